"""What each srun task's own shell computes in `srun bash -c '...'`, and whether the rendezvous values it
computes are the same in every task.

bash (bash(1), QUOTING and EXPANSION): the batch shell expands `$(...)`, `` `...` `` and `$NAME` outside single
quotes and not escaped with a backslash, once, on the node it runs on (node 0); what it leaves -- inside single
quotes, or written `\\$(...)` / `\\$NAME` -- becomes text in the command string that srun hands to every task, and
each task's `bash -c` expands it itself, on its own node (srun(1): every task gets its own SLURM_PROCID,
SLURM_LOCALID, SLURM_NODEID). So `MASTER_ADDR=$(hostname)` inside the single quotes is each node's own name and
`MASTER_PORT=$(python -c '...bind(("", 0))...')` each task's own free port, while the same written outside the
quotes (`head=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1)`) is one value for all.

A rendezvous endpoint that differs between the processes meant to meet is a rendezvous that never completes:
torch.distributed.run's static and c10d rendezvous connect every agent to --rdzv-endpoint/--master-addr:port
(the c10d handler starts the store on the host whose name matches), env:// connects every rank to
MASTER_ADDR:MASTER_PORT (torch/distributed/rendezvous.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpudoctor.readers.sbatch.shell import _VAR, scan_word, split_commands

# How a value differs between tasks: by node, by task, by task within a node, or at random in each task.
PER_NODE, PER_TASK, PER_LOCAL_TASK, RANDOM = "node", "task", "local task", "random"
_VARYING_NAMES = {
    "HOSTNAME": PER_NODE,
    "HOST": PER_NODE,
    "SLURMD_NODENAME": PER_NODE,
    "SLURM_NODEID": PER_NODE,
    "SLURM_TOPOLOGY_ADDR": PER_NODE,
    "SLURM_PROCID": PER_TASK,
    "SLURM_TASK_PID": PER_TASK,
    "BASHPID": PER_TASK,
    "SLURM_LOCALID": PER_LOCAL_TASK,
    "RANDOM": RANDOM,
    "SRANDOM": RANDOM,
}
# A command whose output is this node's name or address (not `scontrol show hostname(s)`, the job's first node).
_NODE_COMMAND = re.compile(
    r"(?<!show )(?<![\w/-])(hostname|uname\s+-n|ifconfig|ip\s+(-\S+\s+)*(a|addr|address|route)\b|cat\s+/etc/hostname)"
    r"|socket\.gethostname|socket\.getfqdn|platform\.node"
)
# A command that picks a port or number afresh each time it runs.
_RANDOM_COMMAND = re.compile(r"getsockname|bind\(|free_?port|open_?port|\bshuf\b|\$S?RANDOM\b|\brandom\b|mktemp")


def evaluated_parts(text: str) -> set[str]:
    """The `$(...)`, `` `...` `` and `$NAME` (as "$NAME") that a shell reading text (as written) expands itself:
    not inside single quotes, not escaped with a backslash."""
    out: set[str] = set()
    i, n, in_double = 0, len(text), False
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "'" and not in_double:
            close = text.find("'", i + 1)
            i = n if close < 0 else close + 1
            continue
        if c == '"':
            in_double = not in_double
            i += 1
            continue
        if (c == "$" and text.startswith("$(", i)) or c == "`":
            end, _ = scan_word(text, i, single=True)
            end = max(end, i + 1)
            if text.startswith("$((", i):  # arithmetic: the names in it are what the shell reads
                out |= {f"${name}" for name in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", text[i + 3 : end])}
            else:
                out.add(text[i:end])
            i = end
            continue
        if c == "$":
            m = _VAR.match(text, i)
            if m:
                out.add("$" + (m.group(1) or m.group(4)))
                i = m.end()
                continue
        i += 1
    return out


MAX_EVALUATED = 256  # expansions remembered per variable: a real script has a handful


def varies(part: str) -> bool:
    """An expansion whose value could differ between the batch shell and a task: a command substitution, or a
    variable srun or the node sets per task or node ($HOSTNAME, $SLURM_PROCID, $RANDOM...)."""
    return part.startswith(("$(", "`")) or part[1:] in _VARYING_NAMES


def referenced_names(text: str) -> set[str]:
    """Every $NAME / ${NAME...} in text, quoted or not."""
    return {m.group(1) or m.group(4) for m in _VAR.finditer(text)}


@dataclass(frozen=True)
class Varying:
    """A rendezvous value that each task's shell computes for itself."""

    setting: str  # "--rdzv_endpoint", "MASTER_ADDR", ...
    value: str  # as the task's shell gets it
    how: str  # PER_NODE | PER_TASK | PER_LOCAL_TASK | RANDOM
    because: str  # the expansion that makes it so: "$(hostname)", "$SLURM_PROCID", ...


_QUOTING = re.compile(r"[\s'\"\\]")


def _comparable(text: str) -> str:
    """An expansion's text without blanks, quotes and backslashes: the reader pastes a variable's value into the
    line and reads the quotes again, so `bind(('', 0))` in the value may come back as `bind((, 0))`."""
    return _QUOTING.sub("", text)


def _how(value: str, inner: dict[str, str], batch: frozenset[str], depth: int = 0) -> list[tuple[str, str]]:
    """How value, expanded by a task's shell, differs per node/task: (how, the expansion that makes it so) each."""
    found: list[tuple[str, str]] = []
    if depth > 8:
        return found
    done = {_comparable(b) for b in batch}
    for part in sorted(evaluated_parts(value)):
        if _comparable(part) in done:
            continue  # the batch shell evaluated it once: one value for all tasks
        if part.startswith(("$(", "`")):
            body = part[2:-1] if part.startswith("$(") else part[1:-1]
            if _NODE_COMMAND.search(body):
                found.append((PER_NODE, part))
            elif _RANDOM_COMMAND.search(body):
                found.append((RANDOM, part))
            continue
        name = part[1:]
        if name in inner:
            found += [(how, f"{part}={inner[name]}") for how, _ in _how(inner[name], inner, batch, depth + 1)]
        elif name in _VARYING_NAMES:
            found.append((_VARYING_NAMES[name], part))
    return found


# The options that name the rendezvous endpoint, per launcher (dashed, as readers/sbatch/launch.py keeps them).
_ENDPOINT_OPTIONS = {
    "torchrun": ("rdzv-endpoint", "master-addr", "master-port"),
    "torch.distributed.launch": ("rdzv-endpoint", "master-addr", "master-port"),
    "accelerate": ("main-process-ip", "main-process-port"),
    "deepspeed": ("master-addr", "master-port"),
}
_ENV_ENDPOINT = ("MASTER_ADDR", "MASTER_PORT")  # read by env:// (plain python, Lightning)
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)


def varying_endpoints(
    task_command: str, batch: frozenset[str], launcher: str | None, standalone: bool
) -> list[Varying]:
    """The rendezvous settings of the launch in task_command whose value each task computes differently."""
    from gpudoctor.readers.sbatch.launch import _strip_prefixes, describe_command

    inner: dict[str, str] = {}
    found: list[Varying] = []
    for words in split_commands(task_command)[:200]:
        if words and words[0] == "export":
            words = words[1:]
        assigns = [m for m in (_ASSIGN.match(w) for w in words) if m]
        if len(assigns) == len(words):
            inner.update({m.group(1): m.group(2) for m in assigns})
            continue
        rest = _strip_prefixes(words)
        desc = describe_command(rest) if rest else {}
        if not desc.get("launcher") or desc.get("launcher") != launcher:
            continue
        prefix = {m.group(1): m.group(2) for m in (_ASSIGN.match(w) for w in words[: len(words) - len(rest)]) if m}
        options = desc.get("launcher_options") or {}
        if not standalone:
            for option in _ENDPOINT_OPTIONS.get(launcher or "", ()):
                value = options.get(option)
                if isinstance(value, str):
                    found += [
                        Varying(f"--{option.replace('-', '_')}", value, *how) for how in _how(value, inner, batch)
                    ]
        if launcher in ("python", "lightning"):
            env = {**inner, **prefix}
            for name in _ENV_ENDPOINT:
                if name in env:
                    found += [Varying(name, env[name], *how) for how in _how(env[name], {**inner, name: ""}, batch)]
    return found
