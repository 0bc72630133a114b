"""A synthetic token stream with learnable structure, served through a real DataLoader.

Each sequence is made of segments: a segment starts at a token drawn from a Zipf distribution
and then walks a fixed cycle through the vocabulary (token -> its successor), so a model can
learn the start-token frequencies at once and the successor table soon after. Loss starts near
ln(V) and falls toward about reset_prob * H(zipf); a run whose loss does not fall is broken.
Item i is a pure function of (seed, i), so every rank and every worker sees the same data.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from torch.utils.data import DataLoader, Dataset, Sampler


class SyntheticTokens(Dataset):
    def __init__(self, vocab: int, seq_len: int, length: int, seed: int, reset_prob: float = 0.1):
        g = torch.Generator().manual_seed(seed)
        self.vocab, self.seq_len, self.length, self.seed = vocab, seq_len, length, seed
        self.reset_prob = reset_prob
        self.cycle = torch.randperm(vocab, generator=g)
        self.position = torch.empty_like(self.cycle)
        self.position[self.cycle] = torch.arange(vocab)
        zipf = 1.0 / torch.arange(1, vocab + 1, dtype=torch.float64) ** 1.1
        self.start_weights = zipf[torch.randperm(vocab, generator=g)]

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + int(i))
        n = self.seq_len + 1
        steps = torch.arange(n)
        resets = torch.rand(n, generator=g) < self.reset_prob
        resets[0] = True
        segment_start = torch.cummax(torch.where(resets, steps, 0), dim=0).values
        starts = torch.multinomial(self.start_weights, n, replacement=True, generator=g)
        walked = self.position[starts[segment_start]] + (steps - segment_start)
        tokens = self.cycle[walked % self.vocab]
        return tokens[:-1], tokens[1:]


class LazyDistributedSampler(Sampler[int]):
    """This rank's share of a shuffled epoch, generated one index at a time.

    torch's DistributedSampler materialises randperm(len(dataset)).tolist() in every rank: a Python list of
    every index (--steps 10000000 made 6 GB per rank). Here the epoch's order is an affine permutation
    i -> (a*i + b) mod n, with a coprime to n and (a, b) drawn from (seed, epoch): O(1) memory, a new order
    each epoch, and like drop_last=True every rank gets n // world_size indices, disjoint across ranks.
    """

    def __init__(self, length: int, *, world_size: int, rank: int, seed: int):
        if length < world_size:
            raise ValueError(f"{length} samples cannot be shared by {world_size} ranks")
        self.length, self.world_size, self.rank, self.seed = length, world_size, rank, seed
        self.per_rank = length // world_size
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _affine(self) -> tuple[int, int]:
        g = torch.Generator().manual_seed(self.seed + 7919 * self.epoch)
        n = self.length
        a = int(torch.randint(1, max(2, n), (1,), generator=g))
        while math.gcd(a, n) != 1:  # the density of units keeps this loop short (expected < 10 tries)
            a = a % (n - 1) + 1 if n > 2 else 1
        b = int(torch.randint(0, n, (1,), generator=g))
        return a, b

    def __iter__(self) -> Iterator[int]:
        a, b, n = *self._affine(), self.length
        for i in range(self.rank, self.per_rank * self.world_size, self.world_size):
            yield (a * i + b) % n

    def __len__(self) -> int:
        return self.per_rank


def make_loader(
    dataset: SyntheticTokens, *, rank: int, world_size: int, seed: int, batch_size: int, settings: dict
) -> DataLoader:
    """settings: num_workers, pin_memory, persistent_workers, prefetch_factor, drop_last (resolved)."""
    sampler = LazyDistributedSampler(len(dataset), world_size=world_size, rank=rank, seed=seed)
    kwargs = dict(
        batch_size=batch_size,
        sampler=sampler,
        num_workers=settings["num_workers"],
        pin_memory=settings["pin_memory"],
        drop_last=settings["drop_last"],
    )
    if settings["num_workers"] > 0:
        kwargs["persistent_workers"] = settings["persistent_workers"]
        if settings.get("prefetch_factor") is not None:
            kwargs["prefetch_factor"] = settings["prefetch_factor"]
    return DataLoader(dataset, **kwargs)


def batches(loader: DataLoader):
    """Endless batches; a new epoch reshuffles through the sampler."""
    sampler = loader.sampler
    assert isinstance(sampler, LazyDistributedSampler), "batches() reshuffles loaders made by make_loader()"
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1
