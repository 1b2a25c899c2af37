"""``StepscopeCallback`` in a real HF ``Trainer`` (with accelerate) with gradient accumulation.

A tiny model trains six optimizer steps of two micro-batches each on the CPU; the test reads
the written trace and checks that exactly the scheduled optimizer steps were recorded, each
holding both micro-batches' forwards, and that the report's forward share per step agrees
(within 3 points) with the split the test computes itself from the forward regions' spans.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope.analysis.analyze import analyze
from stepscope.trace.chrome_reader import read_chrome_trace
from tests.integration_helpers import region_shares, step_spans
from tests.step_split import step_split

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")


class Tiny(torch.nn.Module):  # type: ignore[misc,name-defined]
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1)
        )

    def forward(self, x: Any, labels: Any) -> dict[str, Any]:
        time.sleep(0.003)  # a forward long enough to measure on a busy machine
        return {"loss": (self.net(x).squeeze(-1) - labels).pow(2).mean()}


def test_the_callback_records_the_scheduled_optimizer_steps(tmp_path: Path) -> None:
    from stepscope.integrations.transformers import StepscopeCallback

    callback = StepscopeCallback(
        output_dir=tmp_path / "traces",
        schedule=stepscope.schedule(wait=1, warmup=1, active=3, repeat=1),
    )
    data = [{"x": torch.randn(64), "labels": torch.randn(())} for _ in range(64)]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=6,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    model = Tiny()
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train()
    files = sorted((tmp_path / "traces").iterdir())
    assert len(files) == 1  # one window, one rank
    trace = read_chrome_trace(files[0])
    recorded = step_spans(trace)
    assert [s[0] for s in recorded] == [2, 3, 4]
    names, starts = trace.spans["name"], trace.spans["start_ns"]
    for _, lo, hi, _ in recorded:  # gradient accumulation: both micro-batches in the step
        forwards = [
            i
            for i in range(len(trace.spans))
            if trace.strings[names[i]] == "forward: Tiny" and lo <= starts[i] < hi
        ]
        assert len(forwards) == 2
    report = analyze([(files[0].name, trace)])
    forward = region_shares(trace, lambda n: n.startswith("forward: "))
    split = step_split(files[0])
    for b in report.combined.host_steps:
        assert b.step is not None
        shares = {c.name: c.pct for c in b.categories}
        assert forward[b.step] > 10
        # the model's annotated forward lies inside the step's forward passes, which the
        # independent split measures (operators and the Python between them up to backward)
        assert shares["forward"] >= forward[b.step] - 1, (b.step, shares, forward)
        assert abs(shares["forward"] - split[b.step]["forward"]) <= 3, (b.step, shares, split)
        assert shares["optimizer"] > 0 and shares["backward"] > 0
    assert not model._forward_pre_hooks and not model._forward_hooks  # removed at the end
    assert "**3 steps**" in callback.summary()
