"""The sampled leak estimate's error against its model, over many seeds.

A loop keeps about 1 MiB of small blocks per step for 20 steps under the allocation hook; the
growth between the third and the last step end is estimated from the samples, as the leak hint
does, and compared with the bytes kept (``sys.getsizeof``). The model's standard deviation is
``sqrt(grown * mean)``; the script prints the spread of ``(estimate - truth) / sigma``, which
should have a standard deviation near 1.

Usage: python bench/memory_sampling_error.py [SEEDS]   (default 100)
"""

from __future__ import annotations

import math
import statistics
import sys
from typing import Any

from stepscope import _ext
from stepscope.collectors.memory_sampled import LARGE_BYTES, MEAN_BYTES


def _leak() -> list[bytearray]:
    return [bytearray(100) for _ in range(7000)]


def growth_estimate(native: Any, seed: int) -> tuple[float, int]:
    """(sampled estimate, true bytes) of what ``_leak`` kept from step 4 to step 20."""
    held: list[list[bytearray]] = []
    live: dict[int, float] = {}
    snapshots: dict[int, float] = {}
    native._alloc_hook_start(float(MEAN_BYTES), LARGE_BYTES, 1 << 20, seed)
    try:
        for step in range(1, 21):
            held.append(_leak())
            native._alloc_hook_end_step()
            _, events = native._alloc_hook_drain()
            for ptr, size, weight, _t, frames in events:
                if not size:
                    live.pop(ptr, None)
                elif any(code.co_name == "_leak" for code, _ in frames):
                    live[ptr] = weight
            if step in (3, 20):
                snapshots[step] = sum(live.values())
    finally:
        native._alloc_hook_stop()
    per_step = sys.getsizeof(held[0]) + 7000 * sys.getsizeof(bytearray(100))
    return snapshots[20] - snapshots[3], 17 * per_step


def main(seeds: int) -> None:
    """Print the spread of the estimate's error in units of the model's sigma."""
    native = _ext.native()
    if native is None or not hasattr(native, "_alloc_hook_start"):
        print("the C extension with the allocation hook is not in use here")
        return
    zs = []
    for n in range(seeds):
        estimate, truth = growth_estimate(native, 7919 * (n + 1) + 1)
        zs.append((estimate - truth) / math.sqrt(truth * MEAN_BYTES))
    outside = sum(abs(z) > 2 for z in zs) / len(zs)
    print(
        f"{len(zs)} seeds: mean error {statistics.mean(zs):+.3f} sigma, standard deviation "
        f"{statistics.pstdev(zs):.3f} sigma (model: 1), largest {max(map(abs, zs)):.2f} sigma, "
        f"{outside:.1%} outside 2 sigma (model: about 5 %)"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
