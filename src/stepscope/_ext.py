"""Access to the optional C extension; ``STEPSCOPE_PURE_PYTHON=1`` forces the pure-Python twins."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

_loaded: ModuleType | None = None
_tried = False
load_error: str | None = None


def native() -> ModuleType | None:
    """Return ``stepscope._native`` if it is built and allowed, else ``None``."""
    global _loaded, _tried, load_error
    if _tried:
        return _loaded
    _tried = True
    if os.environ.get("STEPSCOPE_PURE_PYTHON") == "1":
        load_error = "disabled by STEPSCOPE_PURE_PYTHON=1"
        return None
    try:
        _loaded = importlib.import_module("stepscope._native")
    except ImportError as exc:
        load_error = str(exc)
        _loaded = None
    return _loaded
