"""Live warnings: each fires on a synthetic stream that shows its failure, none on healthy runs."""

import math
import random

import pytest

from mlx_grpo.config import ConfigError, load_config
from mlx_grpo.run.watch import RunWatcher, trend_t


def healthy(steps=300, seed=0, plateau=False):
    """A run that learns (or, with plateau, sits at its ceiling): noisy but fine metrics."""
    rng = random.Random(seed)
    for t in range(1, steps + 1):
        level = 0.7 if plateau else 0.2 + 0.6 * (1 - math.exp(-t / 80))
        yield {
            "step": t,
            "reward": level + rng.gauss(0, 0.08),
            "frac_reward_zero_std": rng.uniform(0.1, 0.6),
            "grad_norm": math.exp(rng.gauss(0, 0.4)),
            "completions/clipped_ratio": rng.uniform(0.0, 0.2),
            "kl": 0.3 * t / steps + rng.uniform(0, 0.02),
        }


def feed(watcher, rows):
    """{step: warnings printed at that step} for the steps that printed any."""
    out = {}
    for m in rows:
        printed = watcher.update(m)
        if printed:
            out[m["step"]] = printed
    return out


def with_(rows, **changes):
    """The stream with some metrics replaced: changes[key] is a function of (step, value)."""
    for m in rows:
        m = dict(m)
        for key, fn in changes.items():
            m[key.replace("__", "/")] = fn(m["step"], m.get(key.replace("__", "/")))
        yield m


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("plateau", [False, True])
def test_healthy_runs_raise_no_warning(seed, plateau):
    w = RunWatcher()
    assert feed(w, healthy(seed=seed, plateau=plateau)) == {}
    assert w.counts == {} and w.summary() is None


def test_no_signal_needs_ten_steps_in_a_row():
    w = RunWatcher()
    printed = feed(w, with_(healthy(40), frac_reward_zero_std=lambda t, v: 0.95 if 11 <= t <= 30 else v))
    assert list(printed) == [20]  # the 10th step above 0.9 in a row; steps 21..30 only counted
    assert "the task is too easy or too hard: no signal" in printed[20][0]
    assert w.counts == {"no_signal": 11}
    # nine high steps, then one low, over and over: never ten in a row
    w = RunWatcher()
    assert feed(w, with_(healthy(100), frac_reward_zero_std=lambda t, v: 1.0 if t % 10 else 0.0)) == {}


def test_grad_norm_spike_against_running_median():
    w = RunWatcher()
    printed = feed(w, with_(healthy(60), grad_norm=lambda t, v: 30.0 if t == 40 else 1.0 + 0.01 * (t % 3)))
    assert list(printed) == [40] and "10x its running median 1.01" in printed[40][0]
    w = RunWatcher()  # judged from step 6: five steps give the median its footing
    assert list(feed(w, with_(healthy(10), grad_norm=lambda t, v: 50.0 if t in (5, 6) else 1.0))) == [6]
    w = RunWatcher()  # 9x the median is below the default factor of 10
    assert feed(w, with_(healthy(60), grad_norm=lambda t, v: 9.0 if t == 40 else 1.0)) == {}


def test_clipped_completions_say_raise_max_new_tokens():
    w = RunWatcher()
    printed = feed(w, with_(healthy(20), completions__clipped_ratio=lambda t, v: 0.6 if t >= 5 else 0.5))
    assert list(printed) == [5] and "raise generation.max_new_tokens" in printed[5][0]
    assert w.counts == {"length_cap": 16}


def test_kl_above_bound():
    w = RunWatcher()
    printed = feed(w, with_(healthy(20), kl=lambda t, v: 0.1 * t))  # 1.1 at step 11
    assert list(printed) == [11] and "kl 1.1 > 1.0" in printed[11][0]


def test_reward_falling_for_fifty_steps():
    rng = random.Random(1)
    w = RunWatcher()
    printed = feed(w, with_(healthy(120), reward=lambda t, v: 0.8 - 0.005 * t + rng.gauss(0, 0.05)))
    assert list(printed) == [50]  # judged only once 50 steps are in
    assert "reward has been falling for 50 steps" in printed[50][0]
    # mean 1.8, sxx = 10, slope = (-2*1.2 - 1*0.2 + 0 + 1*-0.8 + 2*-1.3) / 10 = -0.6; residuals
    # (0, -0.4, 0.7, -0.2, -0.1), squares sum 0.7; stderr = sqrt(0.7 / 3 / 10) = 0.1528, t = -3.93
    assert trend_t([3.0, 2.0, 2.5, 1.0, 0.5]) == pytest.approx(-0.6 / math.sqrt(0.7 / 3 / 10), rel=1e-9)
    assert trend_t([1.0, 1.0, 1.0]) == 0.0 and trend_t([3.0, 2.0, 1.0]) == -math.inf


def test_printed_once_then_counted_in_the_summary():
    w = RunWatcher()
    printed = feed(w, with_(healthy(10), kl=lambda t, v: 2.0 if t in (3, 4, 7) else v))
    assert list(printed) == [3] and printed[3][0].endswith("(printed once; later occurrences are counted)")
    assert w.summary() == "mlx-grpo: warnings this run: kl_high x3 (first at step 3)"


def bad_stream():
    """Every failure at once: each check has something to fire on."""
    return with_(healthy(80), frac_reward_zero_std=lambda t, v: 1.0,
                 grad_norm=lambda t, v: 100.0 if t == 30 else 1.0,
                 completions__clipped_ratio=lambda t, v: 0.9, kl=lambda t, v: 5.0,
                 reward=lambda t, v: 1.0 - 0.01 * t)


def test_thresholds_come_from_the_logging_section():
    assert set(RunWatcher.from_config(load_config(None).logging).counts) == set()
    w = RunWatcher.from_config(load_config(None).logging)
    feed(w, bad_stream())
    assert set(w.counts) == {"no_signal", "grad_norm_spike", "length_cap", "kl_high", "reward_falling"}
    off = ["logging.warn_zero_std_steps=0", "logging.warn_grad_norm_factor=0", "logging.warn_clipped_ratio=0",
           "logging.warn_kl=0", "logging.warn_reward_falling_steps=0"]
    w = RunWatcher.from_config(load_config(None, off).logging)
    assert feed(w, bad_stream()) == {}
    looser = ["logging.warn_kl=6.0", "logging.warn_clipped_ratio=0.95", "logging.warn_grad_norm_factor=200",
              "logging.warn_zero_std_steps=100", "logging.warn_reward_falling_steps=90"]
    w = RunWatcher.from_config(load_config(None, looser).logging)
    assert feed(w, bad_stream()) == {}
    w = RunWatcher.from_config(load_config(None, ["logging.warn_zero_std_frac=0.99"]).logging)
    feed(w, with_(healthy(20), frac_reward_zero_std=lambda t, v: 0.95))
    assert "no_signal" not in w.counts


@pytest.mark.parametrize("item, expected", [
    ("logging.warn_reward_falling_steps=2", "0 (off) or >= 3"),
    ("logging.warn_grad_norm_factor=0.5", "0 (off) or > 1"),
    ("logging.warn_clipped_ratio=1.5", "in [0, 1)"),
    ("logging.warn_kl=-1", ">= 0"),
    ("logging.warn_zero_std_frac=1.0", "in [0, 1)"),
])
def test_bad_thresholds_are_refused(item, expected):
    with pytest.raises(ConfigError, match="logging.warn_") as info:
        load_config(None, [item])
    assert expected in str(info.value)
