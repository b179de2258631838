"""Canonical decoding over Llama 3's real vocabulary (128,000 byte-level BPE tokens, 280,147 merges).

The ranks are ``llama3/tokenizer.model`` from the PyPI package ``llama-models`` (Meta's own,
installed by ``make setup`` with ``--no-deps``; no model hub). The tokenizer is built by
transformers' own ``TikTokenConverter``, the converter that wrote Llama 3's ``tokenizer.json``:
a merge for every split of a token into two tokens (so ``"ĠĠĠĠ"`` is made by three merges, and
some merges have parts made by later merges), ``ignore_merges``, Llama 3's split pattern, its
256 special tokens. Checked first against the rank BPE tiktoken runs (the reference Llama 3 was
trained with) and Llama 3's published ids.

The merge-tree test (:meth:`~memfree.vocab.bpe.ByteLevelBpe.bigram_allowed`) is checked pair by
pair against the merges themselves, where the converted merges make it hard (merges whose parts
are made later; tokens with a later-made node on a spine); then rows against the definition for
every one of the 128,256 candidates.
"""

from __future__ import annotations

import base64
import importlib.resources
import json
import pickle
import string
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree.core.canonical import CanonicalMasker
from memfree.vocab.bpe import ByteLevelBpe
from memfree.vocab.info import TokenizerInfo
from memfree.vocab.token_bytes import byte_level_chars
from tests.memfree.core.test_canonical import PIECES, _check_rows, _encode, _split, _texts
from tests.memfree.core.test_canonical_advance import _check_prefixes
from tests.memfree.core.test_canonical_split import SPLIT_PIECES

pytest.importorskip("llama_models", reason="needs llama-models (make setup installs it)")

_SPECIAL = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|image|>",
]


def _ranks() -> dict[bytes, int]:
    resource = importlib.resources.files("llama_models") / "llama3" / "tokenizer.model"
    ranks = {}
    for line in resource.read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def llama3_tokenizer() -> Any:
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = _ranks()

    class _Converter(TikTokenConverter):  # type: ignore[misc]
        @staticmethod
        def load_tiktoken_bpe(tiktoken_url: str) -> dict[bytes, int]:
            return ranks  # the ranks file read above (transformers would need tiktoken)

    backend = _Converter(vocab_file="tokenizer.model").converted()
    names = _SPECIAL + [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(_SPECIAL))]
    backend.add_special_tokens([AddedToken(n, special=True, normalized=False) for n in names])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"
    )


_NONE = 1 << 62  # no such token


def _tiktoken_encode(tokenizer: Any, ranks: dict[bytes, int], text: str) -> list[int]:
    """tiktoken's algorithm: each chunk of the split pattern, a whole token if it is one, else
    its bytes merged pair by pair, the pair whose join has the lowest rank first."""
    byte_of = {char: byte for byte, char in byte_level_chars().items()}
    ids = []
    for piece, _ in tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text):
        raw = bytes(byte_of[c] for c in piece)
        parts = [raw] if raw in ranks else [bytes([b]) for b in raw]
        while len(parts) > 1:
            joins = [(ranks.get(parts[i] + parts[i + 1], _NONE), i) for i in range(len(parts) - 1)]
            rank, at = min(joins)
            if rank == _NONE:
                break
            parts[at : at + 2] = [parts[at] + parts[at + 1]]
        ids.extend(ranks[p] for p in parts)
    return ids


_MULTILINGUAL = (
    "Xin chào, tôi là một nghiệp vụ. Bağlantılar çıkan araştırma yılında. Однако в качестве "
    "примера. 日本語のテキストしている。😀 ç'est l'été\n\n"
)


@pytest.fixture(scope="module")
def llama3() -> tuple[Any, CanonicalMasker]:
    tokenizer = llama3_tokenizer()
    # Llama 3's ids, as its published tokenizer gives them.
    assert _encode(tokenizer, "Hello world") == [9906, 1917]
    info = TokenizerInfo.of(tokenizer)
    return tokenizer, CanonicalMasker(info, [info.eos_token_id])


def test_the_built_tokenizer_is_llama3s(llama3: tuple[Any, CanonicalMasker]) -> None:
    tokenizer, _ = llama3
    ranks = _ranks()
    for text in (Path(textwrap.__file__).read_text()[:20_000], _MULTILINGUAL):
        assert _encode(tokenizer, text) == _tiktoken_encode(tokenizer, ranks, text)


@pytest.fixture(scope="module")
def merges(llama3: tuple[Any, CanonicalMasker]) -> tuple[ByteLevelBpe, Any, np.ndarray]:
    """The tables, the merges alone (a BPE model without ``ignore_merges``), and the tokens
    the merges make from their own bytes."""
    from tokenizers import models

    bpe = llama3[1].bpe
    spec = json.loads(llama3[0].backend_tokenizer.to_str())["model"]  # the tokenizer's own
    pairs = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in spec["merges"]]
    assert len(pairs) == 280_147  # as Llama 3's tokenizer.json
    model = models.BPE(spec["vocab"], pairs, ignore_merges=False)
    strings = {token: text for text, token in spec["vocab"].items()}
    made = np.array(
        [[t.id for t in model.tokenize(strings[i])] == [i] for i in range(len(strings))]
    )
    return bpe, model, np.flatnonzero(made)


def _bigram_by_model(model: Any, bpe: ByteLevelBpe, a: int, b: int) -> bool:
    strings = {token: text for text, token in bpe.model["vocab"].items()}
    return [t.id for t in model.tokenize(strings[a] + strings[b])] == [a, b]


def _hard_partners(
    bpe: ByteLevelBpe, a: int, made: set[int], rng: np.random.Generator
) -> list[int]:
    """Tokens ``b`` that a merge whose parts are made after it (an *early* merge, from the
    conversion) joins to ``a`` across the junction, and tokens with a later-made node on their
    left spine: where the ranks alone do not say when symbols stand together."""
    offsets, partner, rank = bpe.tree.partners
    member_offsets, member, _ = bpe.tree.members
    formed = bpe.tree.formed
    found: set[int] = set()
    for x, _ in bpe.tree.right_spine(a):
        for k in range(offsets[x], offsets[x + 1]):
            y = int(partner[k])
            if rank[k] < formed[x] or rank[k] < formed[y]:
                members = member[member_offsets[y] : member_offsets[y + 1]]
                if members.size:
                    found.update(rng.choice(members, min(4, members.size)).tolist())
    found.update(rng.choice(np.flatnonzero(bpe.tree.late[1]), 8).tolist())
    return [b for b in found if b in made][:60]


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1), late=st.booleans())
def test_the_merge_tree_test_is_the_merges_own_answer(
    merges: tuple[ByteLevelBpe, Any, np.ndarray], seed: int, late: bool
) -> None:
    """For a token ``a`` (one with a later-made node on its right spine, or any), the test says
    [a, b] exactly where the merges give [a, b] for the two tokens' bytes: for ``b`` joined to
    ``a`` by early merges, with late left spines, and at random."""
    bpe, model, made = merges
    rng = np.random.default_rng(seed)
    pool = np.flatnonzero(bpe.tree.late[0]) if late else made
    a = int(rng.choice(np.intersect1d(pool, made)))
    row = bpe.bigram_allowed(a)
    made_set = set(made.tolist())
    others = _hard_partners(bpe, a, made_set, rng) + rng.choice(made, 40).tolist()
    wrong = [b for b in others if bool(row[b]) != _bigram_by_model(model, bpe, a, int(b))]
    assert not wrong, (a, wrong[:5])


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(seed=st.integers(0, 2**32 - 1), late=st.booleans())
def test_the_runs_written_ahead_are_the_per_token_reading(
    merges: tuple[ByteLevelBpe, Any, np.ndarray], seed: int, late: bool
) -> None:
    """The merge-tree test read from the runs and the late columns written down ahead
    (:mod:`memfree.vocab.pair_ranges`) is the per-token reading of the merges, row, failures
    alone and single pair, for tokens with a late node on their left spine among the others; a
    token with a late node on its right spine is read from the merges either way (at build,
    or on use)."""
    import dataclasses

    bpe, _, made = merges
    tree = bpe.tree
    assert tree.ranges is not None and tree.late_pairs is not None
    rng = np.random.default_rng(seed)
    a = int(rng.choice(np.flatnonzero(tree.late[0]) if late else made))
    row = tree.bigram_allowed(a)
    per_token = dataclasses.replace(tree, ranges=None, late_pairs=None, late_rows=None)
    assert np.array_equal(row, per_token.bigram_allowed(a))
    if tree.late[0][a]:  # read from the merges at build: the row the tables' file keeps
        assert tree.late_rows is not None and a in tree.late_rows
        kept_row = pickle.loads(pickle.dumps(tree.late_rows))[a]
        assert np.array_equal(np.unpackbits(kept_row, count=tree.size).view(bool), row)
    # The failures alone (what the split reading takes out of a continued chunk): the row's.
    assert np.array_equal(np.sort(tree.joined(a)), np.flatnonzero(~row))
    if not tree.late[0][a]:
        assert np.array_equal(
            np.sort(tree.ranges.conflicts(a)), np.flatnonzero(tree.conflicts_by_spine(a))
        )
    # The late-left-spine columns read from the merges: those some merge joins to a's spine.
    owners, symbols = tree._late_left_spines
    offsets, partner, _ = tree.partners
    spine = [partner[offsets[x] : offsets[x + 1]] for x, _ in tree.right_spine(a)]
    near = np.unique(owners[np.isin(symbols, np.concatenate(spine))])
    assert np.array_equal(tree._late_near(a), near)
    if not tree.late[0][a]:  # written down ahead: the same columns, the merges' answers
        ahead, joins = tree.late_pairs.of(a)
        assert np.array_equal(ahead, near)
        assert np.array_equal(joins, ~per_token._bigram_by_merges(a, near))
        kept = pickle.loads(pickle.dumps(tree.late_pairs))  # as the tables' file keeps them
        assert all(np.array_equal(x, y) for x, y in zip(kept.of(a), (ahead, joins), strict=True))
    banned = np.flatnonzero(~row)
    others = [
        *near[:8].tolist(),
        *rng.choice(np.flatnonzero(tree.late[1]), 8).tolist(),
        *rng.choice(banned, min(8, banned.size)).tolist(),
        *rng.integers(0, tree.size, 8).tolist(),
    ]
    assert [tree.pair_allowed(a, int(b)) for b in others] == [bool(row[b]) for b in others]


def test_a_merge_whose_part_is_made_later(merges: tuple[ByteLevelBpe, Any, np.ndarray]) -> None:
    """``"'"`` then ``"ıydı"``: the merges give ``"'ı", "ydı"`` (the merge of "'" and "ı" comes
    before the one that, once "ydı" is made, joins "ı" to it), though that merge's rank is past
    the rank of "ıydı"'s own last merge."""
    bpe, model, _ = merges
    apostrophe, word = bpe.ids_of["'"], bpe.ids_of["ıydı"]
    assert not _bigram_by_model(model, bpe, apostrophe, word)
    assert not bpe.bigram_allowed(apostrophe)[word]


@pytest.mark.parametrize(("left", "right"), [("тери", "цин"), ("گیر", "داشت")])
def test_a_merge_across_the_junction_whose_part_is_gone_first(
    merges: tuple[ByteLevelBpe, Any, np.ndarray], left: str, right: str
) -> None:
    """A merge joins a symbol of ``left``'s right spine to one of ``right``'s left spine with a
    rank that comes before both are consumed, but one of them is made only after the other is
    gone (a part made by a later merge): the two never stand side by side, and the merges give
    ``[left, right]``. The ranks alone (the rule for trained vocabularies) would ban it."""
    bpe, model, _ = merges
    a, b = bpe.ids_of[left], bpe.ids_of[right]
    assert _bigram_by_model(model, bpe, a, b)
    assert bpe.bigram_allowed(a)[b]


@pytest.mark.parametrize(
    ("text", "how"),
    [
        ("def f(self, x):\n    return x.(bar) + 1234567\n", 0),
        ("It's HE'S we'Re  caf\u00e9 \u65e5\u672c\u8a9e\r\n", 2),
        (_MULTILINGUAL, 0),
        ("    return x  # 42\n\n    ", 1),
    ],
)
def test_llama3_allowed_iff_canonical_for_every_candidate(
    llama3: tuple[Any, CanonicalMasker], text: str, how: int
) -> None:
    tokenizer, masker = llama3
    ids = _split(tokenizer, text, how, 5)
    ends = sorted({1, len(ids) // 2, len(ids)})
    _check_rows(tokenizer, masker, [ids[:end] for end in ends])


def test_string_module_round_trips(llama3: tuple[Any, CanonicalMasker]) -> None:
    """Every prefix of a real text's tokenization is allowed step by step (the true next token
    is never banned) and ends where the text does."""
    tokenizer, masker = llama3
    text = Path(string.__file__).read_text()[:1500]
    ids = _encode(tokenizer, text)
    import torch

    for end in range(1, len(ids)):
        banned, _ = masker.banned_mask(torch.tensor([ids[:end]]), masker.info.vocab_size)
        assert not banned[0, ids[end]], (end, tokenizer.decode(ids[:end]))


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    text=_texts(PIECES + SPLIT_PIECES + ["тери", "цин", "ıydı", " nghiệp", "ĠĠĠĠ"]),
    how=st.integers(0, 2),
    cut=st.integers(0, 10_000),
)
def test_an_advanced_row_reads_as_the_whole_row(
    llama3: tuple[Any, CanonicalMasker], text: str, how: int, cut: int
) -> None:
    """A row one token longer than a row read is advanced from that read (a step reads only
    its last chunks): the same state and chunks as the whole row read afresh."""
    tokenizer, masker = llama3
    _check_prefixes(masker.states, _split(tokenizer, text, how, cut))


def test_real_texts_advance_as_they_read(llama3: tuple[Any, CanonicalMasker]) -> None:
    tokenizer, masker = llama3
    for text in (Path(string.__file__).read_text()[:2000], _MULTILINGUAL):
        assert _check_prefixes(masker.states, _encode(tokenizer, text)) > 0


@settings(max_examples=60, deadline=None)
@given(
    text=st.one_of(
        st.sampled_from(
            ["", " ", "s", "self", " def", "ĠĠ", "\n", "  ", "\U0010ffff", "x\U0010ffff"]
        ),
        st.text(st.sampled_from("ab eft \n.:_(0\u00e9\u65e5\U0010ffff"), max_size=6),
    )
)
def test_the_completions_a_continued_chunk_reads_are_a_scan_of_the_vocabulary(
    llama3: tuple[Any, CanonicalMasker], text: str
) -> None:
    """``ignore_merges`` gives a continued chunk that is itself a token that token, so a row's
    fixes ban the candidates whose text completes the chunk's into a token: found by a range
    of the sorted token texts (bisection), each entry's suffix read as arrays made ahead or
    entry by entry, here against a scan of every token's text, for the tokens and for the
    pseudo candidates."""
    from memfree.core import canonical_split

    _, masker = llama3
    split = masker.split
    assert split is not None
    cut = len(text)
    starting = [entry for entry, _ in split._sorted if entry.startswith(text)]
    tokens = [
        split.bpe.ids_of[entry[cut:]] for entry in starting if entry[cut:] in split.bpe.ids_of
    ]
    pseudo = [j for entry in starting for j in split._pseudo_of_text.get(entry[cut:], [])]
    before = canonical_split._FEW_ENTRIES
    try:
        for few in (0, 1 << 30):  # every range read as arrays, and entry by entry
            canonical_split._FEW_ENTRIES = few
            split._completions.clear()
            assert sorted(split._completing(text)) == sorted(tokens)
            assert sorted(split._completing(text, True)) == sorted(pseudo)
    finally:
        canonical_split._FEW_ENTRIES = before


def test_the_completions_read_the_same_after_unpickling(
    llama3: tuple[Any, CanonicalMasker],
) -> None:
    """The arrays ``_completing`` reads (each sorted text's suffixes) are not pickled, so not
    written to the tables' file: an unpickled split makes them again and reads the same
    completions, for the tokens and for the pseudo candidates."""
    import pickle

    _, masker = llama3
    split = masker.split
    assert split is not None
    copy = pickle.loads(pickle.dumps(split))
    assert "_suffixes" not in split.__getstate__()
    texts = ["", " ", "s", "e", " the", "in", "\n", "x", "'", "\U0010ffff", "ab", "Ġ"]
    for text in texts:
        for pseudo in (False, True):
            split._completions.clear()
            copy._completions.clear()
            assert copy._completing(text, pseudo) == split._completing(text, pseudo), text
    assert all(any(copy._completing(t, pseudo) for t in texts) for pseudo in (False, True))


def test_a_lone_chunk_advanced_from_its_shapes_equals_its_text_read(
    llama3: tuple[Any, CanonicalMasker], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row read as one token's chunk alone, advanced by a token that starts a chunk after
    it, from the shapes alone (:class:`~memfree.core.row_tail.LoneStarts`): the same read as
    from the text, on the real vocabulary."""
    from tests.memfree.core.test_canonical_advance import check_lone_starts

    check_lone_starts(*llama3, monkeypatch)
