"""Automatic garbage collection paused while stepscope builds something in bulk.

Reading a trace or building a window's trace makes hundreds of thousands of small containers;
each 700 of them start a collection, and in a process that holds a large heap (torch's modules,
the program's data) the occasional full collection walks all of it: a third of a window end's
time was collections that found nothing of stepscope's to free.  The program's own setting is
kept: a collector the program disabled stays disabled, and explicit ``gc.collect()`` calls (from
any thread) still run.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["gc_paused"]


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """No automatic collection inside the block; the collector as it was after it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
