"""DataLoader workers in a trace: the names the recorder writes and every reader looks for.

Each batch a DataLoader worker made is a ``batch N`` span (category ``dataloader_worker``) on
the worker's own track — the stepscope process's pid, the worker's pid as the thread id — with
``dataset`` and ``collate`` spans inside it, and a ``worker exited`` instant when its loop
returned; a loader without workers (``num_workers=0``) has
one track for the batches the loop made itself (``LOOP_TRACK_BASE + loader``).  Each batch the
loop took is a ``DataLoader batch`` instant on the thread that asked, at the moment it asked.
The loaders' settings are in the metadata under ``stepscope_dataloaders``.  Worker tracks are
other processes' time: analyses of the program's own threads leave them out.
"""

from __future__ import annotations

from stepscope.trace.model import Trace

__all__ = [
    "BATCH_PREFIX",
    "COLLATE_SPAN",
    "CONSUMED_INSTANT",
    "DATASET_SPAN",
    "EXITED_INSTANT",
    "LOOP_TRACK_BASE",
    "METADATA_KEY",
    "WORKER_CATEGORY",
    "worker_tracks",
]

WORKER_CATEGORY = "dataloader_worker"
"""Category of every span, instant and flow the DataLoader workers' recorder writes."""
BATCH_PREFIX = "batch "
"""A worker's batch span is ``batch <index>``; its args say which loader, worker and epoch."""
DATASET_SPAN = "dataset"
COLLATE_SPAN = "collate"
CONSUMED_INSTANT = "DataLoader batch"
"""The loop took a batch: an instant at the moment it asked, on the asking thread."""
EXITED_INSTANT = "worker exited"
"""A worker's loop returned (its epoch ended, or the loader shut down): on its track."""
METADATA_KEY = "stepscope_dataloaders"
LOOP_TRACK_BASE = 1 << 30
"""Thread id of the track of a loader without workers: this plus the loader's number."""


def worker_tracks(trace: Trace) -> set[tuple[int, int]]:
    """The (pid, tid) column values of the tracks holding DataLoader workers' spans."""
    strings = trace.strings
    if WORKER_CATEGORY not in strings:
        return set()
    cat = strings.index(WORKER_CATEGORY)
    spans = trace.spans
    return {
        (p, t) for c, p, t in zip(spans["cat"], spans["pid"], spans["tid"], strict=True) if c == cat
    }
