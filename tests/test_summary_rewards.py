"""The reference-free summary rewards, each on small texts against numbers worked out by hand."""

import pytest

from mlx_grpo.rewards import REWARDS, RewardSet, resolve_reward
from mlx_grpo.rewards.summary import (
    checked_words,
    coverage,
    faithfulness,
    keywords,
    length_band,
    no_copy,
    split_sentences,
    words,
)


def one(fn, post, summary):
    (score,) = fn([post], [summary], None)  # answers=None: reference-free
    return score


def n_words(n):
    return " ".join(["word"] * n)


def test_words_and_sentences():
    assert words("I don't [25M] like-it, 3.5!") == ["I", "dont", "25M", "like", "it", "3", "5"]
    assert split_sentences("Hi there. Is it? Yes!\n\nnew line  ") == ["Hi there.", "Is it?", "Yes!", "new line"]
    assert split_sentences("  ") == []


# --- length_band: band [15, 50] words -------------------------------------------------------------


@pytest.mark.parametrize("summary, expected", [
    ("", 0.0),  # 0 / 15
    (n_words(3), 0.2),  # 3 / 15
    ("don't stop, ok?", 3 / 15),  # dont, stop, ok
    (n_words(14), 14 / 15),
    (n_words(15), 1.0),
    (n_words(50), 1.0),
    (n_words(60), 0.8),  # 1 - (60 - 50) / 50
    (n_words(75), 0.5),  # 1 - 25 / 50
    (n_words(100), 0.0),
    (n_words(180), 0.0),  # clamped, never negative
])
def test_length_band(summary, expected):
    assert one(length_band, "any post", summary) == pytest.approx(expected)


# --- coverage -------------------------------------------------------------------------------------

# Content stems and counts: cat 3 (cat, cat, cats), dog 2 (dogs, dog), sat, ran, bark, fish, swim 1
# each ("the", "like", "a" are stopwords): 7 keywords with counts summing to 10.
PETS = "The cat sat. The cat ran. Cats like dogs. A dog barked. Fish swim."
GREEK = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda"  # 11 stems, 1 each


def test_keywords_rank_by_count_then_first_occurrence():
    assert keywords(PETS) == {"cat": 3, "sat": 1, "ran": 1, "dog": 2, "bark": 1, "fish": 1, "swim": 1}
    assert list(keywords(PETS, k=2)) == ["cat", "dog"]
    assert keywords("ox yak zebra yak zebra", k=2) == {"yak": 2, "zebra": 2}
    assert keywords("ox yak zebra", k=2) == {"ox": 1, "yak": 1}  # a tie keeps the earlier word
    assert len(keywords(GREEK)) == 10 and "lambda" not in keywords(GREEK)


@pytest.mark.parametrize("post, summary, expected", [
    (PETS, "A cat and a dog.", 0.5),  # (3 + 2) / 10
    (PETS, "Cats.", 0.3),  # 3 / 10, stemmed
    (PETS, "The dogs barked at fish", 0.4),  # (2 + 1 + 1) / 10
    (PETS, PETS, 1.0),
    (PETS, "Birds sing.", 0.0),
    (PETS, "", 0.0),
    (GREEK, "alpha", 0.1),  # 1 / 10
    (GREEK, "lambda", 0.0),  # the 11th word is not among the top 10
    ("the and of it", "the and of it", 0.0),  # no content words in the post
])
def test_coverage(post, summary, expected):
    assert one(coverage, post, summary) == pytest.approx(expected)


# --- faithfulness ---------------------------------------------------------------------------------

TRIP = "I met Anna in Paris when I was 22. We dated for three years."


@pytest.mark.parametrize("summary, checked", [
    ("I met Anna in Paris.", {"anna", "pari"}),  # names: capitalized, not opening the sentence
    ("Met Anna. Berlin was fun.", {"anna"}),  # "Met", "Berlin" open their sentences
    ("we dated wonderfully in 2019", {"wonder", "2019"}),  # rare (>= 7 letters), number
    ("We dated for years", set()),
    ("I saw Rome, Rome and I", {"rome"}),  # distinct stems; "I" is a stopword, not a name
])
def test_checked_words(summary, checked):
    assert checked_words(summary) == checked


@pytest.mark.parametrize("summary, expected", [
    ("I met Anna in Paris.", 1.0),
    ("I met Anna in Rome at 23.", 1 / 3),  # anna in the post; rome and 23 are not
    ("We dated 3 years.", 0.0),  # the post says "three", not "3"
    ("we dated wonderfully", 0.0),
    ("We were together for 22 happy years", 1.0),  # 22 occurs; nothing else is checked
    ("We dated for years", 1.0),  # nothing to check
    ("", 0.0),  # an empty summary is no summary
    ("...", 0.0),
])
def test_faithfulness(summary, expected):
    assert one(faithfulness, TRIP, summary) == pytest.approx(expected)


# --- no_copy: spans of >= 5 words shared with the post --------------------------------------------

FIGHT = "I think we should break up because she lies to me all the time"


@pytest.mark.parametrize("summary, expected", [
    ("we should break up because she lies", 0.0),  # three 5-word windows cover all 7 words
    ("We should BREAK up, because!", 0.0),  # case and punctuation do not hide a copy
    ("we should break up because of her lying", 0.375),  # 5 of 8 words copied: 1 - 5/8
    ("so she lies to me all the time ok", 1 - 7 / 9),  # "she lies to me all the time"
    ("we should break up soon", 1.0),  # 4 copied words in a row are not a span
    ("she lies so we should break up", 1.0),
    ("break up now", 1.0),  # shorter than a span
    ("", 0.0),
])
def test_no_copy(summary, expected):
    assert one(no_copy, FIGHT, summary) == pytest.approx(expected)


# --- registry -------------------------------------------------------------------------------------


def test_registered_and_reference_free():
    names = ["length_band", "coverage", "faithfulness", "no_copy"]
    for name in names:
        assert resolve_reward(name) is REWARDS[name]
    reward_set = RewardSet([(n, 0.5) for n in names])
    total, per_name = reward_set([PETS, PETS], ["A cat and a dog.", ""], [None, None])
    # "A cat and a dog.": 5 words -> length 1/3; coverage 0.5; nothing checked -> 1; no copy -> 1
    assert per_name == {"length_band": [pytest.approx(1 / 3), 0.0], "coverage": [0.5, 0.0],
                        "faithfulness": [1.0, 0.0], "no_copy": [1.0, 0.0]}
    assert total == [pytest.approx(0.5 * (1 / 3 + 0.5 + 1 + 1)), 0.0]
