"""Units: what a filter's ``unit`` ("token" or "word") means, in one place per unit.

A filter stores n-grams of some unit: token ids of one tokenizer (:mod:`memfree.units.token`),
or normalized words, for every model (:mod:`memfree.units.word`). Code that works for any unit
asks the unit instead of branching on its name::

    unit = unit_of(ngram_filter)        # or get_unit("word")
    unit.name                           # "token" | "word"

The guard (any engine):
    ``unit.text_promise(canonical, tokenizer_info)`` -> whether the guard adds canonical
    decoding (the token unit: by default where there is a tokenizer; the word unit: never, its
    promise is over the text; each refuses a choice it cannot honour with a ``ValueError``).
    ``unit.masker(ngram_filter, tokenizer_info, special_token_ids, options=None, *,
    canonical=False, end_token_ids=())`` -> a :class:`memfree.core.Masker` (with ``canonical``,
    the token unit's inside a text-promise masker with the tokenizer's canonical masker), whose ``banned_mask(contexts, vocab_width)`` gives the banned
    candidates of each row and whose ``context_width`` says how much of a row it reads.
    ``tokenizer_info`` is a :class:`~memfree.vocab.info.TokenizerInfo` (or None);
    ``special_token_ids`` are the exempt ids (:func:`memfree.core.exempt_token_ids`); ``options``
    a :class:`~memfree.core.MaskerOptions`. The token masker needs no tokenizer (check its
    fingerprint first: :func:`memfree.vocab.tokenizer.check_tokenizer`), the word masker reads
    each token's bytes from it. Raises ``FilterMismatchError`` for a filter of another unit.

The evaluation ("n-grams this output created"):
    ``unit.created_ngram_counts(ngram_filter, prompt_ids, output_ids, *,
    special_token_ids=None, tokenizer=None)`` (a ``TokenizerInfo``) -> ``(stored, all)``: token windows of
    ``prompt ‖ output`` holding an output token (windows with a special id skipped), or word
    n-grams of the decoded text ending at a word the output created or changed (needs the
    tokenizer).
    ``unit.created_text_ngram_counts(...)`` (same arguments; needs the tokenizer) -> the same,
    read from the text: the token unit decodes ``prompt ‖ output`` and tokenizes it again (what
    anyone who stores the text sees; the guard's promise is over the generated ids); the word
    unit's count is already over the text.

The builder:
    ``unit.tokenizer_problem(requested, tokenizer=None)`` -> why a build of this unit cannot take
    that tokenizer (the word unit takes none), or None.
    ``unit.build_parts(requested=None, tokenizer=None)`` -> :class:`BuildParts`: ``payload``, a
    picklable :class:`EncoderPayload` whose ``encoder()`` (built once per worker) gives an
    :class:`Encoder` with ``encode(texts) -> list[np.ndarray]`` (uint32 token ids, or uint64 word
    hashes) and ``special_ids`` (uint32, where windows are cut); ``header_fields`` (token:
    ``unit``, ``tokenizer``, ``tokenizer_fingerprint``, ``vocab_size``, ``special_token_ids``;
    word: ``unit``, ``normalizer``, ``unicode_version``); ``config_fields`` (what a resumed work
    directory must share: ``tokenizer_fingerprint``, ``normalizer``, ``special_ids``); and
    ``progress_label``. The token unit loads ``requested`` when no tokenizer is given.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from memfree.units.base import BuildParts, Encoder, EncoderPayload, TextNgrams, Unit
from memfree.units.token import BatchEncoder, TokenizerPayload, TokenUnit
from memfree.units.word import WordEncoder, WordPayload, WordUnit
from memfree.vocab.info import TokenizerInfo

if TYPE_CHECKING:
    from memfree.filterfile.protocol import NgramSet

TOKEN = TokenUnit()
WORD = WordUnit()
_UNITS: dict[str, Unit] = {TOKEN.name: TOKEN, WORD.name: WORD}
UNIT_NAMES: tuple[str, ...] = tuple(_UNITS)


def get_unit(name: str) -> Unit:
    """The unit called ``name``.

    Raises:
        ValueError: no unit has that name.
    """
    unit = _UNITS.get(name)
    if unit is None:
        raise ValueError(f"unknown unit {name!r}; memfree knows {', '.join(UNIT_NAMES)}")
    return unit


def unit_of(ngram_filter: NgramSet) -> Unit:
    """The unit of a filter's n-grams (its header's ``unit``).

    Raises:
        ValueError: the filter names a unit this memfree does not know.
    """
    unit = _UNITS.get(ngram_filter.unit)
    if unit is None:
        raise ValueError(
            f"{ngram_filter.path}: stores n-grams of unit {ngram_filter.unit!r}, which this "
            f"memfree does not know ({', '.join(UNIT_NAMES)}); upgrade memfree or rebuild it"
        )
    return unit


def stored_ngram_counts(
    ngram_filter: NgramSet,
    prompt_ids: Sequence[int],
    output_ids: Sequence[int],
    *,
    special_token_ids: Sequence[int] | None = None,
    tokenizer: TokenizerInfo | Any = None,
    text: bool = False,
) -> tuple[int, int]:
    """(stored, all) n-grams of ``prompt ‖ output`` that hold at least one output token, by the
    filter's unit.

    Windows with a special token the builder cut at (recorded in the filter; else
    ``special_token_ids``) are not counted: no such window is stored. With a word filter, the
    n-grams are those of the decoded text (special tokens skipped) that end at a word the output
    created or changed; that needs the ``tokenizer``.

    With ``text``, a token filter's n-grams are those of the decoded text tokenized again (what
    anyone who stores the text sees; the guard's promise is over the generated ids); needs the
    tokenizer. A word filter's count is the same either way.
    """
    special = ngram_filter.special_token_ids
    if special is None and special_token_ids is not None:
        special = tuple(special_token_ids)
    info = None if tokenizer is None else TokenizerInfo.of(tokenizer)
    unit = unit_of(ngram_filter)
    count = unit.created_text_ngram_counts if text else unit.created_ngram_counts
    return count(ngram_filter, prompt_ids, output_ids, special_token_ids=special, tokenizer=info)


__all__ = [
    "TOKEN",
    "UNIT_NAMES",
    "WORD",
    "BatchEncoder",
    "BuildParts",
    "Encoder",
    "EncoderPayload",
    "TextNgrams",
    "TokenUnit",
    "TokenizerPayload",
    "Unit",
    "WordEncoder",
    "WordPayload",
    "WordUnit",
    "get_unit",
    "stored_ngram_counts",
    "unit_of",
]
