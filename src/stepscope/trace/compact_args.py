"""The args of the compact form (its ``ARGS`` section, version 2): templates and integer columns.

A window's args are near-unique only by their integer values ("External id", "Sequence number",
addresses): each mapping's JSON text is split into a template, the text with each top-level
integer value cut out, written once however many mappings share it, and the values, one column
per key name, zigzag delta-coded in row order, so an id that grows costs about a byte.

Payload (all numbers LEB128 varints): the row count, the template count, the key count; each
key (its text as written between the quotes) as its length and bytes, in order of first use;
each template as the mapping's key count, its hole count, per hole the length of the text
before it (from the previous hole), the length of the text after the last hole, per hole its
key's index, then the text's pieces one after another; each row's template index; each key's
column as its byte length and its values as ``pack_varints(values, "q", True)`` writes them (a
value per hole of that key, in row order).

Only a top-level value that is a plain JSON integer (no fraction or exponent, not ``-0``) within
64 bits is cut: strings (escapes and all), literals, numbers with a fraction or exponent, nested
objects and lists stay in the template, and a text that does not scan as one JSON object (strict
strings, keys and top-level numbers; brackets matched and at most ``MAX_NESTING`` deep inside a
value) is stored whole, as a template without holes.  Rebuilding puts back each value's decimal
text, so every mapping's text comes back byte for byte.

``split_args`` and ``splice_args`` use the C ``split_args`` and ``splice_args``
(``_csrc/compact_args.c``, ``_csrc/compact_splice.c``) when the extension is built;
``split_args_python`` and ``splice_args_python`` are their twins and give the same bytes (the C
writer also guesses each text's template from the ones before and checks it against the text,
which finds the same template the scan would).  A malformed payload is a ``ValueError``.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Mapping, Sequence
from typing import Any

from stepscope._ext import native
from stepscope.jsonenc import RawJsonObject, json_bytes
from stepscope.trace.compact_format import varint
from stepscope.trace.compact_varint import pack_python, unpack_python

__all__ = [
    "MAX_NESTING",
    "splice_args",
    "splice_args_python",
    "split_args",
    "split_args_python",
]

MAX_NESTING = 64
"""Open brackets a top-level value may nest; a deeper one makes its text stored whole."""

_BAD = "args table truncated or malformed"
_WS = re.compile(rb"[ \t\n\r]*")
_STRING = re.compile(rb'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"')
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_NESTED = re.compile(rb'["{}\[\]]')
_MAX_INT_DIGITS = 4300
"""Longer integers are refused by the strict number scan (``json.loads`` refuses them too)."""
_OPEN, _CLOSE = b"{[", {ord("}"): ord("{"), ord("]"): ord("[")}
_LITERALS = (b"true", b"false", b"null")


def _nested_end(text: bytes, at: int) -> int:
    """The end of the object or list at ``at`` (brackets matched, strings strict), or -1."""
    stack: list[int] = []
    while True:
        m = _NESTED.search(text, at)
        if m is None:
            return -1
        at = m.start()
        ch = text[at]
        if ch == 0x22:
            s = _STRING.match(text, at)
            if s is None:
                return -1
            at = s.end()
            continue
        if ch in _OPEN:
            if len(stack) == MAX_NESTING:
                return -1
            stack.append(ch)
        elif not stack or stack.pop() != _CLOSE[ch]:
            return -1
        at += 1
        if not stack:
            return at


def _after_blanks(text: bytes, at: int) -> int:
    found = _WS.match(text, at)
    return at if found is None else found.end()


def _holes(text: bytes) -> list[tuple[int, int, bytes, int]] | None:
    """The top-level plain integers of an object's text as (start, end, key, value), or None
    when the text does not scan cleanly."""
    n, ws = len(text), _after_blanks
    at = ws(text, 0)
    if text[at : at + 1] != b"{":
        return None
    at = ws(text, at + 1)
    holes: list[tuple[int, int, bytes, int]] = []
    if text[at : at + 1] != b"}":
        while True:
            key = _STRING.match(text, at)
            if key is None:
                return None
            at = ws(text, key.end())
            if text[at : at + 1] != b":":
                return None
            at = ws(text, at + 1)
            first = text[at : at + 1]
            if first == b'"':
                s = _STRING.match(text, at)
                if s is None:
                    return None
                at = s.end()
            elif first in (b"{", b"["):
                at = _nested_end(text, at)
                if at < 0:
                    return None
            elif first in (b"t", b"f", b"n"):
                word = _LITERALS[b"tfn".index(first)]
                if not text.startswith(word, at):
                    return None
                at += len(word)
            else:
                num = _NUMBER.match(text, at)
                if num is None:
                    return None
                if num.group(1) is None and num.group(2) is None:
                    literal = num.group()
                    if len(literal.lstrip(b"-")) > _MAX_INT_DIGITS:
                        return None
                    if len(literal) <= 20 and literal != b"-0":
                        value = int(literal)
                        if -(2**63) <= value < 2**63:
                            holes.append(
                                (at, num.end(), text[key.start() + 1 : key.end() - 1], value)
                            )
                at = num.end()
            at = ws(text, at)
            sep = text[at : at + 1]
            if sep == b"}":
                break
            if sep != b",":
                return None
            at = ws(text, at + 1)
    at = ws(text, at + 1)
    return holes if at == n else None


def split_args_python(args: Sequence[Mapping[str, Any]]) -> tuple[bytes, array[int]]:
    """Twin of the C ``split_args``: the ARGS payload of the args mappings (each one's compact
    JSON text, ``json_bytes``), and each one's key count."""
    sizes = array("q", map(len, args))
    keys: dict[bytes, int] = {}
    templates: dict[bytes, tuple[int, bytes, list[int]]] = {}  # by numbers and pieces
    columns: list[list[int]] = []
    rows: list[int] = []
    for text, size in zip(map(json_bytes, args), sizes, strict=True):
        holes = _holes(text) or ()
        head, pieces, prev = [varint(size), varint(len(holes))], [], 0
        for start, end, _, _ in holes:
            head.append(varint(start - prev))
            pieces.append(text[prev:start])
            prev = end
        head.append(varint(len(text) - prev))
        pieces.append(text[prev:])
        found = b"".join(head + pieces)
        template = templates.get(found)
        if template is None:  # a template's keys are in its pieces: new ones only are looked up
            of = [keys.setdefault(key, len(keys)) for _, _, key, _ in holes]
            columns += ([] for _ in range(len(keys) - len(columns)))
            template = templates[found] = (len(templates), b"".join(head), of)
        for k, (_, _, _, value) in zip(template[2], holes, strict=True):
            columns[k].append(value)
        rows.append(template[0])
    parts = [varint(len(rows)), varint(len(templates)), varint(len(keys))]
    for key in keys:
        parts += (varint(len(key)), key)
    for found, (_, numbers, of) in templates.items():
        parts += (numbers, b"".join(map(varint, of)), found[len(numbers) :])
    parts.append(b"".join(map(varint, rows)))
    for values in columns:
        packed = pack_python(array("q", values), "q", True)
        parts += (varint(len(packed)), packed)
    return b"".join(parts), sizes


class _Reader:
    """Varints and byte runs from an ARGS payload; ``ValueError`` past its end."""

    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def number(self, most: int | None = None) -> int:
        """A varint, at most ``most`` (default: the bytes left)."""
        value, shift, data = 0, 0, self.data
        while True:
            if self.at >= len(data) or shift > 63:
                raise ValueError(_BAD)
            b = data[self.at]
            self.at += 1
            value |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if value > (len(data) - self.at if most is None else most):
            raise ValueError(_BAD)
        return value

    def take(self, n: int) -> bytes:
        out = self.data[self.at : self.at + n]
        self.at += n
        return out


def splice_args_python(payload: bytes) -> tuple[list[bytes], array[int]]:
    """Twin of the C ``splice_args``: each mapping's text from an ARGS payload, and its key
    count."""
    cur = _Reader(payload)
    count, ntemplates, nkeys = cur.number(), cur.number(), cur.number()
    for _ in range(nkeys):
        cur.take(cur.number())
    templates: list[tuple[int, list[bytes], list[int]]] = []
    for _ in range(ntemplates):
        size = cur.number(2**63 - 1)
        gaps = [cur.number() for _ in range(cur.number())]
        last = cur.number()
        of = [cur.number(nkeys - 1) for _ in gaps]
        text = cur.take(sum(gaps) + last)
        if len(text) != sum(gaps) + last:
            raise ValueError(_BAD)
        pieces, at = [], 0
        for gap in gaps:
            pieces.append(text[at : at + gap])
            at += gap
        pieces.append(text[at:])
        templates.append((size, pieces, of))
    rows = [cur.number(ntemplates - 1) for _ in range(count)]
    wanted = [0] * nkeys
    for t in rows:
        for k in templates[t][2]:
            wanted[k] += 1
    if sum(wanted) > len(payload) - cur.at:
        raise ValueError(_BAD)
    columns = []
    for k in range(nkeys):
        data = cur.take(cur.number())
        try:
            values, end = unpack_python(data, 0, wanted[k], "q", True)
        except ValueError:
            raise ValueError(_BAD) from None
        if end != len(data):
            raise ValueError(_BAD)
        columns.append(iter(array("q", values)))
    if cur.at != len(payload):
        raise ValueError(_BAD)
    texts, sizes = [], array("q")
    for t in rows:
        size, pieces, keys = templates[t]
        parts = [pieces[0]]
        for k, piece in zip(keys, pieces[1:], strict=True):
            parts += (b"%d" % next(columns[k]), piece)
        texts.append(b"".join(parts))
        sizes.append(size)
    return texts, sizes


def split_args(args: Sequence[Mapping[str, Any]]) -> tuple[bytes, array[int]]:
    """The ARGS payload of a trace's args mappings, and each one's key count."""
    mod = native()
    if mod is None:
        return split_args_python(args)
    payload, sizes = mod.split_args(args, RawJsonObject, json_bytes)
    return payload, array("q", sizes)


def splice_args(payload: bytes) -> tuple[list[bytes], array[int]]:
    """Each mapping's text from an ARGS payload, and each one's key count."""
    mod = native()
    if mod is None:
        return splice_args_python(payload)
    texts, sizes = mod.splice_args(payload)
    return texts, array("q", sizes)
