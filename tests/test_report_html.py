"""The HTML report: a self-contained page, checked as text and in a real browser.

The browser tests drive Debian's ``chromium`` through ``chromium-driver`` (Selenium, never a
downloaded driver), installed by ``scripts/install-test-services.sh``: where they are missing
the tests skip, except under ``CI=true`` where they fail.  Each page is loaded offline
(``file://``, a Content-Security-Policy that forbids every fetch) and checked through the DOM;
screenshots are written under the test's tmp dir (and copied to ``$STEPSCOPE_ARTIFACTS`` when
set).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from stepscope.analysis.analyze import analyze
from stepscope.cli import main
from stepscope.report import html as report_html
from stepscope.trace.chrome_reader import read_chrome_trace
from tests.analysis_helpers import SHARED

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_loop.py"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
HOSTILE = [
    "</script><script>window.__pwned = 1</script>",
    "<!--<script>window.__pwned = 2</script>",
    "quote \" and ' and `tick` & <b>bold</b>",
    "lone \ud800 surrogate",
    "<img src=x onerror=window.__pwned=3>",
]


def data_block(page: str) -> dict[str, Any]:
    m = re.search(r'<script type="application/json" id="stepscope-data">\n(.*?)\n</script>', page)
    assert m is not None
    data: dict[str, Any] = json.loads(m.group(1))
    return data


def hostile_trace(path: Path) -> Path:
    """A Chrome trace of three steps whose spans carry names that try to break out of HTML."""
    events: list[dict[str, Any]] = []
    t = 1_000.0
    for step in range(1, 4):
        events.append(
            {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}",
             "pid": 1, "tid": 1, "ts": t, "dur": 1_000.0}
        )  # fmt: skip
        for k, name in enumerate(HOSTILE):
            events.append(
                {"ph": "X", "cat": "user_annotation", "name": name,
                 "pid": 1, "tid": 1, "ts": t + 10 + 150 * k, "dur": 100.0 + step}
            )  # fmt: skip
        t += 1_100.0
    # ensure_ascii: the lone surrogate travels as the JSON escape \ud800
    path.write_text(json.dumps({"traceEvents": events}, ensure_ascii=True))
    return path


def run_demo(out: Path) -> Path:
    """The demo: examples/train_loop.py under ``stepscope run`` (samples and annotations)."""
    done = subprocess.run(
        [sys.executable, "-m", "stepscope", "run", "-o", str(out),
         "--step-on", "train_loop:train_step", "--sampling-rate", "500",
         "--wait", "1", "--warmup", "1", "--active", "12", "--top", "0",
         str(EXAMPLE), "20"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return out


# ---- the page as text ----------------------------------------------------------------------


def test_page_is_self_contained(tmp_path: Path) -> None:
    trace = read_chrome_trace(SHARED / "training_rank0_gpu.json.gz")
    report = analyze([("rank0", trace)], flames=True)
    page = report_html.html_document(report)
    # nothing to fetch: no src/href attributes, a CSP that forbids every load
    assert not re.search(r"<(script|link|img|iframe)[^>]*\s(src|href)=", page)
    assert "default-src 'none'" in page
    assert page.count("<script") == page.count("</script>") == len(report_html.VENDOR_SCRIPTS) + 2
    data = data_block(page)
    assert data["combined"] == json.loads(report.to_json())["combined"]
    (flame,) = [g for g in data["views"][0]["flames"] if g["kind"] == "spans"]
    root = flame["root"]
    assert root["name"] == "all" and root["value"] > 0
    # values include the children's: every node is at least the sum of its children
    stack = [root]
    while stack:
        node = stack.pop()
        kids = node.get("children", [])
        assert node["value"] >= sum(k["value"] for k in kids)
        stack += kids
    assert {k["name"] for k in root["children"]} >= {"ProfilerStep*"}


def test_hostile_names_stay_text(tmp_path: Path) -> None:
    path = hostile_trace(tmp_path / "hostile.json")
    out = tmp_path / "r.html"
    assert main(["report", str(path), "--html", str(out)]) == 0
    page = out.read_text(encoding="utf-8")  # valid UTF-8: the lone surrogate became U+FFFD
    assert "window.__pwned" not in page.split('id="stepscope-data">', 1)[0]
    block = page.split('id="stepscope-data">', 1)[1].split("</script>", 1)[0]
    assert "<" not in block and "\\u003c/script>" in block
    names = {r["name"] for r in data_block(page)["combined"]["operators"]}
    assert "</script><script>window.__pwned = 1</script>" in names
    assert any(re.fullmatch("lone \ufffd+ surrogate", n) for n in names)


def test_flame_tree_folds_small_frames() -> None:
    tree = report_html.flame_tree({"a;b": 9_999, "a;c": 1, "d": 10_000}, min_share=0.001)
    assert tree == {
        "name": "all",
        "value": 20_000,
        "children": [
            {"name": "a", "value": 10_000, "children": [{"name": "b", "value": 9_999}]},
            {"name": "d", "value": 10_000},
        ],
    }


def test_steps_option_limits_the_flame_graph(tmp_path: Path) -> None:
    path = hostile_trace(tmp_path / "t.json")
    trace = read_chrome_trace(path)
    whole = analyze([("t", trace)], flames=True).combined.flames
    one = analyze([("t", trace)], (2, 2), flames=True).combined.flames
    assert whole is not None and one is not None
    assert sum(one.spans.values()) * 3 == pytest.approx(sum(whole.spans.values()), rel=0.01)


def test_write_is_atomic(tmp_path: Path) -> None:
    trace = read_chrome_trace(hostile_trace(tmp_path / "t.json"))
    report = analyze([("a", trace), ("b", trace)], flames=True)
    out = tmp_path / "r.html"
    out.write_text("old")
    report_html.write_html(report, out)
    assert data_block(out.read_text(encoding="utf-8"))["generator"]["flames_given"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "t.json"]  # no temp file
    with pytest.raises(FileNotFoundError, match="does not exist"):
        report_html.write_html(report, tmp_path / "missing" / "r.html")


def test_vendored_assets_and_licences() -> None:
    assets = ROOT / "src" / "stepscope" / "report" / "assets"
    total = 0
    for name in (*report_html.VENDOR_SCRIPTS, *report_html.VENDOR_STYLES):
        f = assets / name
        total += f.stat().st_size
        assert (f.parent / "LICENSE").read_text().strip(), f"{name}: no licence beside it"
    assert (assets / "vendor" / "d3-array" / "LICENSE-internmap").is_file()
    assert total < 250_000  # every report carries them


# ---- in a real browser ---------------------------------------------------------------------


def _missing(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (scripts/install-test-services.sh installs it)")
    pytest.skip(f"{reason} (scripts/install-test-services.sh installs it as root with apt)")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Headless Debian Chromium through its chromedriver, offline flags, a fresh profile."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _missing("selenium is not installed (tests/requirements.txt)")
    for binary in (CHROMIUM, CHROMEDRIVER):
        if not os.access(binary, os.X_OK):
            _missing(f"{binary} is missing")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    profile = tmp_path_factory.mktemp("chromium-profile")
    for flag in (
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", "--window-size=1400,1000",
    ):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def load(driver: Any, page: Path) -> list[dict[str, Any]]:
    """Open the page offline; the console messages it logged."""
    driver.get_log("browser")  # drop what an earlier page left
    driver.get(page.resolve().as_uri())
    deadline = time.monotonic() + 20
    while driver.execute_script("return document.body.dataset.rendered") != "true":
        assert time.monotonic() < deadline, "the page never finished rendering"
        time.sleep(0.05)
    time.sleep(0.6)  # the flame graph's entry transition
    logs: list[dict[str, Any]] = driver.get_log("browser")
    return logs


def assert_clean(driver: Any, logs: list[dict[str, Any]]) -> None:
    errors = [e for e in logs if e["level"] in ("SEVERE", "WARNING")]
    assert not errors, errors
    # offline: the page loaded nothing besides itself
    assert driver.execute_script("return performance.getEntriesByType('resource').length") == 0
    assert driver.execute_script("return window.__pwned === undefined")


def inked_pixels(driver: Any, selector: str) -> int:
    """Pixels a chart's canvas has drawn (not transparent)."""
    count: int = driver.execute_script(
        """const c = document.querySelector(arguments[0] + ' canvas');
        if (!c) return -1;
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++;
        return n;""",
        selector,
    )
    return count


def flame_frames(driver: Any) -> int:
    count: int = driver.execute_script(
        """return [...document.querySelectorAll('#flame-chart svg rect')]
        .filter(r => parseFloat(r.getAttribute('width')) > 0).length;"""
    )
    return count


def screenshot(driver: Any, tmp_path: Path, name: str) -> Path:
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, min(int(height) + 150, 9000))
    time.sleep(1.0)  # charts follow the new size after 200 ms, the flame graph's transition
    shot = tmp_path / name
    assert driver.save_screenshot(str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    target = os.environ.get("STEPSCOPE_ARTIFACTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(target) / name)
    driver.set_window_size(1400, 1000)
    return shot


def column(driver: Any, table: str, index: int) -> list[str]:
    cells: list[str] = driver.execute_script(
        "return [...document.querySelectorAll(arguments[0] + ' tbody tr')]"
        ".map(r => r.children[arguments[1]].textContent);",
        table,
        index,
    )
    return cells


def number(text: str) -> float:
    return float(text.replace(",", "").lstrip("~"))


def test_demo_report_in_browser(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    traces = run_demo(tmp_path / "traces")
    page = tmp_path / "report.html"
    assert main(["report", str(traces), "--html", str(page)]) == 0
    assert_clean(browser, load(browser, page))
    assert browser.find_element(By.TAG_NAME, "h1").text.startswith("stepscope report")
    stat = browser.find_element(By.CSS_SELECTOR, "#summary .stat .v").text
    assert stat == "12"  # steps
    width = browser.execute_script("return document.querySelector('#step-chart canvas').width")
    assert inked_pixels(browser, "#step-chart") > 0.01 * width * 200
    assert inked_pixels(browser, "#host-chart") > 0.01 * width * 200
    assert browser.find_elements(By.CSS_SELECTOR, "#steps .stackbar .seg")
    assert "No device" in browser.find_element(By.ID, "device").text
    overhead = data_block(page.read_text())["combined"]["overhead"]
    said = browser.find_element(By.ID, "overhead").text
    assert said.startswith("Overhead: ") and f"{overhead['recorded_steps']} recorded" in said
    recs = browser.find_elements(By.CSS_SELECTOR, "#recommendations .rec")
    assert any("Data loading" in r.text and "threshold pct" in r.text for r in recs)
    # flame graph: samples first (a sampled plain-Python program), then the spans
    kinds = browser.find_elements(By.CSS_SELECTOR, "#flame-kind option")
    assert [k.text.split()[0] for k in kinds] == ["Python", "Host"]
    assert flame_frames(browser) > 5
    labels = browser.execute_script(
        "return [...document.querySelectorAll('#flame-chart svg g')].map(g => g.textContent)"
    )
    assert any("load_batch" in text for text in labels)
    browser.execute_script(
        "const s = document.getElementById('flame-kind'); s.value = '1';"
        "s.dispatchEvent(new Event('change'));"
    )
    time.sleep(0.5)
    labels = browser.execute_script(
        "return [...document.querySelectorAll('#flame-chart svg g')].map(g => g.textContent)"
    )
    assert any("data_loading" in text for text in labels) and flame_frames(browser) >= 4
    # sortable: Python functions by calls, descending then ascending
    header = browser.find_elements(By.CSS_SELECTOR, "#table-functions th")[1]
    header.click()
    assert header.get_attribute("aria-sort") == "descending"
    calls = [number(c) for c in column(browser, "#table-functions", 1)]
    assert calls == sorted(calls, reverse=True) and len(calls) > 2
    header.click()
    calls = [number(c) for c in column(browser, "#table-functions", 1)]
    assert calls == sorted(calls)
    name_header = browser.find_elements(By.CSS_SELECTOR, "#table-operators th")[0]
    name_header.click()
    names = column(browser, "#table-operators", 0)
    assert names == sorted(names, key=str.lower) or names == sorted(names)
    assert_clean(browser, browser.get_log("browser"))
    screenshot(browser, tmp_path, "report-demo.png")


def test_gpu_report_in_browser(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    page = tmp_path / "gpu.html"
    assert main(["report", str(SHARED / "training_rank0_gpu.json.gz"), "--html", str(page)]) == 0
    assert_clean(browser, load(browser, page))
    assert inked_pixels(browser, "#device-chart") > 1000
    device = browser.find_element(By.ID, "device").text
    assert "HTA's temporal breakdown" in device and "launch delay" in device
    assert "Overhead: not stated" in browser.find_element(By.ID, "overhead").text  # torch's
    kernels = column(browser, "#table-kernels", 0)
    assert len(kernels) == 10 and all(k and "<" not in k for k in kernels)
    assert flame_frames(browser) > 20
    # the search box highlights matching frames
    box = browser.find_element(By.ID, "flame-search")
    box.send_keys("convolution")
    time.sleep(0.3)
    assert "search" in browser.find_element(By.ID, "flame-details").text
    assert_clean(browser, browser.get_log("browser"))
    screenshot(browser, tmp_path, "report-gpu.png")


def test_directory_views_in_browser(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    runs = tmp_path / "runs"
    runs.mkdir()
    for name in ("alexnet_gpu.json.gz", "nccl_gpu.json.gz"):
        (runs / name.removesuffix(".gz")).write_bytes(gzip.decompress((SHARED / name).read_bytes()))
    page = tmp_path / "dir.html"
    assert main(["report", str(runs), "--html", str(page)]) == 0
    assert_clean(browser, load(browser, page))
    buttons = browser.find_elements(By.CSS_SELECTOR, "nav#views button")
    assert [b.text for b in buttons] == ["all files", "alexnet_gpu.json", "nccl_gpu.json"]
    all_steps = browser.find_element(By.CSS_SELECTOR, "#summary .stat .v").text
    buttons[2].click()
    time.sleep(0.6)
    assert "active" in browser.find_elements(By.CSS_SELECTOR, "nav#views button")[2].get_attribute(
        "class"
    )
    assert browser.find_element(By.CSS_SELECTOR, "#summary .stat .v").text != all_steps
    assert "COMMUNICATION" in browser.find_element(By.ID, "device").text  # NCCL kernels
    assert inked_pixels(browser, "#step-chart") > 0 and flame_frames(browser) > 5
    assert_clean(browser, browser.get_log("browser"))


def test_hostile_names_in_browser(browser: Any, tmp_path: Path) -> None:
    from selenium.webdriver.common.by import By

    page = tmp_path / "hostile.html"
    assert main(["report", str(hostile_trace(tmp_path / "h.json")), "--html", str(page)]) == 0
    assert_clean(browser, load(browser, page))
    shown = column(browser, "#table-operators", 0)
    assert set(shown) >= {HOSTILE[0], HOSTILE[1], HOSTILE[2], HOSTILE[4]}
    assert any(re.fullmatch("lone \ufffd+ surrogate", n) for n in shown)
    assert not browser.find_elements(By.CSS_SELECTOR, "#app b, #app img")
    assert browser.title == "stepscope report: h.json"
