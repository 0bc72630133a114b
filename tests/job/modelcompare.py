"""The job model (gpudoctor/job/model.py) against what a batch script really started (tests/job/reality.py), process
by process: node, rank and world size as the program reads them, the GPUs it sees (CUDA's reading of what it got),
the rendezvous it reaches from its own node, the program's argv and its torchrun's argv as the shell expanded it,
the variables the model gives it; and the worlds they formed. `compare` returns the differences, and for each
field the model leaves unknown, the model's reason (an unknown field is not compared).

Processes are paired by (node, SLURM_PROCID, local rank). A process the model says never joins a world (its rank
unknown: "no world forms", "not admitted") may be absent in reality (torchrun never started it); every process
that ran must be one the model predicts, and every process whose rank the model knows must have run.
"""

from __future__ import annotations

import re

from gpudoctor.job.model import JobModel, Process, build, known
from gpudoctor.readers.sbatch.reader import load_sbatch
from tests.job.jobscripts import observed_endpoint
from tests.job.reality import JobRun, ProcessRecord, launcher_start
from tests.job.recorder import NAMES as RECORDED
from tests.job.recorder import PREFIXES as RECORDED_PREFIXES

# Where the model and reality disagree today, each with what torchrun really does (reported to the model's
# authors). A difference listed here is shown (the test's `known` output), not failed; one not listed fails;
# when the model is fixed, the entry is simply no longer met.
KNOWN_DIFFERENCES: dict[str, str] = {
    # regex of a difference line: why the model is known to differ there (with the consumer's source). Empty: the
    # workers' MASTER_ADDR/MASTER_PORT under c10d and --standalone, once listed here, are now modelled as torchrun
    # gives them (the rank-0 agent's host and a free port it picks: RendezvousStoreInfo.build).
}


def split_known(bad: list[str]) -> tuple[list[str], list[str]]:
    """(the differences not listed in KNOWN_DIFFERENCES, the listed ones met)."""
    known_met = [line for line in bad if any(re.search(rx, line) for rx in KNOWN_DIFFERENCES)]
    return [line for line in bad if line not in known_met], known_met


def model_of(run: JobRun, text: str | None = None) -> JobModel:
    """The model of the run's script (or of text, another script, beside the same files), read as `gpudoctor
    check --sbatch` reads it (load_sbatch: the program beside it)."""
    path = run.job_dir / "job.sbatch"
    if text is not None:
        path = run.job_dir / "other.sbatch"
        path.write_text(text)
    return build(load_sbatch(str(path)))


def _key(node: int | None, procid: object, local: object) -> tuple:
    return (node, str(procid), str(local))


def record_key(rec: ProcessRecord) -> tuple:
    return _key(rec.node, rec.get("SLURM_PROCID"), rec.get("LOCAL_RANK") or rec.get("SLURM_LOCALID"))


def as_pattern(text: str) -> re.Pattern[str]:
    """The model's argument text with what the shell computes at run time ($VAR, ${VAR}, $(...)) as wildcards."""
    parts = re.split(r"(\$\([^)]*\)|\$\{[^}]*\}|\$\w+)", text)
    return re.compile("".join(".+" if i % 2 else re.escape(p) for i, p in enumerate(parts)))


def _matches(model_args: list[str], ran_args) -> bool:
    ran_args = list(ran_args)
    return len(model_args) == len(ran_args) and all(
        as_pattern(a).fullmatch(b) for a, b in zip(model_args, ran_args, strict=True)
    )


def _visible(rec: ProcessRecord) -> tuple[str, ...]:
    """CUDA_VISIBLE_DEVICES as the process got it, read by CUDA's rule for the values these scripts give (the
    entries up to the first that is not a number: `0,` is GPU 0 alone); unset with no GPU in the step is none
    of the allocation's GPUs (on a cluster with ConstrainDevices the task sees none; the model says ())."""
    value = rec.visible_gpus
    if value is None:
        return () if not (rec.get("SLURM_STEP_GPUS") or rec.get("SLURM_JOB_GPUS")) else ("unset",)
    out: list[str] = []
    for entry in value.split(","):
        if not re.fullmatch(r"\s*\+?\d+", entry):
            break
        out.append(str(int(entry)))
    return tuple(out)


def compare(model: JobModel, run: JobRun, names: list[str]) -> tuple[list[str], dict[str, str]]:
    """(mismatches, {field: the model's reason} for each field the model leaves unknown)."""
    bad: list[str] = []
    unknown: dict[str, str] = {}
    predicted: dict[tuple, Process] = {_key(p.node, p.procid, p.local_rank): p for p in model.processes()}
    records = {record_key(r): r for r in run.records}
    if len(records) != len(run.records):
        bad.append(f"two processes ran as one (node, procid, local rank): {[record_key(r) for r in run.records]}")
    for key, rec in records.items():
        if key not in predicted:
            bad.append(f"{key}: ran ({rec.argv}), not in the model")
    for key, p in predicted.items():
        rec = records.get(key)
        if rec is None:
            if known(p.rank):
                bad.append(f"{key}: the model's rank {p.rank} never ran")
            else:
                unknown.setdefault("rank", f"not run: {p.rank.why}")  # type: ignore[union-attr]
                unknown.setdefault("world_size", f"not run: {getattr(p.world_size, 'why', p.world_size)}")
            continue
        bad += [f"{key}: {m}" for m in _compare_process(p, rec, names, unknown)]
    bad += _compare_worlds(model, run, records)
    return bad, unknown


def _compare_process(p: Process, rec: ProcessRecord, names: list[str], unknown: dict[str, str]) -> list[str]:
    bad = []
    fields = {
        "rank": (p.rank, rec.rank),
        "world_size": (p.world_size, rec.world_size),
        "visible_gpus": (p.visible_gpus, _visible(rec)),
    }
    for name, (want, got) in fields.items():
        if not known(want):
            unknown.setdefault(name, want.why)  # type: ignore[union-attr]
        elif (str(want) if name != "visible_gpus" else want) != got:
            bad.append(f"{name}: model {want!r}, ran {got!r}")
    bad += _compare_rendezvous(p, rec, names, unknown)
    bad += _compare_argv(p, rec, unknown)
    bad += _compare_env(p, rec)
    return bad


def _compare_env(p: Process, rec: ProcessRecord) -> list[str]:
    """Every variable the model gives the process, of those the recorder records, has that value (run-time
    expansions as wildcards); a variable the model does not give is not compared (the model lists what it knows)."""
    bad = []
    for name, want in sorted(p.env.items()):
        if not (name in RECORDED or name.startswith(RECORDED_PREFIXES)):
            continue
        got = rec.env.get(name)
        if got is None or not as_pattern(str(want)).fullmatch(got):
            bad.append(f"env {name}: model {want!r} ({p.env_sources.get(name, '?')}), ran {got!r}")
    return bad


def _compare_rendezvous(p: Process, rec: ProcessRecord, names: list[str], unknown: dict[str, str]) -> list[str]:
    got = observed_endpoint(rec, names)
    if p.launcher != "torchrun":
        return []  # a plain program's rendezvous is its own init's (MASTER_ADDR): not recorded here
    if p.rendezvous is None or got is None:
        return [] if p.rendezvous is None and got is None else [f"rendezvous: model {p.rendezvous}, ran {got}"]
    reaches, port = p.rendezvous.reaches, p.rendezvous.port
    if not known(reaches):
        unknown.setdefault("rendezvous", reaches.why)  # type: ignore[union-attr]
        return []
    want = (reaches, port if known(port) else got[1])
    return [] if want == got else [f"rendezvous: model reaches {want}, ran {got} ({rec.launcher_endpoint})"]


def _compare_argv(p: Process, rec: ProcessRecord, unknown: dict[str, str]) -> list[str]:
    """The program's argv is the model's from the program on; a launcher's own argv (torchrun's, as the shell
    expanded it: the recorder's parent) matches the model's with run-time expansions as wildcards."""
    argv = list(p.argv)
    if rec.argv[0] not in argv:
        return [f"argv: the program {rec.argv[0]} is not in the model's {argv}"]
    at = argv.index(rec.argv[0])
    bad = []
    program = argv[at:]
    if any("$" in a for a in program):
        unknown.setdefault("argv", f"expanded at run time: {program}")
        if not _matches(program, rec.argv):
            bad.append(f"argv: model {program}, ran {list(rec.argv)}")
    elif tuple(program) != rec.argv:
        bad.append(f"argv: model {program}, ran {list(rec.argv)}")
    if p.launcher == "torchrun":
        launcher = argv[(launcher_start(argv) or 1) : at]  # torchrun's options
        ran_args = list(rec.parent_argv or ())
        start = launcher_start(ran_args)
        if start is None:
            return [*bad, f"torchrun argv: model {launcher}, but its parent ran {ran_args}"]
        ran_args = ran_args[start : len(ran_args) - len(rec.argv)]
        if not _matches(launcher, ran_args):
            bad.append(f"torchrun argv: model {launcher}, ran {ran_args}")
    return bad


def _compare_worlds(model: JobModel, run: JobRun, records: dict[tuple, ProcessRecord]) -> list[str]:
    """The processes that joined (GD_RECORD_JOIN) group into the worlds the model says (those it gives a rank)."""
    if not any(r.world is not None for r in run.records):
        return []
    want: dict[str, set] = {}
    for p in model.processes():
        if known(p.world) and known(p.rank):
            want.setdefault(str(p.world), set()).add(_key(p.node, p.procid, p.local_rank))
    ranked = set().union(*want.values()) if want else set()
    got: dict[str, set] = {}
    for key, rec in records.items():  # a process the model gives no rank may form a world of its own or none
        if key in ranked and rec.world is not None and rec.world.formed and rec.world.id:
            got.setdefault(rec.world.id, set()).add(key)
    want_sets = sorted(sorted(v) for v in want.values())
    got_sets = sorted(sorted(v) for v in got.values())
    return [] if want_sets == got_sets else [f"worlds: model {want_sets}, formed {got_sets}"]
