# mypy: disable-error-code="no-untyped-call,attr-defined,call-arg"
"""Training programs of every shape a step takes (issue 36's shapes matrix), one per ``argv[1]``.

argv: CELL SIDE_FILE [ACCUM] [INTEGRATION_DIR WAIT WARMUP ACTIVE]

CELL is ``loop``, ``hf``, ``lightning``, ``gan``, ``lbfgs``, ``compile``, ``bf16`` or ``ddp``;
ACCUM the micro-batches per optimizer step (``loop``, ``hf``, ``lightning``, ``ddp``); with
INTEGRATION_DIR the program records itself through the integration (the HF callback, the
Lightning profiler) with that schedule instead of being run under ``stepscope run``.

Every program runs ``ITERATIONS`` optimizer iterations and measures itself, independently of
stepscope: a :class:`Meter` counts each ``Optimizer.step()`` call, the forwards (micro-batches)
before it and whether the profiler was recording them (``torch.autograd._profiler_enabled()``
at each forward), and times the step with ``time.perf_counter()``: from the end of the previous
``Optimizer.step()`` (after every global post-hook, stepscope's step edge included) to the end
of this one's own work (a per-optimizer post-hook, which torch runs before the global ones).
At the end it writes them as JSON to SIDE_FILE (one file per rank, ``.rank<N>`` appended, for
``ddp``).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import torch

ITERATIONS = 13
BATCH = 128
"""Optimizer iterations: with ``--wait 5 --warmup 1 --active 4`` the window is steps 6-9, and
steps 2-4 and 10-12 are warm unrecorded ones for the outside A/B."""


class Meter:
    """The program's own count and clock of its optimizer steps (see the module docstring)."""

    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.forwards: list[bool] = []
        self.began = time.perf_counter()
        self.seen: set[int] = set()
        self.iterations = 0
        from torch.optim.optimizer import (
            register_optimizer_step_post_hook,
            register_optimizer_step_pre_hook,
        )

        register_optimizer_step_pre_hook(self._pre)
        register_optimizer_step_post_hook(self._after)

    def forward(self) -> None:
        """A forward pass (a micro-batch) begins."""
        self.forwards.append(bool(torch.autograd._profiler_enabled()))

    def _pre(self, opt: Any, args: Any, kwargs: Any) -> None:
        if id(opt) not in self.seen:  # its own post-hook runs before every global one
            self.seen.add(id(opt))
            opt.register_step_post_hook(self._done)

    def _done(self, opt: Any, args: Any, kwargs: Any) -> None:
        self.steps.append(
            {
                "optimizer": type(opt).__name__,
                "body_s": time.perf_counter() - self.began,
                "forwards": len(self.forwards),
                "recorded": all(self.forwards) and bool(self.forwards),
                "any_recorded": any(self.forwards),
            }
        )
        self.forwards = []

    def _after(self, opt: Any, args: Any, kwargs: Any) -> None:
        self.began = time.perf_counter()

    def write(self, path: str) -> None:
        if not self.iterations:  # a trainer's loop: one iteration per optimizer step
            self.iterations = len(self.steps)
        with open(path, "w") as fh:
            json.dump({"steps": self.steps, "iterations": self.iterations}, fh)


def _schedule(argv: list[str]) -> tuple[str | None, Any]:
    if len(argv) < 8:
        return None, None
    import stepscope

    wait, warmup, active = (int(a) for a in argv[5:8])
    return argv[4], stepscope.schedule(wait=wait, warmup=warmup, active=active, repeat=1)


def _mlp() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512), torch.nn.ReLU(),
        torch.nn.Linear(512, 1),
    )  # fmt: skip


def loop(meter: Meter, accum: int) -> None:
    """A plain loop: ``(loss / accum).backward()`` per micro-batch, then step and zero_grad."""
    model = _mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(ITERATIONS):
        for _ in range(accum):
            x, y = torch.randn(BATCH, 64), torch.randn(BATCH, 1)
            meter.forward()
            loss = torch.nn.functional.mse_loss(model(x), y) / accum
            loss.backward()
        opt.step()
        opt.zero_grad()
        meter.iterations += 1


def bf16(meter: Meter) -> None:
    """The plain loop with its forward under ``torch.autocast("cpu", dtype=torch.bfloat16)``."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(ITERATIONS):
        x, y = torch.randn(BATCH, 64), torch.randn(BATCH, 1)
        meter.forward()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = torch.nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        meter.iterations += 1


def compiled(meter: Meter) -> None:
    """A ``torch.compile``d model (inductor): compiled before the loop, so no step compiles."""
    model = torch.compile(_mlp())
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(BATCH, 64), torch.randn(BATCH, 1)
    torch.nn.functional.mse_loss(model(x), y).backward()  # compile forward and backward now
    opt.zero_grad()
    for _ in range(ITERATIONS):
        x, y = torch.randn(BATCH, 64), torch.randn(BATCH, 1)
        meter.forward()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        meter.iterations += 1


def lbfgs(meter: Meter) -> None:
    """``optimizer.step(closure)``: LBFGS evaluates the closure (forward and backward) inside."""
    model = _mlp()
    opt = torch.optim.LBFGS(model.parameters(), lr=0.1, max_iter=3)
    for _ in range(ITERATIONS):
        x, y = torch.randn(BATCH, 64), torch.randn(BATCH, 1)

        def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            opt.zero_grad()
            meter.forward()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            return loss

        opt.step(closure)
        meter.iterations += 1


def gan(meter: Meter) -> None:
    """One iteration as pytorch/examples dcgan: D on real and fake (two backwards), D's step,
    then G through D (one backward), G's step — two optimizers, two steps per iteration."""
    nz = 32
    netg = torch.nn.Sequential(
        torch.nn.Linear(nz, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64), torch.nn.Tanh()
    )
    netd = torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.LeakyReLU(0.2), torch.nn.Linear(128, 1)
    )
    opt_d = torch.optim.Adam(netd.parameters(), lr=2e-4, betas=(0.5, 0.999))
    opt_g = torch.optim.Adam(netg.parameters(), lr=2e-4, betas=(0.5, 0.999))
    criterion = torch.nn.BCEWithLogitsLoss()
    for _ in range(ITERATIONS):
        real = torch.randn(64, 64)
        netd.zero_grad()
        meter.forward()
        err_real = criterion(netd(real), torch.ones(64, 1))
        err_real.backward()
        meter.forward()
        fake = netg(torch.randn(64, nz))
        err_fake = criterion(netd(fake.detach()), torch.zeros(64, 1))
        err_fake.backward()
        opt_d.step()
        netg.zero_grad()
        meter.forward()
        err_g = criterion(netd(fake), torch.ones(64, 1))
        err_g.backward()
        opt_g.step()
        meter.iterations += 1


def hf(meter: Meter, accum: int, argv: list[str]) -> None:
    """A transformers ``Trainer`` on a tiny BERT classifier built from a config."""
    from transformers import (
        BertConfig,
        BertForSequenceClassification,
        Trainer,
        TrainerCallback,
        TrainingArguments,
    )

    config = BertConfig(
        vocab_size=128, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=32, num_labels=2,
    )  # fmt: skip
    model = BertForSequenceClassification(config)
    model.register_forward_pre_hook(lambda *_: meter.forward())
    ids = torch.randint(0, 128, (ITERATIONS * accum * 4, 24))
    data = [{"input_ids": i, "labels": int(i[0]) % 2} for i in ids]
    where, schedule = _schedule(argv)
    callbacks: list[Any] = []
    if where is not None:
        from stepscope.integrations.transformers import StepscopeCallback

        callbacks.append(StepscopeCallback(output_dir=where, schedule=schedule))

    class Count(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            meter.iterations += 1

    args = TrainingArguments(
        output_dir=os.path.join(os.path.dirname(argv[2]), "hf_out"), max_steps=ITERATIONS,
        per_device_train_batch_size=4, gradient_accumulation_steps=accum, report_to=[],
        save_strategy="no", logging_strategy="no", use_cpu=True, disable_tqdm=True,
        dataloader_num_workers=0,
    )  # fmt: skip
    Trainer(model=model, args=args, train_dataset=data, callbacks=[*callbacks, Count()]).train()


def lightning(meter: Meter, accum: int, argv: list[str]) -> None:
    """A Lightning ``fit`` of a tiny model (``accumulate_grad_batches``)."""
    import lightning as L

    class Tiny(L.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = _mlp()

        def training_step(self, batch: Any, index: int) -> Any:
            meter.forward()
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    where, schedule = _schedule(argv)
    profiler = None
    if where is not None:
        from stepscope.integrations.lightning import StepscopeProfiler

        profiler = StepscopeProfiler(dirpath=where, schedule=schedule)
    batch = 4 * BATCH  # steps long beside Lightning's own Python: less noise run to run
    n = ITERATIONS * accum * batch
    data = torch.utils.data.TensorDataset(torch.randn(n, 64), torch.randn(n, 1))
    trainer = L.Trainer(
        max_steps=ITERATIONS, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=accum,
        profiler=profiler, default_root_dir=os.path.dirname(argv[2]),
    )  # fmt: skip
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=batch))


def ddp(meter: Meter, accum: int, side: str) -> None:
    """DDP on gloo (launched by torchrun): ``no_sync`` on every micro-batch but the last."""
    import contextlib

    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = torch.nn.parallel.DistributedDataParallel(_mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(ITERATIONS):
        for micro in range(accum):
            x, y = torch.randn(BATCH, 64), torch.randn(BATCH, 1)
            quiet = model.no_sync() if micro < accum - 1 else contextlib.nullcontext()
            with quiet:
                meter.forward()
                loss = torch.nn.functional.mse_loss(model(x), y) / accum
                loss.backward()
        opt.step()
        opt.zero_grad()
        meter.iterations += 1
    meter.write(f"{side}.rank{rank}")
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str]) -> None:
    cell, side = argv[1], argv[2]
    accum = int(argv[3]) if len(argv) > 3 else 1
    torch.manual_seed(0)
    torch.set_num_threads(1)  # two cores shared with other work: no oversubscribed pools
    meter = Meter()
    if cell == "loop":
        loop(meter, accum)
    elif cell == "bf16":
        bf16(meter)
    elif cell == "compile":
        compiled(meter)
    elif cell == "lbfgs":
        lbfgs(meter)
    elif cell == "gan":
        gan(meter)
    elif cell == "hf":
        hf(meter, accum, argv)
    elif cell == "lightning":
        lightning(meter, accum, argv)
    elif cell == "ddp":
        ddp(meter, accum, side)
        return
    else:
        raise SystemExit(f"no such cell: {cell}")
    meter.write(side)
    print("finished")


if __name__ == "__main__":
    main(sys.argv)
