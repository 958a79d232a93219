"""A self-contained API smoke run, used by ``gna-interp demo`` when the examples
folder is not installed alongside the package."""

from __future__ import annotations


def run() -> None:
    import gna_interp as gna
    from gna_interp.models.tiny import tiny_model, word_tokenizer

    tokenizer = word_tokenizer()
    clean = ["w5 w6 w7 w8", "w9 w10 w11 w12"]
    metric = gna.logit_diff(5, 6)
    for family in ("llama", "mamba2"):
        model = gna.load(tiny_model(family), tokenizer=tokenizer)
        sweep = gna.ablation_sweep(model, clean, None, metric, progress=False)
        print(model, "top heads:", [(str(h), round(s, 4)) for h, s in sweep.top(3)])
