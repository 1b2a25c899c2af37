"""``stepscope kernels`` survives odd files and explains empty results (issue 13, point 11)."""

from __future__ import annotations

import csv
import os
import threading
from pathlib import Path

import pytest

from stepscope.cli import main

pytestmark = pytest.mark.implementation_independent

HAND = Path(__file__).parent / "fixtures" / "kernels" / "handwritten"


def rows_of(path: Path) -> list[list[str]]:
    with open(path, newline="") as fh:
        return list(csv.reader(fh))


def kernel_module(name: str) -> str:
    return (HAND / f"{name}.py.txt").read_text()


def test_a_fifo_named_py_is_skipped_not_waited_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.py").write_text(kernel_module("pointwise_add_relu"))
    os.mkfifo(tree / "pipe.py")
    out = tmp_path / "k.csv"
    result: list[int] = []
    worker = threading.Thread(
        target=lambda: result.append(main(["kernels", str(tree), "-o", str(out)])), daemon=True
    )
    worker.start()
    worker.join(30)
    if worker.is_alive():  # unblock the reader so the test run can end
        with open(tree / "pipe.py", "w"):
            pass
        pytest.fail("stepscope kernels waited on a FIFO")
    assert result == [0]
    assert [r[1] for r in rows_of(out)[1:]] == ["triton_poi_fused_add_relu_0"]
    assert f"skipped {tree / 'pipe.py'}: not a regular file" in capsys.readouterr().err


def test_a_pathological_file_is_reported_and_the_scan_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.py").write_text(kernel_module("pointwise_add_relu"))
    huge = kernel_module("pointwise_2d_transpose").replace(
        "    xnumel = ", "    junk = " + " + ".join(["x"] * 200_000) + "\n    xnumel = ", 1
    )
    (tree / "b_huge.py").write_text(huge)
    (tree / "c.py").write_text(kernel_module("reduction_softmax_looped"))
    out = tmp_path / "k.csv"
    assert main(["kernels", str(tree), "-o", str(out)]) == 1
    names = sorted(r[1] for r in rows_of(out)[1:])
    assert names == ["triton_poi_fused_add_relu_0", "triton_red_fused__softmax_0"]
    err = capsys.readouterr().err
    assert f"cannot parse {tree / 'b_huge.py'}" in err
    assert "2 kernels from 3 files, 1 failed" in err


def test_old_format_modules_report_inductors_kernel_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    old = kernel_module("pointwise_add_relu").replace(
        "def triton_poi_fused_add_relu_0(", "def triton_("
    )
    (tree / "cold.py").write_text(old)
    out = tmp_path / "k.csv"
    assert main(["kernels", str(tree), "-o", str(out)]) == 0
    assert [r[1] for r in rows_of(out)[1:]] == ["triton_poi_fused_add_relu_0"]


def test_an_empty_result_says_where_it_looked_and_what_it_expects(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "model.py").write_text("import torch\n")
    out = tmp_path / "k.csv"
    assert main(["kernels", str(tree), "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"no Triton kernels in 1 .py files under {tree.resolve()}" in err
    assert "@triton_heuristics" in err and "TORCHINDUCTOR_CACHE_DIR" in err
    assert len(rows_of(out)) == 1  # the header
