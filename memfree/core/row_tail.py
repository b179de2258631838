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
the last one longer: no text is read to find them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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


def _in_text(split: SplitChunks, shape: tuple[int, ...], text: str, index: int) -> int:
    """A position in the shape's characters, in the text's (a run the shape cut short stands
    for its first and last characters)."""
    return index if len(shape) == len(text) else split.row_shape(text)[1][index]


__all__ = ["decode_tail", "in_space_run", "settled_before", "split_moved", "tokens_of_tail"]
