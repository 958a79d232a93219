"""nnsight backend: one trace per forward, local or remote (NDIF).

Sites map to module paths in exactly one place, `NNsightBackend.steps`:

- heads of mixer ``m`` of layer ``l``: the input of ``<layers>.l.<mixer m>.<out_proj>``,
  viewed ``[batch, pos, head, d_head]``; their outputs before the mixer's group norm
  (`SiteKind.PRE_NORM`): the first input of ``<layers>.l.<mixer m>.<norm>``, viewed the
  same way (`_HEAD_VIEWS` lists both);
- residual stream entering block ``l``: the input of ``<layers>.l`` (``l == n_layers``:
  the input of the final norm);
- block ``l``'s MLP (`SiteKind.MLP_IN` / `SiteKind.MLP_OUT`): the first input of its norm /
  the MLP's output (`gna_interp.core.arch.ArchSpec.mlp`), after every mixer of the block;
- a skipped block ``l``: its output (its hidden state, for blocks that return a tuple)
  is replaced by its input;
- a plan that starts at block ``l``: blocks ``0 .. l-1`` are skipped (not computed) and
  output the given residual stream;
- an input stream of mixer ``m`` of layer ``l`` (`SiteKind.STREAM`): columns of the
  output (or input) of ``<layers>.l.<mixer m>.<stream.module>``, as the architecture
  table lays them out, viewed ``[batch, pos, unit, width]``; all streams of one module
  are edited in one step;
- a `Read` at layer ``l``: ``PATTERN`` is item 1 of ``<layers>.l.<mixer m>``'s output (the
  attention weights; HF computes them only with eager attention, so the model's
  ``config._attn_implementation`` is set to ``"eager"`` for that one trace and restored
  after it, exceptions included); ``OUTPUT`` is the output of ``<layers>.l.<mixer>.<name>``;
  ``PARAM`` is the parameter ``<layers>.l.<mixer>.<name>``.

The trace body uses nothing but torch and builtins on plain tensors and ints, so the
same code runs locally, under nnsight's ``remote="local"`` simulation, and on NDIF.
Modules are visited in execution order, as nnsight requires: by layer, then by the
order the block runs its mixers (`gna_interp.core.arch.MixerSpec.runs`).

**Modules called more than once per forward.** A module object registered in several
blocks (a shared attention block, as Zamba2 builds it when one module serves every
hybrid layer) runs once per block, and nnsight reaches all those calls through one
envoy. Each call is one *occurrence* of the module's input / output; a step at layer
``l`` addresses occurrence ``k`` = the number of earlier blocks (from the first block
that runs) holding the same module object, through ``tracer.iter[k]``. A head of such a
module therefore names one application, and editing it leaves the other applications
alone. (transformers 5.x builds Zamba2 with one module per hybrid layer and tied
weights, where every occurrence is 0; both layouts work.)

With ``grad=True`` every captured activation is written back into the forward (even
without edits), so it is the tensor the rest of the forward uses and
``torch.autograd.grad`` can differentiate with respect to it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import nnsight
import torch
from torch import Tensor

from ..core import search
from ..core.arch import ArchSpec, LayerMixer, LayerSpec
from ..core.errors import GnaValueError
from ..core.inputs import Batch
from ..core.plan import Plan, Read, ReadKind, Ref, Site, SiteKind
from ..cost import charge, charge_forward
from . import nnsight_program as program
from .base import RunOutput, eager_attention
from .finite import check_logits, keep_last, output_embedding_path
from .jobs import Job
from .nnsight_fired import check_fired

Op = program.Op  # step opcodes (steps carry them as plain ints)

nnsight.register(search)  # the joint search the program runs
nnsight.register(program)  # shipped by value: NDIF need not have gna_interp installed


# Per-head views of a module's first input, ``[batch, pos, head, d_head]``, by site kind:
# the module (from the mixer's table entry) and its order key inside the mixer (see `_stage`).
_HEAD_VIEWS: dict[SiteKind, tuple[Callable[[LayerMixer], str], float]] = {
    SiteKind.HEADS: (lambda mixer: mixer.out_proj_path, 0.7),  # the heads' outputs
    SiteKind.PRE_NORM: (lambda mixer: mixer.norm_path, 0.6),  # Mamba-2: the scan output y, before the group norm
}


class NNsightBackend:
    name = "nnsight"

    def __init__(self, envoy: Any, spec: ArchSpec, layers: Sequence[LayerSpec], remote: bool | str = False) -> None:
        self.envoy = envoy
        self.spec = spec
        self.layers = tuple(layers)
        self.n_layers = len(self.layers)
        self.remote = remote
        self.max_request_mb = 256.0
        """Tensor payload one session request may carry (`run_many` packs jobs up to it)."""
        self._shared: tuple[Any, dict[int, tuple[int, ...]]] | None = None
        self._unembedding: str | None = None

    def steps(self, plan: Plan, capture: Collection[Site], reads: Sequence[Read] = ()) -> list[tuple]:
        """The plan as a list of plain tuples ``(op, path, edits, slot, tensor, spec, occurrence)``,
        sorted in execution order. ``edits`` is a list of ``(mask, value, straight_through)``;
        ``slot`` indexes the saved list (or -1); ``tensor`` is the skip's row mask
        (``Op.SKIP_BLOCK``) or the output of a block that is not run (``Op.NOT_RUN``);
        ``spec`` is ``(item, attribute, selects)`` for reads, ``(is_input, blocks)`` for
        streams, ``(n_heads, head_dim)`` for heads (``None`` otherwise); ``occurrence``
        is which call of the module the step addresses (see the module docs)."""
        order = {site: i for i, site in enumerate(sorted(capture))}
        steps: list[tuple] = []
        streams: dict[tuple[int, float, str, int], list[tuple]] = {}
        for site in sorted(set(plan.edits) | set(capture)):
            edits = [(e.mask, e.value, e.straight_through) for e in plan.edits.get(site, [])]
            slot = order.get(site, -1)
            if site.kind in _HEAD_VIEWS:
                mixer = self._mixer(site.layer, site.mixer)
                module_of, within = _HEAD_VIEWS[site.kind]
                path = module_of(mixer)
                if not path:
                    raise GnaValueError(f"mixer {site.mixer} of layer {site.layer} ({mixer.path}) has no {site.kind.value} site")
                shape = (mixer.n_heads, mixer.head_dim)
                steps.append((site.layer, self._stage(mixer, within), Op.READ_HEADS, path, edits, slot, None, shape))
            elif site.kind is SiteKind.RESID:
                steps.append((site.layer, 0, Op.READ_INPUT, self._resid_path(site.layer), edits, slot, None, None))
            elif site.kind in (SiteKind.MLP_IN, SiteKind.MLP_OUT):  # after every mixer of the block
                op, part = (Op.MODULE_INPUT, 0) if site.kind is SiteKind.MLP_IN else (Op.MODULE_OUTPUT, 1)
                steps.append((site.layer, 5 + part, op, self.spec.mlp_path(site.layer, part), edits, slot, None, None))
            else:
                key, block = self._stream_block(site, edits, slot)
                streams.setdefault(key, []).append(block)
        for (layer, rank, path, is_input), blocks in streams.items():
            steps.append((layer, rank, Op.STREAMS, path, [], -1, None, (is_input, sorted(blocks, key=lambda b: b[0]))))
        for layer, rows in plan.skips.items():
            path = self.spec.block_path(layer)
            if not any(s[0] == layer and s[2] == Op.READ_INPUT for s in steps):
                steps.append((layer, 0, Op.READ_INPUT, path, [], -1, None, None))
            steps.append((layer, 99, Op.SKIP_BLOCK, path, [], -1, rows, None))
        for i, read in enumerate(reads):
            steps.append(self._read_step(read, len(capture) + i))
        start_layer = 0
        if plan.start is not None:
            start_layer, resid = plan.start
            steps = [s for s in steps if s[0] >= start_layer]
            steps += [(layer, -1, Op.NOT_RUN, self.spec.block_path(layer), [], -1, resid, None) for layer in range(start_layer)]
        steps.sort(key=lambda s: (s[0], s[1]))  # stable: reads of one layer keep their order
        return [(*s[2:], self._occurrence(s[3], s[0], start_layer)) for s in steps]

    def keyed_steps(self, plan: Plan) -> list[tuple[tuple, tuple]]:
        """`steps` of a plan of edits (no captures or reads) with each step's execution-order
        key ``(layer, rank, op, path, occurrence)``: steps of several plans with the same start
        merge by key (their edit lists concatenated) into the steps of the combined plan."""
        keys = []
        for site in sorted(plan.edits):
            if site.kind is not SiteKind.HEADS:
                raise GnaValueError(f"keyed_steps takes head edits only, got {site}")
            keys.append((site.layer, self._stage(self._mixer(site.layer, site.mixer), 0.7)))
        start_layer = plan.start_layer
        keys += [(layer, -1) for layer in range(start_layer)]
        keys.sort()
        steps = self.steps(plan, ())
        return [((*key, step[0], step[1], step[-1]), step) for key, step in zip(keys, steps, strict=True)]

    def _mixer(self, layer: int, index: int) -> LayerMixer:
        mixers = self.layers[layer].mixers
        if not 0 <= index < len(mixers):
            raise GnaValueError(f"layer {layer} has {len(mixers)} mixer(s): no mixer {index}")
        return mixers[index]

    @staticmethod
    def _stage(mixer: LayerMixer, within: float) -> float:
        """Order key inside a block: its input (0), then each mixer in the order the block
        runs them (streams 0.1 .. 0.4, internal reads 0.5, pre-norm heads 0.6, heads 0.7,
        mixer output 0.9)."""
        return 1 + mixer.spec.runs + within

    def _stream_block(self, site: Site, edits: list, slot: int) -> tuple[tuple[int, float, str, int], tuple]:
        """Where a stream site lives (the step key: layer, order, module path, input?) and
        its block ``(first column, units, width, edits, slot)``."""
        mixer = self._mixer(site.layer, site.mixer)
        stream = mixer.stream(site.stream)
        start, units, width = stream.layout(mixer.dims)
        path = f"{mixer.path}.{stream.module}"
        key = (site.layer, self._stage(mixer, 0.1 + 0.01 * mixer.stream_rank(stream)), path, int(stream.io == "input"))
        return key, (start, units, width, edits, slot)

    @property
    def config(self) -> Any:
        """The HF config (also for a remote model, whose weights live on NDIF)."""
        return self.envoy._module.config

    def _read_step(self, read: Read, slot: int) -> tuple:
        """Mixer internals run after the block's input and before the out-projection;
        attention weights come out of the mixer after it."""
        mixer = self._mixer(read.layer, read.mixer)
        if read.kind is ReadKind.PATTERN:
            return (read.layer, self._stage(mixer, 0.9), Op.READ_OUTPUT, mixer.path, [], slot, None, (1, "", read.selects))
        if read.kind is ReadKind.OUTPUT:
            return (
                read.layer,
                self._stage(mixer, 0.5),
                Op.READ_OUTPUT,
                f"{mixer.path}.{read.name}",
                [],
                slot,
                None,
                (-1, "", read.selects),
            )
        owner, _, attr = f"{mixer.path}.{read.name}".rpartition(".")
        return (read.layer, self._stage(mixer, 0.5), Op.READ_PARAM, owner, [], slot, None, (-1, attr, read.selects))

    def _resid_path(self, layer: int) -> str:
        if layer == self.n_layers:
            return self.spec.final_norm_path
        return self.spec.block_path(layer)

    def _shared_modules(self) -> dict[int, tuple[int, ...]]:
        """``id(module) -> layers`` for every module object registered in more than one
        block (recomputed when the envoy changes)."""
        if self._shared is None or self._shared[0] is not self.envoy:
            root = self.envoy._module
            where: dict[int, list[int]] = {}
            blocks = root.get_submodule(self.spec.layers_path)
            for layer, block in enumerate(blocks):
                for module in block.modules():
                    where.setdefault(id(module), []).append(layer)
            self._shared = (self.envoy, {key: tuple(layers) for key, layers in where.items() if len(layers) > 1})
        return self._shared[1]

    def _occurrence(self, path: str, layer: int, start_layer: int) -> int:
        """Which call of the module at ``path`` runs in block ``layer`` (0 unless the module
        object is shared between blocks)."""
        shared = self._shared_modules()
        if not shared or not path.startswith(self.spec.layers_path + "."):
            return 0
        layers = shared.get(id(self.envoy._module.get_submodule(path)), ())
        return sum(1 for other in layers if start_layer <= other < layer)

    @property
    def unembedding_path(self) -> str:
        """The path of the unembedding (``lm_head``) whose input ``logits_to_keep`` narrows;
        ``""`` when the model has none to find (logits are then sliced after the forward)."""
        if self._unembedding is None:
            self._unembedding = output_embedding_path(self.envoy._module)
        return self._unembedding

    def run(
        self,
        batch: Batch,
        plan: Plan,
        capture: Collection[Site] = (),
        reads: Sequence[Read] = (),
        grad: bool = False,
        logits_to_keep: int = 0,
    ) -> RunOutput:
        """`gna_interp.backends.base.Backend.run`; its logits checked (`gna_interp.backends.finite`)."""
        out = self._forward(batch, plan, capture, reads, grad, logits_to_keep)
        root = None if self.remote else self.envoy._module  # a remote model's weights are not here

        def unchecked(batch: Batch, plan: Plan, capture: Collection[Site]) -> RunOutput:
            return self._forward(batch, plan, capture, (), False, logits_to_keep)

        check_logits(self.name, out.logits, batch, plan, self.layers, unchecked, root)
        return out

    def _forward(
        self, batch: Batch, plan: Plan, capture: Collection[Site], reads: Sequence[Read], grad: bool, logits_to_keep: int
    ) -> RunOutput:
        if logits_to_keep < 0:
            raise GnaValueError(f"logits_to_keep={logits_to_keep}: expected 0 (every position) or k > 0 (the last k positions)")
        steps = self.steps(plan, capture, reads)
        n_saved = len(capture) + len(reads)
        charge_forward(self, batch.n_rows, plan.start_layer, self.n_layers, request=bool(self.remote))
        model = self.envoy
        block_items = self.spec.block_output  # 0: blocks return a tensor; n: a tuple of n items
        # Two statements on purpose: nnsight captures the source of the trace block itself.
        patterns = any(read.kind is ReadKind.PATTERN for read in reads)
        inputs = self.call_inputs(batch)
        fired = [0] * len(steps)  # each step's firings (locally; a remote program's stay on the server)
        counted = None if self.remote else fired
        try:
            with torch.set_grad_enabled(grad), eager_attention(getattr(self.envoy._module, "config", None), patterns):  # noqa: SIM117
                with self.pad_guards(batch), model.trace(**inputs) as tracer:
                    saved, logits = program.apply_steps(
                        model, tracer, steps, n_saved, block_items, grad, self.unembedding_path, logits_to_keep, fired
                    )
        except Exception as error:  # a module the model did not call: nnsight's OutOfOrderError names it
            check_fired(self, steps, counted, error, [(plan, capture, reads)])
            raise
        check_fired(self, steps, counted, None, [(plan, capture, reads)])
        acts = {site: saved[i] for i, site in enumerate(sorted(capture))}
        values = [saved[len(capture) + i] for i in range(len(reads))]
        for read, value in zip(reads, values, strict=True):
            if value is None:
                raise RuntimeError(
                    f"layer {read.layer} returned no attention weights: the model (remote={self.remote!r}) runs attention "
                    "without computing them; load it with attn_implementation='eager'"
                )
        if not grad:
            acts = {site: value.detach() for site, value in acts.items()}
            values = [value.detach() for value in values]
            logits = logits.detach()
        return RunOutput(logits=keep_last(logits, logits_to_keep), acts=acts, reads=values)

    def call_inputs(self, batch: Batch) -> dict[str, Any]:
        """The keywords of one forward: ``input_ids``, ``attention_mask`` when the family's
        forward takes it (`ArchSpec.takes_mask`), ``remote`` when remote."""
        inputs: dict[str, Any] = {"input_ids": batch.input_ids}
        if self.spec.takes_mask:
            inputs["attention_mask"] = batch.attention_mask
        if self.remote:
            inputs["remote"] = self.remote
        return inputs

    @contextmanager
    def pad_guards(self, batch: Batch) -> Iterator[None]:
        """For a left-padded batch: each mixer's `MixerSpec.pad_guard` on the output of its
        ``pad_guard_module``, as forward hooks removed on exit (exceptions included). A
        family whose forward takes no mask and has a mixer without a guard refuses padding."""
        padded = not bool(batch.attention_mask.bool().all())
        mixers = [mixer for layer in self.layers for mixer in layer.mixers]
        if not padded or not any(mixer.spec.pad_guard for mixer in mixers):
            if padded and not self.spec.takes_mask:
                raise GnaValueError(
                    f"the {self.spec.family!r} family's forward takes no attention mask and its mixers have no pad_guard, so a "
                    "left-padded batch would change the rows' numbers: pass rows of one token length (or give its "
                    "MixerSpecs a pad_guard)"
                )
            yield
            return
        if self.remote:
            raise GnaValueError(f"the {self.spec.family!r} family needs local pad guards for padded batches: run it locally")
        root = self.envoy._module
        mask = batch.attention_mask
        handles = []
        try:
            for mixer in mixers:
                guard = mixer.spec.pad_guard
                if guard is None:
                    continue

                def hook(module: Any, args: Any, output: Any, guard: Any = guard, dims: Any = mixer.dims) -> Any:
                    return guard(output, dims, mask)

                module = root.get_submodule(f"{mixer.path}.{mixer.spec.pad_guard_module}")
                handles.append(module.register_forward_hook(hook))
            yield
        finally:
            for handle in handles:
                handle.remove()

    def run_many(self, jobs: Sequence[Job]) -> list[RunOutput | None]:
        """``jobs`` (`gna_interp.backends.jobs`) in as few requests as the payload allows:
        one nnsight session per request, its traces run in order on the server
        (`nnsight_program.run_jobs`), each `Ref` resolved there. Jobs are packed in order
        up to ``max_request_mb`` of tensors; a job whose reference falls in an earlier
        request takes the referenced job along (run again). Locally: one forward each."""
        if not self.remote:
            from .jobs import kept, resolved

            full: list[RunOutput] = []
            for job in jobs:  # keep 0 / 2: the final position's logits alone are computed
                last = 0 if job.keep == 1 else 1
                full.append(self.run(job.batch, resolved(job.plan, full), capture=job.capture, reads=job.reads, logits_to_keep=last))
            return [kept(out, job.keep) for out, job in zip(full, jobs, strict=True)]
        outputs: list[RunOutput | None] = [None] * len(jobs)
        for group, own in self._request_groups(jobs):
            for index, out in zip(group, self._session(jobs, group, own), strict=True):
                if index in own:
                    outputs[index] = out
        return outputs

    def _request_groups(self, jobs: Sequence[Job]) -> list[tuple[list[int], set[int]]]:
        """Per request: the job indices it runs, in order (those its own jobs' references
        need included), and its own jobs (each job is own in exactly one request)."""
        limit = self.max_request_mb * 2**20
        groups: list[tuple[list[int], set[int]]] = []
        group: list[int] = []
        own: set[int] = set()
        size = 0.0
        for index in range(len(jobs)):
            needed = [j for j in _closure(jobs, index) if j not in group]
            extra = sum(_payload_bytes(jobs[j]) for j in needed)
            if group and size + extra > limit:
                groups.append((group, own))
                group, own, size = [], set(), 0.0
                needed = _closure(jobs, index)
                extra = sum(_payload_bytes(jobs[j]) for j in needed)
            group = sorted({*group, *needed})
            own.add(index)
            size += extra
        if group:
            groups.append((group, own))
        return groups

    def _session(self, jobs: Sequence[Job], group: list[int], own: set[int]) -> list[RunOutput | None]:
        """One session request running ``jobs[i]`` for ``i`` in ``group``, in order; the
        outputs in ``group`` order (``None`` for ``keep=0`` and for jobs taken along)."""
        local = {job: position for position, job in enumerate(group)}
        prepared = []
        for index in group:
            job = jobs[index]
            steps = [self._with_markers(step, jobs, local) for step in self.steps(job.plan, job.capture, job.reads)]
            keep = job.keep if index in own else 0
            prepared.append((job.batch.input_ids, job.batch.attention_mask, steps, len(job.capture) + len(job.reads), keep))
            charge_forward(self, job.batch.n_rows, job.plan.start_layer, self.n_layers)
        charge(self, requests=1)
        model = self.envoy
        block_items = self.spec.block_output
        patterns = any(read.kind is ReadKind.PATTERN for index in group for read in jobs[index].reads)
        # Two statements on purpose: nnsight captures the source of the session block itself.
        with torch.no_grad(), eager_attention(getattr(self.envoy._module, "config", None), patterns):
            try:
                with model.session(remote=self.remote):
                    returned = nnsight.save(program.run_jobs(model, prepared, block_items, self.unembedding_path))
            except Exception as error:  # a module the server's model did not call: named by nnsight's error
                needs = [(jobs[index].plan, jobs[index].capture, jobs[index].reads) for index in group]
                check_fired(self, [step for job in prepared for step in job[2]], None, error, needs)
                raise
        outputs: list[RunOutput | None] = []
        for index, item in zip(group, returned, strict=True):
            if item is None:
                outputs.append(None)
                continue
            job = jobs[index]
            saved, logits = item
            check_logits(self.name, logits[:, None] if job.keep == 2 else logits, job.batch, job.plan, self.layers, None, None)
            if job.keep == 2:
                outputs.append(RunOutput(logits=logits[:, None].detach()))
                continue
            acts = {site: saved[i].detach() for i, site in enumerate(sorted(job.capture))}
            values = [saved[len(job.capture) + i].detach() for i in range(len(job.reads))]
            outputs.append(RunOutput(logits=logits.detach(), acts=acts, reads=values))
        return outputs

    def run_greedy(self, problem: dict) -> list:
        """`nnsight_program.greedy_joint` in one session request (remote models only)."""
        if not self.remote:
            raise GnaValueError("run_greedy sends a session program to a remote model: load it with remote=True or 'local'")
        model = self.envoy
        block_items = self.spec.block_output
        # Two statements on purpose: nnsight captures the source of the session block itself.
        with torch.no_grad():
            try:
                with model.session(remote=self.remote):
                    result = nnsight.save(program.greedy_joint(model, {**problem, "unembed": self.unembedding_path}, block_items))
            except Exception as error:  # a module the server's model did not call: named by nnsight's error
                check_fired(self, [], None, error, [])
                raise
        roles, (forwards, rows, block_rows) = result
        charge(self, forwards=forwards, rows=rows, block_rows=block_rows, requests=1)
        return list(roles)

    @staticmethod
    def _with_markers(step: tuple, jobs: Sequence[Job], local: dict[int, int]) -> tuple:
        """A step with each `Ref` as the plain marker ``("ref", job in the request, slot, copies)``."""

        def marker(value: Any) -> Any:
            if not isinstance(value, Ref):
                return value
            slot = sorted(jobs[value.job].capture).index(value.site)
            return ("ref", local[value.job], slot, value.copies)

        op, path, edits, slot, rows, spec, occurrence = step
        return (op, path, [(marker(m), marker(v), through) for m, v, through in edits], slot, marker(rows), spec, occurrence)


def _closure(jobs: Sequence[Job], index: int) -> list[int]:
    """``index`` and the jobs its references need, earliest first."""
    needed = {index}
    stack = [index]
    while stack:
        start = jobs[stack.pop()].plan.start
        if start is not None and isinstance(start[1], Ref) and start[1].job not in needed:
            needed.add(start[1].job)
            stack.append(start[1].job)
    return sorted(needed)


def _payload_bytes(job: Job) -> float:
    """Tensor bytes a job sends: ids, mask, edit masks and values, skip rows, a start residual."""
    tensors = [job.batch.input_ids, job.batch.attention_mask, *job.plan.skips.values()]
    tensors += [t for edits in job.plan.edits.values() for edit in edits for t in (edit.mask, edit.value)]
    if job.plan.start is not None and isinstance(job.plan.start[1], Tensor):
        tensors.append(job.plan.start[1])
    return float(sum(t.numel() * t.element_size() for t in tensors))
