"""A marker secret planted in a batch script, a training config and the environment, in the forms people
write them, must reach no output of any command and no file gpudoctor writes -- except the user's own file
that `fix --apply` edits and its backup, which keep the user's bytes (issue 24 item 2)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpudoctor.redact import REDACTED, redact, redact_text, redact_words
from tests.cliutil import clean_env, run_gpudoctor, run_gpudoctor_here

MARK = "MARKER"  # every planted secret holds it; no file name or gpudoctor text does

# (line in the script, what of it must survive redaction): each a form of writing a credential
SCRIPT_SECRETS = [
    "export HF_TOKEN=hf_MARKERsecret123",
    'export WANDB_API_KEY="MARKERwandb0123456789"',
    "export OPENAI_API_KEY='sk-MARKERsecret123abcdef'",
    "AWS_ACCESS_KEY_ID=AKIAMARKER1234567890 python -c pass",
    "export MASTER_ADDR=user:MARKERpw@node1",
    'export HF_ENDPOINT="https://alice:MARKERurl@mirror.example.com"',
    "declare -x DB_PASSWORD=MARKERdecl",
    "export GH_TOKEN=$'MARKER ansi'",
    "TOKEN+=MARKERappend",
    "curl -s -u alice:MARKERcurl https://example.com/x",
    'curl -H "Authorization: Bearer MARKERbearer" https://example.com/x',
    "wget https://example.com/data?token=MARKERquery -O /tmp/d",
    "echo ghp_MARKERabcdefghijklmnopqrstuv > /dev/null",
]
SCRIPT = "\n".join(
    [
        "#!/bin/bash",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=8",
        "#SBATCH --gpus-per-node=8",
        "#SBATCH --cpus-per-task=4",
        "#SBATCH --export=ALL,SECRET_KEY=MARKERexport",
        *SCRIPT_SECRETS,
        "export NCCL_ASYNC_ERROR_HANDLING=1",
        "export MASTER_PORT=29500",
        "srun torchrun --nproc-per-node=4 train.py --password MARKERpass --api-key=MARKERopt "
        "--hub_token hf_MARKERarg456 --config cfg.yaml",
        "",
    ]
)
CONFIG = """\
data:
  batch_size: 64
  num_workers: 0
  pin_memory: false
wandb:
  api_key: MARKERyaml
  token: "hf_MARKERyaml789"
hub_url: https://bob:MARKERcfgurl@hub.example.com/models
"""
ENV = {
    "HF_TOKEN": "hf_MARKERenv123",
    "WANDB_API_KEY": "MARKERenvwandb",
    "MASTER_ADDR": "carol:MARKERenvpw@10.0.0.1",
    "NCCL_ASYNC_ERROR_HANDLING": "sk-MARKERrenamed123456",  # a fix renames it: its value must not be printed
    "NCCL_DEBUG_FILE": "/tmp/x?token=MARKERenvquery",
    "TORCH_DISTRIBUTED_DEBUG": "hf_MARKERdebug12345",
}


def _files(tmp_path: Path) -> tuple[Path, Path]:
    script, config = tmp_path / "job.slurm", tmp_path / "cfg.yaml"
    script.write_text(SCRIPT)
    config.write_text(CONFIG)
    return script, config


def _leaks(text: str) -> list[str]:
    return [line for line in text.splitlines() if MARK in line]


def test_the_rule_blanks_every_planted_form():
    for line in [*SCRIPT_SECRETS, *CONFIG.splitlines(), *SCRIPT.splitlines()]:
        assert MARK not in redact(line), line
    assert MARK not in redact_text(SCRIPT) and MARK not in redact_text(CONFIG)
    assert redact_words(["--password", "MARKERx", "--token=MARKERy", "hf_MARKERabc123"]) == (
        "--password",
        REDACTED,
        f"--token={REDACTED}",
        REDACTED,
    )
    pem = "-----BEGIN OPENSSH PRIVATE KEY-----\nMARKERpem\n-----END OPENSSH PRIVATE KEY-----"
    assert MARK not in redact_text(f"cat > key <<EOF\n{pem}\nEOF")


@pytest.mark.parametrize(
    "kept",
    [
        "export NCCL_IB_PKEY=3",
        "pip install hf_transfer",
        "export HF_HUB_ENABLE_HF_TRANSFER=1",
        "#SBATCH --mail-user=alice@example.com",
        "git clone git@github.com:org/repo.git",
        "export WANDB_API_KEY=$WANDB_API_KEY",
        "python train.py --lr 0.1 --batch-size 64",
        "export MASTER_ADDR=$(scontrol show hostnames | head -n1)",
        "task-sk-1",
    ],
)
def test_what_is_no_secret_is_kept(kept):
    assert redact(kept) == kept


def test_no_command_or_format_prints_or_writes_a_planted_secret(tmp_path):
    script, config = _files(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    check = ["check", "--sbatch", str(script), "--config", str(config)]
    fix = ["fix", "--sbatch", str(script), "--config", str(config)]
    runs = {
        "check text": [*check, "-v"],
        "check json": [*check, "--json", "--junit", str(out / "junit.xml"), "--prometheus", str(out / "m.prom")],
        "check github": [*check, "--format", "github"],
        "check concise": [*check, "--format", "concise"],
        "check env": ["check", "-v", "--select", "distributed,nccl,slurm,cuda"],
        "check env json": ["check", "--json", "--select", "distributed,nccl,slurm,cuda"],
        "fix text": fix,
        "fix diff": [*fix, "--diff", "--unsafe-fixes"],
        "fix json": [*fix, "--json", "--unsafe-fixes"],
        "fix shell": [*fix, "--shell"],
        "fix env-file": [*fix, "--env-file", str(out / "fix.env")],
        "fix env": ["fix", "--json"],
        "fix env shell": ["fix", "--shell"],
        "snapshot": ["snapshot", "-o", str(out / "snap.json")],
        "health": ["health", "--json", "--expect-gpus", "0"],
    }

    # what each command prints and writes: in this process (its stdout, stderr and files are what is read), but
    # one run as a real process, whose every write to its stdout and stderr (not only Python's) is read
    real = "check env"
    results = {name: run_gpudoctor_here(*argv, env=ENV, cwd=tmp_path) for name, argv in runs.items() if name != real}
    results[real] = run_gpudoctor(*runs[real], env=ENV, cwd=tmp_path, timeout=300)
    applied = tmp_path / "applied"
    applied.mkdir()
    shutil.copy(script, applied / "job.slurm")
    shutil.copy(config, applied / "cfg.yaml")
    results["fix apply"] = run_gpudoctor_here(
        "fix", "--sbatch", "job.slurm", "--config", "cfg.yaml", "--apply", "--unsafe-fixes", env=ENV, cwd=applied
    )
    hook = Path(sys.executable).with_name("gpudoctor-hook")
    for kind, path in (("sbatch", script), ("config", config)):
        results[f"hook {kind}"] = subprocess.run(
            [str(hook), kind, str(path)], capture_output=True, text=True, env=clean_env(ENV), cwd=tmp_path, timeout=300
        )
    leaks = {}
    for name, r in results.items():
        assert r.returncode in (0, 1), (name, r.returncode, r.stderr[-2000:])
        found = _leaks(r.stdout) + _leaks(r.stderr)
        if found:
            leaks[name] = found[:5]
    for written in out.iterdir():
        found = _leaks(written.read_text())
        if found:
            leaks[written.name] = found[:5]
    # the user's files: edited by --apply, they keep every secret (theirs); the backup too
    assert (applied / "job.slurm").read_text().count(MARK) == SCRIPT.count(MARK)
    for backup in applied.glob("*.gpudoctor.bak"):
        assert backup.read_text() in (SCRIPT, CONFIG)
    users = ("job.slurm", "cfg.yaml", "job.slurm.gpudoctor.bak", "cfg.yaml.gpudoctor.bak")
    assert not [p for p in applied.iterdir() if p.name not in users and MARK in p.read_text()]
    assert not leaks, json.dumps(leaks, indent=1)
    # the runs did judge the inputs (a run that read nothing would leak nothing)
    assert "GD-DIST-005" in results["fix json"].stdout and json.loads(results["check json"].stdout)["findings"]


# ---------------------------------------------------------------- issue 35: argv words, program source


@pytest.mark.parametrize(
    "words",
    [
        ["curl", "-u", "bob:MARKERpw", "https://x"],
        ["curl", "--user", "bob:MARKERpw"],
        ["curl", "--proxy-user", "u:MARKERpw"],
        ["curl", "-U", "u:MARKERpw"],
        ["curl", "--user=bob:MARKERpw"],
        ["curl", "-ubob:MARKERpw"],
        ["curl", "-u", "bob:MARKER pw with blanks"],
        ["wget", "--http-user", "bob:MARKERpw"],
        ["tool", "--password", "MARKERpw"],
        ["tool", "--token", "MARKERtok"],
        ["tool", "--hf-token", "MARKERtok"],
        ["curl", "-H", "Authorization: Bearer MARKERbearer"],
        ["tool", "Bearer", "MARKERbearer"],
        ["tool", "password", "MARKERnetrc"],
        ["git", "clone", "https://bob:MARKERpw@example.com/r.git"],
        ["python", "train.py", "hf_MARKERabc12345"],
    ],
)
def test_an_argv_shows_no_secret_in_one_word_or_two(words):
    shown = redact_words(words)
    assert MARK not in " ".join(shown), shown
    assert len(shown) == len(words) and shown[0] == words[0]


def test_argv_words_that_are_no_secret_are_kept():
    for words in (
        ["python", "-u", "train.py", "--lr", "0.1"],
        ["torchrun", "--nproc-per-node=4", "train.py", "--data", "a:b"],
        ["curl", "-u", "$CREDENTIALS", "https://x"],
        ["srun", "-u", "python", "train.py"],
    ):
        assert redact_words(words) == tuple(words)


def test_watch_shows_no_argv_secret_even_from_a_probe_that_did_not_redact():
    from gpudoctor.watch.samples import NodeObservation

    raw = {
        "node": "n1",
        "processes": [{"pid": 5, "cmdline": ["python", "x.py", "-u", "bob:MARKERpw", "--proxy-user", "u:MARKERp"]}],
        "others": {"9": {"user": "eve", "cmdline": ["curl", "--user", "e:MARKERe"]}},
    }
    obs = NodeObservation.from_dict(raw)
    assert MARK not in json.dumps(obs.to_dict()), obs


PROGRAM = (
    "import os\nimport torch.distributed as dist\nfrom torch.nn.parallel import DistributedDataParallel as DDP\n"
    "rank, world = int(os.environ['SLURM_PROCID']), int(os.environ['SLURM_NTASKS'])\n"
    # the password runs past the 90 characters a fact quotes: redacted before it is shortened, or half of it shows
    "dist.init_process_group('nccl', init_method='tcp://bob:MARKERurl0123456789abcdefghijklmnop@10.0.0.1:29500', "
    "rank=rank, world_size=world)\n"
    "model = DDP(build('AKIAMARKER1234567890', token='hf_MARKERabcdef123'), device_ids=[rank])\n"
)


def test_quoted_program_source_shows_no_secret(tmp_path):
    script = tmp_path / "job.slurm"
    script.write_text("#!/bin/bash\n#SBATCH --gres=gpu:8\n#SBATCH --ntasks=1\npython3 train.py\n")
    (tmp_path / "train.py").write_text(PROGRAM)
    text = run_gpudoctor_here("check", "--sbatch", str(script), "-v", cwd=tmp_path)
    js = run_gpudoctor_here("check", "--sbatch", str(script), "--json", cwd=tmp_path)
    for r in (text, js):
        assert r.returncode in (0, 1), r.stderr
        assert not _leaks(r.stdout) and not _leaks(r.stderr), _leaks(r.stdout)
    # the program was read and quoted (a run that quoted nothing would leak nothing)
    assert "init_process_group" in js.stdout and "GD-SLURM-003" in js.stdout
