"""Reference-free rewards for summaries: length, coverage, faithfulness and copying.

Each is a plain reward ``fn(prompts, completions, answers, **kwargs) -> list[float]`` in [0, 1]
that compares a completion (the summary) only with its prompt (the source text, i.e. the data's
``prompt_field`` value); ``answers`` is ignored and may be None, so they work on posts that have
no reference summary. Registered by name in ``mlx_grpo.rewards.REWARDS``.

Shared text handling, used by all four:
  words     = runs of ASCII letters and digits, after deleting apostrophes ("don't" -> "dont");
  content   = a word whose lowercase form is not in ``STOPWORDS``;
  stem      = nltk's Porter stemmer on the lowercase word (the stemmer ROUGE uses);
  sentences = pieces of the text split after . ! or ? followed by whitespace, and at newlines.
A completion without a single word scores 0.0 on every reward (nothing was summarized).
Pure Python on purpose, like rewards.py: no MLX here.
"""

from __future__ import annotations

import functools
import re
from collections import Counter

LENGTH_BAND = (15, 50)  # words; the shipped TL;DR references run 20-39 words (5th-95th pct)
COVERAGE_KEYWORDS = 10  # the post's top-k content stems by frequency
RARE_WORD_LETTERS = 7  # a content word this long counts as rare for faithfulness
MIN_COPY_SPAN = 5  # words in a row shared with the post that count as copied

# Common English function words and fillers (apostrophes removed, as the tokenizer does).
STOPWORDS = frozenset("""
a about above after again against all also am an and any anymore anyone anything are around as
at back be because been before being below between both but by can cant could couldnt did didnt
do does doesnt doing dont down during each else even ever every everyone everything few for from
further get gets getting go goes going got had hadnt has hasnt have havent having he hed hes her
here hers herself him himself his how however i id if ill im in into is isnt it its itself ive
just know like lot made make many may maybe me might more most much must my myself never no nor
not nothing now of off oh ok okay on once one only or other our ours ourselves out over own
pretty probably quite rather really said same say says see she shes should shouldnt so some
someone something still such than that thats the their theirs them themselves then there theres
these they theyre things think this those though through thing to too under until up upon
us very via was wasnt way we well were werent weve what whats when where whether which while who
whom whose why will with without wont would wouldnt yeah yes yet you youd youll your youre yours
yourself yourselves youve actually already although another anyway basically instead literally
recently somehow together usually whatever whenever wherever
""".split())

_WORD = re.compile(r"[A-Za-z0-9]+")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


def words(text: str) -> list[str]:
    """The words of `text` in their original case, apostrophes deleted first."""
    return _WORD.findall(text.replace("'", "").replace("\u2019", ""))


def split_sentences(text: str) -> list[str]:
    """Non-empty sentences of `text`, split after . ! ? + whitespace and at line breaks."""
    return [s.strip() for s in _SENTENCE_END.split(text.strip()) if s.strip()]


@functools.cache
def _stemmer():
    from nltk.stem.porter import PorterStemmer  # lazy: importing nltk takes seconds

    return PorterStemmer()


@functools.lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """Porter stem of the lowercase word."""
    return _stemmer().stem(word.lower())


def _is_content(word: str) -> bool:
    return word.lower() not in STOPWORDS


def _length_score(n: int) -> float:
    lo, hi = LENGTH_BAND
    if n < lo:
        return n / lo
    return 1.0 if n <= hi else max(0.0, 1.0 - (n - hi) / hi)


def length_band(prompts, completions, answers=None, **kwargs) -> list[float]:
    """1.0 for a summary of LENGTH_BAND = [15, 50] words, falling off linearly outside it.

    n = number of words; score = n / 15 for n < 15; 1 for 15 <= n <= 50;
    max(0, 1 - (n - 50) / 50) for n > 50, so 75 words score 0.5 and 100 or more score 0.
    """
    return [_length_score(len(words(c))) for c in completions]


def keywords(text: str, k: int = COVERAGE_KEYWORDS) -> dict[str, int]:
    """The text's k most frequent content stems -> their counts (ties: first occurrence first)."""
    counts = Counter(stem(w) for w in words(text) if _is_content(w))
    return dict(sorted(counts.items(), key=lambda kv: -kv[1])[:k])  # sorted() is stable


def _coverage_score(post: str, summary: str) -> float:
    keys = keywords(post)
    kept = {stem(w) for w in words(summary)}
    total = sum(keys.values())
    return sum(c for s, c in keys.items() if s in kept) / total if total and kept else 0.0


def coverage(prompts, completions, answers=None, **kwargs) -> list[float]:
    """Frequency-weighted share of the post's salient words that the summary keeps.

    K = the post's COVERAGE_KEYWORDS = 10 most frequent content stems, c(s) = the count of
    stem s in the post; score = sum of c(s) over the s in K that occur (stemmed) in the summary
    / sum of c(s) over K. A post without content words scores 0.
    """
    return [_coverage_score(p, c) for p, c in zip(prompts, completions)]


def checked_words(summary: str) -> set[str]:
    """Stems of the summary's numbers, names and rare words: what faithfulness checks.

    number = a word with a digit; name = a capitalized content word that does not open its
    sentence; rare = a content word of at least RARE_WORD_LETTERS = 7 letters.
    """
    out = set()
    for sentence in split_sentences(summary):
        for j, w in enumerate(words(sentence)):
            number = any(ch.isdigit() for ch in w)
            name = j > 0 and w[0].isupper() and _is_content(w)
            rare = len(w) >= RARE_WORD_LETTERS and _is_content(w)
            if number or name or rare:
                out.add(stem(w))
    return out


def _faithfulness_score(post: str, summary: str) -> float:
    if not words(summary):
        return 0.0
    checked = checked_words(summary)
    if not checked:
        return 1.0
    source = {stem(w) for w in words(post)}
    return len(checked & source) / len(checked)


def faithfulness(prompts, completions, answers=None, **kwargs) -> list[float]:
    """Share of the summary's numbers, names and rare words that also occur in the post.

    C = checked_words(summary), distinct stems; score = |C & stems of the post| / |C|, so each
    invented number, name or rare word costs 1/|C|. 1.0 when C is empty (nothing to check).
    """
    return [_faithfulness_score(p, c) for p, c in zip(prompts, completions)]


def _no_copy_score(post: str, summary: str, n: int = MIN_COPY_SPAN) -> float:
    s = [w.lower() for w in words(summary)]
    if not s:
        return 0.0
    p = [w.lower() for w in words(post)]
    post_spans = {tuple(p[i : i + n]) for i in range(len(p) - n + 1)}
    copied = [False] * len(s)
    for j in range(len(s) - n + 1):
        if tuple(s[j : j + n]) in post_spans:
            copied[j : j + n] = [True] * n
    return 1.0 - sum(copied) / len(s)


def no_copy(prompts, completions, answers=None, **kwargs) -> list[float]:
    """1 - the share of the summary's words that lie in a span copied verbatim from the post.

    A word is copied when it is inside a run of at least MIN_COPY_SPAN = 5 consecutive summary
    words (lowercase, unstemmed) that also occurs as consecutive words in the post.
    score = 1 - copied words / summary words: 1.0 for no such span, 0.0 for a verbatim excerpt.
    """
    return [_no_copy_score(p, c) for p, c in zip(prompts, completions)]
