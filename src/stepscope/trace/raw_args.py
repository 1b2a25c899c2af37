"""Event args kept as the compact JSON text they were read from, parsed only when read."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["RawArgs"]


class RawArgs(Mapping[str, Any]):
    """A read-only mapping over a JSON object's text; writers copy ``raw`` as it is."""

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

    def __repr__(self) -> str:
        return f"RawArgs({self.raw.decode('utf-8', 'replace')})"
