"""Canary formats (Carlini et al., "The Secret Sharer", 2019): templates with holes, the space R
of their fillings, seeded random secrets, and the record of one planted canary."""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_HOLE = re.compile(r"\{(d+|a+|x+|word)\}")
_ALPHABETS = {"d": "0123456789", "a": "abcdefghijklmnopqrstuvwxyz", "x": "0123456789abcdef"}


@dataclass(frozen=True)
class CanaryFormat:
    """A template with holes, and the words a ``{word}`` hole draws from.

    A format is a template with holes: ``"my social security number is {ddd}-{dd}-{dddd}"``. A
    hole is a run of ``d`` (a digit), ``a`` (a lower-case letter) or ``x`` (a hex digit), one
    character each, or ``{word}``, one word of ``words``. The randomness space R is every filling
    of the holes; the *secret* of a canary is its filling, the *prefix* the text before the first
    hole.
    """

    template: str
    words: tuple[str, ...] = ()
    _parts: tuple[tuple[str, str], ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts: list[tuple[str, str]] = []  # ("text", literal) or ("hole", alphabet key)
        cursor = 0
        for match in _HOLE.finditer(self.template):
            if match.start() > cursor:
                parts.append(("text", self.template[cursor : match.start()]))
            spec = match.group(1)
            if spec == "word":
                if len(set(self.words)) < 2:
                    raise ValueError("a {word} hole needs a list of at least two distinct words")
                parts.append(("hole", "word"))
            else:
                parts += [("hole", spec[0])] * len(spec)
            cursor = match.end()
        if cursor < len(self.template):
            parts.append(("text", self.template[cursor:]))
        if not any(kind == "hole" for kind, _ in parts):
            raise ValueError(
                f"canary format {self.template!r} has no hole; write e.g. "
                "'my pin is {dddd}' ({d...} digits, {a...} letters, {x...} hex, {word})"
            )
        object.__setattr__(self, "_parts", tuple(parts))

    def _choices(self, key: str) -> Sequence[str]:
        return sorted(set(self.words)) if key == "word" else _ALPHABETS[key]

    @property
    def holes(self) -> list[Sequence[str]]:
        """The choices of each hole, in order."""
        return [self._choices(key) for kind, key in self._parts if kind == "hole"]

    @property
    def space_size(self) -> int:
        """|R|: the number of distinct canaries of this format."""
        return math.prod(len(choices) for choices in self.holes)

    @property
    def prefix(self) -> str:
        """The fixed text before the first hole."""
        return self._parts[0][1] if self._parts[0][0] == "text" else ""

    def fill(self, secret: Sequence[str]) -> str:
        """The canary text for one choice per hole."""
        values = iter(secret)
        return "".join(value if kind == "text" else next(values) for kind, value in self._parts)

    def secret_text(self, secret: Sequence[str]) -> str:
        """The canary without its prefix (what an attacker must recover)."""
        return self.fill(secret)[len(self.prefix) :]

    def random_secrets(self, count: int, rng: np.random.Generator) -> list[tuple[str, ...]]:
        """``count`` distinct random secrets (uniform over R)."""
        if count > self.space_size:
            raise ValueError(
                f"asked for {count} distinct secrets from a space of {self.space_size}"
            )
        holes = self.holes
        secrets: dict[tuple[str, ...], None] = {}
        while len(secrets) < count:
            secret = tuple(choices[int(rng.integers(len(choices)))] for choices in holes)
            secrets.setdefault(secret, None)
        return list(secrets)

    def all_secrets(self) -> Iterator[tuple[str, ...]]:
        """Every secret of R, in order (for small spaces: exact ranks)."""
        return itertools.product(*self.holes)


@dataclass(frozen=True)
class Canary:
    """One planted canary."""

    text: str
    secret: tuple[str, ...]
    repetitions: int
    positions: tuple[tuple[int, int], ...] = ()  # (document index, character offset)

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "secret": list(self.secret),
            "repetitions": self.repetitions,
            "positions": [list(p) for p in self.positions],
        }


__all__ = ["Canary", "CanaryFormat"]
