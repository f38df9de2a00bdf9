"""Stage 1: batched rollouts. Shapes, ordering, masks, truncation, one generate call."""

import pytest
import torch

from grpo_tutorial.rollout import Rollout, encode_prompts, generate_rollouts, render_prompts


def _count_generate(monkeypatch, model):
    """Wrap model.generate; return the list of recorded calls."""
    calls = []
    real = model.generate

    def wrapper(*args, **kwargs):
        calls.append(
            {
                "rows": kwargs["input_ids"].shape[0],
                "use_cache": kwargs.get("use_cache"),
                "training": model.training,
                "grad": torch.is_grad_enabled(),
                "input_ids": kwargs["input_ids"].clone(),
            }
        )
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "generate", wrapper)
    return calls


def test_one_generate_call_for_all_b_times_g(small_policy, monkeypatch):
    model, tok = small_policy
    calls = _count_generate(monkeypatch, model)
    r = generate_rollouts(model, tok, ["1+2=", "12+34=", "5*6="], group_size=4, max_new_tokens=3, generator_seed=0)
    assert len(calls) == 1
    assert calls[0]["rows"] == 12
    assert calls[0]["use_cache"] is True
    assert calls[0]["training"] is False and calls[0]["grad"] is False
    assert isinstance(r, Rollout) and len(r) == 12


def test_shapes_left_padding_and_group_order(small_policy):
    model, tok = small_policy
    prompts = ["1+2=", "12+34="]  # 5 and 7 tokens with <bos>
    r = generate_rollouts(model, tok, prompts, group_size=3, max_new_tokens=4, generator_seed=1)
    assert r.prompt_ids.shape == (6, 7) and r.prompt_mask.shape == (6, 7)
    assert r.completion_ids.shape[0] == 6 and 1 <= r.completion_ids.shape[1] <= 4
    assert r.completion_mask.shape == r.completion_ids.shape
    # group by group: rows 0-2 are prompt 0, rows 3-5 prompt 1
    assert r.prompt_index.tolist() == [0, 0, 0, 1, 1, 1]
    assert r.prompts == ["1+2=", "1+2=", "1+2=", "12+34=", "12+34=", "12+34="]
    assert r.group_size == 3 and r.num_prompts == 2
    short = tok("1+2=")["input_ids"]
    assert r.prompt_ids[0].tolist() == [tok.pad_token_id] * 2 + short  # left padding
    assert r.prompt_mask[0].tolist() == [0, 0, 1, 1, 1, 1, 1]
    assert r.prompt_mask[3].tolist() == [1] * 7
    assert r.prompt_ids[3].tolist() == tok("12+34=")["input_ids"]
    # the convenience views line up
    assert torch.equal(r.input_ids, torch.cat([r.prompt_ids, r.completion_ids], 1))
    assert r.attention_mask.shape == r.input_ids.shape


def test_masks_and_truncation_are_consistent(small_policy):
    model, tok = small_policy
    eos, pad = tok.eos_token_id, tok.pad_token_id
    r = generate_rollouts(model, tok, ["1+2=", "3+4=", "99+1="], group_size=8, max_new_tokens=5, generator_seed=3)
    for ids, mask, trunc, text in zip(r.completion_ids.tolist(), r.completion_mask.tolist(), r.truncated.tolist(), r.completions):
        if eos in ids:
            first = ids.index(eos)
            assert mask == [1.0] * (first + 1) + [0.0] * (len(ids) - first - 1)
            assert all(t == pad for t in ids[first + 1 :])  # generate pads after EOS
            assert trunc is False
            kept = ids[:first + 1]
        else:
            assert mask == [1.0] * len(ids)
            assert trunc is True
            kept = ids
        assert text == tok.decode(kept, skip_special_tokens=True)
    assert r.completion_lengths.tolist() == [sum(m) for m in r.completion_mask.tolist()]


class _ScriptedLM(torch.nn.Module):
    """A stand-in model whose generate returns fixed completions (to test the splitting exactly)."""

    def __init__(self, completions):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.completions = torch.tensor(completions)

    def generate(self, input_ids, attention_mask, **kwargs):
        assert input_ids.shape[0] == self.completions.shape[0]
        return torch.cat([input_ids, self.completions], dim=1)


def test_split_mask_truncation_and_decoding_exact(small_policy):
    _, tok = small_policy
    eos, pad = tok.eos_token_id, tok.pad_token_id
    one, two, plus = (tok.convert_tokens_to_ids(c) for c in "12+")
    scripted = [
        [one, eos, pad, pad],  # "1", stops
        [one, two, plus, one],  # "12+1", truncated
        [eos, pad, pad, pad],  # empty answer, stops at once
        [two, two, eos, pad],  # "22"
    ]
    model = _ScriptedLM(scripted)
    r = generate_rollouts(model, tok, ["1+1=", "5+6="], group_size=2, max_new_tokens=4)
    assert r.completion_ids.tolist() == scripted
    assert r.completion_mask.tolist() == [
        [1.0, 1.0, 0.0, 0.0],
        [1.0, 1.0, 1.0, 1.0],
        [1.0, 0.0, 0.0, 0.0],
        [1.0, 1.0, 1.0, 0.0],
    ]
    assert r.truncated.tolist() == [False, True, False, False]
    assert r.completions == ["1", "12+1", "", "22"]
    assert r.completion_lengths.tolist() == [2.0, 4.0, 1.0, 3.0]


def test_restores_train_mode_and_keeps_global_rng(small_policy):
    model, tok = small_policy
    model.train()
    state = torch.get_rng_state()
    a = generate_rollouts(model, tok, ["1+2=", "7+8="], group_size=4, max_new_tokens=4, generator_seed=11)
    assert model.training is True
    assert torch.equal(torch.get_rng_state(), state)  # seeded sampling leaves the caller's RNG alone
    b = generate_rollouts(model, tok, ["1+2=", "7+8="], group_size=4, max_new_tokens=4, generator_seed=11)
    c = generate_rollouts(model, tok, ["1+2=", "7+8="], group_size=4, max_new_tokens=4, generator_seed=12)
    assert torch.equal(a.completion_ids, b.completion_ids)
    assert not torch.equal(a.completion_ids, c.completion_ids)
    model.eval()
    generate_rollouts(model, tok, ["1+2="], group_size=2, max_new_tokens=2, generator_seed=0)
    assert model.training is False


def test_greedy_takes_the_argmax_and_padding_does_not_change_it(small_policy):
    model, tok = small_policy
    r = generate_rollouts(model, tok, ["1+2=", "12+34="], group_size=1, max_new_tokens=3, do_sample=False)
    with torch.no_grad():
        ids = torch.tensor([tok("1+2=")["input_ids"]])
        first = model(input_ids=ids).logits[0, -1].argmax().item()
    assert r.completion_ids[0, 0].item() == first
    alone = generate_rollouts(model, tok, ["1+2="], group_size=1, max_new_tokens=3, do_sample=False)
    width = alone.completion_ids.shape[1]
    assert torch.equal(alone.completion_ids[0], r.completion_ids[0, :width])  # left padding is invisible


def test_chat_template_and_system_prompt(small_policy):
    model, tok = small_policy
    # no template: plain text, and a system prompt is refused
    assert render_prompts(tok, ["1+2="]) == ["1+2="]
    with pytest.raises(ValueError, match="system_prompt"):
        render_prompts(tok, ["1+2="], system_prompt="0")
    with pytest.raises(ValueError, match="use_chat_template=True"):
        render_prompts(tok, ["1+2="], use_chat_template=True)
    # a toy template spelled with the tiny vocabulary: (system)(user)=
    tok.chat_template = (
        "{% for m in messages %}({{ m['content'] }}){% endfor %}{% if add_generation_prompt %}={% endif %}"
    )
    assert render_prompts(tok, ["1+2"]) == ["(1+2)="]
    assert render_prompts(tok, ["1+2"], system_prompt="0") == ["(0)(1+2)="]
    assert render_prompts(tok, [[{"role": "user", "content": "3"}]], system_prompt="0") == ["(0)(3)="]
    assert render_prompts(tok, ["1+2"], use_chat_template=False) == ["1+2"]
    r = generate_rollouts(model, tok, ["1+2"], group_size=2, max_new_tokens=2, system_prompt="0", generator_seed=0)
    # the template's text is tokenized without an extra <bos>
    assert r.prompt_ids[0].tolist() == tok("(0)(1+2)=", add_special_tokens=False)["input_ids"]
    # encode_prompts is that encoding, for callers that count prompt tokens (benchmarks/trainers.py)
    assert encode_prompts(tok, ["1+2"], system_prompt="0") == [r.prompt_ids[0].tolist()]
    assert encode_prompts(tok, ["1+2"], use_chat_template=False) == [tok("1+2")["input_ids"]]  # specials added


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (dict(prompts=[]), ValueError, "prompts is empty"),
        (dict(prompts="1+2="), TypeError, "list of strings"),
        (dict(prompts=["1+2=", 5]), TypeError, r"prompts\[1\]"),
        (dict(group_size=0), ValueError, "group_size"),
        (dict(max_new_tokens=0), ValueError, "max_new_tokens"),
        (dict(temperature=0.0), ValueError, "temperature"),
        (dict(top_p=1.5), ValueError, "top_p"),
        (dict(prompts=["1" * 70]), ValueError, "context of 64 tokens"),
        (dict(prompts=["1+1=", "What is 2+3?"]), ValueError, r"prompts\[1\]='What is 2\+3\?' contains characters"),
    ],
)
def test_bad_arguments(small_policy, kwargs, error, match):
    model, tok = small_policy
    args = dict(prompts=["1+2="], group_size=2, max_new_tokens=2)
    args.update(kwargs)
    with pytest.raises(error, match=match):
        generate_rollouts(model, tok, args.pop("prompts"), **args)


def test_every_eos_of_the_model_ends_a_completion(make_small_policy):
    """A second EOS id from the model's generation config stops, masks and un-truncates too."""
    from grpo_tutorial.rollout import generate_rollouts, stop_token_ids

    model, tok = make_small_policy(seed=3)
    extra = tok.convert_tokens_to_ids("7")
    model.generation_config.eos_token_id = [tok.eos_token_id, extra]
    assert stop_token_ids(model, tok) == [tok.eos_token_id, extra]
    out = generate_rollouts(model, tok, ["1+2=", "3+4="], group_size=8, max_new_tokens=12, generator_seed=0)
    for ids, mask, truncated in zip(out.completion_ids, out.completion_mask, out.truncated):
        stops = [i for i, t in enumerate(ids.tolist()) if t in (tok.eos_token_id, extra)]
        if stops:
            assert mask.sum() == stops[0] + 1 and not truncated
        else:
            assert mask.sum() == len(ids) and truncated


def test_shared_prompt_cache_samples_the_same_tokens(small_policy, monkeypatch):
    """Encoding each prompt once and copying its cache G times changes no sampled token."""
    import grpo_tutorial.rollout as rollout_module

    model, tok = small_policy
    prompts = ["12+34=", "5+6=", "71+8="]  # different lengths: left padding is exercised too
    calls = []
    real = rollout_module.shared_prompt_cache
    monkeypatch.setattr(rollout_module, "shared_prompt_cache", lambda *a: calls.append(1) or real(*a))
    shared = generate_rollouts(model, tok, prompts, group_size=4, max_new_tokens=6, generator_seed=3)
    assert calls == [1]
    monkeypatch.setattr(rollout_module, "generation_can_share_prompts", lambda m: False)
    plain = generate_rollouts(model, tok, prompts, group_size=4, max_new_tokens=6, generator_seed=3)
    assert torch.equal(shared.completion_ids, plain.completion_ids)
    assert torch.equal(shared.prompt_ids, plain.prompt_ids) and shared.completions == plain.completions
    assert len(set(shared.completions)) > 1  # really sampled, not all the same
