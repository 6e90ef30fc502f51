"""orchestrator/ray_env.py: SIGTERM as Ctrl-C for the CLI drivers (no Ray started here)."""

import os
import signal

import pytest

from orchestrator import ray_env


def test_sigterm_inside_the_block_raises_keyboard_interrupt_and_the_old_handler_comes_back():
    seen = []
    old = signal.signal(signal.SIGTERM, lambda *_: seen.append("old"))
    try:
        with pytest.raises(KeyboardInterrupt):
            with ray_env.terminate_as_interrupt():
                assert ray_env._term_as_interrupt
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(100):  # the handler runs between bytecodes of the main thread
                    pass
        assert not ray_env._term_as_interrupt
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100):
            pass
        assert seen == ["old"]
    finally:
        signal.signal(signal.SIGTERM, old)
