"""What follows a cause: timeouts, lost peers, the launchers' summaries (diagnose); and the verdict for a log
whose cause is not known (GD-DIAG-001)."""

from gpudoctor.checks.diagnose._signature import JUDGED_BY, Signature, verdicts
from gpudoctor.registry import Verdict, declare

_DEBUG = "https://pytorch.org/docs/stable/distributed.html#debugging-torch-distributed-applications"
_ELASTIC = "https://pytorch.org/docs/stable/elastic/errors.html"

SIGNATURES = (
    Signature(
        id="GD-DIAG-048",
        name="log-nccl-watchdog-timeout",
        category="nccl",
        title="No collective times out in NCCL's watchdog",
        keys=(
            "Watchdog caught collective operation timeout",
            "Timeout at NCCL work",
            "Some NCCL operations have failed or timed out",
            "NCCL communicator was aborted",
            "watchdog thread terminated with exception",
        ),
        role="consequence",
        cause="NCCL's watchdog timed out a collective: a rank was behind or gone",
        why="A collective waits until every rank joins it; the watchdog ends it after the timeout. The ranks that "
        "time out are the ones waiting: the cause is the rank that never came (it raised, hung, or is behind: "
        "the lowest collective sequence number, SeqNum).",
        fix="Read the first cause on the rank that is behind; TORCH_NCCL_DUMP_ON_TIMEOUT=1 and "
        "TORCH_DISTRIBUTED_DEBUG=DETAIL name what each rank was doing.",
        source=_DEBUG,
        versions="torch >= 1.12 (SeqNum lines), >= 2.2 ('Timeout at NCCL work')",
    ),
    Signature(
        id="GD-DIAG-049",
        name="log-peer-lost",
        category="distributed",
        title="No rank loses its peers in a collective",
        keys=(
            "Connection closed by peer",
            "Connection reset by peer",
            "ncclRemoteError",
            "remote process exited",
            "Broken pipe",
        ),
        role="consequence",
        cause="a rank lost its peers in a collective (they had already failed)",
        why="When one rank dies, the others' gloo or NCCL connections to it close: 'Connection closed by peer', "
        "'ncclRemoteError'. These ranks only followed.",
        fix="Read the first cause of the rank that died first.",
        source=_DEBUG,
    ),
    Signature(
        id="GD-DIAG-050",
        name="log-collective-timeout",
        category="distributed",
        title="No collective times out",
        keys=("Timed out waiting", "timed out after", "DistBackendError", "Socket Timeout"),
        pattern=r"Timed out waiting \d+ms for (?:recv|send)|Socket Timeout|DistBackendError",
        role="consequence",
        cause="a rank timed out waiting in a collective (another rank never came)",
        why="A rank waiting in a collective for a rank that raised, hung or died times out; it is not the cause.",
        fix="Read the first cause of the rank the others waited for.",
        source=_DEBUG,
    ),
    Signature(
        id="GD-DIAG-051",
        name="log-launcher-child-failed",
        category="distributed",
        title="No launcher reports a failed worker",
        keys=("ChildFailedError", "Root Cause (first observed failure)", "failed (exitcode:"),
        role="consequence",
        cause="torchrun reported a failed worker (its 'root cause' is only the first to exit)",
        why="torchrun's summary names the first worker to exit as the root cause; a rank killed because another "
        "failed can exit first. The log's first cause, not the summary, says what failed.",
        fix="Read the first cause above the summary.",
        source=_ELASTIC,
    ),
    Signature(
        id="GD-DIAG-052",
        name="log-srun-task-exited",
        category="slurm",
        title="No srun task exits non-zero",
        keys=("srun: error:",),
        pattern=r"srun: error: (?P<node>[^:]+): tasks? (?P<task>[\d,-]+): (?:Exited with exit code (?P<code>\d+)"
        r"|Killed|Terminated)",
        role="consequence",
        cause="srun reported a task that ended with an error (its output above says why)",
        why="srun prints one line per task that ended non-zero; the task's own output holds the cause.",
        fix="Read the first cause in the task's output.",
        source="https://slurm.schedmd.com/srun.html",
        versions="SLURM",
    ),
    Signature(
        id="GD-DIAG-053",
        name="log-terminated-by-signal",
        category="distributed",
        title="No rank is ended by a signal from its launcher",
        keys=("SIGTERM", "Received 15 death signal", "Signals.SIGTERM", "closing signal"),
        role="consequence",
        cause="a launcher ended its workers (SIGTERM) after another failure or a cancellation",
        why="torchrun sends SIGTERM to the remaining workers when one fails; SLURM does so at a time limit or "
        "scancel. These lines follow the cause.",
        fix="Read the first cause above.",
        source="https://pytorch.org/docs/stable/elastic/run.html",
    ),
    Signature(
        id="GD-DIAG-054",
        name="log-dataloader-worker-exited",
        category="dataloader",
        title="No DataLoader worker exits unexpectedly",
        keys=("exited unexpectedly",),
        pattern=r"DataLoader worker \(pid\(?s?\)? [\d, ]+\) exited unexpectedly",
        role="consequence",
        cause="a DataLoader worker exited unexpectedly (killed, or raised: its own line says which)",
        why="The main process reports a worker that is gone; the reason is the worker's own error or the signal "
        "that killed it (a bus error, the OOM killer), printed before.",
        fix="Read the worker's error above; num_workers=0 shows the error in the main process.",
        source="https://pytorch.org/docs/stable/data.html#multi-process-data-loading",
    ),
)

declare(verdicts(SIGNATURES), source="diagnose", judged_by=JUDGED_BY)

# The verdicts the judge gives beyond the table: a log whose cause is not known, and a rank behind the others.
declare(
    (
        Verdict(
            id="GD-DIAG-001",
            name="log-cause-unknown",
            category="distributed",
            title="The failed job's log names a known cause",
            what="`gpudoctor diagnose` found no known signature's cause in the log; it names the first error line "
            "(the first exception, error or fatal line, in the log's order) and the rank that printed it.",
            why="A log without a known cause is never a clean bill: the first error is where to read.",
            fix="Read the log from the line named; if it is a known failure, add its signature (a row of "
            "checks/diagnose/ with the log beside it in tests/fixtures/logs/).",
            scope="job",
        ),
        Verdict(
            id="GD-DIAG-055",
            name="log-rank-behind",
            category="nccl",
            title="No rank is behind the others in the collectives",
            what="From NCCL's watchdog lines (WorkNCCL(SeqNum=N, OpType=...), 'last enqueued NCCL work'): the rank "
            "with the lowest collective sequence number is behind the others, which wait for it.",
            why="A collective completes when every rank has called it; the ranks further on wait for the one that "
            "has not, and time out. The rank behind is where the job stopped (a hang in its data, a different "
            "branch, a slow or failed GPU).",
            fix="Read the rank behind: what it did after its last collective (py-spy dump --pid on a live job; "
            "TORCH_NCCL_DUMP_ON_TIMEOUT=1 records each rank's collectives).",
            scope="job",
        ),
        Verdict(
            id="GD-DIAG-066",
            name="log-slurm-job-record",
            category="slurm",
            title="SLURM's record of the job",
            what="With `--job JOBID`: the job's state, exit code and nodes from `scontrol show job` (or `sacct` once "
            "the controller has forgotten it), shown as a note; a state that is a cause in itself (TIMEOUT, "
            "OUT_OF_MEMORY, NODE_FAIL, PREEMPTED) is named as the cause where the log names none surer.",
            why="A process killed by the OOM killer or at the time limit often prints nothing of it; SLURM's record "
            "says what ended the job.",
            fix="Read the cause named; `sacct -j JOBID -o JobID,State,ExitCode,MaxRSS,Elapsed` per step.",
            scope="job",
        ),
    ),
    source="diagnose",
    judged_by=JUDGED_BY,
)
