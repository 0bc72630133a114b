"""gpudoctor/edit.py: every action kind is one row of the table, and the one renderer says each kind as the
report and the fix plan always have (byte for byte)."""

from __future__ import annotations

import pytest

from gpudoctor.edit import CONFIG, ENV, FILE_EDITS, KINDS, SCRIPT, Edit
from gpudoctor.fixes.plan import _EDITORS
from gpudoctor.model import ENV_REFERENCE, Action, ActionKind

S = "job.sbatch"


def test_every_kind_has_a_row_and_every_file_edit_an_editor():
    assert set(KINDS) == set(ActionKind)
    assert set(_EDITORS) == set(FILE_EDITS) == {k for k, row in KINDS.items() if row.place in (SCRIPT, CONFIG)}
    assert all(KINDS[row.in_script].place == SCRIPT for row in KINDS.values() if row.in_script)


@pytest.mark.parametrize(
    "action, advice, change",
    [
        (Action(ActionKind.SET_ENV, "NCCL_DEBUG", "WARN"), "export NCCL_DEBUG=WARN", "export NCCL_DEBUG=WARN"),
        (
            Action(ActionKind.SET_ENV, "SRUN_CPUS_PER_TASK", "$SLURM_CPUS_PER_TASK", key=ENV_REFERENCE),
            'export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"',
            'export SRUN_CPUS_PER_TASK="$SLURM_CPUS_PER_TASK"',
        ),
        (Action(ActionKind.SET_ENV, "X", "$(id)"), "export X='$(id)'", "export X='$(id)'"),
        (  # a title may name what no shell line can set; the shell line never does
            Action(ActionKind.SET_ENV, "a b", "1"),
            "# not a shell variable name: 'a b'; no shell line can set it",
            "export a b=1",
        ),
        (Action(ActionKind.UNSET_ENV, "NCCL_P2P_DISABLE"), "unset NCCL_P2P_DISABLE", "unset NCCL_P2P_DISABLE"),
        (Action(ActionKind.COMMAND, "nvidia-smi -pm 1"), "nvidia-smi -pm 1", None),
        (
            Action(ActionKind.YAML_SET, "c.yaml", False, "trainer.tf32"),
            "c.yaml: trainer.tf32: false",
            "c.yaml: trainer.tf32: False",
        ),
        (Action(ActionKind.SBATCH_SET, S, "4", "ntasks-per-node"), f"{S}: #SBATCH --ntasks-per-node=4", None),
        (Action(ActionKind.SBATCH_REMOVE, S, key="gpus"), f"{S}: remove #SBATCH --gpus", None),
        (
            Action(ActionKind.SBATCH_RENAME, S, "gpus-per-node", "gpu-per-node"),
            f"{S}: #SBATCH gpu-per-node -> --gpus-per-node",
            f"{S}: rename #SBATCH gpu-per-node to --gpus-per-node",
        ),
        (Action(ActionKind.SBATCH_HOIST, S, "#SBATCH -N 2"), f"{S}: move `#SBATCH -N 2` above the first command", None),
        (
            Action(ActionKind.DIRECTIVE_REPAIR, S, "# SBATCH -N 2"),
            f"{S}: write `# SBATCH -N 2` as an #SBATCH directive",
            None,
        ),
        (
            Action(ActionKind.CONTINUATION_REPAIR, S, "a \\  # b"),
            f"{S}: nothing after the backslash of `a \\  # b` (its comment moves above the command)",
            f"{S}: nothing after the backslash of `a \\  # b`",
        ),
        (
            Action(ActionKind.SRUN_PREFIX, S, "--cpu-bind=none"),
            f"{S}: start the launch line with `srun --cpu-bind=none`",
            f"{S}: start the launch line with srun --cpu-bind=none",
        ),
        (
            Action(ActionKind.SRUN_PREFIX, S, ""),
            f"{S}: start the launch line with `srun`",
            f"{S}: start the launch line with srun",
        ),
        (Action(ActionKind.EXPORT_SET, S, "a b", "X"), f"{S}: export X='a b'", None),
        (Action(ActionKind.EXPORT_REMOVE, S, key="X"), f"{S}: drop the export of X", f"{S}: drop export X"),
        (
            Action(ActionKind.OVERRIDE_SET, S, 8, "data.workers"),
            f"{S}: launch line data.workers=8",
            f"{S}: launch-line override data.workers=8",
        ),
    ],
)
def test_one_renderer_says_each_kind_as_before(action, advice, change):
    edit = Edit.of(action)
    assert edit.advice() == advice
    if action.kind is not ActionKind.COMMAND:
        assert edit.describe() == (advice if change is None else change)


def test_an_environment_edit_names_no_file_and_shares_its_slot_with_the_export():
    env = Edit.of(Action(ActionKind.UNSET_ENV, "X"))
    assert env.dest is None and env.row.place == ENV and env.value is None
    export = Edit(ActionKind.EXPORT_REMOVE, S, "X")
    assert env.slot[1:] == export.slot[1:] == ("env", "X")
    assert Edit(ActionKind.SBATCH_SET, S, "gpus").slot == Edit(ActionKind.SBATCH_REMOVE, S, "gpus").slot
