"""The build's steps one at a time, each against what it must produce exactly, on real files and
the session's trained tokenizer: plan (units into shards), encode (each document's ids), map
(every window's key, spilled into sorted runs) and reduce (each key range counted across every
run, the keys seen at least ``min_count`` times kept). ``test_build.py`` tests them together."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bloom_builder.counting import Run
from bloom_builder.encode import encoded_batches, init_worker, worker_encoder
from bloom_builder.map import MapTask, map_shard
from bloom_builder.plan import plan_build, plan_shards, unit_parts
from bloom_builder.reduce import read_kept, reduce_partition, reduce_tasks
from bloom_builder.settings import BuildSettings
from bloom_builder.sources import ProblemLog
from memfree.filterfile.hashing import fingerprints_np
from memfree.filterfile.index import index_keys, token_bits_for

N = 3
DOCUMENTS = [
    "the cat sat on the mat",
    "the cat sat on the hat",
    "a dog sat on the mat and the cat sat on the mat",
    "",  # an empty document: no windows
    "mat",  # shorter than n: no windows
    "def f(x):\n    return x + 1\n",
]


def _corpus(tmp_path: Path, documents: list[str], files: int = 2) -> list[str]:
    """The documents as JSONL files (a document per line), split among ``files`` files."""
    paths = []
    for index in range(files):
        path = tmp_path / "corpus" / f"part-{index}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps({"text": text}) for text in documents[index::files]]
        path.write_text("\n".join(lines) + "\n")
        paths.append(str(path))
    return paths


def _planned(tmp_path: Path, tokenizer: Any, **settings: Any) -> tuple[Any, Any, BuildSettings]:
    chosen = BuildSettings(ngram_size=N, **settings)
    parts = unit_parts(chosen, tokenizer)
    plan = plan_build(_corpus(tmp_path, DOCUMENTS), tmp_path / "out.memfree", [], chosen, parts)
    init_worker(parts.payload)
    return plan, parts, chosen


def _ids(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _windows(tokenizer: Any) -> np.ndarray:
    """Every n-gram window of every document, as the tokenizer gives its ids."""
    rows = []
    for text in DOCUMENTS:
        ids = _ids(tokenizer, text)
        rows.extend(ids[start : start + N] for start in range(len(ids) - N + 1))
    return np.array(rows, dtype=np.int64).reshape(-1, N)


def _run_counts(stems: list[str]) -> Counter[int]:
    """What a set of runs holds: each key with its count (keys seen once carry no count)."""
    counts: Counter[int] = Counter()
    for stem in stems:
        keys, indices, repeats = Run(Path(stem)).open()
        found = dict.fromkeys(keys.tolist(), 1)
        for index, count in zip(indices.tolist(), repeats.tolist(), strict=True):
            found[int(keys[index])] = count
        counts.update(found)
    return counts


def test_plan_groups_units_in_order_into_shards_of_about_the_size(tmp_path: Path) -> None:
    paths = _corpus(tmp_path, [f"document {i} " * (i + 1) for i in range(12)], files=6)
    from bloom_builder.sources import SourceOptions, discover

    units = discover(paths, SourceOptions(), ProblemLog())
    assert len(units) == 6
    for size in (1, 40, 100, 10**9):
        shards = plan_shards(units, size)
        assert [unit for shard in shards for unit in shard] == units  # each once, in order
        for shard in shards[:-1]:  # every shard but the last reaches the size ...
            assert sum(max(u.size_bytes, 1) for u in shard) >= size
            # ... and stops at the first unit that does
            assert sum(max(u.size_bytes, 1) for u in shard[:-1]) < size
    assert len(plan_shards(units, 1)) == 6 and len(plan_shards(units, 10**9)) == 1


def test_encode_gives_each_document_its_tokenizers_ids(tmp_path: Path, tokenizer: Any) -> None:
    plan, _, chosen = _planned(tmp_path, tokenizer)
    found = {}
    for unit in plan.units:
        for batch in encoded_batches(
            unit, plan.options, ProblemLog(), worker_encoder(), batch_documents=2, batch_bytes=64
        ):
            for document, ids in batch:
                found[document.text] = ids.tolist()
    assert set(found) == {text for text in DOCUMENTS if text}  # an empty document is skipped
    assert all(found[text] == _ids(tokenizer, text) for text in found)
    assert chosen.ngram_size == N


@pytest.mark.parametrize("layout", ["blocked-512", "prefix-index"])
def test_map_spills_every_windows_key_and_reduce_keeps_those_seen_often_enough(
    tmp_path: Path, tokenizer: Any, layout: str
) -> None:
    """The map tasks' runs hold exactly one key per window of every document (with repeats
    counted); each reduce partition keeps exactly the keys of its range seen at least
    ``min_count`` times, sorted; together the partitions hold every such key once."""
    plan, parts, chosen = _planned(tmp_path, tokenizer, layout=layout, min_count=2)
    index_bits = token_bits_for(int(parts.header_fields["vocab_size"])) if chosen.uses_index else 0
    work = tmp_path / "work"
    results = [
        map_shard(
            MapTask(
                index=index,
                units=shard,
                work_dir=str(work),
                ngram_size=N,
                hash_seed=chosen.hash_seed,
                batch_documents=2,
                buffer_entries=4,  # spills often: many small runs
                options=plan.options,
                prefixes=False,
                index_token_bits=index_bits,
            )
        )
        for index, shard in enumerate(plan.shards)
    ]
    windows = _windows(tokenizer)
    fingerprints = fingerprints_np(windows, chosen.hash_seed)
    if chosen.uses_index:
        prefixes = fingerprints_np(windows[:, :-1], chosen.hash_seed)
        expected_keys = index_keys(prefixes, windows[:, -1], index_bits)
    else:
        expected_keys = fingerprints
    expected = Counter(int(key) for key in expected_keys)
    stems = [
        str(work / "map" / f"shard-{i:05d}" / stem)
        for i, r in enumerate(results)
        for stem in r.runs
    ]
    assert len(stems) > len(results)  # the small buffer spilled several runs per task
    assert _run_counts(stems) == expected
    assert sum(r.stats.ngrams for r in results) == len(windows)

    tasks = reduce_tasks({"ngrams": stems}, 4, 2, 1 << 20, work / "reduce")
    kept = []
    for task in tasks:
        result = reduce_partition(task)
        part = np.asarray(read_kept(task)).tolist()
        assert part == sorted(set(part))  # sorted, each key once
        assert all(task.low <= key < task.high for key in part)
        assert result.kept == len(part)
        assert result.distinct == sum(1 for key in expected if task.low <= key < task.high)
        kept.extend(part)
    assert sorted(kept) == sorted(key for key, count in expected.items() if count >= 2)
    assert kept  # the corpus repeats n-grams: something is kept
