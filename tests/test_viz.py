"""Issue 3, test 5: views open offline (no external script URL), carry the token labels
and the right numbers; where Node.js is available, the inlined scripts are run headless
and must render the circuitsvis attention component into an element of the page."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess

import pytest
import torch

import gna_interp as gna
from gna_interp.models.tiny import tiny_model
from gna_interp.viz import AttentionView, attention_view, heatmap_png, side_by_side
from gna_interp.viz.views import bundle_script

from .conftest import PROMPTS

SCRIPT = re.compile(r"<script[^>]*>(.*?)</script>", re.S)
RENDER_CALL = re.compile(r'CircuitsVis\.render\(\s*"([^"]+)",\s*CircuitsVis\.(\w+),\s*(\{.*\})\s*\)\s*$', re.S)


@pytest.fixture(scope="module")
def mamba(tokenizer):
    return gna.load(tiny_model("mamba", seed=10), tokenizer=tokenizer)


def render_props(html: str) -> list[tuple[str, str, dict]]:
    """``(element id, component, props)`` of every circuitsvis render call in the page."""
    calls = []
    for script in SCRIPT.findall(html):
        match = RENDER_CALL.search(script)
        if match:
            calls.append((match.group(1), match.group(2), json.loads(match.group(3))))
    return calls


def assert_offline(html: str) -> None:
    assert not re.search(r"<script[^>]*\bsrc\s*=", html, re.I), "a script loaded from a URL"
    assert not re.search(r"""(import|from)\s*\(?\s*["']https?://""", html), "a JavaScript module imported from a URL"
    assert "unpkg.com" not in html and "cdn.jsdelivr" not in html
    assert not re.search(r"<link[^>]*\bhref\s*=\s*[\"']https?://", html, re.I), "a stylesheet from a URL"


def test_softmax_view_is_offline_with_labels_and_hf_numbers(llama_nnsight, llama_hf):
    view = attention_view(llama_nnsight, PROMPTS, [gna.Head(2, 4), gna.Head(0, 1)], row=1)
    html = view.html
    assert_offline(html)
    assert view._repr_html_() == html
    (element, component, props) = render_props(html)[0]
    assert f'id="{element}"' in html and component == "AttentionHeads"
    assert props["tokens"] == ["<bos>", "w10", "w11"], "the prompt's own tokens, padding dropped"
    assert props["attentionHeadNames"] == ["L2H4", "L0H1"]
    eager = copy.deepcopy(llama_hf)  # the pristine model, with HF's eager attention
    eager.config._attn_implementation = "eager"
    ids = llama_nnsight.to_batch(PROMPTS[1]).input_ids
    with torch.no_grad():
        weights = eager(input_ids=ids, output_attentions=True).attentions
    expected = torch.stack([weights[2][0, 4], weights[0][0, 1]])
    assert torch.allclose(torch.tensor(props["attention"]), expected, atol=1e-6)


def test_ssm_view_raw_values_and_side_by_side(llama_tlens, mamba):
    left = attention_view(llama_tlens, PROMPTS, gna.Head(1, 3), row=2, title="Transformer")
    right = attention_view(mamba, PROMPTS, gna.Head(1, 7), row=2, normalize=None, title="Mamba <1>")
    both = side_by_side(left, right)
    assert_offline(both.html)
    calls = render_props(both.html)
    assert len(calls) == 2 and "Transformer" in both.html and "Mamba &lt;1&gt;" in both.html
    raw = gna.attention_pattern(mamba, [PROMPTS[2]], [gna.Head(1, 7)])[0]
    props = calls[1][2]
    assert right.panels[0].signed and props["minValue"] == -props["maxValue"]
    assert torch.allclose(torch.tensor(props["attention"]), raw, atol=1e-7)
    assert props["tokens"] == ["<bos>", *PROMPTS[2].split()]


def test_saved_files(tmp_path, mamba):
    view = attention_view(mamba, PROMPTS, [gna.Head(0, 0), gna.Head(0, 5)])
    page = view.save(tmp_path / "view.html").read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and view.html in page
    png = view.save(tmp_path / "view.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    data = heatmap_png(mamba, PROMPTS, gna.Head(1, 1), row=3, path=tmp_path / "one.png")
    assert data == (tmp_path / "one.png").read_bytes() and data[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    image = matplotlib.image.imread(tmp_path / "one.png")
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 100


def test_view_bad_input(mamba):
    with pytest.raises(ValueError, match=r"row=4 out of range: the inputs have prompts 0..3"):
        attention_view(mamba, PROMPTS, gna.Head(0, 0), row=4)
    with pytest.raises(TypeError, match=r"heatmap_png draws one head"):
        heatmap_png(mamba, PROMPTS, [gna.Head(0, 0)])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"side_by_side needs at least two AttentionView values"):
        side_by_side(attention_view(mamba, PROMPTS, gna.Head(0, 0)))
    with pytest.raises(ValueError, match=r"max_heads=0: expected a positive int"):
        AttentionView(attention_view(mamba, PROMPTS, gna.Head(0, 0)).panels).png(max_heads=0)


NODE_CHECK = r"""
const fs = require("fs"), vm = require("vm");
const html = fs.readFileSync(process.argv[2], "utf8");
const scripts = [...html.matchAll(/<script[^>]*>([\s\S]*?)<\/script>/g)].map((m) => m[1]);
function stub() {  // a document that accepts anything: enough for the bundle to load
  const f = function () { return stub(); };
  return new Proxy(f, { get: (t, k) => (k === Symbol.toPrimitive ? () => "" : k in t ? t[k] : stub()), set: () => true });
}
const calls = [];
// One global scope for every script, as in a page: the bundle defines CircuitsVis, each view's call uses it.
const box = { console, setTimeout, clearTimeout, TextEncoder, TextDecoder, performance, navigator: { userAgent: "headless" } };
box.window = box; box.self = box; box.globalThis = box; box.document = stub();
box.__record = (id, component, props) => {
  const name = Object.keys(box.CircuitsVis).find((k) => box.CircuitsVis[k] === component);
  calls.push({ id, component: name, tokens: props.tokens });
};
vm.createContext(box);  // no fetch, no require, no import: the page must be self-contained
for (const script of scripts) vm.runInContext(script.replace("CircuitsVis.render(", "__record("), box);
console.log(JSON.stringify(calls));
"""


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js to run the inlined scripts headless")
def test_inlined_scripts_run_headless(tmp_path, mamba, llama_tlens):
    view = side_by_side(attention_view(mamba, PROMPTS, gna.Head(1, 2)), attention_view(llama_tlens, PROMPTS, gna.Head(0, 0), row=1))
    page = view.save(tmp_path / "page.html")
    (tmp_path / "check.js").write_text(NODE_CHECK)
    result = subprocess.run(["node", str(tmp_path / "check.js"), str(page)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    calls = json.loads(result.stdout.strip().splitlines()[-1])
    assert [call["component"] for call in calls] == ["AttentionHeads", "AttentionHeads"]
    text = page.read_text()
    assert all(f'<div id="{call["id"]}" style="margin: 15px 0;"></div>' in text for call in calls), "each view's element, closed"
    assert text.count(bundle_script()) == 1, "one bundle for both panels"
    assert calls[0]["tokens"] == ["<bos>", *PROMPTS[0].split()] and calls[1]["tokens"] == ["<bos>", *PROMPTS[1].split()]


def test_the_scan_figure_marks_layers_cleared_in_a_group():
    """A layer the screened layer scan cleared in a group holds its group's value: drawn
    hollow and named as such, never as a layer skipped alone."""
    from gna_interp.viz.figures import scan_figure

    scan = [0.97, 0.97, 0.28, 0.23]
    grouped = scan_figure(None, scan, 0.97, 0.25, [[0, 1], [0, 1], [2, 2], [3, 3]])
    alone = scan_figure(None, scan, 0.97, 0.25, [[0, 0], [1, 1], [2, 2], [3, 3]])
    assert grouped is not None and "cleared in a group" in grouped
    assert alone is not None and "cleared in a group" not in alone
    assert "cleared in a group" not in (scan_figure(None, scan, 0.97, 0.25) or "")
