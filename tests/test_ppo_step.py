"""PPO's value model (grpo_tutorial/ppo/critic.py) and step (grpo_tutorial/ppo/step.py) on the tiny model."""

from __future__ import annotations

import math
import statistics
import types

import pytest
import torch

from grpo_tutorial import GRPOConfig
from grpo_tutorial.ppo.critic import ValueModel, build_value_model, count_parameters
from grpo_tutorial.kl import kl_estimate
from grpo_tutorial.ppo import PPOSettings, gae, token_rewards, whiten
from grpo_tutorial.ppo.step import PPOStep
from grpo_tutorial.rollout import generate_rollouts
from helpers import StepState

ROWS = [{"prompt": "12+34=", "answer": "46"}, {"prompt": "7+58=", "answer": "65"}]
#: Two prompts, four completions each, up to eight tokens: a step in a fraction of a second.
CONFIG = dict(group_size=4, prompts_per_step=2, max_new_tokens=8, learning_rate=1e-3, seed=3)


def length_reward(prompts, completions, **kwargs):
    """A reward with a spread on an untrained model: a quarter per character written."""
    return [len(c) / 4 for c in completions]


class Watched(PPOStep):
    """The PPO step, keeping what stages 2 to 4 gave (the extension pattern: a stage overridden, the number unchanged)."""

    def advantages(self, rewards):
        self.rewards = rewards
        out = super().advantages(rewards)
        self.adv = out.values  # [N, T]
        return out

    def score(self, rollout):
        self.policy_logp = self.logprobs(self.model, rollout, entropy=False)  # [N, T] before the update
        self.scores = super().score(rollout)
        return self.scores


def snapshot(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def unchanged(module: torch.nn.Module, before: list[torch.Tensor]) -> bool:
    return all(torch.equal(p, q) for p, q in zip(module.parameters(), before))


# ---------------------------------------------------------------------------
# The value model
# ---------------------------------------------------------------------------


def test_a_value_is_read_from_the_state_before_its_token(small_policy):
    model, tok = small_policy
    rollout = generate_rollouts(model, tok, ["12+34=", "7+5="], group_size=2, max_new_tokens=5, generator_seed=0)
    critic = build_value_model(model, "separate")
    torch.nn.init.normal_(critic.head.weight, generator=torch.Generator().manual_seed(0))
    values = critic.values(rollout)  # [N, Tc]
    assert values.shape == rollout.completion_ids.shape
    ids, mask = rollout.input_ids, rollout.attention_mask
    out = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
                output_hidden_states=True)
    Tp = rollout.prompt_ids.shape[1]
    want = critic.head(out.hidden_states[-1][:, Tp - 1 : -1]).squeeze(-1)  # the position before each token
    torch.testing.assert_close(values, want, rtol=1e-5, atol=1e-6)
    later = rollout.completion_ids.clone()
    later[:, 2:] = (later[:, 2:] + 1) % 10 + 5  # other tokens from position 2 on
    changed = critic(torch.cat([rollout.prompt_ids, later], 1), mask, later.shape[1])
    torch.testing.assert_close(changed[:, :3], values[:, :3], rtol=1e-5, atol=1e-6)  # V_t sees tokens < t only
    assert not torch.allclose(changed[:, 3:], values[:, 3:])


def test_the_head_starts_at_zero_and_a_separate_model_is_a_copy(small_policy):
    model, tok = small_policy
    rollout = generate_rollouts(model, tok, ["1+2="], group_size=2, max_new_tokens=4, generator_seed=1)
    for kind in ("separate", "head"):
        critic = build_value_model(model, kind)
        assert not critic.values(rollout).any()  # a zero head: every value exactly 0
    separate = build_value_model(model, "separate")
    policy_storage = {p.data_ptr() for p in model.parameters()}
    assert not policy_storage & {p.data_ptr() for p in separate.parameters()}
    assert {p.data_ptr() for p in build_value_model(model, "head").parameters()}.isdisjoint(policy_storage)


def test_parameter_counts_of_the_two_value_models(small_policy):
    model, _ = small_policy
    policy = sum(p.numel() for p in model.parameters())
    hidden = model.config.hidden_size
    assert count_parameters(build_value_model(model, "separate"), model) == {
        "policy": policy, "value_model": policy + hidden + 1}
    assert count_parameters(build_value_model(model, "head"), model)["value_model"] == hidden + 1


class NoHiddenStates(torch.nn.Module):
    """A model class with no hidden states to put a head on: its forward takes the ids and nothing else."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)

    def forward(self, input_ids):
        return self.embed(input_ids)


class SilentHiddenStates(NoHiddenStates):
    """Takes any keyword and has a hidden size, but returns no hidden states."""

    config = types.SimpleNamespace(hidden_size=4)

    def forward(self, input_ids, **kwargs):
        return types.SimpleNamespace(logits=self.embed(input_ids), hidden_states=None)


@pytest.mark.parametrize("kind", ["head", "separate"])
def test_a_model_that_exposes_no_hidden_states_is_refused(kind):
    with pytest.raises(ValueError, match="needs a model that exposes its hidden states.*NoHiddenStates does not"):
        build_value_model(NoHiddenStates(), kind)


def test_a_model_that_returns_no_hidden_states_is_refused_at_its_first_pass():
    critic = ValueModel(SilentHiddenStates(), train_trunk=True)
    with pytest.raises(ValueError, match="SilentHiddenStates does not"):
        critic(torch.tensor([[1, 2, 3]]), torch.ones(1, 3), 1)


# ---------------------------------------------------------------------------
# The step
# ---------------------------------------------------------------------------


def test_a_ppo_step_changes_the_policy_and_the_value_model(small_policy):
    model, tok = small_policy
    step = PPOStep(model, tok, length_reward, GRPOConfig(**CONFIG), settings=PPOSettings(value_lr=1e-2))
    policy, critic = snapshot(model), snapshot(step.critic)
    state = StepState()
    row = step(ROWS, state, [])
    assert state.step == 1 and not unchanged(model, policy) and not unchanged(step.critic, critic)
    for key in ("value_loss", "explained_variance", "advantage_var", "value_mean", "value_grad_norm", "value_seconds"):
        assert math.isfinite(row[key]), key
    assert row["value_loss"] > 0 and row["advantage_var"] > 0
    assert step.last_batch[4].shape == (8,)  # one number per completion for the trainer's log: its mean advantage
    second = step(ROWS, state, [row])
    assert second["value_mean"] != 0  # the critic has learned something: its values are no longer the zero head's


def test_the_first_update_by_hand(small_policy):
    """A zero head gives V = 0, so GAE's advantage of token t is (gamma lambda)^(L-1-t) times the score: whitened
    over the batch, its on-policy loss is -mean over completions of the mean over their tokens (ratio 1, beta 0),
    and the value loss 0.5 * mean(R_t^2) with R_t = that advantage before whitening."""
    model, tok = small_policy
    settings = PPOSettings(gamma=1.0, lam=0.9)
    step = Watched(model, tok, length_reward, GRPOConfig(**CONFIG), settings=settings)
    row = step(ROWS, StepState(), [])
    mask = step.rewards.rollout.completion_mask.tolist()
    scores = step.rewards.rewards.tolist()
    raw = [[0.9 ** (sum(m) - 1 - t) * s if m[t] else None for t in range(len(m))] for m, s in zip(mask, scores)]
    real = [a for row_ in raw for a in row_ if a is not None]
    mean, sd = statistics.mean(real), math.sqrt(statistics.variance(real) + 1e-8)
    per_completion = [statistics.mean([(a - mean) / sd for a in r if a is not None]) for r in raw]
    assert row["loss"] == pytest.approx(-statistics.mean(per_completion), abs=1e-6)
    assert row["value_loss"] == pytest.approx(0.5 * statistics.mean([a * a for a in real]), rel=1e-5)
    assert row["explained_variance"] == pytest.approx(0.0, abs=1e-6)  # V = 0: 1 - Var(R) / Var(R)
    assert row["advantage_var"] == pytest.approx(statistics.pvariance(real), rel=1e-5)


def test_a_value_learning_rate_of_zero_leaves_the_critic(small_policy):
    model, tok = small_policy
    step = PPOStep(model, tok, length_reward, GRPOConfig(**CONFIG), settings=PPOSettings(value_lr=0.0))
    policy, critic = snapshot(model), snapshot(step.critic)
    state = StepState()
    for _ in range(2):
        step(ROWS, state, [])
    assert unchanged(step.critic, critic) and not unchanged(model, policy)


@pytest.mark.parametrize("kind", ["separate", "head"])
def test_the_value_warmup_trains_the_critic_alone(small_policy, kind):
    model, tok = small_policy
    step = PPOStep(model, tok, length_reward, GRPOConfig(**CONFIG),
                   settings=PPOSettings(value_warmup_steps=1, value_model=kind, value_lr=1e-2))
    policy, head = snapshot(model), step.critic.head.weight.detach().clone()
    state = StepState()
    row = step(ROWS, state, [])
    assert unchanged(model, policy) and not torch.equal(step.critic.head.weight, head)  # the head reads a fixed trunk
    assert math.isnan(row["loss"]) and math.isfinite(row["entropy"]) and row["value_loss"] > 0
    step(ROWS, state, [row])
    assert not unchanged(model, policy)  # after the warm-up the policy trains


@pytest.mark.parametrize("kl_in_reward", [False, True])
def test_the_kl_in_the_reward_or_in_the_loss(small_policy, make_small_policy, kl_in_reward):
    """beta * KL_t goes into each token's reward (and out of the loss), or stays in the loss as GRPO keeps it."""
    model, tok = small_policy
    reference, _ = make_small_policy(seed=1)  # another model: a KL far from 0 at the first step
    beta, config = 0.1, GRPOConfig(**CONFIG, beta=0.1, kl_kind="k3")
    step = Watched(model, tok, length_reward, config, reference, settings=PPOSettings(kl_in_reward=kl_in_reward))
    row = step(ROWS, StepState(), [])
    rollout = step.rewards.rollout
    mask = rollout.completion_mask
    kl = kl_estimate(step.policy_logp, step.scores.ref_logp, kind="k3")  # [N, T]
    assert row["kl"] > 1e-3  # measured in the loss either way (with kl_in_reward its beta is 0)
    folded = kl if kl_in_reward else None
    raw, _ = gae(token_rewards(step.rewards.rewards, mask, folded, beta), torch.zeros_like(mask), mask, 1.0, 0.95)
    torch.testing.assert_close(step.adv, whiten(raw, mask), rtol=1e-4, atol=1e-5)
    policy_term = -((step.adv * mask).sum(1) / mask.sum(1)).mean()  # ratio 1
    kl_term = ((kl * mask).sum(1) / mask.sum(1)).mean()
    want = policy_term if kl_in_reward else policy_term + beta * kl_term
    assert row["loss"] == pytest.approx(float(want), abs=1e-5)
    assert abs(float(beta * kl_term)) > 1e-3  # the two ways differ by more than the tolerance


def test_the_step_refuses_a_config_that_assumes_no_critic(small_policy):
    model, tok = small_policy
    with pytest.raises(ValueError, match=r"GRPOConfig\.advantage_baseline must be 'group' with a value model"):
        PPOStep(model, tok, length_reward, GRPOConfig(**CONFIG, advantage_baseline="rloo"))
    with pytest.raises(TypeError, match="value_model must be a ValueModel"):
        PPOStep(model, tok, length_reward, GRPOConfig(**CONFIG), value_model=torch.nn.Linear(2, 1))


def test_the_counts_the_docs_give_for_chapter_13s_model():
    """critic.py's docstring: the policy's 791,168 parameters, 791,297 more for a separate critic, 129 for a head."""
    import grpo_tutorial.ppo.critic as critic_module
    from grpo_tutorial.chapters.thinking import ThinkingRecipe, build_thinking_model

    model, _ = build_thinking_model(ThinkingRecipe(), 0)
    separate = count_parameters(build_value_model(model, "separate"), model)
    assert separate == {"policy": 791_168, "value_model": 791_297}
    assert count_parameters(build_value_model(model, "head"), model)["value_model"] == 129
    for number in ("791,168", "791,297", "129"):
        assert number in critic_module.__doc__


def test_the_value_models_micro_batches_accumulate_to_the_whole_update(make_small_policy):
    """Two updates a pass (minibatches of 4), two passes (mu = 2): cut into micro-batches of 2 or not, each update's
    gradient and loss are the same up to float rounding (each micro-batch's loss is divided by the update's tokens).
    The optimizer's step is replaced by a recorder, so the weights stay and every update sees the same ones."""
    grads, rows = [], []
    for micro in (None, 2):
        model, tok = make_small_policy(seed=0)
        config = GRPOConfig(**CONFIG, num_iterations=2, minibatch_size=4, micro_batch_size=micro)
        step = PPOStep(model, tok, length_reward, config, settings=PPOSettings(cliprange_value=0.2))
        torch.nn.init.normal_(step.critic.head.weight, std=0.1, generator=torch.Generator().manual_seed(0))
        seen = []
        step.value_optimizer.step = lambda seen=seen, critic=step.critic: seen.append(
            [p.grad.clone() for p in critic.trainable_parameters()])
        rows.append(step(ROWS, StepState(), []))
        grads.append(seen)
    assert len(grads[0]) == len(grads[1]) == 4  # mu * N / minibatch = 2 * 8 / 4 updates
    for whole, parts in zip(*grads):
        for a, b in zip(whole, parts):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)
    assert rows[0]["value_loss"] == pytest.approx(rows[1]["value_loss"], rel=1e-5)
    assert any(g.abs().sum() > 0 for update in grads[0] for g in update)


# ---------------------------------------------------------------------------------------- the trainer and its checkpoints


def _ppo_trainer(make_small_policy, out=None, **settings):
    from grpo_tutorial import GRPOTrainer

    model, tok = make_small_policy(seed=0)
    config = GRPOConfig(**CONFIG, beta=0.05, checkpoint_every=2, output_dir=None if out is None else str(out))
    step = PPOStep(model, tok, length_reward, config, settings=PPOSettings(**settings))
    return GRPOTrainer(model, tok, length_reward, config, step=step)


def _quiet_train(trainer, rows, steps, **kwargs):
    import warnings

    from grpo_tutorial.trainer import GRPOWarning

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GRPOWarning)
        return trainer.train(rows, steps, progress=False, **kwargs)


def _comparable(rows):
    from grpo_tutorial.trainer import TIMING_KEYS

    import json

    return [json.dumps({k: v for k, v in r.items() if k not in TIMING_KEYS and not k.endswith("_seconds")},
                       sort_keys=True) for r in rows]


def test_a_ppo_run_interrupted_and_resumed_is_the_uninterrupted_run(make_small_policy, tmp_path):
    """Issue 54: the trainer takes the PPO step (step=) and its checkpoints hold the value model and its optimizer,
    so a run stopped after its checkpoint and resumed gives the uninterrupted history, policy and critic bit for bit.
    Resumed with a fresh critic (the planted bug: the checkpoint without it), the histories part at the first step
    after the checkpoint."""
    rows = ROWS * 8
    whole = _ppo_trainer(make_small_policy, value_lr=3e-3)
    uninterrupted = _quiet_train(whole, rows, 5)

    out = tmp_path / "run"
    first = _ppo_trainer(make_small_policy, out, value_lr=3e-3)
    _quiet_train(first, rows, 3)  # a checkpoint at step 2; step 3 logged after it (as if killed then)
    resumed_trainer = _ppo_trainer(make_small_policy, out, value_lr=3e-3)
    resumed = _quiet_train(resumed_trainer, rows, 5, resume=True)
    assert _comparable(resumed) == _comparable(uninterrupted)
    for a, b in ((resumed_trainer.model, whole.model), (resumed_trainer.grpo_step.critic, whole.grpo_step.critic)):
        assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))

    # the planted bug: the critic left out of the checkpoint (a fresh one at the resume)
    fresh = _ppo_trainer(make_small_policy, out, value_lr=3e-3)
    fresh.grpo_step.load_extra_state = lambda state: None
    import shutil

    shutil.rmtree(out)
    _quiet_train(_ppo_trainer(make_small_policy, out, value_lr=3e-3), rows, 3)
    wrong = _quiet_train(fresh, rows, 5, resume=True)
    assert _comparable(wrong)[:2] == _comparable(uninterrupted)[:2] and _comparable(wrong)[2:] != _comparable(
        uninterrupted)[2:]


def test_a_ppo_step_refuses_a_checkpoint_without_its_value_model(make_small_policy, tmp_path):
    from grpo_tutorial import GRPOTrainer

    model, tok = make_small_policy(seed=0)
    config = GRPOConfig(**CONFIG, checkpoint_every=2, output_dir=str(tmp_path / "run"))
    _quiet_train(GRPOTrainer(model, tok, length_reward, config), ROWS * 4, 2)  # GRPO's checkpoint: no critic
    ppo = _ppo_trainer(make_small_policy, tmp_path / "run")
    with pytest.raises(ValueError, match="holds no value model"):
        ppo.load_checkpoint()


def test_the_trainer_takes_a_step_built_on_its_own_model_only(make_small_policy):
    from grpo_tutorial import GRPOTrainer

    model, tok = make_small_policy(seed=0)
    other, _ = make_small_policy(seed=1)
    config = GRPOConfig(**CONFIG)
    step = PPOStep(model, tok, length_reward, config)
    assert GRPOTrainer(model, tok, length_reward, config, step=step).grpo_step is step
    with pytest.raises(ValueError, match="another model"):
        GRPOTrainer(other, tok, length_reward, config, step=step)
    with pytest.raises(ValueError, match="another config"):
        GRPOTrainer(model, tok, length_reward, GRPOConfig(**{**CONFIG, "seed": 4}), step=step)
    with pytest.raises(ValueError, match="ref_model belong to the step"):
        GRPOTrainer(model, tok, length_reward, config, ref_model=other, step=step)
    with pytest.raises(TypeError, match="step must be a GRPOStep"):
        GRPOTrainer(model, tok, length_reward, config, step=object())
