"""``stepscope run`` chooses the step source from what the program does and says which; a
program that crashes before its first step gets advice about that, not about --step-on
(issue 23, point 9)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from stepscope.program import find_program, first_import

pytestmark = pytest.mark.slow

PLAIN = """\
import sys
print(sum(i * i for i in range(200_000)))
print("torch loaded:", "torch" in sys.modules)
"""


def _run(tmp_path: Path, script: str, *flags: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stepscope", "run", "-o", str(tmp_path / "out"), *flags, script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        check=False,
    )


def test_a_plain_python_program_records_its_whole_run_without_torch(tmp_path: Path) -> None:
    (tmp_path / "prog.py").write_text(PLAIN)
    done = _run(tmp_path, "prog.py", "--top", "3")
    assert done.returncode == 0, done.stderr
    assert "torch loaded: False" in done.stdout, "stepscope did not import torch for it"
    assert "steps: --step-on none (prog.py imports no torch" in done.stderr
    assert "nothing recorded" not in done.stderr
    assert len(list((tmp_path / "out").glob("*.pt.trace.json"))) == 1


def test_torch_imported_by_a_module_of_the_program_steps_on_the_optimizer(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    (tmp_path / "helpers.py").write_text(
        textwrap.dedent(
            """\
            import torch

            def train(steps):
                model = torch.nn.Linear(4, 1)
                opt = torch.optim.SGD(model.parameters(), lr=0.1)
                for _ in range(steps):
                    model(torch.randn(2, 4)).sum().backward()
                    opt.step()
                    opt.zero_grad()
            """
        )
    )
    (tmp_path / "prog.py").write_text("from helpers import train\ntrain(7)\n")
    done = _run(tmp_path, "prog.py", "--top", "0")
    assert done.returncode == 0, done.stderr
    assert "steps: --step-on optimizer (helpers.py imports torch" in done.stderr
    assert "7 steps, 1 trace(s) written" in done.stderr


def test_a_crash_at_start_up_is_named_as_the_reason_nothing_was_recorded(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch")
    (tmp_path / "prog.py").write_text("import torch\nraise RuntimeError('bad config')\n")
    done = _run(tmp_path, "prog.py")
    assert done.returncode == 1
    assert "RuntimeError: bad config" in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "before its first step ended" in last, last
    assert "--step-on module:qualname" not in done.stderr


def test_first_import_follows_the_programs_own_modules_and_packages(tmp_path: Path) -> None:
    package = tmp_path / "app"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text("from . import loop\nloop.run()\n")
    (package / "loop.py").write_text("def run():\n    from .model import build\n")
    (package / "model.py").write_text("def build():\n    import lightning.pytorch as pl\n")
    (tmp_path / "other.py").write_text("import json\n")
    sys.path.insert(0, str(tmp_path))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        program = find_program("app", [])
        found = first_import(program, ("torch", "lightning"))
        assert found is not None
        assert found[0] == "lightning" and Path(found[1]).name == "model.py"
        assert first_import(find_program(None, [str(tmp_path / "other.py")]), ("torch",)) is None
    finally:
        os.chdir(cwd)
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m == "app" or m.startswith("app.")]:
            del sys.modules[name]
