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
"""

from __future__ import annotations

import os
from typing import Any

from stepscope.extras import require
from stepscope.integrations.session import TrainingSession
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
        TrainingSession.check_options(schedule, profile_options, "StepscopeProfiler")

    def setup(self, stage: str, local_rank: int | None = None, log_dir: str | None = None) -> None:
        """Lightning's set-up (``fit`` only): traces go to ``dirpath``, else to ``stepscope/``
        under the trainer's log dir."""
        super().setup(stage, local_rank, log_dir)  # type: ignore[misc]
        if stage != "fit" or self.session is not None:
            return
        where = self._given_dir or os.path.join(log_dir or os.getcwd(), "stepscope")
        self.session = TrainingSession(
            where,
            self._schedule,
            self._options,
            who="StepscopeProfiler",
        )

    def start(self, action_name: str) -> None:
        """An action starts: the profile's first step, or a region."""
        session = self.session
        if session is None:
            return
        if not session.running and action_name.endswith(FIRST_ACTIONS):
            session.start()
        if action_name not in SPANNING_ACTIONS:
            session.enter(region_name(action_name), action_name)

    def stop(self, action_name: str) -> None:
        """An action ends: its region closes; a training batch's end is a step."""
        session = self.session
        if session is None:
            return
        session.leave(action_name)
        if action_name.rsplit(".", 1)[-1] == _OPTIMIZER_STEP:
            self._optimizer_stepped = True
        elif action_name == STEP_ACTION:
            if self._optimizer_stepped or not self._automatic_optimization():
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
        self._summary = session.summary()
        return self._summary

    def teardown(self, stage: str | None) -> None:
        """Lightning's tear-down: the profile stops (the window in progress is saved)."""
        if self.session is not None:
            self.session.stop()
        super().teardown(stage)  # type: ignore[misc]


def profiler_class(base: type) -> type:
    """``StepscopeProfiler`` on ``base`` (a Lightning ``Profiler`` class)."""
    return type(
        "StepscopeProfiler",
        (LightningRegions, base),
        {"__doc__": "stepscope as a Lightning profiler: ``Trainer(profiler=StepscopeProfiler())``"},
    )


def __getattr__(name: str) -> Any:
    if name == "StepscopeProfiler":
        module = require("lightning.pytorch.profilers", "StepscopeProfiler", "lightning")
        made = globals()["StepscopeProfiler"] = profiler_class(module.Profiler)
        return made
    raise AttributeError(name)
