"""The recording options: what a window records and where it is written, one type for every surface.

``RecordingOptions`` is what ``stepscope run``, ``stepscope attach`` and an on-demand window ask
a profile to record (and what the next surfaces take: a window triggered by a slow step, the
flight recorder, worker recording).  Each option is one field, declared once with ``option()``;
everything else follows from that declaration:

- its check: ``RecordingOptions(...)`` raises a one-line ``ValueError`` naming the flag;
- its flag: ``add_recording_arguments`` gives ``run`` and ``attach`` the same flags;
- its wire form: ``to_wire``/``from_wire``, the JSON object of an attach request;
- its place in a profile: ``profile_kwargs`` builds one, ``adopt`` moves them onto a live one.

Adding an option is adding a field here.  On the wire an option at its default is left out,
and an option the receiving process does not know is refused with one line (never ignored: a
window recorded without what was asked for would be silent data loss); so a newer ``attach``
works with an older process as long as it asks only for what that process knows.

At import only the standard library and the base are loaded (the trace handler when it is
asked for): ``attach`` imports this without loading the profiler.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepscope._version import __version__
from stepscope.activity import ProfilerActivity, coerce_activities
from stepscope.values import MAX_SAMPLING_HZ, at_least, positive_finite

if TYPE_CHECKING:
    from stepscope.profiler.profile import profile

__all__ = ["DEFAULT_MAX_CALLS", "RecordingOptions", "add_recording_arguments", "adopt"]

DEFAULT_MAX_CALLS = 500_000
"""Calls ``with_stack`` keeps per window (about 10 MB in memory, 90 MB of .json)."""
_SPEC = "stepscope_option"
Check = Callable[[str, Any], Any]
"""``check(flag, value)``: the value in its one form, or a ``ValueError`` naming ``flag``."""


@dataclass(frozen=True)
class Option:
    """How one field of ``RecordingOptions`` is spelled on each surface."""

    flags: tuple[str, ...]
    help: str
    metavar: str | None = None
    group: str | None = None
    """The title of the argument group the flag is listed under (None: the command's own)."""
    parse: Callable[[str], Any] | None = None
    """The flag's text to a value (default: from the field's type)."""
    check: Check | None = None
    profile: bool = True
    """A keyword of ``profile()`` of the same name (False: used otherwise, e.g. the handler)."""
    tracer: str = ""
    """A key of ``profile(tracer_options=)`` instead of a keyword."""
    wire: str = ""
    """Its key in an attach request when not the field's name (kept for older processes)."""
    torch: bool = False
    """Recorded through torch's profiler: needs torch in the recording process."""

    @property
    def flag(self) -> str:
        """The flag that names the option in messages (its first long one)."""
        return next((f for f in self.flags if f.startswith("--")), self.flags[0])


def option(default: Any, *flags: str, help: str, **how: Any) -> Any:
    """A field of ``RecordingOptions`` with its flags, help and ``Option`` settings."""
    return field(default=default, metadata={_SPEC: Option(flags, help, **how)})


def _at_least(minimum: int) -> Check:
    def check(flag: str, value: int | None) -> int | None:
        at_least(flag, value, minimum)
        return value

    return check


def _rate(flag: str, value: float) -> float:
    positive_finite(flag, value, MAX_SAMPLING_HZ, "samples per second")
    return value


def _out(flag: str, value: str) -> str:
    if not value:
        raise ValueError(f"{flag} must name a directory, got an empty one")
    return value


def _trace_format(flag: str, value: str) -> str:
    """A format ``trace_handler`` writes, its packages installed (checked before the program
    runs, not at its first window)."""
    from stepscope.extras import missing_extra
    from stepscope.trace.formats import check_format

    try:
        check_format(value)
    except ValueError as exc:
        raise ValueError(f"{flag}: {exc}") from None
    if value == "perfetto" and importlib.util.find_spec("perfetto") is None:
        raise ValueError(str(missing_extra(f"{flag} perfetto", "perfetto")))
    return value


def _activity_names(text: str) -> tuple[str, ...] | None:
    """``--activities CPU,sampling`` (``auto``: the surface's default, None)."""
    names = tuple(part.strip() for part in text.split(",") if part.strip())
    return None if names in ((), ("auto",)) else names


_CANONICAL = {name.upper(): name for name in ProfilerActivity.__members__}


def _activities(flag: str, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
    """Known activity names, each as ``ProfilerActivity`` spells it (``cpu``: ``CPU``)."""
    if not value:  # none named: the surface's default
        return None
    value = tuple(_CANONICAL.get(name.upper(), name) for name in value)
    coerce_activities(value)  # the ValueError names the known activities
    return value


TRACER_GROUP = "--with-stack (every Python call; memory and files grow with calls)"


@dataclass(frozen=True)
class RecordingOptions:
    """What a window records and where it goes; checked when made (see the module doc)."""

    out: str = option(
        "out/stepscope",
        "-o",
        "--out",
        profile=False,
        check=_out,
        help="directory for traces (default: out/stepscope)",
    )
    activities: tuple[str, ...] | None = option(
        None,
        "--activities",
        parse=_activity_names,
        check=_activities,
        help="comma-separated ProfilerActivity names: CPU, CUDA, PYTHON, SAMPLING ... (default: "
        "what the program needs: CPU and torch's device, CUDA on an NVIDIA machine, when it "
        "runs torch; CPU,SAMPLING when it is plain Python, so the table shows where its time "
        "goes)",
    )
    sampling_rate_hz: float = option(
        100.0,
        "--sampling-rate",
        metavar="HZ",
        check=_rate,
        help="stack samples per second with SAMPLING (default 100)",
    )
    record_shapes: bool = option(
        False, "--record-shapes", torch=True, help="record operator input shapes (torch)"
    )
    with_stack: bool = option(
        False, "--with-stack", help="record every Python call (stepscope's tracer)"
    )
    with_flops: bool = option(
        False, "--with-flops", torch=True, help="estimate FLOPs of matmul/conv (torch)"
    )
    with_modules: bool = option(
        False, "--with-modules", torch=True, help="record nn.Module hierarchy (torch)"
    )
    profile_memory: bool = option(
        False,
        "--memory",
        "--profile-memory",
        wire="memory",
        help="memory per step: the Python heap, torch's tensors, the RSS (profile_memory)",
    )
    gzip: bool = option(False, "--gzip", profile=False, help="write .json.gz traces")
    trace_format: str = option(
        "chrome",
        "--trace-format",
        profile=False,
        metavar="FORMAT",
        check=_trace_format,
        help="chrome (.json, the default: HTA, TensorBoard and torch read it), compact "
        "(.sstrace: a tenth of the bytes or less, read by every stepscope command) or "
        "perfetto (.pftrace, the perfetto extra)",
    )
    max_calls: int = option(
        DEFAULT_MAX_CALLS,
        "--max-calls",
        metavar="N",
        group=TRACER_GROUP,
        tracer="event_budget",
        check=_at_least(1),
        help=f"calls kept per window; older ones are dropped and counted (default "
        f"{DEFAULT_MAX_CALLS})",
    )
    include: tuple[str, ...] = option(
        (),
        "--include",
        metavar="GLOB",
        group=TRACER_GROUP,
        tracer="include",
        help="record only these modules",
    )
    exclude: tuple[str, ...] = option(
        (),
        "--exclude",
        metavar="GLOB",
        group=TRACER_GROUP,
        tracer="exclude",
        help="never record these modules",
    )
    max_depth: int | None = option(
        None,
        "--max-depth",
        metavar="N",
        group=TRACER_GROUP,
        tracer="max_depth",
        check=_at_least(0),
        help="deepest call level kept",
    )
    dataloader_workers: bool = option(
        True,
        "--no-dataloader-workers",
        help="do not follow torch DataLoader worker processes (by default each worker records "
        "its batches and samples its stacks inside windows)",
    )

    def __post_init__(self) -> None:
        for name, spec in _specs():
            value = _KINDS[_HINTS[name]].conform(spec.flag, getattr(self, name))
            if spec.check is not None:
                value = spec.check(spec.flag, value)
            object.__setattr__(self, name, value)  # frozen: set once, here
        if self.gzip and self.trace_format != "chrome":
            raise ValueError(
                f"--gzip is for Chrome JSON traces; --trace-format {self.trace_format} is "
                "compressed already"
            )

    # -- the command line ----------------------------------------------------------------------
    @classmethod
    def from_args(cls, args: argparse.Namespace) -> RecordingOptions:
        """The options parsed by ``add_recording_arguments``; ``ValueError`` names a bad one."""
        return cls(**{name: getattr(args, name) for name, _ in _specs()})

    def torch_flags(self) -> list[str]:
        """The flags given that record through torch's profiler."""
        return [spec.flag for name, spec in _specs() if spec.torch and getattr(self, name)]

    # -- the wire ------------------------------------------------------------------------------
    def to_wire(self) -> dict[str, Any]:
        """The JSON object of an attach request: the options not at their default, and ``out``
        made absolute (the recording process has another working directory)."""
        found: dict[str, Any] = {"out": str(Path(self.out).resolve())}
        for f in dataclasses.fields(self):
            value, spec = getattr(self, f.name), f.metadata[_SPEC]
            if f.name != "out" and value != f.default:
                found[spec.wire or f.name] = list(value) if isinstance(value, tuple) else value
        return found

    @classmethod
    def from_wire(cls, message: Mapping[str, Any]) -> RecordingOptions:
        """The options of an attach request (``to_wire``'s form); ``ValueError`` says what is
        wrong, an unknown option included."""
        names = {spec.wire or name: name for name, spec in _specs()}
        unknown = sorted(set(message) - set(names))
        if unknown:
            raise ValueError(
                f"this process runs stepscope {__version__}, which does not know the option(s) "
                f"{', '.join(map(repr, unknown))}; attach without them, or run the program "
                "with a stepscope that has them"
            )
        out = message.get("out")
        if not isinstance(out, str) or not Path(out).is_absolute():
            raise ValueError(f"the output directory must be an absolute path, got {out!r}")
        return cls(**{names[key]: value for key, value in message.items()})

    # -- a profile -----------------------------------------------------------------------------
    def profile_kwargs(self, default_activities: Iterable[str]) -> dict[str, Any]:
        """Keywords of ``profile()`` for these options (``default_activities`` when none were
        asked for: each surface has its own)."""
        kwargs: dict[str, Any] = {"tracer_options": {}}
        for name, spec in _specs():
            if spec.tracer:
                kwargs["tracer_options"][spec.tracer] = getattr(self, name)
            elif spec.profile:
                kwargs[name] = getattr(self, name)
        if self.activities is None:
            kwargs["activities"] = sorted(default_activities)
        return kwargs

    def handler(self) -> Callable[[Any], str | None]:
        """The ``on_trace_ready`` that writes each window into ``out``, in ``trace_format``
        (gzipped with ``gzip``)."""
        from stepscope.profiler.handlers import trace_handler

        return trace_handler(self.out, use_gzip=self.gzip, format=self.trace_format)


def _specs() -> Iterable[tuple[str, Option]]:
    return ((f.name, f.metadata[_SPEC]) for f in dataclasses.fields(RecordingOptions))


PROFILE_STATE = ("tracer_options", "activity_filters", "torch_ops", "collectors")
"""What a profile derives from its options when it is made: moved with them by ``adopt``."""


def adopt(live: profile, built: profile) -> None:
    """Give ``live`` the options of ``built`` (made with ``profile_kwargs``) and the collectors
    made from them, for its next window (``live``'s own collectors are closed by the caller)."""
    moved = [name for name, spec in _specs() if spec.profile and not spec.tracer]
    for name in (*moved, *PROFILE_STATE):
        setattr(live, name, getattr(built, name))


def add_recording_arguments(parser: argparse.ArgumentParser) -> None:
    """The recording options as flags of ``parser`` (``RecordingOptions.from_args`` reads them)."""
    groups: dict[str, argparse._ActionsContainer] = {}
    for f in dataclasses.fields(RecordingOptions):
        spec: Option = f.metadata[_SPEC]
        where: argparse._ActionsContainer = parser
        if spec.group is not None:
            where = groups.get(spec.group) or groups.setdefault(
                spec.group, parser.add_argument_group(spec.group)
            )
        how = dict(_KINDS[_HINTS[f.name]].cli)
        if how.get("action") == "store_true" and f.default is True:
            how["action"] = "store_false"  # on by default: its flag turns it off
        if spec.parse is not None:
            how = {"type": spec.parse}
        how.setdefault("default", f.default)
        if spec.metavar is not None:
            how["metavar"] = spec.metavar
        where.add_argument(*spec.flags, dest=f.name, help=spec.help, **how)


# -- the types an option may have ---------------------------------------------------------------


@dataclass(frozen=True)
class _Kind:
    conform: Callable[[str, Any], Any]
    """``conform(flag, value)``: the value in its one form, or a ``ValueError`` naming ``flag``."""
    cli: Mapping[str, Any]
    """How argparse reads it."""


def _boolean(flag: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{flag} must be true or false, got {value!r}")
    return value


def _integer(flag: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{flag} must be a whole number, got {value!r}")
    return value


def _number(flag: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{flag} must be a number, got {value!r}")
    return float(value)


def _text(flag: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{flag} must be text, got {value!r}")
    return value


def _names(flag: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"{flag} must be a list of names, got {value!r}")
    if not all(isinstance(item, str) and item for item in value):
        raise ValueError(f"{flag} must be a list of names, got {value!r}")
    return tuple(value)


def _optional(conform: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    return lambda flag, value: None if value is None else conform(flag, value)


_KINDS: dict[Any, _Kind] = {
    bool: _Kind(_boolean, {"action": "store_true"}),
    int: _Kind(_integer, {"type": int}),
    int | None: _Kind(_optional(_integer), {"type": int}),
    float: _Kind(_number, {"type": float}),
    str: _Kind(_text, {}),
    tuple[str, ...]: _Kind(_names, {"action": "append", "default": []}),
    tuple[str, ...] | None: _Kind(_optional(_names), {}),
}
"""Each type a field of ``RecordingOptions`` may have."""


_HINTS: dict[str, Any] = typing.get_type_hints(RecordingOptions)
_unknown_kinds = {n: h for n, h in _HINTS.items() if h not in _KINDS}
if _unknown_kinds:
    raise TypeError(f"RecordingOptions: no _KINDS entry for the type of {_unknown_kinds}")
