"""Add the label-reading check (held-out accuracy with shuffled and in-order labels) to
bundled toys' cards that lack it, and rewrite their README.md.

    python tools/card_labels.py [NAME ...]   (default: every bundled toy without the check)
"""

from __future__ import annotations

import json
import sys

import torch

import gna_interp as gna
from gna_interp.zoo.build import HELD_OUT_PROMPTS, HELD_OUT_TASK_SEED
from gna_interp.zoo.card import label_reading
from gna_interp.zoo.store import CARD, card_markdown, toy_path

torch.set_num_threads(1)
gna.set_progress(False)
for name in sys.argv[1:] or gna.toy_names():
    folder = toy_path(name)
    card = json.loads((folder / CARD).read_text())
    if "labels" in card and not sys.argv[1:]:
        continue
    labels = label_reading(gna.load_toy(name), card["task"], HELD_OUT_PROMPTS, HELD_OUT_TASK_SEED)
    # the check goes right after the held-out accuracy, as build_toy writes it
    keys = list(card)
    card.pop("labels", None)
    ordered = {}
    for key in keys:
        if key != "labels":
            ordered[key] = card[key]
        if key == "held_out_accuracy":
            ordered["labels"] = labels
    (folder / CARD).write_text(json.dumps(ordered, indent=1) + "\n")
    (folder / "README.md").write_text(card_markdown(ordered))
    print(f"{name}: shuffled {labels['shuffled']:.3f}, in order {labels['in_order']:.3f}")
