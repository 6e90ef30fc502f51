"""A store that stops answering during a run (trainers/data/shards/cache.py): the retry policy, on a
clock of the test's own (no waits); the one line a shard the store did not serve ends the run with;
a cache that fetches again once the store is back; and the event that error becomes on a worker
(trainers/link/failure.py), raised in the loop's process or re-raised from a DataLoader process.
The cache against a real S3-compatible server: tests/integration/test_token_shards.py."""

from __future__ import annotations

import io

import numpy as np
import pytest

from trainers.data.shards import cache as cache_module
from trainers.data.shards.cache import RETRIES, Backoff, GaveUp, ShardCache, ShardUnavailable
from trainers.data.shards.manifest import Manifest
from trainers.data.shards.prepare import prepare
from trainers.errors import EndsRun
from trainers.link.failure import run_ending_error


class _Clock:
    """Time that moves only when slept (or when a try takes ``per_try`` seconds)."""

    def __init__(self, per_try: float = 0.0) -> None:
        self.now, self.per_try, self.pauses = 100.0, per_try, []

    def sleep(self, s: float) -> None:
        self.pauses.append(s)
        self.now += s

    def __call__(self) -> float:
        return self.now


def _failing(clock: _Clock, failures: int):
    tries = []

    def attempt() -> str:
        tries.append(clock.now)
        clock.now += clock.per_try
        if len(tries) <= failures:
            raise ConnectionRefusedError("connection refused")
        return "served"

    return attempt, tries


@pytest.mark.parametrize("failures", [0, 1, 3])
def test_a_try_that_fails_is_retried_after_each_pause_in_turn(failures):
    clock = _Clock()
    attempt, tries = _failing(clock, failures)
    assert Backoff().call(attempt, clock.sleep, clock) == "served"
    assert clock.pauses == list(RETRIES[:failures]) and len(tries) == failures + 1


def test_the_pauses_spent_end_in_gave_up_with_the_last_error():
    clock = _Clock()
    attempt, tries = _failing(clock, 10)
    with pytest.raises(GaveUp) as e:
        Backoff(pauses=(1.0, 2.0)).call(attempt, clock.sleep, clock)
    assert clock.pauses == [1.0, 2.0] and len(tries) == 3
    assert e.value.tries == 3 and e.value.elapsed_s == 3.0 and isinstance(e.value.error, ConnectionRefusedError)


def test_no_retry_starts_past_the_time_limit():
    """Tries that hang 10 s each (until the store client's timeout): the limit of 30 s allows the
    pauses of 0.5 and 2 s, not the third try's 8 s after 22.5 s."""
    clock = _Clock(per_try=10.0)
    attempt, tries = _failing(clock, 10)
    with pytest.raises(GaveUp) as e:
        Backoff(limit_s=30.0).call(attempt, clock.sleep, clock)
    assert clock.pauses == [0.5, 2.0] and len(tries) == 3 and e.value.elapsed_s == 32.5


def test_an_error_other_than_the_stores_is_not_retried():
    clock = _Clock()

    def attempt():
        raise ValueError("a bug")

    with pytest.raises(ValueError):
        Backoff().call(attempt, clock.sleep, clock)
    assert clock.pauses == []


class _Store:
    """A pyarrow-like filesystem: its reads raise ``error`` while ``down`` (counting each), else serve ``data``."""

    def __init__(self, data: bytes, error: OSError) -> None:
        self.data, self.error, self.down, self.opened = data, error, True, 0

    def open_input_stream(self, path):
        self.opened += 1
        if self.down:
            raise self.error
        return io.BytesIO(self.data)


def _remote_cache(tmp_path, monkeypatch, error: OSError) -> tuple[ShardCache, _Store, Manifest, _Clock]:
    src = tmp_path / "src.txt"
    src.write_bytes(bytes(range(256)) * 12)
    m = prepare([str(src)], str(tmp_path / "shards"), shard_tokens=400, progress=False)[0]
    store = _Store((tmp_path / "shards" / m.shards[0].name).read_bytes(), error)
    monkeypatch.setattr(cache_module, "remote", lambda location: (store, location.split("://", 1)[1]))
    remote = Manifest("s3://b/corpus", m.dtype, m.vocab_size, m.eos_id, m.tokenizer, m.shards)
    cache = ShardCache(remote, 1 << 20, str(tmp_path / "c"), prefetch=False)
    clock = _Clock()
    cache.sleep, cache.clock = clock.sleep, clock
    return cache, store, m, clock


def test_a_store_that_stops_answering_ends_in_one_line_and_the_cache_fetches_again_once_it_is_back(
    tmp_path, monkeypatch
):
    err = OSError(
        "When reading information for key 'corpus/shard-00000.bin' in bucket 'b': AWS Error NETWORK_CONNECTION"
    )
    cache, store, m, clock = _remote_cache(tmp_path, monkeypatch, err)
    with pytest.raises(ShardUnavailable) as e:
        cache.array(m.shards[0])
    line = str(e.value)
    assert line == (
        "data.root: could not fetch shard 'shard-00000.bin' from s3://b/corpus after 4 tries in 10.5 s "
        f"({err}); the run stopped at its newest checkpoint: resume it once the store answers again"
    )
    assert isinstance(e.value, EndsRun) and isinstance(e.value, OSError)
    assert store.opened == 4 and clock.pauses == list(RETRIES) and cache.fetches == 0
    assert not list((tmp_path / "c").iterdir())  # nothing half-written kept
    store.down = False  # the store is back: the same cache (a resumed run's) reads the shard
    assert np.array_equal(cache.array(m.shards[0]), np.frombuffer(store.data, dtype="<u2"))
    assert cache.fetches == 1


def test_a_shard_gone_from_the_store_says_so(tmp_path, monkeypatch):
    cache, _, m, _ = _remote_cache(
        tmp_path, monkeypatch, FileNotFoundError("Path does not exist 'b/corpus/shard-00000.bin'")
    )
    gone = r"^data\.root: could not fetch shard 'shard-00000\.bin' from s3://b/corpus after 4 tries in 10\.5 s "
    tail = r"\(gone from the store: Path does not exist .*\); .*: put the shard back .*, then resume it$"
    with pytest.raises(ShardUnavailable, match=gone + tail) as e:
        cache.array(m.shards[0])
    assert "\n" not in str(e.value)


def _shard_unavailable(seconds: float = 10.5) -> ShardUnavailable:
    return ShardUnavailable(
        f"data.root: could not fetch shard 'shard-00003.bin' from s3://b/c after 4 tries in {seconds} s (x)"
    )


def test_the_error_is_an_event_that_ends_the_run_naming_its_field():
    try:
        raise _shard_unavailable()
    except ShardUnavailable as raised:
        exc = raised
    ev = run_ending_error(exc, rank=2, phase=1)
    assert ev is not None and ev.deterministic and (ev.rank, ev.phase) == (2, 1)
    assert ev.where == "data.root"
    assert ev.message == "data.root: could not fetch shard 'shard-00003.bin' from s3://b/c after 4 tries in 10.5 s (x)"
    assert "Traceback" in ev.traceback
    assert run_ending_error(OSError("connection refused")) is None  # an error a restart may cure


def test_the_error_re_raised_from_a_dataloader_process_is_the_same_event():
    from torch._utils import ExceptionWrapper

    try:
        raise _shard_unavailable()
    except ShardUnavailable:
        wrapped = ExceptionWrapper(where="in DataLoader worker process 0")  # what a loader process sends
    with pytest.raises(ShardUnavailable) as e:
        wrapped.reraise()
    ev = run_ending_error(e.value)
    assert ev is not None and ev.where == "data.root" and ev.error.startswith("could not fetch shard 'shard-00003.bin'")
    assert ev.error.endswith("(x)")


class _Bar:
    """A progress bar's stand-in: the lines written under it."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def write(self, line: str) -> None:
        self.lines.append(line)


def test_the_driver_writes_the_error_once_whichever_ranks_met_it_and_announces_no_restart():
    from orchestrator.record.events import GroupFailed
    from orchestrator.record.listeners import ProgressListener

    bar = _Bar()
    listener = ProgressListener(bar)  # type: ignore[arg-type]
    # each rank's line says how long it tried (10.6 s on one, 10.5 s on the other): the first is written
    events = [run_ending_error(_shard_unavailable(10.5 + r / 10), rank=r, phase=1) for r in (1, 0)]
    for ev in [*events, GroupFailed(phase=1, message="ShardUnavailable: data.root: could not fetch ...")]:
        listener.on_event(ev)
    assert bar.lines == [f"error: {events[0].message}"]
    ProgressListener(other := _Bar()).on_event(GroupFailed(phase=1, message="RayActorError: died"))
    assert other.lines[0].startswith("warning: a worker failed (RayActorError: died); the group restarts")
