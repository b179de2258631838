"""The token unit: a filter of one tokenizer's token-id n-grams (the paper's setting).

Its builder encodes texts with that tokenizer (cut at its special tokens); its filter records the
tokenizer's fingerprint, so the guard refuses any other vocabulary; its guard is the
:class:`~memfree.core.token.TokenMasker`.
"""

from __future__ import annotations

import array
import os
import pickle
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from memfree.units.base import BuildParts, TextNgrams, check_filter_unit

if TYPE_CHECKING:
    from memfree.core import Masker, MaskerOptions
    from memfree.core.exempt import PromptNgrams
    from memfree.core.token_index import IndexMasker
    from memfree.filterfile.protocol import NgramSet
    from memfree.vocab.info import TokenizerInfo


class BatchEncoder:
    """Encodes batches of documents to token ids with a Hugging Face tokenizer.

    Fast tokenizers travel to workers as their ``tokenizers`` JSON (workers then never import
    transformers); other tokenizers travel pickled.
    """

    def __init__(
        self,
        backend_json: str | None,
        pickled: bytes | None,
        special_ids: tuple[int, ...] = (),
        vocab_size: int | None = None,
    ) -> None:
        self.special_ids = np.asarray(special_ids, dtype=np.uint32)
        self.vocab_size = vocab_size  # ids a pre-tokenized corpus may hold: [0, vocab_size)
        self._backend: Any = None
        self._slow: Any = None
        if backend_json is not None:
            from tokenizers import Tokenizer

            self._backend = Tokenizer.from_str(backend_json)
            self._backend.no_truncation()
            self._backend.no_padding()
        elif pickled is not None:
            self._slow = pickle.loads(pickled)
        else:
            raise ValueError("a BatchEncoder needs a backend tokenizer or a pickled tokenizer")

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """Token ids (uint32 arrays) of each text, without special tokens."""
        if self._backend is not None:
            encodings = self._backend.encode_batch(texts, add_special_tokens=False)
            return [_uint32_array(encoding.ids) for encoding in encodings]
        ids = self._slow(texts, add_special_tokens=False)["input_ids"]
        return [np.asarray(row, dtype=np.uint32) for row in ids]


# A 4-byte unsigned array.array type (C's unsigned int is 4 bytes on every platform numpy runs
# on; checked anyway): it converts a list of ints about twice as fast as np.asarray.
_UINT32_CODE = "I" if array.array("I").itemsize == 4 else None


def _uint32_array(ids: list[int]) -> np.ndarray:
    """A uint32 array of a list of token ids."""
    if _UINT32_CODE is None:
        return np.asarray(ids, dtype=np.uint32)
    return np.frombuffer(array.array(_UINT32_CODE, ids), dtype=np.uint32)


@dataclass(frozen=True)
class TokenizerPayload:
    """What a worker needs to rebuild the tokenizer."""

    backend_json: str | None
    pickled: bytes | None
    special_ids: tuple[int, ...] = ()
    vocab_size: int | None = None

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> TokenizerPayload:
        """The payload of a loaded Hugging Face tokenizer (its backend JSON when it is fast)."""
        from memfree.vocab.tokenizer import special_token_ids, tokenizer_vocab_size

        special = special_token_ids(tokenizer)
        vocab = tokenizer_vocab_size(tokenizer)
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is not None and getattr(tokenizer, "is_fast", False):
            return cls(backend.to_str(), None, special, vocab)
        return cls(None, pickle.dumps(tokenizer), special, vocab)

    def encoder(self) -> BatchEncoder:
        return BatchEncoder(self.backend_json, self.pickled, self.special_ids, self.vocab_size)


class TokenUnit:
    """The token unit (see :mod:`memfree.units` for what each method gives)."""

    name = "token"
    reads_token_ids = True  # its n-grams are of one tokenizer's ids
    output_formats: tuple[str, ...] = (
        "memfree",
        "pybloomfiltermmap3",
    )  # the filter file formats that can hold its n-grams

    def text_promise(self, canonical: bool | None, tokenizer: TokenizerInfo | None) -> bool:
        """Canonical decoding is on by default where there is a tokenizer (it reads each
        token's text), and needs one when asked for.

        Raises:
            ValueError: ``canonical=True`` without a tokenizer.
        """
        if canonical is None:
            return tokenizer is not None
        if canonical and tokenizer is None:
            raise ValueError(
                "canonical decoding needs the model's tokenizer (it reads each token's text); "
                "pass tokenizer=, or canonical=False to guard the ids only"
            )
        return canonical

    def promise(self, canonical: bool | None) -> str:
        """Over the ids, and with canonical decoding over their text tokenized again."""
        if canonical is None:
            return (
                "no stored token n-gram in the ids, nor in their text tokenized again (canonical "
                "decoding, the default with a BPE tokenizer it reads: byte-level or "
                "SentencePiece-style); over the ids only with canonical=False (--no-canonical)"
            )
        if canonical:
            return "no stored token n-gram in the ids, nor in their text tokenized again"
        return "no stored token n-gram in the ids (not their text: canonical decoding is off)"

    def prompt_ngrams(
        self,
        prompt: Sequence[int],
        n: int,
        tokenizer: TokenizerInfo | None,
        special_token_ids: Sequence[int],
    ) -> PromptNgrams:
        """The prompt's id windows."""
        from memfree.core.exempt import PromptNgrams

        return PromptNgrams.of_ids(prompt, n)

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
        """A :class:`~memfree.core.token.TokenMasker`, or an
        :class:`~memfree.core.token_index.IndexMasker` for a prefix-keyed index (the tokenizer was checked by the caller:
        its fingerprint must match the filter's, see :func:`memfree.vocab.tokenizer.check_tokenizer`);
        with ``canonical``, inside a :class:`~memfree.core.text_promise.TextPromiseMasker` with
        the tokenizer's canonical masker.

        Raises:
            FilterMismatchError: ``ngram_filter`` is not a token filter.
            CanonicalUnsupportedError: ``canonical`` with a tokenizer it is not exact for.
        """
        from memfree.core.token import TokenMasker

        check_filter_unit(ngram_filter, self.name, "`memfree build` (--unit token)")
        masker: TokenMasker | IndexMasker
        if ngram_filter.prefix_index() is not None:
            from memfree.core.token_index import IndexMasker

            masker = IndexMasker(ngram_filter, special_token_ids, options)
        else:
            masker = TokenMasker(ngram_filter, special_token_ids, options)
        if not canonical:
            return masker
        self.text_promise(True, tokenizer)  # one wording for a direct call without a tokenizer
        assert tokenizer is not None
        from memfree.core.canonical import canonical_masker
        from memfree.core.text_promise import TextPromiseMasker

        return TextPromiseMasker(masker, canonical_masker(tokenizer, end_token_ids))

    def created_ngram_counts(
        self,
        ngram_filter: NgramSet,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        *,
        special_token_ids: Sequence[int] | None = None,
        tokenizer: TokenizerInfo | None = None,
    ) -> tuple[int, int]:
        """(stored, all) token n-grams of ``prompt ‖ output`` that hold an output token.

        Windows holding one of ``special_token_ids`` are not counted: no such window is stored.
        """
        n = ngram_filter.n
        sequence = np.asarray(list(prompt_ids) + list(output_ids), dtype=np.int64)
        if len(output_ids) == 0 or sequence.shape[0] < n:
            return 0, 0
        first = max(len(prompt_ids) - n + 1, 0)  # first window reaching into the output
        windows = np.lib.stride_tricks.sliding_window_view(sequence, n)[first:]
        if special_token_ids:
            windows = windows[~np.isin(windows, special_token_ids).any(axis=1)]
        if windows.shape[0] == 0:
            return 0, 0
        found = ngram_filter.contains(np.ascontiguousarray(windows))
        return int(found.sum()), int(windows.shape[0])

    def created_text_ngram_counts(
        self,
        ngram_filter: NgramSet,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        *,
        special_token_ids: Sequence[int] | None = None,
        tokenizer: TokenizerInfo | None = None,
    ) -> tuple[int, int]:
        """(stored, all) token n-grams that the output created *in its text*: the text of
        ``prompt ‖ output`` tokenized again, as anyone who stores or forwards the text does, and
        its windows holding a token that the output created or changed: past the longest common
        prefix with the prompt's own ids, and with the prompt's text tokenized again (a prompt
        cut from a longer text may end in ids its text alone would not give, say a whitespace
        run split before the next word; windows of those ids are the prompt's, not the
        output's). Windows holding one of ``special_token_ids`` are not counted, as in the ids.

        The ids-only guard's promise is over the generated ids (:meth:`created_ngram_counts`);
        a model that spells a stored passage with another token split keeps that promise, and
        this count finds the passage. Canonical decoding keeps this count at 0.

        Raises:
            ValueError: no tokenizer (the text must be decoded and tokenized again).
        """
        if tokenizer is None:
            raise ValueError("counting stored n-grams of the text needs the filter's tokenizer")
        if len(output_ids) == 0:
            return 0, 0
        prompt_ids = list(prompt_ids)
        before = _retokenized(tokenizer, prompt_ids)
        after = _retokenized(tokenizer, prompt_ids + list(output_ids))
        common = max(_common_prefix(before, after), _common_prefix(prompt_ids, after))
        if common == len(after):  # the output's text changed no token (it decodes to nothing)
            return 0, 0
        return self.created_ngram_counts(
            ngram_filter,
            after[:common],
            after[common:],
            special_token_ids=special_token_ids,
        )

    def text_ngrams(
        self, ngram_filter: NgramSet, text: str, tokenizer: TokenizerInfo | None = None
    ) -> TextNgrams:
        """The token n-grams of ``text`` (no special tokens added; windows holding a special id
        the builder cut at left out), decoded lazily for quoting.

        Raises:
            ValueError: no tokenizer.
        """
        if tokenizer is None:
            raise ValueError("the token n-grams of a text need the filter's tokenizer")
        from memfree.vocab.info import TokenizerInfo

        tokenizer = TokenizerInfo.of(tokenizer)  # callers above the units may pass their own
        n = ngram_filter.n
        ids = np.asarray(tokenizer.encode(text), dtype=np.int64)
        if ids.shape[0] < n:
            return TextNgrams(np.zeros(0, dtype=bool), [])
        windows = np.lib.stride_tricks.sliding_window_view(ids, n)
        special = ngram_filter.special_token_ids
        if special:
            windows = windows[~np.isin(windows, special).any(axis=1)]
        windows = np.ascontiguousarray(windows)
        stored = ngram_filter.contains(windows) if windows.shape[0] else np.zeros(0, dtype=bool)
        return TextNgrams(stored, _Decoded(tokenizer, windows))

    def tokenizer_problem(
        self, requested: str | os.PathLike[str] | None, tokenizer: Any = None
    ) -> str | None:
        """None: a token build takes any tokenizer (the default model's when none is named)."""
        return None

    def build_parts(
        self, requested: str | os.PathLike[str] | None = None, tokenizer: Any = None
    ) -> BuildParts:
        """The payload, header and configuration fields of a token build.

        Args:
            requested: the tokenizer named by the user (None: the default model's).
            tokenizer: the tokenizer already loaded; None loads ``requested``.
        """
        from memfree.vocab.tokenizer import (
            load_tokenizer,
            special_token_ids,
            tokenizer_fingerprint,
            tokenizer_name,
            tokenizer_vocab_size,
        )

        if tokenizer is None:
            tokenizer = load_tokenizer(requested)
        fingerprint = tokenizer_fingerprint(tokenizer)
        special_ids = list(special_token_ids(tokenizer))
        header = {
            "unit": self.name,
            "tokenizer": tokenizer_name(tokenizer, requested),
            "tokenizer_fingerprint": fingerprint,
            "vocab_size": tokenizer_vocab_size(tokenizer),
            "special_token_ids": special_ids,
        }
        config = {
            "tokenizer_fingerprint": fingerprint,
            "normalizer": None,
            "special_ids": special_ids,
        }
        return BuildParts(
            TokenizerPayload.from_tokenizer(tokenizer), header, config, "tokenize+hash"
        )


def _retokenized(tokenizer: TokenizerInfo, ids: list[int]) -> list[int]:
    """``ids`` decoded as the completion's text is (special tokens written out, so tokenizing
    the text again reads them back as special ids, where windows are cut) and tokenized again
    (none added)."""
    return tokenizer.encode(tokenizer.decode(ids))


class _Decoded(Sequence[str]):
    """Token windows as text, decoded only when asked for."""

    def __init__(self, tokenizer: TokenizerInfo, windows: np.ndarray) -> None:
        self._tokenizer = tokenizer
        self._windows = windows

    def __len__(self) -> int:
        return int(self._windows.shape[0])

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return str(self._tokenizer.decode(self._windows[index].tolist()))


def _common_prefix(first: Sequence[int], second: Sequence[int]) -> int:
    common = 0
    for old, new in zip(first, second, strict=False):
        if old != new:
            break
        common += 1
    return common


__all__ = ["BatchEncoder", "TokenUnit", "TokenizerPayload"]
