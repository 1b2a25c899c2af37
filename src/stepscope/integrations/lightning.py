"""``StepscopeProfiler``: stepscope as a Lightning profiler (``Trainer(profiler=...)``).

A step per optimizer step, as the HF callback and ``step_on="optimizer"`` count them: under
automatic optimization a training batch (``run_training_batch``) ends a step when Lightning
stepped the optimizer in it, so with ``accumulate_grad_batches=k`` a step holds k batches; under
manual optimization (``automatic_optimization = False``, whose optimizer steps Lightning does
not announce) every batch ends a step.  Lightning's hooks become regions named as
Lightning names them, except the few the host breakdown must tell apart inside the optimizer
closure: ``training_step``/``validation_step`` run as ``forward: <hook>``,
``optimizer_step``/``optimizer_zero_grad`` as ``optimizer: <hook>`` (the backward hook names
itself).  The profile starts with the first training batch, so step 0 is a training step.
This module uses ``lightning``; ``stepscope.integrations.pytorch_lightning`` is the same
profiler for the ``pytorch_lightning`` package.

Lightning stops a profiler only when ``fit`` succeeds (``describe`` and ``teardown``); when
training raises, it calls its callbacks' ``on_exception`` (before any ``except`` of the
program's own).  So ``setup`` adds one callback of ours to the trainer (``on_exception``
only; its own hooks make no regions) that hands the exception to the profiler: the window is
saved, marked incomplete, and the profile stops (``TrainingSession.fail``).  The batch that
raised is not counted as a step (``run_training_batch`` ends with an exception on its way).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from stepscope.extras import require
from stepscope.integrations.session import TrainingSession, open_session
from stepscope.profiler.schedule import Schedule

__all__ = ["LightningRegions", "profiler_class", "region_name"]

STEP_ACTION = "run_training_batch"
FIRST_ACTIONS = ("train_dataloader_next", STEP_ACTION)
"""Actions whose first start starts the profile (the first batch's fetch or run)."""
SPANNING_ACTIONS = frozenset({"run_training_epoch", "run_training", "run_evaluation"})
"""Actions that stay open across many steps: no region (it would hold the step spans)."""
_FORWARD = ("training_step", "validation_step")
_OPTIMIZER = ("optimizer_step", "optimizer_zero_grad")
_OPTIMIZER_STEP = "optimizer_step"
ON_EXCEPTION = "StepscopeOnException"
"""The ``state_key`` (class name) of the callback that hands training's exception over."""


def region_name(action: str) -> str:
    """The region name of a Lightning action (its hook name after the last dot decides)."""
    hook = action.rsplit(".", 1)[-1]
    if hook in _FORWARD:
        return f"forward: {action}"
    if hook in _OPTIMIZER:
        return f"optimizer: {action}"
    return action


class LightningRegions:
    """The profiler's behaviour, on any Lightning ``Profiler`` base (``lightning`` or
    ``pytorch_lightning``)."""

    _framework = "lightning.pytorch"
    """The package of the ``Profiler`` base (its ``callbacks`` module has ``Callback``)."""

    def __init__(
        self,
        dirpath: str | os.PathLike[str] | None = None,
        filename: str | None = None,
        schedule: Schedule | None = None,
        **profile_options: Any,
    ) -> None:
        super().__init__(dirpath=dirpath, filename=filename)  # type: ignore[call-arg]
        self._schedule = schedule
        self._options = profile_options
        self.session: TrainingSession | None = None
        """The run's session (None until ``setup``): its ``profile`` and ``trace_files``."""
        self._summary = ""
        self._given_dir = dirpath
        self._optimizer_stepped = False
        """Whether Lightning stepped an optimizer in the training batch in progress."""
        self._batch_raising: BaseException | None = None
        TrainingSession.check_options(schedule, profile_options, "StepscopeProfiler")

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        """Lightning's set-up (``fit`` only): traces go to ``dirpath``, else to ``stepscope/``
        under the trainer's log dir."""
        super().setup(stage, local_rank, log_dir)  # type: ignore[misc]
        if stage != "fit":
            return
        if self.session is None:
            where = self._given_dir or os.path.join(log_dir or os.getcwd(), "stepscope")
            self.session = open_session(
                where, self._schedule, self._options, who="StepscopeProfiler"
            )
        session = self.session
        if session is not None and not session.off_reason:  # each fit's trainer
            session._guard("on_exception callback", self._hand_over_exceptions)

    def _hand_over_exceptions(self) -> None:
        """Add (once) the callback whose ``on_exception`` calls :meth:`training_raised`."""
        module = getattr(self, "_lightning_module", None)
        trainer = getattr(module, "trainer", None) if module is not None else None
        if trainer is None:
            return
        callbacks = trainer.callbacks
        if any(getattr(c, "profiler", None) is self for c in callbacks):
            return
        base = importlib.import_module(f"{self._framework}.callbacks").Callback
        callbacks.insert(0, _on_exception_class(base)(self))

    def training_raised(self, exc: BaseException) -> None:
        """Training raised ``exc`` (Lightning's ``on_exception``): the window in progress is
        saved marked incomplete and the profile stops (never raises: ``exc`` goes on)."""
        if self.session is not None:
            self.session.fail(exc)

    def start(self, action_name: str) -> None:
        """An action starts: the profile's first step, or a region."""
        session = self.session
        if session is None or action_name.startswith(f"[Callback]{ON_EXCEPTION}."):
            return
        if not session.running and action_name.endswith(FIRST_ACTIONS):
            session.start()
        if action_name == STEP_ACTION:
            self._batch_raising = sys.exc_info()[1]  # one the program handles around fit
        if action_name not in SPANNING_ACTIONS:
            session.enter(region_name(action_name), action_name)

    def stop(self, action_name: str) -> None:
        """An action ends: its region closes; a training batch's end is a step (not when
        the batch raised: Lightning stops its actions in ``finally``)."""
        session = self.session
        if session is None:
            return
        session.leave(action_name)
        if action_name.rsplit(".", 1)[-1] == _OPTIMIZER_STEP:
            self._optimizer_stepped = True
        elif action_name == STEP_ACTION:
            raising = sys.exc_info()[1]
            completed = (
                raising is None
                or raising is self._batch_raising
                or isinstance(raising, StopIteration)  # Lightning's own end of the data
            )
            if completed and (self._optimizer_stepped or not self._automatic_optimization()):
                session.step()
            self._optimizer_stepped = False

    def _automatic_optimization(self) -> bool:
        """Whether the trainer's module lets Lightning step its optimizers (False when the
        profiler does not know the module: then every batch is a step)."""
        module = getattr(self, "_lightning_module", None)  # set by Lightning's trainer
        try:
            return module is not None and bool(module.automatic_optimization)
        except ReferenceError:  # the trainer's weak proxy outlived its module
            return False

    def summary(self) -> str:
        """The recorded window's report (Markdown) and the trace files; stops the profile."""
        session = self.session
        if session is None:
            return self._summary
        session.stop()
        session._guard("summary", lambda: setattr(self, "_summary", session.summary()))
        return self._summary

    def teardown(self, stage: str | None) -> None:
        """Lightning's tear-down: the profile stops (the window in progress is saved)."""
        if self.session is not None:
            self.session.stop()
        super().teardown(stage)  # type: ignore[misc]


def _on_exception_class(base: type) -> type:
    """The callback that hands training's exception to the profiler, on Lightning's
    ``Callback`` ``base``."""

    def __init__(self: Any, profiler: LightningRegions) -> None:
        self.profiler = profiler

    def on_exception(self: Any, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.profiler.training_raised(exception)

    return type(
        ON_EXCEPTION,
        (base,),
        {
            "__init__": __init__,
            "on_exception": on_exception,
            "__doc__": "Hands training's exception to stepscope's profiler (its window closes).",
        },
    )


def profiler_class(base: type) -> type:
    """``StepscopeProfiler`` on ``base`` (a Lightning ``Profiler`` class)."""
    return type(
        "StepscopeProfiler",
        (LightningRegions, base),
        {
            "__doc__": "stepscope as a Lightning profiler: "
            "``Trainer(profiler=StepscopeProfiler())``",
            "_framework": base.__module__.split(".profilers")[0],
        },
    )


def __getattr__(name: str) -> Any:
    if name == "StepscopeProfiler":
        module = require("lightning.pytorch.profilers", "StepscopeProfiler", "lightning")
        made = globals()["StepscopeProfiler"] = profiler_class(module.Profiler)
        return made
    raise AttributeError(name)
