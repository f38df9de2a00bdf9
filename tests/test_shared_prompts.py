"""The shared-prompt scoring pass: each distinct prompt encoded once, same numbers.

``completion_logprobs(..., share_prompts=True)`` runs the U distinct prompts of a
batch through the model once and lets the N rows read their KV cache. It must
give the full pass's log-probs, entropies and gradients up to float rounding,
for left-padded prompts of different lengths, rows in any order and completions
that stop early; it must do less work; and it must step aside where it would not
be the same computation (gradient checkpointing, active dropout).
"""

from __future__ import annotations

import warnings

import pytest
import torch

from grpo_tutorial.logprobs import completion_logprobs
from grpo_tutorial.rollout import generate_rollouts
from grpo_tutorial.speedups import can_share_prompts, shared_prompt_logits
from helpers import tiny_model

G = 4


def _batch(seed: int = 0, completion_len: int = 5):
    """Three prompts of different lengths, G rows each, shuffled; some completions stop early."""
    torch.manual_seed(seed)
    model, tokenizer = tiny_model(seed=seed)
    rollout = generate_rollouts(
        model, tokenizer, ["1+2=", "13+24=", "(7*8)-9="], group_size=G, max_new_tokens=completion_len,
        generator_seed=seed,
    )
    order = torch.randperm(len(rollout), generator=torch.Generator().manual_seed(seed))  # [N]
    input_ids = rollout.input_ids[order]  # [N, Tp+Tc]
    attention_mask = rollout.attention_mask[order]  # [N, Tp+Tc]
    return model, input_ids, attention_mask, rollout.completion_ids.shape[1]


def _score(model, ids, mask, tc, share, **kw):
    return completion_logprobs(model, ids, mask, tc, share_prompts=share, return_entropy=True, **kw)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shared_pass_gives_the_full_pass_logprobs_and_entropies(seed):
    model, ids, mask, tc = _batch(seed)
    assert (mask[:, :-tc] == 0).any(), "the prompts must be left-padded for this test to mean anything"
    assert (mask[:, -tc:] == 0).any(), "some completion must stop early for this test to mean anything"
    model.eval()
    with torch.no_grad():
        full_logp, full_ent = _score(model, ids, mask, tc, share=False)
        shared_logp, shared_ent = _score(model, ids, mask, tc, share=True)
    torch.testing.assert_close(shared_logp, full_logp, rtol=0, atol=1e-5)
    torch.testing.assert_close(shared_ent, full_ent, rtol=0, atol=1e-5)


def test_shared_pass_gives_the_full_pass_gradients():
    model, ids, mask, tc = _batch(3)
    model.train()
    weights = torch.linspace(-1.0, 1.0, ids.shape[0])[:, None] * mask[:, -tc:]  # [N, Tc]
    grads = {}
    for share in (False, True):
        model.zero_grad(set_to_none=True)
        logp, entropy = _score(model, ids, mask, tc, share=share, entropy_grad=True)
        ((logp * weights).sum() + 0.1 * entropy.sum()).backward()
        grads[share] = [p.grad.clone() for p in model.parameters()]
    for full, shared in zip(grads[False], grads[True]):
        # A gradient entry is a sum over every token, so its rounding error scales with the
        # tensor's largest entries, not with the entry itself: an absolute tolerance of 1e-6
        # passed on an AVX512 CPU and failed on an AVX2 one (2.6e-6 on an entry of 3.6e-3 in
        # the embedding gradient, whose largest entry is 7.5; every tensor agrees to ~1e-6 of
        # its own scale). A real mistake (a position off by one) moves entries by O(scale).
        torch.testing.assert_close(shared, full, rtol=1e-4, atol=1e-5 * float(full.abs().max()))
    assert sum(float(g.abs().sum()) for g in grads[True]) > 0


def test_a_one_token_completion_needs_only_the_prompt_pass():
    model, ids, mask, tc = _batch(4, completion_len=1)
    assert tc == 1
    with torch.no_grad():
        full = completion_logprobs(model, ids, mask, tc)
        shared = completion_logprobs(model, ids, mask, tc, share_prompts=True)
    torch.testing.assert_close(shared, full, rtol=0, atol=1e-5)


def _tokens_seen(model, fn) -> int:
    """How many token positions went through the model's embedding during ``fn()``."""
    seen = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, args, out: seen.append(args[0].numel()))
    try:
        fn()
    finally:
        hook.remove()
    return sum(seen)


def test_each_distinct_prompt_is_encoded_once():
    model, ids, mask, tc = _batch(5)
    n, t = ids.shape
    tp = t - tc
    with torch.no_grad():
        full = _tokens_seen(model, lambda: completion_logprobs(model, ids, mask, tc))
        shared = _tokens_seen(model, lambda: completion_logprobs(model, ids, mask, tc, share_prompts=True))
    assert full == n * t
    assert shared == 3 * tp + n * (tc - 1)  # 3 distinct prompts once, then every completion but its last token


def test_no_repeated_prompt_means_the_plain_pass():
    model, ids, mask, tc = _batch(6)
    _, first = torch.unique(ids[:, :-tc], dim=0, return_inverse=True)
    one_per_prompt = torch.tensor([int((first == u).nonzero()[0]) for u in first.unique()])  # [3]
    assert shared_prompt_logits(model, ids[one_per_prompt], mask[one_per_prompt], tc) is None


def test_gradient_checkpointing_and_dropout_fall_back_to_the_full_pass():
    model, ids, mask, tc = _batch(7)
    model.train()
    assert can_share_prompts(model)
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    disable = getattr(model, "activation_checkpointing_disable", None) or model.gradient_checkpointing_disable
    enable()
    assert not can_share_prompts(model)  # transformers switches the KV cache off under checkpointing
    disable()
    assert can_share_prompts(model)
    model.model.layers[0].self_attn.attention_dropout = 0.1  # training with dropout: G masks, not one
    assert not can_share_prompts(model)
    assert shared_prompt_logits(model, ids, mask, tc) is None
    model.eval()  # no dropout in eval mode
    assert can_share_prompts(model)
    assert not can_share_prompts(torch.nn.Linear(2, 2))  # not a transformers causal LM


def test_the_trainer_default_shares_and_the_flag_turns_it_off(make_tiny_policy):
    from grpo_tutorial import GRPOConfig, GRPOTrainer, make_arithmetic_dataset
    from grpo_tutorial.rewards import correctness_reward

    data = make_arithmetic_dataset(4, seed=0, digits=1)
    seen = {}
    for share in (True, False):
        model, tokenizer = make_tiny_policy(seed=0)
        config = GRPOConfig(prompts_per_step=4, group_size=4, share_prompt_cache=share, seed=0)
        trainer = GRPOTrainer(model, tokenizer, correctness_reward, config)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an untrained model: no signal, truncated completions
            seen[share] = _tokens_seen(model, lambda: trainer.train_step(data))
    assert GRPOConfig().share_prompt_cache is True
    assert seen[True] < seen[False]
    with pytest.raises(TypeError, match="share_prompt_cache"):  # a wrong type: TypeError, the package's policy
        GRPOConfig(share_prompt_cache="yes")


def test_the_kv_cache_goes_by_the_name_this_transformers_takes(make_small_policy):
    """transformers 5.24 renamed past_key_values to cache; the shared passes use the model's own name."""
    from grpo_tutorial.speedups import cache_argument, returned_cache

    model, _ = make_small_policy(num_layers=1, intermediate_size=32)
    takes_cache = "cache" in __import__("inspect").signature(model.forward).parameters
    assert cache_argument(model) == ("cache" if takes_cache else "past_key_values")

    class Old(torch.nn.Module):  # a model of the older API
        def forward(self, input_ids, past_key_values=None, use_cache=False):
            return input_ids

    assert cache_argument(Old()) == "past_key_values"
    out = model(torch.tensor([[1, 5, 6]]), use_cache=True)
    assert returned_cache(out) is not None and returned_cache(out).get_seq_length() == 3


def test_sampling_and_scoring_with_shared_prompts_raise_no_deprecation_warning(make_small_policy):
    """Passing the cache under its old name warns at every call in transformers 5.24 (chapter 10 printed them)."""
    model, tok = make_small_policy(num_layers=1, intermediate_size=32)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rollout = generate_rollouts(model, tok, ["12+3=", "4+5="], group_size=4, max_new_tokens=3, onednn=False)
        ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
        mask = torch.cat([rollout.prompt_mask, rollout.completion_mask.long()], dim=1)
        completion_logprobs(model, ids, mask, rollout.completion_ids.shape[1], share_prompts=True)
    assert [str(w.message) for w in caught if "deprecated" in str(w.message)] == []
