"""Canonical decoding for split patterns read by shapes (memfree/core/canonical_split.py).

Byte-level BPE tokenizers built as Llama 3's (its split pattern: a punctuation mark joins the
word after it, digits in groups of three, contractions in any case; ``ignore_merges``), Qwen 2's
(single digits, an NFC normalizer) and Mistral Tekken's (letter runs split by case, marks in
words and punctuation runs, slashes after a punctuation run's newlines; ``ignore_merges``) are,
trained here (their real vocabularies: test_canonical_llama3.py, test_canonical_qwen.py,
test_canonical_tekken.py). Checked with Hypothesis against the definition for every candidate,
as for GPT-2's pattern in test_canonical.py; and the same reading run over SmolLM2's tokenizer
must agree with the definition too.

The rule is the extendable one, as for GPT-2's pattern: a whitespace character after a whitespace
run is allowed where the run's split reading (before a character that is not whitespace) keeps the
row a prefix of the tokenization (``"x  1"`` is ``x, " ", " ", 1``), and end of sequence is not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree.core.canonical import CanonicalMasker
from memfree.engines.transformers import MemFreeLogitsProcessor
from memfree.vocab.bpe import CanonicalUnsupportedError
from memfree.vocab.info import TokenizerInfo
from tests.conftest import LLAMA3_PATTERN, train_split_bpe
from tests.memfree.core.test_canonical import (
    PIECES,
    SPECIAL_PIECES,
    _check_rows,
    _encode,
    _filter_for,
    _split,
    _texts,
    check_both_ways,
    check_spelled_added,
)

SPLIT_PIECES = [
    "(self",
    "x.(bar",
    "1234567",
    "HE'S",
    "don'T",
    "'Re",
    ".\n\n",
    "  \r\n",
    "),\n",
    " ?!",
    "_name",
    "\u00e1",
    "\u0301",
    "HTTPServer",
    "camelCase",
    "\u00c9COLE",
    "://a/b//",
    ";\n/",
    "\u0627\u064b",
    "\u01c5x",
]
_SPLIT_EXAMPLES = 36  # per family; each example checks every prefix against the definition


@pytest.fixture(scope="module", params=["llama3", "qwen2", "tekken", "o200k", "deepseek3"])
def family(request: pytest.FixtureRequest) -> tuple[Any, CanonicalMasker]:
    tokenizer = train_split_bpe(request.param)
    info = TokenizerInfo.of(tokenizer)
    masker = CanonicalMasker(info, [info.eos_token_id])
    assert masker.split is not None  # read through the pre-tokenizer, not GPT-2's rules
    return tokenizer, masker


@settings(max_examples=_SPLIT_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    # The trained tokenizers' own special tokens, whole and begun: spelled in plain tokens
    # where a row is cut inside one.
    text=_texts(PIECES + SPLIT_PIECES + SPECIAL_PIECES[:2] + ["<|eot_id|>", "<|eot"]),
    how=st.integers(0, 3),
    cut=st.integers(0, 10_000),
)
def test_split_patterns_allowed_iff_canonical_for_every_candidate(
    family: tuple[Any, CanonicalMasker], text: str, how: int, cut: int
) -> None:
    tokenizer, masker = family
    ids = _split(tokenizer, text, how, cut)
    check_both_ways(tokenizer, masker, [ids[:end] for end in range(len(ids) + 1)])


# Characters each pattern may treat apart: cases, a mark, letters that are neither case, a
# titlecase letter, a modifier letter, slashes, punctuation, the apostrophe and contraction
# letters, digits, whitespace.
_ALPHABET = "aAsStTeE\u00e9\u0627\u064b\u01c5\u02b0\u65e5\u3072\u30ab\ud55c/.'#_$+-\u30021\u0661 \n\r\t\u00a0"


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=st.text(alphabet=_ALPHABET, min_size=1, max_size=9))
def test_characters_of_one_class_are_interchangeable_for_the_pattern(
    family: tuple[Any, CanonicalMasker], text: str
) -> None:
    """The shapes stand on this: a text whose characters are each replaced by their class's
    representative is cut into chunks at the same places (so a class that merged two
    characters the pattern treats apart would show here; Tekken's letters of neither case are
    one such pair, told apart from "a" only after an uppercase letter)."""
    assert_cut_like_its_classes(family[1], text)


def assert_cut_like_its_classes(masker: CanonicalMasker, text: str) -> None:
    """``text`` and its stand-in (each character replaced by its class's representative) are
    cut into chunks at the same places by the masker's pre-tokenizer."""
    split = masker.split
    assert split is not None
    pre = masker.bpe.tokenizer_backend.pre_tokenizer
    stand_in = "".join(split._reps[split.char_class(c)] for c in text)
    assert [span for _, span in pre.pre_tokenize_str(text)] == [
        span for _, span in pre.pre_tokenize_str(stand_in)
    ], (text, stand_in)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=st.text(alphabet=_ALPHABET, max_size=8))
def test_a_row_shapes_groups_are_each_candidate_shapes_reading(
    family: tuple[Any, CanonicalMasker], text: str
) -> None:
    """A new row shape reads every candidate shape after it (inlined for speed): each
    candidate's group is its reading's (``_reading``: where its chunk starts, the boundaries in
    the row; none where it crosses one), numbered in the order first met."""
    split = family[1].split
    assert split is not None
    shape = split._shape(text, token=False)[0]
    split._groups.pop(shape, None)
    groups = split.groups(shape)
    row = "".join(split._reps[c] for c in shape)
    numbers: dict[Any, int] = {}
    for index, candidate in enumerate(split._shape_texts):
        reading = split._reading(row, candidate, "")
        expected = -1 if reading is None else numbers.setdefault(reading[:2], len(numbers))
        assert groups.of_shape[index] == expected, (row, candidate)
        if row[-1:].isspace() and len(candidate) == 1 and candidate.isspace():
            for after in split._after_space():  # a run's split reading: its groups too
                other = split._reading(row, candidate, after)
                if other is not None:
                    numbers.setdefault(other[:2], len(numbers))
    assert groups.groups == tuple(numbers)
    assert groups.of_shape[-1] == -1  # candidates without a shape: in no group


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=st.text(alphabet=_ALPHABET, min_size=1, max_size=12) | _texts(PIECES + SPLIT_PIECES))
def test_the_chunks_are_read_without_the_byte_mapping_as_with_it(
    family: tuple[Any, CanonicalMasker], text: str
) -> None:
    """The shapes' readings run the pre-tokenizer without its last ``ByteLevel`` step (it moves
    no boundary): the same spans as the tokenizer's own pre-tokenizer."""
    split = family[1].split
    assert split is not None
    own = family[1].bpe.tokenizer_backend.pre_tokenizer
    assert split._pre is not own  # the byte mapping was dropped
    assert [span for _, span in split._pre.pre_tokenize_str(text)] == [
        span for _, span in own.pre_tokenize_str(text)
    ]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    text=st.text(alphabet=_ALPHABET + "\u0301\u00e9e", min_size=1, max_size=12)
    | _texts(PIECES + SPLIT_PIECES + SPECIAL_PIECES + ["<|eot_id|>", "<|end_of_text|>"])
)
def test_a_texts_ids_read_from_its_chunks_are_the_tokenizers(
    family: tuple[Any, CanonicalMasker], text: str
) -> None:
    """A row's text tokenized from its chunks' BPE (each chunk's kept) is the tokenizer's own
    tokenization wherever it is read so: wherever the text holds no added token's content and
    normalizing would not change it. Elsewhere the tokenizer itself reads it."""
    tokenizer, masker = family
    split = masker.split
    assert split is not None
    expected = _encode(tokenizer, text)
    ids = split.chunk_ids(text)
    added = any(content in text for content in masker.bpe.added)
    changed = tokenizer.backend_tokenizer.normalizer is not None and (
        tokenizer.backend_tokenizer.normalizer.normalize_str(text) != text
    )
    assert (ids is None) == (added or changed)  # read from the chunks wherever it may be
    assert split.encode(text) == expected
    if ids is not None:
        assert ids == expected


@pytest.mark.parametrize(
    "text",
    [
        "def f(self, x):\n    return x.(bar) + 1234567\n\n",
        "It's HE'S we'Re they'LL i'M don'T",
        "a  \r\n\n  b\t\tc .\n\n(x",
        "caf\u00e9 cafe\u0301 \u65e5\u672c\u8a9e",
        "'''docstring'''",
        # A window of the row's last tokens that starts inside a run of digits would group them
        # from the wrong place (found by a long soak): every prefix of a long run.
        ".\n\n 4212345671234567890123456789012345678901234567890123 x",
    ],
)
def test_split_patterns_every_prefix_of_hard_texts(
    family: tuple[Any, CanonicalMasker], text: str
) -> None:
    tokenizer, masker = family
    ids = _encode(tokenizer, text)
    _check_rows(tokenizer, masker, [ids[:end] for end in range(len(ids) + 1)])


def test_a_boundary_known_in_one_row_is_not_trusted_inside_a_whitespace_run(
    family: tuple[Any, CanonicalMasker],
) -> None:
    """Found by a long soak: the prefix check restarted from a boundary found canonical in an
    earlier row ("  1" is " ", " ", "1": a boundary after the first space) inside this row's
    whitespace run ("   def" is "  ", " def", not " ", " ", " def")."""
    tokenizer, masker = family
    space = _encode(tokenizer, " ")
    first = _encode(tokenizer, "  1")
    if first != space + space + _encode(tokenizer, "1"):  # DeepSeek V3 splits digits off first
        pytest.skip("this family keeps the spaces before a digit in one chunk")
    second = space + _encode(tokenizer, "  def f(x)")
    assert second[:2] == space + space and _encode(tokenizer, "   def f(x)") != second
    _check_rows(tokenizer, masker, [first[:end] for end in range(len(first) + 1)])
    _check_rows(tokenizer, masker, [second[:end] for end in range(len(second) + 1)])


def test_rows_that_end_in_the_same_settled_chunk_share_one_read(
    family: tuple[Any, CanonicalMasker],
) -> None:
    """Where no text appended moves the boundary before a row's last chunk and the chunk before
    it is its tokens' BPE, the row reads as its last chunk alone: rows with other words before
    the same last chunk share one read (their state, table row and transitions), read whole or
    advanced. A chunk before that is not its tokens' BPE stays in the read."""
    tokenizer, masker = family
    if masker.split is None or masker.split._reach is None:
        pytest.skip("a pre-tokenizer whose boundaries are not read (split_groups.py): two chunks")
    states = masker.states
    rows = [_encode(tokenizer, text) for text in ("foo(", "x = bar(", "1234 quux(")]
    reads = [states.read(ids) for ids in rows]
    assert reads[0][1] is not None and reads[0][1].text == "("
    assert all(read == reads[0] for read in reads)
    for ids, read in zip(rows, reads, strict=True):
        assert states.advance(*states.read(ids[:-1]), ids[-1]) == read
    spelled = [t for c in "foo" for t in _encode(tokenizer, c)] + _encode(tokenizer, "(")
    assert spelled != rows[0]  # "foo" is one token, or a few: not three
    _, tail = states.read(spelled)
    assert tail is None or tail.text == "foo("
    _check_rows(tokenizer, masker, [spelled])


@pytest.fixture(scope="module")
def smol_split(default_tokenizer: Any) -> tuple[Any, CanonicalMasker]:
    info = TokenizerInfo.of(default_tokenizer)
    return default_tokenizer, CanonicalMasker(info, [info.eos_token_id], _split=True)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=_texts(PIECES), how=st.integers(0, 2), cut=st.integers(0, 10_000))
def test_the_split_reading_agrees_with_the_definition_on_smollm2(
    smol_split: tuple[Any, CanonicalMasker], text: str, how: int, cut: int
) -> None:
    """GPT-2's pattern read the split way: a second, independent implementation."""
    tokenizer, masker = smol_split
    ids = _split(tokenizer, text, how, cut)
    _check_rows(tokenizer, masker, [ids[: len(ids) // 2], ids])


def test_a_split_pattern_tokenizer_is_guarded_canonically_by_default(tmp_path: Path) -> None:
    tokenizer = train_split_bpe("llama3")
    ids = _encode(tokenizer, "def f(self):\n    return 1234")
    guard = MemFreeLogitsProcessor(
        _filter_for(tokenizer, tmp_path / "f.memfree", [ids[:3]]), tokenizer
    )
    assert guard.canonical
    row = torch.tensor([ids[:2]])
    scores = guard(row, torch.zeros(1, len(tokenizer)))
    assert scores[0, ids[2]] == float("-inf")  # the stored 3-gram
    # Llama 3 groups digits by three: after "12", "3" completes the group, but "00" would
    # cross into the next one ("1200" is "120", "0"); after "123", "00" starts a new group.
    info = TokenizerInfo.of(tokenizer)
    for text, candidate, expected in (
        ("x = 12", "3", True),
        ("x = 12", "00", False),
        ("x = 123", "00", True),
        ("x = 123", "4", True),
    ):
        row = torch.tensor([_encode(tokenizer, text)])
        allowed = ~guard(row, torch.zeros(1, len(tokenizer)))[0].isinf()
        token = tokenizer.convert_tokens_to_ids(candidate)
        assert bool(allowed[token]) is expected, (text, candidate, info.decode([token]))


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda s: s.replace("{1,3}", "{1,4}"), "a split pattern other than"),
        (lambda s: s.replace('"ignore_merges":true', '"ignore_merges":false'), None),
    ],
)
def test_only_known_split_patterns_are_read(change: Any, problem: str | None) -> None:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer = train_split_bpe("llama3")
    spec = tokenizer.backend_tokenizer.to_str()
    assert LLAMA3_PATTERN.replace("\\", "\\\\") in spec
    changed = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(change(spec)), eos_token="<|end_of_text|>"
    )
    info = TokenizerInfo.of(changed)
    if problem is None:
        assert CanonicalMasker(info, [info.eos_token_id]).split is not None
        return
    with pytest.raises(CanonicalUnsupportedError, match=problem) as error:
        CanonicalMasker(info, [info.eos_token_id])
    assert "Llama 3" in str(error.value) and "word filter" in str(error.value)


# Found by an independent review (each fails without its fix).


def test_a_window_that_starts_inside_a_multibyte_digit_is_widened(
    family: tuple[Any, CanonicalMasker],
) -> None:
    tokenizer, masker = family
    ids = _encode(tokenizer, "x\u0663" + "1" * 15)  # an Arabic-Indic three, then ones
    _check_rows(tokenizer, masker, [ids[:end] for end in range(len(ids) + 1)])


def test_a_prefix_verdict_is_kept_per_next_character_not_per_next_byte() -> None:
    """Two rows share a prefix and the next token (the first byte of a 3-byte character) but
    not the character: the verdict of one must not answer the other, in either order."""
    from memfree.vocab.token_bytes import byte_level_chars

    tokenizer = train_split_bpe("llama3")
    spelled = byte_level_chars()
    first = _encode(tokenizer, "a  \u3000b.")
    byte_ids = [tokenizer.convert_tokens_to_ids(spelled[b]) for b in "\u3007".encode()]
    assert first[2] == byte_ids[0]  # "\u3000" and "\u3007" are written byte by byte here
    second = first[:2] + byte_ids + _encode(tokenizer, ".")
    for order in ((first, second), (second, first)):
        info = TokenizerInfo.of(tokenizer)
        masker = CanonicalMasker(info, [info.eos_token_id])
        _check_rows(tokenizer, masker, list(order))


def test_an_added_token_follows_only_a_row_that_is_its_own_tokenization() -> None:
    tokenizer = train_split_bpe("llama3")
    tokenizer.add_tokens(["<file_sep>"])  # added, not special: the tokenizer cuts text at it
    info = TokenizerInfo.of(tokenizer)
    masker = CanonicalMasker(info, [info.eos_token_id])
    split = _encode(tokenizer, "it") + _encode(tokenizer, "'") + _encode(tokenizer, "s")
    assert split != _encode(tokenizer, "it's")
    _check_rows(tokenizer, masker, [_encode(tokenizer, "it's"), split])


def test_split_maskers_pickle_with_empty_caches(family: tuple[Any, CanonicalMasker]) -> None:
    import pickle

    tokenizer, masker = family
    ids = _encode(tokenizer, "def f(x):\n    return 1234")
    copy = pickle.loads(pickle.dumps(masker))
    assert (copy.allowed(ids) == masker.allowed(ids)).all()


@pytest.mark.parametrize("after", ["", " = 1"])
def test_a_row_that_spells_an_added_token_is_not_canonical(
    family: tuple[Any, CanonicalMasker], after: str
) -> None:
    """As for GPT-2's rules (test_canonical.py): read whole, advanced, or read whole after a
    beginning of the content, a row that spells a special token in plain tokens is dead."""
    tokenizer, masker = family
    check_spelled_added(
        tokenizer,
        lambda: CanonicalMasker(masker.info, list(masker.end_token_ids)),
        "<|eot_id|>",
        after,
    )


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    before=_texts(PIECES + SPLIT_PIECES),
    after=_texts(PIECES + SPLIT_PIECES),
    cut=st.integers(0, 10_000),
)
def test_rows_that_spell_a_special_token_amid_text(
    family: tuple[Any, CanonicalMasker], before: str, after: str, cut: int
) -> None:
    """A special token's content spelled in plain tokens amid other text, every prefix both
    ways, by the family's masker (which keeps what it met in earlier rows)."""
    tokenizer, masker = family
    content = "<|eot_id|>"
    at = 1 + cut % (len(content) - 1)
    ids = _encode(tokenizer, before + content[:at])
    ids += _encode(tokenizer, content[at:] + after)
    check_both_ways(tokenizer, masker, [ids[:end] for end in range(len(ids) + 1)])
