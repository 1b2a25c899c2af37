"""``arg_reader`` against ``json.loads`` over random and odd JSON args text."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepscope.trace.raw_args import RawArgs, arg_reader, arg_rows, arg_values

_KEYS = ("stream", "correlation", "device")
_ODD_KEYS = (" stream", "a:b", ",x", ",", "{", " ", 'de"v')
_NAMES = st.sampled_from(
    [*_KEYS, *_ODD_KEYS, "External id", "grid", "stream ", "Stream", "correlation2", "a\\b", ":"]
)
_TEXTS = st.sampled_from(
    ["", "stream", '"stream":1', ',"device":2', "{", "}", "\\", "x,", ":", 'a\\"b', "\u00e9"]
)
_SCALARS = st.one_of(
    st.integers(-(10**20), 10**20),
    st.booleans(),
    st.none(),
    st.floats(allow_nan=False),
    _TEXTS,
    st.text(max_size=6),
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(st.tuples(_NAMES, inner), max_size=3).map(lambda p: _Pairs(p)),
    ),
    max_leaves=6,
)


class _Pairs(list[tuple[str, Any]]):
    """An object's members in order, duplicate names allowed."""


def _dump(value: Any, blank: str) -> str:
    if isinstance(value, _Pairs):
        inner = ("," + blank).join(
            json.dumps(k) + blank + ":" + blank + _dump(v, blank) for k, v in value
        )
        return "{" + blank + inner + blank + "}"
    if isinstance(value, list):
        return "[" + ",".join(_dump(v, blank) for v in value) + "]"
    return json.dumps(value)


@pytest.mark.slow
@settings(max_examples=600, deadline=None)
@given(
    st.lists(st.tuples(_NAMES, _VALUES), max_size=6),
    st.sampled_from(["", " ", "\n\t"]),
    st.sampled_from([_KEYS, ("correlation",), _ODD_KEYS, ("stream", "a:b")]),
)
def test_arg_reader_matches_json_loads(
    pairs: list[tuple[str, Any]], blank: str, keys: tuple[str, ...]
) -> None:
    """Every key's value is what ``json.loads`` gives, whatever the text holds."""
    raw = _dump(_Pairs(pairs), blank).encode()
    parsed = json.loads(raw)
    expected = tuple(parsed.get(k) for k in keys)
    args = RawArgs(raw, len(parsed))
    got = arg_reader(keys)(args)
    assert got == expected
    assert [type(v) for v in got] == [type(v) for v in expected]
    assert arg_values(args, keys) == expected
    # a column of args in one call (the C int_args where built): the same, row by row
    plain = {keys[0]: 5}
    rows = arg_rows([args, None, plain, RawArgs(b"{}", 0), args], keys)
    nones = (None,) * len(keys)
    assert rows == [expected, nones, (5, *nones[1:]), nones, expected]
    assert [type(v) for v in rows[0]] == [type(v) for v in expected]


def test_arg_rows_reads_every_row_and_what_is_not_plain() -> None:
    """A column with escapes, floats, duplicates, nesting and bad text reads as ``get`` says."""
    texts = [
        b'{"stream": 7, "correlation": 12, "device": 0}',
        b'{"st\\u0072eam": 5}',
        b'{"stream": 1, "stream": 2}',
        b'{"a": {"stream": 9}, "stream": 3}',
        b'{"stream": 1.5, "device": true}',
        b'{"stream": 99999999999999999999999}',
        b' { "stream" : -0 } ',
    ]
    args = [RawArgs(t, len(json.loads(t))) for t in texts]
    expected = [tuple(json.loads(t).get(k) for k in _KEYS) for t in texts]
    rows = arg_rows(args, _KEYS)
    assert rows == expected
    assert [[type(v) for v in r] for r in rows] == [[type(v) for v in r] for r in expected]
    assert arg_rows([], _KEYS) == []


def test_arg_reader_plain_dicts_and_none() -> None:
    """Mappings other than ``RawArgs`` and missing args read as ``get`` says."""
    read = arg_reader(_KEYS)
    assert read(None) == (None, None, None)
    assert read({}) == (None, None, None)
    assert read({"stream": 7, "device": "0"}) == (7, None, "0")
    assert read(RawArgs(b"{}", 0)) == (None, None, None)
    assert read(RawArgs(b'{"stream":7,"stream":-0}', 1)) == (0, None, None)
    assert read(RawArgs(b'{"kind":"stream","device":1}', 2)) == (None, None, 1)
    # a closing quote, ``,"`` and ``:1,`` (a key's text) is no key ``,`` with the value 1
    assert arg_values(RawArgs(b'{"a":"q",":1,":5}', 2), (",",)) == (None,)
    assert read(RawArgs(b'{"stream":true,"correlation":1.0}', 2)) == (True, 1.0, None)
