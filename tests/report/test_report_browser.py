"""The report page in a real browser: Debian's headless Chromium (make system-deps), driven by
selenium through chromedriver. The page must load from disk with no console error and no
request of any kind, and every plot must be drawn: its SVG laid out at a real size, and its
pixels on screen holding colour (the data lines and bars; axes and text are grey)."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

from console.report.render import PLOTS


def _browser() -> tuple[str, str]:
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if chromium is None or driver is None:
        pytest.fail("Chromium and chromedriver are missing: make system-deps installs them "
                    "(apt-get install chromium chromium-driver)")
    return chromium, driver


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[webdriver.Chrome]:
    chromium, driver = _browser()
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1000", "--hide-scrollbars", "--no-first-run",
                f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = Service(executable_path=driver, log_output=str(tmp_path / "chromedriver.log"))
    drv = webdriver.Chrome(options=options, service=service)
    drv.set_page_load_timeout(120)
    try:
        yield drv
    finally:
        drv.quit()


def coloured_pixels(png: bytes) -> int:
    """Pixels that are clearly coloured (not white, grey or black): plotted data."""
    rgb = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.int16)
    return int((rgb.max(axis=2) - rgb.min(axis=2) > 60).sum())


def test_the_report_loads_in_chromium_with_no_error_and_every_plot_drawn(
        recorded: Path, tmp_path: Path, browser: webdriver.Chrome) -> None:
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "console.cli", "report", str(recorded),
                           "--to", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    page = out / "report.html"
    browser.get(page.as_uri())
    assert browser.execute_script("return document.readyState") == "complete"

    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")]
    assert errors == [], errors
    # Self-contained: the page asked for nothing (no script, style, font or image by URL).
    assert browser.execute_script(
        "return performance.getEntriesByType('resource').length") == 0

    rows = browser.find_elements(By.CSS_SELECTOR, "#summary tbody tr")
    assert len(rows) == 1 and "test-run" in rows[0].text

    for name, title, _caption, _draw in PLOTS:
        figure = browser.find_element(By.ID, f"plot-{name}")
        assert title in figure.text
        svg = figure.find_element(By.TAG_NAME, "svg")
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", svg)
        box = browser.execute_script(
            "const r = arguments[0].getBoundingClientRect(); return [r.width, r.height]", svg)
        assert box[0] > 400 and box[1] > 100, (name, box)
        # What is drawn inside the axes: paths with a real extent (lines, bars, bands).
        drawn = browser.execute_script(
            "return [...arguments[0].querySelectorAll('g[id^=line2d] path, g[id^=patch] path,"
            " g[id^=FillBetween] path')].filter(p => { const b = p.getBBox();"
            " return b.width > 0 || b.height > 0 }).length", svg)
        assert drawn > 0, name
        shot = svg.screenshot_as_png
        assert coloured_pixels(shot) > 300, f"{name}: no data drawn on screen"
