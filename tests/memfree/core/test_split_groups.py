"""A row shape's groups read from its last chunk alone (memfree/core/split_groups.py).

:class:`SplitReach` says where no appended text can move a text's chunk boundaries; there a row
shape's groups are its last chunk's, shifted. Checked against the tokenizer's own pre-tokenizer:
the boundaries it calls settled stay under appended text (Hypothesis, every family's pattern);
the shifted groups equal the groups read whole; and patterns it cannot read get no reach.
The candidates' groups against the definition: test_canonical_split.py (which now reads
shifted groups too) and the split families' tests.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memfree.core.canonical import CanonicalMasker
from memfree.core.canonical_split import SplitChunks
from memfree.core.split_groups import Groups, SplitReach, splits_only
from memfree.vocab.info import TokenizerInfo
from tests.conftest import train_split_bpe
from tests.memfree.core.test_canonical_split import _ALPHABET

_READ = ["llama3", "qwen2", "tekken", "o200k"]  # one isolating split each: a reach


@pytest.fixture(scope="module", params=_READ)
def split(request: pytest.FixtureRequest) -> SplitChunks:
    info = TokenizerInfo.of(train_split_bpe(request.param))
    masker = CanonicalMasker(info, [info.eos_token_id])
    assert masker.split is not None and masker.split._reach is not None
    return masker.split


def _starts(split: SplitChunks, text: str) -> list[int]:
    return [span[0] for _, span in split._pre.pre_tokenize_str(text)]


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    text=st.text(alphabet=_ALPHABET, min_size=1, max_size=10),
    after=st.lists(st.text(alphabet=_ALPHABET, min_size=1, max_size=6), min_size=1, max_size=8),
)
def test_settled_boundaries_stay_whatever_follows(
    split: SplitChunks, text: str, after: list[str]
) -> None:
    """Where the reach calls a text's boundaries settled, every appended text leaves them (and
    the last chunk's start) where they are, and the chunks from the last start on are those of
    the last chunk and the appended text alone."""
    assert split._reach is not None
    starts = _starts(split, text)
    if not split._reach.settled(text, starts):
        return
    for more in after:
        longer = _starts(split, text + more)
        last = starts[-1]
        assert [s for s in longer if s <= last] == starts, (text, more)
        assert [s - last for s in longer if s >= last] == _starts(split, text[last:] + more)


@pytest.mark.parametrize(
    ("text", "settled"),
    [
        ("foo.", True),  # a word, then punctuation: the word's match read only the '.'
        ("x = ", True),
        ("a\n\n", True),
        ("\n   ", False),  # "\n   " + "\n" is one chunk: \s*[\r\n]+ reads to the end
        ("\n ", False),
        ("\n\n ", False),
    ],
)
def test_known_rows(split: SplitChunks, text: str, settled: bool) -> None:
    assert split._reach is not None
    starts = _starts(split, text)
    assert len(starts) > 1
    assert split._reach.settled(text, starts) is settled


def test_most_row_shapes_are_read_from_their_last_chunk(split: SplitChunks) -> None:
    """Not vacuous: over rows of code, most row shapes are settled and their groups, shifted
    from the last chunk's, equal the groups read whole; a row that is not settled is read
    whole."""
    rows = ["self.x", "foo(", " = 1", "x, y", "'s x", "a.b(", "\n\n\t", "if x:", "1+2", "\n  "]
    shifted = 0
    for text in rows:
        shape = split._shape(text, token=False)[0]
        split._groups.clear()
        found = split.groups(shape)
        shifted += len(split._groups) > 1  # the last chunk's groups were kept too
        _assert_same(found, _read_whole(split, shape))
    assert shifted >= 6


def _read_whole(split: SplitChunks, shape: tuple[int, ...]) -> Groups:
    """The shape's groups read through the pre-tokenizer for every candidate (no reach)."""
    reach, split._reach = split._reach, None
    try:
        split._groups.clear()
        return split.groups(shape)
    finally:
        split._reach = reach


def _assert_same(one: Groups, other: Groups) -> None:
    assert np.array_equal(one.of_shape, other.of_shape)
    assert one.groups == other.groups
    assert [g for g, _ in one.extra] == [g for g, _ in other.extra]
    for (_, a), (_, b) in zip(one.extra, other.extra, strict=True):
        assert np.array_equal(a, b)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_shifted_groups_equal_the_groups_read_whole(split: SplitChunks, data: Any) -> None:
    """Any row shape (classes drawn at random, whitespace runs included): the groups with the
    reach equal those read through the pre-tokenizer for every candidate shape."""
    classes = st.integers(0, len(split._reps) - 1)
    shape = tuple(data.draw(st.lists(classes, min_size=1, max_size=9)))
    split._groups.pop(shape, None)
    _assert_same(split.groups(shape), _read_whole(split, shape))


def test_unpickled_split_reads_its_reach_again(split: SplitChunks) -> None:
    again = pickle.loads(pickle.dumps(split))
    assert again._reach is not None and again._reach.pattern == split._reach.pattern  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "pattern",
    [
        r"^\s+|\w+",  # an anchor
        r"\w+$",
        r"\b\w+",  # a word boundary
        r"(?<=a)b|.",  # lookbehind
        r"(?>ab|a)c",  # an atomic group
        r"a++|.",  # possessive
        r"(?i)ab|.",  # a flag for the rest
        r"(?i:[a-z])+|.",  # a case-insensitive class
        r"(a)\1|.",  # a back reference
        r"\s+(?!\S\S)",  # a lookahead of two characters
        r"a{1,99}",  # a long bounded repetition
        r"[a[b]]",  # a class inside a class
        r"\s*|\w+",  # an empty match
        r"(?:a|)",
        r"ya{2}?z?b|.",  # Oniguruma reads "{2}?" as optional, not lazy
        r"x\pLy|.",  # "\pL" without braces is the letters "pL"
        r"a(?i:\x{df})|.",  # a case-insensitive character past ASCII, escaped
        r"(?:(?:(?:a{16}){16}){16}){16}",  # too large to unroll
    ],
)
def test_patterns_not_read_get_no_reach(pattern: str) -> None:
    from tokenizers import Regex, pre_tokenizers

    pre = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    assert SplitReach.of(pre) is None


@pytest.mark.parametrize("pattern", ["(ab", "ab)", "[ab", "a{2", "\\", "a|*"])
def test_patterns_the_parser_cannot_close_are_refused(pattern: str) -> None:
    with pytest.raises(ValueError):
        SplitReach(pattern)


def test_pre_tokenizers_other_than_one_isolating_split_get_no_reach() -> None:
    from tokenizers import Regex, pre_tokenizers

    deepseek = splits_only(train_split_bpe("deepseek3").backend_tokenizer.pre_tokenizer)
    assert SplitReach.of(deepseek) is None  # three splits in a sequence
    assert SplitReach.of(pre_tokenizers.Split(Regex(r"\s+"), behavior="removed")) is None
    assert SplitReach.of(pre_tokenizers.Split(" ", behavior="isolated")) is None  # a string
    assert SplitReach.of(pre_tokenizers.Whitespace()) is None


def test_a_character_a_fold_matches_for_two_is_never_settled() -> None:
    """``(?i:ss)`` matches ``ß``: the automaton tests one character per literal, so a text
    holding such a character is not settled, though a text without one is."""
    from tokenizers import Regex, pre_tokenizers

    reach = SplitReach.of(pre_tokenizers.Split(Regex(r"(?i:ss)|\p{L}|."), behavior="isolated"))
    assert reach is not None
    assert reach.settled("a.", [0, 1])
    assert not reach.settled("\u00df.", [0, 1])


@pytest.mark.parametrize(
    ("pattern", "text", "after"),
    [
        (r"a(?i:(?:s)s)b|.", "a\u00df", "b"),  # Oniguruma joins the literals across groups
        (r"a(?i:s{1}t)b|.", "a\ufb06", "b"),
        (r"a(?i:s(?:t))b|.", "a\ufb06", "b"),
        (r"(?i:'ss)|.", "x\u00df", ""),
    ],
)
def test_a_character_folding_to_several_is_never_settled(
    pattern: str, text: str, after: str
) -> None:
    """Under any case-insensitive group, a character whose full case folding is several
    characters may match several literals at once (whatever runs the parser recorded)."""
    from tokenizers import Regex, pre_tokenizers

    pre = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    reach = SplitReach.of(pre)
    assert reach is not None
    starts = [span[0] for _, span in pre.pre_tokenize_str(text)]
    if after:
        assert [span[0] for _, span in pre.pre_tokenize_str(text + after)] != starts
    assert not reach.settled(text, starts)


def test_escaped_code_points_are_read() -> None:
    r"""``\x9`` (one hex digit) is a tab, as Oniguruma reads it; the parser reads it, not fails."""
    from tokenizers import Regex, pre_tokenizers

    pre = pre_tokenizers.Split(Regex(r"\x9+|[^\x9]+"), behavior="isolated")
    reach = SplitReach.of(pre)
    assert reach is not None
    for text in ("a\t", "\ta", "ab\t\tc"):  # each chunk but the last stops inside the text
        starts = [span[0] for _, span in pre.pre_tokenize_str(text)]
        assert reach.settled(text, starts), text


def test_lookahead_inside_the_text_is_followed_exactly() -> None:
    r"""``\s+(?!\S)`` fails before a letter inside the text, so a whitespace run before a
    word is settled; ``\s*[\r\n]+`` reads a newline's run to the text's end, so a newline
    before spaces is not (``"\n  " + "\n"`` is one chunk)."""
    from tokenizers import Regex, pre_tokenizers

    pre = pre_tokenizers.Split(Regex(r"\s*[\r\n]+|\s+(?!\S)|\s+|\w+"), behavior="isolated")
    reach = SplitReach.of(pre)
    assert reach is not None
    for text, settled in (("  ab", True), ("\nab", True), ("a  ", True), ("\n  ", False)):
        starts = [span[0] for _, span in pre.pre_tokenize_str(text)]
        assert len(starts) > 1
        assert reach.settled(text, starts) is settled, text


def test_a_lookahead_at_the_end_is_never_settled() -> None:
    """A path whose lookahead stands at the text's end reads what follows, though nothing else
    of it is alive there: ``"ab" + "x"`` is one chunk."""
    from tokenizers import Regex, pre_tokenizers

    pre = pre_tokenizers.Split(Regex(r"ab(?!c)x|a|b"), behavior="isolated")
    reach = SplitReach.of(pre)
    assert reach is not None
    assert [span[0] for _, span in pre.pre_tokenize_str("ab")] == [0, 1]
    assert [span[0] for _, span in pre.pre_tokenize_str("abx")] == [0]
    assert not reach.settled("ab", [0, 1])
    assert reach.settled("ba", [0, 1])
