"""Canaries (Carlini et al., "The Secret Sharer", 2019): random secrets in a fixed format, planted
in a training corpus a chosen number of times, to measure later how much the model learned them.

A format is a template with holes: ``"my social security number is {ddd}-{dd}-{dddd}"``. A hole
is a run of ``d`` (a digit), ``a`` (a lower-case letter) or ``x`` (a hex digit), one character
each, or ``{word}``, one word of a given list. The randomness space R is every filling of the
holes; the *secret* of a canary is its filling, the *prefix* the text before the first hole.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

_HOLE = re.compile(r"\{(d+|a+|x+|word)\}")
_ALPHABETS = {"d": "0123456789", "a": "abcdefghijklmnopqrstuvwxyz", "x": "0123456789abcdef"}


@dataclass(frozen=True)
class CanaryFormat:
    """A template with holes, and the words a ``{word}`` hole draws from."""

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


def insert_canaries(
    corpus: Sequence[str],
    output_dir: str | os.PathLike[str],
    canary_format: CanaryFormat,
    repetitions: Sequence[int] = (1, 2, 4, 8, 16, 32),
    canaries_per_repetition: int = 1,
    seed: int = 0,
    text_field: str = "text",
) -> dict[str, Any]:
    """Plant canaries in a corpus: each repeated a chosen number of times at random places.

    Writes ``corpus.jsonl`` (every document of the input, with canaries inserted at line
    boundaries of random documents) and ``manifest.json`` (format, |R|, seed, each canary with its
    repetitions and positions) to ``output_dir``. The manifest is all later steps need.

    Returns:
        the manifest.
    """
    from bloom_builder.sources import ProblemLog, SourceOptions, discover, read_unit

    if canaries_per_repetition < 1 or not repetitions or min(repetitions) < 1:
        raise ValueError("repetitions and canaries_per_repetition must be >= 1")
    options = SourceOptions(text_field=text_field)
    problems = ProblemLog()
    documents = [
        document.text
        for unit in discover(list(corpus), options, problems)
        for document in read_unit(unit, options, problems)
    ]
    if not documents:
        raise ValueError(f"no readable document in {', '.join(corpus)}")
    rng = np.random.default_rng(seed)
    secrets = canary_format.random_secrets(len(repetitions) * canaries_per_repetition, rng)
    planned: list[tuple[int, int]] = []  # (canary index, document index) per insertion
    canary_repetitions = [r for r in repetitions for _ in range(canaries_per_repetition)]
    for index, count in enumerate(canary_repetitions):
        planned += [(index, int(rng.integers(len(documents)))) for _ in range(count)]
    inserted: dict[int, list[str]] = {}
    positions: dict[int, list[tuple[int, int]]] = {i: [] for i in range(len(secrets))}
    for index, document_index in planned:
        inserted.setdefault(document_index, []).append(str(index))
    texts = list(documents)
    for document_index, canary_indices in inserted.items():
        text = texts[document_index]
        lines = text.split("\n")
        cuts = sorted(int(rng.integers(len(lines))) for _ in canary_indices)  # before a line
        pieces: list[str] = []
        previous = 0
        offset = 0
        for cut, canary_index in zip(cuts, canary_indices, strict=True):
            chunk = "\n".join(lines[previous:cut])
            if previous < cut:
                pieces.append(chunk + "\n")
                offset += len(chunk) + 1
            canary = canary_format.fill(secrets[int(canary_index)])
            positions[int(canary_index)].append((document_index, offset))
            pieces.append(canary + "\n")
            offset += len(canary) + 1
            previous = cut
        pieces.append("\n".join(lines[previous:]))
        texts[document_index] = "".join(pieces)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "corpus.jsonl", "w", encoding="utf-8") as handle:
        for text in texts:
            handle.write(json.dumps({text_field: text}, ensure_ascii=False) + "\n")
    canaries = [
        Canary(canary_format.fill(secret), secret, canary_repetitions[i], tuple(positions[i]))
        for i, secret in enumerate(secrets)
    ]
    manifest = {
        "format": canary_format.template,
        "words": list(canary_format.words),
        "space_size": canary_format.space_size,
        "prefix": canary_format.prefix,
        "seed": seed,
        "corpus": [str(path) for path in corpus],
        "documents": len(texts),
        "text_field": text_field,
        "canaries": [canary.to_dict() for canary in canaries],
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2, ensure_ascii=False))
    return manifest


def load_manifest(
    path: str | os.PathLike[str],
) -> tuple[CanaryFormat, list[Canary], dict[str, Any]]:
    """Read a manifest written by :func:`insert_canaries`."""
    file = Path(path)
    if file.is_dir():
        file = file / "manifest.json"
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
        canary_format = CanaryFormat(data["format"], tuple(data.get("words", ())))
        canaries = [
            Canary(
                item["text"],
                tuple(item["secret"]),
                int(item["repetitions"]),
                tuple((int(a), int(b)) for a, b in item.get("positions", [])),
            )
            for item in data["canaries"]
        ]
    except FileNotFoundError:
        raise FileNotFoundError(f"{file}: no canary manifest; run `memfree audit insert`") from None
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{file}: not a canary manifest ({error})") from None
    return canary_format, canaries, data
