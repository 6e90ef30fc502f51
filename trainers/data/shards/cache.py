"""Shards of a remote corpus in a bounded local cache, fetched ahead of the step.

Each worker keeps the shards its coming windows need in a folder on its own disk: the block the
global order is reading and the next one (``trainers/data/shards/order.py`` :func:`shards_ahead`).
``want(shards)`` (called by the dataset's ``reading_at`` before each global batch) pins that list
and wakes a background thread that fetches the missing ones in order; a window whose shard is not
there yet is fetched on demand (that wait is what ``wait_s`` counts).

Every file in the cache is complete and verified: a download streams into a temporary file in the
cache folder while its sha256 is computed, and is renamed into place (named by that sha256) only
when both size and sha256 agree with the manifest.  A corrupt download is fetched again once; a
second mismatch is a :class:`~trainers.data.shards.manifest.ShardError`.  A store that does not
answer, or a shard that is gone from it, is retried with backoff (:class:`Backoff`: after 0.5, 2
and 8 s, none started past 30 s); then :class:`ShardUnavailable` ends the run without a restart
(trainers/link/failure.py), its checkpoints kept: the run resumes where it stopped once the store
answers (a checkpoint holds only the data position, ``(epoch, cursor)``).  A prefetch that gives up
is not held against the store: the reader's own fetch of that shard tries again, unless it was
waiting on that very download.

The cache never holds more than ``cache_bytes``: before a fetch, shards no longer wanted are
evicted, least recently used first; a prefetch that does not fit waits for the next ``want``, and
an on-demand fetch evicts whatever else it must.  ``peak`` is the largest total held.  With
``data.loader.workers > 0`` each loader process keeps its own account over the same folder (a shard
one process fetched, the others take from the disk): the bound then holds per process.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from trainers.data.shards.manifest import Manifest, Shard, ShardError, is_uri, join, local_path, remote
from trainers.errors import EndsRun, first_line

CHUNK = 8 << 20
RETRIES = (0.5, 2.0, 8.0)  # seconds before each retry of a download the store did not answer
RETRY_LIMIT_S = 30.0  # no retry starts this long after the first try (a try that hangs: the client's timeout)
T = TypeVar("T")


class ShardUnavailable(EndsRun, OSError):
    """A shard the store did not serve through every retry (it did not answer, or the shard is gone).
    The run ends at once, without a restart, its checkpoints kept for a resume; the message is one
    line ``data.root: ...; fix``.  Built from its message alone (a DataLoader process re-raises it so)."""


class GaveUp(Exception):
    """:meth:`Backoff.call` retried ``tries`` times over ``elapsed_s`` seconds; ``error`` the last."""

    def __init__(self, tries: int, elapsed_s: float, error: OSError) -> None:
        super().__init__(f"{tries} tries in {elapsed_s:.1f} s: {error}")
        self.tries, self.elapsed_s, self.error = tries, elapsed_s, error


@dataclass(frozen=True)
class Backoff:
    """How a download the store did not answer is retried: after each of ``pauses`` seconds in
    turn, and no retry started ``limit_s`` seconds after the first try (a try that hangs is ended
    by the store client's own timeout)."""

    pauses: tuple[float, ...] = RETRIES
    limit_s: float = RETRY_LIMIT_S

    def call(
        self,
        attempt: Callable[[], T],
        sleep: Callable[[float], object] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> T:
        """``attempt()``'s value; an ``OSError`` is retried as above, then :class:`GaveUp`."""
        t0, tries = clock(), 0
        while True:
            try:
                return attempt()
            except OSError as e:
                tries += 1
                elapsed = clock() - t0
                if tries > len(self.pauses) or elapsed + self.pauses[tries - 1] > self.limit_s:
                    raise GaveUp(tries, elapsed, e) from None
            sleep(self.pauses[tries - 1])


def unavailable(shard: Shard, location: str, gave_up: GaveUp) -> ShardUnavailable:
    """The one line for ``shard`` that ``location`` did not serve: which, how long it was tried, the
    store's reason, and how the run goes on."""
    e = gave_up.error
    reason = first_line(str(e), 160) or type(e).__name__
    if isinstance(e, FileNotFoundError):
        reason, fix = (
            f"gone from the store: {reason}",
            "put the shard back (or prepare the corpus again), then resume it",
        )
    else:
        fix = "resume it once the store answers again"
    return ShardUnavailable(
        f"data.root: could not fetch shard {shard.name!r} from {location} after {gave_up.tries} tries in "
        f"{gave_up.elapsed_s:.1f} s ({reason}); the run stopped at its newest checkpoint: {fix}"
    )


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def default_cache_root() -> str:
    """``$ELASTIC_CACHE_DIR/tokens`` or ``~/.cache/elastic-large-batch/tokens``."""
    base = os.environ.get("ELASTIC_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "elastic-large-batch")
    return os.path.join(base, "tokens")


class ShardCache:
    """The shards of ``manifest`` as ``numpy.memmap`` arrays: opened in place for a local folder
    (size checked on open, sha256 the first time this machine opens that file), fetched into
    ``directory`` for a store."""

    def __init__(self, manifest: Manifest, cache_bytes: int, directory: str | None = None, prefetch: bool = True):
        self.manifest, self.cache_bytes = manifest, int(cache_bytes)
        self.remote = is_uri(manifest.location)
        key = hashlib.sha256(manifest.location.encode()).hexdigest()[:16]
        self.directory = directory or os.path.join(default_cache_root(), key)
        self.prefetch = prefetch
        self.backoff = Backoff()
        self.sleep, self.clock = time.sleep, time.monotonic  # between retries (a test passes its own)
        self._lock = threading.Condition()
        self._arrays: dict[str, np.ndarray] = {}  # plain ndarray views of the memmaps (no subclass overhead)
        self._held: OrderedDict[str, int] = OrderedDict()  # sha256 -> bytes, least recently used first
        self._inflight: dict[str, int] = {}  # sha256 -> bytes of the downloads under way (room kept for them)
        self._wanted: list[Shard] = []
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None  # the prefetch thread's, raised at the next fetch
        self._failed: dict[str, ShardUnavailable] = {}  # sha256 -> a download that gave up (not yet fetched since)
        self.peak, self.fetched_bytes, self.fetches, self.wait_s = 0, 0, 0, 0.0
        if self.remote:
            os.makedirs(self.directory, exist_ok=True)
            self._adopt()

    # ------------------------------------------------------------------ state that crosses processes

    def __getstate__(self) -> dict:
        # a DataLoader process gets its own cache over the same folder: no thread, no open arrays
        return {"manifest": self.manifest, "cache_bytes": self.cache_bytes, "directory": self.directory}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["manifest"], state["cache_bytes"], state["directory"], prefetch=False)

    # ------------------------------------------------------------------ the files

    def _path(self, shard: Shard) -> str:
        return os.path.join(self.directory, f"{shard.sha256}.bin")

    def _adopt(self) -> None:
        """Files a previous run left (each verified before it was renamed there), within the bound."""
        by_sha = {s.sha256: s for s in self.manifest.shards}
        for entry in sorted(os.scandir(self.directory), key=lambda e: e.stat().st_mtime):
            sha = entry.name[: -len(".bin")] if entry.name.endswith(".bin") else None
            shard = by_sha.get(sha or "")
            if shard is None or entry.stat().st_size != shard.bytes:
                if entry.name.endswith((".tmp", ".bin")):
                    os.unlink(entry.path)
                continue
            self._held[shard.sha256] = shard.bytes
        while sum(self._held.values()) > self.cache_bytes:
            self._drop(next(iter(self._held)))

    def _on_disk(self, shard: Shard) -> bool:
        try:
            return os.path.getsize(self._path(shard)) == shard.bytes
        except OSError:
            return False

    def _verified_before(self, path: str, shard: Shard) -> bool:
        """A local shard's size, and its sha256 the first time this file (same inode, size and mtime) is
        opened on this machine: a marker in the cache folder remembers the check, so a large local
        corpus is hashed once, not by every worker of every run.  False: it does not match."""
        st = os.stat(local_path(path))
        if st.st_size != shard.bytes:
            return False
        marker = os.path.join(
            self.directory, "verified", f"{shard.sha256}-{st.st_dev}-{st.st_ino}-{st.st_size}-{st.st_mtime_ns}"
        )
        if os.path.exists(marker):
            return True
        if sha256_file(path) != shard.sha256:
            return False
        try:
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            open(marker, "a").close()
        except OSError:
            pass  # a read-only cache folder: hashed again next time
        return True

    def _drop(self, sha: str) -> None:
        self._held.pop(sha, None)
        self._arrays.pop(sha, None)  # a reader still holding the map keeps the unlinked pages until it lets go
        try:
            os.unlink(os.path.join(self.directory, f"{sha}.bin"))
        except FileNotFoundError:
            pass

    def held(self) -> int:
        """Bytes of the shards held and of the downloads under way."""
        return sum(self._held.values()) + sum(self._inflight.values())

    def _make_room(self, shard: Shard, keep: set[str]) -> bool:
        """Evict least recently used shards outside ``keep`` until ``shard`` fits (lock held)."""
        for sha in list(self._held):
            if self.held() + shard.bytes <= self.cache_bytes:
                break
            if sha not in keep:
                self._drop(sha)
        return self.held() + shard.bytes <= self.cache_bytes

    def _download(self, shard: Shard) -> None:
        """Fetch ``shard`` into the cache, verified, renamed into place; once more on a mismatch.
        A store that does not serve it is retried (:attr:`backoff`), then :class:`ShardUnavailable`."""
        source = join(self.manifest.location, shard.name)
        fs, path = remote(source)
        tmp = os.path.join(self.directory, f"{shard.sha256}.{os.getpid()}.{threading.get_ident()}.tmp")

        def attempt() -> tuple[str, int]:
            h, n = hashlib.sha256(), 0
            with fs.open_input_stream(path) as src, open(tmp, "wb") as dst:
                while block := src.read(CHUNK):
                    h.update(block)
                    dst.write(block)
                    n += len(block)
            return h.hexdigest(), n

        digest, n = "", 0
        for _ in range(2):
            try:
                try:
                    digest, n = self.backoff.call(attempt, self.sleep, self.clock)
                except GaveUp as e:
                    raise unavailable(shard, self.manifest.location, e) from None
                if n == shard.bytes and digest == shard.sha256:
                    os.replace(tmp, self._path(shard))
                    self.fetched_bytes += n
                    self.fetches += 1
                    return
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        raise ShardError(
            f"data.root: shard {shard.name!r} fetched twice from {self.manifest.location} with {n} bytes and sha256 "
            f"{digest[:12]}..., the manifest says {shard.bytes} bytes and {shard.sha256[:12]}...; "
            "upload the shard again or prepare the corpus again"
        )

    def _fetch(self, shard: Shard, keep: set[str], demand: bool) -> bool:
        """Make ``shard`` present; False when a prefetch does not fit now."""
        with self._lock:
            while True:
                waited = False
                while shard.sha256 in self._inflight:
                    waited = True
                    self._lock.wait()
                if waited and shard.sha256 in self._failed:  # the download waited on gave up: no second wait
                    raise ShardUnavailable(str(self._failed[shard.sha256]))
                if shard.sha256 in self._held and not self._on_disk(shard):
                    self._held.pop(shard.sha256)  # another loader process on this machine evicted it: fetch again
                if shard.sha256 in self._held:
                    self._held.move_to_end(shard.sha256)
                    return True
                if self._on_disk(shard):  # renamed there, verified, by another process on this machine
                    self._held[shard.sha256] = shard.bytes
                    return True
                if self._make_room(shard, keep | {shard.sha256}):
                    break
                if not demand:
                    return False
                if self._make_room(shard, {shard.sha256}):
                    break
                if not self._inflight:
                    raise ShardError(
                        f"data.cache_bytes: {self.cache_bytes} bytes cannot hold shard {shard.name!r} of "
                        f"{shard.bytes} bytes; raise data.cache_bytes"
                    )
                self._lock.wait()  # room is held for a download under way: wait for it, then evict
            self._inflight[shard.sha256] = shard.bytes
            self.peak = max(self.peak, self.held())
        try:
            self._download(shard)
        except ShardUnavailable as e:
            with self._lock:
                self._failed[shard.sha256] = e
            raise
        finally:
            with self._lock:
                self._inflight.pop(shard.sha256, None)
                self._lock.notify_all()
        with self._lock:
            self._failed.pop(shard.sha256, None)
            self._held[shard.sha256] = shard.bytes
            self.peak = max(self.peak, self.held())
        return True

    # ------------------------------------------------------------------ what the dataset calls

    def array(self, shard: Shard) -> np.ndarray:
        """The shard's tokens (fetched on demand from a store: the wait is counted in ``wait_s``)."""
        arr = self._arrays.get(shard.sha256)
        if arr is not None:
            if self.remote:
                with self._lock:
                    if shard.sha256 in self._held:
                        self._held.move_to_end(shard.sha256)
            return arr
        dtype = np.dtype(self.manifest.dtype).newbyteorder("<")
        if not self.remote:
            path = join(self.manifest.location, shard.name)
            if not self._verified_before(path, shard):
                raise ShardError(
                    f"data.root: shard {shard.name!r} at {path} does not match the manifest (size or sha256); "
                    "copy it again or prepare the corpus again"
                )
            arr = np.memmap(path, dtype=dtype, mode="r").view(np.ndarray)
        else:
            if self._error is not None:
                raise self._error
            t0 = time.perf_counter()
            keep = {s.sha256 for s in self._wanted}
            self._fetch(shard, keep, demand=True)
            self.wait_s += time.perf_counter() - t0
            arr = np.memmap(self._path(shard), dtype=dtype, mode="r").view(np.ndarray)
        self._arrays[shard.sha256] = arr
        return arr

    def want(self, shards: Sequence[Shard]) -> None:
        """The shards the coming windows need, in order: kept, and fetched ahead by the thread."""
        if not self.remote:
            return
        with self._lock:
            self._wanted = list(shards)
            self._lock.notify_all()
        if self.prefetch and self._thread is None:
            self._thread = threading.Thread(target=self._prefetch, name="shard-prefetch", daemon=True)
            self._thread.start()

    def _prefetch(self) -> None:
        done: list[Shard] | None = None
        while True:
            with self._lock:
                while self._wanted is done:
                    self._lock.wait()
                wanted = done = self._wanted
            keep = {s.sha256 for s in wanted}
            try:
                for shard in wanted:
                    if self._wanted is not wanted or not self._fetch(shard, keep, demand=False):
                        break
            except ShardUnavailable:
                continue  # the reader's fetch of that shard tries again (or ends the run)
            except BaseException as e:  # the reader raises it at its next fetch
                self._error = e
                return
