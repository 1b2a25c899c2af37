"""Kineto's result saved to a file, in a forked child when the caller is not the loop's thread.

torch's ``kineto_results.save`` holds the GIL while Kineto writes its JSON: about a quarter of a
second for 100,000 events, in which a training loop on another thread cannot run a line of
Python.  Called off the loop (the profile's writer thread) for a session that recorded the CPU
only, it runs in a child forked for it, which only saves and leaves (``os._exit``); this process
waits for it without the GIL.  The parent's copy of the result is untouched, so if the child
fails, is reaped by someone else with no file, or takes longer than ``CHILD_WAIT_S``, the result
is saved here after all.  A session that recorded a device saves here (a forked child cannot
use the device), and so does every session of a distributed job (a fork can upset memory
registered with a network adapter) or when ``STEPSCOPE_FORK_SAVE=0`` is set.  The caller says
"on the loop" also for a window the loop is waiting for (its last, saved in ``profile.stop()``):
nothing runs beside that save, and a child's copy-on-write makes it several times slower.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import time
from typing import Any

from stepscope.distributed import rank_and_world_size

__all__ = ["CHILD_WAIT_S", "ENV_FORK_SAVE", "save_kineto"]

ENV_FORK_SAVE = "STEPSCOPE_FORK_SAVE"
"""``0``: never save Kineto's result in a forked child."""
CHILD_WAIT_S = 120.0
"""How long the child may take before it is killed and the result saved in this process."""
_POLL_S = 0.002


def save_kineto(results: Any, path: str, device: str | None, off_loop: bool) -> str:
    """Save ``results`` (a ``_ProfilerResult``) to ``path``; says where it was saved
    (``"child"`` or ``"here"``).  ``off_loop``: the caller is not the training loop's thread."""
    if device is None and off_loop and _may_fork():
        try:
            if _save_in_child(results, path):
                return "child"
        except (OSError, DeprecationWarning):
            # no fork here (limits, memory), or 3.12's warning about forking a threaded process
            # made an error by the program's warning filters: save in this process
            pass
    results.save(path)
    return "here"


def _may_fork() -> bool:
    if not hasattr(os, "fork") or os.environ.get(ENV_FORK_SAVE, "1") == "0":
        return False
    _, world = rank_and_world_size()
    return world is None or world < 2


def _save_in_child(results: Any, path: str) -> bool:
    """Whether a forked child saved ``results`` to ``path`` (Kineto renames the file into
    place when complete, so a non-empty ``path`` is a whole file)."""
    pid = os.fork()  # (3.12 warns "may lead to deadlocks": the child only saves, then leaves)
    if pid == 0:  # the child: save, then leave without running anything of the parent's
        code = 1
        try:
            results.save(path)
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + CHILD_WAIT_S
    status: int | None = None
    exited = _exit_notice(pid)
    try:
        while status is None:
            try:
                done, code = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:  # reaped by the program: the file tells
                break
            if done:
                status = code
            elif time.monotonic() > deadline:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                return False
            elif exited is not None:  # woken the moment the child exits
                select.select([exited], [], [], min(1.0, max(0.0, deadline - time.monotonic())))
            else:
                time.sleep(_POLL_S)
    finally:
        if exited is not None:
            os.close(exited)
    if status is not None and not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
        return False
    return os.path.getsize(path) > 0


def _exit_notice(pid: int) -> int | None:
    """A descriptor that becomes readable when child ``pid`` exits (Linux 5.3+), else None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
