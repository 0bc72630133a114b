"""gpudoctor.audit_dataloader on real torch.utils.data.DataLoader objects."""

import subprocess
import sys

import pytest
import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, RandomSampler, TensorDataset

import gpudoctor
from gpudoctor.api import AuditError, loader_settings
from gpudoctor.model import Severity
from tests.factsutil import HEALTHY_GPU, make_facts, said
from tests.thismachine import torch_sees_gpu

# torch warns about worker counts above this 2-CPU test machine; the loaders are never iterated.
pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create")

DATA = TensorDataset(torch.arange(256, dtype=torch.float32).reshape(128, 2))


def by_id(findings):
    out = {}
    for f in findings:
        out.setdefault(f.id, []).append(f)
    return {k: max(v, key=lambda f: f.severity.rank) for k, v in out.items()}


def bad(findings):
    return sorted(f.id for f in findings if f.severity in (Severity.WARN, Severity.FAIL, Severity.ERROR))


def test_settings_are_read_off_the_loader():
    loader = DataLoader(
        DATA, batch_size=16, shuffle=True, num_workers=2, pin_memory=True, persistent_workers=True, drop_last=True
    )
    s = loader_settings(loader)
    assert s == {
        "num_workers": 2,
        "pin_memory": True,
        "persistent_workers": True,
        "prefetch_factor": 2,
        "batch_size": 16,
        "drop_last": True,
        "sampler": "torch.utils.data.sampler.RandomSampler",
    }


def test_batch_sampler_loader_reports_its_batch_size():
    loader = DataLoader(DATA, batch_sampler=BatchSampler(RandomSampler(DATA), batch_size=32, drop_last=True))
    s = loader_settings(loader)
    assert (s["batch_size"], s["drop_last"], s["sampler"]) == (32, True, "torch.utils.data.sampler.RandomSampler")


def test_main_process_loading_on_gpu_training_warns():
    loader = DataLoader(DATA, batch_size=16)
    findings = by_id(gpudoctor.audit_dataloader(loader, facts=make_facts(HEALTHY_GPU, env={}), expect_gpus=True))
    assert findings["GD-DL-002"].severity is Severity.WARN
    assert "num_workers=0 (DataLoader.num_workers)" in findings["GD-DL-002"].message
    assert findings["GD-DL-003"].severity is Severity.INFO  # pin_memory defaults to False


def test_good_loader_on_an_8_gpu_node_has_no_warning():
    loader = DataLoader(
        DATA,
        batch_size=16,
        num_workers=4,
        pin_memory=True,
        persistent_workers=True,
        sampler=DistributedSampler(DATA, num_replicas=8, rank=0),
    )
    findings = gpudoctor.audit_dataloader(
        loader,
        local_ranks=8,
        world_size=8,
        facts=make_facts(HEALTHY_GPU, env={"OMP_NUM_THREADS": "8"}),
        expect_gpus=True,
    )
    assert bad(findings) == []
    ids = {f.id for f in findings}
    assert {"GD-DL-001", "GD-DL-002", "GD-DL-003", "GD-DL-004", "GD-DL-005", "GD-DL-009"} <= ids
    assert by_id(findings)["GD-DL-009"].severity is Severity.PASS


def test_too_many_workers_for_the_ranks_warns_with_an_unsafe_fix():
    loader = DataLoader(DATA, batch_size=16, num_workers=32, persistent_workers=True, pin_memory=True)
    facts = make_facts(HEALTHY_GPU, env={}, patch={"host.cpus_allowed_count": 96})
    f = by_id(gpudoctor.audit_dataloader(loader, local_ranks=8, facts=facts, expect_gpus=True))["GD-DL-001"]
    assert f.severity is Severity.WARN
    assert "8 rank(s) x (32 workers + 1 main process) = 264 processes" in said(f)
    assert f.fix.safety.value == "unsafe" and "num_workers=11" in f.fix.title


def test_random_sampler_on_several_ranks_warns():
    loader = DataLoader(DATA, batch_size=16, shuffle=True)
    f = by_id(gpudoctor.audit_dataloader(loader, world_size=4, facts=make_facts(HEALTHY_GPU, env={})))["GD-DL-009"]
    assert f.severity is Severity.WARN and "RandomSampler on 4 ranks" in said(f)


def test_small_shm_warns_for_a_worker_loader():
    loader = DataLoader(DATA, batch_size=16, num_workers=4, persistent_workers=True)
    facts = make_facts(HEALTHY_GPU, env={}, patch={"host.shm": {"total_bytes": 64 << 20, "free_bytes": 60 << 20}})
    f = by_id(gpudoctor.audit_dataloader(loader, local_ranks=8, facts=facts))["GD-DL-005"]
    assert f.severity is Severity.WARN and "64 batches in flight" in said(f)


def test_probing_this_host_for_real():
    loader = DataLoader(DATA, batch_size=16, num_workers=1, persistent_workers=True, pin_memory=False)
    findings = gpudoctor.audit_dataloader(loader)
    assert {f.category for f in findings} == {"dataloader"}
    assert not [f for f in findings if f.severity is Severity.ERROR]
    # Worker processes are GPU-only advice: it does not apply without a GPU, and holds with one.
    assert by_id(findings)["GD-DL-002"].severity is (Severity.PASS if torch_sees_gpu() else Severity.SKIP)


def test_not_a_dataloader_is_refused():
    with pytest.raises(AuditError):
        gpudoctor.audit_dataloader([1, 2, 3])
    with pytest.raises(ValueError):
        gpudoctor.audit_dataloader(DataLoader(DATA), local_ranks=0)


def test_importing_gpudoctor_does_not_import_torch():
    code = (
        "import sys, gpudoctor; gpudoctor.audit_dataloader; import gpudoctor.checks; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


# --- unusual loaders: the audit never raises and judges what the loader really does --------


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter(range(8))


class _BucketBatchSampler:
    """A batch sampler that picks samples itself (no .sampler), like bucketing/distributed batch samplers."""

    def __iter__(self):
        return iter([[0, 1], [2, 3]])

    def __len__(self):
        return 2


def audit8(loader, **kw):
    facts = make_facts(HEALTHY_GPU, env={"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8", "OMP_NUM_THREADS": "4"})
    findings = gpudoctor.audit_dataloader(loader, facts=facts, **kw)
    assert not [f for f in findings if f.severity is Severity.ERROR], [f.message for f in findings]
    return by_id(findings)


def test_custom_batch_sampler_is_what_chooses_the_samples():
    loader = DataLoader(DATA, batch_sampler=_BucketBatchSampler(), num_workers=2)
    assert loader_settings(loader)["sampler"].endswith("_BucketBatchSampler")
    f = audit8(loader, expect_gpus=True)["GD-DL-009"]
    assert f.severity is Severity.INFO and "_BucketBatchSampler" in said(f)  # not the unused default SequentialSampler


def test_iterable_dataset_is_not_judged_by_a_sampler():
    f = audit8(DataLoader(_Stream(), batch_size=4, num_workers=2), expect_gpus=True)["GD-DL-009"]
    assert f.severity is Severity.INFO and "IterableDataset" in said(f) and f.fix is not None


def test_unbatched_and_spawn_context_loaders_are_audited():
    unbatched = audit8(
        DataLoader(
            DATA,
            batch_size=None,
            num_workers=2,
            pin_memory=True,
            sampler=DistributedSampler(DATA, num_replicas=8, rank=0),
        ),
        expect_gpus=True,
    )
    assert {k: f.severity.value for k, f in unbatched.items() if f.severity in (Severity.WARN, Severity.FAIL)} == {}
    spawn = DataLoader(
        DATA,
        batch_size=8,
        shuffle=True,
        num_workers=2,
        multiprocessing_context="spawn",
        generator=torch.Generator().manual_seed(0),
    )
    assert audit8(spawn, expect_gpus=False)["GD-DL-009"].severity is Severity.WARN  # RandomSampler on 8 ranks
    assert audit8(spawn, expect_gpus=False)["GD-DL-002"].severity is Severity.SKIP  # CPU job: no GPU to starve


def test_cpu_only_main_process_loader_is_fine():
    findings = audit8(
        DataLoader(DATA, batch_size=8, sampler=DistributedSampler(DATA, num_replicas=8, rank=3)), expect_gpus=False
    )
    assert [k for k, f in findings.items() if f.severity in (Severity.WARN, Severity.FAIL)] == []
