"""``report.html``: a self-contained page of a run, checked as text and in a real headless Chromium."""

from __future__ import annotations

import json
import re
import shutil

import pytest

from rlft.cli.main import main
from rlft.recipe import load_config
from rlft.stages.pipeline import run_pipeline


def quiet(*args, **kwargs) -> None:
    pass


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_overrides):
    tmp = tmp_path_factory.mktemp("report")
    cfg = load_config(None, tiny_overrides(tmp, "log.name=r", "train.steps=4", "eval.every=2",
                                           "log.samples_every=2", "log.samples_groups=1"))
    return run_pipeline(cfg, echo=quiet).run_dir


def test_the_run_writes_a_self_contained_report(run_dir):
    page = (run_dir / "report.html").read_text()
    assert "<script" not in page and not re.search(r"src\s*=", page)  # nothing fetched, nothing run
    assert all(link.startswith('"#') for link in re.findall(r"href\s*=\s*([^\s>]+)", page))  # links: in the page
    assert "http://" not in page and "https://" not in page
    steps = len((run_dir / "metrics.jsonl").read_text().splitlines())
    charts = dict(re.findall(r'<svg class="chart" data-panel="(\w+)".*?data-points="(\d+)"', page, re.S))
    assert charts["reward"] == str(steps) and charts["validation"] == str(steps // 2)
    samples = len((run_dir / "samples.jsonl").read_text().splitlines())
    table = page[page.index('<table id="samples">'):]
    assert table[: table.index("</table>")].count("<tr>") == samples + 1
    assert '<table id="evaluation">' in page and "exact_match" in page
    assert 'id="health"' in page and "algo:" in page  # the health section and the configuration


def test_rlft_report_rebuilds_it(run_dir, capsys):
    (run_dir / "report.html").unlink()
    assert main(["report", str(run_dir)]) == 0
    assert (run_dir / "report.html").is_file() and "report.html" in capsys.readouterr().out
    assert main(["report", str(run_dir / "missing")]) == 2


def test_a_run_without_steps_yet_still_gets_a_page(tmp_path):
    (tmp_path / "config.yaml").write_text("algo: {}\n")
    assert main(["report", str(tmp_path)]) == 0
    page = (tmp_path / "report.html").read_text()
    assert "No steps logged yet." in page and "No evaluation yet." in page


def _chromium():
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (browser and driver):
        pytest.skip("no chromium and chromedriver on this machine (Debian: apt-get install chromium "
                    "chromium-driver; .ci/run installs them)")
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (the dev extra)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=opts)


def test_the_report_renders_in_headless_chromium(run_dir):
    from selenium.webdriver.common.by import By

    browser = _chromium()
    try:
        browser.get((run_dir / "report.html").as_uri())
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors
        steps = len((run_dir / "metrics.jsonl").read_text().splitlines())
        charts = browser.find_elements(By.CSS_SELECTOR, "svg.chart")
        assert {c.get_attribute("data-panel") for c in charts} >= {"reward", "validation", "entropy", "grad_norm"}
        for chart in charts:
            assert chart.size["width"] > 100 and chart.size["height"] > 100  # laid out, visible
            for line in chart.find_elements(By.TAG_NAME, "polyline"):
                box = browser.execute_script("return arguments[0].getBBox().width", line)
                assert box > 0, chart.get_attribute("data-panel")  # drawn with the run's points
        reward = browser.find_element(By.CSS_SELECTOR, 'svg[data-panel="reward"] polyline')
        assert reward.get_attribute("data-points") == str(steps)
        records = [json.loads(x) for x in (run_dir / "samples.jsonl").read_text().splitlines()]
        rows = browser.find_elements(By.CSS_SELECTOR, "#samples tr")
        assert len(rows) == len(records) + 1
        assert records[-1]["completion"].strip()[:10] in rows[-1].text or not records[-1]["completion"].strip()
    finally:
        browser.quit()
