"""What eval and audit write, and where: a folder of other files, or of another kind of results, is
refused without --force; a folder another run is writing is locked (the second run is refused at
once, naming the first; the lock dies with its holder); a duplicate or another run's record is
refused when the folder is read back; and every bad setting or input is named as typed on the
command line."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eval.audit_report import write_audit_report
from eval.experiments import run_memorization
from eval.resultdirs import LOCK_NAME, check_results_dir, folder_kinds
from eval.settings import ExperimentSettings
from memfree import NgramFilter
from memfree.cli import main as cli_main
from tests.eval.eval_runs import finished_eval_run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any, tokenizer_dir: Path) -> Any:
    """A corpus of 3 documents, its filter, a saved tiny model, and a finished eval run."""
    root = tmp_path_factory.mktemp("safety")
    arguments, model = finished_eval_run(root, tokenizer, tokenizer_dir)
    return root, arguments, model


def files_of(folder: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in folder.iterdir() if path.is_file()}


def error_of(capsys: pytest.CaptureFixture[str]) -> str:
    """The last line on stderr (after any progress bar)."""
    return capsys.readouterr().err.strip().splitlines()[-1]


# -- item 2: a folder of other files, or of another kind, is not silently replaced ---------------


def test_eval_refuses_a_folder_of_other_files_unless_forced(
    tmp_path: Path, setup: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    _, arguments, _ = setup
    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.md").write_text("my own report\n")
    (out / "summary.json").write_text("{}\n")
    capsys.readouterr()
    assert cli_main([*arguments, "--out", str(out)]) == 2
    assert error_of(capsys) == (
        f"memfree: error: {out}: not empty (report.md, summary.json) and not a memfree eval "
        "results folder; memfree writes records.jsonl, examples.jsonl, settings.json, "
        "summary.json, report.md and PNG plots there, replacing files of those names. Choose "
        "another --out (a new or empty folder), or pass --force to write there anyway"
    )
    assert files_of(out) == {"report.md": b"my own report\n", "summary.json": b"{}\n"}
    assert cli_main([*arguments, "--out", str(out), "--force"]) == 0
    assert (out / "report.md").read_text() != "my own report\n"
    assert not (out / LOCK_NAME).exists()  # released
    # Now it is an eval folder: the same run resumes (and re-renders) without --force.
    assert cli_main([*arguments, "--out", str(out)]) == 0


def test_eval_resumes_its_own_folder_and_refuses_an_audit_one(
    tmp_path: Path, setup: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    root, arguments, _ = setup
    out = tmp_path / "run"
    shutil.copytree(root / "run", out)
    records = (out / "records.jsonl").read_bytes()
    assert cli_main([*arguments, "--out", str(out)]) == 0
    assert (out / "records.jsonl").read_bytes() == records  # all done: nothing added
    audit = tmp_path / "audit"
    audit.mkdir()
    (audit / "audit.json").write_text(json.dumps({"unguarded": {"by_k": []}}))
    capsys.readouterr()
    assert cli_main([*arguments, "--out", str(audit)]) == 2
    assert error_of(capsys).startswith(
        f"memfree: error: {audit}: holds the results of memfree audit extractable; memfree eval "
        "writes"
    )
    assert files_of(audit) == {"audit.json": b'{"unguarded": {"by_k": []}}'}


def test_eval_refuses_a_file_as_its_folder(
    tmp_path: Path, setup: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    _, arguments, _ = setup
    (tmp_path / "a-file").write_text("x")
    assert cli_main([*arguments, "--out", str(tmp_path / "a-file")]) == 2
    assert error_of(capsys) == (
        f"memfree: error: {tmp_path / 'a-file'}: is a file, not a folder; --out names the folder "
        "the results go in"
    )


@pytest.mark.parametrize("run", ["buckets", "discoverable", "styles", "styles-buckets"])
def test_committed_results_are_eval_folders(run: str) -> None:
    folder = ROOT / "docs" / "results" / run
    assert folder_kinds(folder) == {"eval"}
    check_results_dir(folder, "eval", force=False)  # resumable, re-renderable as before
    with pytest.raises(ValueError, match=r"holds the results of memfree eval; .*--force"):
        check_results_dir(folder, "audit exposure", force=False)


def _extractability(share: float) -> dict[str, Any]:
    row = {"k": 4, "sequences": 2, "extractable": share}
    return {"unguarded": {"truth_tokens": 6, "by_k": [row], "by_bucket": []}}


def test_an_audit_report_never_replaces_another_folder_s_files(tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "audit.md").write_text("my notes\n")
    with pytest.raises(ValueError, match=rf"{mine}: not empty \(audit\.md\) .*--force"):
        write_audit_report(mine, _extractability(0.5), "t")
    assert files_of(mine) == {"audit.md": b"my notes\n"}
    assert write_audit_report(mine, _extractability(0.5), "t", overwrite=True)
    assert "50%" in (mine / "audit.md").read_text()
    # Its own kind is rendered again; another step's report is refused.
    write_audit_report(mine, _extractability(1.0), "t")
    assert "100%" in (mine / "audit.md").read_text()
    exposure: dict[str, Any] = {"unguarded": {"by_repetitions": []}}
    with pytest.raises(ValueError, match="holds the results of memfree audit extractable"):
        write_audit_report(mine, exposure, "t")
    assert set(files_of(mine)) == {"audit.md", "audit.json"}


def test_cli_audit_exposure_refuses_a_folder_of_another_kind_before_loading_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.txt").write_text("one\ntwo\n")
    planted = tmp_path / "planted"
    assert cli_main(["audit", "insert", str(tmp_path / "a.txt"), "-o", str(planted)]) == 0
    step = ["audit", "exposure", "--manifest", str(planted), "--model", str(tmp_path / "none")]
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "audit.json").write_text(json.dumps({"guarded": {"shortest_path": {}}}))
    capsys.readouterr()
    assert cli_main([*step, "--out", str(theirs)]) == 2
    assert error_of(capsys) == (
        f"memfree: error: {theirs}: holds the results of memfree audit extract; memfree audit "
        "exposure writes audit.json, audit.md and exposure.png there and would replace them. "
        "Choose another --out, or pass --force to replace them"
    )
    # The same kind, or --force: the folder is taken (then the missing model is what fails).
    exposure = tmp_path / "exposure"
    exposure.mkdir()
    (exposure / "audit.json").write_text(json.dumps({"guarded": {"by_repetitions": []}}))
    for out, force in ((exposure, []), (theirs, ["--force"])):
        assert cli_main([*step, "--out", str(out), *force]) == 2
        model = tmp_path / "none"
        assert error_of(capsys).startswith(f"memfree: error: model '{model}': cannot load")
        assert not (out / LOCK_NAME).exists()


# -- items 6 and 20: one run at a time in a folder -------------------------------------------------


@pytest.fixture
def other_process() -> Iterator[Any]:
    """Factory: a Python process holding the results lock of a folder until it is killed."""
    started: list[subprocess.Popen[str]] = []

    def hold(folder: Path, *command: str) -> subprocess.Popen[str]:
        script = (
            "import sys\n"
            "from eval.resultdirs import ResultsLock\n"
            f"sys.argv = {['memfree', *command]!r}\n"
            f"ResultsLock({str(folder)!r}).acquire()\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n"
        )
        process = subprocess.Popen(
            [sys.executable, "-c", script],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(process)
        assert process.stdout is not None and process.stdout.readline() == "held\n"
        return process

    yield hold
    for process in started:
        process.kill()
        process.wait()


def test_a_second_eval_into_one_folder_is_refused_at_once_naming_the_first(
    tmp_path: Path, setup: Any, other_process: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    _, arguments, _ = setup
    out = tmp_path / "shared"
    first = other_process(out, "eval", "discoverable", "--out", str(out))
    capsys.readouterr()
    assert cli_main([*arguments, "--out", str(out)]) == 2
    error = error_of(capsys)
    assert error.startswith(
        f"memfree: error: {out}: another memfree run is writing there (pid {first.pid} on "
        f"{socket.gethostname()}, started "
    )
    assert error.endswith(
        f": memfree eval discoverable --out {out}); wait for it to finish, or choose another --out"
    )
    assert not (out / "records.jsonl").exists() and not (out / "settings.json").exists()
    # The kernel drops the lock of a process that dies: the next run goes ahead.
    first.kill()
    first.wait()
    assert cli_main([*arguments, "--out", str(out)]) == 0
    lines = (out / "records.jsonl").read_text().splitlines()
    assert len(lines) == 2 * 2  # examples x defenses, each once


def test_the_library_run_takes_the_lock_too(
    tmp_path: Path, setup: Any, tokenizer: Any, other_process: Any
) -> None:
    root, _, model = setup
    settings = ExperimentSettings(
        corpus=(str(root / "corpus"),), num_examples=1, prompt_tokens=5, truth_tokens=5
    )
    first = other_process(tmp_path / "run")
    with pytest.raises(
        ValueError, match=rf"another memfree run is writing there \(pid {first.pid}"
    ):
        run_memorization(
            settings, tmp_path / "run", model, tokenizer, NgramFilter.open(root / "f.memfree")
        )


def test_a_second_audit_insert_into_one_folder_is_refused(
    tmp_path: Path, other_process: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.txt").write_text("one\ntwo\n")
    out = tmp_path / "planted"
    first = other_process(out, "audit", "insert", "a.txt", "-o", str(out))
    insert = ["audit", "insert", str(tmp_path / "a.txt"), "-o", str(out), "--format", "pin {dd}"]
    capsys.readouterr()
    assert cli_main(insert) == 2
    error = error_of(capsys)
    assert error.startswith(f"memfree: error: {out}: another memfree run is writing there (pid ")
    assert f"pid {first.pid} " in error and error.endswith("or choose another -o")
    assert not (out / "manifest.json").exists()
    first.kill()
    first.wait()
    assert cli_main(insert) == 0 and (out / "manifest.json").exists()


# -- item 6: a record that is there twice, or is another run's, is refused ------------------------


def _append(path: Path, record: dict[str, Any]) -> int:
    """Append a record; its line number."""
    lines = path.read_text().splitlines()
    path.write_text("\n".join([*lines, json.dumps(record)]) + "\n")
    return len(lines) + 1


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            {},
            "a second record of example {id!r}, style 'original', defense 'none' (the first is "
            "line 1); two runs wrote into this folder at once, or lines were copied: delete one of "
            "the two lines (the run generates a deleted record again)",
        ),
        (
            {"example_id": "elsewhere.txt#3"},
            "a record of example 'elsewhere.txt#3', which is not "
            "among this run's examples (examples.jsonl): another run's record; delete that line (the "
            "run generates its own records), or give the run its own --out",
        ),
        (
            {"style": "upper"},
            "a record of style 'upper', which is not among this run's styles "
            "(original): another run's record",
        ),
        (
            {"defense": "censor"},
            "a record of defense 'censor', which is not among this run's "
            "defenses (none memfree): another run's record",
        ),
    ],
    ids=["duplicate", "example", "style", "defense"],
)
def test_a_duplicate_or_foreign_record_is_refused_naming_its_line(
    tmp_path: Path,
    setup: Any,
    change: dict[str, Any],
    problem: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root, arguments, _ = setup
    out = tmp_path / "run"
    shutil.copytree(root / "run", out)
    records = out / "records.jsonl"
    first = json.loads(records.read_text().splitlines()[0])
    assert first["defense"] == "none"
    number = _append(records, {**first, **change})
    before = files_of(out)
    capsys.readouterr()
    assert cli_main([*arguments, "--out", str(out)]) == 2
    expected = problem.format(id=first["example_id"])
    assert error_of(capsys).startswith(f"memfree: error: {records}:{number}: {expected}")
    assert files_of(out) == before  # nothing dropped, nothing rewritten


# -- item 21: what cannot be done as asked is said, in the options' names -------------------------


def test_eval_refuses_more_examples_than_the_corpus_holds(
    tmp_path: Path, setup: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    root, arguments, _ = setup
    arguments = [*arguments]
    arguments[arguments.index("--num-examples") + 1] = "4"  # 3 documents, one example each
    out = tmp_path / "run"
    capsys.readouterr()
    assert cli_main([*arguments, "--out", str(out)]) == 2
    assert error_of(capsys) == (
        f"memfree: error: --num-examples 4: {root / 'corpus'} holds only 3 documents of at least "
        "10 tokens (prompt and truth), and each gives one example; ask for --num-examples 3 or "
        "fewer, give a larger corpus, or shorten --prompt-tokens/--truth-tokens"
    )
    assert not out.exists()  # nothing left behind: the same --out takes the fixed command
    arguments[arguments.index("--num-examples") + 1] = "3"
    assert cli_main([*arguments, "--out", str(out)]) == 0


def test_audit_extractable_refuses_more_examples_than_the_corpus_holds(
    tmp_path: Path, setup: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _, _ = setup
    command = ["audit", "extractable", str(root / "corpus"), "--model", str(root / "model")]
    command += ["--k", "4", "--m", "4", "--num-examples", "5", "--out", str(tmp_path / "x")]
    capsys.readouterr()
    assert cli_main(command) == 2
    assert error_of(capsys).startswith(
        f"memfree: error: --num-examples 5: {root / 'corpus'} holds only 3 documents of at least "
        "8 tokens"
    )
    assert not (tmp_path / "x").exists()


def test_audit_insert_refuses_its_input_file_as_the_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    corpus = tmp_path / "a.txt"
    corpus.write_text("one\ntwo\n")
    assert cli_main(["audit", "insert", str(corpus), "-o", str(corpus)]) == 2
    assert error_of(capsys) == (
        f"memfree: error: {corpus}: is the corpus file {corpus} given as input, not a folder; -o "
        "names the folder that gets the planted corpus.jsonl and manifest.json: choose another "
        "-o, e.g. a new folder"
    )
    assert corpus.read_text() == "one\ntwo\n"


def test_audit_insert_with_force_never_replaces_its_own_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "a.txt").write_text("one\ntwo\n")
    out = tmp_path / "planted"
    assert cli_main(["audit", "insert", str(tmp_path / "a.txt"), "-o", str(out)]) == 0
    planted = (out / "corpus.jsonl").read_bytes()
    again = ["audit", "insert", str(out / "corpus.jsonl"), "-o", str(out), "--force"]
    assert cli_main(again) == 2
    assert error_of(capsys).startswith(
        f"memfree: error: {out / 'corpus.jsonl'}: is an input of this run"
    )
    assert (out / "corpus.jsonl").read_bytes() == planted


@pytest.mark.parametrize(
    ("command", "message"),
    [
        (["eval", "discoverable", "--seed", "-1"], "--seed must be from 0 to 4294967295, got -1"),
        (["eval", "styles", "--seed", "4294967296"], "--seed must be from 0 to 4294967295"),
        (["audit", "insert", "a.txt", "-o", "o", "--seed", "-1"], "--seed must be from 0 to"),
        (["audit", "exposure", "--manifest", "m", "--model", "x", "--seed", "-1"], "--seed must"),
        (["audit", "extractable", "a.txt", "--model", "x", "--seed", "-1"], "--seed must be"),
        (
            ["eval", "discoverable", "--bleu-threshold", "2"],
            "--bleu-threshold must be a number from 0 to 1, got 2.0",
        ),
        (
            ["eval", "discoverable", "--batch-size", "0"],
            "--batch-size must be an integer >= 1, got 0",
        ),
        (
            ["eval", "styles", "--truth-tokens", "0"],
            "--truth-tokens must be an integer >= 1, got 0",
        ),
        (["eval", "discoverable", "--text-field", ""], "--text-field must not be empty"),
        (["eval", "styles", "--styles", "nope"], "--styles: unknown style 'nope'; known: "),
        (
            ["audit", "insert", "a.txt", "-o", "o", "--format", "pin {word}"],
            "--format: a {word} hole needs a list of at least two distinct words (give them with "
            "--words FILE)",
        ),
        (
            ["audit", "insert", "a.txt", "-o", "o", "--format", "pin {d}", "--repetitions"]
            + [str(count) for count in range(1, 12)],
            "--repetitions and --per-repetition ask for 11 distinct canaries, but the format "
            "'pin {d}' has only 10 (|R|); plant fewer, or give --format more holes",
        ),
    ],
)
def test_every_bad_setting_is_named_by_its_option(
    tmp_path: Path,
    command: list[str],
    message: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_text("one\ntwo\n")
    if command[0] == "eval":
        command = [*command, "--model", "x", "--out", "out"]
    assert cli_main(command) == 2
    assert error_of(capsys).startswith(f"memfree: error: {message}")
    assert not (tmp_path / "out").exists() and not (tmp_path / "o").exists()


@pytest.mark.parametrize("force", [False, True])
def test_a_damaged_audit_json_is_named_never_replaced(tmp_path: Path, force: bool) -> None:
    """A folder whose audit.json cannot be read cannot be told apart: refused, naming the file,
    even with --force (a damaged record of an unknown run is never replaced)."""
    folder = tmp_path / "audit"
    folder.mkdir()
    (folder / "audit.json").write_text('{"guarded": {"by_repetitions": [')
    with pytest.raises(ValueError, match=r"audit\.json: cannot be read \(not JSON") as refused:
        check_results_dir(folder, "exposure", force=force)
    assert "another --out" in str(refused.value)
    assert (folder / "audit.json").read_text() == '{"guarded": {"by_repetitions": ['
