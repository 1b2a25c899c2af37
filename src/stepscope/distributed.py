"""Who this process is in a distributed job: rank, world size, and torch.distributed's setup."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["distributed_info", "rank_and_world_size"]


def _torch_dist() -> Any | None:
    """torch.distributed if torch is already imported and a process group is initialised."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist
    except Exception:
        return None
    return None


def rank_and_world_size() -> tuple[int | None, int | None]:
    """(rank, world_size) from torch.distributed, else the RANK/WORLD_SIZE variables, else None."""
    dist = _torch_dist()
    if dist is not None:
        return int(dist.get_rank()), int(dist.get_world_size())
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    return (
        int(rank) if rank is not None and rank.isdigit() else None,
        int(world) if world is not None and world.isdigit() else None,
    )


def distributed_info() -> dict[str, Any] | None:
    """The trace's ``distributedInfo``: from torch.distributed, else from RANK/WORLD_SIZE."""
    dist = _torch_dist()
    if dist is None:
        rank, world = rank_and_world_size()
        if rank is None:
            return None
        return {"rank": rank, "world_size": world if world is not None else 1}
    info: dict[str, Any] = {
        "backend": str(dist.get_backend()),
        "rank": int(dist.get_rank()),
        "world_size": int(dist.get_world_size()),
    }
    try:
        info["pg_count"] = int(dist.get_pg_count())
        info["pg_config"] = dist.distributed_c10d._get_all_pg_configs()
    except Exception:  # private API; keep what we have
        pass
    return info
