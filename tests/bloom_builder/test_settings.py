"""BuildSettings' errors name fields and values (SettingError); `memfree build` says them in its
options' words through one table (bloom_builder.cli.FLAGS), exactly as it always has; the named
choices (unit, executor, output format) are Literal types checked once."""

from __future__ import annotations

import argparse
import ast
import importlib.util
from pathlib import Path
from typing import Any, get_args

import pytest

from bloom_builder.choices import EXECUTORS, FORMATS, UNITS, ExecutorName, OutputFormat, UnitName
from bloom_builder.cli import FLAGS, NONE_SPELLED, add_arguments, setting_message
from bloom_builder.errors import BuildError
from bloom_builder.executors.ray_join import ADDRESS_FIX, ray_address_problem
from bloom_builder.settings import BuildSettings
from bloom_builder.write import UnreachableRateError, _size_for
from memfree.cli import main as cli_main
from memfree.errors import SettingError
from memfree.units import UNIT_NAMES

ROOT = Path(__file__).resolve().parents[2]
HAS_RAY_CLIENT = importlib.util.find_spec("grpc") is not None
RAY_FIX = ADDRESS_FIX.replace("ray_address", "--ray-address")

# What `memfree build` printed for each bad setting before library errors named fields: the
# same words, to the byte (after "memfree: error: ").
CLI_ERRORS = [
    (["--n", "0"], "--n must be an integer >= 1, got 0"),
    (["--n", "65"], "--n must be at most 64, got 65"),
    (["--min-count", "0"], "--min-count must be an integer >= 1, got 0"),
    (["--fpr", "2"], "--fpr must be in (0, 1), got 2.0"),
    (["--fpr", "-1"], "--fpr must be in (0, 1), got -1.0"),
    (
        ["--fpr", "1e-300", "--layout", "blocked-512"],
        "--fpr 1e-300 cannot be reached: no filter of this format goes below 3.1e-49 (one n-gram "
        "in 2**32 blocks); raise --fpr (1e-3 to 1e-6 is the usual range)",
    ),
    (
        ["--fpr", "1e-300"],
        "--fpr 1e-300 cannot be reached: no prefix index goes below 1.4e-17 (a 56-bit prefix "
        "remainder); raise --fpr (1e-5 to 1e-9 is the usual range)",
    ),
    (["--prefix-fpr", "2"], "--prefix-fpr must be in (0, 1) (or 0 for no prefix section), got 2.0"),
    (
        ["--prefix-fpr", "-0.5"],
        "--prefix-fpr must be in (0, 1) (or 0 for no prefix section), got -0.5",
    ),
    (
        ["--prefix-fpr", "1e-300"],
        "--prefix-fpr 1e-300 cannot be reached: no filter of this format goes below 3.1e-49 (one "
        "n-gram in 2**32 blocks); raise --prefix-fpr (1e-3 to 1e-6 is the usual range)",
    ),
    (
        ["--format", "pybloomfiltermmap3"],
        "--unit word writes the memfree format only (pybloomfiltermmap3 files hash token ids)",
    ),
    (
        ["--tokenizer", "x"],
        "--unit word needs no tokenizer: drop --tokenizer (one filter serves every model)",
    ),
    (["--workers", "0"], "--workers must be an integer >= 1, got 0"),
    (["--memory-limit", "1K"], "--memory-limit must be at least 16M, got 1024 bytes"),
    (["--memory-limit", "lots"], "cannot read 'lots' as a size; write e.g. 512M or 2G"),
    (["--partitions", "3"], "--partitions must be a power of two in [1, 4096], got 3"),
    (["--partitions", "8192"], "--partitions must be a power of two in [1, 4096], got 8192"),
    (["--shard-size", "0"], "--shard-size must be at least 1 byte, got 0"),
    (["--text-field", ""], "--text-field must not be empty"),
    (["--ids-field", "x"], "--ids-field reads token ids: it needs --unit token, not --unit word"),
    (["--unit", "token", "--ids-field", ""], "--ids-field must not be empty"),
    (["--ray-address", "auto"], "--ray-address needs --executor ray"),
    (["--executor", "ray", "--ray-address", " "], f"--ray-address is empty; {RAY_FIX}"),
    (
        ["--executor", "ray", "--ray-address", "garbage::::"],
        f"--ray-address 'garbage::::' is not HOST:PORT; {RAY_FIX}",
    ),
    (
        ["--executor", "ray", "--ray-address", "http://127.0.0.1:8265"],
        f"--ray-address 'http://127.0.0.1:8265' is a http:// URL (a dashboard's?); {RAY_FIX}",
    ),
    (
        ["--executor", "ray", "--ray-address", "ray://"],
        "--ray-address 'ray://': a Ray Client address is ray://HOST:PORT (port 10001)",
    ),
    # A value that is also a field's name stays as the user wrote it.
    (
        ["--executor", "ray", "--ray-address", "workers:0"],
        f"--ray-address 'workers:0' is not HOST:PORT; {RAY_FIX}",
    ),
]


@pytest.mark.parametrize(("options", "expected"), CLI_ERRORS)
def test_the_cli_says_setting_errors_in_its_options_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], options: list[str], expected: str
) -> None:
    missing = tmp_path / "missing"  # were the corpus read, this would be the error
    unit = [] if "--unit" in options else ["--unit", "word"]
    command = ["build", str(missing), "-o", str(tmp_path / "f.memfree"), *unit, *options]
    assert cli_main(command) == 2
    assert capsys.readouterr().err == f"memfree: error: {expected}\n"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(HAS_RAY_CLIENT, reason="ray[client] is installed here")
def test_the_cli_names_the_ray_client_extra_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    command = ["build", str(tmp_path), "-o", str(tmp_path / "f.memfree"), "--unit", "word"]
    assert cli_main([*command, "--executor", "ray", "--ray-address", "ray://head:10001"]) == 2
    assert capsys.readouterr().err == (
        "memfree: error: --ray-address 'ray://head:10001' is a Ray Client address, which needs "
        "pip install 'ray[client]'; or run memfree on a node of the cluster with --ray-address "
        "auto (or HOST:PORT of its GCS)\n"
    )


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"ngram_size": 0}, "ngram_size", "ngram_size must be an integer >= 1, got 0"),
        ({"unit": "sentence"}, "unit", "unit must be one of token, word, got 'sentence'"),
        ({"output_format": "zip"}, "output_format", "output_format must be one of memfree, "),
        ({"unit": "word", "output_format": "pybloomfiltermmap3"}, "output_format", "unit word "),
        ({"unit": "word", "tokenizer": "x"}, "tokenizer", "--unit word needs no tokenizer"),
        ({"shard_bytes": 0}, "shard_bytes", "shard_bytes must be at least 1 byte, got 0"),
        ({"executor": "slurm"}, "executor", "executor must be local or ray, got 'slurm'"),
        ({"ray_address": "auto"}, "ray_address", "ray_address needs executor ray"),
        ({"executor": "ray", "ray_address": "h"}, "ray_address", "ray_address 'h' is not "),
        (
            {"prefix_false_positive_rate": 0.0},
            "prefix_false_positive_rate",
            "prefix_false_positive_rate must be in (0, 1) (or None for no prefix section), got 0.0",
        ),
        ({"hash_seed": -1}, "hash_seed", "hash_seed must fit in 64 bits, got -1"),
    ],
)
def test_library_errors_name_the_field_and_the_value(
    overrides: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(SettingError) as refused:
        BuildSettings(**overrides)
    assert refused.value.field == field
    assert str(refused.value).startswith(message)
    assert isinstance(refused.value, ValueError)  # what callers caught before
    assert BuildSettings().problem() is None


def test_no_settings_message_names_an_option() -> None:
    """BuildSettings' errors name fields; only the command line names its options."""
    source = (ROOT / "bloom_builder" / "settings.py").read_text(encoding="utf-8")
    strings = [
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    assert not [text for text in strings if "--" in text]
    for address in ("", "garbage::::", "http://h:1", "ray://", "ray://head:10001"):
        assert "--ray-address" not in (ray_address_problem(address) or "")


def test_flags_name_real_fields_and_real_options() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    options = {name for action in parser._actions for name in action.option_strings}
    fields = set(BuildSettings.__dataclass_fields__)
    assert set(FLAGS) <= fields and set(NONE_SPELLED) <= set(FLAGS)
    assert set(FLAGS.values()) <= options
    # Every field with an option is in the table but tokenizer and follow_symlinks (see FLAGS);
    # batch_documents and hash_seed have no option.
    assert fields - set(FLAGS) == {"tokenizer", "follow_symlinks", "batch_documents", "hash_seed"}


def test_a_rate_unreachable_once_counted_is_a_setting_error_in_the_options_words() -> None:
    with pytest.raises(UnreachableRateError) as refused:
        _size_for(10**20, 1e-45, "false_positive_rate", "n-grams")
    error = refused.value
    assert isinstance(error, BuildError) and isinstance(error, SettingError)
    assert error.field == "false_positive_rate"
    assert setting_message(error) == (
        "--fpr 1e-45 cannot be reached for 100,000,000,000,000,000,000 n-grams: no filter of at "
        "most 2**32 blocks does; raise --fpr (the finished tasks are kept: a rerun with a higher "
        "rate reuses them)"
    )


def test_setting_message_keeps_quoted_values_and_other_flags() -> None:
    message = "ray_address 'unit' is not HOST:PORT; leave ray_address out, or pass --unit word"
    assert setting_message(SettingError(message, field="ray_address")) == (
        "--ray-address 'unit' is not HOST:PORT; leave --ray-address out, or pass --unit word"
    )
    # None is spelled 0 only for the field whose option says so.
    assert setting_message(SettingError("workers must not be None", field="workers")) == (
        "--workers must not be None"
    )


def test_the_choices_are_literal_types_checked_once() -> None:
    assert get_args(UnitName) == UNITS and set(UNITS) == set(UNIT_NAMES)
    assert EXECUTORS == get_args(ExecutorName) == ("local", "ray")
    assert FORMATS == get_args(OutputFormat) == ("memfree", "pybloomfiltermmap3")
    for field, bad in (("unit", "sentence"), ("executor", "slurm"), ("output_format", "zip")):
        with pytest.raises(SettingError) as refused:
            BuildSettings(**{field: bad})
        assert refused.value.field == field and f"got '{bad}'" in str(refused.value)
