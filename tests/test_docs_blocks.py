"""Every python block of README.md and of the guide (docs/, not docs/records/ or the API
reference) runs as pasted, in page order, one namespace per page (a page's blocks may
build on its earlier blocks, as a reader would run them). The blocks are found and run by
Sybil (https://sybil.readthedocs.io). A block that needs a hub model, a GPU or the network
is preceded by ``<!-- skip: next "reason" -->`` and a visible note; the test reports it as
skipped with that reason,."""

from __future__ import annotations

import os
from pathlib import Path
from unittest import SkipTest

import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parent.parent
GUIDE = ["README.md"] + sorted(
    f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md") if p.name not in {"architecture.md", "dependencies.md"}
)
# Pages whose blocks cost more than a few seconds (toy discovery, training): `make test-slow`.
SLOW = {"docs/layer_swap.md", "docs/discovery.md", "docs/report.md"}

PARSER = Sybil(parsers=[PythonCodeBlockParser(), SkipParser()])


def run_page(page: str) -> list[str]:
    """Run every python block of ``page`` in order; return the reasons of the skipped ones."""
    skipped = []
    for example in PARSER.parse(ROOT / page):
        try:
            example.evaluate()
        except SkipTest as skip:
            skipped.append(str(skip))
    return skipped


@pytest.mark.parametrize("page", [pytest.param(p, marks=pytest.mark.slow) if p in SLOW else p for p in GUIDE])
def test_page_blocks_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # blocks that write files (a report) write them here
    monkeypatch.setenv("HF_HUB_OFFLINE", os.environ.get("HF_HUB_OFFLINE", "1"))
    for reason in run_page(page):
        assert reason.strip(), f"{page}: a block is skipped without a reason"


def test_guide_pages_are_short():
    """No guide page is over 400 lines (measurements and history go to docs/records/)."""
    long = {p: n for p in GUIDE if p != "README.md" and (n := len((ROOT / p).read_text().splitlines())) > 400}
    assert not long, long
