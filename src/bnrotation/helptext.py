"""A module docstring as a command's ``--help`` text: the same words, without the markup meant for the docs.

The commands (``bnrotation-check``, ``python -m bnrotation.audit``, the analysis targets) describe themselves
in their module docstring, once. Sphinx reads its roles (``:func:`reestimate```) and literals (````x````); a
terminal shows them as noise, so :func:`plain` turns each into its name.
"""

from __future__ import annotations

import re

__all__ = ["plain"]

# :role:`name`, :role:`~pkg.mod.name` (the last part only, as Sphinx shows it) and :role:`text <target>`
_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`(~?)([^`<]*?)(?:\s*<[^`>]*>)?`")
_LITERAL = re.compile(r"``([^`]+)``")


def plain(doc: str | None) -> str:
    """``doc`` with each Sphinx role replaced by the name it shows and each ````literal```` by ``literal``; the
    rest, line breaks and indentation included, as it is. ``""`` for None (a module run without docstrings,
    ``python -OO``)."""
    if not doc:
        return ""
    text = _ROLE.sub(lambda m: m.group(2).rsplit(".", 1)[-1] if m.group(1) else m.group(2), doc)
    return _LITERAL.sub(r"\1", text)
