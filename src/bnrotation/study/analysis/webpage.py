"""``make report``: the write-up as one self-contained HTML page, ``<out>/report.html`` (no torch).

    python -m bnrotation.study.analysis.webpage --results results/reference   # writes results/reference/report.html

One file that opens offline, at most :data:`MAX_BYTES`: plotly.js and every number are inlined, and the figures
of ``make figures`` (``<out>/figures/*.png``, where they exist) are inlined as data URIs. It holds, in order: the
finding, one sentence per task, docs/results.md's generated headline (:func:`.claims.finding.headline`); the
headline figure, evaluation-mode accuracy against rotation with one point per run and the article's row means
beside them; the condition map's figure; why fresh samples keep Adam rotating (the data swap's sentence, table and
figure, :func:`why_section`); what it was made from (results root, runs, the suite's commit, the runs' scale); the article's table
with the published figure, the measured mean ± spread, n and a verdict per cell; the claims, grouped by section
of ``claims.md``, each group folded (``<details>``) under its verdict counts, each verdict with its reason; the
accuracy over steps per row in both modes (mean, lowest and highest run at each check, as figure 3 draws them);
and the other figures. No number of the table or the claims is computed here: the table is
:func:`.tables.table.build_table` (the lines of ``table.csv``), the verdicts are :func:`.claims.command.weigh` (those of
``claims.md``), the per-run values are :func:`.claims.evidence.collect`'s, the published figures are
:func:`.claims.kinds.published`'s (:mod:`bnrotation.study.rows`, :mod:`bnrotation.study.article`). The page has no time
stamp and fixed element ids, so the same runs, figures and commit give the same bytes.

Size: plotly.js (plotly.py's own ``plotly.min.js``, once) is inlined gzipped and base64-encoded, and unpacked in
the browser by its ``DecompressionStream`` (Chromium 80, Firefox 113, Safari 16.4) before the figures are drawn
from their inlined JSON: a third of the bundle's bytes. The figures' PNGs are redrawn at most
:data:`FIGURE_WIDTH_PX` wide with a palette of 256 colours (:func:`compact_png`): line art, which a palette keeps
sharp where JPEG or lossy WebP would blur the lettering.

Library: Plotly (plotly.py), because it writes a figure with plotly.js inlined and needs nothing else at view
time, with hover and legend toggling built in; Altair's offline page needs the vega, vega-lite and vega-embed
bundles fetched and inlined by a further package. Pillow (matplotlib's own image library) re-encodes the PNGs.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import html
import io
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd

from ...helptext import plain
from ... import records
from ..article import FAIL_BELOW
from ..rows import ROWS, row_order
from .claims import weigh
from ..condition_map import ROOT as MAP_ROOT
from .claims import why as claims_why
from .claims.command import map_line
from ..why import ROOT as WHY_ROOT
from .report.section import to_html as section_html
from .claims.finding import TASK_ROWS, findings, headline as finding_headline
from .claims.kinds import ARTICLE, FAIL, PASS, RESNET, Check, published
from .claims.report import SECTIONS as REPORT_SECTIONS
from .claims.report import legend, verdict_counts
from .formatting import cell, schema_versions
from .results import ALL_TABLES, Run, add_results_arguments, command_inputs, count, scale_note
from .tables.figures import FIGURES, Data, network_style, norms, row_palette
from .tables.table import COLUMNS, build_table, cell_parts, seeds_cell

__all__ = ["build_page", "main"]

PAGE = "report.html"
INTERACTIVE = ("01_accuracy_vs_rotation", "03_accuracy_over_steps")  # drawn on the page; their PNGs are left out
HEADLINE_ID, STEPS_ID = "headline", "accuracy-over-steps"  # the figures' element ids (fixed: same bytes each time)
FINDING_ID, PLOTLY_ID = "finding", "plotly-js"  # the finding's paragraph; the script element holding plotly.js
MAP_ID = "where-it-lives"  # the paragraph after the finding: where the collapse lives (the condition map)
MAP_FIGURE_ID = "figure-map"  # the condition map's figure, after the headline's
WHY_ID = "why"  # the data swap's section: why fresh samples keep Adam rotating
MAX_BYTES = 5 * 2 ** 20  # the page's size at most (tests/test_webpage.py checks the committed one)
# The figures' width at most: the page's column is 1180 CSS pixels (STYLE), so this leaves a little for a zoom or
# a denser screen; make figures draws them at 150 dpi, 1,600 to 3,100 pixels wide.
FIGURE_WIDTH_PX = 1400
PALETTE_COLOURS = 256  # a PNG palette's most
# The sections of claims.md (kinds.ARTICLE, then those of claims.report.SECTIONS), in its order and words: a folded
# group each.
SECTIONS = {ARTICLE: "The article's claims", **{key: title for key, (title, _) in REPORT_SECTIONS.items()}}
# matplotlib's markers of figures.network_style and of the rows without running statistics, in plotly's names
SYMBOLS = {"o": "circle", "^": "triangle-up", "s": "square"}
LOG_TICKS = [m * 10.0 ** e for e in range(-2, 3) for m in (1, 2, 5)]  # 0.01, 0.02, 0.05, ..., 500: as the figures
STYLE = """
body { font-family: system-ui, sans-serif; max-width: 1180px; margin: 2em auto; padding: 0 1em; color: #222;
       line-height: 1.45; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.86em; margin: 1em 0; }
th, td { border: 1px solid #ddd; padding: 0.3em 0.5em; vertical-align: top; }
th { background: #f4f4f4; text-align: left; }
td.num { text-align: right; white-space: nowrap; }
.verdict { font-weight: bold; padding: 0 0.3em; border-radius: 3px; white-space: nowrap; }
.PASS { background: #d9f2d9; color: #145214; } .FAIL { background: #f8d4d4; color: #7a1010; }
.other { background: #eee; color: #444; }
.published { color: #555; } .note { color: #555; font-size: 0.92em; }
figure { margin: 1.5em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.9em; color: #333; }
code { background: #f4f4f4; padding: 0 0.2em; }
table.wide { width: 100%; table-layout: fixed; } table.wide td { overflow-wrap: anywhere; }
code.name { font-weight: bold; } .claim { font-size: 0.95em; }
details.note summary { cursor: pointer; color: #555; }
#finding { font-size: 1.15em; border-left: 4px solid #7a1010; padding: 0.2em 0 0.2em 0.8em; }
details.section { margin: 0.6em 0; } details.section > summary { cursor: pointer; font-size: 1.05em; }
"""


class PageError(RuntimeError):
    """The page cannot be built; the message says why in one line (a missing library)."""


def _plotly():
    """plotly's ``graph_objects`` and ``make_subplots``.

    Raises:
        PageError: when plotly is not installed, naming the version the suite uses.
    """
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError as err:
        raise PageError(f"the write-up page needs plotly ({err}); install it: pip install plotly==7.1.0") from err
    return go, make_subplots


def inline(text) -> str:
    """One line of the suite's markdown (``code``, ``**bold**``) as escaped HTML."""
    out = html.escape(str(text), quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", out)


def badge(verdict: str) -> str:
    """A verdict as a coloured label: PASS green, FAIL red, the others (:data:`.claims.report.VERDICTS`) grey."""
    kind = verdict if verdict in (PASS, FAIL) else "other"
    return f'<span class="verdict {kind}">{html.escape(verdict)}</span>'


def suite_commit() -> str:
    """The suite's commit, with ``-dirty`` when tracked files differ from it (``git describe --dirty``), or
    a sentence saying git could not tell."""
    root = Path(__file__).resolve().parents[4]
    try:
        done = subprocess.run(["git", "describe", "--always", "--dirty", "--abbrev=40"], cwd=root,
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as err:
        return f"unknown (git: {err})"
    return done.stdout.strip() or f"unknown (not a git checkout: {done.stderr.strip()[:120]})"


def label(row: str) -> str:
    """The row's label in the legends (:attr:`bnrotation.study.rows.RowSpec.label`; its name for a row of one's own):
    ResNet-20's rows say so, and the marker tells the networks apart."""
    return ROWS[row].label if row in ROWS else row


def _hex(rgb: tuple) -> str:
    return "#" + "".join(f"{round(c * 255):02x}" for c in rgb[:3])


def _symbol(d: Data, row: str, norm: dict[str, str]) -> str:
    """The row's marker, as in the figures: circle (the study's network), triangle (ResNet-20), square (no
    running statistics)."""
    marker = network_style(d, row)[0] if norm.get(row, "batch") == "batch" else "s"
    return SYMBOLS.get(marker, "circle")


def headline(d: Data, go) -> object:
    """Evaluation-mode accuracy (mean of the checks, fraction) against the last conv layer's rotation per 100
    steps (degrees, log axis): one point per finished run, one legend entry per row (a click hides or shows the
    row's runs and its published mean together), the article's row mean as a hollow marker of the row's colour.
    Hover: row, seed, rotation, norm growth (×) and accuracy. Each run trace has ``meta`` ``"runs"``, each
    published one ``"published"``."""
    fig = go.Figure()
    norm = norms(d)
    finished = d.per_run[~d.per_run["diverged"].astype(bool)]
    for row in d.rows:
        g = finished[finished["row"] == row].sort_values("seed")
        colour, symbol = _hex(d.palette[row]), _symbol(d, row, norm)
        fig.add_trace(go.Scatter(
            x=g["rotation_per_100_deg"].tolist(), y=g["acc_eval_mode"].tolist(), mode="markers", name=label(row),
            legendgroup=row, meta="runs", customdata=[[row, int(s), ng] for s, ng in zip(g["seed"], g["norm_growth"])],
            marker={"color": colour, "symbol": symbol, "size": 9, "line": {"color": "white", "width": 0.6}},
            hovertemplate=("row <b>%{customdata[0]}</b>, seed %{customdata[1]}<br>rotation %{x:.2f}° per 100 steps"
                           "<br>norm growth %{customdata[2]:.2f}×<br>accuracy %{y:.1%}<extra></extra>")))
        rotation, accuracy = published(row, "rotation_per_100_deg"), published(row, "acc_eval_mode")
        if rotation and accuracy:
            fig.add_trace(go.Scatter(
                x=[rotation.value], y=[accuracy.value], mode="markers", name=f"{label(row)}: published",
                legendgroup=row, showlegend=False, meta="published", customdata=[[row]],
                marker={"color": "rgba(0,0,0,0)", "size": 16, "line": {"color": colour, "width": 2}},
                hovertemplate=("row <b>%{customdata[0]}</b>: the article's row mean<br>rotation %{x:.2f}° per 100 "
                               "steps<br>accuracy %{y:.1%}<extra></extra>")))
    fig.add_hline(y=0.1, line={"color": "#999", "dash": "dot", "width": 1}, annotation_text="chance",
                  annotation_position="bottom left")
    fig.update_xaxes(type="log", tickvals=LOG_TICKS,
                     title="rotation of the last conv layer per 100 steps (degrees, log scale)")
    fig.update_yaxes(range=[0, 1.04], tickformat=".0%", title="evaluation-mode accuracy (mean of the checks)")
    fig.update_layout(template="plotly_white", height=max(560, 160 + 30 * len(d.rows)), margin={"t": 30},
                      legend={"title": {"text": "row (click: hide/show)"}, "font": {"size": 11}})
    return fig


def accuracy_over_steps(d: Data, go, make_subplots) -> object:
    """Per row, one panel: training- and evaluation-mode accuracy on the held-out set at each check, mean over
    the row's runs (line) and lowest to highest run (band); evaluation mode in the row's colour,
    training mode dashed grey. The legend has one entry per mode, which hides or shows it in every panel."""
    checks = d.table("checks")
    rows = d.rows
    cols = min(len(rows), 4)
    grid = math.ceil(len(rows) / cols)
    fig = make_subplots(rows=grid, cols=cols, shared_xaxes=True, shared_yaxes=True, vertical_spacing=0.5 / grid / 2,
                        horizontal_spacing=0.03, subplot_titles=[label(r) for r in rows])
    modes = (("acc_train_mode", "training mode (held-out set's own batch statistics)", "dash"),
             ("acc_eval_mode", "evaluation mode (running statistics)", "solid"))
    for i, row in enumerate(rows):
        g = checks[checks["row"] == row]
        at = {"row": i // cols + 1, "col": i % cols + 1}
        for column, mode, dash in modes:
            s = g.groupby("step")[column].agg(["mean", "min", "max"])
            colour = "#555555" if dash == "dash" else _hex(d.palette[row])
            steps = s.index.tolist()
            fig.add_trace(go.Scatter(x=steps + steps[::-1], y=s["max"].tolist() + s["min"].tolist()[::-1],
                                     fill="toself", fillcolor=colour, opacity=0.2, line={"width": 0},
                                     hoverinfo="skip", legendgroup=column, showlegend=False, name=mode), **at)
            fig.add_trace(go.Scatter(x=steps, y=s["mean"].tolist(), mode="lines", name=mode, legendgroup=column,
                                     showlegend=i == 0, line={"color": colour, "dash": dash, "width": 1.6},
                                     hovertemplate=f"{html.escape(row)}, {mode.split(' (')[0]}<br>step %{{x}}: "
                                                   "mean %{y:.1%}<extra></extra>"), **at)
    fig.update_xaxes(showticklabels=True, title_text="step", title_standoff=2)
    fig.update_yaxes(range=[0, 1.04], tickformat=".0%")
    fig.update_annotations(font_size=11)
    fig.update_layout(template="plotly_white", height=230 * grid + 110, margin={"t": 100},
                      legend={"orientation": "h", "yref": "container", "y": 0.99, "yanchor": "top"})
    return fig


def table_html(table: pd.DataFrame, cells: dict[str, Check]) -> str:
    """The article's table, one line per row of :func:`.tables.table.build_table` (``table.csv``): per column the
    measured mean ± spread, the published figure and the cell's verdict (``cells``: :func:`.claims.command.weigh`'s
    table cells by name, ``<row>:<column key>``). Each cell carries its numbers as ``data-`` attributes
    (``repr`` of the float: the same bits as ``table.csv``)."""
    head = "".join(f"<th>{html.escape(c.header)}</th>" for c in COLUMNS)
    out = [f"<table id=\"table\"><thead><tr><th>Row</th><th>Network</th><th>Seeds (n)</th>{head}<th>Diverged</th>"
           "</tr></thead><tbody>"]
    for _, line in table.iterrows():
        tds = []
        for col in COLUMNS:
            measured, pub = cell_parts(line, col)
            check = cells.get(f"{line['row']}:{col.key}")
            attrs = " ".join(f'data-{k}="{float(line[f"{col.key}_{k}"])!r}"' for k in ("mean", "std", "published"))
            tds.append(f'<td class="num" data-column="{col.key}" {attrs}>{html.escape(measured)}'
                       + (f'<br><span class="published">published {html.escape(pub)}</span>' if pub else "")
                       + (f"<br>{badge(check.verdict)}" if check else "") + "</td>")
        diverged = f"{line['diverged']} (seeds {line['diverged_seeds']})" if line["diverged"] else "0"
        out.append(f'<tr data-row="{html.escape(line["row"])}" data-n="{int(line["n_seeds"])}">'
                   f"<td>{html.escape(line['label'])} (<code>{html.escape(line['row'])}</code>)</td>"
                   f"<td>{html.escape(line['network'])}</td><td>{html.escape(seeds_cell(line))}</td>"
                   + "".join(tds) + f"<td class=\"num\">{diverged}</td></tr>")
    return "\n".join(out) + "\n</tbody></table>"


def claims_table(checks: list[Check]) -> str:
    """``checks`` as one table: each one's verdict, the article's claim, published and measured figures, and its
    reason (the tolerance it was weighed with, and its note, folded)."""
    out = ['<table class="wide"><colgroup><col style="width:27%"><col style="width:8%">'
           '<col style="width:14%"><col style="width:24%"><col style="width:27%"></colgroup><thead><tr><th>Check '
           "and claim</th><th>Verdict</th><th>Published</th><th>Measured</th><th>Reason</th></tr></thead><tbody>"]
    for c in checks:
        reason = inline(c.tolerance) + (f'<details class="note"><summary>note</summary>{inline(c.note)}</details>'
                                        if c.note else "")
        out.append(f'<tr data-check="{html.escape(c.name)}" data-verdict="{html.escape(c.verdict)}">'
                   f"<td><code class=\"name\">{html.escape(c.name)}</code>{' (exploratory)' if c.exploratory else ''}"
                   f'<br><span class="claim">{inline(c.claim)}</span></td>'
                   f"<td>{badge(c.verdict)}</td><td>{inline(c.published)}</td>"
                   f"<td>{inline(c.measured)}</td><td>{reason}</td></tr>")
    return "\n".join(out) + "\n</tbody></table>"


def claims_html(checks: list[Check]) -> str:
    """Every named check, grouped by its section of ``claims.md`` (:data:`SECTIONS`, in that order), each group
    folded (``<details>``) under its title and verdict counts (:func:`claims_table` inside)."""
    out = ['<div id="claims">']
    for section, title in SECTIONS.items():
        group = [c for c in checks if c.section == section]
        if group:
            out.append(f'<details class="section" data-section="{section}"><summary><strong>{html.escape(title)}'
                       f"</strong> ({count(len(group), 'check')}): {verdict_counts(group)}</summary>\n"
                       f"{claims_table(group)}\n</details>")
    return "\n".join(out) + "\n</div>"


def figure_captions(folder: Path) -> dict[str, str]:
    """Each figure's caption, or ``Not drawn: <reason>.``, from ``folder/README.md`` as
    :func:`.tables.figures.index_markdown` writes it (empty where there is no README)."""
    readme = folder / "README.md"
    if not readme.is_file():
        return {}
    text = readme.read_text()
    found = {m.group(1): m.group(2) for m in re.finditer(r"^!\[[^\]]*\]\(([^)]+)\.png\)\n\n(.*?) \(\[PDF\]", text,
                                                         re.M)}
    names = [name for name, _, _ in FIGURES]
    for m in re.finditer(r"^## (\d+)\. .*\n\n(Not drawn: .*)$", text, re.M):
        index = int(m.group(1)) - 1
        if 0 <= index < len(names):
            found[names[index]] = m.group(2)
    return found


def compact_png(png: bytes, width_px: int = FIGURE_WIDTH_PX) -> bytes:
    """``png`` (a figure of ``make figures``) as a smaller PNG for the page: on white (its alpha channel
    flattened), scaled down to at most ``width_px`` pixels wide (Lanczos), and with a palette of at most
    :data:`PALETTE_COLOURS` colours (median cut, no dithering: a line chart's flat areas stay flat). Deterministic:
    the same bytes in give the same bytes out."""
    from PIL import Image

    image = Image.open(io.BytesIO(png)).convert("RGBA")
    flat = Image.alpha_composite(Image.new("RGBA", image.size, "white"), image).convert("RGB")
    if flat.width > width_px:
        flat = flat.resize((width_px, round(flat.height * width_px / flat.width)), Image.Resampling.LANCZOS)
    out = io.BytesIO()
    flat.quantize(PALETTE_COLOURS, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(
        out, "PNG", optimize=True)
    return out.getvalue()


def figures_html(folder: Path) -> str:
    """The figures of ``make figures`` other than :data:`INTERACTIVE`, each PNG inlined as a data URI with its
    title and caption; a line for each one not in ``folder``."""
    captions = figure_captions(folder)
    out, absent = [], []
    for name, title, _ in FIGURES:
        if name in INTERACTIVE:
            continue
        png = folder / f"{name}.png"
        number = int(name[:2])
        if not png.is_file():
            absent.append(f"<li>{number}. {html.escape(title)}: {inline(captions.get(name, 'no PNG'))}</li>")
            continue
        data = base64.b64encode(compact_png(png.read_bytes())).decode("ascii")
        out.append(f'<figure id="figure-{name}"><img alt="{html.escape(title)}" src="data:image/png;base64,{data}">'
                   f"<figcaption><strong>{number}. {html.escape(title)}.</strong> "
                   f"{inline(captions.get(name, ''))}</figcaption></figure>")
    if absent:
        out.append(f"<p>Not in <code>{html.escape(str(folder))}</code> (<code>make figures</code> draws them):</p>"
                   f"<ul>{''.join(absent)}</ul>")
    return "\n".join(out)


# Unpacks plotly.js (gzip, base64, in the script element PLOTLY_ID) and draws each figure from its JSON; where the
# browser cannot, each figure's box says why instead (the rest of the page needs no script).
LOADER = """
(async () => {
  const config = %(config)s;
  const divs = Array.from(document.querySelectorAll("div[data-figure]"));
  try {
    const packed = atob(document.getElementById(%(plotly)s).textContent);
    const bytes = Uint8Array.from(packed, c => c.charCodeAt(0));
    const unpacked = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    const script = document.createElement("script");
    script.textContent = await new Response(unpacked).text();
    document.head.appendChild(script);
  } catch (err) {
    divs.forEach(div => { div.textContent = "This browser cannot unpack the page's plotly.js (" + err + ")."; });
    return;
  }
  for (const div of divs) {
    const figure = JSON.parse(document.getElementById(div.dataset.figure).textContent);
    await Plotly.newPlot(div, figure.data, figure.layout, config);
  }
})();
"""


def plotly_script() -> str:
    """plotly.py's own plotly.js, gzipped (level 9, no time stamp: the same bytes each time) and base64-encoded in
    a script element that the browser does not run (:data:`LOADER` unpacks it)."""
    from plotly.offline import get_plotlyjs

    packed = base64.b64encode(gzip.compress(get_plotlyjs().encode(), compresslevel=9, mtime=0)).decode("ascii")
    return f'<script type="application/octet-stream" id="{PLOTLY_ID}">{packed}</script>'


def figure_div(fig, div_id: str) -> str:
    """A plotly figure as its ``<div>`` (``div_id``, the figure's height) and its JSON beside it, in a script
    element the browser does not run, which :data:`LOADER` draws."""
    import plotly.io as pio

    data = pio.to_json(fig, validate=False).replace("</", "<\\/")  # no "</script>" inside: JSON's escaped "/"
    return (f'<div id="{div_id}" class="plotly-graph-div" data-figure="{div_id}-json" '
            f'style="height:{fig.layout.height}px; width:100%;"></div>\n'
            f'<script type="application/json" id="{div_id}-json">{data}</script>')


def finding(ev) -> str:
    """The finding as the page's first paragraph: docs/results.md's generated headline, one sentence per task
    (:func:`.claims.finding.headline`), or a line saying which rows it needs."""
    if findings(ev):
        text = finding_headline(ev)
    else:
        text = ("No finding sentence: it sets a task's Adam row against its SGD row, and these results have no runs "
                f"of {' or '.join(f'`{rows[0]}`' for rows in TASK_ROWS.values())}.")
    return f'<p id="{FINDING_ID}">{inline(text)}</p>'


def where_it_lives(ev) -> str:
    """The paragraph after the finding: where the collapse lives, docs/results.md's generated ``map`` block
    (:func:`.claims.command.map_line`)."""
    return f'<p id="{MAP_ID}">{inline(map_line(ev))}</p>'


def map_figure(ev) -> str:
    """The condition map's figure (``<root>/map/map.png``, drawn by :mod:`.tables.map_report`) inlined with its
    caption, after the headline's figure (the page's first); ``''`` where there is none."""
    png = Path(ev.root) / MAP_ROOT / "map.png"
    if not png.is_file():
        return ""
    data = base64.b64encode(compact_png(png.read_bytes())).decode("ascii")
    return (f'<figure id="{MAP_FIGURE_ID}"><img alt="The condition map" src="data:image/png;base64,{data}">'
            "<figcaption><strong>Where the collapse lives: the condition map.</strong> Along each knob, Adam's "
            "evaluation-mode accuracy minus SGD's (top) and each optimizer's mode gap (bottom), mean ± sd over seeds; "
            "stars: the knob's own task's setting; lines: both tasks' reference points (templates dotted, "
            f"Fashion-MNIST dashed). Its table: <code>{html.escape(str(png.with_name('map.md')))}</code>."
            "</figcaption></figure>")


def why_section(ev) -> str:
    """The data swap's section (issue 64): its sentence and table (:func:`.claims.why.summary`, rendered by
    :func:`.report.section.to_html`) and its figure (``<root>/why/why.png``, where drawn); ``''`` where the results
    root holds no data-swap folder."""
    folder = Path(ev.root) / WHY_ROOT
    if not folder.is_dir():
        return ""
    said, table = claims_why.summary(ev.root)
    png = folder / "why.png"
    figure = "" if not png.is_file() else (
        '<figure><img alt="The data swap: rotation rate and normalised step" src="data:image/png;base64,'
        f'{base64.b64encode(compact_png(png.read_bytes())).decode("ascii")}"><figcaption>The rotation rate and '
        "Adam's normalised step against the step, four arms, the swap marked. Every arm: "
        f"<code>{html.escape(str(folder / 'why.md'))}</code>.</figcaption></figure>")
    return (f'<section id="{WHY_ID}"><h2>{html.escape(claims_why.WHY_SECTION.title)}</h2><p>{inline(said)}</p>'
            f"{section_html(claims_why.WHY_SECTION, table)}{figure}</section>")


def build_page(root: Path, runs: list[Run], out: Path, skipped: list[str] = ()) -> str:
    """The whole page, for ``runs`` read from ``root``, with the figures of ``out/figures`` (the folder
    ``make figures`` writes for the same output folder).

    Raises:
        PageError: when plotly is missing.
    """
    go, make_subplots = _plotly()
    ev, checks, cells = weigh(root, runs)
    per_run = ev.per_run.assign(label=ev.per_run["row"])
    d = Data(root, runs, per_run, row_palette(list(per_run["row"].unique())))
    table = build_table(runs)
    finished = int((~per_run["diverged"].astype(bool)).sum())
    diverged = len(runs) - finished
    rows_run = sorted(per_run["row"].unique(), key=row_order)
    schema = schema_versions(r.info.get("schema_version") for r in runs)
    article = [c for c in checks if c.section == ARTICLE]
    resnet = [c for c in checks if c.section == RESNET]
    # plotly.js's own buttons, less its "Share chart" (an upload to Plotly's cloud): nothing leaves the file
    config = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["sendChartToCloud"]}
    plot_headline = figure_div(headline(d, go), HEADLINE_ID)
    plot_steps = figure_div(accuracy_over_steps(d, go, make_subplots), STEPS_ID)
    import plotly

    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>The rotation study, measured</title>", f"<style>{STYLE}</style></head><body>",
        "<h1>The rotation study, measured</h1>",
        finding(ev),
        where_it_lives(ev),
        plot_headline,
        f"<p class=\"note\">Evaluation-mode accuracy against rotation: one filled point per finished run "
        f"({finished}), coloured by row; hollow: the article's row means. "
        "Circles: the study's network with BatchNorm; squares: no running statistics (GroupNorm, LayerNorm); "
        "triangles: ResNet-20, in the colour of the study's row with its optimizer. Hover a point for its row, seed, "
        "rotation, norm growth and accuracy; click a legend entry to hide or show a row. Accuracy: mean of the "
        "checks in the check window; rotation: the last conv layer's median channel, per 100 steps, averaged over "
        "the window.</p>",
        map_figure(ev),
        why_section(ev),
        "<h2>What it was made from</h2>",
        f'<p id="provenance">Made by <code>make report</code> from {count(len(runs), "run")} '
        f"({count(finished, 'finished run')}, {diverged} diverged; {count(len(rows_run), 'row')}) under "
        f"<code>{html.escape(str(root))}</code>, parquet only, with the suite at commit "
        f"<code>{html.escape(suite_commit())}</code> ({schema}; plotly "
        f"{plotly.__version__}). {inline(scale_note(runs))}</p>",
        "<p>The same numbers as <code>table.md</code>, <code>table.csv</code> and <code>claims.md</code> of this "
        "results root, from the same code. Measured figures: mean over seeds ± the sample standard deviation over "
        "seeds (n − 1), with n.</p>",
        *([f"<p><strong>Left out with --skip-bad ({len(skipped)}):</strong></p><ul>"
           + "".join(f"<li>{inline(s)}</li>" for s in skipped) + "</ul>"] if skipped else []),
        "<h2>The article's table</h2>",
        "<p>Each cell: measured mean ± sample standard deviation over seeds (n in the Seeds column), the published "
        f"figure, and the cell's verdict, weighed as in <code>claims.md</code>. \"Checks below "
        f"{cell(FAIL_BELOW, 'pct', digits=0)}\" pools every check of the row's runs. Table cells: "
        f"{verdict_counts(c for _, _, c in cells)}.</p>",
        table_html(table, {c.name: c for _, _, c in cells}),
        "<h2>The claims</h2>",
        f"<p>Named checks of the article's claims: <strong>{verdict_counts(article)}</strong>"
        + (f"; does it carry over to ResNet-20: <strong>{verdict_counts(resnet)}</strong>" if resnet else "")
        + ". The reason gives the tolerance each was weighed with; open a group to see its checks.</p>",
        f"<p>{inline(legend())}</p>",
        claims_html(checks),
        "<h2>Accuracy over steps</h2>",
        "<p>Per row, accuracy on the held-out set at each check: line, mean over the row's runs; band, lowest to "
        "highest run. Evaluation mode (running statistics) in the row's colour, training mode (the held-out batch's "
        "own statistics) dashed grey. Click a mode in the legend to hide or show it in every panel.</p>",
        plot_steps,
        "<h2>The other figures</h2>",
        "<p>As <code>make figures</code> last drew them for this output folder (figures 1 and 3 are the interactive "
        "ones above).</p>",
        figures_html(out / "figures"),
        plotly_script(),
        f"<script>{LOADER % {'config': json.dumps(config), 'plotly': json.dumps(PLOTLY_ID)}}</script>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=plain(__doc__), formatter_class=argparse.RawDescriptionHelpFormatter)
    add_results_arguments(p)
    p.add_argument("--out", default=None, help=f"folder for {PAGE}, and whose figures/ it shows "
                   "(default: the results root read)")
    args = p.parse_args(argv)
    skipped: list[str] = []
    try:
        _plotly()  # before reading any run
    except PageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    found = command_inputs(args, ALL_TABLES, skipped=skipped)
    if found is None:
        return 2
    root, runs, out = found
    page = build_page(root, runs, out, skipped)
    records.atomic_write_text(out / PAGE, page)
    print(f"wrote {out / PAGE} ({len(page.encode()) / 2 ** 20:.1f} MiB) from {count(len(runs), 'run')} under {root}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
