"""Train a toy model, measure it, write it with its card: what ``gna-interp zoo train`` runs."""

from __future__ import annotations

import platform
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ..core.arch import ArchSpec
from ..core.errors import GnaValueError
from ..models.loading import load
from ..scoring.evaluation import evaluate
from ..tasks.toy import toy_mcq, toy_tokenizer
from .card import CHANCE_MARGIN, ablation_facts, label_reading
from .recipes import Recipe
from .store import save_toy
from .train import TrainResult, init_key, task_shape, train

HELD_OUT_PROMPTS = 2000
HELD_OUT_TASK_SEED = 20_000
"""`toy_mcq` seed of the card's held-out prompts (training never sees text prompts)."""


def build_toy(
    recipe: Recipe,
    out: Path,
    *,
    init: str | Path | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
    device: str | None = None,
    arch: ArchSpec | None = None,
) -> dict[str, Any]:
    """Train ``recipe``, evaluate it on fresh prompts, run the ablation checks, save.

    ``init``: for a recipe with ``init_from``, that toy's folder (default: the bundled one).
    Training checkpoints to ``out/checkpoint.pt`` at every evaluation; running again
    after an interruption resumes there (the result equals an uninterrupted run).
    ``device``: where to train (default: the recipe's ``device``); a CUDA device on a
    machine without one is an error naming the option. ``arch``: the family as data, for a
    family the architecture table lacks (the card's checks load the model with it).

    Returns:
        the model card (also written to ``out/card.json`` and ``out/README.md``).
    """
    out.mkdir(parents=True, exist_ok=True)
    checkpoint = out / "checkpoint.pt"
    where = recipe.device if device is None else device
    if torch.device(where).type == "cuda" and not torch.cuda.is_available():
        raise GnaValueError(
            f"device={where!r}: recipe {recipe.name!r} trains on a GPU and this machine has none; pass "
            "device='cpu' (CLI: --device cpu) to train it on the CPU (much slower, other weights)"
        )
    result = train(recipe, checkpoint=checkpoint, init=init, progress=progress, log=log, device=where)
    return finish_toy(recipe, result, out, progress=progress, init=init, device=where, arch=arch)


def finish_toy(
    recipe: Recipe,
    result: TrainResult,
    out: Path,
    *,
    progress: bool = False,
    init: str | Path | None = None,
    device: str = "cpu",
    arch: ArchSpec | None = None,
) -> dict[str, Any]:
    """Evaluate ``result`` on fresh prompts (on the CPU), run the ablation checks, save.

    ``device``: where it was trained, for the card; ``arch``: as `build_toy`'s."""
    tokenizer = toy_tokenizer()
    model = load(result.model, tokenizer=tokenizer, backend="nnsight", arch=arch)
    task = toy_mcq(HELD_OUT_PROMPTS, seed=HELD_OUT_TASK_SEED, **task_shape(recipe))
    if recipe.ablation_prompts is None:
        facts = ablation_facts(model, task, progress=progress)
    else:  # fewer prompts for the ablations; the clean accuracy on all of them
        facts = ablation_facts(model, toy_mcq(recipe.ablation_prompts, seed=HELD_OUT_TASK_SEED, **task_shape(recipe)), progress=progress)
        facts.clean_accuracy = evaluate(model, task, progress=False).accuracy
    card = {
        "name": recipe.name,
        "family": recipe.family,
        "notes": recipe.notes,
        "task": task_shape(recipe),
        "parameters": sum(p.numel() for p in result.model.parameters()),
        "seed": recipe.seed,
        "steps": result.steps,
        "batch_size": recipe.batch_size,
        "lr": recipe.lr,
        "ordered_label_steps": recipe.ordered_label_steps,
        "init_from": recipe.init_from,
        "init_folder": init_key(init),
        "pruned_heads": list(recipe.pruned_heads),
        "reached_target": result.reached_target,
        "train_seconds": round(result.seconds, 1),
        "threads": recipe.threads,
        "device": device,
        "machine": f"{platform.machine()}, torch {torch.__version__}",
        "held_out_accuracy": facts.clean_accuracy,
        "labels": label_reading(model, task_shape(recipe), HELD_OUT_PROMPTS, HELD_OUT_TASK_SEED),
        "held_out_n": HELD_OUT_PROMPTS,
        "held_out_seed": HELD_OUT_TASK_SEED,
        **({"ablation_n": recipe.ablation_prompts} if recipe.ablation_prompts is not None else {}),
        "chance_margin": CHANCE_MARGIN,
        "ablation": facts.to_dict(),
        "history": result.history,
    }
    save_toy(result.model, tokenizer, card, out)
    (out / "checkpoint.pt").unlink(missing_ok=True)
    return card
