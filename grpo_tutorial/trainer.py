"""The GRPO trainer: the one stateful piece of the package.

One call to :meth:`GRPOTrainer.train_step` runs the whole pipeline of DESIGN.md:

1. rollout: B prompts x G completions, one batched ``generate``  (rollout.py)
2. rewards: TRL-signature reward functions, weighted and summed    (rewards.py)
3. advantages: z-scores within each group                          (advantages.py)
4. old log-probs (and entropy) from a no-grad pass in eval mode    (logprobs.py)
5. reference log-probs, only when beta > 0                         (logprobs.py)
6. mu passes over shuffled minibatches: clipped surrogate + beta*KL,
   gradient clipping, AdamW                                         (loss.py, kl.py)

:meth:`GRPOTrainer.train` loops over a dataset, writes ``history.jsonl``, saves
atomic checkpoints and resumes from them so that a run killed at any moment and
resumed gives the same history as one that was never interrupted (on CPU, with
the same seed). Only wall-clock fields (:data:`TIMING_KEYS`) differ.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
import random
import shutil
import signal
import sys
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from .advantages import SCALES, STDS, group_advantages
from .kl import KL_KINDS
from .logprobs import completion_logprobs
from .loss import LOSS_TYPES, grpo_loss
from .rewards import answers_match, compute_rewards, extract_answer, reward_function_means
from .rollout import Rollout, generate_rollouts
from .tasks import validate_dataset

__all__ = [
    "GRPOConfig",
    "GRPOTrainer",
    "GRPOWarning",
    "TIMING_KEYS",
    "advantages_skipping_unscorable",
    "derive_seed",
    "find_checkpoint",
    "load_model_state",
    "read_history",
]

#: History fields that measure wall-clock time. They are the only fields allowed
#: to differ between two runs with the same seed (or a run and its resumption).
TIMING_KEYS = frozenset({"step_seconds", "rollout_seconds", "tokens_per_s"})

_CHECKPOINT = "checkpoint"
_CHECKPOINT_TMP = "checkpoint.tmp"
_CHECKPOINT_OLD = "checkpoint.old"
_STATE_FILE = "state.pt"
_META_FILE = "trainer_state.json"
_HISTORY_FILE = "history.jsonl"
_FORMAT_VERSION = 1


class GRPOWarning(UserWarning):
    """A training failure mode was detected (no signal, truncation, collapse, NaN)."""


# ---------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------


def _fail(name: str, value: Any, expected: str, hint: str = "") -> None:
    raise ValueError(f"GRPOConfig.{name} must be {expected}, got {value!r}{hint}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass
class GRPOConfig:
    """Every hyperparameter of a GRPO run, with CPU-sized defaults.

    The defaults are the tiny-model settings of DESIGN.md's calibration (except
    mu = 1). For a real LLM on a GPU, typical values are ``group_size=8..16``,
    ``max_new_tokens=256..1024``, ``learning_rate=1e-6..1e-5``.

    Attributes:
        group_size: G, completions per prompt (>= 2: a group needs a baseline).
        prompts_per_step: B, prompts per step; a step samples B*G completions.
        max_new_tokens: completion budget; longer completions are truncated.
        temperature, top_p: sampling parameters (log-probs use the same T).
        learning_rate, weight_decay: AdamW settings.
        warmup_steps: linear learning-rate warmup, counted in optimizer updates.
        beta: KL penalty weight; 0 keeps no reference model at all.
        kl_kind: ``"k1"``, ``"k2"`` or ``"k3"`` (the estimator in the penalty).
        clip_eps, clip_eps_high: PPO clip range (1 - eps, 1 + eps_high);
            ``clip_eps_high=None`` means symmetric. DAPO's clip-higher uses 0.28.
        num_iterations: mu, passes over each batch of completions.
        minibatch_size: completions per optimizer update (None = all B*G). It
            must divide B*G; a step makes mu * B*G / minibatch_size updates.
        loss_type: ``"grpo"``, ``"bnpo"``, ``"dapo"`` or ``"dr_grpo"``.
        scale_rewards: ``"group"``, ``"batch"`` or ``"none"`` (Dr. GRPO).
        std: ``"sample"`` (Bessel) or ``"population"`` for the advantage std.
        max_grad_norm: gradient clipping threshold (None = no clipping, but the
            norm is still measured and logged).
        ref_sync_every: copy the policy into the reference every this many
            steps (None = never). Only used when beta > 0.
        reward_weights: one weight per reward function (None = all 1).
        system_prompt: system message for chat-template models.
        use_chat_template: None = automatic (use it when the tokenizer has one).
        seed: seeds the data order, sampling and minibatch shuffles.
        log_every: refresh the progress bar's reward/KL every this many steps.
        checkpoint_every: save a checkpoint every this many steps and at the
            end of ``train`` (0 = no periodic checkpoints; Ctrl-C still saves
            one). Needs output_dir.
        output_dir: where ``history.jsonl`` and ``checkpoint/`` go (None = keep
            the history in memory only).
        eval_batch_size: prompts per ``generate`` call in :meth:`GRPOTrainer.evaluate`.
    """

    group_size: int = 8
    prompts_per_step: int = 16
    max_new_tokens: int = 4
    temperature: float = 1.0
    top_p: float = 1.0
    learning_rate: float = 1e-4
    weight_decay: float = 0.0
    warmup_steps: int = 0
    beta: float = 0.0
    kl_kind: str = "k3"
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    num_iterations: int = 1
    minibatch_size: int | None = None
    loss_type: str = "grpo"
    scale_rewards: str = "group"
    std: str = "sample"
    max_grad_norm: float | None = 1.0
    ref_sync_every: int | None = None
    reward_weights: list[float] | None = None
    system_prompt: str | None = None
    use_chat_template: bool | None = None
    seed: int = 0
    log_every: int = 1
    checkpoint_every: int = 0
    output_dir: str | None = None
    eval_batch_size: int = 64

    def __post_init__(self) -> None:
        for name, minimum in (
            ("group_size", 2),
            ("prompts_per_step", 1),
            ("max_new_tokens", 1),
            ("num_iterations", 1),
            ("log_every", 1),
            ("eval_batch_size", 1),
        ):
            value = getattr(self, name)
            if not _is_int(value) or value < minimum:
                hint = "; a group needs at least 2 completions to have a baseline" if name == "group_size" else ""
                _fail(name, value, f"an int >= {minimum}", hint)
        for name in ("warmup_steps", "checkpoint_every", "seed"):
            value = getattr(self, name)
            if not _is_int(value) or value < 0:
                _fail(name, value, "an int >= 0")
        if not _is_number(self.temperature) or self.temperature <= 0:
            _fail("temperature", self.temperature, "a number > 0")
        if not _is_number(self.top_p) or not 0 < self.top_p <= 1:
            _fail("top_p", self.top_p, "a number in (0, 1]")
        if not _is_number(self.learning_rate) or self.learning_rate <= 0:
            _fail("learning_rate", self.learning_rate, "a positive number (e.g. 1e-4 for the tiny model)")
        if not _is_number(self.weight_decay) or self.weight_decay < 0:
            _fail("weight_decay", self.weight_decay, "a number >= 0")
        if not _is_number(self.beta) or self.beta < 0:
            _fail("beta", self.beta, "a number >= 0 (0 = no KL penalty)")
        if not _is_number(self.clip_eps) or not 0 < self.clip_eps < 1:
            _fail("clip_eps", self.clip_eps, "a number in (0, 1), e.g. 0.2")
        if self.clip_eps_high is not None and (
            not _is_number(self.clip_eps_high) or not 0 < self.clip_eps_high < 1
        ):
            _fail("clip_eps_high", self.clip_eps_high, "None or a number in (0, 1), e.g. 0.28")
        for name, allowed in (
            ("kl_kind", KL_KINDS),
            ("loss_type", LOSS_TYPES),
            ("scale_rewards", SCALES),
            ("std", STDS),
        ):
            value = getattr(self, name)
            if value not in allowed:
                _fail(name, value, f"one of {list(allowed)}")
        if self.max_grad_norm is not None and (not _is_number(self.max_grad_norm) or self.max_grad_norm <= 0):
            _fail("max_grad_norm", self.max_grad_norm, "None or a number > 0")
        if self.ref_sync_every is not None and (not _is_int(self.ref_sync_every) or self.ref_sync_every < 1):
            _fail("ref_sync_every", self.ref_sync_every, "None or an int >= 1")
        n = self.prompts_per_step * self.group_size
        if self.minibatch_size is not None:
            if not _is_int(self.minibatch_size) or self.minibatch_size < 1:
                _fail("minibatch_size", self.minibatch_size, "None or an int >= 1")
            if n % self.minibatch_size != 0:
                _fail(
                    "minibatch_size",
                    self.minibatch_size,
                    f"a divisor of prompts_per_step*group_size = {self.prompts_per_step}*{self.group_size} = {n}",
                )
        if self.reward_weights is not None:
            if isinstance(self.reward_weights, (str, bytes)) or not isinstance(self.reward_weights, Sequence):
                _fail("reward_weights", self.reward_weights, "None or a list of numbers")
            if not all(_is_number(w) for w in self.reward_weights):
                _fail("reward_weights", self.reward_weights, "a list of finite numbers")
            self.reward_weights = [float(w) for w in self.reward_weights]
        if self.system_prompt is not None and not isinstance(self.system_prompt, str):
            _fail("system_prompt", self.system_prompt, "None or a str")
        if self.use_chat_template not in (None, True, False):
            _fail("use_chat_template", self.use_chat_template, "None (auto), True or False")
        if self.output_dir is not None:
            if not isinstance(self.output_dir, (str, os.PathLike)):
                _fail("output_dir", self.output_dir, "None or a path")
            self.output_dir = os.fspath(self.output_dir)

    @property
    def batch_completions(self) -> int:
        """N = prompts_per_step * group_size, completions sampled per step."""
        return self.prompts_per_step * self.group_size

    @property
    def updates_per_step(self) -> int:
        """Optimizer updates per step: mu * N / minibatch_size."""
        return self.num_iterations * self.batch_completions // (self.minibatch_size or self.batch_completions)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------------
# Small pure helpers
# ---------------------------------------------------------------------------


def derive_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed mixed from ``seed`` and integer keys, without Python's hash().

    ``hash()`` of a string changes between processes; ``numpy.random.SeedSequence``
    does not, so ``derive_seed(0, 5)`` is the same number in every process.
    """
    state = np.random.SeedSequence([seed, *keys]).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def epoch_permutation(n: int, seed: int, epoch: int) -> list[int]:
    """The order in which epoch ``epoch`` visits a dataset of ``n`` rows."""
    gen = torch.Generator().manual_seed(derive_seed(seed, 1, epoch))
    return torch.randperm(n, generator=gen).tolist()


def _caller_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the first frame outside this package."""
    package_dir = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(1), 1  # level 1 = the function calling warnings.warn
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package_dir):
        frame, level = frame.f_back, level + 1
    return level


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum() / mask.sum().clamp(min=1.0))


def _nanmean(values: Sequence[float]) -> float:
    """Mean of the non-NaN values (NaN if there are none)."""
    kept = [v for v in values if not math.isnan(v)]
    return float(sum(kept) / len(kept)) if kept else math.nan


def _finite_mean(values: Sequence[float]) -> float:
    """Mean of the finite values; if none is finite, the first value (NaN or inf) itself."""
    kept = [v for v in values if math.isfinite(v)]
    if kept:
        return float(sum(kept) / len(kept))
    return float(values[0]) if values else math.nan


def _nanmax(values: Sequence[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return float(max(kept)) if kept else math.nan


def advantages_skipping_unscorable(
    rewards: torch.Tensor, group_size: int, *, scale: str = "group", std: str = "sample", eps: float = 1e-4
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group advantages when some rewards are NaN ("no reward function applied").

    Without NaNs this is exactly :func:`group_advantages`. A NaN completion is
    left out of its group's mean and std (as TRL 1.16 does), and its own
    advantage is 0. A group with fewer than two scorable completions, or whose
    scorable rewards are all equal, carries no signal: all its advantages are 0.

    Returns:
        advantages [N] and zero_std [P] (True for groups without a signal).
    """
    nan = torch.isnan(rewards)  # [N]
    grouped = rewards.view(-1, group_size)  # [P, G]
    if not nan.any():
        advantages = group_advantages(rewards, group_size, scale=scale, std=std, eps=eps)  # [N]
        return advantages, (grouped == grouped[:, :1]).all(dim=1)
    valid = ~torch.isnan(grouped)  # [P, G]
    count = valid.sum(dim=1, keepdim=True)  # [P, 1]
    values = torch.where(valid, grouped, torch.zeros_like(grouped))  # [P, G]
    mean = values.sum(dim=1, keepdim=True) / count.clamp(min=1)  # [P, 1]
    centred = torch.where(valid, grouped - mean, torch.zeros_like(grouped))  # [P, G]
    ddof = 1 if std == "sample" else 0
    if scale == "group":
        spread = torch.sqrt((centred**2).sum(dim=1, keepdim=True) / (count - ddof).clamp(min=1))  # [P, 1]
        advantages = centred / (spread + eps)  # [P, G]
    elif scale == "batch":
        kept = grouped[valid]  # [K]
        spread = kept.std(unbiased=ddof == 1) if kept.numel() > 1 else kept.new_zeros(())
        advantages = centred / (spread + eps)  # [P, G]
    else:
        advantages = centred  # [P, G]
    low = torch.where(valid, grouped, torch.full_like(grouped, math.inf)).amin(dim=1)  # [P]
    high = torch.where(valid, grouped, torch.full_like(grouped, -math.inf)).amax(dim=1)  # [P]
    zero_std = (count.squeeze(1) < 2) | (low == high)  # [P]
    advantages = advantages.masked_fill(zero_std[:, None] | ~valid, 0.0)  # [P, G]
    return advantages.reshape(-1), zero_std


def read_history(path: str | os.PathLike) -> list[dict]:
    """Rows of a ``history.jsonl`` (a directory holding one is fine too)."""
    p = Path(path)
    if p.is_dir():
        p = p / _HISTORY_FILE
    if not p.exists():
        raise FileNotFoundError(f"no history file at {str(p)!r}")
    rows = []
    with open(p, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{p}:{line_no} is not valid JSON ({err}); was the file cut short?") from None
    return rows


def _fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (POSIX; a no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def find_checkpoint(output_dir: str | os.PathLike) -> Path | None:
    """The last complete checkpoint under ``output_dir``, or None.

    ``output_dir/checkpoint`` normally; if a save was killed between its two
    renames, the previous checkpoint is still complete under ``checkpoint.old``.
    A leftover ``checkpoint.tmp`` is an unfinished write and is never used.
    ``output_dir`` may also be a checkpoint directory itself.
    """
    root = Path(output_dir)
    if (root / _META_FILE).exists() and (root / _STATE_FILE).exists():
        return root
    for name in (_CHECKPOINT, _CHECKPOINT_OLD):
        candidate = root / name
        if (candidate / _META_FILE).exists() and (candidate / _STATE_FILE).exists():
            return candidate
    return None


def load_model_state(model: torch.nn.Module, checkpoint: str | os.PathLike) -> dict:
    """Load a trainer checkpoint's policy weights into ``model``; return its metadata."""
    path = find_checkpoint(checkpoint)
    if path is None:
        raise FileNotFoundError(
            f"no checkpoint found in {os.fspath(checkpoint)!r}; expected {_CHECKPOINT}/{_STATE_FILE} "
            f"and {_CHECKPOINT}/{_META_FILE} (written by GRPOTrainer.train with checkpoint_every > 0)"
        )
    state = torch.load(path / _STATE_FILE, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    return json.loads((path / _META_FILE).read_text(encoding="utf-8"))


def _dataset_fingerprint(dataset: Sequence[dict]) -> str:
    """A digest of the prompts and answers, to catch resuming on other data."""
    digest = hashlib.sha256()
    for row in dataset:
        digest.update(json.dumps([row.get("prompt"), row.get("answer")], default=str).encode("utf-8"))
    return digest.hexdigest()[:16]


def _as_rows(dataset: Any) -> Any:
    """Accept a Hugging Face ``datasets.Dataset`` (as TRL users have) as a list of dicts."""
    to_list = getattr(dataset, "to_list", None)
    if callable(to_list) and not isinstance(dataset, (list, tuple)):
        return to_list()
    return dataset


def _check_rows(rows: Any, name: str) -> None:
    if isinstance(rows, (str, dict)) or not isinstance(rows, Sequence):
        raise TypeError(f"{name} must be a list of dicts with a 'prompt' key, got {type(rows).__name__}")
    if len(rows) == 0:
        raise ValueError(f"{name} is empty; expected at least one row with a 'prompt'")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise TypeError(f"{name}[{i}] must be a dict with a 'prompt' key, got {type(row).__name__}: {row!r:.80}")
        prompt = row.get("prompt")
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt))):
            raise ValueError(
                f"{name}[{i}] needs a 'prompt' that is a string or a list of chat messages, got {row!r:.80}"
            )


def _rng_state() -> dict:
    """Every global RNG a reward function might touch, in a torch.save-safe form."""
    np_state = np.random.get_state()
    state = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": [np_state[0], torch.from_numpy(np_state[1].astype(np.int64)), *map(float, np_state[2:])],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), int(pos), int(has_gauss), float(cached)))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ---------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------


class GRPOTrainer:
    """GRPO for a Hugging Face causal LM, with verifiable reward functions.

    Args:
        model: the policy (a transformers causal LM), trained in place.
        tokenizer: its tokenizer (needs an EOS token).
        reward_fns: one reward function or a list, TRL signature
            ``fn(completions, *, answer, **kwargs) -> list[float | None]``.
        config: a :class:`GRPOConfig` (default: ``GRPOConfig()``).
        ref_model: the reference policy for the KL penalty. Only used when
            ``config.beta > 0``; if None, a frozen deep copy of ``model`` is made.
        accuracy_fn: what the ``accuracy`` metric counts as correct: a function
            with the reward signature returning 1.0 (correct) or 0.0 per
            completion. Default: the answer ``extract_answer`` finds equals the
            row's ``answer`` (``answers_match``). Pass ``countdown_reward`` for
            Countdown, whose answer is an expression, not a number.

    Attributes:
        step: completed training steps.
        history: one dict per completed step (see :meth:`train_step`).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        reward_fns: Callable | Sequence[Callable],
        config: GRPOConfig | None = None,
        ref_model: torch.nn.Module | None = None,
        *,
        accuracy_fn: Callable | None = None,
    ) -> None:
        config = GRPOConfig() if config is None else config
        if not isinstance(config, GRPOConfig):
            raise TypeError(f"config must be a GRPOConfig, got {type(config).__name__}")
        fns = [reward_fns] if callable(reward_fns) else reward_fns
        if isinstance(fns, (str, dict)) or not isinstance(fns, Sequence) or len(fns) == 0:
            raise TypeError(f"reward_fns must be a reward function or a non-empty list of them, got {reward_fns!r:.80}")
        for i, fn in enumerate(fns):
            if not callable(fn):
                raise TypeError(f"reward_fns[{i}] must be callable, got {type(fn).__name__}: {fn!r:.80}")
        if config.reward_weights is not None and len(config.reward_weights) != len(fns):
            raise ValueError(
                f"GRPOConfig.reward_weights has {len(config.reward_weights)} entries but there are "
                f"{len(fns)} reward functions; expected one weight per function"
            )
        if getattr(tokenizer, "eos_token_id", None) is None:
            raise ValueError("tokenizer.eos_token_id is None; the trainer needs an EOS token")
        if accuracy_fn is not None and not callable(accuracy_fn):
            raise TypeError(f"accuracy_fn must be None or a function, got {type(accuracy_fn).__name__}")
        self.accuracy_fn = accuracy_fn

        self.model = model
        self.tokenizer = tokenizer
        self.reward_fns = list(fns)
        self.config = config
        self.step = 0
        self.history: list[dict] = []
        self.skipped_updates = 0
        self._epoch = 0  # data position: epoch and index into its permutation
        self._index = 0
        self._perm_cache: tuple[int, int, list[int]] | None = None
        self._warned: set[str] = set()
        self._stop_requested = False
        self._dataset_fingerprint: str | None = None

        torch.manual_seed(config.seed)
        random.seed(config.seed)
        np.random.seed(config.seed % 2**32)

        if ref_model is not None and ref_model is model:
            raise ValueError(
                "ref_model is the policy itself; the reference must be a separate, frozen copy "
                "(pass ref_model=None to let the trainer make one, or copy.deepcopy(model))"
            )
        self.ref_model: torch.nn.Module | None = None
        if config.beta > 0:
            self.ref_model = ref_model if ref_model is not None else copy.deepcopy(model)
            self.ref_model.eval()
            self.ref_model.requires_grad_(False)

        self._params = [p for p in model.parameters() if p.requires_grad]
        if not self._params:
            raise ValueError("the model has no trainable parameters (all requires_grad=False)")
        half = sorted({str(p.dtype) for p in self._params if p.dtype in (torch.float16, torch.bfloat16)})
        if half:
            warnings.warn(
                f"the policy's trainable weights are {', '.join(half)}: AdamW updates of size lr "
                "(e.g. 1e-6) are mostly rounded away in 16-bit weights, so training may silently do "
                "almost nothing. Load the policy in float32 for training "
                "(load_policy(name, dtype='float32')); generation can still be fast enough.",
                GRPOWarning,
                stacklevel=2,
            )
        self.optimizer = torch.optim.AdamW(
            self._params, lr=config.learning_rate, weight_decay=config.weight_decay
        )
        warmup = config.warmup_steps
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda update: min(1.0, (update + 1) / (warmup + 1)) if warmup else 1.0
        )

    # ------------------------------------------------------------------ warnings
    def _warn_once(self, kind: str, message: str) -> None:
        if kind in self._warned:
            return
        self._warned.add(kind)
        warnings.warn(message, GRPOWarning, stacklevel=_caller_stacklevel())

    # ------------------------------------------------------------------ scoring
    def _logprobs(
        self, model: torch.nn.Module, rollout: Rollout, rows: torch.Tensor, *, entropy: bool = False
    ) -> Any:
        """Per-token log-probs of the completions in ``rows`` under ``model``."""
        return completion_logprobs(
            model,
            rollout.input_ids[rows],  # [M, Tp+Tc]
            rollout.attention_mask[rows],  # [M, Tp+Tc]
            rollout.completion_ids.shape[1],
            temperature=self.config.temperature,
            return_entropy=entropy,
        )

    @torch.no_grad()
    def _score_no_grad(self, model: torch.nn.Module, rollout: Rollout, *, entropy: bool) -> Any:
        """Stage 4/5: log-probs (and entropy) of all N completions, eval mode, no gradient."""
        n = len(rollout)
        chunk = self.config.minibatch_size or n
        was_training = model.training
        model.eval()
        try:
            parts = [
                self._logprobs(model, rollout, torch.arange(i, min(i + chunk, n)), entropy=entropy)
                for i in range(0, n, chunk)
            ]
        finally:
            model.train(was_training)
        if entropy:
            return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])  # [N, Tc] x2
        return torch.cat(parts)  # [N, Tc]

    def _columns(self, batch: Sequence[dict], group_size: int) -> dict[str, list]:
        """Extra dataset columns, repeated for each completion (TRL passes them as kwargs)."""
        keys = [k for k in batch[0] if k not in ("prompt", "answer") and all(k in row for row in batch)]
        return {k: [row[k] for row in batch for _ in range(group_size)] for k in keys}

    def _correct(
        self, prompts: list, completions: list[str], answers: list, columns: dict[str, list]
    ) -> list[float] | None:
        """1.0/0.0 per completion as ``accuracy_fn`` judges it (None: cannot be judged)."""
        if self.accuracy_fn is None:
            if any(a is None for a in answers):
                return None
            return [1.0 if answers_match(extract_answer(c), a) else 0.0 for c, a in zip(completions, answers)]
        values = self.accuracy_fn(prompts=prompts, completions=completions, answer=answers, **columns)
        if len(values) != len(completions):
            raise ValueError(
                f"accuracy_fn returned {len(values)} values for {len(completions)} completions; expected one each"
            )
        return [math.nan if v is None else float(v) for v in values]

    # ------------------------------------------------------------------ one step
    def train_step(self, batch: Sequence[dict]) -> dict:
        """One GRPO step on ``batch`` (a list of rows with ``prompt`` and ``answer``).

        Returns the history row, also appended to :attr:`history`. Its fields are
        plain numbers: ``step``; ``reward_mean``, ``reward_std`` and
        ``reward/<function name>``; ``accuracy`` (NaN if rows have no answer);
        ``kl`` (NaN when beta = 0: no reference is kept); ``clip_frac_low``,
        ``clip_frac_high``, ``clip_frac``, ``ratio_mean``, ``ratio_max`` (means
        over the step's updates, max for ratio_max); ``entropy`` (mean per
        completion token, from the old-policy pass); ``completion_len_mean``,
        ``completion_len_max``; ``frac_zero_std`` (groups whose rewards are all
        equal); ``frac_truncated``; ``grad_norm`` (before clipping) and ``loss``
        (means over the step's updates that were finite; NaN/inf only if
        none was); ``lr``; ``skipped_updates`` (cumulative); and the
        timing fields ``step_seconds``, ``rollout_seconds``, ``tokens_per_s``.
        """
        _check_rows(batch, "batch")
        cfg = self.config
        G = cfg.group_size
        t_start = time.perf_counter()
        step_seed = derive_seed(cfg.seed, 0, self.step)

        # stage 1: rollout, all B*G completions in one generate call
        rollout = generate_rollouts(
            self.model,
            self.tokenizer,
            [row["prompt"] for row in batch],
            group_size=G,
            max_new_tokens=cfg.max_new_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            do_sample=True,
            system_prompt=cfg.system_prompt,
            use_chat_template=cfg.use_chat_template,
            generator_seed=step_seed,
        )
        rollout_seconds = time.perf_counter() - t_start
        N = len(rollout)

        # stage 2: rewards
        answers = [row.get("answer") for row in batch for _ in range(G)]
        columns = self._columns(batch, G)
        rewards, per_fn = compute_rewards(
            self.reward_fns, cfg.reward_weights, rollout.prompts, rollout.completions, answers, **columns
        )  # [N], {name: [N]}
        correct = self._correct(rollout.prompts, rollout.completions, answers, columns)
        device = rollout.completion_ids.device
        unscorable = torch.isnan(rewards)  # [N]
        if unscorable.any():
            self._warn_once(
                "unscorable",
                f"{int(unscorable.sum())} of {N} completions could not be scored (every reward function "
                "returned None); they are left out of their group's baseline and of reward_mean, "
                "and get an advantage of 0",
            )

        # stage 3: group-relative advantages (group_advantages, NaN-aware)
        advantages, zero_std = advantages_skipping_unscorable(
            rewards, G, scale=cfg.scale_rewards, std=cfg.std
        )  # [N], [P]
        advantages = advantages.to(device)  # [N]

        # stage 4: old log-probs (the policy that sampled), no gradient, eval mode
        mask = rollout.completion_mask  # [N, Tc]
        old_logp, entropy = self._score_no_grad(self.model, rollout, entropy=True)  # [N, Tc] x2

        # stage 5: reference log-probs, only with a KL penalty
        ref_logp = None
        if self.ref_model is not None:
            ref_logp = self._score_no_grad(self.ref_model, rollout, entropy=False)  # [N, Tc]

        # stage 6: mu passes over shuffled minibatches
        stats, losses, grad_norms, lr = self._update(rollout, old_logp, ref_logp, advantages, mask)

        self.step += 1
        if self.ref_model is not None and cfg.ref_sync_every and self.step % cfg.ref_sync_every == 0:
            self.ref_model.load_state_dict(self.model.state_dict())

        step_seconds = time.perf_counter() - t_start
        lengths = mask.sum(dim=1)  # [N]
        generated = float(lengths.sum())
        reward_values = rewards[~unscorable]
        row: dict[str, Any] = {
            "step": self.step,
            "reward_mean": float(reward_values.mean()) if reward_values.numel() else math.nan,
            "reward_std": float(reward_values.std()) if reward_values.numel() > 1 else 0.0,
        }
        row.update({f"reward/{name}": value for name, value in reward_function_means(per_fn).items()})
        row.update(
            {
                "accuracy": _nanmean(correct) if correct is not None else math.nan,
                "kl": _nanmean([s["kl"] for s in stats]),
                "clip_frac_low": _nanmean([s["clip_frac_low"] for s in stats]),
                "clip_frac_high": _nanmean([s["clip_frac_high"] for s in stats]),
                "clip_frac": _nanmean([s["clip_frac"] for s in stats]),
                "ratio_mean": _nanmean([s["ratio_mean"] for s in stats]),
                "ratio_max": _nanmax([s["ratio_max"] for s in stats]),
                "entropy": _masked_mean(entropy, mask),
                "completion_len_mean": float(lengths.mean()),
                "completion_len_max": float(lengths.max()),
                "frac_zero_std": float(zero_std.float().mean()),
                "frac_truncated": float(rollout.truncated.float().mean()),
                "grad_norm": _finite_mean(grad_norms),
                "loss": _finite_mean(losses),
                "lr": lr,
                "skipped_updates": float(self.skipped_updates),
                "step_seconds": step_seconds,
                "rollout_seconds": rollout_seconds,
                "tokens_per_s": generated / step_seconds if step_seconds > 0 else math.nan,
            }
        )
        self._check_failure_modes(row)
        self.history.append(row)
        return row

    def _update(
        self,
        rollout: Rollout,
        old_logp: torch.Tensor,
        ref_logp: torch.Tensor | None,
        advantages: torch.Tensor,
        mask: torch.Tensor,
    ) -> tuple[list[dict], list[float], list[float], float]:
        """Stage 6: mu passes of clipped-surrogate updates over shuffled minibatches."""
        cfg = self.config
        N = len(rollout)
        size = cfg.minibatch_size or N
        shuffle = torch.Generator().manual_seed(derive_seed(cfg.seed, 2, self.step))
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm is not None else math.inf
        stats: list[dict] = []
        losses: list[float] = []
        grad_norms: list[float] = []
        lr = float(self.optimizer.param_groups[0]["lr"])
        was_training = self.model.training
        self.model.train()
        try:
            for _ in range(cfg.num_iterations):
                order = torch.randperm(N, generator=shuffle).to(old_logp.device)  # [N]
                for start in range(0, N, size):
                    rows = order[start : start + size]  # [M]
                    logp = self._logprobs(self.model, rollout, rows)  # [M, Tc]
                    loss, s = grpo_loss(
                        logp,
                        old_logp[rows],
                        advantages[rows],
                        mask[rows],
                        ref_logp=None if ref_logp is None else ref_logp[rows],
                        beta=cfg.beta,
                        clip_eps=cfg.clip_eps,
                        clip_eps_high=cfg.clip_eps_high,
                        loss_type=cfg.loss_type,
                        max_completion_length=cfg.max_new_tokens,
                        kl_kind=cfg.kl_kind,
                    )
                    stats.append(s)
                    losses.append(float(loss.detach()))
                    lr = float(self.optimizer.param_groups[0]["lr"])
                    self.optimizer.zero_grad(set_to_none=True)
                    if not torch.isfinite(loss):
                        grad_norms.append(math.nan)
                        self._skip_update(f"the loss is {float(loss)}")
                        continue
                    loss.backward()
                    norm = float(torch.nn.utils.clip_grad_norm_(self._params, max_norm))
                    grad_norms.append(norm)
                    if not math.isfinite(norm):
                        self.optimizer.zero_grad(set_to_none=True)
                        self._skip_update(f"the gradient norm is {norm}")
                        continue
                    self.optimizer.step()
                    self.scheduler.step()
                    self.optimizer.zero_grad(set_to_none=True)
        finally:
            self.model.train(was_training)
        return stats, losses, grad_norms, lr

    def _skip_update(self, reason: str) -> None:
        self.skipped_updates += 1
        self._warn_once(
            "nonfinite",
            f"step {self.step + 1}: {reason}; skipped this optimizer update (gradients zeroed). "
            "Training continues and history['skipped_updates'] counts the skips. If it keeps "
            "happening, lower learning_rate, check the reward functions, or use float32.",
        )

    def _check_failure_modes(self, row: dict) -> None:
        cfg = self.config
        step = row["step"]
        if row["frac_zero_std"] == 1.0:
            self._warn_once(
                "zero_std",
                f"no learning signal at step {step}: in every group all {cfg.group_size} completions got "
                "the same reward, so every advantage is 0. Make the task easier (or warm-start the "
                "model), raise group_size or temperature, or use a reward with partial credit.",
            )
        elif row["frac_zero_std"] > 0.8:
            self._warn_once(
                "collapse",
                f"possible collapse at step {step}: {row['frac_zero_std']:.0%} of groups have zero reward "
                "std (healthy tiny-model runs sit at about 16-42%). The policy may have become "
                f"deterministic; lower learning_rate (now {cfg.learning_rate:g}) or add a KL penalty (beta).",
            )
        if row["frac_truncated"] > 0.5:
            self._warn_once(
                "truncated",
                f"step {step}: {row['frac_truncated']:.0%} of completions hit max_new_tokens="
                f"{cfg.max_new_tokens} without an EOS; raise max_new_tokens, or ask for shorter answers.",
            )

    # ------------------------------------------------------------------ data
    def _permutation(self, n: int, epoch: int) -> list[int]:
        if self._perm_cache is None or self._perm_cache[:2] != (n, epoch):
            self._perm_cache = (n, epoch, epoch_permutation(n, self.config.seed, epoch))
        return self._perm_cache[2]

    def _next_batch(self, dataset: Sequence[dict]) -> tuple[list[dict], int, int]:
        """The next prompts_per_step rows and the data position after them.

        Rows are visited in a seeded shuffled order that changes every epoch; a
        batch may run over into the next epoch. The position is returned rather
        than stored, so a step that fails leaves it untouched.
        """
        n = len(dataset)
        epoch, index = self._epoch, self._index
        rows: list[dict] = []
        while len(rows) < self.config.prompts_per_step:
            perm = self._permutation(n, epoch)
            take = min(self.config.prompts_per_step - len(rows), n - index)
            rows.extend(dataset[i] for i in perm[index : index + take])
            index += take
            if index == n:
                epoch, index = epoch + 1, 0
        return rows, epoch, index

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, output_dir: str | os.PathLike | None = None) -> Path:
        """Write ``output_dir/checkpoint/`` atomically and return its path.

        Everything goes into ``checkpoint.tmp/`` first and is fsynced; then the
        old checkpoint is renamed to ``checkpoint.old``, the new one renamed into
        place, and the old one deleted. At every instant a complete checkpoint
        exists under ``checkpoint`` or ``checkpoint.old`` (see
        :func:`find_checkpoint`), so a kill mid-save loses at most the new one.
        """
        root = Path(output_dir if output_dir is not None else self._require_output_dir("save_checkpoint"))
        root.mkdir(parents=True, exist_ok=True)
        final, tmp, old = root / _CHECKPOINT, root / _CHECKPOINT_TMP, root / _CHECKPOINT_OLD
        # recover from an earlier save killed between its renames, then clear leftovers
        if not final.exists() and old.exists():
            os.replace(old, final)
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)

        tmp.mkdir()
        state = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "ref_model": None if self.ref_model is None else self.ref_model.state_dict(),
            "rng": _rng_state(),
        }
        torch.save(state, tmp / _STATE_FILE)
        with open(tmp / _STATE_FILE, "rb+") as fh:
            os.fsync(fh.fileno())
        meta = {
            "format": _FORMAT_VERSION,
            "step": self.step,
            "epoch": self._epoch,
            "index": self._index,
            "data_seed": self.config.seed,
            "dataset_fingerprint": self._dataset_fingerprint,
            "skipped_updates": self.skipped_updates,
            "warned": sorted(self._warned),
            "history_len": len(self.history),
            "history": self.history,
            "config": self.config.to_dict(),
        }
        _write_file(tmp / _META_FILE, json.dumps(meta, indent=1).encode("utf-8"))
        _fsync_dir(tmp)

        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        _fsync_dir(root)
        shutil.rmtree(old, ignore_errors=True)
        return final

    def load_checkpoint(self, output_dir: str | os.PathLike | None = None) -> bool:
        """Restore everything from the last checkpoint; False if there is none."""
        root = output_dir if output_dir is not None else self._require_output_dir("load_checkpoint")
        path = find_checkpoint(root)
        if path is None:
            return False
        meta = json.loads((path / _META_FILE).read_text(encoding="utf-8"))
        if meta.get("format") != _FORMAT_VERSION:
            raise ValueError(f"checkpoint {path} has format {meta.get('format')!r}; expected {_FORMAT_VERSION}")
        saved = meta["config"]
        ignore = {"output_dir", "log_every", "checkpoint_every", "eval_batch_size"}
        changed = {k: (saved.get(k), v) for k, v in self.config.to_dict().items() if k not in ignore and saved.get(k) != v}
        if changed:
            listing = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
            warnings.warn(
                f"resuming from {path} with a different config ({listing}); the resumed run will not "
                "match an uninterrupted one",
                GRPOWarning,
                stacklevel=2,
            )
        state = torch.load(path / _STATE_FILE, map_location="cpu", weights_only=True)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if self.ref_model is not None:
            if state["ref_model"] is not None:
                self.ref_model.load_state_dict(state["ref_model"])
            else:
                warnings.warn(
                    f"checkpoint {path} holds no reference model (it was saved with beta=0); "
                    "the reference stays as it is now",
                    GRPOWarning,
                    stacklevel=2,
                )
        _set_rng_state(state["rng"])
        self.step = int(meta["step"])
        self._epoch, self._index = int(meta["epoch"]), int(meta["index"])
        self._dataset_fingerprint = meta["dataset_fingerprint"]
        self.skipped_updates = int(meta["skipped_updates"])
        self._warned = set(meta["warned"])
        self.history = list(meta["history"])[: int(meta["history_len"])]
        return True

    def _validate(self, dataset: Sequence[dict]) -> None:
        """The dataset checks of tasks.validate_dataset, with the model's context as the limit."""
        _check_rows(dataset, "dataset")
        limit = getattr(getattr(self.model, "config", None), "max_position_embeddings", None)
        max_prompt = limit - self.config.max_new_tokens if isinstance(limit, int) else None
        if max_prompt is not None and max_prompt < 1:
            raise ValueError(
                f"GRPOConfig.max_new_tokens={self.config.max_new_tokens} leaves no room for a prompt "
                f"in the model's context of {limit} tokens"
            )
        validate_dataset(dataset, tokenizer=self.tokenizer, max_prompt_tokens=max_prompt)

    def _require_output_dir(self, what: str) -> str:
        if self.config.output_dir is None:
            raise ValueError(f"{what} needs a directory: set GRPOConfig.output_dir or pass output_dir=...")
        return self.config.output_dir

    # ------------------------------------------------------------------ the loop
    def _rewrite_history_file(self, path: Path) -> None:
        """Make ``history.jsonl`` hold exactly :attr:`history` (atomic replace)."""
        tmp = path.with_name(path.name + ".tmp")
        text = "".join(json.dumps(row) + "\n" for row in self.history)
        _write_file(tmp, text.encode("utf-8"))
        os.replace(tmp, path)

    def _install_sigint(self) -> Any:
        """Turn the first Ctrl-C into "stop after this step"; a second one aborts."""
        if threading.current_thread() is not threading.main_thread():
            return None
        previous = signal.getsignal(signal.SIGINT)

        def handler(signum: int, frame: Any) -> None:
            if self._stop_requested:
                raise KeyboardInterrupt
            self._stop_requested = True
            print(
                "\nCtrl-C: finishing the current step, then saving a checkpoint "
                "(press Ctrl-C again to abort at once, losing this step)",
                file=sys.stderr,
                flush=True,
            )

        signal.signal(signal.SIGINT, handler)
        return previous

    def train(
        self,
        dataset: Sequence[dict],
        steps: int,
        *,
        resume: bool = False,
        progress: bool = True,
    ) -> list[dict]:
        """Train until ``steps`` steps have been taken in total; return the history.

        ``steps`` is the total, not a count of new steps: a resumed run and an
        uninterrupted one with the same arguments end at the same step, and a
        second ``train(ds, 200)`` on a trainer already at step 100 runs 100 more.

        Each step's row is appended to ``output_dir/history.jsonl`` and flushed.
        A checkpoint is saved every ``checkpoint_every`` steps and at the end.

        Args:
            dataset: rows with ``prompt`` (and ``answer``) keys.
            steps: the total number of steps to reach (> 0).
            resume: load ``output_dir/checkpoint`` first (if there is none,
                start from scratch with a warning). ``history.jsonl`` is cut back
                to the checkpoint's step, and the later steps are redone exactly.
            progress: show a tqdm bar with the reward and KL.

        Ctrl-C: the current step finishes, a checkpoint is saved (if output_dir
        is set), and ``KeyboardInterrupt`` is raised. The trainer is then
        consistent, so calling ``train`` again continues. A second Ctrl-C
        aborts the step at once; resume from the last checkpoint then.
        """
        dataset = _as_rows(dataset)
        self._validate(dataset)
        if not _is_int(steps) or steps < 1:
            raise ValueError(f"steps must be a positive int, got {steps!r}")
        cfg = self.config
        out = Path(cfg.output_dir) if cfg.output_dir is not None else None
        fingerprint = _dataset_fingerprint(dataset)
        if resume:
            if out is None:
                raise ValueError("train(resume=True) needs GRPOConfig.output_dir, where the checkpoint lives")
            saved = find_checkpoint(out)
            if saved is not None:  # refuse a different dataset before touching any state
                saved_fingerprint = json.loads((saved / _META_FILE).read_text(encoding="utf-8")).get("dataset_fingerprint")
                if saved_fingerprint not in (None, fingerprint):
                    raise ValueError(
                        f"the dataset differs from the one the checkpoint in {str(out)!r} was trained on "
                        f"(fingerprint {fingerprint} vs {saved_fingerprint}); resume with the same dataset"
                    )
            if not self.load_checkpoint(out):
                warnings.warn(f"resume=True but no checkpoint in {str(out)!r}; starting from step 0", GRPOWarning, stacklevel=2)
            elif self._dataset_fingerprint not in (None, fingerprint):
                raise ValueError(
                    f"the dataset differs from the one the checkpoint in {str(out)!r} was trained on "
                    f"(fingerprint {fingerprint} vs {self._dataset_fingerprint}); resume with the same dataset"
                )
        elif out is not None and self.step == 0 and find_checkpoint(out) is not None:
            warnings.warn(
                f"{str(out)!r} already holds a checkpoint; starting a new run from step 0 that will "
                "replace it at its first save (pass resume=True to continue the old run instead)",
                GRPOWarning,
                stacklevel=2,
            )
        self._dataset_fingerprint = fingerprint

        history_file = None
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            self._rewrite_history_file(out / _HISTORY_FILE)
            history_file = open(out / _HISTORY_FILE, "a", encoding="utf-8")

        bar = None
        if progress:
            from ._progress import progress_bar

            bar = progress_bar(total=steps, desc="GRPO", initial=min(self.step, steps), unit="step", dynamic_ncols=True)
        self._stop_requested = False
        previous_handler = self._install_sigint()
        saved_at = self.step  # nothing new to save unless a step runs
        try:
            while self.step < steps:
                batch, epoch, index = self._next_batch(dataset)
                row = self.train_step(batch)
                self._epoch, self._index = epoch, index
                if history_file is not None:
                    history_file.write(json.dumps(row) + "\n")
                    history_file.flush()
                if bar is not None:
                    bar.update(1)
                    if self.step % cfg.log_every == 0:
                        bar.set_postfix(reward=f"{row['reward_mean']:.3f}", kl=f"{row['kl']:.4f}")
                if out is not None and cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                    os.fsync(history_file.fileno())
                    self.save_checkpoint(out)
                    saved_at = self.step
                if self._stop_requested:
                    if out is not None:
                        os.fsync(history_file.fileno())
                        where = self.save_checkpoint(out)
                        message = f"training interrupted after step {self.step}; checkpoint saved to {where}"
                    else:
                        message = f"training interrupted after step {self.step} (no output_dir, nothing saved)"
                    raise KeyboardInterrupt(message)
            if out is not None and cfg.checkpoint_every and saved_at != self.step:
                os.fsync(history_file.fileno())
                self.save_checkpoint(out)
        finally:
            if previous_handler is not None:
                signal.signal(signal.SIGINT, previous_handler)
            if bar is not None:
                bar.close()
            if history_file is not None:
                history_file.close()
        return self.history

    # ------------------------------------------------------------------ evaluation
    def evaluate(
        self, dataset: Sequence[dict], *, batch_size: int | None = None, num_samples: int = 3
    ) -> dict:
        """Greedy accuracy, mean reward and mean completion length on ``dataset``.

        One greedy completion per prompt, ``batch_size`` prompts per ``generate``
        call (default ``config.eval_batch_size``). The model's train/eval mode
        is restored afterwards and no RNG is consumed, so evaluating in the
        middle of training does not change the training run.

        Returns:
            ``accuracy`` (NaN if rows have no answer), ``reward_mean``,
            ``completion_len_mean``, ``frac_truncated``, ``n`` and ``samples``:
            the first ``num_samples`` (prompt, completion, answer) dicts.
        """
        dataset = _as_rows(dataset)
        self._validate(dataset)
        size = self.config.eval_batch_size if batch_size is None else batch_size
        if not _is_int(size) or size < 1:
            raise ValueError(f"batch_size must be a positive int, got {size!r}")
        completions: list[str] = []
        correct: list[float] | None = []
        rewards: list[torch.Tensor] = []
        lengths: list[torch.Tensor] = []
        truncated: list[torch.Tensor] = []
        for start in range(0, len(dataset), size):
            rows = list(dataset[start : start + size])
            rollout = generate_rollouts(
                self.model,
                self.tokenizer,
                [row["prompt"] for row in rows],
                group_size=1,
                max_new_tokens=self.config.max_new_tokens,
                do_sample=False,
                system_prompt=self.config.system_prompt,
                use_chat_template=self.config.use_chat_template,
            )
            answers = [row.get("answer") for row in rows]
            columns = self._columns(rows, 1)
            total, _ = compute_rewards(
                self.reward_fns, self.config.reward_weights, rollout.prompts, rollout.completions, answers, **columns
            )
            judged = self._correct(rollout.prompts, rollout.completions, answers, columns)
            correct = None if correct is None or judged is None else correct + judged
            completions.extend(rollout.completions)
            rewards.append(total)
            lengths.append(rollout.completion_lengths.float().cpu())
            truncated.append(rollout.truncated.float().cpu())
        all_rewards = torch.cat(rewards)  # [n]
        return {
            "accuracy": _nanmean(correct) if correct is not None else math.nan,
            "reward_mean": float(torch.nanmean(all_rewards)),
            "completion_len_mean": float(torch.cat(lengths).mean()),
            "frac_truncated": float(torch.cat(truncated).mean()),
            "n": len(dataset),
            "samples": [
                {"prompt": row["prompt"], "completion": c, "answer": row.get("answer")}
                for row, c in zip(dataset[:num_samples], completions)
            ],
        }
