"""What every ``memfree`` subcommand shares: how errors, warnings and texts reach the user.

Kept free of heavy imports: the builder's and eval's commands import it too.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import sys
import textwrap
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memfree.generation import Completion

_COLOR_ESCAPE = re.compile(r"\033\[[0-9;]*m")

#: What an interrupted resumable command (build, eval) tells the user.
INTERRUPTED = "memfree: interrupted; rerun the same command to resume"
#: The exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it.
INTERRUPTED_STATUS = 130


#: ``DecodingSettings`` fields and the ``memfree generate`` / ``memfree eval`` flags that set them:
#: library errors name fields, the command line names flags (:func:`memfree.errors.in_flag_terms`).
DECODING_FLAGS = {
    "max_new_tokens": "--max-new-tokens",
    "do_sample": "--sample",
    "temperature": "--temperature",
    "top_k": "--top-k",
    "top_p": "--top-p",
    "num_beams": "--num-beams",
    "num_return_sequences": "--num-return-sequences",
    "seed": "--seed",
    "batch_size": "--batch-size",
}


def no_room(error: BaseException, where: str, fix: str) -> str | None:
    """The message for a write the local disk refused for lack of room (full: ENOSPC; over a
    quota: EDQUOT; past the file-size limit: EFBIG), naming ``where`` the command writes and
    ``fix``; None for any other error.

    Example:
        >>> import errno
        >>> no_room(OSError(errno.ENOSPC, "No space left on device"), "out/eval", "free some")
        'no room to write in out/eval (No space left on device): free some'
    """
    from memfree.storage import NO_ROOM

    if not isinstance(error, OSError) or error.errno not in NO_ROOM:
        return None
    named = f" ({error.filename})" if error.filename else ""
    return f"no room to write in {where}{named} ({error.strerror}): {fix}"


def fail(message: str) -> int:
    """Print ``memfree: error: MESSAGE`` on stderr and return the usage-error status, 2.

    Args:
        message: what was wrong and how to fix it; library errors are passed through as they are
            worded, since they already name the input, the problem and the fix.

    Returns:
        2, the status argparse uses for bad command lines.
    """
    print(f"memfree: error: {message}", file=sys.stderr)
    return 2


def interrupted() -> int:
    """Tell the user that rerunning resumes, and return the Ctrl-C status (130)."""
    print(INTERRUPTED, file=sys.stderr)
    return INTERRUPTED_STATUS


def disable_download_bars() -> None:
    """Hide transformers' per-file progress bars (local loads only: they would only add noise)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


@contextlib.contextmanager
def warnings_to_stderr() -> Iterator[None]:
    """Show memfree's warnings (a prompt cut to fit the context) as ``memfree: warning: ...``
    lines on stderr, above any progress bar; other warnings as Python shows them."""
    from tqdm import tqdm

    from memfree.generation import PromptCutWarning

    with warnings.catch_warnings():
        previous = warnings.showwarning

        def show(
            message: Warning | str,
            category: type[Warning],
            filename: str,
            lineno: int,
            file: Any = None,
            line: str | None = None,
        ) -> None:
            if issubclass(category, PromptCutWarning):
                tqdm.write(f"memfree: warning: {message}", file=sys.stderr)
            else:
                previous(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        yield


def indent(text: str) -> str:
    """``text`` with every line behind a ``  │ `` gutter (prompts and completions)."""
    return textwrap.indent(text, "  │ ", lambda _: True)


def side_by_side(left_title: str, left: str, right_title: str, right: str) -> str:
    """Two texts in columns when the terminal is wide enough, else one after the other."""
    width = shutil.get_terminal_size((100, 24)).columns
    if width < 100:
        return "\n".join([left_title, indent(left), right_title, indent(right)])
    column = (width - 3) // 2
    left_lines = _wrap(left, column)
    right_lines = _wrap(right, column)
    rows = [f"{left_title[:column]:<{column}} │ {right_title[:column]}"]
    for index in range(max(len(left_lines), len(right_lines))):
        a = left_lines[index] if index < len(left_lines) else ""
        b = right_lines[index] if index < len(right_lines) else ""
        rows.append(f"{a}{' ' * max(column - _visible_length(a), 0)} │ {b}")
    return "\n".join(rows)


def _wrap(text: str, width: int) -> list[str]:
    lines: list[str] = []
    for line in text.expandtabs(4).split("\n"):
        lines.extend(
            textwrap.wrap(line, width, drop_whitespace=False, replace_whitespace=False) or [""]
        )
    return lines


def _visible_length(text: str) -> int:
    """Columns ``text`` takes on a terminal: colour escape sequences take none."""
    return len(_COLOR_ESCAPE.sub("", text))


_RED_STRIKE, _GREEN, _RESET = "\033[9;31m", "\033[32m", "\033[0m"


def _visible(token_text: str) -> str:
    """A token's text with line breaks and tabs written as escapes, so a mark stays on one line."""
    return token_text.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")


def explain(tokenizer: Any, completion: Completion, color: bool = False) -> str:
    """The completion's text with each intervention shown as ``[[blocked -> chosen]]``.

    With ``color``, the blocked token is red and struck through and the chosen token green
    instead of the brackets. Line breaks and tabs inside a mark are written ``\\n`` and ``\\t``.
    """
    marks = {item.position: item for item in completion.interventions}
    pieces: list[str] = []
    ids = completion.output_ids
    cursor = 0
    for position in sorted(marks):
        pieces.append(tokenizer.decode(ids[cursor:position]))
        item = marks[position]
        blocked = _visible(tokenizer.decode([item.blocked]))
        chosen = _visible(tokenizer.decode([item.chosen]))
        if color:
            pieces.append(f"{_RED_STRIKE}{blocked}{_RESET}{_GREEN}{chosen}{_RESET}")
        else:
            pieces.append(f"[[{blocked} -> {chosen}]]")
        cursor = position + 1
    pieces.append(tokenizer.decode(ids[cursor:]))
    return "".join(pieces)
