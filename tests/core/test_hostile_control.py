"""Terminal control sequences in what gpudoctor reads -- a batch script's content, its file name, an
environment value -- never reach stdout or stderr raw (issue 24, item 3), whatever the command or format:
check (text, github, concise, json), gpudoctor-hook, fix (plan, --diff, --json, --shell, --env-file).

One sanitiser (gpudoctor.sanitize.clean) makes text safe; GitHub's own escaping of %, CR and LF stays;
the shell lines write a control byte as an octal escape inside `$'...'` (gpudoctor.shellquote). The check is
`cat -v`'s: no C0 control other than newline and tab, no DEL, no C1 control (U+0080-U+009F), and no byte
that is not UTF-8 (a raw 0x9b is CSI to an 8-bit terminal).
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudoctor.cli import main
from gpudoctor.hook import main as hook_main
from gpudoctor.report.annotations import escape_data
from gpudoctor.sanitize import clean
from tests.cliutil import clean_env


def raw_controls(data: bytes) -> list[str]:
    """The control characters in data that a terminal would act on (as `cat -v` shows them: ^X, M-^X)."""
    text = data.decode("utf-8", "surrogateescape")
    return [
        repr(ch)
        for ch in text
        if (ord(ch) < 0x20 and ch not in "\n\t") or 0x7F <= ord(ch) <= 0x9F or 0xD800 <= ord(ch) <= 0xDFFF
    ]


def _raw(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


HOSTILE = [
    "\x1b]52;c;dG91Y2g=\x07",  # OSC 52: writes the clipboard
    "\x1b]0;title\x1b\\",  # OSC 0 ended by ST: retitles the window
    "\x1b[2J\x1b[H",  # CSI: clears the screen
    "\x1b[31m",
    "\x9b31m",  # C1 CSI (U+009B)
    "\x9d0;t\x9c",  # C1 OSC ... ST
    "\x85",  # C1 NEL
    "\x07",
    "\x7f",
    "\b\b\b",
    "\r",
    "\x1bP1$r\x1b\\",  # DCS
    _raw(b"\x9b31m"),  # a raw byte 0x9b, not UTF-8
    _raw(b"\xff\xfe"),
    "%0A%25",
]

_pieces = st.lists(st.sampled_from([*HOSTILE, "a", "b", "1", " ", "é", "-"]), min_size=1, max_size=6).map("".join)


def _script(payload: str) -> str:
    """A batch script with payload in a directive, comments, an export's value and the launch line, whose
    findings quote several of them (GD-SLURM-003, -010, GD-NCCL-006). Each payload is followed by a letter:
    a CR before the line break would be a DOS line break, which sbatch refuses before anything is quoted."""
    return (
        "#!/bin/bash\n"
        f"#SBATCH --job-name=j{payload}x\n"
        "#SBATCH --nodes=1\n#SBATCH --ntasks=1\n#SBATCH --gres=gpu:8\n"
        f"# {payload}x\n"
        f"export NCCL_DEBUG=INFO{payload}x\n"
        f"export CUDA_VISIBLE_DEVICES=0,1{payload}x\n"
        f"srun python train.py --tag '{payload}x'\n"
    )


def _file_name(payload: str) -> str:
    return "job" + payload.replace("/", "")[:200] + ".slurm"


@contextmanager
def _environment(extra: dict[str, str]):
    with mock.patch.dict(os.environ, clean_env(extra), clear=True):
        yield


def _run(entry, argv: list[str]) -> tuple[int, bytes]:
    """entry(argv) in this process, its stdout and stderr as the bytes a terminal would get (UTF-8; an
    unencodable surrogate written as the raw byte it stands for, as Python does in the C locale)."""
    out = io.BytesIO()
    stream = io.TextIOWrapper(out, encoding="utf-8", errors="surrogateescape", write_through=True)
    with redirect_stdout(stream), redirect_stderr(stream):
        code = entry(argv)
        stream.flush()
    return code, out.getvalue()


COMMANDS = [
    (main, ["check", "--sbatch"]),
    (main, ["check", "-v", "--sbatch"]),
    (main, ["check", "--format", "github", "--sbatch"]),
    (main, ["check", "--format", "concise", "--sbatch"]),
    (main, ["check", "--json", "--sbatch"]),
    (hook_main, ["sbatch"]),
    (main, ["fix", "--unsafe-fixes", "--sbatch"]),
    (main, ["fix", "--diff", "--unsafe-fixes", "--sbatch"]),
    (main, ["fix", "--json", "--unsafe-fixes", "--sbatch"]),
    # this machine's environment: the renamed variable's value in the shell lines and the env file
    (main, ["fix", "--select", "distributed", "--shell", "--env-file", "{env_file}"]),
    (main, ["check", "--sbatch", "{missing}", "--config", "{script}"]),  # no such file: its name in the error
]
EVERY_PAYLOAD = "x".join(HOSTILE)


def _assert_clean(tmp: Path, payload: str, commands=COMMANDS) -> None:
    script = tmp / _file_name(payload)
    script.write_text(_script(payload), encoding="utf-8", errors="surrogateescape")
    env_file = tmp / "gpudoctor.env"
    names = {"env_file": str(env_file), "missing": str(tmp / _file_name(payload + "-missing"))}
    # the environment gpudoctor reads carries the payload too: a renamed variable's value (GD-DIST-005)
    with _environment({"NCCL_BLOCKING_WAIT": payload}):
        for entry, args in commands:
            argv = [a.format(**names, script=script) for a in args]
            code, out = _run(entry, argv if "{script}" in args or argv[-1] != "--sbatch" else [*argv, str(script)])
            assert code in (0, 1, 2) and b"Traceback" not in out, (args, out[-300:])
            assert not raw_controls(out), (args, raw_controls(out), out[-400:])
    if env_file.exists():
        assert b"export TORCH_NCCL_BLOCKING_WAIT=" in env_file.read_bytes()
        assert not raw_controls(env_file.read_bytes())


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(a for a in args if "{" not in a) for _, args in COMMANDS])
def test_every_control_sequence_stays_off_the_terminal_in_each_command(tmp_path, command):
    _assert_clean(tmp_path, EVERY_PAYLOAD, [command])


@settings(max_examples=4, deadline=None, database=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(_pieces)
def test_generated_control_sequences_stay_off_the_terminal(tmp_path_factory, payload):
    quick = [COMMANDS[i] for i in (0, 2, 3, 7, 9)]  # text, github, concise, the fix diff, shell lines and env file
    _assert_clean(tmp_path_factory.mktemp("ctl"), payload, quick)


def test_github_escaping_of_percent_cr_lf_stays_the_toolkits():
    assert escape_data("50% done\r\nnext") == "50%25 done%0D%0Anext"
    assert escape_data("a\x1b]52;c;QQ==\x07b\x9b") == "ab\\x9b"  # the sanitiser first


def test_a_byte_that_is_not_utf8_is_shown_as_the_byte():
    assert clean(_raw(b"a\x9bb\xff")) == "a\\x9bb\\xff"


def test_the_real_command_on_a_terminal_stream(tmp_path):
    """The same through a real process's stdout and stderr (its encoding, its error handler)."""
    payload = "\x1b]52;c;dG91Y2g=\x07" + _raw(b"\x9b") + "\r\x7f"
    script = tmp_path / _file_name(payload)
    script.write_text(_script(payload), encoding="utf-8", errors="surrogateescape")
    for args in (["fix", "--diff"],):  # the diff quotes the script, the plan the environment's value
        r = subprocess.run(
            [sys.executable, "-m", "gpudoctor", *args, "--sbatch", str(script)],
            capture_output=True,
            env=clean_env({"NCCL_BLOCKING_WAIT": payload}),
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        assert r.returncode in (0, 1), r.stderr
        assert not raw_controls(r.stdout + r.stderr), (args, r.stdout[-400:], r.stderr[-400:])
