"""grpo_tutorial/seeding.py: the named seed streams, the data order, and the minibatch shuffle.

``tests/test_trainer_pieces.py`` checks how the trainer uses them (the minibatch
order, the resampling rounds, a data stream's position); this file pins the
numbers themselves, which every stored run depends on, and the invariants: a
permutation per epoch, each row once per epoch, no global RNG touched.
"""

import random

import numpy as np
import pytest
import torch

from grpo_tutorial.seeding import (
    DATA_ORDER,
    MINIBATCHES,
    RESAMPLING,
    SAMPLING,
    DataStream,
    derive_seed,
    epoch_permutation,
    minibatches,
    next_batch,
    sampling_seed,
    stream_generator,
    stream_seed,
)


def test_the_stream_numbers_are_fixed():
    # part of the stored results: changing one changes every run
    assert (SAMPLING, DATA_ORDER, MINIBATCHES, RESAMPLING) == (0, 1, 2, 3)


def test_derive_seed_is_the_same_number_in_every_process():
    # numpy's SeedSequence, not hash(): these are the numbers on any machine, in any process
    assert derive_seed(0, 5) == 346450728717391432
    assert derive_seed(0) == 6375474604893067239
    assert derive_seed(1, 2, 3) == 8208089874740249663
    assert stream_seed(7, SAMPLING, 0) == derive_seed(7, 0, 0) == 4474668370826950401


def test_derive_seed_is_63_bits_and_depends_on_every_key_in_order():
    seeds = {derive_seed(s, a, b) for s in range(3) for a in range(4) for b in range(4)}
    assert len(seeds) == 3 * 4 * 4  # no two keys collide here
    assert all(0 <= s < 2**63 for s in seeds)
    assert derive_seed(0, 1, 2) != derive_seed(0, 2, 1)
    # SeedSequence ignores trailing zero keys: (0, 1) and (0, 1, 0) are one seed. The streams never meet it:
    # each passes (seed, stream, index), and a resampling round (a fourth key) is >= 1
    assert derive_seed(0, 1) == derive_seed(0, 1, 0) and derive_seed(7) == derive_seed(7, 0, 0)


def test_the_streams_of_a_run_never_share_a_seed():
    used = [stream_seed(s, stream, i) for s in range(3) for stream in (SAMPLING, DATA_ORDER, MINIBATCHES)
            for i in range(6)]
    used += [sampling_seed(s, step, r) for s in range(3) for step in range(6) for r in range(1, 4)]
    assert len(set(used)) == len(used) == 3 * 3 * 6 + 3 * 6 * 3


def test_sampling_seed_round_zero_is_the_sampling_stream():
    assert sampling_seed(3, 4) == stream_seed(3, SAMPLING, 4)
    assert sampling_seed(3, 4, 1) == derive_seed(3, RESAMPLING, 4, 1) != sampling_seed(3, 4)


def test_stream_generator_is_a_cpu_generator_seeded_by_the_stream():
    g = stream_generator(3, DATA_ORDER, 4)
    assert isinstance(g, torch.Generator) and g.device.type == "cpu"
    assert g.initial_seed() == stream_seed(3, DATA_ORDER, 4)


def test_epoch_permutation_is_the_data_order_streams_randperm():
    for epoch in range(3):
        perm = epoch_permutation(5, 0, epoch)
        assert sorted(perm) == list(range(5))
        assert perm == torch.randperm(5, generator=stream_generator(0, DATA_ORDER, epoch)).tolist()
    assert epoch_permutation(5, 0, 0) == epoch_permutation(5, 0, 0)
    assert len({tuple(epoch_permutation(8, 0, e)) for e in range(5)}) > 1  # reshuffled between epochs


def test_next_batch_runs_over_epochs_and_returns_the_position_after():
    data = ["a", "b", "c"]
    perms = [epoch_permutation(3, 0, e) for e in range(3)]
    rows, epoch, index = next_batch(data, 7, seed=0, epoch=0, index=0)
    # 7 rows from 3: all of epoch 0, all of epoch 1, then the first of epoch 2
    assert rows == [data[i] for i in perms[0] + perms[1] + perms[2][:1]]
    assert (epoch, index) == (2, 1)
    assert data == ["a", "b", "c"]  # the dataset is read, never reordered


def test_next_batch_from_the_middle_of_an_epoch():
    data = list(range(5))
    perm = epoch_permutation(5, 1, 0)
    rows, epoch, index = next_batch(data, 2, seed=1, epoch=0, index=3)
    assert rows == [perm[3], perm[4]] and (epoch, index) == (1, 0)  # an epoch that ends exactly moves on


def test_a_data_stream_visits_every_row_once_per_epoch(tiny_batch):
    stream = DataStream(tiny_batch, 2, seed=9)
    first_epoch = stream.draw() + stream.draw()
    assert (stream.epoch, stream.index) == (1, 0)
    assert sorted(r["prompt"] for r in first_epoch) == sorted(r["prompt"] for r in tiny_batch)
    assert first_epoch == [tiny_batch[i] for i in epoch_permutation(4, 9, 0)]
    assert stream.draw() == [tiny_batch[i] for i in epoch_permutation(4, 9, 1)[:2]]


def test_minibatches_cut_each_pass_and_the_last_may_be_short():
    parts = [t.tolist() for t in minibatches(5, 2, 1, seed=0, step=0)]
    assert [len(p) for p in parts] == [2, 2, 1]
    assert sorted(sum(parts, [])) == list(range(5))
    assert parts == [torch.randperm(5, generator=stream_generator(0, MINIBATCHES, 0))[i:i + 2].tolist()
                     for i in (0, 2, 4)]
    assert list(minibatches(5, 2, 0, seed=0, step=0)) == []
    two_passes = list(minibatches(4, 4, 2, seed=0, step=3))
    assert len(two_passes) == 2 and all(t.dtype == torch.int64 for t in two_passes)
    assert list(minibatches(4, 4, 2, seed=0, step=3))[1].tolist() == two_passes[1].tolist()  # the same again


def test_no_global_rng_is_touched():
    torch.manual_seed(123)
    random.seed(123)
    np.random.seed(123)
    before = torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy()
    derive_seed(1, 2)
    epoch_permutation(10, 1, 2)
    next_batch(list(range(10)), 13, 1, 0, 4)
    list(minibatches(10, 3, 2, seed=1, step=5))
    assert torch.equal(before[0], torch.get_rng_state())
    assert before[1] == random.getstate()
    assert np.array_equal(before[2], np.random.get_state()[1])


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")])
def test_minibatches_on_a_device(device):
    (only,) = minibatches(3, 3, 1, seed=0, step=0, device=device)
    assert only.device.type == "cpu"
