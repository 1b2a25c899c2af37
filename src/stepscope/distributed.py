"""Who this process is in a distributed job, and what ranks agree on while profiling.

Rank, local rank and world size come from torch.distributed once it is initialised, else from
the launcher's ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` variables (torchrun, SLURM wrappers).

With torch.distributed initialised and two or more ranks:

**Step numbers** (``join_steps``, at a profile's start; no collective, store reads and writes
only).  The first rank to start a profile becomes the step leader (one ``compare_set`` on
``stepscope/steps/leader`` in torch.distributed's own key-value store) and publishes, at every
step boundary, its step number with the default group's collective count (a ``set``, not
waited for).  Every rank issues the same collectives in the same order, so a rank that starts
profiling later waits for the leader's record with its own collective count — the same
boundary — and takes that step number (``leader_step``).  A rank that started late thus records
the same step numbers (windows come from the same schedule at the same steps).  This needs a
collective between steps (a training step's all-reduce): in a loop with none every boundary has
the same count, so the leader's record also holds the count at its previous boundary, and a
rank that finds the two equal cannot tell which boundary it is at and keeps its own numbering
(a late joiner that took the leader's current step could be past its window, and the others
would wait out the clock handshake's timeout for it).

**Clock offsets** (``sync_first_window``, once per profile, at the end of its first window,
after the collectors stopped).  Collectives are issued only when every rank of the default
group is known to take part, so a rank that never profiles cannot hang the job:

1. Without any collective, each rank adds itself to a counter in the store
   (``stepscope/sync/<generation>/<last step>/arrived``); the rank that completes the count
   sets an ``all`` key, which the others wait for (``store.wait``) up to
   ``STEPSCOPE_RANK_SYNC_TIMEOUT_S`` (default 10 s).  Before that, the first rank names the
   step its window ended at (``stepscope/sync/<generation>/last_step``); a rank whose window
   ended at another step (another schedule) sets ``mismatch`` and skips, and the ranks waiting
   see it within ``MISMATCH_CHECK_S`` and skip too, instead of waiting out the timeout.
2. Each rank then proposes ``go`` (every rank arrived) or ``skip`` with one ``compare_set`` on
   one key: the first proposal wins and every rank reads the same decision.  ``go`` is only
   possible once all ranks have arrived, so every rank reads it and all go on together.
3. On ``go`` only: ``CLOCK_ROUNDS`` calls to ``torch.distributed.barrier()`` (the only
   collectives stepscope issues), each bracketed by clock readings; rank 0 publishes its readings
   in the store and every other rank reads them.

Rank r's clock offset to rank 0 is bounded by each barrier: a rank leaves only after every rank
has entered, so ``t_enter[r] - t_leave[0] <= offset <= t_leave[r] - t_enter[0]``.  The tightest
bounds over the rounds give the offset (their midpoint) and its uncertainty (half their width).
The result goes into every window's metadata as ``stepscope_rank_sync``.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

from stepscope import clock

__all__ = [
    "CLOCK_ROUNDS",
    "RankInfo",
    "StepBeacon",
    "distributed_info",
    "join_steps",
    "leader_step",
    "offset_bounds",
    "rank_and_world_size",
    "rank_info",
    "sync_first_window",
    "sync_timeout_s",
]

CLOCK_ROUNDS = 5
"""Barrier round trips used to bound each rank's clock offset to rank 0."""
TIMEOUT_ENV = "STEPSCOPE_RANK_SYNC_TIMEOUT_S"
MISMATCH_CHECK_S = 0.1
"""How often a rank waiting for the others checks whether a rank's schedule differs."""
STEPS_KEY = "stepscope/steps"
LEADER_KEY = "stepscope/steps/leader"
STOPPED = "stopped"
_generation = 0


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the job: global rank, local rank on its host, world size."""

    rank: int
    world_size: int
    local_rank: int | None = None
    local_world_size: int | None = None


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


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    return int(value) if value.isdigit() else None


def rank_and_world_size() -> tuple[int | None, int | None]:
    """(rank, world_size) from torch.distributed, else the RANK/WORLD_SIZE variables, else None."""
    dist = _torch_dist()
    if dist is not None:
        return int(dist.get_rank()), int(dist.get_world_size())
    return _env_int("RANK"), _env_int("WORLD_SIZE")


def rank_info() -> RankInfo | None:
    """This process's ``RankInfo``, or None outside a distributed job."""
    rank, world = rank_and_world_size()
    if rank is None:
        return None
    return RankInfo(
        rank=rank,
        world_size=world if world is not None else 1,
        local_rank=_env_int("LOCAL_RANK"),
        local_world_size=_env_int("LOCAL_WORLD_SIZE"),
    )


def distributed_info() -> dict[str, Any] | None:
    """The trace's ``distributedInfo``: from torch.distributed, else from RANK/WORLD_SIZE."""
    info = rank_info()
    if info is None:
        return None
    out: dict[str, Any] = {}
    dist = _torch_dist()
    if dist is not None:
        out["backend"] = str(dist.get_backend())
    out["rank"] = info.rank
    out["world_size"] = info.world_size
    if info.local_rank is not None:
        out["local_rank"] = info.local_rank
    if info.local_world_size is not None:
        out["local_world_size"] = info.local_world_size
    if dist is not None:
        try:
            out["pg_count"] = int(dist.get_pg_count())
            out["pg_config"] = dist.distributed_c10d._get_all_pg_configs()
        except Exception:  # private API; keep what we have
            pass
    return out


def sync_timeout_s() -> float:
    """Seconds a rank waits for the others at the first window (TIMEOUT_ENV)."""
    text = os.environ.get(TIMEOUT_ENV, "").strip()
    if not text:
        return 10.0
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{TIMEOUT_ENV} must be a number of seconds, got {text!r}") from None
    if not value >= 0:
        raise ValueError(f"{TIMEOUT_ENV} must be >= 0 seconds, got {text!r}")
    return value


def _now() -> int:
    return clock.to_unix_ns(clock.now_ns())


def _clock_rounds(dist: Any) -> tuple[list[int], list[int]]:
    enter, leave = [], []
    for _ in range(CLOCK_ROUNDS):
        enter.append(_now())
        dist.barrier()
        leave.append(_now())
    return enter, leave


def offset_bounds(
    mine: tuple[list[int], list[int]], rank0: tuple[list[int], list[int]]
) -> tuple[int, int]:
    """(offset, uncertainty) in ns of a rank's clock to rank 0's from paired barrier readings."""
    (enter, leave), (enter0, leave0) = mine, rank0
    low = max(e - l0 for e, l0 in zip(enter, leave0, strict=True))
    high = min(lv - e0 for lv, e0 in zip(leave, enter0, strict=True))
    return (low + high) // 2, max(0, high - low + 1) // 2


def _sequence(dist: Any) -> int | None:
    """How many collectives the default process group has issued (the same on every rank at the
    same point of the program), or None when the backend does not count them."""
    try:
        group = dist.distributed_c10d._get_default_group()
        return int(group._get_sequence_number_for_group())
    except Exception:
        return None


class StepBeacon:
    """The step leader's step numbers in the store, for ranks that start profiling later."""

    def __init__(self, dist: Any, store: Any) -> None:
        self._dist, self._store = dist, store
        self._previous = -1  # the collective count at the previous boundary (-1: none yet)

    def publish(self, step: int) -> None:
        """Record ``step`` with the collective counts at this step boundary and the one before
        (not waited for)."""
        sequence = _sequence(self._dist)
        if sequence is not None:
            self._store.set(STEPS_KEY, f"{step} {sequence} {self._previous}")
            self._previous = sequence

    def close(self) -> None:
        """The leader's profile stopped: later ranks stop waiting for its records."""
        self._store.set(STEPS_KEY, STOPPED)


def join_steps(step: int) -> tuple[StepBeacon | None, int]:
    """At a profile's start: (the beacon when this rank leads the step numbers, the step to use).

    The first rank to start a profile leads: it publishes each step boundary's number with the
    default group's collective count.  A rank that starts later (no collective, store reads
    only) waits for the leader's record of the boundary it is at — the one with its own
    collective count — and takes that step number.
    """
    dist = _torch_dist()
    if dist is None or int(dist.get_world_size()) < 2:
        return None, step
    store = dist.distributed_c10d._get_default_store()
    me = str(int(dist.get_rank())).encode()
    if bytes(store.compare_set(LEADER_KEY, "", me)) == me:
        beacon = StepBeacon(dist, store)
        beacon.publish(step)
        return beacon, step
    found = leader_step(dist, store, sync_timeout_s())
    return None, step if found is None else found


def leader_step(dist: Any, store: Any, timeout_s: float) -> int | None:
    """The leader's number for this rank's current step boundary, or None when there is none.

    Every rank issues the same collectives in the same order, so the leader's record with this
    rank's collective count is the same boundary, unless the leader's previous boundary had the
    same count too (no collective between steps): then None, and this rank keeps its own step
    numbers.  The leader is never ahead of that (it cannot
    pass a collective this rank has not joined) and gets there without this rank (no collective
    between a step's last collective and its boundary), so waiting for it cannot deadlock; the
    wait is bounded by ``timeout_s`` all the same, and ends at once when the leader stopped.
    """
    sequence = _sequence(dist)
    if sequence is None:
        return None
    deadline = time.monotonic() + timeout_s
    while True:
        if store.check([STEPS_KEY]):
            text = bytes(store.get(STEPS_KEY)).decode()
            if text == STOPPED:
                return None
            leader, leader_sequence, previous = map(int, text.split())
            if leader_sequence == sequence:
                return None if previous == sequence else leader
            if leader_sequence > sequence:
                return None
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.001)


def _skipped(reason: str, arrived: int, world: int) -> dict[str, Any]:
    return {"status": "skipped", "reason": reason, "ranks_arrived": arrived, "world_size": world}


def _wait_for_all(store: Any, all_key: str, mismatch_key: str, timeout: float) -> bool:
    """Wait up to ``timeout`` for ``all_key``; True as soon as ``mismatch_key`` appears."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        # DistStoreError (a RuntimeError): this slice timed out
        with contextlib.suppress(RuntimeError):
            store.wait([all_key], datetime.timedelta(seconds=min(left, MISMATCH_CHECK_S)))
            return False
        if store.check([mismatch_key]):
            return True
    return False


def sync_first_window(first_step: int, last_step: int) -> dict[str, Any] | None:
    """Measure the clock offset to rank 0 at the end of the first window (module docstring).

    Returns the ``stepscope_rank_sync`` record (``status`` ``synced`` or ``skipped``), or None
    when torch.distributed is not initialised or the job has one rank.
    """
    global _generation
    dist = _torch_dist()
    if dist is None or int(dist.get_world_size()) < 2:
        return None
    rank, world = int(dist.get_rank()), int(dist.get_world_size())
    timeout = sync_timeout_s()
    _generation += 1
    store = dist.distributed_c10d._get_default_store()
    generation = f"stepscope/sync/{_generation}/"
    prefix = f"{generation}{last_step}/"
    # the first rank here names the step its window ended at; a rank whose window ended at
    # another step (another schedule) can never meet it: it says so, and nobody waits
    first = bytes(store.compare_set(generation + "last_step", "", str(last_step))).decode()
    if first != str(last_step):
        store.set(generation + "mismatch", first)
        return _skipped(
            f"ranks ended their first window at different steps (this rank at {last_step}, "
            f"another at {first}): their schedules differ; clocks not aligned, no collective "
            "issued",
            1,
            world,
        )
    arrived = int(store.add(prefix + "arrived", 1))
    if arrived == world:
        store.set(prefix + "all", b"1")
    elif _wait_for_all(store, prefix + "all", generation + "mismatch", timeout):
        return _skipped(
            f"another rank ended its first window at a step other than {last_step}: the ranks' "
            "schedules differ; clocks not aligned, no collective issued",
            arrived,
            world,
        )
    else:
        arrived = int(store.add(prefix + "arrived", 0))
    proposal = b"go" if arrived >= world else b"skip"
    decision = bytes(store.compare_set(prefix + "decision", "", proposal))
    if decision != b"go":
        return _skipped(
            f"not every rank ended its first window at step {last_step} within "
            f"{timeout:g} s ({TIMEOUT_ENV}); clocks not aligned, no collective issued",
            arrived, world,
        )  # fmt: skip
    enter, leave = _clock_rounds(dist)
    if rank == 0:
        record = {"first_step": first_step, "enter": enter, "leave": leave}
        store.set(prefix + "rank0", json.dumps(record))
        offset, uncertainty = 0, 0
    else:
        record = json.loads(bytes(store.get(prefix + "rank0")))
        offset, uncertainty = offset_bounds((enter, leave), (record["enter"], record["leave"]))
    return {
        "status": "synced",
        "rank": rank,
        "world_size": world,
        "clock_offset_ns": offset,
        "clock_uncertainty_ns": uncertainty,
        "rounds": CLOCK_ROUNDS,
        "first_step": first_step,
        "last_step": last_step,
        "steps_agree": record["first_step"] == first_step,
    }
