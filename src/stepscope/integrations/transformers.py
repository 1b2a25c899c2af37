"""``StepscopeCallback``: stepscope as an HF ``Trainer`` callback (``callbacks=[...]``).

A step per optimizer step (``on_step_end``: gradient accumulation's micro-batches stay in one
step); the model's forward is a ``forward: <Model>`` region (a forward pre-hook and hook,
added at ``on_train_begin`` and removed at ``on_train_end``); backward and the optimizer are
torch's own spans (its autograd operators and ``Optimizer.step#...``, recorded with torch's
operators, on by default), so the breakdown is the one ``stepscope run`` gives the same
program: HF's own Python around the optimizer is no optimizer time under either.  The profile
starts at the first step, so step 0 is a training step.  One trace file per window and rank.

HF calls ``on_train_end`` only when training succeeds.  When it raises, the window is closed by
``Trainer.train`` itself: the first time ``StepscopeCallback`` is built, ``train`` of
transformers' ``Trainer`` class is wrapped (once) in a ``try``/``except BaseException`` that
hands the exception to every ``StepscopeCallback`` of that trainer (``TrainingSession.fail``:
the window is saved, marked incomplete, the profile stops, the hooks go) and re-raises it
unchanged (the same object; on Python 3.11+ the wrapper's own frame is taken out of its
traceback).  This runs in the raising thread before any ``except`` of the program's own, so a
profile started there already works.  A weakref finalizer would wait until the traceback that
holds the trainer is freed (never, while the program keeps the exception), and the step hooks
never see an exception raised between them.  A trainer whose class replaces ``train`` without
calling ``Trainer.train`` is covered by the session's stop at exit only (and by the next
``on_train_begin``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import threading
from typing import Any

from stepscope.extras import require
from stepscope.integrations.session import TrainingSession, open_session
from stepscope.profiler.schedule import Schedule

__all__: list[str] = []  # StepscopeCallback: built on first use (module __getattr__)

FORWARD_KEY = "forward"
_WRAPPED = "__stepscope_closes_on_error__"
_wrap_lock = threading.Lock()


class CallbackRegions:
    """The callback's behaviour, on transformers' ``TrainerCallback``."""

    def __init__(
        self,
        output_dir: str | os.PathLike[str] | None = None,
        schedule: Schedule | None = None,
        **profile_options: Any,
    ) -> None:
        TrainingSession.check_options(schedule, profile_options, "StepscopeCallback")
        self._given_dir = output_dir
        self._schedule = schedule
        self._options = profile_options
        self.session: TrainingSession | None = None
        """The run's session (None until training begins): its ``profile`` and
        ``trace_files``."""
        self._hooks: list[Any] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Training begins: the session is made and the model's forward hooked."""
        self._end(None)  # a session an earlier run left running (its train raised unseen)
        where = self._given_dir or os.path.join(args.output_dir or os.getcwd(), "stepscope")
        self.session = session = open_session(
            where, self._schedule, self._options, who="StepscopeCallback"
        )
        model = kwargs.get("model")
        if session is not None and model is not None and not session.off_reason:
            name = f"forward: {type(model).__name__}"

            def hook() -> None:
                self._hooks.append(
                    model.register_forward_pre_hook(lambda *_: session.enter(name, FORWARD_KEY))
                )
                self._hooks.append(
                    model.register_forward_hook(
                        lambda *_: session.leave(FORWARD_KEY), always_call=True
                    )
                )

            session._guard("forward hooks", hook)

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """An optimizer step begins: the first one starts the profile."""
        if self.session is not None and not self.session.running:
            self.session.start()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """An optimizer step ended: the profile steps."""
        if self.session is not None:
            self.session.step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Training ends: the hooks go, the profile stops (the window in progress is saved)."""
        self._end(None)

    def training_raised(self, exc: BaseException) -> None:
        """``Trainer.train`` raised ``exc``: the hooks go, the window in progress is saved
        marked incomplete, the profile stops (never raises: ``exc`` goes on unchanged)."""
        self._end(exc)

    def _end(self, exc: BaseException | None) -> None:
        hooks, self._hooks = self._hooks, []
        for hook in hooks:
            with contextlib.suppress(Exception):  # a RemovableHandle: a dict pop
                hook.remove()
        if self.session is not None:
            if exc is None:
                self.session.stop()
            else:
                self.session.fail(exc)

    def summary(self) -> str:
        """The recorded window's report (Markdown) and the trace files."""
        if self.session is None:
            return (
                "StepscopeCallback: no window was recorded (training has not begun, or the "
                "session could not be set up: see the warning logged then)."
            )
        return self.session.summary()


def close_on_error(trainer_class: type) -> None:
    """Wrap ``trainer_class.train`` (once) so that an exception leaving it reaches the trainer's
    ``StepscopeCallback``s before it goes on, unchanged."""
    with _wrap_lock:
        original = trainer_class.__dict__.get("train")
        if original is None or getattr(original, _WRAPPED, False):
            return

        @functools.wraps(original)
        def train(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return original(self, *args, **kwargs)
            except BaseException as exc:
                _training_raised(self, exc)
                # the program's own traceback: this wrapper's frame taken out (a bare raise
                # adds no frame back)
                here = exc.__traceback__
                if here is not None and here.tb_frame is sys._getframe():
                    exc.__traceback__ = here.tb_next
                del here
                raise

        setattr(train, _WRAPPED, True)
        trainer_class.train = train  # type: ignore[attr-defined]


def _training_raised(trainer: Any, exc: BaseException) -> None:
    try:
        callbacks = list(trainer.callback_handler.callbacks)
    except Exception:  # a trainer that failed before its callbacks existed
        return
    for callback in callbacks:
        if isinstance(callback, CallbackRegions):
            with contextlib.suppress(Exception):  # fail() reports its own; exc goes on
                callback.training_raised(exc)


def __getattr__(name: str) -> Any:
    if name == "StepscopeCallback":
        module = require("transformers", "StepscopeCallback", "transformers")
        close_on_error(module.Trainer)
        made = globals()["StepscopeCallback"] = type(
            "StepscopeCallback",
            (CallbackRegions, module.TrainerCallback),
            {"__doc__": "stepscope as an HF Trainer callback: ``callbacks=[StepscopeCallback()]``"},
        )
        return made
    raise AttributeError(name)
