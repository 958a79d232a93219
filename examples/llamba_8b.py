# %% [markdown]
# # The paper's Llamba check on Llamba-8B (GPU)
#
# Llamba-8B is Llama-3.1-8B distilled into Discrete Mamba-2 mixers. Expected (the paper):
# Gather head L16H10, Aggregate heads L17H3 and L17H9; and replacing Llamba's layer 17 by
# Llama-3.1-8B-Instruct's layer 17 (the Aggregate layer; whole layer, no training) takes
# MMLU from about 33% to 50%.
#
# Needs a GPU, Cartesia's modelling code (`pip install
# "git+https://github.com/cartesia-ai/edge.git#subdirectory=cartesia-pytorch"`: the PyPI
# package `cartesia-pytorch` is an empty placeholder) with mamba-ssm's kernels, both
# models' weights (about 16 GB each) and MMLU (`pip install 'gna-interp[data]'`, or local
# files in `cais/mmlu`'s schema).
#
# Environment overrides (CI smoke-checks this script on the CPU twin,
# `gna_interp.models.llamba`): `GNA_EXAMPLE_MODEL` (a Llamba checkpoint folder or hub id),
# `GNA_EXAMPLE_DONOR` (the Llama folder or hub id), `GNA_EXAMPLE_MMLU`, `GNA_EXAMPLE_N`.

# %%
import os

import torch
from torch import nn

import gna_interp as gna

MODEL = os.environ.get("GNA_EXAMPLE_MODEL", "cartesia-ai/Llamba-8B")
DONOR = os.environ.get("GNA_EXAMPLE_DONOR", "meta-llama/Llama-3.1-8B-Instruct")
MMLU = os.environ.get("GNA_EXAMPLE_MMLU")  # None: the hub
N = int(os.environ.get("GNA_EXAMPLE_N", "500"))
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SWAP = 17


def load_llamba() -> gna.GnaModel:
    """A local folder loads through `gna.load` (Cartesia's class when installed, else the
    CPU twin); a hub id through Cartesia's own class, with Llama-3.1's tokenizer."""
    if os.path.isdir(MODEL):
        return gna.load(MODEL, device=DEVICE)
    from cartesia_pytorch.Llamba.llamba import LlambaLMHeadModel  # type: ignore[import-not-found]
    from transformers import AutoTokenizer

    raw = LlambaLMHeadModel.from_pretrained(MODEL).to(DEVICE, torch.bfloat16)
    return gna.load(raw, tokenizer=AutoTokenizer.from_pretrained(DONOR))


model = load_llamba()
task = gna.tasks.mmlu(n=N, path=MMLU, seed=0)
print(model)

# %% The paper's heads (on a smaller model: the found circuit's first Gather / Aggregate heads).
clean = gna.evaluate(model, task).accuracy
print(f"MMLU clean {clean:.3f}")
if model.n_layers >= 18 and model.n_heads >= 11:
    heads = {"gather": [gna.Head(16, 10)], "aggregate": [gna.Head(17, 3), gna.Head(17, 9)]}
else:
    late = list(range(max(0, model.n_layers - 2), model.n_layers))
    circuit = gna.discover(model, task, layers=late, stages=("layers", "heads", "roles"), progress=False)
    heads = {"gather": circuit.gather[:1], "aggregate": circuit.aggregate[:2]}
for role, chosen in heads.items():
    for head in chosen:
        print(f"{role} {head} ablated {gna.evaluate(model, task, [gna.Ablate([head])]).accuracy:.3f}")


# %% The layer swap: Llama's whole block in place of Llamba's (the residual widths match).
class LlamaBlockInLlamba(nn.Module):
    """A Llama decoder layer called the way a Llamba block is: ``block(hidden_states)``,
    returning what a Llamba block returns. It computes its own rotary embedding and runs
    causal attention without a padding mask, so the swapped model is scored one prompt at
    a time (``batch_size=1``)."""

    def __init__(self, layer: nn.Module, rotary: nn.Module, hf_style: bool) -> None:
        super().__init__()
        self.layer, self.rotary, self.hf_style = layer, rotary, hf_style

    def forward(self, hidden_states: torch.Tensor, **kwargs: object) -> object:
        positions = torch.arange(hidden_states.shape[1], device=hidden_states.device)[None]
        embeddings = self.rotary(hidden_states, positions)
        out = self.layer(hidden_states, position_embeddings=embeddings, position_ids=positions)
        out = out[0] if isinstance(out, tuple) else out
        return (out,) if self.hf_style else {"hidden_states": out}


def donor_block(layer: int, hf_style: bool) -> nn.Module:
    from transformers import AutoModelForCausalLM

    donor = AutoModelForCausalLM.from_pretrained(DONOR, dtype=model.hf_model.lm_head.weight.dtype, attn_implementation="sdpa")
    return LlamaBlockInLlamba(donor.model.layers[layer], donor.model.rotary_emb, hf_style).to(DEVICE)


layer = min(SWAP, model.n_layers - 1)
blocks = model.hf_model.get_submodule(model.arch.layers_path)
original = blocks[layer]
hf_style = model.arch.family == "llamba_hf"
one_at_a_time = gna.evaluate(model, task, batch_size=1).accuracy
blocks[layer] = donor_block(layer, hf_style)
try:
    swapped = gna.evaluate(model, task, batch_size=1).accuracy
finally:
    blocks[layer] = original  # the model is Llamba again, even if scoring failed
print(f"MMLU with Llama's layer {layer}: {one_at_a_time:.3f} -> {swapped:.3f}")
