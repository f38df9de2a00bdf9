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
=================  =======  ======================================

The numbers are part of the stored results: changing one changes every run.
Reward functions may still use the global RNGs; checkpoints therefore save and
restore those too (:func:`grpo_tutorial.run.checkpoint.capture_rng_state`), so a
resumed run matches.
"""

from __future__ import annotations

import numpy as np
import torch

__all__ = [
    "DATA_ORDER",
    "MINIBATCHES",
    "RESAMPLING",
    "SAMPLING",
    "derive_seed",
    "epoch_permutation",
    "next_batch",
    "stream_generator",
    "stream_seed",
]

SAMPLING = 0
DATA_ORDER = 1
MINIBATCHES = 2
RESAMPLING = 3


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
