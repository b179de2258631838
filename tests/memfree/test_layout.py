"""The layout's promises: the public import paths operators and users rely on stay where they
were, one ``open_filter`` reads every format by its magic bytes, a tokenizer is read once into a
:class:`TokenizerInfo`, and the adapters ask the masker how much of a row it reads."""

from __future__ import annotations

import ast
import importlib.metadata
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import memfree
from memfree.core import MaskerOptions
from memfree.core.token import TokenMasker
from memfree.engines.rows import RowGuard
from memfree.engines.setup import GuardSetup
from memfree.filterfile import open_filter, pybloom
from memfree.filterfile.bloom.reader import NgramFilter
from memfree.testing import word_filter_from_texts
from memfree.vocab.info import TokenizerInfo
from memfree.vocab.token_bytes import token_bytes
from memfree.vocab.tokenizer import special_token_ids, tokenizer_fingerprint

ROOT = Path(__file__).resolve().parents[2]


def test_public_paths_name_the_same_objects() -> None:
    from memfree.engines import llama_cpp, transformers, vllm
    from memfree.filter import NgramFilter as PublicFilter
    from memfree.integrations.llama_cpp import MemFreeLlamaCppLogitsProcessor
    from memfree.integrations.vllm import MemFreeV1LogitsProcessor, MemFreeV2LogitsProcessor
    from memfree.processor import MemFreeLogitsProcessor

    assert MemFreeLogitsProcessor is transformers.MemFreeLogitsProcessor
    assert memfree.MemFreeLogitsProcessor is MemFreeLogitsProcessor
    assert PublicFilter is NgramFilter is memfree.NgramFilter
    assert MemFreeV1LogitsProcessor is vllm.MemFreeV1LogitsProcessor
    assert MemFreeV2LogitsProcessor is vllm.MemFreeV2LogitsProcessor
    assert MemFreeLlamaCppLogitsProcessor is llama_cpp.MemFreeLlamaCppLogitsProcessor


def test_every_layout_opens_as_an_ngram_filter_with_a_name_of_its_own(tmp_path: Path) -> None:
    """``NgramFilter.open`` of a default build (the prefix index), a Bloom file and a
    pybloomfiltermmap3 file is an ``NgramFilter`` (the README's quick start), each reader a class
    of its own; and no two public classes share a name."""
    from memfree.filterfile.bloom.reader import BloomFilter
    from memfree.filterfile.index.reader import IndexFilter

    ngrams = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int64)
    paths = {
        BloomFilter: NgramFilter.from_ngrams(tmp_path / "b.memfree", ngrams).path,
        IndexFilter: IndexFilter.from_ngrams(tmp_path / "i.memfree", ngrams, vocab_size=8).path,
    }
    writer = pybloom.PybloomWriter(capacity=2, error_rate=0.01, hash_seed=1)
    writer.add_ngrams(ngrams)
    paths[pybloom.PybloomNgramFilter] = writer.write(
        tmp_path / "p.bloom", {"tokenizer": "toy", "unit": "token"}, 2
    )
    for reader, path in paths.items():
        opened = NgramFilter.open(path)
        assert type(opened) is reader and isinstance(opened, NgramFilter)
        assert isinstance(open_filter(path), NgramFilter) and opened.contains(ngrams).all()
    assert len({reader.__name__ for reader in paths} | {"NgramFilter"}) == 4
    public = {
        name: obj
        for module in (memfree, memfree.filter, memfree.processor, memfree.integrations.vllm)
        for name in getattr(module, "__all__", ())
        if isinstance(obj := getattr(module, name), type)
    }
    names: dict[str, type] = {}
    for name, cls in public.items():
        assert names.setdefault(cls.__name__, cls) is cls, f"two public classes named {name}"


def test_every_exception_of_the_guard_lives_in_errors_py_with_its_right_parent() -> None:
    """One home for the exceptions users act on (their old import paths still work), and each
    under the right parent: a bad server configuration is a setting's error, not a filter's."""
    from memfree import errors
    from memfree.engines.policy import ServingConfigError

    defined = [
        f"{path.relative_to(ROOT)}: {node.name}"
        for path in (ROOT / "memfree").rglob("*.py")
        if path.name != "errors.py"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef) and node.name.endswith("Error")
    ]  # (an internal signal such as fileio's LockHeld is caught and worded by its caller)
    assert defined == []
    assert ServingConfigError is errors.ServingConfigError
    assert issubclass(ServingConfigError, errors.SettingError)
    assert not issubclass(ServingConfigError, errors.FilterError)
    assert issubclass(errors.CanonicalUnsupportedError, errors.UnsupportedTokenizerError)


def test_version_comes_from_the_package_metadata() -> None:
    assert memfree.__version__ == importlib.metadata.version("memfree")


#: A module holds one structure or one algorithm: the anchors' single structures run 420-750
#: lines (issue 36 replaced a 400-line cap that cut algorithms across files); past this is bloat.
MODULE_LINE_BUDGET = 750


def test_no_module_exceeds_its_budget() -> None:
    long = {
        str(path.relative_to(ROOT)): count
        for package in ("memfree", "bloom_builder", "eval")
        for path in (ROOT / package).rglob("*.py")
        if (count := len(path.read_text(encoding="utf-8").splitlines())) > MODULE_LINE_BUDGET
    }
    assert not long, f"cut these along their seams: {long}"


def _documented_modules() -> dict[str, dict[str, str]]:
    """docs/layout.md's module tables: folder -> module file -> its line."""
    import re

    listed: dict[str, dict[str, str]] = {}
    folder = None
    for line in (ROOT / "docs" / "layout.md").read_text(encoding="utf-8").splitlines():
        heading = re.match(r"### `([^`]+)/`", line)
        if heading:
            folder = heading.group(1)
            listed.setdefault(folder, {})
        elif line.startswith("## "):
            folder = None
        elif folder and (row := re.match(r"\| `([^`]+\.py)` \| (.*) \|$", line)):
            listed[folder][row.group(1)] = row.group(2)
    return listed


def test_layout_md_names_every_module_and_only_those() -> None:
    """docs/layout.md lists every folder of the three packages and every module in it, and
    nothing that is not there (it had drifted: a folder that was renamed, two modules missing)."""
    listed = _documented_modules()
    folders = {
        str(path.parent.relative_to(ROOT))
        for package in ("memfree", "bloom_builder", "eval")
        for path in (ROOT / package).rglob("*.py")
    }
    assert sorted(folders - set(listed)) == [], "folders docs/layout.md does not describe"
    assert sorted(set(listed) - folders) == [], "folders docs/layout.md names that do not exist"
    for folder, modules in listed.items():
        real = {path.name for path in (ROOT / folder).glob("*.py")}
        assert sorted(real - set(modules)) == [], f"{folder}: modules docs/layout.md misses"
        assert sorted(set(modules) - real) == [], f"{folder}: modules docs/layout.md invents"
        assert all(line.strip() for line in modules.values()), folder


def test_every_relative_link_in_the_docs_names_a_file_that_is_there() -> None:
    """README.md and docs/*.md link only to files of this repository that exist (a page renamed
    or a file moved fails here, not in a reader's browser)."""
    import re

    broken = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL, or a place on the same page
            path = (page.parent / target.split("#", 1)[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_no_library_message_names_a_decoding_flag() -> None:
    """DecodingSettings' errors name fields; the command lines translate them to flags."""
    source = (ROOT / "memfree" / "generation.py").read_text(encoding="utf-8")
    strings = [
        node.value
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    assert not [text for text in strings if "--" in text]


# -- one open_filter for every format --------------------------------------------------------------


def test_open_filter_dispatches_on_magic_bytes(tmp_path: Path) -> None:
    ngrams = np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int64)
    native = NgramFilter.from_ngrams(tmp_path / "n.memfree", ngrams)
    writer = pybloom.PybloomWriter(capacity=2, error_rate=0.01, hash_seed=1)
    writer.add_ngrams(ngrams)
    bloom = writer.write(tmp_path / "p.bloom", {"tokenizer": "toy", "unit": "token"}, 2)
    opened = open_filter(tmp_path / "n.memfree")
    assert isinstance(opened, NgramFilter) and opened.layout == native.layout
    other = open_filter(bloom)
    assert isinstance(other, pybloom.PybloomNgramFilter)
    for filt in (opened, other):
        assert filt.contains(ngrams).all()
    assert open_filter(native) is native  # an open filter is returned as it is
    assert isinstance(NgramFilter.open(bloom), pybloom.PybloomNgramFilter)
    with pytest.raises(TypeError, match="ngram_filter must be"):
        open_filter(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unexpected arguments"):
        open_filter(tmp_path / "n.memfree", ngram_size=3)


# -- TokenizerInfo ---------------------------------------------------------------------------------


def test_tokenizer_info_reads_the_tokenizer_once(tokenizer: Any) -> None:
    info = TokenizerInfo.of(tokenizer)
    assert TokenizerInfo.of(info) is info
    assert info.vocab_size == len(tokenizer)
    assert info.eos_token_id == tokenizer.eos_token_id
    assert info.pad_token_id == tokenizer.pad_token_id
    assert info.special_token_ids == special_token_ids(tokenizer)
    assert info.fingerprint == tokenizer_fingerprint(tokenizer)
    assert info.token_bytes == tuple(token_bytes(tokenizer))
    assert info.token_bytes is info.token_bytes  # computed once
    text = "def add(a, b):\n    return a + b\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert info.encode(text) == ids and info.decode(ids) == tokenizer.decode(ids)
    with pytest.raises(TypeError, match="Hugging Face tokenizer"):
        TokenizerInfo.of(None)


def test_guard_setup_reads_ids_from_the_info(tmp_path: Path, tokenizer: Any) -> None:
    filt = NgramFilter.from_ngrams(
        tmp_path / "f.memfree",
        np.array([[5, 6, 7]]),
        metadata={
            "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer),
            "special_token_ids": list(special_token_ids(tokenizer)),
        },
    )
    from_info = GuardSetup.create(filt, TokenizerInfo.of(tokenizer))
    from_tokenizer = GuardSetup.create(filt, tokenizer)
    assert from_info.special_token_ids == from_tokenizer.special_token_ids
    assert from_info.eos_token_ids == (tokenizer.eos_token_id,)
    assert tokenizer.pad_token_id in from_info.special_token_ids


# -- the masker says what it reads -----------------------------------------------------------------


def test_adapters_read_as_much_of_a_row_as_the_masker_does(tmp_path: Path, tokenizer: Any) -> None:
    token_filter = NgramFilter.from_ngrams(tmp_path / "t.memfree", np.array([[5, 6, 7]]))
    word_filter = word_filter_from_texts(tmp_path / "w.memfree", ["the quick brown fox"], 2)
    token = GuardSetup.create(token_filter, eos_token_id=0)
    word = GuardSetup.create(word_filter, tokenizer)
    assert token.masker.context_width == 2 and RowGuard(token).window == 2
    assert word.masker.context_width is None and RowGuard(word).window is None
    banned, _ = RowGuard(token).banned([[9, 9, 5, 6], [5, 6, 9]], 10)
    assert banned[0, 7] and not banned[1].any()


def test_masker_options_change_how_not_what(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    stored = rng.integers(0, 20, (40, 3))
    filt = NgramFilter.from_ngrams(tmp_path / "f.memfree", stored)
    rows = rng.integers(0, 20, (16, 5))
    rows[::2, -2:] = stored[:8, :2]  # half the rows end with a stored prefix
    tensor = torch.from_numpy(rows)
    masks = [
        TokenMasker(filt, [], MaskerOptions(skip_rows=skip)).banned_mask(tensor, 24)[0]
        for skip in (True, False)
    ]
    assert torch.equal(masks[0], masks[1]) and masks[0].any()
