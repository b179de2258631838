"""A build's work directory on object storage: ``--work-dir s3://bucket/work/web``.

The tasks work in a local mirror of the work directory (a folder in memfree's cache named for
the URL) and the store holds what makes the build resumable anywhere: each finished task's
output objects, then its marker, which names every output's size and xxh3 (written after them,
so a marker on the store always names whole objects). A build that starts again, on this machine
or another with an empty cache, reads the markers on the store, downloads the outputs they name
into its mirror and checks them (size and xxh3) before it reuses the task; a task whose outputs
are missing or damaged there runs again. The store also holds the work directory's own marker
(the configuration's hash: work of other settings is cleared, as locally) and the running
build's lock (``lock.json``: host, process, start and a heartbeat refreshed every
:data:`HEARTBEAT_S` seconds; a lock not refreshed for :data:`STALE_S` seconds is a dead build's
and is taken over).

Paths inside markers are the mirror's; on the store they are written relative to the work
directory, so another machine's mirror (another cache directory) reads them as its own.

How the tasks use it (through the driver, or each task reaching the store itself on Ray) is
:mod:`bloom_builder.store_tasks`.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

from bloom_builder.errors import BuildError
from bloom_builder.executors.markers import (
    MarkedTask,
    result_payload,
    write_marker,
)
from memfree.errors import StorageError
from memfree.storage import (
    NO_ROOM,
    address_problem,
    cache_dir,
    filesystem,
    is_store_failure,
    store_error,
)

WORK_OBJECT = "memfree-work.json"
LOCK_OBJECT = "lock.json"
HEARTBEAT_S = 20.0
STALE_S = 120.0
_PLACEHOLDER = "{memfree-work}"
# What a build puts in its work directory (cleared for other settings, removed at the end).
_ENTRIES = ("map", "reduce-min", "sections")


def mirror_folder(url: str) -> Path:
    """The local mirror of the work directory at ``url``, in memfree's cache."""
    return cache_dir() / "work" / hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:24]


class StoreWork:
    """The work directory at ``url`` and its local mirror (see the module's docstring).

    Raises:
        BuildError: the URL cannot be taken (credentials or a query in it, an unknown protocol).
        MissingDependencyError: its protocol's package is not installed.
    """

    def __init__(self, url: str) -> None:
        problem = address_problem(url, "the work directory")
        if problem is not None:
            raise BuildError(problem)
        self.url = url.rstrip("/")
        self.fs, self.root = filesystem(self.url)
        self.local = mirror_folder(self.url)
        self._lock: StoreLock | None = None  # held while a build runs (:meth:`locked`)
        self._local_text = json.dumps(str(self.local))[1:-1]

    # -- names --------------------------------------------------------------------------------

    def key_of(self, local: Path | str) -> str:
        """The store's key of a file in the mirror."""
        relative = Path(local).relative_to(self.local).as_posix()
        return f"{self.root}/{relative}"

    def _url_of(self, key: str) -> str:
        return self.url + key[len(self.root) :]

    def _call(self, what: str, key: str, action: Callable[[], Any]) -> Any:
        try:
            return action()
        except Exception as error:  # botocore's connection errors are not OSErrors
            if is_store_failure(error):
                raise store_error(self._url_of(key), what, error) from None
            if not isinstance(error, OSError):
                raise
            if error.errno in NO_ROOM:  # the local disk refused (the mirror), not the store
                raise
            raise BuildError(f"{self._url_of(key)}: the store refused {what}: {error}") from None

    # -- the work directory's marker ------------------------------------------------------------

    def claim(self, config: dict[str, Any], config_hash: str) -> bool:
        """Take the work directory for a build of ``config_hash``: work of the same settings is
        kept (True: it may be resumed), of other settings cleared; a prefix holding objects that
        no build put there is refused."""
        marker = f"{self.root}/{WORK_OBJECT}"
        try:
            previous = json.loads(self.fs.cat_file(marker))
        except FileNotFoundError:
            previous = None
        except ValueError:
            previous = {}
        except Exception as error:  # a store's own errors are not all OSErrors
            if is_store_failure(error):
                raise store_error(self._url_of(marker), "reading its marker", error) from None
            if not isinstance(error, OSError):
                raise
            raise BuildError(f"{self.url}: the store refused reading its marker: {error}") from None
        if isinstance(previous, dict) and previous.get("config_hash") == config_hash:
            return True
        if previous is None and self._other_objects():
            raise BuildError(
                f"{self.url}: holds objects and is not a memfree work directory (no "
                f"{WORK_OBJECT}); memfree only deletes what it wrote. Pass an empty or new "
                "--work-dir"
            )
        self._clear()
        payload = json.dumps({"memfree_work_dir": 1, "config_hash": config_hash, "config": config})
        self._call(
            "writing its marker", marker, lambda: self.fs.pipe_file(marker, payload.encode())
        )
        return False

    def _other_objects(self) -> bool:
        try:
            names = self.fs.ls(self.root, detail=False, refresh=True)
        except FileNotFoundError:
            return False
        except Exception as error:  # a store's own errors are not all OSErrors
            if is_store_failure(error):
                raise store_error(self.url, "listing it", error) from None
            raise
        return any(os.path.basename(str(name).rstrip("/")) not in (LOCK_OBJECT,) for name in names)

    def _clear(self) -> None:
        """Delete what builds put under the URL (task outputs and markers), nothing else."""
        try:
            names = self.fs.ls(self.root, detail=False, refresh=True)
        except FileNotFoundError:
            return
        for name in names:
            base = os.path.basename(str(name).rstrip("/"))
            if base.startswith(_ENTRIES) or base == WORK_OBJECT:
                self._call("deleting old work", str(name), partial(self._rm, str(name)))

    def _rm(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(key, recursive=True)

    def holds_finished(self) -> bool:
        """Whether the store holds a finished map task (its marker): work a rerun reuses, kept
        when a build fails. True where the store cannot be listed (nothing is deleted unseen)."""
        try:
            self.fs.invalidate_cache(f"{self.root}/map")
            found = self.fs.find(f"{self.root}/map")
        except FileNotFoundError:
            return False
        except Exception:  # a store's own errors are not all OSErrors
            return True
        return any(key.endswith(".json") for key in found)

    def remove(self) -> None:
        """Delete the build's work on the store (at the end of a build that keeps none)."""
        self._clear()
        with contextlib.suppress(OSError):
            self.fs.invalidate_cache()

    # -- tasks ----------------------------------------------------------------------------------

    def restore(self, tasks: Sequence[MarkedTask]) -> int:
        """For each task the store holds as finished: its outputs downloaded into the mirror
        (those missing or changed there) and its marker written there, so the executor reuses
        it once its outputs check; a local marker the store lacks is dropped (the store is the
        truth: its task runs again). Returns how many tasks the store holds as finished."""
        found = 0
        sizes = self._listed_for(tasks)
        for task in tasks:
            payload = self._stored_payload(task, sizes)
            result = None if payload is None else self._result_of(task, payload)
            if payload is None or result is None:
                Path(task.marker).unlink(missing_ok=True)
                continue
            for path in _outputs(task, result) or []:
                self._fetch(path, sizes)
            Path(task.marker).parent.mkdir(parents=True, exist_ok=True)
            write_marker(Path(task.marker), payload)
            found += 1
        return found

    def finished_on_store(
        self, tasks: Sequence[Any], bounds_suffix: str
    ) -> tuple[list[tuple[Any, Any]], list[Any]]:
        """``tasks`` split into those the store holds as finished (each with its result,
        ``reused`` true) and those to run, for tasks that reach the store themselves: a task is
        finished where its marker and every output it names are on the store with their
        recorded sizes (and each run's bounds beside it). A local marker of a task to run is
        dropped (its outputs are the store's, never the mirror's)."""
        sizes = self._listed_for(tasks)
        finished, pending = [], []
        for task in tasks:
            result = self._recorded(task, sizes, bounds_suffix)
            if result is None:
                Path(task.marker).unlink(missing_ok=True)
                pending.append(task)
            else:
                finished.append((task, result))
        return finished, pending

    def _recorded(self, task: Any, sizes: dict[str, int], bounds_suffix: str) -> Any | None:
        """The result a task's marker on the store records, where every output it names (and
        each run's bounds) is there with its recorded size; else None."""
        payload = self._stored_payload(task, sizes)
        result = None if payload is None else self._result_of(task, {**payload, "reused": True})
        if result is None:
            return None
        for path, size in task.output_sizes(result).items():
            key = self.key_of(path)
            if sizes.get(key) != size:
                return None
            if path.endswith(".keys") and key[: -len(".keys")] + bounds_suffix not in sizes:
                return None
        return result

    def _stored_payload(self, task: Any, sizes: dict[str, int]) -> dict[str, Any] | None:
        """A task's marker on the store (listed in ``sizes``), its paths the mirror's; None
        where there is none or it cannot be read as JSON.

        Raises:
            StorageError: the store failed.
        """
        key = self.key_of(task.marker)
        if key not in sizes:
            return None
        try:
            text = self.fs.cat_file(key).decode("utf-8")
            payload = json.loads(text.replace(_PLACEHOLDER, self._local_text))
        except FileNotFoundError:
            return None
        except Exception as error:  # a store's own errors are not all OSErrors
            if is_store_failure(error):
                raise store_error(self._url_of(key), "reading a task's marker", error) from None
            if not isinstance(error, (OSError, ValueError)):  # UnicodeDecodeError: ValueError
                raise
            return None
        return payload if isinstance(payload, dict) else None

    @staticmethod
    def _result_of(task: Any, payload: dict[str, Any]) -> Any | None:
        """The task's typed result of a marker's payload; None where it is not one."""
        try:
            return task.result_type.from_json(payload)
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    def fetch_outputs(self, tasks: Sequence[Any], results: Sequence[Any]) -> None:
        """Download finished tasks' outputs into the mirror and check them (size and xxh3).

        Raises:
            StorageError: an output on the store is missing or damaged: its task's marker is
                removed (a rerun runs that task again; the others are kept).
        """
        sizes = self._listed_for(tasks)
        for task, result in zip(tasks, results, strict=True):
            for path in _outputs(task, result) or []:
                self._fetch(path, sizes)
            if not task.outputs_intact(result):
                marker = self.key_of(task.marker)
                with contextlib.suppress(Exception):
                    self.fs.rm(marker)
                Path(task.marker).unlink(missing_ok=True)
                raise StorageError(
                    errno.EIO,
                    f"{self._url_of(marker)}: the output of this finished task is missing or "
                    "damaged on the store; rerun the build: that task runs again, the others "
                    "are reused",
                )

    def _listed_for(self, tasks: Sequence[Any]) -> dict[str, int]:
        """Every object in the folders of the tasks' markers: key -> size."""
        return self._listed({str(Path(self.key_of(task.marker)).parent) for task in tasks})

    def _listed(self, folders: set[str]) -> dict[str, int]:
        """Every object under ``folders`` (one listing each, not a request per task): key ->
        size."""
        sizes: dict[str, int] = {}
        for folder in sorted(folders):
            try:
                found = self.fs.find(folder, detail=True, refresh=True)
            except FileNotFoundError:
                continue
            except Exception as error:  # a store's own errors are not all OSErrors
                if is_store_failure(error):
                    raise store_error(self._url_of(folder), "listing its tasks", error) from None
                if not isinstance(error, OSError):
                    raise
                raise BuildError(
                    f"{self._url_of(folder)}: the store refused listing: {error}"
                ) from None
            for key, info in found.items():
                sizes[str(key).rstrip("/")] = int(info.get("size") or 0)
        return sizes

    def _fetch(self, path: Path, sizes: dict[str, int]) -> None:
        """Download one output into the mirror unless a file of its size is there (the task's
        own check hashes it before it is reused); one the store lacks is left to that check
        (its task runs again)."""
        key = self.key_of(path)
        size = sizes.get(key)
        if size is None:
            return
        if path.is_file() and path.stat().st_size == size:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.download.tmp")
        try:
            self._call(
                "downloading a task's output", key, lambda: self.fs.get_file(key, str(temporary))
            )
        except BaseException:
            temporary.unlink(missing_ok=True)  # no half download left in the mirror
            raise
        os.replace(temporary, path)

    def publish(self, task: MarkedTask, result: Any, uploaded: bool = False) -> None:
        """Upload a finished task's outputs (unless the task has: ``uploaded``), then its
        marker (paths written relative)."""
        if self._lock is not None:
            self._lock.check()  # a build whose lock was taken over writes nothing more
        outputs = _outputs(task, result)
        if outputs is None:
            return  # a task that never reuses its work (it writes the final file in place)
        if uploaded:
            outputs = []
        missing = [path for path in outputs if not path.is_file()]
        if missing:
            raise BuildError(
                f"{missing[0]}: a finished task's output is not on this machine, where the "
                "driver uploads it from (its task ran elsewhere, or the file was removed); run "
                "the build again (the task runs again)"
            )
        for path in outputs:
            key = self.key_of(path)
            self._call("uploading a task's output", key, partial(self.fs.put_file, str(path), key))
        text = json.dumps({**result_payload(result), "reused": False}, sort_keys=True)
        text = text.replace(self._local_text, _PLACEHOLDER)
        key = self.key_of(task.marker)
        self._call("writing a task's marker", key, lambda: self.fs.pipe_file(key, text.encode()))

    # -- the lock ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the work directory's lock on the store for the block (see :class:`StoreLock`)."""
        lock = StoreLock(self)
        lock.acquire()
        self._lock = lock
        try:
            yield
        finally:
            self._lock = None
            lock.release()


def _outputs(task: MarkedTask, result: Any) -> list[Path] | None:
    """The files a task's result names (None: a task that keeps no outputs)."""
    named = getattr(task, "output_sizes", None)
    return None if named is None else [Path(path) for path in named(result)]


class StoreLock:
    """The lock of the build that uses a work directory on the store: ``lock.json`` names its
    holder and a heartbeat it refreshes every :data:`HEARTBEAT_S` seconds. A second build is
    refused while the heartbeat is fresh; a lock not refreshed for :data:`STALE_S` seconds (its
    build was killed) is taken over.

    On S3 (and stores that speak its API) every write of the lock is conditional, so the lock
    is exact: it is created only where no lock is (``If-None-Match: *``), taken over and
    refreshed only if it is still the object read (``If-Match`` its ETag). Of two builds that
    start at once, one write fails and that build stops; a build whose lock was taken over (it
    stalled past :data:`STALE_S`) finds out at its next heartbeat and stops before it writes
    another task. Other stores have no conditional write: there two builds that write the lock
    within the same fraction of a second may both go on (each reads the lock back after 0.2 s,
    and the one that reads another's token stops)."""

    def __init__(self, work: StoreWork) -> None:
        self.work = work
        self.key = f"{work.root}/{LOCK_OBJECT}"
        self.token = f"{socket.gethostname()}:{os.getpid()}:{time.time_ns()}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._conditional = hasattr(work.fs, "call_s3")  # s3fs: S3's conditional writes
        self._etag = ""  # of the lock this build wrote last (conditional stores)
        self.lost: dict[str, Any] | None = None  # the build that took the lock over, if one did

    def _payload(self) -> bytes:
        return json.dumps(
            {
                "token": self.token,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "heartbeat": time.time(),
            }
        ).encode()

    def _holder(self) -> dict[str, Any] | None:
        return self._read()[0]

    def _read(self) -> tuple[dict[str, Any] | None, str]:
        """The lock's holder (None: no lock, or one that is not JSON) and the ETag of the object
        read ("" where none is, or the store gives none)."""
        fs = self.work.fs
        try:
            tag = ""
            if self._conditional:
                fs.invalidate_cache(self.key)
                tag = str(fs.info(self.key).get("ETag") or "")
            held = json.loads(fs.cat_file(self.key))
        except FileNotFoundError:
            return None, ""
        except ValueError:
            return None, tag
        except Exception as error:  # a store's own errors are not all OSErrors
            if is_store_failure(error):
                raise store_error(self.work.url, "reading its lock", error) from None
            if not isinstance(error, OSError):
                raise
            raise BuildError(
                f"{self.work.url}: the store refused reading its lock: {error}"
            ) from None
        # Read after the ETag: if the object changed between, the write conditioned on the
        # ETag fails, and this build stops (never the other way round).
        return (held if isinstance(held, dict) else None), tag

    def _put(self, tag: str | None) -> str | None:
        """Write the lock: only where none is (``tag`` None), or only over the object whose ETag
        is ``tag``. Returns the new object's ETag; None where the condition failed."""
        bucket, key, _ = self.work.fs.split_path(self.key)
        condition = {"IfNoneMatch": "*"} if tag is None else {"IfMatch": tag}
        try:
            answer = self.work.fs.call_s3(
                "put_object", Bucket=bucket, Key=key, Body=self._payload(), **condition
            )
        except Exception as error:  # a store's own errors are not all OSErrors
            if _error_code(error) in _PRECONDITION or isinstance(error, FileExistsError):
                return None
            if _error_code(error) in _NO_CONDITIONS:
                raise _Unconditional from None
            raise
        self.work.fs.invalidate_cache(self.key)
        return str(answer.get("ETag") or "")

    def acquire(self) -> None:
        held, tag = self._read()
        if held is not None and held.get("token") != self.token:
            age = time.time() - float(held.get("heartbeat") or 0)
            if age < STALE_S:
                raise BuildError(
                    f"{self.work.url}: another build is using this work directory (host "
                    f"{held.get('host')}, process {held.get('pid')}, seen {max(age, 0):.0f} s "
                    "ago); wait for it to finish, or pass another --work-dir. If that build is "
                    f"dead, its lock goes stale after {STALE_S:.0f} s"
                )
        written: str | None = None
        if self._conditional:
            try:
                written = self.work._call(
                    "writing its lock", self.key, lambda: self._put(tag or None)
                )
            except _Unconditional:  # an S3-like store without conditional writes
                self._conditional = False
        if self._conditional:
            if written is None:
                self._refuse_racing(self._holder())
            self._etag = written
        else:
            self.work._call(
                "writing its lock",
                self.key,
                lambda: self.work.fs.pipe_file(self.key, self._payload()),
            )
            time.sleep(0.2)  # two builds that wrote at once: the one that reads another's stops
            held = self._holder()
            if held is None or held.get("token") != self.token:
                self._refuse_racing(held)
        self._thread = threading.Thread(target=self._beat, name="memfree-store-lock", daemon=True)
        self._thread.start()

    def _refuse_racing(self, held: dict[str, Any] | None) -> NoReturn:
        raise BuildError(
            f"{self.work.url}: another build took this work directory at the same moment "
            f"(host {held.get('host') if held else '?'}); wait for it to finish, or pass "
            "another --work-dir"
        )

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(Exception):  # a missed beat: the next one may land
                if not self._conditional:
                    self.work.fs.pipe_file(self.key, self._payload())
                    continue
                written = self._put(self._etag)
                if written is None:  # another build took the lock over: this one stops
                    self.lost = self._holder() or {}
                    return
                self._etag = written

    def check(self) -> None:
        """Raise if another build took the lock over (this build stalled past its staleness)."""
        if self.lost is not None:
            raise BuildError(
                f"{self.work.url}: another build (host {self.lost.get('host', '?')}, process "
                f"{self.lost.get('pid', '?')}) took this work directory over: this build stalled "
                f"for more than {STALE_S:.0f} s without its heartbeat. It stops before writing "
                "another task; the tasks on the store are kept for the build that holds it"
            )

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        with contextlib.suppress(Exception):  # left behind, it goes stale (never hides an error)
            held = self._holder()
            if held is not None and held.get("token") == self.token:
                self.work.fs.rm(self.key)


class _Unconditional(Exception):
    """The store refused a conditional write as a request it does not implement."""


_PRECONDITION = frozenset({"PreconditionFailed", "412"})
_NO_CONDITIONS = frozenset({"NotImplemented", "501"})


def _error_code(error: BaseException) -> str:
    """The S3 error code behind a store's error (s3fs raises its own exception, the client's
    error as the cause: FileExistsError for a failed ``If-None-Match``, EINVAL for a failed
    ``If-Match``); "" where none is."""
    seen: BaseException | None = error
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            return str(response.get("Error", {}).get("Code") or "")
        seen = seen.__cause__ or seen.__context__
    return ""


__all__ = [
    "HEARTBEAT_S",
    "LOCK_OBJECT",
    "STALE_S",
    "WORK_OBJECT",
    "StoreLock",
    "StoreWork",
    "mirror_folder",
]
