"""`gpudoctor compare A.json B.json ...`: every snapshot one member of a job, judged as one job (the job view:
gpudoctor/job/compare.py; its text: gpudoctor/report/jobtext.py)."""

from __future__ import annotations

from gpudoctor.facts import Facts
from gpudoctor.job.compare import members_from_snapshots, view


def job_specs(ignore: list[str] | None) -> list:
    """The job checks: always judged by compare and check --job (--select narrows only the nodes' own
    checks), unless --ignore names them."""
    from gpudoctor.registry import load_all, select

    return select(load_all(), ["job"], ignore)


def compare(
    paths: list[str],
    specs: list,
    as_json: bool = False,
    strict: bool = False,
    verbose: bool = False,
    ignore: list[str] | None = None,
) -> int:
    """`gpudoctor compare`: exit 0/1 like check; an unreadable snapshot raises SnapshotError (exit 2)."""
    from gpudoctor.facts import SnapshotError
    from gpudoctor.model import Context
    from gpudoctor.report.emit import Output, emit
    from gpudoctor.runner import run_checks

    facts_list = []
    for path in paths:
        facts_list.append(Facts.load(path, what="compare"))  # SnapshotError: the caller prints one line, exit 2
    if len(paths) < 2:
        raise SnapshotError("compare needs two snapshots or more")
    node_specs = [s for s in specs if s.category != "job"]
    specs = node_specs + job_specs(ignore)
    ctx = Context()
    findings_list = [run_checks(node_specs, f, ctx) for f in facts_list]
    members = members_from_snapshots(paths, facts_list, findings_list)
    job = view(members, source="snapshots")
    findings = run_checks([s for s in specs if s.category == "job"], Facts(sections={"job": job}, meta={}), ctx)
    result = job_result(findings, job, f"gpudoctor compare: {len(paths)} snapshots", strict=strict, verbose=verbose)
    emit(result, [Output("json" if as_json else "text")])
    return result.exit_code


def job_result(findings, job: dict, header: str, *, strict: bool, verbose: bool, **more):
    """The Result of a job judged across its ranks: every finding counts; the JSON says how many nodes and ranks."""
    from gpudoctor.model import exit_code
    from gpudoctor.report.result import Result, View

    nodes = sorted({m["node"] for m in job["members"]})
    source = {
        "job": {
            "source": job["source"],
            "nodes": len(nodes),
            "ranks": len(job["members"]),
            "world_size": job.get("world_size"),
        }
    }
    code = int(exit_code(findings, strict=strict))
    return Result(
        findings,
        findings,
        code,
        strict=strict,
        kind="job",
        view=View(header=header),
        detail="all" if verbose else "default",
        source=source,
        job=job,
        **more,
    )
