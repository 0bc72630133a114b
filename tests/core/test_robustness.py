"""Robustness: messy environments, configs, batch scripts and snapshots never crash gpudoctor.

A check that raises becomes an `error` finding: a bug in gpudoctor, and a run that judged nothing.
A parser that raises anything but its own *Error becomes exit 3 or a traceback instead of one
clear line and exit 2. Hypothesis feeds every check (over every facts fixture) and every parser
malformed values: empty, blank, negative, huge, unicode, SLURM's compressed forms half-written,
UUID prefixes, wrong types in configs, random script text and bytes.

Bounded for CI: deterministic examples, a few hundred per test (under a minute in all).
GPUDOCTOR_FUZZ_EXAMPLES=5000 runs that many random (not derandomized) examples per test.
"""

from __future__ import annotations

import copy
import datetime
import json
import os
import re
import string
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpudoctor import factschema
from gpudoctor.facts import Facts, SnapshotError, collectable_env
from gpudoctor.model import Context, Severity
from gpudoctor.readers import allocconf, cudavis, dlconfig, slurmfmt
from gpudoctor.readers.sbatch import SbatchError, load_sbatch, parse_sbatch
from gpudoctor.readers.trainconfig import ConfigError, load_config
from gpudoctor.registry import load_all
from gpudoctor.report import json_report, junit
from gpudoctor.runner import run_checks
from tests.cliutil import run_gpudoctor_here
from tests.factsutil import FIXTURES, load_fixture

ROOT = Path(__file__).resolve().parents[2]
SPECS = list(load_all().values())
FIXTURE_NAMES = sorted(p.stem for p in (FIXTURES / "facts").glob("*.json"))
_DEEP = int(os.environ.get("GPUDOCTOR_FUZZ_EXAMPLES", "0"))


def fuzz(examples: int):
    """Hypothesis settings: the suite runs `examples` fixed (derandomized) cases; GPUDOCTOR_FUZZ_EXAMPLES=N runs N
    random ones (a deeper search than the suite's time allows, e.g. before a release)."""
    return settings(
        max_examples=_DEEP or examples,
        deadline=None,
        database=None,
        derandomize=not _DEEP,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    )


# ---------------------------------------------------------------- what users' environments hold


def _env_names_read() -> list[str]:
    """Every variable name the checks and core modules spell out that a snapshot can hold."""
    text = "".join(p.read_text() for d in ("checks", "gpudoctor") for p in sorted((ROOT / d).glob("*.py")))
    quoted = set(re.findall(r"""["']([A-Z][A-Z0-9_]*[A-Z0-9])["']""", text))
    return sorted(collectable_env({n: "" for n in quoted}))


ENV_NAMES = _env_names_read()

MALFORMED = [
    "",
    " ",
    "\t",
    "\n",
    "-1",
    "-0",
    "0",
    "1",
    "2",
    "8",
    "00",
    "+3",
    "007",
    "1e9",
    "1.5",
    "nan",
    "inf",
    "-inf",
    "99999999999999999999999",
    "2147483648",
    "100000",
    "0x10",
    "1 2",
    "1,",
    ",1",
    ",",
    ",,",
    ":",
    "::",
    "=",
    "é",
    "ü,ö",
    "０",
    "٣",
    "\u200b",
    "🙂",
    "(x3)",
    "2(x3),1",
    "2(x0)",
    "8(x100000)",
    "1(x99999999)",
    "(x)",
    "gpu[",
    "gpu[01-",
    "gpu[3-1]",
    "a[1-99999]b[1-99999]",
    "n[0-99999999999]",
    "0,0",
    "0,,1",
    "0-3",
    "3-0",
    "0-99999999",
    "GPU-",
    "MIG-",
    "GPU-abc,0",
    "MIG-GPU-x/1/2",
    "MIG-GPU-/0/0",
    " GPU-1",
    "all",
    "none",
    "void",
    "NoDevFiles",
    "True",
    "false",
    "yes",
    "OFF",
    "INFO",
    "WARN",
    "TRACE",
    "^eth0",
    "=eth0",
    "^=eth,",
    "ib0:1",
    "mlx5_0:1,mlx5_1",
    "^mlx5",
    "gpu:h100:8",
    "gpu:0",
    "h100:",
    "gpu:a100:2(IDX:0-1)",
    "gpu(IDX:",
    "gpu:99999999999",
    "$HOME",
    "${X}",
    "$(hostname)",
    "a=b",
    "max_split_size_mb:",
    "max_split_size_mb:0",
    "expandable_segments:true,",
    "backend:x",
    "roundup_power2_divisions:[",
    "roundup_power2_divisions:[256:x,>:0]",
    "[",
    "]",
    "[1:2",
    "%h.%p",
    "/nonexistent",
    "LOC",
    "SYS",
    "NVL",
    "PIX",
    "AF_INET",
    "AF_INET6",
    "12.4",
    "2.0",
    "-",
    "--",
    "x" * 300,
]
_SEPARATORS = st.sampled_from([",", ":", " ", "(x", "-", "[", "]"])
malformed = st.one_of(
    st.sampled_from(MALFORMED),
    st.text(max_size=12),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.lists(st.sampled_from(MALFORMED), min_size=2, max_size=4).flatmap(
        lambda parts: _SEPARATORS.map(lambda sep: sep.join(parts))
    ),
)
# Also names no check spells out: the NCCL and launcher checks look at every NCCL_* / TORCH_NCCL_* / PL_* name.
env_name = st.one_of(
    st.sampled_from(ENV_NAMES),
    st.tuples(
        st.sampled_from(["NCCL_", "TORCH_NCCL_", "PL_", "CUDA_", "SLURM_"]),
        st.text(string.ascii_uppercase + "_", min_size=1, max_size=8),
    ).map("".join),
)
env_vars = st.dictionaries(env_name, malformed, max_size=12)
fixture_name = st.sampled_from(FIXTURE_NAMES)
launcher = st.sampled_from([None, "torchrun", "lightning", "srun", "accelerate", "deepspeed", "python"])
expect_gpus = st.one_of(st.sampled_from([None, 0, 1, 8]), st.integers(min_value=0, max_value=10**12))


def facts_with(name: str, env: dict) -> Facts:
    """A fixture with these variables set on top of its own."""
    data = load_fixture(name)  # parsed afresh on each call: an object of its own, no copy needed
    if isinstance(data.get("env"), dict) and "error" not in data["env"]:
        data["env"].setdefault("vars", {}).update(env)
    return Facts.from_dict(data)


def assert_no_check_crashes(facts: Facts, ctx: Context) -> None:
    findings = run_checks(SPECS, facts, ctx)
    crashed = [f"{f.id}: {f.message} at {f.evidence.get('where')}" for f in findings if f.severity is Severity.ERROR]
    assert not crashed, "\n".join(crashed)
    # and the reports can carry whatever the findings quote
    json.loads(json_report.document(findings))
    ET.fromstring(junit.document(findings).split("\n", 1)[1])


@fuzz(200)
@given(fixture_name, env_vars, expect_gpus, launcher)
def test_no_check_crashes_on_malformed_environment_values(name, env, gpus, how):
    assert_no_check_crashes(facts_with(name, env), Context(expect_gpus=gpus, launcher=how))


# ---------------------------------------------------------------- training configs of every shape

CONFIG_KEYS = sorted(
    {
        k
        for table in (dlconfig.INT_SETTINGS, dlconfig.BOOL_SETTINGS, dlconfig.TEXT_SETTINGS)
        for keys in table.values()
        for k in keys
    }
    | {
        "train_batch_size",
        "zero_optimization",
        "precision",
        "mixed_precision",
        "bf16",
        "fp16",
        "dtype",
        "amp",
        "trainer",
        "data",
        "dataloader",
        "train_dataloader",
        "val",
        "test",
        "params",
        "init_args",
        "loader",
        "ray",
        "scaling_config",
        "devices",
        "num_nodes",
        "accelerator",
        "strategy",
        "_target_",
        "class_path",
    }
)
CONFIG_SCALARS = [
    None,
    True,
    False,
    0,
    1,
    -1,
    4,
    2**70,
    -(2**70),
    1.5,
    4.0,
    float("nan"),
    float("inf"),
    "",
    "four",
    "8",
    " 8 ",
    "-3",
    "true",
    "bf16",
    "16-mixed",
    "bf16-mixed",
    "32",
    "auto",
    "gpu",
    "${data.workers}",
    "${.num_workers}",
    "${..x}",
    "${...}",
    "${}",
    "${oc.env:NUM_W,4}",
    "${oc.env:NUM_W}",
    "${env:X,}",
    "${num_workers}",
    "${batch_size}",
    "${a.0.b}",
    "${oc.decode:1}",
    "${ x }",
    "${data.0}",
    "${data}",
    "${trainer.devices}",
    datetime.date(2024, 1, 1),
    datetime.datetime(2024, 1, 1, 12),
    b"\x00\xff",
    frozenset({"a"}),
    "é",
    "torch.utils.data.DistributedSampler",
]
config_key = st.one_of(st.sampled_from(CONFIG_KEYS), st.sampled_from([1, None, True, 2.5, "x.y", "", "0"]))
config_value = st.recursive(
    st.one_of(st.sampled_from(CONFIG_SCALARS), malformed),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(config_key, inner, max_size=5)),
    max_leaves=25,
)
configs = st.dictionaries(config_key, config_value, max_size=6)


@fuzz(150)
@given(fixture_name, configs, st.dictionaries(st.sampled_from(ENV_NAMES), malformed, max_size=3), expect_gpus, launcher)
def test_no_check_crashes_on_malformed_training_configs(name, config, env, gpus, how):
    ctx = Context(expect_gpus=gpus, launcher=how, config=config, config_path="train.yaml")
    assert_no_check_crashes(facts_with(name, env), ctx)


def test_no_check_crashes_on_a_config_nested_as_deep_as_json_allows():
    deep: object = {"num_workers": 4}
    for _ in range(900):
        deep = {"data": deep}
    config = json.loads(json.dumps(deep))
    assert_no_check_crashes(facts_with(FIXTURE_NAMES[0], {}), Context(config=config, config_path="deep.json"))


# ---------------------------------------------------------------- batch scripts

DIRECTIVES = [
    "--nodes=",
    "-N ",
    "--ntasks=",
    "-n ",
    "--ntasks-per-node=",
    "--tasks-per-node ",
    "--gres=",
    "--gpus=",
    "-G ",
    "--gpus-per-node=",
    "--gpus-per-task=",
    "--cpus-per-task=",
    "-c ",
    "--job-name=",
    "-J ",
    "--mem=",
    "--ntasks-per-gpu=",
    "--gpu-bind=",
    "--export=",
    "--exclusive",
    "--ntasks-per-n=",
    "--nonsense=",
]
GOOD_VALUES = [
    "1",
    "2",
    "8",
    "16",
    "0",
    "00",
    "2-4",
    "gpu:8",
    "gpu:h100:4",
    "h100:2",
    "gpu",
    "none",
    "train",
    "bash",
    "gpu:a100:2(IDX:0-1)",
    "99999999999",
    "100000",
    "closest",
    "ALL",
]
COMMANDS = [
    "srun python train.py",
    "srun torchrun --nproc-per-node={v} train.py",
    "torchrun --nproc_per_node={v} --nnodes={v} t.py",
    "python -m torch.distributed.launch --nproc_per_node={v} t.py",
    "python -m torch.distributed.run --standalone t.py",
    "accelerate launch --num_processes {v} --num_machines {v} t.py",
    "deepspeed --num_gpus {v} t.py",
    "python train.py trainer.devices={v} trainer.num_nodes={v}",
    "srun python t.py --trainer.devices {v}",
    "export CUDA_VISIBLE_DEVICES={v}",
    "export WORLD_SIZE={v} LOCAL_WORLD_SIZE={v}",
    "unset CUDA_VISIBLE_DEVICES",
    "X={v}",
    "srun -n {v} -c {v} --gpus-per-task={v} python t.py",
    "srun -N {v} --ntasks-per-node={v} --gres={v} torchrun t.py",
    "lightning run model --devices={v} --num-nodes={v} t.py",
    "fabric run --devices={v} t.py",
    "srun gpudoctor check",
    "export SRUN_CPUS_PER_TASK={v}",
    "export NCCL_DEBUG={v}",
    "export OMP_NUM_THREADS={v}",
    "export PYTORCH_CUDA_ALLOC_CONF={v}",
    "echo hi",
    "cat <<EOF",
    "'unclosed",
    "srun",
    "srun --",
    "srun -n",
    "exec srun python t.py",
    "env A=1 srun python t.py",
    "srun python -c 'x'",
    "#SBATCH --gres={v}",
    "$(hostname)",
    "srun ${X} python t.py",
    "srun apptainer exec --nv img.sif torchrun --nproc-per-node={v} t.py",
    "uv run python t.py",
    "conda run -n x python t.py",
    "python - <<'PY'",
    "srun --ntasks=1 torchrun --nnodes=$SLURM_NNODES t.py",
]
script_value = st.one_of(
    st.sampled_from(GOOD_VALUES),
    malformed.map(lambda v: v.replace("\n", " ")),
    st.sampled_from(["$SLURM_NTASKS", "${SLURM_GPUS_ON_NODE}", "${X:-4}", "$((1+1))"]),
)
directive_line = st.tuples(st.sampled_from(DIRECTIVES), script_value).map(
    lambda t: "#SBATCH " + t[0] + ("" if t[0] == "--exclusive" else t[1])
)
command_line = st.tuples(st.sampled_from(COMMANDS), script_value).map(lambda t: t[0].replace("{v}", t[1]))
scripts = st.tuples(
    st.booleans(),
    st.lists(directive_line, max_size=8),
    st.lists(st.one_of(command_line, malformed), max_size=6),
    st.booleans(),
).map(lambda t: ("#!/bin/bash\n" if t[0] else "") + "\n".join(t[1] + t[2]) + ("\\" if t[3] else "\n"))


def parsed_or_none(text: str) -> dict | None:
    try:
        return parse_sbatch(text, "job.slurm")
    except SbatchError:
        return None  # sbatch would refuse it too: exit 2 through the CLI


@fuzz(200)
@given(
    fixture_name,
    scripts,
    st.dictionaries(st.sampled_from(ENV_NAMES), malformed, max_size=3),
    expect_gpus,
    launcher,
    st.one_of(st.none(), configs),
)
def test_no_check_crashes_on_any_batch_script(name, text, env, gpus, how, config):
    sb = parsed_or_none(text)
    ctx = Context(
        expect_gpus=gpus,
        launcher=how,
        config=config,
        config_path="train.yaml",
        sbatch=sb,
        sbatch_path="job.slurm" if sb else None,
    )
    assert_no_check_crashes(facts_with(name, env), ctx)


# ---------------------------------------------------------------- snapshots: the contract is the line


def _paths(node, path=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield path + (k,)
            yield from _paths(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield path + (i,)
            yield from _paths(v, path + (i,))


ODD_VALUES = [
    None,
    True,
    False,
    0,
    1,
    -1,
    3,
    8,
    2**31,
    2**64,
    -(2**40),
    0.5,
    -2.5,
    1e300,
    "",
    " ",
    "x",
    "0",
    "-1",
    "12",
    "12.4",
    "2.13",
    "550.54.15",
    "N/A",
    "[Not Supported]",
    "é",
    [],
    [0],
    [12, 4],
    [2, 20, 5],
    ["a"],
    {},
    {"error": "boom"},
]


@st.composite
def mutated_snapshots(draw):
    """A fixture with a few values replaced (same type mostly, any type sometimes) or keys removed."""
    data = load_fixture(draw(fixture_name))  # parsed afresh: this example's own object
    for _ in range(draw(st.integers(1, 4))):
        paths = [p for p in _paths(data) if p[0] != "schema"]
        path = draw(st.sampled_from(paths))
        parent = data
        for k in path[:-1]:
            parent = parent[k]
        current = parent[path[-1]]
        if draw(st.integers(0, 3)) == 0:
            del parent[path[-1]]
            continue
        if isinstance(current, bool):
            new = not current
        elif isinstance(current, int) and draw(st.booleans()):
            new = draw(st.sampled_from([0, -1, 1, 2, 8, 2**31, 2**64, current * 2, current // 2]))
        elif isinstance(current, str) and draw(st.booleans()):
            new = draw(st.sampled_from(["", " ", "x", "0", "12.4", "é", "N/A", current[:2], current + "x"]))
        elif isinstance(current, list) and draw(st.booleans()):
            new = draw(st.sampled_from([[], current[:1], current[::-1], current * 2]))
        else:
            new = copy.deepcopy(draw(st.sampled_from(ODD_VALUES)))
        parent[path[-1]] = new
    return data


VALIDATOR = jsonschema.Draft202012Validator(factschema.load_schema())


@fuzz(200)
@given(mutated_snapshots(), expect_gpus, launcher)
def test_a_snapshot_the_contract_accepts_never_crashes_a_check(data, gpus, how):
    """`check --snapshot` refuses a file that breaks the schema (exit 2); what it accepts, every check can judge."""
    if factschema.first_problem(data) is not None:
        return
    assert_no_check_crashes(Facts.from_dict(data), Context(expect_gpus=gpus, launcher=how))


@fuzz(150)
@given(mutated_snapshots())
def test_the_snapshot_validator_agrees_with_jsonschema(data):
    problem = factschema.first_problem(data)
    assert (problem is None) == VALIDATOR.is_valid(data), (
        problem or [e.message for e in VALIDATOR.iter_errors(data)][:3]
    )


def test_the_schema_uses_only_keywords_the_validator_reads():
    seen = set()

    def walk(node, key=None):
        if isinstance(node, dict):
            if key not in ("properties", "$defs"):  # there the keys are names, not keywords
                seen.update(node)
            for k, v in node.items():
                walk(v, k)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(factschema.load_schema())
    assert seen <= factschema.KEYWORDS | factschema.ANNOTATIONS, seen - factschema.KEYWORDS - factschema.ANNOTATIONS


def test_the_packaged_schema_is_the_documented_one():
    packaged = (ROOT / "gpudoctor" / factschema.SCHEMA_FILE).read_text()
    assert (ROOT / "docs" / "facts.schema.json").read_text() == packaged


@pytest.mark.parametrize(
    "patch, where",
    [
        ({"nvidia": {"available": True, "gpus": "eight"}}, "nvidia"),
        ({"env": {"vars": ["CUDA_VISIBLE_DEVICES"]}}, "env.vars"),
        ({"env": {"vars": {"OMP_NUM_THREADS": 8}}}, "env.vars.OMP_NUM_THREADS"),
        ({"torch": {"status": "ok", "version": "2.4.0", "cuda": "twelve"}}, "torch"),
        ({"nvidia": {"available": False, "error": "NVML: gone", "gpus": [{"index": 0}]}}, "nvidia.gpus"),
    ],
)
def test_a_corrupt_snapshot_is_refused_with_one_line(tmp_path, patch, where):
    data = load_fixture(FIXTURE_NAMES[-1])
    data.update(patch)
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(data))
    with pytest.raises(SnapshotError, match=rf"does not follow gpudoctor.facts/1 at {re.escape(where)}"):
        Facts.load(str(path))


def test_every_fixture_loads_as_a_snapshot():
    for name in FIXTURE_NAMES:
        Facts.load(str(FIXTURES / "facts" / f"{name}.json"))


@pytest.mark.parametrize(
    "text, words",
    [("[" * 100_000 + "]" * 100_000, "nested too deeply"), ('{"schema": ' + "1" * 5000 + "}", "digits")],
)
def test_json_python_cannot_hold_is_a_corrupt_snapshot(tmp_path, text, words):
    path = tmp_path / "snap.json"
    path.write_text(text)
    with pytest.raises(SnapshotError, match=words):
        Facts.load(str(path))


# ---------------------------------------------------------------- the parsers on their own

slurm_text = st.one_of(malformed, st.text(alphabet="0123456789,-()[]x:gpuIDXabc ", max_size=20))


@fuzz(150)
@given(slurm_text)
def test_slurm_formats_raise_only_their_own_error(text):
    for parse in (slurmfmt.parse_tasks_per_node, slurmfmt.expand_nodelist, slurmfmt.parse_index_list):
        try:
            assert len(parse(text)) <= slurmfmt.MAX_EXPANSION
        except slurmfmt.SlurmFormatError:
            pass
    for parse in (slurmfmt.parse_int, slurmfmt.parse_gres, slurmfmt.parse_gpus, slurmfmt.split_top_level):
        try:
            parse(text)
        except slurmfmt.SlurmFormatError:
            pass
    for name in ("SLURM_JOB_GPUS", "SLURM_STEP_GPUS", "SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE", "SLURM_GPUS"):
        try:
            slurmfmt.parse_gpu_env(name, text)
        except slurmfmt.SlurmFormatError:
            pass


@pytest.mark.parametrize(
    "parse, text",
    [
        (slurmfmt.parse_tasks_per_node, "1(x99999999999999999999)"),  # was OverflowError
        (slurmfmt.parse_tasks_per_node, "8(x1000000000)"),  # was an 8 GB list
        (slurmfmt.parse_index_list, "0-99999999999999999999"),  # was OverflowError
        (slurmfmt.parse_index_list, "0-1000000000"),  # was a billion-element list
        (slurmfmt.expand_nodelist, "r[1-99999]n[1-99999]"),  # was ten billion host names
        (slurmfmt.expand_nodelist, "a[1-99999],b[1-99999]"),
        (slurmfmt.parse_gres, "gpu:8(IDX:0-99999999999)"),
    ],
)
def test_implausibly_large_slurm_values_are_format_errors(parse, text):
    # past INT_MAX SLURM itself refuses the number (issue 24); below it, the expansion's size is refused
    with pytest.raises(slurmfmt.SlurmFormatError, match="implausibly large|SLURM refuses a value above"):
        parse(text)


def test_slurm_values_at_the_limit_still_expand():
    assert len(slurmfmt.parse_tasks_per_node(f"8(x{slurmfmt.MAX_EXPANSION})")) == slurmfmt.MAX_EXPANSION
    assert len(slurmfmt.expand_nodelist(f"n[1-{slurmfmt.MAX_EXPANSION}]")) == slurmfmt.MAX_EXPANSION


def _fixture_gpu_lists() -> list:
    lists = [None, []]
    for name in FIXTURE_NAMES:
        nv = load_fixture(name).get("nvidia") or {}
        if nv.get("available"):
            lists.append(nv["gpus"])
    return lists


@fuzz(200)
@given(
    st.one_of(
        st.none(),
        malformed,
        st.lists(st.sampled_from(["0", "1", "7", "GPU-", "MIG-", " 2", "-1", "", "1gpu"]), max_size=5).map(",".join),
    ),
    st.sampled_from(_fixture_gpu_lists()),
)
def test_cuda_visible_devices_parses_anything(value, gpus):
    vis = cudavis.parse_visible_devices(value, gpus)
    assert vis.count is None or 0 <= vis.count <= max(len(vis.entries), len(gpus or []))
    assert vis.describe() and isinstance(vis.problems, tuple) and isinstance(vis.notes, tuple)
    assert vis.hides_all in (True, False) and vis.mixed_forms in (True, False)


@fuzz(200)
@given(
    st.one_of(
        malformed,
        st.lists(st.sampled_from(sorted(allocconf.KEYS) + ["x", "backend", ""]), max_size=3).flatmap(
            lambda keys: st.lists(malformed, min_size=len(keys), max_size=len(keys)).map(
                lambda vals: ",".join(f"{k}:{v}" for k, v in zip(keys, vals, strict=True))
            )
        ),
    ),
    st.one_of(st.none(), st.tuples(st.integers(0, 3), st.integers(0, 20))),
)
def test_allocator_conf_parses_anything(text, version):
    conf = allocconf.parse_alloc_conf(text, version)
    assert conf.ok == (not conf.errors) and isinstance(conf.settings, dict)
    fixed = allocconf.suggest_correction(text, version)
    assert fixed is None or allocconf.parse_alloc_conf(fixed, version).ok
    allocconf.effective_variable({allocconf.LEGACY_VAR: text, allocconf.UNIFIED_VAR: text[::-1]}, version)


@fuzz(150)
@given(st.one_of(st.none(), configs), st.dictionaries(st.sampled_from(["NUM_W", "X"]), malformed, max_size=2))
def test_dataloader_settings_read_any_config(config, env):
    found = dlconfig.find_settings(config, "train.yaml", env)
    for name in (*dlconfig.INT_SETTINGS, *dlconfig.BOOL_SETTINGS, *dlconfig.TEXT_SETTINGS):
        assert found.describe(name)
        assert (found.where(name) is None) == (name not in found.found)
    json.dumps(found.evidence(), default=str)


@fuzz(60)
@given(st.one_of(configs, st.just({dlconfig.LIVE_KEY: {"num_workers": "x", "batch_size": None}})))
def test_smoke_reads_any_config_or_says_why_not(config):
    from gpudoctor.sample_train.options import OptionsError, loader_from_config

    try:
        loader_from_config(config, "train.yaml")
    except OptionsError:
        pass


@fuzz(200)
@given(st.one_of(scripts, st.text(max_size=200)))
def test_batch_script_text_parses_or_raises_sbatch_error(text):
    parsed_or_none(text)


file_bytes = st.one_of(
    st.binary(max_size=200),
    scripts.map(lambda s: s.encode()),
    st.tuples(scripts, st.binary(max_size=8)).map(lambda t: t[0].encode() + t[1]),
    st.sampled_from(
        [
            b"",
            b"  \n\t\n",
            b"#!/bin/bash\r\n#SBATCH -N 1\r\n",
            b"#!/bin/bash\n\xff\xfe#SBATCH -N 1\n",
            b"\xef\xbb\xbf#!/bin/bash\n",
            b"#SBATCH -N 1\nsrun x\n",
        ]
    ),
)


@fuzz(150)
@given(file_bytes)
def test_batch_script_files_load_or_raise_sbatch_error(tmp_path_factory, content):
    path = tmp_path_factory.mktemp("sb") / "job.slurm"
    path.write_bytes(content)
    try:
        load_sbatch(str(path))
    except SbatchError as e:
        assert "\n" not in str(e)
        return
    assert content.startswith(b"#!") and content.strip()


@pytest.mark.parametrize(
    "content, words",
    [
        (b"", "empty"),
        (b" \n\t\n", "only whitespace"),
        (b"#SBATCH --nodes=1\nsrun python t.py\n", "#!"),
        (b"#!/bin/bash\r\n#SBATCH --nodes=1\r\nsrun python t.py\r\n", "DOS line breaks"),
        (b"\x7fELF\x02\x01\x01\x00\x00", "binary"),
    ],
)
def test_scripts_sbatch_refuses_are_refused(tmp_path, content, words):
    path = tmp_path / "job.slurm"
    path.write_bytes(content)
    with pytest.raises(SbatchError, match=words):
        load_sbatch(str(path))


def test_a_stray_latin1_byte_in_a_comment_does_not_refuse_the_script(tmp_path):
    path = tmp_path / "job.slurm"
    path.write_bytes(b"#!/bin/bash\n# caf\xe9 au lait\n#SBATCH --nodes=1\nsrun python t.py\n")
    assert load_sbatch(str(path)).options == {"nodes": "1"}


@pytest.mark.parametrize(
    "text",
    [
        "#!/bin/bash\n#SBATCH -N 00\n#SBATCH --gpus=2\nsrun python t.py\n",  # was ZeroDivisionError
        "#!/bin/bash\n#SBATCH --nodes=0\n#SBATCH --gpus=8\nsrun python t.py\n",
    ],
)
def test_zero_nodes_with_gpus_is_not_a_crash(text):
    sb = parse_sbatch(text, "job.slurm")
    assert_no_check_crashes(facts_with(FIXTURE_NAMES[0], {}), Context(sbatch=sb, sbatch_path="job.slurm"))


def test_a_huge_node_count_is_a_finding_not_a_crash():
    # was OverflowError in every slurm check: [1] * 99999999999
    sb = parse_sbatch("#!/bin/bash\n#SBATCH --nodes=99999999999\nsrun python t.py\n", "job.slurm")
    assert_no_check_crashes(facts_with(FIXTURE_NAMES[0], {}), Context(sbatch=sb, sbatch_path="job.slurm"))
    sb = parse_sbatch("#!/bin/bash\nsrun -N 99999999999 python t.py\n", "job.slurm")
    assert_no_check_crashes(facts_with(FIXTURE_NAMES[0], {}), Context(sbatch=sb, sbatch_path="job.slurm"))


config_text = st.one_of(
    st.text(max_size=200),
    configs.map(lambda c: json.dumps(c, default=str)),
    st.sampled_from(
        [
            "- a\n- b\n",
            "a: [1, 2\n",
            "a:\n\tb: 1\n",
            "? [a, b]\n: 1\n",
            "a: 1\n---\nb: 2\n",
            "a: &x [*x]\n",
            "a: !!python/object:os.system x\n",
            "a: !!set {x}\nb: !!binary aGk=\nc: 2024-01-01\n",
            "null",
            "42",
            "[" * 5000 + "]" * 5000,
            "num_workers: " + "1" * 5000,
            '{"num_workers": ' + "9" * 5000 + "}",
            '{"a": NaN}',
            "\ufeffnum_workers: 4\n",
            "%YAML 9.9\n---\na: 1\n",
        ]
    ),
)


@fuzz(100)
@given(config_text, st.sampled_from(["train.yaml", "train.yml", "train.json", "train"]), st.booleans())
def test_training_config_files_load_or_raise_config_error(tmp_path_factory, text, filename, garble):
    path = tmp_path_factory.mktemp("cfg") / filename
    path.write_bytes(text.encode("utf-8", "surrogatepass") + (b"\xff\xfe" if garble else b""))
    try:
        config = load_config(str(path))
    except ConfigError as e:
        assert "\n" not in str(e)
        return
    assert isinstance(config, dict)


_LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefg", "bcdefgh", strict=True)
)


@pytest.mark.parametrize(
    "text, words",
    [
        ("a: &x [1, *x]\n", "contains it"),  # was RecursionError in every dataloader check
        ("data: &x {num_workers: 4, loader: *x}\n", "contains it"),
        (_LAUGHS, "more than 1,000,000 values"),  # 9**8 values: gpudoctor check hung
        ("[" * 5000 + "]" * 5000, "nested too deeply"),  # was RecursionError out of load_config
        ("num_workers: " + "1" * 5000 + "\n", "digits"),  # was ValueError out of load_config
    ],
)
def test_configs_no_tree_can_hold_are_config_errors(tmp_path, text, words):
    path = tmp_path / "train.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=words):
        load_config(str(path))


def test_an_anchor_used_twice_is_still_a_config(tmp_path):
    path = tmp_path / "train.yaml"
    path.write_text("loader: &l {num_workers: 4, pin_memory: true}\ntrain_loader: *l\nval_loader: *l\n")
    config = load_config(str(path))
    assert dlconfig.find_settings(config, str(path)).value("num_workers") == 4


# ---------------------------------------------------------------- the command line


def gpudoctor(*args):
    """The CLI's answer (exit code, one line on stderr), run in this process."""
    return run_gpudoctor_here(*args)


def _write(tmp_path, name: str, content) -> str:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return str(path)


def _corrupt_snapshot(tmp_path) -> str:
    data = load_fixture("synthetic-h100x8-healthy")
    data["nvidia"] = {"available": True, "gpus": "eight"}
    return _write(tmp_path, "snap.json", json.dumps(data))


SNAPSHOT = str(FIXTURES / "facts" / "synthetic-h100x8-healthy.json")
BAD_INPUTS = {
    "config-directory": lambda t: ["check", "--snapshot", SNAPSHOT, "--config", str(t)],
    "config-binary": lambda t: ["check", "--snapshot", SNAPSHOT, "--config", _write(t, "c.yaml", b"\x00\xff\xfe\x01")],
    "config-yaml-list": lambda t: ["check", "--snapshot", SNAPSHOT, "--config", _write(t, "c.yaml", "- a\n- b\n")],
    "config-deeply-nested": lambda t: [
        "check",
        "--snapshot",
        SNAPSHOT,
        "--config",
        _write(t, "c.json", "[" * 50000 + "]" * 50000),
    ],
    "sbatch-directory": lambda t: ["check", "--snapshot", SNAPSHOT, "--sbatch", str(t)],
    "sbatch-empty": lambda t: ["check", "--snapshot", SNAPSHOT, "--sbatch", _write(t, "job.slurm", "")],
    "sbatch-binary": lambda t: [
        "check",
        "--snapshot",
        SNAPSHOT,
        "--sbatch",
        _write(t, "job.slurm", b"\x7fELF\x00\x01\xff"),
    ],
    "junit-missing-directory": lambda t: ["check", "--snapshot", SNAPSHOT, "--junit", str(t / "no" / "such" / "j.xml")],
    # the probe before the write is not the test: a --python that answers at once spares the torch import
    "snapshot-output-missing-directory": lambda t: [
        "snapshot",
        "--python",
        "/bin/true",
        "-o",
        str(t / "no" / "such" / "f.json"),
    ],
    "docs-output-missing-directory": lambda t: ["docs", "-o", str(t / "no" / "such" / "checks.md")],
    "snapshot-wrong-types": lambda t: ["check", "--snapshot", _corrupt_snapshot(t)],
    "snapshot-directory": lambda t: ["check", "--snapshot", str(t)],
    "torch-timeout-nan": lambda t: ["snapshot", "--torch-timeout", "nan"],  # was a torch "timeout" after nan s
    "torch-timeout-inf": lambda t: ["check", "--select", "cuda", "--torch-timeout", "inf"],
    "config-recursive-alias": lambda t: [
        "check",
        "--snapshot",
        SNAPSHOT,
        "--config",
        _write(t, "c.yaml", "a: &x [*x]\n"),
    ],
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_and_exit_2(tmp_path, case):
    r = gpudoctor(*BAD_INPUTS[case](tmp_path))
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    # "gpudoctor: ..." from the command, "gpudoctor check: argument ...: ..." from its option parser
    assert re.match(r"gpudoctor( [a-z]+)?: ", lines[0]), lines[0]


def test_odd_yaml_values_still_make_a_json_report(tmp_path):
    config = _write(
        tmp_path,
        "c.yaml",
        "dataloader:\n  num_workers: 2024-01-01\n  pin_memory: !!binary aGk=\n  batch_size: !!set {a}\n",
    )
    r = gpudoctor("check", "--snapshot", SNAPSHOT, "--config", config, "--select", "dataloader", "--json")
    assert r.returncode in (0, 1), r.stderr  # was exit 3: "Object of type set is not JSON serializable"
    findings = json.loads(r.stdout)["findings"]
    assert not [f for f in findings if f["severity"] == "error"]
