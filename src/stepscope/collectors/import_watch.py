"""Run callbacks once a module has been imported, without importing it first.

stepscope never imports torch itself, yet a profile created before the program imports torch
(``stepscope run`` starts the profile before the script runs) must record torch's operators from
the moment torch is there.  ``when_imported("torch", callback)`` calls ``callback()`` at once if
torch is already imported, or right after its import finishes: a finder at the front of
``sys.meta_path`` wraps the module's loader for that one import, and takes itself out again when
no callback is left waiting.  A failing callback is logged and never reaches the import.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

__all__ = ["cancel", "when_imported"]

log = logging.getLogger("stepscope")

_lock = threading.RLock()
_waiting: dict[str, list[Callable[[], None]]] = {}


def when_imported(module: str, callback: Callable[[], None]) -> bool:
    """Call ``callback`` once ``module`` is imported; True if it ran at once (already imported)."""
    if sys.modules.get(module) is not None:
        callback()
        return True
    with _lock:
        _waiting.setdefault(module, []).append(callback)
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)
    return False


def cancel(module: str, callback: Callable[[], None]) -> None:
    """Forget a callback that has not run yet (no error if it ran or was never registered)."""
    with _lock:
        callbacks = _waiting.get(module, [])
        if callback in callbacks:
            callbacks.remove(callback)
        if not callbacks:
            _waiting.pop(module, None)
        _remove_finder_if_idle()


def _remove_finder_if_idle() -> None:
    if not _waiting and _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


def _run_callbacks(module: str) -> None:
    with _lock:
        callbacks = _waiting.pop(module, [])
        _remove_finder_if_idle()
    for callback in callbacks:
        try:
            callback()
        except Exception as exc:  # an instrument must never break the program's import
            log.warning(
                "stepscope: reacting to the import of %s failed (%s: %s)",
                module,
                type(exc).__name__,
                exc,
            )


class _Finder(importlib.abc.MetaPathFinder):
    """Finds watched modules with the other finders and wraps their loader."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _waiting:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _NotifyingLoader(spec.loader, fullname)
                return spec
        return None


class _NotifyingLoader(importlib.abc.Loader):
    """Delegates to the real loader, then runs the module's callbacks."""

    def __init__(self, loader: Any, module: str) -> None:
        self._loader = loader
        self._module = module

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self._loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The module sees its own loader; the wrapper only lives for this one import.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        _run_callbacks(self._module)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, get_resource_reader...
        return getattr(self._loader, name)


_FINDER = _Finder()
