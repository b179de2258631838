"""What every unit gives (the :class:`Unit` protocol) and the shapes it gives them in: the
builder's encoder (:class:`Encoder`, built in each worker from a picklable :class:`EncoderPayload`)
and a build's unit fields (:class:`BuildParts`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from memfree.errors import FilterMismatchError

if TYPE_CHECKING:
    from memfree.core import Masker, MaskerOptions
    from memfree.core.exempt import PromptNgrams
    from memfree.filterfile.protocol import NgramSet
    from memfree.vocab.info import TokenizerInfo


class Encoder(Protocol):
    """Turns texts into the integer sequences whose n-grams a filter stores.

    Attributes:
        special_ids: uint32 `(num_special,)` ids that no stored window may hold (the builder cuts
            its windows at them).
    """

    special_ids: np.ndarray
    vocab_size: int | None  # token ids a pre-tokenized document may hold; None: it takes none

    def encode(self, texts: list[str]) -> list[np.ndarray]:
        """One integer array `(num_ids,)` per text (uint32 token ids, or uint64 word hashes)."""
        ...


class EncoderPayload(Protocol):
    """A picklable recipe for an :class:`Encoder`, built once per worker process."""

    def encoder(self) -> Encoder: ...


@dataclass(frozen=True)
class TextNgrams:
    """The n-grams of one text in a unit, and which of them a filter stores.

    Attributes:
        stored: bool `(num_ngrams,)`, in text order (windows the builder never stores, such as
            those holding a special token, are left out).
        ngrams: the same n-grams as text, for quoting (``ngrams[i]`` is n-gram ``i``).
    """

    stored: np.ndarray
    ngrams: Sequence[str]


@dataclass(frozen=True)
class BuildParts:
    """What a build of one unit needs from the unit.

    Attributes:
        payload: the recipe of the encoder each worker builds.
        header_fields: the filter header's unit fields (``unit``, tokenizer name, fingerprint,
            vocabulary size and special ids; or the word normalizer and Unicode version).
        config_fields: what a resumed work directory must share with this build beyond the
            settings (tokenizer fingerprint, special ids, normalizer).
        progress_label: the encode step's progress label.
    """

    payload: EncoderPayload
    header_fields: dict[str, Any]
    config_fields: dict[str, Any]
    progress_label: str


class Unit(Protocol):
    """What a filter's ``unit`` means, everywhere it matters (see :mod:`memfree.units`)."""

    name: str
    reads_token_ids: bool  # whether its n-grams are token ids (its filter fits one tokenizer)
    output_formats: tuple[str, ...]  # the filter file formats that can hold its n-grams

    def text_promise(self, canonical: bool | None, tokenizer: TokenizerInfo | None) -> bool:
        """Whether the guard adds canonical decoding (its promise then holds over the text) for
        ``canonical`` as a caller gave it (None: the unit's default with this tokenizer).

        Raises:
            ValueError: a choice the unit cannot honour, with what to do instead.
        """
        ...

    def promise(self, canonical: bool | None) -> str:
        """What a guard of this unit promises, in words: with canonical decoding on or off as
        :meth:`text_promise` decided, or (None) over a filter of this unit with the defaults
        and the alternative (what ``memfree info`` says)."""
        ...

    def prompt_ngrams(
        self,
        prompt: Sequence[int],
        n: int,
        tokenizer: TokenizerInfo | None,
        special_token_ids: Sequence[int],
    ) -> PromptNgrams:
        """A request's prompt n-grams for ``exempt_prompt``
        (:mod:`memfree.core.exempt`), read as this unit's guard reads text."""
        ...

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
        """The guard core for ``ngram_filter`` (a filter of this unit) and the model's tokenizer
        (``options``: how the core computes; see :class:`~memfree.core.MaskerOptions`), with
        canonical decoding when ``canonical`` (as :meth:`text_promise` decided; end of sequence
        is ``end_token_ids``)."""
        ...

    def created_ngram_counts(
        self,
        ngram_filter: NgramSet,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        *,
        special_token_ids: Sequence[int] | None = None,
        tokenizer: TokenizerInfo | None = None,
    ) -> tuple[int, int]:
        """(stored, all) n-grams that ``output_ids`` created after ``prompt_ids``."""
        ...

    def created_text_ngram_counts(
        self,
        ngram_filter: NgramSet,
        prompt_ids: Sequence[int],
        output_ids: Sequence[int],
        *,
        special_token_ids: Sequence[int] | None = None,
        tokenizer: TokenizerInfo | None = None,
    ) -> tuple[int, int]:
        """(stored, all) n-grams that ``output_ids`` created, read from the decoded text (token
        n-grams: the text tokenized again; needs the tokenizer)."""
        ...

    def text_ngrams(
        self, ngram_filter: NgramSet, text: str, tokenizer: TokenizerInfo | None = None
    ) -> TextNgrams:
        """The n-grams of ``text`` in this unit and which the filter stores (the token unit
        needs the filter's tokenizer)."""
        ...

    def tokenizer_problem(
        self, requested: str | os.PathLike[str] | None, tokenizer: Any = None
    ) -> str | None:
        """Why a build of this unit cannot take this tokenizer (name or object), or None."""
        ...

    def build_parts(
        self, requested: str | os.PathLike[str] | None = None, tokenizer: Any = None
    ) -> BuildParts:
        """The encoder payload, header and configuration fields of a build of this unit."""
        ...


def check_filter_unit(ngram_filter: NgramSet, unit: str, build_hint: str) -> None:
    """Refuse a filter of another unit than ``unit`` (``build_hint`` says how to build one).

    Raises:
        FilterMismatchError: the filter's ``unit`` is not ``unit``.
    """
    if ngram_filter.unit != unit:
        raise FilterMismatchError(
            f"{ngram_filter.path}: is a {ngram_filter.unit} filter; the {unit} guard needs one "
            f"built with {build_hint}"
        )


__all__ = ["BuildParts", "Encoder", "EncoderPayload", "TextNgrams", "Unit", "check_filter_unit"]
