"""A report section and the one renderer that turns it into Markdown, LaTeX and HTML (no torch).

A :class:`Section` is a title, one function from runs to a :class:`pandas.DataFrame` of unrounded values, a caption
of at most :data:`MAX_WORDS` words and its :class:`Column` s, each linked to its definition in docs/PROTOCOL.md (the
section's :attr:`Section.legend`). Numbers are rounded only here, when a frame is rendered (:func:`shown`, through
:func:`..formatting.cell`); a section never holds a rounded figure.

The layout is pandas' :class:`~pandas.io.formats.style.Styler` (jinja2, in the lock): ``to_latex(hrules=True)``
writes a booktabs table, ``to_html`` the page's, ``to_string`` the rows of a Markdown pipe table.
``DataFrame.to_markdown`` would need tabulate, which neither the lock nor the package's dependencies hold.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd

from ..formatting import cell, spread

__all__ = ["MAX_WORDS", "PROTOCOL", "Column", "Section", "anchor", "shown", "sentences", "to_html", "to_latex",
           "to_markdown", "words"]

PROTOCOL = "docs/PROTOCOL.md"  # where every column is defined, relative to the checkout
MAX_WORDS = 30  # the most words of a caption, and of any generated sentence
EMPTY = "–"  # a cell with no value
DELIMITER = "\x1f"  # between the cells of Styler.to_string's lines (no cell holds it)


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation but hyphens dropped, spaces to hyphens
    (``'The published table (steps 2,000–6,000, 3 seeds)'`` -> ``'the-published-table-steps-20006000-3-seeds'``)."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")


def words(sentence: str) -> int:
    """How many words ``sentence`` has: its runs of characters between spaces."""
    return len(sentence.split())


def sentences(text: str) -> list[str]:
    """The sentences of ``text``: split after '.', '?' or '!' (or one closing bold ``**``) followed by a space and a
    capital, a backtick, a star or a digit ('0.5' and 'lr 3e-3, momentum' do not end one)."""
    return [s.strip() for s in re.split(r"(?:(?<=[.?!])|(?<=[.?!]\*\*))\s+(?=[A-Z`*\d])", text.strip()) if s.strip()]


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA


@dataclass(frozen=True)
class Column:
    """One column of a section: the frame's ``key``, its ``header``, ``defined_in`` (the heading of docs/PROTOCOL.md
    that defines it), and how a cell prints: ``unit`` (a key of :data:`..formatting.UNITS`; ``'text'`` as it is,
    ``'count'`` an integer), ``digits`` (decimals in the printed unit), ``sd`` (the key of the column holding its
    spread over seeds: the cell reads ``mean ± sd``) and ``difference`` (a difference or a gap: points, not %)."""

    key: str
    header: str
    defined_in: str
    unit: str = "text"
    digits: int | None = None
    sd: str | None = None
    difference: bool = False

    def text(self, line: pd.Series) -> str:
        """The cell of ``line`` (one line of a section's frame), rounded here and nowhere before."""
        value = line[self.key]
        if _missing(value) or value == "":
            return EMPTY
        if self.unit == "text":
            return str(value)
        if self.unit == "count":
            return f"{int(value):,}"
        sd = None if self.sd is None else line[self.sd]
        if self.difference:  # '28.3 points', or with its spread '28.3 ± 10.1 points'
            if _missing(sd):
                return spread(float(value), self.unit, digits=self.digits)
            return cell(float(value), self.unit, float(sd), digits=self.digits, sign=False)
        return cell(float(value), self.unit, None if _missing(sd) else float(sd), digits=self.digits,
                    spread_sign=False)


@dataclass(frozen=True)
class Section:
    """A title, ``table`` (a torch-free function from runs to a frame of unrounded values, one line per table row),
    a ``caption`` of at most :data:`MAX_WORDS` words, and its :class:`Column` s.

    Raises:
        ValueError: a caption over :data:`MAX_WORDS` words, or no column.
    """

    title: str
    table: Callable[..., pd.DataFrame]
    caption: str
    columns: tuple[Column, ...]

    def __post_init__(self):
        if not self.columns:
            raise ValueError(f"section {self.title!r}: no column")
        if words(self.caption) > MAX_WORDS:
            raise ValueError(f"section {self.title!r}: a caption of {words(self.caption)} words "
                             f"(at most {MAX_WORDS})")

    @property
    def legend(self) -> dict[str, str]:
        """Each column's header -> the link of its definition, ``docs/PROTOCOL.md#<anchor>``."""
        return {c.header: f"{PROTOCOL}#{anchor(c.defined_in)}" for c in self.columns}


def shown(section: Section, frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` as it prints: one string per cell (:meth:`Column.text`), the headers as columns; rounding happens
    here, once."""
    return pd.DataFrame([[c.text(line) for c in section.columns] for _, line in frame.iterrows()],
                        columns=[c.header for c in section.columns], dtype=object)


def _aligns(section: Section) -> list[str]:
    """Each column's alignment: text left, numbers right."""
    return ["l" if c.unit == "text" else "r" for c in section.columns]


def _md(text: str) -> str:
    """Text for a Markdown table cell: a literal | would end the cell."""
    return text.replace("|", "\\|")


def to_markdown(section: Section, frame: pd.DataFrame, protocol: str = PROTOCOL) -> str:
    """The section as Markdown: its title in bold and its caption, then the table, each header a link to its
    definition (the legend: ``protocol``, the path of docs/PROTOCOL.md from the file written), a row per line of
    ``frame``, or a line saying there is none."""
    table = shown(section, frame).map(_md)
    head = "| " + " | ".join(f"[{_md(c.header)}]({protocol}#{anchor(c.defined_in)})" for c in section.columns) + " |"
    rule = "|" + "|".join("---" if a == "l" else "---:" for a in _aligns(section)) + "|"
    body = table.style.hide(axis="index").to_string(delimiter=DELIMITER).splitlines()[1:] if len(table) else []
    lines = [f"| {' | '.join(line.split(DELIMITER))} |" for line in body]
    return "\n".join([f"**{section.title}.** {section.caption}", "", head, rule, *lines]
                     + ([] if lines else ["", "No runs yet."])) + "\n"


def to_latex(section: Section, frame: pd.DataFrame) -> str:
    """The section as a booktabs table (``\\toprule``, ``\\midrule``, ``\\bottomrule``) a write-up can ``\\input``,
    with its caption; cells escaped for LaTeX, Markdown's code spans as ``\\texttt``. Its ± and ° are UTF-8."""
    table = shown(section, frame)
    tex = (table.style.hide(axis="index").format(escape="latex").format_index(escape="latex", axis=1)
           .to_latex(hrules=True, column_format="".join(_aligns(section)),
                     caption=f"{section.title}. {section.caption}"))
    return re.sub(r"`([^`\n]*)`", r"\\texttt{\1}", tex)  # a row's name, `adam\_bn\_m0.3`, in type


def to_html(section: Section, frame: pd.DataFrame) -> str:
    """The section as an HTML table with its caption, cells escaped."""
    table = shown(section, frame)
    return (table.style.hide(axis="index").format(escape="html").format_index(escape="html", axis=1)
            .set_uuid(anchor(section.title)).set_caption(f"{section.title}. {section.caption}").to_html())
