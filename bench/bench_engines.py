"""The guard inside serving engines, on the default model (SmolLM2-135M-Instruct, CPU): outputs and
guarded/unguarded wall time, measured in one run.

    python bench/bench_engines.py vllm  --token-filter T --word-filter W [--json OUT]
    python bench/bench_engines.py llama --token-filter T --word-filter W [--json OUT]

vllm: a batch of 8 prompts, greedy, 64 new tokens, on three engines one after the other: none
(plain; memfree's entry point is loaded and inert), MemFreeLogitsProcessor with the token
filter and opt-out allowed (guarded, opted-out, a mixed batch and a sampled batch), and with the
word filter. llama: the same prompts one at a time
(batch 1, n_threads=1), plain, token guard and word guard, greedy and sampled. The JSON holds every
output's token ids, for `make test-engines` to check. Needs the `.venv-engines` environment.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path
from typing import Any

MAX_TOKENS = 64


def prompts(count: int = 8, length: int = 50) -> list[list[int]]:
    """Prompts cut from encodings/cp437.py (which the filters hold and the model has memorized)."""
    import encodings.cp437 as module

    from memfree.vocab.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(None)
    text = Path(module.__file__).read_text(encoding="utf-8")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    start = len(
        tokenizer(text[: text.index("decoding_map.update")], add_special_tokens=False)["input_ids"]
    )
    return [ids[start + 200 * i : start + 200 * i + length] for i in range(count)]


def build_filters(directory: Path) -> dict[str, Path]:
    """A token and a word 10-gram filter of encodings/cp437.py for the default model, in the
    default layout (reused; built again when an earlier memfree wrote it)."""
    import encodings.cp437 as module

    from bloom_builder.build import build_filter
    from bloom_builder.settings import BuildSettings
    from memfree.vocab.tokenizer import load_tokenizer

    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    from memfree.errors import DamagedFilterError
    from memfree.filterfile import open_filter
    from memfree.filterfile.index import INDEX_LAYOUT

    for unit in ("token", "word"):
        path = directory / f"cp437-{unit}.memfree"
        if path.exists():
            try:
                found = open_filter(path)
                stale = found.layout != INDEX_LAYOUT  # the default layout changed since
                found.close()
            except DamagedFilterError:  # written by an earlier memfree
                stale = True
            if stale:
                path.unlink()
        if not path.exists():
            tokenizer = load_tokenizer(None) if unit == "token" else None
            settings = BuildSettings(workers=1, unit=unit)
            build_filter([module.__file__], path, settings, tokenizer=tokenizer, progress=False)
        paths[unit] = path
    return paths


def cpu_kv_share(budget_bytes: int = 3 << 30) -> float:
    """vLLM's ``gpu_memory_utilization`` on the CPU backend: the share of NUMA node 0's memory it
    reserves for the model and its KV cache. A fixed share (0.15 was used) is too small where the
    node is small (8.3 GiB on one of these VMs: the model alone outgrew it); take ~3 GiB."""
    try:
        with open("/sys/devices/system/node/node0/meminfo", encoding="ascii") as meminfo:
            total_kib = next(int(line.split()[3]) for line in meminfo if "MemTotal" in line)
    except (OSError, StopIteration, ValueError, IndexError):
        return 0.15
    return round(min(0.6, max(0.15, budget_bytes / (total_kib * 1024))), 3)


def _timed(function: Any, repeats: int = 3) -> tuple[Any, float]:
    best, result = float("inf"), None
    for _ in range(repeats):
        started = time.perf_counter()
        result = function()
        best = min(best, time.perf_counter() - started)
    return result, best


def run_vllm(token_filter: str, word_filter: str) -> dict[str, Any]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from memfree.engines.vllm import MemFreeLogitsProcessor
    from memfree.models import default_model_dir

    batch = prompts()
    inputs = [TokensPrompt(prompt_token_ids=p) for p in batch]
    common = dict(
        model=str(default_model_dir()),
        dtype="float32",
        max_model_len=1024,
        seed=0,
        gpu_memory_utilization=cpu_kv_share(),
        enforce_eager=True,
    )
    greedy = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    out_of_it = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, extra_args={"memfree": 0})
    sampled = SamplingParams(temperature=0.8, top_p=0.95, max_tokens=MAX_TOKENS, seed=1)

    def ids(outputs: Any) -> list[list[int]]:
        return [list(o.outputs[0].token_ids) for o in outputs]

    def plain(llm: Any) -> dict[str, Any]:
        out, seconds = _timed(lambda: ids(llm.generate(inputs, greedy)))
        return {"plain": out, "plain_s": seconds}

    def token(llm: Any) -> dict[str, Any]:
        found: dict[str, Any] = {}
        found["guarded"], found["guarded_s"] = _timed(lambda: ids(llm.generate(inputs, greedy)))
        found["opted_out"], found["opted_out_s"] = _timed(
            lambda: ids(llm.generate(inputs, out_of_it))
        )
        mixed = [greedy if i % 2 == 0 else out_of_it for i in range(len(inputs))]
        found["mixed"] = ids(llm.generate(inputs, mixed))
        found["sampled"] = ids(llm.generate(inputs, sampled))
        return found

    def word(llm: Any) -> dict[str, Any]:
        out, seconds = _timed(lambda: ids(llm.generate(inputs, greedy)))
        return {"word": out, "word_s": seconds}

    def guard(path: str, **memfree: Any) -> dict[str, Any]:
        return {
            "logits_processors": [MemFreeLogitsProcessor],  # also the entry point's: one guards
            "additional_config": {"memfree": {"filter": path, **memfree}},
        }

    result: dict[str, Any] = {"prompts": batch}
    for settings, work in (
        ({}, plain),
        (guard(token_filter, allow_opt_out=True), token),
        (guard(word_filter), word),
    ):
        llm = LLM(**common, **settings)
        result.update(work(llm))
        del llm  # one engine at a time: its worker processes end here
        gc.collect()
    return result


def run_llama(token_filter: str, word_filter: str) -> dict[str, Any]:
    from llama_cpp import Llama, LogitsProcessorList

    from memfree.integrations.llama_cpp import MemFreeLlamaCppLogitsProcessor
    from memfree.vocab.tokenizer import default_gguf_path

    llm = Llama(model_path=str(default_gguf_path()), n_ctx=1024, n_threads=1, verbose=False)
    guards = {
        "token": MemFreeLlamaCppLogitsProcessor(token_filter, llm),
        "word": MemFreeLlamaCppLogitsProcessor(word_filter, llm),
    }
    eos = llm.token_eos()
    batch = prompts()

    def generate(prompt: list[int], guard: Any, temperature: float) -> list[int]:
        llm.reset()
        processors = LogitsProcessorList([guard]) if guard is not None else None
        out: list[int] = []
        for token in llm.generate(
            prompt,
            temp=temperature,
            top_k=40,
            top_p=0.95,
            reset=True,
            logits_processor=processors,
        ):
            if token == eos:
                break
            out.append(int(token))
            if len(out) == MAX_TOKENS:
                break
        if guard is not None:
            guard.check()
        return out

    result: dict[str, Any] = {"prompts": batch}
    for name, guard in (("plain", None), ("guarded", guards["token"]), ("word", guards["word"])):
        result[name], result[f"{name}_s"] = _timed(
            lambda guard=guard: [generate(p, guard, 0.0) for p in batch]
        )
    llm.set_seed(1)
    result["sampled"] = [generate(p, guards["token"], 0.8) for p in batch]
    result["word_sampled"] = [generate(p, guards["word"], 0.8) for p in batch]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("engine", choices=["vllm", "llama"])
    parser.add_argument("--token-filter", help="default: built from encodings/cp437.py")
    parser.add_argument("--word-filter", help="default: built from encodings/cp437.py")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if not (args.token_filter and args.word_filter):
        built = build_filters(Path("out/engines"))
        args.token_filter = args.token_filter or built["token"]
        args.word_filter = args.word_filter or built["word"]
    run = run_vllm if args.engine == "vllm" else run_llama
    result = run(str(Path(args.token_filter).resolve()), str(Path(args.word_filter).resolve()))
    plain = result["plain_s"]
    print(f"{args.engine}: {len(result['prompts'])} prompts x {MAX_TOKENS} tokens, greedy")
    for name in ("plain", "guarded", "opted_out", "word"):
        if f"{name}_s" in result:
            seconds = result[f"{name}_s"]
            print(f"  {name:10s} {seconds:7.2f} s   {seconds / plain:5.3f}x plain")
    if args.json:
        args.json.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
