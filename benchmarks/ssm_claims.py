"""Issue 41, item 4: the paper's SSM claims in miniature, on the label-reading toys.

Four measurements, each beside the paper's figure (docs/records/toys.md has the table and
``examples/ssm_claims.ipynb`` shows it from this script's JSON):

(a) smoother SSM Aggregate rows: entropy and top-1 mass of the Aggregate head's final-position
    row over the option-summary positions (each option line's label), Transformer toy
    against Mamba-2 toy (and the hybrid's heads), on the same prompts;
(b) in the hybrid, attention takes the Aggregate role: accuracy with the aggregate layer's
    attention heads ablated at the final position, against its SSM heads, and the heads' share;
(c) the layer swap: a pure Discrete-Mamba-2 student distilled from `llama_4x8` (at chance)
    with the teacher's layers swapped in, untrained;
(d) the skill gap: KV-retrieval accuracy against the number of pairs, a Llama against a
    Mamba-2 of about the same parameter count, trained alike on the toy vocabulary.

    python benchmarks/ssm_claims.py [--parts a b c d] [--kv-models ...] [--json benchmarks/results/ssm_claims.json]

Each part replaces its own key in the JSON file and keeps the others, with its per-prompt
results (right or wrong as ``"0110..."``, entropies per prompt); then each claim's verdict is
printed (``VERDICT | (a) | ...``), a test with its interval over the prompts (`ssm_verdicts`). Times on the shared
2-core machine, one thread: (a) and (b) about 2 minutes together; (c) distils for 2 minutes;
(d) trains 2.4 (Llama), 11.7 (Mamba-2), 1.9 (Llama, std 0.02) and 8.1 (Llama, 4x steps) minutes.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from _common import parser, set_threads
from ssm_verdicts import claim_verdicts

import gna_interp as gna

RESULTS = Path(__file__).resolve().parent / "results" / "ssm_claims.json"

# The bundled label-reading toys (the Mamba-2 and the hybrid read their option labels; see their cards).
TRANSFORMER = "llama"
MAMBA2 = "mamba2"
HYBRID = "falcon_h1"

# ---------------------------------------------------------------- (d) KV retrieval
KV_PAIRS = (2, 4, 8, 16)
KV_STEPS = 2400
KV_BATCH = 16
KV_HELD_OUT = 300  # prompts per pair count
KV_LR = 2e-3
KV_STEPS_OF = {"llama_4x_steps": 4 * KV_STEPS}  # every other model: KV_STEPS
_KV_LLAMA = dict(hidden_size=64, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                 max_position_embeddings=128, tie_word_embeddings=False)  # fmt: skip
KV_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    # The toy Llama's shape (2 layers x 4 heads of 16, width 64) against a 2-layer Mamba-2 of
    # width 64 made about as large (expand 4: 16 heads of 16, state 64): 156k against 146k.
    "llama": ("llama", dict(_KV_LLAMA, initializer_range=0.2)),
    "mamba2": ("mamba2", dict(hidden_size=64, num_hidden_layers=2, num_heads=16, head_dim=16, expand=4, state_size=64, n_groups=1,
                              chunk_size=32, conv_kernel=4, tie_word_embeddings=False)),
    # The same Llama with 4x the steps: whether it learns the task at all (not an equal budget).
    "llama_4x_steps": ("llama", dict(_KV_LLAMA, initializer_range=0.2)),
    # The Llama at HF's default init (std 0.02), a second chance for the Transformer.
    "llama_std002": ("llama", dict(_KV_LLAMA)),
}  # fmt: skip


def kv_ids(n: int, n_pairs: int, generator: Any) -> tuple[Any, Any, Any]:
    """``n`` KV prompts in the paper's wording as toy token ids (equal to tokenizing
    `kv_retrieval`'s text, checked in `kv_part`): ``input_ids [n, pos]``, the correct value's
    token ``[n]`` and the dictionary's value tokens ``[n, n_pairs]`` (the candidates)."""
    import torch

    # Private: the toy vocabulary's word lists, to build the prompts as tensors.
    from gna_interp.tasks.toy import CONTENT_WORDS, NUMBERS, VOCAB

    vocab = {token: i for i, token in enumerate(VOCAB)}
    keys = torch.tensor([vocab[w] for w in CONTENT_WORDS])[torch.rand(n, len(CONTENT_WORDS), generator=generator).argsort(1)[:, :n_pairs]]
    values = torch.tensor([vocab[v] for v in NUMBERS])[torch.rand(n, len(NUMBERS), generator=generator).argsort(1)[:, :n_pairs]]
    asked = torch.randint(n_pairs, (n,), generator=generator)
    rows = torch.arange(n)

    def col(word: str) -> Any:
        return torch.full((n, 1), vocab[word])

    lines = [torch.cat([keys[:, i : i + 1], col(":"), values[:, i : i + 1], col("\n")], 1) for i in range(n_pairs)]
    header = [col(w) for w in ("<bos>", "Memorize", "the", "following", "dictionary", ":", "\n")]
    question = [col(w) for w in ("The", "value", "of", "the", "key", "'")] + [keys[rows, asked][:, None], col("'"), col("is")]
    return torch.cat([*header, *lines, *question], 1), values[rows, asked], values


def kv_accuracy(model: Any, n_pairs: int, seed: int) -> float:
    """Held-out accuracy: the dictionary's value with the highest logit at the final position."""
    import torch

    ids, answer, candidates = kv_ids(KV_HELD_OUT, n_pairs, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, -1]
    picked = candidates.gather(1, logits.gather(1, candidates).argmax(1, keepdim=True))[:, 0]
    return float((picked == answer).float().mean())


def kv_part(models: list[str] | None = None, stored: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train ``models`` (default: all of `KV_MODELS`) and keep the other models' rows of ``stored``."""
    import torch
    import torch.nn.functional as F
    from transformers import AutoConfig, AutoModelForCausalLM

    from gna_interp.tasks import kv_example, toy_tokenizer

    # Private: the toy vocabulary's size, for the models' configs.
    from gna_interp.tasks.toy import VOCAB_SIZE

    # The tensor prompts are the library's KV prompts tokenized (same wording, same tokens).
    ids, answer, _ = kv_ids(1, 3, torch.Generator().manual_seed(5))
    words = toy_tokenizer().convert_ids_to_tokens(ids[0].tolist())
    keys, values = [words[7 + 4 * i] for i in range(3)], [int(words[9 + 4 * i]) for i in range(3)]

    text = kv_example(keys, values, keys.index(words[-3])).text
    assert toy_tokenizer()(text).input_ids == ids[0].tolist(), (text, words)

    tokens = dict(vocab_size=VOCAB_SIZE, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    rows: dict[str, Any] = dict((stored or {}).get("models", {}))
    for name in models or list(KV_MODELS):
        family, config = KV_MODELS[name]
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **config, **tokens))
        optimiser = torch.optim.AdamW(model.parameters(), lr=KV_LR, weight_decay=0.0)
        generator = torch.Generator().manual_seed(1)
        start, curve = time.perf_counter(), []
        model.train()
        steps = KV_STEPS_OF.get(name, KV_STEPS)
        for step in range(1, steps + 1):
            n_pairs = KV_PAIRS[int(torch.randint(len(KV_PAIRS), (1,), generator=generator))]
            ids, answer, _ = kv_ids(KV_BATCH, n_pairs, generator)
            for group in optimiser.param_groups:
                group["lr"] = KV_LR * min(1.0, step / 100) * (1.0 if step < steps * 0.6 else (steps - step) / (steps * 0.4))
            loss = F.cross_entropy(model(input_ids=ids).logits[:, -1], answer)
            optimiser.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimiser.step()
            if step % 400 == 0 or step == steps:
                model.eval()
                accuracy = {p: kv_accuracy(model, p, 900 + p) for p in KV_PAIRS}
                model.train()
                curve.append({"step": step, "loss": float(loss.detach()), **{str(p): a for p, a in accuracy.items()}})
                took = (time.perf_counter() - start) / 60
                print(f"  kv {name} step {step} loss {float(loss.detach()):.3f} {accuracy} ({took:.1f} min)", flush=True)
        model.eval()
        rows[name] = {
            "family": family,
            "steps": steps,
            "parameters": sum(p.numel() for p in model.parameters()),
            "config": config,
            "accuracy": {str(p): kv_accuracy(model, p, 7000 + p) for p in (*KV_PAIRS, 24, 32)},
            "chance": {str(p): 1 / p for p in (*KV_PAIRS, 24, 32)},
            "curve": curve,
            "minutes": (time.perf_counter() - start) / 60,
        }
        print(f"RESULT | kv {name} | {rows[name]['parameters']} parameters | {rows[name]['accuracy']}", flush=True)
    return {
        "models": rows,
        "steps": KV_STEPS,
        "batch": KV_BATCH,
        "pairs_trained": list(KV_PAIRS),
        "held_out": KV_HELD_OUT,
        "note": "24 and 32 pairs were never trained on (longer than any training prompt).",
    }


# ---------------------------------------------------------------- (c) layer swap
TEACHER = "llama_4x8"  # its card: Gather layer 0 (L0H0-3), Aggregate layer 2 (L2H0-3)
SWAPS = ((2,), (0,), (1,), (3,), (0, 2), (0, 1, 2, 3))


@contextmanager
def blocks_swapped(student: Any, teacher: Any, layers: tuple[int, ...]) -> Iterator[None]:
    """The student's blocks at ``layers`` replaced by the teacher's (the same modules, not
    copies: nothing trains here), put back on exit. By hand: `gna.swap_layers` has no row
    for the hybrid student's family; its blocks take the Llama block's arguments (hidden
    states, the 4-D mask, the rotary embeddings) and return a tensor, as the teacher's do."""
    slots = student.model.layers
    kept = {layer: slots[layer] for layer in layers}
    try:
        for layer in layers:
            slots[layer] = teacher.model.layers[layer]
        yield
    finally:
        for layer, block in kept.items():
            slots[layer] = block


def mcq_correct(hf_model: Any, task: Any) -> tuple[Any, Any]:
    """Per prompt, whether a raw HF model answers a toy task right (``[batch]`` bool: its
    letters' logits at the final position; toy prompts have one length, no padding), and the
    final logits ``[batch, vocab]``."""
    import torch

    encoded = task.encode()
    with torch.no_grad():
        logits = hf_model(input_ids=encoded.batch.input_ids).logits[:, -1]
    scores = logits.gather(1, encoded.candidate_ids)
    return scores.argmax(1) == encoded.correct, logits


def mcq_accuracy(hf_model: Any, task: Any) -> tuple[float, Any]:
    """`mcq_correct` as an accuracy, with the final logits."""
    correct, logits = mcq_correct(hf_model, task)
    return float(correct.float().mean()), logits


def swap_part() -> dict[str, Any]:
    """The pure Discrete-Mamba-2 student of benchmarks/hybrid_students.py (``none``, attention
    init, stage A 150 + stage B 400 steps, seed 0: rebuilt here, deterministic on one thread),
    then the teacher's blocks swapped in, untrained."""
    teacher, task = gna.load_toy(TEACHER), gna.toy_task(TEACHER, 400, seed=2026)
    train = gna.toy_task(TEACHER, 8000, seed=1).prompts
    student = gna.hybridize(teacher, [], init="attention", combine="sum")
    t_hf, s_hf = teacher.hf_model, student.hf_model
    clean, t_logits = mcq_accuracy(t_hf, task)

    def swapped_rows() -> tuple[float, dict[str, Any]]:
        right, _ = mcq_correct(s_hf, task)
        alone = float(right.float().mean())
        rows = {"student": {"accuracy": alone, "correct": bits(right)}}
        for layers in SWAPS:
            with blocks_swapped(s_hf, t_hf, layers):
                correct, logits = mcq_correct(s_hf, task)
            rows["+".join(map(str, layers))] = {
                "accuracy": float(correct.float().mean()),
                "max_logit_diff_to_teacher": float((logits - t_logits).abs().max()),
                "correct": bits(correct),  # per prompt: the verdicts' paired bootstrap
            }
        assert mcq_accuracy(s_hf, task)[0] == alone  # the student is back
        # Every block swapped: the teacher itself (embeddings, norms and head are the teacher's copies).
        assert rows["0+1+2+3"]["max_logit_diff_to_teacher"] < 1e-4, rows["0+1+2+3"]
        print(f"  student {alone:.3f}; swapped { ({k: round(v['accuracy'], 3) for k, v in rows.items()}) }", flush=True)
        student = rows.pop("student")
        return alone, {**rows, "student": student}

    before, before_rows = swapped_rows()
    start = time.perf_counter()
    gna.distill(student, teacher, train, stages=["A", "B"], steps={"A": 150, "B": 400}, batch_size=16, lr=5e-4, seed=0,
                positions="last", train="new", progress=False)  # fmt: skip
    minutes = (time.perf_counter() - start) / 60
    alone, rows = swapped_rows()
    return {
        "teacher": TEACHER,
        "teacher_accuracy": clean,
        "student_accuracy": alone,
        "swaps": rows,
        "before_distillation": {"student_accuracy": before, "swaps": before_rows},
        "aggregate_layer": 2,
        "gather_layer": 0,
        "prompts": 400,
        "distill_minutes": minutes,
        "student": "pure Discrete Mamba-2 (gna.hybridize(teacher, [], init='attention', combine='sum')), distilled 150 + 400 steps",
    }


# ---------------------------------------------------------------- (a) smoothness, (b) hybrid
SMOOTH_PROMPTS = 200
SMOOTH_SEED = 4141


def shared_task() -> Any:
    """The prompts every toy answers: label-last, shuffled labels, 4 options of 2 words
    (the Mamba-2 toy trained on varied lengths, which include 2)."""
    from gna_interp.tasks import toy_mcq

    return toy_mcq(SMOOTH_PROMPTS, seed=SMOOTH_SEED, layout="label_last", shuffle_labels=True)


def single_head_drops(model: Any, task: Any, layer: int, per_prompt: dict[str, Any] | None = None) -> dict[str, float]:
    """Accuracy drop (clean - ablated) of each head of ``layer``, zero-ablated alone at the
    final position (where the Aggregate role reads); ``per_prompt``, when given, receives each
    run's per-prompt right or wrong (``"clean"`` and each head: lists of 0/1)."""
    clean = gna.evaluate(model, task, progress=False)
    final = task.encode(task.tokenizer_for(model.tokenizer)).final
    heads = [h for h in model.heads if h.layer == layer]
    runs = {str(h): gna.evaluate(model, task, [gna.Ablate([h], positions=final)], progress=False) for h in heads}
    if per_prompt is not None:
        per_prompt.update({"clean": bits(clean.is_correct), **{h: bits(e.is_correct) for h, e in runs.items()}})
    return {h: clean.accuracy - e.accuracy for h, e in runs.items()}


def row_stats(model: Any, task: Any, heads: list[Any]) -> dict[str, dict[str, float]]:
    """Per head: its final-position row (|weights|; implicit attention for SSM heads) over the
    option-summary keys, each option's label token (in the label-last layout the label is
    also the segment's end): entropy (nats; uniform over 4 keys = ln 4 = 1.386), top-1 mass,
    the share of the whole row on those keys, how often the top key is the correct option's;
    and the whole row's entropy and top-1 mass (all keys; the prompts have one length)."""
    import torch

    encoded = task.encode(task.tokenizer_for(model.tokenizer))
    assert torch.equal(encoded.labels, encoded.segment_ends)  # label-last: one summary token per option
    pattern = gna.attention_pattern(model, task.prompts, heads, query_positions=[-1], normalize="abs")[:, :, 0]  # [batch, head, key]
    out: dict[str, dict[str, float]] = {}
    for i, head in enumerate(heads):
        row = pattern[:, i]
        on = row.gather(1, encoded.labels)  # [batch, option]
        out[str(head)] = {
            "entropy": float(gna.attention.entropy(on).mean()),
            "top1": float(gna.attention.top1_mass(on).mean()),
            "share": float((on.sum(1) / row.sum(1)).mean()),
            "top_is_correct": float((on.argmax(1) == encoded.correct).float().mean()),
            "row_entropy": float(gna.attention.entropy(row).mean()),  # the whole row, every key
            "row_top1": float(gna.attention.top1_mass(row).mean()),
            "per_prompt": {"entropy": gna.attention.entropy(on), "row_entropy": gna.attention.entropy(row)},  # [batch]
        }
    return out


def weighted(stats: dict[str, dict[str, float]], drops: dict[str, float]) -> dict[str, float]:
    """The heads' statistics averaged with their (positive) single-head drops as weights."""
    weights = {h: max(drops.get(h, 0.0), 0.0) for h in stats}
    total = sum(weights.values())
    if total == 0:
        return {}
    keys = [k for k in next(iter(stats.values())) if k != "per_prompt"]
    return {k: sum(weights[h] * stats[h][k] for h in stats) / total for k in keys}


def weighted_per_prompt(stats: dict[str, dict[str, Any]], drops: dict[str, float]) -> dict[str, list[float]]:
    """Per prompt, the heads' ``entropy`` and ``row_entropy`` averaged as `weighted` does (6 decimals)."""
    weights = {h: max(drops.get(h, 0.0), 0.0) for h in stats}
    total = sum(weights.values()) or 1.0
    keys = ("entropy", "row_entropy")
    return {k: [round(float(v), 6) for v in sum(weights[h] * stats[h]["per_prompt"][k] for h in stats) / total] for k in keys}


def bits(correct: Any) -> str:
    """``[batch]`` bool as ``"0110..."``: right or wrong per prompt, one character each."""
    return "".join("1" if value else "0" for value in correct.tolist())


def dump(figures: dict[str, Any]) -> str:
    """The results as JSON, one key a line, each list of numbers on one line."""
    text = json.dumps(figures, indent=1)
    return re.sub(r"\[\s*(-?[0-9][-0-9.eE]*(?:,\s*-?[0-9][-0-9.eE]*)*)\s*\]", lambda m: "[" + re.sub(r",\s*", ", ", m.group(1)) + "]", text)


def smooth_part() -> dict[str, Any]:
    task = shared_task()
    result: dict[str, Any] = {"prompts": SMOOTH_PROMPTS, "seed": SMOOTH_SEED, "task": task.name, "models": {}}
    for label, source in (("transformer", TRANSFORMER), ("mamba2", MAMBA2), ("hybrid", HYBRID)):
        model = load(source)
        accuracy = gna.evaluate(model, task, progress=False).accuracy
        layer = model.n_layers - 1  # the 2-layer toys aggregate in their last layer
        drops = single_head_drops(model, task, layer)
        heads = [h for h in model.heads if h.layer == layer]
        stats = row_stats(model, task, heads)
        per_prompt = weighted_per_prompt(stats, drops)  # the verdicts' paired bootstrap; the heads' own rows are not kept
        for item in stats.values():
            item.pop("per_prompt")
        top = sorted(drops, key=drops.__getitem__, reverse=True)[:3]
        result["models"][label] = {
            "source": str(source),
            "accuracy": accuracy,
            "layer": layer,
            "drops": drops,
            "rows": stats,
            "top_heads": top,
            "weighted": weighted(stats, drops),
            "kinds": {str(h): model.head_kind(h).name for h in heads},
            "per_prompt": per_prompt,
        }
        print(f"  {label}: accuracy {accuracy:.3f}, top heads {top}, weighted {result['models'][label]['weighted']}", flush=True)
    return result


def hybrid_part() -> dict[str, Any]:
    """The hybrid's aggregate layer at the final position: its attention heads ablated
    together, its SSM heads together, all of them; and the single-head drops summed by kind."""
    task, model = shared_task(), load(HYBRID)
    final = task.encode(task.tokenizer_for(model.tokenizer)).final
    clean = gna.evaluate(model, task, progress=False).accuracy
    layers = {}
    for layer in range(model.n_layers):
        heads = [h for h in model.heads if h.layer == layer]
        attention = [h for h in heads if model.head_kind(h) == gna.LayerKind.ATTENTION]
        ssm = [h for h in heads if h not in attention]

        def ablated(chosen: list[Any]) -> float:
            return float(gna.evaluate(model, task, [gna.Ablate(chosen, positions=final)], progress=False).accuracy)

        per_prompt: dict[str, Any] = {}
        drops = single_head_drops(model, task, layer, per_prompt)
        positive = {h: max(d, 0.0) for h, d in drops.items()}
        total = sum(positive.values())
        layers[str(layer)] = {
            "attention_heads": [str(h) for h in attention],
            "ssm_heads": [str(h) for h in ssm],
            "all_ablated": ablated(heads),
            "attention_ablated": ablated(attention),
            "ssm_ablated": ablated(ssm),
            "single_drops": drops,
            "attention_share_of_drops": sum(positive[str(h)] for h in attention) / total if total else float("nan"),
            "attention_share_of_heads": len(attention) / len(heads),
        }
        shown = {k: v for k, v in layers[str(layer)].items() if k != "single_drops"}
        layers[str(layer)]["per_prompt"] = per_prompt  # the verdicts' bootstrap
        print(f"  hybrid layer {layer}: {shown}", flush=True)
    return {"source": str(HYBRID), "clean": clean, "chance": 0.25, "prompts": SMOOTH_PROMPTS, "layers": layers}


def load(source: str) -> Any:
    """A bundled toy by name, or a toy's folder (a checkpoint-only folder is refused)."""
    if "/" in source:
        from gna_interp.tasks import toy_tokenizer

        return gna.load(source, tokenizer=toy_tokenizer())
    return gna.load_toy(source)


PARTS: dict[str, Any] = {"a": smooth_part, "b": hybrid_part, "c": swap_part, "d": kv_part}


def main() -> None:
    arguments = parser(__doc__, threads=1, json_file=False)
    arguments.add_argument("--parts", nargs="+", default=sorted(PARTS), choices=sorted(PARTS))
    arguments.add_argument("--json", type=Path, default=RESULTS, help="the results file (each part replaces its key)")
    arguments.add_argument("--kv-models", nargs="+", choices=sorted(KV_MODELS), help="part d: train only these (the others' rows are kept)")
    args = arguments.parse_args()
    gna.set_progress(False)  # here, not at import: the suite imports this file's building blocks
    set_threads(args.threads)
    for part in args.parts:
        figures = json.loads(args.json.read_text()) if args.json.exists() else {}
        figures[part] = kv_part(args.kv_models, figures.get("d")) if part == "d" else PARTS[part]()
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(dump(figures) + "\n")
    for claim, verdict in claim_verdicts(json.loads(args.json.read_text())).items():  # each word a test (ssm_verdicts)
        print(f"VERDICT | {claim} | {verdict['word']} | {verdict['text']}", flush=True)


if __name__ == "__main__":
    main()
