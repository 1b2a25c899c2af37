"""The wrappers ``logged`` puts around functions, coroutines, generators and async generators.

Every wrapper first reads two flags: the logger's cached ``isEnabledFor`` answer and the
annotations' recording flag.  When both say no, it calls straight through.

Forwarding ``*args, **kwargs`` costs more than the flags (a call with two keyword arguments
pays ~150 ns for the dict alone), so plain Python functions get a wrapper generated with the
function's own parameters that forwards them by name; anything else (builtins, callable
objects, functions with a ``__signature__``) gets the generic ``*args, **kwargs`` wrapper.
"""

from __future__ import annotations

import functools
import inspect
import linecache
from collections.abc import AsyncGenerator, Callable, Generator
from typing import Any

from stepscope.events.call import Call, Spec, recording
from stepscope.events.context import CURRENT

__all__ = ["wrap"]

SlowPath = Callable[[tuple[Any, ...], dict[str, Any]], Any]


def wrap(fn: Callable[..., Any], spec: Spec) -> Callable[..., Any]:
    """The right wrapper for ``fn``, with ``fn``'s name, docstring and ``__wrapped__``."""
    if inspect.isasyncgenfunction(fn):
        wrapper = _async_generator_wrapper(fn, spec)
    elif inspect.iscoroutinefunction(fn):
        wrapper = _async_wrapper(fn, spec)
    elif inspect.isgeneratorfunction(fn):
        wrapper = _generator_wrapper(fn, spec)
    else:
        slow = _slow_path(fn, spec)
        wrapper = _generated_wrapper(fn, spec, slow) or _generic_wrapper(fn, spec, slow)
    return functools.wraps(fn)(wrapper)


def _slow_path(fn: Callable[..., Any], spec: Spec) -> SlowPath:
    begin = spec.begin
    late = spec.late_exception
    log_exceptions = spec.log_exceptions

    def slow(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call = begin(args, kwargs)
        if call is None:
            if not log_exceptions:
                return fn(*args, **kwargs)
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:
                late(args, kwargs, exc)
                raise
        try:
            result = fn(*args, **kwargs)
        except BaseException as exc:
            call.fail(exc)
            raise
        call.finish()
        return result

    return slow


def _generic_wrapper(fn: Callable[..., Any], spec: Spec, slow: SlowPath) -> Callable[..., Any]:
    enabled = spec.enabled
    logger = spec.logger
    level = spec.level
    late = spec.late_exception
    log_exceptions = spec.log_exceptions

    def logged_call(*args: Any, **kwargs: Any) -> Any:
        if (enabled(level) is not False and not logger.disabled) or recording():
            return slow(args, kwargs)
        if not log_exceptions:
            return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:
            late(args, kwargs, exc)
            raise

    return logged_call


_TEMPLATE = """\
def _ss_make(
    _ss_fn, _ss_slow, _ss_late, _ss_enabled, _ss_level, _ss_logger, _ss_recording, {defaults}
):
    def logged_call({params}):
        if (_ss_enabled(_ss_level) is not False and not _ss_logger.disabled) or _ss_recording():
            return _ss_slow({pos}, {kw})
{fast}
    return logged_call
"""
_FAST = "        return _ss_fn({forward})\n"
_FAST_LOGGING_EXCEPTIONS = """\
        try:
            return _ss_fn({forward})
        except BaseException as _ss_exc:
            _ss_late({pos}, {kw}, _ss_exc)
            raise
"""

_generated = 0


def _generated_wrapper(
    fn: Callable[..., Any], spec: Spec, slow: SlowPath
) -> Callable[..., Any] | None:
    """A wrapper with ``fn``'s parameters (forwarded by name), or None where that is unsafe."""
    global _generated
    if not inspect.isfunction(fn) or hasattr(fn, "__signature__"):
        return None
    try:
        params = list(inspect.signature(fn, follow_wrapped=False).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.name.startswith("_ss_") or p.name == "BaseException" for p in params):
        return None
    kind = inspect.Parameter
    head: list[str] = []
    pos: list[str] = []
    kw: list[str] = []
    forward: list[str] = []
    defaults: list[Any] = []
    saw_positional_only = saw_star = False

    def declare(p: inspect.Parameter, text: str) -> None:
        if p.default is not p.empty:
            text += f"=_ss_d{len(defaults)}"
            defaults.append(p.default)
        head.append(text)

    for p in params:
        if p.kind is not kind.POSITIONAL_ONLY and saw_positional_only:
            head.append("/")
            saw_positional_only = False
        if p.kind in (kind.POSITIONAL_ONLY, kind.POSITIONAL_OR_KEYWORD):
            saw_positional_only = p.kind is kind.POSITIONAL_ONLY
            declare(p, p.name)
            pos.append(p.name)
            forward.append(p.name)
        elif p.kind is kind.VAR_POSITIONAL:
            saw_star = True
            head.append(f"*{p.name}")
            pos.append(f"*{p.name}")
            forward.append(f"*{p.name}")
        elif p.kind is kind.KEYWORD_ONLY:
            if not saw_star:
                head.append("*")
                saw_star = True
            declare(p, p.name)
            kw.append(f"{p.name!r}: {p.name}")
            forward.append(f"{p.name}={p.name}")
        else:
            head.append(f"**{p.name}")
            kw.append(f"**{p.name}")
            forward.append(f"**{p.name}")
    if saw_positional_only:
        head.append("/")
    pos_expr = f"({', '.join(pos)},)" if pos else "()"
    kw_expr = "{" + ", ".join(kw) + "}"
    fast = _FAST_LOGGING_EXCEPTIONS if spec.log_exceptions else _FAST
    source = _TEMPLATE.format(
        defaults=", ".join(f"_ss_d{i}" for i in range(len(defaults))) or "_ss_unused=None",
        params=", ".join(head),
        pos=pos_expr,
        kw=kw_expr,
        fast=fast.format(forward=", ".join(forward), pos=pos_expr, kw=kw_expr),
    )
    _generated += 1
    filename = f"<stepscope.events wrapper {_generated} of {spec.name}>"
    namespace: dict[str, Any] = {}
    exec(
        compile(source, filename, "exec"), namespace
    )  # the source is built above from the signature
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    make = namespace["_ss_make"]
    wrapper: Callable[..., Any] = make(
        fn,
        slow,
        spec.late_exception,
        spec.enabled,
        spec.level,
        spec.logger,
        recording,
        *defaults,
    )
    return wrapper


def _async_wrapper(fn: Callable[..., Any], spec: Spec) -> Callable[..., Any]:
    wanted, begin, late, log_exceptions = spec.hooks()

    async def logged_coroutine(*args: Any, **kwargs: Any) -> Any:
        if wanted():
            call = begin(args, kwargs)
            if call is not None:
                try:
                    result = await fn(*args, **kwargs)
                except BaseException as exc:
                    call.fail(exc)
                    raise
                call.finish()
                return result
        if not log_exceptions:
            return await fn(*args, **kwargs)
        try:
            return await fn(*args, **kwargs)
        except BaseException as exc:
            late(args, kwargs, exc)
            raise

    return logged_coroutine


def _generator_wrapper(fn: Callable[..., Any], spec: Spec) -> Callable[..., Any]:
    wanted, begin, late, log_exceptions = spec.hooks()

    def logged_generator(*args: Any, **kwargs: Any) -> Generator[Any, Any, Any]:
        gen = fn(*args, **kwargs)
        if wanted():
            call = begin(args, kwargs, activate=False)
            if call is not None:
                return (yield from _drive(gen, call))
        if not log_exceptions:
            return (yield from gen)
        try:
            return (yield from gen)
        except GeneratorExit:
            raise
        except BaseException as exc:
            late(args, kwargs, exc)
            raise

    return logged_generator


def _drive(gen: Generator[Any, Any, Any], call: Call) -> Generator[Any, Any, Any]:
    """Run ``gen`` with ``call`` current only while its body runs; events when it ends."""
    sent: Any = None
    thrown: BaseException | None = None
    while True:
        token = CURRENT.set(call)
        try:
            if thrown is None:
                item = gen.send(sent)
            else:
                exc, thrown = thrown, None
                item = gen.throw(exc)
        except StopIteration as stop:
            call.finish()
            return stop.value
        except BaseException as exc:
            call.fail(exc)
            raise
        finally:
            CURRENT.reset(token)
        try:
            sent = yield item
        except GeneratorExit:
            token = CURRENT.set(call)
            try:
                gen.close()
            except BaseException as exc:
                call.fail(exc)
                raise
            finally:
                CURRENT.reset(token)
            call.finish("closed")
            raise
        except BaseException as exc:
            thrown = exc


def _async_generator_wrapper(fn: Callable[..., Any], spec: Spec) -> Callable[..., Any]:
    wanted, begin, late, log_exceptions = spec.hooks()

    async def logged_async_generator(*args: Any, **kwargs: Any) -> AsyncGenerator[Any, Any]:
        agen = fn(*args, **kwargs)
        call = begin(args, kwargs, activate=False) if wanted() else None
        sent: Any = None
        thrown: BaseException | None = None
        while True:
            token = CURRENT.set(call) if call is not None else None
            try:
                if thrown is None:
                    item = await agen.asend(sent)
                else:
                    exc, thrown = thrown, None
                    item = await agen.athrow(exc)
            except StopAsyncIteration:
                if call is not None:
                    call.finish()
                return
            except BaseException as exc:
                if call is not None:
                    call.fail(exc)
                elif log_exceptions:
                    late(args, kwargs, exc)
                raise
            finally:
                if token is not None:
                    CURRENT.reset(token)
            try:
                sent = yield item
            except GeneratorExit:
                try:
                    await agen.aclose()
                except BaseException as exc:
                    if call is not None:
                        call.fail(exc)
                    raise
                if call is not None:
                    call.finish("closed")
                raise
            except BaseException as exc:
                thrown = exc

    return logged_async_generator
