"""Whether a study's drivers are alive, and what is done with the trials of one that died.

A search driver killed by SIGKILL, ``ray job stop`` or a lost head node leaves its trials RUNNING
in the study forever: Optuna cannot tell a dead driver's trial from a live one's.  Each driver
therefore beats (``Heartbeat``):

* every ``interval_s`` seconds for each trial it has asked and not yet told (pending ones too);
  on an RDB storage through Optuna's own heartbeat (``RDBStorage(heartbeat_interval=...,
  grace_period=...)``, ``record_heartbeat``, ``optuna.storages.fail_stale_trials``); on a journal
  file, which has no heartbeat in Optuna 5, as the trial's system attribute ``search:heartbeat``
  (unix time);
* for its own invocation record (``Invocation``, study system attribute ``search:request:<id>``:
  what ``--trials`` asked, how many trials of the chain were already finished, its last beat).

Only Optuna's public API is used: the driver keeps the storage it opened (``StudyStore``) and asks
it for the study's and the trials' ids (``get_study_id_from_name``,
``get_trial_id_from_study_id_trial_number``); ``Study`` and ``Trial`` keep theirs private.

A RUNNING trial whose beat is older than ``GRACE_BEATS`` intervals belongs to a dead driver
(``fail_stale``): it is told FAIL, its MLflow child run is closed KILLED, its checkpoints are deleted
(unless the space keeps them) and its config is queued again as a WAITING trial with user attribute
``retry_of`` (grid points keep their ``grid_id``, so the grid is finished, not skipped).  A live
driver's trials always have fresh beats, so two live drivers on one study never fail each other's
trials (``tests/unit/test_search_liveness.py``).

``--trials N`` counts the trials one command evaluates.  A re-run of the same command (same space
file, same ``--trials``) whose earlier invocation died unfinished takes that invocation's record
over (``adopt``): it evaluates only what is left of the N, the re-queued trials first.  A re-run
after a finished invocation adds N more trials.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import optuna

if TYPE_CHECKING:
    from optuna import Study
    from optuna.storages import BaseStorage
    from optuna.trial import FrozenTrial

DEFAULT_HEARTBEAT_S = 10
GRACE_BEATS = 3  # a trial is stale once its beat is older than GRACE_BEATS x the heartbeat interval
BEAT_ATTR = "search:heartbeat"  # trial system attribute (journal storage): unix time of the last beat
REQUEST_PREFIX = "search:request:"  # study system attribute per invocation: its request and last beat
INVOCATION_ATTR = "search_invocation"  # trial user attribute: the invocation that asked it
RETRY_ATTR = "retry_of"  # user attribute of a re-queued trial: the number of the lost trial
LOST_ERROR = "its search driver died (no heartbeat)"


def grace_s(interval_s: float) -> float:
    """Seconds without a beat after which a RUNNING trial is stale: ``GRACE_BEATS * interval_s``."""
    return GRACE_BEATS * float(interval_s)


class StaleCollector:
    """Optuna's ``heartbeat_stale_trial_callback`` for an RDB storage: keeps the trials
    ``fail_stale_trials`` failed, so the driver can close their runs and queue them again."""

    def __init__(self) -> None:
        self.trials: list[FrozenTrial] = []

    def __call__(self, study: Study, trial: FrozenTrial) -> None:
        self.trials.append(trial)


class StudyStore:
    """A study and the storage the driver opened it on (``search.study_storage.open_storage``).  The
    study's id and its trials' ids come from the storage; ``rdb``: an RDB storage opened with
    Optuna's heartbeat (``RDBStorage(heartbeat_interval=...)``), else the driver beats itself."""

    def __init__(self, study: Study, storage: BaseStorage) -> None:

        self.study, self.storage = study, storage
        self.study_id = storage.get_study_id_from_name(study.study_name)
        self.rdb = isinstance(storage, optuna.storages.RDBStorage) and storage.get_heartbeat_interval() is not None
        self._ids: dict[int, int] = {}  # trial number -> the storage's trial id (they never change)

    def trial_id(self, number: int) -> int:
        """The storage's id of the study's trial ``number``."""
        if number not in self._ids:
            self._ids[number] = self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)
        return self._ids[number]

    def system_attrs(self) -> dict[str, Any]:
        return self.storage.get_study_system_attrs(self.study_id)

    def set_system_attr(self, key: str, value: Any) -> None:
        self.storage.set_study_system_attr(self.study_id, key, value)


def lost_numbers(trials: list[FrozenTrial]) -> set[int]:
    """Numbers of the trials whose driver died (another trial is their ``retry_of``)."""
    return {int(t.user_attrs[RETRY_ATTR]) for t in trials if RETRY_ATTR in t.user_attrs}


# --------------------------------------------------------------------------- beating


class Heartbeat:
    """A driver's pulse: a daemon thread that beats every ``interval_s`` for the trials in ``watch``
    (until ``forget``) and for the invocation record.  Storage trouble in a beat is ignored (the
    next beat tries again); a trial told meanwhile is simply dropped."""

    def __init__(self, store: StudyStore, interval_s: float, invocation: Invocation | None = None) -> None:
        self.store = store
        self.interval_s = float(interval_s)
        self.invocation = invocation
        self._trials: set[int] = set()  # the numbers of the trials beaten for
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def watch(self, number: int) -> None:
        """Beat for trial ``number`` from now on (and once at once)."""
        with self._lock:
            self._trials.add(number)
        self._beat_trial(number)

    def forget(self, number: int) -> None:
        """Stop beating for trial ``number`` (call it before telling the trial's state)."""
        with self._lock:
            self._trials.discard(number)

    def beat(self) -> None:
        """One beat for every watched trial and the invocation record."""
        with self._lock:
            ids = sorted(self._trials)
        for tid in ids:
            self._beat_trial(tid)
        if self.invocation is not None:
            try:
                self.invocation.beat()
            except Exception:
                pass

    def _beat_trial(self, number: int) -> None:
        try:
            trial_id = self.store.trial_id(number)
            if self.store.rdb:
                self.store.storage.record_heartbeat(trial_id)
            else:
                self.store.storage.set_trial_system_attr(trial_id, BEAT_ATTR, time.time())
        except Exception:  # told meanwhile (UpdateFinishedTrialError) or a storage hiccup: the next beat
            pass

    def start(self) -> None:
        self.beat()
        self._thread = threading.Thread(target=self._run, name="search-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.beat()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


# --------------------------------------------------------------------------- finding the dead


def running_trials(study: Study) -> list[FrozenTrial]:

    return study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))


def last_beat(t: FrozenTrial) -> float:
    """A journal trial's last beat (its start if it never beat)."""
    beat = t.system_attrs.get(BEAT_ATTR)
    if isinstance(beat, (int, float)):
        return float(beat)
    return t.datetime_start.timestamp() if t.datetime_start is not None else 0.0


def fail_stale(store: StudyStore, interval_s: float, now: Callable[[], float] = time.time) -> list[FrozenTrial]:
    """Tell FAIL every RUNNING trial whose beat is older than ``grace_s(interval_s)``; return them
    (as they were before, RUNNING).  RDB: Optuna's ``fail_stale_trials``; journal: our beat attribute."""

    storage, study = store.storage, store.study
    if store.rdb:
        cb = storage.get_heartbeat_stale_trial_callback()
        if not isinstance(cb, StaleCollector):
            raise RuntimeError("the RDB storage was opened without search's stale-trial collector")
        cb.trials.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            optuna.storages.fail_stale_trials(study)
        return list(cb.trials)
    lost = []
    limit = grace_s(interval_s)
    t_now = now()
    for t in running_trials(study):
        if t_now - last_beat(t) <= limit:
            continue
        try:
            trial_id = store.trial_id(t.number)
            storage.set_trial_system_attr(trial_id, "fail_reason", LOST_ERROR)
            if storage.set_trial_state_values(trial_id, state=optuna.trial.TrialState.FAIL):
                lost.append(t)
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another driver failed it first, or its own driver told it just now
    return lost


def wait_for_verdict(
    store: StudyStore, interval_s: float, say: Callable[[str], None], sleep: Callable[[float], None] = time.sleep
) -> None:
    """Before recovering: if RUNNING trials have fresh beats, wait until each is either stale or has
    beaten again (at most one grace period), so that a driver killed a moment ago is recognised."""
    running = running_trials(store.study)
    if not running:
        return
    limit = grace_s(interval_s)
    if store.rdb:
        wait = limit + 1.0  # Optuna does not show the beat times: wait one whole grace period
    else:
        wait = max(0.0, max(last_beat(t) for t in running) + limit + 0.5 - time.time())
    if wait <= 0:
        return
    nums = ", ".join(str(t.number) for t in running[:10])
    say(f"trial(s) {nums} are RUNNING: waiting {wait:.0f} s to see whether their driver is alive")
    sleep(wait)


def requeue(study: Study, lost: FrozenTrial) -> None:
    """Queue the lost trial's config again: a WAITING trial with its params (and grid point), user
    attribute ``retry_of``; the next ``ask`` of any driver takes it."""

    system = {k: lost.system_attrs[k] for k in ("grid_id", "search_space") if k in lost.system_attrs}
    study.add_trial(
        optuna.trial.create_trial(
            state=optuna.trial.TrialState.WAITING,
            params=dict(lost.params),
            distributions=dict(lost.distributions),
            user_attrs={RETRY_ATTR: lost.number},
            system_attrs=system,
        )
    )


# --------------------------------------------------------------------------- invocations


def request_key(space_text: str, trials: int | None) -> str:
    """What makes a re-run 'the same command': the space file's text and ``--trials``."""
    return hashlib.sha1(f"{trials}\n{space_text}".encode()).hexdigest()[:16]


@dataclass
class Invocation:
    """One ``search run``'s request, kept in the study so a re-run after its death can finish it:
    ``total`` trials asked by the command chain, ``base`` of them finished by earlier (dead)
    invocations of the chain."""

    store: StudyStore
    id: str
    key: str
    total: int
    base: int = 0

    @property
    def attr(self) -> str:
        return REQUEST_PREFIX + self.id

    def record(self, done: bool = False, stopped: bool = False) -> dict[str, Any]:
        # a driver that stops unfinished (Ctrl-C, an error) writes beat 0: a re-run takes it over at once
        return {
            "key": self.key,
            "total": self.total,
            "base": self.base,
            "beat": 0.0 if stopped else time.time(),
            "done": done,
        }

    def beat(self, done: bool = False, stopped: bool = False) -> None:
        self.store.set_system_attr(self.attr, self.record(done, stopped))

    def finished(self) -> int:
        """Trials of the chain finished so far (lost ones, whose driver died, do not count)."""
        return self.base + finished_by(self.store.study, self.id)

    def left(self) -> int:
        return max(0, self.total - self.finished())


def finished_by(study: Study, invocation_id: str) -> int:
    """Trials asked by ``invocation_id`` that ended (COMPLETE, PRUNED, FAIL), not counting lost ones."""
    trials = study.get_trials(deepcopy=False)
    lost = lost_numbers(trials)
    return sum(
        1
        for t in trials
        if t.user_attrs.get(INVOCATION_ATTR) == invocation_id and t.state.is_finished() and t.number not in lost
    )


def _open_requests(store: StudyStore, key: str) -> list[tuple[float, str, dict[str, Any]]]:
    """``(last beat, attribute, record)`` of the unfinished invocations of the command ``key``."""
    attrs = store.system_attrs()
    return [
        (float(rec.get("beat", 0)), name, rec)
        for name, rec in attrs.items()
        if name.startswith(REQUEST_PREFIX) and isinstance(rec, dict) and not rec.get("done") and rec.get("key") == key
    ]


def start_invocation(
    store: StudyStore,
    key: str,
    total: int,
    interval_s: float,
    now: Callable[[], float] = time.time,
    say: Callable[[str], None] | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> tuple[Invocation, str | None]:
    """This command's invocation record.  If an unfinished invocation of the same command (same
    ``key``) stopped beating more than a grace period ago, take it over: the new record continues
    its chain (``base`` = what the chain finished) and the old one is marked done.  One that beat
    less than a grace period ago is given that long to beat again (it may be alive: then this is a
    new invocation).  Returns the record and the id of the invocation taken over (or ``None``)."""
    limit = grace_s(interval_s)
    fresh = [b for b, _, _ in _open_requests(store, key) if now() - b <= limit]
    if fresh:
        wait = max(fresh) + limit + 0.5 - now()
        if wait > 0:
            if say is not None:
                say(
                    f"another driver ran this command {now() - max(fresh):.0f} s ago: waiting {wait:.0f} s to see "
                    f"whether it is alive"
                )
            sleep(wait)
    dead = [r for r in _open_requests(store, key) if now() - r[0] > limit]
    inv = Invocation(store, uuid.uuid4().hex[:12], key, total)
    taken = None
    if dead:
        _, name, rec = max(dead)
        old_id = name[len(REQUEST_PREFIX) :]
        inv.total = int(rec.get("total", total))
        inv.base = int(rec.get("base", 0)) + finished_by(store.study, old_id)
        store.set_system_attr(name, {**rec, "done": True, "taken_over_by": inv.id})
        taken = old_id
    inv.beat()
    return inv, taken


# --------------------------------------------------------------------------- one driver


class DriverLife:
    """One search driver's liveness: its invocation record, its beat for the trials it asked and
    has not told, and when it last looked for the trials of dead drivers."""

    def __init__(self, store: StudyStore | None, interval_s: float) -> None:
        self.store, self.interval_s = store, interval_s
        self.invocation: Invocation | None = None
        self.heartbeat: Heartbeat | None = None
        self.last_recovery = time.time()

    def begin(self, key: str, total: int, say: Callable[[str], None]) -> str | None:
        """This command's invocation record (``start_invocation``); the id of a dead one taken over."""
        assert self.store is not None
        self.invocation, taken = start_invocation(self.store, key, total, self.interval_s, say=say)
        return taken

    def start_beating(self) -> None:
        assert self.store is not None
        self.heartbeat = Heartbeat(self.store, self.interval_s, self.invocation)
        self.heartbeat.start()

    def end(self, done: bool) -> None:
        """Stop beating; the request is done, or (``done`` false: Ctrl-C, an error) stopped, which
        a re-run of the command takes over at once."""
        if self.heartbeat is not None:
            self.heartbeat.stop()
        if self.invocation is not None:
            try:
                self.invocation.beat(done=done, stopped=not done)
            except Exception:
                pass

    def asked(self, trial: Any) -> None:
        """A trial was asked: beat for it, and tag it with this invocation."""
        if self.heartbeat is not None:
            self.heartbeat.watch(trial.number)
        if self.invocation is not None:
            trial.set_user_attr(INVOCATION_ATTR, self.invocation.id)

    def forget(self, number: int) -> None:
        """Stop beating for trial ``number`` (just before its state is told)."""
        if self.heartbeat is not None:
            self.heartbeat.forget(number)

    def recovery_due(self) -> bool:
        """A grace period has passed since the last look for dead drivers' trials."""
        return time.time() - self.last_recovery > grace_s(self.interval_s)

    def find_dead(self, wait: bool, say: Callable[[str], None]) -> list[FrozenTrial]:
        """Fail the RUNNING trials of dead drivers (with ``wait``, first give fresh-looking ones a
        grace period to beat again) and return them (``fail_stale``)."""
        if self.store is None:
            return []
        if wait:
            wait_for_verdict(self.store, self.interval_s, say)
        self.last_recovery = time.time()
        return fail_stale(self.store, self.interval_s)
