"""``stepscope run`` with its defaults on the trainers people use: a plain torch loop, a
transformers ``Trainer`` (a tiny GPT-2 built from a config, random tokens, no downloads) and a
Lightning ``Trainer.fit``.  Forward / backward / optimizer shares per step hold within 3 points
of a split computed independently from the trace's spans (``tests/step_split.py``), and
``--memory`` runs all three to their end (issue 23, points 1 and 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.step_split import step_outline, step_split

pytestmark = pytest.mark.slow

pytest.importorskip("torch")

PROGRAMS = {
    "torch_loop": """\
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for _ in range(7):
    x, y = torch.randn(16, 32), torch.randn(16, 1)
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad()
print("finished")
""",
    "hf_trainer": """\
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

torch.manual_seed(0)
config = GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2)
model = GPT2LMHeadModel(config)
data = [{"input_ids": ids, "labels": ids} for ids in torch.randint(0, 64, (64, 16))]
args = TrainingArguments(
    output_dir=sys.argv[1], max_steps=7, per_device_train_batch_size=4, report_to=[],
    save_strategy="no", logging_strategy="no", use_cpu=True, disable_tqdm=True,
)
Trainer(model=model, args=args, train_dataset=data).train()
print("finished")
""",
    "lightning_fit": """\
import lightning as L
import torch

class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        layers = (torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
        self.net = torch.nn.Sequential(*layers)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(128, 32), torch.randn(128, 1))
trainer = L.Trainer(max_steps=7, accelerator="cpu", logger=False, enable_checkpointing=False,
                    enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=16))
print("finished")
""",
}
NEEDS = {"torch_loop": "torch", "hf_trainer": "transformers", "lightning_fit": "lightning"}
CATEGORIES = ("forward", "backward", "optimizer")


def _run(
    tmp_path: Path, program: str, *flags: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    script = tmp_path / f"{program}.py"
    script.write_text(PROGRAMS[program])
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "stepscope",
            "run",
            "-o",
            str(out),
            "--top",
            "0",
            *flags,
            str(script),
            str(tmp_path / "trainer_out"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env={**os.environ, "PYTHONWARNINGS": "ignore", "TOKENIZERS_PARALLELISM": "false"},
        check=False,
    )
    return done, out


@pytest.mark.parametrize("memory", [False, True], ids=["defaults", "memory"])
@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_trainer_breakdown_matches_an_independent_split(
    tmp_path: Path, program: str, memory: bool
) -> None:
    pytest.importorskip(NEEDS[program])
    done, out = _run(tmp_path, program, *(["--memory"] if memory else []))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "finished" in done.stdout, "the program ran to its end"
    assert "7 steps" in done.stderr, done.stderr[-2000:]
    (trace,) = sorted(out.glob("*.pt.trace.json"))
    report = tmp_path / "report.json"
    shown = subprocess.run(
        [sys.executable, "-m", "stepscope", "report", "--json", str(report), str(trace)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    (analysed,) = json.loads(report.read_text())["files"]
    expected = step_split(trace)
    steps = analysed["host_steps"]
    recorded = [2, 3, 4, 5, 6] if memory else [2, 3, 4]  # --memory records 5: the leak hint's
    assert [s["step"] for s in steps] == recorded
    for step in steps:
        shares = {c["name"]: c["pct"] for c in step["categories"]}
        for category in CATEGORIES:
            assert shares[category] == pytest.approx(expected[step["step"]][category], abs=3.0), (
                step["step"],
                category,
                shares,
                expected[step["step"]],
                step_outline(trace, step["step"]),
            )
    if memory:
        assert [row["step"] for row in analysed["memory"]["steps"]] == recorded
