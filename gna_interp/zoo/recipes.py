"""Training recipes of the bundled toy models: one row per model, as data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..core.errors import GnaValueError
from ..tasks.toy import VOCAB_SIZE

TOY_TOKENS = dict(vocab_size=VOCAB_SIZE, pad_token_id=0, bos_token_id=1, eos_token_id=2)
"""The config fields every toy shares (the toy vocabulary's size and special ids); `train` adds
those a recipe's ``config`` leaves out."""
_LLAMA_2X4 = dict(
    hidden_size=64,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    max_position_embeddings=128,
    tie_word_embeddings=False,
    **TOY_TOKENS,
)
"""The toy Llama's shape: 2 layers x 4 heads of 16."""
_MAMBA2_2X8 = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_heads=8,
    head_dim=16,
    expand=2,
    state_size=16,
    n_groups=1,
    chunk_size=32,
    conv_kernel=4,
    tie_word_embeddings=False,
    **TOY_TOKENS,
)
"""The toy Mamba-2s' shape: 2 layers x 8 heads of 16, state 16, a 4-token conv (the query-last ones use 2)."""

_FALCON_H1_2X12 = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=16,
    mamba_d_ssm=128,
    mamba_n_heads=8,
    mamba_d_head=16,
    mamba_expand=2,
    mamba_n_groups=1,
    mamba_d_state=16,
    mamba_chunk_size=32,
    mamba_d_conv=4,
    max_position_embeddings=128,
    tie_word_embeddings=False,
    **TOY_TOKENS,
)
"""The toy hybrids' shape: 2 layers, each with 4 attention heads of 16 and 8 Mamba-2 heads of 16."""


_LLAMA_PRUNED: dict[str, Any] = dict(
    family="llama",
    config=dict(_LLAMA_2X4, initializer_range=0.2),
    seed=1,
    lr=1e-3,
    max_steps=8_000,
    warmup_steps=100,
    decay_start=4_800,
    decay_steps=3_200,
    target_accuracy=0.99,
    layout="label_last",
    shuffle_labels=True,
    init_from="llama_4heads",
)
"""Fine-tuning `llama_4heads` with some layer-1 heads pruned (recipes `llama`, `llama_2heads`)."""


_MAMBA2_PRUNED: dict[str, Any] = dict(
    family="mamba2",
    config=_MAMBA2_2X8,
    seed=1,
    lr=1e-3,
    max_steps=3_000,
    warmup_steps=100,
    decay_start=1_800,
    decay_steps=1_200,
)
"""Fine-tuning a query-first Mamba-2 toy with some layer-1 heads pruned (recipes `mamba2_query_first`,
`mamba2_long_options`)."""
_MAMBA2_QUERY_LAST: dict[str, Any] = dict(family="mamba2", config=dict(_MAMBA2_2X8, conv_kernel=2), query_last=True)
"""The toy Mamba-2 of the query-last task (recipes `mamba2_query_last`, `mamba2`): a 2-token conv,
so that neither an option's words nor the final position reach the query or a label through it."""
_MAMBA2_LAYER1_BUT_L1H4 = tuple(f"L1H{h}" for h in range(8) if h != 4)


@dataclass(frozen=True)
class Recipe:
    """How one toy model is trained on `toy_mcq` prompts (fresh ones every step)."""

    name: str
    family: str
    """HF ``model_type``: a bundled toy's, or any family transformers builds from a config
    (``"qwen3"``, ``"mistral"``...; one the architecture table lacks needs an `ArchSpec`
    to be analysed, docs/own_family.md)."""
    config: dict[str, Any]
    """The model's config fields (`TOY_TOKENS` added where left out), e.g. `FAMILY_SHAPE`."""
    seed: int
    lr: float
    max_steps: int
    batch_size: int = 128
    warmup_steps: int = 200
    decay_start: int | None = None
    """Step after which the learning rate decays linearly to 0 over ``decay_steps``
    (``None``: constant after warm-up)."""
    decay_steps: int = 0
    more_phases: tuple[tuple[int, float, float], ...] = ()
    """After the decay: ``(steps, start factor, end factor)`` phases, linear within each
    (a warm restart, e.g. ``(6000, 0.5, 0.5), (3000, 0.5, 0.0)``)."""
    grad_clip: float = 1.0
    weight_decay: float = 0.01
    eval_every: int = 200
    target_accuracy: float = 0.99
    """Stop once a fixed held-out batch of 512 prompts is answered this well."""
    n_options: int = 4
    words_per_option: int = 2
    layout: str = "label_first"
    """`toy_mcq` layout: ``"label_first"`` (``A. w1 w2``) or ``"label_last"`` (``w1 w2 A``)."""
    vary_lengths: bool = False
    """`toy_mcq`'s option lengths vary (1 to ``2 * words_per_option - 1`` words)."""
    shuffle_labels: bool = False
    """`toy_mcq`'s labels come in a random order per prompt."""
    query_last: bool = False
    """`toy_mcq`'s ``Query: w`` line comes after the options, just before ``Answer:``."""
    ordered_label_steps: int = 0
    """With ``shuffle_labels``: the first steps keep the labels in order, a curriculum
    (the model first learns to find the option, then to read its label)."""
    init_from: str | None = None
    """Fine-tuning: the toy whose trained weights start this one (a bundled toy's name, or
    a folder passed to `train` as ``init``), instead of a fresh initialisation."""
    pruned_heads: tuple[str, ...] = ()
    """Heads removed before training (``"L1H3"``): the weight entries
    that carry their output are zero and stay zero
    (`gna_interp.zoo.prune`), so a layer can have fewer heads than the config says."""
    threads: int = 1
    device: str = "cpu"
    """Where the bundled weights were trained (``"cuda"``: on a GPU, for a recipe that needs
    hours of a 2-core CPU); `gna-interp zoo train --device` overrides it."""
    ablation_prompts: int | None = None
    """Held-out prompts of the card's ablation facts (``None``: all of them, as the clean
    accuracy); fewer for a toy whose every channel is a head."""
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.ordered_label_steps < 0 or (self.ordered_label_steps and not self.shuffle_labels):
            raise GnaValueError(
                f"ordered_label_steps={self.ordered_label_steps}: expected 0, or a positive number of steps with shuffle_labels=True"
            )


RECIPES: dict[str, Recipe] = {
    recipe.name: recipe
    for recipe in (
        Recipe(
            name="llama_4heads",
            family="llama",
            config=dict(_LLAMA_2X4, initializer_range=0.2),
            seed=0,
            lr=2e-3,
            max_steps=73_200,
            decay_start=31_200,
            decay_steps=10_000,
            more_phases=((8_000, 0.5, 0.5), (4_000, 0.5, 0.0)) + ((6_000, 0.25, 0.25), (4_000, 0.25, 0.0)) * 2,
            target_accuracy=0.97,
            layout="label_last",
            shuffle_labels=True,
            notes=(
                "2 layers x 4 heads of 16, on label-last options with shuffled labels: only a summary written into each "
                "option's label can answer. Initialised 10x wider than HF's default (std 0.2): from std 0.02 it stays "
                "at chance for 32,000+ steps. Bundled as the start of `llama`: its layer-1 heads aggregate together; "
                "two of them (L1H1, L1H3) act mostly through the MLP, and favour the correct option on some prompts only."
            ),
        ),
        Recipe(
            name="llama",
            **_LLAMA_PRUNED,
            pruned_heads=("L1H1", "L1H2", "L1H3"),
            notes=(
                "`llama_4heads` with layer 1 pruned to one head, then fine-tuned: 4 heads of 16 in layer 0, 1 in layer 1. "
                "The kept head, L1H0, cost the most ablated alone on 500 prompts of the task (toy_mcq seed 10001): L1H0 -> "
                "0.762, L1H3 0.768, L1H2 0.784, L1H1 0.846. The first three are within noise: on the 2,000 prompts of "
                "`llama_4heads`'s card L1H2 comes first (0.746, then L1H0 0.766)."
            ),
        ),
        Recipe(
            name="llama_2heads",
            **_LLAMA_PRUNED,
            pruned_heads=("L1H1", "L1H2"),
            notes=(
                "As `llama`, with layer 1 pruned to two heads, L1H0 and L1H3 (the two most important by the same 500 "
                "prompts). Not bundled: L1H3's final row favours the wrong options (see docs/records/discovery.md)."
            ),
        ),
        Recipe(
            name="llama_4x8",
            family="llama",
            config=dict(_LLAMA_2X4, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=8, head_dim=16, initializer_range=0.2),
            seed=0,
            lr=1e-3,
            max_steps=800,
            warmup_steps=100,
            decay_start=400,
            decay_steps=400,
            layout="label_last",
            shuffle_labels=True,
            init_from="llama_4x8_start",
            notes=(
                "The teacher of issue 30's keep-only experiments: 4 layers x 8 heads of 16 (32 heads), on label-last options "
                "with shuffled labels (it must read the labels). Grown from `llama_4heads`, then fine-tuned: that toy's layers "
                "are layers 0 and 2 (heads 0-3), every other head and layers 1 and 3 freshly initialised with their writers "
                "scaled by 0.1 (`python benchmarks/retention_teacher.py widen OUT`, then `gna-interp zoo train llama_4x8 "
                "--init OUT`). Training from scratch at this size did not fit the time on a shared 2-core machine (0.5 steps/s)."
                " Its retrieval ranking on its task (500 prompts, toy_mcq seed 31000, zero ablation): L0H0 0.672, L0H"
                "2 0.600, L0H1 0.570, L0H3 0.556, L2H0 0.232, L2H2 0.206, L2H3 0.194, L2H1 0.126; the 24 new heads 0."
                "000 (fine-tuning left them near-inert). Keeping those 8 of 32 heads (25%) and mean-ablating the rest"
                " keeps 0.986 (100% of clean); the top 6 keep 0.702, the top 4 0.234; 8 random heads keep 0.256 +- 0."
                "017 (5 seeds) (`python benchmarks/retention_teacher.py measure`)."
            ),
        ),
        Recipe(
            name="mamba2_8heads",
            family="mamba2",
            config=_MAMBA2_2X8,
            seed=0,
            lr=3e-3,
            max_steps=8_000,
            notes=(
                "2 layers x 8 heads of 16, state 16, query first. Bundled as the start of `mamba2_query_first`: its "
                "aggregation needs three layer-1 heads, among them a backup head, L1H6, whose final row does not favour the "
                "correct option."
            ),
        ),
        Recipe(
            name="mamba2_query_first",
            **_MAMBA2_PRUNED,
            init_from="mamba2_8heads",
            pruned_heads=_MAMBA2_LAYER1_BUT_L1H4,
            notes=(
                "`mamba2_8heads` with layer 1 pruned to one head, then fine-tuned: 8 heads of 16 in layer 0 and 1 in layer 1 "
                "(state 16). The kept head, L1H4, cost the most ablated alone on 500 prompts of the task (toy_mcq seed "
                "10001): L1H4 -> 0.526, then L1H5 0.816; the others 0.936 or more. A pruned Mamba-2 head's gate is zero "
                "too, so the group's gated norm no longer depends on it. It was the bundled `mamba2` until the query-last "
                "one replaced it: its critical Gather head, L0H0, carries the query into the options and its segment-end "
                "rows look outside their own segment."
            ),
        ),
        Recipe(
            name="mamba2_long_options",
            **_MAMBA2_PRUNED,
            words_per_option=4,
            init_from="mamba2_query_first",
            pruned_heads=_MAMBA2_LAYER1_BUT_L1H4,
            notes=(
                "`mamba2_query_first` fine-tuned on options of 4 words, longer than its 4-token conv can carry into the "
                "option's line end. Not bundled: its critical Gather head, L0H0, still reads outside its own segment "
                "(gather ratio 0.11), so longer options do not close that toy's Gather pattern gap (the query-last task does)."
            ),
        ),
        Recipe(
            name="mamba2_counting",
            **_MAMBA2_QUERY_LAST,
            seed=1,
            lr=3e-3,
            max_steps=6_000,
            warmup_steps=100,
            decay_start=3_600,
            decay_steps=2_400,
            init_from="mamba2_query_last",
            pruned_heads=tuple(f"L1H{h}" for h in range(8) if h != 6),
            notes=(
                "`mamba2_query_last` with layer 1 pruned to one head, then fine-tuned: 8 heads of 16 in layer 0 and 1 in "
                "layer 1 (state 16, 2-token conv), query after the options. The kept head, L1H6, cost the most ablated alone "
                "on 500 prompts of the task (toy_mcq seed 10001): L1H6 -> 0.746, then L1H0 0.796, L1H2 0.810, L1H1 0.812; "
                "the others 0.968 or more. On the 2,000 prompts of `mamba2_query_last`'s card L1H2 comes first (0.780). "
                "It was the bundled `mamba2` until the label-reading one replaced it: trained with the labels in order, it "
                "answers by the option's place (labels shuffled: 0.302 held out, against 0.993 in order)."
            ),
        ),
        Recipe(
            name="mamba2_query_last",
            **_MAMBA2_QUERY_LAST,
            seed=0,
            lr=3e-3,
            max_steps=8_000,
            notes=(
                "2 layers x 8 heads of 16, state 16, with the query after the options and a 2-token conv: no option can see "
                "the query, and neither the conv of an option's words nor that of the final position reaches far enough to "
                "do the retrieval. Bundled as the start of `mamba2`: its aggregation needs five layer-1 heads."
            ),
        ),
        Recipe(
            name="mamba2_query_last_conv4",
            family="mamba2",
            config=_MAMBA2_2X8,
            seed=0,
            lr=3e-3,
            max_steps=8_000,
            query_last=True,
            notes=(
                "As `mamba2_query_last` with the default 4-token conv. Not bundled: the final position's conv reaches the "
                "query word and each word's conv its label, and it retrieves in layer 0 (0.996 held out after 1,600 steps; "
                "all eight layer-1 heads ablated together leave 0.94)."
            ),
        ),
        Recipe(
            name="mamba2",
            family="mamba2",
            config=dict(_MAMBA2_2X8, conv_kernel=2),
            seed=0,
            lr=3e-3,
            max_steps=30_000,
            layout="label_last",
            vary_lengths=True,
            shuffle_labels=True,
            ordered_label_steps=2_500,
            notes=(
                "2 layers x 8 heads of 16, state 16, on label-last options of varied lengths with shuffled labels (in order "
                "for the first 2,500 steps), so only a summary written into each option's label can answer. A 2-token "
                "conv, so that the conv cannot carry a whole option into its label. From shuffled labels at the start it "
                "stayed at chance for 2,200 steps. Unpruned: its roles keep their natural head counts (spread over several "
                "heads, as the paper finds for SSMs). It replaced the counting toy (`mamba2_counting`) as `mamba2`."
            ),
        ),
        Recipe(
            name="mamba2_shuffled",
            family="mamba2",
            config=_MAMBA2_2X8,
            seed=0,
            lr=3e-3,
            max_steps=25_000,
            target_accuracy=0.985,
            shuffle_labels=True,
            ordered_label_steps=2_500,
            notes=(
                "`mamba2_8heads`'s shape and task (label-first options, query first), with shuffled labels (in order for the "
                "first 2,500 steps). Not bundled: it reads the labels (0.997 held out after 3,000 steps, 472 s), but the final "
                "row of its single Aggregate head favours the wrong options (uniform ratio 0.42), and ablating that "
                "head leaves 0.35-0.375 depending on the prompts."
            ),
        ),
        Recipe(
            name="falcon_h1_counting",
            family="falcon_h1",
            config=_FALCON_H1_2X12,
            seed=0,
            lr=3e-3,
            max_steps=16_000,
            notes=(
                "Hybrid, 2 layers, each running attention (4 heads of 16: heads 0-3) and Mamba-2 (8 heads of 16: "
                "heads 4-11) in parallel, so either kind can take either role. It was the bundled `falcon_h1` until the "
                "label-reading one replaced it: trained with the labels in order, it answers by the option's place (labels "
                "shuffled: 0.306 held out, against 0.984 in order)."
            ),
        ),
        Recipe(
            name="falcon_h1",
            family="falcon_h1",
            config=dict(_FALCON_H1_2X12, mamba_d_conv=2, initializer_range=0.1),
            seed=0,
            lr=3e-3,
            max_steps=30_000,
            layout="label_last",
            vary_lengths=True,
            shuffle_labels=True,
            ordered_label_steps=2_500,
            notes=(
                "Hybrid, 2 layers, each running attention (4 heads of 16: heads 0-3) and Mamba-2 (8 heads of 16: heads "
                "4-11) in parallel, on label-last options of varied lengths with shuffled labels (in order for the first "
                "2,500 steps), so only a summary written into each option's label can answer. A 2-token conv, so that the "
                "conv cannot carry a whole option into its label. Initialised 5x wider than HF's default (std 0.1): "
                "from std 0.02 it was still at chance after 7,600 steps (5,100 of them with shuffled labels); from 0.1 it "
                "left chance right after the curriculum. Unpruned: every head it trained with is kept."
            ),
        ),
        Recipe(
            name="mamba",
            family="mamba",
            config=dict(
                hidden_size=64,
                num_hidden_layers=2,
                expand=2,
                state_size=16,
                conv_kernel=4,
                tie_word_embeddings=False,
                **TOY_TOKENS,
            ),
            seed=1,
            lr=2e-3,
            max_steps=6_000,
            device="cuda",
            ablation_prompts=400,
            notes=(
                "Mamba-1, 2 layers x 128 channels (each channel is a head), state 16, query first. Trained on a GPU "
                "(an H200 lent for one session, HF's PyTorch path: no fused kernels): it sits at chance for 2,000-4,000 "
                "steps, then learns (seeds 1, 2 and 3 reached 0.99 at steps 6,000, 5,800 and 4,800, in 200-245 s). "
                "On the 2-core CPU the same recipe ran at 2-5 s a step under load and was still at chance at step 1,000."
            ),
        ),
    )
}


def recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise GnaValueError(f"unknown toy model {name!r}: expected one of {sorted(RECIPES)}")
    return RECIPES[name]


FAMILY_SHAPE: dict[str, Any] = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=16,
    max_position_embeddings=128,
    initializer_range=0.2,
    tie_word_embeddings=False,
)
"""The config of a toy of a family the zoo does not ship (`family_recipe`): 2 layers x 4
attention heads of 16, initialised 10x wider than HF's default (as the toy Llama: from std
0.02 such toys sit at chance for thousands of steps). The fields of Llama-like families
(``llama``, ``mistral``, ``qwen2``, ``qwen3``...); another family takes its own."""

FAMILY_TRAINING: dict[str, Any] = dict(seed=0, lr=3e-3, max_steps=400, batch_size=64, warmup_steps=50, eval_every=50, target_accuracy=0.95)
"""`family_recipe`'s training settings: a few hundred steps of 64 prompts, stopping at 0.95."""


def family_recipe(name: str, family: str, config: dict[str, Any] | None = None, **fields: Any) -> Recipe:
    """A `Recipe` for a toy of ``family`` (any HF ``model_type``): `FAMILY_SHAPE` updated by
    ``config``, `FAMILY_TRAINING` updated by ``fields`` (any other `Recipe` field too:
    ``n_options=2``, ``shuffle_labels=True``...). What ``gna-interp zoo train NAME --family
    FAMILY`` trains."""
    if not isinstance(family, str) or not family:
        raise GnaValueError(f"family={family!r}: expected a transformers model_type, e.g. 'qwen3'")
    if config is not None and not isinstance(config, dict):
        raise GnaValueError(f"config={config!r}: expected a dict of config fields")
    return Recipe(name=name, family=family, config={**FAMILY_SHAPE, **(config or {})}, **{**FAMILY_TRAINING, **fields})


def recipe_with(name: str, family: str | None = None, config: dict[str, Any] | None = None, **fields: Any) -> Recipe:
    """What ``gna-interp zoo train`` trains: the bundled recipe ``name`` with ``fields``
    replaced, or with ``family`` a new toy (`family_recipe`). Its task is checked by building
    one prompt (a bad number of options fails now, not at the first step)."""
    import dataclasses

    from ..tasks.toy import toy_mcq

    if family is None and config is not None:
        raise GnaValueError(f"config={config!r} sets the config of a new toy: give its family too")
    chosen = dataclasses.replace(recipe(name), **fields) if family is None else family_recipe(name, family, config, **fields)
    shape = ("n_options", "words_per_option", "layout", "vary_lengths", "shuffle_labels", "query_last")
    toy_mcq(1, **{field: getattr(chosen, field) for field in shape})
    return chosen
