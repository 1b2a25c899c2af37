"""One hook per process on torch.distributed's collectives, registered once, never removed.

Every collective of c10d — a ``dist.all_reduce``, DDP's bucket all-reduces (issued from C++ by
its reducer), FSDP's all-gathers, a barrier, a send — is a dispatcher operator
(``c10d::allreduce_``...) that runs its backend and returns a ``Work``.  stepscope registers a
kernel of its own for these operators on the ``Autograd`` dispatch key, which none of them uses
(torch falls through to its backend kernels there): the kernel calls the operator below
autograd, exactly as the fall-through would, and tells the listeners when the collective
started and when it completed:

- **on the host** (CPU tensors: gloo; any backend whose ``Work``'s future completes when the
  collective does): ``collective_started()`` when the call enters, and the callable it returned
  when the work's future completes, on the backend's thread (a collective that returns no work
  completes when the call returns);
- **on a device** (CUDA tensors: NCCL, whose future completes at launch): the group's
  collective timing is switched on (``ProcessGroup._enable_collectives_timing``: start and end
  events around each collective) and ``device_collective(work)`` gets the work, whose
  ``_get_duration()`` gives the device time once ``is_completed()``.

Nothing here runs inside a compiled graph (dynamo traces ``torch.distributed`` calls into
functional collectives and never calls a dispatcher kernel while tracing; the compiled code
calls the backend at run time, through this kernel), so it adds no graph break.  Calls made
under ``torch.inference_mode()`` skip autograd's key, and so this hook.  Registering or
removing a kernel while another thread calls the operator is not safe in torch, so the kernel
is registered once — when the first listener is added, or right after ``torch.distributed`` is
imported — and stays; with no listener it costs one Python call per collective.  Everything the
listeners do is guarded: a failure is counted on the ``collectors`` failure log, and the
collective's result or exception is the one its backend gave.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from stepscope.collectors import import_watch
from stepscope.failures import failure_log

__all__ = [
    "CollectiveListener",
    "add_listener",
    "ensure_registered",
    "hooked_operators",
    "remove_listener",
]


class CollectiveListener(Protocol):
    """What the hook calls (from any thread, holding the GIL)."""

    def collective_started(self) -> Callable[[], None] | None:
        """A host collective starts now; the callable returned is called when it completes."""

    def device_collective(self, work: Any) -> None:
        """A device collective was launched (``work``: its ``torch.distributed.Work``)."""


_listeners: tuple[CollectiveListener, ...] = ()
_lock = threading.Lock()
_registered = False
_waiting = False
_library: Any = None  # the torch.library.Library holding the kernels: kept for the process
_hooked: tuple[str, ...] = ()
_timed_groups: set[str] = set()
_failures = failure_log("collectors")


def hooked_operators() -> tuple[str, ...]:
    """The ``c10d`` operators the hook sees (empty until it is registered)."""
    return _hooked


def add_listener(listener: CollectiveListener) -> None:
    """Tell ``listener`` about every collective from now on (registering the hook when
    ``torch.distributed`` is imported, or now if it is)."""
    global _listeners
    with _lock:
        if listener not in _listeners:
            _listeners = (*_listeners, listener)
    ensure_registered()


def remove_listener(listener: CollectiveListener) -> None:
    """Stop telling ``listener`` (no error if it was not listening)."""
    global _listeners
    with _lock:
        _listeners = tuple(known for known in _listeners if known is not listener)


def ensure_registered() -> None:
    """Register the kernels now if ``torch.distributed`` is imported, else right after."""
    global _waiting
    with _lock:
        if _registered or _waiting:
            return
        _waiting = True
    import_watch.when_imported("torch.distributed", _register)


def _register() -> None:
    global _registered, _waiting, _library, _hooked
    with _lock:
        _waiting = False
        if _registered:
            return
        _registered = True
        try:
            _library, _hooked = _register_kernels()
        except Exception as exc:  # a torch without c10d, or one whose operators differ
            _failures.report(
                type(exc).__name__,
                "the collective hook",
                exc,
                strict=False,
                then="collectives are not timed; the program runs on",
            )


def _register_kernels() -> tuple[Any, tuple[str, ...]]:
    import torch
    import torch.distributed as dist

    if not dist.is_available():
        return None, ()
    library: Any = torch.library.Library("c10d", "IMPL")  # type: ignore[no-untyped-call]
    hooked = []
    for qualified in sorted(torch._C._dispatch_get_all_op_names()):
        namespace, _, name = qualified.partition("::")
        if namespace != "c10d":
            continue
        packet = getattr(torch.ops.c10d, name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            work_at = _work_index(op._schema)
            group_at = _group_index(op._schema)
            if group_at is None:  # not a collective (c10d::check_for_nan)
                continue
            # someone else's autograd kernel is never replaced
            if torch._C._dispatch_has_kernel_for_dispatch_key(qualified, "Autograd"):
                continue
            spelled = name if overload == "default" else f"{name}.{overload}"
            library.impl(spelled, _kernel(op, work_at, group_at), "Autograd")
            hooked.append(qualified)
    return library, tuple(hooked)


def _group_index(schema: Any) -> int | None:
    for i, argument in enumerate(schema.arguments):
        if "ProcessGroup" in str(argument.type):
            return i
    return None


def _work_index(schema: Any) -> int | None:
    """Where the ``Work`` is in the operator's result: -1 for the result itself, else its
    position in the result tuple; None when it returns none."""
    returns = schema.returns
    for i, value in enumerate(returns):
        if "Work" in str(value.type):
            return -1 if len(returns) == 1 else i
    return None


def _kernel(op: Any, work_at: int | None, group_at: int) -> Callable[..., Any]:
    import torch

    below = torch._C._AutoDispatchBelowAutograd

    def kernel(*args: Any, **kwargs: Any) -> Any:
        listeners = _listeners
        if not listeners:
            with below():
                return op(*args, **kwargs)
        finishes, device = _started(listeners, args, group_at)
        try:
            with below():
                result = op(*args, **kwargs)
        except BaseException:
            _finish(finishes)
            raise
        _completion(listeners, result, work_at, finishes, device)
        return result

    return kernel


def _started(
    listeners: Sequence[CollectiveListener], args: Sequence[Any], group_at: int
) -> tuple[list[Callable[[], None]], bool]:
    """(the host listeners' completion callables, whether the collective runs on a device)."""
    finishes: list[Callable[[], None]] = []
    try:
        device = _on_device(args[0]) if args else False
        if device:
            _time_group(args[group_at] if group_at < len(args) else None)
            return finishes, True
        for listener in listeners:
            finish = listener.collective_started()
            if finish is not None:
                finishes.append(finish)
    except Exception as exc:
        _report(exc)
        return finishes, False
    return finishes, False


def _completion(
    listeners: Sequence[CollectiveListener],
    result: Any,
    work_at: int | None,
    finishes: list[Callable[[], None]],
    device: bool,
) -> None:
    try:
        work = _work(result, work_at)
        if device:
            if work is not None:
                for listener in listeners:
                    listener.device_collective(work)
        elif finishes:
            if work is None:
                _finish(finishes)
            else:
                work.get_future().add_done_callback(lambda _future: _finish(finishes))
    except Exception as exc:
        _finish(finishes)
        _report(exc)


def _work(result: Any, work_at: int | None) -> Any:
    """The operator's ``Work`` as a ``torch.distributed.Work`` (None: it returns none)."""
    if work_at is None:
        return None
    boxed = result if work_at == -1 else result[work_at]
    from torch._C._distributed_c10d import Work

    return boxed if isinstance(boxed, Work) else Work.unbox(boxed)


def _on_device(first: Any) -> bool:
    """Whether the collective's first tensor (the first argument, or its first element, at
    any depth of lists) lives on a device rather than the CPU."""
    while isinstance(first, (list, tuple)):
        if not first:
            return False
        first = first[0]
    device = getattr(first, "device", None)
    return device is not None and device.type not in ("cpu", "meta")


def _time_group(boxed: Any) -> None:
    """Switch on collective timing (device start and end events) in the group, once."""
    if boxed is None:
        return
    from torch._C._distributed_c10d import ProcessGroup

    group: Any = boxed if isinstance(boxed, ProcessGroup) else ProcessGroup.unbox(boxed)
    name = group.group_name
    if name not in _timed_groups:
        _timed_groups.add(name)
        group._enable_collectives_timing()


def _finish(finishes: list[Callable[[], None]]) -> None:
    for finish in finishes:
        try:
            finish()
        except Exception as exc:
            _report(exc)


def _report(exc: Exception) -> None:
    _failures.report(
        type(exc).__name__,
        "the collective hook",
        exc,
        strict=False,  # on a backend's thread nobody could catch it
        then="this collective is not timed; the collective itself ran as it would",
    )
