"""The shared fixtures of ``tests/conftest.py`` are what their docstrings say."""

import torch


def test_tiny_batch_is_two_digit_additions_the_tiny_tokenizer_encodes(tiny_batch, tiny_policy):
    _, tok = tiny_policy
    assert len(tiny_batch) == 4 and all(set(row) == {"prompt", "answer"} for row in tiny_batch)
    for row in tiny_batch:
        a, b = row["prompt"].removesuffix("=").split("+")
        assert row["prompt"].endswith("=") and len(a) <= 2 and len(b) <= 2
        assert row["answer"] == str(int(a) + int(b))
        ids = tok(row["prompt"] + row["answer"], add_special_tokens=False)["input_ids"]
        assert len(ids) == len(row["prompt"] + row["answer"])  # one token per character
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == row["prompt"] + row["answer"]


def test_the_policies_have_their_shapes_and_seed_0(tiny_policy, small_policy):
    from grpo_tutorial import build_tiny_policy

    tiny, _ = tiny_policy
    small, _ = small_policy
    assert (tiny.config.hidden_size, tiny.config.num_hidden_layers, tiny.config.num_attention_heads) == (128, 3, 4)
    assert sum(p.numel() for p in tiny.parameters()) == 791_168
    assert (small.config.hidden_size, small.config.num_hidden_layers, small.config.num_attention_heads,
            small.config.intermediate_size) == (32, 2, 2, 64)
    again, _ = build_tiny_policy(seed=0)
    assert all(torch.equal(p, q) for p, q in zip(tiny.parameters(), again.parameters()))
    assert not tiny.training  # eval mode, as build_tiny_policy returns it


def test_run_dir_is_a_fresh_path_under_tmp_path(run_dir, tmp_path):
    assert run_dir == tmp_path / "run" and not run_dir.exists() and tmp_path.is_dir()
