"""Run a Python script or module under the step-scheduled profiler and write its traces.

``stepscope run [OPTIONS] SCRIPT [ARGS...]`` (or ``-m MODULE``) runs the program as ``python``
would, inside ``stepscope.profile`` with a schedule.  Steps advance on their own: after every
``torch.optim.Optimizer.step()`` (``--step-on optimizer``; by default when the program or a
module of its own imports torch or a torch trainer, and torch is installed), after every return
of a function (``--step-on module:qualname``; a function of the script itself is wrapped when
the script defines it), or never (``--step-on none``: the whole run is one window; the default
for other programs).  Each window is written as a Chrome trace into ``--out`` (open it in
https://ui.perfetto.dev), and the top rows of the last window's table are printed at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from stepscope.commands.command import Command
from stepscope.commands.flight_args import (  # the flight recorder's options (issue 40)
    add_flight_arguments,
    flight_options,
    flight_raised,
    flight_summary,
)
from stepscope.extras import torch_installed
from stepscope.profiler.options import RecordingOptions, add_recording_arguments
from stepscope.profiler.sort_keys import SORT_KEYS
from stepscope.program import Program, find_program, first_import, print_program_traceback
from stepscope.steps import window_label
from stepscope.values import at_least

if TYPE_CHECKING:
    from stepscope.profiler.on_demand import OnDemand
    from stepscope.profiler.profile import profile
    from stepscope.profiler.step_trigger import StepTrigger

AUTO = "auto"
NO_STEPS = "none"
TORCH_TRAINERS = ("torch", "lightning", "pytorch_lightning", "transformers", "accelerate")
"""Imports that make ``--step-on auto`` end steps at the optimizer (the trainers import torch)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``stepscope run``."""
    parser.add_argument(
        "--step-on",
        default=AUTO,
        metavar="WHEN",
        help="what ends a step: 'optimizer' (torch's Optimizer.step), 'module:qualname' (each "
        "return of that function), 'none' (record the whole run as one window); default: "
        "'optimizer' when the program (or a module of its own) imports torch, else 'none'",
    )
    group = parser.add_argument_group("schedule (as torch.profiler.schedule; ignored with none)")
    group.add_argument("--skip-first", type=int, default=0, help="steps to skip (default 0)")
    group.add_argument("--wait", type=int, default=1, help="idle steps per cycle (default 1)")
    group.add_argument("--warmup", type=int, default=1, help="warm-up steps per cycle (default 1)")
    group.add_argument(
        "--active",
        type=int,
        default=None,
        help="recorded steps per cycle (default 3; 5 with --memory: a leak hint needs the step "
        "ends)",
    )
    group.add_argument("--repeat", type=int, default=1, help="cycles, 0 = forever (default 1)")
    add_recording_arguments(parser)
    parser.add_argument(
        "--top", type=int, default=15, help="rows to print at the end, 0 for none (default 15)"
    )
    parser.add_argument(
        "--sort",
        default="self_cpu_time_total",
        choices=sorted(SORT_KEYS),
        metavar="KEY",
        help="sort the table by this torch.profiler key (default self_cpu_time_total)",
    )
    parser.add_argument(
        "--on-demand",
        action="store_true",
        help="record nothing until asked: 'stepscope attach PID --steps N' records the next N "
        "steps (the schedule options are ignored)",
    )
    parser.add_argument(
        "--step-tables",
        metavar="DIR",
        help="write one row per step (every step) as Parquet into DIR (see stepscope fleet)",
    )
    add_flight_arguments(parser)
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a module, as python -m")
    parser.add_argument(
        "program", nargs=argparse.REMAINDER, help="SCRIPT [ARGS...] (or ARGS with -m)"
    )


def auto_step_on(program: Program) -> tuple[str | None, str]:
    """``--step-on auto``: the step source for what the program does, and why, in words."""
    if not torch_installed():
        return None, "torch is not installed here"
    found = first_import(program, TORCH_TRAINERS)
    if found is None:
        return None, f"{program.display} imports no torch"
    module, where = found
    return "optimizer", f"{Path(where).name} imports {module}"


def resolve_step_on(value: str) -> str | None:
    """The profile's ``step_on`` for ``--step-on`` (None: no automatic steps); ``auto`` without
    a program to look at is ``optimizer`` when torch is installed."""
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


def _activities(options: RecordingOptions, step_on: str | None) -> list[str]:
    """``--activities`` by default: CPU (with torch imported, its device too: CUDA on a GPU
    machine), and SAMPLING unless torch's optimizer ends steps or every call is traced."""
    from stepscope.profiler.activity import default_activities

    found = {a.name for a in default_activities()}
    if not (step_on == "optimizer" or options.with_stack):
        found.add("SAMPLING")
    return sorted(found)


def _check_torch_flags(options: RecordingOptions) -> None:
    asked = options.torch_flags()
    if asked and not torch_installed():
        raise ValueError(
            f"{', '.join(asked)} record through torch's profiler, and torch is not installed "
            "here: pip install 'stepscope[torch]' (or drop the flag)"
        )


def _profile(
    args: argparse.Namespace, options: RecordingOptions, step_on: str | None, in_program: bool
) -> profile | OnDemand:
    import stepscope

    if step_on == "optimizer":
        import torch  # noqa: F401  (the optimizer hook and torch's operators need it loaded)
    if args.on_demand:
        from stepscope.profiler.on_demand import OnDemand

        return OnDemand(None if in_program else step_on)
    schedule = None
    flight = flight_options(args, options)
    if step_on is not None and flight is None:
        schedule = stepscope.schedule(
            skip_first=args.skip_first,
            wait=args.wait,
            warmup=args.warmup,
            active=args.active if args.active is not None else _default_active(options),
            repeat=args.repeat,
        )
    return stepscope.profile(
        **options.profile_kwargs(_activities(options, step_on)),
        schedule=schedule,
        on_trace_ready=options.handler(),
        step_on=None if in_program else step_on,
        step_tables=args.step_tables,
        flight_recorder=flight,
    )


def check_values(args: argparse.Namespace) -> RecordingOptions:
    """Every option in range, before the program runs (whether or not a schedule or a sampler
    will use it): a ``ValueError`` naming the option; returns the recording options."""
    for option, minimum in (
        ("skip_first", 0),
        ("wait", 0),
        ("warmup", 0),
        ("active", 1),
        ("repeat", 0),
        ("top", 0),
    ):
        at_least(f"--{option.replace('_', '-')}", getattr(args, option), minimum)
    options = RecordingOptions.from_args(args)
    flight_options(args, options)
    return options


def run(args: argparse.Namespace) -> int:
    """Run ``stepscope run``."""
    from stepscope.profiler.profile import profile
    from stepscope.profiler.step_trigger import StepTrigger, names_program_function

    options = check_values(args)
    _check_torch_flags(options)
    program = find_program(args.module, list(args.program))
    chosen = None
    if args.step_on == AUTO:
        step_on, why = auto_step_on(program)
        chosen = f"--step-on {step_on or NO_STEPS} ({why}; pass --step-on to choose)"
    else:
        step_on = resolve_step_on(args.step_on)
    in_program = step_on not in (None, "optimizer") and names_program_function(
        str(step_on), program.module_name
    )
    trigger = None
    status = 0
    if args.flight_recorder is not None and step_on is None:
        raise ValueError(
            "--flight-recorder needs a step source: --step-on module:qualname (the function "
            "that ends a step), or a torch program's optimizer steps"
        )
    if args.on_demand and step_on is None:
        raise ValueError(
            "--on-demand needs a step source: --step-on module:qualname (the function that "
            "ends a step), or a torch program's optimizer steps"
        )
    with program.as_main():
        # made here, so that --step-on finds the modules beside the program
        prof = _profile(args, options, step_on, in_program)
        if in_program:
            trigger = StepTrigger(str(step_on), prof.step, program_module=program.module_name)
        with prof:
            if not isinstance(prof, profile) and prof.attachable:  # else it said why, once
                _announce(program)
            try:
                if trigger is not None and trigger.in_program is not None:
                    program.run({trigger.in_program.split(".")[0]}, trigger.bound)
                else:
                    program.run()
            except SystemExit as exc:
                code = exc.code
                status = code if isinstance(code, int) else 0 if code is None else 1
                if not isinstance(code, (int, type(None))):
                    print(code, file=sys.stderr)
                if status:
                    flight_raised(prof, exc)
            except KeyboardInterrupt as exc:
                print_program_traceback(exc)
                status = 130
                flight_raised(prof, exc)
            except BaseException as exc:  # the program's own error: report it as python would
                print_program_traceback(exc)
                status = 1
                flight_raised(prof, exc)
    if isinstance(prof, profile):
        _summary(prof, program, step_on, args, options.profile_memory, trigger, status, chosen)
    else:
        _on_demand_summary(prof, program)
    return status


def _announce(program: Program) -> None:
    print(
        f"stepscope run: {program.display}: on demand: stepscope attach {os.getpid()} --steps N",
        file=sys.stderr,
        flush=True,
    )


def _on_demand_summary(session: OnDemand, program: Program) -> None:
    files = session.trace_files
    print(f"stepscope run: {program.display}: {len(files)} on-demand trace(s)", file=sys.stderr)
    for path in files:
        print(f"  {path}", file=sys.stderr)


def _summary(
    prof: profile,
    program: Program,
    step_on: str | None,
    args: argparse.Namespace,
    memory: bool,
    trigger: StepTrigger | None,
    status: int,
    chosen: str | None,
) -> None:
    out = sys.stderr
    name = program.display
    if chosen is not None:
        print(f"stepscope run: {name}: steps: {chosen}", file=out)
    if flight_summary(prof, name) and not prof.trace_files:
        return
    if not prof.trace_files:
        if status != 0 and prof.step_num == 0:
            hint = (
                f"the program stopped (exit status {status}) before its first step ended; "
                "see its error above"
            )
        elif trigger is not None and not trigger.wrapped:
            hint = (
                f"--step-on {args.step_on}: the program never defined {trigger.in_program} "
                "at its top level; name a function it defines, or pass --step-on none"
            )
        elif step_on is not None:
            hint = (
                f"no step ended (step_on={step_on}) before the schedule recorded; pass "
                "--step-on module:qualname for the function that ends a step, or --step-on "
                "none to record the whole run"
            )
        else:
            hint = "the program ended before anything was recorded"
        print(f"stepscope run: {name}: nothing recorded: {hint}", file=out)
        return
    if args.top:
        trace = prof.trace()
        window = trace.metadata.get("stepscope_window", {})
        count = len(prof.trace_files)
        index = window.get("index", count - 1)
        where = window_label(index, window.get("first_step", 0), window.get("last_step", 1))
        header = f"stepscope run: {name}: top {args.top} by {args.sort}, {where} of {count}"
        print(
            prof.key_averages().table(sort_by=args.sort, row_limit=args.top, header=header),
            file=out,
        )
    if memory:
        from stepscope.report.memory import memory_line

        print(memory_line(prof.trace(), f"stepscope run: {name}: memory"), file=out)
    steps = f"{prof.step_num} steps, " if step_on is not None else ""
    print(
        f"stepscope run: {name}: {steps}{len(prof.trace_files)} trace(s) written:",
        file=out,
    )
    for path in prof.trace_files:
        print(f"  {path}", file=out)
    whole = _whole_run_overhead(prof)
    if whole is not None:
        print(f"stepscope run: {name}: over the whole run: {whole}", file=out)


def _whole_run_overhead(prof: profile) -> str | None:
    """The recorded steps' slowdown over every warm unrecorded step of the run (a trace states
    it up to its window's end: the first window often has too few unrecorded steps before it);
    None when the run gives no figure either."""
    from stepscope.analysis.overhead import stated_overhead
    from stepscope.report.overhead import overhead_lines

    source = prof.traces[-1].metadata.get("stepscope_step_source") if prof.traces else None
    overhead = stated_overhead(prof.step_times.summary(), source)
    if overhead is None or overhead.slowdown_pct is None:
        return None
    line = overhead_lines(overhead)[0]
    return line[0].lower() + line[1:]


COMMAND = Command("run", __doc__ or "", add_arguments, run)
"""``stepscope run``."""


def _default_active(options: RecordingOptions) -> int:
    """Recorded steps per window: 3, or with memory enough step ends for a leak hint past the
    warm-up rise it leaves out."""
    if not options.profile_memory:
        return 3
    from stepscope.analysis.memory import LEAK_MIN_STEPS  # the analysis only when it is needed

    return LEAK_MIN_STEPS + 1
