"""The ``memfree`` command: one entry point whose subcommands live with their packages and load
only when asked for (``memfree --help`` imports no torch, no builder, no eval).

    common.py              errors, warnings and side-by-side text, for every subcommand
    info.py                memfree info
    tables.py              memfree tables
    generate.py            memfree generate
    demo.py                make demo (python -m memfree.cli.demo)
    bloom_builder/cli.py   memfree build
    eval/cli/              memfree eval, memfree audit
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol, cast


class Command(NamedTuple):
    """A subcommand: the module that defines it, and its line in ``memfree --help``."""

    module: str
    help: str


class CommandModule(Protocol):
    """What a subcommand's module provides (its imports of torch & co. wait until :func:`run`)."""

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Give the subcommand's parser its description and arguments."""

    def run(self, args: argparse.Namespace) -> int:
        """Run the subcommand on parsed arguments; returns the exit status."""


# The order of ``memfree --help``. Each module is imported only when its command is named.
COMMANDS: dict[str, Command] = {
    "build": Command("bloom_builder.cli", "build a filter of a corpus's n-grams"),
    "info": Command("memfree.cli.info", "show a filter's metadata"),
    "tables": Command("memfree.cli.tables", "canonical decoding's cached tables; build them ahead"),
    "generate": Command("memfree.cli.generate", "complete prompts with the guard"),
    "eval": Command("eval.cli.evaluate", "measure memorization the guard does and does not stop"),
    "audit": Command("eval.cli.audit", "canaries: insert, exposure, extraction"),
}


def command_module(name: str) -> CommandModule:
    """Import the module that defines subcommand ``name`` (a key of :data:`COMMANDS`)."""
    return cast(CommandModule, importlib.import_module(COMMANDS[name].module))


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The ``memfree`` parser, with arguments for the subcommand that ``argv`` names.

    The other subcommands get their name and help line only: enough for ``memfree --help`` and
    for argparse's "invalid choice" message, without importing their packages.

    Args:
        argv: the command line (without the program name); empty builds the bare listing, and
            ``build_parser(["NAME"])`` the full parser of subcommand NAME.
    """
    parser = argparse.ArgumentParser(
        prog="memfree",
        description="Keep language models from emitting n-grams of their training data.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    named = _named_command(argv)
    for name, command in COMMANDS.items():
        sub = commands.add_parser(name, help=command.help)
        if name == named:
            command_module(name).add_arguments(sub)
    return parser


def _named_command(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` asks for: its first word (``memfree`` itself takes only -h)."""
    for word in argv:
        if not word.startswith("-"):
            return word if word in COMMANDS else None
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``memfree`` command line; returns the exit status.

    Args:
        argv: the arguments (default ``sys.argv[1:]``), e.g. ``["info", "stdlib.memfree"]``.

    Returns:
        0 on success, 2 for a bad command line or input (with a ``memfree: error:`` line on
        stderr), 130 when interrupted, and what the subcommand returns otherwise.
    """
    words = list(sys.argv[1:] if argv is None else argv)
    args = build_parser(words).parse_args(words)
    handler: Callable[[argparse.Namespace], int] = command_module(args.command).run
    try:
        return handler(args)
    except BrokenPipeError:  # `memfree info F | head`: the reader left; not an error of ours
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 0
