"""Kineto's bookkeeping args, which a merged trace leaves out (the C scanner drops the same)."""

from __future__ import annotations

from typing import Any

__all__ = ["drop_bookkeeping"]

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
