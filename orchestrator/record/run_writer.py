"""Rows and tags written to a run's tracking store in batches, kept while the store does not answer.

A tracking server that stops answering never holds up training: each request is bounded
(:data:`HTTP_LIMITS`), rows and tags wait here and unacknowledged records in the checkpoints,
tried again every :data:`RETRY_S`; back within ``tracking.outage_timeout_s`` nothing is lost, past
it the run stops (:class:`TrackingLost`, :meth:`RunWriter.lost_message`)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

import requests
import urllib3.exceptions
from mlflow.entities import Metric

from orchestrator.config.uris import redact_text
from trainers.errors import one_line

MAX_BATCH = 900  # MLflow's log_batch takes at most 1000 metrics per call
# Rows are written in batches about this often: a MLflow (SQLite) call costs the driver ~4 ms of CPU
# plus ~0.1 ms a row, and at hundreds of steps a second that CPU is taken from the training workers.
FLUSH_S = 2.0
# While the tracking store does not answer, the buffered rows are tried again this often (each try
# is one bounded request: HTTP_LIMITS); training goes on meanwhile (tracking.outage_timeout_s).
RETRY_S = 5.0
# Bounds on each request to a tracking server, unless the environment sets them: MLflow's own
# defaults (7 retries with backoff, 120 s timeout) hold one call for about 4 minutes, and the
# driver, which also relays resizes and the progress bar, must not stand still that long; the
# writer retries on its own (RETRY_S) for as long as tracking.outage_timeout_s allows.
HTTP_LIMITS = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
}


def bound_http_requests(uri: str) -> None:
    """:data:`HTTP_LIMITS` for a tracking server (``http(s)://``), each only where the environment
    does not set it already."""
    if uri.split(":", 1)[0].lower() in ("http", "https"):
        for key, value in HTTP_LIMITS.items():
            os.environ.setdefault(key, value)


def unavailable(e: BaseException) -> bool:
    """Whether ``e`` says the tracking store did not answer (refused or dropped connection, a
    timeout, retries used up on 5xx/429 answers), as opposed to refusing the request itself (a
    bad value, a missing run), which waiting does not cure.  MLflow wraps the HTTP library's error
    in an ``MlflowException`` whose context keeps it."""

    gone = (
        requests.exceptions.ConnectionError,
        requests.exceptions.Timeout,
        requests.exceptions.RetryError,
        urllib3.exceptions.HTTPError,
        ConnectionError,
        TimeoutError,
    )
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, gone):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def short_error(e: BaseException) -> str:
    """The innermost cause's type and first line, credentials masked (MLflow quotes the URL)."""
    inner = e
    while inner.__cause__ or inner.__context__:
        inner = inner.__cause__ or inner.__context__
    return redact_text(one_line(inner, None))[:160]


class TrackingLost(Exception):
    """The tracking store did not answer for ``tracking.outage_timeout_s``: the run stops at a
    checkpoint (its unconfirmed records ride in it) and ends with :meth:`RunWriter.lost_message`."""


class Outage:
    """The tracking store stopped answering at ``since`` (monotonic; ``wall``: the clock time),
    with ``error``; the next write is tried at ``next_try``."""

    def __init__(self, error: str) -> None:
        self.since, self.wall, self.error = time.monotonic(), time.time(), error
        self.next_try = self.since + RETRY_S


class RunWriter:
    """Write one run's metric rows and tags in batches, keeping them through a tracking outage.

    ``uri``: the tracking URI as given (said, redacted, in the outage's lines);
    :attr:`written_upto`: every step record up to this step is written (what the driver acks);
    :attr:`lost`: the store stayed away past ``outage_timeout_s``, nothing more is tried;
    :attr:`warn`: where the outage's lines go; :attr:`on_back`: called once the store answers again."""

    def __init__(
        self, client: Any, run_id: str, uri: str, outage_timeout_s: float, warn: Callable[[str], None] | None = None
    ) -> None:
        self.client, self.run_id, self.uri = client, run_id, uri
        self.outage_timeout_s = outage_timeout_s
        self.outage: Outage | None = None
        self.lost = False
        self.written_upto = -1
        self.warn: Callable[[str], None] = warn or (lambda line: print(line, file=sys.stderr, flush=True))
        self.on_back: Callable[[], None] = lambda: None
        self._rows: list[Any] = []  # MLflow Metric rows not yet written
        self._tags: dict[str, str] = {}  # tags held back by an outage
        self._unwritten: dict[int, int] = {}  # step -> metric values of the records not written yet
        self._flushed = time.monotonic()

    # -- what is buffered ----------------------------------------------------------------------

    def cover(self, records: list[tuple]) -> None:
        """The step records ``(step, metrics, ...)`` the rows added next come from: once written,
        :attr:`written_upto` reaches their newest step."""
        for step, metrics, *_ in records:
            if step > self.written_upto:
                self._unwritten[step] = max(self._unwritten.get(step, 0), len(metrics))

    def add_points(self, points: list[tuple[str, int, float, float]]) -> None:
        """Buffer ``(metric, step, value, time)`` points as rows (written at the next :meth:`flush`)."""

        self._rows.extend(Metric(key, value, int(1000 * when), step) for key, step, value, when in points)

    def log_rows(self, rows: list[Any]) -> None:
        """MLflow ``Metric`` rows as they are (two at one step stay two), written now or, while the
        store does not answer, with the buffered rows."""
        self._rows.extend(rows)
        self.flush()

    def due(self) -> bool:
        """Whether :data:`FLUSH_S` has passed since the last write."""
        return time.monotonic() - self._flushed >= FLUSH_S

    # -- writing -------------------------------------------------------------------------------

    def flush(self, force: bool = False) -> None:
        """Write the buffered rows (and tags held back by an outage).

        A store that does not answer (:func:`unavailable`) raises nothing here: the rows stay
        buffered, :attr:`written_upto` stays where it was (so rank 0 keeps the records in its
        checkpoints), and the write is tried again every :data:`RETRY_S` (``force``: now) until
        the store answers (nothing is lost) or :meth:`outage_expired` ends the run."""
        now = time.monotonic()
        self._flushed = now
        if self.lost or (self.outage is not None and not force and now < self.outage.next_try):
            return
        try:
            while self._rows:
                chunk = self._rows[:MAX_BATCH]
                self.client.log_batch(self.run_id, metrics=chunk)
                del self._rows[: len(chunk)]
            while self._tags:
                key = next(iter(self._tags))
                self.client.set_tag(self.run_id, key, self._tags[key])
                del self._tags[key]
        except Exception as e:
            if not unavailable(e):
                raise
            self._away(e)
            return
        if self.outage is not None:
            self._back()
        self.written_upto = max(self.written_upto, max(self._unwritten, default=-1))
        self._unwritten.clear()

    def set_tags(self, tags: dict[str, Any]) -> None:
        """Tags (failures, notes: free text that may quote a URI) with any credential redacted.
        While the store does not answer they wait with the rows (:meth:`flush`)."""
        clean = {k: redact_text(str(v)) for k, v in tags.items()}
        if self.outage is not None or self.lost:
            self._tags.update(clean)
            return
        items = list(clean.items())
        for i, (k, v) in enumerate(items):
            try:
                self.client.set_tag(self.run_id, k, v)
            except Exception as e:
                if not unavailable(e):
                    raise
                self._tags.update(items[i:])  # this one and the rest wait
                self._away(e)
                return

    def close(self, status: str) -> None:
        """Mark the run terminated with ``status``; a store that does not answer is warned about."""
        try:
            self.client.set_terminated(self.run_id, status=status)
        except Exception as e:
            if not unavailable(e):
                raise
            self.warn(
                f"warning: the tracking server {redact_text(self.uri)} did not answer; the run was not "
                f"closed {status} there ({short_error(e)})"
            )

    # -- an outage -----------------------------------------------------------------------------

    def _away(self, e: BaseException) -> None:
        if self.outage is None:
            self.outage = Outage(short_error(e))
            self.warn(
                f"warning: the tracking server {redact_text(self.uri)} does not answer ({self.outage.error}); "
                f"training goes on and its records are kept for up to {self.outage_timeout_s:g} s"
            )
        else:
            self.outage.next_try = time.monotonic() + RETRY_S

    def _back(self) -> None:
        away = time.monotonic() - self.outage.since
        self.outage = None
        self.warn(f"the tracking server answers again after {away:.0f} s: every record kept meanwhile is logged")
        self.on_back()

    def outage_expired(self) -> TrackingLost | None:
        """Try the store again when due; once it has not answered for ``tracking.outage_timeout_s``
        the writer gives up (:attr:`lost`: no more calls to it) and returns the error to stop the
        run with (None while the store answers or the wait goes on)."""
        if self.outage is None or self.lost:
            return None
        if time.monotonic() >= self.outage.next_try:
            self.flush(force=True)
            if self.outage is None:
                return None
        if time.monotonic() - self.outage.since < self.outage_timeout_s:
            return None
        self.lost = True
        return TrackingLost(
            f"the tracking server {redact_text(self.uri)} did not answer for "
            f"{self.outage_timeout_s:g} s ({self.outage.error})"
        )

    def await_store(self) -> TrackingLost | None:
        """Wait, trying every :data:`RETRY_S`, until the store answers what is buffered or
        ``tracking.outage_timeout_s`` has passed since it stopped answering."""
        while self.outage is not None and not self.lost:
            lost = self.outage_expired()
            if lost is not None:
                return lost
            if self.outage is not None:
                time.sleep(max(0.0, min(RETRY_S, self.outage.next_try - time.monotonic())))
        return None

    def unrecorded(self) -> tuple[int, int, int | None]:
        """What the store does not hold: (step records, metric values, the first such step)."""
        return len(self._unwritten), sum(self._unwritten.values()), min(self._unwritten, default=None)

    def lost_message(self, lost: TrackingLost, stopped_at: int, checkpoints: str, resume: str) -> str:
        """One line for a run whose tracking store stayed away: what was not recorded, where the
        checkpoints are and the command that records it all once the store is back."""
        records, values, first = self.unrecorded()
        since = time.strftime("%H:%M:%S", time.localtime(self.outage.wall)) if self.outage else "?"
        what = (
            f"{records} step records ({values} metric values) from step {first} on were not recorded "
            f"(the checkpoints carry them; the steps after the newest one are trained again)"
            if records
            else "every step record was recorded"
        )
        return (
            f"{lost} since {since}; training reached step {stopped_at}; {what}; checkpoints: "
            f"{checkpoints}; the run shows RUNNING until it is resumed; once the server answers again: {resume}"
        )
