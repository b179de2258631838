"""Style transfers on tricky inputs: empty text, Unicode, code with strings and comments, and the
prompt/continuation boundary falling inside a word or a line."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eval.styles import (
    PAPER_STYLES,
    apply_style,
    available_styles,
    get_style,
    register_style,
)

CODE = """def add(a, b):  # add a and b
    text = "a + b"
    return _hidden + a + b + 0x1F + __init__
"""


def test_each_style_on_code() -> None:
    assert get_style("original")(CODE) == CODE
    assert get_style("upper")("naïve straße") == "NAÏVE STRASSE"
    assert get_style("lower")("ÀB") == "àb"
    assert get_style("two_spaces")("    x = f(a, b)\n") == "    x  =  f(a,  b)\n"
    assert get_style("python_comment")("a\nb") == "# a\n# b"
    assert get_style("c_comment")("a\n") == "// a\n// "
    assert get_style("tab_indent")("def f():\n        return 1\n  x") == (
        "def f():\n\t\treturn 1\n  x"
    )
    renamed = get_style("underscore_names")(CODE)
    assert renamed.splitlines() == [
        "def _add(_a, _b):  # add a and b",  # the comment is left alone
        '    _text = "a + b"',  # so is the string
        "    return _hidden + _a + _b + 0x1F + __init__",  # and _names, numbers, keywords
    ]


@pytest.mark.parametrize("name", list(PAPER_STYLES))
def test_empty_and_unicode_text(name: str) -> None:
    prompt, truth = apply_style(name, "", "")
    assert prompt + truth == get_style(name)("")
    prompt, truth = apply_style(name, "émoji 🎉 x = 1\n", "y = 2")
    assert "🎉" in prompt and "\ue000" not in prompt + truth
    assert truth.lower().lstrip("_#/ \t").startswith("y")


def test_the_boundary_inside_a_word_keeps_one_identifier() -> None:
    assert apply_style("underscore_names", "x = foo", "bar(1)") == ("_x = _foo", "bar(1)")
    assert apply_style("two_spaces", "a = ", "b + c") == ("a  = ", " b  +  c")
    assert apply_style("python_comment", "x = 1\ny", " = 2\nz") == ("# x = 1\n# y", " = 2\n# z")
    assert apply_style("lower+python_comment", "X\n", "Y") == ("# x\n# ", "y")


@given(st.text(max_size=40), st.text(max_size=40), st.sampled_from(PAPER_STYLES))
def test_styling_the_parts_joins_up_like_styling_the_whole(
    prompt: str, truth: str, name: str
) -> None:
    styled_prompt, styled_truth = apply_style(name, prompt, truth)
    assert styled_prompt + styled_truth == get_style(name)(prompt + truth)


def test_registering_a_new_style() -> None:
    @register_style("reverse_words_test", "words in reverse order (test)")
    def reverse(text: str) -> str:
        return text[::-1]

    assert "reverse_words_test" in available_styles()
    assert get_style("reverse_words_test+upper")("ab") == "BA"
    with pytest.raises(ValueError, match="already registered"):
        register_style("reverse_words_test", "again")(lambda text: text)
    with pytest.raises(ValueError, match="unknown style 'nope'"):
        get_style("lower+nope")
    register_style("twice_reversed_test", "the text twice, reversed (test)")(
        lambda text: (text + text)[::-1]
    )
    with pytest.raises(RuntimeError, match="did not keep"):
        apply_style("twice_reversed_test", "ab", "cd")


@pytest.mark.parametrize(
    "name, prompt, truth, expected",
    [
        # a docstring is a string: its words are not identifiers
        (
            "underscore_names",
            'def f():\n    """Doc line\n    more',
            ' words\n    """\n',
            ('def _f():\n    """Doc line\n    more', ' words\n    """\n'),
        ),
        # a keyword cut by the boundary becomes an identifier: "def" + "ault"
        ("underscore_names", "x = def", "ault", ("_x = _def", "ault")),
        # indentation split by the boundary
        ("tab_indent", "if x:\n", "    y = 1", ("if x:\n", "\ty = 1")),
        ("tab_indent", "if x:\n    ", "    y", ("if x:\n\t", "\ty")),
        # two spaces already: left alone, wherever the boundary falls
        ("two_spaces", "foo ", " bar", ("foo ", " bar")),
        ("upper", "a\ue000", "b", ("A\ue000", "B")),  # the marker in the text itself
    ],
)
def test_boundary_cases(name: str, prompt: str, truth: str, expected: tuple[str, str]) -> None:
    assert apply_style(name, prompt, truth) == expected
    assert "".join(expected) == get_style(name)(prompt + truth)
