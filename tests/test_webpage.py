"""The write-up page (``make report``, :mod:`bnrotation.study.analysis.webpage`) in a real browser.

The page is built from a synthetic results root whose every per-run value has a closed form
(``test_analysis.write_replication``: each row at the article's figures, a factor 1 + 0.02 (seed − 1) across
seeds), beside the ``table.csv`` and ``claims.md`` that ``make table`` and ``make claims`` write for it, and a
``figures/`` folder with one small real PNG. It is then opened from ``file://`` in Debian's chromium, headless,
driven through the Chrome DevTools Protocol by Playwright (never a browser Playwright downloads), in a fresh
profile, with every request that is not the page itself or a ``data:`` URI recorded and aborted.

Each check is a function that returns what it found wrong, and each has a failure case that must report it:
a page that asks the network and logs an error, a table cell and a point changed in a copy of the page.
Skipped, saying why, where Playwright is not installed or chromium cannot be started
(``apt-get install chromium``; ``.ci/run`` installs it).
"""

from __future__ import annotations

import base64
import gzip
import html
import io
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bnrotation.study.analysis import claims, webpage
from bnrotation.study.analysis.claims.command import results_blocks
from bnrotation.study.analysis.results import ALL_TABLES, load_runs
from bnrotation.study.analysis.tables import figures, table
from bnrotation.study.rows import ROWS
from test_analysis import PUBLISHED_LIKE, SCALE, write_replication

sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed "
                               "(pip install playwright==1.65.2; it drives Debian's chromium, downloads none)")

# Debian's chromium; the flags keep it from reaching any service of its own while the page is open.
CHROMIUM = os.environ.get("BNROTATION_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SEEDS = (0, 1, 2)
PNG = "02_accuracy_vs_norm_growth"  # the figure given a real (4 × 3 pixel) PNG in figures/
NOT_DRAWN = "04_rotation_over_steps"  # listed in figures/README.md as not drawn
ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "results" / "reference" / webpage.PAGE  # make report's page of the committed reference runs
# Per-run values are float64 reductions (a median of two channels' rotations, a mean of 41 equal accuracies) of
# the closed forms below, then JSON: each within a few ulps, so a relative 1e-12 is ample and still exact enough
# to tell any two runs apart (they differ by 2%).
REL = 1e-12
N_CHECKS = (SCALE["steps"] - SCALE["check_start"]) // SCALE["check_every"] + 1  # 41 checks per run


def factor(seed: int) -> float:
    """The replication's factor for ``seed`` (``test_analysis.write_replication``)."""
    return 1 + 0.02 * (seed - 1)


def closed_form(row: str, seed: int) -> dict:
    """What the page must plot for one run of the replication: rotation per 100 steps (degrees), norm growth
    (×) and evaluation-mode accuracy (fraction, the mean of the checks), from the published figures the runs were
    written from; ``adam``'s check at step 4,000 is at chance (0.1) instead."""
    pub = ROWS[row].published
    growth = pub.norm_growth if not math.isnan(pub.norm_growth) else 5.0
    accuracy = min(pub.acc_eval_mode * factor(seed), 1.0)
    if row == "adam":
        accuracy = (accuracy * (N_CHECKS - 1) + 0.1) / N_CHECKS
    return {"rotation": pub.rotation_deg_per_100 * factor(seed), "norm_growth": growth * factor(seed),
            "accuracy": accuracy}


# ----------------------------------------------------------------------------- the browser
@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless chromium in a fresh profile, or a skip that says why it cannot start."""
    if not CHROMIUM:
        pytest.skip("chromium not found (apt-get install chromium; or set BNROTATION_CHROMIUM)")
    pw = sync_api.sync_playwright().start()
    try:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM, args=FLAGS,
            headless=True, viewport={"width": 1280, "height": 900})
    except Exception as err:  # noqa: BLE001 - Playwright raises its own Error for every launch failure
        pw.stop()
        pytest.skip(f"chromium ({CHROMIUM}) could not be started: {str(err).splitlines()[0]}")
    yield context
    context.close()
    pw.stop()


@dataclass
class Opened:
    """A page opened from a file: the Playwright page, console errors and uncaught exceptions (``errors``),
    and the requests that would have left the file (``leaving``: recorded and aborted)."""

    page: object
    errors: list[str] = field(default_factory=list)
    leaving: list[str] = field(default_factory=list)


def open_file(context, path: Path) -> Opened:
    """Open ``path`` in a new tab of ``context`` and wait until the load event; every request but the file's
    own URL and ``data:`` URIs is recorded in ``leaving`` and aborted."""
    url = path.resolve().as_uri()
    page = context.new_page()
    opened = Opened(page)

    def guard(route):
        if route.request.url == url or route.request.url.startswith("data:"):
            route.continue_()
        else:
            opened.leaving.append(route.request.url)
            route.abort()

    page.route("**/*", guard)
    page.on("console", lambda msg: opened.errors.append(f"console: {msg.text}") if msg.type == "error" else None)
    page.on("pageerror", lambda err: opened.errors.append(f"uncaught: {err}"))
    page.goto(url, wait_until="load")
    return opened


def plotted(opened: Opened, div: str = webpage.HEADLINE_ID) -> None:
    """Wait until plotly has drawn the figure ``div``."""
    opened.page.wait_for_function(f"() => document.getElementById({div!r})?._fullLayout !== undefined")


# ----------------------------------------------------------------------------- the page under test
@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """A results root with the replication's runs, its table.csv and claims.md, a figures/ folder with one PNG
    and its README.md, and report.html built from them."""
    root = write_replication(tmp_path_factory.mktemp("webpage"), seeds=SEEDS)
    assert table.main(["--results", str(root)]) == 0
    assert claims.main(["--results", str(root)]) == 0
    (root / "figures").mkdir()
    import matplotlib.pyplot as plt
    plt.imsave(root / "figures" / f"{PNG}.png", np.linspace(0, 1, 12).reshape(3, 4), cmap="gray")
    done = [figures.Drawn(PNG, "A small figure", caption="Its caption, with `code`."),
            figures.Drawn(NOT_DRAWN, "A figure without data", skipped="no runs of that row")]
    (root / "figures" / "README.md").write_text(figures.index_markdown(done, root))
    assert webpage.main(["--results", str(root)]) == 0
    return root


@pytest.fixture(scope="module")
def opened(browser, built) -> Opened:
    """The page, opened once and drawn, for the checks that only read it."""
    page = open_file(browser, built / webpage.PAGE)
    plotted(page)
    plotted(page, webpage.STEPS_ID)
    return page


# ----------------------------------------------------------------------------- what each check reads
def run_points(opened: Opened) -> list[dict]:
    """The headline's run points as the browser holds them: row, seed, x, y and norm growth."""
    traces = opened.page.evaluate(f"""() => document.getElementById({webpage.HEADLINE_ID!r}).data
        .filter(t => t.meta === 'runs').map(t => ({{x: Array.from(t.x), y: Array.from(t.y), c: t.customdata}}))""")
    return [{"row": c[0], "seed": c[1], "rotation": x, "accuracy": y, "norm_growth": c[2]}
            for t in traces for x, y, c in zip(t["x"], t["y"], t["c"])]


def point_mismatches(points: list[dict], rows, seeds) -> list[str]:
    """What differs between the plotted points and one point per run of ``rows`` × ``seeds`` at its closed
    form (:func:`closed_form`, relative :data:`REL`)."""
    got = {(p["row"], p["seed"]): p for p in points}
    want = {(row, seed) for row in rows for seed in seeds}
    problems = [f"{len(points)} points for {len(want)} runs"] if len(points) != len(want) else []
    problems += [f"no point for {k}" for k in sorted(want - set(got))]
    problems += [f"a point for {k}, which is no run" for k in sorted(set(got) - want)]
    for key in sorted(want & set(got)):
        for name, value in closed_form(*key).items():
            if not math.isclose(got[key][name], value, rel_tol=REL):
                problems.append(f"{key} {name}: plotted {got[key][name]!r}, the run's is {value!r}")
    return problems


def drawn_points(opened: Opened) -> int:
    """How many markers the headline's SVG shows now."""
    return opened.page.locator(f"#{webpage.HEADLINE_ID} .scatterlayer .trace path.point").count()


def page_table(opened: Opened) -> list[dict]:
    """The page's table as the browser shows it: per row its name, n, and per column the cell's text, its
    ``data-`` numbers and its verdict (None without one)."""
    return opened.page.evaluate("""() => Array.from(document.querySelectorAll('#table tbody tr')).map(tr => ({
        row: tr.dataset.row, n: Number(tr.dataset.n),
        cells: Object.fromEntries(Array.from(tr.querySelectorAll('td[data-column]')).map(td => [td.dataset.column, {
            text: td.innerText, mean: Number(td.dataset.mean), std: Number(td.dataset.std),
            published: Number(td.dataset.published), verdict: td.querySelector('.verdict')?.innerText ?? null}]))}))""")


def claims_md_cells(text: str) -> dict[tuple[str, str], str]:
    """(row, column title) → verdict, from the section "The article's table, cell by cell" of ``claims.md``."""
    section = text.split("## The article's table, cell by cell", 1)[1].split("\n## ", 1)[0]
    return {(m.group(1), m.group(2)): m.group(3).strip()
            for m in re.finditer(r"^\| `([^`]+)` \| ([^|]+?) \|.*\| ([A-Z][A-Za-z ]+) \|$", section, re.M)}


def table_mismatches(shown: list[dict], csv: pd.DataFrame, verdicts: dict[tuple[str, str], str]) -> list[str]:
    """What differs between the page's table and ``table.csv`` (the same rows in the same order; per cell the
    same mean, spread and published figure to the bit, the text ``table.md`` prints for them, n) and the cell
    verdicts of ``claims.md``."""
    problems = []
    if [s["row"] for s in shown] != list(csv["row"]):
        return [f"rows {[s['row'] for s in shown]}, table.csv has {list(csv['row'])}"]
    for s, (_, line) in zip(shown, csv.iterrows()):
        if s["n"] != line["n_seeds"]:
            problems.append(f"{s['row']}: n {s['n']}, table.csv {line['n_seeds']}")
        for col in table.COLUMNS:
            got = s["cells"][col.key]
            for k in ("mean", "std", "published"):
                want = float(line[f"{col.key}_{k}"])
                if not (got[k] == want or (math.isnan(want) and math.isnan(got[k]))):
                    problems.append(f"{s['row']} {col.key} {k}: page {got[k]!r}, table.csv {want!r}")
            measured, published = table.cell_parts(line, col)
            if not got["text"].startswith(measured) or (published and f"published {published}" not in got["text"]):
                problems.append(f"{s['row']} {col.key}: shows {got['text']!r}, table.csv gives {measured!r} "
                                f"[{published}]")
            want_verdict = verdicts.get((s["row"], col.header))
            if got["verdict"] != want_verdict:
                problems.append(f"{s['row']} {col.key}: verdict {got['verdict']!r}, claims.md {want_verdict!r}")
    return problems


# ----------------------------------------------------------------------------- the checks
def test_the_page_opens_offline_without_errors(opened, built, tmp_path):
    page = opened.page
    assert opened.errors == []
    assert opened.leaving == []
    assert "<script src=" not in (built / webpage.PAGE).read_text()  # plotly.js inlined, not linked
    buttons = page.eval_on_selector_all(".modebar-btn", "bs => bs.map(b => b.dataset.title)")
    assert "Download plot as a PNG" in buttons and not [b for b in buttons if "Share" in b]  # no upload button
    shot = tmp_path / "report.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 0
    # the figure given a PNG shows it, decoded from its data URI; the one without says why
    assert page.evaluate(f"() => document.querySelector('#figure-{PNG} img').naturalWidth") == 4
    assert "Its caption, with code." in page.inner_text(f"#figure-{PNG} figcaption")
    assert "Not drawn: no runs of that row." in page.inner_text("body")
    assert f"{len(PUBLISHED_LIKE) * len(SEEDS)} runs" in page.inner_text("#provenance")


def test_the_headline_has_one_point_per_run_at_its_closed_form(opened):
    assert point_mismatches(run_points(opened), PUBLISHED_LIKE, SEEDS) == []
    published = opened.page.evaluate(f"""() => document.getElementById({webpage.HEADLINE_ID!r}).data
        .filter(t => t.meta === 'published').map(t => [t.customdata[0][0], t.x[0], t.y[0]])""")
    assert {row: (x, y) for row, x, y in published} == {
        row: (ROWS[row].published.rotation_deg_per_100, ROWS[row].published.acc_eval_mode) for row in PUBLISHED_LIKE}
    assert drawn_points(opened) == len(PUBLISHED_LIKE) * (len(SEEDS) + 1)  # each run, each published mean


def test_a_changed_point_is_caught(opened):
    points = run_points(opened)
    points[0] = dict(points[0], accuracy=points[0]["accuracy"] * (1 + 1e-9))
    assert len(point_mismatches(points, PUBLISHED_LIKE, SEEDS)) == 1
    assert point_mismatches(points[1:], PUBLISHED_LIKE, SEEDS)[:2] == [
        f"{len(points) - 1} points for {len(points)} runs", f"no point for {(points[0]['row'], points[0]['seed'])}"]


def test_a_legend_click_hides_a_row_and_a_second_shows_it(browser, built):
    opened = open_file(browser, built / webpage.PAGE)
    plotted(opened)
    page, label = opened.page, ROWS["adam"].label
    all_points = drawn_points(opened)
    entry = page.locator(f"#{webpage.HEADLINE_ID} .legend .traces").filter(
        has=page.get_by_text(label, exact=True)).locator(".legendtoggle")
    hidden = f"""() => document.getElementById({webpage.HEADLINE_ID!r}).data
        .filter(t => t.legendgroup === 'adam').every(t => t.visible === 'legendonly')"""
    entry.click()
    page.wait_for_function(hidden)
    assert drawn_points(opened) == all_points - len(SEEDS) - 1  # the row's runs and its published mean
    entry.click()
    page.wait_for_function(f"() => !({hidden})()")
    assert drawn_points(opened) == all_points
    assert opened.errors == []
    page.close()


def test_the_table_cells_equal_table_csv_and_the_verdicts_claims_md(opened, built):
    csv = pd.read_csv(built / "table.csv", keep_default_na=False, na_values=[""])
    verdicts = claims_md_cells((built / "claims.md").read_text())
    assert verdicts  # the parser found the section
    shown = page_table(opened)
    assert table_mismatches(shown, csv, verdicts) == []
    assert {(s["row"], col.header): s["cells"][col.key]["verdict"] for s in shown for col in table.COLUMNS
            if s["cells"][col.key]["verdict"]} == verdicts


def test_a_changed_table_cell_is_caught(opened, built, browser, tmp_path):
    page = (built / webpage.PAGE).read_text()
    csv = pd.read_csv(built / "table.csv", keep_default_na=False, na_values=[""])
    mean = float(csv.loc[csv["row"] == "adam", "acc_eval_mode_mean"].iloc[0])
    assert page.count(f'data-mean="{mean!r}"') == 1
    copy = tmp_path / webpage.PAGE
    copy.write_text(page.replace(f'data-mean="{mean!r}"', f'data-mean="{mean + 0.001!r}"'))
    tampered = open_file(browser, copy)
    problems = table_mismatches(page_table(tampered), csv, claims_md_cells((built / "claims.md").read_text()))
    assert problems == [f"adam acc_eval_mode mean: page {mean + 0.001!r}, table.csv {mean!r}"]
    tampered.page.close()


def test_the_claims_are_those_of_claims_md(opened, built):
    summary = (built / "claims.md").read_text().split("## Summary", 1)[1].split("\n## ", 1)[0]
    want = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([^`]+)`(?: \*\(exploratory\)\*)? \| ([^|]+?) \|",
                                                        summary, re.M)}
    shown = opened.page.evaluate("""() => Object.fromEntries(Array.from(document.querySelectorAll(
        '#claims tbody tr')).map(tr => [tr.dataset.check, tr.dataset.verdict]))""")
    assert want and shown == want


def test_the_guard_catches_a_request_leaving_the_file_and_a_console_error(browser, tmp_path):
    page = tmp_path / "leaky.html"
    page.write_text('<!DOCTYPE html><html><body><img src="http://192.0.2.1/pixel.png">'  # TEST-NET-1: aborted
                    '<script>console.error("broken on purpose")</script></body></html>')
    leaky = open_file(browser, page)
    assert leaky.leaving == ["http://192.0.2.1/pixel.png"]
    # in whichever order chromium reports it beside the aborted request's own console line
    assert any("broken on purpose" in e for e in leaky.errors)
    leaky.page.close()


def test_the_command_refuses_a_root_without_runs_in_one_line(tmp_path, capsys):
    assert webpage.main(["--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: {tmp_path}: no runs/ folder")
    assert not (tmp_path / webpage.PAGE).exists()


def test_the_page_module_and_plotly_import_no_torch():
    code = ("import sys, bnrotation.study.analysis.webpage as w; w._plotly(); "
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')); "
            "sys.exit(f'imported {bad}' if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src")))
    assert done.returncode == 0, done.stderr[-2000:]


# ----------------------------------------------------------------------------- what comes first, and the size
FIRST_FIGURE = re.compile(r'<figure|<img|<div [^>]*data-figure=')


def order_problems(page: str, sentence: str) -> list[str]:
    """What is wrong with the opening of ``page`` (its HTML): the finding paragraph must be there, hold
    ``sentence`` (docs/results.md's headline, as markdown) and come before any figure, and the first figure must be
    the headline's."""
    found = re.search(rf'<p id="{webpage.FINDING_ID}">(.*?)</p>', page, re.S)
    if not found:
        return ["no finding paragraph"]
    problems = []
    shown = html.unescape(re.sub(r"<[^>]+>", "", found.group(1)))
    if shown != sentence.strip().replace("`", ""):
        problems.append(f"the finding reads {shown[:120]!r}..., docs/results.md's headline {sentence[:120]!r}...")
    first = FIRST_FIGURE.search(page)
    if first and first.start() < found.start():
        problems.append(f"a figure ({page[first.start():first.start() + 40]!r}) comes before the finding")
    if not first or f'id="{webpage.HEADLINE_ID}"' not in page[first.start():first.start() + 200]:
        problems.append("the first figure is not the headline's")
    return problems


def the_headline_sentence(root: Path) -> str:
    """docs/results.md's generated headline (:func:`results_blocks`) for the runs under ``root``, read as `make`
    reads them."""
    return results_blocks(*claims.weigh(root, load_runs(root, tables=ALL_TABLES)))["headline"]


def test_the_page_opens_with_the_finding_then_the_headline_figure(opened, built):
    page = (built / webpage.PAGE).read_text()
    sentence = the_headline_sentence(built)
    assert order_problems(page, sentence) == []
    # as drawn: the sentence above the headline figure, the figure above everything else the page shows
    tops = opened.page.evaluate(f"""() => ({{finding: document.getElementById({webpage.FINDING_ID!r})
        .getBoundingClientRect().top, headline: document.getElementById({webpage.HEADLINE_ID!r})
        .getBoundingClientRect().top, table: document.getElementById('table').getBoundingClientRect().top}})""")
    assert tops["finding"] < tops["headline"] < tops["table"], tops
    assert opened.page.inner_text(f"#{webpage.FINDING_ID}") == sentence.strip().replace("`", "")


def test_a_figure_before_the_finding_and_another_sentence_are_caught(built):
    page = (built / webpage.PAGE).read_text()
    sentence = the_headline_sentence(built)
    finding = re.search(rf'<p id="{webpage.FINDING_ID}">.*?</p>\n', page, re.S).group(0)
    moved = page.replace(finding, "").replace("</figcaption></figure>", "</figcaption></figure>\n" + finding, 1)
    assert order_problems(moved, sentence)[0].startswith("a figure (")
    assert order_problems(page, sentence.replace("training", "evaluation"))[0].startswith("the finding reads")
    assert order_problems(page.replace(f'id="{webpage.FINDING_ID}"', 'id="elsewhere"'), sentence) == [
        "no finding paragraph"]


def test_the_committed_page_is_at_most_5_mib_and_opens_with_the_results_headline():
    """``results/reference/report.html`` (``make report RESULTS=results/reference``): at most
    :data:`webpage.MAX_BYTES`, and its finding is docs/results.md's generated headline, which ``make claims``
    writes from the same runs (a page left behind by a change of the runs or of the sentence fails here)."""
    assert COMMITTED.stat().st_size <= webpage.MAX_BYTES == 5 * 2 ** 20
    results = (ROOT / "docs" / "results.md").read_text()
    (sentence,) = [m["text"] for m in claims.BLOCK.finditer(results) if m["name"] == "headline"]
    assert order_problems(COMMITTED.read_text(), sentence) == []


def test_plotly_js_is_inlined_once_as_plotly_py_s_own_bundle(built):
    from plotly.offline import get_plotlyjs

    page = (built / webpage.PAGE).read_text()
    packed = re.findall(rf'<script type="application/octet-stream" id="{webpage.PLOTLY_ID}">([^<]*)</script>', page)
    assert len(packed) == 1 and gzip.decompress(base64.b64decode(packed[0])).decode() == get_plotlyjs()
    assert page.count(f'id="{webpage.PLOTLY_ID}"') == 1 and "Plotly.newPlot" in page  # the loader, once


def test_the_claims_are_grouped_by_section_and_folded(opened, built):
    sections = opened.page.evaluate("""() => Array.from(document.querySelectorAll('#claims details.section'))
        .map(d => ({section: d.dataset.section, open: d.open, rows: d.querySelectorAll('tbody tr').length}))""")
    _, checks, _ = claims.weigh(built, load_runs(built))
    want = [(s, sum(c.section == s for c in checks)) for s in webpage.SECTIONS if any(c.section == s for c in checks)]
    assert [(s["section"], s["rows"]) for s in sections] == want and not any(s["open"] for s in sections)
    assert opened.page.locator("#claims tbody tr").count() == len(checks)  # every check is in a group
    first = opened.page.locator("#claims details.section").first
    assert not first.locator("tbody tr").first.is_visible()
    first.locator(":scope > summary").click()
    assert first.locator("tbody tr").first.is_visible()
    first.locator(":scope > summary").click()


def test_a_figure_is_inlined_as_a_narrower_palette_png_on_white():
    """A figure as ``make figures`` draws one (matplotlib, 150 dpi, here 3,000 pixels wide, its background left
    transparent) comes out :data:`webpage.FIGURE_WIDTH_PX` wide with its aspect ratio, a palette PNG, white where it
    was transparent, smaller, and the same bytes each time; one narrower than that keeps its width."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    def drawn(width_in: float) -> bytes:
        fig, ax = plt.subplots(figsize=(width_in, width_in / 2))
        steps = np.arange(200)
        for k in range(6):
            ax.plot(steps, np.cos(steps / (10 + k)) + k, label=f"row {k}")
        ax.legend()
        ax.set_xlabel("step")
        out = io.BytesIO()
        fig.savefig(out, format="png", dpi=150, transparent=True)
        plt.close(fig)
        return out.getvalue()

    raw = drawn(20.0)
    out = webpage.compact_png(raw)
    small = Image.open(io.BytesIO(out))
    assert Image.open(io.BytesIO(raw)).size == (3000, 1500)
    assert small.format == "PNG" and small.mode == "P" and small.size == (webpage.FIGURE_WIDTH_PX, 700)
    assert small.convert("RGB").getpixel((2, 2)) == (255, 255, 255)  # the transparent corner, on white
    assert len(out) < len(raw) / 2 and webpage.compact_png(raw) == out
    narrow = drawn(4.0)  # 600 pixels
    assert Image.open(io.BytesIO(webpage.compact_png(narrow))).size == (600, 300)


def test_the_condition_maps_figure_follows_the_headline_figure_where_the_map_has_one(built, tmp_path):
    """The report page shows the map's figure (``<root>/map/map.png``) after the headline's, the page's first; a
    root without the map's figure gets no empty figure element."""
    page = (built / webpage.PAGE).read_text()
    assert f'id="{webpage.MAP_FIGURE_ID}"' not in page
    ev = claims.weigh(built, load_runs(built, tables=ALL_TABLES))[0]
    assert webpage.map_figure(ev) == ""
    (built / "map").mkdir(exist_ok=True)
    plt = pytest.importorskip("matplotlib.pyplot")
    plt.imsave(built / "map" / "map.png", np.linspace(0, 1, 12).reshape(3, 4), cmap="gray")
    shown = webpage.map_figure(ev)
    assert shown.startswith(f'<figure id="{webpage.MAP_FIGURE_ID}"><img alt="The condition map" src="data:image/png')
    html_page = webpage.build_page(built, load_runs(built, tables=ALL_TABLES), tmp_path)
    assert html_page.index(f'id="{webpage.HEADLINE_ID}"') < html_page.index(f'id="{webpage.MAP_FIGURE_ID}"')
    (built / "map" / "map.png").unlink()
