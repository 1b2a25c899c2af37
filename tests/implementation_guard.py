"""Holds the ``implementation_independent`` marker honest.

The twins stage (``make test-twins``) skips the tests that carry it, so a marked test must not
reach any choice between the C extension and its pure-Python twins: it may not call
``_ext.native()`` or ``_ext.resolve()`` from inside the package while it runs (its fixtures
included) — which is what every part with a twin does to pick one — nor use the twin of
``record_function``, chosen once at import.  ``tests/conftest.py`` imports this module before any
other stepscope module, so each module's ``from stepscope._ext import native`` binds the
wrappers below; a marked test that reaches a choice fails at teardown, naming where.

A test may still ask ``_ext.native()`` itself (to skip without the extension).  Processes a test
starts are not watched: a marked test that runs stepscope in a child sets the child's
``STEPSCOPE_IMPLEMENTATION`` itself, or runs only what has no twin (the metrics pipeline, the
tables, ``stepscope fleet``, ``stepscope kernels``).  Reading ``clock.now_ns()`` is no choice
(bound at import; its twin is ``time.monotonic_ns``), ``clock.refine()``/``clock_info()`` are.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from stepscope import _ext

MARKER = "implementation_independent"
PACKAGE = str(Path(_ext.__file__).resolve().parent)
EXT_FILE = str(Path(_ext.__file__).resolve())

reached: set[str] = set()
"""Where the running test reached a choice (``file:line`` inside the package)."""

_native, _resolve = _ext.native, _ext.resolve


def _note(what: str) -> None:
    caller = sys._getframe(2).f_code.co_filename
    if caller.startswith(PACKAGE) and caller != EXT_FILE:
        line = sys._getframe(2).f_lineno
        reached.add(f"{what} at {caller[len(PACKAGE) + 1 :]}:{line}")


def native() -> _ext.NativeModule | None:
    """``_ext.native``, noting a call from the package."""
    _note("_ext.native()")
    return _native()


def resolve(implementation: str | None = "auto", *, what: str = "implementation") -> Any:
    """``_ext.resolve``, noting a call from the package."""
    _note("_ext.resolve()")
    return _resolve(implementation, what=what)


_ext.native, _ext.resolve = native, resolve  # type: ignore[assignment]


def watch_the_record_function_twin() -> None:
    """Note every use of the twin of ``record_function`` (the choice made once at import)."""
    from stepscope.collectors import annotations

    twin = annotations.PyRecordFunction
    enter = twin.__enter__

    def watched_enter(self: Any) -> Any:
        reached.add("the record_function twin")
        return enter(self)

    twin.__enter__ = watched_enter  # type: ignore[method-assign]
