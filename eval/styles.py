"""Style-transfer prompts (Ippolito et al. 2023, §4.2): the same prompt in another case, spacing,
comment style or naming convention. A verbatim guard stores the original form only, so a model
asked for another style can still emit the memorized text in that style.

A style is a function ``text -> text``, registered by name; ``"lower+python_comment"`` composes
styles left to right. :func:`apply_style` transforms a prompt and its true continuation together,
so that the continuation takes the form the styled prompt asks for, and splits them again.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Callable
from dataclasses import dataclass

# Marks the prompt/continuation boundary while a style runs over both. A style must keep it
# (every style here does): private-use, so no real text holds it, and treated as part of a word.
BOUNDARY = "\ue000"


@dataclass(frozen=True)
class Style:
    """A named text transformation."""

    name: str
    function: Callable[[str], str]
    description: str


_REGISTRY: dict[str, Style] = {}


def register_style(
    name: str, description: str
) -> Callable[[Callable[[str], str]], Callable[[str], str]]:
    """Decorator: register ``function`` as the style ``name``.

    The function takes and returns text, and must keep :data:`BOUNDARY` characters where they are
    relative to the text around them.

    Example:
        >>> @register_style("reverse_lines", "lines in reverse order")  # doctest: +SKIP
        ... def reverse_lines(text: str) -> str:
        ...     return "\\n".join(reversed(text.split("\\n")))
    """
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name):
        raise ValueError(f"style names are lower-case identifiers, got {name!r}")

    def decorate(function: Callable[[str], str]) -> Callable[[str], str]:
        if name in _REGISTRY and _REGISTRY[name].function is not function:
            raise ValueError(f"a style named {name!r} is already registered")
        _REGISTRY[name] = Style(name, function, description)
        return function

    return decorate


def available_styles() -> dict[str, str]:
    """Registered style names and their descriptions."""
    return {name: style.description for name, style in sorted(_REGISTRY.items())}


def get_style(name: str) -> Callable[[str], str]:
    """The function of a style name, or of a ``+``-joined composition of names."""
    parts = name.split("+")
    unknown = [part for part in parts if part not in _REGISTRY]
    if unknown or not name:
        raise ValueError(
            f"unknown style {unknown[0] if unknown else name!r}; known: "
            f"{', '.join(sorted(_REGISTRY))} (combine them with '+')"
        )
    functions = [_REGISTRY[part].function for part in parts]

    def composed(text: str) -> str:
        for function in functions:
            text = function(text)
        return text

    return composed


def apply_style(name: str, prompt: str, truth: str = "") -> tuple[str, str]:
    """Apply a style to a prompt and its true continuation as one text, then split them again.

    The joined text is styled as a whole (so the continuation takes the form the styled prompt
    asks for: a continued identifier is not renamed twice, a continued line is not commented
    twice). It is split after the styled prompt when that is a prefix of it; otherwise at a
    :data:`BOUNDARY` marker carried through the style; failing both, where the styled prompt and
    the styled whole stop agreeing.

    Returns:
        (styled prompt, styled continuation); joined, they equal the styled whole.
    """
    function = get_style(name)
    whole = function(prompt + truth)
    styled_prompt = function(prompt)
    if whole.startswith(styled_prompt):
        return styled_prompt, whole[len(styled_prompt) :]
    if BOUNDARY not in prompt and BOUNDARY not in truth:
        marked = function(prompt + BOUNDARY + truth)
        if marked.count(BOUNDARY) != 1:
            raise RuntimeError(f"style {name!r} did not keep the prompt/continuation boundary")
        if marked.replace(BOUNDARY, "") == whole:
            head, tail = marked.split(BOUNDARY)
            return head, tail
    common = 0
    for left, right in zip(whole, styled_prompt, strict=False):
        if left != right:
            break
        common += 1
    return whole[:common], whole[common:]


# ---------------------------------------------------------------------------------------------
# The paper's styles and a few more


@register_style("original", "the text unchanged")
def original(text: str) -> str:
    return text


@register_style("lower", "lower case")
def lower(text: str) -> str:
    return text.lower()


@register_style("upper", "upper case")
def upper(text: str) -> str:
    return text.upper()


_BETWEEN_WORDS = re.compile(r"(?<=\S) (?=\S)")


@register_style("two_spaces", "every single space between two non-space characters doubled")
def two_spaces(text: str) -> str:
    return _BETWEEN_WORDS.sub("  ", text)


def _prefix_lines(text: str, prefix: str) -> str:
    return prefix + text.replace("\n", "\n" + prefix)


@register_style("python_comment", "every line starts with '# ' (the code commented out)")
def python_comment(text: str) -> str:
    return _prefix_lines(text, "# ")


@register_style("c_comment", "every line starts with '// '")
def c_comment(text: str) -> str:
    return _prefix_lines(text, "// ")


_INDENT = re.compile(r"^((?:    )+)", re.MULTILINE)


@register_style("tab_indent", "indentation in tabs instead of groups of four spaces")
def tab_indent(text: str) -> str:
    return _INDENT.sub(lambda match: "\t" * (len(match.group(1)) // 4), text)


_KEYWORDS = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist)
# A string literal (triple or single quoted, with escapes), a comment, or an identifier; the
# boundary marker counts as a word character so that an identifier cut by the prompt's end stays
# one identifier.
_LEXEME = re.compile(
    r"""(?P<string>(?:[rRbBuUfF]{0,2})(?:'''[\s\S]*?(?:'''|\Z)|\"\"\"[\s\S]*?(?:\"\"\"|\Z)"""
    r"""|'(?:\\.|[^'\\\n])*(?:'|$)|"(?:\\.|[^"\\\n])*(?:"|$)))"""
    r"""|(?P<comment>\#[^\n]*)"""
    r"""|(?<![\w\ue000])(?P<name>[\w\ue000]+)""",
    re.MULTILINE,
)


@register_style(
    "underscore_names",
    "identifiers renamed with a leading '_' (a naming convention); keywords, strings, comments "
    "and names that already start with '_' unchanged",
)
def underscore_names(text: str) -> str:
    def rename(match: re.Match[str]) -> str:
        name = match.group("name")
        if name is None:
            return match.group(0)
        bare = name.replace(BOUNDARY, "")
        if not bare or bare in _KEYWORDS or bare[0].isdigit() or bare[0] == "_":
            return name
        return "_" + name

    return _LEXEME.sub(rename, text)


PAPER_STYLES = (
    "original",
    "two_spaces",
    "lower",
    "upper",
    "python_comment",
    "c_comment",
    "tab_indent",
    "underscore_names",
    "lower+python_comment",
)
