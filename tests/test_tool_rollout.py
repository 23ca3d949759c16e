"""Multi-turn tool rollouts on builtin:tiny with scripted turns: the tokens a row gets (its sampled
ids, then the tool message's, then its next turn's, never re-tokenized), faults as messages to
the model, the limits, and a slow tool that holds up only its own row.

The turns are scripted with per-row samplers (each returns the row's next scripted token whatever
the logits), attached by a BatchGenerator subclass; the model, its KV caches and the continuous
batch are the real ones.
"""

import asyncio
import time

import mlx.core as mx
import pytest

import mlx_grpo.rollout.episodes as episodes_module
from mlx_grpo.rollout.episodes import EpisodeLimits, generate_episodes
from mlx_grpo.tools import Toolset
from mlx_grpo.tools.calls import ToolFormat, tool_turn_text

EOS = 2


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def slow(seconds: float) -> str:
    """Sleep, then answer."""
    time.sleep(seconds)
    return "late"


async def async_add(a: int, b: int) -> int:
    """Add, asynchronously."""
    await asyncio.sleep(0.01)
    return a + b


def broken(x: int) -> int:
    """Always raises."""
    raise ValueError(f"no {x}")


def call(name: str, **arguments) -> str:
    import json

    return f'<tool_call>{json.dumps({"name": name, "arguments": arguments})}</tool_call>'


class Scripted(episodes_module.BatchGenerator):
    """Rows follow scripts: row i's prompt ends with token FIRST + i; its turns are scripts[i][turn]."""

    FIRST = 100
    scripts: dict = {}
    tokenizer = None
    finished_at: dict = {}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.row_of_uid, self.row_of_cache, self.turn = {}, {}, {}

    def insert(self, prompts, max_tokens=None, caches=None, **kwargs):
        rows = [self.row_of_cache.pop(id(c)) if c is not None and id(c) in self.row_of_cache else p[-1] - self.FIRST
                for p, c in zip(prompts, caches or [None] * len(prompts))]
        samplers = []
        for row in rows:
            turn = self.turn[row] = self.turn.get(row, -1) + 1
            text = self.scripts[row][turn] if turn < len(self.scripts[row]) else "0"
            samplers.append(_script(self.tokenizer.encode(text, add_special_tokens=False) + [EOS]))
        uids = super().insert(prompts, max_tokens, caches, samplers=samplers)
        self.row_of_uid.update(zip(uids, rows))
        return uids

    def next_generated(self):
        out = super().next_generated()
        for r in out:
            if r.finish_reason is not None:
                self.row_of_cache[id(r.prompt_cache)] = self.row_of_uid[r.uid]
                Scripted.finished_at[(self.row_of_uid[r.uid], self.turn[self.row_of_uid[r.uid]])] = time.monotonic()
        return out


def _script(tokens):
    it = iter(tokens)
    return lambda logprobs: mx.array([next(it, EOS)] * logprobs.shape[0])


def run(tiny, monkeypatch, scripts, tools, environment=None, limits=None, timeout_s=5.0, sampling_logprob=None):
    model, tokenizer = tiny
    monkeypatch.setattr(episodes_module, "BatchGenerator", Scripted)
    Scripted.scripts, Scripted.tokenizer, Scripted.finished_at = scripts, tokenizer, {}
    toolset = Toolset(tools, environment, timeout_s=timeout_s)
    n = len(scripts)
    prompts = [[1, 50, 60, Scripted.FIRST + i] for i in range(n)]
    episodes = [toolset.episode({"prompt": "q", "row": i}) for i in range(n)]
    limits = limits or EpisodeLimits(max_new_tokens=200, max_turns=4, max_tool_calls=0, max_tokens=1000)
    return generate_episodes(model, tokenizer, prompts, episodes, limits=limits, sampler=None,
                             fmt=ToolFormat.of(tokenizer), schemas=toolset.schemas, timeout_s=timeout_s,
                             group_size=1, sampling_logprob=sampling_logprob or (lambda lp, t: mx.zeros(t.shape)))


def ids(tokenizer, text):
    return tokenizer.encode(text, add_special_tokens=False)


def test_a_tool_result_is_appended_as_tokens_and_the_row_goes_on_from_its_cache(tiny, monkeypatch):
    tokenizer = tiny[1]
    r = run(tiny, monkeypatch, {0: [call("add", a=2, b=3), "5"], 1: ["7"]}, [add])
    turn1 = ids(tokenizer, call("add", a=2, b=3)) + [EOS]  # the turn ends at its EOS, which is scored
    suffix = ids(tokenizer, tool_turn_text(tokenizer, [("add", "5")], ended_with_eos=True))
    assert r.completion_tokens[0] == turn1 + suffix + ids(tokenizer, "5") + [EOS]
    assert r.trainable[0] == [1.0] * len(turn1) + [0.0] * len(suffix) + [1.0] * (len(ids(tokenizer, "5")) + 1)
    assert r.completion_tokens[1] == ids(tokenizer, "7") + [EOS] and r.trainable[1] == [1.0] * 2
    assert len(r.sampling_logprobs[0]) == len(r.completion_tokens[0])
    e = r.episodes[0]
    assert (e["turns"], e["tool_calls"], e["tool_failures"], e["tools"]) == (2, 1, 0, {"add": 1})
    assert [m["role"] for m in e["messages"]] == ["assistant", "tool", "assistant"]
    assert e["messages"][1] == {"role": "tool", "name": "add", "content": "5"} and e["messages"][2]["content"] == "5"
    assert r.truncated == [False, False] and r.episodes[1]["turns"] == 1
    assert "<|im_start|>tool\n5<|im_end|>" in r.texts[0]  # the rewards read the whole episode


def test_the_continued_rows_saw_exactly_the_tokens_the_trainer_scores(tiny, monkeypatch):
    """Each sampled token's log-prob as the rollout computed it (from the row's own cache, the tool
    tokens appended) equals the trainer's, from one forward over prompt + episode."""
    from mlx_grpo.algorithm.loss import completion_logprobs
    from mlx_grpo.rollout.sample import make_sampling_logprob

    r = run(tiny, monkeypatch, {0: [call("add", a=2, b=3), call("add", a=5, b=1), "6"], 1: ["9"]}, [add],
            sampling_logprob=make_sampling_logprob(1.0, 1.0, 0, 0.0))
    assert r.episodes[0]["turns"] == 3
    for i in range(2):
        trainer = completion_logprobs(tiny[0], [r.prompt_tokens[i]], [r.completion_tokens[i]])[0].tolist()
        sampled = [(a, b) for a, b, m in zip(trainer, r.sampling_logprobs[i], r.trainable[i]) if m]
        assert len(sampled) == sum(r.trainable[i]) and max(abs(a - b) for a, b in sampled) < 1e-4


def test_a_slow_tool_holds_up_only_its_own_row(tiny, monkeypatch):
    # 3 s: under a loaded CI (two test workers on two cores) the other rows' two turns once took
    # longer than the 1.5 s this tool slept before
    seconds = 3.0
    long_answer = "1 + 2 = 3. " * 6
    scripts = {0: [call("slow", seconds=seconds), "done"], **{i: [call("add", a=i, b=1), long_answer] for i in (1, 2, 3)}}
    tic = time.monotonic()
    r = run(tiny, monkeypatch, scripts, [add, slow])
    total = time.monotonic() - tic
    assert r.episodes[0]["messages"][1]["content"] == "late"
    slow_done = Scripted.finished_at[(0, 1)]  # the slow row's second turn came after its tool returned
    for i in (1, 2, 3):  # the others finished both turns while the slow tool still ran
        assert Scripted.finished_at[(i, 1)] < tic + seconds < slow_done, (i, tic, Scripted.finished_at)
        assert r.episodes[i]["messages"][-1]["content"] == long_answer
    assert seconds < total < seconds + 8.5
    assert r.tool_time["tools/seconds"] >= seconds


def test_faults_become_error_messages_to_the_model_and_are_counted(tiny, monkeypatch):
    scripts = {
        0: ['<tool_call>{"name": "add", "arguments": {"a": 1,</tool_call>', "ok"],  # bad JSON
        1: [call("mul", a=1, b=2), "ok"],  # unknown tool
        2: [call("broken", x=3), "ok"],  # raises
        3: [call("slow", seconds=2.0), "ok"],  # times out
        4: [call("async_add", a=1, b=2), "ok"],  # async, fine
    }
    r = run(tiny, monkeypatch, scripts, [add, slow, broken, async_add], timeout_s=0.5)
    told = [e["messages"][1]["content"] for e in r.episodes]
    assert told[0].startswith("Error: malformed tool call (JSONDecodeError")
    assert told[1] == "Error: unknown tool 'mul'; the tools are: add, slow, broken, async_add"
    assert told[2] == "Error: tool 'broken' raised ValueError: no 3"
    assert told[3] == "Error: tool 'slow' timed out after 0.5 s"
    assert told[4] == "3"
    assert [e["tool_failures"] for e in r.episodes] == [1, 1, 1, 1, 0]
    assert all(e["messages"][-1]["content"] == "ok" and e["turns"] == 2 for e in r.episodes)  # each went on


def test_limits_max_turns_tool_calls_and_the_episode_budget(tiny, monkeypatch):
    tokenizer = tiny[1]
    again = call("add", a=1, b=1)
    limits = EpisodeLimits(max_new_tokens=200, max_turns=2, max_tool_calls=1, max_tokens=1000)
    r = run(tiny, monkeypatch, {0: [again, again, again], 1: [call("add", a=1, b=1) + call("add", a=2, b=2), "4"]},
            [add], limits=limits)
    assert r.episodes[0]["turns"] == 2 and r.truncated[0]  # still calling after its last turn
    assert r.episodes[0]["tool_calls"] == 1
    told = [m["content"] for m in r.episodes[1]["messages"] if m["role"] == "tool"]
    assert told == ["2", "Error: max_tool_calls (1) reached; answer without tools"] and not r.truncated[1]
    # the episode budget: room for the first turn, not for the tool message after it
    budget = len(ids(tokenizer, again)) + 4
    r = run(tiny, monkeypatch, {0: [again, "2"]}, [add],
            limits=EpisodeLimits(max_new_tokens=200, max_turns=4, max_tool_calls=0, max_tokens=budget))
    assert r.truncated[0] and len(r.completion_tokens[0]) <= budget and set(r.trainable[0]) == {1.0}
    # the budget caps a turn too: a 30-token answer in a 10-token budget stops at 10, truncated
    r = run(tiny, monkeypatch, {0: ["1 + 2 = 3. " * 5]}, [add],
            limits=EpisodeLimits(max_new_tokens=200, max_turns=4, max_tool_calls=0, max_tokens=10))
    assert len(r.completion_tokens[0]) == 10 and r.truncated[0]


class Counter:
    def reset(self, **row):
        self.total = 0
        return None

    def bump(self, by: int) -> int:
        """Add to the total."""
        self.total += by
        return self.total

    def reward(self) -> float:
        return float(self.total)


def test_an_environment_instance_per_episode(tiny, monkeypatch):
    r = run(tiny, monkeypatch, {0: [call("bump", by=2), call("bump", by=3), "x"], 1: [call("bump", by=1), "y"]},
            [], environment=Counter)
    assert [m["content"] for m in r.episodes[0]["messages"] if m["role"] == "tool"] == ["2", "5"]
    assert [m["content"] for m in r.episodes[1]["messages"] if m["role"] == "tool"] == ["1"]


@pytest.fixture(scope="module")
def tiny():
    import mlx_lm

    from mlx_grpo.models.builtin import builtin_model_path

    return mlx_lm.load(str(builtin_model_path("tiny")))
