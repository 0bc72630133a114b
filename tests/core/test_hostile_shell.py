"""What gpudoctor prints for a shell is read back by a real bash as exactly the bytes it stands for, and never
runs a command (issue 24, item 1): `eval "$(gpudoctor fix --shell)"`, `source` of `--env-file`, the
`export` lines `fix --apply` writes into a batch script, and the report's commands.

Every hostile value carries ways to run `touch MARKER` if a shell expanded it (`$(...)`, backticks, `${X@P}`
with X='$(touch MARKER)', an arithmetic subscript in `${PATH:...}`, quotes and `;` that would end a quoted
word, a newline, `$'...'`); each test asserts the marker file was never made and the variable's bytes equal
the input, non-UTF-8 bytes and control characters included.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpudoctor import shellquote
from gpudoctor.fixes import envfile
from gpudoctor.report import text as text_report
from tests.cliutil import clean_env

BASH = shutil.which("bash")
pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")
# torch >= 2.2 renamed these (checks/distributed/deprecated.py): the rename copies the user's value into the new name.
RENAMED = {
    "NCCL_ASYNC_ERROR_HANDLING": "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_BLOCKING_WAIT": "TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_DESYNC_DEBUG": "TORCH_NCCL_DESYNC_DEBUG",
    "NCCL_ENABLE_TIMING": "TORCH_NCCL_ENABLE_TIMING",
    "NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK": "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK",
}


def _raw(data: bytes) -> str:
    """bytes as os.environ holds them (undecodable bytes as surrogate escapes)."""
    return data.decode("utf-8", "surrogateescape")


def hostile_values(marker: Path) -> list[str]:
    m = str(marker)
    return [
        "${X@P}",
        f"${{PATH:a[$(touch {m})]}}",
        "${HOME}",
        "$HOME/x",
        f"$(touch {m})",
        f"`touch {m}`",
        f"'; touch {m}; '",
        f'"; touch {m}; "',
        f"a\ntouch {m}\n",
        f"$'\\x41'; touch {m}",
        _raw(b"\xff\xfe;touch " + m.encode() + b"\x80"),
        "\x1b]52;c;dG91Y2g=\x07\x1b[2J\x9b31m\x7f\b\r",
        "",
        'it\'s \\ a "quote" ~ * ? [a] {a,b} !x #c & | < > % =',
        "\u202etxt.exe\u2028é=cmd",
    ]


def _read_back(script: str, names: list[str], env: dict[str, str], cwd: Path) -> list[bytes]:
    """Run script in a real bash, then print the named variables' bytes (NUL-separated)."""
    return _read_back_each([script], names, env, cwd, reset=[])[0]


def _read_back_each(
    scripts: list[str], names: list[str], env: dict[str, str], cwd: Path, reset: list[str] | None = None
) -> list[list[bytes]]:
    """One bash runs each script in turn, each after the variables in reset (default: names) are unset, and
    prints the named variables' bytes."""
    dump = "printf '%s\\0' " + " ".join(f'"${{{n}-<unset>}}"' for n in names)
    clear = f"unset {' '.join(names if reset is None else reset)}\n" if (reset is None or reset) else ""
    parts = [f"{clear}{script}\n{dump}" for script in scripts]
    r = subprocess.run(
        [BASH, "-c", "\n".join(parts)], env=env, capture_output=True, timeout=30, cwd=cwd, stdin=subprocess.DEVNULL
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout.split(b"\0")
    return [out[i * len(names) : (i + 1) * len(names)] for i in range(len(scripts))]


def _shell_env(marker: Path) -> dict[str, str]:
    return {"PATH": os.environ["PATH"], "HOME": "/home/nobody", "X": f"$(touch {marker})", "LC_ALL": "C"}


# ---------------------------------------------------------------- the one quoting rule, generated


_fragments = st.sampled_from(
    [
        "$(touch MARKER)",
        "`touch MARKER`",
        "${X@P}",
        "${PATH:a[$(touch MARKER)]}",
        "${HOME}",
        "$HOME",
        "$'\\n'",
        "'",
        '"',
        "\\",
        ";",
        "\n",
        "\t",
        " ",
        "!",
        "*",
        "~",
        "=",
        "#",
        "&",
        "|",
        "{a,b}",
        "[a]",
        "\x1b]52;c;AAAA\x07",
        "\x1b[31m",
        "\x9b",
        "\x7f",
        "\udcff",
        "\udc80",
        "é",
        "\u202e",
        "a",
        "_",
        "0",
    ]
)
_values = st.one_of(
    st.lists(_fragments, max_size=8).map("".join),
    st.binary(max_size=24).map(lambda b: _raw(b.replace(b"\0", b""))),
    st.text(max_size=16).filter(lambda t: "\0" not in t),
)


@settings(max_examples=40, deadline=None, database=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_values, min_size=1, max_size=6))
def test_generated_values_reach_bash_exactly_through_shell_lines_and_env_file(tmp_path_factory, values):
    tmp = tmp_path_factory.mktemp("gen")
    marker = tmp / "MARKER"
    values = [v.replace("MARKER", str(marker)) for v in values]
    names = [f"V{i}" for i in range(len(values))]
    changes = dict(zip(names, values, strict=True))
    shell_lines = "\n".join(envfile.lines(changes))
    assert all(ch == "\n" or shellquote.unprintable(ch) is False for ch in shell_lines)  # terminal-safe text
    assert len(shell_lines.splitlines()) == len(values)  # one line per variable
    env_file = tmp / "gpudoctor.env"
    env_file.write_text(envfile.render(changes), encoding="utf-8")  # printable text only: no surrogate left
    (tmp / "lines").write_text(shell_lines + "\n", encoding="utf-8")
    expected = [v.encode("utf-8", "surrogateescape") for v in values]
    # the report's copy-pasteable commands use the same rule
    report = "\n".join(text_report.export_line(n, v) for n, v in changes.items())
    got = _read_back_each(['eval "$(cat lines)"', f"source {env_file}", report], names, _shell_env(marker), tmp)
    assert got == [expected] * 3
    assert not marker.exists()


@settings(max_examples=40, deadline=None, database=None, derandomize=True)
@given(st.text(min_size=1, max_size=12))
def test_a_name_that_is_not_a_shell_name_is_never_printed_as_an_assignment(name):
    assume(name != "OK")
    ok = shellquote.is_name(name)
    out = envfile.lines({name: "1", "OK": None})
    assert sorted(out) == sorted(([f"export {name}=1"] if ok else []) + ["unset OK"])
    assert (text_report.export_line(name, "1") == f"export {name}=1") is ok
    if not ok:
        assert text_report.export_line(name, "1").startswith("# ")
        assert not any(shellquote.unprintable(ch) for ch in text_report.unset_line(name))


def test_only_a_reference_gpudoctor_made_stays_live(tmp_path):
    marker = tmp_path / "MARKER"
    env = {**_shell_env(marker), "SLURM_CPUS_PER_TASK": "16"}
    lines = envfile.lines({"A": shellquote.Reference("SLURM_CPUS_PER_TASK"), "B": "$SLURM_CPUS_PER_TASK"})
    assert _read_back("\n".join(lines), ["A", "B"], env, tmp_path) == [b"16", b"$SLURM_CPUS_PER_TASK"]
    with pytest.raises(ValueError):
        shellquote.Reference("X; touch y")


def test_a_posix_sh_without_dollar_single_quotes_still_runs_no_command(tmp_path):
    """dash (Debian's /bin/sh) has no `$'...'`: a control byte's value comes out wrong there, never a command;
    every other value is exact in any POSIX shell."""
    dash = shutil.which("dash")
    if dash is None:
        pytest.skip("no dash here")
    marker = tmp_path / "MARKER"
    values = hostile_values(marker)
    names = [f"V{i}" for i in range(len(values))]
    env_file = tmp_path / "gpudoctor.env"
    env_file.write_text(envfile.render(dict(zip(names, values, strict=True))), encoding="utf-8")
    dump = "printf '%s\\0' " + " ".join(f'"${n}"' for n in names)
    r = subprocess.run([dash, "-c", f". {env_file}\n{dump}"], env=_shell_env(marker), capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    got = r.stdout.split(b"\0")[: len(names)]
    for value, back in zip(values, got, strict=True):
        if not any(shellquote.unprintable(ch) for ch in value):
            assert back == value.encode("utf-8", "surrogateescape")
    assert not marker.exists()


# ---------------------------------------------------------------- the real command, end to end


def _gpudoctor(*args: str) -> str:
    return " ".join([sys.executable, "-m", "gpudoctor", *args])


@pytest.mark.parametrize("group", [0, 1, 2], ids=["expansions", "quotes", "bytes-and-text"])
def test_eval_of_fix_shell_and_source_of_env_file_keep_the_users_value(tmp_path, group):
    """The rename of NCCL_* to TORCH_NCCL_* copies the user's value: a real bash evaluating gpudoctor's output
    gets exactly that value, five hostile values per run (one per renamed variable)."""
    marker = tmp_path / "MARKER"
    values = hostile_values(marker)[group * 5 : group * 5 + 5]
    olds = list(RENAMED)[: len(values)]
    user_env = clean_env(dict(zip(olds, values, strict=True)), drop=("TORCH_NCCL_", "ENABLE_NCCL"))
    user_env["X"] = f"$(touch {marker})"
    env_file = tmp_path / "gpudoctor.env"
    news = [RENAMED[o] for o in olds]
    expected = [v.encode("utf-8", "surrogateescape") for v in values]
    fix = _gpudoctor("fix", "--select", "distributed", "--shell", "--env-file", str(env_file))
    got = _read_back(f'eval "$({fix})" || exit 9', news + olds, user_env, tmp_path)
    assert got == expected + [b"<unset>"] * len(olds)
    got = _read_back(f"source {env_file}", news, {**user_env, **_shell_env(marker)}, tmp_path)
    assert got == expected
    assert not marker.exists()


def test_fix_apply_writes_exports_bash_reads_back_exactly(tmp_path):
    """--sbatch --apply writes the renamed variables into the batch script: the script's own bash gets the
    user's bytes and runs nothing else."""
    marker = tmp_path / "MARKER"
    values = hostile_values(marker)[:5]
    script = tmp_path / "job.slurm"
    script.write_text("#!/bin/bash\n#SBATCH --nodes=1\nsrun python train.py\n")
    olds = list(RENAMED)[: len(values)]
    user_env = clean_env(dict(zip(olds, values, strict=True)), drop=("TORCH_NCCL_", "ENABLE_NCCL"))
    r = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "fix", "--select", "distributed", "--sbatch", str(script), "--apply"],
        env=user_env,
        capture_output=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stderr
    body = script.read_text(encoding="utf-8").replace("srun python train.py\n", "")
    assert body.count("\n") == 2 + 2 * len(values)  # one export and one unset line per variable
    news = [RENAMED[o] for o in olds]
    got = _read_back(body, news, {**_shell_env(marker), **dict(zip(olds, values, strict=True))}, tmp_path)
    assert got == [v.encode("utf-8", "surrogateescape") for v in values]
    assert not marker.exists()


def test_a_value_gpudoctor_only_saw_redacted_is_never_written_as_the_blank(tmp_path):
    """A credential reaches gpudoctor blanked (`<redacted>@host`): copying it would replace the user's value
    with the blank, so the rename is a manual step in which the shell copies its own bytes."""
    value = "user:pass@host"
    env = clean_env({"NCCL_ASYNC_ERROR_HANDLING": value}, drop=("TORCH_NCCL_", "ENABLE_NCCL"))
    r = subprocess.run(
        [sys.executable, "-m", "gpudoctor", "fix", "--select", "distributed", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    plan = json.loads(r.stdout)
    assert plan["shell"] == [] and plan["env"] == [] and "user:pass" not in r.stdout + r.stderr
    command = 'export TORCH_NCCL_ASYNC_ERROR_HANDLING="$NCCL_ASYNC_ERROR_HANDLING"; unset NCCL_ASYNC_ERROR_HANDLING'
    assert [m["commands"] for m in plan["manual"]] == [[command]]
    assert _read_back(command, ["TORCH_NCCL_ASYNC_ERROR_HANDLING"], env, tmp_path) == [value.encode()]
