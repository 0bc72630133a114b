"""What the batch shell expands once and what each task of `srun bash -c '...'` expands itself (readers/pertask.py)."""

from __future__ import annotations

from gpudoctor.readers.pertask import PER_NODE, PER_TASK, RANDOM, evaluated_parts, varying_endpoints
from gpudoctor.readers.sbatch import parse_sbatch

HEAD = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n#SBATCH --gres=gpu:4\n"
FREE_PORT = """$(python -c 'import socket; s=socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')"""
FREE_PORT_DQ = """$(python -c "import socket; s=socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])")"""


def _varying(body: str):
    launch = parse_sbatch(HEAD + body + "\n", "job.slurm").launch
    return varying_endpoints(launch.task_command, launch.batch_evaluated, launch.launcher, launch.standalone)


def test_evaluated_parts_follow_bash_quoting():
    text = """a=$(hostname) "$X" '$(uname -n) $Y' \\$Z `date` "\\$(w)" $((N + 1))"""
    assert evaluated_parts(text) == {"$(hostname)", "$X", "`date`", "$N"}


def test_hostname_inside_single_quotes_is_each_nodes_own():
    (v,) = _varying("srun bash -c 'torchrun --nnodes 2 --rdzv_backend c10d --rdzv_endpoint $(hostname):29500 t.py'")
    assert (v.setting, v.how, v.because) == ("--rdzv_endpoint", PER_NODE, "$(hostname)")


def test_hostname_in_double_quotes_is_expanded_once_by_the_batch_shell():
    assert _varying('srun bash -c "torchrun --nnodes 2 --rdzv_endpoint $(hostname):29500 t.py"') == []
    assert _varying('srun bash -c "torchrun --nnodes 2 --rdzv_endpoint \\$(hostname):29500 t.py"')[0].how == PER_NODE


def test_a_variable_assigned_in_the_batch_shell_holds_its_value_not_its_text():
    body = (
        "head=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)\n"
        f"export MASTER_PORT={FREE_PORT}\n"
        'srun bash -c "torchrun --nnodes 2 --rdzv_endpoint $head:\\$MASTER_PORT --node_rank \\$SLURM_NODEID t.py"'
    )
    assert _varying(body) == []


def test_a_port_picked_once_with_a_heredoc_in_the_batch_shell_is_one_value():
    body = (
        "MAIN_HOST=`hostname -s`\nexport MASTER_ADDR=$MAIN_HOST\n"
        "export MASTER_PORT=$(python - <<EOF\nimport socket\ns = socket.socket()\ns.bind(('', 0))\n"
        "print(s.getsockname()[1])\nEOF\n)\n"
        "srun bash -c 'torchrun --nnodes 2 --rdzv_backend c10d --rdzv_endpoint=$MASTER_ADDR:$MASTER_PORT t.py'"
    )
    assert _varying(body) == []


def test_a_command_kept_as_text_in_single_quotes_runs_in_each_task():
    body = "CMD='torchrun --nnodes 2 --master_addr $(hostname) t.py'\nsrun bash -c \"$CMD\""
    assert [v.how for v in _varying(body)] == [PER_NODE]


def test_assignments_inside_the_command_string_are_followed():
    body = f"srun bash -c 'export MASTER_PORT={FREE_PORT_DQ}; MASTER_ADDR=$HOSTNAME python train.py'"
    found = {v.setting: v.how for v in _varying(body)}
    assert found == {"MASTER_PORT": RANDOM, "MASTER_ADDR": PER_NODE}


def test_procid_in_a_port_is_per_task_and_scontrol_is_the_same_everywhere():
    body = (
        "srun bash -c 'MASTER_ADDR=$(scontrol show hostname $SLURM_NODELIST | head -n1) "
        "MASTER_PORT=$((29500 + SLURM_PROCID)) python train.py'"
    )
    (v,) = _varying(body)
    assert (v.setting, v.how) == ("MASTER_PORT", PER_TASK)


def test_pythons_own_hostname_is_per_node():
    body = "srun bash -c 'MASTER_ADDR=$(python -c \"import socket; print(socket.gethostname())\") python t.py'"
    assert [v.how for v in _varying(body)] == [PER_NODE]


def test_standalone_torchrun_ignores_its_endpoint():
    launch = parse_sbatch(
        HEAD + "srun bash -c 'torchrun --standalone --rdzv_endpoint $(hostname):0 t.py'\n", "j"
    ).launch
    assert launch.standalone
    assert varying_endpoints(launch.task_command, launch.batch_evaluated, launch.launcher, launch.standalone) == []
