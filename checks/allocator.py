"""allocator checks: the caching allocator's settings and the CUDA debug switches that cost speed.

These read only environment variables and torch's version from package metadata: no torch
import, so `gpudoctor check --select allocator` stays fast even where torch is slow to load.
"""

from __future__ import annotations

from typing import Any

from gpudoctor import versions
from gpudoctor.job.env import job_env
from gpudoctor.model import Action, ActionKind, Fix, Safety, fail, info, manual, passed, set_env, unset_env, warn
from gpudoctor.readers import allocconf
from gpudoctor.readers.ints import python_int
from gpudoctor.registry import check

NEEDS = ["env", "torch_meta"]
NO_CACHING_VAR = "PYTORCH_NO_CUDA_MEMORY_CACHING"
NO_CACHING_STRICT_SINCE = (2, 7)  # pytorch#145905: from 2.7 only "1" disables caching


def _torch_version(facts) -> tuple[int, ...] | None:
    return versions.parse(facts.torch_version())


def _version_text(v) -> str:
    return versions.fmt(v[:2]) if v else "unknown"


@check(
    id="GD-ALLOC-001",
    scope="job",
    name="alloc-conf-invalid",
    category="allocator",
    title="Allocator settings (PYTORCH_CUDA_ALLOC_CONF) are valid",
    needs=NEEDS,
    what="Parses PYTORCH_CUDA_ALLOC_CONF (and PYTORCH_ALLOC_CONF, its newer name) the way torch's "
    "caching allocator does and validates every key and value against the installed torch version: "
    "key:value pairs separated by commas, known keys, max_split_size_mb above 20, "
    "garbage_collection_threshold strictly between 0 and 1, power-of-2 roundup divisions, "
    "backend native|cudaMallocAsync, booleans written exactly True or False, keys newer than torch.",
    why="torch parses the variable lazily - when the allocator is first used, or already at import in "
    "recent CUDA builds - so a typo does not show at submission: the job starts and dies at `import torch` "
    "or at the first .cuda() with 'Unrecognized CachingAllocator option', \"Expected 'True' or 'False'\", "
    "'Index out of bounds in ConfigTokenizer' or a bare 'stoi' error. Lower-case true, key=value, or a key "
    "from a newer torch are the usual causes.",
    fix="Correct the value, e.g. `export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True` or "
    "`max_split_size_mb:512`; remove keys this torch does not know. See the PyTorch notes on CUDA "
    "memory management for every option.",
)
def alloc_conf_invalid(facts, ctx):
    env = job_env(facts, ctx)
    tv = _torch_version(facts)
    names = [n for n in (allocconf.UNIFIED_VAR, allocconf.LEGACY_VAR) if n in env]
    if not names:
        return passed("no allocator settings: torch's defaults", torch=_version_text(tv))
    chosen = allocconf.effective_variable(env, tv)
    if chosen.version_known:
        names = list(chosen.candidates)
        if not names:
            return passed(
                f"only {', '.join(chosen.ignored)} is set, which torch {_version_text(tv)} ignores (see GD-ALLOC-002)"
            )
    outcomes = [_judge_conf(name, env[name], tv, env.source(name)) for name in names]
    return max(outcomes, key=lambda o: o.severity.rank) if len(outcomes) > 1 else outcomes[0]


def _quoted(value: str, limit: int = 200) -> str:
    """The value as a Python literal, cut short when a pasted blob would flood the report."""
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value):,} characters)"


def _judge_conf(name: str, value: str, tv, source: str | None = None):
    conf = allocconf.parse_alloc_conf(value, tv, variable=name)
    evidence = {
        "variable": name,
        "value": value,
        "set_in": source,
        "torch": _version_text(tv),
        "settings": conf.settings,
    }
    if conf.errors:
        corrected = allocconf.suggest_correction(value, tv)
        if corrected:
            fix = set_env(name, corrected)
        else:
            # The value cannot run at all (torch raises on it), so dropping what it rejects is safe.
            kept, dropped = allocconf.valid_entries(value, tv)
            shown = ", ".join(_quoted(d, 60) for d in dropped)
            fix = (
                set_env(
                    name,
                    kept,
                    f"Keep the entries torch {_version_text(tv)} accepts: export {name}={kept} (drops {shown})",
                )
                if kept
                else unset_env(name, f"unset {name}: torch {_version_text(tv)} accepts none of its entries ({shown})")
            )
        return fail(
            f"{name}={_quoted(value)}: {'; '.join(conf.errors)}",
            fix,
            errors=conf.errors,
            **evidence,
        )
    if conf.warnings:
        return warn(f"{name}={_quoted(value)}: {'; '.join(conf.warnings)}", None, warnings=conf.warnings, **evidence)
    note = "; ".join(conf.notes)
    unknown = "" if tv else " (torch version unknown: checked against the newest rules)"
    return passed(
        f"{name}={value!r} is valid for torch {_version_text(tv)}{unknown}" + (f"; {note}" if note else ""), **evidence
    )


@check(
    id="GD-ALLOC-002",
    scope="job",
    name="alloc-conf-variable-ignored",
    category="allocator",
    title="Allocator settings are in the variable this torch reads",
    needs=NEEDS,
    what="Compares PYTORCH_ALLOC_CONF and PYTORCH_CUDA_ALLOC_CONF with the installed torch version: "
    "torch before 2.10 reads only PYTORCH_CUDA_ALLOC_CONF for CUDA; from 2.10 either name works alone. With "
    "both set torch reads one and ignores the other: torch 2.9 preferred PYTORCH_ALLOC_CONF, torch 2.13 reads "
    "PYTORCH_CUDA_ALLOC_CONF first.",
    why="Settings in the variable torch does not read are silently ignored: expandable_segments or "
    "max_split_size_mb meant to prevent an out-of-memory simply do not happen. torch 2.9 warns that "
    "PYTORCH_CUDA_ALLOC_CONF is deprecated, yet its CUDA allocator still ignores expandable_segments set in "
    "PYTORCH_ALLOC_CONF (pytorch/pytorch#183387); torch never merges the two variables.",
    fix="Set only one of the two: PYTORCH_CUDA_ALLOC_CONF for torch < 2.10, either name for 2.10 and newer.",
)
def alloc_conf_variable_ignored(facts, ctx):
    env = job_env(facts, ctx)
    tv = _torch_version(facts)
    legacy, unified = env.get(allocconf.LEGACY_VAR), env.get(allocconf.UNIFIED_VAR)
    if legacy is None and unified is None:
        return passed("neither allocator variable is set")
    if tv is None:
        if legacy is not None and unified is not None:
            evidence: dict[str, Any] = {
                allocconf.UNIFIED_VAR: unified,
                allocconf.LEGACY_VAR: legacy,
                "torch": "unknown",
            }
            return _both_set(allocconf.effective_variable(job_env(facts, ctx), None), None, legacy, unified, evidence)
        return passed("torch's version is unknown; cannot tell which allocator variable it reads")
    chosen = allocconf.effective_variable(env, tv)
    evidence = {"torch": _version_text(tv), allocconf.UNIFIED_VAR: unified, allocconf.LEGACY_VAR: legacy}
    if chosen.ignored == (allocconf.UNIFIED_VAR,) and legacy is None and unified is not None:
        partly = (
            " (torch 2.9 reads it for some keys, but its CUDA allocator "
            "ignores expandable_segments there, pytorch#183387)"
            if tuple(tv[:2]) == (2, 9)
            else ""
        )
        return warn(
            f"torch {_version_text(tv)} reads only {allocconf.LEGACY_VAR} for CUDA; "
            f"{allocconf.UNIFIED_VAR}={unified!r} is ignored{partly} - torch reads it from 2.10",
            set_env(allocconf.LEGACY_VAR, unified),
            **evidence,
        )
    if legacy is not None and unified is not None:
        return _both_set(chosen, tv, legacy, unified, evidence)
    if chosen.deprecated_alias:
        return passed(
            f"torch {_version_text(tv)} reads {allocconf.LEGACY_VAR}, the older name of {allocconf.UNIFIED_VAR} "
            "(both names work; renaming is optional)",
            **evidence,
        )
    return passed(f"torch {_version_text(tv)} reads {chosen.effective}", **evidence)


def _both_set(chosen, tv, legacy: str, unified: str, evidence: dict):
    """Both allocator variables set: torch reads exactly one of them, never a merge."""
    if legacy == unified:
        return passed(
            "both variables are set to the same value, so it does "
            f"not matter which one torch {_version_text(tv)} reads",
            **evidence,
        )
    keep_unified = unset_env(
        allocconf.LEGACY_VAR,
        f"unset {allocconf.LEGACY_VAR} so that {allocconf.UNIFIED_VAR} "
        "takes effect (merge what you need into it first)",
    )
    if chosen.ignored == (allocconf.UNIFIED_VAR,):
        why = (
            "only 2.10+ reads the new name"
            if tuple(tv[:2]) < allocconf.UNIFIED_SINCE
            else "from 2.13 the older name is read first"
        )
        return warn(
            f"torch {_version_text(tv)} reads {allocconf.LEGACY_VAR}={legacy!r} and "
            f"ignores {allocconf.UNIFIED_VAR}={unified!r} "
            f"({why}): the settings in {allocconf.UNIFIED_VAR} do not take effect",
            keep_unified,
            **evidence,
        )
    return warn(
        f"both {allocconf.UNIFIED_VAR}={unified!r} and {allocconf.LEGACY_VAR}={legacy!r} are set; torch reads only "
        f"one of them and which one changed between releases (2.9 preferred {allocconf.UNIFIED_VAR}, 2.13 "
        f"prefers {allocconf.LEGACY_VAR})"
        + (f"; torch {_version_text(tv)}'s order is not verified" if tv else "; torch's version is unknown")
        + " - keep one variable",
        keep_unified,
        **evidence,
    )


@check(
    id="GD-ALLOC-003",
    scope="job",
    name="caching-allocator-disabled",
    category="allocator",
    title="CUDA caching allocator is on",
    needs=NEEDS,
    what="Looks for PYTORCH_NO_CUDA_MEMORY_CACHING. torch before 2.7 disables the caching allocator when "
    "the variable exists at all - even set to 0 or empty; from 2.7 only the value 1 disables it "
    "(pytorch/pytorch#145905).",
    why="Without the caching allocator every tensor allocation is a cudaMalloc and every free a "
    "synchronising cudaFree: training runs several times slower and fragments memory. It is a debugging "
    "switch for compute-sanitizer, not a memory saver.",
    fix="`unset PYTORCH_NO_CUDA_MEMORY_CACHING` (setting it to 0 is not enough on torch < 2.7).",
)
def caching_allocator_disabled(facts, ctx):
    value = job_env(facts, ctx).get(NO_CACHING_VAR)
    tv = _torch_version(facts)
    evidence = {NO_CACHING_VAR: value, "torch": _version_text(tv)}
    if value is None:
        return passed("caching allocator on (PYTORCH_NO_CUDA_MEMORY_CACHING unset)", **evidence)
    fix = unset_env(NO_CACHING_VAR)
    strict = tv is not None and tuple(tv[:2]) >= NO_CACHING_STRICT_SINCE
    if value == "1":
        return warn(
            f"{NO_CACHING_VAR}=1 turns off the CUDA caching allocator: every allocation is a cudaMalloc and every free "
            "a synchronising cudaFree - a debugging switch that makes training much slower",
            fix,
            **evidence,
        )
    if strict:
        if value == "0":
            return passed(f"{NO_CACHING_VAR}=0: torch {_version_text(tv)} reads 0 as off", **evidence)
        return info(
            f"{NO_CACHING_VAR}={value!r} is neither 0 nor 1; torch {_version_text(tv)} ignores it with a warning",
            fix,
            **evidence,
        )
    if tv is None:
        return warn(
            f"{NO_CACHING_VAR}={value!r}: torch before 2.7 disables the caching allocator whenever this variable "
            "exists, even when it is 0 (torch's version is unknown)",
            fix,
            **evidence,
        )
    return warn(
        f"{NO_CACHING_VAR}={value!r}: torch {_version_text(tv)} disables the caching allocator whenever this variable "
        "exists, even when it is 0 or empty (only torch 2.7+ reads the value) - training will be much slower",
        fix,
        **evidence,
    )


@check(
    id="GD-ALLOC-004",
    name="cuda-launch-blocking-on",
    category="allocator",
    title="Kernel launches are asynchronous (CUDA_LAUNCH_BLOCKING off)",
    needs=["env"],
    scope="job",
    what="Reads CUDA_LAUNCH_BLOCKING: 1 makes every kernel launch wait for the kernel to finish; 0 (or unset) "
    "is CUDA's normal asynchronous mode.",
    why="With launches serialised the CPU cannot run ahead of the GPU, so data loading, Python overhead and "
    "NCCL communication no longer overlap with compute: a debugging switch for locating the kernel behind a "
    "CUDA error, often left in job scripts afterwards.",
    fix="`unset CUDA_LAUNCH_BLOCKING` (or set it to 0) for training runs.",
)
def cuda_launch_blocking_on(facts, ctx):
    value = job_env(facts, ctx).get("CUDA_LAUNCH_BLOCKING")
    if value is None or value.strip() in ("", "0"):
        return passed(
            "kernel launches are asynchronous"
            + (f" (CUDA_LAUNCH_BLOCKING={value!r} is off)" if value is not None else ""),
            CUDA_LAUNCH_BLOCKING=value,
        )
    if value.strip() == "1":
        return warn(
            "CUDA_LAUNCH_BLOCKING=1 serialises every kernel launch: the CPU waits for each kernel, so input pipeline "
            "and communication stop overlapping with compute - a debugging switch that slows training",
            unset_env("CUDA_LAUNCH_BLOCKING"),
            CUDA_LAUNCH_BLOCKING=value,
        )
    return info(
        f"CUDA_LAUNCH_BLOCKING={value!r}: CUDA documents only 0 "
        "(asynchronous) and 1 (blocking); set it to 0 or unset it",
        unset_env("CUDA_LAUNCH_BLOCKING"),
        CUDA_LAUNCH_BLOCKING=value,
    )


@check(
    id="GD-ALLOC-005",
    name="cuda-dsa-flag-at-runtime",
    category="allocator",
    title="No build-time CUDA debug flags set at run time",
    needs=["env"],
    scope="job",
    what="Looks for TORCH_USE_CUDA_DSA and PYTORCH_USE_CUDA_DSA. TORCH_USE_CUDA_DSA is a compile-time macro for "
    "building torch with device-side assertions; as an environment variable at run time nothing reads it. "
    "PYTORCH_USE_CUDA_DSA=1 is the run-time switch, and it only has an effect in a torch built with "
    "TORCH_USE_CUDA_DSA (the pip and conda wheels are not).",
    why="Guides that recommend `export TORCH_USE_CUDA_DSA=1` for training give a false sense of extra checking; "
    "in a torch built with DSA, PYTORCH_USE_CUDA_DSA=1 records every kernel launch and slows the job.",
    fix="`unset TORCH_USE_CUDA_DSA`. To debug a device-side assert, run once with CUDA_LAUNCH_BLOCKING=1 "
    "(and, in a DSA build, PYTORCH_USE_CUDA_DSA=1).",
)
def cuda_dsa_flag_at_runtime(facts, ctx):
    env = job_env(facts, ctx)
    build_flag, runtime_flag = env.get("TORCH_USE_CUDA_DSA"), env.get("PYTORCH_USE_CUDA_DSA")
    evidence = {"TORCH_USE_CUDA_DSA": build_flag, "PYTORCH_USE_CUDA_DSA": runtime_flag}
    if build_flag is not None:
        return info(
            f"TORCH_USE_CUDA_DSA={build_flag!r} does nothing at run time: it is a flag for building torch from source "
            "(the run-time switch is PYTORCH_USE_CUDA_DSA=1, effective only in a DSA build)",
            unset_env("TORCH_USE_CUDA_DSA"),
            **evidence,
        )
    if runtime_flag == "1":
        return info(
            "PYTORCH_USE_CUDA_DSA=1 enables device-side assertion tracking, but only in a torch built with "
            "TORCH_USE_CUDA_DSA (pip/conda wheels are not); where it works it records every kernel launch",
            unset_env("PYTORCH_USE_CUDA_DSA"),
            **evidence,
        )
    return passed("no device-side-assertion flags set", **evidence)


# Tools that hook into every CUDA call when their variables are set.
_INJECTION_HINTS = (
    ("sanitizer", "compute-sanitizer"),
    ("nsight-systems", "Nsight Systems (nsys)"),
    ("nsys", "Nsight Systems (nsys)"),
    ("nsight-compute", "Nsight Compute (ncu)"),
    ("ncu", "Nsight Compute (ncu)"),
    ("toolsinjection", "an Nsight tool"),
    ("cupti", "a CUPTI-based profiler"),
)


def _tool_name(path: str) -> str | None:
    low = path.lower()
    return next((name for hint, name in _INJECTION_HINTS if hint in low), None)


def _debug_switches(env: dict) -> list[tuple[str, str, str]]:
    """(variable, value, what it does) for each speed-costing tool or logging switch that is on."""
    found = []
    inj = env.get("CUDA_INJECTION64_PATH")
    if inj:
        found.append(
            (
                "CUDA_INJECTION64_PATH",
                inj,
                f"{_tool_name(inj) or 'a CUDA tool library'} is injected into every CUDA process",
            )
        )
    for lib in (env.get("LD_PRELOAD") or "").replace(":", " ").split():
        tool = _tool_name(lib)
        if tool:
            found.append(("LD_PRELOAD", lib, f"{tool} is preloaded into every process"))
    if "TORCH_CUDA_SANITIZER" in env:  # torch/__init__.py enables it when the name exists, whatever the value
        found.append(
            (
                "TORCH_CUDA_SANITIZER",
                env["TORCH_CUDA_SANITIZER"],
                "torch's CUDA stream sanitizer checks every kernel's tensor accesses",
            )
        )
    if env.get("CUDNN_LOGINFO_DBG") == "1":
        found.append(("CUDNN_LOGINFO_DBG", "1", "cuDNN logs every API call"))
    level = python_int(env.get("CUDNN_LOGLEVEL_DBG"))
    if level is not None and level >= 3:
        found.append(("CUDNN_LOGLEVEL_DBG", env["CUDNN_LOGLEVEL_DBG"], "cuDNN 9 logs every API call (level 3 = info)"))
    if env.get("CUBLAS_LOGINFO_DBG") == "1":
        found.append(("CUBLAS_LOGINFO_DBG", "1", "cuBLAS logs every API call"))
    level = python_int(env.get("CUBLASLT_LOG_LEVEL"))
    if level is not None and level >= 2:
        found.append(("CUBLASLT_LOG_LEVEL", env["CUBLASLT_LOG_LEVEL"], "cuBLASLt traces its calls (level 2 and up)"))
    return found


DIST_DEBUG_LEVELS = ("OFF", "INFO", "DETAIL")


def _dist_debug_problem(env: dict) -> tuple[str, str] | None:
    """(severity, text) for TORCH_DISTRIBUTED_DEBUG; torch upper-cases the value (c10d/debug.cpp)."""
    value = env.get("TORCH_DISTRIBUTED_DEBUG")
    if value is None:
        return None
    level = value.upper()
    if level not in DIST_DEBUG_LEVELS:
        return "fail", (
            f"TORCH_DISTRIBUTED_DEBUG={value!r} is not OFF, INFO or DETAIL: `import torch.distributed` raises "
            "'The value of TORCH_DISTRIBUTED_DEBUG must be OFF, INFO, or DETAIL.' on every rank"
        )
    if level == "DETAIL":
        return "warn", (
            "TORCH_DISTRIBUTED_DEBUG=DETAIL wraps every process group in a checker "
            "that runs extra collectives to compare each collective's shapes across "
            "ranks, and turns on desync debugging and per-iteration DDP statistics"
        )
    return None  # OFF; INFO only logs once at DDP construction


def _startup_switches(env: dict) -> list[tuple[str, str, str]]:
    """Settings that cost start-up time or memory rather than speed per step (reported as info)."""
    found = []
    loading = env.get("CUDA_MODULE_LOADING")
    if loading is not None and loading.strip().upper() == "EAGER":
        found.append(
            (
                "CUDA_MODULE_LOADING",
                loading,
                "CUDA loads every kernel of torch's libraries when the context is created (torch sets LAZY when "
                "unset): slower start-up and more GPU memory per process",
            )
        )
    return found


@check(
    id="GD-ALLOC-006",
    name="cuda-debug-tool-attached",
    category="allocator",
    title="No profiler, sanitizer or debug switch that slows training",
    needs=["env"],
    scope="job",
    what="Looks for tools that hook every CUDA call: a CUDA_INJECTION64_PATH injection library (Nsight, "
    "CUPTI tools), profiler or sanitizer libraries in LD_PRELOAD, TORCH_CUDA_SANITIZER, and cuDNN/cuBLAS API "
    "logging (CUDNN_LOGINFO_DBG=1, CUDNN_LOGLEVEL_DBG>=3, CUBLAS_LOGINFO_DBG=1, CUBLASLT_LOG_LEVEL>=2); "
    "TORCH_DISTRIBUTED_DEBUG=DETAIL (a value other than OFF/INFO/DETAIL, in any case, makes `import "
    "torch.distributed` raise); CUDA_MODULE_LOADING=EAGER (info). NCCL's debug variables are judged by the "
    "nccl checks.",
    why="Each of these is right for a profiling or debugging session and wrong for a long training run: "
    "they add per-call overhead (sanitizers by orders of magnitude) and logging can fill the disk. "
    "TORCH_DISTRIBUTED_DEBUG=DETAIL adds consistency-checking collectives to every collective.",
    fix="Unset the variables for production runs; profile a short run separately (`nsys profile -d 60 ...`).",
)
def cuda_debug_tool_attached(facts, ctx):
    env = job_env(facts, ctx)
    found = _debug_switches(env)
    dist = _dist_debug_problem(env)
    startup = _startup_switches(env)
    if dist:
        found.append(("TORCH_DISTRIBUTED_DEBUG", env["TORCH_DISTRIBUTED_DEBUG"], dist[1]))
    if not found and not startup:
        return passed("no profiler, sanitizer, API logging or distributed debug switch set")
    every = found + startup
    names = sorted({v for v, _, _ in every})
    plain = [n for n in names if n != "LD_PRELOAD"]
    if "LD_PRELOAD" in names:
        fix = manual(
            "Remove the tool library from LD_PRELOAD" + (f" and unset {' '.join(plain)}" if plain else ""),
            *[f"unset {n}" for n in plain],
        )
    else:
        fix = Fix("unset " + " ".join(plain), Safety.SAFE, tuple(Action(ActionKind.UNSET_ENV, n) for n in plain))
    switches = {var: value for var, value, _ in every}
    text = "; ".join(
        f"{what} ({var}={value!r})" if var != "TORCH_DISTRIBUTED_DEBUG" else what for var, value, what in every
    )
    if dist and dist[0] == "fail":
        return fail(text, fix, switches=switches)
    if found:
        return warn(text + " - this slows training", fix, switches=switches)
    return info(text, fix, switches=switches)


# ---------------------------------------------------------------- GD-ALLOC-007 (issue 13)

EXPANDABLE_IGNORES_SPLIT_SINCE = (2, 3)  # pytorch#120022: expandable segments ignore max_split_size


@check(
    id="GD-ALLOC-007",
    scope="job",
    name="max-split-with-expandable-segments",
    category="allocator",
    title="max_split_size_mb is not combined with expandable_segments",
    needs=NEEDS,
    what="Looks for max_split_size_mb and expandable_segments:True together in the allocator variable torch reads.",
    why="The two are alternative cures for fragmentation. Before torch 2.3 the combination crashed with "
    "'!block->expandable_segment_ INTERNAL ASSERT FAILED' when cached memory was released (pytorch#119452, fixed by "
    "#120022, which makes expandable segments ignore max_split_size). Since then max_split_size_mb does nothing for "
    "expandable segments, yet its oversize rules still apply to their free blocks and can make reserved memory grow "
    "until the GPU is full (pytorch#123548).",
    fix="Keep one: expandable_segments:True alone (usually the better choice), or max_split_size_mb alone.",
)
def max_split_with_expandable_segments(facts, ctx):
    env = job_env(facts, ctx)
    tv = _torch_version(facts)
    chosen = allocconf.effective_variable(env, tv)
    names = (
        list(chosen.candidates)
        if chosen.version_known
        else [n for n in (allocconf.UNIFIED_VAR, allocconf.LEGACY_VAR) if n in env]
    )
    for name in names:
        conf = allocconf.parse_alloc_conf(env[name], tv, variable=name)
        settings = conf.settings
        if "max_split_size_mb" not in settings or str(settings.get("expandable_segments")) != "True":
            continue
        keep = ",".join(f"{k}:{v}" for k, v in settings.items() if k != "max_split_size_mb" and isinstance(v, str))
        fix = (
            set_env(name, keep, title="Drop max_split_size_mb (expandable segments ignore it)")
            if keep
            else unset_env(name)
        )
        evidence = {"variable": name, "value": env[name], "torch": _version_text(tv)}
        if tv and tuple(tv[:2]) < EXPANDABLE_IGNORES_SPLIT_SINCE:
            return warn(
                f"{name}={env[name]!r}: torch {_version_text(tv)} can crash with 'INTERNAL ASSERT FAILED' "
                "(expandable_segment_) when it frees cached memory with both set (pytorch#119452)",
                fix,
                **evidence,
            )
        return warn(
            f"{name}={env[name]!r}: max_split_size_mb does not apply to expandable segments, and the two together "
            "can grow reserved memory until the GPU is full (pytorch#123548)",
            fix,
            **evidence,
        )
    return passed("max_split_size_mb and expandable_segments are not combined", variables=names)
