"""`distill`: train a hybrid student (`gna_interp.models.hybrid_student`) to imitate its
teacher, in the two stages of Bick, Xing, Gu (2026), sized for CPU toys.

- **Stage A** (``"A"``), per layer, teacher-forced: block ``l`` of the student reads the
  teacher's residual stream entering block ``l`` and fits the teacher's residual leaving
  it. Loss: the mean over layers of the mean squared error over real (non-padding)
  tokens and ``d_model``.
- **Stage B** (``"B"``), end to end: the student's next-token distribution fits the
  teacher's (soft targets). Loss: ``KL(teacher || student)`` per real token (the soft-target
  cross-entropy minus the teacher's entropy, so 0 at a perfect fit), averaged.

By default only the student's new parameters train (each layer's mixer and ``attn_map``;
``train="all"`` trains every one), with AdamW (one optimiser per stage) and the gradient
clipped to norm ``max_grad_norm``; the teacher runs
under ``torch.no_grad`` through the library (`GnaModel.run`, which leaves no hook).
Batches are drawn from the data with a generator seeded by ``(seed, global step)``, so
a run is a function of its arguments, and a run resumed from its checkpoint
(``checkpoint_dir``) ends with the same weights and the same loss history as one that
was never interrupted.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.errors import GnaTypeError, GnaValueError
from ..core.heads import Resid
from ..core.keywords import renamed, suggest_keywords
from ..progress import progress_bar

STAGES = ("A", "B")
POSITIONS = ("all", "last")
TRAIN = ("new", "all")
"""Which student parameters the optimiser moves: ``"new"``, the parameters the teacher
does not have (every layer's ``mixer`` and ``attn_map``), or ``"all"``."""
NEW_PARTS = ("mixer", "attn_map")
CHECKPOINT_NAME = "distill_checkpoint.pt"


@dataclass
class DistillHistory:
    """The loss of every optimisation step, in order.

    Attributes:
        stages: per step, its stage (``"A"`` or ``"B"``).
        steps: per step, its index within its stage.
        losses: ``[n_steps]`` float64, the loss of each step's batch (before the update).
    """

    stages: list[str] = field(default_factory=list)
    steps: list[int] = field(default_factory=list)
    losses: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))

    def append(self, stage: str, step: int, loss: float) -> None:
        self.stages.append(stage)
        self.steps.append(step)
        self.losses = torch.cat([self.losses, torch.tensor([loss], dtype=torch.float64)])

    def stage(self, name: str) -> Tensor:
        """``[n]`` the losses of stage ``name`` only."""
        return self.losses[[i for i, s in enumerate(self.stages) if s == name]]

    @property
    def frame(self) -> Any:
        """A ``pandas.DataFrame`` with columns ``stage``, ``step``, ``loss``."""
        import pandas as pd

        return pd.DataFrame({"stage": self.stages, "step": self.steps, "loss": self.losses.tolist()})

    def state(self) -> dict[str, Any]:
        return {"stages": list(self.stages), "steps": list(self.steps), "losses": self.losses.clone()}


def _texts_source(data: Any) -> Callable[[int, torch.Generator, int], list[str]]:
    """``(global step, generator, batch size) -> texts`` for a `Task`, a list of strings,
    or a function ``step -> list of strings`` (a stream)."""
    prompts = getattr(data, "prompts", None)
    if prompts is not None and not callable(prompts):
        data = list(prompts)
    if callable(data):
        stream = data

        def from_stream(step: int, generator: torch.Generator, size: int) -> list[str]:
            texts = stream(step)
            if isinstance(texts, str) or not isinstance(texts, Sequence) or not texts:
                raise GnaTypeError(f"distill: the stream returned {texts!r} for step {step}: expected a non-empty list of strings")
            return list(texts)

        return from_stream
    if isinstance(data, str) or not isinstance(data, Sequence) or not data or not all(isinstance(t, str) for t in data):
        raise GnaTypeError(f"distill: data={data!r}: expected a Task, a non-empty list of strings, or a function step -> list of strings")
    texts = list(data)

    def from_list(step: int, generator: torch.Generator, size: int) -> list[str]:
        order = torch.randperm(len(texts), generator=generator)[: min(size, len(texts))]
        return [texts[int(i)] for i in order]

    return from_list


def _steps_per_stage(stages: Sequence[str], steps: int | dict[str, int]) -> dict[str, int]:
    for stage in stages:
        if stage not in STAGES:
            raise GnaValueError(f"distill: stages={list(stages)!r} holds {stage!r}: expected stages from {STAGES}")
    counts = {stage: steps for stage in stages} if isinstance(steps, int) else dict(steps)
    for stage in stages:
        value = counts.get(stage)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise GnaValueError(f"distill: steps={steps!r} gives stage {stage!r} {value!r} steps: expected an int >= 0")
    return {stage: counts[stage] for stage in stages}


def _stage_a_loss(student: Any, resids: list[Tensor], mask: Tensor) -> Tensor:
    """Mean over layers of the masked MSE between student block ``l`` on the teacher's
    ``resids[l]`` and the teacher's ``resids[l + 1]`` (each ``[batch, pos, d_model]``)."""
    trunk = student.model
    extra = trunk.block_inputs(resids[0], mask)
    weight = mask[..., None].to(resids[0].dtype)
    count = weight.sum() * resids[0].shape[-1]
    losses = [((block(resids[i], **extra) - resids[i + 1]).pow(2) * weight).sum() / count for i, block in enumerate(trunk.layers)]
    return torch.stack(losses).mean()


def last_token_mask(mask: Tensor) -> Tensor:
    """``[batch, pos]`` attention mask -> ``[batch, pos]``, 1 only at each row's last real
    token (left or right padding)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask.bool(), positions, -1).max(dim=1).values
    return (positions == last[:, None]).to(mask.dtype)


def _stage_b_loss(
    student: Any, input_ids: Tensor, mask: Tensor, teacher_logits: Tensor, temperature: float, weight_mask: Tensor | None = None
) -> Tensor:
    """Mean over real tokens (or the tokens ``weight_mask`` marks) of ``KL(teacher ||
    student)`` of the next-token distributions at ``temperature``."""
    logits = student(input_ids, attention_mask=mask).logits.float()
    target = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    log_q = F.log_softmax(logits / temperature, dim=-1)
    kl = (target.exp() * (target - log_q)).sum(-1)
    weight = (mask if weight_mask is None else weight_mask).to(kl.dtype)
    return (kl * weight).sum() / weight.sum()


def trained_parameters(model: Any, train: str) -> list[tuple[str, Tensor]]:
    """``(name, parameter)`` of a `HybridStudentForCausalLM` that ``train`` selects (see
    `TRAIN`): with ``"new"``, those under a layer's ``mixer`` or ``attn_map``."""
    named = list(model.named_parameters())
    if train == "all":
        return named
    return [(name, p) for name, p in named if any(f".{part}." in f".{name}" for part in NEW_PARTS)]


@renamed(show_progress="progress")
@suggest_keywords
def distill(
    student: Any,
    teacher: Any,
    data: Any,
    *,
    stages: Sequence[str] = STAGES,
    steps: int | dict[str, int] = 50,
    batch_size: int = 8,
    lr: float = 1e-3,
    seed: int = 0,
    temperature: float = 1.0,
    positions: str = "all",
    train: str = "new",
    max_grad_norm: float | None = 1.0,
    checkpoint_dir: str | os.PathLike[str] | None = None,
    checkpoint_every: int = 10,
    callback: Callable[[str, int, float], None] | None = None,
    progress: bool = True,
) -> DistillHistory:
    """Distil ``teacher`` into ``student`` in place (see the module docstring).

    Args:
        student: a `GnaModel` over a `HybridStudentForCausalLM` (`gna_interp.hybridize`).
        teacher: the teacher `GnaModel` (same tokenizer and vocabulary). Not modified.
        data: a `Task` (its prompts), a list of strings, or a function ``step -> list of
            strings`` (a stream; called with the global step number).
        stages: ``("A", "B")``, or one of them.
        steps: optimisation steps per stage (an int for every stage, or ``{"A": n, "B": m}``).
        batch_size: prompts per step (drawn without replacement from a list).
        lr: AdamW's learning rate.
        seed: fixes the batches (and nothing else is random).
        temperature: stage B's softmax temperature.
        positions: the tokens stage B's KL averages over: ``"all"`` real tokens, or
            ``"last"``, each row's last real token only (the answer position of a task's
            prompt: where a toy was trained). Stage A always fits every real token.
        train: the parameters the optimiser moves: ``"new"`` (default), only what the
            teacher does not have (each layer's ``mixer`` and ``attn_map``; embeddings,
            norms, MLPs, LM head and kept heads stay the teacher's), or ``"all"``. With
            ``"all"``, Adam's first steps move every copied weight by about ``lr`` whatever
            its gradient, which pulls a student that already matches its teacher away
            from it (the `llama_4x8` student keeping every head falls from 0.955 to 0.80
            accuracy in 30 stage-B steps at ``lr=2e-3``, clipped or not, and to 0.93 with
            ``"new"``; see docs/layer_swap.md).
        max_grad_norm: the trained parameters' gradient is clipped to this norm before each
            step (``None``: no clipping).
        checkpoint_dir: a folder; every ``checkpoint_every`` steps and at each stage's end,
            the student's weights, the optimiser and the history go to
            ``<dir>/distill_checkpoint.pt``. A call that finds one there (written with the
            same arguments) continues from it.
        checkpoint_every: see ``checkpoint_dir``.
        callback: ``(stage, step, loss)`` after each step (after the checkpoint, if any).
        progress: a progress bar per stage (`gna_interp.progress`).

    Returns:
        `DistillHistory`: ``.losses`` ``[n_steps]`` and ``.frame`` (a DataFrame).

    Raises:
        ValueError: unknown stages, bad step counts, a checkpoint written with other
            arguments, or a student / teacher pair that do not match.
    """
    plan = _steps_per_stage(stages, steps)
    _check_pair(student, teacher)
    options = _Options(batch_size, lr, seed, temperature, positions, train, max_grad_norm, checkpoint_every, callback, progress)
    options.check()
    run = _start(student, teacher, _texts_source(data), plan, options, checkpoint_dir)
    with _training_only(student.hf_model, run.params):
        offset = 0
        for stage, total in plan.items():
            _run_stage(run, stage, total, offset)
            offset += total
    return run.history


def _check_pair(student: Any, teacher: Any) -> None:
    if not hasattr(getattr(student, "hf_model", None), "model") or not hasattr(student.hf_model.model, "block_inputs"):
        raise GnaTypeError(f"distill: student={student!r}: expected the GnaModel gna_interp.hybridize returns")
    if int(student.vocab_size) != int(teacher.vocab_size) or int(student.n_layers) != int(teacher.n_layers):
        raise GnaValueError(
            f"distill: the student ({student.n_layers} layers, vocabulary {student.vocab_size}) does not match the teacher "
            f"({teacher.n_layers} layers, vocabulary {teacher.vocab_size})"
        )


@dataclass(frozen=True)
class _Options:
    """`distill`'s keyword options (see its Args)."""

    batch_size: int
    lr: float
    seed: int
    temperature: float
    positions: str
    train: str
    max_grad_norm: float | None
    checkpoint_every: int
    callback: Callable[[str, int, float], None] | None
    progress: bool

    def check(self) -> None:
        if self.positions not in POSITIONS:
            raise GnaValueError(f"distill: positions={self.positions!r}: expected one of {POSITIONS}")
        if self.train not in TRAIN:
            raise GnaValueError(f"distill: train={self.train!r}: expected one of {TRAIN}")
        if self.max_grad_norm is not None and not self.max_grad_norm > 0:
            raise GnaValueError(f"distill: max_grad_norm={self.max_grad_norm!r}: expected a positive float or None")
        if self.batch_size < 1 or self.checkpoint_every < 1 or self.lr <= 0 or self.temperature <= 0:
            raise GnaValueError(
                f"distill: batch_size={self.batch_size}, checkpoint_every={self.checkpoint_every}, lr={self.lr}, "
                f"temperature={self.temperature}: expected positive values"
            )


@dataclass
class _Run:
    """A `distill` call under way: what it trains, and where it stands (``history``, ``done``:
    steps finished per stage; ``saved``: the checkpoint it resumed from, if any)."""

    student: Any
    teacher: Any
    source: Callable[[int, torch.Generator, int], list[str]]
    options: _Options
    settings: dict[str, Any]  # what a checkpoint must have been written with
    params: list[Tensor]
    path: Path | None
    history: DistillHistory
    done: dict[str, int]
    saved: dict[str, Any] | None


def _start(
    student: Any,
    teacher: Any,
    source: Callable[[int, torch.Generator, int], list[str]],
    plan: dict[str, int],
    options: _Options,
    checkpoint_dir: str | os.PathLike[str] | None,
) -> _Run:
    """The parameters to train, and the student resumed from a checkpoint in ``checkpoint_dir``
    written with the same settings, if there is one."""
    settings = {
        "stages": list(plan),
        "steps": plan,
        "batch_size": options.batch_size,
        "lr": options.lr,
        "seed": options.seed,
        "temperature": options.temperature,
    }
    if options.positions != "all":
        settings["positions"] = options.positions
    settings["train"], settings["max_grad_norm"] = options.train, options.max_grad_norm
    model = student.hf_model
    params = [p for _, p in trained_parameters(model, options.train)]
    if not params:
        raise GnaValueError(f"distill: train={options.train!r} selects no parameter of the student")
    path = Path(checkpoint_dir) / CHECKPOINT_NAME if checkpoint_dir is not None else None
    history, done = DistillHistory(), {stage: 0 for stage in plan}
    saved = _load_checkpoint(path, settings)
    if saved is not None:
        model.load_state_dict(saved["student"])
        history = DistillHistory(**saved["history"])
        done = saved["done"]
    return _Run(student, teacher, source, options, settings, params, path, history, done, saved)


@contextmanager
def _training_only(model: Any, params: list[Tensor]) -> Iterator[None]:
    """``model`` in train mode with gradients for ``params`` alone; its mode and flags given
    back and its gradients cleared on the way out, exceptions included."""
    was_training = model.training
    trained = {id(p) for p in params}
    frozen = [(p, p.requires_grad) for p in model.parameters() if id(p) not in trained]
    model.train()
    try:
        for p, _ in frozen:  # no gradient computed (or accumulated) for what does not train
            p.requires_grad_(False)
        yield
    finally:
        for p, flag in frozen:
            p.requires_grad_(flag)
        model.train(was_training)
        model.zero_grad(set_to_none=True)


def _run_stage(run: _Run, stage: str, total: int, offset: int) -> None:
    """Stage ``stage``'s steps from where ``run`` stands to ``total`` (``offset``: the steps of
    the stages before it), each logged, checkpointed and reported."""
    options, model = run.options, run.student.hf_model
    optimizer = torch.optim.AdamW(run.params, lr=options.lr)
    if run.saved is not None and run.saved["stage"] == stage and run.done[stage] < total:
        optimizer.load_state_dict(run.saved["optimizer"])
    for step in progress_bar(range(run.done[stage], total), show=options.progress, desc=f"distill stage {stage}"):
        loss = _step_loss(run, stage, offset + step)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if options.max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(run.params, options.max_grad_norm)
        optimizer.step()
        run.history.append(stage, step, float(loss.detach()))
        run.done[stage] = step + 1
        if run.path is not None and (run.done[stage] % options.checkpoint_every == 0 or run.done[stage] == total):
            _save_checkpoint(run.path, run.settings, model, optimizer, run.history, run.done, stage)
        if options.callback is not None:
            options.callback(stage, step, float(loss.detach()))


def _step_loss(run: _Run, stage: str, global_step: int) -> Tensor:
    """The loss of the batch of ``global_step`` (drawn with a generator seeded by it)."""
    options, model, n_layers = run.options, run.student.hf_model, int(run.teacher.n_layers)
    generator = torch.Generator().manual_seed(options.seed * 1_000_003 + global_step)
    texts = run.source(global_step, generator, options.batch_size)
    with torch.no_grad():
        logits, acts = run.teacher.run(texts, capture=[Resid(layer) for layer in range(n_layers + 1)])
    batch = run.student.to_batch(texts)
    mask = batch.attention_mask
    if stage == "A":
        return _stage_a_loss(model, [acts[Resid(layer)].detach() for layer in range(n_layers + 1)], mask)
    weight_mask = last_token_mask(mask) if options.positions == "last" else None
    return _stage_b_loss(model, batch.input_ids, mask, logits.detach(), options.temperature, weight_mask)


def _save_checkpoint(
    path: Path, settings: dict[str, Any], model: Any, optimizer: Any, history: DistillHistory, done: dict[str, int], stage: str
) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {
        "settings": settings,
        "student": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "optimizer": optimizer.state_dict(),
        "history": history.state(),
        "done": dict(done),
        "stage": stage,
    }
    partial = path.with_suffix(".tmp")
    torch.save(state, partial)
    partial.replace(path)  # a crash mid-write leaves the previous checkpoint whole


def _load_checkpoint(path: Path | None, settings: dict[str, Any]) -> dict[str, Any] | None:
    if path is None or not path.exists():
        return None
    saved: dict[str, Any] = torch.load(path, weights_only=False)
    if saved.get("settings") != settings:
        raise GnaValueError(
            f"distill: the checkpoint {str(path)!r} was written with {saved.get('settings')}, not with this call's {settings}: "
            "use another checkpoint_dir or the same arguments"
        )
    return saved
