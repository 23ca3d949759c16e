"""Multi-turn tool-use rollouts: G episodes per prompt, decoded together in one continuous batch.

A row decodes until its turn ends (its EOS token). When the
turn calls tools, the row leaves the batch with its KV cache, its calls run on their own threads
(tools/execute.py) while the other rows keep decoding, and when they are done the tool messages'
tokens are appended and the row rejoins the batch from its own cache: the history is never
re-tokenized, so the trainer scores exactly the sampled ids plus the appended tool tokens.
`Rollout.trainable` marks which is which (1 sampled, 0 tool). Faults (a malformed call, an
unknown tool, a tool that raises or times out) become error messages to the model.

Limits: max_new_tokens per turn, max_turns model turns, max_tool_calls calls (0 = no limit;
calls past it are answered with an error), and max_tokens per episode (sampled and tool tokens):
a row that would overflow it stops there and is marked truncated, as is one still calling tools
after its last turn.
"""

from collections import Counter
from dataclasses import dataclass, field
import time

import mlx.core as mx
from mlx_lm.generate import BatchGenerator

from mlx_grpo.rollout.sample import Rollout, _prefill
from mlx_grpo.tools.calls import tool_turn_text
from mlx_grpo.tools.execute import Call, Failed


@dataclass(frozen=True)
class EpisodeLimits:
    max_new_tokens: int  # per model turn
    max_turns: int
    max_tool_calls: int  # 0 = no limit
    max_tokens: int  # per episode, sampled and tool tokens together


@dataclass
class _Row:
    prompt: list[int]
    episode: object  # tools/toolbox.Episode
    tokens: list[int] = field(default_factory=list)
    trainable: list[float] = field(default_factory=list)
    segments: list = field(default_factory=list)  # ("uid", uid) | ("tool", n): where sampled log-probs go
    turn: list[int] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    tools: Counter = field(default_factory=Counter)
    turns: int = 0
    calls: int = 0
    failures: int = 0
    truncated: bool = False
    waiting: list | None = None  # the calls in flight
    cache: list | None = None
    ended_with_eos: bool = False

    def stats(self) -> dict:
        return {"turns": self.turns, "tool_calls": self.calls, "tool_failures": self.failures,
                "tools": dict(self.tools), "messages": self.messages,
                "tool_tokens": int(len(self.trainable) - sum(self.trainable))}


class _Episodes:
    """The state of one multi-turn rollout; `run` drives it to the end."""

    def __init__(self, model, tokenizer, rows: list[_Row], limits: EpisodeLimits, fmt, schemas, timeout_s: float,
                 template_kwargs: dict | None):
        self.model, self.tokenizer, self.rows, self.limits = model, tokenizer, rows, limits
        self.fmt, self.schemas, self.timeout_s, self.template_kwargs = fmt, schemas, timeout_s, template_kwargs
        self.eos = set(tokenizer.eos_token_ids)
        self.by_uid: dict[int, int] = {}
        self.active = 0
        self.tool_seconds = 0.0  # summed over calls
        self.idle_seconds = 0.0  # wall time with every unfinished row waiting on tools

    def turn_budget(self, row: _Row) -> int:
        return min(self.limits.max_new_tokens, self.limits.max_tokens - len(row.tokens))

    def insert(self, gen, indices: list[int], inputs: list[list[int]], caches) -> None:
        uids = gen.insert(inputs, max_tokens=[self.turn_budget(self.rows[i]) for i in indices], caches=caches)
        for i, uid in zip(indices, uids):
            self.by_uid[uid] = i
            self.rows[i].segments.append(("uid", uid))
        self.active += len(indices)

    def end_turn(self, i: int, response) -> None:
        """Row i's turn is over: finish the episode, or send its calls off."""
        row = self.rows[i]
        self.active -= 1
        row.ended_with_eos = row.turn[-1] in self.eos
        text = self.tokenizer.decode(row.turn[:-1] if row.ended_with_eos else row.turn)
        row.messages.append({"role": "assistant", "content": text})
        row.turns += 1
        calls = self.fmt.calls(text, self.schemas) if response.finish_reason == "stop" else []
        if response.finish_reason == "length":
            row.truncated = True
        if not calls:
            return
        if row.turns >= self.limits.max_turns or len(row.tokens) >= self.limits.max_tokens:
            row.truncated = True  # it still wants tools, and may have no more turns
            return
        row.cache, row.waiting = response.prompt_cache, []
        for call in calls:
            limit = self.limits.max_tool_calls
            if isinstance(call, str):
                row.waiting.append(Failed("", call))
            elif limit and row.calls >= limit:
                row.waiting.append(Failed(call["name"], f"max_tool_calls ({limit}) reached; answer without tools"))
            else:
                prepared = row.episode.prepare(call)
                row.waiting.append(Failed(call["name"], prepared) if isinstance(prepared, str)
                                   else Call(call["name"], *prepared, self.timeout_s))
            row.calls += not isinstance(call, str)

    def rejoin(self, gen) -> None:
        """Rows whose calls are all answered get the tool messages appended and decode again."""
        ready, inputs, caches = [], [], []
        for i, row in enumerate(self.rows):
            if row.waiting is None:
                continue
            results = [c.result() for c in row.waiting]
            if any(r is None for r in results):
                continue
            for c, (text, failed) in zip(row.waiting, results):
                row.tools[c.name or "<malformed>"] += 1
                row.failures += failed
                if isinstance(c, Call):
                    self.tool_seconds += (c.finished_at or c.clock()) - c.started
                row.messages.append({"role": "tool", "name": c.name, "content": text})
            suffix = self.tokenizer.encode(
                tool_turn_text(self.tokenizer, [(c.name, t) for c, (t, _) in zip(row.waiting, results)],
                               row.ended_with_eos, self.template_kwargs), add_special_tokens=False)
            row.waiting, cache, row.cache = None, row.cache, None
            if len(row.tokens) + len(suffix) >= self.limits.max_tokens:  # no room for the answer
                row.truncated = True
                continue
            row.tokens += suffix
            row.trainable += [0.0] * len(suffix)
            row.segments.append(("tool", len(suffix)))
            row.turn = []
            ready.append(i)
            inputs.append(suffix)
            caches.append(cache)
        if ready:
            self.insert(gen, ready, inputs, caches)

    def wait_for_tools(self) -> None:
        """No row is decoding: block until the first waiting call is done (or times out)."""
        tic = time.perf_counter()
        pending = [c for row in self.rows if row.waiting for c in row.waiting if c.result() is None]
        if pending:
            pending[0].wait(0.05)
        self.idle_seconds += time.perf_counter() - tic

    def waiting(self) -> bool:
        return any(row.waiting is not None for row in self.rows)


def generate_episodes(model, tokenizer, prompts: list[list[int]], episodes: list, *, limits: EpisodeLimits,
                      sampler, fmt, schemas, timeout_s: float, group_size: int, batch_size: int = 0,
                      sampling_logprob=None, template_kwargs: dict | None = None, on_progress=None) -> Rollout:
    """One episode per row (prompts[i], episodes[i]: tools/toolbox.Episode), rows in prompt-major
    order; consecutive rows with the same prompt share its prefill. Returns the Rollout with
    `trainable` and `episodes` (per row: turns, calls, failures, per-tool counts, messages)."""
    rows = [_Row(p, e) for p, e in zip(prompts, episodes)]
    state = _Episodes(model, tokenizer, rows, limits, fmt, schemas, timeout_s, template_kwargs)
    n = len(rows)
    gen = BatchGenerator(model, max_tokens=limits.max_new_tokens, stop_tokens=_stops(tokenizer),
                         sampler=sampler, completion_batch_size=batch_size or n,
                         prefill_batch_size=min(batch_size or n, 64))
    picked, sampled = [], 0
    try:
        start = 0
        while start < n:  # a run of rows sharing one prompt: one prefill
            end = start + 1
            while end < n and rows[end].prompt == rows[start].prompt:
                end += 1
            prompt = rows[start].prompt
            cache = _prefill(model, prompt)
            state.insert(gen, list(range(start, end)), [prompt[-1:]] * (end - start),
                         [cache] * (end - start) if len(prompt) > 1 else None)
            start = end
        while state.active or state.waiting():
            responses = gen.next_generated() if state.active else []
            if not responses and state.waiting():
                state.wait_for_tools()
            if responses and sampling_logprob is not None:
                lp = sampling_logprob(mx.stack([r.logprobs for r in responses]), mx.array([r.token for r in responses]))
                mx.async_eval(lp)
                picked.append(([r.uid for r in responses], lp))
            for r in responses:
                row = rows[state.by_uid[r.uid]]
                row.tokens.append(r.token)
                row.trainable.append(1.0)
                row.turn.append(r.token)
                if r.finish_reason is not None:
                    state.end_turn(state.by_uid[r.uid], r)
            state.rejoin(gen)
            if on_progress:
                sampled += len(responses)
                on_progress(sampled, n - state.active - sum(rw.waiting is not None for rw in rows), n)
    finally:
        gen.close()
    return _rollout(tokenizer, rows, picked, sampling_logprob is not None, group_size, state)


def _stops(tokenizer) -> list[list[int]]:
    """The tokens that end a turn: each EOS token. Not the call format's closing marker: a turn may
    make several calls (Qwen writes one <tool_call> block each, then its EOS)."""
    return [[t] for t in sorted(tokenizer.eos_token_ids)]


def _rollout(tokenizer, rows: list[_Row], picked, keep_logprobs: bool, group_size: int, state) -> Rollout:
    eos = set(tokenizer.eos_token_ids)
    sampling_logprobs = None
    if keep_logprobs:
        by_uid = {}
        for uids, lp in picked:
            for uid, v in zip(uids, lp.tolist()):
                by_uid.setdefault(uid, []).append(v)
        sampling_logprobs = [[v for kind, x in row.segments for v in (by_uid.get(x, []) if kind == "uid" else [0.0] * x)]
                             for row in rows]
    texts = [tokenizer.decode(r.tokens[:-1] if r.tokens and r.tokens[-1] in eos else r.tokens) for r in rows]
    return Rollout(
        prompt_tokens=[r.prompt for r in rows], completion_tokens=[r.tokens for r in rows], texts=texts,
        truncated=[r.truncated for r in rows], group_size=group_size, sampling_logprobs=sampling_logprobs,
        trainable=[r.trainable for r in rows], episodes=[r.stats() for r in rows],
        tool_time={"tools/seconds": state.tool_seconds, "tools/idle_seconds": state.idle_seconds},
    )
