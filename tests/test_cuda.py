"""On a GPU, every backend and architecture gives the numbers it gives on the CPU.

Skipped without CUDA (CI has none). Each model is built once on the CPU, copied to the
GPU, and loaded on both backends in both places; every operation is run on the four
handles and compared with the CPU run of the same backend (float32: 1e-4 on logits and
scores). The reference is the CPU path the rest of the suite checks against raw hooks.
Without ``mamba-ssm`` / ``causal-conv1d`` installed, HF's Mamba and Mamba-2 use their
PyTorch path on the GPU too; with them, the fused path must still reach every site (a
tlens tap that never fires raises, and nnsight fails on a module that never runs).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

import gna_interp as gna
from gna_interp.models.tiny import tiny_model, word_tokenizer

GPU = os.environ.get("GNA_TEST_GPU", "cuda")  # "cpu" runs the same checks CPU against CPU (a dry run of this file)
pytestmark = pytest.mark.skipif(GPU == "cuda" and not torch.cuda.is_available(), reason="needs a CUDA GPU")

TOL = 1e-4
CLEAN = ["w5 w6 w7 w8 w9 w10", "w11 w12 w13 w14 w15 w16", "w17 w18 w19 w20 w21 w22"]
CORRUPT = ["w5 w30 w7 w8 w9 w10", "w11 w12 w31 w14 w15 w16", "w40 w18 w19 w20 w41 w22"]
FAMILIES = ("llama", "mamba", "mamba2", "falcon_h1")


@pytest.fixture(scope="module", params=FAMILIES)
def handles(request):
    """``{(backend, device): GnaModel}`` over one set of weights."""
    hf = tiny_model(request.param, seed=0)
    tokenizer = word_tokenizer()
    out = {}
    for device in ("cpu", GPU):
        for backend in ("nnsight", "tlens"):
            out[backend, device] = gna.load(copy.deepcopy(hf).to(device), tokenizer=tokenizer, backend=backend)
    return request.param, out


def _agree(cpu: torch.Tensor, gpu: torch.Tensor, what: str) -> None:
    difference = (cpu.detach().float().cpu() - gpu.detach().float().cpu()).abs().nan_to_num(0).max().item()
    assert difference < TOL, f"{what}: CPU and GPU differ by {difference}"


def _heads(model: gna.GnaModel) -> list[gna.Head]:
    """One head of each mixer of the last two layers."""
    heads = []
    for spec in model.layer_specs[-2:]:
        heads += [gna.Head(spec.layer, mixer.offset + mixer.n_heads - 1) for mixer in spec.mixers]
    return heads


@pytest.mark.parametrize("backend", ["nnsight", "tlens"])
def test_logits_and_interventions(handles, backend):
    _, models = handles
    cpu, gpu = models[backend, "cpu"], models[backend, GPU]
    assert gpu.device.type == GPU
    heads = _heads(cpu)
    for interventions in ([], [gna.Ablate(heads)], [gna.Patch(heads, source=CORRUPT, positions=[-1])], [gna.SkipLayers([0])]):
        _agree(cpu.logits(CLEAN, interventions), gpu.logits(CLEAN, interventions), f"{backend} {interventions}")


@pytest.mark.parametrize("backend", ["nnsight", "tlens"])
def test_sweeps_path_patching_patterns_and_attribution(handles, backend):
    family, models = handles
    cpu, gpu = models[backend, "cpu"], models[backend, GPU]
    metric = gna.logit_diff(5, 6)
    for name, run in {
        "ablation": lambda m: gna.ablation_sweep(m, CLEAN, None, metric, progress=False).scores,
        "patching": lambda m: gna.patching_sweep(m, CLEAN, CORRUPT, metric, progress=False).scores,
        "attribution": lambda m: gna.attribution_patching(m, CLEAN, CORRUPT, metric).scores,
    }.items():
        _agree(run(cpu), run(gpu), f"{family} {backend} {name}")
    heads = _heads(cpu)
    sender = next(h for h in cpu.heads if cpu.head_position(h) < cpu.head_position(heads[-1]))
    path = [gna.path_patching(m, CLEAN, CORRUPT, metric, senders=[sender], receivers=[heads[-1]]) for m in (cpu, gpu)]
    assert abs(path[0] - path[1]) < TOL, path
    _agree(gna.attention_pattern(cpu, CLEAN, heads), gna.attention_pattern(gpu, CLEAN, heads), f"{family} {backend} patterns")


def test_backends_agree_on_the_gpu(handles):
    family, models = handles
    heads = _heads(models["nnsight", GPU])
    interventions = [gna.Ablate(heads[:1]), gna.Patch(heads[1:], source=CORRUPT)]
    _agree(models["nnsight", GPU].logits(CLEAN, interventions), models["tlens", GPU].logits(CLEAN, interventions), family)


def test_prefix_reuse_and_the_meter_on_the_gpu(handles):
    """A plan started at a later block from the cached clean residual gives the full run's
    logits on the GPU, and the meter counts the blocks it skipped."""
    _, models = handles
    for backend in ("nnsight", "tlens"):
        model = models[backend, GPU]
        late = [gna.Ablate(_heads(model)[-1:])]
        full = model.logits(CLEAN, late)
        with model.prefix_cache(), gna.cost_meter(model) as cost:
            model.logits(CLEAN)  # the clean run fills the cache
            started = model.logits(CLEAN, late)
        _agree(full, started, f"{backend} prefix reuse")
        assert cost.block_rows < 2 * len(CLEAN) * model.n_layers


@pytest.mark.filterwarnings("ignore::gna_interp.discovery.stages.PositionalAnswerWarning")  # the toy Mamba-2 counts options
def test_discover_on_the_toy_on_the_gpu():
    """The bundled toy Mamba-2 on the GPU: the circuit the CPU finds."""
    task = gna.toy_task("mamba2_counting", n=48, seed=4242)
    settings = dict(stages=("heads", "entry", "roles", "joint", "confirm"), progress=False)
    circuits = [gna.discover(gna.load_toy("mamba2_counting", device=device), task, **settings) for device in ("cpu", GPU)]
    assert circuits[0].gather == circuits[1].gather and circuits[0].aggregate == circuits[1].aggregate
    assert circuits[0].accuracy == pytest.approx(circuits[1].accuracy, abs=1e-6)


def test_cartesia_llamba_equals_the_cpu_twin_on_the_same_weights():
    """Cartesia's own Llamba class (mamba-ssm's Triton scan) against the pure-PyTorch twin,
    on the same weights in Cartesia's naming (float32): logits, an ablated head, and the
    rows of a left-padded batch, all through gna. Skipped unless ``cartesia_pytorch`` (and
    its kernels) are installed and a GPU is present."""
    if GPU != "cuda":
        pytest.skip("compares Cartesia's GPU kernel to the twin: needs a CUDA GPU")
    llamba = pytest.importorskip("cartesia_pytorch.Llamba.llamba")
    from gna_interp.models.llamba import tiny_llamba

    twin = tiny_llamba(seed=0)
    real = llamba.LlambaLMHeadModel(twin.config.to_dict(), device=GPU, dtype=torch.float32)
    real.load_state_dict(twin.state_dict(), strict=True)
    tokenizer = word_tokenizer()
    ours, theirs = gna.load(twin, tokenizer=tokenizer), gna.load(real.eval(), tokenizer=tokenizer)
    prompts = ["w5 w6 w7 w8 w9", "w10 w11", *CLEAN]
    head = gna.Head(1, 2)
    for interventions in ([], [gna.Ablate([head])]):
        expected = ours.logits(prompts, interventions)
        got = theirs.logits(prompts, interventions).cpu()
        real_tokens = ours.to_batch(prompts).attention_mask.bool()
        assert (got - expected)[real_tokens].abs().max().item() < 1e-3, interventions
