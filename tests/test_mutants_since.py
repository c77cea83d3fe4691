"""``make mutants SINCE=<commit>`` (tests/mutants_report.py): which functions a change touched, as mutmut names them.

Each test builds a small git repository of its own, commits a module, changes it, and reads the names back; the
second function, the second method and a deletion are the cases a one-of-each reading would get wrong.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mutants_report  # noqa: E402

BEFORE = '''\
def first(x):
    return x + 1


def second(x):
    y = x * 2
    return y


class Rule:
    def one(self):
        return 1

    def two(self):
        return 2


@staticmethod
def decorated():
    return 3
'''


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "mod.py").write_text(BEFORE)
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "base")
    return tmp_path


def test_only_the_changed_second_function_and_second_method_are_named(repo: Path):
    text = BEFORE.replace("y = x * 2", "y = x * 3").replace("return 2", "return 22")
    (repo / "src" / "pkg" / "mod.py").write_text(text)
    assert mutants_report.changed_functions("HEAD", repo) == ["pkg.mod.x_second", "pkg.mod.xǁRuleǁtwo"]


def test_a_deleted_line_names_the_function_it_was_in(repo: Path):
    (repo / "src" / "pkg" / "mod.py").write_text(BEFORE.replace("    y = x * 2\n    return y", "    return x * 2"))
    assert mutants_report.changed_functions("HEAD", repo) == ["pkg.mod.x_second"]


def test_a_change_to_a_decorator_names_its_function_and_an_untracked_file_names_all_of_its(repo: Path):
    (repo / "src" / "pkg" / "mod.py").write_text(BEFORE.replace("@staticmethod", "@classmethod"))
    (repo / "src" / "pkg" / "new.py").write_text("def fresh():\n    return 0\n\n\nclass K:\n    def m(self):\n"
                                                 "        return 1\n")
    assert mutants_report.changed_functions("HEAD", repo) == ["pkg.mod.x_decorated", "pkg.new.x_fresh",
                                                              "pkg.new.xǁKǁm"]


def test_no_change_names_nothing_and_an_unknown_commit_exits_2_naming_it(repo: Path, capsys):
    assert mutants_report.changed_functions("HEAD", repo) == []
    with pytest.raises(SystemExit) as stop:
        mutants_report.changed_functions("no-such-commit", repo)
    assert stop.value.code == 2
    assert "SINCE=no-such-commit" in capsys.readouterr().err


def test_a_changed_line_between_two_functions_names_neither(repo: Path):
    (repo / "src" / "pkg" / "mod.py").write_text(BEFORE.replace("\n\ndef second", "\n# a comment\ndef second"))
    assert mutants_report.changed_functions("HEAD", repo) == []
