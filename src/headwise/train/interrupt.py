"""Ctrl-C during training: the first SIGINT asks the loop to stop after the step it is in
(so the weights and the optimizer state are those of a finished step, and the checkpoint it
then writes resumes exactly); a second SIGINT stops at once (``KeyboardInterrupt``)."""

from __future__ import annotations

import signal
import sys
import threading

__all__ = ["StopOnSigint"]


class StopOnSigint:
    """Context manager: ``stop.requested`` turns True at the first SIGINT.

    Installed only in the main thread (Python delivers signals there); elsewhere it is inert
    and Ctrl-C keeps its default meaning."""

    def __init__(self):
        self.requested = False
        self._previous = None

    def _handle(self, signum, frame) -> None:
        if self.requested:  # the second Ctrl-C: do not wait for the step
            raise KeyboardInterrupt
        self.requested = True
        print("\nCtrl-C: saving a checkpoint after this step (press Ctrl-C again to stop "
              "without saving)", file=sys.stderr, flush=True)

    def __enter__(self) -> StopOnSigint:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None
