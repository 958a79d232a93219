"""`LMEvalModel`: an ``lm_eval`` language model that runs through a `GnaModel`.

lm-evaluation-harness asks a model three things: the log-probability of a continuation
after a context (``loglikelihood``: multiple-choice tasks such as MMLU, ARC, HellaSwag),
of a whole text (``loglikelihood_rolling``: perplexity) and a greedy generation
(``generate_until``: GSM8K, BBH). Each is answered here with forwards of
`GnaModel.logits`, so every intervention given to the adapter and every active
``model.ablated`` / ``model.intervening`` / `gna_interp.swap_layers` context applies,
on either backend and on remote models. Nothing is cached between forwards: each
generation step is one full forward over the prompt and the tokens so far.

Tokenization follows lm-eval's own Hugging Face model: a context is encoded with the
tokenizer's default special tokens (so ``<bos>`` where the tokenizer adds one), the
continuation is what ``context + continuation`` adds to it, and an empty context or a
rolling window starts from `prefix_token_id`. Requests with the same input (the
choices of one question, when each is one token) share one forward.

Importing this module registers the class in lm-eval's model registry as ``gna``.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from ..core.interventions import Ablate, Intervention, KeepOnly, MaskAttentionRows, Patch

try:
    import lm_eval.models  # noqa: F401 - lm-eval's own names first: its registry fills itself only while empty
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
except ImportError as error:  # pragma: no cover - exercised without the extra
    raise ImportError('gna_interp.harness needs lm-eval: pip install "gna-interp[eval]"') from error

from ..core.errors import GnaTypeError, GnaValueError
from ..models.handle import GnaModel

DEFAULT_MAX_LENGTH = 2048
"""Context length for models whose config states none (SSMs), as lm-eval's HF model."""
DEFAULT_MAX_GEN_TOKS = 256


class LMEvalModel(TemplateLM):
    """A `GnaModel` as an ``lm_eval.api.model.LM``, with interventions.

    Args:
        model: the model to evaluate.
        interventions: applied to every forward, on top of the model's active
            ``ablated`` / ``intervening`` contexts. `Patch` and resample `Ablate` pair
            rows with their own inputs and cannot follow lm-eval's requests; positions
            (`Ablate(positions=...)`, `MaskAttentionRows`) must count from the end
            (``-1``: the last token fed, the one that predicts a one-token continuation).
        batch_size: forwards hold up to this many distinct inputs (left-padded).
        max_length: the longest input fed (longer ones keep their last tokens);
            default: the config's ``max_position_embeddings``, else 2048.
        max_gen_toks: default generation length when a task gives none.
        prefix_token_id: the token an empty context and a rolling window start from;
            default: the tokenizer's BOS, else its EOS. A tokenizer with neither needs
            it only for those two kinds of request.
        progress: tqdm bars over forwards (default: unless lm-eval asks for none).

    Example::

        lm = LMEvalModel(model, [gna.Ablate([gna.Head(16, 22)])])
        lm_eval.simple_evaluate(model=lm, tasks=["mmlu"])
    """

    backend = "causal"

    def __init__(
        self,
        model: GnaModel,
        interventions: Sequence[Intervention] = (),
        batch_size: int = 16,
        *,
        max_length: int | None = None,
        max_gen_toks: int = DEFAULT_MAX_GEN_TOKS,
        prefix_token_id: int | None = None,
        progress: bool | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(model, GnaModel):
            raise GnaTypeError(
                f"LMEvalModel needs a gna_interp.GnaModel, got {type(model).__name__} (from the CLI: --model_args pretrained=...)"
            )
        for name, value in (("batch_size", batch_size), ("max_gen_toks", max_gen_toks), ("max_length", max_length)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise GnaValueError(f"{name}={value!r}: expected a positive int")
        self.gna_model = model
        self.interventions = tuple(interventions)
        check_interventions(self.interventions, "interventions")
        self._batch_size = batch_size
        self._max_length = max_length
        self._max_gen_toks = max_gen_toks
        self._prefix_token_id = prefix_token_id
        self.progress = progress
        self.tokenizer = model.tokenizer

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict[str, Any] | None = None) -> LMEvalModel:
        """From the CLI's ``--model_args`` string (see `gna_interp.harness.args`)."""
        from lm_eval.utils import simple_parse_args_string

        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict[str, Any], additional_config: dict[str, Any] | None = None) -> LMEvalModel:
        """From ``model_args`` as a dict, with lm-eval's ``batch_size`` / ``device`` settings
        (``model_args`` win where both give one)."""
        from .args import load_from_args, parse_model_args

        settings = {key: value for key, value in (additional_config or {}).items() if value is not None}
        parsed = parse_model_args({**settings, **arg_dict})
        return cls(load_from_args(parsed), parsed.interventions, **parsed.adapter)

    # ----- what lm-eval reads ----------------------------------------------------
    @property
    def batch_size(self) -> int:
        return self._batch_size

    @property
    def device(self) -> torch.device:
        return self.gna_model.device

    @property
    def max_length(self) -> int:
        if self._max_length is not None:
            return self._max_length
        return int(getattr(self.gna_model.hf_model.config, "max_position_embeddings", None) or DEFAULT_MAX_LENGTH)

    @property
    def max_gen_toks(self) -> int:
        return self._max_gen_toks

    @property
    def eot_token_id(self) -> int | None:  # type: ignore[override]
        """The tokenizer's EOS (ends a generation), or ``None``: generations then end
        at the task's stop strings or after ``max_gen_toks`` tokens."""
        value = self.tokenizer.eos_token_id
        return None if value is None else int(value)

    @property
    def prefix_token_id(self) -> int:
        for value in (self._prefix_token_id, self.tokenizer.bos_token_id, self.tokenizer.eos_token_id):
            if value is not None:
                return int(value)
        raise GnaValueError(
            f"{self.gna_model.name}'s tokenizer has no BOS or EOS token, which an empty context and loglikelihood_rolling start "
            "from: pass prefix_token_id= (model_args prefix_token_id=N)"
        )

    @property
    def tokenizer_name(self) -> str:
        return str(getattr(self.tokenizer, "name_or_path", "") or self.gna_model.name).replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """Token ids of ``string``; ``None``: the tokenizer's default special tokens (not
        doubled when ``string`` already starts with the BOS text)."""
        options = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        bos = self.tokenizer.bos_token
        if add_special_tokens is None and bos and string.startswith(bos):
            options = {"add_special_tokens": False}
        return list(self.tokenizer(string, **options)["input_ids"])

    def tok_decode(self, tokens: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(tokens), skip_special_tokens=True))

    # ----- scoring ---------------------------------------------------------------
    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """lm-eval's tokenization (`TemplateLM`), then `_loglikelihood_tokens`; its
        tokenizing bar follows ``progress`` too."""
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm or self.progress is False)

    def _loglikelihood_tokens(self, requests: list[Any], disable_tqdm: bool = False, **kwargs: Any) -> list[tuple[float, bool]]:
        """``(summed log-prob, greedy?)`` per ``((context, continuation), context_ids,
        continuation_ids)`` request: one forward per distinct input ``(context +
        continuation)[:-1]`` (its last `max_length` tokens)."""
        self._check_ambient()
        inputs: list[tuple[int, ...]] = []
        for strings, context_ids, continuation_ids in requests:
            context, continuation = strings or ("", "")
            if not continuation_ids:
                raise GnaValueError(f"continuation {continuation!r} after context {context[-40:]!r} tokenizes to no tokens")
            if len(continuation_ids) > self.max_length:
                raise GnaValueError(
                    f"continuation {continuation[:40]!r} has {len(continuation_ids)} tokens, more than max_length={self.max_length}"
                )
            whole = [*context_ids, *continuation_ids][-(self.max_length + 1) :]
            inputs.append(tuple(whole[:-1]))
        users: dict[tuple[int, ...], list[int]] = defaultdict(list)
        for index, tokens in enumerate(inputs):
            users[tokens].append(index)
        distinct = sorted(users, key=lambda tokens: (-len(tokens), tokens))  # longest first: fewer pad columns per batch
        results: list[tuple[float, bool]] = [(0.0, False)] * len(requests)
        for start in self._bar(range(0, len(distinct), self.batch_size), disable_tqdm, "gna loglikelihood"):
            chunk = distinct[start : start + self.batch_size]
            logits = self.gna_model.logits([list(tokens) for tokens in chunk], self.interventions)
            for row, tokens in enumerate(chunk):
                for index in users[tokens]:
                    target = torch.tensor(requests[index][2])
                    logprobs = logits[row, -len(target) :].float().log_softmax(-1).cpu()
                    score = float(logprobs.gather(1, target[:, None]).sum())
                    greedy = bool((logprobs.argmax(-1) == target).all())
                    results[index] = (score, greedy)
                    if requests[index][0] is not None:  # rolling windows are cached whole, by loglikelihood_rolling
                        self.cache_hook.add_partial("loglikelihood", requests[index][0], results[index])
        return results

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """Log-probability of each whole text after `prefix_token_id`, in windows of
        `max_length` tokens (lm-eval's rolling windows, context 1)."""
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        windows, owner = [], []
        for index, (text,) in enumerate(request.args for request in requests):
            tokens = self.tok_encode(text)  # default special tokens, as lm-eval's HF model
            for context_ids, continuation_ids in map(
                make_disjoint_window, get_rolling_token_windows(tokens, self.prefix_token_id, self.max_length, context_len=1)
            ):
                windows.append((None, list(context_ids), list(continuation_ids)))
                owner.append(index)
        scores = self._loglikelihood_tokens(windows, disable_tqdm=disable_tqdm)
        totals = [0.0] * len(requests)
        for index, (score, _) in zip(owner, scores, strict=True):
            totals[index] += score
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    # ----- generation ------------------------------------------------------------
    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy generations, each stopped at the first of the request's ``until``
        strings (cut there), at EOS, or after ``max_gen_toks`` tokens."""
        self._check_ambient()
        groups: dict[str, list[int]] = defaultdict(list)
        for index, request in enumerate(requests):
            groups[json.dumps(request.args[1], sort_keys=True, default=str)].append(index)
        outputs = [""] * len(requests)
        for indices in groups.values():
            options = _generation_options(requests[indices[0]].args[1], self.max_gen_toks)
            stops = list(options["until"])
            budget = self.max_length - options["max_gen_toks"]
            if budget < 1:
                raise GnaValueError(f"max_gen_toks={options['max_gen_toks']} leaves no room for a prompt in max_length={self.max_length}")
            prompts = {index: self.tok_encode(requests[index].args[0])[-budget:] for index in indices}
            ordered = sorted(indices, key=lambda index: -len(prompts[index]))
            for start in self._bar(range(0, len(ordered), self.batch_size), disable_tqdm, "gna generate_until"):
                chunk = ordered[start : start + self.batch_size]
                texts = self._greedy([prompts[index] for index in chunk], options["max_gen_toks"], stops)
                for index, text in zip(chunk, texts, strict=True):
                    outputs[index] = text
                    self.cache_hook.add_partial("generate_until", requests[index].args, text)
        return outputs

    def _greedy(self, prompts: list[list[int]], max_new: int, stops: list[str]) -> list[str]:
        """Greedy continuations of ``prompts`` (one full forward per step over the rows
        still running), decoded and cut at the first stop string."""
        generated: list[list[int]] = [[] for _ in prompts]
        running = list(range(len(prompts)))
        eos = self.eot_token_id
        for _ in range(max_new):
            if not running:
                break
            logits = self.gna_model.logits([prompts[i] + generated[i] for i in running], self.interventions)
            chosen = logits[:, -1].argmax(-1).tolist()
            still = []
            for row, token in zip(running, chosen, strict=True):
                if token == eos:
                    continue
                generated[row].append(int(token))
                if not any(stop in self.tok_decode(generated[row]) for stop in stops if stop):
                    still.append(row)
            running = still
        texts = []
        for tokens in generated:
            text = self.tok_decode(tokens)
            for stop in filter(None, stops):
                text = text.split(stop)[0]
            texts.append(text)
        return texts

    # ----- checks ----------------------------------------------------------------
    def _check_ambient(self) -> None:
        check_interventions(self.gna_model.active_interventions, f"{self.gna_model.name}'s active interventions")

    def _bar(self, items: range, disable_tqdm: bool, what: str) -> Any:
        from tqdm.auto import tqdm

        show = (not disable_tqdm and len(items) > 4) if self.progress is None else self.progress
        return tqdm(items, desc=what, disable=not show, leave=False)

    def __repr__(self) -> str:
        return f"LMEvalModel({self.gna_model!r}, interventions={list(self.interventions)!r}, batch_size={self.batch_size})"


def check_interventions(interventions: Sequence[Intervention], what: str) -> None:
    """Refuse what cannot follow lm-eval's requests: paired rows and positions counted
    from the start of a padded batch."""
    for item in interventions:
        if isinstance(item, Patch) or (isinstance(item, (Ablate, KeepOnly)) and item.how == "resample"):
            raise GnaValueError(
                f"{what}: {type(item).__name__} pairs each prompt with its own source row, which lm-eval's requests do not have: "
                "use zero or mean ablation"
            )
        if isinstance(item, (Ablate, MaskAttentionRows)) and not _from_end(item.positions):
            raise GnaValueError(
                f"{what}: positions={item.positions!r}: lm-eval's requests have different lengths, so positions must count from the "
                "end of each input (negative ints, e.g. -1 for the last token) or be None"
            )


def _from_end(positions: Any) -> bool:
    if positions is None:
        return True
    values = [positions] if isinstance(positions, int) else positions
    if isinstance(values, torch.Tensor) or not isinstance(values, (list, tuple, range)):
        return False
    return all(isinstance(p, int) and not isinstance(p, bool) and p < 0 for p in values)


def _generation_options(gen_kwargs: Any, default_max: int) -> dict[str, Any]:
    """``until`` (a list of strings) and ``max_gen_toks`` from a request's generation
    arguments, read by lm-eval's own rules (its aliases for the length; ``do_sample``
    unset means sampling when ``temperature > 0``); sampling is refused."""
    from lm_eval.models.utils import normalize_gen_kwargs

    if not isinstance(gen_kwargs, dict):
        raise GnaValueError(f"generation arguments {gen_kwargs!r}: expected a dict")
    options = normalize_gen_kwargs(gen_kwargs, default_max)
    if options["do_sample"]:
        raise GnaValueError(f"generation arguments {gen_kwargs!r} ask for sampling: the gna model decodes greedily only")
    until = options.get("until") or []
    until = [until] if isinstance(until, str) else list(until)
    if not all(isinstance(stop, str) for stop in until):
        raise GnaValueError(f"until={until!r}: expected a string or a list of strings")
    if options["max_gen_toks"] < 1:
        raise GnaValueError(f"max_gen_toks={options['max_gen_toks']!r}: expected a positive int")
    return {"until": until, "max_gen_toks": options["max_gen_toks"]}


register_model("gna")(LMEvalModel)
