# %% [markdown]
# # Path patching into one head of a shared group (offline, toy model)
#
# `mamba2_8heads` (the unpruned query-first toy) has one `B` / `C` group for all 8 heads of
# a layer (`n_groups = 1`), and its gated norm spans all 8. A path into one layer-1 head
# changes that head's output and nothing else: through `B`, the head reads its own patched
# copy of the layer's `B` while the other seven keep their clean outputs.
#
# Senders: every layer-0 head, switched to a prompt whose correct option is another one.
# For each layer-1 head, the share of the clean - corrupt logit difference that flows
# through it, by its whole output (`"any"`) and through its `B` only. The last lines patch
# `B` for all 8 heads at once (every head that reads the unit named as a receiver), which
# is what a path "into one head's B" measured before receivers were isolated.

# %%
import torch

import gna_interp as gna

torch.set_num_threads(1)
model = gna.load_toy("mamba2_8heads")
task = gna.toy_task("mamba2_8heads", 16, seed=7)
corrupt = task.corrupted()
enc, cor = task.encode(), corrupt.encode()
rows = range(len(task))
metric = gna.logit_diff(enc.candidate_ids[rows, enc.correct], cor.candidate_ids[rows, cor.correct])

senders = [gna.Head(0, h) for h in range(model.heads_per_layer[0])]
layer1 = [gna.Head(1, h) for h in range(model.heads_per_layer[1])]
clean = float(metric(model.logits(task)).mean())
span = clean - float(metric(model.logits(corrupt)).mean())


def share(receivers, receiver_input="any"):
    """Fraction of the clean - corrupt difference that the path carries."""
    return (
        clean - gna.path_patching(model, task, corrupt, metric, senders=senders, receivers=receivers, receiver_input=receiver_input)
    ) / span


# %%
print(f"{'receiver':<10}{'any':>8}{'B':>8}")
for head in layer1:
    print(f"{head!s:<10}{share([head]):>8.3f}{share([head], 'B'):>8.3f}")
print(f"{'all 8':<10}{share(layer1):>8.3f}{share(layer1, 'B'):>8.3f}")
