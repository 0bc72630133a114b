"""rendezvous checks: a job's rendezvous port on a node that other jobs share.

Sources (torch 2.x):
- torch/distributed/run.py: --standalone sets --rdzv-backend=c10d, --rdzv-endpoint=localhost:0 (a free port)
  and a fresh uuid as --rdzv-id, ignoring the values given; the default backend is static, on
  --master-addr (127.0.0.1) and --master-port (29500). torch.distributed.launch is run.py with the same defaults.
- torch/distributed/elastic/rendezvous/c10d_rendezvous_backend.py: the c10d endpoint's default port is 29400;
  an agent whose host is the endpoint tries to listen there and, when that fails (the port is taken), connects as
  a client instead -- to whatever store listens there, another job's -- and meets its peers under
  /torch.rendezvous.<rdzv-id>: the same id joins the other job's rendezvous.
- The static backend's rank-0 TCPStore listens on --master-port; a port in use fails it with EADDRINUSE
  ("The server socket has failed to listen on any local network address").
- DeepSpeed's runner: --master_port defaults to 29500 (TORCH_DISTRIBUTED_DEFAULT_PORT).
- accelerate/commands/launch.py: --main_process_port defaults to 29500; a port in use stops the launch with
  ConnectionError, and 0 picks the next open port on a single node.
- Lightning's SLURMEnvironment takes MASTER_PORT from the environment, else 15000 + the job id's last 4 digits;
  a program with init_process_group("env://") reads MASTER_PORT.
SLURM shares a node between jobs unless the job asks for it whole (sbatch --exclusive; --exclusive=user or =mcs
still share it with the user's or group's own jobs); a partition may hand out whole nodes (OverSubscribe=EXCLUSIVE),
which a batch script does not show. A multi-node GPU job normally holds its nodes' GPUs, so a fixed port there is
said in the pass message, not warned; a one-node job is where sharing is common and --standalone is the exact fix.
"""

from __future__ import annotations

import re

from gpudoctor.checks.slurm._shared import slurm_shape
from gpudoctor.job.shape import JobShape
from gpudoctor.model import Action, ActionKind, Fix, Safety, info, manual, passed, skip, warn
from gpudoctor.registry import check

TORCH_LAUNCHERS = ("torchrun", "torch.distributed.launch")
STATIC_DEFAULT_PORT = 29500  # torchrun/torch.distributed.launch --master-port, deepspeed --master_port
C10D_DEFAULT_PORT = 29400
# A port every task of the job agrees on (SLURM_JOB_ID is the same in all of them) and two jobs rarely share.
JOB_PORT = "$((20000 + SLURM_JOB_ID % 10000))"
_LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")
# 8 GPUs per node is the most mainstream GPU servers have (HGX/DGX): a job holding 8 per node leaves no GPU on
# them for another training job to land beside it.
WHOLE_GPU_NODE = 8


def _literal_port(text: str | None) -> int | None:
    """A port written as a number; None when it comes from a variable or a command (not known before the job)."""
    if text is None or not re.fullmatch(r"\s*\d{1,5}\s*", str(text)):
        return None
    return int(text)


def _fixed_rendezvous(launch, exports) -> tuple[int, str, bool] | None:
    """(port, how it is set, same id for every job) of a rendezvous on a fixed port; None when it picks a free port,
    derives it from the job, or is not known here."""
    if launch.launcher in TORCH_LAUNCHERS:
        if launch.standalone:
            return None
        backend = (launch.rdzv_backend or "static").lower()
        same_id = launch.rdzv_id is None or "$" not in str(launch.rdzv_id)
        if backend == "c10d":
            endpoint = launch.rdzv_endpoint
            if endpoint is None:
                return None
            host, colon, port_text = endpoint.rpartition(":")  # the host may be a variable; the port decides
            port = _literal_port(port_text) if colon else C10D_DEFAULT_PORT
            if port is None or port == 0:
                return None
            return (
                port,
                f"--rdzv-endpoint={endpoint}" + (f" --rdzv-id={launch.rdzv_id}" if launch.rdzv_id else ""),
                same_id,
            )
        if backend != "static":
            return None
        if launch.master_port is None:
            return STATIC_DEFAULT_PORT, f"{launch.launcher}'s default --master-port {STATIC_DEFAULT_PORT}", False
        port = _literal_port(launch.master_port)
        return (port, f"--master-port={port}", False) if port else None
    if launch.launcher == "deepspeed":
        if launch.master_port is None:
            return STATIC_DEFAULT_PORT, f"deepspeed's default --master_port {STATIC_DEFAULT_PORT}", False
        port = _literal_port(launch.master_port)
        return (port, f"--master_port={port}", False) if port else None
    if launch.launcher == "accelerate":
        port = _literal_port(launch.master_port)
        return (port, f"--main_process_port={port}", False) if port else None
    if launch.launcher in ("python", "lightning") and launch.srun is not None:
        exported = exports.get("MASTER_PORT")
        port = _literal_port(exported.value) if exported is not None and not exported.unset else None
        if port:
            return port, f"export MASTER_PORT={port} (line {exported.line}), read by env:// and Lightning", False
    return None


@check(
    id="GD-SLURM-026",
    name="rendezvous-port-fixed-on-shared-node",
    category="slurm",
    title="The rendezvous port is the job's own on a node other jobs share",
    needs=[],
    requires=["sbatch"],
    scope="job",
    what="For --sbatch, on a one-node job: a rendezvous on a fixed port -- torchrun's --rdzv-endpoint=host:PORT "
    "(with a fixed --rdzv-id), a literal --master-port, torchrun/torch.distributed.launch/deepspeed left on their "
    "default 29500, "
    "accelerate --main_process_port, or an exported MASTER_PORT under srun -- in a job that does not ask for its "
    "nodes whole (#SBATCH --exclusive). torchrun --standalone (a free port) and ports derived from SLURM_JOB_ID pass; "
    "on several nodes (which usually hold their GPUs whole) a fixed port is named in the pass message, and a c10d "
    "rendezvous id every run shares is a note unless the job holds 8 GPUs per node.",
    why="Two jobs on one node that listen on the same port collide: torch's c10d rendezvous, finding the port taken, "
    "connects to the other job's store and, under the same --rdzv-id, joins or breaks that job's rendezvous; the "
    "static rendezvous (and DeepSpeed's, and env://) fails with EADDRINUSE. Jobs asking for fewer than all of a "
    "node's resources share nodes by default, and a second run of the same script (a sweep, a resubmission) uses "
    "the same port.",
    fix="On one node: `torchrun --standalone ...` (or --rdzv-endpoint=localhost:0). On several: derive the port "
    "from the job, e.g. `--rdzv-endpoint=$MASTER_ADDR:$((20000 + SLURM_JOB_ID % 10000))`, "
    "`--master_port $((20000 + SLURM_JOB_ID % 10000))`, or `export MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))`.",
)
def rendezvous_port_fixed_on_shared_node(facts, ctx):
    sb = ctx.sbatch
    launch = sb.launch
    if launch is None:
        return skip("no training launch line found in the script")
    exclusive = sb.options.get("exclusive")
    if exclusive is True:
        return passed("the job asks for its nodes whole (--exclusive): no other job listens on them")
    fixed = _fixed_rendezvous(launch, sb.exports)
    if fixed is None:
        return passed(f"line {launch.line}: the rendezvous port is picked freely or derived from the job, or not fixed")
    port, how, same_id = fixed
    shape = slurm_shape(facts, ctx)
    nodes = shape.nodes
    c10d = how.startswith("--rdzv-endpoint")
    if nodes is None or nodes > 1:
        # A multi-node GPU job usually holds its nodes' GPUs, so no other training job lands beside it; the node
        # size that would tell is not in the script. Said, not warned; a rendezvous id every job shares is a note,
        # since it is what turns a shared port into one job joining another's rendezvous.
        gpus = shape.gpus_per_node
        if c10d and same_id and not (gpus and gpus >= WHOLE_GPU_NODE):
            return info(
                f"line {launch.line}: every run shares rendezvous port {port} and id: two jobs on one node would meet",
                manual(
                    "Give each job its own rendezvous id (and port)",
                    f'--rdzv-id="$SLURM_JOB_ID" --rdzv-endpoint="$MASTER_ADDR:{JOB_PORT}"',
                ),
                port=port,
                endpoint=how,
                detail="fine while the job holds that node's GPUs alone",
            )
        return passed(
            f"line {launch.line}: the rendezvous listens on fixed port {port} on the first node",
            port=port,
            endpoint=how,
            detail="fine while no other job on that node uses the port; a job sharing its node should derive the "
            "port from SLURM_JOB_ID",
        )
    shared = (
        f"--exclusive={exclusive} still shares the node with other jobs of that {exclusive}"
        if exclusive
        else "the job does not ask for its node(s) whole (no --exclusive)"
    )
    if c10d and same_id:
        effect = (
            "when another job on the node listens there first, this job's agent becomes a client of that job's store "
            "and, under the same --rdzv-id, joins or breaks that job's rendezvous"
        )
    elif c10d:
        effect = (
            "when another job on the node listens there first, this job's agent becomes a client of that job's store, "
            "and its rendezvous dies when that job ends"
        )
    else:
        effect = (
            "when another job on the node listens there first, the store fails with EADDRINUSE ('address already in "
            "use') and the job does not start"
        )
    ev = {"launch line": f"line {launch.line}: {launch.text[:160]}", "port": port, "nodes": nodes, "endpoint": how}
    ev |= {
        "shared": shared,
        "effect": effect,
        "unless": "the partition gives out whole nodes (OverSubscribe=EXCLUSIVE)",
    }
    msg = f"line {launch.line}: fixed rendezvous port {port} on a node other jobs may share: another job can take it"
    return warn(msg, _fix(sb, launch, nodes, shape, how), **ev)


def _fix(sb, launch, nodes: int | None, shape: JobShape, how: str) -> Fix:
    one_launcher = nodes == 1 and (shape.tasks_here or 1) == 1
    endpoint = launch.rdzv_endpoint or ""
    if (
        launch.launcher in TORCH_LAUNCHERS
        and one_launcher
        and (launch.rdzv_backend or "").lower() == "c10d"
        and endpoint.rpartition(":")[0] in _LOCAL_HOSTS
    ):
        # what --standalone does (run.py): the same rendezvous on a port the OS picks free; one node, one agent
        return Fix(
            "Let the OS pick the rendezvous port, as --standalone does: "
            f"--rdzv-endpoint=localhost:0 (line {launch.line})",
            Safety.SAFE,
            (Action(ActionKind.OVERRIDE_SET, sb.path, value="localhost:0", key="rdzv-endpoint"),),
        )
    if launch.launcher == "accelerate" and one_launcher:
        # accelerate/commands/launch.py: "To automatically use the next open port (on a single node), you can set
        # this to `0`"
        return Fix(
            f"Let accelerate pick a free port on this one node: --main_process_port=0 (line {launch.line})",
            Safety.SAFE,
            (Action(ActionKind.OVERRIDE_SET, sb.path, value="0", key="main_process_port"),),
        )
    if how.startswith("export MASTER_PORT"):
        # computed once in the batch shell and inherited by every task: all ranks agree on it. A manual step: the
        # script editors write a value as its literal bytes (gpudoctor.shellquote), never an arithmetic expansion.
        return manual(
            f"Derive MASTER_PORT from the job (line {how.split('line ')[-1].split(')')[0]})",
            f"export MASTER_PORT={JOB_PORT}",
        )
    if launch.launcher in TORCH_LAUNCHERS and one_launcher:
        command = "torchrun" if launch.launcher == "torchrun" else "python -m torch.distributed.launch"
        return manual(
            f"One node: start {command} with --standalone (a free port; "
            f"drop --rdzv-*/--master-* on line {launch.line})",
            f"{command} --standalone --nproc-per-node={launch.nproc_per_node or 'gpu'} ...",
        )
    flag = {
        "deepspeed": "--master_port",
        "accelerate": "--main_process_port",
    }.get(launch.launcher or "", "--master-port")
    if launch.launcher in TORCH_LAUNCHERS and (launch.rdzv_backend or "").lower() == "c10d":
        return manual(
            "Derive the rendezvous port from the job (the same in every task)",
            f'--rdzv-endpoint="$MASTER_ADDR:{JOB_PORT}" --rdzv-id="$SLURM_JOB_ID"',
        )
    return manual("Derive the port from the job (the same in every task)", f'{flag} "{JOB_PORT}"')
