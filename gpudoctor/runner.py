"""Runs checks over facts. A check that raises becomes an `error` finding, never a crash.

The runner applies the policies a check declares (registry module docstring): `needs` and
`requires` skip a check that cannot judge, `scope` turns a verdict about a node measured on the
wrong machine into a hint, `defers_to` hands a check the outcomes of the checks it leaves a
shared finding to.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable, Iterable
from dataclasses import replace

from gpudoctor.facts import Facts
from gpudoctor.model import Context, Finding, Location, Outcome, Severity
from gpudoctor.registry import REQUIREMENTS, CheckSpec, registered


def _gpus_expected(facts: Facts, ctx: Context) -> str | None:
    return None if ctx.gpus_expected else "no GPU training expected (--expect-gpus 0, or a process without CUDA)"


def _nvidia_driver(facts: Facts, ctx: Context) -> str | None:
    return None if facts.nvidia.get("available") else "no NVIDIA driver (see GD-DRV-001)"


def _job_gpus(facts: Facts, ctx: Context) -> str | None:
    from gpudoctor.readers.cudavis import job_gpus

    return _nvidia_driver(facts, ctx) or (None if job_gpus(facts) else "no GPUs to judge")


def _torch(facts: Facts, ctx: Context) -> str | None:
    status = facts.torch.get("status")
    if status == "ok":
        return None
    if status is None and facts.torch_meta.get("not_asked"):
        return f"torch not known here: {facts.torch_meta['not_asked']}"
    return f"torch could not be imported ({status or facts.torch.get('error') or 'not probed'}; see GD-CUDA-001)"


def _cuda_build(facts: Facts, ctx: Context) -> str | None:
    """CPU-only and ROCm builds are GD-CUDA-002's to judge."""
    from gpudoctor import versions

    t = facts.torch
    if t.get("hip"):
        return f"torch {t.get('version')} is a ROCm build (see GD-CUDA-002)"
    if not t.get("cuda"):
        return f"torch {t.get('version')} is a CPU-only build (see GD-CUDA-002)"
    if versions.parse(t["cuda"]) is None:  # a replayed or hand-made snapshot; torch.version.cuda is 'X.Y'
        return f"torch's CUDA version {str(t['cuda'])[:40]!r} is not a version number"
    return None


def _loader_settings(facts: Facts, ctx: Context) -> str | None:
    from gpudoctor.job.env import job_env
    from gpudoctor.readers.dlconfig import from_context

    if from_context(ctx, job_env(facts, ctx)) is not None:
        return None
    return "no training config (--config) or DataLoader (gpudoctor.audit_dataloader) to read settings from"


def _sbatch(facts: Facts, ctx: Context) -> str | None:
    return None if ctx.sbatch is not None else "no --sbatch script given"


def _slurm_job(facts: Facts, ctx: Context) -> str | None:
    from gpudoctor.job.shape import in_slurm_job

    if ctx.sbatch is not None or in_slurm_job(facts.env):  # job.shape.job_shape has a shape to judge
        return None
    return "not inside a SLURM job (no SLURM_JOB_ID) and no --sbatch script given"


def _loader_workers(facts: Facts, ctx: Context) -> str | None:
    from gpudoctor.job.env import job_env
    from gpudoctor.readers.dlconfig import from_context

    settings = from_context(ctx, job_env(facts, ctx))
    return _loader_settings(facts, ctx) if settings is None else settings.workers_unknown()


def _several_hosts(facts: Facts, ctx: Context) -> str | None:
    from gpudoctor.job.layout import layout

    lay = layout(facts, ctx)
    return None if lay.multi_node else f"not a multi-node job (nodes: {lay.nodes.value or 'unknown'})"


# requires= name -> why the check is skipped (None: the requirement holds). One wording per requirement.
UNMET: dict[str, Callable[[Facts, Context], str | None]] = {
    "gpus-expected": _gpus_expected,
    "nvidia-driver": _nvidia_driver,
    "job-gpus": _job_gpus,
    "torch": _torch,
    "cuda-build": _cuda_build,
    "loader-settings": _loader_settings,
    "sbatch": _sbatch,
    "slurm-job": _slurm_job,
    "loader-workers": _loader_workers,
    "several-hosts": _several_hosts,
}
assert UNMET.keys() == REQUIREMENTS.keys()


def _scoped(spec: CheckSpec, o: Outcome, facts: Facts, ctx: Context) -> Outcome:
    """scope="node": before submission a warn/fail about this host's CPUs, memory or network is only
    a hint, since the job runs on compute nodes that may differ from the submit host. It becomes
    info that says where it was judged (run `srun gpudoctor check` in the job for a verdict)."""
    from gpudoctor.job.layout import before_submission
    from gpudoctor.job.target import JOB_RESOURCES, JUDGED_FOR

    if spec.scope != "node" or o.severity not in (Severity.WARN, Severity.FAIL) or not before_submission(facts, ctx):
        return o
    if o.evidence.get(JUDGED_FOR) == JOB_RESOURCES:  # judged against the script's resources, not this host's
        return o
    host = facts.host.get("hostname") or "this host"
    return replace(
        o,
        fix=None,  # computed from this host's numbers, which are not the job's
        severity=Severity.INFO,
        message=f"judged on {host}, not on the node the job will get: {o.message}",
        evidence={**o.evidence, "judged_on": host, "before_submission": True},
    )


def _outcomes(spec: CheckSpec, facts: Facts, ctx: Context) -> list[Outcome]:
    """The check's outcomes with its policies applied; exceptions propagate to the caller."""
    missing = [s for s in spec.needs if not facts.has(s)]
    if missing:
        why = facts.torch_meta.get("not_asked") if "torch" in missing else None  # probe.collect(probe_torch=False)
        message = f"torch not known here: {why}" if why else f"not probed: {', '.join(missing)}"
        return [Outcome(Severity.SKIP, message, {"missing_facts": missing})]
    for requirement in spec.requires:
        reason = UNMET[requirement](facts, ctx)
        if reason is not None:
            return [Outcome(Severity.SKIP, reason, {"requires": requirement})]
    if spec.defers_to:
        ctx = replace(ctx, deferred=_deferred(spec, facts, ctx))
    result = spec.func(facts, ctx)
    outcomes = result if isinstance(result, list) else [result]
    if not outcomes or not all(isinstance(o, Outcome) for o in outcomes):
        raise TypeError(f"check returned {result!r}, expected Outcome or a list of them")
    if "several-hosts" in spec.requires:
        from gpudoctor.job.layout import mark_several_hosts

        outcomes = [mark_several_hosts(o) for o in outcomes]
    return [_scoped(spec, o, facts, ctx) for o in outcomes]


def _deferred(spec: CheckSpec, facts: Facts, ctx: Context) -> dict[str, tuple[Outcome, ...]]:
    """Outcomes of the checks `spec` defers to that are in this run; one that fails is left out
    (its own run reports its error; here it only decides who reports)."""
    out = {}
    for other_id in spec.defers_to:
        other = registered(other_id)
        if other is None or other_id not in (ctx.running or ()):
            continue
        try:
            out[other_id] = tuple(_outcomes(other, facts, replace(ctx, deferred={})))
        except Exception:
            continue
    return out


def run_check(spec: CheckSpec, facts: Facts, ctx: Context) -> list[Finding]:
    try:
        outcomes = _outcomes(spec, facts, ctx)
    except Exception as e:
        tb = traceback.extract_tb(e.__traceback__)[-1]
        return [
            _finding(
                spec,
                Outcome(
                    Severity.ERROR,
                    f"the check itself failed: {type(e).__name__}: {e}",
                    {"exception": type(e).__name__, "where": f"{tb.filename}:{tb.lineno}"},
                ),
            )
        ]
    from gpudoctor.job.locate import locate

    return [_finding(spec, o, locate(o, ctx)) for o in outcomes]


MESSAGE_LIMIT = 120  # a finding's message: one sentence a person reads at a glance (issue 38)
# Where a long message may end, strongest first: the clause before it says what is wrong, the rest why.
_BREAKS = ("; ", " -- ", ": ", " (", ", ")


def _balanced(text: str) -> bool:
    return text.count("(") == text.count(")") and text.count("`") % 2 == 0 and text.count("'") % 2 == 0


def one_sentence(message: str, limit: int = MESSAGE_LIMIT) -> tuple[str, str | None]:
    """(message, detail): a message longer than `limit` ends at its last clause break that fits (and leaves
    no bracket or quote open); what followed becomes the finding's `detail` evidence (-v, JSON), never lost.
    A check's own message is written short; this holds the contract for one that is not."""
    if len(message) <= limit:
        return message, None
    for sep in _BREAKS:
        cuts = [i for i in range(len(message)) if message.startswith(sep, i) and 40 <= i <= limit - 1]
        for i in reversed(cuts):
            if _balanced(message[:i]):
                return message[:i], message[i + len(sep) :].strip()
    head = message[: limit - 1].rsplit(" ", 1)[0]
    return head + "…", message


def _finding(spec: CheckSpec, o: Outcome, location: Location | None = None) -> Finding:
    message, detail = one_sentence(o.message)
    evidence = o.evidence if detail is None else {**o.evidence, "detail": detail}
    return Finding(
        id=spec.id,
        name=spec.name,
        category=spec.category,
        severity=o.severity,
        title=spec.title,
        message=message,
        evidence=evidence,
        fix=o.fix,
        location=location,
    )


def run_checks(specs: Iterable[CheckSpec], facts: Facts, ctx: Context) -> list[Finding]:
    """Runs the checks judged from facts (smoke-sourced ones are `gpudoctor smoke`'s)."""
    specs = [s for s in specs if s.judged_by_check]
    if ctx.running is None:
        ctx = replace(ctx, running=frozenset(s.id for s in specs))
    if ctx.sbatch is not None and (ctx.job is None or ctx.job.script is not ctx.sbatch):
        from gpudoctor.job.env import job_env
        from gpudoctor.job.model import build

        ctx = replace(ctx, job=build(ctx.sbatch, job_env(facts, ctx), ctx))  # the job as it will run, built once
    from gpudoctor.job.env import built_once

    findings: list[Finding] = []
    with built_once():  # facts and ctx stay as they are for the whole run
        for spec in specs:
            findings.extend(run_check(spec, facts, ctx))
    return findings


def summarize(findings: list[Finding]) -> dict[str, int]:
    counts = {s.value: 0 for s in Severity}
    for f in findings:
        counts[f.severity.value] += 1
    return counts
