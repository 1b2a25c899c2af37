"""One place to register what a forked child must redo: ``after_fork_in_child(hook)``.

Locks held by another thread at the fork, export threads, recording windows and counts belong to
the parent.  Every module that keeps such state registers a hook here instead of calling
``os.register_at_fork`` itself; the hooks run in registration order (import order) in the child,
each guarded: a hook that raises is logged on ``stepscope.failures.fork`` and the others still
run.  On platforms without ``fork`` nothing is registered.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable

__all__ = ["after_fork_in_child", "fork_hooks"]

_hooks: list[Callable[[], object]] = []
_lock = threading.Lock()
_log = logging.getLogger("stepscope.failures.fork")


def after_fork_in_child(hook: Callable[[], object]) -> Callable[[], object]:
    """Run ``hook()`` in every child forked from now on (returns ``hook``, so it decorates)."""
    if not callable(hook):
        raise TypeError(f"a fork hook must be callable, got {hook!r}")
    with _lock:
        _hooks.append(hook)
    return hook


def fork_hooks() -> list[Callable[[], object]]:
    """The registered hooks, in the order they run."""
    with _lock:
        return list(_hooks)


def _run_in_child() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork
    for hook in list(_hooks):
        try:
            hook()
        except Exception as exc:  # raising in a fork hook helps no one: log and go on
            with contextlib.suppress(Exception):
                _log.warning(
                    "stepscope: in a forked child, %s failed (%s: %s)",
                    getattr(hook, "__qualname__", repr(hook)),
                    type(exc).__name__,
                    exc,
                )


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_run_in_child)
