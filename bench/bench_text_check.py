"""Benchmark: what an exact text-level token guard would cost (issue 16; not shipped).

The token guard promises no stored n-gram in the ids it generates. To promise the same for the
text tokenized again, a guard would have to tokenize the text's tail once per candidate token
(the last pretoken plus the candidate's text) and look up the n-grams that result. This measures
the tokenizer alone, with SmolLM2's tokenizer, on the same short tail (the last pretoken plus one
token's text): for the sampler's choice only, for 50 candidates (the first 50 ids of the
vocabulary: short texts, so a lower bound for 50 likely tokens), and for every token. The shipped
guard's whole-vocabulary step is ``bench_generate.py``'s.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable

from memfree.vocab.tokenizer import load_tokenizer

LAST_PRETOKEN = "self._val"
TAIL = LAST_PRETOKEN + "ue"  # the pretoken with the sampler's choice


def _best(run: Callable[[], object], repeats: int) -> float:
    """Best of 3 timings of ``repeats`` calls, in seconds per call."""
    times = []
    for _ in range(3):
        started = time.perf_counter()
        for _ in range(repeats):
            run()
        times.append((time.perf_counter() - started) / repeats)
    return min(times)


def main() -> None:
    tokenizer = load_tokenizer(None)
    backend = tokenizer.backend_tokenizer
    vocabulary = [tokenizer.decode([i]) for i in range(len(tokenizer))]
    candidates = [LAST_PRETOKEN + text for text in vocabulary]

    def whole() -> object:
        return [e.ids for e in backend.encode_batch(candidates, add_special_tokens=False)]

    one = _best(lambda: backend.encode(TAIL, add_special_tokens=False).ids, 2000)
    top = _best(lambda: backend.encode_batch(candidates[:50], add_special_tokens=False), 100)
    every = _best(whole, 1)
    print(f"machine: {platform.machine()}, {platform.processor() or 'cpu'}; SmolLM2 tokenizer")
    print(f"the sampler's choice only:  {one * 1e6:8.1f} us per row")
    print(f"50 candidates:              {top * 1e3:8.2f} ms per row")
    print(f"every token ({len(candidates):,}):      {every * 1e3:8.0f} ms per row")


if __name__ == "__main__":
    main()
