"""GPT-2's pattern's rules for canonical decoding: for a row's state, the candidates that keep it
canonical, over the tokens or over the pseudo candidates of characters written with several
tokens (:mod:`memfree.core.canonical_chars`).

A candidate ``c`` after a chunk ``C`` whose last token is ``a`` (the pattern's chunks are runs of
letters, numbers, punctuation or whitespace, contractions, and a whitespace run that gives its
last space to the next word):

- ``c`` starts a new chunk when its first character cannot continue ``C``: allowed iff the
  tokenizer gives ``[c]`` for its text;
- ``c`` continues ``C``: allowed iff its whole text is one run of that class and BPE gives
  ``[a, c]`` for their bytes (the merge-tree test);
- after a whitespace run, a token that is exactly one whitespace character enters the split
  reading (the run as it stands, then that character before the next word), after which only a
  token that starts the next chunk fits; after a lone apostrophe, a contraction's rest.

An added token cuts the text: it is allowed where the row's text ending there is its tokens; a
candidate that would finish an added token's content the row began is not.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import numpy as np

from memfree.core.canonical_chars import Characters
from memfree.core.canonical_state import CONTRACTIONS, RULE_KINDS, RUN_OF_CLASS
from memfree.vocab.bpe import (
    LETTER,
    NUMBER,
    PUNCT,
    RUN_LETTERS,
    RUN_NUMBERS,
    RUN_PUNCT,
    RUN_SPACE,
    SP,
    WS,
    ByteLevelBpe,
)

# States of rows that are canonical as they stand (an added token may follow them); these rules
# answer those and "space_split" (RULE_KINDS; the others: a split pattern's, or rows that are
# not canonical).
ENDS_CANONICAL = RULE_KINDS - {"space_split"}
_WORD_RUNS = (RUN_LETTERS, RUN_NUMBERS, RUN_PUNCT)


class Columns(NamedTuple):
    """What the rules read of each candidate: one entry per token, or per pseudo candidate
    (``tokens`` False)."""

    tokens: bool
    new: np.ndarray  # starts a chunk: the tokenizer gives it back alone
    added: np.ndarray  # an added token that is not special
    first_letter: np.ndarray
    first_number: np.ndarray
    first_punct: np.ndarray
    first_space: np.ndarray
    self_ok: np.ndarray
    run: np.ndarray  # the run its whole text is (NONE: not one)
    runs: dict[int, np.ndarray]  # run kind -> one such run, and comes back alone
    word_run: np.ndarray
    split_enter: np.ndarray  # see split_enter()
    after_apostrophe: np.ndarray  # see contraction_heads()
    starting_with: Callable[[str], np.ndarray]
    bigram: Callable[[int], np.ndarray]  # the merge-tree test after a token


def rule_mask(key: tuple[Any, ...], c: Columns, ids_of: dict[str, int]) -> np.ndarray:
    """The candidates (columns ``c``) a state allows; ``ids_of``: the tokens' texts."""
    kind = key[0]
    new, bigram = c.new, c.bigram
    if kind == "start" or kind == "contraction":
        mask = new.copy()
    elif kind == "run":
        _, cls, a = key[:3]
        continues = {
            LETTER: c.first_letter,
            NUMBER: c.first_number,
            PUNCT: c.first_punct,
        }.get(cls)
        if continues is None:
            mask = new.copy()
        else:
            run = c.runs[RUN_OF_CLASS[cls]]
            mask = (new & ~continues) | (run & bigram(a))
    elif kind == "apostrophe":
        a = key[1]
        heads = c.after_apostrophe
        base = (new & ~c.first_punct) | (c.runs[RUN_PUNCT] & bigram(a))
        mask = (base & (heads == 0)) | ((heads == 1) & c.self_ok & bigram(a))
    elif kind == "open":
        _, a, completion, merged = key[:4]
        starts = c.starting_with(completion)
        letters = (new & ~c.first_letter) | (c.runs[RUN_LETTERS] & bigram(a))
        mask = letters & ~starts
        if merged and c.tokens:
            mask[ids_of[completion]] = True
    elif kind == "space":
        _, a, last_char, split_ok = key[:4]
        mask = c.runs[RUN_SPACE] & bigram(a)
        mask |= c.first_space & (c.run != RUN_SPACE) & new
        # The split reading: the run as it stands, then one whitespace character that a
        # non-space character will follow (a newline alone, a space joined to a word).
        mask |= c.split_enter
        if split_ok:
            if last_char == " ":
                mask |= c.word_run & bigram(ids_of[" "])
            else:
                mask |= new & ~c.first_space
    elif kind == "space_split":  # only the word that splits the run fits
        mask = c.word_run & bigram(ids_of[" "]) if key[1] == " " else new & ~c.first_space
    else:  # pragma: no cover - every state above
        raise AssertionError(key)
    return cut_mask(key, mask, c)


def cut_mask(key: tuple[Any, ...], mask: np.ndarray, c: Columns) -> np.ndarray:
    """``mask`` with the added tokens where the state may be cut, and without the candidates
    that would finish an added token's content the row began (the state's last field)."""
    kind, pending = key[0], key[-1]
    if kind in ENDS_CANONICAL or (kind == "split" and key[1][3]):
        mask = mask | c.added
    for rest in pending:
        mask &= ~c.starting_with(rest)
    return mask


def pseudo_columns(
    chars: Characters, token_bigram: Callable[[int], np.ndarray], run_kinds: Iterable[int]
) -> Columns:
    """What the rules read of each pseudo candidate (a head and the class of the character it
    begins): it starts a chunk alone (its chain is its text's tokenization), is never an added
    token or a lone whitespace character, and is a contraction's rest only where its head's
    whole characters are; its merge-tree test is its head's (``token_bigram``: a token's
    test over the vocabulary)."""
    size = chars.size
    heads = chars.heads

    def bigram(a: int) -> np.ndarray:
        allowed: np.ndarray = token_bigram(a)[heads]
        return allowed

    return Columns(
        False, np.ones(size, dtype=bool), np.zeros(size, dtype=bool), chars.firsts == LETTER,
        chars.firsts == NUMBER, chars.firsts == PUNCT, (chars.firsts == SP) | (chars.firsts == WS),
        np.ones(size, dtype=bool), chars.runs, {kind: chars.runs == kind for kind in run_kinds},
        np.isin(chars.runs, _WORD_RUNS), np.zeros(size, dtype=bool),
        contraction_heads(chars.texts), functools.lru_cache(maxsize=256)(chars.starting_with),
        bigram,
    )  # fmt: skip


def split_enter(bpe: ByteLevelBpe, new: np.ndarray, word_run: np.ndarray) -> np.ndarray:
    """GPT-2's pattern: the tokens that may follow a whitespace run as its split reading, the
    run's tokens as they stand and then one whitespace character that a non-space character
    will follow (``\\s+(?!\\S)`` leaves a run's last character to what follows it). A token is
    one iff its text is exactly one whitespace character that comes back alone; a space only if
    some word keeps a lone space before it (the space joins the word's chunk). None for a split
    pattern (its chunks are read through the pre-tokenizer)."""
    enter = np.zeros(bpe.vocab_size, dtype=bool)
    if bpe.pattern:
        return enter
    for token in np.flatnonzero(new):
        text = bpe.texts[int(token)]
        if text is not None and len(text) == 1 and bpe.char_class(text) in (SP, WS):
            enter[token] = True
    space = bpe.ids_of.get(" ")
    if space is not None and enter[space] and not (word_run & bpe.bigram_allowed(space)).any():
        enter[space] = False
    return enter


def contraction_heads(texts: Iterable[str | None]) -> np.ndarray:
    """After a lone apostrophe: 1 for a text that is exactly a contraction's rest ("s",
    "re", ...), 2 for one that starts with one and goes on (cut inside it), else 0."""
    texts = list(texts)
    heads = np.zeros(len(texts), dtype=np.int8)
    for token, text in enumerate(texts):
        if text is None:
            continue
        for rest in CONTRACTIONS:
            if text == rest:
                heads[token] = 1
            elif text.startswith(rest):
                heads[token] = max(heads[token], 2)
    return heads


__all__ = [
    "ENDS_CANONICAL",
    "RULE_KINDS",
    "Columns",
    "contraction_heads",
    "cut_mask",
    "pseudo_columns",
    "rule_mask",
    "split_enter",
]
