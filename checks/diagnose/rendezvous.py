"""Signatures of the rendezvous: the ranks finding each other through MASTER_ADDR:MASTER_PORT (diagnose)."""

from gpudoctor.checks.diagnose._signature import JUDGED_BY, Signature, verdicts
from gpudoctor.registry import declare

_RUN = "https://pytorch.org/docs/stable/elastic/run.html"
_DIST = "https://pytorch.org/docs/stable/distributed.html#tcp-initialization"

SIGNATURES = (
    Signature(
        id="GD-DIAG-007",
        name="log-rendezvous-port-in-use",
        category="distributed",
        title="The rendezvous port is free on the master node",
        keys=("EADDRINUSE", "Address already in use", "address already in use"),
        cause="the rendezvous port was already in use on the master node (another job or launcher holds it)",
        why="The TCPStore server binds MASTER_PORT on the master; a second torchrun on the same node with the same "
        "--master_port (two jobs sharing a node, a leftover process, a fixed port in the script) fails to bind "
        "with EADDRINUSE.",
        fix="Give each job its own port, e.g. MASTER_PORT=$((10000 + SLURM_JOB_ID % 50000)) or torchrun "
        "--rdzv-endpoint=$MASTER_ADDR:0 --rdzv-backend=c10d (a free port), and end leftover launchers.",
        source=_RUN,
        check=("GD-SLURM-026", "GD-DIST-002"),
    ),
    Signature(
        id="GD-DIAG-008",
        name="log-rendezvous-timeout",
        category="distributed",
        title="Every node joins the rendezvous before its timeout",
        keys=("RendezvousTimeoutError", "RendezvousClosedError"),
        cause="the rendezvous timed out: not every node's launcher joined (nnodes, or a node never started)",
        why="torchrun waits for --nnodes launchers at the rendezvous endpoint; one that never starts (no srun over "
        "the nodes, a different --rdzv-id, an endpoint that resolves differently per node) or a --nnodes larger "
        "than the nodes launched leaves the others waiting until the rendezvous times out.",
        fix="Start one launcher per node (srun --ntasks-per-node=1 torchrun ...), the same --rdzv-id and "
        "--rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT on every node, and --nnodes=$SLURM_NNODES.",
        source=_RUN,
        check=("GD-SLURM-034", "GD-SLURM-012", "GD-DIST-003"),
    ),
    Signature(
        id="GD-DIAG-009",
        name="log-store-clients-missing",
        category="distributed",
        title="As many ranks join the store as the world size says",
        keys=("waiting for clients", "store based barrier"),
        pattern=r"waiting for clients(?:\.\s*(?P<joined>\d+)/(?P<expected>\d+) clients joined)?"
        r"|store based barrier.*world_size=(?P<world>\d+), worker_count=(?P<workers>\d+)",
        cause="not every rank reached the rendezvous store: the world size and the ranks started disagree",
        why="The TCPStore on rank 0 waits for WORLD_SIZE clients; fewer arriving means fewer processes were started "
        "than the world size says (--nnodes or --nproc_per_node larger than what runs, a node without its "
        "launcher) or some could not reach MASTER_ADDR.",
        fix="Make WORLD_SIZE the number of processes really started: --nnodes=$SLURM_NNODES, --nproc_per_node = "
        "GPUs per node, one launcher per node; MASTER_ADDR the first node of the allocation.",
        source=_DIST,
        check=("GD-DIST-001", "GD-JOB-001", "GD-SLURM-012"),
    ),
    Signature(
        id="GD-DIAG-010",
        name="log-master-unreachable",
        category="distributed",
        title="Every rank reaches MASTER_ADDR:MASTER_PORT",
        keys=("has timed out after", "RendezvousConnectionError", "connection to the C10d store has failed"),
        pattern=r"client socket has timed out after|RendezvousConnectionError|connection to the C10d store has failed",
        cause="a rank could not connect to the rendezvous endpoint in time (MASTER_ADDR/--rdzv-endpoint unreachable)",
        why="The clients connect to MASTER_ADDR:MASTER_PORT: a name that does not resolve on the node, an address "
        "of the login node or of localhost, a port the master never opened (its launcher failed first) or a "
        "firewall ends in refused connections and a timeout.",
        fix="Set MASTER_ADDR to the job's first node (scontrol show hostnames $SLURM_JOB_NODELIST | head -n1) "
        "and the same MASTER_PORT on every node; if the master failed first, its error is the cause.",
        source=_DIST,
        check=("GD-DIST-003", "GD-DIST-006", "GD-JOB-008"),
    ),
    Signature(
        id="GD-DIAG-011",
        name="log-master-name-unresolved",
        category="distributed",
        title="MASTER_ADDR resolves on every node",
        keys=("Name or service not known", "nodename nor servname", "Temporary failure in name resolution"),
        cause="MASTER_ADDR is a name the nodes cannot resolve",
        why="The rendezvous address is looked up on each node; a name of another network, a typo, or a variable "
        "expanded on the wrong host resolves nowhere.",
        fix="Use the first node's name from the allocation (scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)"
        " or its IP address.",
        source=_DIST,
        check=("GD-DIST-003",),
    ),
    Signature(
        id="GD-DIAG-060",
        name="log-rendezvous-variables-missing",
        category="distributed",
        title="Every rank gets the rendezvous variables",
        keys=("expected, but not set",),
        pattern=r"environment variable (?P<name>\w+) expected, but not set",
        cause="a rank started without {name}: the program was not started by a launcher that sets it",
        why="init_process_group's env:// rendezvous reads MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE; torchrun "
        "sets them, plain srun or python does not (srun sets SLURM_PROCID, which the program must map itself).",
        fix="Start the program with torchrun (srun torchrun ...), or export MASTER_ADDR/MASTER_PORT in the batch "
        "script and RANK/WORLD_SIZE from SLURM_PROCID/SLURM_NTASKS in each task.",
        source="https://pytorch.org/docs/stable/distributed.html#environment-variable-initialization",
        check=("GD-SLURM-030", "GD-DIST-001", "GD-SLURM-021"),
    ),
    Signature(
        id="GD-DIAG-061",
        name="log-master-connection-refused",
        category="distributed",
        title="The rendezvous endpoint accepts the ranks' connections",
        keys=("Connection refused", "failed to connect", "retrieving ncclUniqueId"),
        pattern=r"client socket has failed to connect|connect to .* failed|Connection refused|retrieving ncclUniqueId",
        role="hint",
        cause="a rank's connection to the rendezvous endpoint was refused (nothing listening there, or it died)",
        why="torch retries a refused connection until its timeout (the warnings are normal while the master starts); "
        "refusals to the end mean nothing listens at MASTER_ADDR:MASTER_PORT on that address: the master's "
        "launcher failed first, listens on another port, or the address is another host's.",
        fix="If the master failed first, its error is the cause; else set MASTER_ADDR to the job's first node and "
        "one MASTER_PORT for every node.",
        source=_DIST,
        check=("GD-DIST-003", "GD-JOB-008"),
    ),
    Signature(
        id="GD-DIAG-065",
        name="log-rank-claimed-twice",
        category="distributed",
        title="Every rank number is claimed by one process",
        keys=("has already checked in",),
        pattern=r"rank (?P<rank>\d+) of (?P<world>\d+) ranks has already checked in",
        cause="two processes claimed the same rank: each node computed the same ranks (node rank not set per node)",
        why="NCCL's bootstrap root receives each rank once; a second process with the same rank means two "
        "launchers believe they are the same node (--node_rank / NODE_RANK not set from SLURM_NODEID, a launch "
        "line run once per task where it should run once per node).",
        fix="Give each node its own rank: torchrun --node_rank=$SLURM_NODEID (or the c10d rendezvous, which assigns "
        "them), one launcher per node (srun --ntasks-per-node=1 torchrun ...).",
        source="https://github.com/Lightning-AI/pytorch-lightning/issues/14986",
        check=("GD-DIST-001", "GD-SLURM-009", "GD-SLURM-034"),
    ),
)

declare(verdicts(SIGNATURES), source="diagnose", judged_by=JUDGED_BY)
