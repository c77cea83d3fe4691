"""A module docstring as a command's ``--help`` text: the same words, without the markup meant for the docs; and
the exit status every command that judges shares.

The commands (``bnrotation-check``, ``python -m bnrotation.audit``, the analysis targets) describe themselves
in their module docstring, once. Sphinx reads its roles (``:func:`reestimate```) and literals (````x````); a
terminal shows them as noise, so :func:`plain` turns each into its name.

The commands that judge (``bnrotation-check``, ``python -m bnrotation.audit``) end with one convention, so that a
CI gate written for one reads the other: :func:`exit_status` computes it, :data:`EXIT_STATUS` words it, in every
such command's ``--help`` (its epilog) and in the docs (``docs/monitor.md``, ``docs/troubleshooting.md``; a test
compares them).
"""

from __future__ import annotations

import re

__all__ = ["plain", "EXIT_NOTHING_FOUND", "EXIT_FOUND", "EXIT_UNUSABLE", "EXIT_STATUS", "exit_status"]

# The exit status of a command that judges: nothing found, a problem found, bad input or a verdict it cannot give.
EXIT_NOTHING_FOUND, EXIT_FOUND, EXIT_UNUSABLE = 0, 1, 2
EXIT_STATUS = (f"Exit status: {EXIT_NOTHING_FOUND}, nothing found; {EXIT_FOUND}, a problem found (stale "
               f"statistics, a stale averaged copy); {EXIT_UNUSABLE}, bad input or undetermined (one line says "
               "which).")

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



def exit_status(found: bool, undetermined: bool = False) -> int:
    """The exit status of a command that judged (:data:`EXIT_STATUS`): :data:`EXIT_FOUND` when it ``found`` a
    problem (it outranks an undetermined part of the verdict: what was found stands), else :data:`EXIT_UNUSABLE`
    when the verdict is ``undetermined``, else :data:`EXIT_NOTHING_FOUND`. Bad input exits :data:`EXIT_UNUSABLE`
    before any verdict."""
    if found:
        return EXIT_FOUND
    return EXIT_UNUSABLE if undetermined else EXIT_NOTHING_FOUND
