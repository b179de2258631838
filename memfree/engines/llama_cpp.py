"""The guard inside llama-cpp-python: :class:`MemFreeLlamaCppLogitsProcessor`.

llama-cpp-python calls a ``logits_processor`` with the context's ids (prompt and generated) and
the next token's scores, from inside a ctypes callback of llama.cpp's sampler chain. That callback
swallows exceptions: an error would leave the scores as they were, unguarded. So this processor
fails closed: if anything goes wrong inside a step, the step allows nothing but end of sequence,
and the error is kept and raised afterwards by :meth:`~MemFreeLlamaCppLogitsProcessor.check` (or
on leaving a ``with`` block). A token the guard did not check is never emitted. A filter error
(a block of an index filter found damaged on its first read) is logged once per problem, naming
the file and the block; the guard keeps serving later generations, and each step it failed is
still raised by :meth:`~MemFreeLlamaCppLogitsProcessor.check`.

Example::

    from llama_cpp import Llama, LogitsProcessorList
    from memfree.integrations.llama_cpp import MemFreeLlamaCppLogitsProcessor

    llm = Llama(model_path="smollm2.gguf")
    guard = MemFreeLlamaCppLogitsProcessor("stdlib.memfree", llm)
    with guard:
        out = llm(prompt, logits_processor=LogitsProcessorList([guard]), max_tokens=64)
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import torch

from memfree.core.exempt import PromptNgrams
from memfree.engines.faults import StepFaults
from memfree.engines.rows import RowGuard
from memfree.engines.setup import GuardSetup
from memfree.errors import FilterError, FilterMismatchError, GuardStepError
from memfree.filterfile.protocol import NgramSet

logger = logging.getLogger("memfree")


class MemFreeLlamaCppLogitsProcessor:
    """MemFree decoding for ``Llama(...)(prompt, logits_processor=LogitsProcessorList([guard]))``,
    greedy or sampled (the guard runs first in llama.cpp's sampler chain, before top-k/top-p).

    Args:
        ngram_filter: a filter (token or word unit) or its path.
        llama: the ``llama_cpp.Llama`` model. Its vocabulary is checked against the filter's
            tokenizer: the tokenizer is read from the model's GGUF file (or given), its
            fingerprint must match the filter's, and every token text of the model must be the
            tokenizer's for the same id.
        tokenizer: the model's Hugging Face tokenizer (default: read from ``llama.model_path``).
        ngram_size: the n you expect; refused if the filter holds another n.
        canonical: token filters: canonical decoding (default on; False guards the ids only:
            see :class:`~memfree.MemFreeLogitsProcessor`).
        exempt_prompt: a stored n-gram that occurs in the generation's own prompt (the row at
            its first step) is not banned (:mod:`memfree.core.exempt`). Run each generation
            inside ``with guard:``: a prompt that is the last generation's row one token
            longer is otherwise read as that generation's next step.
        allow_empty: accept a filter that stores no n-gram (refused by default: it guards
            nothing).

    Raises:
        FilterMismatchError: the filter does not fit the model's vocabulary, n or unit.
        EmptyFilterError: the filter stores no n-gram (pass ``allow_empty=True`` to accept it).
        FilterError: the filter cannot be opened, or the model's end-of-sequence token is not one
            of the filter's special tokens.
    """

    def __init__(
        self,
        ngram_filter: NgramSet | str | os.PathLike[str],
        llama: Any,
        *,
        tokenizer: Any = None,
        ngram_size: int | None = None,
        canonical: bool | None = None,
        exempt_prompt: bool = False,
        allow_empty: bool = False,
    ) -> None:
        if tokenizer is None:
            tokenizer = gguf_tokenizer(llama)
        check_vocabulary(llama, tokenizer)
        self.n_vocab = int(llama.n_vocab())
        eos = int(llama.token_eos())
        setup = GuardSetup.create(
            ngram_filter,
            tokenizer,
            ngram_size=ngram_size,
            eos_token_id=eos,
            canonical=canonical,
            allow_empty=allow_empty,
        )
        if not setup.eos_token_ids:
            raise FilterError(
                f"{setup.filter.path}: the model's end-of-sequence token {eos} is not one of the "
                "filter's special tokens, so the guard could not always leave it allowed; "
                "rebuild the filter with this model's tokenizer"
            )
        self.setup = setup
        self.failures: list[BaseException] = []
        # A row closed for a filter error is a failed step too: logged once, raised by check().
        self.rows = RowGuard(setup, StepFaults(logger, lambda error: self.failures.append(error)))
        self.eos_token_id = eos
        self.steps = 0
        self.exempt_prompt = bool(exempt_prompt)
        self._prompt: np.ndarray | None = None  # the generation's prompt, and its n-grams
        self._prompt_ngrams: PromptNgrams | None = None
        self._last = 0

    def __call__(self, input_ids: np.ndarray, scores: np.ndarray) -> np.ndarray:
        """The scores with every token that completes a stored n-gram at ``-inf`` (a new array).

        Never raises: on any error the step allows only end of sequence (see :meth:`check`).
        """
        try:
            self.steps += 1
            if scores.ndim != 1 or scores.shape[0] != self.n_vocab:
                raise GuardStepError(
                    f"expected scores of the {self.n_vocab} vocabulary tokens in id order, got "
                    f"shape {scores.shape}"
                )
            ids = np.asarray(input_ids, dtype=np.int64)
            guarded = torch.from_numpy(np.array(scores, dtype=np.float32))[None]
            prompts = [self._prompt_of(ids)] if self.exempt_prompt else None
            return self.rows.guard(guarded, [ids], inplace=True, prompts=prompts)[0].numpy()
        except BaseException as error:
            return self._closed(scores, error)

    def _prompt_of(self, ids: np.ndarray) -> PromptNgrams:
        """The n-grams of the generation's prompt: the row at its first step (a step whose row is
        not the previous step's row one token longer, or the first since ``with guard:``)."""
        prompt = self._prompt
        if (
            prompt is None
            or self._prompt_ngrams is None
            or ids.shape[0] != self._last + 1
            or not np.array_equal(ids[: prompt.shape[0]], prompt)
        ):
            self._prompt = ids.copy()
            special = np.isin(ids, np.asarray(self.setup.special_token_ids, dtype=np.int64))
            self._prompt_ngrams = self.setup.prompt_ngrams(np.where(special, -1, ids).tolist())
        self._last = ids.shape[0]
        return self._prompt_ngrams

    def _closed(self, scores: Any, error: BaseException) -> np.ndarray:
        """End of sequence only, and the error kept for :meth:`check`."""
        if not self.failures:
            logger.error(
                "memfree: a guarded llama.cpp step failed (%r); it allowed only EOS", error
            )
        self.failures.append(error)
        try:
            closed = np.full(np.shape(scores), -np.inf, dtype=np.float32)
            if closed.ndim == 1 and closed.shape[0] == self.n_vocab:
                kept = float(scores[self.eos_token_id])
                closed[self.eos_token_id] = kept if np.isfinite(kept) else 0.0
            return closed
        except BaseException:
            closed = np.full(self.n_vocab, -np.inf, dtype=np.float32)
            closed[self.eos_token_id] = 0.0
            return closed

    def check(self) -> None:
        """Raise the first error of a failed step since the last check (and forget them).

        Raises:
            GuardStepError: a step failed; it allowed only end of sequence.
        """
        if not self.failures:
            return
        failures, self.failures = self.failures, []
        raise GuardStepError(
            f"{len(failures)} guarded llama.cpp step(s) failed and allowed only end of sequence; "
            f"the first: {failures[0]!r}"
        ) from failures[0]

    def __enter__(self) -> MemFreeLlamaCppLogitsProcessor:
        """A generation starts: its first step's row is its prompt (even one that is the last
        generation's row one token longer, which the ids alone cannot tell from a step)."""
        self.failures = []
        self._prompt = self._prompt_ngrams = None
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if kind is None:
            self.check()

    def __repr__(self) -> str:
        return (
            f"MemFreeLlamaCppLogitsProcessor(filter={str(self.setup.filter.path)!r}, "
            f"unit={self.setup.unit.name!r}, n={self.setup.n})"
        )


def gguf_tokenizer(llama: Any) -> Any:
    """The Hugging Face tokenizer of the model's GGUF file (the default model's from memfree's
    cache).

    Raises:
        FilterMismatchError: the model was not loaded from a GGUF file; pass ``tokenizer=``.
    """
    from memfree.vocab.tokenizer import default_gguf_path, load_tokenizer

    path = getattr(llama, "model_path", None)
    if not path or Path(path).suffix != ".gguf":
        raise FilterMismatchError(
            f"llama model {path!r}: not a GGUF file, so its tokenizer cannot be read from it; "
            "pass tokenizer= (the model's Hugging Face tokenizer)"
        )
    try:
        if Path(path).resolve() == default_gguf_path().resolve():
            return load_tokenizer(None)
    except FileNotFoundError:
        pass
    return load_tokenizer(path)


def check_vocabulary(llama: Any, tokenizer: Any) -> None:
    """Refuse a tokenizer whose ids differ from the model's: same size, same token texts.

    Raises:
        FilterMismatchError: a difference, naming the first id that differs.
    """
    n_vocab = int(llama.n_vocab())
    if n_vocab != len(tokenizer):
        raise FilterMismatchError(
            f"llama model {getattr(llama, 'model_path', '')!r} has {n_vocab} tokens, its "
            f"tokenizer {len(tokenizer)}: they are not the same vocabulary; pass the model's own "
            "tokenizer"
        )
    texts = tokenizer.convert_ids_to_tokens(list(range(n_vocab)))
    model = llama._model  # llama-cpp-python's model wrapper: the GGUF's token texts
    for index, text in enumerate(texts):
        if model.token_get_text(index) != text:
            raise FilterMismatchError(
                f"llama model {getattr(llama, 'model_path', '')!r}: token {index} is "
                f"{model.token_get_text(index)!r}, its tokenizer's is {text!r}: they are not the "
                "same vocabulary; pass the model's own tokenizer"
            )


__all__ = [
    "GuardStepError",
    "MemFreeLlamaCppLogitsProcessor",
    "check_vocabulary",
    "gguf_tokenizer",
]
