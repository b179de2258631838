"""``memfree tables``: canonical decoding's tables kept in memfree's cache, and building them
ahead of time (a server image's build step, so that no worker builds them at start)."""

from __future__ import annotations

import argparse
import json
import time

from memfree.cli.common import fail


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Give ``memfree tables``'s parser its description and options."""
    parser.description = (
        "List canonical decoding's tables kept in memfree's cache directory ($MEMFREE_CACHE, "
        "else ~/.cache/memfree), each with the tokenizer it was built for, its size, how long "
        "it took to build and whether it is whole; with --tokenizer, build that tokenizer's "
        "tables first (or find them there)."
    )
    parser.add_argument(
        "--tokenizer",
        default=None,
        metavar="NAME",
        help="a tokenizer directory, .gguf file, cached model name, or 'default'",
    )
    parser.add_argument("--json", action="store_true", help="print the list as JSON")


def run(args: argparse.Namespace) -> int:
    """Run ``memfree tables``; returns the exit status (2 for a tokenizer it cannot load or
    canonical decoding does not read)."""
    from memfree.core.table_cache import kept_tables, tables_dir

    if args.tokenizer is not None:
        from memfree.core.canonical import canonical_masker
        from memfree.vocab.bpe import CanonicalUnsupportedError
        from memfree.vocab.info import TokenizerInfo
        from memfree.vocab.tokenizer import TokenizerNotFoundError, load_tokenizer

        try:
            tokenizer = load_tokenizer(args.tokenizer)
            started = time.perf_counter()
            canonical_masker(TokenizerInfo.of(tokenizer))
        except (TokenizerNotFoundError, CanonicalUnsupportedError) as error:
            return fail(str(error))
        if not args.json:
            print(
                f"{args.tokenizer}: canonical decoding's tables ready in "
                f"{time.perf_counter() - started:.1f} s"
            )
    kept = kept_tables()
    if args.json:
        print(json.dumps(kept, indent=2, sort_keys=True))
        return 0
    print(f"{tables_dir()}: {len(kept)} tables file(s)")
    for entry in kept:
        state = "whole" if entry.get("whole") else f"damaged ({entry.get('problem', 'checksum')})"
        print(
            f"  {entry['path'].rsplit('/', 1)[-1]}  {entry.get('kind', '?')}  tokenizer "
            f"{str(entry.get('tokenizer_fingerprint', '?'))[:16]}  "
            f"{entry['size_bytes'] / 2**20:.1f} MiB  built in {entry.get('build_seconds', '?')} s "
            f"({entry.get('created', '?')})  {state}"
        )
    return 0
