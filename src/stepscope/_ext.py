"""Access to the optional C extension, and the one way to choose it or its pure-Python twins.

Every choice between the C extension and the twins takes one of :data:`IMPLEMENTATIONS`:
``"auto"`` (the extension when it is built, else the twins), ``"native"`` (the extension, or an
error saying why it cannot be used) or ``"python"`` (the twins).  The process-wide choice is the
environment variable ``STEPSCOPE_IMPLEMENTATION`` (default ``auto``); a part that takes
``implementation=`` (the function tracer, the stack sampler) resolves its own with
:func:`resolve`.

Only the built extension module is accepted: whatever else answers to the name
``stepscope._native`` (a leftover folder imported as a namespace package, a ``.py`` file, a
stale build missing entry points) is refused, and the reason is kept in :func:`status` so the
clock metadata of every trace says which implementation ran and why.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
from types import ModuleType
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from stepscope import _native

__all__ = [
    "ENV",
    "IMPLEMENTATIONS",
    "MODULE",
    "REQUIRED",
    "NativeModule",
    "load_error",
    "native",
    "process_implementation",
    "resolve",
    "status",
]

IMPLEMENTATIONS = ("auto", "native", "python")
"""The values of every native-or-twin choice."""
ENV = "STEPSCOPE_IMPLEMENTATION"
"""The process-wide choice (one of :data:`IMPLEMENTATIONS`, default ``auto``)."""

MODULE = "stepscope._native"
"""The name the extension is built under (``setup.py``; sources in ``src/stepscope/_csrc``)."""

REQUIRED = (
    "now_ns",
    "_clock_configure",
    "format_spans",
    "scan_trace",
    "spans_from_events",
    "remap_column",
    "int_args",
    "pack_varints",
    "column_min",
    "split_args",
    "nest_spans",
    "RecordFunction",
    "_tracer_start",
    "StackSampler",
    "StepRing",
)
"""Entry points of each C part; a module lacking one is a stale build and is refused."""

if TYPE_CHECKING:

    class NativeModule:
        """``stepscope._native`` as the type checker sees it: each entry point of the stub
        ``_native.pyi`` (a module cannot be a type, so this namespace names them once more)."""

        _clock_configure = staticmethod(_native._clock_configure)
        _clock_refine = staticmethod(_native._clock_refine)
        now_ns = staticmethod(_native.now_ns)
        ticks = staticmethod(_native.ticks)
        ticks_to_ns = staticmethod(_native.ticks_to_ns)
        ticks_per_second = staticmethod(_native.ticks_per_second)
        format_spans = staticmethod(_native.format_spans)
        spans_from_events = staticmethod(_native.spans_from_events)
        scan_trace = staticmethod(_native.scan_trace)
        remap_column = staticmethod(_native.remap_column)
        int_args = staticmethod(_native.int_args)
        pack_varints = staticmethod(_native.pack_varints)
        unpack_varints = staticmethod(_native.unpack_varints)
        column_min = staticmethod(_native.column_min)
        split_args = staticmethod(_native.split_args)
        splice_args = staticmethod(_native.splice_args)
        nest_spans = staticmethod(_native.nest_spans)
        RecordFunction = _native.RecordFunction
        _annotations_start = staticmethod(_native._annotations_start)
        _annotations_stop = staticmethod(_native._annotations_stop)
        _annotations_recording = staticmethod(_native._annotations_recording)
        _annotations_emit = staticmethod(_native._annotations_emit)
        _annotations_set_bridge = staticmethod(_native._annotations_set_bridge)
        _annotations_set_decorator = staticmethod(_native._annotations_set_decorator)
        TRACER_RECORD_BYTES = _native.TRACER_RECORD_BYTES
        _tracer_configure = staticmethod(_native._tracer_configure)
        _tracer_start = staticmethod(_native._tracer_start)
        _tracer_stop = staticmethod(_native._tracer_stop)
        _tracer_stats = staticmethod(_native._tracer_stats)
        _tracer_interned = staticmethod(_native._tracer_interned)
        _tracer_export = staticmethod(_native._tracer_export)
        _tracer_clear = staticmethod(_native._tracer_clear)
        _tracer_active = staticmethod(_native._tracer_active)
        _tracer_thread_hook = staticmethod(_native._tracer_thread_hook)
        _mon_py_start = staticmethod(_native._mon_py_start)
        _mon_py_throw = staticmethod(_native._mon_py_throw)
        _mon_py_return = staticmethod(_native._mon_py_return)
        _mon_py_unwind = staticmethod(_native._mon_py_unwind)
        _mon_call = staticmethod(_native._mon_call)
        _mon_c_end = staticmethod(_native._mon_c_end)
        StackSampler = _native.StackSampler
        StepRing = _native.StepRing
        _sampler_after_fork_in_child = staticmethod(_native._sampler_after_fork_in_child)
        _alloc_hook_start = staticmethod(_native._alloc_hook_start)
        _alloc_hook_stop = staticmethod(_native._alloc_hook_stop)
        _alloc_hook_end_step = staticmethod(_native._alloc_hook_end_step)
        _alloc_hook_poll = staticmethod(_native._alloc_hook_poll)
        _alloc_hook_drain = staticmethod(_native._alloc_hook_drain)
        _alloc_hook_stats = staticmethod(_native._alloc_hook_stats)
        _alloc_hook_numpy = staticmethod(_native._alloc_hook_numpy)
        _alloc_hook_pause = staticmethod(_native._alloc_hook_pause)

else:
    NativeModule = ModuleType

_loaded: ModuleType | None = None
_tried = False
load_error: str | None = None
"""Why the twins are in use (``None`` while the extension is in use or not yet asked for)."""


def process_implementation() -> tuple[str, str]:
    """The process-wide choice and the setting it came from (``STEPSCOPE_IMPLEMENTATION=...`` or
    ``default``)."""
    value = os.environ.get(ENV, "").strip().lower()
    if value:
        if value not in IMPLEMENTATIONS:
            raise ValueError(
                f"{ENV} must be one of {', '.join(IMPLEMENTATIONS)}, got {os.environ[ENV]!r}"
            )
        return value, f"{ENV}={value}"
    return "auto", "default"


def _load() -> tuple[ModuleType | None, str | None]:
    """The extension module, or ``None`` and the reason it cannot be used."""
    choice, source = process_implementation()
    if choice == "python":
        return None, f"disabled by {source}"
    try:
        spec = importlib.util.find_spec(MODULE)
    except (ImportError, ValueError) as exc:
        return None, f"{MODULE} cannot be looked up: {exc}"
    if spec is None:
        return None, f"{MODULE} is not built (install with a C compiler to build it)"
    if not isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
        if spec.origin is None or spec.submodule_search_locations is not None:
            where = ", ".join(spec.submodule_search_locations or ()) or "?"
            found = "a folder (namespace package)"
        else:
            where, found = spec.origin, f"a module loaded by {type(spec.loader).__name__}"
        return None, (
            f"{MODULE} is not built: {where} is {found}, not the extension module; not imported"
        )
    try:
        mod = importlib.import_module(MODULE)
    except ImportError as exc:
        return None, f"{MODULE} at {spec.origin} failed to import: {exc}"
    missing = [name for name in REQUIRED if not hasattr(mod, name)]
    if missing:
        return None, (
            f"{MODULE} at {spec.origin} is a stale build (missing {', '.join(missing)}); "
            "rebuild it with `python setup.py build_ext --inplace` or reinstall"
        )
    return mod, None


def native() -> NativeModule | None:
    """``stepscope._native`` if it is built and the process-wide choice allows it, else ``None``.

    Decided once per process.  Under ``STEPSCOPE_IMPLEMENTATION=native`` a missing or refused
    extension is a ``RuntimeError`` saying why, not a quiet fall-back to the twins.
    """
    global _loaded, _tried, load_error
    if not _tried:
        _tried = True
        _loaded, load_error = _load()
    if _loaded is None and os.environ.get(ENV, "").strip().lower() == "native":
        raise RuntimeError(
            f"{ENV}=native, but the stepscope C extension cannot be used: {load_error}"
        )
    return cast("NativeModule | None", _loaded)


def resolve(
    implementation: str | None = "auto", *, what: str = "implementation"
) -> NativeModule | None:
    """The extension for one choice (one of :data:`IMPLEMENTATIONS`; ``None`` means ``auto``),
    or ``None`` for the twins.

    ``auto`` follows the process-wide choice; ``python`` is always the twins; ``native`` is the
    extension or a ``RuntimeError`` saying why it cannot be used.  ``what`` names the option in
    error messages.
    """
    choice = "auto" if implementation is None else implementation
    if choice not in IMPLEMENTATIONS:
        raise ValueError(
            f"{what} must be one of {', '.join(IMPLEMENTATIONS)}, got {implementation!r}"
        )
    if choice == "python":
        return None
    mod = native()
    if choice == "native" and mod is None:
        raise RuntimeError(
            f"{what}='native' needs the stepscope C extension, which is not available "
            f"({load_error}); use {what}='auto' to fall back to the pure-Python twin"
        )
    return mod


def status() -> dict[str, object]:
    """Which implementation is in use: ``{"native": True, "file": name}`` or the reason not."""
    mod = native()
    if mod is None:
        return {"native": False, "reason": load_error or "not loaded"}
    return {"native": True, "file": os.path.basename(getattr(mod, "__file__", None) or "")}
