"""dataloader checks of what each rank loads: the global batch split over ranks, arguments this torch
rejects, sharding across ranks."""

from __future__ import annotations

from dataclasses import dataclass

from gpudoctor.checks.dataloader._loader import change_setting, loader_settings
from gpudoctor.job.env import job_env
from gpudoctor.job.layout import intended_launcher, layout
from gpudoctor.model import fail, info, manual, passed, skip, warn
from gpudoctor.registry import check


def _data_parallel_size(settings, world: int) -> tuple[int, str]:
    tp = settings.value("tensor_parallel") or 1
    pp = settings.value("pipeline_parallel") or 1
    cp = settings.value("context_parallel") or 1
    model_parallel = tp * pp * cp
    if model_parallel > 1 and world % model_parallel == 0:
        parts = " x ".join(f"{n} {v}" for n, v in (("tensor", tp), ("pipeline", pp), ("context", cp)) if v > 1)
        return world // model_parallel, f"world size {world} / ({parts} parallel)"
    return world, f"world size {world}"


def _batch_framework(settings) -> str | None:
    """Frameworks that refuse to start on an inconsistent global batch."""
    key = (settings.where("global_batch_size") or "").rsplit(".", 1)[-1]  # the key itself: not global_train_batch_size
    if key == "train_batch_size":
        return "DeepSpeed"
    if key == "global_batch_size" and (settings.where("batch_size") or "").rsplit(".", 1)[-1] == "micro_batch_size":
        return "Megatron"
    if key == "IMS_PER_BATCH":  # detectron2's build_batch_data_loader asserts it divides by the world size
        return "detectron2"
    return None


@dataclass(frozen=True)
class BatchRule:
    """What the global batch must be a multiple of (unit), or equal to (exact), and why."""

    unit: int
    unit_text: str
    exact: int | None = None
    exact_text: str | None = None
    quotient: str = "samples per data-parallel rank"  # what global // unit is


def _batch_rule(settings, framework: str | None, dp: int) -> BatchRule:
    """The rule the framework applies (DeepSpeed's _set_batch_related_parameters, Megatron's
    num-microbatches calculator); for hand-written loops, micro x accumulation x ranks."""
    micro, accum = settings.value("batch_size"), settings.value("gradient_accumulation_steps")
    micro_text = settings.describe("batch_size")
    accum_text = settings.describe("gradient_accumulation_steps")
    if framework == "Megatron" and micro:
        # Megatron derives the accumulation (global / (micro x dp)); a trainer's accumulate_grad_batches is not used.
        return BatchRule(
            micro * dp, f"{micro_text} x {dp} data-parallel ranks", quotient="micro-batches accumulated per step"
        )
    if micro and accum:
        return BatchRule(
            dp, f"{dp} data-parallel ranks", micro * accum * dp, f"{micro_text} x {accum_text} x {dp} ranks"
        )
    if framework == "DeepSpeed" and micro:
        # DeepSpeed sets accumulation = train_batch_size // micro // world and then asserts equality.
        return BatchRule(
            micro * dp, f"{micro_text} x {dp} data-parallel ranks", quotient="micro-batches accumulated per step"
        )
    if framework == "DeepSpeed" and accum:
        return BatchRule(accum * dp, f"{accum_text} x {dp} data-parallel ranks", quotient="samples per micro-batch")
    return BatchRule(dp, f"{dp} data-parallel ranks")


@check(
    id="GD-DL-007",
    name="global-batch-not-divisible",
    category="dataloader",
    title="The global batch size divides evenly across the data-parallel ranks",
    needs=["env"],
    requires=["loader-settings"],
    scope="job",
    what="When the config states a global batch (DeepSpeed train_batch_size, Megatron/NeMo global_batch_size, "
    "detectron2 SOLVER.IMS_PER_BATCH, effective_batch_size...), checks it against the data-parallel size "
    "(world size, divided by tensor x pipeline x context parallel sizes when the config states them) the way "
    "the framework does: DeepSpeed needs train_batch_size = micro batch x gradient accumulation x "
    "data-parallel size (deriving the one left out), Megatron/NeMo need global_batch_size to be a multiple of "
    "micro_batch_size x data-parallel size, detectron2 needs IMS_PER_BATCH to be a multiple of the world "
    'size. DeepSpeed\'s "auto" (filled in by the HF Trainer or accelerate) is consistent by construction. '
    "Per-device batches (HF per_device_train_batch_size) have no global rule.",
    why="DeepSpeed, Megatron and detectron2 refuse to start ('train_batch_size is not equal to micro_batch_per_gpu * "
    "gradient_acc_step * world_size', 'global batch size is not divisible by micro batch size times data "
    "parallel size'); hand-written loops silently round the per-rank batch down and train on a different "
    "batch size than the one tuned.",
    fix="Choose a global batch that is a multiple of micro batch x data-parallel size (DeepSpeed: exactly "
    'micro x accumulation x ranks), or leave DeepSpeed\'s train_batch_size to "auto" / state only the '
    "per-rank batch and the accumulation steps.",
)
def global_batch_not_divisible(facts, ctx):
    settings = loader_settings(facts, ctx)
    if settings.is_auto("global_batch_size"):
        return passed(
            f"{settings.describe('global_batch_size')}: the HF Trainer / accelerate fills it in as world size x "
            "per-device batch x accumulation, consistent by construction",
            **settings.evidence(),
        )
    global_batch = settings.value("global_batch_size")
    if global_batch is None:
        if "global_batch_size" in settings.found:
            return skip(settings.unknown("global_batch_size"), **settings.evidence())
        return skip(
            f"{settings.source} states no global batch size (per-device batches have no global rule)",
            **settings.evidence(),
        )
    lay = layout(facts, ctx)
    if not lay.world_size.known or lay.world_size.value is None:
        return skip(
            "the world size is not known here (set WORLD_SIZE, or --expect-gpus on one node)", **settings.evidence()
        )
    dp, dp_text = _data_parallel_size(settings, lay.world_size.value)
    framework = _batch_framework(settings)
    rule = _batch_rule(settings, framework, dp)
    evidence = {**settings.evidence(), **lay.evidence(), "data_parallel": dp_text, "framework": framework}
    sev = fail if framework else warn
    stops = f"; {framework} refuses to start" if framework else ""
    target = rule.exact or max(rule.unit, round(global_batch / rule.unit) * rule.unit)
    fix = change_setting(
        settings, "global_batch_size", target, f"Set the global batch to {target} (a multiple of {rule.unit})"
    )
    stated = settings.describe("global_batch_size")
    if global_batch % rule.unit or global_batch < rule.unit:
        evidence["world_size_source"] = lay.world_size.source
        return sev(f"{stated} is not a multiple of {rule.unit_text} = {rule.unit}{stops}", fix, **evidence)
    if rule.exact is not None and rule.exact != global_batch:
        return sev(f"{rule.exact_text} = {rule.exact}, not the stated {stated}{stops}", fix, **evidence)
    if rule.exact is not None:
        return passed(f"{stated} = {rule.exact_text}", **evidence)
    return passed(f"{stated} = {rule.unit_text} x {global_batch // rule.unit} {rule.quotient}", **evidence)


def rejected_arguments(settings, torch_version) -> list[str]:
    """Combinations torch.utils.data.DataLoader raises ValueError on.

    A worker count left to a framework's default (HF TrainingArguments: 0) counts: the
    framework passes it on all the same.
    """
    workers_found = settings.effective("num_workers")
    workers = workers_found.value if workers_found else None
    by_default = workers_found is not None and workers_found is settings.defaults.get("num_workers")
    workers_text = f" ({workers_found.path} is not set: TrainingArguments' default is {workers})" if by_default else ""
    prefetch = settings.value("prefetch_factor")
    out = []
    if workers is not None and workers < 0:
        out.append(f"{settings.describe('num_workers')} is negative")
    if workers == 0 and settings.value("persistent_workers"):
        out.append(f"{settings.describe('persistent_workers')} needs num_workers > 0")
    if workers == 0 and prefetch is not None and (torch_version is None or torch_version >= (2, 0) or prefetch != 2):
        out.append(f"{settings.describe('prefetch_factor')} is allowed only with num_workers > 0")
    if out and workers_text:
        out[-1] += workers_text
    if workers and prefetch is not None and prefetch < 1:
        out.append(f"{settings.describe('prefetch_factor')} must be at least 1")
    batch = settings.value("batch_size")
    if batch is not None and batch < 1:
        out.append(f"{settings.describe('batch_size')} must be at least 1")
    return out


def _rejected_fix(settings):
    workers = settings.value("num_workers")
    if workers is not None and workers < 0:
        return manual(
            f"Set {settings.describe('num_workers').split('=')[0]} to 0 or a positive count (or resolve -1 in your "
            "code before DataLoader)"
        )
    keys = [settings.describe(n).split("=")[0] for n in ("prefetch_factor", "persistent_workers") if settings.value(n)]
    return manual(
        f"Remove {' and '.join(keys) or 'the rejected arguments'} while num_workers is 0, or set num_workers above 0"
    )


@check(
    id="GD-DL-008",
    scope="job",
    name="dataloader-arguments-rejected",
    category="dataloader",
    title="DataLoader arguments are a combination torch accepts",
    needs=["torch_meta"],
    requires=["loader-settings"],
    what="Looks for DataLoader argument combinations torch rejects: persistent_workers=True or a "
    "prefetch_factor with num_workers=0 (torch >= 2.0), prefetch_factor < 1, negative num_workers, a "
    "batch size below 1.",
    why="torch.utils.data.DataLoader raises ValueError on these when the training script builds the loader, "
    "after the job has started and the model is loaded. Code that drops the argument when num_workers is 0 "
    "is not affected.",
    fix="Leave prefetch_factor and persistent_workers unset when num_workers is 0.",
)
def dataloader_arguments_rejected(facts, ctx):
    settings = loader_settings(facts, ctx)
    from gpudoctor import versions

    problems = rejected_arguments(settings, versions.parse(facts.torch_version()))
    evidence = {**settings.evidence(), "torch": facts.torch_version()}
    if not problems:
        return passed("the stated DataLoader arguments are a combination torch accepts", **evidence)
    if settings.live:
        raiser = "DataLoader raises ValueError"
    elif "huggingface" in settings.frameworks:
        raiser = "TrainingArguments or DataLoader raises ValueError when the Trainer starts"
    else:
        raiser = "DataLoader raises ValueError if the config's values reach torch.utils.data.DataLoader unchanged"
    return warn(
        "; ".join(problems) + f": {raiser}",
        _rejected_fix(settings),
        **evidence,
    )


_SELF_SHARDING = ("lightning", "accelerate")


# Samplers that read the rank and world size themselves and hand each rank its own share.
RANK_AWARE_SAMPLERS = {
    "DefaultSampler": "mmengine",  # mmengine.dataset.DefaultSampler / InfiniteSampler: get_dist_info()
    "InfiniteSampler": "mmengine",
    "TrainingSampler": "detectron2",  # detectron2.data.samplers: shards its infinite stream by rank
    "RepeatFactorTrainingSampler": "detectron2",
    "RepeatAugSampler": "timm",
    "DistributedBucketSampler": "",
    "ElasticDistributedSampler": "torchelastic",
    "StatefulDistributedSampler": "torchdata",
}


@check(
    id="GD-DL-009",
    name="dataloader-not-sharded-across-ranks",
    category="dataloader",
    title="Each rank reads its own share of the data",
    needs=["env"],
    requires=["loader-settings"],
    scope="job",
    what="With more than one rank, the DataLoader's sampler should be a DistributedSampler (or another "
    "sampler that splits the dataset by rank: mmengine's DefaultSampler/InfiniteSampler, detectron2's "
    "TrainingSampler...). Read from a live DataLoader (a custom batch_sampler counts as the sampler) or a "
    "config's `sampler`; an IterableDataset must shard itself (info).",
    why="With a RandomSampler or SequentialSampler every rank iterates the whole dataset: an epoch does "
    "world-size times the work, and with a SequentialSampler all ranks train on identical batches. "
    "Lightning and accelerate swap in a distributed sampler themselves when they prepare the loader.",
    fix="DataLoader(dataset, sampler=DistributedSampler(dataset), ...) and call sampler.set_epoch(epoch) every epoch.",
)
def dataloader_not_sharded_across_ranks(facts, ctx):
    settings = loader_settings(facts, ctx)
    sampler = settings.value("sampler")
    if sampler is None:
        return skip(f"the sampler is not stated in {settings.source}", **settings.evidence())
    lay = layout(facts, ctx)
    evidence = {**settings.evidence(), **lay.evidence()}
    name = sampler.rsplit(".", 1)[-1]
    if not (lay.world_size.value and lay.world_size.value > 1):
        return skip(f"a single rank (world size {lay.world_size.value or 'unknown'}): nothing to shard", **evidence)
    if name == "_InfiniteConstantSampler":
        return info(
            f"an IterableDataset on {lay.world_size.value} ranks: torch cannot shard it, so its __iter__ must split "
            "the stream by rank (and by worker) itself, or every rank trains on the same samples",
            manual(
                "Split the stream by rank",
                "datasets.distributed.split_dataset_by_node(ds, rank, world_size)  # or "
                "torch.utils.data.get_worker_info() + the rank in __iter__",
            ),
            **evidence,
        )
    if "distributed" in name.lower() or name in RANK_AWARE_SAMPLERS:
        return passed(f"sampler {name} splits the data by rank", **evidence)
    self_sharding = (
        intended_launcher(ctx) in _SELF_SHARDING
        or "lightning" in settings.frameworks
        or any(k.startswith(("PL_", "LIGHTNING_", "ACCELERATE_")) for k in job_env(facts, ctx))
    )
    msg = f"sampler {name} on {lay.world_size.value} ranks: every rank reads the whole dataset"
    fix = manual("Use a DistributedSampler", "DataLoader(ds, sampler=DistributedSampler(ds), ...)")
    if self_sharding or name not in ("RandomSampler", "SequentialSampler"):
        return info(msg + " (unless Lightning/accelerate, or the sampler itself, shards it by rank)", fix, **evidence)
    return warn(msg, fix, **evidence)
