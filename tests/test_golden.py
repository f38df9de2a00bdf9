"""Numbers do not move: a 5-step tiny run gives the same history as the stored one.

The stored rows (``tests/fixtures/golden_history.json``) were computed by this very
code path before the package was reorganised, so a refactor that changes any
number, however slightly, fails here. Three runs cover the paths a step can take:
the defaults; a KL penalty with mu = 2 over two minibatches (reference model,
off-policy ratios, clipping); and Dr. GRPO's loss with a NaN-producing reward
(the NaN-aware advantages).

If a deliberate numerical change moves these numbers, regenerate the fixture in
that commit with ``python tests/test_golden.py --write`` and say why in the
commit message.
"""

from __future__ import annotations

import hashlib
import json
import sys
import warnings
from pathlib import Path

import torch

from grpo_tutorial import GRPOConfig, GRPOTrainer, TIMING_KEYS, build_tiny_policy, make_arithmetic_dataset
from grpo_tutorial.rewards import correctness_reward, partial_credit_reward

FIXTURE = Path(__file__).parent / "fixtures" / "golden_history.json"
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


def run(name: str) -> dict:
    kwargs, fns = RUNS[name]
    torch.set_num_threads(1)
    model, tokenizer = build_tiny_policy(seed=11)
    data = make_arithmetic_dataset(64, seed=13, digits=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = GRPOTrainer(model, tokenizer, fns, GRPOConfig(**kwargs))
        history = trainer.train(data, STEPS, progress=False)
    rows = [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in history]
    # JSON round trip: the stored form (NaN stays NaN in Python's json)
    return {"history": json.loads(json.dumps(rows)), "weights_sha256": _weights_digest(model)}


def _same(a, b) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_history_and_weights_are_bit_identical_to_the_stored_run():
    expected = json.loads(FIXTURE.read_text(encoding="utf-8"))
    assert sorted(expected) == sorted(RUNS)
    for name in RUNS:
        got = run(name)
        want = expected[name]
        for i, (g, w) in enumerate(zip(got["history"], want["history"])):
            common = sorted(set(g) & set(w))
            assert _same({k: g[k] for k in common}, {k: w[k] for k in common}), f"{name}: row {i} differs"
            assert set(w) <= set(g), f"{name}: row {i} lost fields {sorted(set(w) - set(g))}"
        assert len(got["history"]) == len(want["history"]) == STEPS
        assert got["weights_sha256"] == want["weights_sha256"], f"{name}: final weights differ"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/test_golden.py --write   (regenerates the fixture)")
    FIXTURE.write_text(json.dumps({name: run(name) for name in RUNS}, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {FIXTURE}")
