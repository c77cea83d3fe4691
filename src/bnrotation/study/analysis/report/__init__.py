"""The report as a list of sections (:mod:`.section`: a title, a table from the runs, a caption, a legend; one
renderer for Markdown, LaTeX and HTML). It imports only :mod:`..formatting`: the sections themselves live with what
they read (the README's first screen: :mod:`..claims.front`). No torch."""

from .section import Column, Section, to_html, to_latex, to_markdown

__all__ = ["Column", "Section", "to_html", "to_latex", "to_markdown"]
