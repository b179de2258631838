"""The word unit: a filter of normalized-word n-grams (:mod:`memfree.vocab.words`), built with no
tokenizer, that serves every model.

Its builder encodes texts as the hashes of their words; its filter records the normalizer and the
Unicode version; its guard is the :class:`~memfree.core.word.WordMasker`, which reads each
token's bytes from the model's tokenizer; the n-grams an output created are those of the decoded
text that end at a word the output created or changed.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from memfree.units.base import BuildParts, TextNgrams, check_filter_unit
from memfree.vocab.words import NORMALIZER, new_word_ngrams, ngram_hash_rows, text_word_hashes
from memfree.vocab.words import word_metadata as _word_metadata

if TYPE_CHECKING:
    from memfree.core import Masker, MaskerOptions
    from memfree.core.exempt import PromptNgrams
    from memfree.filterfile.protocol import NgramSet
    from memfree.vocab.info import TokenizerInfo

_NO_TOKENIZER = "--unit word needs no tokenizer: drop --tokenizer (one filter serves every model)"


class WordEncoder:
    """Turns documents into the hashes of their normalized words (no tokenizer)."""

    special_ids = np.empty(0, dtype=np.uint32)
    vocab_size: int | None = None  # words come from text: it takes no pre-tokenized ids

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """uint64 word hashes of each text, in order (see :mod:`memfree.vocab.words`)."""
        return [text_word_hashes(text) for text in texts]


@dataclass(frozen=True)
class WordPayload:
    """What a worker needs for the word unit: nothing but the normalizer's version."""

    normalizer: str

    def encoder(self) -> WordEncoder:
        if self.normalizer != NORMALIZER:  # pragma: no cover - one process tree, one memfree
            raise RuntimeError(f"worker normalizer {NORMALIZER} != {self.normalizer}")
        return WordEncoder()


class WordUnit:
    """The word unit (see :mod:`memfree.units` for what each method gives)."""

    name = "word"
    reads_token_ids = False  # its n-grams are of text: any tokenizer, or none
    output_formats: tuple[str, ...] = (
        "memfree",
    )  # the filter file formats that can hold its n-grams

    def text_promise(self, canonical: bool | None, tokenizer: TokenizerInfo | None) -> bool:
        """Never: the word guard's promise is over the text already.

        Raises:
            ValueError: ``canonical=True``.
        """
        if canonical:
            raise ValueError(
                "canonical=True applies to token filters; the word guard's promise is "
                "already over the text"
            )
        return False

    def promise(self, canonical: bool | None) -> str:
        """Over the text, whatever the tokenizer."""
        if canonical is None:
            return "no stored word n-gram in the text (any tokenizer)"
        return "no stored word n-gram in the text"

    def prompt_ngrams(
        self,
        prompt: Sequence[int],
        n: int,
        tokenizer: TokenizerInfo | None,
        special_token_ids: Sequence[int],
    ) -> PromptNgrams:
        """The word n-grams of the prompt's text, read as the word guard reads it (special
        tokens add no text)."""
        from memfree.core.exempt import PromptNgrams

        special = set(special_token_ids)
        text = b"".join(
            tokenizer.token_bytes[i] or b""
            for i in prompt
            if tokenizer is not None and 0 <= i < len(tokenizer.token_bytes) and i not in special
        )
        return PromptNgrams.of_text(text.decode("utf-8", "replace"), n)

    def masker(
        self,
        ngram_filter: NgramSet,
        tokenizer: TokenizerInfo | None,
        special_token_ids: Iterable[int],
        options: MaskerOptions | None = None,
        *,
        canonical: bool = False,
        end_token_ids: Iterable[int] = (),
    ) -> Masker:
        """A :class:`~memfree.core.word.WordMasker` (computed on the CPU, over each row's text:
        ``options`` do not apply, see :class:`~memfree.core.MaskerOptions`).

        Raises:
            FilterMismatchError: ``ngram_filter`` is not a word filter, or uses another normalizer.
            ValueError: no tokenizer.
        """
        from memfree.core.word import WordMasker

        self.text_promise(canonical, tokenizer)
        check_filter_unit(ngram_filter, self.name, "`memfree build --unit word`")
        return WordMasker(ngram_filter, tokenizer, special_token_ids)

    def created_ngram_counts(
        self,
        ngram_filter: NgramSet,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        *,
        special_token_ids: Sequence[int] | None = None,
        tokenizer: TokenizerInfo | None = None,
    ) -> tuple[int, int]:
        """(stored, all) word n-grams of the decoded text (special tokens skipped) that end at a
        word the output created or changed.

        Raises:
            ValueError: no tokenizer (the text must be decoded).
        """
        if tokenizer is None:
            raise ValueError("counting stored word n-grams needs the tokenizer to decode the text")
        if len(output_ids) == 0:
            return 0, 0
        before = tokenizer.decode(prompt_ids, skip_special_tokens=True)
        after = tokenizer.decode(list(prompt_ids) + list(output_ids), skip_special_tokens=True)
        created = new_word_ngrams(before, after, ngram_filter.n)
        if not created:
            return 0, 0
        return int(ngram_filter.contains(ngram_hash_rows(created)).sum()), len(created)

    def created_text_ngram_counts(
        self,
        ngram_filter: NgramSet,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        *,
        special_token_ids: Sequence[int] | None = None,
        tokenizer: TokenizerInfo | None = None,
    ) -> tuple[int, int]:
        """The same as :meth:`created_ngram_counts`: word n-grams are read from the text, so no
        token split of it hides one."""
        return self.created_ngram_counts(
            ngram_filter,
            prompt_ids,
            output_ids,
            special_token_ids=special_token_ids,
            tokenizer=tokenizer,
        )

    def text_ngrams(
        self, ngram_filter: NgramSet, text: str, tokenizer: TokenizerInfo | None = None
    ) -> TextNgrams:
        """The normalized-word n-grams of ``text`` (no tokenizer needed)."""
        from memfree.vocab.words import word_hashes_np, words

        found = words(text)
        n = ngram_filter.n
        if len(found) < n:
            return TextNgrams(np.zeros(0, dtype=bool), [])
        windows = np.lib.stride_tricks.sliding_window_view(word_hashes_np(found), n)
        stored = ngram_filter.contains(np.ascontiguousarray(windows))
        return TextNgrams(stored, [" ".join(found[i : i + n]) for i in range(len(found) - n + 1)])

    def tokenizer_problem(
        self, requested: str | os.PathLike[str] | None, tokenizer: Any = None
    ) -> str | None:
        """A word build takes no tokenizer: one word filter serves every model."""
        if requested is not None:
            return _NO_TOKENIZER
        if tokenizer is not None:
            return "--unit word needs no tokenizer (one filter serves every model)"
        return None

    def build_parts(
        self, requested: str | os.PathLike[str] | None = None, tokenizer: Any = None
    ) -> BuildParts:
        """The payload, header and configuration fields of a word build.

        Raises:
            ValueError: a tokenizer was given.
        """
        problem = self.tokenizer_problem(requested, tokenizer)
        if problem:
            raise ValueError(problem)
        config: dict[str, Any] = {
            "tokenizer_fingerprint": None,
            "normalizer": NORMALIZER,
            "special_ids": [],
        }
        return BuildParts(WordPayload(NORMALIZER), self.header_fields(), config, "normalize+hash")

    def header_fields(self) -> dict[str, str]:
        """The header fields that make a filter a word filter (normalizer, Unicode version)."""
        return _word_metadata()


__all__ = ["WordEncoder", "WordPayload", "WordUnit"]
