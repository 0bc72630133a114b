"""What a `gpudoctor check` verdict is about: the job, or the machine gpudoctor runs on.

The patient is the job (docs/architecture.md). Where gpudoctor runs decides what it can see of it:

- inside the job's own environment (a SLURM allocation, or rank variables set by a launcher), this
  machine is one of the job's nodes: every finding is about the job and counts;
- before submission (`--sbatch`, or `--config` with `--expect-gpus`/`--launcher` on a machine
  without an NVIDIA driver), gpudoctor runs on a login or submit host. The job's own checks
  (scope "job": its script, config, environment, launcher) judge the job from anywhere. Checks of
  scope "machine" (driver, torch install, GPUs) and "node" (CPUs, memory, network measured here)
  describe this host, which is not where the job runs: they are shown in a short section of
  their own and do not set the exit code. The nodes the job will land on come from the cluster
  (`scontrol`, the cluster fact section) or from a snapshot recorded on a compute node
  (`--node-snapshot F`), whose facts then stand for the job's node and count in full;
- otherwise (a plain `gpudoctor check`) this machine is the target.

Which findings count is decided from the target in gpudoctor/verdict.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from gpudoctor.facts import Facts

# Evidence key a node-scope check sets when, before submission, it judged the job's requested resources
# (e.g. the script's --cpus-per-task) instead of this host's: its verdict is about the job.
JUDGED_FOR = "judged_for"
JOB_RESOURCES = "the job's requested resources"
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_PROCID")


def in_job_environment(env: dict) -> bool:
    """This process runs where the job runs: inside a SLURM allocation, or started by a launcher."""
    return "SLURM_JOB_ID" in env or "SLURM_JOBID" in env or any(name in env for name in RANK_VARIABLES)


@dataclass(frozen=True)
class Target:
    kind: str  # "job": the job a script/config describes, judged from elsewhere; "machine": this machine
    label: str  # said in the report's first line
    machine_in_verdict: bool  # this machine's (or the node snapshot's) machine/node findings set the exit code
    reason: str  # how the target was decided
    hostname: str
    nodes: str | None = None  # where the job's node facts come from (--node-snapshot F), when not this machine

    def to_dict(self) -> dict:
        return {
            "kind": self.kind,
            "label": self.label,
            "this_machine_in_verdict": self.machine_in_verdict,
            "reason": self.reason,
            "hostname": self.hostname,
            "node_facts": self.nodes,
        }


def decide(facts, ctx, node_snapshot: str | None = None, local_hostname: str | None = None) -> Target:
    """The target of this run (module docstring)."""
    env = facts.env
    host = local_hostname or facts.host.get("hostname") or "this machine"
    script = os.path.basename(ctx.sbatch_path) if ctx.sbatch_path else None
    config = os.path.basename(ctx.config_path) if ctx.config_path else None
    what = f"the job in {script}" if script else (f"the job configured in {config}" if config else "the job")
    if node_snapshot:
        recorded_on = facts.host.get("hostname") or "a compute node"
        return Target(
            "job",
            f"{what}, on the node recorded in {os.path.basename(node_snapshot)} ({recorded_on})",
            True,
            f"--node-snapshot: machine and node checks judge {recorded_on}, a node the job runs on",
            host,
            nodes=node_snapshot,
        )
    if in_job_environment(env):
        where = (
            "this SLURM allocation" if ("SLURM_JOB_ID" in env or "SLURM_JOBID" in env) else "the launcher's environment"
        )
        return Target(
            "machine",
            f"{what if script or config else 'this job'} on {host} (inside {where})",
            True,
            f"running inside {where}: this machine is one of the job's nodes",
            host,
        )
    job_described = bool(ctx.sbatch) or (bool(ctx.config) and (ctx.expect_gpus is not None or bool(ctx.launcher)))
    if job_described and (ctx.sbatch or ctx.before_submission or not facts.nvidia.get("available")):
        return Target(
            "job",
            f"{what} (before submission, from {host})",
            False,
            f"{'--sbatch' if ctx.sbatch else '--config'} outside any job: {host} is the submit host, "
            "not where the job runs",
            host,
        )
    label = "this machine" if host == "this machine" else f"this machine ({host})"
    return Target("machine", label, True, "no job script: the machine gpudoctor runs on", host)


# Sections a --node-snapshot contributes: what the node is. The environment, the batch script's view of
# the job and the cluster's answers stay this run's (the snapshot may have been taken inside another job).
LOCAL_SECTIONS = ("env", "cluster", "job")


def partition_of(ctx) -> str | None:
    """The partition the script asks for (#SBATCH --partition / -p), None for the cluster's default."""
    sb = ctx.sbatch
    options = getattr(sb, "options", None) or {}
    value = options.get("partition")
    if isinstance(value, str) and value.strip() and "$" not in value:
        return value.strip()
    return None


def merge_node_snapshot(local: Facts, node: Facts) -> Facts:
    """The job's node (the snapshot) with this run's environment and cluster view."""
    sections = {k: v for k, v in node.sections.items() if k not in LOCAL_SECTIONS}
    for k in LOCAL_SECTIONS:
        if k in local.sections:
            sections[k] = local.sections[k]
    # The node facts answer for the cluster where this run could not ask it (a replay without that section).
    sections.setdefault("cluster", {"available": False, "reason": "the cluster was not asked in this run"})
    slurm = sections.get("slurm")
    if isinstance(slurm, dict):  # the recording job's controller record is not this job's
        sections["slurm"] = {**slurm, "job": None, "in_job": False}
    meta = {**local.meta, "node_snapshot_collected_at": node.meta.get("collected_at")}
    return Facts(sections=sections, meta=meta)
