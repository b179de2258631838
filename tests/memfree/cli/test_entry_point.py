"""The ``memfree`` entry point: every command listed and dispatched to the module that defines it,
defaults read from the settings dataclasses, nothing heavy imported to show the help."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memfree.cli import COMMANDS, build_parser, command_module, main

# A command line of each command that parses (what the files name need not exist).
MINIMAL = {
    "build": ["build", "corpus.txt", "-o", "out.memfree"],
    "info": ["info", "f.memfree"],
    "tables": ["tables"],
    "generate": ["generate", "--filter", "f.memfree", "--prompt", "def"],
    "eval": ["eval", "discoverable"],
    "audit": ["audit", "insert", "corpus.txt", "-o", "planted"],
}


def parse(argv: list[str]) -> argparse.Namespace:
    return build_parser(argv).parse_args(argv)


def test_help_lists_the_six_commands(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["--help"])
    assert stopped.value.code == 0
    listing = capsys.readouterr().out
    assert list(COMMANDS) == ["build", "info", "tables", "generate", "eval", "audit"]
    for name, command in COMMANDS.items():
        assert f"    {name}" in listing and command.help in listing


@pytest.mark.parametrize(
    "argv",
    [
        [name, *steps, "--help"]
        for name, steps in [
            ("build", []),
            ("info", []),
            ("generate", []),
            ("eval", []),
            ("eval", ["discoverable"]),
            ("eval", ["styles"]),
            ("eval", ["utility"]),
            ("audit", []),
            ("audit", ["insert"]),
            ("audit", ["extractable"]),
            ("audit", ["exposure"]),
            ("audit", ["extract"]),
        ]
    ],
)
def test_every_command_has_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: memfree {' '.join(argv[:-1])}")


def test_an_unknown_command_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["bulid", "x"])
    assert stopped.value.code == 2
    assert "invalid choice: 'bulid'" in capsys.readouterr().err


@pytest.mark.parametrize("name", list(MINIMAL))
def test_each_command_runs_its_own_module(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module = command_module(name)
    assert module.__name__ == COMMANDS[name].module
    seen: list[argparse.Namespace] = []

    def run(args: argparse.Namespace) -> int:
        seen.append(args)
        return 7

    monkeypatch.setattr(module, "run", run)
    assert main(MINIMAL[name]) == 7
    assert [args.command for args in seen] == [name]


def test_the_subcommands_live_with_their_packages() -> None:
    assert COMMANDS["build"].module == "bloom_builder.cli"
    assert COMMANDS["eval"].module.startswith("eval.cli")
    assert COMMANDS["audit"].module.startswith("eval.cli")
    assert {COMMANDS[name].module for name in ("info", "generate")} == {
        "memfree.cli.info",
        "memfree.cli.generate",
    }


@pytest.mark.parametrize(
    "argv", [["--help"], ["info", "--help"], ["audit", "--help"], ["build", "--help"]]
)
def test_help_imports_no_torch(argv: list[str]) -> None:
    """The listing and the light commands' help load neither torch nor other commands."""
    probe = (
        "import sys\n"
        "from memfree.cli import main\n"
        "try:\n"
        "    main(sys.argv[1:])\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = ['torch', 'transformers', 'bloom_builder.build', 'eval.experiments']\n"
        "print(sorted(m for m in heavy if m in sys.modules), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, *argv], capture_output=True, text=True, check=True
    )
    assert done.stderr.strip().splitlines()[-1] == "[]"


def test_python_dash_m_memfree_cli_runs_the_entry_point() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "memfree.cli", "info", "/nonexistent/f.memfree"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("memfree: error: ")


# -- defaults: the CLI shows the settings dataclasses' ------------------------------------------


def test_build_defaults_are_build_settings() -> None:
    from bloom_builder.cli import settings_from_args
    from bloom_builder.settings import BuildSettings

    assert settings_from_args(parse(MINIMAL["build"])) == BuildSettings()


def test_build_sizes_are_shown_as_they_are_typed() -> None:
    from bloom_builder.cli import format_size
    from bloom_builder.settings import parse_size

    for size in (1, 1000, 16 << 20, 2 << 30, 3 << 40, (1 << 20) + 1):
        assert parse_size(format_size(size)) == size
    assert (format_size(2 << 30), format_size(4 << 20)) == ("2G", "4M")


@pytest.mark.parametrize("experiment", ["discoverable", "styles"])
def test_eval_defaults_are_experiment_settings(experiment: str) -> None:
    from eval.cli.evaluate import experiment_defaults, settings_from_args
    from eval.settings import ExperimentSettings

    settings = settings_from_args(parse(["eval", experiment]))
    assert settings == experiment_defaults(experiment)
    base = ExperimentSettings(experiment=experiment)
    if experiment == "discoverable":  # the dataclass's own defaults, field by field
        assert settings == base
    else:  # the styles experiment differs only where it says so
        changed = {
            f.name
            for f in dataclasses.fields(base)
            if getattr(settings, f.name) != getattr(base, f.name)
        }
        assert changed == {"styles", "defenses", "metrics"}
        assert (
            dataclasses.replace(settings.metrics, normalize=base.metrics.normalize) == base.metrics
        )


@pytest.mark.parametrize(
    "argv",
    [
        ["audit", "insert", "corpus.txt", "-o", "planted"],
        ["audit", "extractable", "corpus.txt"],
        ["audit", "exposure", "--manifest", "m", "--model", "x"],
        ["audit", "extract", "--manifest", "m", "--model", "x"],
    ],
)
def test_audit_defaults_are_audit_settings(argv: list[str]) -> None:
    from eval.cli.audit import settings_from_args
    from eval.settings import AuditSettings

    assert settings_from_args(parse(argv)) == AuditSettings()


def test_every_audit_setting_is_an_option_of_some_step() -> None:
    from eval.cli.audit import _OPTION_FIELDS
    from eval.settings import AuditSettings

    assert set(_OPTION_FIELDS.values()) == {f.name for f in dataclasses.fields(AuditSettings)}


def test_generate_defaults_are_decoding_settings() -> None:
    from memfree.cli.generate import decoding_settings
    from memfree.generation import DecodingSettings

    assert decoding_settings(parse(MINIMAL["generate"])) == DecodingSettings()


# -- audit: lengths named as eval names them, the old names kept ---------------------------------


def test_audit_extractable_takes_eval_length_names_and_the_old_ones() -> None:
    from eval.cli.audit import settings_from_args

    new = parse(["audit", "extractable", "c", "--prompt-tokens", "4", "8", "--truth-tokens", "6"])
    old = parse(["audit", "extractable", "c", "--k", "4", "8", "--m", "6"])
    assert vars(new) == vars(old)
    settings = settings_from_args(new)
    assert (settings.prompt_lengths, settings.truth_tokens) == ((4, 8), 6)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--k", "0", "4"], "--prompt-tokens (--k) must be integers >= 1, got 0 4"),
        (["--prompt-tokens", "-1"], "--prompt-tokens (--k)"),
        (["--m", "0"], "--truth-tokens (--m) must be an integer >= 1, got 0"),
        (["--num-examples", "0"], "--num-examples"),
        (["--per-bucket", "0"], "--per-bucket"),
    ],
)
def test_audit_extractable_refuses_bad_lengths_before_loading_anything(
    options: list[str], named: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["audit", "extractable", "/nonexistent", "--model", "x", *options]) == 2
    assert capsys.readouterr().err.startswith(f"memfree: error: {named}")


# -- checks left to the library ----------------------------------------------------------------


def test_eval_utility_leaves_the_tokenizer_check_to_the_guard(
    tmp_path: Path, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from memfree.filterfile.bloom.reader import NgramFilter

    (tmp_path / "texts.txt").write_text("def add(a, b):\n    return a + b\n")
    NgramFilter.from_ngrams(
        tmp_path / "f.memfree",
        np.array([[1, 2, 3]]),
        metadata={"tokenizer_fingerprint": "feedfacefeedface", "tokenizer": "other"},
    )
    argv = ["eval", "utility", str(tmp_path / "texts.txt"), "--filter", str(tmp_path / "f.memfree")]
    assert main([*argv, "--tokenizer", str(tokenizer_dir)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(
        f"memfree: error: {tmp_path / 'f.memfree'}: built with tokenizer 'other'"
    )
    assert "feedfacefeedface" in error


def test_eval_utility_counts_with_the_filter_s_own_tokenizer(
    tmp_path: Path, tokenizer: Any, tokenizer_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from memfree.filterfile.bloom.reader import NgramFilter
    from memfree.vocab.tokenizer import tokenizer_fingerprint

    text = "def add(a, b):\n    return a + b\n"
    (tmp_path / "texts.txt").write_text(text)
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    NgramFilter.from_ngrams(
        tmp_path / "f.memfree",
        np.array([ids[:3]]),
        metadata={"tokenizer_fingerprint": tokenizer_fingerprint(tokenizer)},
    )
    argv = ["eval", "utility", str(tmp_path / "texts.txt"), "--filter", str(tmp_path / "f.memfree")]
    assert main([*argv, "--tokenizer", str(tokenizer_dir), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["texts"] == 1 and result["texts_with_stored_ngram"] == 1
