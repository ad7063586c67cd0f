"""The history page, built by asv's publisher from a synthetic history with a planted 15% step at a known commit:
the regression is listed at that commit for the machine that slowed (and nowhere else), higher-is-better figures
keep their own units, nothing loads from the network, and a real headless Chromium draws it."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from harness.history.site import publish
from harness.history.site.asv_results import machine_slug
from harness.history.site.vendor import remote_loads
from harness.history.serve import serving
from tests.history import synthetic
from tests.history.chromium import PACKAGE, Chromium, find_chromium

pytest.importorskip("asv", reason="asv is the history page's publisher: pip install -e '.[history]'")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if shutil.which("npm") is None:
        pytest.skip("no npm here: the page's scripts (jQuery, flot, Bootstrap) install from npm by name; install "
                    "Node.js and npm (Debian: apt-get install npm)")
    root = tmp_path_factory.mktemp("history")
    hashes = synthetic.make_repo(root / "repo")
    report = publish(synthetic.records(hashes), root / "site", repo=root / "repo")
    return hashes, report


def test_the_planted_step_is_the_only_regression_listed(built):
    hashes, report = built
    step = hashes[synthetic.STEP_AT]
    found = {(r.metric, r.machine, r.commit) for r in report.regressions}
    cpu = machine_slug(synthetic.CPU.kind)
    assert found == {(synthetic.TIME, cpu, step), (synthetic.TPS, cpu, step)}, report.summary()
    assert report.drawn == report.records == 2 * synthetic.COMMITS and not report.left_out


def test_a_higher_is_better_figure_is_published_in_its_own_units(built):
    hashes, report = built
    tps = {r.metric: r for r in report.regressions}[synthetic.TPS]
    assert tps.before == pytest.approx(50, rel=0.02)  # tok/s, not 1/50 and not -50
    assert tps.after == pytest.approx(50 / (1 + synthetic.STEP), rel=0.03)
    graph = next(report.out_dir.glob(f"graphs/**/machine-{machine_slug(synthetic.CPU.kind)}/"
                                      f"{synthetic.TPS}.json"))
    values = [v[0] for _, v in json.loads(graph.read_text())]  # band order: value, low, high
    assert values[0] == pytest.approx(50, rel=0.02) and values[-1] == pytest.approx(43.5, rel=0.03)


def test_the_site_loads_nothing_from_the_network(built):
    _, report = built
    pages = list(report.out_dir.glob("*.html"))
    assert pages and all(remote_loads(p.read_text()) == [] for p in pages)
    assert (report.out_dir / "vendor" / "js" / "jquery-3.3.1.min.js").stat().st_size > 50_000


def test_each_commit_links_to_the_runs_behind_its_points(built):
    hashes, report = built
    page = (report.out_dir / "runs" / hashes[synthetic.STEP_AT] / "index.html").read_text()
    assert synthetic.CPU.kind in page and synthetic.GPU.kind in page and "IQR of 20 steps" in page


ROWS = ("Array.from(document.querySelectorAll('table tbody tr')).filter(tr => tr.offsetParent !== null)"
        ".map(tr => Array.from(tr.cells).map(td => td.textContent.trim()))")
PLOT = ("(function(){var p=$('.flot-base').closest('*').parents().filter(function(){return $(this).data('plot')})"
        ".first().data('plot'); if(!p) return null; return p.getData().map(function(s){return {label: s.label || '',"
        " ys: s.data.filter(function(d){return d && d[1] !== null;}).map(function(d){return d[1];})};})"
        ".filter(function(s){return s.ys.length;});})()")


@pytest.mark.slow
def test_a_real_browser_finds_the_regression_and_draws_the_plot(built, tmp_path):
    executable = find_chromium()
    if executable is None:
        pytest.skip(f"no Chromium here: install Debian's `{PACKAGE}` package (apt-get install {PACKAGE}); "
                    "CI installs it")
    hashes, report = built
    step = hashes[synthetic.STEP_AT][:8]
    shots = Path(os.environ.get("QWEN36_HISTORY_SCREENSHOTS", tmp_path))
    with serving(report.out_dir) as url, Chromium(executable) as browser:
        browser.goto(url + "index.html#/regressions")
        rows = browser.wait_for(f"(function(){{var r={ROWS}; return r.length ? r : null;}})()")
        listed = {(row[0], row[2]) for row in rows}
        assert (f"{synthetic.TIME}(value)", step) in listed and (f"{synthetic.TPS}(value)", step) in listed, rows
        assert len(rows) == 2, rows  # the GPU's flat lines and the spread bands are not listed
        browser.screenshot(shots / "history-regressions.png")

        browser.goto(url + f"index.html#{synthetic.TPS}")
        series = browser.wait_for(PLOT)
        ys = sorted(y for s in series for y in s["ys"])
        # Both machines' lines, value and spread bands, in tok/s: the CPU's ~43-52, the GPU's ~390-412.
        assert len(series) >= 2 and 40 < ys[0] and ys[-1] < 420, series
        assert sum(len(s["ys"]) for s in series) >= 2 * synthetic.COMMITS
        assert browser.screenshot(shots / "history-plot.png").stat().st_size > 10_000
