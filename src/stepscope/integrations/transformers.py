"""``StepscopeCallback``: stepscope as an HF ``Trainer`` callback (``callbacks=[...]``).

A step per optimizer step (``on_step_end``: gradient accumulation's micro-batches stay in one
step); the model's forward is a ``forward: <Model>`` region (a forward pre-hook and hook,
added at ``on_train_begin`` and removed at ``on_train_end``), the optimizer's step an
``optimizer: step`` region (``on_pre_optimizer_step`` to ``on_optimizer_step``); backward is
torch's own autograd operators (recorded with torch's operators, on by default).  The profile
starts at the first step, so step 0 is a training step.  One trace file per window and rank.
"""

from __future__ import annotations

import os
from typing import Any

from stepscope.extras import require
from stepscope.integrations.session import TrainingSession
from stepscope.profiler.schedule import Schedule

__all__: list[str] = []  # StepscopeCallback: built on first use (module __getattr__)

FORWARD_KEY = "forward"
OPTIMIZER_KEY = "optimizer"


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
        where = self._given_dir or os.path.join(args.output_dir or os.getcwd(), "stepscope")
        self.session = TrainingSession(
            where, self._schedule, self._options, who="StepscopeCallback"
        )
        model = kwargs.get("model")
        if model is not None:
            session, name = self.session, f"forward: {type(model).__name__}"
            self._hooks = [
                model.register_forward_pre_hook(lambda *_: session.enter(name, FORWARD_KEY)),
                model.register_forward_hook(
                    lambda *_: session.leave(FORWARD_KEY), always_call=True
                ),
            ]

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """An optimizer step begins: the first one starts the profile."""
        if self.session is not None and not self.session.running:
            self.session.start()

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The optimizer's step region opens."""
        if self.session is not None:
            self.session.enter("optimizer: step", OPTIMIZER_KEY)

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """The optimizer's step region closes."""
        if self.session is not None:
            self.session.leave(OPTIMIZER_KEY)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """An optimizer step ended: the profile steps."""
        if self.session is not None:
            self.session.step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Training ends: the hooks go, the profile stops (the window in progress is saved)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self.session is not None:
            self.session.stop()

    def summary(self) -> str:
        """The recorded window's report (Markdown) and the trace files."""
        if self.session is None:
            return "StepscopeCallback: training has not begun."
        return self.session.summary()


def __getattr__(name: str) -> Any:
    if name == "StepscopeCallback":
        module = require("transformers", "StepscopeCallback", "transformers")
        made = globals()["StepscopeCallback"] = type(
            "StepscopeCallback",
            (CallbackRegions, module.TrainerCallback),
            {"__doc__": "stepscope as an HF Trainer callback: ``callbacks=[StepscopeCallback()]``"},
        )
        return made
    raise AttributeError(name)
