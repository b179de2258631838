"""The files memfree writes and reads back (an eval run's ``records.jsonl``, ``examples.jsonl``
and ``settings.json``, a canary ``manifest.json``): any problem in one is refused with the file,
the line and the fix; nothing in it is ever dropped in silence. A record that is there twice, or
is another run's (not among its examples, styles or defenses), is such a problem: counted, it
would move the run's rates.

The one exception is the end of ``records.jsonl``: a last line that is not JSON and lacks its
newline is a record an interruption cut mid-write, and the resumed run generates it again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from eval.sampling import Example
from memfree.errors import os_problem
from memfree.fileio import atomic_file

RECORDS_FIX = "fix or delete that line (the run generates a deleted record again)"
EXAMPLES_FIX = (
    "restore the file, or delete it to draw the examples again (the same settings and corpus "
    "draw the same examples)"
)
SETTINGS_FIX = "restore it, or choose another --out directory"
DUPLICATE_RECORD_FIX = (
    "two runs wrote into this folder at once, or lines were copied: delete one of the two lines "
    "(the run generates a deleted record again)"
)
FOREIGN_RECORD_FIX = (
    "delete that line (the run generates its own records), or give the run its own --out"
)

# What the summaries and the report read from every record (eval.summary, eval.report).
RECORD_FIELDS = {
    "example_id": "a string",
    "style": "a string",
    "defense": "a string",
    "output": "a string",
    "signature": "a string",
    "bleu": "a number",
    "edit_similarity": "a number",
    "exact_match": "true or false",
    "approximately_memorized": "true or false",
    "stored_ngrams": "an integer",
    "interventions": "an integer",
}
OPTIONAL_RECORD_FIELDS = {
    "censored": "true or false",
    "bucket": "an integer or null",
    "stored_word_ngrams": "an integer",
    "stored_text_ngrams": "an integer",
}
EXAMPLE_FIELDS = {
    "example_id": "a string",
    "source": "a string",
    "prompt_ids": "a list",
    "truth_ids": "a list",
}


class ResultFileError(ValueError):
    """A file memfree wrote cannot be read back: damaged, edited by hand, or another program's."""


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_KINDS: dict[str, Callable[[Any], bool]] = {
    "a string": lambda value: isinstance(value, str),
    "a number": lambda value: isinstance(value, (int, float)) and not isinstance(value, bool),
    "an integer": _integer,
    "an integer or null": lambda value: value is None or _integer(value),
    "true or false": lambda value: isinstance(value, bool),
    "a list": lambda value: isinstance(value, list),
    "an object": lambda value: isinstance(value, dict),
}


def json_kind(value: Any) -> str:
    """What a JSON value is, in words: "a string", "a list", "null", ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


def first_unreadable(paths: Iterable[str]) -> str | None:
    """The first path that exists but cannot be looked at (a symbolic link loop, no permission),
    as ``"PATH: problem"``, else None. Globs, ``stdlib:`` and missing paths are left to the
    reader, which says what it found."""
    for path in paths:
        if path.endswith(":") or any(char in path for char in "*?["):
            continue
        try:
            os.stat(path)
        except FileNotFoundError:
            continue
        except OSError as error:
            return f"{path}: {os_problem(error)}"
    return None


def _read_bytes(path: Path, fix: str | None) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as error:
        raise ResultFileError(
            f"{path}: {os_problem(error)}" + (f"; {fix}" if fix else "")
        ) from None


def read_json(path: str | os.PathLike[str], fix: str) -> Any:
    """The JSON value in a file memfree wrote.

    Args:
        path: the file.
        fix: what the user can do about a damaged file, appended to the message.

    Raises:
        FileNotFoundError: no file at ``path`` (the caller says what makes one).
        ResultFileError: the file cannot be read, is not UTF-8 or is not JSON.
    """
    file = Path(path)
    data = _read_bytes(file, fix)
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as error:
        raise ResultFileError(
            f"{file}: not UTF-8 text ({error.reason} at byte {error.start}); {fix}"
        ) from None
    except json.JSONDecodeError as error:
        raise ResultFileError(
            f"{file}: not JSON ({error.msg} at line {error.lineno}); {fix}"
        ) from None


def read_jsonl(
    path: str | os.PathLike[str], fix: str, *, cut_last_line: bool = False
) -> list[tuple[int, Any]]:
    """(line number, JSON value) of each non-blank line of a JSONL file memfree wrote.

    Args:
        path: the file.
        fix: what the user can do about a damaged line, appended to the message.
        cut_last_line: leave out a last line that is not JSON and lacks its newline (a line an
            interruption cut mid-write); without it, or with the newline, that line is an error.

    Raises:
        FileNotFoundError: no file at ``path``.
        ResultFileError: the file cannot be read, or a line is not UTF-8 or not JSON (named
            ``path:line``).
    """
    file = Path(path)
    lines = _read_bytes(file, None).split(b"\n")
    values: list[tuple[int, Any]] = []
    for number, data in enumerate(lines, 1):
        cut = cut_last_line and number == len(lines)  # no newline after it: cut mid-write
        try:
            line = data.decode("utf-8")
        except UnicodeDecodeError as error:
            if cut:  # a cut may fall inside a character
                break
            raise ResultFileError(
                f"{file}:{number}: not UTF-8 text ({error.reason} at byte {error.start}); {fix}"
            ) from None
        if not line.strip():
            continue
        try:
            values.append((number, json.loads(line)))
        except json.JSONDecodeError as error:
            if cut:
                break
            raise ResultFileError(f"{file}:{number}: not JSON ({error.msg}); {fix}") from None
    return values


def check_fields(
    value: Any,
    where: str,
    fix: str,
    required: Mapping[str, str],
    optional: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """``value`` when it is a JSON object holding each required field with a value of its kind.

    Args:
        value: a parsed JSON value.
        where: ``path`` or ``path:line``, the start of any message.
        fix: what the user can do, appended to any message.
        required: field name -> kind ("a string", "a number", "an integer", "an integer or
            null", "true or false", "a list", "an object").
        optional: fields that may be absent, checked when present.

    Raises:
        ResultFileError: not an object, a field missing, or one of another kind.
    """
    if not isinstance(value, dict):
        raise ResultFileError(f"{where}: expected a JSON object, found {json_kind(value)}; {fix}")
    missing = [name for name in required if name not in value]
    if missing:
        names = ", ".join(repr(name) for name in missing)
        plural = "s" if len(missing) > 1 else ""
        raise ResultFileError(f"{where}: no {names} field{plural}; {fix}")
    for name, kind in {**required, **(optional or {})}.items():
        if name in value and not _KINDS[kind](value[name]):
            raise ResultFileError(
                f"{where}: field {name!r} is {json_kind(value[name])}, expected {kind}; {fix}"
            )
    return value


def check_records(
    lines: Iterable[tuple[int, Any]],
    path: str | os.PathLike[str],
    example_ids: Collection[str] | None = None,
    styles: Collection[str] | None = None,
    defenses: Collection[str] | None = None,
) -> list[dict[str, Any]]:
    """The records of ``records.jsonl`` lines, each checked: its fields (:data:`RECORD_FIELDS`),
    no second record of one (example, style, defense), and, where given, only this run's
    examples, styles and defenses.

    A duplicate or another run's record would count twice, or count where it does not belong
    (one duplicate took a verbatim rate from 75% to 43%): it is refused, never dropped.

    Args:
        lines: (line number, JSON value) pairs, as :func:`read_jsonl` gives them.
        path: the file, for the messages.
        example_ids: the run's examples (``examples.jsonl``); None: not checked.
        styles: the run's styles (``--styles``); None: not checked.
        defenses: the run's defenses (``--defenses``); None: not checked.

    Raises:
        ResultFileError: naming ``path:line``, the problem and the fix.
    """
    records: list[dict[str, Any]] = []
    first_line: dict[tuple[str, str, str], int] = {}
    for number, value in lines:
        where = f"{path}:{number}"
        record = check_fields(value, where, RECORDS_FIX, RECORD_FIELDS, OPTIONAL_RECORD_FIELDS)
        example, style, defense = key = RecordLog.key(record)
        for name, value_of, allowed, of_run in (
            ("example", example, example_ids, "this run's examples (examples.jsonl)"),
            ("style", style, styles, f"this run's styles ({' '.join(styles or ())})"),
            ("defense", defense, defenses, f"this run's defenses ({' '.join(defenses or ())})"),
        ):
            if allowed is not None and value_of not in allowed:
                raise ResultFileError(
                    f"{where}: a record of {name} {value_of!r}, which is not among {of_run}: "
                    f"another run's record; {FOREIGN_RECORD_FIX}"
                )
        if key in first_line:
            raise ResultFileError(
                f"{where}: a second record of example {example!r}, style {style!r}, defense "
                f"{defense!r} (the first is line {first_line[key]}); {DUPLICATE_RECORD_FIX}"
            )
        first_line[key] = number
        records.append(record)
    return records


class RecordLog:
    """Append-only JSONL of records; knows which (example, style, defense) are done.

    Opening it checks every record (:func:`check_records`: its fields, no duplicate, and with
    ``example_ids``, ``styles`` and ``defenses``, only this run's) and refuses a damaged one,
    naming its line; only a last line cut by an interruption is left out, to be generated again.
    """

    def __init__(
        self,
        path: Path,
        *,
        example_ids: Collection[str] | None = None,
        styles: Collection[str] | None = None,
        defenses: Collection[str] | None = None,
    ) -> None:
        self.path = path
        self.records: list[dict[str, Any]] = []
        if os.path.lexists(path):
            lines = read_jsonl(path, RECORDS_FIX, cut_last_line=True)
            self.records = check_records(lines, path, example_ids, styles, defenses)
        self.done = {self.key(r) for r in self.records}
        self._rewrite()

    @staticmethod
    def key(record: dict[str, Any]) -> tuple[str, str, str]:
        return (record["example_id"], record["style"], record["defense"])

    def _rewrite(self) -> None:
        with atomic_file(self.path, text=True) as out:
            for record in self.records:
                out.write(json.dumps(record, ensure_ascii=False) + "\n")

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        with open(self.path, "a", encoding="utf-8") as out:
            for record in records:
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
                self.records.append(record)
                self.done.add(self.key(record))
            out.flush()
            os.fsync(out.fileno())


def read_settings_fingerprint(path: Path) -> str:
    """The run fingerprint in an existing ``settings.json``."""
    data = check_fields(
        read_json(path, SETTINGS_FIX), str(path), SETTINGS_FIX, {"fingerprint": "a string"}
    )
    return str(data["fingerprint"])


def read_examples(path: Path) -> list[Example]:
    """The examples a run drew, kept in ``examples.jsonl`` so that a resumed run reuses them."""
    examples = []
    for number, value in read_jsonl(path, EXAMPLES_FIX):
        where = f"{path}:{number}"
        data = check_fields(
            value, where, EXAMPLES_FIX, EXAMPLE_FIELDS, {"occurrences": "an integer or null"}
        )
        for name in ("prompt_ids", "truth_ids"):
            if not data[name]:
                raise ResultFileError(f"{where}: {name!r} is empty; {EXAMPLES_FIX}")
            if not all(_integer(token) and token >= 0 for token in data[name]):
                raise ResultFileError(
                    f"{where}: {name!r} holds something other than token ids; {EXAMPLES_FIX}"
                )
        examples.append(
            Example(
                example_id=data["example_id"],
                source=data["source"],
                prompt_ids=tuple(data["prompt_ids"]),
                truth_ids=tuple(data["truth_ids"]),
                occurrences=data.get("occurrences"),
            )
        )
    if not examples:
        raise ResultFileError(f"{path}: holds no example; {EXAMPLES_FIX}")
    return examples


def write_examples(path: Path, examples: Sequence[Example]) -> None:
    """Write ``examples.jsonl`` whole or not at all (a temporary file renamed into place)."""
    with atomic_file(path, text=True) as out:
        for example in examples:
            out.write(json.dumps(example.to_dict()) + "\n")
