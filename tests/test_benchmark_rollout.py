"""The rollout benchmark's harness: forcing full-length completions changes no sample."""

import torch

from benchmarks.rollout import NoStopTokens, fixed_length, generated_tokens
from grpo_tutorial.rollout import generate_rollouts, stop_token_ids


def _rollout(model, tokenizer, seed):
    return generate_rollouts(model, tokenizer, ["12+34=", "5+6="], group_size=4, max_new_tokens=6, generator_seed=seed)


def test_suppressing_stop_tokens_in_place_samples_what_min_new_tokens_samples(tiny_policy):
    model, tokenizer = tiny_policy
    for seed in range(3):
        model.generation_config.min_new_tokens = 6  # transformers' way: torch.where, a new [N, V] tensor
        try:
            reference = _rollout(model, tokenizer, seed)
        finally:
            model.generation_config.min_new_tokens = None
        with fixed_length(model, tokenizer):  # ours: -inf written in place
            forced = _rollout(model, tokenizer, seed)
        assert torch.equal(forced.completion_ids, reference.completion_ids)
        assert generated_tokens(forced) == 2 * 4 * 6  # every completion ran to the budget
    assert "generate" not in vars(model)  # the context manager put the class's method back
    free = _rollout(model, tokenizer, 0)
    stops = torch.tensor(stop_token_ids(model, tokenizer))
    assert torch.isin(free.completion_ids, stops).any(), "untrained, the model does sample stop tokens"


def test_no_stop_tokens_writes_minus_infinity_only_there():
    scores = torch.zeros(3, 10)  # [N, V]
    out = NoStopTokens([2, 7])(torch.zeros(3, 1, dtype=torch.long), scores)
    assert out is scores
    assert torch.isinf(out[:, [2, 7]]).all() and (out[:, [0, 1, 3, 4, 5, 6, 8, 9]] == 0).all()


def test_shared_pass_flops_count_each_prompt_once(tiny_policy):
    from benchmarks.mfu import flop_counts, shared_flop_counts

    model, _ = tiny_policy
    full = flop_counts(model, rows=8, seq_len=7 + 4, completion_len=4)
    body, head = full["non_embedding_parameters"], full["output_layer_parameters"]
    width, layers = model.config.hidden_size, model.config.num_hidden_layers  # tiny: heads * head_dim = hidden
    # 2 distinct prompts of 7 tokens once, then 8 rows x 3 completion tokens attending to 7 + 3 keys
    expected = 6.0 * body * (2 * 7 + 8 * 3) + 6.0 * head * (2 + 8 * 3) + 12 * layers * width * (2 * 49 + 8 * 3 * 10)
    assert shared_flop_counts(model, rows=8, prompts=2, prompt_len=7, completion_len=4) == expected
    assert shared_flop_counts(model, rows=8, prompts=2, prompt_len=7, completion_len=4) < full["flops_counted"]
