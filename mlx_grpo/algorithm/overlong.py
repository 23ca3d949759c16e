"""DAPO's soft overlong punishment (Yu et al. 2025): long completions lose reward linearly.

With cap L_max = generation.max_new_tokens, buffer B = grpo.overlong_buffer and amount
a = grpo.overlong_penalty, a completion of l tokens gets

    penalty(l) = 0                              if l <= L_max - B
               = -(l - (L_max - B)) / B * a     if L_max - B < l <= L_max

so a completion cut at the cap loses the full amount. The penalty is added to the reward
before advantages are computed. Pure Python.
"""


def overlong_penalty(lengths, max_len: int, buffer: int, amount: float) -> list[float]:
    """The penalty (<= 0) of each completion length; see the module docstring."""
    if not 1 <= buffer <= max_len:
        raise ValueError(f"overlong buffer must be in [1, max_len = {max_len}], got {buffer}")
    start = max_len - buffer
    out = []
    for i, n in enumerate(lengths):
        if n > max_len:
            raise ValueError(f"completion {i} has {n} tokens, more than the cap of {max_len}")
        out.append(-(n - start) / buffer * amount if n > start else 0.0)
    return out
