"""distributed checks of deprecated launchers and names: torch.distributed.launch, renamed NCCL_* variables."""

from __future__ import annotations

import re

from gpudoctor import versions
from gpudoctor.job.env import job_env
from gpudoctor.model import (
    Action,
    ActionKind,
    Fix,
    Safety,
    export_title,
    info,
    manual,
    passed,
    set_env,
    unset_env,
    warn,
)
from gpudoctor.redact import REDACTED
from gpudoctor.registry import check

_LEGACY_LAUNCHER = re.compile(r"\bpython[\d.]*\s+-m\s*torch\.distributed\.launch\b")


_USE_ENV = re.compile(r"\s+--use[-_]env\b")


def _as_torchrun(line: str) -> str:
    """The user's own launch line with torchrun in place of `python -m torch.distributed.launch` (torchrun takes
    the same options and always passes the rank in the environment, so --use-env goes)."""
    return _USE_ENV.sub("", _LEGACY_LAUNCHER.sub("torchrun", line))


def _legacy_launches(sbatch) -> list:
    return [ln for ln in sbatch.launches if ln.launcher == "torch.distributed.launch"]


@check(
    id="GD-DIST-004",
    name="deprecated-torch-distributed-launch",
    category="distributed",
    title="Not launched with the deprecated torch.distributed.launch",
    needs=[],
    requires=["sbatch"],
    scope="job",
    what="Looks for `python -m torch.distributed.launch` among the launch lines of the batch script given "
    "with --sbatch.",
    why="torch.distributed.launch has been deprecated in favour of torchrun since torch 1.10. Since torch "
    "2.0 it passes `--local-rank=N` (dashed) to the script unless --use-env is given, so a script whose "
    "argparse knows only `--local_rank` stops at once with 'unrecognized arguments: --local-rank=0'.",
    fix="Replace `python -m torch.distributed.launch --nproc_per_node=N train.py` with `torchrun "
    "--nproc-per-node=N train.py` and read the rank from os.environ['LOCAL_RANK'].",
)
def deprecated_torch_distributed_launch(facts, ctx):
    legacy = _legacy_launches(ctx.sbatch)
    evidence = {"sbatch": ctx.sbatch_path, "lines": [f"line {ln.line}: {ln.text}" for ln in legacy][:5]}
    if not legacy:
        return passed("the batch script does not use torch.distributed.launch", sbatch=ctx.sbatch_path)
    fix = manual("Launch with torchrun instead", "; ".join(dict.fromkeys(_as_torchrun(ln.text) for ln in legacy)))
    if all(re.search(r"--use[-_]env\b", ln.text or "") for ln in legacy):
        return info(
            "the batch script uses the deprecated torch.distributed.launch (with --use-env, so ranks come from "
            "LOCAL_RANK): use torchrun",
            fix,
            **evidence,
        )
    return warn(
        "the batch script launches with the deprecated torch.distributed.launch: since torch 2.0 it passes "
        "--local-rank=N, which scripts that parse only --local_rank reject; use torchrun",
        fix,
        **evidence,
    )


# Renamed in torch 2.2 (pytorch#114077); the old names are still read, with a warning per rank.
TORCH_NCCL_RENAMES = {
    "NCCL_ASYNC_ERROR_HANDLING": "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_BLOCKING_WAIT": "TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_DESYNC_DEBUG": "TORCH_NCCL_DESYNC_DEBUG",
    "NCCL_ENABLE_TIMING": "TORCH_NCCL_ENABLE_TIMING",
    "ENABLE_NCCL_HEALTH_CHECK": "TORCH_ENABLE_NCCL_HEALTH_CHECK",
    "NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK": "TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK",
}


RENAMED_IN = (2, 2)


def _rename_findings(env: dict, torch_version):
    new_torch = torch_version is not None and torch_version[:2] >= RENAMED_IN
    old_torch = torch_version is not None and torch_version[:2] < RENAMED_IN
    out: list[tuple[str, str, Fix | None]] = []
    for old, new in TORCH_NCCL_RENAMES.items():
        has_old, has_new = old in env, new in env
        if has_old and has_new and env[old] != env[new] and not old_torch:
            out.append(
                ("warn", f"{old}={env[old]!r} and {new}={env[new]!r} disagree: torch uses {new}", unset_env(old))
            )
        elif has_old and not has_new and not old_torch:
            when = "" if new_torch else " (torch >= 2.2)"
            out.append(
                (
                    "info",
                    f"{old} is deprecated{when}: use {new} (the old name still works, with a warning from every rank)",
                    _rename_fix(old, new, env[old]),
                )
            )
        elif has_new and not has_old and old_torch:
            out.append(
                (
                    "warn",
                    f"{new} has no effect on torch {versions.fmt(torch_version)}, which reads only {old}",
                    manual(
                        f"Set {old} from {new} (its value holds a credential gpudoctor does not copy)",
                        f'export {old}="${new}"',
                    )
                    if REDACTED in env[new]
                    else set_env(old, env[new]),
                )
            )
    return out


def _rename_fix(old: str, new: str, value: str):
    if REDACTED in value:
        # gpudoctor never holds the credential, so it cannot write the value: the shell copies its own bytes
        return manual(
            f"Rename {old} to {new} (its value holds a credential gpudoctor does not copy)",
            f'export {new}="${old}"; unset {old}',
        )
    return Fix(
        f"{export_title(new, value)} and unset {old}",  # the user's value, quoted as the shell line keeps it
        Safety.SAFE,
        (Action(ActionKind.SET_ENV, new, value), Action(ActionKind.UNSET_ENV, old)),
    )


@check(
    id="GD-DIST-005",
    scope="job",
    name="deprecated-nccl-env-names",
    category="distributed",
    title="PyTorch's NCCL variables use the names this torch reads",
    needs=["env", "torch_meta"],
    what="torch 2.2 renamed the ProcessGroupNCCL variables NCCL_ASYNC_ERROR_HANDLING, NCCL_BLOCKING_WAIT, "
    "NCCL_DESYNC_DEBUG, NCCL_ENABLE_TIMING, ENABLE_NCCL_HEALTH_CHECK and "
    "NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK to TORCH_-prefixed names. Compares the names set with the "
    "installed torch version.",
    why="torch >= 2.2 still reads the old names but prints a deprecation warning from every rank, and "
    "when both names are set the new one wins. torch < 2.2 reads only the old names, so a TORCH_NCCL_* "
    "setting copied from newer docs silently does nothing.",
    fix="On torch >= 2.2 rename the variable (e.g. TORCH_NCCL_ASYNC_ERROR_HANDLING=1); on older torch use "
    "the old name.",
)
def deprecated_nccl_env_names(facts, ctx):
    env = job_env(facts, ctx)
    tv = versions.parse(facts.torch_version())
    found = _rename_findings(env, tv)
    names = {k: env[k] for pair in TORCH_NCCL_RENAMES.items() for k in pair if k in env}
    evidence = {"torch": facts.torch_version(), **names}
    if not found:
        if not names:
            return passed("none of the renamed ProcessGroupNCCL variables is set", **evidence)
        return passed(f"{', '.join(names)}: the names torch {facts.torch_version() or ''} reads".rstrip(), **evidence)
    outcomes = []
    for sev, msg, fix in found:
        outcomes.append((warn if sev == "warn" else info)(msg, fix, **evidence))
    return outcomes
