"""Planting canaries in a corpus (Carlini et al., "The Secret Sharer", 2019) with a manifest, the
only record of which secrets went where; and reading that manifest back, checked."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from eval.canary_formats import Canary, CanaryFormat
from memfree.errors import SettingError
from memfree.fileio import atomic_file, atomic_write


def _existing(corpus: Sequence[str]) -> list[str]:
    return [path for path in corpus if not path.endswith(":") and os.path.lexists(path)]


def _check_output(out: Path, corpus: Sequence[str]) -> None:
    """Refuse an output that is a file (a corpus file given as the output, say)."""
    if os.path.lexists(out) and not os.path.isdir(out):
        given = next((path for path in _existing(corpus) if _same_file(path, out)), None)
        what = f"the corpus file {given} given as input" if given else "a file"
        raise ValueError(
            f"{out}: is {what}, not a folder; -o names the folder that gets the planted "
            "corpus.jsonl and manifest.json: choose another -o, e.g. a new folder"
        )


def _check_not_an_input(out: Path, corpus: Sequence[str]) -> None:
    """Refuse, since ``overwrite`` would replace them, a ``corpus.jsonl`` or ``manifest.json``
    in ``out`` that is an input of this run or lies inside one."""
    inputs = _existing(corpus)
    for name in ("corpus.jsonl", "manifest.json"):
        target = out / name
        if not os.path.lexists(target):
            continue
        for path in inputs:
            inside = os.path.isdir(path) and Path(os.path.realpath(target)).is_relative_to(
                os.path.realpath(path)
            )
            if inside or _same_file(path, target):
                raise ValueError(
                    f"{target}: is {'inside ' if inside else ''}an input of this run ({path}); "
                    "writing the planted corpus there would replace what is being read. Choose "
                    "another -o"
                )


def _same_file(first: str | os.PathLike[str], second: str | os.PathLike[str]) -> bool:
    try:
        return os.path.samefile(first, second)
    except OSError:
        return False


def _refuse_overwrite(out: Path, overwrite: bool) -> None:
    """Refuse an output directory that already holds a manifest or a planted corpus."""
    present = [name for name in ("manifest.json", "corpus.jsonl") if os.path.lexists(out / name)]
    if present and not overwrite:
        why = ""
        if "manifest.json" in present:
            why = " (its manifest.json is the only record of which secrets were planted there)"
        raise ValueError(
            f"{out}: already holds {' and '.join(present)}{why}; choose another output "
            f"directory, or replace {'them' if len(present) > 1 else 'it'} with --force "
            "(overwrite=True in Python)"
        )


def _plant(lines: list[str], cuts: list[int], canaries: list[str]) -> tuple[str, list[int]]:
    """The document with each canary inserted as a line before line ``cuts[i]`` (sorted), and
    each canary's character offset in it."""
    pieces: list[str] = []
    offsets: list[int] = []
    previous = offset = 0
    for cut, canary in zip(cuts, canaries, strict=True):
        chunk = "\n".join(lines[previous:cut])
        if previous < cut:
            pieces.append(chunk + "\n")
            offset += len(chunk) + 1
        offsets.append(offset)
        pieces.append(canary + "\n")
        offset += len(canary) + 1
        previous = cut
    pieces.append("\n".join(lines[previous:]))
    return "".join(pieces), offsets


def insert_canaries(
    corpus: Sequence[str],
    output_dir: str | os.PathLike[str],
    canary_format: CanaryFormat,
    repetitions: Sequence[int] = (1, 2, 4, 8, 16, 32),
    canaries_per_repetition: int = 1,
    seed: int = 0,
    text_field: str = "text",
    *,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Plant canaries in a corpus: each repeated a chosen number of times at random places.

    Writes ``corpus.jsonl`` (every document of the input, with canaries inserted at line
    boundaries of random documents) and ``manifest.json`` (format, |R|, seed, each canary with its
    repetitions and positions) to ``output_dir``. The manifest is all later steps need.

    Args:
        corpus: paths, directories or globs (as ``memfree build`` takes them).
        output_dir: where ``corpus.jsonl`` and ``manifest.json`` go.
        canary_format: the canaries' template.
        repetitions: how many times each group of canaries is inserted.
        canaries_per_repetition: canaries per repetition count.
        seed: random seed (secrets and places).
        text_field: JSONL field / Parquet column of the corpus, and of ``corpus.jsonl``.
        overwrite: replace a ``manifest.json`` or ``corpus.jsonl`` already in ``output_dir``
            (``--force``); without it such a directory is refused, since its manifest is the
            only record of which secrets were planted.

    Returns:
        the manifest.

    Raises:
        memfree.errors.SettingError: bad repetitions, or more canaries than the format has
            secrets (named by the arguments).
        ValueError: no readable document, ``output_dir`` is a file, or it already holds a
            manifest or corpus and ``overwrite`` is not set (or they are inputs of this run).
        eval.resultdirs.ResultsDirError: another run writes into ``output_dir`` (it holds the
            folder's lock; the message names it).
    """
    from eval.resultdirs import ResultsLock

    if canaries_per_repetition < 1 or not repetitions or min(repetitions) < 1:
        raise SettingError(
            "repetitions and canaries_per_repetition must be >= 1", field="repetitions"
        )
    wanted = len(repetitions) * canaries_per_repetition
    if wanted > canary_format.space_size:
        raise SettingError(
            f"repetitions and canaries_per_repetition ask for {wanted} distinct canaries, but the "
            f"format {canary_format.template!r} has only {canary_format.space_size} (|R|); plant "
            "fewer, or give canary_format more holes",
            field="repetitions",
        )
    out = Path(output_dir)
    _check_output(out, corpus)
    # Held from the check of what is there to the manifest's writing: two runs into one folder
    # would otherwise both pass the check, and one manifest would replace the other.
    with ResultsLock(out, option="-o"):
        _refuse_overwrite(out, overwrite)
        _check_not_an_input(out, corpus)
        return _insert(
            corpus, out, canary_format, repetitions, canaries_per_repetition, seed, text_field
        )


def _insert(
    corpus: Sequence[str],
    out: Path,
    canary_format: CanaryFormat,
    repetitions: Sequence[int],
    canaries_per_repetition: int,
    seed: int,
    text_field: str,
) -> dict[str, Any]:
    """:func:`insert_canaries` in its locked output folder."""
    from bloom_builder.sources import ProblemLog, SourceOptions, iter_documents
    from eval.sampling import skipped

    options = SourceOptions(text_field=text_field)
    problems = ProblemLog()
    documents = [found.text for found in iter_documents(list(corpus), options, problems)]
    if not documents:
        raise ValueError(f"no readable document in {', '.join(corpus)}{skipped(problems)}")
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
        lines = texts[document_index].split("\n")
        cuts = sorted(int(rng.integers(len(lines))) for _ in canary_indices)  # before a line
        fills = [canary_format.fill(secrets[int(i)]) for i in canary_indices]
        texts[document_index], offsets = _plant(lines, cuts, fills)
        for canary_index, offset in zip(canary_indices, offsets, strict=True):
            positions[int(canary_index)].append((document_index, offset))
    out.mkdir(parents=True, exist_ok=True)
    # Written whole or not at all, the corpus before its manifest: an interrupted run never
    # leaves a manifest describing a corpus that is not there.
    with atomic_file(out / "corpus.jsonl", text=True) as handle:
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
    atomic_write(out / "manifest.json", json.dumps(manifest, indent=2, ensure_ascii=False))
    return manifest


MANIFEST_FIX = (
    "give the manifest.json that `memfree audit insert` wrote (or its directory), or run "
    "`memfree audit insert` again"
)


def load_manifest(
    path: str | os.PathLike[str],
) -> tuple[CanaryFormat, list[Canary], dict[str, Any]]:
    """Read a manifest written by :func:`insert_canaries`.

    Args:
        path: ``manifest.json`` or the directory holding it.

    Returns:
        (format, canaries, the manifest as written).

    Raises:
        FileNotFoundError: no manifest there.
        eval.resultfiles.ResultFileError: the manifest cannot be read or is damaged (the
            message names the file, the canary and the fix).
    """
    from eval.resultfiles import ResultFileError, check_fields, read_json

    file = Path(path)
    if file.is_dir():
        file = file / "manifest.json"
    try:
        data = read_json(file, MANIFEST_FIX)
    except FileNotFoundError:
        raise FileNotFoundError(f"{file}: no canary manifest; run `memfree audit insert`") from None
    where = str(file)
    check_fields(
        data, where, MANIFEST_FIX, {"format": "a string", "canaries": "a list"}, {"words": "a list"}
    )
    words = data.get("words", [])

    def damaged(problem: str) -> ResultFileError:
        return ResultFileError(f"{problem}; {MANIFEST_FIX}")

    if not all(isinstance(word, str) for word in words):
        raise damaged(f"{where}: field 'words' holds something other than strings")
    try:
        canary_format = CanaryFormat(data["format"], tuple(words))
    except ValueError as error:
        raise damaged(f"{where}: {error}") from None
    if not data["canaries"]:
        raise damaged(f"{where}: holds no canary")
    holes = len(canary_format.holes)
    canaries = [
        _read_canary(item, f"{where}: canary {index}", holes)
        for index, item in enumerate(data["canaries"], 1)
    ]
    return canary_format, canaries, data


def _read_canary(item: Any, at: str, holes: int) -> Canary:
    """One canary of a manifest, checked (``at`` names it in the messages).

    Raises:
        eval.resultfiles.ResultFileError: the canary is damaged.
    """
    from eval.resultfiles import ResultFileError, check_fields

    def damaged(problem: str) -> ResultFileError:
        return ResultFileError(f"{at}: {problem}; {MANIFEST_FIX}")

    check_fields(
        item,
        at,
        MANIFEST_FIX,
        {"text": "a string", "secret": "a list", "repetitions": "an integer"},
        {"positions": "a list"},
    )
    secret = item["secret"]
    if not all(isinstance(part, str) for part in secret):
        raise damaged("its secret holds something other than strings")
    if len(secret) != holes:
        raise damaged(
            f"a secret of {len(secret)} part{'s' if len(secret) != 1 else ''} for a "
            f"format of {holes} hole{'s' if holes != 1 else ''}"
        )
    if item["repetitions"] < 1:
        raise damaged(f"repetitions must be >= 1, found {item['repetitions']}")
    positions = item.get("positions", [])
    if not all(
        isinstance(pair, list) and len(pair) == 2 and all(type(x) is int for x in pair)
        for pair in positions
    ):
        raise damaged("positions must be [document, offset] pairs of integers")
    return Canary(
        item["text"], tuple(secret), item["repetitions"], tuple((a, b) for a, b in positions)
    )


__all__ = ["MANIFEST_FIX", "Canary", "CanaryFormat", "insert_canaries", "load_manifest"]
