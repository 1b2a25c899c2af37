"""``StepscopeProfiler`` in a real Lightning ``Trainer`` (``lightning`` and ``pytorch_lightning``).

A tiny model trains a few steps on the CPU; the test reads the written trace and checks that
exactly the scheduled steps were recorded and that the report's forward and backward shares per
step agree (within 3 points) with the split the test computes itself from the regions' spans.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope.analysis.analyze import analyze
from stepscope.integrations.lightning import region_name
from stepscope.trace.chrome_reader import read_chrome_trace
from tests.integration_helpers import region_shares, step_spans
from tests.step_split import step_split

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")


def _module_class(pl: Any) -> Any:
    class Tiny(pl.LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)
            )

        def training_step(self, batch: Any, index: int) -> Any:
            time.sleep(0.004)  # a forward long enough to measure on a busy machine
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    return Tiny


def _fit(
    package: str, profiler_module: str, tmp_path: Path, accumulate: int = 1
) -> tuple[Any, list[Path]]:
    pl = pytest.importorskip(package)
    profiler_class = importlib.import_module(profiler_module).StepscopeProfiler
    profiler = profiler_class(
        dirpath=tmp_path / "traces",
        schedule=stepscope.schedule(wait=1, warmup=1, active=3, repeat=1),
    )
    data = torch.utils.data.TensorDataset(torch.randn(64, 64))
    trainer = pl.Trainer(
        max_steps=7,
        accumulate_grad_batches=accumulate,
        profiler=profiler,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        default_root_dir=tmp_path,
    )
    trainer.fit(_module_class(pl)(), torch.utils.data.DataLoader(data, batch_size=8))
    return profiler, sorted((tmp_path / "traces").iterdir())


def test_lightning_records_the_scheduled_steps_with_forward_and_backward_right(
    tmp_path: Path,
) -> None:
    profiler, files = _fit("lightning", "stepscope.integrations.lightning", tmp_path)
    assert len(files) == 1  # one window, one rank
    trace = read_chrome_trace(files[0])
    assert [s[0] for s in step_spans(trace)] == [2, 3, 4]
    report = analyze([(files[0].name, trace)])
    forward = region_shares(trace, lambda n: n.startswith("forward: "))
    split = step_split(files[0])
    for b in report.combined.host_steps:
        assert b.step is not None
        shares = {c.name: c.pct for c in b.categories}
        assert forward[b.step] > 10  # the regions are there and not empty
        # training_step's region lies inside the step's forward pass, which the independent
        # split measures (with the hooks Lightning runs between the loss and backward)
        assert shares["forward"] >= forward[b.step] - 1, (b.step, shares, forward)
        for category in ("forward", "backward"):
            assert abs(shares[category] - split[b.step][category]) <= 3, (b.step, shares, split)
        assert shares["optimizer"] > 0
    summary = profiler.summary()
    assert "**3 steps**" in summary and str(files[0]) in summary


def test_pytorch_lightning_records_the_scheduled_steps(tmp_path: Path) -> None:
    _, files = _fit("pytorch_lightning", "stepscope.integrations.pytorch_lightning", tmp_path)
    assert len(files) == 1
    assert [s[0] for s in step_spans(read_chrome_trace(files[0]))] == [2, 3, 4]


def test_region_names_tell_the_closure_apart() -> None:
    assert region_name("[Strategy]SingleDeviceStrategy.training_step").startswith("forward: ")
    assert region_name("[LightningModule]M.optimizer_step").startswith("optimizer: ")
    assert region_name("[Strategy]SingleDeviceStrategy.backward").endswith(".backward")


def test_a_wrong_option_is_an_error_where_it_is_written() -> None:
    pytest.importorskip("lightning")
    from stepscope.integrations.lightning import StepscopeProfiler

    with pytest.raises(ValueError, match="leave out on_trace_ready"):
        StepscopeProfiler(on_trace_ready=print)
    with pytest.raises(TypeError):
        StepscopeProfiler(no_such_option=1)


def test_a_step_is_an_optimizer_step_under_gradient_accumulation(tmp_path: Path) -> None:
    # issue 36, point 2: Lightning's profiler counted a batch and the HF callback an optimizer
    # step, so under accumulation their step times differed by the accumulation factor
    _, files = _fit("lightning", "stepscope.integrations.lightning", tmp_path, accumulate=2)
    trace = read_chrome_trace(files[0])
    steps = step_spans(trace)
    assert [s[0] for s in steps] == [2, 3, 4]
    forwards = [
        (span.start_ns, span.end_ns)
        for span in trace.iter_spans()
        if span.name.startswith("forward: ") and span.name.endswith("training_step")
    ]
    for number, start, end, *_ in steps:
        inside = [f for f in forwards if start <= f[0] and f[1] <= end]
        assert len(inside) == 2, (number, inside)  # two micro-batches, one optimizer step
    report = analyze([(files[0].name, trace)])
    split = step_split(files[0])
    for b in report.combined.host_steps:
        assert b.step is not None
        shares = {c.name: c.pct for c in b.categories}
        assert abs(shares["forward"] - split[b.step]["forward"]) <= 3, (b.step, shares, split)
