"""Every python block of README.md and of the guide (docs/, not docs/records/ or the API
reference) runs as pasted, in page order, one namespace per page (a page's blocks may
build on its earlier blocks, as a reader would run them). The blocks are found and run by
Sybil (https://sybil.readthedocs.io). A block that needs a hub model, a GPU or the network
is preceded by ``<!-- skip: next "reason" -->`` and a note the reader sees; SKIPPED lists
every such block, and a page whose skipped blocks differ from its list fails."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import SkipTest

import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parent.parent
RECORDS = {"dependencies.md"}  # with docs/records/: measurements and maintenance, not the guide
GUIDE = ["README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md") if p.name not in RECORDS)]
# Every page runs in `make test`: the blocks use the 2-layer toys and few prompts (the
# costliest pages, discovery and its report, take seconds each).

# The blocks not run, per page: each needs a hub model, a GPU, the network or data not shipped.
SKIPPED = {
    "docs/backends.md": ["downloads an 8B hub model and needs a GPU"],
    "docs/harness.md": [
        "downloads an 8B hub model and lm-eval's datasets",
        "needs the 8B hub model of the block above",
        "needs the local MMLU rows of the YAML above",
    ],
    "docs/quickstart.md": ["downloads 7B-8B hub models and needs NDIF_API_KEY"],
    "docs/remote.md": ["needs NDIF_API_KEY and the network"],
    "docs/report.md": ["downloads a 1B hub model"],
}

PARSER = Sybil(parsers=[PythonCodeBlockParser(), SkipParser()])


def _tl_edge_granularity() -> bool:
    """Whether this TransformerLens scores edges (3.9, the floors, refuses ``granularity="edge"``):
    docs/parity.md's edge block is skipped where it does not (``tl_edge_granularity``)."""
    from transformer_lens.tools.analysis import attribution_patching

    try:
        attribution_patching.EdgeAttributionConfig(granularity="edge")
    except (AttributeError, NotImplementedError, ValueError):
        return False
    return True


TL_EDGE_GRANULARITY = _tl_edge_granularity()
if not TL_EDGE_GRANULARITY:
    SKIPPED["docs/parity.md"] = ["this TransformerLens refuses granularity='edge'"]


def run_page(page: str) -> list[str]:
    """Run every python block of ``page`` in order; return the reasons of the skipped ones."""
    skipped = []
    document = PARSER.parse(ROOT / page)
    document.namespace["tl_edge_granularity"] = TL_EDGE_GRANULARITY  # read by a conditional skip
    for example in document:
        try:
            example.evaluate()
        except SkipTest as skip:
            skipped.append(str(skip))
    return skipped


SLOW_PAGES = {"docs/mib.md", "docs/own_family.md"}
"""Pages whose blocks train or score for more than a few seconds (MIB's budgets of two toys, a
Qwen3 trained 400 steps): run by `make test-slow` (and CI), not `make test`."""


@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.slow) if p in SLOW_PAGES else p for p in GUIDE])
def test_page_blocks_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # blocks that write files (a report) write them here
    monkeypatch.setenv("HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", "1"))
    assert run_page(page) == SKIPPED.get(page, []), f"{page}: the blocks skipped are not the ones SKIPPED lists"


def test_guide_pages_are_short():
    """No guide page is over 400 lines (measurements and history go to docs/records/)."""
    long = {p: n for p in GUIDE if p != "README.md" and (n := len((ROOT / p).read_text().splitlines())) > 400}
    assert not long, long
