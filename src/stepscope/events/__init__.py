"""stepscope.events: structured start / end / exception events of long calls.

Re-creates ``torch.distributed.checkpoint.logger``'s method logger for any long operation::

    import logging
    from stepscope import events

    events.log_to_jsonl("events.jsonl")                 # or any logging handler + JsonFormatter

    @events.logged(fields=events.checkpoint_fields, log_exceptions=True)
    def save(state_dict, *, checkpoint_id=None, storage_writer=None, planner=None): ...

    with events.logged("evaluate", epoch=3) as call:    # also a (async) context manager
        call.set("accuracy", 0.91)

Each event is a dict (``event``, ``phase``, ``ts_ns``, ``mono_ns``, ``seq``, ``span_id``,
``parent_span_id``, ``pid``, ``thread``, ``step``, ``rank``, ``world_size``, ``attrs`` ...)
sent to the ``stepscope.events`` logger; while a profiler window records, each call is also a
``user_annotation`` span in the trace.  With the logger disabled and no window recording, a
decorated call computes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepscope.events.call import Call
from stepscope.events.coerce import Limits, coerce, get_limits, set_limits
from stepscope.events.context import current_span_id
from stepscope.events.decorator import EVENTS_LOGGER, Logged, NoCall, logged
from stepscope.events.event import Event
from stepscope.events.extractors import checkpoint_fields
from stepscope.events.failures import failure_counts
from stepscope.lazy import lazy_names

if TYPE_CHECKING:
    from stepscope.events.sinks import JsonFormatter, JsonlHandler, as_json_object, log_to_jsonl

__all__ = [
    "EVENTS_LOGGER",
    "Call",
    "Event",
    "JsonFormatter",
    "JsonlHandler",
    "Limits",
    "Logged",
    "NoCall",
    "as_json_object",
    "checkpoint_fields",
    "coerce",
    "current_span_id",
    "failure_counts",
    "get_limits",
    "log_to_jsonl",
    "logged",
    "set_attr",
    "set_limits",
]

_SINKS = {"JsonFormatter", "JsonlHandler", "as_json_object", "log_to_jsonl"}


def set_attr(name: str, value: Any) -> bool:
    """Add an attribute to the innermost logged call running here; False if none (or no room)."""
    from stepscope.events.context import current_call

    call = current_call()
    return False if call is None else call.set(name, value)


# the sinks import the metrics pipeline: only load it when a sink is asked for
__getattr__, __dir__ = lazy_names(globals(), dict.fromkeys(_SINKS, "stepscope.events.sinks"))
