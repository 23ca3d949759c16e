"""The task rewards: GSM8K-style numbers, the R1 answer format and ROUGE-L.

Each is a plain function ``fn(prompts, completions, answers, **kwargs) -> list[float]``; a wrong
or unparseable answer scores 0.0. `extract_reference_number` and `extract_predicted_number` are
shared with evaluation, which scores the same numbers as accuracy, maj@K and pass@K, with
`extract_strict_number` for its format-aware accuracy, the `lm_eval_*` functions for
lm-evaluation-harness's GSM8K strict-match and flexible-extract, and `rouge_scorer` with its
ROUGE metrics. Pure Python: no MLX here.
"""

from __future__ import annotations

import functools
import math
import numbers
import re
from decimal import Decimal

# A minus only counts when it is not glued to a preceding word or number ("10-5" is 10 and 5).
_NUMBER = re.compile(r"(?:(?<![\w.])-)?\$?\d+(?:,\d{3})*(?:\.\d+)?")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)")


def _normalize_number(text: str) -> str | None:
    """'$1,000.00' -> '1000'; None unless what is left is a plain decimal number."""
    s = text.replace(",", "").replace("$", "").strip().rstrip(".")
    s = re.sub(r"\.0+$", "", s)
    return s if _PLAIN_NUMBER.fullmatch(s) else None


def _last_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    return _normalize_number(found[-1]) if found else None


def extract_reference_number(answer) -> str | None:
    """The number after the last '#### ' (GSM8K style), else the whole answer read as a number;
    an answer that is a number (a JSON number in the data) is that number (72 -> '72', 0.5 -> '0.5')."""
    if isinstance(answer, numbers.Real) and not isinstance(answer, bool):
        return _normalize_number(format(Decimal(str(answer)), "f")) if math.isfinite(answer) else None
    if not isinstance(answer, str):
        return None
    return _normalize_number(answer.rsplit("####", 1)[-1] if "####" in answer else answer)


def extract_predicted_number(completion: str) -> str | None:
    """The last number inside the last <answer>...</answer>, else the last number anywhere."""
    tagged = _ANSWER_TAG.findall(completion)
    return _last_number(tagged[-1] if tagged else completion)


# The format-aware reading's fallback: a number after '####', with an optional "$".
_HASHES = re.compile(r"####\s*\$?(-?[0-9.,]+)")


def extract_strict_number(completion: str) -> str | None:
    """The answer in the expected format, or None: the content of the last <answer>...</answer>
    when it is one number and nothing else ('$1,000.' counts, 'x = 5' does not), else, without
    an answer tag, the number right after the last '####' (GSM8K's own format)."""
    tagged = _ANSWER_TAG.findall(completion)
    if tagged:
        return _normalize_number(tagged[-1])
    found = _HASHES.findall(completion)
    return _normalize_number(found[-1]) if found else None


# lm-evaluation-harness's GSM8K task (lm_eval/tasks/gsm8k/gsm8k.yaml, main of August 2026): its
# RegexFilter (lm_eval/filters/extraction.py) with the task's patterns, then take_first of one
# response, then exact_match (lm_eval/api/metrics.py) with the task's regexes_to_ignore, applied
# in order to prediction and reference alike, and ignore_case: a string comparison, not a numeric one.
LM_EVAL_INVALID = "[invalid]"  # RegexFilter's fallback when nothing matches
_LM_EVAL_STRICT = re.compile(r"#### (\-?[0-9\.\,]+)")  # strict-match, group_select 0: the first
_LM_EVAL_FLEXIBLE = re.compile(r"(-?[$0-9.,]{2,})|(-?[0-9]+)")  # flexible-extract, group_select -1: the last
_LM_EVAL_IGNORE = (",", r"\$", r"(?s).*#### ", r"\.$")


def _regex_filter(pattern: re.Pattern, group_select: int, text: str) -> str:
    """RegexFilter: match number group_select of findall, of a tuple its first non-empty group,
    stripped; the fallback when nothing matches."""
    found = pattern.findall(text)
    if not found:
        return LM_EVAL_INVALID
    match = found[group_select]
    if isinstance(match, tuple):
        match = next((g for g in match if g), LM_EVAL_INVALID)
    return match.strip()


def lm_eval_strict_match(completion: str) -> str:
    """lm-eval's GSM8K strict-match: N of the first '#### N' (N of '-0-9.,'), else '[invalid]'."""
    return _regex_filter(_LM_EVAL_STRICT, 0, completion)


def lm_eval_flexible_extract(completion: str) -> str:
    """lm-eval's GSM8K flexible-extract: the LAST run of 2+ of '$0-9.,' or integer, else '[invalid]'."""
    return _regex_filter(_LM_EVAL_FLEXIBLE, -1, completion)


def lm_eval_exact_match(prediction: str, reference: str) -> bool:
    """lm-eval's exact_match for GSM8K: both strings stripped of ',', '$', everything up to the
    last '#### ' and a final '.', then compared lower-cased ('72.0' is not '72')."""
    for pattern in _LM_EVAL_IGNORE:
        prediction, reference = re.sub(pattern, "", prediction), re.sub(pattern, "", reference)
    return prediction.lower() == reference.lower()


def _same_number(a: str | None, b: str | None) -> bool:
    return a is not None and b is not None and Decimal(a) == Decimal(b)


def gsm8k_correctness(prompts, completions, answers, **kwargs) -> list[float]:
    """1.0 where the predicted number equals the reference number numerically, else 0.0."""
    return [
        float(_same_number(extract_predicted_number(c), extract_reference_number(a)))
        for c, a in zip(completions, answers)
    ]


_STRICT = re.compile(r"<reasoning>\n.*?\n</reasoning>\n<answer>\n.*?\n</answer>\n?", re.DOTALL)
_SOFT = re.compile(r"<reasoning>.*?</reasoning>\s*<answer>.*?</answer>", re.DOTALL)
_TAGS = ("<reasoning>", "</reasoning>", "<answer>", "</answer>")


def _tag_credit(text: str) -> float:
    """Fraction of the four tags that occur exactly once and after every earlier tag that occurs."""
    credit, last_pos = 0, -1
    for tag in _TAGS:
        pos = text.find(tag)
        if pos == -1:
            continue
        if text.count(tag) == 1 and pos > last_pos:
            credit += 1
        last_pos = max(last_pos, pos)
    return credit / len(_TAGS)


def _xml_score(text: str) -> float:
    strict = 1.0 if _STRICT.fullmatch(text) else 0.0
    soft = 1.0 if _SOFT.search(text) else 0.0
    trailing = text.rsplit("</answer>", 1)[1].strip() if "</answer>" in text else ""
    penalty = min(len(trailing), 100) / 1000
    return min(1.0, max(0.0, 0.5 * strict + 0.25 * soft + 0.25 * _tag_credit(text) - penalty))


def xml_format(prompts, completions, answers, **kwargs) -> list[float]:
    """How well each completion follows '<reasoning>\\n...\\n</reasoning>\\n<answer>\\n...\\n</answer>'.

    score = clamp(0.5*strict + 0.25*soft + 0.25*tags - penalty, 0, 1), where
      strict  = 1 if the whole completion is exactly that format (one optional final newline),
      soft    = 1 if '<reasoning>.*?</reasoning>\\s*<answer>.*?</answer>' occurs anywhere (DOTALL),
      tags    = (number of the four tags occurring exactly once, after every earlier tag) / 4,
      penalty = min(len(text after the last '</answer>', stripped), 100) / 1000, at most 0.1.
    A perfect completion scores exactly 1.0; one without any tag 0.0.
    """
    return [_xml_score(c) for c in completions]


ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


@functools.cache
def rouge_scorer():
    """rouge-score's stemmed scorer of ROUGE_TYPES, made once: the reward and evaluation share it."""
    from rouge_score import rouge_scorer as scorer  # lazy: it pulls in nltk, slow to import

    return scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)


def rouge_l(prompts, completions, answers, **kwargs) -> list[float]:
    """ROUGE-L F-measure of each stripped completion against its reference; no reference -> 0.0."""
    return [
        rouge_scorer().score(a, c.strip())["rougeL"].fmeasure if isinstance(a, str) and a.strip() else 0.0
        for c, a in zip(completions, answers)
    ]
