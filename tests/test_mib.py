"""MIB's graph files and edge budgets (issue 54) against a twin of MIB's own code.

`MibTwin` is written by hand from MIB's ``eap/graph.py`` (``Graph.from_model``, its
forward / backward indices, ``apply_topn`` at edge level, ``prune``, ``to_json``) and
``evaluate_area_under_curve`` (the budgets and the two areas): dense ``[n_forward,
n_backward]`` tensors and the loops of ``from_model``, nothing of the library's."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

import gna_interp as gna
from gna_interp.core.errors import GnaValueError
from gna_interp.models.tiny import tiny_model
from gna_interp.scoring.mib_graph import mib_circuit, scheme_of
from gna_interp.scoring.mib_read import scheme_from_cfg

from .conftest import CLEAN, CORRUPT

PERCENTAGES = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1)


class MibTwin:
    """MIB's ``Graph`` for a Transformer config, as its code builds it."""

    def __init__(self, n_layers: int, n_heads: int, parallel: bool) -> None:
        self.L, self.H, self.parallel = n_layers, n_heads, parallel
        self.n_forward = 1 + n_layers * (n_heads + 1)
        self.n_backward = n_layers * (3 * n_heads + 1) + 1
        self.real = torch.zeros(self.n_forward, self.n_backward, dtype=torch.bool)
        self.f2b = torch.zeros(self.n_forward, self.n_backward, dtype=torch.bool)
        self.names: dict[str, tuple[int, int]] = {}
        stream = ["input"]
        for layer in range(n_layers):
            heads = [f"a{layer}.h{h}" for h in range(n_heads)]
            for h in heads:
                for letter in "qkv":
                    self.f2b[self.fwd(h), self.bwd(h, letter)] = True
            self.f2b[self.fwd(f"m{layer}"), self.bwd(f"m{layer}")] = True
            for node in stream:
                for h in heads:
                    for letter in "qkv":
                        self.add(node, h, letter)
                if parallel:
                    self.add(node, f"m{layer}")
            stream = stream + heads
            if not parallel:
                for node in stream:
                    self.add(node, f"m{layer}")
            stream.append(f"m{layer}")
        for node in stream:
            self.add(node, "logits")
        self.nodes = [
            "input",
            *[n for layer in range(n_layers) for n in (*[f"a{layer}.h{h}" for h in range(n_heads)], f"m{layer}")],
            "logits",
        ]

    def fwd(self, name: str) -> int:
        if name == "input":
            return 0
        if name[0] == "m":
            return 1 + int(name[1:]) * (self.H + 1) + self.H
        layer, head = name[1:].split(".h")
        return 1 + int(layer) * (self.H + 1) + int(head)

    def bwd(self, name: str, qkv: str | None = None) -> int:
        if name == "logits":
            return self.n_backward - 1
        if name[0] == "m":
            return int(name[1:]) * (3 * self.H + 1) + 3 * self.H
        layer, head = name[1:].split(".h")
        return int(layer) * (3 * self.H + 1) + "qkv".index(qkv or "") * self.H + int(head)

    def add(self, parent: str, child: str, qkv: str | None = None) -> None:
        name = f"{parent}->{child}" if qkv is None else f"{parent}->{child}<{qkv}>"
        self.names[name] = (self.fwd(parent), self.bwd(child, qkv))
        self.real[self.fwd(parent), self.bwd(child, qkv)] = True

    def topn_pruned(self, scores: torch.Tensor, n: int, absolute: bool) -> torch.Tensor:
        """``apply_topn(n, absolute, level="edge", prune=True)`` on ``scores`` ``[fwd, bwd]``."""
        s = scores.abs() if absolute else scores.clone()
        s[~self.real] = -torch.inf
        order = torch.argsort(s.view(-1), descending=True, stable=True)  # MIB's leaves ties unordered: pinned by edge number
        in_graph = torch.zeros_like(self.real)
        in_graph.view(-1)[order[:n]] = True
        while True:  # prune, to its fixed point
            out = in_graph.any(1)
            into = (in_graph.any(0).float() @ self.f2b.float().T) > 0
            into[0] = True
            nodes = out & into
            back = (nodes.float() @ self.f2b.float()) > 0
            back[-1] = True
            new = in_graph & nodes[:, None] & back[None, :]
            if torch.equal(new, in_graph):
                return in_graph
            in_graph = new


def _areas(f: list[float]) -> tuple[float, float]:
    """evaluate_area_under_curve's ``area_under`` and ``area_from_1`` (linear x)."""
    under = from_1 = 0.0
    for i in range(len(f) - 1):
        dx = PERCENTAGES[i + 1] - PERCENTAGES[i]
        from_1 += dx * (abs(1 - f[i]) + abs(1 - f[i + 1])) / 2
        under += dx * (f[i] + f[i + 1]) / 2
    return under, from_1


@pytest.mark.parametrize(("layers", "heads", "parallel"), [(12, 12, False), (12, 12, True), (3, 2, False)])
def test_counts_and_names_are_mibs(layers, heads, parallel):
    """GPT-2's shape: 158 nodes and 32,491 edges, from the config alone; every name MIB's."""
    twin = MibTwin(layers, heads, parallel)
    scheme = scheme_from_cfg({"n_layers": layers, "n_heads": heads, "parallel_attn_mlp": parallel, "d_model": 8}, lambda k: "")
    assert len(scheme.nodes()) == len(twin.nodes) == twin.n_forward + 1
    assert scheme.nodes() == twin.nodes
    names = [f"{p}->{c}" if q is None else f"{p}->{c}<{q}>" for p, c, q in scheme.edges()]
    assert set(names) == set(twin.names) and len(names) == int(twin.real.sum())
    assert sorted(names, key=lambda n: twin.names[n]) == names  # numbered as MIB's score matrix
    if (layers, heads, parallel) == (12, 12, False):
        assert (len(scheme.nodes()), len(names)) == (158, 32491)


@pytest.mark.parametrize("absolute", [True, False])
def test_budget_circuits_are_mibs_topn_then_prune(absolute):
    """At every MIB budget, the same pruned circuit as the twin's apply_topn + prune."""
    twin = MibTwin(3, 2, False)
    scheme = scheme_from_cfg({"n_layers": 3, "n_heads": 2, "parallel_attn_mlp": False, "d_model": 8}, lambda k: "")
    edges = scheme.edges()
    gen = torch.Generator().manual_seed(0)
    flat = torch.randn(len(edges), generator=gen, dtype=torch.float64) ** 3  # distinct: MIB's argsort leaves ties unordered
    dense = torch.zeros(twin.n_forward, twin.n_backward, dtype=torch.float64)
    where = [twin.names[f"{p}->{c}" if q is None else f"{p}->{c}<{q}>"] for p, c, q in edges]
    for value, (i, j) in zip(flat.tolist(), where, strict=True):
        dense[i, j] = value
    sizes = []
    for pct in (*PERCENTAGES, 0.3, 0.7):
        n = int(pct * len(edges))
        ours = mib_circuit(scheme, flat, n, absolute)
        theirs = twin.topn_pruned(dense, n, absolute)
        assert [bool(theirs[i, j]) for i, j in where] == ours.tolist(), (pct, n)
        sizes.append((n, int(ours.sum())))
    assert any(kept < n for n, kept in sizes)  # the prune did something


@pytest.fixture(scope="module")
def llama():
    model, task = gna.load_toy("llama"), gna.toy_task("llama", n=8, seed=0)
    encoded = task.encode(model.tokenizer)
    return model, task, task.corrupted(), gna.candidate_logit_diff(encoded.candidate_ids, encoded.correct)


def test_edge_budget_scores_follow_mibs_definition(llama):
    """Sizes int(p * n), the twin's pruned circuits, f from m(C), m(∅), m(N), MIB's areas."""
    model, task, corrupt, metric = llama
    graph = gna.mib_attribution(model, task, corrupt, metric, progress=False)
    score = gna.circuit_score(model, task, corrupt, metric, graph, unit="edge", path="direct", absolute=False, progress=False)
    n = graph.n_edges
    assert n == 110 and score.sizes.tolist() == [int(p * n) for p in PERCENTAGES]
    twin = MibTwin(2, 4, False)
    dense = torch.zeros(twin.n_forward, twin.n_backward, dtype=torch.float64)
    for name, value in zip(graph.edge_names(), graph.scores.tolist(), strict=True):
        dense[twin.names[name]] = value
    assert score.kept.tolist() == [int(twin.topn_pruned(dense, k, False).sum()) for k in score.sizes.tolist()]
    assert score.metric[-1] == pytest.approx(score.metric_full, abs=1e-4)  # every edge kept: the clean model
    expected = (score.metric - score.metric_empty) / (score.metric_full - score.metric_empty)
    torch.testing.assert_close(score.faithfulness, expected)
    under, from_1 = _areas(score.faithfulness.tolist())
    assert (score.cpr, score.cmd) == (pytest.approx(under), pytest.approx(from_1))
    with pytest.raises(GnaValueError, match="pass path='direct'"):  # circuit_score's default path='all' is the heads' graph
        gna.circuit_score(model, task, corrupt, metric, graph, unit="edge", progress=False)
    clean = model.logits(task)
    assert score.metric_full == pytest.approx(float(metric(clean).float().mean()), rel=1e-4)


def test_round_trips_both_families(llama, tmp_path):
    """Scores, membership and nodes come back the same, for a Transformer and an SSM."""
    model, task, corrupt, metric = llama
    mamba = gna.load_toy("mamba2")
    mtask = gna.toy_task("mamba2", n=8, seed=0)
    menc = mtask.encode(mamba.tokenizer)
    cases = [
        (model, gna.mib_attribution(model, task, corrupt, metric, progress=False)),
        (
            mamba,
            gna.mib_attribution(
                mamba, mtask, mtask.corrupted(), gna.candidate_logit_diff(menc.candidate_ids, menc.correct), progress=False
            ),
        ),
    ]
    for m, graph in cases:
        written = gna.to_mib(graph, tmp_path / "g.json", model=m, n_edges=graph.n_edges // 10)
        back = gna.from_mib(tmp_path / "g.json", m)
        assert torch.equal(back.scores, written.scores) and torch.equal(back.in_graph, written.in_graph)
        assert torch.equal(back.nodes_in_graph, written.nodes_in_graph) and 0 < int(back.in_graph.sum()) <= graph.n_edges // 10
        assert back.circuit() == [e for e, k in zip(graph.edges(), written.in_graph.tolist(), strict=True) if k]
    data = json.loads((tmp_path / "g.json").read_text())
    heads_only = gna.mib_attribution(model, task, corrupt, metric, path="all", progress=False)  # head -> head port edges
    gna.to_mib(heads_only, tmp_path / "all.json", model=model)
    back = gna.from_mib(tmp_path / "all.json", model)
    assert torch.equal(back.scores.isnan(), heads_only.scores.isnan()) and int((~back.scores.isnan()).sum()) == 48
    assert torch.equal(back.scores.nan_to_num(), heads_only.scores.nan_to_num())
    assert data["cfg"]["family"] == "mamba2" and "s1.h7" in data["nodes"] and "s0.h0->s1.h3<dt>" in data["edges"]
    assert len(data["edges"]) == 417 and not any(name.startswith(("a", "m")) for name in data["nodes"])


def test_a_transformer_file_is_mibs_json(llama, tmp_path):
    """What MIB's to_json writes, read back: its cfg's four keys, every edge, the scores."""
    model = llama[0]
    twin = MibTwin(2, 4, False)
    gen = torch.Generator().manual_seed(1)
    edges = {name: {"score": float(torch.randn(1, generator=gen)), "in_graph": bool(i % 3 == 0)} for i, name in enumerate(twin.names)}
    nodes = {name: {"in_graph": True} for name in twin.nodes}
    cfg = {"n_layers": 2, "n_heads": 4, "parallel_attn_mlp": False, "d_model": 64}
    (tmp_path / "mib.json").write_text(json.dumps({"cfg": cfg, "nodes": nodes, "edges": edges}))
    graph = gna.from_mib(tmp_path / "mib.json", model)
    assert dict(zip(graph.edge_names(), graph.scores.tolist(), strict=True)) == {k: v["score"] for k, v in edges.items()}
    gna.to_mib(graph, tmp_path / "ours.json", model=model)
    ours = json.loads((tmp_path / "ours.json").read_text())
    assert ours["cfg"] == cfg and set(ours["edges"]) == set(edges) and list(ours["nodes"]) == twin.nodes


def test_rankings_and_circuits_round_trip(llama, tmp_path):
    model, task, corrupt, metric = llama
    ranking = [(gna.Head(0, h), gna.Head(1, 0), "k") for h in (2, 0, 3, 1)]
    score = gna.circuit_score(model, task, corrupt, metric, ranking, progress=False)
    gna.to_mib(score, tmp_path / "r.json", model=model)
    back = gna.from_mib(tmp_path / "r.json", model)
    assert back.ranking()[: len(score.ranking)] == score.ranking and int((~torch.isnan(back.scores)).sum()) == len(score.ranking)
    heads = [gna.Head(1, 0), gna.Head(0, 3), gna.Head(0, 1)]
    by_head = gna.circuit_score(model, task, corrupt, metric, heads, progress=False)  # the other 5 heads follow
    gna.to_mib(by_head, tmp_path / "h.json", model=model)
    nodes = json.loads((tmp_path / "h.json").read_text())["nodes"]
    ranked = sorted((v["score"], n) for n, v in nodes.items() if "score" in v)[::-1]
    assert [n for _, n in ranked][:3] == ["a1.h0", "a0.h3", "a0.h1"] and len(ranked) == 8 and "score" not in nodes["m0"]
    back = gna.from_mib(tmp_path / "h.json", model)
    assert back.node_scores is not None and int((~back.node_scores.isnan()).sum()) == 8
    circuit = SimpleNamespace(gather=[gna.Head(0, 1)], aggregate=[gna.Head(1, 2)])
    gna.to_mib(circuit, tmp_path / "c.json", model=model)
    data = json.loads((tmp_path / "c.json").read_text())
    heads_in = {n for n, v in data["nodes"].items() if v["in_graph"] and n.startswith("a")}
    assert heads_in == {"a0.h1", "a1.h2"}
    kept = {n for n, v in data["edges"].items() if v["in_graph"]}
    assert "a0.h1->a1.h2<q>" in kept and "a0.h1->m0" in kept and "a1.h2->logits" in kept
    assert not any("a0.h0" in n or "a1.h0" in n for n in kept)
    back = gna.from_mib(tmp_path / "c.json", model)
    assert sorted(e for e, k in zip(back.edge_names(), back.in_graph.tolist(), strict=True) if k) == sorted(kept)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d.pop("cfg"), "'cfg' is missing"),
        (lambda d: d["cfg"].update(n_layers=3), "cfg['n_layers'] is 3; the model's is 2"),
        (lambda d: d["nodes"].update({"a7.h0": {"in_graph": True}}), "nodes['a7.h0']: the model's graph has no node 'a7.h0'"),
        (
            lambda d: d["edges"].update({"input->a1.h0<x>": {"score": 1.0, "in_graph": True}}),
            "edges['input->a1.h0<x>']: port <x>: a1.h0's ports are",
        ),
        (
            lambda d: d["edges"].update({"a1.h0->a0.h1<q>": {"score": 1.0, "in_graph": True}}),
            "edges['a1.h0->a0.h1<q>']: a1.h0 does not precede a0.h1",
        ),
        (lambda d: d["edges"]["input->m0"].update(score="big"), "edges['input->m0']['score'] is 'big': expected a number"),
        (lambda d: d["edges"]["input->m0"].update(in_graph=1), "edges['input->m0']['in_graph'] is 1: expected true or false"),
        (lambda d: d["nodes"]["m0"].update(neurons=[True] * 64), "nodes['m0'] has neurons: MIB's neuron-level circuits are not read"),
    ],
)
def test_errors_name_the_entry_and_field(llama, tmp_path, edit, expected):
    model = llama[0]
    graph = gna.from_mib(_write_full(tmp_path), model)
    gna.to_mib(graph, tmp_path / "f.json", model=model)
    data = json.loads((tmp_path / "f.json").read_text())
    edit(data)
    (tmp_path / "f.json").write_text(json.dumps(data, indent=1))
    with pytest.raises(GnaValueError) as error:
        gna.from_mib(tmp_path / "f.json", model)
    assert expected in str(error.value) and "f.json" in str(error.value)
    if "cfg" not in expected:  # an entry: its line in the file too
        key = next(k for k in ("input->a1.h0<x>", "a1.h0->a0.h1<q>", "input->m0", "a7.h0", "m0") if f"['{k}']" in expected)
        lines = (tmp_path / "f.json").read_text().splitlines()
        line = next(i for i, text in enumerate(lines, 1) if json.dumps(key) in text)
        assert f"line {line}," in str(error.value)


def _write_full(tmp_path):
    twin = MibTwin(2, 4, False)
    data = {
        "cfg": {"n_layers": 2, "n_heads": 4, "parallel_attn_mlp": False, "d_model": 64},
        "nodes": {n: {"in_graph": True} for n in twin.nodes},
        "edges": {n: {"score": float(i), "in_graph": True} for i, n in enumerate(twin.names)},
    }
    (tmp_path / "full.json").write_text(json.dumps(data))
    return tmp_path / "full.json"


def test_hybrid_scheme_names_both_kinds():
    """FalconH1's layers hold 4 attention heads (q, k, v) and 8 SSM heads (x, B, C, dt, gate)
    side by side, then an MLP: counted by hand, 846 edges."""
    model = gna.load_toy("falcon_h1")
    scheme = scheme_of(model)
    assert scheme.family == "falcon_h1" and scheme.to_mib(gna.Head(1, 5)) == "s1.h1" and scheme.to_mib(gna.Head(1, 3)) == "a1.h3"
    assert scheme.to_gna("s1.h1") == gna.Head(1, 5) and scheme.to_gna("m0") == "L0MLP" and scheme.to_gna("input") == "embed"
    ports = 4 * 3 + 8 * 5
    layer0 = 1 * ports + (1 + 12)  # input -> every port; input and the 12 heads -> m0
    layer1 = 14 * ports + (14 + 12)  # input, layer 0's heads and m0 -> every port; those and layer 1's heads -> m1
    assert len(scheme.edges()) == layer0 + layer1 + (1 + 2 * 13) == 846  # + every sender -> logits
    assert not any(p.startswith(("a1.", "s1.")) and c.startswith(("a1.", "s1.")) for p, c, _ in scheme.edges())  # side by side: no edge


def twin_evaluate_graph(model, clean, corrupt, metric, twin: MibTwin, in_graph: torch.Tensor) -> float:
    """MIB's ``evaluate_graph`` (``intervention="patching"``) on the HF Llama blocks, by its
    code's recipe: ``activation_difference`` ``[batch, pos, n_forward, d_model]`` gets the
    corrupted run's outputs added and the patched run's subtracted; each node in the graph
    whose parent edges are not all in it reads ``einsum(difference[:, :, :prev_index],
    1 - in_graph[:prev_index, backward])`` added to its input (heads: their q/k/v inputs)."""
    hf, H = model.hf_model, twin.H
    dh = hf.config.hidden_size // H
    ids = [model.to_batch(x).input_ids for x in (clean, corrupt)]
    into = (in_graph.any(0).float() @ twin.f2b.float().T) > 0
    into[0] = True
    nodes_in = in_graph.any(1) & into
    missing = 1.0 - in_graph.float()
    diff = torch.zeros(*ids[0].shape, twin.n_forward, hf.config.hidden_size)
    sign = {"value": 1.0}

    def store(index, heads=False):
        def hook(module, args, output=None):
            value = args[0] if output is None else output
            if heads:  # o_proj's input: hook_result, each head's write
                z = value.view(*value.shape[:2], H, dh)
                diff[:, :, index : index + H] += sign["value"] * torch.einsum("bphe,dhe->bphd", z, module.weight.view(-1, H, dh))
            else:
                diff[:, :, index] += sign["value"] * value

        return hook

    def prev(layer, mlp=False):
        return 1 + layer * (H + 1) + (H if mlp else 0)

    handles = []
    try:
        for layer, block in enumerate(hf.model.layers):
            if layer == 0:
                handles.append(block.input_layernorm.register_forward_pre_hook(store(0)))
            handles.append(block.self_attn.o_proj.register_forward_pre_hook(store(prev(layer), heads=True)))
            handles.append(block.mlp.register_forward_hook(store(prev(layer, True))))
        with torch.no_grad():
            hf(ids[1])  # corrupted: difference += outputs
            sign["value"] = -1.0
            for layer, block in enumerate(hf.model.layers):
                heads_in = any(nodes_in[prev(layer) + h] for h in range(H))
                if heads_in:
                    handles += _qkv_inputs(block, layer, diff, missing, H, dh, prev(layer))
                if nodes_in[prev(layer, True)]:
                    col = layer * (3 * H + 1) + 3 * H
                    handles.append(
                        block.post_attention_layernorm.register_forward_pre_hook(
                            _add(diff, missing[: prev(layer, True), col], prev(layer, True))
                        )
                    )
            handles.append(hf.model.norm.register_forward_pre_hook(_add(diff, missing[:, -1], twin.n_forward)))
            logits = hf(ids[0]).logits
    finally:
        for handle in handles:
            handle.remove()
    return float(metric(logits).float().mean())


def _add(diff, column, prev_index):
    def hook(module, args):
        return (args[0] + torch.einsum("bpnd,n->bpd", diff[:, :, :prev_index], column), *args[1:])

    return hook


def _qkv_inputs(block, layer, diff, missing, H, dh, prev_index):
    """hook_q_input / hook_k_input / hook_v_input: the stream per head plus its update."""
    attn, waiting = block.self_attn, {}

    def pre(module, args):
        for i, proj in enumerate((attn.q_proj, attn.k_proj, attn.v_proj)):
            col = layer * (3 * H + 1) + i * H
            x = args[0][:, :, None] + torch.einsum("bpnd,nh->bphd", diff[:, :, :prev_index], missing[:prev_index, col : col + H])
            waiting[proj] = torch.einsum("bphd,hed->bphe", module.forward(x), proj.weight.view(H, dh, -1)).flatten(2)

    handles = [block.input_layernorm.register_forward_pre_hook(pre)]
    return handles + [proj.register_forward_hook(lambda m, a, o: waiting.pop(m)) for proj in (attn.q_proj, attn.k_proj, attn.v_proj)]


@pytest.fixture(scope="module")
def held_out(tokenizer):
    """A random Llama of MIB's shape (3 layers of 4 heads, one key/value head per query head),
    never used to write the code: the toy prompts of the suite, the logit difference 5 - 6."""
    hf = tiny_model("llama", seed=3, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4)
    return gna.load(hf, tokenizer=tokenizer, backend="nnsight"), CLEAN, CORRUPT, gna.logit_diff(5, 6)


@pytest.mark.parametrize("which", ["llama", "held_out"])
def test_faithfulness_at_each_budget_is_mibs_evaluate_graph(which, request):
    """path="mib": the same counts, top-k and f at every budget as the twin of MIB's
    evaluate_graph, on the Llama toy and on a held-out random Transformer."""
    model, task, corrupt, metric = request.getfixturevalue(which)
    layers, heads = model.n_layers, model.n_heads
    graph = gna.mib_attribution(model, task, corrupt, metric, progress=False)
    twin = MibTwin(layers, heads, False)
    assert (len(graph.scheme.nodes()), graph.n_edges) == (len(twin.nodes), int(twin.real.sum()))
    score = gna.circuit_score(model, task, corrupt, metric, graph, unit="edge", path="mib", progress=False)
    dense = torch.zeros(twin.n_forward, twin.n_backward, dtype=torch.float64)
    for name, value in zip(graph.edge_names(), graph.scores.tolist(), strict=True):
        dense[twin.names[name]] = value
    full = float(metric(model.logits(task)).float().mean())
    empty = twin_evaluate_graph(model, task, corrupt, metric, twin, torch.zeros_like(twin.real))
    ours, kept = [], []
    for k in score.sizes.tolist():
        circuit = twin.topn_pruned(dense, k, True)
        kept.append(int(circuit.sum()))
        ours.append((twin_evaluate_graph(model, task, corrupt, metric, twin, circuit) - empty) / (full - empty))
    assert empty == pytest.approx(float(metric(model.logits(corrupt)).float().mean()), abs=1e-4)  # no edge: the corrupted run
    assert score.kept.tolist() == kept
    torch.testing.assert_close(score.faithfulness, torch.tensor(ours, dtype=torch.float64), atol=1e-4, rtol=1e-4)
    assert any(abs(f) > 0.05 and abs(f - 1) > 0.05 for f in ours)  # a circuit strictly between the ends is compared
