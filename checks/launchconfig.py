"""slurm checks of a launcher's own inputs on the launch line of a batch script (--sbatch).

GD-SLURM-033: the config file `accelerate launch --config_file F` reads, read as accelerate reads it
(gpudoctor/readers/accelerate.py, after huggingface/accelerate 1.x commands/launch.py and
commands/config/config_args.py): where it is, whether it can be read, and the values the launch takes from it.
The process counts it gives are judged by the existing launcher checks (GD-SLURM-002/003/009, GD-DIST-001)
through the job's shape.
"""

from __future__ import annotations

from gpudoctor.model import fail, info, manual, passed, skip, warn
from gpudoctor.readers.accelerate import DEFAULT_CONFIG, accelerate_plan
from gpudoctor.registry import check


def _launch_evidence(launch) -> dict:
    return {"launch line": f"line {launch.line}: {launch.text}"}


@check(
    id="GD-SLURM-033",
    name="accelerate-config-file-unread",
    category="slurm",
    title="The accelerate config file of the launch line is there and readable",
    needs=[],
    scope="job",
    what="Reads the file of `accelerate launch --config_file F` on the batch script's training line as accelerate "
    "does: JSON for a .json name, YAML otherwise, relative to the directory the launch runs in (#SBATCH --chdir, "
    "else the directory sbatch is run from, which is unknown before submission: the script's directory and the "
    "current directory are tried; then any `cd`). Reports where F was found and the values the launch takes from "
    "it: the command line wins, then F, then accelerate's defaults (num_machines 1, machine_rank 0). Those values "
    "are what the launcher checks (GD-SLURM-002/003/009, GD-DIST-001) judge.",
    why="accelerate stops at once when F does not exist ('The passed configuration file ... does not exist'), when "
    "it is not valid YAML/JSON, when it has no distributed_type, and when neither F nor the line gives "
    "num_processes -- after the job has waited in the queue. And F decides how many processes each node starts "
    "and which node is the main one: a config written for one machine starts the wrong world on several.",
    fix="Give F as an absolute path, or one relative to a directory the script `cd`s to, and write it with "
    "`accelerate config --config_file F` (or correct the key named). Without --config_file accelerate reads "
    f"{DEFAULT_CONFIG} on the node when it exists: pass --config_file to make the job independent of it.",
)
def accelerate_config_file_unread(facts, ctx):
    sb = ctx.sbatch
    if sb is None or not hasattr(sb, "launch"):
        return skip("no batch script given (--sbatch)")
    launch = sb.launch
    if launch is None or launch.launcher != "accelerate" or not launch.config_file:
        return skip("the training line is not `accelerate launch --config_file F`")
    config = launch.launcher_config
    evidence = {**_launch_evidence(launch), "config_file": launch.config_file}
    if config is None:
        return skip("the config file was not looked for (the script was not read from a file)", **evidence)
    where = config.path or config.written
    if config.status == "unresolved":
        return info(
            f"--config_file {config.written}: {config.problem}, so its values (processes, machines, machine rank) "
            "are not known before submission",
            **evidence,
        )
    if config.status == "missing":
        relative = not config.written.startswith(("/", "~"))
        return warn(
            f"--config_file {config.written} (line {launch.line}): {config.problem}; accelerate stops at start "
            f"('The passed configuration file `{config.written}` does not exist')"
            + (
                " unless the directory sbatch is run from holds it (the job starts there)"
                if relative and launch.cwd is None and not sb.options.get("chdir")
                else ""
            ),
            manual(
                "Point --config_file at the file the job can open",
                f"accelerate config --config_file {config.written}   (writes it), or give its absolute path",
            ),
            looked_in=where,
            **evidence,
        )
    if config.status == "unreadable":
        return warn(
            f"accelerate cannot read its config file: {config.problem}; the launch stops before training",
            manual("Rewrite the config file", f"accelerate config --config_file {where}"),
            **evidence,
        )
    plan = accelerate_plan(launch)
    settings = {
        name: f"{getattr(plan, name).value} ({getattr(plan, name).source})"
        for name in ("mode", "num_processes", "num_machines", "machine_rank", "main_process_ip", "main_process_port")
    }
    evidence.update(config_path=where, **settings)
    if plan.stops:
        return fail(
            "; ".join(plan.stops) + " -- before any training",
            manual("Complete the config file (or pass the value on the launch line)", f"accelerate config --config_file {where}"),
            **evidence,
        )
    per = f" ({plan.procs_per_machine} per machine)" if plan.procs_per_machine else ""
    notes = "; ".join(plan.notes)
    return passed(
        f"accelerate reads {where}: {plan.mode.value or 'distributed_type unknown'}, num_processes "
        f"{plan.num_processes.value} over num_machines {plan.num_machines.value}{per}, machine_rank "
        f"{plan.machine_rank.value}" + (f"; {notes}" if notes else ""),
        **evidence,
    )
