"""Run a Python script or module under the step-scheduled profiler and write its traces.

``stepscope run [OPTIONS] SCRIPT [ARGS...]`` (or ``-m MODULE``) runs the program as ``python``
would, inside ``stepscope.profile`` with a schedule.  Steps advance on their own: after every
``torch.optim.Optimizer.step()`` when torch is installed (``--step-on optimizer``, the default
then), after every return of a function (``--step-on module:qualname``), or never
(``--step-on none``: the whole run is one window).  Each window is written as a Chrome trace into
``--out`` (open it in https://ui.perfetto.dev), and the top operators are printed at the end.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import runpy
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

AUTO = "auto"
NO_STEPS = "none"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``stepscope run``."""
    parser.add_argument(
        "-o", "--out", default="out/stepscope", help="directory for traces (default: out/stepscope)"
    )
    parser.add_argument(
        "--step-on",
        default=AUTO,
        metavar="WHEN",
        help="what ends a step: 'optimizer' (torch's Optimizer.step), 'module:qualname' (each "
        "return of that function), 'none' (record the whole run as one window); default: "
        "'optimizer' when torch is installed, else 'none'",
    )
    group = parser.add_argument_group("schedule (as torch.profiler.schedule; ignored with none)")
    group.add_argument("--skip-first", type=int, default=0, help="steps to skip (default 0)")
    group.add_argument("--wait", type=int, default=1, help="idle steps per cycle (default 1)")
    group.add_argument("--warmup", type=int, default=1, help="warm-up steps per cycle (default 1)")
    group.add_argument("--active", type=int, default=3, help="recorded steps per cycle (default 3)")
    group.add_argument("--repeat", type=int, default=1, help="cycles, 0 = forever (default 1)")
    parser.add_argument(
        "--activities",
        default="CPU",
        help="comma-separated ProfilerActivity names: CPU, CUDA, PYTHON, SAMPLING ... "
        "(default: CPU)",
    )
    for flag, what in (
        ("--record-shapes", "record operator input shapes (torch)"),
        ("--with-stack", "record every Python call (stepscope's tracer)"),
        ("--profile-memory", "record tensor allocations (torch)"),
        ("--with-flops", "estimate FLOPs of matmul/conv (torch)"),
        ("--with-modules", "record nn.Module hierarchy (torch)"),
        ("--gzip", "write .json.gz traces"),
    ):
        parser.add_argument(flag, action="store_true", help=what)
    parser.add_argument(
        "--top", type=int, default=15, help="operators to print at the end, 0 for none (default 15)"
    )
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a module, as python -m")
    parser.add_argument(
        "program", nargs=argparse.REMAINDER, help="SCRIPT [ARGS...] (or ARGS with -m)"
    )


def torch_installed() -> bool:
    """Whether torch can be imported here (without importing it)."""
    return "torch" in sys.modules or importlib.util.find_spec("torch") is not None


def resolve_step_on(value: str) -> str | None:
    """The profile's ``step_on`` for ``--step-on`` (None: no automatic steps)."""
    if value == AUTO:
        return "optimizer" if torch_installed() else None
    if value == NO_STEPS:
        return None
    if value == "optimizer":
        if not torch_installed():
            raise ValueError("--step-on optimizer needs torch, which is not installed here")
        return value
    if ":" not in value:
        raise ValueError(
            f"--step-on {value!r}: expected 'optimizer', 'none' or 'module:qualname' "
            "(e.g. mytrainer:Trainer.train_step)"
        )
    return value


def _program(args: argparse.Namespace) -> tuple[str, list[str], Callable[[], Any]]:
    """(display name, sys.argv, runner) of the program to run."""
    rest = list(args.program)
    if rest[:1] == ["--"]:
        rest = rest[1:]
    if args.module:
        module = args.module
        if importlib.util.find_spec(module) is None:
            raise ValueError(f"no module named {module!r} (is it on PYTHONPATH?)")
        return (
            module,
            [module, *rest],
            lambda: runpy.run_module(module, run_name="__main__", alter_sys=True),
        )
    if not rest:
        raise ValueError("nothing to run: pass SCRIPT [ARGS...] or -m MODULE [ARGS...]")
    script = Path(rest[0])
    if not script.is_file():
        raise ValueError(f"script not found: {script}")
    return (
        str(script),
        [str(script), *rest[1:]],
        lambda: runpy.run_path(str(script), run_name="__main__"),
    )


@contextmanager
def _as_main(argv: list[str], script_dir: str | None) -> Iterator[None]:
    """sys.argv and sys.path[0] as ``python`` sets them for the program; restored after."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = argv
    sys.path.insert(0, script_dir if script_dir is not None else os.getcwd())
    try:
        yield
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def _profile(args: argparse.Namespace, step_on: str | None) -> Any:
    import stepscope

    names = [part.strip().upper() for part in args.activities.split(",") if part.strip()]
    if step_on == "optimizer":
        import torch  # noqa: F401  (the optimizer hook and torch's operators need it loaded)
    schedule = None
    if step_on is not None:
        schedule = stepscope.schedule(
            skip_first=args.skip_first,
            wait=args.wait,
            warmup=args.warmup,
            active=args.active,
            repeat=args.repeat,
        )
    return stepscope.profile(
        activities=names,
        schedule=schedule,
        on_trace_ready=stepscope.trace_handler(args.out, use_gzip=args.gzip),
        record_shapes=args.record_shapes,
        with_stack=args.with_stack,
        profile_memory=args.profile_memory,
        with_flops=args.with_flops,
        with_modules=args.with_modules,
        step_on=step_on,
    )


def run(args: argparse.Namespace) -> int:
    """Run ``stepscope run``."""
    if args.top < 0:
        raise ValueError(f"--top must be 0 or more, got {args.top}")
    step_on = resolve_step_on(args.step_on)
    name, argv, runner = _program(args)
    status = 0
    with _as_main(argv, None if args.module else str(Path(argv[0]).resolve().parent)):
        prof = _profile(args, step_on)  # here, so --step-on finds modules beside the script
        with prof:
            try:
                runner()
            except SystemExit as exc:
                code = exc.code
                status = code if isinstance(code, int) else 0 if code is None else 1
                if not isinstance(code, (int, type(None))):
                    print(code, file=sys.stderr)
            except KeyboardInterrupt:
                traceback.print_exc()
                status = 130
            except BaseException:  # the program's own error: report it as python would
                traceback.print_exc()
                status = 1
    _summary(prof, name, step_on, args)
    return status


def _summary(prof: Any, name: str, step_on: str | None, args: argparse.Namespace) -> None:
    out = sys.stderr
    if not prof.trace_files:
        hint = (
            f"no step ended (step_on={step_on}) before the schedule recorded; pass "
            "--step-on module:qualname for the function that ends a step, or --step-on none "
            "to record the whole run"
            if step_on is not None
            else "the program ended before anything was recorded"
        )
        print(f"stepscope run: {name}: nothing recorded: {hint}", file=out)
        return
    if args.top:
        print(prof.key_averages().table(row_limit=args.top), file=out)
    steps = f"{prof.step_num} steps, " if step_on is not None else ""
    print(
        f"stepscope run: {name}: {steps}{len(prof.trace_files)} trace(s) written:",
        file=out,
    )
    for path in prof.trace_files:
        print(f"  {path}", file=out)
