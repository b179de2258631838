"""A row one token longer than a row read at the previous step is read from that row's state
(issue 35: a step costs the row's last chunks, not its length): the answer must be exactly the
full read's, for every family, every text, and rows grown by any token the guard allows.

Checked against :meth:`RowStates.read` (itself checked against the definition in
``test_canonical.py`` and ``test_canonical_split.py``): Hypothesis texts tokenized and split
the ways a prompt can be, walks over allowed tokens, and the masker's step over rows that grow,
get reordered or replaced between steps, against a fresh masker's step.
"""

from __future__ import annotations

import random
import sysconfig
import unicodedata
import warnings
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree.core import row_threads, state_table
from memfree.core.canonical import CanonicalMasker
from memfree.core.canonical_state import RowStates
from memfree.vocab.info import TokenizerInfo
from tests.conftest import train_split_bpe
from tests.memfree.core.test_canonical import PIECES, SPECIAL_PIECES, _split, _texts
from tests.memfree.core.test_canonical_split import SPLIT_PIECES

WALK_PIECES = ["x = 1\n\n# c\n", "def f():\n\n\n    return 1\n", "a  1  2\n \n", "'s 'll", "<|im"]


@pytest.fixture(scope="module", params=["gpt2-rules", "split-way", "llama3", "qwen2"])
def family(request: pytest.FixtureRequest, default_tokenizer: Any) -> tuple[Any, CanonicalMasker]:
    if request.param in ("gpt2-rules", "split-way"):
        tokenizer = default_tokenizer
    else:
        tokenizer = train_split_bpe(request.param)
    info = TokenizerInfo.of(tokenizer)
    masker = CanonicalMasker(info, [info.eos_token_id], _split=request.param == "split-way")
    return tokenizer, masker


@pytest.fixture(scope="module")
def smol_masker(default_tokenizer: Any) -> CanonicalMasker:
    info = TokenizerInfo.of(default_tokenizer)
    return CanonicalMasker(info, [info.eos_token_id])


def _read(states: RowStates, ids: list[int]) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return states.read(ids)


def _check_prefixes(states: RowStates, ids: list[int]) -> int:
    """Every prefix advanced from the one before equals its full read; how many advanced."""
    advanced = 0
    for length in range(1, len(ids) + 1):
        before = _read(states, ids[: length - 1])
        found = states.advance(*before, ids[length - 1])
        if found is not None:
            advanced += 1
            assert found == _read(states, ids[:length]), (ids[:length], before, found)
    return advanced


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    text=_texts(PIECES + SPLIT_PIECES + SPECIAL_PIECES),
    how=st.integers(0, 3),
    cut=st.integers(0, 10_000),
)
def test_an_advanced_row_reads_as_the_whole_row(
    family: tuple[Any, CanonicalMasker], text: str, how: int, cut: int
) -> None:
    tokenizer, masker = family
    _check_prefixes(masker.states, _split(tokenizer, text, how, cut))


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=_texts(PIECES + WALK_PIECES), seed=st.integers(0, 2**32 - 1))
def test_walks_over_allowed_tokens_advance_exactly(
    family: tuple[Any, CanonicalMasker], text: str, seed: int
) -> None:
    """Rows the guard itself writes: from a text's tokens, tokens drawn among the allowed ones
    (pending whitespace runs, contractions, runs going on and new chunks alike)."""
    tokenizer, masker = family
    rng = random.Random(seed)
    ids = _split(tokenizer, text, 0, 0)
    row = ids[: rng.randrange(len(ids) + 1)]
    for _ in range(12):
        allowed = np.flatnonzero(masker.allowed(row))
        if not allowed.size:
            break
        row.append(int(rng.choice(allowed)))
    _check_prefixes(masker.states, row)


def test_rows_of_ordinary_text_advance_without_reading_the_row(
    family: tuple[Any, CanonicalMasker],
) -> None:
    """The point of it: along ordinary text almost every step advances from the step before
    (only a token that joins the tail's two chunks into one needs the row read again)."""
    tokenizer, masker = family
    text = "def f(x, y):\n    return x + y  # sum\n\n\nprint(f(1, 2))\nIt's done.\n"
    ids = _split(tokenizer, text, 0, 0)
    assert _check_prefixes(masker.states, ids) >= 0.9 * len(ids)


def test_rows_after_a_whitespace_run_advance_without_reading_text(
    smol_masker: CanonicalMasker,
    default_tokenizer: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """GPT-2's pattern, a row ending in a whitespace run: a token that starts a chunk after it
    (``"\\n" + "def"``, ``"    " + " return"``, ``"\\n\\n" + "class"``) is read from the
    per-token tables, and a token that does neither from the run alone (a whitespace token
    that goes on with the run: from the run after "x", whatever chunk came before it). Along
    real code (the standard library's first modules, blank lines written both ways), every
    prefix advanced equals its full read, and both shortcuts are taken."""
    states = smol_masker.states
    taken = []
    space_move = states._space_move
    neutral = []
    advance_tail = states._advance_tail

    def counted(key: Any, spot: Any, token: int) -> Any:
        found = space_move(key, spot, token)
        taken.append(found is not None)
        return found

    def after_x(tail: Any, pending: Any, token: int) -> Any:
        neutral.append(tail.tokens[:1] == (states._neutral,) and tail.text[:1] == "x")
        return advance_tail(tail, pending, token)

    monkeypatch.setattr(states, "_space_move", counted)
    monkeypatch.setattr(states, "_advance_tail", after_x)
    paths = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:12]
    texts = [path.read_text(errors="ignore")[:1500] for path in paths]
    texts.append('class A:\n\n\n    def f(self):\n\treturn 1\n \nx = "a"\n\n"""s"""\n  \'t\n')
    for text in texts:
        ids = default_tokenizer(text, add_special_tokens=False)["input_ids"]
        _check_prefixes(states, ids)
        _check_prefixes(states, _split(default_tokenizer, text, 1, 7))
    assert sum(taken) >= 100, (sum(taken), len(taken))
    assert sum(neutral) >= 20, sum(neutral)


def test_split_rows_advance_by_their_groups_without_reading_text(
    family: tuple[Any, CanonicalMasker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A split pattern's row whose next token, by its state's groups and facts, starts a chunk
    of its own after the row's last chunk or goes on with it, is advanced from them (no
    pre-tokenizer, no prefix check): along real code, written canonically and split
    otherwise, and text with marks, CJK, an emoji, an added token's content and
    contractions, every prefix so advanced equals its full read, and both ways are taken
    for almost every advance."""
    tokenizer, masker = family
    states = masker.states
    if states.split is None:
        pytest.skip("GPT-2's rules: rows advance by spots (test above)")
    taken: list[str] = []
    split_move = states._split_move

    def counted(key: Any, tail: Any, token: int) -> Any:
        found = split_move(key, tail, token)
        goes_on = found is not None and found[1].tokens == (*tail.tokens, token)
        taken.append("read" if found is None else "goes on" if goes_on else "starts")
        return found

    monkeypatch.setattr(states, "_split_move", counted)
    paths = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[12:18]
    texts = [path.read_text(errors="ignore")[:1200] for path in paths]
    texts.append(
        "caf\u00e9 e\u0301t\u00e9 \u65e5\u672c\u8a9e \U0001f600 it's <|im_start|>x 12345\n"
    )
    for text in texts:
        for how, cut in ((0, 0), (1, 5), (2, 11)):
            _check_prefixes(states, _split(tokenizer, text, how, cut))
    # A mark written after its letter as a token of its own (the text is no longer NFC).
    marked = [_split(tokenizer, t, 0, 0) for t in ("x = cafe", "\u0301", "\u0323", " ok")]
    _check_prefixes(states, marked[0] + marked[1] + marked[3])
    _check_prefixes(states, marked[0] + marked[2] + marked[1])
    ways = {way: taken.count(way) for way in ("starts", "goes on", "read")}
    assert ways["starts"] >= 0.3 * len(taken) and ways["goes on"] >= 0.1 * len(taken), ways
    assert ways["read"] <= 0.1 * len(taken), ways  # 1-2% here


def _lone_starts(
    states: RowStates,
    rows: list[list[int]],
    candidates: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[int, int]:
    """Every prefix of ``rows`` read as one token's chunk alone (advanced from the prefix one
    token shorter where it can be, as a step reads it), advanced by its next token and by
    ``candidates(tail)``, and the first three reads so made of a candidate's chunk alone
    advanced by ``candidates`` again (a candidate that is not its own BPE is a row's last token only so):
    the same read with the shapes' shortcut
    (:class:`~memfree.core.row_tail.LoneStarts`) as without it. How many advances were
    compared, and how many the shortcut answered."""
    lone = states._lone
    assert lone is not None
    answered = []
    starts = lone.starts

    def counted(*given: Any) -> bool:
        found = starts(*given)
        answered.append(found)
        return found

    monkeypatch.setattr(lone, "starts", counted)
    compared = 0
    for ids in rows:
        read = _read(states, ids[:1])
        for length in range(1, len(ids)):
            if length > 1:  # as a step does: advanced from the row one token shorter
                read = states.advance(*read, ids[length - 1]) or _read(states, ids[:length])
            key, tail = read
            if tail is None or tail.last != (0, 0) or len(tail.tokens) != 1 or key[2]:
                continue
            reads = [(ids[:length], key, tail)]
            for row, key, tail in reads:  # and the reads it gives, one level deeper
                for token in [*([ids[length]] if len(reads) == 1 else []), *candidates(tail)]:
                    found = states.advance(key, tail, token)
                    with monkeypatch.context() as plain:
                        plain.setattr(states, "_lone", None)
                        expected = states.advance(key, tail, token)
                    assert found == expected, (row, token, found, expected)
                    compared += 1
                    if (
                        len(reads) < 4
                        and len(row) == length
                        and found
                        and found[1].tokens == (token,)
                    ):
                        reads.append(([*row, token], *found))
    return compared, sum(answered)


def drawn_tokens(tokenizer: Any, states: RowStates, seed: int = 7) -> Any:
    """``candidates`` for :func:`_lone_starts` over a large vocabulary: after each row, tokens
    drawn at random and among those where the shapes' shortcut must step aside or could go
    wrong: tokens that begin with the row's last character (a run of one class across the
    boundary), hold an apostrophe, are not their own BPE (a fact that fails), begin with a
    combining mark, or hold an added token's first character."""
    rng = random.Random(seed)
    texts = states.bpe.texts
    split = states.split
    assert split is not None
    by_first: dict[str, list[int]] = {}
    kinds: dict[str, list[int]] = {"'": [], "mark": [], "added": []}
    firsts = {content[0] for content in states.bpe.added if content}
    for token, text in enumerate(texts):
        if not text:
            continue
        by_first.setdefault(text[0], []).append(token)
        if "'" in text:
            kinds["'"].append(token)
        if unicodedata.combining(text[0]):
            kinds["mark"].append(token)
        if firsts.intersection(text):
            kinds["added"].append(token)
    kinds["not BPE"] = np.flatnonzero(~split.alone & (split.shape_of >= 0)).tolist()

    def candidates(tail: Any) -> list[int]:
        found: list[int] = []  # those not their own BPE first: the next level reads them
        for group in [kinds["not BPE"], by_first.get(tail.text[-1], []), *kinds.values()]:
            found += rng.sample(group, min(6, len(group)))
        return found + [rng.randrange(len(texts)) for _ in range(8)]

    return candidates


def test_a_lone_chunk_advanced_from_its_shapes_equals_its_text_read(
    family: tuple[Any, CanonicalMasker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A split pattern's row whose last chunk is one token alone, and a token that starts a
    chunk after it: the next read comes from the state and the two shapes (no text read, no
    new row shape). Along real code and text with marks, CJK, contractions and an added
    token's content, written canonically and split otherwise, and for drawn tokens and
    whitespace, punctuation and apostrophes after every such row, it equals the read from
    the text, and it answers a good part of them (GPT-2's pattern read as a split pattern has
    no reach: no row reads as its last chunk alone there)."""
    tokenizer, masker = family
    states = masker.states
    if states.split is None:
        pytest.skip("GPT-2's rules: rows advance by spots")
    paths = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[18:22]
    texts = [path.read_text(errors="ignore")[:800] for path in paths]
    texts.append("caf\u00e9 e\u0301t\u00e9 \u65e5\u672c it's <|im_start|>x 12345 \n\n'll\n")
    rows = [_split(tokenizer, t, how, cut) for t in texts for how, cut in ((0, 0), (2, 3))]
    rng = random.Random(7)
    extra = [tokenizer.convert_tokens_to_ids(t) for t in ("'", "Ġ", "Ċ", "s", "(", "1")]
    extra = [t for t in extra if t is not None and t != tokenizer.unk_token_id]
    size = states.bpe.vocab_size
    compared, answered = _lone_starts(
        states, rows, lambda tail: extra + [rng.randrange(size) for _ in range(24)], monkeypatch
    )
    assert compared >= 300, compared
    if states.split._reach is not None:  # else no row reads as its last chunk alone
        assert answered >= 0.2 * compared, (compared, answered)


def check_lone_starts(tokenizer: Any, masker: CanonicalMasker, monkeypatch: Any) -> None:
    """:func:`_lone_starts` on a real vocabulary: along real code and text with contractions,
    marks, CJK, digits and an added token's content, with :func:`drawn_tokens` after each
    row; the shortcut answers a good part of the advances."""
    states = masker.states
    paths = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[22:24]
    texts = [path.read_text(errors="ignore")[:600] for path in paths]
    texts.append("It's HE'S we'Re  caf\u00e9 cafe\u0301 \u65e5\u672c x<|im_start|>y 12345 'll\n")
    rows = [_split(tokenizer, t, how, cut) for t in texts for how, cut in ((0, 0), (2, 5))]
    compared, answered = _lone_starts(states, rows, drawn_tokens(tokenizer, states), monkeypatch)
    assert compared >= 1000 and answered >= 0.1 * compared, (compared, answered)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    text=_texts(PIECES + SPLIT_PIECES + SPECIAL_PIECES + ["<|end_of_text|>", "<|eot", "''ll"]),
    how=st.integers(0, 3),
    cut=st.integers(0, 10_000),
)
def test_a_lone_chunk_advanced_by_every_token_equals_its_text_read(
    family: tuple[Any, CanonicalMasker],
    monkeypatch: pytest.MonkeyPatch,
    text: str,
    how: int,
    cut: int,
) -> None:
    """The same over Hypothesis texts (contractions, runs of one class, added tokens' contents
    whole, begun and spelled), every token of the trained vocabularies after every row read as
    one token's chunk alone."""
    tokenizer, masker = family
    states = masker.states
    if states.split is None or states._lone is None or states.split._reach is None:
        pytest.skip("no row reads as its last chunk alone")
    every = range(states.bpe.vocab_size)
    with monkeypatch.context() as patched:
        _lone_starts(states, [_split(tokenizer, text, how, cut)], lambda tail: every, patched)


def _expected(masker: CanonicalMasker, row: list[int], width: int) -> np.ndarray:
    """A row's banned candidates read afresh, without the step's memory or its table."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        allowed = masker.allowed(row)
        may_end = masker.may_end(row)
    banned = np.ones(width, dtype=bool)
    banned[: len(allowed)] = ~allowed
    if may_end:
        banned[list(masker.end_token_ids)] = False
    return banned


_FRESH: dict[tuple[int, int, bytes], tuple[np.ndarray, Any]] = {}


@pytest.mark.parametrize("copy", [False, True], ids=["host-table", "device-copy"])
def test_the_step_over_growing_reordered_and_new_rows_equals_a_fresh_read(
    family: tuple[Any, CanonicalMasker], copy: bool
) -> None:
    """Rows grow by the text's next token or by a random allowed one; between steps they are
    reordered (beams) and one is replaced (a finished request's place taken); the table of
    states holds fewer rows than a step needs (it must grow, not give up a row in use). With
    ``copy`` the rows are gathered from the table's copy on the scores' device (what a CUDA
    step does; here the device is the CPU), which receives only the rows of new states."""
    tokenizer, base = family
    masker = CanonicalMasker(base.info, base.end_token_ids, _split=base.split is not None)
    masker.table.capacity = 2  # fewer rows than a step's states: it grows, and drops old ones
    masker.table.mirror_always = copy
    sent = 0
    width = masker.bpe.vocab_size + 3  # ids past the vocabulary: banned, as without memory
    texts = [
        "def f(x):\n\n    return x  + 1\n\n\nclass A:\n\tpass",
        "It's a test.\n\nThe end -- they'll see 12345 and 3.14!",
        "Hello\n\nWorld  \n \n  x\u00a0y 日本語 😀 café",
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nOk",
        "if x:\n    y = [1, 2]  # done\n\n\n\ndef g(): pass",
    ]
    rng = random.Random(0)
    live = [(_split(tokenizer, t, 0, 0), 4) for t in texts]
    rows = [source[:4] for source, _ in live]
    for step in range(24):
        if step % 5 == 4:  # beams reordered: rows move to other places
            order = list(range(len(rows)))
            rng.shuffle(order)
            live, rows = [live[i] for i in order], [rows[i] for i in order]
        if step % 7 == 6:  # a finished request's place taken by a new one
            source = _split(tokenizer, texts[step % len(texts)][::-1], 0, 0)
            live[0], rows[0] = (source, 0), source[: 3 + step % 4]
        length = max(map(len, rows))
        batch = torch.tensor([[-1] * (length - len(r)) + r for r in rows])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            banned, _, pending = masker.step(batch, width)
        # The reference read afresh (a new masker; each row alone), once for both variants:
        # their rows are the same step after step.
        key = (id(base), step, batch.numpy().tobytes())
        if key not in _FRESH:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                _, _, fresh_pending = CanonicalMasker(
                    masker.info, masker.end_token_ids, _split=masker.split is not None
                ).step(batch, width)
            _FRESH[key] = (np.stack([_expected(masker, row, width) for row in rows]), fresh_pending)
        expected, expected_pending = _FRESH[key]
        assert np.array_equal(banned.numpy(), expected), step
        assert pending == expected_pending, step
        sent += masker.sent
        for index, row in enumerate(rows):
            source, _ = live[index]
            allowed = np.flatnonzero(~expected[index, : masker.bpe.vocab_size])
            if source[: len(row)] == row and len(source) > len(row) and rng.random() < 0.7:
                row.append(source[len(row)])
            elif allowed.size:
                row.append(int(rng.choice(allowed)))
            else:
                row.append(int(rng.randrange(masker.bpe.vocab_size)))
    if copy:  # the indexes every step, and the rows of new states (here almost every row)
        assert len(rows) * 8 * 24 < sent <= len(rows) * ((width + 7) // 8 + 8) * 24


def test_the_device_copy_receives_only_new_states(
    default_tokenizer: Any, smol_masker: CanonicalMasker
) -> None:
    """Asked again for rows whose states it holds, the step sends only their table indexes."""
    masker = CanonicalMasker(smol_masker.info, smol_masker.end_token_ids)
    masker.table.mirror_always = True
    rows = [_split(default_tokenizer, text, 0, 0)[-2:] for text in ("Hello world", "x = 1\n")]
    batch = torch.tensor(rows)
    width = masker.bpe.vocab_size
    first, _, _ = masker.step(batch, width)
    assert masker.sent == 2 * ((width + 7) // 8) + 2 * 8  # packed: 8 candidates a byte
    again, _, _ = masker.step(batch, width)
    assert masker.sent == 2 * 8
    assert torch.equal(first, again)


def test_the_device_copy_serves_steps_inside_and_outside_inference_mode(
    default_tokenizer: Any, smol_masker: CanonicalMasker
) -> None:
    """generate() steps inside ``torch.inference_mode``; a direct call after it (a benchmark, a
    server's own step) does not. Found on an H100: the device copy made inside was an inference
    tensor, and the next step outside could not add a new state's row to it."""
    masker = CanonicalMasker(smol_masker.info, smol_masker.end_token_ids)
    masker.table.mirror_always = True  # the path every CUDA step takes
    width = masker.bpe.vocab_size
    rows = [_split(default_tokenizer, t, 0, 0)[-2:] for t in ("Hello world", "x = 1\n", "a b")]
    with torch.inference_mode():
        inside, _, _ = masker.step(torch.tensor(rows[:2]), width)
    outside, _, _ = masker.step(torch.tensor(rows[1:]), width)  # a new state's row goes over
    assert masker.sent == (width + 7) // 8 + 2 * 8
    with torch.inference_mode():
        again, _, _ = masker.step(torch.tensor(rows), width)
    expected = np.stack([_expected(masker, row, width) for row in rows])
    assert np.array_equal(inside.numpy(), expected[:2])
    assert np.array_equal(outside.numpy(), expected[1:])
    assert np.array_equal(again.numpy(), expected)


@pytest.mark.parametrize("parts", [1, 2, 3])
def test_a_step_writes_into_the_last_steps_mask_only_when_no_one_holds_it(
    default_tokenizer: Any,
    smol_masker: CanonicalMasker,
    parts: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On the CPU a step writes its mask into the last step's array (a new one would cost a
    page fault every 4 KiB), but only where nothing holds that array any more: a mask kept by
    the caller, as a tensor or a numpy view, keeps its answer; one let go is written over. The
    same with the rows unpacked in parts by several threads (a large step's)."""
    monkeypatch.setattr(state_table, "_PART", 1)
    monkeypatch.setattr(state_table, "_WIDE_ROW", 1)  # SmolLM2's rows split too
    monkeypatch.setattr(row_threads, "step_threads", lambda: parts)
    masker = CanonicalMasker(smol_masker.info, smol_masker.end_token_ids)
    width = masker.bpe.vocab_size
    texts = ("Hello world", "x = 1\n", "a b", "def f():\n    return")
    rows = [_split(default_tokenizer, t, 0, 0)[-2:] for t in texts]
    first_rows, second_rows = torch.tensor(rows[:2]), torch.tensor(rows[2:])
    first, _, _ = masker.step(first_rows, width)
    view = first.numpy()[0]  # a view alone keeps the array too
    expected_first = np.stack([_expected(masker, row, width) for row in rows[:2]])
    expected_second = np.stack([_expected(masker, row, width) for row in rows[2:]])
    kept = weakref.ref(masker.table._dense)
    del first
    second, _, _ = masker.step(second_rows, width)
    assert masker.table._dense is not kept()  # the view holds the first array
    assert np.array_equal(view, expected_first[0])
    assert np.array_equal(second.numpy(), expected_second)
    kept = weakref.ref(masker.table._dense)
    del second
    third, _, _ = masker.step(first_rows, width)  # the second array, let go: written over
    assert masker.table._dense is kept()
    assert np.array_equal(third.numpy(), expected_first)
    assert np.array_equal(view, expected_first[0])


@pytest.mark.parametrize("copy", [False, True], ids=["host-table", "device-copy"])
def test_a_step_of_another_width_gets_a_table_of_its_own(
    default_tokenizer: Any, smol_masker: CanonicalMasker, copy: bool
) -> None:
    """Engines ask with the model's width, which may differ from the tokenizer's; a masker
    asked with one width, then another, then the first again, answers each as a fresh one."""
    masker = CanonicalMasker(smol_masker.info, smol_masker.end_token_ids)
    masker.table.mirror_always = copy
    masker.table.capacity = 2
    rows = [_split(default_tokenizer, t, 0, 0)[-2:] for t in ("Hello world", "x = 1\n", "a b")]
    batch = torch.tensor(rows)
    size = masker.bpe.vocab_size
    for width in (size, size + 64, size, size + 64):
        banned, _, _ = masker.step(batch, width)
        expected = np.stack([_expected(masker, row, width) for row in rows])
        assert np.array_equal(banned.numpy(), expected), width


def follows_by_decoding(token_bytes: Any, segment: Any, at: int) -> str:
    """What follows ``segment[:at]`` as a prefix check reads it under NFC, by decoding: the next
    character and the combining marks after it."""
    import unicodedata

    data = b"".join(token_bytes[t] for t in segment[at : at + 8])
    text = data[:32].decode("utf-8", errors="ignore")
    end = 1
    while end < len(text) and unicodedata.combining(text[end]):
        end += 1
    return text[:end]


def test_what_follows_a_prefix_over_every_short_row_of_chosen_bytes() -> None:
    """A prefix check's key (``follows``: under NFC, the next character with the combining marks
    after it; an ASCII character followed by another is answered without decoding) over every row of one to three tokens drawn from byte strings no real
    vocabulary holds together (an empty token, an ASCII character then a mark's bytes in one
    token, a mark's bytes split over two tokens), NFC on and off: the ASCII path's answer is
    the decoding's."""
    import itertools
    from types import SimpleNamespace

    from memfree.core.row_prefix import PrefixChecks

    chosen = [
        b"", b"a", b"ab", b"a ", b"a\xcc\x81", b"a\xcc", b"\xcc\x81", b"\x81", b"\xcc", b"e",
        b"\xc3\xa9", b"\xe6\x97\xa5", b" ", b"\n", b"a\xc3\xa9", b"'",
    ]  # fmt: skip

    checked = 0
    for nfc in (True, False):
        states = SimpleNamespace(_bytes=chosen, bpe=SimpleNamespace(nfc=nfc))
        for size in (1, 2, 3):
            for segment in itertools.product(range(len(chosen)), repeat=size):
                for at in range(size):
                    got = PrefixChecks.follows(states, list(segment), at)  # type: ignore[arg-type]
                    if not nfc and len(chosen[segment[at]]) == 1 and chosen[segment[at]].isascii():
                        assert got == segment[at]  # the token itself, without NFC
                    else:
                        assert got == follows_by_decoding(chosen, segment, at), (segment, at, nfc)
                    checked += 1
    assert checked > 20_000
