"""The public API contract: the names and signatures ``book/architecture.md`` promises, importable from the package.

CONTRACT is the stable core: notebooks, tests and outside code rely on these names, their
argument order and defaults, so a change to one is made on purpose, with this test and the
book in the same commit. Everything else in ``grpo_tutorial.__all__`` is exported and must exist.
"""

import inspect

import grpo_tutorial
from grpo_tutorial.loss import NAMED_OPTIONS, LossOptions

CONTRACT = [
    "group_advantages", "token_logprobs", "completion_mask", "kl_estimate", "grpo_loss",
    "sequence_logprob_loss", "extract_answer", "correctness_reward", "format_reward",
    "combined_reward", "make_arithmetic_dataset", "make_countdown_dataset", "load_gsm8k",
    "load_policy", "build_tiny_policy", "GRPOConfig", "GRPOTrainer", "plot_history",
]


def test_contract_names_are_exported():
    missing = [name for name in CONTRACT if not hasattr(grpo_tutorial, name)]
    assert missing == []
    assert set(CONTRACT) <= set(grpo_tutorial.__all__)
    assert all(hasattr(grpo_tutorial, name) for name in grpo_tutorial.__all__)


def test_contract_signatures():
    sig = inspect.signature(grpo_tutorial.group_advantages)
    assert list(sig.parameters)[:2] == ["rewards", "group_size"]
    assert {k: sig.parameters[k].default for k in ("scale", "std", "eps")} == {"scale": "group", "std": "sample", "eps": 1e-4}
    sig = inspect.signature(grpo_tutorial.grpo_loss)
    assert list(sig.parameters)[:4] == ["logp", "old_logp", "advantages", "mask"]
    named = ("beta", "clip_eps", "clip_eps_high", "loss_type", "max_completion_length")  # by name; defaults: LossOptions'
    assert set(named) <= set(NAMED_OPTIONS)
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    defaults = {"ref_logp": sig.parameters["ref_logp"].default, **{k: getattr(LossOptions(), k) for k in named}}
    assert defaults == {"ref_logp": None, "beta": 0.0, "clip_eps": 0.2, "clip_eps_high": None, "loss_type": "grpo", "max_completion_length": None}
    assert inspect.signature(grpo_tutorial.kl_estimate).parameters["kind"].default == "k3"
    reward_params = inspect.signature(grpo_tutorial.correctness_reward).parameters
    assert reward_params["answer"].kind is inspect.Parameter.KEYWORD_ONLY
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in reward_params.values())
