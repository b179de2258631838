"""Corpora on object storage (issue 37, inputs): a real S3 API server (moto's, from PyPI) on
127.0.0.1, read through s3fs; no mock of memfree's own code. The same corpus built from local
files and from the bucket gives the same filter, but for the header naming its sources."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from bloom_builder.build import build_filter
from bloom_builder.errors import BuildError
from memfree import NgramFilter
from memfree.errors import MissingDependencyError
from tests.bloom_builder.test_build import WORDS, settings_for

pytest.importorskip("s3fs", reason="the s3 extra is not installed: run `make setup`")
pytest.importorskip("moto", reason="moto is not installed: run `make setup`")


def _corpus(directory: Path) -> Path:
    """Text, JSON lines (long enough to be read in several byte ranges), gzip, Parquet, a
    hidden file under the prefix."""
    rng = np.random.default_rng(7)
    directory.mkdir(parents=True)
    words = lambda count: " ".join(rng.choice(WORDS, count))  # noqa: E731
    (directory / "a.txt").write_text(words(300) + "\n")
    (directory / "sub").mkdir()
    (directory / "sub" / "b.txt").write_text(words(200) + "\n")
    lines = [json.dumps({"text": words(40)}) for _ in range(30)]
    (directory / "docs.jsonl").write_text("\n".join(lines) + "\n")
    with gzip.open(directory / "sub" / "more.jsonl.gz", "wt") as handle:
        handle.write("\n".join(json.dumps({"text": words(50)}) for _ in range(10)) + "\n")
    if importlib.util.find_spec("pyarrow"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table({"text": [words(60) for _ in range(12)]})
        pq.write_table(table, directory / "rows.parquet", row_group_size=4)
    (directory / ".hidden.txt").write_text(words(50) + "\n")
    return directory


def _upload(fs: Any, local: Path, prefix: str) -> None:
    for path in sorted(local.rglob("*")):
        if path.is_file():
            fs.put_file(str(path), f"{prefix}/{path.relative_to(local).as_posix()}")


def _payload(path: Path) -> tuple[dict[str, Any], bytes]:
    """A filter's header without the sources it names, and its bytes after the header."""
    metadata = json.loads(json.dumps(dict(NgramFilter.open(path).metadata)))
    sources = metadata["corpus"].pop("sources")
    assert sources
    length = int.from_bytes(path.read_bytes()[12:16], "little")
    start = -(-(24 + length) // 4096) * 4096
    return metadata, path.read_bytes()[start:]


def test_a_corpus_in_a_bucket_builds_the_filter_the_local_copy_builds(
    s3: Any, tmp_path: Path, tokenizer_dir: Path
) -> None:
    """A prefix (every object under it, hidden ones counted and left out) and a glob, each
    against the same files on disk: the same n-grams, the same bytes after the header, the same
    problems; with two workers and JSON lines cut into byte ranges (ranged reads)."""
    local = _corpus(tmp_path / "local")
    _upload(s3, local, "corpus/web")
    settings = settings_for(tokenizer_dir, workers=2)
    for local_spec, url in [
        (str(local), "s3://corpus/web"),
        (str(local / "**" / "*.jsonl*"), "s3://corpus/web/**/*.jsonl*"),
    ]:
        here = build_filter([local_spec], tmp_path / "here.memfree", settings, progress=False)
        there = build_filter([url], tmp_path / "there.memfree", settings, progress=False)
        assert _payload(tmp_path / "here.memfree") == _payload(tmp_path / "there.memfree"), url
        assert NgramFilter.open(tmp_path / "there.memfree").metadata["corpus"]["sources"] == [url]
        assert here.documents == there.documents > 0  # type: ignore[attr-defined]
        assert here.skipped["counts"] == there.skipped["counts"], url  # type: ignore[attr-defined]


def test_json_lines_in_a_bucket_are_read_in_byte_ranges_as_on_disk(s3: Any, tmp_path: Path) -> None:
    """A JSON lines object larger than the split size becomes byte-range units read by ranged
    requests; their documents, in order, are the local file's, and so is every unit."""
    from bloom_builder.sources import ProblemLog, SourceOptions, discover, documents_of

    local = _corpus(tmp_path / "local")
    _upload(s3, local, "corpus/ranges")
    options = SourceOptions(split_bytes=1024)
    read = {}
    for spec in (str(local / "docs.jsonl"), "s3://corpus/ranges/docs.jsonl"):
        problems = ProblemLog()
        units = discover([spec], options, problems)
        assert len(units) > 3 and not problems.to_dict()["counts"]
        documents = [doc.text for doc in documents_of(units, options, problems)]
        read[spec.startswith("s3://")] = ([(u.kind, u.start, u.stop) for u in units], documents)
    assert read[True] == read[False] and len(read[True][1]) == 30


def test_missing_objects_and_buckets_are_named_and_nothing_is_lost(
    s3: Any, tmp_path: Path, tokenizer_dir: Path
) -> None:
    """A key, a prefix or a bucket that does not exist is a "missing" problem naming the URL; a
    build with nothing else to read fails with that list, a build with more goes on without it."""
    s3.pipe_file("corpus/ok/a.txt", (" ".join(WORDS[:200]) + "\n").encode())
    settings = settings_for(tokenizer_dir)
    for missing in [
        "s3://corpus/ok/nothing.txt",
        "s3://no-such-bucket/x",
        "s3://corpus/none/*.txt",
    ]:
        with pytest.raises(BuildError, match="nothing to build") as caught:
            build_filter([missing], tmp_path / "f.memfree", settings, progress=False)
        assert "missing: 1" in str(caught.value) and missing in str(caught.value)
        assert not (tmp_path / "f.memfree").exists()
    summary = build_filter(
        ["s3://corpus/ok/a.txt", "s3://corpus/ok/gone.txt"], tmp_path / "f.memfree", settings,
        progress=False,
    )  # fmt: skip
    assert summary.skipped["counts"] == {"missing": 1}  # type: ignore[attr-defined]
    assert (tmp_path / "f.memfree").exists()


def test_a_changed_object_is_read_again(s3: Any, tmp_path: Path, tokenizer_dir: Path) -> None:
    """The reuse key of an object is its size and ETag: a kept work directory is reused for an
    unchanged bucket, and an object rewritten with other words of the same length is read
    again (its tasks are not reused)."""
    text = " ".join(WORDS[:300]) + "\n"
    s3.pipe_file("corpus/reuse/a.txt", text.encode())
    settings = settings_for(tokenizer_dir)
    out, work = tmp_path / "f.memfree", tmp_path / "work"

    def build() -> Any:
        return build_filter(
            ["s3://corpus/reuse"], out, settings, work_dir=work, keep_work=True, progress=False
        )

    first, again = build(), build()
    assert again.reused_tasks == first.map_tasks > 0
    s3.pipe_file("corpus/reuse/a.txt", text.upper().encode())  # the same size, other bytes
    changed = build()
    assert changed.reused_tasks == 0


@pytest.mark.parametrize(
    "url, words",
    [
        ("s3://AKIAKEY:secret@corpus/web", ["credentials", "environment"]),
        ("s3://corpus/web?versionId=3", ["query string"]),
        ("nosuchprotocol://corpus/web", ["knows no nosuchprotocol://"]),
    ],
    ids=["credentials", "query", "protocol"],
)
def test_urls_memfree_will_not_read_are_refused_before_anything_is_made(
    tmp_path: Path, tokenizer_dir: Path, url: str, words: list[str]
) -> None:
    """Credentials are never taken from a URL (they would land in the filter's header, a log
    line or an error): such a URL, and a query string or an unknown protocol, are refused with
    what to do, and the refusal does not repeat the secret."""
    with pytest.raises(BuildError) as caught:
        build_filter([url], tmp_path / "f.memfree", settings_for(tokenizer_dir), progress=False)
    message = str(caught.value)
    assert all(word in message for word in words) and "secret" not in message
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(bool(importlib.util.find_spec("gcsfs")), reason="gcsfs is installed")
def test_a_protocol_whose_package_is_missing_names_the_extra(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    with pytest.raises(MissingDependencyError, match=r"gcsfs.*memfree\[gcs\]"):
        build_filter(
            ["gs://bucket/web/*.jsonl"], tmp_path / "f.memfree", settings_for(tokenizer_dir)
        )
    assert not list(tmp_path.iterdir())


def test_a_filter_built_to_a_bucket_is_the_local_build_uploaded_whole(
    s3: Any, tmp_path: Path, tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``-o s3://...``: the same bytes as the local build of the same corpus, at the key; the
    staging folder in memfree's cache is gone afterwards, and the filter opens by URL. An
    object at the key that is not a filter is kept unless ``force``; a pybloomfiltermmap3 output
    takes its sidecar up with it."""
    from memfree.cli import main

    monkeypatch.setenv("MEMFREE_CACHE", str(tmp_path / "cache"))
    corpus = _corpus(tmp_path / "local")
    settings = settings_for(tokenizer_dir)
    local = tmp_path / "here.memfree"
    build_filter([str(corpus)], local, settings, progress=False)
    url = "s3://corpus/filters/web.memfree"
    summary = build_filter([str(corpus)], url, settings, progress=False)
    assert summary.output == url  # type: ignore[attr-defined]
    assert s3.cat_file(url[5:]) == local.read_bytes()
    assert not list((tmp_path / "cache" / "builds").iterdir())
    assert NgramFilter.open(url).num_ngrams == NgramFilter.open(local).num_ngrams
    s3.pipe_file("corpus/filters/notes.txt", b"someone's notes\n")
    argv = [
        "build",
        str(corpus),
        "-o",
        "s3://corpus/filters/notes.txt",
        "--tokenizer",
        str(tokenizer_dir),
    ]
    assert main(argv) == 2
    assert s3.cat_file("corpus/filters/notes.txt") == b"someone's notes\n"
    assert main([*argv, "--force", "--min-count", "1"]) == 0
    assert s3.cat_file("corpus/filters/notes.txt")[:8] == b"MEMFREE\0"
    pybloom = settings_for(tokenizer_dir, output_format="pybloomfiltermmap3")
    build_filter([str(corpus)], "s3://corpus/filters/web.bloom", pybloom, progress=False)
    assert s3.exists("corpus/filters/web.bloom") and s3.exists("corpus/filters/web.bloom.json")


def test_an_output_bucket_that_does_not_exist_is_refused_before_the_build(
    s3: Any, tmp_path: Path, tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEMFREE_CACHE", str(tmp_path / "cache"))
    corpus = _corpus(tmp_path / "local")
    with pytest.raises(BuildError, match="no-such-bucket"):
        build_filter([str(corpus)], "s3://no-such-bucket/f.memfree", settings_for(tokenizer_dir))
    assert not (tmp_path / "cache").exists()


class _Flaky:
    """A TCP proxy in front of the S3 server that resets its first ``resets`` connections (all
    of them with -1) and passes the others through: a store that drops connections. With
    ``reading``, a connection is also reset when a request on it starts with those bytes
    (``b"GET /bucket/prefix/"``: an object's bytes, not a listing or a HEAD)."""

    def __init__(self, target: tuple[str, int], resets: int, reading: bytes = b"") -> None:
        import socket
        import threading

        self.target, self.resets, self.reset, self.reading = target, resets, 0, reading
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.resets < 0 or self.reset < self.resets:
                self.reset += 1
                _reset(client)
                continue
            upstream = socket.create_connection(self.target)
            for source, sink, watch in ((client, upstream, self.reading), (upstream, client, b"")):
                threading.Thread(target=self._pipe, args=(source, sink, watch), daemon=True).start()

    def _pipe(self, source: Any, sink: Any, watch: bytes) -> None:
        try:
            while data := source.recv(1 << 16):
                if watch and (data.startswith(watch) or b"\r\n" + watch in data):
                    self.reset += 1
                    self._answer(source)
                    return
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for end in (source, sink):
                end.close()

    def _answer(self, client: Any) -> None:
        """What a watched request gets: its connection reset."""
        _reset(client)


def _reset(connection: Any) -> None:
    """Close with a reset (RST), not a clean end of stream."""
    import socket
    import struct

    connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    connection.close()


def _through(flaky: _Flaky, monkeypatch: pytest.MonkeyPatch, attempts: int = 2) -> None:
    """The S3 client pointed at ``flaky``, each request tried ``attempts`` times (botocore's
    ``AWS_MAX_ATTEMPTS``: 2 keeps a store that never answers quick to give up on)."""
    import s3fs

    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{flaky.port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", str(attempts))
    s3fs.S3FileSystem.clear_instance_cache()


def test_connections_the_store_drops_are_retried(
    s3: Any, tmp_path: Path, tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store resets the first two connections: its client retries them with backoff, and
    the build gives the filter it gives without them."""
    import os
    from urllib.parse import urlsplit

    import s3fs

    local = _corpus(tmp_path / "local")
    _upload(s3, local, "corpus/flaky")
    settings = settings_for(tokenizer_dir)
    build_filter(["s3://corpus/flaky"], tmp_path / "plain.memfree", settings, progress=False)
    endpoint = urlsplit(os.environ["AWS_ENDPOINT_URL"])
    flaky = _Flaky((endpoint.hostname or "", endpoint.port or 80), resets=2)
    _through(flaky, monkeypatch, attempts=5)  # each reset retried (the first two connections)
    try:
        build_filter(["s3://corpus/flaky"], tmp_path / "flaky.memfree", settings, progress=False)
    finally:
        monkeypatch.undo()
        s3fs.S3FileSystem.clear_instance_cache()
    assert flaky.reset == 2
    assert (tmp_path / "flaky.memfree").read_bytes() == (tmp_path / "plain.memfree").read_bytes()


def test_a_store_that_never_answers_fails_the_build_naming_the_url(
    s3: Any,
    tmp_path: Path,
    tokenizer_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Every connection reset: after its client's retries the build stops with an error that
    names the URL and says nothing is lost, not a traceback, and no filter is written (a store
    that fails is never taken for an empty prefix)."""
    import s3fs

    from memfree.cli import main

    flaky = _Flaky(("127.0.0.1", 9), resets=-1)
    _through(flaky, monkeypatch)
    try:
        code = main(
            ["build", "s3://corpus/web", "-o", str(tmp_path / "f.memfree"),
             "--tokenizer", str(tokenizer_dir)]
        )  # fmt: skip
    finally:
        monkeypatch.undo()
        s3fs.S3FileSystem.clear_instance_cache()
    error = capsys.readouterr().err
    assert code == 2 and "Traceback" not in error
    assert "s3://corpus/web: the store failed while listing it" in error
    assert "nothing is lost" in error
    assert not (tmp_path / "f.memfree").exists()


def test_a_store_that_fails_while_tasks_read_it_fails_the_build_naming_the_object(
    s3: Any,
    tmp_path: Path,
    tokenizer_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The listing and the objects' sizes go through, every read of an object's bytes is reset
    (the tasks' reads): the build stops with a StorageError naming an object, instead of a filter that silently lacks
    the objects it could not read; a rerun once the store answers builds it."""
    import os
    from urllib.parse import urlsplit

    import s3fs

    from memfree.errors import StorageError

    local = _corpus(tmp_path / "local")
    _upload(s3, local, "corpus/dropping")
    endpoint = urlsplit(os.environ["AWS_ENDPOINT_URL"])
    flaky = _Flaky((endpoint.hostname or "", endpoint.port or 80), 0, b"GET /corpus/dropping/")
    _through(flaky, monkeypatch)
    settings = settings_for(tokenizer_dir)
    out = tmp_path / "f.memfree"
    try:
        with pytest.raises(StorageError, match=r"s3://corpus/dropping/.*: the store failed while"):
            build_filter(["s3://corpus/dropping"], out, settings, progress=False)
    finally:
        monkeypatch.undo()
        s3fs.S3FileSystem.clear_instance_cache()
    assert not out.exists()
    build_filter(["s3://corpus/dropping"], out, settings, progress=False)
    assert out.exists()


def test_a_ray_build_from_a_bucket_to_a_bucket_gives_the_local_executors_bytes(
    s3: Any, tmp_path: Path, tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray's tasks open the bucket's objects themselves (their credentials from their own
    environment): a local Ray with two workers, reading the corpus from the bucket and writing
    the filter to it, gives the bytes of the local executor's build of the same objects."""
    ray = pytest.importorskip("ray", reason="the ray extra is not installed")
    monkeypatch.setenv("MEMFREE_CACHE", str(tmp_path / "cache"))
    _upload(s3, _corpus(tmp_path / "local"), "corpus/ray")
    local = settings_for(tokenizer_dir, workers=1, num_partitions=4)
    build_filter(["s3://corpus/ray"], tmp_path / "local.memfree", local, progress=False)
    ray.init(
        address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
        configure_logging=False,
    )  # fmt: skip
    try:
        on_ray = settings_for(tokenizer_dir, workers=2, executor="ray", num_partitions=4)
        build_filter(["s3://corpus/ray"], "s3://corpus/filters/ray.memfree", on_ray, progress=False)
    finally:
        ray.shutdown()
    assert s3.cat_file("corpus/filters/ray.memfree") == (tmp_path / "local.memfree").read_bytes()


def test_a_megatron_dataset_in_a_bucket_builds_what_its_local_copy_builds(
    s3: Any, tmp_path: Path, tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pre-tokenized Megatron dataset (``.bin`` + ``.idx``) on a bucket: its index copied once
    into memfree's cache, its token ids read by ranged requests; the same documents, in units,
    and the same filter as from disk; the ``.bin`` named alone stands for the dataset, and a
    dataset whose ``.bin`` is missing is named as such."""
    from bloom_builder.sources import ProblemLog, SourceOptions, discover, documents_of
    from bloom_builder.sources.megatron import write_megatron

    monkeypatch.setenv("MEMFREE_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(3)
    documents = [rng.integers(0, 290, size=int(rng.integers(5, 200))).tolist() for _ in range(300)]
    (tmp_path / "mega").mkdir()
    write_megatron(str(tmp_path / "mega" / "train_text_document"), documents)
    _upload(s3, tmp_path / "mega", "corpus/mega")
    read = {}
    for spec in (
        str(tmp_path / "mega"),
        "s3://corpus/mega",
        "s3://corpus/mega/train_text_document.bin",
    ):
        problems = ProblemLog()
        units = discover([spec], SourceOptions(), problems)
        assert not problems.to_dict()["counts"], spec
        ids = [doc.document.ids.tolist() for doc in documents_of(units, SourceOptions(), problems)]
        read[spec] = ([(u.kind, u.start, u.stop) for u in units], ids)
    assert read["s3://corpus/mega"] == read[str(tmp_path / "mega")]
    assert read["s3://corpus/mega/train_text_document.bin"] == read[str(tmp_path / "mega")]
    assert read["s3://corpus/mega"][1] == documents
    settings = settings_for(tokenizer_dir)
    build_filter([str(tmp_path / "mega")], tmp_path / "here.memfree", settings, progress=False)
    build_filter(["s3://corpus/mega"], tmp_path / "there.memfree", settings, progress=False)
    assert _payload(tmp_path / "here.memfree") == _payload(tmp_path / "there.memfree")
    s3.put_file(str(tmp_path / "mega" / "train_text_document.idx"), "corpus/lone/x.idx")
    problems = ProblemLog()
    assert discover(["s3://corpus/lone"], SourceOptions(), problems) == []
    assert "no such object" in str(problems.to_dict())


class _Denying(_Flaky):
    """A proxy that answers requests whose line begins with ``reading`` with S3's 403
    AccessDenied, as a store does for a key the credentials may not read."""

    ANSWER = b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>AccessDenied</Code>" + (
        b"<Message>Access Denied</Message></Error>"
    )

    def _answer(self, client: Any) -> None:
        client.sendall(
            b"HTTP/1.1 403 Forbidden\r\nContent-Type: application/xml\r\n"
            + f"Content-Length: {len(self.ANSWER)}\r\n".encode()
            + b"Connection: close\r\n\r\n"
            + self.ANSWER
        )


def test_an_object_the_credentials_may_not_read_is_named_and_the_rest_built(
    s3: Any, tmp_path: Path, tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Access denied to one object (a 403 from the store): the build reads the others, records
    that object as unreadable with the store's words, and says so; access denied is an answer,
    not a store failure, so nothing is retried and the build does not stop."""
    import os
    from urllib.parse import urlsplit

    import s3fs

    local = _corpus(tmp_path / "local")
    _upload(s3, local, "corpus/denied")
    endpoint = urlsplit(os.environ["AWS_ENDPOINT_URL"])
    denying = _Denying(
        (endpoint.hostname or "", endpoint.port or 80), 0, b"GET /corpus/denied/a.txt"
    )
    _through(denying, monkeypatch)
    out = tmp_path / "f.memfree"
    try:
        summary = build_filter(
            ["s3://corpus/denied"], out, settings_for(tokenizer_dir), progress=False
        )
    finally:
        monkeypatch.undo()
        s3fs.S3FileSystem.clear_instance_cache()
    assert denying.reset >= 1 and out.exists()
    unreadable = summary.skipped["examples"]["unreadable"]
    assert any("s3://corpus/denied/a.txt" in str(entry) for entry in unreadable), unreadable
    assert any("denied" in str(entry).lower() for entry in unreadable), unreadable
    assert summary.documents > 0


def test_an_object_rewritten_after_the_listing_stops_the_build_naming_it(
    s3: Any, tmp_path: Path, tokenizer_dir: Path
) -> None:
    """Objects listed, one rewritten before its task reads it (text, JSON lines, Parquet): the
    read refuses it (its ETag changed) with a StorageError naming it, instead of a filter built
    from contents the plan never saw; then deleted: refused as deleted (a filter built without
    an object its plan counted would be short of it); unchanged objects read as listed."""
    from bloom_builder.sources import ProblemLog, SourceOptions, discover, documents_of
    from memfree.errors import StorageError

    local = _corpus(tmp_path / "local")
    _upload(s3, local, "corpus/rewritten")
    problems = ProblemLog()
    units = discover(["s3://corpus/rewritten"], SourceOptions(), problems)
    assert units and all(unit.stamp for unit in units)
    assert list(documents_of(units, SourceOptions(), problems))  # as listed: read
    names = ["a.txt", "docs.jsonl"] + (
        ["rows.parquet"] if importlib.util.find_spec("pyarrow") else []
    )
    for name in names:
        key = f"corpus/rewritten/{name}"
        s3.pipe_file(key, s3.cat_file(key) + b"\n")  # another ETag, another size
        chosen = [unit for unit in units if unit.path.endswith("/" + name)]
        with pytest.raises(StorageError, match=rf"s3://corpus/rewritten/{name}: changed since"):
            list(documents_of(chosen, SourceOptions(), ProblemLog()))
        s3.rm(key)  # and deleted: refused as such, not read as an unreadable document
        with pytest.raises(StorageError, match=rf"s3://corpus/rewritten/{name}: deleted since"):
            list(documents_of(chosen, SourceOptions(), ProblemLog()))


@pytest.mark.parametrize("rewritten", ["train_text_document.bin", "train_text_document.idx"])
def test_a_megatron_dataset_rewritten_after_the_listing_stops_the_build_naming_it(
    s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rewritten: str
) -> None:
    """A Megatron dataset on a bucket whose ``.bin`` or ``.idx`` is rewritten after the build
    listed both: its units refuse it (a StorageError naming the file), whether the dataset was
    listed as a folder or named by its ``.bin``; never ids read half from the old files, half
    from the new."""
    from bloom_builder.sources import ProblemLog, SourceOptions, discover, documents_of
    from bloom_builder.sources.megatron import write_megatron
    from memfree.errors import StorageError

    monkeypatch.setenv("MEMFREE_CACHE", str(tmp_path / "cache"))
    documents = [[i, i + 1, i + 2, i + 3] for i in range(0, 200, 4)]
    (tmp_path / "mega").mkdir()
    write_megatron(str(tmp_path / "mega" / "train_text_document"), documents)
    prefix = f"corpus/mega-{rewritten.rsplit('.', 1)[1]}"
    _upload(s3, tmp_path / "mega", prefix)
    listed = {}
    for spec in (f"s3://{prefix}", f"s3://{prefix}/train_text_document.bin"):
        units = discover([spec], SourceOptions(), ProblemLog())
        assert units and all(len(unit.stamp) == 6 for unit in units), spec
        assert [d.document.ids.tolist() for d in documents_of(units, SourceOptions(), ProblemLog())]
        listed[spec] = units
    write_megatron(str(tmp_path / "mega" / "train_text_document"), [*documents, [7, 8, 9]])
    s3.put_file(str(tmp_path / "mega" / rewritten), f"{prefix}/{rewritten}")
    for units in listed.values():
        with pytest.raises(StorageError, match=rf"s3://{prefix}/{rewritten}: changed since"):
            list(documents_of(units, SourceOptions(), ProblemLog()))
    s3.rm(f"{prefix}/{rewritten}")
    for units in listed.values():
        with pytest.raises(StorageError, match=rf"s3://{prefix}/{rewritten}: deleted since"):
            list(documents_of(units, SourceOptions(), ProblemLog()))
