"""A ``rank`` label on every series of a process that is a rank of a distributed job.

Local ranks of one host share one Prometheus endpoint (the first to bind the port serves it,
the others push to it); with the label, each rank keeps its own series there instead of being
summed with the other ranks'.  A series that already has a ``rank`` label keeps it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from stepscope.distributed import rank_and_world_size
from stepscope.metrics.points import Family

__all__ = ["with_rank_labels"]


def with_rank_labels(families: Sequence[Family]) -> list[Family]:
    """``families`` with ``rank=<r>`` added to each series, when this process has a rank."""
    rank, _ = rank_and_world_size()
    if rank is None:
        return list(families)
    label = ("rank", str(rank))
    out = []
    for family in families:
        points = tuple(
            p
            if any(k == "rank" for k, _ in p.labels)
            else dataclasses.replace(p, labels=tuple(sorted((*p.labels, label))))
            for p in family.points
        )
        out.append(dataclasses.replace(family, points=points))
    return out
