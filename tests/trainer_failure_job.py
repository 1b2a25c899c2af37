"""A trainer whose training raises in the middle of stepscope's window, run by
test_trainer_failures in a subprocess.

argv: FRAMEWORK OUT MODE PROFILED
- FRAMEWORK: ``transformers`` (HF ``Trainer`` with ``StepscopeCallback``), ``lightning`` or
  ``pytorch_lightning`` (``Trainer(profiler=StepscopeProfiler())``);
- MODE: ``catch`` (the program catches its exception, then runs a ``stepscope.profile`` of its
  own and prints what it recorded) or ``raise`` (the exception ends the program);
- PROFILED: ``1`` with stepscope's integration, ``0`` without (the same program's own
  behaviour, to compare with).

The model's forward raises ``Boom`` in the 4th training step (step 3): the window (steps 1-10)
is then open.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

import stepscope

RAISE_AT = 3
"""The training step (0-based) whose forward raises."""


class Boom(RuntimeError):
    """The program's own failure."""


def schedule() -> Any:
    return stepscope.schedule(wait=0, warmup=1, active=10, repeat=1)


def train_transformers(out: Path, profiled: bool) -> None:
    import transformers

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)
            self.calls = 0

        def forward(self, x: Any, labels: Any) -> dict[str, Any]:
            if self.calls == RAISE_AT:
                raise Boom(f"forward of step {RAISE_AT} failed")
            self.calls += 1
            return {"loss": (self.net(x).squeeze(-1) - labels).pow(2).mean()}

    callbacks = []
    if profiled:
        from stepscope.integrations.transformers import StepscopeCallback

        callbacks.append(StepscopeCallback(output_dir=out / "traces", schedule=schedule()))
    data = [{"x": torch.randn(4), "labels": torch.randn(())} for _ in range(32)]
    args = transformers.TrainingArguments(
        output_dir=str(out / "hf"),
        max_steps=8,
        per_device_train_batch_size=2,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    trainer = transformers.Trainer(model=Tiny(), args=args, train_dataset=data, callbacks=callbacks)
    trainer.train()


def train_lightning(package: str, out: Path, profiled: bool) -> None:
    import importlib

    pl = importlib.import_module(package)

    class Tiny(pl.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, index: int) -> Any:
            if index == RAISE_AT:
                raise Boom(f"training_step {RAISE_AT} failed")
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    profiler = None
    if profiled:
        module = importlib.import_module(f"stepscope.integrations.{package}")
        profiler = module.StepscopeProfiler(dirpath=out / "traces", schedule=schedule())
    trainer = pl.Trainer(
        max_steps=8,
        profiler=profiler,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        default_root_dir=out,
    )
    data = torch.utils.data.TensorDataset(torch.randn(32, 4))
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=2))


def main() -> None:
    framework, out, mode, profiled = sys.argv[1], Path(sys.argv[2]), sys.argv[3], sys.argv[4]

    def train() -> None:
        if framework == "transformers":
            train_transformers(out, profiled == "1")
        else:
            train_lightning(framework, out, profiled == "1")

    if mode == "raise":
        train()
        return
    try:
        train()
    except Boom as exc:
        print(f"the program caught: {exc}", flush=True)
    # a profile of the program's own, in the same process, after the failed training
    with stepscope.profile() as prof:
        torch.ones(8).sum()
    names = {prof.trace().strings[n] for n in prof.trace().spans["name"]}
    print(f"own profile recorded aten::sum: {'aten::sum' in names}", flush=True)


if __name__ == "__main__":
    main()
