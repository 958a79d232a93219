"""The bundled toy models on disk: ``gna_interp/zoo/models/<name>/`` holds
``model.safetensors``, ``config.json``, the tokenizer files, ``card.json`` (machine
readable) and ``README.md`` (the model card)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..core.errors import GnaTypeError, GnaValueError
from ..core.keywords import suggest_keywords

ZOO_DIR = Path(__file__).resolve().parent / "models"
CARD = "card.json"


def toy_names() -> list[str]:
    """Names of the bundled toy models."""
    return sorted(p.name for p in ZOO_DIR.iterdir() if (p / CARD).is_file()) if ZOO_DIR.is_dir() else []


def toy_path(name: str) -> Path:
    folder = ZOO_DIR / name
    if not (folder / CARD).is_file():
        raise GnaValueError(f"unknown toy model {name!r}: bundled are {toy_names()}")
    return folder


@suggest_keywords
def toy_card(name: Any) -> dict[str, Any]:
    """The model card of a bundled toy model (seed, steps, time, accuracy, ablation facts).

    Args:
        name: a bundled toy (`toy_names`), a trained toy's folder (a `Path`), or a
            `GnaModel` loaded from either (`load_toy`, `gna.load(folder)`).
    """
    source = toy_source(name, "toy_card")
    if isinstance(source, Path):  # a model loaded from a trained toy's folder
        return card_of(source)
    return dict(json.loads((toy_path(source) / CARD).read_text()))


@suggest_keywords
def toy_task(name: Any, n: int = 200, seed: int = 0) -> Any:
    """``n`` fresh prompts of the task a toy model was trained on (`toy_mcq` with its
    card's number of options, words per option, layout, option lengths, label order and
    query place).

    Args:
        name: a bundled toy (`toy_names`), a folder written by ``gna-interp zoo train``, or
            a `GnaModel` loaded from either (``gna.toy_task(gna.load_toy("llama"))``).

    Example::

        model, task = gna.load_toy("llama"), gna.toy_task("llama", n=200, seed=1)
    """
    from ..tasks.toy import toy_mcq

    return toy_mcq(n, seed=seed, **card_of(toy_source(name, "toy_task")).get("task", {}))


def toy_source(value: Any, call: str) -> str | Path:
    """What names a toy in ``call(name, ...)``: a string or path as given; a model loaded
    from a toy's folder (its config's ``name_or_path`` holds ``card.json``) as that
    folder: a bundled toy's name, another folder as a `Path`. Anything else raises a
    `TypeError` naming the value, its type and what is expected."""
    if isinstance(value, (str, Path)):
        return value
    if isinstance(value, os.PathLike):
        return Path(os.fspath(value))
    expected = f"expected a toy name from gna.toy_names() ({', '.join(toy_names())}) or a folder holding {CARD}"
    config = getattr(getattr(value, "hf_model", None), "config", None)
    if config is not None:  # a GnaModel: use the folder it was loaded from, when that is a toy's
        folder = Path(str(getattr(config, "name_or_path", "") or ""))
        if str(folder) and (folder / CARD).is_file():
            return folder.name if folder.resolve().parent == ZOO_DIR and folder.name in toy_names() else folder
        raise GnaTypeError(
            f"{call}(name={value!r}): this {type(value).__name__} was not loaded from a toy's folder "
            f"(its weights came from {str(folder) or 'memory'!r}, which holds no {CARD}), so it names no toy task: {expected}"
        )
    text = repr(value)
    shown = text if len(text) <= 80 else text[:77] + "..."
    raise GnaTypeError(f"{call}(name={shown}) ({type(value).__name__}): {expected}")


def card_of(name: str | Path) -> dict[str, Any]:
    """The card of a bundled toy, or of a trained toy's folder (``card.json`` in it)."""
    if str(name) in toy_names():
        return toy_card(str(name))
    file = Path(name) / CARD
    if not file.is_file():
        raise GnaValueError(f"unknown toy model {str(name)!r}: expected one of {toy_names()} or a folder holding {CARD}")
    return dict(json.loads(file.read_text()))


@suggest_keywords
def load_toy(name: str, backend: str | None = None, device: Any = None) -> Any:
    """Load a bundled toy model offline.

    Args:
        name: a bundled toy, ``"llama"``, ``"mamba2"`` or ``"falcon_h1"`` (see `toy_names`).
        backend: ``"tlens"`` or ``"nnsight"``; default as `gna_interp.load`.
        device: where the weights go (``"cuda"``, a ``torch.device``); default: the CPU.

    Returns:
        a `GnaModel` with the toy tokenizer.
    """
    from ..models.loading import load

    if isinstance(name, os.PathLike):  # a toy's folder given as a path, as `load` takes it
        name = str(os.fspath(name))
    if not isinstance(name, str):
        loaded = " (already a loaded model: use it as it is)" if hasattr(name, "hf_model") else ""
        raise GnaTypeError(
            f"load_toy(name={name!r}) ({type(name).__name__}){loaded}: expected a toy name from gna.toy_names() ({', '.join(toy_names())})"
        )
    folder = toy_path(name)
    model = load(str(folder), backend=backend, device=device)
    model.name = f"toy-{name}"
    return model


def save_toy(model: Any, tokenizer: Any, card: dict[str, Any], folder: Path) -> Path:
    """Write a trained model, its tokenizer and its card to ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    (folder / "generation_config.json").unlink(missing_ok=True)
    tokenizer.save_pretrained(folder)
    (folder / CARD).write_text(json.dumps(card, indent=1) + "\n")
    (folder / "README.md").write_text(card_markdown(card))
    return folder


def _trained_on_gpu(card: dict[str, Any]) -> bool:
    return card.get("device", "cpu") != "cpu"  # cards written before the field: the CPU


def zoo_table_markdown() -> str:
    """One markdown table of every bundled card (``gna-interp zoo list --markdown``)."""
    lines = [
        "| model | parameters | steps | training time | held-out accuracy | labels shuffled / in order "
        "| best single-head ablation | smallest collapsing sets |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in toy_names():
        card = toy_card(name)
        facts = card["ablation"]
        sets = "; ".join(
            f"L{layer}: {len(row['heads'])} head{'s' if len(row['heads']) > 1 else ''} -> {row['accuracy']:.3f}"
            + ("" if row["reached_chance"] else " (not reached)")
            for layer, row in facts["smallest_sets"].items()
        )
        origin = f", fine-tuned from `{card['init_from']}`" if card.get("init_from") else ""
        gpu = " (GPU)" if _trained_on_gpu(card) else ""
        lines.append(
            f"| `{name}` ({card['family']}{origin}) | {card['parameters']:,} | {card['steps']:,} | {card['train_seconds']:.0f} s{gpu} | "
            f"{card['held_out_accuracy']:.3f} | {_labels_cell(card.get('labels'))} | {facts['best_single_head']} -> "
            f"{facts['best_single_head_accuracy']:.3f} | {sets} |"
        )
    return "\n".join(lines) + "\n"


def _labels_cell(labels: dict[str, Any] | None) -> str:
    return "-" if labels is None else f"{labels['shuffled']:.3f} / {labels['in_order']:.3f}"


def _labels_row(labels: dict[str, Any]) -> str:
    verdict = "reads the labels" if labels["shuffled"] >= 0.9 else "answers by the option's place, not its label"
    return (
        f"| labels shuffled / in order | {labels['shuffled']:.3f} / {labels['in_order']:.3f} held out "
        f"({labels['n']} prompts each): {verdict} |"
    )


def card_markdown(card: dict[str, Any]) -> str:
    """The human-readable model card."""
    facts = card["ablation"]
    lines = [
        f"# Toy model `{card['name']}` ({card['family']})",
        "",
        card.get("notes", ""),
        "",
        f"Trained on `gna_interp.tasks.toy_mcq` ({_task_words(card)}), fresh prompts every step, loss on",
        f"the final position only; `gna.toy_task({card['name']!r})` gives its prompts.",
        f"Reproduce with `gna-interp zoo train {card['name']}`.",
        "",
        "| field | value |",
        "|---|---|",
        f"| parameters | {card['parameters']:,} |",
        f"| seed | {card['seed']} |",
        *([f"| starts from | the trained `{card['init_from']}` (fine-tuned){_init_folder(card)} |"] if card.get("init_from") else []),
        *(
            [f"| pruned heads | {', '.join(card['pruned_heads'])} (output zero: `gna_interp.zoo.prune`) |"]
            if card.get("pruned_heads")
            else []
        ),
        f"| steps | {card['steps']:,} (batch {card['batch_size']}) |",
        (
            f"| training time | {card['train_seconds']:.0f} s on a GPU ({card['machine']}) |"
            if _trained_on_gpu(card)
            else f"| training time | {card['train_seconds']:.0f} s on {card['threads']} CPU thread(s) |"
        ),
        f"| held-out accuracy | {card['held_out_accuracy']:.3f} on {card['held_out_n']} fresh prompts (seed {card['held_out_seed']}) |",
        *([_labels_row(card["labels"])] if card.get("labels") else []),
        f"| chance | {facts['chance']:.3f} |",
        f"| best single-head ablation | {facts['best_single_head']} -> {facts['best_single_head_accuracy']:.3f} |",
        "",
        f"Smallest head set per layer whose zero-ablation brings accuracy to chance + {card['chance_margin']:.2f}",
        "(greedy, most harmful first):",
        "",
        "| layer | heads | accuracy | reached |",
        "|---|---|---|---|",
    ]
    for layer, row in facts["smallest_sets"].items():
        lines.append(f"| {layer} | {', '.join(row['heads'])} | {row['accuracy']:.3f} | {'yes' if row['reached_chance'] else 'no'} |")
    curves = {layer: row["curve"] for layer, row in facts["smallest_sets"].items() if row.get("curve")}
    if curves:  # wide layers: the sizes tried doubled
        lines += ["", "Wide layers, the most harmful heads ablated together (size -> accuracy):", ""]
        lines += [f"- layer {layer}: " + ", ".join(f"{int(k)} -> {a:.3f}" for k, a in curve) for layer, curve in curves.items()]
    if facts.get("layer_ablation"):  # cards written since the field exists
        lines += [
            "",
            "Every head of a layer zero-ablated together:",
            "",
            "| layer | everywhere | final position only | segment ends only |",
            "|---|---|---|---|",
        ]
        for layer, row in facts["layer_ablation"].items():
            cells = [f"{row[k]:.3f}" if k in row else "-" for k in ("all", "final", "ends")]
            lines.append(f"| {layer} | {' | '.join(cells)} |")
    if card.get("ablation_n"):
        lines += [
            "",
            f"Ablations measured on {card['ablation_n']} held-out prompts (toy_mcq seed {card['held_out_seed']}).",
        ]
    return "\n".join(lines) + "\n"


def _init_folder(card: dict[str, Any]) -> str:
    folder = card.get("init_folder")
    return f", from `{folder}`" if folder else ", the bundled one"


def _task_words(card: dict[str, Any]) -> str:
    shape = {
        "n_options": 4,
        "words_per_option": 2,
        "layout": "label_first",
        "vary_lengths": False,
        "shuffle_labels": False,
        "query_last": False,
        **card.get("task", {}),
    }
    line = "`A. w1 w2`" if shape["layout"] == "label_first" else "`w1 w2 A`: label last"
    per_option, total = shape["words_per_option"], shape["n_options"] * shape["words_per_option"]
    words = f"1 to {2 * per_option - 1} words ({total} in all)" if shape["vary_lengths"] else f"{per_option} words"
    order = ", labels in a random order" if shape["shuffle_labels"] else ""
    if shape["shuffle_labels"] and card.get("ordered_label_steps"):
        order += f" (in order for the first {card['ordered_label_steps']:,} steps)"
    place = "query after the options" if shape["query_last"] else "query first"
    return f"{shape['n_options']} options of {words}, each line {line}{order}, {place}"
