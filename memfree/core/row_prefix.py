"""Whether the part of a row before its last chunks is its text's tokenization, checked once per
prefix: canonical decoding's prefix checks.

A row's last two pre-tokenizer chunks may change when text is appended; the chunks before them
are fixed, so they must already be their text's tokenization
(:class:`~memfree.core.canonical_state.RowStates` reads a row so). :class:`PrefixChecks` answers
that for a prefix and keeps the answer by a hash of the prefix and what follows it (the next
character decides where a whitespace run or a contraction ends, and under NFC the marks after it
compose with the prefix). A check extends the latest boundary already known canonical that no
text after it can move, so a step encodes only the text since; the segments before a special
token (a prompt's chat template) are checked once per prefix as well.

An added token's content written in plain tokens is cut by the tokenizer as that token, wherever
it lies, so a row that spells one is not canonical. A verdict kept for a boundary says nothing of
a content that runs across it (its beginning before, its rest after): such a boundary is neither
answered from what is kept nor extended from (the row is not canonical).
"""

from __future__ import annotations

import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from memfree.vocab.bpe import ByteLevelBpe

_CHECKS = 8192  # answers kept
_REACH = 256  # how far back a prefix check looks for a boundary already known canonical
_BASE = np.uint64(0x9E3779B97F4A7C15)
_BASE_INT, _MASK = int(_BASE), (1 << 64) - 1
_HASHED_IN_PYTHON = 32  # rows hashed in Python (numpy's fixed cost is larger)

Hashes = Sequence[int] | np.ndarray  # PrefixChecks.hashes: one per prefix of a row


class PrefixChecks:
    """Prefix checks for one tokenizer, kept per prefix.

    Args:
        bpe: the tokenizer's tables.
        token_bytes: each id's bytes (b"" for special tokens).
        text_bytes: each id's bytes as decode writes them (special and added tokens as their
            content).
        begun: the rests of the added tokens' contents that a text's end has begun.
    """

    def __init__(
        self,
        bpe: ByteLevelBpe,
        token_bytes: list[bytes],
        text_bytes: list[bytes],
        begun: Callable[[str], tuple[str, ...]],
    ) -> None:
        self.bpe = bpe
        self._bytes = token_bytes
        self._text_bytes = text_bytes
        self._begun = begun
        # How many ids before a boundary hold any beginning of an added token's content (each
        # id is one byte or more), and after it any rest.
        self._reach = max((len(c.encode("utf-8")) for c in bpe.added), default=0)
        self._checks: OrderedDict[tuple[str, int, int, Any], bool] = OrderedDict()
        self._powers: np.ndarray = np.zeros(0, dtype=np.uint64)
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        """Copies and pickles start with no answers (and their own lock)."""
        state = self.__dict__.copy()
        state.pop("_lock")
        state["_checks"] = OrderedDict()
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def segments(self, ids: list[int], hashes: Hashes) -> bool:
        """Whether the segments before the last cut (a prompt's chat template: messages between
        special tokens) are their text's tokenization; kept per prefix."""
        key = ("s", len(ids), int(hashes[len(ids)]), b"")
        known = self._known(key)
        if known is None:
            try:
                text = b"".join(self._text_bytes[t] for t in ids).decode("utf-8")
                known = self.bpe.encode(text) == ids
            except (UnicodeDecodeError, IndexError):
                known = False
            self._keep(key, known)
        return known

    def prefix(self, segment: list[int], length: int, start: int, hashes: Hashes) -> bool:
        """Whether the segment's first ``length`` ids (up to a fixed chunk boundary) are the
        tokenization of their text, as chunked with the rest of the segment after it (a
        whitespace run splits by what follows it); ``start``: where the segment starts in the
        row ``hashes`` hash. Kept per prefix (by its hash) and extended from the latest fixed
        boundary known canonical: a step encodes only the text since."""
        if not length:
            return True
        if self._spelled_across(segment, length):
            return False
        key = self._key(segment, length, start, hashes)
        known = self._known(key)
        if known is not None:
            return known
        since = 0
        for boundary in range(length - 1, max(0, length - _REACH), -1):
            if (
                self._hard(segment, boundary)
                and self._known(self._key(segment, boundary, start, hashes))
                and not self._spelled_across(segment, boundary)
            ):
                since = boundary
                break
        data = b"".join(self._bytes[t] for t in segment[since:])
        try:
            encoded = self.bpe.encode(data.decode("utf-8"))
            known = encoded[: length - since] == segment[since:length]
        except UnicodeDecodeError:
            known = False
        self._keep(key, known)
        return known

    def _key(
        self, segment: list[int], length: int, start: int, hashes: Hashes
    ) -> tuple[str, int, int, Any]:
        # The verdict depends on what follows the prefix: its next character (a token may hold
        # only its first bytes) and the marks after it (NFC composes them with the prefix).
        return ("p", start + length, int(hashes[start + length]), self.follows(segment, length))

    def follows(self, segment: list[int], at: int) -> Any:
        """What comes after ``segment[:at]`` as far as a prefix check can see: the next token
        when it is one ASCII character and no mark follows, else the next character with the
        combining marks after it."""
        first = self._bytes[segment[at]]
        if first.isascii() and len(first) == 1 and not self.bpe.nfc:
            return segment[at]
        if first[:1].isascii() and first[:1]:  # no mark follows: an ASCII byte (or the end) does
            ahead = b"." if at + 1 == len(segment) else self._bytes[segment[at + 1]][:1]
            after = first[1:2] if len(first) > 1 else ahead
            if after and after.isascii():
                return chr(first[0])
        data = b"".join(self._bytes[t] for t in segment[at : at + 8])
        text = data[:32].decode("utf-8", errors="ignore")
        end = 1
        while end < len(text) and unicodedata.combining(text[end]):
            end += 1
        return text[:end]

    def _spelled_across(self, segment: list[int], boundary: int) -> bool:
        """Whether the segment's text spells an added token's content that begins before
        ``boundary`` and ends after it (the row is then not canonical, whatever else)."""
        if not self._reach:
            return False
        data = b"".join(self._bytes[t] for t in segment[max(0, boundary - self._reach) : boundary])
        rests = self._begun(data.decode("utf-8", errors="ignore"))
        if not rests:
            return False
        data = b"".join(self._bytes[t] for t in segment[boundary : boundary + self._reach])
        after = data.decode("utf-8", errors="ignore")
        return any(after.startswith(rest) for rest in rests)

    def _hard(self, segment: list[int], boundary: int) -> bool:
        """Whether a boundary known canonical in another row is a chunk boundary in this one
        too, whatever follows: so a check may start there. Only a chunk that looks past the
        next character can end differently with the same prefix and next token: a whitespace
        run (it gives its last character to what follows it), a contraction (an apostrophe
        then one or two letters). So not inside a run of whitespace, not after an apostrophe,
        not inside a run of digits, and only between ASCII characters (whose class is plain)."""
        before = self._bytes[segment[boundary - 1]][-1:]
        after = self._bytes[segment[boundary]][:1]
        if not (before and after and before.isascii() and after.isascii()):
            return False
        if (before.isspace() and after.isspace()) or before == b"'":
            return False
        return not (before.isdigit() and after.isdigit())

    def _known(self, key: tuple[str, int, int, Any]) -> bool | None:
        with self._lock:
            return self._checks.get(key)

    def _keep(self, key: tuple[str, int, int, Any], known: bool) -> None:
        with self._lock:
            self._checks[key] = known
            if len(self._checks) > _CHECKS:
                self._checks.popitem(last=False)

    def hashes(self, ids: np.ndarray | list[int]) -> Hashes:
        """A hash of each prefix of ``ids`` (``len(ids) + 1`` of them): the sum of ``(id + 1)
        * BASE ** (i + 1)`` over its ids, modulo 2 ** 64. A short row (an advancing row's last
        chunks) in Python, a long one with numpy: the same values."""
        if len(ids) <= _HASHED_IN_PYTHON:
            values = ids.tolist() if isinstance(ids, np.ndarray) else ids
            found = [0]
            total, power = 0, 1
            for token in values:
                power = power * _BASE_INT & _MASK
                total = (total + (token + 1) * power) & _MASK
                found.append(total)
            return found
        array = np.asarray(ids, dtype=np.int64)
        if len(self._powers) < len(array):
            size = max(len(array), 2 * len(self._powers))
            self._powers = np.cumprod(np.full(size, _BASE, dtype=np.uint64))
        hashes = np.zeros(len(array) + 1, dtype=np.uint64)
        values = array.astype(np.uint64) + np.uint64(1)
        np.cumsum(values * self._powers[: len(array)], out=hashes[1:])
        return hashes


__all__ = ["Hashes", "PrefixChecks"]
