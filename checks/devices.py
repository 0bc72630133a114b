"""devices checks: which GPUs the job will get, and whether they are fit to be used."""

from __future__ import annotations

from gpudoctor.job.env import probe_env
from gpudoctor.model import MULTI_PROCESS_LAUNCHERS, fail, info, manual, passed, set_env, skip, warn
from gpudoctor.readers import cudavis
from gpudoctor.registry import check
from gpudoctor.units import GIB

BUSY_MIN_BYTES = 1 * GIB  # above the driver's own reservation (~0.5 GiB) on an idle GPU
BUSY_FAIL_FRACTION = 0.5  # half the memory already taken: the job will most likely run out


def _visible(facts) -> tuple[cudavis.Visibility, list[dict]]:
    """The CUDA_VISIBLE_DEVICES reading and the NVML GPUs the job will use (all when unresolved)."""
    return cudavis.from_facts(facts), cudavis.job_gpus(facts)


def _nothing_to_judge(facts, ctx):
    if not facts.nvidia.get("available"):
        return skip("no NVIDIA driver (see GD-DRV-001)")
    return skip("no usable GPUs for this job (see GD-DEV-001/GD-DEV-002)")


def _names(gpus: list[dict]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for g in gpus:
        out.setdefault(g.get("name") or "?", []).append(g["index"])
    return out


@check(
    id="GD-DEV-001",
    name="visible-devices-invalid",
    category="devices",
    title="CUDA_VISIBLE_DEVICES names GPUs that exist",
    needs=["env", "nvidia"],
    what="Reads CUDA_VISIBLE_DEVICES the way the CUDA driver does (indices, GPU-UUIDs and unique UUID "
    "prefixes, MIG-UUIDs) and resolves each entry against the GPUs NVML sees. CUDA stops at the first "
    "invalid entry and silently ignores everything after it; a GPU named twice invalidates the list; an "
    "empty value, -1, 'NoDevFiles' (SLURM without gres File=) or 'all' hide every GPU.",
    why="A wrong CUDA_VISIBLE_DEVICES does not raise an error: the job starts on fewer GPUs than planned, "
    "or on none and falls back to the CPU, or waits for ranks that cannot get a GPU.",
    fix="List existing GPUs by index (`nvidia-smi -L`) or UUID, separated by commas without blanks, "
    "e.g. `export CUDA_VISIBLE_DEVICES=0,1,2,3`; unset it to use every GPU. Under SLURM let "
    "`--gpus`/`--gres` set it and configure File= in gres.conf.",
)
def visible_devices_invalid(facts, ctx):
    vis = cudavis.from_facts(facts)
    evidence = {"CUDA_VISIBLE_DEVICES": vis.value, "resolved_gpus": list(vis.gpus) if vis.gpus is not None else None}
    if not vis.is_set:
        return passed("CUDA_VISIBLE_DEVICES is not set: every GPU is visible", **evidence)
    if vis.hides_all:
        if not ctx.gpus_expected:
            return passed(f"{vis.describe()} hides every GPU, as a CPU-only job (--expect-gpus 0) wants", **evidence)
        return fail(
            "; ".join(vis.problems) or f"{vis.describe()} hides every GPU",
            _fix_visibility(vis, facts),
            **evidence,
        )
    if vis.problems:
        judge = fail if ctx.gpus_expected else warn  # a CPU-only job loses nothing, but the value is still wrong
        return judge("; ".join(vis.problems), _fix_visibility(vis, facts), **evidence)
    where = (
        f"nvidia-smi GPU(s) {list(vis.gpus)}"
        if vis.gpus is not None
        else f"{vis.count} GPU(s) (not resolved: NVML unavailable)"
    )
    if vis.notes:
        return info(f"{vis.describe()} selects {where}; " + "; ".join(vis.notes), None, **evidence)
    return passed(f"{vis.describe()} selects {where}", **evidence)


def _fix_visibility(vis: cudavis.Visibility, facts):
    # an entry such as '0-3' stands for the GPUs it was meant to list, not for what CUDA reads
    keep = list(
        dict.fromkeys(
            t for e in vis.accepted for t in [str(i) for i in cudavis.lost_indices(e.text) or []] or [e.text.strip()]
        )
    )
    if vis.duplicate or vis.all_invalid_because or not keep:
        return manual(
            "Set CUDA_VISIBLE_DEVICES to existing GPUs, each once (or unset it to use all)",
            "nvidia-smi -L",
            "unset CUDA_VISIBLE_DEVICES",
        )
    return manual(f"Name only existing GPUs, e.g. CUDA_VISIBLE_DEVICES={','.join(keep)}", "nvidia-smi -L")


_COUNT_FIX = manual(
    "Give the job the GPUs it needs: check CUDA_VISIBLE_DEVICES "
    "and the scheduler request (or pass the right --expect-gpus)",
    "nvidia-smi -L",
    "echo $CUDA_VISIBLE_DEVICES",
)


@check(
    id="GD-DEV-002",
    name="gpu-count-mismatch",
    category="devices",
    title="The job sees the number of GPUs it expects",
    needs=["env", "nvidia"],
    what="Counts the GPUs a CUDA process will enumerate (NVML's GPUs filtered by CUDA_VISIBLE_DEVICES) and "
    "compares with --expect-gpus (default: at least one; 0: a CPU-only job).",
    why="Too few GPUs make torchrun ranks fail with 'invalid device ordinal', or DDP wait forever for ranks "
    "that never start; none at all silently trains on the CPU.",
    fix="Request the GPUs from the scheduler (`--gpus-per-node`), fix CUDA_VISIBLE_DEVICES, or pass the "
    "right --expect-gpus.",
)
def gpu_count_mismatch(facts, ctx):
    expected = ctx.expect_gpus
    if not facts.nvidia.get("available"):
        if not ctx.gpus_expected:
            return passed("no GPUs expected and none usable (no NVIDIA driver)")
        return skip("no NVIDIA driver: GPUs cannot be counted (see GD-DRV-001)")
    vis, visible = _visible(facts)
    count = vis.count if vis.count is not None else len(facts.gpus)
    if _mig_devices_visible(vis, visible):
        count = min(count, 1)  # a CUDA process enumerates one MIG device (see GD-DEV-004)
    evidence = {"visible": count, "expected": expected, "nvml_gpus": len(facts.gpus), "CUDA_VISIBLE_DEVICES": vis.value}
    if expected == 0:
        return passed(f"a CPU-only job (--expect-gpus 0); {count} GPU(s) visible", **evidence)
    if expected is None:
        if count >= 1:
            return passed(f"{count} GPU(s) visible", **evidence)
        return fail(
            f"no GPU visible to CUDA ({vis.describe()}, NVML sees {len(facts.gpus)}): the job would run on the CPU",
            _COUNT_FIX,
            **evidence,
        )
    if count < expected:
        why = f" ({vis.describe()})" if vis.is_set else ""
        return fail(f"the job expects {expected} GPU(s) but CUDA will see {count}{why}", _COUNT_FIX, **evidence)
    if count > expected:
        return passed(f"{count} GPU(s) visible; the job uses {expected}", **evidence)
    return passed(f"{count} GPU(s) visible, as expected", **evidence)


@check(
    id="GD-DEV-003",
    name="device-order-ambiguous",
    category="devices",
    title="GPU indices mean the same GPUs to CUDA and nvidia-smi",
    needs=["env", "nvidia"],
    what="On a machine with different GPU models, checks that CUDA_DEVICE_ORDER=PCI_BUS_ID is set when GPUs "
    "are chosen by index. CUDA's default order (FASTEST_FIRST) puts the fastest GPU first, while nvidia-smi, "
    "NVML and schedulers number GPUs in PCI bus order.",
    why="With mixed models, CUDA_VISIBLE_DEVICES=0 may pick a different card than nvidia-smi's GPU 0: the job "
    "lands on the small or busy GPU, and per-GPU monitoring no longer matches.",
    fix="`export CUDA_DEVICE_ORDER=PCI_BUS_ID`, or select GPUs by UUID.",
)
def device_order_ambiguous(facts, ctx):
    if not facts.nvidia.get("available"):
        return skip("no NVIDIA driver (see GD-DRV-001)")
    gpus = [g for g in facts.gpus if not g.get("error")]
    names = _names(gpus)
    order = probe_env(facts).get("CUDA_DEVICE_ORDER")
    evidence = {
        "models": names,
        "CUDA_DEVICE_ORDER": order,
        "CUDA_VISIBLE_DEVICES": probe_env(facts).get("CUDA_VISIBLE_DEVICES"),
    }
    if len(names) <= 1:
        return passed("all GPUs are the same model: CUDA's order matches nvidia-smi's", **evidence)
    if order == "PCI_BUS_ID":
        return passed("CUDA_DEVICE_ORDER=PCI_BUS_ID: CUDA numbers GPUs as nvidia-smi does", **evidence)
    vis = cudavis.from_facts(facts)
    models = ", ".join(f"{n} (GPU {', '.join(map(str, idx))})" for n, idx in names.items())
    bad_order = (
        f" (CUDA_DEVICE_ORDER={order!r} is not a valid order; CUDA uses FASTEST_FIRST)"
        if order not in (None, "FASTEST_FIRST")
        else ""
    )
    fix = set_env("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
    if vis.uses_indices:
        return warn(
            f"mixed GPU models ({models}) and {vis.describe()} selects by index, but CUDA numbers GPUs fastest-first, "
            f"not in nvidia-smi's PCI order: the indices may pick other cards than intended{bad_order}",
            fix,
            **evidence,
        )
    return info(
        f"mixed GPU models ({models}): CUDA's device 0 is the fastest GPU, not nvidia-smi's GPU 0; "
        f"set CUDA_DEVICE_ORDER=PCI_BUS_ID so cuda:N matches nvidia-smi{bad_order}",
        fix,
        **evidence,
    )


@check(
    id="GD-DEV-004",
    name="mig-multiple-devices",
    category="devices",
    title="MIG set-up gives each process one MIG device",
    needs=["env", "nvidia"],
    what="On GPUs in MIG mode, counts the MIG devices the job would need: a CUDA process enumerates only one "
    "MIG device (the first visible one), and none of the non-MIG GPUs once a MIG device is visible. Also "
    "reports a MIG mode change that waits for a GPU reset.",
    why="Multi-GPU training expecting several MIG slices in one process sees torch.cuda.device_count() == 1: "
    "ranks after the first fail with 'invalid device ordinal'. Each rank needs its own "
    "CUDA_VISIBLE_DEVICES=MIG-<uuid>.",
    fix="Give every process exactly one MIG device (`CUDA_VISIBLE_DEVICES=MIG-<uuid>`, see `nvidia-smi -L`), "
    "or disable MIG for multi-GPU training (`sudo nvidia-smi -i N -mig 0`, then reset the GPU).",
)
def mig_multiple_devices(facts, ctx):
    if not facts.nvidia.get("available"):
        return skip("no NVIDIA driver (see GD-DRV-001)")
    gpus = [g for g in facts.gpus if not g.get("error")]
    pending = [g["index"] for g in gpus if g.get("mig") and g["mig"].get("pending") != g["mig"].get("current")]
    mig_gpus = [g for g in gpus if (g.get("mig") or {}).get("current")]
    if not mig_gpus:
        if pending:
            return warn(
                f"a MIG mode change is pending on GPU(s) {pending} until the GPU is reset",
                manual("Reset the GPU(s) or reboot", "sudo nvidia-smi -r -i <index>"),
                pending=pending,
            )
        return passed("no GPU is in MIG mode")
    vis, visible = _visible(facts)
    devices = _mig_devices_visible(vis, visible)
    evidence = {
        "mig_gpus": [g["index"] for g in mig_gpus],
        "mig_devices_visible": devices,
        "CUDA_VISIBLE_DEVICES": vis.value,
        "pending": pending,
    }
    if not devices and not any((g.get("mig") or {}).get("current") for g in visible):
        return passed(f"GPU(s) {evidence['mig_gpus']} are in MIG mode, but the job does not use them", **evidence)
    wanted = ctx.expect_gpus
    if wanted is not None and wanted > 1:
        return fail(
            f"the job expects {wanted} GPUs but GPUs {evidence['mig_gpus']} are in MIG mode: a CUDA process can use "
            f"only one MIG device ({len(devices)} visible), so torch.cuda.device_count() will be 1",
            manual(
                "Run one process per MIG device, each with its own CUDA_VISIBLE_DEVICES=MIG-<uuid>, or disable MIG",
                "nvidia-smi -L",
            ),
            **evidence,
        )
    if len(devices) > 1 and len(vis.mig or ()) > 1:
        # listed on purpose: CUDA enumerates only the first MIG device of CUDA_VISIBLE_DEVICES (CUDA C Programming
        # Guide, CUDA_VISIBLE_DEVICES; NVIDIA MIG user guide, "CUDA Device Enumeration")
        return warn(
            f"CUDA_VISIBLE_DEVICES lists {len(vis.mig)} MIG devices, but a CUDA process uses only the first: "
            "torch.cuda.device_count() is 1; give each process its own CUDA_VISIBLE_DEVICES=MIG-<uuid>",
            set_env("CUDA_VISIBLE_DEVICES", vis.mig[0], title="Keep only the MIG device CUDA uses (one per process)"),
            **evidence,
        )
    if len(devices) > 1:
        return info(
            f"{len(devices)} MIG devices are visible, but a CUDA process uses only the first; give each process its "
            "own CUDA_VISIBLE_DEVICES=MIG-<uuid>",
            None,
            **evidence,
        )
    if pending:
        return warn(
            f"a MIG mode change is pending on GPU(s) {pending} until the GPU is reset",
            manual("Reset the GPU(s) or reboot", "sudo nvidia-smi -r -i <index>"),
            **evidence,
        )
    return passed(f"MIG mode: {len(devices)} MIG device visible to the job", **evidence)


def _mig_devices_visible(vis: cudavis.Visibility, visible: list[dict]) -> list[str]:
    if vis.mig:
        return list(vis.mig)
    out = []
    for g in visible:
        if (g.get("mig") or {}).get("current"):
            out += [d.get("uuid") for d in g["mig"].get("devices") or []]
    return out


@check(
    id="GD-DEV-005",
    name="compute-mode-restricted",
    category="devices",
    title="GPU compute mode lets the job open the GPUs",
    needs=["env", "nvidia"],
    what="Reads each visible GPU's compute mode. Prohibited: no process may create a CUDA context. "
    "Exclusive_Process: one process per GPU at a time.",
    why="On a Prohibited GPU every CUDA call fails ('all CUDA-capable devices are busy or unavailable'). "
    "Exclusive_Process is fine for DDP's one process per GPU, but a second process on the same GPU - another "
    "job, an evaluation process, a leftover from a crashed run, or a rank that initialises CUDA on cuda:0 before "
    "calling set_device - fails the same way. Reported as info, and as a warning for multi-process launchers.",
    fix="Ask the administrator, or `sudo nvidia-smi -i N -c DEFAULT`. With Exclusive_Process, make sure nothing "
    "else holds the GPU (`nvidia-smi`).",
)
def compute_mode_restricted(facts, ctx):
    _, gpus = _visible(facts)
    modes = {g["index"]: g.get("compute_mode") for g in gpus}
    prohibited = [i for i, m in modes.items() if m == "Prohibited"]
    exclusive = [g for g in gpus if g.get("compute_mode") in ("Exclusive_Process", "Exclusive_Thread")]
    evidence = {"compute_modes": modes}
    if not gpus:
        return _nothing_to_judge(facts, ctx)
    if prohibited:
        return fail(
            f"GPU(s) {prohibited} are in compute mode Prohibited: no CUDA context can be created on them",
            manual(
                "Set the compute mode back to Default (administrator)",
                *[f"sudo nvidia-smi -i {i} -c DEFAULT" for i in prohibited],
            ),
            **evidence,
        )
    taken = [g["index"] for g in exclusive if any(p.get("type") == "compute" for p in g.get("processes") or [])]
    if taken:
        return fail(
            f"GPU(s) {taken} are in Exclusive_Process mode and another "
            "process already holds them: this job cannot open them",
            manual("Find and stop the other process", "nvidia-smi"),
            **evidence,
        )
    if exclusive:
        idx = [g["index"] for g in exclusive]
        text = (
            f"GPU(s) {idx} are in Exclusive_Process mode: fine for one process per GPU, but any second process on the "
            "same GPU fails with 'busy or unavailable'"
        )
        if ctx.launcher in MULTI_PROCESS_LAUNCHERS:
            return warn(
                text + f" - with {ctx.launcher}, a rank that touches cuda:0 before "
                "torch.cuda.set_device(local_rank) (an early .cuda(), empty_cache(), a "
                "barrier without device_ids) takes another rank's GPU and the job dies",
                None,
                launcher=ctx.launcher,
                **evidence,
            )
        return info(text, None, **evidence)
    return passed("compute mode Default on all visible GPUs", **evidence)


@check(
    id="GD-DEV-006",
    name="persistence-mode-off",
    category="devices",
    title="GPU persistence mode is on",
    needs=["env", "nvidia"],
    what="Reads each visible GPU's persistence mode.",
    why="Without persistence mode (or the nvidia-persistenced daemon) the driver tears the GPUs down whenever no "
    "process uses them: every job start pays a driver re-initialisation of seconds per GPU, and settings such "
    "as application clocks are lost between jobs.",
    fix="Administrator: enable the nvidia-persistenced service, or `sudo nvidia-smi -pm 1`.",
)
def persistence_mode_off(facts, ctx):
    _, gpus = _visible(facts)
    off = [g["index"] for g in gpus if g.get("persistence_mode") is False]
    evidence = {
        "persistence_off": off,
        "persistenced_running": facts.nvidia.get("persistenced_running"),
        "node_gpus": len(facts.gpus),
    }
    if not gpus:
        return _nothing_to_judge(facts, ctx)
    if off:
        fix = manual(
            "Enable persistence mode (administrator)",
            "sudo systemctl enable --now nvidia-persistenced",
            "sudo nvidia-smi -pm 1",
        )
        if len(facts.gpus) > 1:
            # A multi-GPU server pays the teardown per GPU and per job step; NVIDIA's driver persistence guide
            # recommends the daemon on all headless servers (docs.nvidia.com/deploy/driver-persistence).
            return warn(
                f"persistence mode is off on GPU(s) {off} of this {len(facts.gpus)}-GPU server: "
                "the driver tears every GPU down "
                "between jobs and each job start re-initialises them (seconds per GPU)",
                fix,
                **evidence,
            )
        return info(
            f"persistence mode is off on GPU(s) {off}: each job start re-initialises the driver (slower start-up)",
            fix,
            **evidence,
        )
    return passed("persistence mode on for all visible GPUs", **evidence)


@check(
    id="GD-DEV-007",
    name="gpus-already-busy",
    category="devices",
    title="The job's GPUs are free",
    needs=["env", "nvidia"],
    what="Looks at processes NVML reports on the job's GPUs and at memory already in use (more than 1 GiB, which "
    "is above the driver's own reservation). Inside containers NVML often lists no processes of other "
    "containers, so used memory is the more reliable sign.",
    why="Memory held by another job or by a leftover process from a crashed run makes this job run out of memory "
    "or share the GPU's compute with it.",
    fix="Find the process (`nvidia-smi`, `fuser -v /dev/nvidia*`) and stop it, or pick other GPUs.",
)
def gpus_already_busy(facts, ctx):
    _, gpus = _visible(facts)
    if not gpus:
        return _nothing_to_judge(facts, ctx)
    busy, heavy = {}, []
    for g in gpus:
        used, total = g.get("memory_used_bytes") or 0, g.get("memory_total_bytes") or 0
        procs = [p for p in g.get("processes") or [] if p.get("type") == "compute"]
        if procs or used > BUSY_MIN_BYTES:
            busy[g["index"]] = {
                "used_gib": round(used / GIB, 1),
                "total_gib": round(total / GIB, 1),
                "pids": [p.get("pid") for p in procs],
            }
            if total and used >= BUSY_FAIL_FRACTION * total:
                heavy.append(g["index"])
    if not busy:
        return passed("no other processes and no memory in use on the job's GPUs")
    detail = "; ".join(
        f"GPU {i}: {b['used_gib']} of {b['total_gib']} GiB in use" + (f", PIDs {b['pids']}" if b["pids"] else "")
        for i, b in busy.items()
    )
    fix = manual("Find and stop the processes holding the GPUs", "nvidia-smi", "fuser -v /dev/nvidia*")
    if heavy:
        return fail(
            f"GPU(s) {heavy} are already half full or more - the job will likely run out of memory ({detail})",
            fix,
            busy=busy,
        )
    return warn(f"the job's GPUs are already in use ({detail})", fix, busy=busy)


@check(
    id="GD-DEV-008",
    name="mixed-gpu-models",
    category="devices",
    title="The job's GPUs are all the same model",
    needs=["env", "nvidia"],
    what="Compares the model names of the GPUs the job will use.",
    why="Data-parallel training runs in lockstep: every step waits for the slowest GPU, and a batch size that "
    "fits the largest card runs out of memory on the smallest.",
    fix="Restrict the job to one model with CUDA_VISIBLE_DEVICES (by UUID, or by index with "
    "CUDA_DEVICE_ORDER=PCI_BUS_ID), or size the per-GPU batch for the smallest GPU.",
)
def mixed_gpu_models(facts, ctx):
    _, gpus = _visible(facts)
    if not gpus:
        return _nothing_to_judge(facts, ctx)
    names = _names(gpus)
    if len(names) == 1:
        return passed(f"{len(gpus)} x {next(iter(names))}", models=names)
    models = ", ".join(f"{n} x{len(idx)} (GPU {', '.join(map(str, idx))})" for n, idx in names.items())
    return warn(
        f"the job's GPUs are {len(names)} different models: data-parallel steps run at the slowest one's pace",
        None,
        models=names,
        gpus=models,
        memory="the memory limits differ too",
    )
