"""A plan knows that it ran: a site whose module the model did not call raises.

A fused kernel (mamba-ssm's ``mamba_split_conv1d_scan_combined``, a kernel package that
replaces a mixer's forward) computes a mixer through its modules' *weights*, so a hook on
the out-projection or the gated norm never runs and an edit there would be a silent no-op
(state-spaces/mamba#59). `fused_kernel` stands in for one on the CPU: while the mixer runs,
each named child is replaced by a twin that computes the same function on the same weights
through its class's own ``forward`` (no torch hook, bridge hook point or nnsight envoy of
the hooked module sees the call). The stand-in is checked to be exact (same logits as the
plain model), and each backend must then refuse, naming the site and the module path.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import pytest
import torch
from torch import nn

import gna_interp as gna
from gna_interp.backends.jobs import Job
from gna_interp.core.errors import GnaError, SiteNotFiredError
from gna_interp.core.plan import Edit, Plan, Site, SiteKind
from gna_interp.models.tiny import tiny_model

from .conftest import CLEAN, no_hooks_left

# family -> (the mixer a kernel replaces in layer 1, the children it does not call, their site kinds)
KERNELS = {
    "llama": ("model.layers.1.self_attn", ("o_proj",), (SiteKind.HEADS,)),
    "mamba2": ("backbone.layers.1.mixer", ("out_proj", "norm"), (SiteKind.HEADS, SiteKind.PRE_NORM)),
}


def _leaf(module: nn.Module) -> nn.Module:
    """The HF module under a TransformerLens bridge component (the module itself on nnsight)."""
    while "_original_component" in module._modules:
        module = module._modules["_original_component"]
    return module


class _Twin(nn.Module):
    """``hooked``'s function on ``hooked``'s weights, through its class's ``forward``: a call
    no hook of ``hooked`` (or of its bridge wrapper) sees."""

    def __init__(self, hooked: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "leaf", _leaf(hooked))  # not registered: no submodule, no hooks

    def forward(self, *args, **kwargs):
        return type(self.leaf).forward(self.leaf, *args, **kwargs)


@contextmanager
def fused_kernel(model: gna.GnaModel, mixer: str, children: Sequence[str]) -> Iterator[None]:
    """While the module at ``mixer`` runs, every slot holding one of its ``children`` (the HF
    module's and a bridge's alias alike) holds a `_Twin` instead; restored after each call
    and on exit, exceptions included."""
    root = model.hf_model
    parent = root.get_submodule(mixer)
    hooked = [root.get_submodule(f"{mixer}.{name}") for name in children]
    slots = [(owner, key, child) for owner in parent.modules() for key, child in owner._modules.items() if any(child is h for h in hooked)]
    assert len(slots) >= len(children)

    def swap(module, args):
        for owner, key, child in slots:
            owner._modules[key] = _Twin(child)

    def restore(*_):
        for owner, key, child in slots:
            owner._modules[key] = child

    handles = [parent.register_forward_pre_hook(swap), parent.register_forward_hook(restore)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        restore()


@pytest.fixture(scope="module", params=[(family, backend) for family in KERNELS for backend in ("tlens", "nnsight")], ids=str)
def model(request, tokenizer):
    family, backend = request.param
    return gna.load(tiny_model(family, seed=0), tokenizer=tokenizer, backend=backend)


def _sites(model) -> list[tuple[Site, str]]:
    """The kernel's sites at layer 1 and the module path each lives on."""
    mixer, children, kinds = KERNELS[model.arch.family]
    return [(Site(kind, 1), f"{mixer}.{child}") for kind, child in zip(kinds, children, strict=True)]


def test_the_stand_in_computes_what_the_model_computes(model):
    """An identity: the stand-in kernel changes no number, so without the check an edit it
    bypasses would vanish without a trace in the logits."""
    plain = model.logits(CLEAN)
    with fused_kernel(model, *KERNELS[model.arch.family][:2]):
        assert torch.equal(model.logits(CLEAN), plain)


def test_a_site_a_kernel_bypasses_raises_naming_it(model):
    """Editing or capturing each bypassed site raises `SiteNotFiredError` naming the site and
    the module path; the same edit without the kernel changes the logits (it is not a no-op
    by itself); nothing is left behind by the raise."""
    batch = model.to_batch(CLEAN)
    plain = model.logits(CLEAN)
    for site, path in _sites(model):
        zero = Plan()
        zero.add(site, Edit(torch.ones(1, dtype=torch.bool), torch.zeros(())))
        edited = model.backend.run(batch, zero).logits
        assert (edited - plain).abs().max() > 1e-3, f"zeroing {site} changes nothing even unbypassed"
        with fused_kernel(model, *KERNELS[model.arch.family][:2]):
            for plan, capture in ((zero, ()), (Plan(), (site,))):
                with pytest.raises(SiteNotFiredError, match=rf"module '{path}'.*{site.kind.value} site at layer 1") as raised:
                    model.backend.run(batch, plan, capture=capture)
                assert raised.value.need == site and raised.value.path == path
                assert isinstance(raised.value, GnaError) and isinstance(raised.value, RuntimeError)
        assert no_hooks_left(model)
        assert torch.equal(model.backend.run(batch, zero).logits, edited), "the model runs as before after the raise"


def test_a_site_before_the_start_is_not_expected_to_fire(model):
    """A plan that starts at block 2 does not run block 1: its bypassed site is not hooked
    and nothing raises; the logits equal those of the same start without the edit (an
    identity), and those of the plain forward."""
    batch = model.to_batch(CLEAN)
    resid = model.backend.run(batch, Plan(), capture=[Site(SiteKind.RESID, 2)]).acts[Site(SiteKind.RESID, 2)]
    site = _sites(model)[0][0]
    plan = Plan(start=(2, resid))
    plan.add(site, Edit(torch.ones(1, dtype=torch.bool), torch.zeros(())))
    with fused_kernel(model, *KERNELS[model.arch.family][:2]):
        started = model.backend.run(batch, plan).logits
        assert torch.equal(started, model.backend.run(batch, Plan(start=(2, resid))).logits)
    torch.testing.assert_close(started, model.logits(CLEAN), atol=1e-5, rtol=0)


def test_a_remote_program_names_the_site_too(tokenizer):
    """Under ``remote="local"`` the counts stay on the (simulated) server: the site is named
    from the location nnsight's program waited for, in one trace and in a session of jobs."""
    model = gna.load(tiny_model("llama", seed=0), tokenizer=tokenizer, remote="local")
    batch = model.to_batch(CLEAN)
    site, path = _sites(model)[0]
    zero = Plan()
    zero.add(site, Edit(torch.ones(1, dtype=torch.bool), torch.zeros(())))
    plain = model.logits(CLEAN)
    with fused_kernel(model, *KERNELS["llama"][:2]):
        assert torch.equal(model.logits(CLEAN), plain)
        with pytest.raises(SiteNotFiredError, match=rf"module '{path}'.*heads site at layer 1") as raised:
            model.backend.run(batch, zero)
        assert raised.value.need == site
        with pytest.raises(SiteNotFiredError, match=rf"module '{path}'.*heads site at layer 1") as raised:
            model.backend.run_many([Job(batch, Plan()), Job(batch, zero)])
        assert raised.value.need == site and raised.value.path == path


def test_another_failure_is_not_called_a_missed_site(model):
    """An edit of the wrong shape fails inside the forward, so later hooks never run: that
    error comes out as it is (a torch error), not as a `SiteNotFiredError`."""
    batch = model.to_batch(CLEAN)
    site = _sites(model)[0][0]
    bad = Plan()
    bad.add(site, Edit(torch.ones(1, 1, 1, 1, dtype=torch.bool), torch.zeros(3, 3, 3, 3, 3)))
    bad.add(Site(SiteKind.RESID, 2), Edit(torch.ones(1, dtype=torch.bool), torch.zeros(())))  # a later site, never reached
    with pytest.raises(RuntimeError) as raised:
        model.backend.run(batch, bad)
    assert not isinstance(raised.value, SiteNotFiredError), raised.value
    assert no_hooks_left(model)
