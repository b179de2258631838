"""Benchmark: a build from object storage against the same build from local files.

An S3 API server (moto's, from PyPI) on the loopback holds the corpus (standard-library modules
as plain text and as gzip-compressed JSON lines); the same corpus is also on local disk. The same
``memfree build`` (default tokenizer, the prefix index) runs from each, one after the other,
best of ``--repeats``; it prints the wall time of each and their ratio, the corpus bytes read
per token (each object is read once: its size over the tokens it gives), the bytes of the
filter, the time to build to ``-o s3://...`` and with ``--work-dir s3://...`` (finished tasks
kept on the store), and to open the filter by URL (a download
into memfree's cache). The loopback has no network latency or bandwidth limit: this measures
memfree's own cost of reading through fsspec, not a cloud store's.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import sysconfig
import tempfile
import time
from pathlib import Path


def corpus(folder: Path, modules: int) -> int:
    """Standard-library modules: half as .txt files, half as .jsonl.gz shards; its bytes."""
    paths = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:modules]
    folder.mkdir(parents=True)
    half = len(paths) // 2
    for path in paths[:half]:
        (folder / f"{path.stem}.txt").write_text(path.read_text(errors="ignore"))
    for shard in range(0, len(paths) - half, 20):
        lines = [
            json.dumps({"text": path.read_text(errors="ignore")})
            for path in paths[half + shard : half + shard + 20]
        ]
        with gzip.open(folder / f"shard{shard:04d}.jsonl.gz", "wt") as out:
            out.write("\n".join(lines) + "\n")
    return sum(path.stat().st_size for path in folder.iterdir())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--modules", type=int, default=400, help="standard-library modules")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()

    import logging

    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # the server's request log

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=f"http://{host}:{port}",
    )  # fmt: skip
    from bloom_builder.build import build_filter
    from bloom_builder.settings import BuildSettings
    from memfree import NgramFilter

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["MEMFREE_CACHE"] = str(root / "cache")
        local = root / "corpus"
        size = corpus(local, args.modules)
        fs = s3fs.S3FileSystem()
        fs.mkdir("bench")
        fs.put(str(local) + "/", "bench/corpus/", recursive=True)
        settings = BuildSettings(workers=args.workers)
        print(
            f"machine: {platform.machine()}, {os.cpu_count()} cores; corpus {args.modules} "
            f"modules, {size / 2**20:.1f} MiB on disk ({len(list(local.iterdir()))} files); "
            f"{args.workers} workers, best of {args.repeats}; S3 through moto on 127.0.0.1"
        )
        times: dict[str, float] = {}
        summary = None
        for _ in range(args.repeats):
            for name, source, output, work in [
                ("local", str(local), str(root / "local.memfree"), None),
                ("s3", "s3://bench/corpus", str(root / "s3.memfree"), None),
                ("s3 -> s3", "s3://bench/corpus", "s3://bench/filters/web.memfree", None),
                ("s3 + work", "s3://bench/corpus", str(root / "w.memfree"), "s3://bench/work"),
            ]:
                started = time.perf_counter()
                summary = build_filter(
                    [source], output, settings, progress=False, force=True, work_dir=work
                )
                times[name] = min(times.get(name, float("inf")), time.perf_counter() - started)
        assert summary is not None
        tokens = summary.tokens
        started = time.perf_counter()
        filt = NgramFilter.open("s3://bench/filters/web.memfree")
        fetch = time.perf_counter() - started
        started = time.perf_counter()
        NgramFilter.open("s3://bench/filters/web.memfree")
        again = time.perf_counter() - started
        print(f"  tokens {tokens:,}; corpus bytes read per token {size / tokens:.2f} (compressed)")
        for name in times:
            print(
                f"  build from {name:9s} {times[name]:7.2f} s   {times[name] / times['local']:.2f}x local"
            )
        print(
            f"  open by URL: {fetch * 1e3:.0f} ms the first time (download {filt.size_bytes / 2**20:.1f} "
            f"MiB and verify), {again * 1e3:.0f} ms from the cache"
        )
    server.stop()


if __name__ == "__main__":
    main()
