"""A row's text kept NFC, for a tokenizer that normalizes to NFC first (Qwen 2).

Such a tokenizer tokenizes the NFC form of what it is given, so a row whose text is not NFC is
not its text's tokenization: a candidate that would compose with the row's end, or reorder
against it, is banned (:meth:`~memfree.core.canonical_split.SplitChunks.breaking_nfc`). What
decides it is the row's end from its last starter on (:func:`nfc_context`), and only candidates
that begin with a character that may change NFC text before it (:func:`may_compose`) can.
"""

from __future__ import annotations

import functools
import unicodedata


def may_compose(char: str) -> bool:
    """Whether ``char`` can change NFC text it is appended to: a combining mark (it reorders
    or composes), or a character that composes with one before it (Hangul vowels and finals,
    the second half of a canonical pair)."""
    return bool(unicodedata.combining(char)) or char in _second_halves()


def nfc_context(text: str) -> str:
    """The end of an NFC ``text`` that decides whether appending text keeps it NFC: from its
    last starter (canonical combining class 0) on. Canonical reordering moves an appended mark
    only among the marks after that starter, and composition joins an appended character only to
    that starter (a starter between blocks it); the text before it is NFC and stays as it is.
    So ``NFC(text + c) == text + c`` iff ``NFC(ctx + c) == ctx + c`` for every ``c``: rows that
    end alike share their NFC answers (a row's whole text in its state made every row a state
    of its own). Tested against the whole text (``test_canonical_qwen.py``)."""
    for index in range(len(text) - 1, -1, -1):
        if unicodedata.combining(text[index]) == 0:
            return text[index:]
    return text


@functools.cache
def _second_halves() -> frozenset[str]:
    halves = {chr(c) for c in range(0x1161, 0x1176)} | {chr(c) for c in range(0x11A8, 0x11C3)}
    for code in range(0x110000):
        parts = unicodedata.decomposition(chr(code)).split()
        if len(parts) == 2 and not parts[0].startswith("<"):
            halves.add(chr(int(parts[1], 16)))
    return frozenset(halves)


__all__ = ["may_compose", "nfc_context"]
