"""`gpudoctor watch --job` on real SLURM jobs: the single-node slurm-wlm cluster with 8 fake GPUs in gres.conf
(tests/slurmcluster.py). NVML is not here, so the allocated GPUs are judged from the processes' own
CUDA_VISIBLE_DEVICES, read by the probe that `watch` starts inside the job with `srun --overlap`.

- a job that asks for 8 GPUs and starts one process that sees one of them: the 7 others are named, with the
  batch script's own checks' fix (GD-SLURM-003: the program, read from the job's directory, is one process, so
  --gres=gpu:1 -- not eight srun copies of it);
- a correct job (8 tasks, one GPU each): none named;
- a probe that cannot run on the node: the node is "not observed" (a fail), never healthy;
- the GPUs an `srun --overlap` step is given inside the job: all of the job's without --gres, none with --gres=none;
- a process of another local user (made with useradd) that sets SLURM_JOB_ID=<job> is not the job's;
- a job that ends inside the window is said to have ended (COMPLETED, with its end time).
Skipped, with the reason, where the cluster cannot start (not root, no SLURM).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slurm

GD = [sys.executable, "-m", "gpudoctor"]


def _submit(cluster, tmp_path: Path, name: str, body: str) -> str:
    train = tmp_path / "train.py"
    train.write_text("import time\ntime.sleep(120)\n")
    script = tmp_path / f"{name}.sbatch"
    script.write_text(
        f"#!/bin/bash\n#SBATCH --output={tmp_path}/{name}.out\n{body.format(python=sys.executable, train=train)}"
    )
    r = subprocess.run(
        ["sbatch", "--parsable", str(script)], env=cluster.env(), capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().split(";")[0]


def _processes_of(job: str, program: str) -> int:
    count = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if f"SLURM_JOB_ID={job}".encode() in env and program.encode() in cmd:
            count += 1
    return count


def _wait_for(job: str, program: str, count: int, timeout: float = 30) -> None:
    """Until the job runs `count` processes of `program` (the job's start, not a guess at its timing)."""
    deadline = time.monotonic() + timeout
    while _processes_of(job, program) < count:
        assert time.monotonic() < deadline, f"job {job} did not start {count} x {program} within {timeout} s"
        time.sleep(0.2)


def _watch(cluster, job: str, *extra: str) -> tuple[int, dict, str]:
    r = subprocess.run(
        [*GD, "watch", "--job", job, "--for", "1s", "--json", *extra],
        env=cluster.env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.stdout.strip(), r.stderr
    return r.returncode, json.loads(r.stdout), r.stderr


def _step_gpus(cluster, job: str, *extra: str) -> str | None:
    r = subprocess.run(
        ["srun", "--jobid", job, "--overlap", "-N1", "--ntasks-per-node=1", *extra, "printenv", "SLURM_STEP_GPUS"],
        env=cluster.env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    return r.stdout.strip() or None


def _by_id(report: dict) -> dict:
    return {f["id"]: f for f in report["findings"]}


def _cancel(cluster, job: str) -> None:
    subprocess.run(["scancel", job], env=cluster.env(), capture_output=True, timeout=30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the next test's job needs the GPUs back
        r = subprocess.run(["squeue", "-h", "-j", job], env=cluster.env(), capture_output=True, text=True, timeout=10)
        if not r.stdout.strip():
            return
        time.sleep(0.2)


def test_one_process_on_an_eight_gpu_job_names_seven_idle_gpus(slurm_cluster, tmp_path):
    body = "#SBATCH --gres=gpu:8\n#SBATCH --ntasks=1\nCUDA_VISIBLE_DEVICES=0 {python} {train}\n"
    job = _submit(slurm_cluster, tmp_path, "one", body)
    try:
        _wait_for(job, "train.py", 1)
        code, report, err = _watch(slurm_cluster, job)
        found = _by_id(report)
        idle = found["GD-WATCH-001"]
        assert idle["severity"] == "fail", idle
        assert idle["evidence"]["unused"] == [1, 2, 3, 4, 5, 6, 7], idle
        assert "1 training process(es) where 8 were meant" in idle["message"]
        # the cause and its fix are the batch script's own checks' (GD-SLURM-003: one task where 8 GPUs are)
        assert "GD-SLURM-003" in idle["evidence"]["batch_script"], idle["evidence"]
        # one fix: GD-SLURM-003's lines (the script is a copy here), and leaving CUDA_VISIBLE_DEVICES to SLURM
        # (the process's own value is 0 where SLURM set 0-7 for the batch step). The program was read from the
        # job's working directory: one process that never starts ranks, so the fix asks for the one GPU it uses --
        # eight srun tasks would start eight copies of it (README, "Do no harm")
        lines = [a["target"] for a in idle["fix"]["actions"]]
        assert "#SBATCH --gres=gpu:1" in lines and "#SBATCH --ntasks-per-node=8" not in lines, lines
        assert any(line.startswith("do not set CUDA_VISIBLE_DEVICES=0") for line in lines), lines
        assert "was set by the job, not by SLURM (SLURM set 0,1,2,3,4,5,6,7" in idle["message"]
        assert code == 1
        assert found["GD-WATCH-006"]["severity"] == "info"  # no NVML here: said, not taken for healthy
        assert report["watch"]["answered"] == report["watch"]["nodes"]

        # what the probe's step is given (watch/cli.py): with --overlap and no --gres, every GPU of the job
        # (so a device cgroup lets NVML open them); --gres=none would give it none
        assert _step_gpus(slurm_cluster, job) == "0,1,2,3,4,5,6,7"
        assert _step_gpus(slurm_cluster, job, "--gres=none") is None

        # the probe cannot run there: the node is not observed, and that is a fail, never a pass
        code, report, err = _watch(slurm_cluster, job, "--python", "/bin/false")
        unobserved = _by_id(report)["GD-WATCH-006"]
        assert unobserved["severity"] == "fail" and "could not observe" in unobserved["message"], unobserved
        assert code == 1
        assert _by_id(report)["GD-WATCH-001"]["severity"] != "pass"
    finally:
        _cancel(slurm_cluster, job)


def test_a_job_with_one_task_per_gpu_names_none(slurm_cluster, tmp_path):
    body = "#SBATCH --ntasks=8\n#SBATCH --gpus-per-task=1\nsrun {python} {train}\n"
    job = _submit(slurm_cluster, tmp_path, "eight", body)
    try:
        _wait_for(job, "train.py", 8)
        code, report, err = _watch(slurm_cluster, job)
        found = _by_id(report)
        assert found["GD-WATCH-001"]["severity"] == "pass", found["GD-WATCH-001"]
        assert "8 on 1 node" in found["GD-WATCH-001"]["message"]
        assert code == 0, report
    finally:
        _cancel(slurm_cluster, job)


def test_another_users_process_that_claims_the_job_is_not_the_jobs(slurm_cluster, tmp_path, monkeypatch):
    """A process of another local user that sets SLURM_JOB_ID=<job> (and a GPU) in its own environment is not
    one of the job's processes: membership is SLURM's (listpids, the job's cgroup), owned by the job's user
    (scontrol's UserId=), issue 35 item 4. Counted, it would claim GPU 1 and hide it from the idle list."""
    from tests.cliutil import clean_env
    from tests.watch.test_node import _any_users_python, _stranger

    uid, gid = _stranger()
    body = "#SBATCH --gres=gpu:8\n#SBATCH --ntasks=1\nCUDA_VISIBLE_DEVICES=0 {python} {train}\n"
    job = _submit(slurm_cluster, tmp_path, "claimed", body)
    stranger = None
    try:
        _wait_for(job, "train.py", 1)
        env = clean_env({"SLURM_JOB_ID": job, "SLURM_STEP_ID": "0", "CUDA_VISIBLE_DEVICES": "1", "LOCAL_RANK": "0"})
        stranger = subprocess.Popen(
            [_any_users_python(), "-c", "import time; time.sleep(120)", "train.py", "--stranger-claims"],
            env=env,
            user=uid,
            group=gid,
            extra_groups=[],
            cwd="/",
            stdin=subprocess.DEVNULL,
        )
        _wait_for(job, "--stranger-claims", 1)
        # membership is SLURM's word here (proctrack/linuxproc answers listpids), not the environment's
        from gpudoctor.watch import node

        monkeypatch.setenv("SLURM_CONF", slurm_cluster.env()["SLURM_CONF"])
        listed = node.listpids(job)
        assert listed and stranger.pid not in listed, listed
        code, report, err = _watch(slurm_cluster, job)
        idle = _by_id(report)["GD-WATCH-001"]
        assert idle["evidence"]["unused"] == [1, 2, 3, 4, 5, 6, 7], idle
        assert "1 training process(es) where 8 were meant" in idle["message"], idle
        assert "--stranger-claims" not in json.dumps(report)
    finally:
        if stranger is not None:
            stranger.kill()
            stranger.wait()
        _cancel(slurm_cluster, job)


def test_a_job_that_ends_during_the_watch_is_said_to_have_ended(slurm_cluster, tmp_path):
    """The job ends inside the window (it waits for a file this test writes once the watch's probe runs on the
    node): the node cannot answer, and the report says the job ended, with its state and end time (issue 35
    item 7), not only "could not observe"."""
    stop = tmp_path / "stop"
    body = f"#SBATCH --ntasks=1\nwhile [ ! -e {stop} ]; do sleep 0.2; done\n"
    job = _submit(slurm_cluster, tmp_path, "short", body)
    watch = None
    try:
        deadline = time.monotonic() + 60
        while True:  # until it runs (the watch refuses a pending job)
            r = subprocess.run(
                ["squeue", "-h", "-j", job, "-o", "%T"], env=slurm_cluster.env(), capture_output=True, text=True
            )
            if r.stdout.strip() == "RUNNING":
                break
            assert time.monotonic() < deadline, r.stdout + r.stderr
            time.sleep(0.2)
        watch = subprocess.Popen(
            [*GD, "watch", "--job", job, "--for", "60s", "--json"],
            env=slurm_cluster.env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _wait_for(job, "gpudoctor.watch.node", 1, timeout=120)  # the probe runs inside the job: now end it
        stop.write_text("")
        out, err = watch.communicate(timeout=180)
        said = [f for f in json.loads(out)["findings"] if f["id"] == "GD-WATCH-006"]
        assert said and all("ended during the watch (COMPLETED at " in f["message"] for f in said), said
        assert said[0]["severity"] == "info" and watch.returncode == 0, (said, err)
    finally:
        if watch is not None and watch.poll() is None:
            watch.kill()
            watch.communicate()
        _cancel(slurm_cluster, job)
