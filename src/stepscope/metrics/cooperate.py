"""Let other threads have the GIL during long background work (snapshots, rendering).

A pure-Python loop on a background thread holds the GIL for up to the interpreter's switch
interval (5 ms) before a waiting thread gets it.  Long jobs instead work in chunks and sleep
briefly between them, so the training loop never waits more than one chunk.
"""

from __future__ import annotations

import time

__all__ = ["CHUNK", "pause_for_others"]

CHUNK = 100
"""Series handled between two pauses (about 0.3 ms of rendering)."""

_PAUSE_S = 50e-6


def pause_for_others() -> None:
    """Release the GIL long enough for a waiting thread to take it."""
    time.sleep(_PAUSE_S)
