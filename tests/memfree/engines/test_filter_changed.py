"""A filter file rewritten in place while a guard has it mapped: the next step raises
FilterChangedError (sticky), never a mask read from bits it did not verify; a rename over the path
(what `memfree build` does), `chmod` and `touch` leave a running guard working on its intact file;
a truncating rewrite in another process never lets a guarded loop emit a stored n-gram."""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from memfree import NgramFilter
from memfree.engines.transformers import MemFreeLogitsProcessor
from memfree.errors import DamagedFilterError, FilterChangedError
from memfree.filterfile.bloom.bits import hashing_digest
from tests.memfree.filterfile.test_header import read_header, rewrite

VOCAB = 12
EOS = 11
# Every stored n-gram ends in a token the scripted scores favour; "other" holds the same shape
# (as many n-grams and prefixes) elsewhere, so its file has the same size.
STORED = [[1, 2, 3], [2, 3, 4], [3, 4, 5], [4, 5, 1], [5, 1, 2]]
OTHER = [[a + 5, b + 5, c + 5] for a, b, c in STORED]
ROW = torch.tensor([[1, 2]])  # (1, 2) -> 3 is stored


def write_filter(path: Path, ngrams: list[list[int]]) -> Path:
    NgramFilter.from_ngrams(path, np.asarray(ngrams), false_positive_rate=1e-9).close()
    return path


def zeroed_bytes(path: Path, scratch: Path) -> bytes:
    """``path``'s bytes with an all-zero bit array and every header checksum recomputed (the
    hashing binding too: the file opens unverified, and would block nothing)."""
    shutil.copyfile(path, scratch)
    metadata, _ = read_header(scratch)
    rewrite(scratch, metadata, np.zeros(metadata["num_bits"] // 64, dtype=np.uint64))
    metadata["hashing_xxh3"] = hashing_digest(metadata)
    rewrite(scratch, metadata)
    return scratch.read_bytes()


def overwrite(path: Path, data: bytes, truncate: bool) -> None:
    """Rewrite ``path`` in place: truncate and write (as `cp` does) or write over its bytes."""
    assert len(data) == path.stat().st_size  # same size: nothing for a reader to trip on
    with open(path, "wb" if truncate else "r+b") as out:
        out.write(data)


def banned(guard: Any, row: torch.Tensor = ROW) -> set[int]:
    out = guard(row, torch.zeros(row.shape[0], VOCAB))
    return set(torch.isneginf(out[0]).nonzero().flatten().tolist())


@pytest.fixture
def live(tmp_path: Path) -> Path:
    return write_filter(tmp_path / "live.memfree", STORED)


@pytest.fixture
def replacements(tmp_path: Path, live: Path) -> dict[str, bytes]:
    other = write_filter(tmp_path / "other.memfree", OTHER)
    data = {"another filter": other.read_bytes(), "zeroed bits": zeroed_bytes(live, tmp_path / "z")}
    for name, content in data.items():  # each would let the stored n-gram through
        probe = tmp_path / f"probe-{len(name)}.memfree"
        probe.write_bytes(content)
        assert not NgramFilter.open(probe, verify=False).contains([[1, 2, 3]])[0], name
    return data


@pytest.mark.parametrize("truncate", [False, True], ids=["same-size write", "cp (truncate)"])
@pytest.mark.parametrize("content", ["another filter", "zeroed bits"])
def test_an_in_place_rewrite_stops_the_next_step(
    live: Path, replacements: dict[str, bytes], content: str, truncate: bool
) -> None:
    guard: Any = MemFreeLogitsProcessor(NgramFilter.open(live), eos_token_id=EOS)
    assert banned(guard) == {3}
    overwrite(live, replacements[content], truncate)
    with pytest.raises(FilterChangedError, match="changed in place") as error:
        guard(ROW, torch.zeros(1, VOCAB))
    message = str(error.value)
    assert str(live) in message and "renaming it over the old one" in message
    assert "restart the guard" in message
    assert isinstance(error.value, DamagedFilterError)
    with pytest.raises(FilterChangedError):  # sticky: no later step reads those bits either
        guard.blocked_mask(torch.tensor([[4, 5]]), VOCAB)


def test_only_the_bits_rewritten_behind_an_unchanged_header_stop_it_too(live: Path) -> None:
    metadata, data_offset = read_header(live)
    guard = MemFreeLogitsProcessor(NgramFilter.open(live), eos_token_id=EOS)
    assert banned(guard) == {3}
    with open(live, "r+b") as out:  # the header's bytes are as they were
        out.seek(data_offset)
        out.write(bytes(metadata["num_bits"] // 8))
    with pytest.raises(FilterChangedError, match="its bit array changed"):
        banned(guard)


def test_generate_stops_when_the_filter_is_rewritten_mid_generation(
    live: Path, replacements: dict[str, bytes], scripted_lm: Any
) -> None:
    """A model that insists on the stored n-grams, through generate(): the step after the
    rewrite raises, so generate() returns nothing that step let through."""
    from transformers import LogitsProcessor, LogitsProcessorList

    model = scripted_lm(VOCAB, STORED, boost=50.0, eos=EOS)
    guard = MemFreeLogitsProcessor(NgramFilter.open(live), eos_token_id=EOS)

    class RewriteAtStep(LogitsProcessor):
        """Runs before the guard and rewrites the filter at its third step."""

        def __init__(self) -> None:
            self.steps = 0

        def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
            self.steps += 1
            if self.steps == 3:
                overwrite(live, replacements["another filter"], truncate=True)
            return scores

    rewriter = RewriteAtStep()
    prompt = torch.tensor([[1, 2]])
    options: dict[str, Any] = dict(
        attention_mask=torch.ones_like(prompt), do_sample=False, use_cache=False
    )
    with pytest.raises(FilterChangedError):
        model.generate(
            prompt,
            logits_processor=LogitsProcessorList([rewriter, guard]),
            max_new_tokens=8,
            min_new_tokens=8,
            **options,
        )
    assert rewriter.steps == 3  # it stopped at the step after the rewrite, not later
    # The same generation with the file intact runs to the end and emits no stored n-gram.
    fresh = write_filter(live.with_name("fresh.memfree"), STORED)
    out = model.generate(
        prompt,
        logits_processor=[MemFreeLogitsProcessor(NgramFilter.open(fresh), eos_token_id=EOS)],
        max_new_tokens=8,
        **options,
    )
    row = out[0].tolist()
    assert not {tuple(row[i : i + 3]) for i in range(len(row) - 2)} & {tuple(s) for s in STORED}


def test_a_rename_over_the_path_leaves_a_running_guard_on_its_file(live: Path) -> None:
    """`memfree build` (and every memfree writer) replaces by rename: the running guard keeps
    the old, intact file (its identity changes: it is verified once, then trusted)."""
    guard = MemFreeLogitsProcessor(NgramFilter.open(live), eos_token_id=EOS)
    assert banned(guard) == {3}
    write_filter(live, OTHER)  # a temporary file, renamed over the path
    assert banned(guard) == {3}  # the old filter, still guarding
    assert banned(guard, torch.tensor([[6, 7]])) == set()
    fresh = MemFreeLogitsProcessor(NgramFilter.open(live), eos_token_id=EOS)  # a restart
    assert banned(fresh, torch.tensor([[6, 7]])) == {8}


def test_chmod_and_touch_change_nothing_a_guard_reads(live: Path) -> None:
    guard = MemFreeLogitsProcessor(NgramFilter.open(live), eos_token_id=EOS)
    assert banned(guard) == {3}
    before = guard.file_watch.identity  # type: ignore[union-attr]
    time.sleep(0.01)
    live.chmod(0o600)
    os.utime(live, ns=(1, 1))
    assert banned(guard) == {3}
    assert guard.file_watch.identity != before  # type: ignore[union-attr]


def test_an_unchanged_file_costs_two_fstat_calls_per_step_and_no_checksum(
    live: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import memfree.filterfile.filewatch

    guard = MemFreeLogitsProcessor(NgramFilter.open(live), eos_token_id=EOS)
    calls = {"fstat": 0}
    real_fstat = os.fstat

    def counted(descriptor: int) -> os.stat_result:
        calls["fstat"] += 1
        return real_fstat(descriptor)

    def no_checksum(*args: Any) -> Any:
        raise AssertionError("an unchanged file was verified again")

    monkeypatch.setattr(memfree.filterfile.filewatch.os, "fstat", counted)
    monkeypatch.setattr(guard.file_watch, "_intact", no_checksum)
    for _ in range(5):
        assert banned(guard) == {3}
    assert calls["fstat"] == 10


def test_copies_hold_their_own_bits(live: Path, replacements: dict[str, bytes]) -> None:
    guard = MemFreeLogitsProcessor(NgramFilter.open(live), eos_token_id=EOS)
    clone = pickle.loads(pickle.dumps(guard))
    overwrite(live, replacements["zeroed bits"], truncate=False)
    with pytest.raises(FilterChangedError):
        banned(guard)
    assert banned(clone) == {3}  # its bits were copied with it


def test_the_word_guard_stops_too(tmp_path: Path) -> None:
    from memfree.testing import word_filter_from_texts
    from tests.memfree.vocab.test_token_bytes import word_level

    tok = word_level()  # a WordLevel tokenizer: the, quick, brown, fox, jumps
    live = tmp_path / "words.memfree"
    word_filter_from_texts(live, ["the quick brown fox jumps"], 3).close()
    other = word_filter_from_texts(tmp_path / "other.memfree", ["one two three four five"], 3)
    other.close()
    guard: Any = MemFreeLogitsProcessor(NgramFilter.open(live), tokenizer=tok)
    ids = torch.tensor([tok("the quick", add_special_tokens=False)["input_ids"]])
    brown = tok.convert_tokens_to_ids("brown")
    assert torch.isneginf(guard(ids, torch.zeros(1, len(tok)))[0]).nonzero().tolist() == [[brown]]
    overwrite(live, (tmp_path / "other.memfree").read_bytes(), truncate=True)
    with pytest.raises(FilterChangedError):
        guard(ids, torch.zeros(1, len(tok)))


def test_a_pybloom_filter_is_watched_too(tmp_path: Path) -> None:
    from memfree.filterfile import pybloom

    paths = []
    for name, ngrams in (("live", STORED), ("other", OTHER)):
        writer = pybloom.PybloomWriter(100, 1e-6, hash_seed=1)
        writer.add_ngrams(np.asarray(ngrams))
        paths.append(writer.write(tmp_path / f"{name}.bloom", {}, num_ngrams=len(ngrams)))
    guard = MemFreeLogitsProcessor(NgramFilter.open(paths[0]), eos_token_id=EOS)
    assert banned(guard) == {3}
    overwrite(paths[0], paths[1].read_bytes(), truncate=False)
    with pytest.raises(FilterChangedError, match="its bit array changed"):
        banned(guard)


def test_a_pybloom_file_without_a_sidecar_survives_a_rename_and_stops_on_a_rewrite(
    tmp_path: Path,
) -> None:
    """A file of the library itself has no sidecar, so no recorded checksum: the bits' own, taken
    at open, is the reference. A rename over the path or a touch changes the open file's identity
    but not its bytes: the guard goes on; an in-place rewrite stops it."""
    from memfree.filterfile import pybloom

    paths = []
    for name, ngrams in (("live", STORED), ("other", OTHER)):
        writer = pybloom.PybloomWriter(100, 1e-6, hash_seed=1)
        writer.add_ngrams(np.asarray(ngrams))
        path = writer.write(tmp_path / f"{name}.bloom", {}, num_ngrams=len(ngrams))
        pybloom.sidecar_path(path).unlink()
        paths.append(path)
    first_bytes = paths[0].read_bytes()
    spare = tmp_path / "spare.bloom"
    spare.write_bytes(paths[1].read_bytes())
    guard = MemFreeLogitsProcessor(NgramFilter.open(paths[0], ngram_size=3), eos_token_id=EOS)
    assert banned(guard) == {3}
    os.utime(paths[0], ns=(1, 1))
    os.replace(spare, paths[0])  # the supported way: the guard keeps the old, intact file
    assert banned(guard) == {3}
    live = NgramFilter.open(paths[0], ngram_size=3)  # the new file, now live
    second = MemFreeLogitsProcessor(live, eos_token_id=EOS)
    assert banned(second) == set()  # the other n-grams: none starts with this row
    overwrite(paths[0], first_bytes, truncate=False)
    with pytest.raises(FilterChangedError, match="its bit array changed"):
        banned(second)


# ------------------------------------------------------------------------------------------------
# A truncating rewrite while another process's guard is reading: SIGBUS or FilterChangedError,
# never exit 0 with a stored n-gram emitted.

GUARDED_LOOP = textwrap.dedent(
    """
    import sys
    import time
    import torch
    from memfree import NgramFilter
    from memfree.engines.transformers import MemFreeLogitsProcessor

    stored = [(1, 2, 3), (2, 3, 4), (3, 4, 5), (4, 5, 1), (5, 1, 2)]
    guard = MemFreeLogitsProcessor(NgramFilter.open(sys.argv[1]), eos_token_id=11)
    step = 0
    while True:
        ngram = stored[step % len(stored)]
        scores = torch.zeros(1, 12)
        scores[0, ngram[2]] = 50.0  # a model that has memorized the stored n-gram
        token = int(guard(torch.tensor([ngram[:2]]), scores).argmax())
        if token == ngram[2]:
            print("EMITTED", ngram, flush=True)
            sys.exit(0)
        step += 1
        if step == 1:
            print("READY", flush=True)
        time.sleep(0.005)  # the model's forward pass, between two guard steps
    """
)


def test_a_truncating_rewrite_under_a_running_guard_never_lets_a_stored_ngram_out(
    live: Path, replacements: dict[str, bytes], tmp_path: Path
) -> None:
    script = tmp_path / "loop.py"
    script.write_text(GUARDED_LOOP)
    root = Path(__file__).resolve().parents[3]
    process = subprocess.Popen(
        [sys.executable, str(script), str(live)],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == "READY"
        sources = [tmp_path / "other.memfree", tmp_path / "z"]  # each lets (1, 2, 3) through
        deadline = time.monotonic() + 120
        copies = 0
        while process.poll() is None and time.monotonic() < deadline:
            shutil.copyfile(sources[copies % 2], live)  # truncate, then write: what `cp` does
            copies += 1
            time.sleep(0.02)  # mostly the rewritten bytes are read; now and then, a truncation
        assert process.poll() is not None, "the guarded loop ran on through the rewrites"
        out, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert "EMITTED" not in out, out  # before the guard checked its file: EMITTED, exit 0
    assert process.returncode != 0
    # Either the guard saw the change (FilterChangedError) or a read hit the truncation (SIGBUS)
    assert "FilterChangedError" in err or process.returncode == -7, (process.returncode, err)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_filter_copied_to_the_gpu_holds_its_own_bits(
    live: Path, replacements: dict[str, bytes]
) -> None:
    """The first step on the GPU copies the bits there (checked); later steps read the copy,
    which a rewrite of the file cannot reach: not checked, and still guarding."""
    guard: Any = MemFreeLogitsProcessor(NgramFilter.open(live), eos_token_id=EOS)
    row = ROW.cuda()
    for _ in range(2):
        out = guard(row, torch.zeros(1, VOCAB, device="cuda"))
        assert torch.isneginf(out[0]).nonzero().flatten().tolist() == [3]
        overwrite(live, replacements["zeroed bits"], truncate=False)
    assert guard.masker.holds_own_copy(row.device)
