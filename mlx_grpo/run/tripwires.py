"""Tripwires: signs that the reward is being earned without the task being learned.

Like the live warnings of watch.py, `Tripwires` is fed each step's metrics row and returns
what to print now: each tripwire in full the first time it fires, later firings only counted
and reported by `summary()` at the end of the run. Pure Python on plain numbers, so each is
tested on hand-made metric sequences. The keys are `[logging]`'s `warn_*`; 0 turns one off.

- truncated_rewarded: `completions/clipped_rewarded_ratio` (the share of a step's completions
  cut at max_new_tokens, so never reaching EOS, whose total reward is > 0) above
  `warn_truncated_rewarded`: the reward pays for text that never ends.
- format_without_correctness: over the last 2W steps (W = `warn_format_window`), a format
  reward's mean rose by at least FORMAT_RISE from the first W to the last W, while the
  correctness reward's rose by less than FLAT: the policy learns the form, not the answers.
- train_up_eval_down: at an evaluation ([eval] every > 0), the held-out score (`eval/accuracy`,
  else `eval/reward`) fell from the previous evaluation by more than `warn_eval_drop_se` standard
  errors of the difference, sqrt(se0^2 + se1^2) from the eval's own `_stderr` metrics, while the
  mean training reward of the steps since that evaluation is above that of as many steps before it.
- unmoved_tensors: `params/unmoved_tensors` > 0, from update/movement.py's check after
  `warn_unmoved_after` optimizer updates: some trainable tensor has not changed in a single bit.
"""

from dataclasses import dataclass, field

from mlx_grpo.run.watch import PrintedOnce

# Reward names the format tripwire reads: the built-in format and correctness rewards.
FORMAT_REWARDS = ("xml_format",)
CORRECTNESS_REWARDS = ("gsm8k_correctness",)
# Both on the 0-1 scale of those rewards, whose per-completion std is at most 0.5: with 64
# completions a step (the smoke profile's) a 20-step window mean has a standard error of at
# most 0.5 / sqrt(1280) = 0.014, the gap between two windows at most 0.02. FORMAT_RISE is 5 of
# those; FLAT, one: a correctness gain any smaller is indistinguishable from none.
FORMAT_RISE = 0.1
FLAT = 0.02


def window_rise(values: list[float], w: int) -> float | None:
    """mean(last w) - mean(the w before them), or None with fewer than 2w values."""
    if w < 1 or len(values) < 2 * w:
        return None
    return sum(values[-w:]) / w - sum(values[-2 * w:-w]) / w


def format_without_correctness(formats: dict[str, list[float]], correct: list[float], w: int) -> str | None:
    """The first format reward that rose by FORMAT_RISE over the windows while correctness
    rose by less than FLAT, with both rises; else None."""
    c = window_rise(correct, w)
    if c is None or c >= FLAT:
        return None
    for name, values in formats.items():
        f = window_rise(values, w)
        if f is not None and f >= FORMAT_RISE:
            return (f"{name} rose by {f:.3f} over the last {w} steps against the {w} before, while correctness "
                    f"rose by {c:+.3f}: the policy learns the format, not the answers")
    return None


# k = 2 standard errors of the difference: a policy whose held-out score has not really changed
# drops by more than that about 2% of the time (one-sided, normal approximation), and the
# training reward must also have risen. On the 200 held-out arithmetic questions at accuracy
# 0.57 the SE is sqrt(0.57 * 0.43 / 200) = 0.035 per evaluation, 0.049 for the difference, so
# k = 2 means a drop of 0.099; the fixed 0.02 used before was 0.4 SE, crossed by noise alone
# about a third of the time. Both evaluations score the same prompts, so the difference's real
# noise is below this unpaired sqrt(se0^2 + se1^2): the tripwire errs toward staying quiet.
EVAL_DROP_SE = 2.0


def train_up_eval_down(rewards: dict[int, float], evals: list[tuple[int, float, float]], k: float,
                       key: str = "eval") -> str | None:
    """rewards: step -> training reward; evals: the (step, score, standard error) of each
    evaluation so far. Judged at the last evaluation (step s1) against the one before (s0): the
    score fell by more than k * sqrt(se0^2 + se1^2) and the mean reward of steps (s0, s1] is
    above that of steps (s0 - n, s0], n = s1 - s0."""
    if len(evals) < 2 or k <= 0:
        return None
    (s0, e0, se0), (s1, e1, se1) = evals[-2], evals[-1]
    n, se = s1 - s0, (se0 ** 2 + se1 ** 2) ** 0.5
    after = [r for s, r in rewards.items() if s0 < s <= s1]
    before = [r for s, r in rewards.items() if s0 - n < s <= s0]
    if not before or not after or e0 - e1 <= k * se:
        return None
    up = sum(after) / len(after) - sum(before) / len(before)
    if up <= 0:
        return None
    return (f"{key} fell from {e0:.3f} at step {s0} to {e1:.3f} at step {s1}, {(e0 - e1) / se:.1f} standard errors "
            f"({se:.3f}) of the difference, while the training reward rose by {up:.3f}: the policy fits the "
            "training prompts, not the task")


@dataclass
class Tripwires(PrintedOnce):
    """Checks each step's metrics row; thresholds as in the `[logging]` keys (0 = off)."""

    label = "tripwire"

    truncated_rewarded: float = 0.1
    format_window: int = 20
    eval_drop_se: float = EVAL_DROP_SE
    counts: dict[str, int] = field(default_factory=dict)
    first_step: dict[str, int] = field(default_factory=dict)

    def __post_init__(self):
        self._rewards, self._evals = {}, []
        self._formats, self._correct = {}, []

    @classmethod
    def from_config(cls, logging_cfg) -> "Tripwires":
        c = logging_cfg
        return cls(c.warn_truncated_rewarded, c.warn_format_window, c.warn_eval_drop_se)

    def _checks(self, m: dict):
        share = m.get("completions/clipped_rewarded_ratio")
        if self.truncated_rewarded and share is not None and share > self.truncated_rewarded:
            yield "truncated_rewarded", (
                f"{share:.2f} of the completions never reached EOS yet scored a positive reward: the reward pays "
                "for text that never ends; set grpo.mask_truncated_completions or grpo.overlong_penalty")
        yield "format_without_correctness", self._format(m)
        yield "train_up_eval_down", self._eval(m)
        unmoved = m.get("params/unmoved_tensors")
        if unmoved:
            yield "unmoved_tensors", (
                f"{unmoved} of {m.get('params/trainable_tensors', '?')} trainable tensors unchanged (bit for bit) "
                f"after {m.get('params/checked_after', '?')} updates ({m.get('params/unmoved_names', '')}): "
                "they are not being trained")

    def _format(self, m: dict):
        if not self.format_window:
            return None
        correct = [m[k] for k in (f"rewards/{n}/mean" for n in CORRECTNESS_REWARDS) if k in m]
        formats = {n: m[f"rewards/{n}/mean"] for n in FORMAT_REWARDS if f"rewards/{n}/mean" in m}
        if not correct or not formats:
            return None
        self._correct.append(correct[0])
        for n, v in formats.items():
            self._formats.setdefault(n, []).append(v)
        return format_without_correctness(self._formats, self._correct, self.format_window)

    def _eval(self, m: dict):
        if "reward" not in m or "step" not in m:
            return None
        self._rewards[m["step"]] = m["reward"]
        key = "eval/accuracy" if "eval/accuracy" in m else "eval/reward"
        if key not in m or f"{key}_stderr" not in m:
            return None
        self._evals.append((m["step"], m[key], m[f"{key}_stderr"]))
        return train_up_eval_down(self._rewards, self._evals, self.eval_drop_se, key)
