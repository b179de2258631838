"""``make demo``: build a filter of this Python's standard library with the default tokenizer
(SmolLM2-135M-Instruct's), then show what it stores and answers.

The guarded generation itself (MemFreeLogitsProcessor) is the next step of the roadmap; this demo
runs the part that exists: the streaming builder and the filter file.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np


def main() -> int:
    from bloom_builder.build import build_filter
    from bloom_builder.settings import BuildSettings
    from memfree import NgramFilter
    from memfree.tokenizer import cache_dir, load_tokenizer

    output = Path("out") / "stdlib.memfree"
    started = time.perf_counter()
    tokenizer = load_tokenizer(None)
    print(
        f"default tokenizer loaded in {time.perf_counter() - started:.1f} s (cached in {cache_dir()})"
    )
    if output.exists():
        print(f"reusing {output} (delete it to rebuild)")
    else:
        summary = build_filter(["stdlib:"], output, BuildSettings(), tokenizer=tokenizer)
        print(summary.to_text())
    filt = NgramFilter.open(output)
    print(f"\n{filt!r}")

    import json.decoder as sample_module

    source = Path(sample_module.__file__).read_text()
    snippet = source[source.index("def py_scanstring") :][:300]
    ids = np.array(tokenizer(snippet, add_special_tokens=False)["input_ids"])
    windows = np.lib.stride_tricks.sliding_window_view(ids, filt.n)
    print(
        f"\nstdlib snippet (json/decoder.py): {len(windows)} 10-grams, "
        f"{int(filt.contains(windows).sum())} stored"
    )
    rewritten = snippet.replace("s", "S")
    ids = np.array(tokenizer(rewritten, add_special_tokens=False)["input_ids"])
    windows = np.lib.stride_tricks.sliding_window_view(ids, filt.n)
    print(
        f"same snippet with 's' -> 'S': {len(windows)} 10-grams, "
        f"{int(filt.contains(windows).sum())} stored (the verbatim guard misses style transfers)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
