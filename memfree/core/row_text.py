"""The word masker's per-row state: a row's text since a safe cut, its words and its partial last
word, recomputed exactly from the chosen tokens' bytes and extended by one token per step.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from functools import lru_cache

from memfree.core.word_vocab import cached_word_hash
from memfree.vocab.words import is_word_char, normalize, starts_clean, word_pattern, words


def _run_text(run: bytes, tokens: int) -> str:
    """How ``tokenizers`` reads a run of byte-fallback tokens: UTF-8, or U+FFFD per token."""
    try:
        return run.decode("utf-8")
    except UnicodeDecodeError:
        return "\ufffd" * tokens


@dataclass
class RowText:
    """A row's text since a safe cut: bytes, words of its complete reading, partial last word.

    ``head`` holds the bytes of the text (for byte-level tokenizers it may end with ``pending``,
    an unfinished UTF-8 character); ``run`` the bytes of a trailing run of byte-fallback tokens
    (SentencePiece), whose reading is only known once the run ends.
    """

    head: bytes
    pending: bytes
    run: bytes
    run_tokens: int
    hashes: list[int]  # hashes of the complete reading's words (without ``pending``)
    partial: str  # the last word, if the text ends inside it; else ""

    @classmethod
    def of(cls, head: bytes, keep_words: int, run: bytes = b"", run_tokens: int = 0) -> RowText:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        text = decoder.decode(head, final=False)
        pending = decoder.getstate()[0]
        text, head = _trim(text, pending, keep_words)
        if run:
            text += ("\ufffd" if pending else "") + _run_text(run, run_tokens)
        norm = normalize(text)
        found = word_pattern().findall(norm)
        partial = found[-1] if found and is_word_char(norm[-1]) else ""
        hashes = [cached_word_hash(word) for word in found]
        return cls(head, pending, run, run_tokens, hashes, partial)

    def reading(self, token: bytes = b"", byte_token: bool = False) -> str:
        """The complete text, with ``token`` appended (a byte-fallback token if ``byte_token``)."""
        if byte_token:
            return self.head.decode("utf-8", "replace") + _run_text(
                self.run + token, self.run_tokens + 1
            )
        return (
            self._closed() + token.decode("utf-8", "replace")
            if self.run
            else ((self.head + token).decode("utf-8", "replace"))
        )

    def _closed(self) -> str:
        return self.head.decode("utf-8", "replace") + _run_text(self.run, self.run_tokens)

    def extended(self, token: bytes, keep_words: int, byte_token: bool = False) -> RowText:
        if byte_token:
            return RowText.of(self.head, keep_words, self.run + token, self.run_tokens + 1)
        if not token:
            return self
        if self.run:
            return RowText.of(self._closed().encode("utf-8") + token, keep_words)
        return RowText.of(self.head + token, keep_words)


@lru_cache(maxsize=4096)
def _safe_cut(char: str) -> bool:
    """A cut just before ``char`` splits the words exactly (it starts clean, as a separator)."""
    norm = normalize(char)
    return bool(norm) and starts_clean(char) and not is_word_char(norm[0])


def _trim(text: str, pending: bytes, keep_words: int) -> tuple[str, bytes]:
    """Drop the start of a long text at a safe cut that keeps at least ``keep_words`` words."""
    if len(text) < 8 * keep_words:
        return text, text.encode("utf-8") + pending
    found = len(words(text))
    if found <= 2 * keep_words:
        return text, text.encode("utf-8") + pending
    cut = 0
    for position in range(len(text) // 2, 0, -1):  # the latest safe cut in the first half
        if _safe_cut(text[position]):
            if len(words(text[position:])) >= keep_words:
                cut = position
            break
    text = text[cut:]
    return text, text.encode("utf-8") + pending


_TAIL_CHARS_PER_WORD = 16  # how far back a tail may start, per word it must keep


def tail(state: RowText, keep_words: int) -> RowText:
    """The row's text from a safe cut near its end that keeps at least ``keep_words`` words.

    A token changes the words of the text at most from the last word on (a UTF-8 character it
    completes, a mark that composes with the last character, the last word it extends), and
    a cut before a clean separator splits the words exactly; so the n-grams a token creates
    are the same in the tail as in the whole text when the tail holds n + 1 words or more.
    """
    if state.run:
        return state
    text = state.head[: len(state.head) - len(state.pending)].decode("utf-8", "replace")
    found, inside, cut = 0, False, 0
    for position in range(len(text) - 1, max(len(text) - _TAIL_CHARS_PER_WORD * keep_words, 0), -1):
        if _safe_cut(text[position]):
            if found >= keep_words:
                cut = position
                break
            inside = False
        elif not inside:  # a word (or what may normalize into one) begins here, reading back
            found, inside = found + 1, True
    if not cut:
        return state
    tail = text[cut:]
    if len(words(tail)) < keep_words:  # the count above is a guess; this is the rule
        return state
    return RowText(tail.encode("utf-8") + state.pending, state.pending, b"", 0, [], "")


__all__ = ["RowText", "tail"]
