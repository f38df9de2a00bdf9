"""The stages of one GRPO step: their numbers and names, written once.

Chapter 0's loop, its diagram and every chapter header, chapter 7's table, the
book's introduction, the architecture page and the comments of
:mod:`grpo_tutorial.step` all number the stages this way; ``tests/test_stages.py``
reads each of them and compares it with :data:`STAGES`.

A step starts from a batch of B prompts (the data, before stage 1) and ends with
the history row (after stage 5):

1. **sample**: the policy writes G completions for each prompt, all B*G in one
   batched ``generate`` call;
2. **reward**: a verifiable reward function scores every completion;
3. **advantages**: each reward against its own group (a z-score);
4. **score**: the log-probabilities of the sampled tokens under the policy that
   sampled them and under the frozen reference (no gradient);
5. **update**: the clipped, KL-penalised loss with gradient, and an optimizer
   step; mu passes over the batch, one optimizer update per minibatch.

Five words for the batch and the pieces of stage 5, used the same way everywhere
(:data:`VOCABULARY`): chapter 4's table (label ``vocabulary-updates``) defines them
for the learner, and chapters 0, 7, 8, 9 and 11 link to it. A step makes mu passes
over its generation batch, each pass one update per minibatch, and an update may be
computed in micro-batches, which change memory and never the update.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["STAGES", "Stage", "VOCABULARY", "stage"]


class Stage(NamedTuple):
    """One stage: its number, its one-word name, what it does, and the modules that hold it."""

    number: int
    name: str
    does: str
    modules: tuple[str, ...]


#: The five stages of one step, in order.
STAGES: tuple[Stage, ...] = (
    Stage(1, "sample", "the policy writes G completions per prompt, B*G in one batched generate call",
          ("rollout", "tools")),
    Stage(2, "reward", "a verifiable reward scores every completion", ("rewards", "answers", "dynamic_sampling")),
    Stage(3, "advantages", "each reward against its own group: a z-score", ("advantages",)),
    Stage(4, "score", "log-probs of the sampled tokens: the sampling policy's and the reference's, no gradient",
          ("logprobs",)),
    Stage(5, "update", "the clipped, KL-penalised loss and an optimizer step, over minibatches, mu passes",
          ("kl", "objectives", "loss", "optim")),
)

#: The words for the pieces of stage 5 (and the batch they cut), one definition each.
VOCABULARY: dict[str, str] = {
    "generation batch": "the B*G completions one step samples (stage 1) and trains on",
    "pass": "one sweep of the update over the whole generation batch; mu (num_iterations) passes a step",
    "minibatch": "the completions of one optimizer update (minibatch_size; None = the whole batch)",
    "update": "one optimizer step: the gradient of one minibatch's loss, then AdamW",
    "micro-batch": "completions that go through the model together (micro_batch_size); their gradients "
    "add up to their minibatch's, so micro-batches change memory, never the update",
}


def stage(name_or_number: str | int) -> Stage:
    """The stage of that name or number.

    >>> stage("score").number, stage(5).name
    (4, 'update')
    """
    for s in STAGES:
        if name_or_number in (s.name, s.number):
            return s
    raise ValueError(
        f"no stage {name_or_number!r}; the stages are "
        + ", ".join(f"{s.number} {s.name}" for s in STAGES)
    )
