"""Telling the user's own errors apart on a worker (trainers/link/failure.py) and deciding, on the
monitor and the driver alike, which end the run instead of a restart."""

from __future__ import annotations

import importlib.util
import textwrap

import pytest

from orchestrator.run.monitor import MonitorState
from orchestrator.run.outcome import is_fatal
from orchestrator.run.run_books import EventBook
from trainers.link.failure import is_user_file, user_error


def _user_module(tmp_path, body: str):
    path = tmp_path / "my_data.py"
    path.write_text(textwrap.dedent(body))
    spec = importlib.util.spec_from_file_location("my_data", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _raised(fn, *args):
    with pytest.raises(Exception) as info:
        fn(*args)
    return info.value


def test_the_users_innermost_frame_names_the_error(tmp_path):
    mod = _user_module(
        tmp_path,
        """
        def load(i):
            return get(i)

        def get(i):
            raise ValueError(f"corrupt record {i}")
    """,
    )
    import torch  # the user's code called from a library's (as a DataLoader calls __getitem__)

    e = _raised(lambda: torch.utils.data.default_collate([mod.load(17)]))
    ev = user_error(e, rank=1, phase=2)
    assert (ev.where, ev.error, ev.rank, ev.phase, ev.deterministic) == (
        "my_data.py:6 in get",
        "ValueError: corrupt record 17",
        1,
        2,
        True,
    )
    assert ev.message == "my_data.py:6 in get: ValueError: corrupt record 17"
    assert "Traceback" in ev.traceback and 'my_data.py", line 6' in ev.traceback


def test_an_io_error_may_pass_and_is_left_to_ray_trains_restarts(tmp_path):
    mod = _user_module(
        tmp_path,
        """
        def read(path):
            return open(path).read()
    """,
    )
    ev = user_error(_raised(mod.read, str(tmp_path / "missing")))
    assert ev.where == "my_data.py:3 in read" and ev.error.startswith("FileNotFoundError") and not ev.deterministic


def _below_this_file(e: BaseException) -> BaseException:
    """``e`` as a worker's loop catches it: without this test's own frames (this file is user code)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return e.with_traceback(tb)


def test_an_error_of_ours_or_a_librarys_is_not_the_users():
    from trainers.loop.config import CheckpointConfig

    assert user_error(_below_this_file(_raised(lambda: CheckpointConfig(keep=1)))) is None
    assert user_error(_below_this_file(_raised(int, "x"))) is None
    assert not is_user_file(CheckpointConfig.__module__.replace(".", "/") + ".py")
    assert not is_user_file(pytest.__file__) and not is_user_file("<frozen runpy>")


def test_an_error_re_raised_from_a_dataloader_worker_process_names_the_users_frame():
    text = (
        "Caught ValueError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
        '  File "/site/torch/utils/data/_utils/fetch.py", line 54, in fetch\n'
        "    data = [self.dataset[idx] for idx in possibly_batched_index]\n"
        '  File "/home/me/project/my_data.py", line 42, in __getitem__\n'
        '    raise ValueError(f"corrupt record {i}")\n'
        "ValueError: corrupt record 17\n"
    )
    ev = user_error(ValueError(text))
    assert (ev.where, ev.error) == ("my_data.py:42 in __getitem__", "ValueError: corrupt record 17")


def _ev(tmp_path, exc_type=ValueError):
    mod = _user_module(
        tmp_path,
        f"""
        def get(i):
            raise {exc_type.__name__}("record " + str(i))
    """,
    )
    return user_error(_raised(mod.get, 3))


def test_a_deterministic_error_ends_the_run_a_transient_one_when_it_comes_again(tmp_path):
    m, book = MonitorState(), EventBook(restarts=0)
    transient = _ev(tmp_path, OSError)
    m.workload_failed(transient)
    book.observe(transient)
    assert m.fatal() is None and book.fatal is None  # Ray Train restarts the group once more
    m.workload_failed(transient)
    book.observe(transient)
    assert m.fatal() == transient and book.fatal == transient  # the same place and type again: it stays
    m2, book2 = MonitorState(), EventBook(restarts=0)
    deterministic = _ev(tmp_path)
    m2.workload_failed(deterministic)
    book2.observe(deterministic)
    assert m2.fatal() == deterministic and book2.fatal == deterministic
    # the rule, written once (orchestrator/run/outcome.py)
    assert is_fatal(deterministic, []) and not is_fatal(transient, []) and is_fatal(transient, [transient])
    other = _ev(tmp_path, TimeoutError)  # another type at the same place is another error
    assert not is_fatal(other, [transient])
    assert [type(e).__name__ for e in m2.drain()[1]] == ["WorkloadFailed"]  # the driver hears of it
