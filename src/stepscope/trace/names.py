"""How frames are named for people: labels for stacks, paths as py-spy shows them, and which
code is stepscope's own (never shown in a user's results)."""

from __future__ import annotations

import os
import runpy
import sys
import sysconfig

__all__ = [
    "OWN_WORK_FRAME",
    "STEPSCOPE_ROOT",
    "frame_label",
    "hidden_threads",
    "hide_launcher",
    "hide_thread",
    "is_helper",
    "is_hidden",
    "sample_frame_label",
    "short_path",
]

STEPSCOPE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
"""stepscope's own package directory: its code is never recorded (it is not the user's)."""
OWN_WORK_FRAME = "[stepscope own work]"
"""The leaf frame of a stack sample taken inside stepscope's own (hidden) code, and the span of
its collectors' work between two steps."""

_hidden_files = {runpy.__file__, "<frozen runpy>"}
"""Launchers of the user's program: runpy, and the ``stepscope`` console script when used."""


def hide_launcher(path: str) -> None:
    """Treat the source file ``path`` (e.g. the console script that started stepscope) as a
    launcher whose frames never appear in results."""
    _hidden_files.add(os.path.abspath(path))  # normalised: a code object may say "a/../b"


_hidden_threads: set[int] = set()
"""Native ids of threads stepscope runs for itself while a window records (never sampled)."""


def hide_thread(native_id: int | None, hidden: bool = True) -> None:
    """Leave the samples of one of stepscope's own threads out of results (or stop doing so)."""
    if native_id is not None:
        if hidden:
            _hidden_threads.add(native_id)
        else:
            _hidden_threads.discard(native_id)


def hidden_threads() -> frozenset[int]:
    """The native ids of stepscope's own threads now running."""
    return frozenset(_hidden_threads)


def is_hidden(file: str) -> bool:
    """Whether frames of source file ``file`` are stepscope's own or a launcher's."""
    if file.startswith(STEPSCOPE_ROOT) or file in _hidden_files:
        return True
    return os.path.isabs(file) and os.path.normpath(file) in _hidden_files


_STDLIB = tuple(
    sorted({os.path.normpath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib")})
)
_INSTALLED = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
_PROFILER_MODULES = (
    os.sep + os.path.join("torch", "profiler") + os.sep,
    os.sep + os.path.join("torch", "autograd", "profiler"),
)


def is_helper(file: str) -> bool:
    """Whether frames of ``file`` run only what their caller asks: the standard library
    (``threading``, ``json``, ``traceback``; not installed packages) and torch's profiler.

    Below stepscope's own frame such frames are stepscope's work (the sampler's start waiting
    for its thread in ``Condition.wait``), never the program's."""
    if file.startswith("<frozen "):
        return True
    if any(m in file for m in _PROFILER_MODULES):
        return True
    return file.startswith(_STDLIB) and not any(m in file for m in _INSTALLED)


def frame_label(name: str) -> str:
    """A frame name safe for the collapsed format (no ';', no line breaks)."""
    return " ".join(name.replace(";", ":").split()) or "?"


def short_path(file: str) -> str:
    """A source path without the longest ``sys.path`` entry it starts with (as py-spy shows it)."""
    best = ""
    for entry in sys.path:
        root = entry.rstrip(os.sep) + os.sep if entry else ""
        if root and file.startswith(root) and len(root) > len(best):
            best = root
    return file[len(best) :] if best else file


def sample_frame_label(name: str, file: str) -> str:
    """The collapsed-stack label of a sampled frame: ``function (path/module.py)``."""
    return frame_label(f"{name} ({short_path(file)})" if file else name)
