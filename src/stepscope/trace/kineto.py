"""Kineto's bookkeeping args: left out of a merged trace (the C scanner drops the same), or
numbered anew over the merged window when ``expose_kineto_event_metadata`` asks for them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepscope.trace.names import OWN_WORK_FRAME

if TYPE_CHECKING:
    from stepscope.trace.model import TraceBuilder

__all__ = ["drop_bookkeeping", "number_events"]

# "Ev Idx" is the event's index in Kineto's own list (meaningless once merged; HTA defaults it),
# "Record function id" 0 is the default, and a "Concrete Inputs" list of empty strings only
# repeats how many inputs "Input Dims" has.
KINETO_INDEX_ARG = "Ev Idx"
RECORD_FUNCTION_ID_ARG = "Record function id"
CONCRETE_INPUTS_ARG = "Concrete Inputs"


def drop_bookkeeping(args: dict[str, Any]) -> None:
    """Remove Kineto's bookkeeping keys from one event's args, in place."""
    args.pop(KINETO_INDEX_ARG, None)
    record_id = args.get(RECORD_FUNCTION_ID_ARG)
    if type(record_id) is int and record_id == 0:
        del args[RECORD_FUNCTION_ID_ARG]
    concrete = args.get(CONCRETE_INPUTS_ARG)
    if isinstance(concrete, list) and all(c == "" for c in concrete) and "Input Dims" in args:
        del args[CONCRETE_INPUTS_ARG]


OP_CATEGORIES = ("cpu_op", "user_annotation")
"""The CPU events Kineto numbers first: torch's ops and the annotations (steps included)."""
MEMORY_EVENT = "[memory]"
PYTHON_CATEGORY = "python_function"


def number_events(builder: TraceBuilder) -> int:
    """Write ``Ev Idx`` on a window's events as torch's profiler numbers them, and return how
    many were numbered.

    torch (``_ExperimentalConfig(expose_kineto_event_metadata=True)``) writes each event's index
    in Kineto's list of the window's events: the ops and annotations in the order they started
    (an enclosing event before the events it encloses), then the ``[memory]`` instants, then the
    Python frames.  A merged window holds stepscope's annotations and steps, which Kineto never
    saw, so the indices are given over again, in the same order, to the merged events: each op,
    annotation and step gets the index torch gives it on the same program (stepscope's own work
    between steps, no event of torch's, gets none), in the file and in ``events()``' args.
    """
    string_ids = builder.bulk_tables()[0]
    cats, names = builder.column("spans", "cat"), builder.column("spans", "name")
    starts, durs = builder.column("spans", "start_ns"), builder.column("spans", "dur_ns")
    op_ids = {string_ids.get(c, -1) for c in OP_CATEGORIES}
    python_id = string_ids.get(PYTHON_CATEGORY, -1)
    own_work = string_ids.get(OWN_WORK_FRAME, -1)

    def by_start(rows: list[int]) -> list[int]:
        return sorted(rows, key=lambda r: (starts[r], -durs[r], r))

    rows = range(len(cats))
    index = 0
    for row in by_start([r for r in rows if cats[r] in op_ids and names[r] != own_work]):
        builder.set_row_args(
            "spans", row, {**(builder.row_args("spans", row) or {}), KINETO_INDEX_ARG: index}
        )
        index += 1
    instants, times = builder.column("instants", "name"), builder.column("instants", "ts_ns")
    memory = string_ids.get(MEMORY_EVENT, -1)
    found = (r for r in range(len(instants)) if instants[r] == memory)
    for row in sorted(found, key=times.__getitem__):
        builder.set_row_args(
            "instants", row, {**(builder.row_args("instants", row) or {}), KINETO_INDEX_ARG: index}
        )
        index += 1
    for row in by_start([r for r in rows if cats[r] == python_id]):
        builder.set_row_args(
            "spans", row, {**(builder.row_args("spans", row) or {}), KINETO_INDEX_ARG: index}
        )
        index += 1
    return index
