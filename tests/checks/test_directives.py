"""GD-SLURM-025: header lines that look like #SBATCH directives but that sbatch does not read."""

from gpudoctor.model import ActionKind, Safety, Severity
from tests.checks.test_slurm_checks import one, sb_run, script
from tests.factsutil import said


def test_025_a_stray_bang_loses_the_signal_and_every_directive_below():
    sb = script("#SBATCH --nodes=1\n!#SBATCH --signal=SIGUSR1@90\n#SBATCH --gres=gpu:4\nsrun python train.py\n")
    f = one(sb_run("GD-SLURM-025", sb))
    assert f.severity is Severity.FAIL  # the --gres below it is ignored too
    assert "no SIGUSR1 90 s before its time limit" in said(f) and "line(s) 4:" in said(f)
    assert f.fix.actions[0].kind is ActionKind.DIRECTIVE_REPAIR
    late = one(sb_run("GD-SLURM-011", sb))
    assert "line 3, `!#SBATCH --signal=SIGUSR1@90`" in said(late)


def test_025_a_lost_signal_alone_is_a_warn_with_a_safe_repair_naming_lightning():
    f = one(
        sb_run(
            "GD-SLURM-025",
            "#SBATCH --gres=gpu:2\n#SBATCh --signal=SIGUSR1@90\nsrun python train.py trainer.devices=2\n",
        )
    )
    assert f.severity is Severity.WARN and f.fix.safety is Safety.SAFE
    assert "Lightning never gets its pre-timeout signal" in said(f)


def test_025_each_slip_is_named():
    text = (
        "#SBATCH --job-name=x\n#SBTACH -e err.log\n# SBATCH --time=1:00:00\n#  SBATCH --mail-type=END\n"
        "  #SBATCH --cpus-per-task=4\n#sbatch --output=o.log\nsrun python t.py\n"
    )
    f = one(sb_run("GD-SLURM-025", text))
    assert f.severity is Severity.WARN  # the job still has what it needs to start; what it loses is named
    for line in (3, 4, 5, 6, 7):
        assert f"line {line} " in said(f)
    assert f.fix.safety is Safety.UNSAFE  # --time and --cpus-per-task are resource requests


def test_025_a_lost_gpu_request_with_none_left_fails():
    f = one(sb_run("GD-SLURM-025", "#SBATCH -N 1\n# SBATCH --gres=gpu:4\nsrun python t.py\n"))
    assert f.severity is Severity.FAIL
    other = one(sb_run("GD-SLURM-025", "#SBATCH --gres=gpu:4\n# SBATCH --gres=gpu:8\nsrun python t.py\n"))
    assert other.severity is Severity.WARN


def test_025_disabled_directives_prose_and_usage_notes_are_no_slip():
    text = (
        "# Usage: sbatch --array=0-9 job.slurm\n# sbatch --array=0-9 job.slurm\n# SBATCH options follow\n"
        "#SBATCH --gres=gpu:1\n##SBATCH --gres=gpu:2\n# #SBATCH --time=1:00\nsrun python t.py\n"
    )
    f = one(sb_run("GD-SLURM-025", text))
    assert f.severity is Severity.PASS and f.fix is None and "line 6" in said(f) and "line 7" in said(f)
    clean = one(sb_run("GD-SLURM-025", "#SBATCH --gres=gpu:1\n#SBATCH --time=1:00\nsrun python t.py\n"))
    assert clean.severity is Severity.PASS


def test_025_old_slurm_marker_is_read_and_noted():
    sb = script("#SLURM --gres=gpu:2\n#SBATCH--time=1:00\nsrun python t.py\n")
    assert sb.options == {"gres": "gpu:2", "time": "1:00"}
    f = one(sb_run("GD-SLURM-025", sb))
    assert f.severity is Severity.INFO and "#SLURM" in said(f)


def test_025_lines_below_the_first_command_are_011s():
    f = one(sb_run("GD-SLURM-025", "#SBATCH --gres=gpu:1\nmodule load cuda\n#SBTACH --time=1:00\nsrun python t.py\n"))
    assert f.severity is Severity.PASS


def test_001_a_word_glued_to_sbatch_is_refused():
    f = one(sb_run("GD-SLURM-001", "#SBATCHx --gres=gpu:1\nsrun python t.py\n"))
    assert f.severity is Severity.WARN and "Invalid directive found in batch script: x" in said(f)


def test_025_lines_a_stray_bang_hides_are_scanned_as_the_repaired_header_would_be():
    sb = script(
        "#SBATCH -N1\n!#SBATCH --signal=USR1@60\n#SBATCh --time=1:00\n#SBATCH --gres=gpu:1\n"
        "srun python t.py\n#SBATCH --mem=1G\n"
    )
    assert [(la.line, la.form, la.hides) for la in sb.lookalike_directives] == [
        (3, "command", (5,)),
        (4, "misspelt", ()),
    ]
    f = one(sb_run("GD-SLURM-025", sb))
    assert f.severity is Severity.FAIL and "line(s) 5:" in said(f)  # its only GPU request is hidden


def test_001_banner_lines_on_the_directive_marker_are_refused():
    for line, words in (("#SBATCH ==========", "Invalid directive"), ("#SBATCH ----------", "unrecognized option")):
        f = one(sb_run("GD-SLURM-001", f"{line}\n#SBATCH --gres=gpu:1\nsrun python t.py\n"))
        assert f.severity is Severity.WARN and words in said(f) and "refuses" in said(f)
    prose = one(sb_run("GD-SLURM-001", "#SLURM settings below\n#SBATCH --gres=gpu:1\nsrun python t.py\n"))
    assert "Invalid directive found in batch script: settings" in said(prose)


def test_003_restores_the_gpu_request_the_user_wrote():
    f = one(sb_run("GD-SLURM-003", "#SBATCH -N 1\n# SBATCH --gres=gpu:4\nsrun python t.py\n"))
    assert f.severity is Severity.FAIL
    assert [(a.kind, a.value) for a in f.fix.actions] == [(ActionKind.DIRECTIVE_REPAIR, "# SBATCH --gres=gpu:4")]
    hidden = one(
        sb_run("GD-SLURM-003", "#SBATCH -N 1\n!#SBATCH --signal=USR1@60\n#SBATCH --gpus=2\nsrun python t.py\n")
    )
    assert hidden.fix.actions[0].value == "!#SBATCH --signal=USR1@60"


def test_every_action_kind_is_in_the_report_schema():
    import json
    from pathlib import Path

    schema = json.loads((Path(__file__).parents[2] / "docs" / "report.schema.json").read_text())
    text = json.dumps(schema)
    missing = [k.value for k in ActionKind if f'"{k.value}"' not in text]
    assert missing == [], f"docs/report.schema.json lacks the action kind(s) {missing}"
