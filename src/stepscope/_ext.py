"""Access to the optional C extension; ``STEPSCOPE_PURE_PYTHON=1`` forces the pure-Python twins.

Only the built extension module is accepted: whatever else answers to the name
``stepscope._native`` (a leftover folder imported as a namespace package, a ``.py`` file, a
stale build missing entry points) is refused, and the reason is kept in :func:`status` so the
clock metadata of every trace says which implementation ran and why.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
from types import ModuleType

__all__ = ["MODULE", "REQUIRED", "load_error", "native", "status"]

MODULE = "stepscope._native"
"""The name the extension is built under (``setup.py``; sources in ``src/stepscope/_csrc``)."""

REQUIRED = (
    "now_ns",
    "_clock_configure",
    "format_spans",
    "scan_trace",
    "spans_from_events",
    "RecordFunction",
    "_tracer_start",
    "StackSampler",
)
"""Entry points of each C part; a module lacking one is a stale build and is refused."""

_loaded: ModuleType | None = None
_tried = False
load_error: str | None = None
"""Why the twins are in use (``None`` while the extension is in use or not yet asked for)."""


def _load() -> tuple[ModuleType | None, str | None]:
    """The extension module, or ``None`` and the reason it cannot be used."""
    if os.environ.get("STEPSCOPE_PURE_PYTHON") == "1":
        return None, "disabled by STEPSCOPE_PURE_PYTHON=1"
    try:
        spec = importlib.util.find_spec(MODULE)
    except (ImportError, ValueError) as exc:
        return None, f"{MODULE} cannot be looked up: {exc}"
    if spec is None:
        return None, f"{MODULE} is not built (install with a C compiler to build it)"
    if not isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
        if spec.origin is None or spec.submodule_search_locations is not None:
            where = ", ".join(spec.submodule_search_locations or ()) or "?"
            found = "a folder (namespace package)"
        else:
            where, found = spec.origin, f"a module loaded by {type(spec.loader).__name__}"
        return None, (
            f"{MODULE} is not built: {where} is {found}, not the extension module; not imported"
        )
    try:
        mod = importlib.import_module(MODULE)
    except ImportError as exc:
        return None, f"{MODULE} at {spec.origin} failed to import: {exc}"
    missing = [name for name in REQUIRED if not hasattr(mod, name)]
    if missing:
        return None, (
            f"{MODULE} at {spec.origin} is a stale build (missing {', '.join(missing)}); "
            "rebuild it with `python setup.py build_ext --inplace` or reinstall"
        )
    return mod, None


def native() -> ModuleType | None:
    """Return ``stepscope._native`` if it is built and allowed, else ``None``."""
    global _loaded, _tried, load_error
    if _tried:
        return _loaded
    _tried = True
    _loaded, load_error = _load()
    return _loaded


def status() -> dict[str, object]:
    """Which implementation is in use: ``{"native": True, "file": name}`` or the reason not."""
    mod = native()
    if mod is None:
        return {"native": False, "reason": load_error or "not loaded"}
    return {"native": True, "file": os.path.basename(getattr(mod, "__file__", None) or "")}
