"""Facts: what the probes saw, as plain JSON-serialisable data (schema gpudoctor.facts/1).

A fact section is a dict. A section that was not probed is absent; a probe that
failed leaves {"error": "..."} so checks can say why they cannot judge.
docs/facts.md describes every section and field.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpudoctor.redact import is_credential_name, redact_value
from gpudoctor.sanitize import json_text

SCHEMA = "gpudoctor.facts/1"

SECTIONS = (
    "host",
    "nvidia",
    "torch_meta",
    "torch",
    "libraries",
    "env",
    "network",
    "rendezvous",
    "slurm",
    "kernel",
    "pci",
    "job",  # not probed: built by gpudoctor/job (check --job, compare) from every rank's facts
    "cluster",  # the partition a batch script runs in and its node types (probe/cluster.py)
)

# Environment variables worth collecting: exact names and prefixes.
ENV_PREFIXES = (
    "CUDA_",
    "NCCL_",
    "PYTORCH_",
    "TORCH_",
    "TORCHELASTIC_",
    "OMP_",
    "MKL_",
    "SLURM_",
    "SRUN_",
    "SBATCH_",
    "MASTER_",
    "NVIDIA_",
    "CUDNN_",
    "CUBLAS_",
    "CUBLASLT_",  # cuBLASLt logging (CUBLASLT_LOG_LEVEL)
    "GLOO_",
    "UCX_",
    "FI_",
    "PL_",
    "LIGHTNING_",
    "ACCELERATE_",
    "DEEPSPEED_",
    "HF_",
    "KMP_",
    "GPUDOCTOR_",
    # families that slow or break training, collected so that checks and reports can name them
    "KINETO_",  # the profiler's CUPTI settings (KINETO_USE_DAEMON, KINETO_LOG_LEVEL)
    "TORCHINDUCTOR_",  # torch.compile: cache dirs, autotuning, compile threads
    "TORCHDYNAMO_",
    "TRITON_",  # Triton kernel cache and debug switches
    "NVTE_",  # Transformer Engine (fused attention, FP8)
    "NVSHMEM_",
    "CUDNN_FRONTEND_",
    "MALLOC_",  # glibc allocator arenas (MALLOC_ARENA_MAX)
    "OMPI_",  # Open MPI launcher and MCA settings
    "PMIX_",
    "XLA_",
)
ENV_NAMES = frozenset(
    {
        "RANK",
        "LOCAL_RANK",
        "GROUP_RANK",
        "NODE_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "LD_LIBRARY_PATH",
        "LD_PRELOAD",
        "PATH",
        "PYTHONPATH",
        "CONDA_PREFIX",
        "VIRTUAL_ENV",
        "HOSTNAME",
    }
)


def collectable_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The allow-listed, non-credential part of an environment, with credentials in URLs blanked."""
    source: Mapping[str, str] = os.environ if environ is None else environ
    return {
        k: redact_value(v)
        for k, v in sorted(source.items())
        if (k in ENV_NAMES or k.startswith(ENV_PREFIXES)) and not is_credential_name(k)
    }


_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _without_lone_surrogates(value):
    """value with each string's lone surrogates written as \\udXXX text (json.loads has already joined pairs)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_without_lone_surrogates(k): _without_lone_surrogates(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_lone_surrogates(v) for v in value]
    return value


class SnapshotError(ValueError):
    """A snapshot file that cannot be used: reported as one line, exit 2."""


@dataclass
class Facts:
    sections: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    # Typed views: each returns the section dict, {} when it was not probed.
    @property
    def host(self) -> dict:
        return self.sections.get("host") or {}

    @property
    def nvidia(self) -> dict:
        return self.sections.get("nvidia") or {}

    @property
    def torch(self) -> dict:
        return self.sections.get("torch") or {}

    @property
    def torch_meta(self) -> dict:
        return self.sections.get("torch_meta") or {}

    @property
    def libraries(self) -> dict:
        return self.sections.get("libraries") or {}

    @property
    def network(self) -> dict:
        return self.sections.get("network") or {}

    @property
    def slurm(self) -> dict:
        return self.sections.get("slurm") or {}

    @property
    def kernel(self) -> dict:
        return self.sections.get("kernel") or {}

    @property
    def pci(self) -> dict:
        return self.sections.get("pci") or {}

    @property
    def cluster(self) -> dict:
        return self.sections.get("cluster") or {}

    @property
    def env(self) -> dict[str, str]:
        return (self.sections.get("env") or {}).get("vars", {})

    @property
    def gpus(self) -> list[dict]:
        return self.nvidia.get("gpus") or []

    def has(self, section: str) -> bool:
        return section in self.sections

    def error(self, section: str) -> str | None:
        s = self.sections.get(section)
        return s.get("error") if isinstance(s, dict) else None

    def torch_version(self) -> str | None:
        """torch's version from the import probe, else from package metadata."""
        return self.torch.get("version") or self.torch_meta.get("version")

    def to_dict(self) -> dict:
        return {"schema": SCHEMA, **self.meta, **{k: self.sections[k] for k in SECTIONS if k in self.sections}}

    @classmethod
    def from_dict(cls, data: Any, source: str = "snapshot") -> Facts:
        if not isinstance(data, dict):
            raise SnapshotError(f"{source}: not a gpudoctor facts object")
        schema = data.get("schema")
        if schema != SCHEMA:
            raise SnapshotError(f"{source}: schema is {schema!r}, expected {SCHEMA!r}")
        sections = {}
        for k in SECTIONS:
            if k in data:
                if not isinstance(data[k], dict):
                    raise SnapshotError(f"{source}: section {k!r} is not an object")
                sections[k] = data[k]
        meta = {k: v for k, v in data.items() if k not in SECTIONS and k != "schema"}
        return cls(sections=sections, meta=meta)

    def dump(self, path: str | None = None) -> str:
        text = json_text(self.to_dict(), indent=2, sort_keys=False) + "\n"
        if path:
            from gpudoctor.fileio import write_output

            write_output(path, text, what="-o")
        return text

    @classmethod
    def load(cls, path: str, what: str = "--snapshot") -> Facts:
        """what: the option that named the file, for the one-line error (--node-snapshot, compare's FILE...)."""
        from gpudoctor.fileio import FileIOError, read_input

        try:
            text = read_input(path, what)
            data = json.loads(text)
            if _SURROGATE_ESCAPE.search(text):  # "\ud800" alone: a str no output stream can encode
                data = _without_lone_surrogates(data)
        except FileIOError as e:
            raise SnapshotError(str(e).replace(": no such file", ": no such snapshot file")) from None
        except json.JSONDecodeError as e:
            raise SnapshotError(f"{path}: corrupt snapshot, not JSON (line {e.lineno}: {e.msg})") from None
        except RecursionError:
            raise SnapshotError(f"{path}: corrupt snapshot, nested too deeply to read") from None
        except ValueError as e:  # valid JSON Python cannot hold: an integer of 5000 digits
            raise SnapshotError(f"{path}: corrupt snapshot ({str(e).split(';')[0]})") from None
        facts = cls.from_dict(data, source=path)
        # Checks trust the contract's types; a file that breaks it is refused, not half-judged.
        from gpudoctor.factschema import first_problem

        problem = first_problem(data)
        if problem is not None:
            raise SnapshotError(f"{path}: corrupt snapshot, does not follow {SCHEMA} at {problem}")
        return facts
