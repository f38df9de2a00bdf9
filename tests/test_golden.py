"""Numbers do not move: a 5-step tiny run gives the same history as the stored one.

The stored rows (``tests/fixtures/golden_history.json``) were computed by this very
code path before the package was reorganised, so a refactor that changes any
number, however slightly, fails here. Three runs cover the paths a step can take:
the defaults; a KL penalty with mu = 2 over two minibatches (reference model,
off-policy ratios, clipping); and Dr. GRPO's loss with a NaN-producing reward
(the NaN-aware advantages).

The stored rows are of the full scoring pass (``share_prompt_cache=False``),
which still reproduces them bit for bit. The default shared-prompt pass (each
prompt encoded once per pass) has its own fixture,
``tests/fixtures/golden_history_shared_prompts.json``: it samples the same
tokens, and its floats differ from the full pass's only by rounding, which
:func:`test_the_shared_prompt_fixture_is_the_full_pass_up_to_rounding` checks.

Floats depend on the kernels that compute them, not only on the code. PyTorch's
kernels, MKL's matrix products and oneDNN pick their code by the processor (vendor and
model, not only its widest instruction set) and by environment variables such as
``ATEN_CPU_CAPABILITY``, ``MKL_ENABLE_INSTRUCTIONS`` and ``ONEDNN_MAX_CPU_ISA``, and a
wider vector or another blocking sums in another order: the same code gives floats
that differ in the last bits (measured: an Intel and an AMD Xeon/EPYC, both
``AVX512`` to PyTorch, differ from row 0 of the defaults run). So each fixture holds
one stored run per *kernel set*, keyed by
:func:`grpo_tutorial.env.kernel_fingerprint` (a hash of what a fixed set of probes
computes at one thread, the golden runs' setting). Where this machine's fingerprint
has a stored run, the check is bit for bit. On any machine, the history must also lie
nearer every stored run than the same run with another seed does
(:func:`test_history_is_the_stored_run_up_to_rounding_on_every_platform`): each row is
sampled, and sampled from updated weights after the first, so no allowance taken from
the machines we have seen bounds the drift on a new one (issue 52); a machine of a new
kind still catches a change as large as a seed that is ignored. The two runs stored
before fingerprints existed (an AMD EPYC, at its native kernels and at AVX2) are kept
as references only: their fingerprints were never measured.

If a deliberate numerical change moves these numbers, regenerate the fixtures in
that commit with ``python tests/test_golden.py --write`` and say why in the commit
message. ``--write`` keeps only this machine's kernel set (the others' stored runs
would be stale); ``--write --add`` adds this kernel set's run to fixtures made by the
same code on other kernels (run it again under the kernel variables of
``make test-kernels`` to add that set too).
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import warnings
from pathlib import Path

import pytest
import torch

from grpo_tutorial import GRPOConfig, GRPOTrainer, TIMING_KEYS, make_arithmetic_dataset
from grpo_tutorial.env import describe_kernels, kernel_fingerprint
from grpo_tutorial.rewards import correctness_reward, partial_credit_reward

from allowances import like_the_row
from helpers import tiny_model

FIXTURE = Path(__file__).parent / "fixtures" / "golden_history.json"
SHARED_FIXTURE = Path(__file__).parent / "fixtures" / "golden_history_shared_prompts.json"
#: the fixture of each scoring pass, and the config field that selects it
FIXTURES = {False: FIXTURE, True: SHARED_FIXTURE}
STEPS = 5


def _half_unscorable(completions, answer, **kwargs):
    """partial credit, except that completions starting with '1' cannot be scored (None)."""
    scores = partial_credit_reward(completions, answer=answer)
    return [None if c.startswith("1") else s for c, s in zip(completions, scores)]


RUNS = {
    "defaults": (dict(prompts_per_step=4, group_size=4, seed=3), [correctness_reward, partial_credit_reward]),
    "kl_mu2_minibatches": (
        dict(prompts_per_step=4, group_size=4, seed=5, beta=0.05, num_iterations=2, minibatch_size=8,
             learning_rate=3e-4, clip_eps_high=0.28),
        [partial_credit_reward],
    ),
    "dr_grpo_unscorable": (
        dict(prompts_per_step=4, group_size=4, seed=7, loss_type="dr_grpo", scale_rewards="none",
             max_new_tokens=5),
        [_half_unscorable],
    ),
}


def kernels() -> str:
    """This machine's kernel fingerprint at one thread, the golden runs' setting (the key of a stored run)."""
    return kernel_fingerprint(threads=1)


def kernel_description() -> dict:
    """What a stored run was made on, for a reader (the fingerprint is what the test compares)."""
    return describe_kernels(threads=1)


def _weights_digest(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


_RUN_CACHE: dict = {}


def run(name: str, **overrides) -> dict:
    """The 5-step run ``name`` with ``overrides``; computed once per process (tests share it)."""
    key = (name, tuple(sorted(overrides.items())))
    if key not in _RUN_CACHE:
        _RUN_CACHE[key] = _run(name, **overrides)
    return _RUN_CACHE[key]


def _run(name: str, **overrides) -> dict:
    kwargs, fns = RUNS[name]
    kwargs = {**kwargs, **overrides}
    torch.set_num_threads(1)
    model, tokenizer = tiny_model(seed=11)
    data = make_arithmetic_dataset(64, seed=13, digits=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = GRPOTrainer(model, tokenizer, fns, GRPOConfig(**kwargs))
        history = trainer.train(data, STEPS, progress=False)
    rows = [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in history]
    # JSON round trip: the stored form (NaN stays NaN in Python's json)
    return {"history": json.loads(json.dumps(rows)), "weights_sha256": _weights_digest(model), "model": model}


def _same(a, b) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def stored_runs(fixture: Path) -> dict[str, dict]:
    """``{kernel fingerprint: {run name: {"history", "weights_sha256"}}}`` from a fixture file."""
    return {key: entry["runs"] for key, entry in json.loads(fixture.read_text(encoding="utf-8"))["kernels"].items()}


def _check_against(want_runs: dict, share_prompt_cache: bool, *, exact: bool) -> None:
    """Compare this machine's runs with stored ones: bit for bit (``exact``), or nearer them than a planted bug."""
    assert sorted(want_runs) == sorted(RUNS)
    for name in RUNS:
        got = run(name, share_prompt_cache=share_prompt_cache)
        want = want_runs[name]
        assert len(got["history"]) == len(want["history"]) == STEPS
        if not exact:
            _nearer_than_another_seed(name, got["history"], want["history"], share_prompt_cache)
            continue
        for i, (g, w) in enumerate(zip(got["history"], want["history"])):
            assert set(w) <= set(g), f"{name}: row {i} lost fields {sorted(set(w) - set(g))}"
            common = sorted(set(g) & set(w))
            assert _same({k: g[k] for k in common}, {k: w[k] for k in common}), f"{name}: row {i} differs"
        assert got["weights_sha256"] == want["weights_sha256"], f"{name}: final weights differ"


#: The planted bug of the comparison on other kernels: the run's seed ignored; three draws of it (the same run with
#: seeds 100, 101 and 102 above its own), so that one that lands near the stored row by chance does not set the bound.
PLANTED_SEED_OFFSETS = (100, 101, 102)


def _nearer_than_another_seed(name: str, got: list[dict], want: list[dict], share_prompt_cache: bool) -> None:
    """On kernels other than a stored run's: every row nearer the stored row than the same run with another seed.

    Each step samples, and from step 2 on it samples from updated weights: two kernel sets
    round differently, a token flips where a probability sat within rounding of a sampling
    boundary, and no machine we have seen bounds how far the rows then drift (issue 52). So
    the rows are told apart from a planted bug instead, the seed ignored: the same run
    with three other seeds, made here (``allowances.like_the_row``: half way to the draw at the
    median distance). The step and the learning rate are exact, and the field names the same.
    """
    seed = RUNS[name][0]["seed"]
    planted = {f"seed {seed + k}": run(name, share_prompt_cache=share_prompt_cache, seed=seed + k)["history"]
               for k in PLANTED_SEED_OFFSETS}
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert set(w) <= set(g), f"{name}: row {i} lost fields {sorted(set(w) - set(g))}"
        like_the_row(g, w, {k: rows[i] for k, rows in planted.items()}, "the run's seed ignored", (),
                     f"{name} row {i}", at_least=1)


def _stored_here(fixture: Path) -> dict:
    platforms = stored_runs(fixture)
    if kernels() not in platforms:
        pytest.skip(
            f"{fixture.name} holds no run made with this machine's kernels (fingerprint {kernels()}; stored: "
            f"{sorted(platforms)}), so a bit-for-bit comparison would prove nothing; the up-to-rounding check "
            "still runs. To add these kernels, run `python tests/test_golden.py --write --add` on code that "
            "passes that check."
        )
    return platforms[kernels()]


def test_history_and_weights_are_bit_identical_to_the_stored_run():
    """The full scoring pass reproduces the rows stored before the package was reorganised."""
    _check_against(_stored_here(FIXTURE), share_prompt_cache=False, exact=True)


def test_default_shared_prompt_pass_is_bit_identical_to_its_stored_run():
    _check_against(_stored_here(SHARED_FIXTURE), share_prompt_cache=True, exact=True)


@pytest.mark.parametrize("share", [False, True], ids=["full_pass", "shared_prompts"])
def test_history_is_the_stored_run_up_to_rounding_on_every_platform(share):
    """On any CPU: every stored run's rows, nearer them than another seed's (bit for bit is the test above)."""
    platforms = stored_runs(FIXTURES[share])
    assert platforms, "the fixture holds no stored run"
    for want_runs in platforms.values():
        _check_against(want_runs, share_prompt_cache=share, exact=False)


def test_stored_runs_of_different_platforms_agree_up_to_rounding():
    """The stored runs of each kernel set were made by the same code: each nearer the first than another seed's run
    (the comparison on kernels other than a stored run's, :func:`_nearer_than_another_seed`)."""
    for share, fixture in FIXTURES.items():
        platforms = list(stored_runs(fixture).values())
        for other in platforms[1:]:
            for name in RUNS:
                _nearer_than_another_seed(name, other[name]["history"], platforms[0][name]["history"], share)


def test_the_shared_prompt_fixture_is_the_full_pass_up_to_rounding():
    """Same sampled tokens, counts and flags; every float within rounding of the full pass."""
    full_platforms, shared_platforms = stored_runs(FIXTURE), stored_runs(SHARED_FIXTURE)
    assert sorted(full_platforms) == sorted(shared_platforms)
    floats = 0
    for platform in full_platforms:
        floats += _full_vs_shared(full_platforms[platform], shared_platforms[platform])
    assert floats > 100 * len(full_platforms)


def _full_vs_shared(full: dict, shared: dict) -> int:
    floats = 0
    for name in RUNS:
        assert shared[name]["weights_sha256"] != full[name]["weights_sha256"]  # not a copy
        for i, (a, b) in enumerate(zip(full[name]["history"], shared[name]["history"])):
            assert set(a) <= set(b), f"{name}: row {i} lost fields {sorted(set(a) - set(b))}"
            for key, x in a.items():
                y = b[key]
                if isinstance(x, float) and not isinstance(y, bool):
                    floats += 1
                    assert math.isclose(x, y, rel_tol=1e-4, abs_tol=1e-6) or (math.isnan(x) and math.isnan(y)), (
                        f"{name} row {i} {key}: {x} (full pass) vs {y} (shared prompts)"
                    )
                else:
                    assert x == y, f"{name} row {i} {key}: {x!r} (full pass) vs {y!r} (shared prompts)"
    return floats


if __name__ == "__main__":
    args = sys.argv[1:]
    if args not in (["--write"], ["--write", "--add"]):
        sys.exit("usage: python tests/test_golden.py --write [--add]   (regenerates the fixtures for this CPU)")
    for share, path in FIXTURES.items():
        runs = {name: run(name, share_prompt_cache=share) for name in RUNS}
        for result in runs.values():
            del result["model"]
        entries = json.loads(path.read_text(encoding="utf-8"))["kernels"] if "--add" in args and path.exists() else {}
        entries[kernels()] = {"made_on": kernel_description(), "runs": runs}
        record = {
            "about": "5-step tiny GRPO runs of tests/test_golden.py, one per kernel set, keyed by "
            "grpo_tutorial.env.kernel_fingerprint(threads=1); regenerate with python tests/test_golden.py --write "
            "(--add keeps the other kernel sets)",
            "kernels": entries,
        }
        path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {path} ({', '.join(sorted(entries))})")
