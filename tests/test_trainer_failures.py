"""Training that raises in the middle of stepscope's window, in a real HF ``Trainer`` and a real
Lightning ``Trainer`` (in subprocesses: a profile left running crashes the interpreter at exit).

The program's exception, output and exit status are the ones it has without stepscope; the
window is saved, marked incomplete, with the step that raised cut short and the exception
named; a ``stepscope.profile`` of the program's own works after it in the same process; exit is
clean (never 139).  Each failure path runs several times: a crash 1 time in 5 is a crash.
Also: a trace directory that cannot be created leaves training running (one warning, counted;
``config.strict`` re-raises).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import stepscope
from stepscope.analysis.analyze import analyze
from stepscope.config import config
from stepscope.failures import failure_log
from stepscope.profiler.profile import active_profile
from stepscope.trace.chrome_reader import read_chrome_trace

pytestmark = [pytest.mark.slow, pytest.mark.whole_trainers]
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "tests" / "trainer_failure_job.py"
LOOPS = 5
FRAMEWORKS = {
    "transformers": "forward of step 3 failed",
    "lightning": "training_step 3 failed",
    "pytorch_lightning": "training_step 3 failed",
}


def need(framework: str) -> None:
    pytest.importorskip(framework)
    if framework == "transformers":
        pytest.importorskip("accelerate")


def job(framework: str, out: Path, mode: str, profiled: bool) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONFAULTHANDLER": "1"}
    return subprocess.run(
        [sys.executable, str(JOB), framework, str(out), mode, "1" if profiled else "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def stepscope_lines(stderr: str) -> list[str]:
    """The lines of ``stderr`` that name stepscope, paths of this checkout left out (a clone in
    a folder named ``stepscope`` puts it in every traceback and warning path)."""
    root = str(Path(__file__).resolve().parents[1])
    return [line for line in stderr.splitlines() if "stepscope" in line.replace(root, "")]


@pytest.mark.parametrize("framework", list(FRAMEWORKS))
def test_training_that_raises_mid_window_closes_it_and_a_later_profile_works(
    framework: str, tmp_path: Path
) -> None:
    need(framework)
    message = FRAMEWORKS[framework]
    for attempt in range(LOOPS if framework != "pytorch_lightning" else 2):
        out = tmp_path / str(attempt)
        done = job(framework, out, "catch", profiled=True)
        assert done.returncode == 0, (attempt, done.returncode, done.stderr[-3000:])
        assert done.stdout.splitlines() == [
            f"the program caught: {message}",
            "own profile recorded aten::sum: True",
        ], (attempt, done.stdout, done.stderr[-3000:])
        assert stepscope_lines(done.stderr) == [], done.stderr[-3000:]  # no failure of ours
        [trace_file] = sorted((out / "traces").iterdir())  # the window was saved
        trace = read_chrome_trace(trace_file)
        assert trace.metadata["stepscope_window_complete"] is False
        assert trace.metadata["stepscope_training_error"] == f"Boom: {message}"
        summary = analyze([(trace_file.name, trace)]).combined
        # step 0 is warmup; 1 and 2 ran whole; 3 raised
        assert [s.step for s in summary.steps] == [1, 2]
        assert [s.step for s in summary.cut_short] == [3]


@pytest.mark.parametrize("framework", ["transformers", "lightning"])
def test_the_programs_exception_and_exit_status_are_its_own(framework: str, tmp_path: Path) -> None:
    need(framework)
    for attempt in range(2):
        without = job(framework, tmp_path / f"plain{attempt}", "raise", profiled=False)
        profiled = job(framework, tmp_path / f"profiled{attempt}", "raise", profiled=True)
        assert without.returncode == 1, without.stderr[-3000:]
        assert profiled.returncode == without.returncode, profiled.stderr[-3000:]
        assert profiled.stdout == without.stdout
        last = profiled.stderr.strip().splitlines()[-1]
        assert last == without.stderr.strip().splitlines()[-1] == f"Boom: {FRAMEWORKS[framework]}"
        assert profiled.stderr.count("Boom: ") == 1
        assert stepscope_lines(profiled.stderr) == []
        assert len(list((tmp_path / f"profiled{attempt}" / "traces").iterdir())) == 1


# -- a trace directory that cannot be created ------------------------------------------------


def hf_train(tmp_path: Path, output_dir: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from stepscope.integrations.transformers import StepscopeCallback

    class Tiny(torch.nn.Module):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def forward(self, x: Any, labels: Any) -> dict[str, Any]:
            return {"loss": (self.net(x).squeeze(-1) - labels).pow(2).mean()}

    callback = StepscopeCallback(
        output_dir=output_dir, schedule=stepscope.schedule(wait=0, warmup=1, active=2, repeat=1)
    )
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"),
        max_steps=4,
        per_device_train_batch_size=2,
        use_cpu=True,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
    )
    data = [{"x": torch.randn(4), "labels": torch.randn(())} for _ in range(8)]
    model = Tiny()
    trainer = transformers.Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    return trainer, callback, model


def lightning_fit(tmp_path: Path, output_dir: Path) -> tuple[Any, Any]:
    pl = pytest.importorskip("lightning.pytorch")
    from stepscope.integrations.lightning import StepscopeProfiler

    class Tiny(pl.LightningModule):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, index: int) -> Any:
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    profiler = StepscopeProfiler(
        dirpath=output_dir, schedule=stepscope.schedule(wait=0, warmup=1, active=2, repeat=1)
    )
    trainer = pl.Trainer(
        max_steps=4,
        profiler=profiler,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        default_root_dir=tmp_path,
    )
    data = torch.utils.data.TensorDataset(torch.randn(8, 4))
    return trainer, lambda: trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=2))


@pytest.mark.parametrize("framework", ["transformers", "lightning"])
def test_an_uncreatable_trace_directory_leaves_training_running(
    framework: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    where = blocker / "traces"  # under a regular file: mkdir fails (ENOTDIR)
    before = failure_log("integrations").counts().get("integration_error", 0)
    caplog.set_level(logging.WARNING, logger="stepscope.failures.integrations")
    if framework == "transformers":
        trainer, callback, model = hf_train(tmp_path, where)
        trainer.train()
        assert trainer.state.global_step == 4  # training ran to its end
        assert not model._forward_pre_hooks and not model._forward_hooks
        assert "no window was recorded" in callback.summary()
    else:
        trainer, fit = lightning_fit(tmp_path, where)
        fit()
        assert trainer.global_step == 4
    assert failure_log("integrations").counts()["integration_error"] == before + 1
    warnings = [r for r in caplog.records if r.name == "stepscope.failures.integrations"]
    assert len(warnings) == 1 and "training goes on without profiling" in warnings[0].getMessage()
    assert active_profile() is None


@pytest.mark.parametrize("framework", ["transformers", "lightning"])
def test_an_uncreatable_trace_directory_is_raised_under_strict(
    framework: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    monkeypatch.setattr(config, "strict", True)
    if framework == "transformers":
        trainer, _, _ = hf_train(tmp_path, blocker / "traces")
        run = trainer.train
    else:
        _, run = lightning_fit(tmp_path, blocker / "traces")
    with pytest.raises(OSError, match="cannot create the trace directory"):
        run()
    assert active_profile() is None


def test_a_profile_that_cannot_start_is_one_warning_and_training_runs_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    trainer, callback, _ = hf_train(tmp_path, tmp_path / "traces")
    before = failure_log("integrations").counts().get("integration_error", 0)
    caplog.set_level(logging.WARNING, logger="stepscope.failures.integrations")
    with stepscope.profile() as own:  # the program's own profile holds the process's one
        trainer.train()
        assert active_profile() is own
    assert trainer.state.global_step == 4
    # counted once: the callback does not try again at every step
    assert failure_log("integrations").counts()["integration_error"] == before + 1
    [warning] = [r for r in caplog.records if r.name == "stepscope.failures.integrations"]
    assert "already running" in warning.getMessage()
    assert "no window was recorded" in callback.summary()


LEFT_RUNNING = """
import sys
import torch
import stepscope
from stepscope.integrations.session import TrainingSession

session = TrainingSession(
    sys.argv[1], stepscope.schedule(wait=0, warmup=1, active=10, repeat=1), {}, who="test"
)
session.start()
for _ in range(4):
    torch.ones(8).sum()
    session.step()
print("leaving with the window open", flush=True)
"""


def test_a_session_left_running_at_exit_is_saved_and_exit_is_clean(tmp_path: Path) -> None:
    # a trainer that ends without its framework's end event (torch's profiler, left running,
    # crashes the interpreter's teardown)
    script = tmp_path / "left.py"
    script.write_text(LEFT_RUNNING)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYTHONFAULTHANDLER": "1"}
    for attempt in range(3):
        out = tmp_path / f"traces{attempt}"
        done = subprocess.run(
            [sys.executable, str(script), str(out)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert done.returncode == 0, (attempt, done.returncode, done.stderr[-3000:])
        assert done.stdout == "leaving with the window open\n"
        [trace_file] = sorted(out.iterdir())
        summary = analyze([(trace_file.name, read_chrome_trace(trace_file))]).combined
        assert [s.step for s in summary.steps] == [1, 2, 3]
        assert [s.step for s in summary.cut_short] == [4]


def test_lightning_fit_inside_the_programs_except_block_counts_every_step(
    tmp_path: Path,
) -> None:
    # the batch's end sees sys.exc_info() of the program's own handled exception: not a batch
    # that raised
    trainer, fit = lightning_fit(tmp_path, tmp_path / "traces")
    try:
        raise KeyError("handled by the program")
    except KeyError:
        fit()
    assert trainer.global_step == 4
    [trace_file] = sorted((tmp_path / "traces").iterdir())
    summary = analyze([(trace_file.name, read_chrome_trace(trace_file))]).combined
    assert [s.step for s in summary.steps] == [1, 2] and summary.cut_short == []
