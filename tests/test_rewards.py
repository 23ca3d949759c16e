import math
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from mlx_grpo.rewards import (
    REWARDS,
    RewardError,
    RewardSet,
    extract_predicted_number,
    extract_reference_number,
    gsm8k_correctness,
    resolve_reward,
    rouge_l,
    xml_format,
)

PERFECT = "<reasoning>\nthink\n</reasoning>\n<answer>\n72\n</answer>"


# --- gsm8k_correctness ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        ("<answer>72</answer>", "She sold 48 + 24 = 72.\n#### 72", 1.0),
        (PERFECT, "#### 72", 1.0),
        ("<answer>\nThe total is 72 dollars\n</answer>", "#### 72", 1.0),
        ("So the answer is 42.", "#### 42", 1.0),  # last-number fallback, trailing dot
        ("First 3, then 4", "#### 3", 0.0),  # fallback takes the last number
        ("<answer>7</answer> but maybe 72", "#### 72", 0.0),  # the tag beats the last number
        ("<answer>1</answer> no wait <answer>72</answer>", "#### 72", 1.0),  # last tag
        ("<answer>1,000</answer>", "#### 1000", 1.0),
        ("<answer>$1000.00</answer>", "#### 1,000", 1.0),
        ("<answer>18.0</answer>", "#### 18", 1.0),
        ("<answer>-5</answer>", "#### -5", 1.0),
        ("<answer>5</answer>", "#### -5", 0.0),
        ("10-5 = 5", "#### 5", 1.0),  # a hyphen after a digit is not a minus sign
        ("<answer>3.5</answer>", "#### 3.50", 1.0),
        ("<answer>0.25</answer>", "#### 0.3", 0.0),
        ("<answer>71</answer>", "#### 72", 0.0),
        ("I have no idea", "#### 72", 0.0),
        ("<answer>none</answer> 72", "#### 72", 0.0),  # a tag without a number is not skipped
        ("<answer>72</answer>", "72", 1.0),  # reference without ####
        ("<answer>72</answer>", "$72.", 1.0),
        ("<answer>72</answer>", "about seventy", 0.0),
        ("<answer>72</answer>", None, 0.0),
        ("", "#### 72", 0.0),
    ],
)
def test_gsm8k_correctness(completion, answer, expected):
    assert gsm8k_correctness(["p"], [completion], [answer]) == [expected]


@pytest.mark.parametrize(
    "answer, expected",
    [
        ("x\n#### 1,000", "1000"),
        ("#### $18.00", "18"),
        ("#### -3", "-3"),
        ("4.", "4"),
        ("####", None),
        (None, None),
    ],
)
def test_extract_reference_number(answer, expected):
    assert extract_reference_number(answer) == expected


@pytest.mark.parametrize(
    "completion, expected",
    [("<answer>$1,000.00</answer>", "1000"), ("it is 2.5 and -7", "-7"), ("no digits", None)],
)
def test_extract_predicted_number(completion, expected):
    assert extract_predicted_number(completion) == expected


# --- xml_format ----------------------------------------------------------------------------------

# score = clamp(0.5*strict + 0.25*soft + 0.25*tags - penalty, 0, 1); tags = good tags / 4;
# penalty = min(len(stripped text after </answer>), 100) / 1000.
@pytest.mark.parametrize(
    "completion, expected",
    [
        (PERFECT, 1.0),  # 0.5 + 0.25 + 0.25*4/4
        (PERFECT + "\n", 1.0),  # one final newline is still strict; trailing whitespace costs nothing
        ("72", 0.0),
        ("<reasoning>think</reasoning> <answer>72</answer>", 0.5),  # soft only: 0.25 + 0.25*4/4
        ("<reasoning>\nthink\n</reasoning>\n", 0.125),  # 0.25 * 2/4
        ("<answer>72</answer>", 0.125),  # 0.25 * 2/4, no soft match without reasoning
        ("<answer>1</answer><answer>2</answer>", 0.0),  # each answer tag twice: no credit
        ("</reasoning> then <reasoning>", 0.0625),  # only <reasoning> counts, </reasoning> is early
        (PERFECT + "\nextra", 0.495),  # 0.25 + 0.25 - 5/1000
        (PERFECT + "x" * 300, 0.4),  # 0.25 + 0.25 - 100/1000 (penalty capped)
        ("</answer>" + "x" * 200, 0.0),  # 0.25*1/4 - 0.1 clamps to 0
    ],
)
def test_xml_format(completion, expected):
    assert xml_format(["p"], [completion], [None]) == [pytest.approx(expected)]


def test_xml_format_perfect_is_exactly_one():
    assert xml_format(["p"], [PERFECT], [None])[0] == 1.0


# --- rouge_l -------------------------------------------------------------------------------------

REF = "the cat sat on the mat"


@pytest.mark.parametrize(
    "completion, answer, expected",
    [
        (REF, REF, 1.0),
        ("  " + REF + "\n", REF, 1.0),  # the completion is stripped
        ("dogs run fast", REF, 0.0),
        # LCS("the cat on mat", ref) = 4 tokens: P = 4/4, R = 4/6, F = 2PR/(P+R) = (4/3)/(5/3) = 0.8
        ("the cat on mat", REF, 0.8),
        ("the cats sat", "the cat sat", 1.0),  # use_stemmer: cats -> cat
        ("anything", None, 0.0),
        ("anything", "  ", 0.0),
        ("", REF, 0.0),
    ],
)
def test_rouge_l(completion, answer, expected):
    assert rouge_l(["p"], [completion], [answer]) == [pytest.approx(expected)]


# --- resolve_reward ------------------------------------------------------------------------------


def write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


BREVITY = """
def brevity(prompts, completions, answers, **kwargs):
    return [1.0 / (1 + len(c)) for c in completions]
"""


def test_resolve_builtins():
    for name, fn in REWARDS.items():
        assert resolve_reward(name) is fn


def test_resolve_file_absolute_and_base_dir(tmp_path):
    path = write(tmp_path / "cfg" / "my_rewards.py", BREVITY)
    assert resolve_reward(f"{path}:brevity")(["p"], ["abc"], [None]) == [0.25]
    assert resolve_reward("my_rewards.py:brevity", base_dir=path.parent)(["p"], ["a"], [None]) == [0.5]


def test_resolve_file_relative_to_cwd(tmp_path, monkeypatch):
    write(tmp_path / "sub" / "r.py", BREVITY)
    monkeypatch.chdir(tmp_path)
    assert resolve_reward("sub/r.py:brevity", base_dir=tmp_path / "elsewhere")(["p"], [""], [None]) == [1.0]


def test_resolve_file_prefers_base_dir_over_cwd(tmp_path, monkeypatch):
    write(tmp_path / "cwd" / "r.py", "def f(p, c, a, **k):\n    return ['cwd']\n")
    write(tmp_path / "cfg" / "r.py", "def f(p, c, a, **k):\n    return ['cfg']\n")
    monkeypatch.chdir(tmp_path / "cwd")
    assert resolve_reward("r.py:f", base_dir=tmp_path / "cfg")([], [], []) == ["cfg"]
    assert resolve_reward("r.py:f")([], [], []) == ["cwd"]


def test_resolve_module_function(tmp_path, monkeypatch):
    write(tmp_path / "rewmod_q7.py", BREVITY)
    write(tmp_path / "rewpkg_q7" / "__init__.py", "")
    write(tmp_path / "rewpkg_q7" / "scoring.py", BREVITY)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resolve_reward("rewmod_q7:brevity")(["p"], ["abc"], [None]) == [0.25]
    assert resolve_reward("rewpkg_q7.scoring:brevity")(["p"], ["abc"], [None]) == [0.25]


@pytest.mark.parametrize(
    "name, fragments",
    [
        ("xml_fromat", ["unknown reward 'xml_fromat'", "did you mean 'xml_format'", *REWARDS]),
        ("gsm8k", ["did you mean 'gsm8k_correctness'"]),  # prefix, too short for difflib
        ("nothing_like_it", ["unknown reward 'nothing_like_it'; known built-ins", "file.py:function"]),
        ("my_rewards.py:nope", ["'my_rewards.py:nope'", "no function 'nope'"]),
        ("my_rewards.py:CONSTANT", ["not callable"]),
        ("missing.py:f", ["file not found", "missing.py"]),
        ("no_such_module_q7:f", ["cannot import module 'no_such_module_q7'"]),
        ("broken.py:f", ["loading", "broken.py", "ZeroDivisionError"]),
    ],
)
def test_resolve_errors(tmp_path, name, fragments):
    write(tmp_path / "my_rewards.py", BREVITY + "CONSTANT = 3\n")
    write(tmp_path / "broken.py", "x = 1 / 0\n")
    with pytest.raises(RewardError) as info:
        resolve_reward(name, base_dir=tmp_path)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message
    assert isinstance(info.value, ValueError)


# --- RewardSet -----------------------------------------------------------------------------------

HELPERS = """
import math

def brevity(prompts, completions, answers, **kwargs):
    return [1.0 / (1 + len(c)) for c in completions]

def boom_at_boom(prompts, completions, answers, **kwargs):
    return [1 / 0 if "boom" in c else 1.0 for c in completions]

def batch_only_failure(prompts, completions, answers, **kwargs):
    if len(completions) > 1:
        raise RuntimeError("batch too big")
    return [0.0]

def too_few(prompts, completions, answers, **kwargs):
    return [0.0]

def ints(prompts, completions, answers, **kwargs):
    return [1, 0, 1]

def scaled(prompts, completions, answers, scale=1.0, **kwargs):
    return [scale] * len(completions)

def with_bad_last(prompts, completions, answers, **kwargs):
    return [0.0] * (len(completions) - 1) + [BAD]
"""


@pytest.fixture
def helpers(tmp_path):
    def make(bad="0.0"):
        write(tmp_path / "helpers.py", HELPERS + f"\nBAD = {bad}\n")
        write(tmp_path / "other" / "helpers.py", HELPERS + "\nBAD = 0.0\n")
        return tmp_path

    return make


PROMPTS = ["p0", "p1", "p2"]
COMPLETIONS = [PERFECT, "<reasoning>x</reasoning><answer>71</answer>", "boom 72"]
ANSWERS = ["#### 72", "#### 72", "#### 72"]


def test_weighted_total_and_per_name():
    rewards = RewardSet([("gsm8k_correctness", 1.0), ("xml_format", 0.5)])
    total, per_name = rewards(PROMPTS, COMPLETIONS, ANSWERS)
    assert per_name == {"gsm8k_correctness": [1.0, 0.0, 1.0], "xml_format": [1.0, 0.5, 0.0]}
    assert total == [1.5, 0.25, 1.0]  # 1*1 + 0.5*1, 1*0 + 0.5*0.5, 1*1 + 0.5*0


def test_zero_weight_is_reported_but_not_summed():
    rewards = RewardSet([("gsm8k_correctness", 1.0), ("xml_format", 0)])
    total, per_name = rewards(PROMPTS, COMPLETIONS, ANSWERS)
    assert per_name["xml_format"] == [1.0, 0.5, 0.0]
    assert total == [1.0, 0.0, 1.0]


def test_from_config_dicts_objects_and_short_names(helpers):
    base = helpers()
    items = [{"name": "helpers.py:brevity", "weight": 2.0}, SimpleNamespace(name="xml_format", weight=1.0)]
    rewards = RewardSet.from_config(items, base_dir=base)
    total, per_name = rewards(["p"], ["abc"], [None])
    assert list(per_name) == ["brevity", "xml_format"]
    assert total == [0.5]  # 2 * 1/(1+3) + 1 * 0


def test_colliding_short_names_use_full_names(helpers):
    base = helpers()
    rewards = RewardSet([("helpers.py:brevity", 1.0), ("other/helpers.py:brevity", 1.0)], base_dir=base)
    _, per_name = rewards(["p"], ["a"], [None])
    assert per_name == {"helpers.py:brevity": [0.5], "other/helpers.py:brevity": [0.5]}


def test_kwargs_are_passed_through(helpers):
    rewards = RewardSet([("helpers.py:scaled", 2.0)], base_dir=helpers())
    total, per_name = rewards(["p"], ["c"], [None], scale=3.0)
    assert per_name == {"scaled": [3.0]} and total == [6.0]


def test_int_scores_are_accepted(helpers):
    _, per_name = RewardSet([("helpers.py:ints", 1.0)], base_dir=helpers())(PROMPTS, COMPLETIONS, ANSWERS)
    assert per_name["ints"] == [1.0, 0.0, 1.0] and all(type(s) is float for s in per_name["ints"])


@pytest.mark.parametrize(
    "items, fragment",
    [
        ([("xml_format", 1.0), ("xml_format", 0.5)], "more than once: xml_format"),
        ([], "no rewards configured"),
        ([("xml_format", "1")], "weight must be a finite number"),
        ([("xml_format", math.nan)], "weight must be a finite number"),
        ([("xml_formt", 1.0)], "did you mean 'xml_format'"),
    ],
)
def test_reward_set_config_errors(items, fragment):
    with pytest.raises(RewardError, match=fragment):
        RewardSet(items)


@pytest.mark.parametrize("item", [{"name": "xml_format"}, SimpleNamespace(weight=1.0)])
def test_from_config_missing_field(item):
    with pytest.raises(RewardError, match="has no '(name|weight)'"):
        RewardSet.from_config([item])


def test_raising_reward_names_reward_and_sample(helpers):
    rewards = RewardSet([("helpers.py:boom_at_boom", 1.0)], base_dir=helpers())
    with pytest.raises(RewardError) as info:
        rewards(PROMPTS, COMPLETIONS, ANSWERS)
    message = str(info.value)
    assert "'boom_at_boom'" in message and "ZeroDivisionError" in message
    assert "sample 2" in message and "'boom 72'" in message and "\n" not in message
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_raising_reward_completion_is_cut_to_80_chars(helpers):
    rewards = RewardSet([("helpers.py:boom_at_boom", 1.0)], base_dir=helpers())
    long = "boom" + "y" * 200
    with pytest.raises(RewardError) as info:
        rewards(["p"], [long], [None])
    assert repr(long[:80]) in str(info.value) and long[:81] not in str(info.value)


def test_batch_only_failure_says_index_unknown(helpers):
    rewards = RewardSet([("helpers.py:batch_only_failure", 1.0)], base_dir=helpers())
    with pytest.raises(RewardError, match="batch too big.*index unknown"):
        rewards(PROMPTS, COMPLETIONS, ANSWERS)


def test_wrong_number_of_scores(helpers):
    with pytest.raises(RewardError, match="'too_few' returned 1 scores for 3 completions"):
        RewardSet([("helpers.py:too_few", 1.0)], base_dir=helpers())(PROMPTS, COMPLETIONS, ANSWERS)


@pytest.mark.parametrize("bad", ["math.nan", "math.inf", "-math.inf", "'1.0'", "True"])  # None: not applicable
def test_bad_score_names_reward_and_index(helpers, bad):
    rewards = RewardSet([("helpers.py:with_bad_last", 1.0)], base_dir=helpers(bad))
    with pytest.raises(RewardError, match=r"'with_bad_last' gave .* for sample 2"):
        rewards(PROMPTS, COMPLETIONS, ANSWERS)


def test_mismatched_batch_lengths():
    with pytest.raises(RewardError, match="2 prompts, 3 completions and 3 answers"):
        RewardSet([("xml_format", 1.0)])(PROMPTS[:2], COMPLETIONS, ANSWERS)


def test_import_does_not_pull_in_mlx():
    code = "import mlx_grpo.rewards, sys; assert 'mlx' not in sys.modules and 'mlx.core' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[1])
