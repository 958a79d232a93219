"""Llamba (Discrete Mamba-2) through the package's table, on the CPU twin, each analysis
against an independent reference: weights edited by hand, raw forward hooks on the twin,
the twin's own scan and one-row-at-a-time runs. Both of Cartesia's namings."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import gna_interp as gna
from gna_interp.models.llamba import discrete_mamba2_scan, tiny_llamba
from gna_interp.models.tiny import tiny_model

from .conftest import CLEAN, CORRUPT, PROMPTS, no_hooks_anywhere

H = gna.Head
EXACT = 1e-5


def trunk(raw):
    return raw.backbone if hasattr(raw, "backbone") else raw.model


def raw_logits(raw, text, tokenizer) -> torch.Tensor:
    """One unpadded row through the raw twin: ``[pos, vocab]``."""
    with torch.no_grad():
        return raw(torch.tensor([tokenizer(text)["input_ids"]])).logits[0]


@pytest.fixture(scope="module", params=["backbone", "model"])
def pair(request, tokenizer):
    raw = tiny_llamba(seed=1, hf_style=request.param == "model")
    return raw, gna.load(copy.deepcopy(raw), tokenizer=tokenizer)


def test_both_namings_load_on_nnsight_and_tlens_refuses(pair, tokenizer):
    raw, model = pair
    assert model.arch.family == ("llamba" if hasattr(raw, "backbone") else "llamba_hf")
    assert (model.backend_name, model.n_layers, model.heads_per_layer, model.head_dim) == ("nnsight", 3, (4, 4, 4), 8)
    assert model.receiver_inputs(H(1, 0)) == ("x", "B", "C", "z", "decay")
    with pytest.raises(ValueError, match=r"backend='tlens' does not support the 'llamba.*' family .*no adapter.*backend='nnsight'"):
        gna.load(copy.deepcopy(raw), tokenizer=tokenizer, backend="tlens")


def test_left_padded_rows_equal_rows_run_alone(pair, tokenizer):
    """The raw twin's numbers move with left padding (no mask); gna's do not."""
    raw, model = pair
    batch = model.to_batch(PROMPTS)
    assert not batch.attention_mask.all(), "the batch must be left-padded"
    with torch.no_grad():
        padded_raw = raw(batch.input_ids).logits
    logits = model.logits(PROMPTS)
    moved = 0.0
    for row, text in enumerate(PROMPTS):
        alone = raw_logits(raw, text, tokenizer)
        n = alone.shape[0]
        assert (logits[row, -n:] - alone).abs().max().item() < EXACT, text
        moved = max(moved, (padded_raw[row, -n:] - alone).abs().max().item())
    assert moved > 1e-2, "padding must move the raw twin's rows, or this test could not fail"
    assert no_hooks_anywhere(model.hf_model)


@pytest.mark.parametrize("family", ["mamba", "falcon_mamba", "mamba2"])
def test_hf_ssm_rows_do_not_depend_on_padding(family, tokenizer):
    """Every other SSM family: batched (left-padded) equals one row at a time."""
    model = gna.load(tiny_model(family, seed=2), tokenizer=tokenizer)
    logits = model.logits(PROMPTS)
    for row, text in enumerate(PROMPTS):
        alone = model.logits([text])[0]
        assert (logits[row, -alone.shape[0] :] - alone).abs().max().item() < 1e-4, (family, text)


def test_head_ablation_equals_zeroed_out_proj_columns(pair, tokenizer):
    raw, model = pair
    for head in (H(0, 1), H(2, 3)):
        edited = copy.deepcopy(raw)
        with torch.no_grad():
            trunk(edited).layers[head.layer].mixer.out_proj.weight[:, head.head * 8 : (head.head + 1) * 8] = 0
        ablated = model.logits(PROMPTS, [gna.Ablate([head])])
        for row, text in enumerate(PROMPTS):
            expected = raw_logits(edited, text, tokenizer)
            assert (ablated[row, -expected.shape[0] :] - expected).abs().max().item() < EXACT, (head, text)
        assert (expected - raw_logits(raw, PROMPTS[-1], tokenizer)).abs().max().item() > 1e-3, "the head matters"


def test_implicit_attention_reproduces_the_scan_output(pair, tokenizer):
    """``y = M x`` (``M`` with ``D`` on its diagonal) against the twin's sequential scan on
    the mixer input captured with a raw hook, each row unpadded; ``M`` from a padded batch."""
    raw, model = pair
    layer = 1
    heads = [H(layer, h) for h in range(4)]
    pattern = gna.attention_pattern(model, PROMPTS, heads, include_skip=True)  # [batch, head, query, key]
    mixer = trunk(raw).layers[layer].mixer
    for row, text in enumerate(PROMPTS):
        store: dict = {}
        handle = mixer.register_forward_pre_hook(lambda module, args, store=store: store.update(u=args[0]))
        try:
            raw_logits(raw, text, tokenizer)
        finally:
            handle.remove()
        with torch.no_grad():
            parts = mixer.ssm_inputs(store["u"])
            B, C = (parts[name].repeat_interleave(2, dim=2) for name in ("B", "C"))
            y = discrete_mamba2_scan(parts["x"], parts["a"], B, C) + mixer.D[:, None] * parts["x"]
        n = y.shape[1]
        M = pattern[row, :, -n:, -n:]
        assert (pattern[row, :, :, :-n] == 0).all(), "padding keys get no weight"
        mixed = torch.einsum("hts,shp->thp", M, parts["x"][0])
        assert (mixed - y[0]).abs().max().item() < EXACT, text


def raw_path_patch(raw, clean_ids, corrupt_ids, sender, receiver, stream, whole_unit=False):
    """Path patching ``sender -> receiver (stream) -> logits`` with raw hooks, sender and
    receiver in different layers (head_dim 8, 4 value heads over 2 qk heads, state 8).

    D: the clean run with the sender's out-projection slice from the corrupt run; the
    receiver's ``in_proj`` output is read there. C: the clean run, with the receiver's
    slice of the out-projection input taken from a copy of its mixer that reads the D
    value of the receiver's stream unit (a qk head's ``B`` / ``C``: the whole unit);
    ``whole_unit``: every head of the mixer takes its slice from the copy."""
    blocks = trunk(raw).layers
    send_proj = blocks[sender.layer].mixer.out_proj
    mixer = blocks[receiver.layer].mixer
    width = 8
    columns = {
        "x": range(receiver.head * 8, receiver.head * 8 + 8),
        "B": range(32 + (receiver.head // 2) * 8, 32 + (receiver.head // 2) * 8 + 8),
        "C": range(48 + (receiver.head // 2) * 8, 48 + (receiver.head // 2) * 8 + 8),
        "z": range(64 + receiver.head * 8, 64 + receiver.head * 8 + 8),
        "decay": range(96 + receiver.head, 96 + receiver.head + 1),
    }[stream]
    cols = torch.tensor(list(columns))
    store = {}

    def run(ids, hooks):
        handles = [
            module.register_forward_pre_hook(fn) if kind == "pre" else module.register_forward_hook(fn) for module, kind, fn in hooks
        ]
        try:
            with torch.no_grad():
                return raw(ids).logits
        finally:
            for handle in handles:
                handle.remove()

    sl = slice(sender.head * width, (sender.head + 1) * width)
    run(corrupt_ids, [(send_proj, "pre", lambda m, a: store.update(sender=a[0][..., sl].clone()))])

    def corrupt_sender(module, args):
        x = args[0].clone()
        x[..., sl] = store["sender"]
        return (x,)

    run(clean_ids, [(send_proj, "pre", corrupt_sender), (mixer.in_proj, "fwd", lambda m, a, o: store.update(d=o[..., cols].clone()))])
    run(clean_ids, [(mixer, "pre", lambda m, a: store.update(u=a[0].clone()))])

    def patched_proj(module, args, output):
        out = output.clone()
        out[..., cols] = store["d"]
        return out

    copy_mixer = copy.deepcopy(mixer)
    handle = copy_mixer.in_proj.register_forward_hook(patched_proj)
    grab = copy_mixer.out_proj.register_forward_pre_hook(lambda m, a: store.update(copy=a[0].clone()))
    try:
        with torch.no_grad():
            copy_mixer(store["u"])
    finally:
        handle.remove()
        grab.remove()
    rs = slice(0, 32) if whole_unit else slice(receiver.head * width, (receiver.head + 1) * width)

    def receiver_from_copy(module, args):
        x = args[0].clone()
        x[..., rs] = store["copy"][..., rs]
        return (x,)

    return run(clean_ids, [(mixer.out_proj, "pre", receiver_from_copy)])


@pytest.mark.parametrize("stream", ["x", "B", "C", "z", "decay"])
def test_path_patching_streams_equal_raw_hook_twin(pair, stream):
    """Each stream into one receiver equals the raw-hook twin; ``B`` / ``C`` (shared by a
    qk head's two value heads) reach the receiver only, as grouped-query keys do."""
    raw, model = pair
    sender, receiver = H(0, 2), H(1, 1)

    def metric(logits):
        return logits[:, -1, 5] - logits[:, -1, 9]

    clean, corrupt = model.to_batch(CLEAN).input_ids, model.to_batch(CORRUPT).input_ids
    got = gna.path_patching(model, CLEAN, CORRUPT, metric, senders=[sender], receivers=[receiver], receiver_input=stream)
    expected = float(metric(raw_path_patch(raw, clean, corrupt, sender, receiver, stream)).mean())
    base = float(metric(model.logits(CLEAN)).mean())
    assert abs(expected - base) > 1e-5, f"{stream}: no effect, the test could not fail"
    assert got == pytest.approx(expected, abs=EXACT), stream
    if stream in ("B", "C"):
        leaky = float(metric(raw_path_patch(raw, clean, corrupt, sender, receiver, stream, whole_unit=True)).mean())
        assert abs(leaky - expected) > 1e-6, "the shared unit would leak into the other value head"


def test_attribution_equals_raw_gradient_reference(pair):
    """(clean - corrupt) . d metric / d head output, from raw hooks on the twin's out-projections."""
    raw, model = pair

    def metric(logits):
        return logits[:, -1, 5] - logits[:, -1, 9]

    result = gna.attribution_patching(model, CLEAN, CORRUPT, metric)
    projs = [layer.mixer.out_proj for layer in trunk(raw).layers]

    def run(ids, grad):
        store = {}
        handles = [p.register_forward_pre_hook(lambda m, a, i=i: store.update({i: a[0]})) for i, p in enumerate(projs)]
        try:
            with torch.set_grad_enabled(grad):
                logits = raw(ids).logits
        finally:
            for handle in handles:
                handle.remove()
        return logits, store

    clean_acts = run(model.to_batch(CLEAN).input_ids, False)[1]
    logits, corrupt_acts = run(model.to_batch(CORRUPT).input_ids, True)
    value = metric(logits).mean()
    grads = torch.autograd.grad(value, [corrupt_acts[i] for i in range(3)])
    for head in model.heads:
        cols = slice(head.head * 8, (head.head + 1) * 8)
        diff = clean_acts[head.layer][..., cols] - corrupt_acts[head.layer][..., cols].detach()
        effect = (diff * grads[head.layer][..., cols]).sum()
        assert result.scores[head.layer, head.head] == pytest.approx(float(value.detach()) + float(effect), abs=EXACT), head


def test_activation_patching_equals_raw_hooks(pair, tokenizer):
    raw, model = pair
    head = H(1, 3)
    proj = trunk(raw).layers[1].mixer.out_proj
    store = {}
    corrupt_ids, clean_ids = model.to_batch(CORRUPT).input_ids, model.to_batch(CLEAN).input_ids
    handle = proj.register_forward_pre_hook(lambda m, a: store.update(x=a[0][..., 24:32].clone()))
    try:
        with torch.no_grad():
            raw(corrupt_ids)
    finally:
        handle.remove()

    def swap(module, args):
        x = args[0].clone()
        x[..., 24:32] = store["x"]
        return (x,)

    handle = proj.register_forward_pre_hook(swap)
    try:
        with torch.no_grad():
            expected = raw(clean_ids).logits
    finally:
        handle.remove()
    got = model.logits(CLEAN, [gna.Patch([head], source=CORRUPT)])
    assert (got - expected).abs().max().item() < EXACT


def test_discover_and_report_run_on_the_twin(tokenizer, tmp_path):
    """A random twin retrieves nothing, but every stage of discovery runs over its heads
    and the report renders them."""
    from gna_interp.tasks.toy import VOCAB
    from gna_interp.viz.report import write_report

    model = gna.load(tiny_llamba(seed=4, vocab_size=len(VOCAB)), tokenizer=tokenizer)
    task = gna.tasks.toy_mcq(12, seed=3)
    with pytest.warns(gna.discovery.NoRetrievalWarning):
        circuit = gna.discover(model, task, max_candidates=6, search_at_chance=True, progress=False)
    scan = torch.tensor([[float("nan") if v is None else v for v in row] for row in circuit.head_scan])
    assert scan.shape == (3, 4) and not scan.isnan().any()
    page = write_report([(circuit, model, task)], tmp_path).read_text()
    assert "L0H0" in page or "L1H" in page or "L2H" in page
    assert no_hooks_anywhere(model.hf_model)


def test_padding_without_a_guard_is_refused(tokenizer):
    """A family whose forward takes no mask and whose mixers have no pad guard refuses a
    left-padded batch by name (rows of one length still run)."""
    from dataclasses import replace

    from gna_interp.models.registry import LLAMBA

    bare = replace(LLAMBA, family="llamba_unguarded", mixers=gna.core.uniform(replace(LLAMBA.mixers(None, 0)[0], pad_guard=None)))
    model = gna.load(tiny_llamba(seed=1), tokenizer=tokenizer, arch=bare)
    assert model.logits(CLEAN).shape[:2] == (3, 5)
    with pytest.raises(ValueError, match=r"'llamba_unguarded' family's forward takes no attention mask .* pass rows of one token length"):
        model.logits(PROMPTS)
    assert F.softplus(torch.tensor(200.0)).neg().exp().item() == 0.0, "the guard's decay clears the state in float32"


@pytest.fixture(scope="module")
def toy_llamba_folder(tmp_path_factory):
    """A tiny twin saved as a checkpoint folder in Cartesia's naming, with the toy tokenizer."""
    from gna_interp.models.llamba import save_llamba
    from gna_interp.tasks.toy import VOCAB

    folder = tmp_path_factory.mktemp("llamba") / "tiny-llamba"
    save_llamba(tiny_llamba(seed=4, vocab_size=len(VOCAB)), folder)
    gna.tasks.toy_tokenizer().save_pretrained(folder)
    return folder


def test_folder_loads_strict_and_cli_ablates(toy_llamba_folder, capsys):
    """The folder loads (no transformers class: the twin, or Cartesia's when installed);
    the command line's ablate runs on it and prints what the library computes."""
    import re

    from safetensors.torch import load_file, save_file

    from gna_interp.cli import main

    model = gna.load(str(toy_llamba_folder))
    assert model.arch.family == "llamba" and model.heads_per_layer == (4, 4, 4)
    status = main(["ablate", "--model", str(toy_llamba_folder), "--head", "1.2", "--n", "16"])
    out, err = capsys.readouterr()
    assert status == 0, err[-2000:]
    before, after = map(float, re.search(r"accuracy clean ([\d.]+) -> ([\d.]+)", out).groups())
    task = gna.tasks.toy_mcq(16, seed=0)  # the command's --task toy, default seed
    assert before == pytest.approx(gna.evaluate(model, task).accuracy, abs=1e-3)
    assert after == pytest.approx(gna.evaluate(model, task, [gna.Ablate([H(1, 2)])]).accuracy, abs=1e-3)
    weights = load_file(str(toy_llamba_folder / "model.safetensors"))
    weights["backbone.layers.0.mixer.extra"] = torch.zeros(1)
    broken = toy_llamba_folder.parent / "broken"
    broken.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        if (toy_llamba_folder / name).is_file():
            (broken / name).write_bytes((toy_llamba_folder / name).read_bytes())
    save_file(weights, str(broken / "model.safetensors"))
    with pytest.raises(
        ValueError, match=r"do not fit the Llamba its config.json builds: missing \[\], unexpected \['backbone.layers.0.mixer.extra'\]"
    ):
        gna.load(str(broken))


def test_lm_eval_equals_evaluate_on_the_twin(toy_llamba_folder, tmp_path):
    """lm-eval through `gna.lm_eval` scores each document as `gna.evaluate` does
    (prompts of several lengths: padded batches, no mask)."""
    pytest.importorskip("lm_eval")
    model = gna.load(str(toy_llamba_folder))
    short, long = gna.tasks.toy_mcq(6, seed=7, words_per_option=1), gna.tasks.toy_mcq(6, seed=8)
    task = gna.tasks.Task("toy_llamba", [e for pair in zip(short.examples, long.examples, strict=True) for e in pair])
    assert len({len(p.split()) for p in task.prompts}) > 1, "prompts of several lengths"
    gna.harness.write_task(task, tmp_path, "toy_llamba")
    run = gna.lm_eval(model, "toy_llamba", [gna.Ablate([H(2, 1)])], include_path=str(tmp_path), log_samples=True)
    ours = gna.evaluate(model, task, [gna.Ablate([H(2, 1)])])
    samples = sorted(run.results["samples"]["toy_llamba"], key=lambda s: s["doc_id"])
    scores = torch.tensor([[resp[0][0] for resp in s["resps"]] for s in samples])
    assert torch.allclose(scores, ours.scores, atol=1e-4)


def test_hub_id_of_a_llamba_says_how_to_load_it(monkeypatch):
    """transformers has no Llamba class: a hub id is refused from its config alone, saying
    how to load it."""
    config = tiny_llamba().config.to_dict()
    monkeypatch.setattr("gna_interp.models.loading.hub_access", lambda name, revision=None: {})
    monkeypatch.setattr("gna_interp.models.loading.hub_config", lambda name, access, kwargs: (config, f"{name}'s config.json"))
    with pytest.raises(
        ValueError, match=r"model='cartesia-ai/Llamba-8B' is a Llamba, which transformers cannot build: .*LlambaLMHeadModel"
    ):
        gna.load("cartesia-ai/Llamba-8B")


def test_skipped_and_truncated_layers_equal_raw_pass_through(pair, tokenizer):
    """Layer ablation (the block passes its input through) and truncation (blocks 0..k-1,
    then the final norm and head) against the raw twin's blocks called by hand."""
    raw, model = pair
    body = trunk(raw)

    def by_hand(text, skip=(), keep=3):
        with torch.no_grad():
            hidden = body.embedding(torch.tensor([tokenizer(text)["input_ids"]]))
            for i, block in enumerate(body.layers[:keep]):
                if i in skip:
                    continue
                out = block(hidden)
                hidden = out[0] if isinstance(out, tuple) else out["hidden_states"]
            return raw.lm_head(body.final_layernorm(hidden))[0]

    skipped = model.logits(PROMPTS, [gna.SkipLayers([1])])
    truncated = model.logits(PROMPTS, [gna.Truncate(2)])
    for row, text in enumerate(PROMPTS):
        expected_skip, expected_cut = by_hand(text, skip=(1,)), by_hand(text, keep=2)
        n = expected_skip.shape[0]
        assert (skipped[row, -n:] - expected_skip).abs().max().item() < EXACT, text
        assert (truncated[row, -n:] - expected_cut).abs().max().item() < EXACT, text
    assert (expected_skip - raw_logits(raw, PROMPTS[-1], tokenizer)).abs().max().item() > 1e-3
