"""Has every trainable tensor moved? A check made once, after `logging.warn_unmoved_after`
optimizer updates, against the tensors as this process started training.

A tensor that has not changed in a single bit after N updates is not being trained: a LoRA B
that stays at its zero init because every advantage was 0, a layer cut off from the loss, or
updates too small to survive bfloat16 rounding. Each tensor is kept as a hash of its bytes
(blake2b, 16 bytes), not a copy, so the check costs no model-sized memory; one tensor at a time
goes to the host, twice a run.
"""

import hashlib

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

SHOWN = 3  # unmoved tensors named in the metrics row


def fingerprints(model) -> dict[str, bytes]:
    """name -> a hash of the bytes of each trainable tensor."""
    return {
        name: hashlib.blake2b(np.array(v.view(mx.uint8)).tobytes(), digest_size=16).digest()
        for name, v in tree_flatten(model.trainable_parameters())
    }


def unmoved(before: dict[str, bytes], after: dict[str, bytes]) -> list[str]:
    """The names whose bytes are the same in both, in `after`'s order."""
    return [name for name, h in after.items() if before.get(name) == h]


class MovementCheck:
    """Fingerprints the trainable tensors now; `__call__` returns {} until the optimizer has made
    `after` updates since, then once the check's metrics (0 = never).

    `state()` goes into each checkpoint and `saved` brings it back on resume, so a resumed run
    checks after the same update, against the tensors as the run started, as an uninterrupted
    run does (and not again when it already has)."""

    def __init__(self, model, optimizer, after: int, saved: dict | None = None):
        self.after, self.done = after, not after
        if saved and after:
            self.start, self.done = saved["start"], saved["done"]
            self.before = {name: bytes.fromhex(h) for name, h in saved["before"].items()}
            return
        self.start = int(optimizer.step.item()) if after else 0
        self.before = fingerprints(model) if after else {}

    def state(self) -> dict | None:
        """What a checkpoint keeps of the check (None when there is none): JSON, 32 hex digits
        per tensor until it is made."""
        if not self.after:
            return None
        before = {} if self.done else {name: h.hex() for name, h in self.before.items()}
        return {"start": self.start, "done": self.done, "before": before}

    def __call__(self, model, optimizer) -> dict:
        if self.done or int(optimizer.step.item()) - self.start < self.after:
            return {}
        self.done = True
        names = unmoved(self.before, fingerprints(model))
        metrics = {"params/unmoved_tensors": len(names), "params/trainable_tensors": len(self.before),
                   "params/checked_after": self.after}
        if names:  # a string: plots and summaries read numbers only
            metrics["params/unmoved_names"] = ", ".join(names[:SHOWN]) + (", ..." if len(names) > SHOWN else "")
        return metrics
