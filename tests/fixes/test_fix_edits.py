"""Batch-script edits anchored on the reader's spans, and the planner's rules (verify, conflicts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpudoctor.fixes import sbatch_edit as edit
from gpudoctor.fixes.envfile import lines as env_lines
from gpudoctor.fixes.plan import make_plan
from gpudoctor.fixes.sbatch_edit import EditError
from gpudoctor.model import Action, ActionKind, Context, Finding, Fix, Safety, Severity
from gpudoctor.readers.sbatch import parse_sbatch
from gpudoctor.shellquote import Reference
from tests.factsutil import make_facts

SCRIPTS = Path(__file__).parents[1] / "fixtures" / "sbatch"


def options(text: str) -> dict:
    return parse_sbatch(text).options


def test_set_keeps_spelling_and_comment_and_edits_the_directive_sbatch_uses():
    text = "#!/bin/bash\n#SBATCH -n 4\n#SBATCH --ntasks 2   # two\nsrun python t.py\n"
    new = edit.set_directive(text, "ntasks", 8)
    assert new == "#!/bin/bash\n#SBATCH -n 4\n#SBATCH --ntasks 8   # two\nsrun python t.py\n"
    assert options(new)["ntasks"] == "8"


def test_an_alias_names_the_same_option():
    text = "#!/bin/bash\n#SBATCH --tasks-per-node=8\nsrun python t.py\n"
    assert (
        edit.set_directive(text, "ntasks-per-node", 1) == "#!/bin/bash\n#SBATCH --tasks-per-node=1\nsrun python t.py\n"
    )
    assert "ntasks-per-node" not in options(edit.remove_directive(text, "tasks-per-node"))


def test_set_adds_a_missing_option_under_the_last_directive():
    text = "#!/bin/bash\n# comment\n#SBATCH --nodes=1\n\nmodule load x\nsrun python t.py\n"
    new = edit.set_directive(text, "gres", "gpu:h200:8")
    assert new.splitlines()[3] == "#SBATCH --gres=gpu:h200:8"
    assert options(new)["gres"] == "gpu:h200:8"


def test_remove_one_option_of_a_multi_option_line():
    text = "#!/bin/bash\n#SBATCH -N 2 -n8 --gres gpu:4 # c\nsrun python t.py\n"
    new = edit.remove_directive(text, "ntasks")
    assert new == "#!/bin/bash\n#SBATCH -N 2 --gres gpu:4 # c\nsrun python t.py\n"
    assert options(new) == {"nodes": "2", "gres": "gpu:4"}


def test_remove_every_occurrence_and_keep_the_users_comment():
    text = "#!/bin/bash\n#SBATCH --ntasks=1  # one process\n#SBATCH --ntasks=2\nsrun python t.py\n"
    new = edit.remove_directive(text, "ntasks")
    assert "ntasks" not in options(new)
    assert "# removed by gpudoctor fix: #SBATCH --ntasks=1  # one process\n" in new
    assert "#SBATCH --ntasks=2" not in new


def test_hoist_moves_a_late_directive_into_the_header():
    text = (SCRIPTS / "realworld" / "late-sbatch-gres-after-module-load.slurm").read_text()
    new = edit.hoist_directive(text, "#SBATCH --gres=gpu:4")
    script = parse_sbatch(new)
    assert script.options["gres"] == "gpu:4"
    assert [d.text for d in script.late_directives] == ["#SBATCH --ntasks-per-node=4"]
    with pytest.raises(EditError):
        edit.hoist_directive(new, "#SBATCH --gres=gpu:4")


def test_srun_prefix_goes_after_exec_and_is_idempotent():
    text = "#!/bin/bash\n#SBATCH --ntasks-per-node=2\ncd /w\nexec python train.py --lr 1\n"
    new = edit.prefix_srun(text)
    assert new.endswith("exec srun python train.py --lr 1\n")
    assert parse_sbatch(new).launch.srun is not None
    assert edit.prefix_srun(new) == new


def test_exports_set_in_place_added_before_launch_and_removed():
    text = "#!/bin/bash\n#SBATCH --nodes=1\nexport A=1 NCCL_DEBUG=INFO\n  srun python t.py\n"
    new = edit.set_export(text, "NCCL_DEBUG", "WARN")
    assert "export A=1 NCCL_DEBUG=WARN\n" in new
    new = edit.set_export(new, "OMP_NUM_THREADS", Reference("SLURM_CPUS_PER_TASK"))
    assert '  export OMP_NUM_THREADS="$SLURM_CPUS_PER_TASK"\n  srun python t.py\n' in new
    new = edit.remove_export(new, "NCCL_DEBUG")
    assert "\nexport A=1\n" in new
    assert "NCCL_DEBUG" not in parse_sbatch(new).exports
    new = edit.remove_export(new, "CUDA_VISIBLE_DEVICES", inherited=True)
    assert "  unset CUDA_VISIBLE_DEVICES\n  srun python t.py\n" in new


def test_override_on_the_launch_line_hydra_jsonargparse_and_launcher_flags():
    text = "#!/bin/bash\nsrun python t.py \\\n  +data.batch_size=22 \\\n  --num-workers 4 --model.lr 0.1\n"
    assert edit.override_on_launch(text, "data.batch_size")
    new = edit.set_override(text, "data.batch_size", 16)
    assert "  +data.batch_size=16 \\\n" in new
    # a plain program option is not known to set a config key: never edited for one (issue 25 class 7)
    assert not edit.override_on_launch(text, "loader.num_workers")
    with pytest.raises(EditError):
        edit.set_override(new, "loader.num_workers", 8)
    # jsonargparse: --model.lr sets model.init_args.lr of a class_path section
    config = {"model": {"class_path": "M", "init_args": {"lr": 1.0}}}
    assert edit.override_on_launch(text, "model.init_args.lr", config)
    assert "--model.lr 0.5" in edit.set_override(text, "model.init_args.lr", 0.5)
    # a launcher's own option (no dots) is its flag: torchrun --nproc-per-node
    launcher = "#!/bin/bash\ntorchrun --nproc-per-node 4 t.py\n"
    assert "--nproc-per-node 2 " in edit.set_override(launcher, "nproc_per_node", 2)
    # a key that merely ends like another is not the same key
    assert not edit.override_on_launch("#!/bin/bash\nsrun python t.py x.data.batch_size=1\n", "data.batch_size")


def test_shell_lines_quote_values_and_skip_bad_names():
    changes = {"A": "x y", "B": Reference("SLURM_CPUS_PER_TASK"), "C": None, "BAD NAME": "1", "D": "$(rm -rf ~)"}
    out = env_lines({**changes, "E": "$SLURM_CPUS_PER_TASK"})  # a plain str is a literal, even one like a reference
    assert out == [
        "export A='x y'",
        'export B="$SLURM_CPUS_PER_TASK"',
        "export D='$(rm -rf ~)'",
        "export E='$SLURM_CPUS_PER_TASK'",
        "unset C",  # after the exports: a reference reads the environment as it was judged
    ]


# ---------------------------------------------------------------- the planner's rules, on a real file


def _finding(check_id: str, sev: Severity, fix: Fix | None) -> Finding:
    return Finding(check_id, check_id.lower(), "slurm", sev, check_id, "m", {}, fix)


def test_two_fixes_for_one_value_are_never_both_kept(tmp_path):
    script = tmp_path / "job.slurm"
    script.write_text("#!/bin/bash\n#SBATCH --gres=gpu:1\nsrun python t.py\n")
    path = str(script)

    def run(facts, ctx):
        gres = ctx.sbatch.options.get("gres")
        wants8 = Fix("gres 8", Safety.SAFE, (Action(ActionKind.SBATCH_SET, path, "gpu:8", "gres"),))
        wants4 = Fix("gres 4", Safety.SAFE, (Action(ActionKind.SBATCH_SET, path, "gpu:4", "gres"),))
        return [
            _finding("GD-TEST-001", Severity.FAIL if gres != "gpu:8" else Severity.PASS, wants8),
            _finding("GD-TEST-002", Severity.WARN if gres != "gpu:4" else Severity.PASS, wants4),
        ]

    ctx = Context(sbatch=parse_sbatch(script.read_text(), path), sbatch_path=path)
    plan = make_plan(run, make_facts(), ctx, frozenset({Safety.SAFE}))
    kept = [d.finding.id for d in plan.decisions if d.kept]
    assert kept == ["GD-TEST-001"]
    refused = next(d for d in plan.decisions if d.finding.id == "GD-TEST-002")
    assert refused.reason.startswith("conflict") and "GD-TEST-001" in refused.reason
    assert "#SBATCH --gres=gpu:8" in plan.final.texts[path]


def test_a_fix_that_makes_another_check_worse_is_not_kept(tmp_path):
    script = tmp_path / "job.slurm"
    script.write_text("#!/bin/bash\n#SBATCH --ntasks-per-node=8\nsrun python t.py\n")
    path = str(script)

    def run(facts, ctx):
        per_node = ctx.sbatch.options.get("ntasks-per-node")
        one = Fix("one task", Safety.UNSAFE, (Action(ActionKind.SBATCH_SET, path, "1", "ntasks-per-node"),))
        return [
            _finding("GD-TEST-001", Severity.WARN if per_node == "8" else Severity.PASS, one),
            _finding("GD-TEST-002", Severity.FAIL if per_node == "1" else Severity.PASS, None),
        ]

    ctx = Context(sbatch=parse_sbatch(script.read_text(), path), sbatch_path=path)
    assert not make_plan(run, make_facts(), ctx, frozenset({Safety.SAFE})).decisions  # unsafe: not even tried
    plan = make_plan(run, make_facts(), ctx, frozenset({Safety.SAFE, Safety.UNSAFE}))
    (decision,) = plan.decisions
    assert not decision.kept and "GD-TEST-002 fail" in decision.reason
    assert plan.final.texts[path] == script.read_text() and not plan.pending


def _closure_script(tmp_path):
    script = tmp_path / "job.slurm"
    script.write_text("#!/bin/bash\n#SBATCH --ntasks=1\npython t.py\n")
    return str(script), Context(sbatch=parse_sbatch(script.read_text(), str(script)), sbatch_path=str(script))


def test_a_fix_is_kept_together_with_the_fix_of_what_it_causes(tmp_path):
    """Issue 18: GD-SLURM-005's srun fix causing GD-SLURM-007 (which has its own safe fix) was refused."""
    path, ctx = _closure_script(tmp_path)

    def run(facts, ctx):
        tasks, cpus = ctx.sbatch.options.get("ntasks"), ctx.sbatch.options.get("cpus-per-task")
        eight = Fix("8 tasks", Safety.UNSAFE, (Action(ActionKind.SBATCH_SET, path, "8", "ntasks"),))
        cpus16 = Fix("16 cpus", Safety.SAFE, (Action(ActionKind.SBATCH_SET, path, "16", "cpus-per-task"),))
        return [
            _finding("GD-TEST-001", Severity.FAIL if tasks != "8" else Severity.PASS, eight),
            _finding("GD-TEST-002", Severity.WARN if tasks == "8" and cpus != "16" else Severity.PASS, cpus16),
        ]

    plan = make_plan(run, make_facts(), ctx, frozenset({Safety.SAFE, Safety.UNSAFE}))
    kept = {d.finding.id: d.reason for d in plan.decisions if d.kept}
    assert set(kept) == {"GD-TEST-001", "GD-TEST-002"}
    assert (
        "with GD-TEST-002's fix" in kept["GD-TEST-001"] and "needed by the fix for GD-TEST-001" in kept["GD-TEST-002"]
    )
    assert "#SBATCH --ntasks=8" in plan.final.texts[path] and "#SBATCH --cpus-per-task=16" in plan.final.texts[path]
    assert [f.id for f in plan.after if f.severity is not Severity.PASS] == []


@pytest.mark.parametrize("follower", ["no fix", "a fix that does not help", "an unsafe fix, safe only allowed"])
def test_a_group_whose_consequence_stays_is_refused(tmp_path, follower):
    path, ctx = _closure_script(tmp_path)
    allowed = frozenset({Safety.SAFE, Safety.UNSAFE})

    def run(facts, ctx):
        tasks = ctx.sbatch.options.get("ntasks")
        eight = Fix("8 tasks", Safety.SAFE, (Action(ActionKind.SBATCH_SET, path, "8", "ntasks"),))
        other = {
            "no fix": None,
            "a fix that does not help": Fix(
                "time", Safety.SAFE, (Action(ActionKind.SBATCH_SET, path, "1:00", "time"),)
            ),
            "an unsafe fix, safe only allowed": Fix(
                "x", Safety.UNSAFE, (Action(ActionKind.SBATCH_SET, path, "2", "nodes"),)
            ),
        }[follower]
        return [
            _finding("GD-TEST-001", Severity.FAIL if tasks != "8" else Severity.PASS, eight),
            _finding("GD-TEST-002", Severity.WARN if tasks == "8" else Severity.PASS, other),
        ]

    if follower.startswith("an unsafe"):
        allowed = frozenset({Safety.SAFE})
    plan = make_plan(run, make_facts(), ctx, allowed)
    (decision,) = [d for d in plan.decisions if d.finding.id == "GD-TEST-001"]
    assert not decision.kept and "it would cause GD-TEST-002 warn" in decision.reason
    assert not any(d.kept for d in plan.decisions) and not plan.pending


def test_typo_option_is_renamed_keeping_value_and_comment():
    text = "#!/bin/bash\n#SBATCH --ntask-per-node=8   # one per GPU\n#SBATCH --gres=gpu:8\nsrun python t.py\n"
    assert parse_sbatch(text).unknown_directives
    new = edit.rename_option(text, "--ntask-per-node", "ntasks-per-node")
    assert new == "#!/bin/bash\n#SBATCH --ntasks-per-node=8   # one per GPU\n#SBATCH --gres=gpu:8\nsrun python t.py\n"
    assert options(new)["ntasks-per-node"] == "8" and not parse_sbatch(new).unknown_directives


def test_repaired_continuation_passes_every_argument_in_real_bash(tmp_path):
    import subprocess

    text = (
        '#!/bin/bash\n#SBATCH --nodes=1\npython() { echo "ARGS: $*"; }\n'
        "python t.py \\\n    a=1 \\    # note one\n    b=2 \\   # note two\n    c=3\n"
    )
    before = subprocess.run(["bash", "-c", text], capture_output=True, text=True, timeout=30)
    assert before.stdout.startswith("ARGS: t.py a=1 ") and "b=2" not in before.stdout  # bash cut the command short
    script = parse_sbatch(text)
    new = text
    for b in script.broken_continuations:
        new = edit.repair_continuation(new, b.text)
    assert not parse_sbatch(new).broken_continuations
    after = subprocess.run(["bash", "-c", new], capture_output=True, text=True, timeout=30)
    assert after.stdout == "ARGS: t.py a=1 b=2 c=3\n" and after.returncode == 0
    assert "# note one\n# note two\npython t.py \\\n" in new  # the comments moved above the command, in order


def test_a_refused_fix_names_the_new_problem_without_cutting_a_word():
    """Lightning-AI/pytorch-lightning#16236 shape (--ntasks=1, 4 GPUs, devices=4, num_workers=16): the one-task-
    per-GPU fix is refused because 16 workers no longer fit 8 CPUs per task; the reason ends on a whole word."""
    from gpudoctor.fixes.plan import judge

    target = Finding("GD-SLURM-005", "lightning", "slurm", Severity.FAIL, "t", "trains on 1 of 4 GPUs")
    workers = (
        "8 CPU(s) per task (srun --cpus-per-task / SRUN_CPUS_PER_TASK) for 1 rank(s) x (16 workers + 1) = 17 "
        "processes: the loaders will starve the GPUs; lower num_workers or ask for more CPUs per task"
    )
    after = [
        Finding("GD-SLURM-005", "lightning", "slurm", Severity.PASS, "t", "ok"),
        Finding("GD-SLURM-008", "cpus", "slurm", Severity.WARN, "t", workers),
    ]
    kept, why = judge(target, [target], after)
    assert not kept and why.startswith("it would cause GD-SLURM-008 warn: 8 CPU(s) per task")
    assert why.endswith(" ...") and why[: -len(" ...")].split()[-1] in workers.split()


def test_repair_directive_rewrites_only_the_marker():
    from gpudoctor.fixes.sbatch_edit import EditError, repair_directive

    text = "#!/bin/bash\n#SBATCH -N1\n!#SBATCH --signal=USR1@90  # note\n  #SBATCH -c 4\n##SBATCH -t 5\npython t.py\n"
    out = repair_directive(text, "!#SBATCH --signal=USR1@90  # note")
    out = repair_directive(out, "  #SBATCH -c 4")
    assert (
        out == "#!/bin/bash\n#SBATCH -N1\n#SBATCH --signal=USR1@90  # note\n#SBATCH -c 4\n##SBATCH -t 5\npython t.py\n"
    )
    import pytest

    with pytest.raises(EditError):
        repair_directive(out, "##SBATCH -t 5")  # switched off on purpose: never repaired
