"""Run every benchmark in bench/ (or those named) and write bench/RESULTS.md.

Usage: python bench/run.py [--quick] [NAME ...]   (NAME matches bench_NAME.py)
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import platform
import sys
import traceback
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from harness import Report  # noqa: E402

PACKAGES = [
    "stepscope",
    "torch",
    "viztracer",
    "pyinstrument",
    "yappi",
    "py-spy",
    "prometheus_client",
    "opentelemetry-sdk",
    "HolisticTraceAnalysis",
    "orjson",
]


def machine_line() -> str:
    """One line describing the machine."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{platform.node()} · {cpu} · {os.cpu_count()} cores · "
        f"Python {platform.python_version()} · {platform.system()} {platform.release()}"
    )


def versions() -> str:
    """Installed versions of stepscope and its peers."""
    found = []
    for name in PACKAGES:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def main() -> int:
    """Run the selected benchmarks and write RESULTS.md."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (smoke run)")
    parser.add_argument("names", nargs="*")
    opts = parser.parse_args()
    files = sorted(HERE.glob("bench_*.py"))
    if opts.names:
        files = [f for f in files if f.stem.removeprefix("bench_") in opts.names]
    reports: list[Report] = []
    failures = []
    for path in files:
        name = path.stem.removeprefix("bench_")
        print(f"== {name}", flush=True)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        report = Report(name, quick=opts.quick)
        try:
            spec.loader.exec_module(module)
            module.run(report)
        except Exception:
            traceback.print_exc()
            failures.append(name)
        reports.append(report)
    write_results(reports, failures)
    return 1 if failures else 0


def section(report: Report, failed: bool) -> str:
    """The RESULTS.md section of one benchmark."""
    out = [
        f"## {report.bench}",
        "",
        f"_run: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M UTC}, "
        f"{'quick' if report.quick else 'full'}_",
        "",
    ]
    if report.results:
        out.append("| case | subject | median | unit | spread |")
        out.append("|---|---|---:|---|---:|")
        for r in report.results:
            out.append(f"| {r.case} | {r.subject} | {r.median:.4g} | {r.unit} | {r.spread:.1%} |")
        out.append("")
    for line in report.lines:
        out.append(f"- {line}")
    for t in report.targets:
        state = "met" if t.met else "**not met**"
        out.append(f"- target: {t.description}: {t.value:.4g} (limit {t.limit:.4g}) — {state}")
    if failed:
        out.append("- **the benchmark failed; see the run's output**")
    out.append("")
    return "\n".join(out)


def write_results(reports: list[Report], failures: list[str]) -> None:
    """Update each benchmark's section (bench/results/NAME.md) and rebuild bench/RESULTS.md."""
    sections = HERE / "results"
    sections.mkdir(exist_ok=True)
    for report in reports:
        (sections / f"{report.bench}.md").write_text(section(report, report.bench in failures))
    out = [
        "# Benchmark results",
        "",
        f"- machine: {machine_line()}",
        f"- versions: {versions()}",
        "",
        "Medians over repeated runs in one process; spread = (max - min) / median. "
        "Peers run in the same session as stepscope, so ratios are comparable even on a noisy "
        "shared machine; absolute numbers are not. Each section says when it was last run.",
        "",
    ]
    for path in sorted(sections.glob("*.md")):
        out.append(path.read_text())
    (HERE / "RESULTS.md").write_text("\n".join(out))


if __name__ == "__main__":
    sys.exit(main())
