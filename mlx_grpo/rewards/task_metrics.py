"""The task metrics `mlx-grpo eval` reports beside the rewards, as functions of completions and
reference answers (see commands/evaluate.py's docstring for what each reads): the readings of
a GSM8K-style answer (`accuracy_metrics`), maj@K and pass@K (`number_metrics`), and ROUGE.
Pure Python, like every reward."""

from collections import Counter
from decimal import Decimal

import numpy as np

from mlx_grpo.rewards.gsm8k import (
    ROUGE_TYPES, extract_predicted_number, extract_reference_number, extract_strict_number, lm_eval_exact_match,
    lm_eval_flexible_extract, lm_eval_strict_match, rouge_scorer,
)


def is_gsm8k_style(answers) -> bool:
    """Every reference is a number: a `#### N` text or a number in the data."""
    return bool(answers) and all(
        (not isinstance(a, str) or "####" in a) and extract_reference_number(a) is not None for a in answers
    )


def number_metrics(samples: list[list[str]], answers: list[str]) -> dict:
    """maj@K and pass@K over K sampled completions per prompt (see the module docstring)."""
    k = len(samples[0])
    majority, any_right = [], []
    for texts, answer in zip(samples, answers):
        ref = extract_reference_number(answer)
        preds = [p for p in map(extract_predicted_number, texts) if p is not None]
        right = [Decimal(p) == Decimal(ref) for p in preds]
        # Votes count numbers by value ("7" and "7.0" agree); ties go to the first one sampled.
        votes = Counter(Decimal(p).normalize() for p in preds)
        majority.append(bool(votes) and votes.most_common(1)[0][0] == Decimal(ref))
        any_right.append(any(right))
    return {f"maj@{k}": float(np.mean(majority)), f"pass@{k}": float(np.mean(any_right))}


def _same_number(read):
    """A judge (completion, answer) -> bool: read's number equals the reference's numerically."""
    def judge(completion, answer):
        p, r = read(completion), extract_reference_number(answer)
        return p is not None and Decimal(p) == Decimal(r)
    return judge


def _lm_eval(extract):
    """A judge as lm-eval's GSM8K task judges: its filter, then exact_match against the whole answer."""
    return lambda completion, answer: lm_eval_exact_match(extract(completion), str(answer))


READINGS = {"accuracy": _same_number(extract_predicted_number), "accuracy_format": _same_number(extract_strict_number),
            "accuracy_strict": _lm_eval(lm_eval_strict_match), "accuracy_lenient": _lm_eval(lm_eval_flexible_extract)}


def accuracy_metrics(completions: list[str], answers: list[str]) -> dict:
    """The share of completions that are right, under each reading of READINGS."""
    return {key: float(np.mean([judge(c, a) for c, a in zip(completions, answers)])) for key, judge in READINGS.items()}


def rouge_metrics(completions: list[str], answers: list[str]) -> dict:
    scores = [rouge_scorer().score(a or "", c.strip()) for c, a in zip(completions, answers)]
    return {k: float(np.mean([s[k].fmeasure for s in scores])) for k in ROUGE_TYPES}
