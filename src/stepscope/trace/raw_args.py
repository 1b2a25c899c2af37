"""Event args kept as the compact JSON text they were read from, parsed only when read.

The class is the JSON encoder's ``RawJsonObject`` (``stepscope.jsonenc``), which writers copy
as it is; ``RawArgs`` is its name in the trace model.

``arg_values`` reads a few keys of many events' args without parsing each one: integer values
of top-level keys are found in the text itself, and anything less plain goes to ``json.loads``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from stepscope.jsonenc import RawJsonObject

__all__ = ["RawArgs", "arg_reader", "arg_values"]

RawArgs = RawJsonObject
"""A read-only mapping over a JSON object's text (one event's args)."""

_Compiled = tuple[tuple[bytes, ...], "re.Pattern[bytes]"]
_COMPILED: dict[tuple[str, ...], _Compiled] = {}


def _compiled(keys: tuple[str, ...]) -> _Compiled:
    found = _COMPILED.get(keys)
    if found is None:
        names = b"|".join(re.escape(k.encode()) for k in keys)
        # In valid JSON a quote after ``{`` or ``,`` (and blanks) always opens a key: inside a
        # string every quote is escaped, and a string ending in ``,`` or ``{`` is never
        # followed by a key's text.  The value is captured when it is a plain integer.
        found = (
            tuple(b'"' + k.encode() + b'"' for k in keys),
            re.compile(
                rb'[{,][ \t\n\r]*"(' + names + rb')"[ \t\n\r]*:'
                rb"(?:[ \t\n\r]*(-?(?:0|[1-9][0-9]*))[ \t\n\r]*(?=[,}]))?"
            ),
        )
        _COMPILED[keys] = found
    return found


def arg_reader(keys: tuple[str, ...]) -> Callable[[Mapping[str, Any] | None], tuple[Any, ...]]:
    """``arg_values`` with ``keys`` bound: the function to call once per event in a loop."""
    found = _READERS.get(keys)
    if found is not None:
        return found
    quoted, pattern = _compiled(keys)
    findall = pattern.findall
    any_key = re.compile(b"|".join(re.escape(q) for q in quoted)).search
    nones: tuple[Any, ...] = (None,) * len(keys)
    slot = {k.encode(): n for n, k in enumerate(keys)}

    def read(args: Mapping[str, Any] | None) -> tuple[Any, ...]:
        # the cheap tests on the text come first; an empty mapping gives nones on every path
        if type(args) is RawJsonObject:
            raw = args.raw
            # an escaped key could spell one of ours; a nested object could hold the same keys
            if b"\\" not in raw:
                if any_key(raw) is None or not args:
                    return nones
                if raw.count(b"{") == 1:
                    values = list(nones)
                    # the last of duplicate keys wins, as json.loads
                    for name, digits in findall(raw):
                        if not digits:  # not a plain integer: parse it
                            break
                        values[slot[name]] = int(digits)
                    else:
                        return tuple(values)
        if not args:
            return nones
        return tuple(args.get(k) for k in keys)

    _READERS[keys] = read
    return read


_READERS: dict[tuple[str, ...], Callable[[Mapping[str, Any] | None], tuple[Any, ...]]] = {}


def arg_values(args: Mapping[str, Any] | None, keys: tuple[str, ...]) -> tuple[Any, ...]:
    """``tuple(args.get(k) for k in keys)`` (all None for no or empty args), without parsing
    ``RawArgs`` whose text shows the keys missing or plain integers."""
    return arg_reader(keys)(args)
