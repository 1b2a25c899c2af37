"""Turn arbitrary attribute values into small JSON values, within size limits.

Every value an event carries goes through :func:`coerce`: JSON scalars pass (NaN/inf become the
strings ``json_bytes`` writes for them), strings are cut to ``max_chars``, containers to
``max_items`` entries and ``max_depth`` levels, and anything else becomes its ``repr`` (cut the
same way; a ``repr`` that raises becomes ``<unrepresentable TYPE>``).  Tensor-like objects are
described by type, shape and dtype instead, so no device value is read.  :class:`AttrSet` adds
attributes under ``max_attrs`` and a total budget ``max_chars_total``; what does not fit is
dropped and counted.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields, replace
from typing import Any

__all__ = ["AttrSet", "Limits", "coerce", "get_limits", "set_limits", "truncate"]

_INT_BOUND = 1 << 63


@dataclass(frozen=True)
class Limits:
    """Size bounds on the attributes of one event."""

    max_attrs: int = 32
    """Attributes per event; further ones are dropped (and counted)."""
    max_chars: int = 1024
    """Characters per string value (longer ones are cut, marked with how much was cut)."""
    max_items: int = 32
    """Entries kept per list, tuple, set or dict value."""
    max_depth: int = 3
    """Nesting levels kept inside a value; deeper containers become their ``repr``."""
    max_chars_total: int = 16384
    """Approximate characters of all attributes of an event together."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"event limit {f.name} must be a positive int, got {value!r}")


_limits = Limits()


def get_limits() -> Limits:
    """The limits applied to event attributes now."""
    return _limits


def set_limits(**changes: int) -> Limits:
    """Change some limits (``max_attrs=64`` ...); returns the new limits."""
    global _limits
    known = {f.name for f in fields(Limits)}
    unknown = sorted(set(changes) - known)
    if unknown:
        raise ValueError(f"unknown event limits {unknown}; the limits are {sorted(known)}")
    _limits = replace(_limits, **changes)
    return _limits


def truncate(text: str, max_chars: int) -> str:
    """``text`` cut to about ``max_chars`` characters, saying how many were cut."""
    if len(text) <= max_chars:
        return text if type(text) is str else str.__str__(text)
    cut = len(text) - max_chars
    return f"{text[:max_chars]}…[+{cut} chars]"


def _repr(value: Any, limits: Limits) -> str:
    try:
        text = repr(value)
        if not isinstance(text, str):
            raise TypeError("__repr__ returned a non-string")
    except Exception:
        try:
            name = type(value).__qualname__
        except Exception:
            name = "object"
        return f"<unrepresentable {name}>"
    return truncate(text, limits.max_chars)


def _tensor_like(value: Any) -> str | None:
    """``Tensor(shape=[2, 3], dtype=torch.float32)`` for array-likes, without reading values."""
    cls = type(value)
    module = getattr(cls, "__module__", "") or ""
    if not module.startswith(("torch", "numpy", "jax", "cupy")):
        return None
    shape = getattr(value, "shape", None)
    dtype = getattr(value, "dtype", None)
    if shape is None or dtype is None:
        return None
    try:
        dims = ", ".join(str(int(d)) for d in shape)
    except Exception:
        return None
    device = getattr(value, "device", None)
    where = f", device={device}" if device is not None else ""
    return f"{cls.__name__}(shape=[{dims}], dtype={dtype}{where})"


def _float(value: float) -> float | str:
    if math.isfinite(value):
        return float(value)
    return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")


def coerce(value: Any, limits: Limits | None = None, depth: int = 0) -> Any:
    """A JSON value standing for ``value``, bounded by ``limits`` (the current ones by default)."""
    lim = _limits if limits is None else limits
    t = type(value)
    if t is str:
        return value if len(value) <= lim.max_chars else truncate(value, lim.max_chars)
    if value is None or t is bool:
        return value
    if t is int:
        return value if -_INT_BOUND <= value < _INT_BOUND else truncate(str(value), lim.max_chars)
    if t is float:
        return _float(value)
    try:
        return _coerce_other(value, lim, depth)
    except Exception:
        return _repr(value, lim)


def _coerce_other(value: Any, lim: Limits, depth: int) -> Any:
    if isinstance(value, str):
        return truncate(value, lim.max_chars)
    if isinstance(value, int):
        return coerce(int(value), lim, depth)
    if isinstance(value, float):
        return _float(float(value))
    if isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value[: lim.max_chars])
        text = repr(raw)
        return text if len(value) <= lim.max_chars else f"{text}…[{len(value)} bytes]"
    if isinstance(value, os.PathLike):
        return truncate(str(os.fspath(value)), lim.max_chars)
    tensor = _tensor_like(value)
    if tensor is not None:
        return tensor
    if isinstance(value, (dict, list, tuple, set, frozenset)):
        if depth >= lim.max_depth:
            return _repr(value, lim)
        return _container(value, lim, depth + 1)
    return _repr(value, lim)


def _container(value: Any, lim: Limits, depth: int) -> Any:
    size = len(value)
    more = size - lim.max_items
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for i, (k, v) in enumerate(value.items()):
            if i >= lim.max_items:
                break
            key = k if type(k) is str else coerce(k, lim, lim.max_depth)
            out[key if isinstance(key, str) else str(key)] = coerce(v, lim, depth)
        if more > 0:
            out["…"] = f"+{more} more"
        return out
    items = value
    if isinstance(value, (set, frozenset)):
        items = sorted(value, key=repr) if size <= 4 * lim.max_items else list(value)
    kept = [coerce(v, lim, depth) for i, v in zip(range(lim.max_items), items, strict=False)]
    if more > 0:
        kept.append(f"…+{more} more")
    return kept


def _size(value: Any) -> int:
    """Rough JSON size of a coerced value, in characters."""
    t = type(value)
    if t is str:
        return len(value) + 2
    if t is dict:
        return 2 + sum(len(k) + 3 + _size(v) for k, v in value.items())
    if t is list:
        return 2 + sum(1 + _size(v) for v in value)
    return 8


class AttrSet:
    """The attributes of one call: added within the limits, drops counted."""

    __slots__ = ("dropped", "limits", "size", "values")

    def __init__(self, limits: Limits | None = None) -> None:
        self.limits = _limits if limits is None else limits
        self.values: dict[str, Any] = {}
        self.size = 0
        self.dropped = 0

    def add(self, name: str, value: Any) -> bool:
        """Add (or replace) one attribute; False (and counted) when it does not fit."""
        values = self.values
        lim = self.limits
        old = values.get(name, _MISSING)
        if old is _MISSING and len(values) >= lim.max_attrs:
            self.dropped += 1
            return False
        if type(value) is str and len(value) <= lim.max_chars:
            coerced: Any = value
            size = len(name) + len(value) + 6
        else:
            coerced = coerce(value, lim)
            size = len(name) + 4 + _size(coerced)
        freed = 0 if old is _MISSING else len(name) + 4 + _size(old)
        if self.size - freed + size > lim.max_chars_total:
            self.dropped += 1
            return False
        values[name] = coerced
        self.size += size - freed
        return True

    def copy(self) -> AttrSet:
        """An independent set with these attributes, under the current limits."""
        other = AttrSet.__new__(AttrSet)
        other.limits = _limits
        other.values = self.values.copy()
        other.size = self.size
        other.dropped = self.dropped
        return other


_MISSING: Any = object()
