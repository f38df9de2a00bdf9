"""The oneDNN speed-up of ``grpo_tutorial.speedups``: generation's linear layers on oneDNN give the same
products, the same samples, and leave nothing behind.

The other two speed-ups are tested with their stage: the blocked scorer in ``tests/test_logprobs.py``, the
shared-prompt cache in ``tests/test_shared_prompts.py`` and ``tests/test_rollout.py``.
"""

import pytest
import torch

from grpo_tutorial.logprobs import completion_logprobs
from grpo_tutorial.rollout import generate_rollouts
from grpo_tutorial.speedups import onednn_available, onednn_linears, use_onednn

pytestmark = pytest.mark.skipif(not onednn_available(), reason="this PyTorch build has no oneDNN packed linear")

PROMPTS = ["12+34=", "5+6=", "71+8="]  # different lengths: left padding is exercised too


@pytest.fixture
def tiny(make_small_policy):
    model, tok = make_small_policy(hidden_size=64, num_heads=4, intermediate_size=128)  # twice as wide
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # Qwen2 starts its q, k, v biases at zero; make them matter
        for m in model.modules():
            if type(m) is torch.nn.Linear and m.bias is not None:
                m.bias.copy_(0.5 * torch.randn(m.bias.shape, generator=gen))
    return model, tok


def _switched(model):
    return [name for name, m in model.named_modules() if "forward" in vars(m)]


def test_every_linear_layer_is_switched_and_gives_the_same_product(tiny):
    model, _ = tiny
    n_linear = sum(type(m) is torch.nn.Linear for m in model.modules())
    assert n_linear == 2 * 7 + 1  # q, k, v, o, gate, up, down per layer, and the output layer
    x = torch.randn(3, 5, 64)
    layer = model.model.layers[0].self_attn.q_proj  # Qwen2's q projection has a bias
    assert layer.bias is not None and layer.bias.abs().max() > 0.1
    with torch.no_grad():
        expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
        with onednn_linears(model, rows=3) as switched:
            assert switched == n_linear and len(_switched(model)) == n_linear
            got = layer(x)
    assert got.shape == expected.shape
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert not torch.equal(got, torch.zeros_like(got))
    assert _switched(model) == []  # the class's forward again


def test_logits_agree_with_the_model_own_layers(tiny):
    model, tok = tiny
    ids = torch.tensor([tok("12+34=")["input_ids"], tok("98+76=")["input_ids"]])
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with onednn_linears(model, rows=2):
            fast = model(input_ids=ids).logits
    assert (fast - plain).abs().max() <= 1e-5 * plain.abs().max()


def test_sampled_tokens_have_the_scorer_log_probs_within_1e_5(tiny):
    # the tokens are sampled from oneDNN's logits; the trainer scores them with the
    # model's own layers. The two distributions must agree token by token.
    model, tok = tiny
    rollout = generate_rollouts(model, tok, PROMPTS, group_size=4, max_new_tokens=6, generator_seed=3, onednn=True)
    T = rollout.completion_ids.shape[1]
    with torch.no_grad():
        scorer = completion_logprobs(model, rollout.input_ids, rollout.attention_mask, T)  # [N, T]
        with onednn_linears(model, rows=len(rollout)):
            sampler = completion_logprobs(model, rollout.input_ids, rollout.attention_mask, T)  # [N, T]
    mask = rollout.completion_mask.bool()
    assert mask.sum() > 20
    assert (sampler - scorer)[mask].abs().max() < 1e-5


def test_same_tokens_as_the_model_own_layers_for_these_seeds(tiny):
    # float rounding could in principle flip a near-tie between two tokens; on this
    # PyTorch build it does not happen for these seeds, so the book's runs are unchanged
    model, tok = tiny
    for seed in range(5):
        fast = generate_rollouts(model, tok, PROMPTS, group_size=4, max_new_tokens=6, generator_seed=seed, onednn=True)
        plain = generate_rollouts(model, tok, PROMPTS, group_size=4, max_new_tokens=6, generator_seed=seed, onednn=False)
        assert torch.equal(fast.completion_ids, plain.completion_ids)
    assert len(set(fast.completions)) > 1  # really sampled


def test_generate_rollouts_uses_it_by_default_on_cpu_float32(tiny, monkeypatch):
    import grpo_tutorial.rollout as rollout_module

    model, tok = tiny
    rows = []
    real = rollout_module.onednn_linears
    monkeypatch.setattr(rollout_module, "onednn_linears", lambda m, **kw: rows.append(kw["rows"]) or real(m, **kw))
    generate_rollouts(model, tok, PROMPTS, group_size=4, max_new_tokens=3, generator_seed=0)
    assert rows == [12]  # B*G rows: the decoding step's batch
    generate_rollouts(model, tok, PROMPTS, group_size=4, max_new_tokens=3, generator_seed=0, onednn=False)
    assert rows == [12]
    assert _switched(model) == []


def test_weights_changed_between_calls_are_used(tiny):
    # the trainer updates the weights between rollouts: each call must pack them anew
    model, _ = tiny
    layer = model.lm_head
    x = torch.randn(2, 64)
    with torch.no_grad():
        with onednn_linears(model, rows=2):
            before = layer(x)
        layer.weight.mul_(2.0)
        with onednn_linears(model, rows=2):
            after = layer(x)
        expected = torch.nn.functional.linear(x, layer.weight)
    assert torch.allclose(after, expected, rtol=1e-5, atol=1e-6)
    assert torch.allclose(after, 2 * before, rtol=1e-5, atol=1e-6)


def test_layers_are_restored_after_an_exception(tiny):
    model, _ = tiny
    with pytest.raises(RuntimeError, match="boom"):
        with onednn_linears(model, rows=4):
            assert _switched(model)
            raise RuntimeError("boom")
    assert _switched(model) == []


def test_when_it_applies(make_small_policy):
    model, _ = make_small_policy(num_layers=1)
    assert use_onednn(model, None) is True
    assert use_onednn(model, True) is True
    assert use_onednn(model, False) is False
    model.double()
    assert use_onednn(model, None) is False  # float64: the model's own layers
    with pytest.raises(ValueError, match="float32 models on the CPU"):
        use_onednn(model, True)
    assert use_onednn(torch.nn.Embedding(3, 4), None) is False  # no linear layer
    assert use_onednn(object(), None) is False
    with pytest.raises(ValueError, match="not a torch.nn.Module"):
        use_onednn(object(), True)


def test_generate_rollouts_refuses_onednn_true_where_it_cannot_apply(make_small_policy):
    model, tok = make_small_policy(num_layers=1)
    model.double()
    with pytest.raises(ValueError, match="onednn=True cannot be used"):
        generate_rollouts(model, tok, PROMPTS, group_size=2, max_new_tokens=2, generator_seed=0, onednn=True)
    r = generate_rollouts(model, tok, PROMPTS, group_size=2, max_new_tokens=2, generator_seed=0)  # auto: plain
    assert len(r) == 6


def test_rows_must_be_positive(tiny):
    model, _ = tiny
    with pytest.raises(ValueError, match="rows must be >= 1"):
        with onednn_linears(model, rows=0):
            pass


def test_the_trainer_passes_its_setting_to_sampling_and_evaluation(monkeypatch, make_small_policy):
    import grpo_tutorial.evaluation as evaluation_module
    import grpo_tutorial.sampling.base as sampling_module
    from grpo_tutorial import GRPOConfig, GRPOTrainer, correctness_reward

    model, tok = make_small_policy(num_layers=1)
    seen = []
    for module in (sampling_module, evaluation_module):  # the policy's sampler, then the evaluation
        real = module.generate_rollouts
        monkeypatch.setattr(module, "generate_rollouts",
                            lambda *a, _real=real, **kw: seen.append(kw["onednn"]) or _real(*a, **kw))
    rows = [{"prompt": "1+2=", "answer": "3"}, {"prompt": "4+4=", "answer": "8"}]
    for setting in (None, False, True):
        config = GRPOConfig(group_size=2, prompts_per_step=2, max_new_tokens=2, onednn_generation=setting, seed=0)
        trainer = GRPOTrainer(model, tok, [correctness_reward], config)
        seen.clear()
        trainer.train(rows, 1, progress=False)
        trainer.evaluate(rows)
        assert seen == [setting, setting]
    with pytest.raises(TypeError, match="onednn_generation"):  # a wrong type: TypeError, the package's policy
        GRPOConfig(onednn_generation="yes")


def test_a_layer_with_its_own_forward_is_left_alone_and_keeps_it(tiny):
    # a hook library's wrapper or a user's patch must neither be bypassed nor removed
    model, _ = tiny
    layer = model.model.layers[0].mlp.down_proj
    calls = []
    own = lambda x, _layer=layer: calls.append(1) or torch.nn.functional.linear(x, _layer.weight, _layer.bias)
    layer.forward = own
    n_linear = sum(type(m) is torch.nn.Linear for m in model.modules())
    x = torch.randn(2, 128)
    with onednn_linears(model, rows=2) as switched:
        assert switched == n_linear - 1
        layer(x)
    assert calls == [1] and vars(layer)["forward"] is own
    del layer.forward


def test_entering_twice_switches_once_and_restores_everything(tiny):
    model, _ = tiny
    with onednn_linears(model, rows=2) as outer:
        with onednn_linears(model, rows=2) as inner:
            assert outer > 0 and inner == 0
        assert len(_switched(model)) == outer  # the inner block removed nothing
    assert _switched(model) == []


def test_not_under_autocast_or_with_onednn_disabled_or_off_the_cpu(make_small_policy):
    model, _ = make_small_policy(num_layers=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert use_onednn(model, None) is False
        with pytest.raises(ValueError, match="autocast"):
            use_onednn(model, True)
    with torch.backends.mkldnn.flags(enabled=False):
        assert use_onednn(model, None) is False
    assert use_onednn(model, None) is True
    meta = model.to("meta")
    assert use_onednn(meta, None) is False
    with pytest.raises(ValueError, match="float32 models on the CPU"):
        use_onednn(meta, True)


@pytest.mark.parametrize("setting", [0, 1, "no", "auto"])
def test_a_setting_that_is_not_none_or_a_bool_is_refused(setting, make_small_policy):
    model, tok = make_small_policy(num_layers=1)
    with pytest.raises(TypeError, match="onednn must be None, True or False"):
        use_onednn(model, setting)
    with pytest.raises(TypeError, match="onednn must be None, True or False"):
        generate_rollouts(model, tok, PROMPTS, group_size=2, max_new_tokens=2, generator_seed=0, onednn=setting)
