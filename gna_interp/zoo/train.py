"""Training a toy model on `toy_mcq`, deterministically for a seed, on CPU.

Fresh random prompts every step (so there is no training set to memorise), loss on
the final position only, AdamW with linear warm-up and gradient clipping. Training
stops once a fixed held-out batch is answered at the recipe's target accuracy.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ..core.errors import GnaValueError
from ..models.loading import quiet_weight_loading
from ..progress import progress_bar
from ..tasks.toy import LETTERS, VOCAB, toy_token_batch
from .prune import frozen_at_zero, head_masks, prune_heads, still_pruned
from .recipes import TOY_TOKENS, Recipe

HELD_OUT_SEED = 10_000
"""Generator seed offset of the quick held-out batch (training uses the recipe's seed)."""


@dataclass
class TrainResult:
    model: Any
    """The trained HF ``*ForCausalLM`` (eval mode)."""
    steps: int
    seconds: float
    reached_target: bool
    history: list[dict[str, float]] = field(default_factory=list)
    """One row per evaluation: step, loss, held-out accuracy."""


def build_model(recipe: Recipe, init: str | Path | None = None) -> Any:
    """The model before training: initialised from the recipe's seed, or, for a recipe
    with ``init_from``, loaded from ``init`` (default: the bundled toy of that name).
    Its ``pruned_heads`` are zeroed (not yet frozen: `train` does that)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(recipe.seed)
    if recipe.init_from is None:
        if init is not None:
            raise GnaValueError(f"init={str(init)!r}: recipe {recipe.name!r} trains from scratch (it has no init_from)")
        try:
            config = AutoConfig.for_model(recipe.family, **{**TOY_TOKENS, **recipe.config})
        except ValueError as error:  # transformers: "Unrecognized model identifier"
            known = f"recipe {recipe.name!r}: family={recipe.family!r} is not a model_type transformers knows"
            raise GnaValueError(f"{known} ({error})") from None
        model = AutoModelForCausalLM.from_config(config)
    else:
        from .store import toy_names, toy_path

        if init is None and recipe.init_from not in toy_names():
            raise GnaValueError(
                f"recipe {recipe.name!r} starts from toy {recipe.init_from!r}, which is not bundled: train it "
                f"(gna-interp zoo train {recipe.init_from}) and pass its folder as init"
            )
        source = Path(init) if init is not None else toy_path(recipe.init_from)
        if not (source / "config.json").is_file():
            raise GnaValueError(f"init={str(source)!r}: expected the folder of a trained toy (with config.json)")
        with quiet_weight_loading(local=True):
            model = AutoModelForCausalLM.from_pretrained(source)
        differs = {k: (getattr(model.config, k, None), v) for k, v in recipe.config.items() if getattr(model.config, k, None) != v}
        if model.config.model_type != recipe.family or differs:
            raise GnaValueError(
                f"init {str(source)!r} is not a {recipe.family} model of the recipe's config: it is a "
                f"{model.config.model_type!r} model" + (f", differing in {differs}" if differs else "")
            )
    prune_heads(model, recipe.pruned_heads)
    return model


def task_shape(recipe: Recipe) -> dict[str, Any]:
    """The `toy_mcq` / `toy_token_batch` keywords of the recipe's task (also on its card)."""
    fields = ("n_options", "words_per_option", "layout", "vary_lengths", "shuffle_labels", "query_last")
    return {name: getattr(recipe, name) for name in fields}


def _letter_ids(recipe: Recipe) -> torch.Tensor:
    return torch.tensor([VOCAB.index(letter) for letter in LETTERS[: recipe.n_options]])


@torch.no_grad()
def quick_accuracy(model: Any, input_ids: torch.Tensor, answer_ids: torch.Tensor, letter_ids: torch.Tensor) -> float:
    """Share of prompts whose highest-scoring answer letter is the correct one."""
    was_training = model.training
    model.eval()
    final = model(input_ids=input_ids).logits[:, -1]
    chosen = letter_ids[final[:, letter_ids].argmax(-1)]
    model.train(was_training)
    return float((chosen == answer_ids).float().mean())


def lr_factor(recipe: Recipe, step: int) -> float:
    """Learning-rate multiplier after ``step`` optimizer steps: linear warm-up, constant,
    then (if the recipe says so) linear decay to 0."""
    factor = min(1.0, (step + 1) / recipe.warmup_steps)
    if recipe.decay_start is None or step < recipe.decay_start:
        return factor
    start = recipe.decay_start + recipe.decay_steps
    if step < start or not recipe.more_phases:
        return factor * max(0.0, 1.0 - (step - recipe.decay_start) / max(1, recipe.decay_steps))
    for length, first, last in recipe.more_phases:
        if step < start + length:
            return first + (last - first) * (step - start) / length
        start += length
    return recipe.more_phases[-1][2]


def _recipe_key(recipe: Recipe) -> dict[str, Any]:
    """What a checkpoint must agree on to be resumed: everything that shapes the
    trajectory (the step limit, the stopping accuracy and the notes may change)."""
    free = ("max_steps", "target_accuracy", "notes", "ablation_prompts", "device")
    return {k: v for k, v in dataclasses.asdict(recipe).items() if k not in free}


_SCHEDULE_FIELDS = ("decay_start", "decay_steps", "more_phases")


def _key_agrees(key: dict[str, Any], stored: dict[str, Any]) -> bool:
    """A field added to `Recipe` after a checkpoint was written had its default then (the
    schedule fields are checked step by step by `_schedule_agrees` instead)."""
    defaults = {
        f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc,operator]
        for f in dataclasses.fields(Recipe)
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }
    return all(key[k] == stored.get(k, defaults.get(k)) for k in key if k not in _SCHEDULE_FIELDS)


def _schedule_agrees(recipe: Recipe, step: int, stored: dict[str, Any]) -> bool:
    """The schedule up to the checkpoint must be the one that produced it."""
    then = dataclasses.replace(recipe, **{k: stored[k] for k in ("decay_start", "decay_steps", "more_phases") if k in stored})
    if "decay_start" not in stored:
        then = dataclasses.replace(then, decay_start=None)
    if "more_phases" not in stored:
        then = dataclasses.replace(then, more_phases=())
    return all(lr_factor(then, s) == lr_factor(recipe, s) for s in range(step))


def init_key(init: str | Path | None) -> str | None:
    """The start a checkpoint was trained from (``None``: the recipe's default)."""
    return None if init is None else str(Path(init).resolve())


def _save_checkpoint(path: Path, state: dict[str, Any]) -> None:
    partial = path.with_name(path.name + ".partial")
    torch.save(state, partial)
    os.replace(partial, path)  # atomic: an interrupted save never leaves a broken checkpoint


def train(
    recipe: Recipe,
    *,
    max_steps: int | None = None,
    checkpoint: str | Path | None = None,
    init: str | Path | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
    device: str | torch.device = "cpu",
) -> TrainResult:
    """Train ``recipe``'s model from scratch, or resume it from ``checkpoint``.

    Args:
        recipe: a row of `RECIPES`, or a `Recipe` of your own (any family transformers
            builds from a config: `family_recipe`, docs/own_family.md).
        max_steps: override the recipe's step limit (e.g. for a short determinism check).
        checkpoint: a file written at every evaluation (model, optimizer, schedule,
            data-generator state); if it exists, training resumes from it, and the
            result equals an uninterrupted run.
        init: for a recipe with ``init_from``, the folder of that toy's trained model
            (default: the bundled toy).
        progress: show a tqdm bar.
        log: where evaluation lines go.
        device: where the model trains (``"cuda"`` on a GPU; prompts are still drawn on
            the CPU from the recipe's seed). The result is returned on the CPU.

    Deterministic for a seed on a given machine and thread count: the weights, the
    prompts and their order all come from the recipe's seed.
    """

    threads = torch.get_num_threads()
    torch.set_num_threads(recipe.threads)
    try:
        run = _start(recipe, max_steps, checkpoint, init, log, device)
        reached = bool(run.history) and run.history[-1]["accuracy"] >= recipe.target_accuracy
        step = run.first_step - 1
        bar = progress_bar(total=run.steps_limit, show=progress, desc=f"train {recipe.name}")
        bar.update(step)  # resumed: the steps already done
        with frozen_at_zero(run.pruned):  # pruned heads stay at 0 (hooks gone on exit)
            for step in range(run.first_step, run.steps_limit + 1) if not reached else range(0):
                loss = _step(run, step)
                bar.update(1)
                if step % recipe.eval_every == 0 or step == run.steps_limit:
                    reached = _evaluate(run, step, loss)
                    if reached:
                        break
        bar.close()
        if not still_pruned(run.pruned):  # would mean an optimizer that moves zero-gradient weights
            raise RuntimeError(f"{recipe.name}: a pruned head's weights left 0 during training")
        return TrainResult(run.model.cpu().eval(), step, time.perf_counter() - run.start, reached, run.history)
    finally:
        torch.set_num_threads(threads)


@dataclass
class _Training:
    """A `train` call under way: the model, its optimiser and data, and the held-out batch."""

    recipe: Recipe
    model: Any
    pruned: Any  # the pruned heads' masks (`head_masks`)
    optimizer: torch.optim.Optimizer
    schedule: Any  # the LambdaLR of `lr_factor`
    data: torch.Generator  # the training prompts' generator
    held: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # held-out ids, answers, the answer letters' ids
    device: str | torch.device
    steps_limit: int
    checkpoint: Path | None
    init: str | Path | None
    log: Callable[[str], None]
    history: list[dict[str, float]]
    first_step: int
    start: float  # time.perf_counter() at the start, less the time a resumed run had taken


def _start(
    recipe: Recipe, max_steps: int | None, checkpoint: str | Path | None, init: str | Path | None, log: Callable[[str], None], device: Any
) -> _Training:
    """The model, optimiser and data at step 0, or where ``checkpoint`` left them."""
    model = build_model(recipe, init).to(device).train()
    pruned = head_masks(model, recipe.pruned_heads)  # build_model zeroed them
    steps_limit = recipe.max_steps if max_steps is None else max_steps
    data = torch.Generator().manual_seed(recipe.seed)
    held_ids, held_answers = toy_token_batch(512, torch.Generator().manual_seed(HELD_OUT_SEED + recipe.seed), **task_shape(recipe))
    held = (held_ids.to(device), held_answers.to(device), _letter_ids(recipe).to(device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(recipe, step))
    history: list[dict[str, float]] = []
    first_step, elapsed = 1, 0.0
    path = Path(checkpoint) if checkpoint is not None else None
    if path is not None and path.is_file():
        state = torch.load(path, weights_only=False, map_location="cpu")
        key, stored = _recipe_key(recipe), state["recipe"]
        if not _key_agrees(key, stored) or not _schedule_agrees(recipe, int(state["step"]), stored):
            raise GnaValueError(f"checkpoint {str(path)!r} was written for another recipe: delete it or pass another path")
        if state.get("init") != init_key(init):
            raise GnaValueError(
                f"checkpoint {str(path)!r} was written from init={state.get('init')!r}, not {init_key(init)!r}: "
                "pass the same --init, or delete the checkpoint"
            )
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        schedule.load_state_dict(state["schedule"])
        data.set_state(state["data"])
        history, first_step, elapsed = state["history"], state["step"] + 1, state["elapsed"]
        log(f"{recipe.name}: resumed from {path} at step {state['step']}")
    start = time.perf_counter() - elapsed
    return _Training(
        recipe, model, pruned, optimizer, schedule, data, held, device, steps_limit, path, init, log, history, first_step, start
    )


def _step(run: _Training, step: int) -> torch.Tensor:
    """One optimiser step on a fresh batch; its loss (before the update)."""
    recipe, task = run.recipe, task_shape(run.recipe)
    shape = {**task, "shuffle_labels": False} if step <= recipe.ordered_label_steps else task  # the curriculum's first steps in order
    input_ids, answers = toy_token_batch(recipe.batch_size, run.data, **shape)
    input_ids, answers = input_ids.to(run.device), answers.to(run.device)
    loss = F.cross_entropy(run.model(input_ids=input_ids).logits[:, -1], answers)
    run.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(run.model.parameters(), recipe.grad_clip)
    run.optimizer.step()
    run.schedule.step()
    return loss


def _evaluate(run: _Training, step: int, loss: torch.Tensor) -> bool:
    """The held-out accuracy at ``step``, logged, added to the history and checkpointed;
    whether it reaches the recipe's target."""
    recipe = run.recipe
    accuracy = quick_accuracy(run.model, *run.held)
    run.history.append({"step": step, "loss": loss.item(), "accuracy": accuracy, "seconds": time.perf_counter() - run.start})
    run.log(f"{recipe.name} step {step}: loss {loss.item():.4f}, held-out accuracy {accuracy:.3f}")
    if run.checkpoint is not None:
        state = {
            "recipe": _recipe_key(recipe),
            "init": init_key(run.init),
            "model": run.model.state_dict(),
            "optimizer": run.optimizer.state_dict(),
            "schedule": run.schedule.state_dict(),
            "data": run.data.get_state(),
            "history": run.history,
            "step": step,
            "elapsed": time.perf_counter() - run.start,
        }
        _save_checkpoint(run.checkpoint, state)
    return accuracy >= recipe.target_accuracy
