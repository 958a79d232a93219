"""MIB's graphs drawn (`gna_interp.viz.mib_view`): every node placed on its layer's row, the
figure's count of edges equal to the file's own ``in_graph`` entries (read with `json`, not the
library), and the report's section side by side for an attention and an SSM circuit."""

from __future__ import annotations

import json
import re
import warnings

import pytest
import torch

import gna_interp as gna
from gna_interp.core.errors import GnaTypeError
from gna_interp.scoring.mib import MibGraph
from gna_interp.scoring.mib_graph import scheme_of
from gna_interp.viz.mib_view import mib_section, node_places


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    folder = tmp_path_factory.mktemp("mib")
    out = []
    for name in ("llama", "mamba2"):
        model, task = gna.load_toy(name), gna.toy_task(name, n=16, seed=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            circuit = gna.discover(model, task, progress=False)
        gna.to_mib(circuit, folder / f"{name}.json", model=model)
        out.append((name, model, task, circuit, folder / f"{name}.json"))
    return out


def test_every_node_sits_on_its_layers_row():
    model = gna.load_toy("falcon_h1")  # a hybrid: attention and SSM heads in one layer
    scheme = scheme_of(model)
    n_edges, n_nodes = len(scheme.edges()), len(scheme.nodes())
    empty = MibGraph(scheme, torch.zeros(n_edges), torch.zeros(n_edges, dtype=torch.bool), torch.zeros(n_nodes, dtype=torch.bool))
    places = node_places(empty)
    assert set(places) == set(scheme.nodes())
    for node, (_, y, kind) in places.items():
        if node == "input":
            assert y == -1 and kind == ""
        elif node == "logits":
            assert y == model.n_layers
        elif node.startswith("m"):
            assert y == int(node[1:]) + 0.5 and kind == "m"
        else:
            assert y == int(re.match(r"[as](\d+)", node).group(1)) and kind == node[0]
    kinds = {kind for _, _, kind in places.values()}
    assert {"a", "s"} <= kinds  # both kinds of head drawn


def test_the_report_draws_each_file_side_by_side(written, tmp_path):
    graphs, items = [], []
    for name, model, task, circuit, path in written:
        graph = gna.from_mib(path, model)
        graphs.append((f"toy {name}", graph))
        items.append((circuit, model, task))
        raw = json.loads(path.read_text())
        kept = sum(1 for entry in raw["edges"].values() if entry["in_graph"])
        assert f"toy {name}: {kept} of {len(raw['edges'])} edges" in mib_section([(f"toy {name}", graph)])
    page = gna.write_report(items, tmp_path / "report", mib=graphs).read_text()
    section = page[page.index("Circuits in MIB") :]
    assert section.count('<div class="mib-graph">') == 2 and "toy llama:" in section and "toy mamba2:" in section
    with pytest.raises(GnaTypeError, match="mib=\\[\\]"):
        mib_section([])
