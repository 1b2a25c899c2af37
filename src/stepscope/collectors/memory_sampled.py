"""The Python heap of ``profile_memory=True``: exact totals from the C allocation hook, sites from
byte samples.

The hook (``_csrc/alloc_hook.c``) counts every allocation of the ``PyMem``/``PyObject`` domains
(current bytes, per-step peak, allocated and freed) and records the allocating stack of about one
allocation per :data:`MEAN_BYTES` allocated, each sample weighted back to the bytes it stands for.
This module replays the samples: which were alive at each step's end and at its peak, grouped by
site (the innermost frame of the program's own code), as the ``Sites`` the exact path makes.
"""

from __future__ import annotations

import math
import sys
import sysconfig
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

from stepscope import _ext

__all__ = [
    "LARGE_BYTES",
    "MAX_EVENTS",
    "MEAN_BYTES",
    "SampledHeap",
    "sampling_error_note",
    "unavailable_reason",
]

MEAN_BYTES = 512 * 1024
"""Mean distance in bytes between two sampled allocations."""
LARGE_BYTES = 512 * 1024
"""Allocations of at least this many bytes are always sampled (weight: their size)."""
MAX_EVENTS = 16384
"""Samples and sampled frees buffered between two step ends (more are dropped and counted)."""
Site = tuple[str, int]


def unavailable_reason() -> str | None:
    """Why the allocation hook cannot run here (``None`` when it can)."""
    if sys.version_info < (3, 11):
        return "the allocation hook reads frames on Python 3.11+ only"
    if sysconfig.get_config_var("Py_GIL_DISABLED"):
        return "the allocation hook needs the GIL (free-threaded build)"
    native = _ext.native()
    if native is None:
        return f"the C extension is not in use ({_ext.status().get('reason')})"
    if not hasattr(native, "_alloc_hook_start"):
        return "the C extension was built without the allocation hook (rebuild it)"
    return None


def _native() -> _ext.NativeModule:
    native = _ext.native()
    assert native is not None  # checked by unavailable_reason before the window starts
    return native


def sampling_error_note(mean_bytes: int) -> str:
    """How far a sampled site's bytes may be from the truth, for the report."""
    return (
        f"sites are estimated from allocations sampled about once per {mean_bytes // 1024} KiB "
        f"allocated (totals are exact): a site holding B bytes is within "
        f"±2·√(B·{mean_bytes // 1024} KiB) (95 %), e.g. ±{_error_pct(mean_bytes, 100 << 20):.0f} % "
        f"at 100 MiB; profile_memory='exact' records every allocation"
    )


def _error_pct(mean_bytes: int, site_bytes: int) -> float:
    return 200 * math.sqrt(site_bytes * mean_bytes) / site_bytes


@dataclass
class _Sample:
    site: Site | None
    weight: float
    size: int


@dataclass
class SampledHeap:
    """The hook for one window: per-step exact rows and the sampled sites alive."""

    own_dir: str
    is_library: Any
    """``file -> bool``: frames of libraries are skipped when naming a site."""
    mean_bytes: int = field(default_factory=lambda: MEAN_BYTES)
    live: dict[int, _Sample] = field(default_factory=dict)
    lines: dict[tuple[CodeType, int], int] = field(default_factory=dict)
    seq: int = 0
    peak_sites: dict[Site, tuple[int, int]] | None = None
    peak_t_ns: int = 0
    last_sample_ns: int = 0
    stats: dict[str, int] = field(default_factory=dict)
    restored: bool = True
    numpy: str = "not loaded"
    """Whether numpy's array data is counted: ``counted``, ``not loaded`` or why not."""

    def start(self, seed: int) -> None:
        """Hook the allocator domains; counting starts now."""
        native = _native()
        native._alloc_hook_start(float(self.mean_bytes), LARGE_BYTES, MAX_EVENTS, seed)
        try:
            self.numpy = _hook_numpy(native)
        except Exception as exc:  # a numpy the hook does not know: its arrays go uncounted
            self.numpy = f"not counted ({type(exc).__name__}: {exc})"
        native._alloc_hook_end_step()

    @staticmethod
    def pause(on: bool) -> None:
        """Leave this thread's allocations out of the counts (stepscope's own work), or not."""
        native = _native()
        native._alloc_hook_pause(on)

    @staticmethod
    def poll() -> tuple[int, int]:
        """(bytes held now, the most held since the last poll)."""
        native = _native()
        current, high = native._alloc_hook_poll()
        return int(current), int(high)

    def end_step(self, want_peak_sites: bool) -> tuple[dict[str, int], dict[Site, tuple[int, int]]]:
        """The closing step's exact counters and the sampled sites alive at its end; with
        ``want_peak_sites``, ``peak_sites`` becomes the sites alive at the step's peak."""
        native = _native()
        counts = native._alloc_hook_end_step()
        first, events = native._alloc_hook_drain()
        mark = max(counts["peak_mark"], first)
        row = {k: int(v) for k, v in counts.items() if k != "peak_mark" and isinstance(v, int)}
        for offset, (ptr, size, weight, t_ns, frames) in enumerate(events):
            if want_peak_sites and first + offset == mark:
                self._take_peak()
            if size:
                self.live[ptr] = _Sample(self._site(frames), weight, size)
                self.last_sample_ns = t_ns
            else:
                self.live.pop(ptr, None)
        if want_peak_sites and mark >= first + len(events):
            self._take_peak()
        self.seq = first + len(events)
        return row, self.sites()

    def _take_peak(self) -> None:
        self.peak_sites = self.sites()
        self.peak_t_ns = self.last_sample_ns

    def sites(self) -> dict[Site, tuple[int, int]]:
        """Estimated (bytes, blocks) held by site, from the samples alive now."""
        sites: dict[Site, list[float]] = {}
        for sample in self.live.values():
            if sample.site is None:
                continue
            acc = sites.setdefault(sample.site, [0.0, 0.0])
            acc[0] += sample.weight
            acc[1] += sample.weight / sample.size
        return {site: (round(b), max(1, round(n))) for site, (b, n) in sites.items()}

    def _site(self, frames: tuple[tuple[CodeType, int], ...]) -> Site | None:
        """The innermost frame of the program's own code (the innermost if all are libraries);
        ``None`` for stepscope's own allocations."""
        if not frames:
            return None
        chosen = frames[0]
        for frame in frames:
            if not self.is_library(frame[0].co_filename):
                chosen = frame
                break
        code, offset = chosen
        if code.co_filename.startswith(self.own_dir):
            return None
        key = (code, offset)
        line = self.lines.get(key)
        if line is None:
            line = self.lines[key] = _line_of(code, offset)
        return code.co_filename, line

    def stop(self) -> None:
        """Unhook (or leave a pass-through where another hook was set on top) and keep the
        hook's own figures in ``stats``."""
        native = _native()
        self.stats = {
            k: int(v) for k, v in native._alloc_hook_stats().items() if isinstance(v, int)
        }
        self.restored = bool(native._alloc_hook_stop())
        self.lines.clear()


def _hook_numpy(native: _ext.NativeModule) -> str:
    """Swap numpy's default data allocator for the hook's, where numpy is loaded."""
    numpy = sys.modules.get("numpy")
    if numpy is None:
        return "not loaded"
    version = tuple(int(p) for p in numpy.__version__.split(".")[:2] if p.isdigit())
    if version < (1, 22):
        return f"not counted (numpy {numpy.__version__} has no allocation handler; 1.22+ has)"
    core = sys.modules.get("numpy._core._multiarray_umath") or sys.modules.get(
        "numpy.core._multiarray_umath"
    )
    api = getattr(core, "_ARRAY_API", None)
    if api is None:
        return "not counted (numpy's C API table was not found)"
    if not native._alloc_hook_numpy(api):
        return "not counted (numpy's default handler is not the one the hook knows)"
    return "counted"


def _line_of(code: CodeType, offset: int) -> int:
    """The source line of a byte offset in a code object."""
    for start, end, line in code.co_lines():
        if start <= offset < end and line is not None:
            return line
    return code.co_firstlineno
