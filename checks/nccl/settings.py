"""nccl checks of NCCL itself and its variables: NCCL in torch, debug logging, malformed values.

How NCCL and torch read these variables: gpudoctor/readers/ncclenv.py (sources cited there)."""

from __future__ import annotations

from gpudoctor import shellquote
from gpudoctor.job.env import job_env
from gpudoctor.job.layout import layout
from gpudoctor.model import Outcome, fail, info, manual, passed, skip, warn
from gpudoctor.readers.ncclenv import (
    NCCL_DEBUG_LEVELS,
    nccl_problems,
    torch_nccl_problems,
)
from gpudoctor.readers.ncclnames import KNOWN, NCCL_DOCS, TORCH_SOURCE, unread
from gpudoctor.registry import check


@check(
    id="GD-NCCL-001",
    name="nccl-missing-in-torch",
    category="nccl",
    title="torch has NCCL for multi-GPU training",
    needs=["torch", "env"],
    requires=["torch", "gpus-expected"],
    what="When the job runs more than one process on GPUs, torch must be built with torch.distributed "
    "and NCCL (torch.distributed.is_nccl_available()).",
    why="init_process_group('nccl') on a torch without NCCL raises 'Distributed package doesn't have NCCL "
    "built in' on every rank, after the allocation has started.",
    fix="Install a CUDA build of torch from download.pytorch.org (the Linux CUDA wheels ship NCCL), not a "
    "CPU-only or source build without USE_NCCL=1.",
)
def nccl_missing_in_torch(facts, ctx):
    t = facts.torch
    lay = layout(facts, ctx)
    evidence = {
        "torch": t.get("version"),
        "nccl": _fmt_nccl(t.get("nccl")),
        "nccl_available": t.get("nccl_available"),
        **lay.evidence(),
    }
    if not lay.multi_process:
        return skip(
            "a single process (no WORLD_SIZE, LOCAL_WORLD_SIZE or SLURM task layout above 1): NCCL is not used",
            **evidence,
        )
    if not t.get("cuda") and not t.get("hip"):
        return skip("torch is a CPU-only build (see the cuda checks)", **evidence)
    fix = manual(
        "Install a CUDA build of torch", "pip install torch --index-url https://download.pytorch.org/whl/cu124"
    )
    if t.get("distributed_available") is False:
        return fail(
            f"torch {t.get('version')} was built without torch.distributed: a multi-process job cannot start",
            fix,
            **evidence,
        )
    if not t.get("nccl_available"):
        return fail(
            f"torch {t.get('version')} has no NCCL: init_process_group('nccl') raises \"Distributed package doesn't "
            'have NCCL built in"',
            fix,
            **evidence,
        )
    return passed(f"torch {t.get('version')} has NCCL {_fmt_nccl(t.get('nccl'))}", **evidence)


def _fmt_nccl(v) -> str:
    return ".".join(str(p) for p in v) if isinstance(v, (list, tuple)) and v else "?"


@check(
    id="GD-NCCL-005",
    name="nccl-debug-logging-left-on",
    category="nccl",
    title="NCCL debug logging off for production runs",
    needs=["env"],
    scope="job",
    what="Reads NCCL_DEBUG and NCCL_DEBUG_SUBSYS.",
    why="NCCL_DEBUG=INFO prints dozens of lines per rank at every communicator set-up: right for debugging a "
    "hang, noise in a long run. With NCCL_DEBUG_SUBSYS including COLL (or ALL), NCCL logs every "
    "collective: millions of lines and measurable overhead. WARN is the level for production.",
    fix="export NCCL_DEBUG=WARN (or unset it) once the set-up works; keep INFO only while debugging. "
    "A debugging switch is yours: `gpudoctor fix --apply` never rewrites it.",
)
def nccl_debug_logging_left_on(facts, ctx):
    env = job_env(facts, ctx)
    value = env.get("NCCL_DEBUG")
    subsys = env.get("NCCL_DEBUG_SUBSYS") or ""
    evidence = {
        "NCCL_DEBUG": value,
        "NCCL_DEBUG_SUBSYS": env.get("NCCL_DEBUG_SUBSYS"),
        "NCCL_DEBUG_FILE": env.get("NCCL_DEBUG_FILE"),
    }
    level = (value or "").strip().upper()
    if value is None or level in ("VERSION", "WARN", "ABORT"):
        return passed(f"NCCL_DEBUG={value or 'unset'}", **evidence)
    if level not in NCCL_DEBUG_LEVELS:
        return passed(
            f"NCCL_DEBUG={value!r} is not a level NCCL knows, so it logs nothing (see GD-NCCL-006)", **evidence
        )
    per_collective = {s.strip().upper() for s in subsys.lstrip("^").split(",")} & {
        "COLL",
        "ALL",
    } and not subsys.startswith("^")
    where = f" to {env['NCCL_DEBUG_FILE']}" if env.get("NCCL_DEBUG_FILE") else ""
    # A debugging switch is the author's choice: the fix is a command for them, never an edit that
    # `gpudoctor fix --apply` would make behind their back (issue 38: INFO was rewritten to WARN).
    lower = manual("When the set-up works, lower NCCL's logging", "export NCCL_DEBUG=WARN")
    if per_collective:
        return warn(
            f"NCCL_DEBUG={value} with NCCL_DEBUG_SUBSYS={subsys} logs every collective{where}: huge, slow logs",
            lower,
            **evidence,
        )
    return info(f"NCCL_DEBUG={value} logs every rank's set-up{where}: fine while debugging", lower, **evidence)


@check(
    id="GD-NCCL-006",
    name="nccl-env-malformed",
    category="nccl",
    title="NCCL_* and TORCH_NCCL_* values are ones NCCL and torch understand",
    needs=["env"],
    scope="job",
    what="Reads the NCCL_* variables as NCCL parses them (integers with C's strtoll, case-sensitive path "
    "levels, NCCL_DEBUG levels) and torch's TORCH_NCCL_* variables as ProcessGroupNCCL does.",
    why="NCCL never rejects a bad value: 'NCCL_IB_DISABLE=true' reads as 0 and leaves InfiniBand on, "
    "'NCCL_BUFFSIZE=4MB' reads as 4 bytes, 'NCCL_P2P_LEVEL=nvl' is ignored. The setting looks applied and "
    "is not. torch is the opposite: a TORCH_NCCL_* boolean or integer it cannot parse makes "
    "init_process_group raise on every rank.",
    fix="Use plain integers for NCCL's numeric variables (1 to disable), upper-case path levels (NVL, PIX, "
    "SYS...), and 1/0 for TORCH_NCCL_* switches.",
)
def nccl_env_malformed(facts, ctx):
    env = job_env(facts, ctx)
    names = sorted(k for k in env if k.startswith(("NCCL_", "TORCH_NCCL_")))
    evidence = {k: env[k] for k in names}
    fatal, ignored = torch_nccl_problems(env), nccl_problems(env)
    fix = manual("Correct the values", *(f"env | grep {p.split('=', 1)[0]}" for p in (fatal + ignored)[:3]))
    if fatal:
        return fail("; ".join(fatal + ignored), fix, **evidence)
    if ignored:
        return warn("; ".join(ignored), fix, **evidence)
    if not names:
        return passed("no NCCL_* or TORCH_NCCL_* variables set", **evidence)
    return passed(f"{len(names)} NCCL variable(s) set, all well-formed", **evidence)


@check(
    id="GD-NCCL-013",
    name="nccl-env-name-unread",
    category="nccl",
    title="Every NCCL_*, TORCH_NCCL_* and TORCH_DISTRIBUTED_* variable is one NCCL or PyTorch reads",
    needs=["env"],
    scope="job",
    what="Compares the job's NCCL_*, TORCH_NCCL_* and TORCH_DISTRIBUTED_* variables with the names NCCL "
    "documents (its user guide's Environment Variables page) and those PyTorch's NCCL process group reads "
    "(ProcessGroupNCCL.hpp's cvars, TORCH_DISTRIBUTED_DEBUG): the lists and their sources are data in "
    "gpudoctor/readers/ncclnames.py.",
    why="Neither NCCL nor PyTorch warns about a variable it does not read: `export NCCL_TIMEOUT=1800` or "
    "`TORCH_NCCL_TIMEOUT=1800` looks like a 30-minute timeout and sets none (the collectives' timeout is "
    "init_process_group(timeout=...)), and a misspelled NCCL_SOCKET_IFNAM leaves NCCL choosing the interface.",
    fix="Use the name NCCL or PyTorch reads (the message names the likely one), or set the value where it is "
    "read: the process group's timeout is `init_process_group(timeout=timedelta(seconds=1800))`.",
)
def nccl_env_name_unread(facts, ctx):
    env = job_env(facts, ctx)
    found = unread(env)
    if not found:
        return passed("every NCCL/PyTorch variable set is one they read")
    unsure = [name for name, _, certain in found if not certain]
    outcomes = [_unread(name, meant, env) for name, meant, certain in found if certain]
    if unsure:
        evidence: dict = {name: env[name] for name in unsure}
        evidence["sources"] = [NCCL_DOCS, TORCH_SOURCE]
        names = ", ".join(unsure)
        outcomes.append(
            info(
                f"{names}: in neither NCCL's documented list nor PyTorch's (NCCL reads a few undocumented)",
                None,
                **evidence,
            )
        )
    return outcomes


def _unread(name: str, meant: str | None, env: dict) -> Outcome:
    """One variable neither reads: the name meant (a typo of a known one), or where its setting really is."""
    evidence = {name: env[name], "sources": [NCCL_DOCS, TORCH_SOURCE]}
    if meant in KNOWN:
        fix = manual(
            f"Use the name that is read: {meant}", f"export {meant}={shellquote.quote(env[name])}", f"unset {name}"
        )
        return warn(f"{name} is read by neither NCCL nor PyTorch: did you mean {meant}?", fix, **evidence)
    evidence["read_instead"] = meant
    fix = manual(f"Set the timeout in the program: {meant}", f"unset {name}")
    return warn(f"{name} is read by neither NCCL nor PyTorch: the timeout is {meant}", fix, **evidence)
