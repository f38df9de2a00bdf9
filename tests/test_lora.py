"""LoRA in the trainer, through PEFT (issue 32, item 1): ``GRPOConfig(use_peft=True)``.

What a user of TRL expects, each checked here on the tiny models of conftest.py:

- the KL's reference is the base with the adapters switched off, no second copy,
  and at step 0 it gives the untrained model's log-probs *exactly* (PEFT starts
  ``B`` at zero, so each adapted layer adds ``B A x = 0``: the sums are the base
  layer's own sums plus exact zeros, bit for bit), so the first step's KL is 0.0;
- only the adapters train, AdamW holds only them, and the base weights stay
  bit-identical;
- dropout in the adapters is off in every pass (``disable_dropout``), so with
  ``lora_dropout=0.05`` the first pass's ratio is exactly 1;
- a checkpoint holds the adapters, their optimizer state and the run state, not
  the base: it is a few per cent of a full run's, and a resumed run repeats the
  uninterrupted one's history exactly;
- the adapters merged into the base (``merge_and_unload``) give the adapter
  model's greedy completions;
- the command line trains, resumes, evaluates, plots and exports a LoRA run.
"""

from __future__ import annotations

import copy
import json
import math
import sys
import warnings

import pytest
import torch

peft = pytest.importorskip("peft")

# PEFT 0.21 reads transformers 5's deprecated is_gradient_checkpointing when it wraps a model
pytestmark = pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")

import grpo_tutorial.step as step_module  # noqa: E402
from grpo_tutorial import load_policy  # noqa: E402
from grpo_tutorial.config import GRPOConfig  # noqa: E402
from grpo_tutorial.lora import (  # noqa: E402
    REFERENCE_ADAPTER, AdapterPolicies, AdapterWeights, adapter_of, base_fingerprint, export_merged, merged_model,
)
from grpo_tutorial.logprobs import score_rollout  # noqa: E402
from grpo_tutorial.metrics import LEGACY_SECONDS, SAMPLER_SECONDS, TIMING_KEYS  # noqa: E402
from grpo_tutorial.rollout import generate_rollouts  # noqa: E402
from grpo_tutorial.speedups import can_share_prompts, generation_can_share_prompts  # noqa: E402
from grpo_tutorial.tasks import make_arithmetic_dataset  # noqa: E402
from grpo_tutorial.trainer import GRPOTrainer, GRPOWarning  # noqa: E402

#: The tiny LoRA runs' settings: small batches, a learning rate that moves the adapters in one step.
RUN = dict(group_size=4, prompts_per_step=4, max_new_tokens=3, beta=0.05, learning_rate=1e-2)


def reward(completions, **kwargs):
    """Varies a lot for an untrained model, so every group has a learning signal."""
    return [float(len(c)) for c in completions]


def rows(n=32, seed=0):
    return make_arithmetic_dataset(n, seed, digits=1)


def lora(**kwargs) -> GRPOConfig:
    return GRPOConfig(**{**RUN, "use_peft": True, "lora_r": 4, **kwargs})


def quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GRPOWarning)
        return fn(*args, **kwargs)


def base_weights(model) -> dict[str, torch.Tensor]:
    """A PEFT model's base weights under the names the unwrapped model gives them."""
    return {
        key.removeprefix("base_model.model.").replace(".base_layer.", "."): value.detach().clone()
        for key, value in model.state_dict().items() if adapter_of(key) is None
    }


def adapter_parameters(model, adapter="default") -> list[torch.nn.Parameter]:
    return [p for name, p in model.named_parameters() if adapter_of(name) == adapter]


def comparable(history):
    return [json.dumps({k: v for k, v in row.items() if k not in TIMING_KEYS}, sort_keys=True) for row in history]


# ---------------------------------------------------------------------------
# The fields, against TRL's
# ---------------------------------------------------------------------------


def test_the_fields_have_trls_names_and_defaults_but_every_linear_layer():
    trl = pytest.importorskip("trl")
    theirs, ours = trl.ModelConfig(), GRPOConfig()
    for name in ("use_peft", "lora_r", "lora_alpha", "lora_dropout"):
        assert getattr(ours, name) == getattr(theirs, name), name  # False, 16, 32, 0.05
    # deliberately not TRL's None (PEFT's per-model default, q_proj and v_proj for Qwen2): every linear layer
    assert theirs.lora_target_modules is None and ours.lora_target_modules == "all-linear"
    assert peft.LoraConfig(r=4, target_modules=None).target_modules is None


def test_the_lora_config_is_the_one_trls_get_peft_config_makes_from_the_same_names():
    trl_utils = pytest.importorskip("trl.trainer.utils")
    from grpo_tutorial.lora import lora_config

    names = dict(lora_r=8, lora_alpha=24, lora_dropout=0.1, lora_target_modules=["q_proj", "up_proj"])
    theirs = trl_utils.get_peft_config(__import__("trl").ModelConfig(use_peft=True, **names))
    ours = lora_config(GRPOConfig(use_peft=True, **names))
    for field in ("r", "lora_alpha", "lora_dropout", "target_modules", "bias", "task_type", "use_rslora", "use_dora"):
        assert getattr(ours, field) == getattr(theirs, field), field


# ---------------------------------------------------------------------------
# The reference: the base, adapters off, no copy; KL exactly 0 at step 0
# ---------------------------------------------------------------------------


def test_the_reference_is_the_base_with_the_adapters_off_and_the_first_kl_is_zero_to_rounding(small_policy):
    model, tok = small_policy
    untrained = copy.deepcopy(model)
    trainer = GRPOTrainer(model, tok, reward, lora(num_iterations=1))
    policies = trainer.grpo_step.policies
    assert isinstance(policies, AdapterPolicies) and trainer.ref_model is None  # no second model
    assert isinstance(trainer.model, peft.PeftModel) and trainer.model.base_model.model is model  # wrapped in place
    rollout = generate_rollouts(untrained, tok, ["1+2=", "3+4="], group_size=4, max_new_tokens=3, generator_seed=0)
    expected = score_rollout(untrained, rollout)
    with policies.reference() as reference:
        assert reference is trainer.model
        base = score_rollout(reference, rollout)
    # The base is the untrained model: the same products as the plain copy's, to float32 rounding (not bit for
    # bit: under MKL_ENABLE_INSTRUCTIONS=SSE4_2 MKL rounds PEFT's wrapped layers' products and the copy's in the
    # last bit, 2.4e-7 on log-probs of about 3). The allowance: float32's unit roundoff 6e-8, times the 64 terms
    # of the longest dot product, times 3 for the chained products they pass through: 1.2e-5 relative.
    torch.testing.assert_close(base, expected, rtol=64 * 3 * 6e-8, atol=0)
    # the adapters add B A x with B = 0: exact zeros, so the policy is the reference bit for bit
    assert torch.equal(score_rollout(trainer.model, rollout), base)
    assert all(torch.count_nonzero(p) == 0 for n, p in trainer.model.named_parameters() if "lora_B" in n)

    row = quiet(trainer.train_step, rows()[:4])
    # The first KL is 0 in exact arithmetic (B = 0: the policy is the base). The step's on-policy pass (the update's
    # forward, with gradients) and its reference pass are two computations of the same numbers; where the kernels
    # round them alike it is exactly 0 (the default kernels here), elsewhere rounding squared (5.9e-16 under
    # ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=AVX2 on this Intel Xeon): the bound of the given-adapter
    # test below, log-probs within 1.2e-5 relative and |log p| under 4: (4.8e-5)^2 / 2 = 1.2e-9. A reference that is
    # not the starting policy is orders above it (the given adapter's bare base: 0.012).
    assert row["kl"] <= (4 * 64 * 3 * 6e-8) ** 2 / 2
    assert row["reward_std"] > 0 and row["grad_norm"] > 0  # and the step did learn something
    with policies.reference() as reference:  # after the update: the reference is still the untrained base
        assert torch.equal(score_rollout(reference, rollout), base)
    assert not torch.equal(score_rollout(trainer.model, rollout), base)  # the policy moved


def test_only_the_adapters_train_adamw_holds_only_them_and_the_base_stays_bit_identical(small_policy):
    model, tok = small_policy
    before = copy.deepcopy(model.state_dict())
    trainer = GRPOTrainer(model, tok, reward, lora(num_iterations=2))
    adapters = adapter_parameters(trainer.model)
    held = [p for group in trainer.optimizer.param_groups for p in group["params"]]
    assert {id(p) for p in held} == {id(p) for p in adapters} and len(held) == len(adapters)
    assert {name for name, p in trainer.model.named_parameters() if p.requires_grad} == {
        name for name, _ in trainer.model.named_parameters() if adapter_of(name) == "default"}
    # every linear layer but the output layer: q, k, v, o, gate, up, down in each of the 2 layers, A and B each
    assert len(adapters) == 2 * 7 * 2
    adapted = copy.deepcopy([p.detach() for p in adapters])
    quiet(trainer.train, rows(), 3, progress=False)
    assert base_weights(trainer.model).keys() == before.keys()
    assert all(torch.equal(value, before[key]) for key, value in base_weights(trainer.model).items())
    assert not all(torch.equal(a, p) for a, p in zip(adapted, adapters))  # the adapters did move
    state = trainer.optimizer.state_dict()["state"]
    assert len(state) == len(adapters) and all(int(s["step"]) == 6 for s in state.values())  # 3 steps x mu 2


def test_attention_only_and_pefts_default_targets(make_small_policy):
    model, tok = make_small_policy(seed=0)
    trainer = GRPOTrainer(model, tok, reward, lora(lora_target_modules=["q_proj", "v_proj"]))
    names = {n.split(".lora_")[0].rsplit(".", 1)[-1] for n, _ in trainer.model.named_parameters() if "lora_" in n}
    assert names == {"q_proj", "v_proj"}
    model, tok = make_small_policy(seed=0)
    trainer = GRPOTrainer(model, tok, reward, lora(lora_target_modules=None))  # PEFT's choice for Qwen2
    assert set(trainer.model.peft_config["default"].target_modules) == {"q_proj", "v_proj"}


# ---------------------------------------------------------------------------
# Dropout: off in every pass, so the first ratio is exactly 1
# ---------------------------------------------------------------------------


def _second_step_first_pass(monkeypatch, model, tok, config):
    """The trainer, and the log-probs of the gradient pass and of the scoring pass (the old policy) that the
    second step's first update compares (mu = 2, so the old ones come from the eval-mode scoring pass)."""
    calls = []
    real = step_module.grpo_loss

    def spy(logp, old_logp, *args, **kwargs):
        calls.append((logp.detach().clone(), old_logp.clone()))
        return real(logp, old_logp, *args, **kwargs)

    monkeypatch.setattr(step_module, "grpo_loss", spy)
    trainer = GRPOTrainer(model, tok, reward, config)
    quiet(trainer.train_step, rows()[:4])  # the first step moves B off zero, so dropout on A's input could show
    assert any(torch.count_nonzero(p) for n, p in trainer.model.named_parameters() if "lora_B" in n)
    calls.clear()
    quiet(trainer.train_step, rows()[4:8])
    return trainer, calls[0]


def test_adapter_dropout_is_off_in_every_pass_so_the_first_ratio_is_exactly_one(monkeypatch, small_policy):
    model, tok = small_policy
    config = lora(lora_dropout=0.05, num_iterations=2)
    trainer, (logp, old) = _second_step_first_pass(monkeypatch, model, tok, config)
    dropouts = [m for name, m in trainer.model.named_modules() if name.endswith("lora_dropout.default")]
    assert len(dropouts) == 2 * 7 and all(m.p == 0.0 for m in dropouts)  # disable_dropout reached PEFT's modules
    assert torch.equal(logp, old)  # ratio exactly 1: the gradient pass and the scoring pass agree bit for bit


def test_with_disable_dropout_off_the_adapter_dropout_acts_in_the_gradient_pass(monkeypatch, small_policy):
    """The control: the test above would see adapter dropout if it were left on."""
    model, tok = small_policy
    config = lora(lora_dropout=0.05, num_iterations=2, disable_dropout=False)
    trainer, (logp, old) = _second_step_first_pass(monkeypatch, model, tok, config)
    assert any(getattr(m, "p", 0) == 0.05 for m in trainer.model.modules())
    assert not torch.equal(logp, old)  # dropout in the gradient pass, none in the scoring pass: ratio != 1


# ---------------------------------------------------------------------------
# ref_sync_every, a given PeftModel, refusals
# ---------------------------------------------------------------------------


def test_ref_sync_copies_the_adapters_into_a_frozen_reference_adapter_and_leaves_the_base(small_policy):
    model, tok = small_policy
    before = copy.deepcopy(model.state_dict())
    trainer = GRPOTrainer(model, tok, reward, lora(ref_sync_every=2))
    policies = trainer.grpo_step.policies
    assert policies.reference_adapter == REFERENCE_ADAPTER
    reference = adapter_parameters(trainer.model, REFERENCE_ADAPTER)
    assert reference and not any(p.requires_grad for p in reference)
    held = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert held == {id(p) for p in adapter_parameters(trainer.model)}  # the copy is not trained

    quiet(trainer.train_step, rows()[:4])  # step 1: the reference is still the start (B = 0 in the copy)
    assert all(torch.count_nonzero(p) == 0 for n, p in trainer.model.named_parameters()
               if adapter_of(n) == REFERENCE_ADAPTER and "lora_B" in n)
    quiet(trainer.train_step, rows()[4:8])  # step 2: sync
    trained = adapter_parameters(trainer.model)
    assert all(torch.equal(a, b) for a, b in zip(trained, adapter_parameters(trainer.model, REFERENCE_ADAPTER)))
    assert all(p.requires_grad for p in trained) and not any(p.requires_grad for p in reference)
    assert trainer.model.active_adapter == "default"
    rollout = generate_rollouts(trainer.model, tok, ["1+2="], group_size=4, max_new_tokens=3, generator_seed=0)
    with policies.reference() as ref:  # the reference is now the policy as it was at the sync
        assert torch.equal(score_rollout(ref, rollout), score_rollout(trainer.model, rollout))
    assert all(torch.equal(v, before[k]) for k, v in base_weights(trainer.model).items())  # nothing merged


def test_a_given_peft_model_is_trained_as_it_is_against_a_frozen_copy_of_its_adapter(small_policy):
    model, tok = small_policy
    config = peft.LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    given = peft.get_peft_model(model, config)
    with torch.no_grad():  # a pretrained adapter: B is not zero, so the bare base is not where the run starts
        for name, p in given.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.5)
    start = copy.deepcopy(given)
    trainer = GRPOTrainer(given, tok, reward, lora(lora_r=16))  # lora_r does not apply to a given PeftModel
    assert trainer.model is given and given.peft_config["default"].r == 2
    rollout = generate_rollouts(start, tok, ["1+2=", "5+5="], group_size=4, max_new_tokens=3, generator_seed=0)
    with trainer.grpo_step.policies.reference() as reference:  # the starting policy, as in TRL
        assert torch.equal(score_rollout(reference, rollout), score_rollout(start, rollout))
    # The reference is a frozen copy of the adapter: the policy's numbers in other tensors. Where the kernels round
    # the step's two passes alike the KL is exactly 0; elsewhere (MKL_ENABLE_INSTRUCTIONS=AVX2 here: 1.2e-15) it is
    # float32 rounding squared: log-probs within 1.2e-5 relative of each other (the derivation in the test above)
    # and |log p| under 4 give a KL of at most (4.8e-5)^2 / 2 = 1.2e-9. The bare base as the reference (the bug
    # this rules out: the pretrained adapter dropped) gives 0.012.
    assert quiet(trainer.train_step, rows()[:4])["kl"] <= (4 * 64 * 3 * 6e-8) ** 2 / 2


def test_refusals(small_policy, make_tiny_policy):
    model, tok = small_policy
    with pytest.raises(ValueError, match="ref_model must be None with GRPOConfig.use_peft=True"):
        GRPOTrainer(model, tok, reward, lora(), ref_model=copy.deepcopy(model))
    wrapped = peft.get_peft_model(model, peft.LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    with pytest.raises(ValueError, match="the model is a peft.PeftModel, but GRPOConfig.use_peft is False"):
        GRPOTrainer(wrapped, tok, reward, GRPOConfig(**RUN))
    with pytest.raises(ValueError, match="config.use_peft needs policies="):
        step_module.GRPOStep(make_tiny_policy(seed=0)[0], tok, reward, lora())


def test_without_peft_installed_the_trainer_says_how_to_get_it(monkeypatch, small_policy):
    model, tok = small_policy
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft now fails
    lora()  # the config alone needs no peft
    with pytest.raises(ModuleNotFoundError, match=r"needs the peft package: pip install peft"):
        GRPOTrainer(model, tok, reward, lora())


def test_building_the_trainer_draws_the_adapters_from_the_seed_and_leaves_the_global_rng(small_policy,
                                                                                          make_small_policy):
    model, tok = small_policy
    state = torch.get_rng_state()
    first = GRPOTrainer(model, tok, reward, lora(seed=3))
    assert torch.equal(state, torch.get_rng_state())
    again = GRPOTrainer(make_small_policy(seed=0)[0], tok, reward, lora(seed=3))
    assert all(torch.equal(a, b) for a, b in zip(adapter_parameters(first.model), adapter_parameters(again.model)))


def test_the_first_step_samples_what_the_full_model_samples(small_policy):
    """Wrapped, the untrained policy is the same model: same completions, same rewards (and the speed-ups apply)."""
    model, tok = small_policy
    full = GRPOTrainer(copy.deepcopy(model), tok, reward, GRPOConfig(**RUN))
    adapters = GRPOTrainer(model, tok, reward, lora())
    assert can_share_prompts(adapters.model) and generation_can_share_prompts(adapters.model)
    a, b = quiet(full.train_step, rows()[:4]), quiet(adapters.train_step, rows()[:4])
    assert full.grpo_step.last_batch[1] == adapters.grpo_step.last_batch[1]
    assert a["reward_mean"] == b["reward_mean"] and a["reward_std"] == b["reward_std"]
    assert set(TIMING_KEYS) - set(SAMPLER_SECONDS) - set(LEGACY_SECONDS) <= set(b)  # seconds per stage, as a full
    # run's rows (a fast sampler's timings only where one samples: not on the CPU by default; older histories' names
    # are timing keys too, and no new row has them)
    assert not set(LEGACY_SECONDS) & set(b)


# ---------------------------------------------------------------------------
# Checkpoints: the adapters, small, and an exact resume
# ---------------------------------------------------------------------------


def _train(model, tok, config, steps, resume=False):
    trainer = GRPOTrainer(model, tok, reward, config)
    quiet(trainer.train, rows(), steps, resume=resume, progress=False)
    return trainer


def test_a_checkpoint_holds_the_adapters_and_their_optimizer_state_not_the_base(tmp_path, tiny_policy):
    model, tok = tiny_policy
    full_model = copy.deepcopy(model)
    trainer = _train(model, tok, lora(output_dir=str(tmp_path / "lora"), checkpoint_every=1), 1)
    state = torch.load(tmp_path / "lora" / "checkpoint" / "state.pt", weights_only=True)
    adapters = AdapterWeights(trainer.model).state_dict()
    assert state["model"].keys() == adapters.keys() and all(adapter_of(k) == "default" for k in adapters)
    assert state["ref_model"] is None and len(state["optimizer"]["state"]) == len(adapters)
    meta = json.loads((tmp_path / "lora" / "checkpoint" / "trainer_state.json").read_text())
    assert meta["config"]["use_peft"] is True and meta["lora_base"] == base_fingerprint(trainer.model)

    _train(full_model, tok, GRPOConfig(**RUN, output_dir=str(tmp_path / "full"), checkpoint_every=1), 1)
    lora_bytes = (tmp_path / "lora" / "checkpoint" / "state.pt").stat().st_size
    full_bytes = (tmp_path / "full" / "checkpoint" / "state.pt").stat().st_size
    # rank 4 on the 0.8M-weight tiny model: 35,328 adapter weights, 4.5% of the model. The LoRA checkpoint
    # keeps them and AdamW's two moments (3 copies); the full one the model, its two moments and the
    # frozen reference (4 copies of the whole model): about 3.3%, so under 5% with the RNG states and names
    assert sum(v.numel() for v in adapters.values()) == 35_328
    assert lora_bytes < 0.05 * full_bytes, (lora_bytes, full_bytes)
    assert lora_bytes < 0.2 * sum(p.numel() * 4 for p in full_model.parameters())  # a fifth of the bare weights


@pytest.mark.parametrize("ref_sync_every", [None, 1])
def test_a_resumed_lora_run_repeats_the_uninterrupted_history(tmp_path, ref_sync_every, make_small_policy):
    def fresh():
        return make_small_policy(seed=0)

    config = lora(num_iterations=2, ref_sync_every=ref_sync_every, checkpoint_every=2)
    whole = _train(*fresh(), config, 4).history
    out = str(tmp_path / "run")
    config.output_dir = out
    _train(*fresh(), config, 2)
    resumed = _train(*fresh(), config, 4, resume=True)
    assert [r["step"] for r in resumed.history] == [1, 2, 3, 4]
    assert comparable(resumed.history) == comparable(whole)
    assert all(r["kl"] > 0 for r in whole[1:])  # the reference mattered


def test_a_checkpoint_is_refused_on_another_base_or_without_adapters(tmp_path, make_small_policy):
    def fresh(seed=0):
        return make_small_policy(seed=seed)

    out = str(tmp_path / "run")
    _train(*fresh(), lora(output_dir=out, checkpoint_every=1), 1)
    with pytest.raises(ValueError, match="trained on another base model"):
        _train(*fresh(seed=1), lora(output_dir=out, checkpoint_every=1), 2, resume=True)
    with pytest.raises(ValueError, match="holds LoRA adapters but the model has none"):
        _train(*fresh(), GRPOConfig(**RUN, output_dir=out, checkpoint_every=1), 2, resume=True)


# ---------------------------------------------------------------------------
# Merging: the merged model completes as the adapters do
# ---------------------------------------------------------------------------


def test_the_adapters_merged_into_the_base_give_the_same_greedy_completions(tmp_path, small_policy):
    model, tok = small_policy
    base_size = sum(p.numel() for p in model.parameters())
    trainer = _train(model, tok, lora(lora_r=8, learning_rate=3e-2), 3)
    assert any(torch.count_nonzero(p) for n, p in trainer.model.named_parameters() if "lora_B" in n)
    prompts = [row["prompt"] for row in rows(16, seed=5)]
    greedy = dict(group_size=1, max_new_tokens=4, do_sample=False)
    with_adapters = generate_rollouts(trainer.model, tok, prompts, **greedy)
    before = AdapterWeights(trainer.model).state_dict()

    folder = export_merged(trainer.model, tmp_path / "merged", tok)
    merged, merged_tok = load_policy(str(folder))
    assert not isinstance(merged, peft.PeftModel)
    assert sum(p.numel() for p in merged.parameters()) == base_size  # the base's shapes, no adapters
    assert generate_rollouts(merged, merged_tok, prompts, **greedy).completions == with_adapters.completions
    # the same numbers up to float rounding: W x + s B (A x) against (W + s B A) x
    scored = score_rollout(merged, with_adapters)
    assert torch.allclose(scored, score_rollout(trainer.model, with_adapters), atol=1e-5)
    # the trainer's model is left as it was (a copy was merged)
    assert isinstance(trainer.model, peft.PeftModel)
    assert all(torch.equal(v, before[k]) for k, v in AdapterWeights(trainer.model).state_dict().items())
    assert merged_model(merged) is merged  # a plain model has nothing to merge


# ---------------------------------------------------------------------------
# The command line: train, resume, evaluate, plot, export
# ---------------------------------------------------------------------------


def _cli(out, steps, *extra):
    from grpo_tutorial.__main__ import main

    return main([
        "train", "--model", "tiny", "--task", "addition", "--digits", "1", "--steps", str(steps), "--out", str(out),
        "--prompts-per-step", "4", "--group-size", "4", "--minibatch-size", "none", "--n-train", "200",
        "--n-eval", "8", "--sft-steps", "3", "--sft-target-accuracy", "none", "--no-eval-before",
        "--checkpoint-every", "1", "--no-progress", "--reward", "partial_credit", "--beta", "0.05",
        "--use-peft", "--lora-r", "2", "--lora-target-modules", "all-linear", "--lr", "1e-2", *extra,
    ])


def test_the_command_line_trains_resumes_evaluates_plots_and_exports_a_lora_run(tmp_path, capsys):
    from grpo_tutorial.__main__ import main, make_task_data
    from grpo_tutorial.evaluation import evaluate_policy

    whole, out = tmp_path / "whole", tmp_path / "run"
    assert _cli(whole, 3, "--no-eval-after") == 0
    assert _cli(out, 2) == 0
    assert (out / "base.safetensors").exists()  # the warm-started base, kept once
    run = json.loads((out / "run.json").read_text())
    assert run["config"]["use_peft"] is True and run["config"]["lora_target_modules"] == "all-linear"
    assert all(adapter_of(k) for k in torch.load(out / "checkpoint" / "state.pt", weights_only=True)["model"])
    evals = json.loads((out / "eval.json").read_text())

    assert main(["evaluate", "--checkpoint", str(out), "--out", str(tmp_path / "e.json")]) == 0
    again = json.loads((tmp_path / "e.json").read_text())
    assert again["accuracy"] == evals["after"]["accuracy"] and again["samples"] == evals["after"]["samples"]
    assert again["completions"] == evals["after"]["completions"]
    assert main(["plot", str(out), "--out", str(tmp_path / "curves.png")]) == 0
    assert (tmp_path / "curves.png").stat().st_size > 1000

    assert main(["export", "--checkpoint", str(out), "--out", str(tmp_path / "merged")]) == 0
    merged, tok = load_policy(str(tmp_path / "merged"))
    data = make_task_data("addition", tiny=True, n_train=1, n_eval=8, seed=run["config"]["seed"], digits=1)
    config = GRPOConfig(**{k: v for k, v in run["config"].items() if k != "output_dir"})
    exported = evaluate_policy(merged, tok, data.test, config, reward_fns=data.reward_fns)
    assert exported["completions"] == evals["after"]["completions"]

    assert _cli(out, 3, "--resume", "--no-eval-after") == 0  # on the saved base, from step 2's adapters
    assert "resuming from" in capsys.readouterr().out
    history = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    expected = [json.loads(line) for line in (whole / "history.jsonl").read_text().splitlines()]
    assert comparable(history) == comparable(expected) and len(history) == 3
    assert all(math.isfinite(r["kl"]) for r in history)
