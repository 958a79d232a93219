"""The teacher toy of issue 30 (`llama_4x8`): its starting point, and its ranking and keep-only curve.

    python benchmarks/retention_teacher.py widen OUT     # the start of recipe llama_4x8
    gna-interp zoo train llama_4x8 --init OUT            # fine-tune it (the zoo's recipe machinery)
    python benchmarks/retention_teacher.py measure [FOLDER] [--json PATH]

``widen``: the bundled `llama_4heads` (2 layers x 4 heads of 16, reads shuffled labels) grown
to 4 layers x 8 heads of 16. Its layers go to layers 0 and 2, its heads to heads 0-3 of
them; every new head (heads 4-7) and the new layers 1 and 3 are freshly initialised, with
their writers (``o_proj`` columns of the new heads, the new layers' ``o_proj`` and
``down_proj``) scaled by 0.1, so the start is close to, not equal to, `llama_4heads`, and
fine-tuning has every head to use.

``measure``: `gna.retrieval_ranking` of every head on the toy's task (the toys never saw
dictionaries, so the KV probe is at chance on them), then `gna.retention_curve` keeping
the top-n heads against random sets (mean ablation), printed as tables.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from _common import set_threads, write_json

SCALE = 0.1
"""Factor on the freshly initialised writers of the new heads and layers."""
OLD_TO_NEW = {0: 0, 1: 2}
"""`llama_4heads` layer -> teacher layer."""


def widen(out: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    # Private: the zoo's own recipe, folder, tokenizer and quiet weight loading, to widen a
    # toy into the start of a new recipe (what `gna-interp zoo train` does for a bundled one).
    from gna_interp.models.loading import quiet_weight_loading
    from gna_interp.tasks.toy import toy_tokenizer
    from gna_interp.zoo.recipes import recipe
    from gna_interp.zoo.store import toy_path

    teacher = recipe("llama_4x8")
    torch.manual_seed(teacher.seed)

    grown = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama", **teacher.config))
    with quiet_weight_loading(local=True):
        small = AutoModelForCausalLM.from_pretrained(toy_path("llama_4heads"))
    width = small.config.num_attention_heads * small.config.head_dim  # rows / columns of the old heads
    state = grown.state_dict()
    with torch.no_grad():
        for layer in range(grown.config.num_hidden_layers):
            prefix = f"model.layers.{layer}."
            for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
                state[prefix + name].mul_(SCALE)
        for key, value in small.state_dict().items():
            if not key.startswith("model.layers."):
                state[key].copy_(value)  # embeddings, final norm, unembedding
                continue
            index, rest = key[len("model.layers.") :].split(".", 1)
            target = state[f"model.layers.{OLD_TO_NEW[int(index)]}.{rest}"]
            if rest.startswith("self_attn.") and rest.split(".")[1] in ("q_proj", "k_proj", "v_proj"):
                target[:width].copy_(value)
            elif rest == "self_attn.o_proj.weight":
                target[:, :width].copy_(value)
            else:
                target.copy_(value)
    grown.load_state_dict(state)
    out.mkdir(parents=True, exist_ok=True)
    grown.save_pretrained(out)
    toy_tokenizer().save_pretrained(out)
    print(f"wrote {out}")


def measure(folder: str | None, n_prompts: int, seeds: int) -> dict:
    import gna_interp as gna

    set_threads(1)
    model = gna.load_toy("llama_4x8", backend="nnsight") if folder is None else gna.load(folder, backend="nnsight")
    card_task = gna.toy_task("llama_4x8", n_prompts, seed=31_000)
    start = time.perf_counter()
    ranking = gna.retrieval_ranking(model, card_task, how="zero", progress=False)
    ranking_seconds = time.perf_counter() - start
    start = time.perf_counter()
    sizes = [1, 2, 3, 4, 6, 8, 12, 16, 24]
    curve = gna.retention_curve(model, card_task, ranking, sizes=sizes, seeds=seeds, how="mean", progress=False)
    curve_seconds = time.perf_counter() - start
    frame = ranking.to_frame()
    print(ranking)
    print(frame.head(12).to_string(index=False))
    print(f"ranking: {ranking.cost}, {ranking_seconds:.1f} s")
    print(curve)
    print(curve.to_frame().drop(columns=["added"]).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    print(f"curve: {curve.cost}, {curve_seconds:.1f} s")
    return {
        "prompts": n_prompts,
        "task_seed": 31_000,
        "clean": ranking.clean,
        "ranking_zero_ablation": [{"head": str(h), "drop": round(float(ranking.drop[h.layer, h.head]), 4)} for h in ranking.order],
        "ranking_cost": ranking.cost,
        "retention_mean_ablation": {
            "seeds": curve.seeds,
            "rows": curve.to_frame().drop(columns=["added"]).round(4).to_dict(orient="records"),
        },
        "seconds": {"ranking": round(ranking_seconds, 1), "retention": round(curve_seconds, 1)},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    widen_parser = commands.add_parser("widen", help="write the start of recipe llama_4x8")
    widen_parser.add_argument("out")
    measure_parser = commands.add_parser("measure", help="ranking and retention curve of the trained teacher")
    measure_parser.add_argument("folder", nargs="?", help="a trained folder (default: the bundled toy)")
    measure_parser.add_argument("--prompts", type=int, default=500)
    measure_parser.add_argument("--seeds", type=int, default=5)
    measure_parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args(argv)
    if args.command == "widen":
        widen(Path(args.out))
        return 0
    numbers = measure(args.folder, args.prompts, args.seeds)
    if args.json:
        write_json(args.json, numbers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
