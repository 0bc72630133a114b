"""CI runs the README's commands as written (issue: a green CI once hid a dependency the README's command did not
install, because CI installed into the machine's own interpreter). `.ci/run` makes a virtual environment of its own
and runs the README's test command verbatim; the README's first screen says what gpudoctor is and shows the commands a
user runs, and its "Tests" section exists (the suite's closing hint points there)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
CI = (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def _section(title: str) -> str:
    m = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README, re.M | re.S)
    assert m, f"README has no '## {title}' section"
    return m.group(1)


def _commands(text: str) -> list[str]:
    """The command lines of the text's ```sh blocks, comments dropped."""
    out = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def test_ci_runs_the_readme_test_command_verbatim_in_its_own_venv():
    test_command = _commands(_section("Tests"))[0]
    assert test_command == "pip install torch==2.13.0 -e '.[test]' && python -m pytest -n 3"
    ci_lines = [line.strip() for line in CI.splitlines()]
    assert test_command in ci_lines
    venv = ci_lines.index("python3 -m venv build/ci-venv")
    activate = ci_lines.index(". build/ci-venv/bin/activate")
    assert venv < activate < ci_lines.index(test_command)
    assert "python -m pytest -n 3 -m world" in ci_lines


def test_readme_first_screen_says_what_it_is_and_shows_the_commands():
    first = "\n".join(README.splitlines()[:30])
    assert "gpudoctor is the doctor for PyTorch GPU training jobs" in first
    shown = _commands(first)
    for command in (
        "gpudoctor check",
        "gpudoctor check --sbatch",
        "gpudoctor fix",
        "gpudoctor smoke",
        "gpudoctor watch",
    ):
        assert any(line.startswith(command) for line in shown), command
    assert "pip install ." in shown
    assert "python -m pytest -n 3" in first


def test_the_suite_hint_points_at_a_section_that_exists():
    hint = (ROOT / "tests" / "conftest.py").read_text(encoding="utf-8")
    assert "README: Tests" in hint
    _section("Tests")


def test_every_command_help_opens_with_its_line_in_the_command_list():
    import subprocess
    import sys

    top = subprocess.run([sys.executable, "-m", "gpudoctor", "--help"], capture_output=True, text=True, check=True)
    for name in ("check", "fix", "smoke", "watch", "health"):
        listed = re.search(rf"^\s+{name}\s+(.+?)(?=^\s{{4}}\S|\n\noptions)", top.stdout, re.M | re.S)
        assert listed, name
        first_words = " ".join(listed.group(1).split()[:4])
        own = subprocess.run([sys.executable, "-m", "gpudoctor", name, "--help"], capture_output=True, text=True)
        assert own.returncode == 0, own.stderr
        description = own.stdout.split("\n\n")[1]
        assert " ".join(description.split()[:4]).lower() == first_words.lower(), (name, description)
