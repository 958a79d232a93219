"""Circuits of a Transformer toy and an SSM toy as MIB graph files, read back and scored at
MIB's edge budgets (docs/mib.md). Runs on the bundled toys in about a minute on a CPU.

    python examples/mib_circuits.py            # GNA_EXAMPLE_N=32 for fewer prompts

Writes ``mib/<toy>_circuit.json`` (the discovered heads as MIB's circuit) and
``mib/<toy>_scores.json`` (EAP edge scores over MIB's whole graph), then prints, per toy,
the edges of each file, the round trip, and MIB's CPR and CMD at its ten edge budgets.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

import gna_interp as gna

N = int(os.environ.get("GNA_EXAMPLE_N", "64"))
folder = Path("mib")
folder.mkdir(exist_ok=True)

# MIB's graph of GPT-2's shape, from its config alone (no weights): 158 nodes, 32,491 edges.
(folder / "gpt2_shape.json").write_text(
    '{"cfg": {"n_layers": 12, "n_heads": 12, "parallel_attn_mlp": false, "d_model": 768}, "nodes": {}, "edges": {}}'
)
gpt2 = gna.from_mib(folder / "gpt2_shape.json", None)
print(f"GPT-2's shape: {len(gpt2.scheme.nodes())} nodes, {gpt2.n_edges} edges")

for name in ("llama", "mamba2"):
    model, task = gna.load_toy(name), gna.toy_task(name, n=N, seed=1)
    corrupt = task.corrupted()
    encoded = task.encode(model.tokenizer)
    metric = gna.candidate_logit_diff(encoded.candidate_ids, encoded.correct)

    circuit = gna.discover(model, task, progress=False)
    written = gna.to_mib(circuit, folder / f"{name}_circuit.json", model=model)
    read = gna.from_mib(folder / f"{name}_circuit.json", model)
    assert read.circuit() == written.circuit()

    scores = gna.mib_attribution(model, task, corrupt, metric, progress=False)
    gna.to_mib(scores, folder / f"{name}_scores.json", model=model)
    back = gna.from_mib(folder / f"{name}_scores.json", model)
    same = torch.equal(back.scores, scores.scores) and torch.equal(back.in_graph, scores.in_graph)
    heads = ", ".join(str(h) for h in circuit.gather + circuit.aggregate)
    print(f"\n{name}: circuit {len(read.circuit())} of {read.n_edges} edges (heads {heads}); scores read back equal: {same}")

    cmd = gna.circuit_score(model, task, corrupt, metric, back, unit="edge", path="direct", progress=False)
    cpr = gna.circuit_score(model, task, corrupt, metric, back, unit="edge", path="direct", absolute=False, progress=False)
    print(f"  MIB's edge budgets (path='direct'): CPR {cpr.cpr:.3f} (signed scores), CMD {cmd.cmd:.3f} (|score|)")
    print(cmd.to_frame().assign(kept=cmd.kept.tolist()).to_string(index=False))
