"""Reading a row for canonical decoding: its state, the few facts the answer depends on.

A row's text is cut at special and added tokens (the tokenizer cuts there); its last segment is
read back far enough to hold three pre-tokenizer chunks. The last two chunks may change when
text is appended (a contraction joins them, a whitespace run gives its last space to the next
word); the ones before are fixed, so they must already be their text's tokenization (checked
once per prefix: :mod:`memfree.core.row_prefix`). A canonical row's state is the kind of its last chunk and its last token, plus
what the rules read (:meth:`RowStates.state`); a row that is not canonical (only a prompt makes
one) gets a state that :class:`~memfree.core.canonical.CanonicalMasker` answers by the
definition itself.

A row one token longer than a row already read is advanced from that read
(:meth:`RowStates.advance`): from its last two chunks alone, or for GPT-2's pattern after a run
of letters, digits or punctuation, or a whitespace run before a token that starts a chunk,
without reading text at all (:meth:`RowStates.move`, from the row's :class:`Spot`: its state and
where its last chunks lie, not their text); after a whitespace run otherwise, from the run alone
(a whitespace token that goes on with the run: from the run after a neutral chunk). Under a
split pattern, a token that starts a chunk after the row's last chunk, or goes on with it, is
placed by the state's own groups and facts (:func:`~memfree.core.row_tail.split_moved`); where
no text appended can move the boundary before the last chunk and the chunk before it is its
tokens' BPE, the row reads as its last chunk alone (:meth:`RowStates._split_read`), so rows that
end in the same chunk share a state and its transitions.
"""

from __future__ import annotations

import threading
import unicodedata
import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from memfree.core.canonical_chars import Characters
from memfree.core.canonical_split import SplitChunks, added_search
from memfree.core.row_prefix import Hashes, PrefixChecks
from memfree.core.row_tail import (
    LoneStarts,
    decode_tail,
    in_space_run,
    settled_before,
    split_moved,
    tokens_of_tail,
)
from memfree.core.split_nfc import may_compose
from memfree.vocab.bpe import (
    APOSTROPHE,
    LETTER,
    NONE,
    NUMBER,
    PUNCT,
    RUN_LETTERS,
    RUN_NUMBERS,
    RUN_PUNCT,
    SP,
    WS,
    ByteLevelBpe,
)

CONTRACTIONS = ("s", "t", "re", "ve", "m", "ll", "d")  # after an apostrophe: GPT-2's pattern
_OPEN_CONTRACTIONS = {"r": "e", "v": "e", "l": "l"}  # "'r" + "e" -> "'re"
_WINDOW = 16  # tokens read back first; doubled while it holds too few chunks
_TAIL_CHUNKS = 2  # the row's last chunks that appended text may change
_ADVANCES = 1 << 14  # rows advanced by one token, kept per tail, added-token progress and token
# States GPT-2's rules answer (memfree.core.canonical_rules); a character written with several
# tokens may follow only these.
RULE_KINDS = frozenset(
    {"start", "contraction", "run", "apostrophe", "open", "space", "space_split"}
)
_ADVANCING = RULE_KINDS | {"split"}
_MISSING = object()
_SHORT = object()  # see RowStates._advance_tail
RUN_OF_CLASS = {LETTER: RUN_LETTERS, NUMBER: RUN_NUMBERS, PUNCT: RUN_PUNCT}  # runs that go on


class Tail(NamedTuple):
    """A canonical row's last two pre-tokenizer chunks: their text and their tokens; and where
    the last chunk starts in them (characters, tokens; None where not known)."""

    text: str
    tokens: tuple[int, ...]
    last: tuple[int, int] | None = None


Read = tuple[tuple[Any, ...], "Tail | None"]  # a row's state, and its last chunks if canonical


class Spot(NamedTuple):
    """A read without its text: its state ``key``; where the row's last two chunks lie (its
    last ``tokens`` ids, ``chars`` characters; ``tokens`` -1 where the row is not canonical);
    where the last chunk starts in them (``last``, as :attr:`Tail.last`); how many of the
    row's last tokens hold its last character exactly (``end``, 0 where no token boundary falls
    there); and whether the row ends in a whitespace run whose split waits on the next
    character (``space``: a candidate may enter its other reading). Rows read alike up to their
    last chunks' text share a spot, and :meth:`RowStates.move` advances a spot by a token
    without that text."""

    key: tuple[Any, ...]
    tokens: int
    chars: int
    last: tuple[int, int] | None
    end: int
    space: bool


def _pending_of(key: tuple[Any, ...]) -> tuple[str, ...]:
    """The added-token rests a state carries (its last field; the third of a split state)."""
    rests: tuple[str, ...] = key[2] if key[0] == "split" else key[-1]
    return rests


class RowStates:
    """The state of rows of token ids, for one tokenizer.

    Args:
        bpe: the tokenizer's tables.
        token_bytes: each id's bytes (b"" for special tokens).
        cuts: ids where the tokenizer cuts text (special and added tokens).
        split: a split pattern's chunk rules (None: GPT-2's pattern, read by rules).
        pair: whether no merge joins a token to the one before (the merge-tree test; default:
            the tables' own, uncached).

    Attributes:
        rows: rows seen that were not canonical (their state came from a prompt).
    """

    def __init__(
        self,
        bpe: ByteLevelBpe,
        token_bytes: list[bytes],
        cuts: frozenset[int],
        split: SplitChunks | None = None,
        pair: Callable[[int, int], bool] | None = None,
        chars: Characters | None = None,
    ) -> None:
        self.bpe = bpe
        self.split = split
        self.chars = chars
        self._pair = pair or (lambda a, token: bool(bpe.bigram_allowed(a)[token]))
        self._bytes = token_bytes
        self._cuts = cuts
        self._is_cut = np.zeros(bpe.vocab_size + 1, dtype=bool)  # the last: ids past the end
        self._is_cut[[t for t in cuts if t < bpe.vocab_size]] = True
        self._lists()
        # Text as decode writes it: special and added tokens as their content.
        self._text_bytes = list(token_bytes)
        for content, token in bpe.added.items():
            if token < len(self._text_bytes):
                self._text_bytes[token] = content.encode("utf-8")
        # Each proper beginning of an added token's content -> the rests that would complete it.
        self._begun: dict[str, list[str]] = {}
        for content in bpe.added:
            for cut in range(1, len(content)):
                self._begun.setdefault(content[:cut], []).append(content[cut:])
        self._longest_begun = max(map(len, self._begun), default=0)
        self._first_chars = sorted({content[0] for content in bpe.added if content})
        self.prefixes = PrefixChecks(  # kept per prefix
            bpe, token_bytes, self._text_bytes, self._pending_added
        )
        self._added_in = added_search(bpe.added)
        self._lone = LoneStarts(split, self._added_in) if split is not None else None
        self._lone_reads: dict[int, Read] = {}  # a token's chunk alone, its chunks before fixed
        self._advances: OrderedDict[tuple[Any, ...], Read | None] = OrderedDict()
        self._lone_kinds: dict[int, tuple[Any, ...]] = {}  # a chunk that is one token: its kind
        self._lone_begins: dict[int, bool] = {}  # a token's text begins an added token's content
        # "x" alone, where the tokenizer writes it so: a chunk before a whitespace run whose own
        # state does not depend on it (see advance_text); -1: none.
        self._neutral = bpe.ids_of.get("x", -1) if bpe.encode("x") == [bpe.ids_of.get("x")] else -1
        self._lock = threading.Lock()
        self._warned = False
        self.rows = 0

    def _lists(self) -> None:
        """The per-token columns an advancing step reads one entry at a time, as lists (a
        list's entry costs a third of a numpy array's); made again for a copy."""
        bpe = self.bpe
        self._cut_of: list[bool] = self._is_cut.tolist()
        self._self_ok: list[bool] = bpe.self_ok.tolist()
        self._run_of: list[int] = bpe.run.tolist()
        self._first_of: list[int] = bpe.first.tolist()
        self._whole_last: list[int] = bpe.whole_last.tolist()  # Spot.end of a row ending in it

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_lock")
        for name in ("_cut_of", "_self_ok", "_run_of", "_first_of", "_whole_last"):
            state.pop(name, None)
        state["_advances"] = OrderedDict()
        state["_lone_reads"] = {}
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._lists()

    def state(self, ids: list[int], array: np.ndarray | None = None) -> tuple[Any, ...]:
        """What the answer depends on: the kind of the row's last chunk, its last token, and
        the facts the rules read; plus the added-token contents its text has begun. Rows that
        are not canonical get an exact answer by other means (``tail``, ``broken``, ``dead``).
        ``array``: the same ids as int64, when the caller has them."""
        return self.read(ids, array)[0]

    def read(self, ids: list[int], array: np.ndarray | None = None) -> Read:
        """The row's state (:meth:`state`) and, for a canonical row, its last two chunks' text
        and tokens (what appended text may change: the other reading of a pending whitespace
        run is read from them)."""
        if array is None:
            array = np.asarray(ids, dtype=np.int64)
        cut_at = np.flatnonzero(np.take(self._is_cut, array, mode="clip"))
        start = int(cut_at[-1]) + 1 if cut_at.size else 0
        hashes = self.prefixes.hashes(array)
        if start and not self.prefixes.segments(ids[:start], hashes):
            self.note()
            return ("dead", ()), None
        segment = ids[start:]
        if not segment:
            return ("start", ()), Tail("", ())
        width = _WINDOW
        while True:
            window = segment[-width:]
            whole = len(window) == len(segment)
            data = b"".join(self._bytes[t] for t in window)
            text = decode_tail(data, whole)
            if text is None:
                return self._inside_character(ids, array, start, segment)
            chunks = self.bpe.chunks(text)
            if whole or (
                len(chunks) > _TAIL_CHUNKS and not self._inside_number(segment, width, text)
            ):
                break
            width *= 2
        return self._finish(segment, start, hashes, window, chunks, self._pending_added(text))

    def _inside_character(
        self, ids: list[int], array: np.ndarray, start: int, segment: list[int]
    ) -> Read:
        """A row whose text ends inside a character: the state of the row before the head that
        began it, and the chain since (:mod:`memfree.core.canonical_chars`). A row whose bytes
        are not text otherwise is answered by the definition (only a prompt makes one)."""
        at = self.chars.chain(segment) if self.chars is not None else None
        if at is None or self.chars is None:
            self.note(" (it ends inside a character)")
            return ("broken", tuple(segment)), None
        before = start + at
        key, tail = self.read(ids[:before], array[:before])
        if self.chars.classify is not None:  # a split pattern: the before-row's last chunks
            if key[0] not in ("split", "start") or tail is None:
                return ("dead", ()), None
            return ("partial", key, tuple(segment[at:]), Tail(tail.text, tail.tokens), ()), None
        if key[0] not in RULE_KINDS:
            return ("dead", ()), None
        return ("partial", key, tuple(segment[at:]), None, ()), None

    def advance(self, key: tuple[Any, ...], tail: Tail | None, token: int) -> Read | None:
        """The read of a row one token longer than a row read as ``(key, tail)``: from the
        tail alone (its first chunk starts at a boundary no appended text moves, and everything
        before it was checked), so a step costs the row's last chunks, not its length. Kept per
        tail, added-token progress and token: rows that repeat a tail share the answer. None
        where only a full read can say (a row that is not canonical, a special or added token,
        a token that is not whole characters): read the row instead. First by :meth:`move`
        (no text read), then by :meth:`advance_text`."""
        if tail is None:
            return None
        moved = None if self.split is not None else self.move(self.spot((key, tail)), token)
        if moved is not None:
            tokens = (*tail.tokens, token)[len(tail.tokens) + 1 - moved.tokens :]
            text = tail.text + (self.bpe.texts[token] or "")
            return moved.key, Tail(text[len(text) - moved.chars :], tokens, moved.last)
        return self.advance_text(key, tail, token)

    def spot(self, read: Read) -> Spot:
        """A read without its text (:class:`Spot`)."""
        key, tail = read
        if tail is None:
            return Spot(key, -1, 0, None, 0, False)
        end = 0
        if tail.text:
            end = len(tokens_of_tail(list(tail.tokens), self._bytes, len(tail.text[-1].encode())))
        space = in_space_run(key, tail.text)
        return Spot(key, len(tail.tokens), len(tail.text), tail.last, end, space)

    def tail_of(self, spot: Spot, ids: np.ndarray) -> Tail | None:
        """The last chunks of a row whose ids end in ``ids``, read as ``spot`` (None: not
        canonical)."""
        if spot.tokens < 0:
            return None
        tokens = tuple(ids[len(ids) - spot.tokens :].tolist()) if spot.tokens else ()
        text = b"".join(self._bytes[t] for t in tokens).decode("utf-8")
        return Tail(text, tokens, spot.last)

    def move(self, spot: Spot, token: int) -> Spot | None:
        """:meth:`advance` where no text need be read (GPT-2's pattern after a run of letters,
        digits or punctuation, or a whitespace run before a token that starts a chunk): the
        next read's spot from ``spot`` and ``token`` alone, so a transition kept is valid for
        every row in ``spot``. None where the text must be read (:meth:`advance_text`)."""
        key = spot.key
        if (
            spot.tokens < 0
            or self.split is not None
            or key[-1]
            or self._cut_of[min(token, self.bpe.vocab_size)]
        ):
            return None
        if key[0] == "run" and spot.last is not None:
            return self._run_move(key[1], key[2], spot, token)
        if key[0] in ("space", "space_split"):
            return self._space_move(key, spot, token)
        return None

    def advance_text(self, key: tuple[Any, ...], tail: Tail, token: int) -> Read | None:
        """:meth:`advance` from the tail's text (where :meth:`move` returns None)."""
        if key[0] not in _ADVANCING or self._cut_of[min(token, self.bpe.vocab_size)]:
            return None
        pending = _pending_of(key)
        if pending and self._completes(pending, token):
            return None  # an added token's content written in plain tokens: read the row
        if key[0] == "split" and not pending and tail.last is not None:
            moved = self._split_move(key, tail, token)
            if moved is not None:
                return moved
        if key[0] == "space" and tail.last is not None and self.split is None:
            # GPT-2's pattern: no text after a whitespace run moves the run's start (the
            # chunk before it ends in a character that is not whitespace, and no chunk takes
            # whitespace after it), so where the run and the token make two chunks or more,
            # they are the row's last two: read from the run alone (rows that repeat a run
            # before a token share the answer, whatever came before the run).
            chars, count = tail.last
            run = Tail(tail.text[chars:], tail.tokens[count:])
            found = self._advance_tail(run, pending, token)
            if found is not _SHORT:
                return found
            if chars and self._neutral >= 0:
                # The token goes on with the run (one chunk). The chunk before the run stays
                # as it is, so the state is that of the run and the token after any chunk
                # that ends in a character that is not whitespace: read after "x" (the state
                # of a whitespace chunk does not depend on the chunk before it), kept per run.
                found = self._advance_tail(
                    Tail("x" + run.text, (self._neutral, *run.tokens), (1, 1)), pending, token
                )
                if found is None or found is _SHORT:
                    return None
                last = found[1].last  # after "x": one character, one token before the run
                if last is not None:
                    last = (last[0] - 1 + chars, last[1] - 1 + count)
                text = tail.text + (self.bpe.texts[token] or "")
                return found[0], Tail(text, (*tail.tokens, token), last)
        found = self._advance_tail(tail, pending, token)
        return None if found is _SHORT else found

    def _split_move(self, key: tuple[Any, ...], tail: Tail, token: int) -> Read | None:
        """:meth:`advance_text` by the state's groups (:func:`~memfree.core.row_tail.split_moved`);
        None where the text must be read (not NFC, or an added token's content written)."""
        assert self.split is not None and tail.last is not None
        try:
            appended = self._bytes[token].decode("utf-8")
        except UnicodeDecodeError:
            return None
        if (
            tail.last == (0, 0)
            and len(tail.tokens) == 1
            and self._lone is not None
            and self._lone.starts(key[1], tail.text, token, appended)
        ):  # the row's chunk alone, and a token that starts one: read from their shapes
            return self._lone_read(token, appended)
        joined = tail.text + appended
        if (self.bpe.nfc and not unicodedata.is_normalized("NFC", joined)) or (
            self._added_in is not None and self._added_in.search(joined)
        ):
            return None
        moved = split_moved(
            self.split, key[1], (tail.text, tail.tokens, tail.last), token, appended
        )
        if moved is None:
            return None
        text, tokens, last, fixed = moved
        return self._split_read(text, tokens, last, self._advance_pending((), appended), fixed)

    def _lone_read(self, token: int, text: str) -> Read:
        """:meth:`_split_read` of a row whose last chunk is ``token`` alone (``text``) and whose
        chunks before it are fixed and canonical, kept per token."""
        read = self._lone_reads.get(token)
        if read is None:
            assert self.split is not None
            state, fixes = self.split.state(text, [token])
            pending = self._advance_pending((), text)
            read = ("split", state, pending, fixes), Tail(text, (token,), (0, 0))
            if len(self._lone_reads) >= _ADVANCES:
                self._lone_reads.clear()
            self._lone_reads[token] = read
        return read

    def _split_read(
        self,
        text: str,
        tokens: tuple[int, ...],
        last: tuple[int, int] | None,
        pending: Any,
        fixed: bool = False,
    ) -> Read:
        """The read of a canonical row whose last chunks are ``text`` with ``tokens``, the last
        starting at ``last`` (characters, tokens). Where the chunks before the last stay
        whatever follows and are their tokens' BPE (``fixed``: known so), it is the read of
        the last chunk alone: rows that share it share its state and transitions, whatever
        came before."""
        assert self.split is not None
        if (
            last
            and last[0]
            and not (self.bpe.nfc and may_compose(text[last[0]]))
            and settled_before(self.split, text, tokens, last, fixed)
        ):
            text, tokens, last = text[last[0] :], tokens[last[1] :], (0, 0)
        state, fixes = self.split.state(text, list(tokens))
        return ("split", state, pending, fixes), Tail(text, tokens, last)

    def _advance_tail(self, tail: Tail, pending: tuple[str, ...], token: int) -> Any:
        """:meth:`advance` read from ``tail``'s text and ``token``'s; ``_SHORT`` where they
        make fewer than two chunks (the row's last two chunks reach before ``tail``)."""
        memo = (tail.tokens, pending, token)
        with self._lock:
            known = self._advances.get(memo, _MISSING)
        if known is not _MISSING:
            return known
        found: Any = None
        try:
            appended = self._bytes[token].decode("utf-8")
        except UnicodeDecodeError:
            appended = None
        if appended is not None:
            segment = [*tail.tokens, token]
            text = tail.text + appended
            chunks = self.bpe.chunks(text)
            # Fewer than two chunks: the token joined the tail's chunks, and the row's last two
            # chunks reach before the tail (a full read sees them).
            if len(chunks) < _TAIL_CHUNKS:
                found = _SHORT
            else:
                rests = self._advance_pending(pending, appended)
                read = self._finish(
                    segment, 0, self.prefixes.hashes(segment), segment, chunks, rests, quiet=True
                )
                if read[1] is not None:  # canonical: else the full read says why
                    found = read
        with self._lock:
            self._advances[memo] = found
            if len(self._advances) > _ADVANCES:
                self._advances.popitem(last=False)
        return found

    def _run_move(self, cls: int, a: int, spot: Spot, token: int) -> Spot | None:
        """GPT-2's pattern, a row ending in a run of letters, digits or punctuation (last token
        ``a``), without reading text: ``token`` either goes on with the run (its whole text is
        of the run's class: the chunk goes on, canonical iff no merge joins it to ``a``, the
        merge-tree test) or starts a chunk (its first character cannot go on with the run: the
        run's chunk is final, and the new chunk is canonical iff the tokenizer gives ``token``
        back alone). None where it does neither or its text begins an added token's content
        (read the tail instead)."""
        run = RUN_OF_CLASS.get(cls)
        text = self.bpe.texts[token]
        if run is None or text is None or not self._self_ok[token] or self.begins_added(token):
            return None
        end = self._whole_last[token]
        if self._run_of[token] == run:  # the same chunk goes on
            if not self._pair(a, token):
                return None
            return Spot(
                ("run", cls, token, ()),
                spot.tokens + 1,
                spot.chars + len(text),
                spot.last,
                end,
                False,
            )
        first = self._first_of[token]
        if first == cls or (cls == PUNCT and first == APOSTROPHE):
            return None  # goes on with the run but is not all of it: crosses a chunk boundary
        assert spot.last is not None  # read by GPT-2's rules
        chars, tokens = spot.last
        kept, count = spot.chars - chars, spot.tokens - tokens  # the run's chunk
        key = (*self.lone_kind(token, text), ())  # the previous chunk matters after "'" only
        return Spot(key, count + 1, kept + len(text), (kept, count), end, key[0] == "space")

    def lone_kind(self, token: int, text: str) -> tuple[Any, ...]:
        """The kind of a chunk that is ``token`` alone (its text ``text``), kept per token."""
        kind = self._lone_kinds.get(token)
        if kind is None:
            kind = self._lone_kinds[token] = self._kind(text, [token], None)
        return kind

    def _space_move(self, key: tuple[Any, ...], spot: Spot, token: int) -> Spot | None:
        """GPT-2's pattern, a row ending in a whitespace run ``W`` (its last chunk), without
        reading text: a token that comes back alone and starts a chunk of its own after the
        run. Two cases. The token is a space then a character that is not whitespace (``"
        def"``): ``W`` stays one chunk (``\\s+(?!\\S)`` stops before that space), and a
        ``space`` state holds ``W``'s tokenization as one chunk. Or the token starts with a
        character that is not whitespace, and the run's last character is not a space (no
        chunk takes it with that character): ``W`` splits into its last character and the rest
        (one character: no split), as ``space_split`` states and ``space`` states with the
        flag hold it. The new state is the token's alone (what came before it matters only
        after an apostrophe); the row's last two chunks are the run (in the second case its
        last character, the spot's last ``end`` tokens) and the token. None otherwise (read
        the tail instead)."""
        text = self.bpe.texts[token]
        if text is None or not self._self_ok[token] or self.begins_added(token):
            return None
        first = self._first_of[token]
        if first == SP:
            if key[0] != "space" or len(text) < 2 or self.bpe.char_class(text[1]) in (SP, WS):
                return None
        elif (
            first in (WS, NONE)
            or key[1 if key[0] == "space_split" else 2] == " "
            or (key[0] == "space" and not key[3])
        ):
            return None
        if first == SP:  # the row's last two chunks: the run, the token
            if spot.last is None:
                return None
            chars, tokens = spot.last
            kept, count = spot.chars - chars, spot.tokens - tokens
        else:  # the run's last character, the token
            kept, count = 1, spot.end
            if not count:
                return None
        key = (*self.lone_kind(token, text), ())
        return Spot(
            key,
            count + 1,
            kept + len(text),
            (kept, count),
            self._whole_last[token],
            key[0] == "space",
        )

    def _finish(
        self,
        segment: list[int],
        start: int,
        hashes: Hashes,
        window: list[int],
        chunks: list[str],
        pending: tuple[str, ...],
        *,
        quiet: bool = False,
    ) -> Read:
        """The state of a segment read as ``window`` (its last ids) with ``chunks`` (at least
        the last three pre-tokenizer chunks, or all of the segment's)."""
        note = (lambda why="": None) if quiet else self.note
        # The last two chunks may change when text is appended (a contraction joins them);
        # the ones before are fixed, so they must be canonical already.
        tail_text = "".join(chunks[-_TAIL_CHUNKS:])
        tail = tokens_of_tail(window, self._bytes, len(tail_text.encode("utf-8")))
        if not tail or not self.prefixes.prefix(segment, len(segment) - len(tail), start, hashes):
            note()
            return ("dead", ()), None
        if self.split is not None:
            if self.bpe.nfc and unicodedata.normalize("NFC", tail_text) != tail_text:
                note(" (its text is not NFC)")
                return ("dead", ()), None
            if self._added_in is not None and self._added_in.search(tail_text):
                # An added token's content spelled inside the last chunks (Tekken's "<s>" is
                # two, "<s" and ">"): the tokenizer reads it back as that token. Before them,
                # the prefix check sees it; GPT-2's rules, by encoding the chunks.
                note(" (its text spells an added token)")
                return ("dead", ()), None
            own = tokens_of_tail(tail, self._bytes, len(chunks[-1].encode("utf-8")))
            at = (len(tail_text) - len(chunks[-1]), len(tail) - len(own)) if own else None
            return self._split_read(tail_text, tuple(tail), at, pending)
        last = chunks[-1]
        canonical = self.bpe.encode(last)
        if tail[len(tail) - len(canonical) :] != canonical or self.bpe.encode(tail_text) != tail:
            if self._split_run(chunks, tail):
                return ("space_split", last[-1], pending), Tail(tail_text, tuple(tail))
            note()
            return ("tail", tuple(tail), tail_text, pending), None
        previous = chunks[-2] if len(chunks) >= 2 else None
        at = (len(tail_text) - len(last), len(tail) - len(canonical))
        return (*self._kind(last, canonical, previous), pending), Tail(tail_text, tuple(tail), at)

    def _completes(self, rests: tuple[str, ...], token: int) -> bool:
        """Whether ``token``'s text completes one of the added-token contents whose ``rests`` a
        row's text has begun (or may: a token that is not whole characters)."""
        text = self.bpe.texts[token]
        if text is None:
            return True
        return any(text.startswith(rest) for rest in rests)

    def _advance_pending(self, rests: tuple[str, ...], appended: str) -> tuple[str, ...]:
        """:meth:`_pending_added` of a text with ``appended`` after it, from the text's own
        rests: a begun content either lies inside the appended text or is one the text had
        begun, continued by all of it."""
        if not self._longest_begun:
            return ()
        found = [
            r[len(appended) :] for r in rests if len(r) > len(appended) and r.startswith(appended)
        ]
        found.extend(self._pending_added(appended))
        return tuple(sorted(found))

    def _split_run(self, chunks: list[str], tail: list[int]) -> bool:
        """Whether the row ends in a whitespace run tokenized as it is when a word follows (all
        but its last character, then that character): a pending run, written one whitespace
        character after a run (``"\\n", "\\n"`` before ``"def"``), or a prompt cut from a
        longer text. Only a candidate that starts that word keeps the row extendable, and the
        row does not end here (its text alone is tokenized otherwise)."""
        last = chunks[-1]
        if len(last) < 2 or any(self.bpe.char_class(c) not in (SP, WS) for c in last):
            return False
        before = self.bpe.encode(chunks[-2]) if len(chunks) >= 2 else []
        return tail == before + self.bpe.encode(last[:-1]) + self.bpe.encode(last[-1])

    def _inside_number(self, segment: list[int], width: int, text: str) -> bool:
        """Whether a window starts inside a run of digits: Llama 3 groups digits by three from
        the run's start, so every chunk of the run would be read wrong. The character before
        the window's text may be one whose first bytes lie before the window."""
        if not text or not unicodedata.category(text[0]).startswith("N"):
            return False
        data = b"".join(self._bytes[t] for t in segment[-width - 4 :])
        before = data.decode("utf-8", errors="ignore")
        if not before.endswith(text) or len(before) == len(text):
            return True  # cannot tell: read a wider window
        return unicodedata.category(before[-len(text) - 1]).startswith("N")

    def _kind(self, last: str, tokens: list[int], previous: str | None) -> tuple[Any, ...]:
        classes = [self.bpe.char_class(c) for c in last]
        a = tokens[-1]
        if last[0] == "'" and last[1:] in CONTRACTIONS:
            return ("contraction",)
        if last == "'":
            return ("apostrophe", a)
        if all(c in (SP, WS) for c in classes):
            split = None
            if len(last) >= 2:
                split = self.bpe.encode(last[:-1]) + self.bpe.encode(last[-1]) == tokens
            return ("space", a, last[-1], len(last) == 1 or split)
        body = [c for i, c in enumerate(classes) if not (i == 0 and c == SP)]
        kind = body[0] if body else NONE
        if kind == APOSTROPHE:
            kind = PUNCT
        if previous == "'" and last in _OPEN_CONTRACTIONS:
            apostrophe = self.bpe.ids_of.get("'", -1)
            completion = _OPEN_CONTRACTIONS[last]
            merged = self.bpe.encode("'" + last + completion) == [
                apostrophe,
                a,
                self.bpe.ids_of.get(completion, -1),
            ]
            return ("open", a, completion, merged)
        return ("run", kind, a)

    def begins_added(self, token: int) -> bool:
        """Whether a token's text alone ends in the beginning of an added token's content
        (:meth:`_pending_added` of its text), kept per token."""
        known = self._lone_begins.get(token)
        if known is None:
            known = self._lone_begins[token] = bool(
                self._pending_added(self.bpe.texts[token] or "")
            )
        return known

    def _pending_added(self, text: str) -> tuple[str, ...]:
        """The rests of added tokens' contents that the text's end has begun."""
        rests: list[str] = []
        tail = text[-self._longest_begun :] if self._longest_begun else ""
        for first in self._first_chars:  # a begun content starts with one of these
            at = tail.find(first)
            while at != -1:
                rests.extend(self._begun.get(tail[at:], ()))
                at = tail.find(first, at + 1)
        return tuple(sorted(rests))

    def note(self, why: str = "") -> None:
        self.rows += 1
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"memfree: a prompt's ids are not the tokenization of its text{why}: "
                "canonical decoding allows only tokens that make prompt and output the "
                "tokenization of their text, often none but end of sequence. Tokenize prompts "
                "from their text (as generate(), vLLM and the CLI do), or pass canonical=False",
                RuntimeWarning,
                stacklevel=4,
            )


__all__ = [
    "CONTRACTIONS",
    "RULE_KINDS",
    "RUN_OF_CLASS",
    "Read",
    "RowStates",
    "Spot",
    "Tail",
]
