"""Event args kept as the compact JSON text they were read from, parsed only when read.

The class is the JSON encoder's ``RawJsonObject`` (``stepscope.jsonenc``), which writers copy
as it is; ``RawArgs`` is its name in the trace model.
"""

from __future__ import annotations

from stepscope.jsonenc import RawJsonObject

__all__ = ["RawArgs"]

RawArgs = RawJsonObject
"""A read-only mapping over a JSON object's text (one event's args)."""
