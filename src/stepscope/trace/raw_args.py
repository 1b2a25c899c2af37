"""Event args kept as the compact JSON text they were read from, parsed only when read.

The class is the JSON encoder's ``RawJsonObject`` (``stepscope.jsonenc``), which writers copy
as it is; ``RawArgs`` is its name in the trace model.

``arg_values`` reads a few keys of many events' args without parsing each one: integer values
of top-level keys are found in the text itself, and anything less plain goes to ``json.loads``.
``arg_rows`` does the same for a whole column of args in one call to the C ``int_args``
(``_csrc/chrome_args.c``) where the extension is built, ``arg_reader`` row by row otherwise.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from stepscope._ext import native
from stepscope.jsonenc import RawJsonObject

__all__ = ["RawArgs", "arg_reader", "arg_rows", "arg_values"]

RawArgs = RawJsonObject
"""A read-only mapping over a JSON object's text (one event's args)."""

_Compiled = tuple[tuple[bytes, ...], "re.Pattern[bytes]"]
_COMPILED: dict[tuple[str, ...], _Compiled] = {}
_AFTER_STRING = " \t\n\r,:{}[]\\"
"""What may follow a string's closing quote in JSON (and the escape, never in a key here)."""


def _compiled(keys: tuple[str, ...]) -> _Compiled:
    found = _COMPILED.get(keys)
    if found is None:
        names = b"|".join(re.escape(k.encode()) for k in keys)
        # In valid JSON a quote after ``{`` or ``,`` (and blanks) always opens a key: inside a
        # string every quote is escaped, and a string ending in ``,`` or ``{`` is never
        # followed by a key's text.  So does a quote before a key's first character when that
        # is no blank or ``,:{}[]`` (a closing quote is followed by one of those), and a string
        # followed by ``:`` is a key; a pattern that starts with the quote searches faster.
        # The value is captured when it is a plain integer.
        plain = all(k and k[0] not in _AFTER_STRING and '"' not in k for k in keys)
        opening = rb"" if plain else rb"[{,][ \t\n\r]*"
        found = (
            tuple(b'"' + k.encode() + b'"' for k in keys),
            re.compile(
                opening + rb'"(' + names + rb')"[ \t\n\r]*:'
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
    pattern = _compiled(keys)[1]
    findall = pattern.findall
    nones: tuple[Any, ...] = (None,) * len(keys)
    slot = {k.encode(): n for n, k in enumerate(keys)}

    def read(args: Mapping[str, Any] | None) -> tuple[Any, ...]:
        # the cheap tests on the text come first; an empty mapping gives nones on every path
        if type(args) is RawJsonObject:
            raw = args.raw
            # an escaped key could spell one of ours; a nested object could hold the same keys
            if b"\\" not in raw:
                # no match: none of the keys at any depth (so no parse, even of nested text)
                found = findall(raw)
                if not found:
                    return nones
                if raw.count(b"{") == 1:
                    values = list(nones)
                    # the last of duplicate keys wins, as json.loads
                    for name, digits in found:
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


def arg_rows(
    args: Sequence[Mapping[str, Any] | None], keys: tuple[str, ...]
) -> list[tuple[Any, ...]]:
    """``[arg_values(a, keys) for a in args]``, plain integers read by the extension in one call
    (rows it cannot read plainly, and every row without it, by ``arg_reader``)."""
    read = arg_reader(keys)
    mod = native()
    if mod is None or not args or not 1 <= len(keys) <= 8:
        return [read(a) for a in args]
    # the text of raw args; None for none; other mappings as they are (rows int_args leaves)
    texts = [a.raw if type(a) is RawJsonObject else (a or None) for a in args]
    rows: list[Any] = mod.int_args(texts, tuple(k.encode() for k in keys))
    for i in [i for i, row in enumerate(rows) if row is None]:
        rows[i] = read(args[i])
    return rows
