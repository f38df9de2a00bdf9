"""Named seed streams: every random choice of a run comes from ``(seed, stream, index)``.

A run never touches the global RNGs to get its randomness: each random choice
draws from its own generator, seeded by the run's seed, the *stream* (what the
randomness is for) and an index (the step or the epoch). So two runs with the
same seed make the same choices, whatever else the process does, and a run
resumed from a checkpoint makes the choices the uninterrupted run would have.

=================  =======  ======================================
stream             number   seeds
=================  =======  ======================================
``SAMPLING``       0        the completions of step ``i`` (stage 1)
``DATA_ORDER``     1        the shuffled order of epoch ``e``
``MINIBATCHES``    2        the minibatch shuffle of step ``i``
``RESAMPLING``     3        round ``r`` >= 1 of dynamic sampling in step ``i``
``ADAPTER_INIT``   4        the LoRA adapters' initial A matrices (index 0)
``MONTE_CARLO``    5        cut point ``j``'s continuations in step ``i`` (``ppo.vine.MONTE_CARLO``)
=================  =======  ======================================

The numbers are part of the stored results: changing one changes every run.
Reward functions may still use the global RNGs; checkpoints therefore save and
restore those too (:func:`grpo_tutorial.run.checkpoint.capture_rng_state`), so a
resumed run matches.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np
import torch

__all__ = [
    "ADAPTER_INIT",
    "DATA_ORDER",
    "DataStream",
    "MINIBATCHES",
    "RESAMPLING",
    "SAMPLING",
    "derive_seed",
    "epoch_permutation",
    "minibatches",
    "next_batch",
    "sampling_seed",
    "stream_generator",
    "stream_seed",
]

SAMPLING = 0
DATA_ORDER = 1
MINIBATCHES = 2
RESAMPLING = 3
ADAPTER_INIT = 4


def derive_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed mixed from ``seed`` and integer keys, without Python's hash().

    ``hash()`` of a string changes between processes; ``numpy.random.SeedSequence``
    does not, so ``derive_seed(0, 5)`` is the same number in every process.
    """
    state = np.random.SeedSequence([seed, *keys]).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def stream_seed(seed: int, stream: int, index: int) -> int:
    """The seed of item ``index`` (a step or an epoch) of ``stream``."""
    return derive_seed(seed, stream, index)


def sampling_seed(seed: int, step: int, round_: int = 0) -> int:
    """The seed of the completions of step ``step``: ``SAMPLING``'s, or ``RESAMPLING``'s for round ``round_`` >= 1
    of dynamic sampling."""
    return stream_seed(seed, SAMPLING, step) if round_ == 0 else derive_seed(seed, RESAMPLING, step, round_)


def stream_generator(seed: int, stream: int, index: int) -> torch.Generator:
    """A CPU ``torch.Generator`` for item ``index`` of ``stream``."""
    return torch.Generator().manual_seed(stream_seed(seed, stream, index))


def epoch_permutation(n: int, seed: int, epoch: int) -> list[int]:
    """The order in which epoch ``epoch`` visits a dataset of ``n`` rows."""
    return torch.randperm(n, generator=stream_generator(seed, DATA_ORDER, epoch)).tolist()


def next_batch(dataset, size: int, seed: int, epoch: int, index: int) -> tuple[list, int, int]:
    """The next ``size`` rows of the data stream at position ``(epoch, index)``, and the position after.

    Rows are visited in a seeded shuffled order that changes every epoch
    (:func:`epoch_permutation`); a batch may run over into the next epoch. The
    position is returned rather than stored, so a step that fails can leave it
    untouched.
    """
    n = len(dataset)
    rows: list = []
    while len(rows) < size:
        perm = epoch_permutation(n, seed, epoch)
        take = min(size - len(rows), n - index)
        rows.extend(dataset[i] for i in perm[index : index + take])
        index += take
        if index == n:
            epoch, index = epoch + 1, 0
    return rows, epoch, index


class DataStream:
    """A run's data stream from position ``(epoch, index)``: each :meth:`draw` is the next ``size`` rows.

    Every draw moves :attr:`epoch` and :attr:`index` on (:func:`next_batch`);
    the caller copies them back into the run's state once the step has
    succeeded, so a failed step leaves the run's position untouched.
    """

    def __init__(self, dataset, size: int, seed: int, epoch: int = 0, index: int = 0) -> None:
        self.dataset, self.size, self.seed, self.epoch, self.index = dataset, size, seed, epoch, index

    def draw(self) -> list:
        rows, self.epoch, self.index = next_batch(self.dataset, self.size, self.seed, self.epoch, self.index)
        return rows


def minibatches(
    n: int, size: int, passes: int, seed: int, step: int, device: torch.device | str = "cpu"
) -> Iterator[torch.Tensor]:
    """The rows of each optimizer update of step ``step``: ``passes`` shuffles of ``range(n)``, cut into ``size`` rows.

    Each pass draws a new order from the step's ``MINIBATCHES`` stream, so every
    completion is in exactly one update per pass. Yields ``[size]`` index tensors
    on ``device`` (the last of a pass shorter if ``size`` does not divide ``n``).
    """
    shuffle = stream_generator(seed, MINIBATCHES, step)
    for _ in range(passes):
        order = torch.randperm(n, generator=shuffle).to(device)  # [n]
        for start in range(0, n, size):
            yield order[start : start + size]  # [size]
