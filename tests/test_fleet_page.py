"""The fleet page's tables have room between their columns (issue 36, item 7: the cells had the
browser's default 1 px padding, so the numbers of neighbouring columns ran together).  Checked
in headless Chromium: the gap between the text of neighbouring cells, and numbers aligned
right."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from stepscope.report.fleet import write_fleet_html
from stepscope.steptables.fleet import fleet_report
from tests import test_report_html
from tests.test_fleet_change_point import shifted, write_tables
from tests.test_report_html import assert_clean, load

pytestmark = pytest.mark.implementation_independent

pytest.importorskip("duckdb")
browser = test_report_html.browser
"""Headless Chromium (the HTML report tests' fixture)."""

MIN_GAP_PX = 12
"""The least room between the text of two neighbouring cells of a row."""


def test_fleet_tables_have_room_between_columns(browser: Any, tmp_path: Path) -> None:
    tables = write_tables(tmp_path / "tables", shifted({27: 25.0}))
    page = tmp_path / "fleet.html"
    write_fleet_html(fleet_report(tables), page)
    assert_clean(browser, load(browser, page))
    # per table: the smallest gap between the text of neighbouring cells, over every row
    gaps: dict[str, float] = browser.execute_script(
        """const out = {};
        for (const table of document.querySelectorAll('section[id] table.fleet')) {
          let least = Infinity;
          for (const row of table.querySelectorAll('tr')) {
            const boxes = [...row.children].map(cell => {
              const r = document.createRange(); r.selectNodeContents(cell);
              return r.getBoundingClientRect();
            });
            for (let i = 1; i < boxes.length; i++)
              least = Math.min(least, boxes[i].left - boxes[i - 1].right);
          }
          out[table.closest('section').id] = least;
        }
        return out;"""
    )
    assert set(gaps) == {"slow-ranks", "worst-steps", "drift"}, gaps
    assert all(gap >= MIN_GAP_PX for gap in gaps.values()), gaps
    align = browser.execute_script(
        """const row = document.querySelector('#slow-ranks tbody tr');
        return [...row.children].map(c => [c.textContent, getComputedStyle(c).textAlign]);"""
    )
    assert align == [
        ["job", "left"],
        ["2", "right"],
        ["30", "right"],
        ["30/30", "right"],
        ["20.1", "right"],
        ["data_wait", "left"],
        ["20.1", "right"],  # the others waited for it this long a step at the collective
        ["0.0", "right"],  # and before step 30 (the blip at 27 was one step)
        ["3/3", "right"],
    ], align
