"""Always-valid JSON text: the one encoder behind every file, line and event stepscope writes.

``json_bytes`` turns any value into strict UTF-8 JSON: NaN/inf become strings, unpaired
surrogates become U+FFFD, sets, bytes and unknown types are written as strings instead of
raising.  ``RawJsonObject`` is a JSON object kept as the text it was read from (the Chrome
trace reader's event args): it is parsed only when read and written back as it is.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, ItemsView, Iterator, Mapping
from typing import Any

from stepscope.text import clean_text

__all__ = ["RawJsonObject", "json_bytes", "utf8"]


class RawJsonObject(Mapping[str, Any]):
    """A read-only mapping over a JSON object's text; ``json_bytes`` copies ``raw`` as it is."""

    __slots__ = ("_parsed", "_size", "raw")

    def __init__(self, raw: bytes, size: int) -> None:
        self.raw = raw
        """The object's compact JSON text."""
        self._size = size
        self._parsed: dict[str, Any] | None = None

    def _items(self) -> dict[str, Any]:
        if self._parsed is None:
            self._parsed = json.loads(self.raw)
        return self._parsed

    def __getitem__(self, key: str) -> Any:
        return self._items()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items())

    def __len__(self) -> int:
        return self._size if self._parsed is None else len(self._parsed)

    def items(self) -> ItemsView[str, Any]:
        """The parsed object's items (the dict's own view: no lookup per key)."""
        return self._items().items()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.raw.decode('utf-8', 'replace')})"


def utf8(text: str) -> bytes:
    """Encode to UTF-8, replacing unpaired surrogates (invalid UTF-8) with U+FFFD."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return clean_text(text).encode("utf-8")


def _finite(value: Any) -> Any:
    """Copy of a JSON-like value with NaN/inf replaced by strings and unknown types stringified."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, Mapping):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _compact_encoder() -> Callable[[Any], str] | None:
    """The C JSON encoder with compact separators, built once (None if ``_json`` is missing)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    encode = make(
        {}, _json_default, json.encoder.encode_basestring, None, ":", ",", False, False, False
    )
    return lambda value: "".join(encode(value, 0))


_encode_compact = _compact_encoder()


def json_bytes(value: Any, *, pretty_separators: bool = False) -> bytes:
    """Serialize any value as valid, UTF-8 JSON (NaN/inf as strings, odd types as strings)."""
    if type(value) is RawJsonObject and not pretty_separators:
        return value.raw
    if _encode_compact is not None and not pretty_separators:
        try:
            return _encode_compact(value).encode("utf-8")
        except (ValueError, UnicodeEncodeError):
            pass  # NaN/inf or unpaired surrogates: take the careful path below
    seps = (", ", ": ") if pretty_separators else (",", ":")
    try:
        text = json.dumps(
            value, ensure_ascii=False, allow_nan=False, separators=seps, default=_json_default
        )
    except ValueError:
        text = json.dumps(
            _finite(value),
            ensure_ascii=False,
            allow_nan=False,
            separators=seps,
            default=_json_default,
        )
    return utf8(text)
