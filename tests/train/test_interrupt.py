"""Ctrl-C during training: the first SIGINT asks for a stop, the second stops at once."""

import os
import signal
import threading

import pytest

from headwise.train.interrupt import StopOnSigint


def test_first_sigint_requests_a_stop_the_second_raises_and_the_handler_is_restored(capsys):
    before = signal.getsignal(signal.SIGINT)
    with StopOnSigint() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested
        assert "saving a checkpoint after this step" in capsys.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


def test_outside_the_main_thread_it_installs_nothing():
    seen = []

    def run():
        with StopOnSigint() as stop:
            seen.append((stop._previous, signal.getsignal(signal.SIGINT)))

    before = signal.getsignal(signal.SIGINT)
    worker = threading.Thread(target=run)
    worker.start()
    worker.join()
    assert seen == [(None, before)]
