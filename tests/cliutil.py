"""Running the real `gpudoctor` command for CLI tests: in a child process (run_gpudoctor), or, where the process
is not what a test proves, in this one with the same environment (run_gpudoctor_here: no ~0.5 CPU-s start).

Every child gets this environment less whatever of the machine running the tests would change a verdict
(its GPU, job, launcher and SLURM variables), and is pinned to the cluster its test means: a test
cluster's slurm.conf (tests/slurmcluster.py), or none. Dropping SLURM_CONF is not enough: on an HPC login
node /etc/slurm/slurm.conf (or configless DNS) then answers `scontrol` for the preflight, and the verdict
judges the fixtures against that cluster.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

# Variables of the machine running the tests that would change a verdict: a GPU, a job, a launcher, a cluster.
JOB_AND_GPU_PREFIXES = (
    "CUDA_",
    "PYTORCH_",
    "SLURM_",
    "SRUN_",
    "SBATCH_",
    "SALLOC_",
    "NCCL_",
    "OMP_",
    "RANK",
    "WORLD_",
    "LOCAL_",
    "GROUP_RANK",
    "MASTER_",
    "TORCHELASTIC_",
    "PET_",
)
# No cluster: an empty slurm.conf. scontrol then fails at once ("Unable to process configuration file"), as on
# a machine without SLURM; a missing file would make it retry for 60 s (SLURM 22.05, measured here).
NO_CLUSTER = os.devnull


def clean_env(
    extra: Mapping[str, str] | None = None, *, drop: tuple[str, ...] = (), cluster: str | None = None
) -> dict[str, str]:
    """This environment less its job, launcher, GPU and cluster variables (and any name starting with one of
    `drop`), with SLURM_CONF pinned to `cluster` (a test cluster's slurm.conf) or to no cluster, then `extra`."""
    cleared = JOB_AND_GPU_PREFIXES + tuple(drop)
    env = {k: v for k, v in os.environ.items() if not k.startswith(cleared)}
    env["SLURM_CONF"] = cluster or NO_CLUSTER
    env.update(extra or {})
    return env


def run_gpudoctor(
    *args: str,
    env: Mapping[str, str] | None = None,
    drop: tuple[str, ...] = (),
    cluster: str | None = None,
    timeout: float = 120,
    cwd: str | os.PathLike | None = None,
    stdout=subprocess.PIPE,
) -> subprocess.CompletedProcess:
    """`python -m gpudoctor ARGS` in clean_env(env, drop=drop, cluster=cluster), no standard input."""
    return subprocess.run(
        [sys.executable, "-m", "gpudoctor", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(env, drop=drop, cluster=cluster),
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        cwd=cwd,
    )


def run_gpudoctor_here(
    *args: str,
    env: Mapping[str, str] | None = None,
    drop: tuple[str, ...] = (),
    cluster: str | None = None,
    cwd: str | os.PathLike | None = None,
) -> subprocess.CompletedProcess:
    """run_gpudoctor's answer without its child process (~0.5 CPU-s of interpreter start and imports each):
    `gpudoctor.cli.main(ARGS)` in this process, in the same clean_env(), cwd and empty standard input, its
    output captured as text. For tests of what the command judges and prints; a test of how the process
    behaves (signals, exit status of a closed stdout, an installed plug-in, the environment a child sees at
    start-up, output written to /dev/stdout by name, which no capture here sees) keeps run_gpudoctor."""
    from gpudoctor.cli import main

    out, err = io.StringIO(), io.StringIO()
    torch_before = "torch" in sys.modules
    with _as_a_fresh_process(clean_env(env, drop=drop, cluster=cluster), cwd, out, err):
        try:
            code = main(list(args))
        except SystemExit as e:  # as the interpreter ends a child: its status, a text on stderr and 1
            if not isinstance(e.code, int | None):
                print(e.code, file=sys.stderr)
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
    # torch imported here would make later tests of this worker judge a process that has it loaded
    assert torch_before or "torch" not in sys.modules, f"gpudoctor {args} imported torch: use run_gpudoctor"
    return subprocess.CompletedProcess(["gpudoctor", *args], int(code), out.getvalue(), err.getvalue())


@contextlib.contextmanager
def _as_a_fresh_process(
    env: Mapping[str, str], cwd: str | os.PathLike | None, out: io.StringIO, err: io.StringIO
) -> Iterator[None]:
    """This process with `env` as its environment (children inherit it), in `cwd`, stdin empty, stdout and
    stderr into `out` and `err`; everything restored afterwards, with the SIGTERM handler main() installs."""
    saved_env, saved_cwd, saved_sigterm = dict(os.environ), os.getcwd(), signal.getsignal(signal.SIGTERM)
    os.environ.clear()
    os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    try:
        with (
            open(os.devnull) as stdin,
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
            _stdin(stdin),
        ):
            yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if saved_sigterm is None else saved_sigterm)
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


@contextlib.contextmanager
def _stdin(stream) -> Iterator[None]:
    saved, sys.stdin = sys.stdin, stream
    try:
        yield
    finally:
        sys.stdin = saved


def install_plugin(folder: Path, body: str, module: str = "acme_checks") -> dict[str, str]:
    """A real installed check plug-in: `module` with `body`, and its distribution's dist-info whose
    entry_points.txt names it in group gpudoctor.checks, found by importlib.metadata as pip would have
    installed it. Returns clean_env() with folder first on PYTHONPATH."""
    (folder / f"{module}.py").write_text(body)
    info = folder / "acme_checks-1.0.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-checks\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[gpudoctor.checks]\nacme = {module}\n")
    return clean_env({"PYTHONPATH": str(folder) + os.pathsep + os.environ.get("PYTHONPATH", "")})


def flat(text: str) -> str:
    """A text report's words with its wrapping undone (a hanging indent, a command's ` \\` continuation), so a
    sentence can be looked for whatever the terminal's width (gpudoctor/report/screen.py wraps to it, 80 columns
    where there is no terminal)."""
    return " ".join(text.replace(" \\\n", " ").split())
