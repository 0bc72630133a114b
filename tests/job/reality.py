"""The reality side of the model-against-reality tests: run a batch script on the test SLURM, read what ran.

`run_script(cluster, script_text, files)` writes the script and its files into a fresh job directory, submits
it with sbatch from there (the job bounded twice: SLURM's --time and the wait's timeout) and returns one
ProcessRecord per process that tests/job/recorder.py ran as, whatever started it (srun, torchrun, bash -c).
`run_job` returns the same with the job's exit code and output, for a job whose processes never start (a
rendezvous that cannot form). The job's `python` and `torchrun` are the test interpreter's (its bin directory
first on PATH, which sbatch exports to the job), the recorder is `recorder.py` in the job directory, and
GD_RECORD_DIR tells it where to write; nothing else of the environment is added, so what the processes see is
what SLURM and the launchers gave them.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

RECORDER = Path(__file__).with_name("recorder.py")
_jobs = itertools.count(1)


@dataclass(frozen=True)
class World:
    """What the process's torch.distributed.init_process_group gave (GD_RECORD_JOIN): formed or not."""

    formed: bool | None
    size: int | None = None
    rank: int | None = None
    id: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class ProcessRecord:
    """One process the job started, as it was: its node (index in the cluster's node_names), host, argv, the
    variables that matter, the rank as the program read it (and from where), the GPUs it sees, its world."""

    node: int | None
    host: str
    pid: int
    ppid: int
    argv: tuple[str, ...]
    parent_argv: tuple[str, ...] | None
    env: dict[str, str] = field(hash=False)
    rank: str | None
    rank_from: str | None
    world: World | None

    @property
    def visible_gpus(self) -> str | None:
        """CUDA_VISIBLE_DEVICES as the process got it (None: unset, every GPU of the node)."""
        return self.env.get("CUDA_VISIBLE_DEVICES")

    def get(self, name: str) -> str | None:
        return self.env.get(name)

    @property
    def world_size(self) -> str | None:
        """The world size as a program reads it: WORLD_SIZE (a launcher's), else SLURM_NTASKS (srun's)."""
        return self.env.get("WORLD_SIZE", self.env.get("SLURM_NTASKS"))

    def launcher_option(self, *names: str) -> str | None:
        """The value of a --name or --name=value option of the torchrun that started this process, as it got it."""
        argv = list(self.parent_argv or ())
        for i, arg in enumerate(argv):
            for flag in names:
                if arg == flag and i + 1 < len(argv):
                    return argv[i + 1]
                if arg.startswith(flag + "="):
                    return arg.split("=", 1)[1]
        return None

    @property
    def launcher_endpoint(self) -> str | None:
        """HOST:PORT of the rendezvous of the torchrun that started this process, as torchrun got it: its
        --rdzv-endpoint, else (static rendezvous) --master-addr:--master-port with torchrun's defaults
        127.0.0.1:29500 (torch/distributed/run.py); None: no torchrun, or --standalone (a port it picks)."""
        argv = self.parent_argv or ()
        if launcher_start(argv) is None or "--standalone" in argv:
            return None
        endpoint = self.launcher_option("--rdzv_endpoint", "--rdzv-endpoint")
        if endpoint:
            return endpoint
        host = self.launcher_option("--master_addr", "--master-addr") or "127.0.0.1"
        return f"{host}:{self.launcher_option('--master_port', '--master-port') or 29500}"


@dataclass
class JobRun:
    records: list[ProcessRecord]
    returncode: int
    output: str
    job_dir: Path

    def worlds(self) -> dict[str | None, list[ProcessRecord]]:
        """The records grouped by the world each formed (key None: those that formed none or did not try)."""
        out: dict[str | None, list[ProcessRecord]] = {}
        for rec in self.records:
            key = rec.world.id if rec.world is not None and rec.world.formed else None
            out.setdefault(key, []).append(rec)
        return out


def launcher_start(argv) -> int | None:
    """Where torchrun's own options begin in a command line (`.../torchrun ...` or `python -m
    torch.distributed.run ...`), or None when it is not one."""
    for i, arg in enumerate(argv):
        if arg.endswith("torchrun") or arg in ("torch.distributed.run", "torch.distributed.launch"):
            return i + 1
    return None


def _record(line: dict, node_names: list[str]) -> ProcessRecord:
    world = line.get("world")
    host = line["host"]
    return ProcessRecord(
        node=node_names.index(host) if host in node_names else (0 if len(node_names) == 1 else None),
        host=host,
        pid=line["pid"],
        ppid=line["ppid"],
        argv=tuple(line["argv"]),
        parent_argv=None if line.get("parent_argv") is None else tuple(line["parent_argv"]),
        env=dict(line["env"]),
        rank=line["rank"],
        rank_from=line["rank_from"],
        world=None if world is None else World(**{k: world.get(k) for k in ("formed", "size", "rank", "id", "error")}),
    )


def read_records(directory: Path, node_names: list[str]) -> list[ProcessRecord]:
    """Every record written there, in (node, rank, pid) order."""
    records = [_record(json.loads(p.read_text()), node_names) for p in sorted(directory.glob("*.json"))]
    return sorted(records, key=lambda r: (r.node if r.node is not None else -1, str(r.rank), r.pid))


def run_job(
    cluster,
    script_text: str,
    files: dict[str, str] | None = None,
    join: bool = False,
    join_timeout: float = 30,
    timeout: float = 150,
    sbatch_args: tuple[str, ...] = (),
    real_wait: bool = False,
) -> JobRun:
    """Runs script_text as a batch job of cluster (tests/slurmcluster) in a new job directory holding files
    ({relative path: text}) and recorder.py; join: each recorder joins a gloo world (bounded by join_timeout).
    The job is waited for by polling (SlurmCluster.sbatch_wait), or by `sbatch --wait` itself with real_wait
    (which sleeps up to 10 s between its polls); either way bounded by timeout."""
    job_dir = Path(cluster.root) / "jobs" / f"job{os.getpid()}-{next(_jobs)}"
    records = job_dir / "records"
    records.mkdir(parents=True)
    shutil.copy(RECORDER, job_dir / "recorder.py")
    for name, text in (files or {}).items():
        (job_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (job_dir / name).write_text(text)
    script = job_dir / "job.sbatch"
    script.write_text(script_text)
    env = {
        "PATH": f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "GD_RECORD_DIR": str(records),
        "GD_RECORD_TIMEOUT": str(join_timeout),
    }
    if join:
        env["GD_RECORD_JOIN"] = "1"
    minutes = max(1, int(timeout // 60))
    args = ["--time", str(minutes), "--output", str(job_dir / "job.out"), *sbatch_args]
    r = cluster.sbatch_wait(script, args=args, env=env, timeout=timeout, cwd=job_dir, real_wait=real_wait)
    output = (job_dir / "job.out").read_text(errors="replace") if (job_dir / "job.out").exists() else r.stderr
    return JobRun(read_records(records, cluster.node_names), r.returncode, output, job_dir)


def run_script(cluster, script_text: str, files: dict[str, str] | None = None, **kw) -> list[ProcessRecord]:
    """The processes the script started, as recorded (run_job's records)."""
    return run_job(cluster, script_text, files, **kw).records
