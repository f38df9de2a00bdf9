"""The GRPO trainer: the loop around one step, and what keeps a run safe.

One step of GRPO is :class:`~grpo_tutorial.step.GRPOStep` (``step.py``: the five
stages of :mod:`grpo_tutorial.stages`, top to bottom). :class:`GRPOTrainer` holds
one and adds what a run needs around it: :meth:`GRPOTrainer.train` loops over a
dataset with the run machinery of :mod:`grpo_tutorial.run`: it appends to
``history.jsonl``, saves atomic checkpoints and holds the output directory's
lock, so a run killed at any moment and resumed gives the same history as one
never interrupted (on CPU, same seed). Only wall-clock fields
(:data:`TIMING_KEYS`) differ. Randomness comes from named seed streams
(seeding.py); building a trainer touches no global RNG.

Where other things plug in: ``ref_model`` and ``sampler`` go to the step (its
:class:`~grpo_tutorial.step.Policies` and sampler); with ``use_peft`` the policy
is wrapped with LoRA adapters and its policies are :mod:`grpo_tutorial.lora`'s
(the base is the reference; a checkpoint holds the adapters); each history row also goes
to every function in :attr:`GRPOTrainer.row_listeners` (a TensorBoard writer,
say) as the run appends it. After each step, chapter 18's doctor reads the run
so far (:mod:`grpo_tutorial.doctor`), and each fault or warning it finds is a
``GRPOWarning``, once per run, that names the finding and its chapter.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from .answers import answer_readings
from ._checks import is_int
from .config import GRPOConfig
from .doctor import live_warnings
from .evaluation import evaluate_policy
from .lora import adapter_policies, check_checkpoint_fits, checkpoint_meta, checkpoint_weights
from .metrics import TIMING_KEYS
from .models import disable_dropout
from .objectives import EntropyControl
from .run.checkpoint import load_model_state, load_training, resume_or_start, save_training
from .run.completions import CompletionsWriter, read_completions, sample_completions
from .run.crash import clear_crash, write_crash
from .run.history import HistoryWriter, history_until, read_history
from .run.interrupt import StopAfterStep
from .run.layout import COMPLETIONS_FILE, find_checkpoint, read_meta
from .run.lock import run_lock
from .run.progress import postfix, progress_bar
from .run.state import RunState, dataset_fingerprint
from .run.tensorboard import check_reporting, report_rows
from .seeding import DataStream
from .step import GRPOStep, Sampler
from .tasks import as_rows, validate_for_model
from .warn import GRPOWarning

__all__ = [
    "GRPOConfig",
    "GRPOTrainer",
    "GRPOWarning",
    "TIMING_KEYS",
    "disable_dropout",
    "find_checkpoint",
    "load_model_state",
    "read_history",
]

#: The progress bar's fields: label -> (history key, format). A value the step did not compute is not shown.
PROGRESS_FIELDS = {"reward": ("reward_mean", ".3f"), "acc": ("accuracy", ".2f"), "kl": ("kl", ".4f")}


def _checked_step(step: Any, model: Any, tokenizer: Any, config: Any, **not_with_a_step: Any) -> GRPOStep:
    """A step given to the trainer: a GRPOStep built on the trainer's own model, tokenizer and config, with nothing
    that the step takes itself passed to the trainer too."""
    if not isinstance(step, GRPOStep):
        raise TypeError(f"step must be a GRPOStep (or a subclass: PPOStep, MonteCarloStep), got {type(step).__name__}")
    unwrap = getattr(step.model, "get_base_model", None)  # a PEFT model wraps the model it was given
    if step.model is not model and not (callable(unwrap) and unwrap() is model):
        raise ValueError("step= was built on another model than the one given to the trainer; build it on the same")
    if step.tokenizer is not tokenizer:
        raise ValueError("step= was built with another tokenizer than the one given to the trainer")
    if step.config != config:
        raise ValueError("step= was built with another config than the one given to the trainer; pass the step's")
    given = sorted(name for name, value in not_with_a_step.items() if value is not None)
    if given:
        raise ValueError(f"{', '.join(given)} belong to the step: pass them when you build it, not to the trainer "
                         "with step=")
    return step


def _step_attribute(name: str, writable: bool = True) -> property:
    """The trainer's ``name`` is its step's (read and written there; ``writable=False``: read only, with a reason)."""

    def refuse(self: Any, value: Any) -> None:
        raise AttributeError(f"GRPOTrainer.{name} cannot be replaced: the step's sampler, optimizer and reference were "
                             f"built with it; build a new GRPOTrainer with the {name} you want")

    setter = (lambda self, value: setattr(self.grpo_step, name, value)) if writable else refuse
    return property(lambda self: getattr(self.grpo_step, name), setter,
                    doc=f"The step's ``{name}`` (:class:`~grpo_tutorial.step.GRPOStep`).")


class GRPOTrainer:
    """GRPO for a Hugging Face causal LM, with verifiable reward functions.

    Args:
        model: the policy (a transformers causal LM), trained in place. With
            ``config.use_peft`` it gets LoRA adapters (``peft.get_peft_model``,
            in place) and :attr:`model` is the ``PeftModel``; a ``PeftModel``
            is trained as it is (:func:`~grpo_tutorial.lora.adapter_policies`).
        tokenizer: its tokenizer (needs an EOS token).
        reward_fns: one reward function or a list, TRL signature
            ``fn(completions, *, answer, **kwargs) -> list[float | None]``.
        config: a :class:`GRPOConfig` (default: ``GRPOConfig()``).
        ref_model: the reference policy for the KL penalty. Only used when
            ``config.beta > 0``; if None, a frozen deep copy of ``model`` is made
            (with ``use_peft``: none, the base with the adapters off is the reference).
        accuracy_fn: what the ``accuracy`` metric counts as correct: a function
            with the reward signature returning 1.0 (correct) or 0.0 per
            completion. Default: the answer ``extract_answer`` finds equals the
            row's ``answer`` (``answers_match``). Pass ``countdown_reward`` for
            Countdown, whose answer is an expression, not a number.
        sampler: what writes each step's completions: a plain function
            ``(prompts, seed) -> Rollout`` or a :class:`~grpo_tutorial.sampling.Sampler`
            (default: the policy itself, or ``GRPOConfig.sampler``'s; see :mod:`grpo_tutorial.sampling`).
        tools: plain Python functions the policy may call between turns
            (TRL's ``tools=``; :mod:`grpo_tutorial.tools`): a chat model calls them
            through its chat template, a model without one writes ``<<expression=``
            to the one tool (the calculator, :func:`~grpo_tutorial.tools.calculator.calculator`).
            The tool's tokens are masked out of the loss.
        step: a built step to run instead of GRPO's own (a
            :class:`~grpo_tutorial.step.GRPOStep` or a subclass: PPO's
            :class:`~grpo_tutorial.ppo.step.PPOStep`, the Monte Carlo values'
            :class:`~grpo_tutorial.ppo.vine.MonteCarloStep`, a gallery bug's), built on the
            same ``model``, ``tokenizer`` and ``config``; its ``ref_model``,
            ``accuracy_fn``, ``sampler`` and ``tools`` are its own, so they are not
            passed here too. What it holds beyond the policy (``extra_state``: a value
            model and its optimizer) goes into every checkpoint.

    Attributes:
        grpo_step: the step (:class:`~grpo_tutorial.step.GRPOStep`): the policies,
            the reward functions, the optimizer; ``model``, ``ref_model``,
            ``optimizer``, ``scheduler``, ``reward_fns``, ``tokenizer``,
            ``config`` and ``accuracy_fn`` are its.
        step: completed training steps (``state.step``).
        state: where the run stands (:class:`~grpo_tutorial.run.state.RunState`):
            the step, the data position, the dataset's fingerprint, the skipped
            updates and the warnings given; its checkpoint form is part of every
            checkpoint.
        history: one dict per completed step (see :func:`~grpo_tutorial.metrics.step_row`).
        row_listeners: functions called with each history row as :meth:`train`
            appends it (besides ``history.jsonl``); with ``report_to="tensorboard"``,
            :meth:`train` adds a TensorBoard writer here while it runs.
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
        sampler: Sampler | Callable[[list, int], Any] | None = None,
        tools: Sequence[Callable] | None = None,
        step: GRPOStep | None = None,
    ) -> None:
        given = GRPOConfig() if config is None else config
        if step is not None:
            self.grpo_step = _checked_step(step, model, tokenizer, given, ref_model=ref_model, accuracy_fn=accuracy_fn,
                                           sampler=sampler, tools=tools)
        else:
            policies = adapter_policies(model, given, ref_model) if isinstance(given, GRPOConfig) else None  # LoRA
            self.grpo_step = GRPOStep(model if policies is None else policies.policy, tokenizer, reward_fns, config,
                                      ref_model, accuracy_fn=accuracy_fn, sampler=sampler, policies=policies,
                                      tools=tools)
        check_reporting(self.config.report_to, self.config.output_dir)  # no output_dir or no TensorBoard: now
        self.state = RunState()
        self.history: list[dict] = []
        self.row_listeners: list[Callable[[dict], None]] = []
        #: The completions kept from every step (``completions_to_keep`` of them, :mod:`~grpo_tutorial.run.completions`)
        #: and those printed, as written to ``completions.jsonl``: what chapter 18's doctor reads beside the history.
        self.completions: list[dict] = []
        self._writers: tuple[HistoryWriter, CompletionsWriter] | None = None  # while train() appends
        self._last_kept: tuple[list[dict], list[dict], int] = ([], [], 0)  # train_step's, for train() to write

    # the step's objects, by the names a user of the trainer knows
    model = property(lambda self: self.grpo_step.model, doc="The policy, trained in place.")
    ref_model = property(lambda self: self.grpo_step.policies.reference_model,
                         doc="The reference (None: beta = 0, or LoRA, whose reference is the base).")
    tokenizer = _step_attribute("tokenizer", writable=False)
    config = _step_attribute("config", writable=False)
    reward_fns = _step_attribute("reward_fns")
    accuracy_fn = _step_attribute("accuracy_fn")
    optimizer = _step_attribute("optimizer")
    scheduler = _step_attribute("scheduler")
    reuse_on_policy_logprobs = _step_attribute("reuse_on_policy_logprobs")

    @property
    def step(self) -> int:
        """Completed training steps."""
        return self.state.step

    @property
    def skipped_updates(self) -> int:
        """Optimizer updates skipped for a non-finite loss or gradient, since the start."""
        return self.state.skipped_updates

    def train_step(self, batch: Sequence[dict], more_rows: Callable[[], list[dict]] | None = None) -> dict:
        """One GRPO step on ``batch`` (rows with ``prompt`` and ``answer``); returns its history row.

        The step is :class:`~grpo_tutorial.step.GRPOStep`'s. ``more_rows`` (used
        by ``dynamic_sampling``) returns the next ``prompts_per_step`` rows of the
        data stream; :meth:`train` passes it. The row (its fields:
        :func:`~grpo_tutorial.metrics.step_row`) is also appended to
        :attr:`history`; it describes the groups the step trains on. The step's kept
        completions join :attr:`completions`, and the doctor's live warnings (chapter
        18) read the run so far.
        """
        row = self.grpo_step(batch, self.state, self.history, more_rows)
        self.history.append(row)
        self._last_kept = self._keep_completions()
        self._check_live()
        return row

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, output_dir: str | os.PathLike | None = None) -> Path:
        """Write ``output_dir/checkpoint/`` atomically and return its path.

        With ``use_peft`` it holds the adapters (and their optimizer state), not
        the base, and the base's fingerprint. The history is not stored in the checkpoint: it lives in
        ``output_dir/history.jsonl`` (rewritten here, unless :meth:`train` is
        appending to it right now: then it is synced).
        """
        meta = {
            **self.state.to_meta(),
            "data_seed": self.config.seed,
            "entropy_control": self.grpo_step.entropy_control.to_meta(),  # adaptive entropy control's state
            "config": self.config.to_dict(),
            **checkpoint_meta(self.model),  # LoRA: the base's fingerprint
        }
        return save_training(  # LoRA: the adapters, not the base (lora.AdapterWeights)
            self._run_dir(output_dir, "save_checkpoint"), checkpoint_weights(self.model), self.optimizer,
            self.scheduler, self.ref_model,
            meta=meta, history=self.history, appending=self._writers or (), in_place=self.config.checkpoint_in_place,
            extra=self.grpo_step.extra_state(),  # what the step holds beyond the policy (PPO: its value model)
        )

    def load_checkpoint(self, output_dir: str | os.PathLike | None = None) -> bool:
        """Restore everything from the last checkpoint; False if there is none.

        The history is read back from ``history.jsonl`` and cut to the
        checkpoint's step (rows written after the checkpoint are redone).
        """
        root = self._run_dir(output_dir, "load_checkpoint")
        if find_checkpoint(root) is not None:  # adapters for a whole model, or on another base: refused first
            check_checkpoint_fits(read_meta(find_checkpoint(root)), self.model)
        meta = load_training(
            root, checkpoint_weights(self.model), self.optimizer, self.scheduler, self.ref_model,
            config=self.config.to_dict(), defaults=GRPOConfig().to_dict(), load_extra=self.grpo_step.load_extra_state,
        )
        if meta is None:
            return False
        self.state = RunState.from_meta(meta)
        self.grpo_step.sampler.reset()  # a sampler copy restarts from the loaded policy (sampling/copies.py)
        self.grpo_step.entropy_control = EntropyControl.from_config(self.config, meta.get("entropy_control"))
        self.history = history_until(root, meta)
        self.completions = [r for r in read_completions(root / COMPLETIONS_FILE) if r["step"] <= self.state.step]
        return True

    def _run_dir(self, output_dir: str | os.PathLike | None, what: str) -> Path:
        """``output_dir``, or the config's; refused if neither is set."""
        if output_dir is None and self.config.output_dir is None:
            raise ValueError(f"{what} needs a directory: set GRPOConfig.output_dir or pass output_dir=...")
        return Path(output_dir if output_dir is not None else self.config.output_dir)

    # ------------------------------------------------------------------ the loop
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
            progress: show a tqdm bar with the reward, the batch accuracy and the
                KL (each only when the step computed it).

        Ctrl-C: the current step finishes, a checkpoint is saved (if output_dir
        is set), and ``KeyboardInterrupt`` is raised. The trainer is then
        consistent, so calling ``train`` again continues. A second Ctrl-C
        aborts the step at once; resume from the last checkpoint then.
        """
        with run_lock(self.config.output_dir):  # one run per output directory (run/lock.py)
            return self._train(dataset, steps, resume=resume, progress=progress)

    def _train(self, dataset: Sequence[dict], steps: int, *, resume: bool, progress: bool) -> list[dict]:
        dataset = self._begin(dataset, steps, resume=resume)
        cfg = self.config
        out = Path(cfg.output_dir) if cfg.output_dir is not None else None
        if out is not None:
            clear_crash(out)  # a new attempt: an older one's error no longer describes the run
        with HistoryWriter(out, self.history) as history, \
                CompletionsWriter(out, self.step, enabled=cfg.log_completions or cfg.completions_to_keep > 0) \
                as completions, \
                report_rows(cfg.report_to, out, self.row_listeners, first_step=self.step + 1):  # run/tensorboard.py
            self._writers = (history, completions)
            bar = progress_bar(total=steps, desc="GRPO", initial=min(self.step, steps), unit="step",
                               dynamic_ncols=True) if progress else None
            saved_at = self.step  # nothing new to save unless a step runs
            try:
                with StopAfterStep() as stop:
                    while self.step < steps:
                        self._last_kept = ([], [], 0)  # a wrapped train_step that keeps nothing writes nothing
                        row = self._next_step(dataset)
                        history.append(row)
                        for listener in self.row_listeners:  # e.g. a TensorBoard writer
                            listener(row)
                        if bar is not None:  # every step's numbers: on a GPU a step takes seconds to minutes
                            bar.update(1)
                            bar.set_postfix(postfix(row, PROGRESS_FIELDS))
                        kept, shown, total = self._last_kept
                        completions.append(kept)
                        if shown:
                            completions.show_only(shown, total=total, bar=bar)
                        if out is not None and cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                            self.save_checkpoint(out)
                            saved_at = self.step
                        if stop.requested:
                            saved = f"checkpoint saved to {self.save_checkpoint(out)}" if out is not None else (
                                "no output_dir, nothing saved")
                            raise KeyboardInterrupt(f"training interrupted after step {self.step}; {saved}")
                if out is not None and cfg.checkpoint_every and saved_at != self.step:
                    self.save_checkpoint(out)
            except Exception as err:
                if out is not None:  # kept for the doctor (chapter 18): the history cannot say why it stopped
                    write_crash(out, self.step + 1, err)
                raise
            finally:
                self._writers = None
                if bar is not None:
                    bar.close()
        return self.history

    def _begin(self, dataset: Sequence[dict], steps: int, *, resume: bool) -> list[dict]:
        """Check the arguments, load the checkpoint for ``resume``, and tie the run to this dataset."""
        dataset = as_rows(dataset)
        validate_for_model(dataset, self.model, self.tokenizer, self.config.max_new_tokens)
        if not is_int(steps) or steps < 1:
            raise ValueError(f"steps must be a positive int, got {steps!r}")
        out, fingerprint = self.config.output_dir, dataset_fingerprint(dataset)
        resume_or_start(out, fingerprint, resume=resume, fresh=self.step == 0, load=self.load_checkpoint)
        self.state.use_dataset(fingerprint, f"the checkpoint in {out!r}" if out is not None else (
            "this trainer's earlier train() calls"))
        return dataset

    def _next_step(self, dataset: list[dict]) -> dict:
        """One step on the next rows of the data stream; the data position moves only after a good step."""
        cfg = self.config
        stream = DataStream(dataset, cfg.prompts_per_step, cfg.seed, self.state.epoch, self.state.index)
        if cfg.dynamic_sampling:
            row = self.train_step(stream.draw(), more_rows=stream.draw)
        else:  # more_rows only when used, so a wrapped train_step(batch) keeps working
            row = self.train_step(stream.draw())
        self.state.epoch, self.state.index = stream.epoch, stream.index
        return row

    def _check_live(self) -> None:
        """Chapter 18's doctor on the run so far (:func:`~grpo_tutorial.doctor.live_warnings`): each fault or
        warning it finds is a :class:`GRPOWarning`, once per run, naming the finding and its chapter."""
        for kind, message in live_warnings(self.history, self.completions, self.config.to_dict()):
            self.state.warn(kind, message)

    def _keep_completions(self) -> tuple[list[dict], list[dict], int]:
        """This step's kept completions (``completions_to_keep``) and, every ``log_every`` steps with
        ``log_completions``, its printed sample, both added to :attr:`completions`; returned with the step's number
        of completions for :meth:`train` to write to ``completions.jsonl`` and print."""
        cfg = self.config
        prompts, completions, rewards, per_fn, advantages = self.grpo_step.last_batch
        values = (self.step, prompts, completions, rewards.tolist(), {k: v.tolist() for k, v in per_fn.items()},
                  advantages.tolist())
        common = {"seed": cfg.seed, "details": self.grpo_step.last_details, "group_size": cfg.group_size,
                  "readings": answer_readings}
        rows = {}
        if cfg.completions_to_keep:
            rows = {r["index"]: r for r in sample_completions(*values, count=cfg.completions_to_keep, stream="kept",
                                                              **common)}
        shown = []
        if cfg.log_completions and self.step % cfg.log_every == 0:
            shown = sample_completions(*values, count=cfg.num_completions_to_print, **common)
            rows.update({r["index"]: r for r in shown})
        kept = [rows[i] for i in sorted(rows)]
        self.completions.extend(kept)
        return kept, shown, len(completions)

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, dataset: Sequence[dict], *, batch_size: int | None = None, num_samples: int = 3) -> dict:
        """:func:`~grpo_tutorial.evaluation.evaluate_policy` with this trainer's model, rewards and config.

        The prompt, chat template, token budget and batch size are the ones the
        trainer samples with. Returns ``accuracy`` and ``se``, ``reward_mean``,
        ``completion_len_mean``, ``frac_truncated``, ``n``, ``seconds``,
        ``correct`` and ``completions`` (one per row), ``records`` and
        ``samples`` (the first ``num_samples`` prompt/completion/answer dicts).
        With merged adapters it generates from the sampler's merged copy
        (:class:`~grpo_tutorial.sampling.fast.FastSampler`), which is the policy as it is now.
        """
        model = self.grpo_step.sampler.evaluation_model  # a fast sampler's merged copy: no second one is made
        return evaluate_policy(
            model, self.tokenizer, dataset, self.config, reward_fns=self.reward_fns,
            accuracy_fn=self.accuracy_fn, batch_size=batch_size, num_samples=num_samples,
        )
