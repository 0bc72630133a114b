"""The batch script read as bash reads it (issue 10), the typed result with spans (issue 9), and the
inputs that broke the old reader (issue 13 B2, B3, B5, B7): real files, real FIFOs, real bash."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudoctor.model import Severity
from gpudoctor.probe import bash as bash_probe
from gpudoctor.probe.bash import bash_syntax
from gpudoctor.readers.sbatch import REDACTED, SbatchError, load_sbatch, parse_sbatch
from gpudoctor.readers.sbatch import reader as sbatch_reader
from gpudoctor.readers.sbatch.shell import commands, tokenize, unquote
from tests.cliutil import run_gpudoctor, run_gpudoctor_here
from tests.factsutil import make_facts, run, said

# The user's SLURM DDP guide's "correct approach" exactly as the guide prints it (plus #!/bin/bash).
CORRECT_AS_PRINTED = Path(__file__).parents[1] / "fixtures" / "sbatch" / "seed-guide-correct-approach.slurm"
BASH = shutil.which("bash")


def parse(body: str):
    return parse_sbatch("#!/bin/bash\n#SBATCH -N1\n" + body, "job.slurm")


def findings(check_id: str, sb):
    return run(check_id, make_facts(), sbatch=sb, sbatch_path=sb.path)


def gpudoctor(*args: str) -> subprocess.CompletedProcess:
    """The CLI's answer, run in this process."""
    return run_gpudoctor_here(*args)


# ---------------------------------------------------------------- backslash, blanks, comment (the seed's trap)


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_the_seeds_fixed_script_as_printed_is_cut_where_bash_cuts_it(tmp_path):
    # Real bash, with `python` standing in for the training: which lines does it run as commands of their own?
    ran = subprocess.run(
        [BASH, "-c", f'python() {{ printf "%s\\0" "$@"; }}; export -f python; {BASH} {CORRECT_AS_PRINTED}'],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    not_found = [int(n) for n in re.findall(r"line (\d+): \S+: command not found", ran.stderr)]
    assert not_found, ran.stderr
    sb = load_sbatch(str(CORRECT_AS_PRINTED))
    assert [b.next_line for b in sb.broken_continuations] == not_found
    args = ran.stdout.split("\0")[:-1]  # the words python is given, exactly
    assert sb.launch.script_args == tuple(args[1:])  # the launch loses the arguments below the trap, as in bash
    assert "trainer.params.num_nodes=1" not in sb.launch.script_args


def test_the_trap_is_a_failing_finding_with_both_lines():
    sb = load_sbatch(str(CORRECT_AS_PRINTED))
    (f,) = findings("GD-SLURM-013", sb)
    assert f.severity is Severity.FAIL
    assert "line 14" in said(f) and "line 15" in said(f) and "command not found" in said(f)
    assert "trainer.params.accelerator=gpu \\" in f.evidence["line 14"]
    assert f.evidence["line 15"].startswith("trainer.params.num_nodes=1")
    assert f.fix is not None and len(f.fix.actions) == 2 and all(a.target == sb.path for a in f.fix.actions)


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_deleting_what_follows_the_backslash_repairs_the_script(tmp_path):
    script = tmp_path / "job.slurm"
    script.write_bytes(CORRECT_AS_PRINTED.read_bytes())
    for b in load_sbatch(str(script)).broken_continuations:  # the repair the finding names, by its line
        repair = rf"{b.line}s/\\[[:blank:]]+(#.*)?$/\\/"
        subprocess.run(["sed", "-i", "-E", repair, str(script)], check=True, timeout=30)
    repaired = load_sbatch(str(script))
    assert repaired.broken_continuations == ()
    assert "trainer.params.num_nodes=1" in repaired.launch.script_args
    assert findings("GD-SLURM-013", repaired)[0].severity is Severity.PASS


TRAPS = ["a \\ \n", "a\\\t  # c\n", "a \\    # note\n"]
NOT_TRAPS = [
    "a \\\n",
    "a\\\t# c\n",
    "'a \\  # c'\n",
    "a \\\\  # c\n",
    "a # note \\  x\n",
]  # `\<tab>#`: one word, no comment


@pytest.mark.parametrize("line", TRAPS + NOT_TRAPS)
def test_only_a_backslash_that_escapes_a_trailing_blank_is_the_trap(line):
    sb = parse(f"srun python t.py {line}b=1\n")
    assert bool(sb.broken_continuations) == (line in TRAPS)


# ---------------------------------------------------------------- expansions kept as written


@pytest.mark.parametrize(
    "body, word",
    [
        ("srun torchrun --nnodes=2 --rdzv_endpoint=$(hostname):29500 train.py\n", "--rdzv_endpoint=$(hostname):29500"),
        (
            "head_node=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1)\n"
            "srun torchrun --rdzv_endpoint=$head_node:29500 train.py\n",
            "--rdzv_endpoint=$head_node:29500",
        ),
        (
            "srun torchrun --rdzv_endpoint=${MASTER_ADDR}:$((29500 + SLURM_JOB_ID % 100)) t.py\n",
            "--rdzv_endpoint=${MASTER_ADDR}:$((29500 + SLURM_JOB_ID % 100))",
        ),
        (
            'srun python t.py --ip="$(getent hosts $(hostname) | cut -d" " -f1)"\n',
            '--ip="$(getent hosts $(hostname) | cut -d" " -f1)"',
        ),
    ],
)
def test_expansions_stay_whole_in_the_launch_line(body, word):
    sb = parse(body)
    assert f" {word}" in sb.launch.text
    ev = run("GD-SLURM-012", make_facts(), sbatch=sb, sbatch_path="job.slurm")[0].evidence
    assert word in ev["launch line"]


def test_the_command_substitution_reaches_the_launcher_intact():
    sb = parse("srun torchrun --nnodes=2 --rdzv_endpoint=$(hostname):29500 train.py\n")
    assert sb.launch.rdzv_endpoint == "$(hostname):29500" and sb.launch.script == "train.py"


def test_an_array_launch_is_read_through_its_elements():
    sb = parse('CMD=(torchrun --nproc_per_node=8 "train.py" --lr 1e-4)\nsrun "${CMD[@]}"\n')
    assert sb.launch.launcher == "torchrun" and sb.launch.nproc_per_node == "8" and sb.launch.script == "train.py"
    assert sb.launch.text == 'srun "${CMD[@]}"'


def test_here_documents_and_hashes_inside_words_are_not_commands_or_comments():
    sb = parse("cat > run.sh <<'EOF'\nsrun python never.py\nEOF\nsrun python t.py --tag=a#b # note\n")
    assert [ln.script for ln in sb.launches] == ["t.py"] and sb.launch.script_args == ("--tag=a#b",)


# ---------------------------------------------------------------- spans for the fix engine


def test_every_value_keeps_its_span():
    text = (
        "#!/bin/bash\n#SBATCH --nodes=2 -c 8\n#SBATCH --gres=gpu:h100:8   # eight\n"
        'export NCCL_SOCKET_IFNAME="ib0"\nsrun torchrun \\\n  --nproc_per_node=8 t.py\n'
    )
    sb = parse_sbatch(text, "job.slurm")
    gres = sb.directive("gres")
    assert text[gres.value_span.start : gres.value_span.end] == "gpu:h100:8"
    assert (gres.value_span.line, gres.value_span.column) == (3, 15) and gres.line_span.line == 3
    cpus = sb.directive("cpus-per-task")
    assert cpus.written == "-c" and text[cpus.span.start : cpus.span.end] == "-c 8"
    nodes = sb.directive("nodes")
    assert text[nodes.value_span.start : nodes.value_span.end] == "2"
    export = sb.exports["NCCL_SOCKET_IFNAME"]
    assert export.value == "ib0" and text[export.value_span.start : export.value_span.end] == '"ib0"'
    assert (sb.launch.span.line, sb.launch.span.end_line) == (5, 6)
    assert text[sb.launch.span.start : sb.launch.span.end] == "srun torchrun \\\n  --nproc_per_node=8 t.py"


# ---------------------------------------------------------------- bash -n


def _script(tmp_path, body: str) -> str:
    path = tmp_path / "job.slurm"
    path.write_text("#!/bin/bash\n#SBATCH -N1\n" + body)
    return str(path)


def load_checked(path: str):
    """As `check --sbatch` loads it: with `bash -n` (gpudoctor.probe.bash)."""
    return load_sbatch(path, check_syntax=bash_syntax)


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_a_script_bash_cannot_parse_fails(tmp_path):
    sb = load_checked(_script(tmp_path, 'if [ -n "$X" ]; then\n  srun python t.py\n'))
    (f,) = findings("GD-SLURM-014", sb)
    assert f.severity is Severity.FAIL and "syntax error" in said(f)
    good = load_checked(_script(tmp_path, "srun python t.py\n"))
    assert findings("GD-SLURM-014", good)[0].severity is Severity.PASS


def test_without_bash_the_syntax_check_is_skipped_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no bash on it
    (f,) = findings("GD-SLURM-014", load_checked(_script(tmp_path, "srun python t.py\n")))
    assert f.severity is Severity.SKIP and "bash is not on PATH" in said(f)


def test_a_hanging_bash_is_killed_with_its_children(tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    fake = tmp_path / "bin" / "bash"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\nsleep 300 &\necho $$ $! > {pids}\nwait\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    monkeypatch.setattr(bash_probe, "BASH_TIMEOUT_S", 1.0)
    start = time.monotonic()
    (f,) = findings("GD-SLURM-014", load_checked(_script(tmp_path, "srun python t.py\n")))
    assert time.monotonic() - start < 10
    assert f.severity is Severity.SKIP and "did not finish" in said(f)
    for pid in map(int, pids.read_text().split()):
        deadline = time.monotonic() + 5
        while os.path.exists(f"/proc/{pid}") and "Z" not in _state(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(f"/proc/{pid}") or "Z" in _state(pid), f"process {pid} outlived the timeout"


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


# ---------------------------------------------------------------- issue 13: inputs that broke the reader


@pytest.mark.parametrize(
    "name, text",
    [
        ("23 lines of X=$X$X", "#!/bin/bash\nX=ab\n" + "X=$X$X\n" * 23 + "srun python t.py $X\n"),
        (
            "100k assignment lines",
            "#!/bin/bash\n" + "".join(f"V{i}=$V{i - 1}x\n" for i in range(100_000)) + "srun python t.py\n",
        ),
        ("one 3 MB word", "#!/bin/bash\nsrun python t.py " + "a" * 3_000_000 + "\n"),
        ("1500 nested wrappers", "#!/bin/bash\nsrun " + "env " * 1500 + "uv run " * 1500 + "python t.py\n"),
        ("1500 nested bash -c", "#!/bin/bash\nsrun " + "bash -c " * 1500 + "python t.py\n"),
        ("1500 nested $(", "#!/bin/bash\nsrun python t.py " + "$(" * 1500 + ")" * 1500 + "\n"),
    ],
)
def test_adversarial_scripts_are_read_in_bounded_time(tmp_path, name, text):
    path = tmp_path / "job.slurm"
    path.write_text(text)
    start = time.monotonic()
    sb = load_sbatch(str(path))
    assert time.monotonic() - start < 30, name  # the old reader: exponential, quadratic, or RecursionError
    assert all(len(v) <= 64 * 1024 for v in sb.variables.values())


def test_a_doubling_variable_becomes_unknown_instead_of_growing():
    sb = parse_sbatch("#!/bin/bash\nX=ab\n" + "X=$X$X\n" * 23 + "srun python t.py --x=$X\n", "job.slurm")
    assert len(sb.launch.expanded) < 200_000


@pytest.mark.parametrize(
    "directive",
    [
        "--ntasks=" + "9" * 5000,
        "--nodes=" + "1" * 5000,
        "--gres=gpu:" + "8" * 5000,
        "--cpus-per-task=0" + "0" * 5000 + "8",
    ],
)
def test_a_5000_digit_number_is_one_line_and_exit_2(tmp_path, directive):
    path = _script(tmp_path, "").replace("", "")
    Path(path).write_text(f"#!/bin/bash\n#SBATCH {directive}\nsrun python t.py\n")
    with pytest.raises(SbatchError, match="digits"):
        load_sbatch(path)
    r = gpudoctor("check", "--sbatch", path, "--select", "slurm")
    assert r.returncode == 2 and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_5000_digit_numbers_in_the_body_are_unknown_not_a_crash():
    sb = parse("N=" + "9" * 5000 + "\nif [ $N -gt 1 ]; then srun python t.py --n=$((N * 2)); fi\n")
    assert sb.launch is not None and "$((N * 2))" in sb.launch.expanded


def test_a_fifo_and_a_dev_zero_link_are_refused_at_once(tmp_path):
    fifo = tmp_path / "job.fifo"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.slurm"
    zero.symlink_to("/dev/zero")
    for path in (fifo, zero):
        start = time.monotonic()
        with pytest.raises(SbatchError, match="not a regular file"):
            load_sbatch(str(path))
        r = run_gpudoctor("check", "--sbatch", str(path), "--select", "slurm", timeout=60)  # a hang is killed
        assert r.returncode == 2 and "not a regular file" in r.stderr and "Traceback" not in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        assert time.monotonic() - start < 60


def test_an_oversized_script_is_refused(tmp_path):
    path = tmp_path / "big.slurm"
    path.write_text("#!/bin/bash\n" + "#" * (sbatch_reader.MAX_SCRIPT_BYTES + 1))
    with pytest.raises(SbatchError, match="refused"):
        load_sbatch(str(path))


SECRET = "wandb_live_3f9a8c7e1d2b"


def test_credentials_in_the_script_never_reach_the_output(tmp_path):
    path = tmp_path / "job.slurm"
    path.write_text(
        "#!/bin/bash\n#SBATCH --nodes=1 --ntasks-per-node=8 --gres=gpu:8\n"
        f"export WANDB_API_KEY={SECRET}\nexport DB_PASSWORD='{SECRET}'\nAUTH=\"--token {SECRET}\"\n"
        f"HF_TOKEN={SECRET} srun python train.py --wandb-key=$WANDB_API_KEY --api-key {SECRET} $AUTH\n"
    )
    sb = load_sbatch(str(path))
    assert SECRET not in repr(sb)
    assert sb.exports["WANDB_API_KEY"].value == REDACTED and sb.exports["WANDB_API_KEY"].redacted
    assert "--wandb-key=$WANDB_API_KEY" in sb.launch.text
    r = gpudoctor("check", "--sbatch", str(path), "--select", "slurm,distributed", "--json", "-v")
    assert r.returncode in (0, 1), r.stderr
    assert SECRET not in r.stdout and SECRET not in r.stderr
    assert "srun python train.py" in r.stdout  # the launch line is still shown, without the values


def test_credentials_in_directives_are_redacted_where_they_are_shown():
    sb = parse_sbatch(
        f"#!/bin/bash\n#SBATCH --export=ALL,HF_TOKEN={SECRET}\nmodule load x\n"
        f"#SBATCH --comment=WANDB_API_KEY={SECRET}\nsrun python t.py\n",
        "job.slurm",
    )
    assert SECRET not in repr(sb)
    assert sb.options["export"] == f"ALL,HF_TOKEN={REDACTED}"
    (f,) = findings("GD-SLURM-011", sb)
    assert f.severity is Severity.WARN and SECRET not in said(f) + json.dumps(f.evidence, default=str)


def test_the_fast_credential_prefilter_matches_the_facts_rule():
    # reader.redact searches upper-cased text with facts' pattern, compiled case-sensitive: it must stay upper case.
    from gpudoctor.redact import _CREDENTIAL, is_credential_name

    assert _CREDENTIAL.pattern == _CREDENTIAL.pattern.upper()
    for name in ("wandb_api_key", "HfToken", "db_password", "MY_SECRET", "x_auth"):
        assert is_credential_name(name) and sbatch_reader.redact(f"{name}=v") == f"{name}={REDACTED}"


# ---------------------------------------------------------------- a line that lost its backslash

LOST_BACKSLASH = (
    "#!/bin/bash\n#SBATCH --nodes=1 --gres=gpu:8\n"
    "srun torchrun --nproc_per_node=8 train.py \\\n"
    "    --lr 1e-4\n"
    "    --batch-size 32 \\\n"
    "    trainer.max_epochs=10\n"
    'case "$1" in\n  --help|-h) echo usage;;\nesac\n'
    "+model.dropout=0.1\n"
)


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
def test_lines_bash_runs_as_missing_commands_are_found_as_bash_finds_them(tmp_path):
    script = tmp_path / "job.slurm"
    script.write_text(LOST_BACKSLASH)
    ran = subprocess.run(
        [BASH, "-c", f"srun() {{ :; }}; export -f srun; {BASH} {script}"],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=tmp_path,
    )
    not_found = [int(n) for n in re.findall(r"line (\d+): \S+: command not found", ran.stderr)]
    sb = load_sbatch(str(script))
    assert [a.line for a in sb.stray_arguments] == not_found == [5, 10]
    assert sb.stray_arguments[0].previous_line == 4 and sb.stray_arguments[0].program == "--batch-size"
    (f,) = findings("GD-SLURM-015", sb)
    assert f.severity is Severity.FAIL and "line 4 above ends the command without a backslash" in said(f)
    assert f.evidence["line 5"] == "--batch-size 32 trainer.max_epochs=10"


def test_a_script_without_stray_lines_passes():
    sb = load_sbatch(str(CORRECT_AS_PRINTED))  # its lines 15-16 belong to GD-SLURM-013, not here too
    assert sb.stray_arguments == ()
    assert findings("GD-SLURM-015", sb)[0].severity is Severity.PASS


@pytest.mark.parametrize(
    "url",
    ["https://user:tok123@mirror.example", "https://u:p@ss/w0rd@mirror.example/x", "s3://AKIA:se/cr@et@bucket/key"],
)
def test_a_url_with_credentials_is_redacted_in_exports_and_launch_lines(url):
    sb = parse(f"export HF_ENDPOINT={url}\nsrun python t.py --hub $HF_ENDPOINT --mirror={url}\n")
    secret = url.split("://", 1)[1].rsplit("@", 1)[0]
    assert secret not in repr(sb)
    assert sb.exports["HF_ENDPOINT"].value.endswith("@" + url.rsplit("@", 1)[1])


def test_directives_are_split_as_sbatch_splits_them_not_as_bash():
    # SLURM constraint expressions use & and |; sbatch splits #SBATCH lines at blanks only.
    text = '#!/bin/bash\n#SBATCH --constraint=a100&ib|h100 --job-name="a;b c" -o log_%j.out  # note\nsrun python t.py\n'
    sb = parse_sbatch(text, "job.slurm")
    assert sb.options == {"constraint": "a100&ib|h100", "job-name": "a;b c", "output": "log_%j.out"}
    assert sb.unknown_directives == ()
    name = sb.directive("job-name")
    assert text[name.value_span.start : name.value_span.end] == '"a;b c"'


# ---------------------------------------------------------------- the lexer against bash itself

WORDS = [
    "a",
    "b1",
    "--lr=1e-4",
    "'x y'",
    '"p q"',
    '"a\\"b"',
    "g\\ h",
    "\\\\",
    "x#y",
    "\\#z",
    "'#'",
    '"#"',
    "$'a\\tb'",
    "k=v",
    "'it'\\''s'",
    '"$"',
    "\\$X",
    "a\\\nb",
    "''",
    '""',
    "trainer.x=1",
    '"a\'b"',
    "'a\"b'",
    '"\\\\"',
    '"x\\ny"',
    "a'b'c",
    '"a \\\n b"',
    "'a \\\n b'",
]
GAPS = [" ", "\t", "  ", " \\\n  ", "\\\n"]
ENDS = ["\n", ";", " ;", " # note\n", "\t# c \\\n", " \\ \n", ";\n\n", " # a 'quote\n"]
command = st.tuples(
    st.lists(st.tuples(st.sampled_from(GAPS), st.sampled_from(WORDS)), max_size=6), st.sampled_from(ENDS)
)
script = st.lists(command, min_size=1, max_size=5)


def bash_words(text: str) -> list[list[str]]:
    """What bash passes to each run of `f`: the words of every command, exactly."""
    ran = subprocess.run(
        [BASH, "-c", 'f() { printf "%s\\0" "$#" "$@"; printf "\\1"; }\n' + text], capture_output=True, timeout=10
    )
    return [chunk.split(b"\0")[1:-1] for chunk in ran.stdout.split(b"\1")[:-1]]  # [0] is the count


@pytest.mark.skipif(BASH is None, reason="bash is not installed")
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(script)
def test_the_lexer_splits_words_and_commands_as_bash_does(cmds):
    text = "".join("f" + "".join(gap + word for gap, word in words) + end for words, end in cmds) + "f\n"
    ours = [[unquote(w.text) for w in c.words[1:]] for c in commands(tokenize(text)) if unquote(c.words[0].text) == "f"]
    expected = [[w.decode() for w in ws] for ws in bash_words(text)]
    # bash hands over expansions' results ($'..' and "$"), ours keeps $-words as written; compare the rest exactly
    assert len(ours) == len(expected), (text, ours, expected)
    for mine, theirs in zip(ours, expected, strict=True):
        assert len(mine) == len(theirs), (text, mine, theirs)
        for m, t in zip(mine, theirs, strict=True):
            assert m == t or "$" in m, (text, m, t)
