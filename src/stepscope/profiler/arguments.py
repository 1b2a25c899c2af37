"""The checks of ``profile``'s arguments: metadata keys and JSON values, torch's
``_ExperimentalConfig`` as stepscope reads it."""

from __future__ import annotations

import json
import warnings
from typing import Any

from stepscope.trace.chrome_writer import RESERVED_KEYS

__all__ = [
    "checked_experimental_config",
    "experimental_flag",
    "gc_info_requested",
    "metadata_key",
    "parse_json",
]


def metadata_key(key: str) -> str:
    """``key`` when it may name a metadata entry (a non-empty str, not a reserved key)."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"metadata key must be a non-empty str, got {key!r}")
    if key in RESERVED_KEYS:
        raise ValueError(
            f"metadata key {key!r} is reserved by the Chrome trace format (one of "
            f"{', '.join(sorted(RESERVED_KEYS))}); use another name"
        )
    return key


def parse_json(key: str, value: str) -> Any:
    """The JSON text ``value`` of metadata ``key``, parsed."""
    if not isinstance(value, str):
        raise TypeError(f"metadata {key!r}: value must be JSON text (a str), got {value!r}")
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(
            f"metadata {key!r}: value is not valid JSON ({exc.msg} at column {exc.colno}): "
            f"{value!r:.80}; use add_metadata() for plain strings"
        ) from None


def checked_experimental_config(config: Any, with_stack: bool) -> Any:
    """torch's ``_ExperimentalConfig`` as stepscope uses it (``trace_only`` + stack: off)."""
    if config is None:
        return None
    if getattr(config, "trace_only", False) and with_stack:
        warnings.warn(
            "trace_only=True is incompatible with with_stack=True (stack traces require event "
            "post-processing). Disabling trace_only.",
            stacklevel=3,
        )
        import copy

        config = copy.copy(config)
        config.trace_only = False
    return config


# Positions of _ExperimentalConfig's fields in its pickled state (torch exposes few attributes).
_EXPERIMENTAL_FIELDS = {
    "capture_overload_names": 8,
    "record_python_gc_info": 9,
    "expose_kineto_event_metadata": 10,
}


def experimental_flag(config: Any, name: str) -> bool:
    """One boolean field of torch's ``_ExperimentalConfig`` (False when absent)."""
    if config is None:
        return False
    if hasattr(config, name):
        return bool(getattr(config, name))
    try:
        state = config.__getstate__()
    except Exception:
        return False
    index = _EXPERIMENTAL_FIELDS.get(name)
    if index is None or not isinstance(state, tuple) or len(state) <= index:
        return False
    return bool(state[index])


def gc_info_requested(config: Any) -> bool:
    """``record_python_gc_info``: torch records it only with its own Python tracer, which
    stepscope replaces, so stepscope records the ``Python GC`` spans itself."""
    return experimental_flag(config, "record_python_gc_info")
