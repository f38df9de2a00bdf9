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

If a deliberate numerical change moves these numbers, regenerate the fixtures in
that commit with ``python tests/test_golden.py --write`` and say why in the
commit message.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import warnings
from pathlib import Path

import torch

from grpo_tutorial import GRPOConfig, GRPOTrainer, TIMING_KEYS, build_tiny_policy, make_arithmetic_dataset
from grpo_tutorial.rewards import correctness_reward, partial_credit_reward

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


def _weights_digest(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def run(name: str, **overrides) -> dict:
    kwargs, fns = RUNS[name]
    kwargs = {**kwargs, **overrides}
    torch.set_num_threads(1)
    model, tokenizer = build_tiny_policy(seed=11)
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


def _check_against(fixture: Path, share_prompt_cache: bool) -> None:
    expected = json.loads(fixture.read_text(encoding="utf-8"))
    assert sorted(expected) == sorted(RUNS)
    for name in RUNS:
        got = run(name, share_prompt_cache=share_prompt_cache)
        want = expected[name]
        for i, (g, w) in enumerate(zip(got["history"], want["history"])):
            common = sorted(set(g) & set(w))
            assert _same({k: g[k] for k in common}, {k: w[k] for k in common}), f"{name}: row {i} differs"
            assert set(w) <= set(g), f"{name}: row {i} lost fields {sorted(set(w) - set(g))}"
        assert len(got["history"]) == len(want["history"]) == STEPS
        assert got["weights_sha256"] == want["weights_sha256"], f"{name}: final weights differ"


def test_history_and_weights_are_bit_identical_to_the_stored_run():
    """The full scoring pass reproduces the rows stored before the package was reorganised."""
    _check_against(FIXTURE, share_prompt_cache=False)


def test_default_shared_prompt_pass_is_bit_identical_to_its_stored_run():
    _check_against(SHARED_FIXTURE, share_prompt_cache=True)


def test_the_shared_prompt_fixture_is_the_full_pass_up_to_rounding():
    """Same sampled tokens, counts and flags; every float within rounding of the full pass."""
    full = json.loads(FIXTURE.read_text(encoding="utf-8"))
    shared = json.loads(SHARED_FIXTURE.read_text(encoding="utf-8"))
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
    assert floats > 100


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_golden.py --write   (regenerates the fixture)")
    for share, path in FIXTURES.items():
        runs = {name: run(name, share_prompt_cache=share) for name in RUNS}
        for result in runs.values():
            del result["model"]
        path.write_text(json.dumps(runs, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {path}")
