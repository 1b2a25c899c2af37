"""Let other threads have the GIL during long background work (snapshots, rendering).

A pure-Python loop on a background thread holds the GIL for up to the interpreter's switch
interval (5 ms) before a waiting thread gets it.  Long jobs instead work in chunks and sleep
briefly between them, so the training loop never waits more than one chunk.
"""

from __future__ import annotations

import time

__all__ = ["RENDER_CHUNK", "SNAPSHOT_CHUNK", "pause_for_others"]

RENDER_CHUNK = 50
"""Series rendered to the exposition format between two pauses (about 0.2 ms)."""

SNAPSHOT_CHUNK = 1000
"""Series snapshot by the export thread between two pauses (about 1 ms).

Kept large on purpose: each pause is a GIL switch, and a steady stream of switches between two
threads starves a third one (CPython only forces a switch for a thread that saw none for a whole
switch interval), such as the endpoint's server thread."""

_PAUSE_S = 200e-6


def pause_for_others() -> None:
    """Release the GIL long enough for a waiting thread to take it."""
    time.sleep(_PAUSE_S)
