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


def test_the_builders_make_a_new_model_at_each_call_with_the_fixtures_seeds_and_shapes(
    make_tiny_policy, make_small_policy, small_policy
):
    from grpo_tutorial import build_tiny_policy

    same = lambda a, b: all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))  # noqa: E731
    first, _ = make_tiny_policy(seed=4)
    second, _ = make_tiny_policy(seed=4)
    assert first is not second and same(first, second) and same(first, build_tiny_policy(seed=4)[0])
    assert not same(first, make_tiny_policy(seed=5)[0])
    small, _ = make_small_policy()
    assert small is not small_policy[0] and same(small, small_policy[0])
    variant, tok = make_small_policy(seed=3, num_layers=1)
    assert (variant.config.hidden_size, variant.config.num_hidden_layers, variant.config.num_attention_heads,
            variant.config.intermediate_size) == (32, 1, 2, 64)
    assert same(variant, build_tiny_policy(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, seed=3)[0])
    assert len(tok) == len(small_policy[1])


def test_hub_offline_sets_the_flag_for_the_test(monkeypatch, request):
    import os

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    request.getfixturevalue("hub_offline")
    assert os.environ["HF_HUB_OFFLINE"] == "1"


def test_run_dir_is_a_fresh_path_under_tmp_path(run_dir, tmp_path):
    assert run_dir == tmp_path / "run" and not run_dir.exists() and tmp_path.is_dir()
