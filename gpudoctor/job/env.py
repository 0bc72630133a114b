"""The one environment accessor of the checks: the job's variables, each with where it came from.

The job runs with this process's environment (the probe's, `facts.env`) plus what its --sbatch
script sets: before submission (no SLURM_JOB_ID here) the script's #SBATCH directives imply
SLURM_NNODES, SLURM_NTASKS, ... (as sbatch sets them in the batch shell), and its `export`/`unset`
lines apply on top, in script order, then the training launch's own environment: `NAME=value srun ...`,
`env NAME=value ...`, `env -u NAME`, `env -i` (bash(1) SIMPLE COMMAND EXPANSION; coreutils env(1)).
Values the script computes at run time ($(...), $VAR left unexpanded, the script's own arguments $1 ...)
and credential-named exports are unknown: dropped rather than guessed.

    env = job_env(facts, ctx)
    env.get("PYTORCH_CUDA_ALLOC_CONF")    -> the value the job gets
    env.source("PYTORCH_CUDA_ALLOC_CONF") -> 'job.slurm line 7' | 'environment' | '#SBATCH directives'
    probe_env(facts)                       -> this process's own environment, what the probes ran under
                                              (the libraries they loaded, the GPUs they saw, the CPU set)
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

ENVIRONMENT = "environment"
DIRECTIVES = "#SBATCH directives"
_UNKNOWN_VALUE = re.compile(r"[$`]")


class JobEnv(dict[str, str]):
    """The job's environment (a plain dict of name -> value) with the source of each value."""

    def __init__(self, here: Mapping[str, str]) -> None:
        super().__init__(here)
        self.here: Mapping[str, str] = here
        self._sources: dict[str, str] = dict.fromkeys(here, ENVIRONMENT)

    def source(self, name: str) -> str | None:
        """Where the job's value of name comes from; None when the job does not get the variable."""
        return self._sources.get(name) if name in self else None

    def put(self, name: str, value: str, source: str) -> None:
        self[name] = value
        self._sources[name] = source

    def drop(self, name: str) -> None:
        self.pop(name, None)
        self._sources.pop(name, None)

    def copy(self) -> JobEnv:
        twin = JobEnv({})
        dict.update(twin, self)
        twin.here, twin._sources = self.here, dict(self._sources)
        return twin


# (id(facts), id(ctx)) -> (facts, ctx, their JobEnv), while a run of the checks is under way (built_once). The
# entry holds facts and ctx themselves: while they live, no other object can take their ids (the runner makes a
# short-lived ctx for a check that defers to others, and a later one could otherwise reuse its id).
_BUILT: ContextVar[dict[tuple[int, int], tuple[object, object, JobEnv]] | None] = ContextVar(
    "gpudoctor_job_env_built", default=None
)


@contextmanager
def built_once() -> Iterator[None]:
    """Within the block, job_env builds each (facts, ctx) pair's environment once and hands out copies: a run of the
    checks asks for it about 35 times over the same, unchanging inputs (1.2 of 3.7 s of `check` on a 16,000-line
    script, profiled). facts and ctx must not change within the block (runner.run_checks)."""
    token = _BUILT.set({})
    try:
        yield
    finally:
        _BUILT.reset(token)


def probe_env(facts) -> Mapping[str, str]:
    """The environment gpudoctor's probes ran under: judge what they saw (loaded libraries, visible GPUs,
    this process's CPU set, whether it runs inside a SLURM step) by it, and the job's settings by job_env."""
    return facts.env


def job_env(facts, ctx) -> JobEnv:
    """The environment the job will run with (module docstring)."""
    built = _BUILT.get()
    if built is None:
        return _build(facts, ctx)
    key = (id(facts), id(ctx))
    if key not in built:
        built[key] = (facts, ctx, _build(facts, ctx))
    return built[key][2].copy()


def _build(facts, ctx) -> JobEnv:
    env = JobEnv(facts.env)
    sb = ctx.sbatch
    if not sb:
        return env
    if "SLURM_JOB_ID" not in facts.env:
        from gpudoctor.readers.sbatch import implied_slurm_env

        for name, value in implied_slurm_env(sb.options, sb.job_name or "").items():
            env.put(name, value, DIRECTIVES)
    script = (sb.path or "the script").rsplit("/", 1)[-1]
    launch = getattr(sb, "launch", None)
    if launch is not None and launch.env_cleared:
        # `env -i ... python train.py`: the program starts from an empty environment; only what the line itself
        # gives (and SLURM's own variables, when srun comes after the clearing and sets them per task) reaches it.
        for name in list(env):
            if env.source(name) != DIRECTIVES:
                env.drop(name)
    for name, entry in sb.exports.items():
        value = entry.value
        if launch is not None and launch.env_cleared and not entry.command_only:
            continue
        if value is None or entry.redacted or _UNKNOWN_VALUE.search(str(value)):
            env.drop(name)
        else:
            where = f"{script} line {entry.line}"
            env.put(name, str(value), f"{where} (for its command)" if entry.command_only else where)
    return env


_ARGUMENT_REF = re.compile(r"\$\{?([1-9]\d*|[@*#])")
_ORDINALS = {"1": "first", "2": "second", "3": "third", "4": "fourth", "5": "fifth"}


def script_argument_note(value: str | None, script: str = "job.slurm") -> str | None:
    """Why a value that names the script's arguments ($1, ${2:-x}, "$@") is unknown before submission; None when it
    names none. bash(1) "Positional Parameters": the arguments `sbatch FILE ARGS` passes; empty when none is given."""
    m = _ARGUMENT_REF.search(value or "")
    if m is None:
        return None
    name = m.group(1)
    what = f"the script's {_ORDINALS.get(name, name + 'th')} argument" if name.isdigit() else "the script's arguments"
    return (
        f"${name} is {what}: unknown before submission (empty unless `sbatch {script} ARGS` gives it); "
        f"name them with `gpudoctor check --sbatch {script} -- ARGS`"
    )
