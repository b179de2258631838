"""GPT-2's rules' automaton (memfree/core/rule_automaton.py): rows kept as integers from step to
step and advanced as arrays. Every row's spot, at every step, must be exactly its full read's
(:meth:`RowStates.read`, itself checked against the definition in ``test_canonical.py``): along
real code and Hypothesis texts, with rows that grow, get reordered, replaced, padded, or hold ids
past the vocabulary, written canonically or split as no tokenizer would."""

from __future__ import annotations

import random
import sysconfig
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree.core.canonical import CanonicalMasker
from memfree.core.rule_automaton import RuleAutomaton
from memfree.core.state_table import row_bounds
from memfree.vocab.info import TokenizerInfo
from tests.conftest import llama_cpp_tokenizer
from tests.memfree.core.test_canonical import PIECES, _split, _texts
from tests.memfree.core.test_canonical_advance import WALK_PIECES
from tests.memfree.core.test_canonical_chars import _needs, llama_cpp_texts


@pytest.fixture(scope="module", params=["smollm2", "gpt-2"])
def rules(request: pytest.FixtureRequest, default_tokenizer: Any) -> tuple[Any, CanonicalMasker]:
    """GPT-2's pattern read by rules: SmolLM2's tokenizer, and GPT-2's real vocabulary."""
    tokenizer = default_tokenizer if request.param == "smollm2" else llama_cpp_tokenizer("gpt-2")
    info = TokenizerInfo.of(tokenizer)
    return tokenizer, CanonicalMasker(info, [info.eos_token_id])


def _walk(
    masker: CanonicalMasker, sources: list[list[int]], steps: int, seed: int, start: int = 3
) -> tuple[int, int]:
    """Rows that grow by their source's next token (or a random one past its end), reordered
    every fifth step, one replaced every seventh, one holding an id past the vocabulary for a
    while: every row's spot equals its full read at every step. Returns how many rows the
    arrays advanced, and how many rows advanced in all."""
    automaton = RuleAutomaton(masker.states)
    automaton.arrays_from = 0  # as arrays however few the rows
    states = masker.states
    size = masker.bpe.vocab_size
    rng = random.Random(seed)
    live = list(sources)
    rows = [source[:start] for source in live]
    moved = advanced = 0
    for step in range(steps):
        if step % 5 == 4:  # reordered: matched by ids, not by place
            order = list(range(len(rows)))
            rng.shuffle(order)
            live, rows = [live[i] for i in order], [rows[i] for i in order]
        if step % 7 == 6:  # a new request in the first place
            live[0] = live[0][::-1]
            rows[0] = live[0][: 1 + step % 3]
        if step == steps // 3:  # an id past the vocabulary, then rows after it
            rows[-1] = [*rows[-1], size + 1]
        length = max(map(len, rows))
        arrays = np.array([[-1] * (length - len(r)) + r for r in rows], dtype=np.int64)
        firsts, past = row_bounds(arrays, size)
        before = automaton._seen.__dict__.get("rows")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            fields = automaton.step(arrays, firsts, past)
            for index, row in enumerate(rows):
                expected = (
                    states.spot((("past",), None)) if past[index] else states.spot(states.read(row))
                )
                assert automaton.spot(fields[index]) == expected, (step, row)
        if before is not None:
            written = (np.asarray(firsts) < length) & ~np.asarray(past)
            previous = automaton._previous(arrays, firsts, written, before)
            done = automaton._move(arrays, previous, before[3], np.zeros_like(fields))
            moved += int(done.sum())
            advanced += int((previous >= 0).sum())
        for index, row in enumerate(rows):
            source = live[index]
            if source[: len(row)] == row and len(source) > len(row):
                row.append(source[len(row)])
            else:
                row.append(rng.randrange(size))
    return moved, advanced


def test_rows_of_real_code_read_as_their_full_reads(rules: tuple[Any, CanonicalMasker]) -> None:
    """The standard library's first modules, as the tokenizer writes them and split at a cut
    (a prompt no tokenizer gives), stepped 60 times: every spot is the full read's, and the
    arrays advance most rows (the point of it)."""
    tokenizer, masker = rules
    paths = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:6]
    texts = [path.read_text(errors="ignore")[:1200] for path in paths]
    sources = [_split(tokenizer, text, 0, 0) for text in texts]
    sources += [_split(tokenizer, text, 1, 40) for text in texts[:3]]
    moved, advanced = _walk(masker, sources, 60, seed=0)
    assert moved >= 0.5 * advanced, (moved, advanced)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    texts=st.lists(_texts(PIECES + WALK_PIECES), min_size=1, max_size=4),
    how=st.integers(0, 3),
    cut=st.integers(0, 100),
    seed=st.integers(0, 2**32 - 1),
)
def test_rows_of_any_text_read_as_their_full_reads(
    rules: tuple[Any, CanonicalMasker], texts: list[str], how: int, cut: int, seed: int
) -> None:
    tokenizer, masker = rules
    sources = [_split(tokenizer, text, how, cut) or [0] for text in texts]
    _walk(masker, sources, 16, seed, start=1)


@pytest.mark.parametrize("name", [pytest.param(n, marks=_needs(n)) for n in ("gpt-2", "starcoder")])
def test_llama_cpp_test_texts_in_one_batch_keep_every_next_token(name: str) -> None:
    """llama.cpp's tokenizer test texts (those its tokenizer and transformers' agree on) as the
    rows of one batch that grow together, a token a step, as a server's do: the arrays advance
    the rows, and no row's own next token is ever banned."""
    tokenizer = llama_cpp_tokenizer(name)
    rows = [
        ids for text in llama_cpp_texts(tokenizer, name) if (ids := _split(tokenizer, text, 0, 0))
    ]
    assert len(rows) >= 38, len(rows)
    info = TokenizerInfo.of(tokenizer)
    masker = CanonicalMasker(info, [info.eos_token_id])
    assert isinstance(masker.automaton, RuleAutomaton)
    assert len(rows) >= masker.automaton.arrays_from  # the step takes the arrays
    moved = []
    take = masker.automaton._move

    def counted(*args: Any) -> Any:
        done = take(*args)
        moved.append(int(done.sum()))
        return done

    masker.automaton._move = counted  # type: ignore[method-assign]
    longest = max(map(len, rows))
    steps = 0
    for end in range(1, longest):
        batch = torch.tensor([[-1] * (longest - min(end, len(r))) + r[:end] for r in rows])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            banned, _, _ = masker.step(batch, info.vocab_size)
        for index, row in enumerate(rows):
            if end < len(row):
                assert not banned[index, row[end]], (name, row[: end + 1])
                steps += 1
    assert steps > 300
    assert sum(moved) >= 0.5 * steps, (sum(moved), steps)
