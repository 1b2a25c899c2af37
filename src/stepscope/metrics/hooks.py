"""Process hooks of the metrics pipelines: exit, SIGTERM, fork and the first declared step.

Every pipeline made in the process is tracked (weakly).  At exit (``atexit``, and
``multiprocessing.util.Finalize`` for children of multiprocessing, which skip atexit) and on
SIGTERM (only when no other handler is installed: flush, then die of SIGTERM as before) each is
shut down.  In a forked child each starts empty (fresh locks, thread and series).  When a loop
declares its first step, each exports at once, so the step gauge is there from the start.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
import weakref
from types import FrameType
from typing import Protocol

from stepscope.forks import after_fork_in_child
from stepscope.metrics.failures import LOGGER
from stepscope.steps import on_step_declared

__all__ = ["LivePipeline", "install_exit_hooks", "shutdown_all", "track"]


class LivePipeline(Protocol):
    """What the process hooks call on a pipeline."""

    def shutdown(self, timeout_s: float | None = None) -> None:
        """Final export and stop."""

    def request_export(self) -> None:
        """Export soon, without waiting."""

    def after_fork_in_child(self) -> None:
        """Start empty in a forked child."""


_live: weakref.WeakSet[LivePipeline] = weakref.WeakSet()
_hooks_installed = False
_sigterm_installed = False


def track(pipeline: LivePipeline) -> None:
    """Include ``pipeline`` in the exit, fork and first-step hooks (for as long as it lives)."""
    _live.add(pipeline)


def _export_on_first_step(step: int) -> None:
    """A loop declared its first step: export now, so the step gauge is there from the start."""
    for pipeline in list(_live):
        pipeline.request_export()


on_step_declared(_export_on_first_step)


class _Anchor:
    """Keeps the multiprocessing after-fork registration alive."""


_anchor = _Anchor()


def shutdown_all() -> None:
    """Shut down every pipeline of this process (the exit hooks call this)."""
    for pipeline in list(_live):
        try:
            pipeline.shutdown()
        except Exception:
            LOGGER.exception("stepscope.metrics: shutdown failed")


def _register_finalizer(_anchor_obj: object = None) -> None:
    import multiprocessing.util

    # children of multiprocessing leave through os._exit after running these finalizers
    multiprocessing.util.Finalize(None, shutdown_all, exitpriority=100)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    shutdown_all()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def install_exit_hooks(handle_sigterm: bool) -> None:
    """Shut every pipeline down at exit (once), and on SIGTERM if asked and nobody else is."""
    global _hooks_installed, _sigterm_installed
    if not _hooks_installed:
        _hooks_installed = True
        import multiprocessing.util

        atexit.register(shutdown_all)
        _register_finalizer()
        multiprocessing.util.register_after_fork(_anchor, _register_finalizer)
    if (
        handle_sigterm
        and not _sigterm_installed
        and threading.current_thread() is threading.main_thread()
    ):
        try:
            if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
                signal.signal(signal.SIGTERM, _on_sigterm)
                _sigterm_installed = True
        except (ValueError, OSError):
            pass


@after_fork_in_child
def _pipelines_after_fork() -> None:
    for pipeline in list(_live):
        pipeline.after_fork_in_child()
