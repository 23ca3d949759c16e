"""Tripwires: each fires on a hand-made metric sequence that shows its failure, none on a
healthy run; the unmoved-tensor check on a real optimizer; one short run that trips two."""

import math

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import pytest

from mlx_grpo.config import ConfigError, load_config
from mlx_grpo.commands.train import train
from mlx_grpo.rewards import RewardSet
from mlx_grpo.run.log import read_metrics
from mlx_grpo.run.tripwires import Tripwires, format_without_correctness, train_up_eval_down, window_rise
from mlx_grpo.update.movement import MovementCheck, fingerprints, unmoved


def test_window_rise_by_hand():
    assert window_rise([0.0, 0.0, 1.0, 1.0], 2) == 1.0  # (1 + 1) / 2 - (0 + 0) / 2
    assert window_rise([9.0, 0.0, 1.0, 2.0, 3.0], 2) == 2.0  # the last four only: 2.5 - 0.5
    assert window_rise([0.0, 1.0, 2.0], 2) is None  # fewer than 2w values


def test_format_rising_while_correctness_stays_flat():
    fmt, flat = [0.5] * 20 + [0.7] * 20, [0.4] * 20 + [0.41] * 20
    text = format_without_correctness({"xml_format": fmt}, flat, 20)
    # format: 0.7 - 0.5 = 0.2 >= 0.1; correctness: 0.41 - 0.4 = +0.01 < 0.02
    assert text.startswith("xml_format rose by 0.200 over the last 20 steps against the 20 before, "
                           "while correctness rose by +0.010")
    assert format_without_correctness({"xml_format": fmt}, [0.4] * 20 + [0.45] * 20, 20) is None  # +0.05
    assert format_without_correctness({"xml_format": [0.5] * 20 + [0.55] * 20}, flat, 20) is None  # +0.05
    assert format_without_correctness({"xml_format": fmt[1:]}, flat[1:], 20) is None  # 39 steps: too few


def _se(p, n=200):
    return math.sqrt(p * (1 - p) / n)


def test_training_reward_rising_while_eval_falls_past_its_noise():
    rewards = {s: 1.0 if s <= 5 else 1.2 for s in range(1, 11)}
    # steps 6-10 average 1.2 against steps 1-5's 1.0. Over 200 prompts, se(0.60) = sqrt(0.6 * 0.4 / 200)
    # = 0.034641 and se(0.55) = se(0.45) = sqrt(0.55 * 0.45 / 200) = 0.035178; the difference's SE is
    # sqrt(0.0012 + 0.0012375) = 0.049371, so k = 2 fires past a drop of 0.098742.
    assert _se(0.6) == pytest.approx(0.034641, abs=1e-6) and _se(0.55) == pytest.approx(0.035178, abs=1e-6)
    # 0.60 -> 0.55: a drop of 0.05, about 1.0 SE: noise, not a signal (the old fixed 0.02 fired here)
    assert train_up_eval_down(rewards, [(5, 0.60, _se(0.60)), (10, 0.55, _se(0.55))], k=2.0) is None
    # 0.60 -> 0.45: 0.15 / 0.049371 = 3.04 SE > 2
    text = train_up_eval_down(rewards, [(5, 0.60, _se(0.60)), (10, 0.45, _se(0.45))], k=2.0, key="eval/accuracy")
    assert text == ("eval/accuracy fell from 0.600 at step 5 to 0.450 at step 10, 3.0 standard errors (0.049) of "
                    "the difference, while the training reward rose by 0.200: the policy fits the training prompts, "
                    "not the task")
    # the same 0.05 drop over 2000 prompts: SE sqrt(0.00012 + 0.00012375) = 0.015612, 3.2 SE: fires
    assert train_up_eval_down(rewards, [(5, 0.60, _se(0.60, 2000)), (10, 0.55, _se(0.55, 2000))], k=2.0)
    drop = [(5, 0.6, _se(0.6)), (10, 0.4, _se(0.4))]
    assert train_up_eval_down({s: 1.0 for s in range(1, 11)}, drop, k=2.0) is None  # reward flat
    assert train_up_eval_down(rewards, drop[1:], k=2.0) is None  # one evaluation: nothing to compare
    assert train_up_eval_down(rewards, drop, k=0.0) is None  # off


def _row(step, **kw):
    m = {"step": step, "reward": 1.0, "rewards/gsm8k_correctness/mean": 0.5, "rewards/xml_format/mean": 0.8,
         "completions/clipped_rewarded_ratio": 0.0}
    m.update({k.replace("__", "/"): v for k, v in kw.items()})
    return m


def feed(t: Tripwires, rows) -> dict:
    return {m["step"]: out for m in rows if (out := t.update(m))}


def test_a_healthy_run_trips_nothing():
    # correctness and format rise together; a few truncated completions, none over 0.1 paid
    rows = [_row(s, rewards__gsm8k_correctness__mean=0.3 + 0.01 * s, rewards__xml_format__mean=0.5 + 0.01 * s,
                 completions__clipped_rewarded_ratio=0.05 * (s % 2), reward=1.0 + 0.01 * s) for s in range(1, 61)]
    for s in (10, 20, 30):
        rows[s - 1]["eval/accuracy"], rows[s - 1]["eval/accuracy_stderr"] = 0.5 + 0.01 * s, 0.035
    t = Tripwires()
    assert feed(t, rows) == {} and t.summary() is None


def test_the_eval_tripwire_reads_the_logged_standard_errors():
    # eval at steps 10 and 20, reward up from 1.0 to 1.2: 0.60 -> 0.50 with stderr 0.035 each is a drop
    # of 0.10 against 2 * sqrt(2) * 0.035 = 0.099: fires; with stderr 0.036 (threshold 0.102) it does not
    for stderr, fires in ((0.035, True), (0.036, False)):
        rows = [_row(s, reward=1.0 if s <= 10 else 1.2) for s in range(1, 21)]
        for s, acc in ((10, 0.6), (20, 0.5)):
            rows[s - 1].update({"eval/accuracy": acc, "eval/accuracy_stderr": stderr})
        printed = feed(Tripwires(format_window=0), rows)
        assert (20 in printed) == fires, stderr
    # without a logged stderr (an eval from before it was logged) nothing is judged
    rows = [_row(s, reward=1.0 if s <= 10 else 1.2) for s in range(1, 21)]
    rows[9]["eval/accuracy"], rows[19]["eval/accuracy"] = 0.9, 0.1
    assert feed(Tripwires(format_window=0), rows) == {}


def test_each_tripwire_prints_once_and_is_counted():
    rows = [_row(s) for s in range(1, 45)]
    for s in (3, 4, 9):
        rows[s - 1]["completions/clipped_rewarded_ratio"] = 0.25
    for s in range(21, 45):
        rows[s - 1]["rewards/xml_format/mean"] = 0.95  # +0.15 against a flat correctness
    rows[9]["params/unmoved_tensors"], rows[9]["params/trainable_tensors"] = 2, 50
    rows[9]["params/checked_after"], rows[9]["params/unmoved_names"] = 10, "a.lora_b, b.lora_b"
    t = Tripwires()
    printed = feed(t, rows)
    assert sorted(printed) == [3, 10, 40]
    assert printed[3] == ["mlx-grpo: tripwire at step 3: 0.25 of the completions never reached EOS yet scored a "
                          "positive reward: the reward pays for text that never ends; set "
                          "grpo.mask_truncated_completions or grpo.overlong_penalty "
                          "(printed once; later occurrences are counted)"]
    assert "2 of 50 trainable tensors unchanged (bit for bit) after 10 updates (a.lora_b, b.lora_b)" in printed[10][0]
    # two windows of 20 need 40 steps: at 40, steps 21-40 (0.95) against 1-20 (0.8), +0.15; it keeps
    # firing to step 44, where 25-44 (0.95) against 5-24 (16 x 0.8 + 4 x 0.95 = 0.83) is +0.12
    assert "xml_format rose by 0.150" in printed[40][0]
    assert t.counts == {"truncated_rewarded": 3, "unmoved_tensors": 1, "format_without_correctness": 5}
    assert t.summary() == ("mlx-grpo: tripwires this run: truncated_rewarded x3 (first at step 3), unmoved_tensors x1 "
                           "(first at step 10), format_without_correctness x5 (first at step 40)")


def test_thresholds_come_from_the_logging_section():
    c = load_config(None, ["logging.warn_truncated_rewarded=0.3", "logging.warn_format_window=5",
                           "logging.warn_eval_drop_se=3", "logging.warn_unmoved_after=7"]).logging
    t = Tripwires.from_config(c)
    assert (t.truncated_rewarded, t.format_window, t.eval_drop_se) == (0.3, 5, 3.0) and c.warn_unmoved_after == 7
    assert Tripwires.from_config(load_config(None).logging).eval_drop_se == 2.0
    off = Tripwires.from_config(load_config(None, ["logging.warn_truncated_rewarded=0", "logging.warn_format_window=0",
                                                   "logging.warn_eval_drop_se=0"]).logging)
    rows = [_row(s, completions__clipped_rewarded_ratio=0.9, rewards__xml_format__mean=0.1 if s < 21 else 0.9)
            for s in range(1, 41)]
    assert feed(off, rows) == {}


@pytest.mark.parametrize("item, expected", [
    ("logging.warn_truncated_rewarded=1.0", "in [0, 1)"), ("logging.warn_format_window=-1", ">= 0"),
    ("logging.warn_eval_drop_se=-0.1", ">= 0"), ("logging.warn_unmoved_after=-2", ">= 0"),
])
def test_bad_thresholds_are_refused(item, expected):
    with pytest.raises(ConfigError, match="logging.warn_") as info:
        load_config(None, [item])
    assert expected in str(info.value)


def test_the_retired_eval_drop_key_names_its_replacement(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(None, ["logging.warn_eval_drop=0.02"])
    message = str(info.value)
    assert "\n" not in message and message.startswith("--set logging.warn_eval_drop=0.02: logging.warn_eval_drop is "
                                                      "retired; use logging.warn_eval_drop_se")
    # a run's own config.toml from before still loads (eval --model, chat, export of an older run)
    saved = tmp_path / "config.toml"
    saved.write_text("[logging]\nwarn_eval_drop = 0.02\n")
    assert load_config(saved, saved=True).logging.warn_eval_drop_se == 2.0
    with pytest.raises(ConfigError, match="is retired"):
        load_config(saved)


def test_movement_check_names_a_tensor_the_optimizer_never_moved():
    mx.random.seed(0)
    model = nn.Linear(2, 2)
    opt = optim.AdamW(learning_rate=0.1, weight_decay=0.0)
    check = MovementCheck(model, opt, after=2)
    before = fingerprints(model)
    assert sorted(before) == ["bias", "weight"] and all(len(h) == 16 for h in before.values())
    grads = {"weight": mx.ones((2, 2)), "bias": mx.zeros((2,))}  # AdamW: m = v = 0 -> a zero step
    opt.update(model, grads)
    assert check(model, opt) == {}  # one update of two
    opt.update(model, grads)
    assert check(model, opt) == {"params/unmoved_tensors": 1, "params/trainable_tensors": 2,
                                 "params/checked_after": 2, "params/unmoved_names": "bias"}
    assert unmoved(before, fingerprints(model)) == ["bias"]
    assert check(model, opt) == {}  # checked once
    assert MovementCheck(model, opt, after=0)(model, opt) == {}  # off


def test_a_run_with_a_constant_reward_trips_two(tmp_path, capsys):
    """Reward 1.0 for everything: no advantage, so no tensor ever moves (AdamW's moments stay 0
    and weight decay is 0), and at 4 new tokens every completion is cut at the cap yet paid."""
    def always_one(prompts, completions, answers, **kw):
        return [1.0] * len(completions)

    cfg = load_config("configs/smoke_test.toml", [
        "training.max_steps=3", "training.prompts_per_step=2", "generation.max_new_tokens=4",
        "checkpoint.save_every=10", "logging.warn_unmoved_after=2", f'output_dir="{tmp_path / "run"}"',
    ])
    train(cfg, reward_set=RewardSet([(always_one, 1.0)], group_size=4))
    rows = read_metrics(cfg.output_dir)
    assert [r["completions/clipped_rewarded_ratio"] for r in rows] == [1.0, 1.0, 1.0]
    assert rows[1]["params/unmoved_tensors"] == rows[1]["params/trainable_tensors"] == 50
    out = " ".join(capsys.readouterr().out.split())  # the console wraps lines past 99 columns
    assert "mlx-grpo: tripwire at step 1: 1.00 of the completions never reached EOS" in out
    assert "mlx-grpo: tripwire at step 2: 50 of 50 trainable tensors unchanged (bit for bit) after 2 updates" in out
    assert ("mlx-grpo: tripwires this run: truncated_rewarded x3 (first at step 1), unmoved_tensors x1 "
            "(first at step 2)") in out
    # 3 + 1 tripwires, and watch.py's length_cap (clipped_ratio 1.0 > 0.5) on each of the 3 steps
    assert "mlx-grpo: done after step 3 of 3, " in out and ", 7 warnings" in out
