"""Where a run stands: the step, the data position, the dataset, the warnings given.

:class:`RunState` is what a checkpoint stores besides the tensors, in the form
it is stored in (``trainer_state.json``, :meth:`RunState.to_meta`). The data
position ``(epoch, index)`` moves only after a step has finished, so a step
that fails (or is interrupted) leaves it where the step started.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Sequence

from ..warn import WarnOnce

__all__ = ["RunState", "check_same_dataset", "dataset_fingerprint"]


def dataset_fingerprint(dataset: Sequence[dict]) -> str:
    """A digest of the prompts and answers, to catch resuming on other data."""
    digest = hashlib.sha256()
    for row in dataset:
        digest.update(json.dumps([row.get("prompt"), row.get("answer")], default=str).encode("utf-8"))
    return digest.hexdigest()[:16]


def check_same_dataset(fingerprint: str, trained_on: str | None, where: str) -> None:
    """Refuse a dataset whose fingerprint is not ``trained_on``, the one ``where`` trained on (None: not known)."""
    if trained_on not in (None, fingerprint):
        raise ValueError(
            f"the dataset differs from the one {where} trained on (fingerprint {fingerprint} vs "
            f"{trained_on}); train on the same dataset, or start a new trainer (and output_dir) for a new one"
        )


@dataclass
class RunState:
    """The counters of a run.

    Attributes:
        step: completed training steps.
        epoch, index: the data position: the epoch, and the index into its
            shuffled order (:func:`grpo_tutorial.seeding.next_batch`).
        dataset_fingerprint: :func:`dataset_fingerprint` of the training data
            (None until the first ``train``).
        skipped_updates: optimizer updates skipped for a non-finite loss or
            gradient, since the start.
        warn: the run's :class:`~grpo_tutorial.warn.WarnOnce` (which
            warnings were given already).
    """

    step: int = 0
    epoch: int = 0
    index: int = 0
    dataset_fingerprint: str | None = None
    skipped_updates: int = 0
    warn: WarnOnce = field(default_factory=WarnOnce)

    def use_dataset(self, fingerprint: str, where: str) -> None:
        """Tie the run to the dataset with this fingerprint; refuse another than the one ``where`` trained on."""
        check_same_dataset(fingerprint, self.dataset_fingerprint, where)
        self.dataset_fingerprint = fingerprint

    def to_meta(self) -> dict:
        """The checkpoint form (JSON-ready)."""
        return {
            "step": self.step,
            "epoch": self.epoch,
            "index": self.index,
            "dataset_fingerprint": self.dataset_fingerprint,
            "skipped_updates": self.skipped_updates,
            "warned": sorted(self.warn.issued),
        }

    @classmethod
    def from_meta(cls, meta: dict) -> "RunState":
        """Read back :meth:`to_meta` (other keys of ``meta`` are ignored)."""
        return cls(
            step=int(meta["step"]),
            epoch=int(meta["epoch"]),
            index=int(meta["index"]),
            dataset_fingerprint=meta["dataset_fingerprint"],
            skipped_updates=int(meta["skipped_updates"]),
            warn=WarnOnce(meta["warned"]),
        )
