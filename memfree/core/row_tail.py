"""A canonical row's last chunks: their text and tokens read from the row's bytes, and a split
pattern's row advanced by one token without reading its text.

:class:`~memfree.core.canonical_state.RowStates` keeps, for a canonical row, its last two
pre-tokenizer chunks (the tail: what appended text may change). Under a split pattern a row one
token longer is read again from the tail and the token (the pre-tokenizer over their text, the
chunks that become fixed checked against the tokenizer, the new last chunks' state), unless the
row's own state already says where the token lands (:func:`split_moved`): its split state holds
the row shape's candidate groups (where each candidate shape's chunk starts after the row's
text, and the row's chunk boundaries then, read by the pre-tokenizer itself) and, per group,
whether the row's chunks before the candidate's are their tokens' BPE (the facts). Where the
token's group starts a chunk at the token, keeps the tail's own boundary and its fact holds, the
tail's first chunk is fixed and canonical, and the row's new last chunks are the tail's last
chunk and the token; where it goes on with the tail's last chunk, they are the tail's two,
the last one longer: no text is read to find them. Most rows read as one token's chunk alone,
and most tokens start a chunk after it: :class:`LoneStarts` answers those from the state and
the two chunks' shapes, kept per state and per pair of shapes, so the next read, the token's
chunk alone (kept per token), needs no shape of the joined text.
"""

from __future__ import annotations

import unicodedata
from typing import TYPE_CHECKING, Any

from memfree.core.split_nfc import may_compose

if TYPE_CHECKING:
    from memfree.core.canonical_split import SplitChunks


def decode_tail(data: bytes, whole: bool) -> str | None:
    """The text of a row's last tokens, or None if it is not whole UTF-8 characters (the row
    ends inside one). A window that does not reach the segment's start may begin inside a
    character: those bytes are skipped."""
    if not whole:
        skip = 0
        while skip < min(3, len(data)) and 0x80 <= data[skip] < 0xC0:
            skip += 1
        data = data[skip:]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def tokens_of_tail(window: list[int], token_bytes: list[bytes], length: int) -> list[int]:
    """The row's last tokens that hold exactly its last ``length`` bytes ([] if no token
    boundary falls there)."""
    total = 0
    for count, token in enumerate(reversed(window), start=1):
        total += len(token_bytes[token])
        if total >= length:
            return window[-count:] if total == length else []
    return []


def in_space_run(key: tuple[Any, ...], text: str) -> bool:
    """Whether a canonical row in state ``key`` whose last chunks are ``text`` ends in a
    whitespace run whose split waits on the next character (a candidate may enter its other
    reading)."""
    return key[0] == "space" or (key[0] == "split" and text[-1:].isspace())


def split_moved(
    split: SplitChunks,
    state: tuple[Any, ...],
    tail: tuple[str, tuple[int, ...], tuple[int, int]],
    token: int,
    appended: str,
) -> tuple[str, tuple[int, ...], tuple[int, int], bool] | None:
    """The last two chunks of a canonical row after ``token`` (text ``appended``): their text,
    tokens, where the last starts (characters, tokens), and whether the chunks before the last
    are known to be their tokens' BPE (the first case below), for a row whose split state is
    ``state`` and whose last chunks are ``tail`` (text, tokens, where the last starts), from
    the token's group (its shape's reading after the row's shape, the text ending after it):

    - it starts a chunk at the token and keeps the tail's boundary, and its fact holds (the
      chunks before the token's are their tokens' BPE, so the tail's first chunk is fixed and
      canonical): the tail's last chunk, then the token;
    - it goes on with the tail's last chunk (the first stays, or the tail is one chunk): the
      tail and the token.

    None otherwise (read the text). The caller checks what the groups do not say: the text
    stays NFC, no added token's content is written or begun."""
    text, tokens, (chars, count) = tail
    shape, _, facts, _ = state
    kind = int(split.shape_of[token])
    if kind < 0:
        return None
    groups = split.groups(shape)
    number = int(groups.of_shape[kind])
    if number < 0:
        return None
    start, bounds = groups.groups[number]
    if start == len(shape):  # a chunk of its own
        if not facts[number] or len(bounds) != (1 if chars else 0):
            return None
        if bounds and _in_text(split, shape, text, bounds[0]) != chars:
            return None
        kept = text[chars:]
        return kept + appended, (*tokens[count:], token), (len(kept), len(tokens) - count), True
    if not bounds and _in_text(split, shape, text, start) == chars:  # goes on
        return text + appended, (*tokens, token), (chars, count), False
    return None


def settled_before(
    split: SplitChunks,
    text: str,
    tokens: tuple[int, ...],
    last: tuple[int, int],
    fixed: bool = False,
) -> bool:
    """Whether the chunks of a canonical row's last chunks (``text`` with ``tokens``) before
    the last, which starts at ``last`` (characters, tokens), stay whatever text is appended
    (the shape's groups are its last chunk's, shifted:
    :attr:`~memfree.core.split_groups.Groups.settled`) and are their tokens' BPE (``fixed``:
    known so already). The row then reads as its last chunk alone: what comes before it is
    fixed and canonical."""
    shape, where = split.row_shape(text)
    groups = split.groups(shape)
    if not groups.settled or where[groups.settled] != last[0]:
        return False
    if fixed:
        return True
    before = (where[b] for b in groups.end if b < groups.settled)
    return split.tokens_before(text, tokens, [0, *before, last[0]]) == last[1]


class LoneStarts:
    """:func:`split_moved` then :func:`settled_before` for the reads most rows have: a row whose
    last chunks are one token's chunk alone (the chunks before it fixed and canonical), and a
    token that starts a chunk of its own after it. Such a row's next read is the token's chunk
    alone, and whether it is depends on the row's state and on the two chunks' shapes, not on
    their text. Kept per state (the candidate shapes whose group starts a chunk at the
    candidate, keeps no boundary inside the row and has its fact) and per pair of shapes
    (whether the boundary between them stays whatever follows), so a row's step reads no text
    and no new row shape.

    Where the two chunks are shaped alike at their boundary (a run there could be cut short in
    the joined text's shape) or hold an apostrophe (the characters after one keep their own
    class), the joined text's shape is not the two shapes joined: :meth:`starts` answers False
    (read the text). So does it where the text could leave NFC, or spells or begins an added
    token's content."""

    _KEPT = 1 << 15  # states and pairs of shapes kept (each table started afresh past it)

    def __init__(self, split: SplitChunks, added_in: Any) -> None:
        self.split = split
        self._added_in = added_in
        self._kinds: list[int] = split.shape_of.tolist()
        self._apostrophe = split.char_class("'")
        self._opening: dict[tuple[Any, ...], bytes] = {}  # (shape, facts) -> per kind: 1, 0
        self._settled: dict[tuple[tuple[int, ...], tuple[int, ...]], bool] = {}

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles start with empty tables."""
        state = self.__dict__.copy()
        state["_opening"], state["_settled"] = {}, {}
        return state

    def starts(self, state: tuple[Any, ...], text: str, token: int, appended: str) -> bool:
        """Whether a row whose last chunk is ``text`` alone (one token's, the chunks before it
        fixed and canonical), in split state ``state``, reads as ``token``'s chunk alone once
        it is appended (its text ``appended``): exactly where :func:`split_moved` places it in
        a chunk of its own after the row's and :func:`settled_before` then finds the row's
        chunk fixed. False where that cannot be said from the shapes (read the text)."""
        split, kind = self.split, self._kinds[token]
        if kind < 0 or not text or not appended:
            return False
        shape, _, facts, _ = state
        opening = self._opening.get((shape, facts))
        if opening is None:
            opening = self._opening_of(shape, facts)
        if not opening[kind]:
            return False
        after = split.row_shape(appended)[0]
        if shape[-1] == after[0] or self._apostrophe in shape or self._apostrophe in after:
            return False
        settled = self._settled.get((shape, after))
        if settled is None:
            # The joined text's shape is the two joined, its boundary at len(shape) (above):
            # settled_before's test, where[settled] == the row's length, reads so.
            settled = split.groups(shape + after).settled == len(shape)
            if len(self._settled) >= self._KEPT:
                self._settled.clear()
            self._settled[(shape, after)] = settled
        if not settled:
            return False
        if split.bpe.nfc and not (
            (text.isascii() and appended.isascii())
            or unicodedata.is_normalized("NFC", text + appended)
        ):
            return False
        if split.bpe.nfc and may_compose(appended[0]):
            return False
        return not (self._added_in is not None and self._added_in.search(text + appended))

    def _opening_of(self, shape: tuple[int, ...], facts: tuple[bool, ...]) -> bytes:
        """Per candidate shape (and the last entry, for candidates without one): 1 where its
        group starts a chunk at the candidate, keeps no chunk boundary inside the row, and has
        its fact (the chunks before the candidate's are their tokens' BPE)."""
        groups = self.split.groups(shape)
        opens = [
            start == len(shape) and not bounds and fact
            for (start, bounds), fact in zip(groups.groups, facts, strict=True)
        ]
        opening = bytes(int(opens[group]) if group >= 0 else 0 for group in groups.of_shape)
        if len(self._opening) >= self._KEPT:
            self._opening.clear()
        self._opening[(shape, facts)] = opening
        return opening


def _in_text(split: SplitChunks, shape: tuple[int, ...], text: str, index: int) -> int:
    """A position in the shape's characters, in the text's (a run the shape cut short stands
    for its first and last characters)."""
    return index if len(shape) == len(text) else split.row_shape(text)[1][index]


__all__ = [
    "LoneStarts",
    "decode_tail",
    "in_space_run",
    "settled_before",
    "split_moved",
    "tokens_of_tail",
]
