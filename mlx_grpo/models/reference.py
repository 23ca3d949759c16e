"""The reference policy of the KL term: whether a run has one, which model it is, its log-probs.

The one owner of that decision: a reference exists when grpo.beta > 0. Under LoRA it is the
policy itself with its adapters switched off (no second copy in memory); otherwise a frozen
copy of the base, loaded from the same local folder as the policy.
"""

import mlx.core as mx

from mlx_grpo.algorithm.prefix import batch_logprobs
from mlx_grpo.models.load import adapters_disabled, load_base


def has_reference(beta: float) -> bool:
    """Whether the loss has a KL term, and so needs the reference's log-probs."""
    return beta > 0


def load_reference(model_cfg, base_path: str, *, beta: float, lora: bool):
    """The frozen copy of the base, or None: no reference, or the policy without adapters."""
    if not has_reference(beta) or lora:
        return None
    ref_model = load_base(model_cfg, base_path)[0]
    ref_model.freeze()
    return ref_model


def reference_logprobs(policy, ref_model, batch, temperature: float) -> mx.array:
    """One no-grad pass of the reference over a micro-batch: the frozen copy, or the policy
    without adapters when `ref_model` is None; shared-prefix micro-batches share the prefix here too."""
    if ref_model is not None:
        out = batch_logprobs(ref_model, batch, temperature)
    else:
        with adapters_disabled(policy):
            out = batch_logprobs(policy, batch, temperature)
    return mx.stop_gradient(out)
