"""`gpudoctor health` as SLURM runs it: a real single-node cluster (tests/slurmcluster.py) with HealthCheckProgram
and Prolog configured, the programs being wrappers that run the gpudoctor installed in this interpreter.

A cluster of its own (module scope, about 2 s to start): these tests drain and resume its only node,
which would starve the other tests' jobs on the shared session cluster. The node's failure is real
input: a facts snapshot with uncorrected ECC errors on one GPU (GD-HW-001), replayed with --snapshot.
The wrappers read their arguments from a file the test writes, so slurmd's own periodic runs (every
HEALTH_INTERVAL s) pick up each step; every wait is bounded."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.factsutil import make_facts
from tests.slurmcluster import ClusterUnavailable, SlurmCluster, ensure_installed

pytestmark = pytest.mark.slurm

HEALTH_INTERVAL = 2  # seconds; slurmctld asks slurmd for a health check this often (observed: every 2.00 s)
WAIT_S = 30  # for one health-check run or one state change; each normally takes about 2-3 s


def _wrapper(path: Path, args_file: Path, done_file: Path, log: Path, conf: Path | None) -> None:
    """A program slurmd runs: `gpudoctor health <args in args_file>`, appending '<token> <exit status>' to
    done_file. slurmd gives a HealthCheckProgram no PATH and no SLURM_CONF (only SLURMD_NODENAME): the
    wrapper names this cluster's slurm.conf, as a site's would name its own if not in /etc/slurm.
    Each step runs once: the wrapper claims args_file by renaming it (atomic), so a run slurmd starts while
    the test is still reading the last result finds nothing to do. (A CI run failed when such a second run
    of a failing step drained the node again after the test had resumed it.)"""
    export = f"export SLURM_CONF={conf}\n" if conf else ""
    path.write_text(
        "#!/bin/sh\n"
        f"claim={args_file}.$$\n"
        f'mv {args_file} "$claim" 2>/dev/null || exit 0\n'
        f"{export}"
        'token=$(sed -n 1p "$claim")\n'
        f'{sys.executable} -m gpudoctor health $(sed -n 2p "$claim") >> {log} 2>&1\n'
        "status=$?\n"
        'rm -f "$claim"\n'
        f'echo "$token $status" >> {done_file}\n'
        "exit $status\n"
    )
    path.chmod(0o755)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    if os.environ.get("GPUDOCTOR_NO_SLURM"):
        pytest.skip("SLURM tests disabled (GPUDOCTOR_NO_SLURM is set)")
    root = tmp_path_factory.mktemp("health-slurm")
    conf = root / "etc" / "slurm.conf"
    _wrapper(root / "healthcheck.sh", root / "hc.args", root / "hc.done", root / "hc.log", conf)
    _wrapper(root / "prolog.sh", root / "prolog.args", root / "prolog.done", root / "prolog.log", None)
    extra = (
        f"HealthCheckProgram={root}/healthcheck.sh\n"
        f"HealthCheckInterval={HEALTH_INTERVAL}\n"
        "HealthCheckNodeState=ANY\n"
        f"Prolog={root}/prolog.sh\n"
    )
    try:
        if os.geteuid() != 0:
            raise ClusterUnavailable("starting SLURM daemons needs root")
        ensure_installed()
        c = SlurmCluster(root, name=f"gdhc{os.getpid()}", extra_conf=extra).start()
    except ClusterUnavailable as e:
        pytest.skip(f"no SLURM cluster for this test: {e}")
    c.facts = {"healthy": str(root / "healthy.json"), "ecc": str(root / "ecc.json")}
    make_facts().dump(c.facts["healthy"])
    ecc = {"nvidia.gpus.3.ecc.uncorrected_volatile": 2, "nvidia.gpus.3.ecc.uncorrected_aggregate": 2}
    make_facts(patch=ecc).dump(c.facts["ecc"])
    try:
        yield c
    finally:
        c.stop()


def _slurm(cluster, *cmd: str) -> str:
    r = subprocess.run(list(cmd), env=cluster.env(), capture_output=True, text=True, timeout=15)
    assert r.returncode == 0, f"{' '.join(cmd)}: {r.stderr}"
    return r.stdout


def node_state(cluster) -> tuple[str, str]:
    """(state, reason) as sinfo prints them: 'idle', 'drained', ...; reason '' when none."""
    state, _, reason = _slurm(cluster, "sinfo", "-h", "-N", "-n", cluster.node, "-o", "%T|%E").strip().partition("|")
    return state, "" if reason == "none" else reason


def health_run(cluster, *args: str) -> int:
    """Sets the health check's arguments and waits for slurmd to run it with them; its exit status."""
    root = cluster.root
    token = uuid.uuid4().hex
    pending = root / "hc.args.new"
    pending.write_text(f"{token}\n{' '.join(args)}\n")
    pending.rename(root / "hc.args")  # whole, or not there, for the wrapper that claims it
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        done = root / "hc.done"
        for line in done.read_text().splitlines() if done.exists() else []:
            if line.startswith(token + " "):
                return int(line.split()[1])
        time.sleep(0.2)
    log = (root / "hc.log").read_text()[-1500:] if (root / "hc.log").exists() else "no log"
    raise AssertionError(f"slurmd did not run the health check within {WAIT_S} s; log: {log}")


def wait_for_state(cluster, wanted: str) -> tuple[str, str]:
    """The node's (state, reason) once its state is `wanted` (or at the deadline). After a RESUME slurmctld
    shows 'idle*' (not responding) until its next ping of slurmd: 'idle' is waited for."""
    deadline = time.monotonic() + WAIT_S
    state, reason = node_state(cluster)
    while state != wanted and time.monotonic() < deadline:
        time.sleep(0.2)
        state, reason = node_state(cluster)
    return state, reason


def resume(cluster) -> None:
    """The test's own clean-up between cases (not a behaviour under test): RESUME, asked again every 5 s until the
    node is idle, since on a loaded machine one update was seen not to take within WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    state = ""
    while state != "idle" and time.monotonic() < deadline:
        # not _slurm: a repeated RESUME of a node already resuming is refused, which is no failure here
        cmd = ["scontrol", "update", f"NodeName={cluster.node}", "State=RESUME"]
        subprocess.run(cmd, env=cluster.env(), capture_output=True, text=True, timeout=15)
        for _ in range(25):
            state = node_state(cluster)[0]
            if state == "idle":
                break
            time.sleep(0.2)
    assert state == "idle", node_state(cluster)


def test_health_check_drains_a_failing_node_and_resumes_only_its_own_drain(cluster):
    healthy, ecc = cluster.facts["healthy"], cluster.facts["ecc"]
    # a healthy node stays idle, --resume or not
    assert health_run(cluster, "--drain", "--resume", "--snapshot", healthy) == 0
    assert node_state(cluster) == ("idle", "")

    # a failing check drains it, the reason naming the check; sinfo -R shows the first 20 characters
    assert health_run(cluster, "--drain", "--snapshot", ecc) == 1
    state, reason = wait_for_state(cluster, "drained")
    assert state == "drained" and reason.startswith("gpudoctor GD-HW-001: ") and len(reason) <= 100
    assert "gpudoctor GD-HW-001:" in _slurm(cluster, "sinfo", "-R")
    assert f"Reason={reason}" in _slurm(cluster, "scontrol", "show", "node", cluster.node)

    # healthy again: without --resume the node stays out (an admin decides); with it, ours is cleared
    assert health_run(cluster, "--drain", "--snapshot", healthy) == 0
    assert node_state(cluster)[0] == "drained"
    assert health_run(cluster, "--drain", "--resume", "--snapshot", healthy) == 0
    assert wait_for_state(cluster, "idle") == ("idle", "")

    # drained by someone else: --resume leaves it, and a failing --drain keeps their reason
    _slurm(cluster, "scontrol", "update", f"NodeName={cluster.node}", "State=DRAIN", "Reason=admin: swap disk 2")
    assert health_run(cluster, "--drain", "--resume", "--snapshot", healthy) == 0
    assert node_state(cluster) == ("drained", "admin: swap disk 2")
    assert health_run(cluster, "--drain", "--snapshot", ecc) == 1
    assert node_state(cluster) == ("drained", "admin: swap disk 2")
    assert "already drained for another reason" in (cluster.root / "hc.log").read_text()
    resume(cluster)


def test_failing_prolog_requeues_the_job_held_and_drains_the_node(cluster, tmp_path):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    assert wait_for_state(cluster, "idle") == ("idle", ""), "the node is not idle before the job is submitted"
    (cluster.root / "prolog.args").write_text(f"prolog\n--drain --snapshot {cluster.facts['ecc']}\n")
    job = ""
    try:
        job = _slurm(cluster, "sbatch", "--parsable", f"--output={tmp_path}/out", str(script)).strip().split(";")[0]
        deadline = time.monotonic() + WAIT_S
        record = ""
        while time.monotonic() < deadline:
            record = _slurm(cluster, "scontrol", "show", "job", "-o", job)
            if "Restarts=1" in record and "JobState=PENDING" in record:
                break
            time.sleep(0.2)
        assert "JobState=PENDING" in record and "Restarts=1" in record, record
        assert "Reason=launch_failed_requeued_held" in record and "Requeue=1" in record, record
        assert not (tmp_path / "out").exists() or "ran" not in (tmp_path / "out").read_text()
        state, reason = wait_for_state(cluster, "drained")
        assert state == "drained", (state, reason)
        # slurmctld keeps the reason --drain set before the prolog's exit (its own would be "Prolog error")
        assert reason.startswith("gpudoctor GD-HW-001: "), reason
        assert "1" in (cluster.root / "prolog.done").read_text().split()
    finally:
        (cluster.root / "prolog.args").unlink(missing_ok=True)
        if job:
            subprocess.run(["scancel", job], env=cluster.env(), capture_output=True, timeout=15)
        resume(cluster)
