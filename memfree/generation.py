"""Guarded and unguarded completion of prompts, and what the guard changed (for the CLI, the demo,
the benchmarks and the evaluation).

The paper's Appendix G shows guarded generations with each blocked token beside the token chosen
in its place; :func:`explain` renders that notation: ``[[blocked -> chosen]]`` (in a terminal,
the blocked token in red and struck through, the chosen one in green).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from memfree.engines.stats import GuardStats
from memfree.engines.transformers import MemFreeLogitsProcessor
from memfree.errors import SettingError
from memfree.filterfile.protocol import NgramSet
from memfree.units import stored_ngram_counts

MAX_SEED = 2**32 - 1


@dataclass(frozen=True)
class DecodingSettings:
    """The ``generate()`` options memfree exposes (the CLI reads its defaults from here).

    Attributes:
        max_new_tokens: tokens generated per completion.
        do_sample: sample instead of greedy / beam search.
        temperature: sampling temperature.
        top_k: keep the k most likely tokens when sampling (None: off).
        top_p: nucleus sampling threshold (None: off).
        num_beams: beam search width (1: no beam search).
        num_return_sequences: completions per prompt.
        seed: random seed set before each generate() call.
        batch_size: prompts per generate() call (left-padded).
    """

    max_new_tokens: int = 64
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    num_beams: int = 1
    num_return_sequences: int = 1
    seed: int = 0
    batch_size: int = 8

    def __post_init__(self) -> None:
        found = self._problem()
        if found:
            raise SettingError(found[1], field=found[0])

    def problem(self) -> str | None:
        """The first invalid setting, named by its field (``top_k must be >= 1, got 0``), or
        None."""
        found = self._problem()
        return found[1] if found else None

    def _problem(self) -> tuple[str, str] | None:
        checks = [
            (
                self.max_new_tokens >= 1,
                "max_new_tokens",
                f"must be >= 1, got {self.max_new_tokens}",
            ),
            (self.temperature > 0, "temperature", f"must be > 0, got {self.temperature}"),
            (self.top_k is None or self.top_k >= 1, "top_k", f"must be >= 1, got {self.top_k}"),
            (
                self.top_p is None or 0 < self.top_p <= 1,
                "top_p",
                f"must be in (0, 1], got {self.top_p}",
            ),
            (self.num_beams >= 1, "num_beams", f"must be >= 1, got {self.num_beams}"),
            (
                self.num_return_sequences >= 1,
                "num_return_sequences",
                f"must be >= 1, got {self.num_return_sequences}",
            ),
            (
                self.num_return_sequences <= max(self.num_beams, 1) or self.do_sample,
                "num_return_sequences",
                f"({self.num_return_sequences}) must not exceed num_beams ({self.num_beams}) "
                "without do_sample",
            ),
            (self.batch_size >= 1, "batch_size", f"must be >= 1, got {self.batch_size}"),
            # transformers' set_seed seeds numpy too, which takes only 32-bit seeds.
            (0 <= self.seed <= MAX_SEED, "seed", f"must be in [0, 2**32 - 1], got {self.seed}"),
        ]
        for ok, name, message in checks:
            if not ok:
                return name, f"{name} {message}"
        return None

    def generate_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``model.generate``."""
        kwargs: dict[str, Any] = {
            "max_new_tokens": self.max_new_tokens,
            "do_sample": self.do_sample,
            "num_beams": self.num_beams,
            "num_return_sequences": self.num_return_sequences,
        }
        if self.do_sample:
            kwargs["temperature"] = self.temperature
            kwargs["top_k"] = self.top_k if self.top_k is not None else 0
            kwargs["top_p"] = self.top_p if self.top_p is not None else 1.0
        return kwargs


@dataclass(frozen=True)
class Intervention:
    """One step where the guard removed the model's first choice."""

    position: int  # index of the generated token in the completion (0 = first new token)
    blocked: int
    chosen: int


class PromptCutWarning(UserWarning):
    """A prompt was cut from the left to fit the model's context (see :func:`complete`)."""


def model_context(model: Any) -> int | None:
    """Positions the model attends to (``config.max_position_embeddings``), or None if unknown."""
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return context if isinstance(context, int) and context > 0 else None


def fit_prompt(ids: list[int], context: int | None, max_new_tokens: int) -> list[int]:
    """The prompt's last ``context - max_new_tokens`` tokens, with a :class:`PromptCutWarning`
    when that cuts any; the prompt itself when it fits or the context is unknown.

    A model fed more positions than it was trained for does not fail: it writes garbage (rotary
    and learned position embeddings alike). Keeping the end of the prompt keeps what the
    continuation follows.

    Raises:
        ValueError: ``max_new_tokens`` leaves no room for one prompt token.
    """
    if context is None:
        return ids
    room = context - max_new_tokens
    if room < 1:
        raise ValueError(
            f"max_new_tokens {max_new_tokens:,} leaves no room for a prompt in the model's "
            f"context of {context:,} tokens; give at most {context - 1:,}"
        )
    if len(ids) <= room:
        return ids
    warnings.warn(
        f"a prompt of {len(ids):,} tokens does not fit in the model's context of {context:,} "
        f"tokens with {max_new_tokens:,} new tokens: its first {len(ids) - room:,} tokens were "
        f"cut (the model sees its last {room:,})",
        PromptCutWarning,
        stacklevel=3,
    )
    return ids[-room:]


@dataclass
class Completion:
    """One generated continuation of one prompt."""

    prompt: str  # as given (decoded, when given as token ids)
    prompt_ids: list[int]  # what the model saw: the prompt's last tokens when it was cut
    output_ids: list[int]
    text: str
    guarded: bool
    interventions: list[Intervention] = field(default_factory=list)
    stored_ngrams: int | None = None  # stored n-grams holding an output token (its ids)
    stored_text_ngrams: int | None = None  # the same in its text tokenized again

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["interventions"] = [asdict(item) for item in self.interventions]
        return data


def complete(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[str] | Sequence[Sequence[int]],
    settings: DecodingSettings | None = None,
    guard: MemFreeLogitsProcessor | None = None,
    *,
    ngram_filter: NgramSet | None = None,
    progress: Any = None,
    count_stored: bool = True,
) -> list[Completion]:
    """Complete each prompt (text, or token ids), with the guard if one is given.

    Args:
        model: a transformers causal LM.
        tokenizer: its tokenizer.
        prompts: prompt texts (tokenized without special tokens) or token id lists.
        settings: decoding settings.
        guard: the guard, or None for unguarded generation.
        ngram_filter: count, in each completion, the stored n-grams that hold at least one
            generated token (default: the guard's filter, if any).
        progress: a callable taking the number of prompts just completed (e.g. tqdm's update).
        count_stored: fill each completion's ``stored_ngrams`` / ``stored_text_ngrams`` (when a
            filter or guard is given); False for callers that count on their own.

    Returns:
        ``len(prompts) * num_return_sequences`` completions, grouped by prompt.

    Warns:
        PromptCutWarning: a prompt does not fit in the model's context
            (``config.max_position_embeddings``) beside ``max_new_tokens``: it is cut from the
            left to its last ``context - max_new_tokens`` tokens.

    Raises:
        ValueError: an empty prompt, or ``max_new_tokens`` that leaves no room in the context
            for one prompt token.
    """
    settings = settings or DecodingSettings()
    ngram_filter = ngram_filter or (guard.filter if guard is not None else None)
    if not count_stored:
        ngram_filter = None
    given = _encode_all(tokenizer, prompts)
    context = model_context(model)
    encoded = [fit_prompt(ids, context, settings.max_new_tokens) for ids in given]
    pad_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    results: list[Completion] = []
    for begin in range(0, len(encoded), settings.batch_size):
        batch = encoded[begin : begin + settings.batch_size]
        input_ids, attention = _left_padded(batch, pad_id)
        width = input_ids.shape[1]
        output = _generate(model, input_ids, attention, settings, guard, pad_id)
        generated = output[:, width:].cpu().tolist()
        stats = guard.stats if guard is not None and settings.num_beams == 1 else None
        for row, ids in enumerate(generated):
            prompt_index = begin + row // settings.num_return_sequences
            new_ids = _strip_after_eos(ids, tokenizer.eos_token_id, pad_id)
            interventions = []
            if stats is not None and stats.num_rows == len(generated):
                interventions = _interventions(stats, row, width, new_ids)
            completion = Completion(
                prompt=prompts[prompt_index]
                if isinstance(prompts[prompt_index], str)
                else tokenizer.decode(given[prompt_index]),  # type: ignore[arg-type]
                prompt_ids=list(encoded[prompt_index]),
                output_ids=new_ids,
                text=tokenizer.decode(new_ids),
                guarded=guard is not None,
                interventions=interventions,
            )
            if ngram_filter is not None:
                completion.stored_ngrams, completion.stored_text_ngrams = _stored_counts(
                    ngram_filter, completion.prompt_ids, new_ids, guard, tokenizer
                )
            results.append(completion)
        if progress is not None:
            progress(len(batch))
    return results


def _encode_all(
    tokenizer: Any, prompts: Sequence[str] | Sequence[Sequence[int]]
) -> list[list[int]]:
    """Each prompt's token ids (texts tokenized without special tokens); an empty one refused."""
    given = [_encode(tokenizer, prompt) for prompt in prompts]
    for index, ids in enumerate(given):
        if not ids:
            raise ValueError(
                f"prompt {index + 1} is empty (no tokens); give every prompt some text"
            )
    return given


def _encode(tokenizer: Any, prompt: str | Sequence[int]) -> list[int]:
    if isinstance(prompt, str):
        return list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    return [int(token) for token in prompt]


def _generate(
    model: Any,
    input_ids: torch.Tensor,
    attention: torch.Tensor,
    settings: DecodingSettings,
    guard: MemFreeLogitsProcessor | None,
    pad_id: int,
) -> torch.Tensor:
    """One seeded ``model.generate`` call on the model's device; `(rows, width + new)` ids."""
    from transformers import set_seed

    device = next(model.parameters()).device
    set_seed(settings.seed)
    if guard is not None:
        guard.reset()
    with torch.inference_mode():
        output: torch.Tensor = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            logits_processor=[guard] if guard is not None else None,
            pad_token_id=pad_id,
            **settings.generate_kwargs(),
        )
    return output


def _left_padded(batch: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """input_ids and attention_mask `(len(batch), longest)`, each prompt padded on the left."""
    width = max(len(ids) for ids in batch)
    input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    for row, ids in enumerate(batch):
        if ids:
            input_ids[row, width - len(ids) :] = torch.tensor(ids)
            attention[row, width - len(ids) :] = 1
    return input_ids, attention


def _interventions(
    stats: GuardStats, row: int, width: int, new_ids: list[int]
) -> list[Intervention]:
    """The steps of ``row`` where the guard removed the model's first choice, placed in the
    completion (``width``: the padded prompt's length)."""
    found = []
    for step in np.flatnonzero(stats.first_choice_blocked[row]):
        position = int(stats.positions[step]) - width
        if 0 <= position < len(new_ids):
            found.append(
                Intervention(position, int(stats.first_choice[row, step]), new_ids[position])
            )
    return found


def _strip_after_eos(ids: list[int], eos: int | None, pad: int | None) -> list[int]:
    """Drop the end-of-sequence token and the padding after it."""
    for index, token in enumerate(ids):
        if token == eos or (token == pad and all(t == pad for t in ids[index:])):
            return ids[:index]
    return ids


def _stored_counts(
    ngram_filter: NgramSet,
    prompt_ids: list[int],
    output_ids: list[int],
    guard: MemFreeLogitsProcessor | None,
    tokenizer: Any,
) -> tuple[int, int]:
    """Stored n-grams holding an output token: in its ids, and in its text tokenized again."""
    special = guard.special_token_ids if guard is not None else None
    counts = [
        stored_ngram_counts(
            ngram_filter,
            prompt_ids,
            output_ids,
            special_token_ids=special,
            tokenizer=tokenizer,
            text=text,
        )[0]
        for text in (False, True)
    ]
    return counts[0], counts[1]
