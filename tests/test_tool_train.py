"""A training run with tools, end to end: every episode calls the calculator once (its turns are
scripted; the model, its caches, the update and the logs are the real ones), and the metrics,
completions.jsonl and the console show the episodes with their tool messages."""

import json

import mlx.core as mx
import pytest

import mlx_grpo.rollout.episodes as episodes_module
from mlx_grpo.rollout.sample import Rollout
from mlx_grpo.rollout.tool_rollout import tool_metrics
from mlx_grpo.run.log import episode_text

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "2 + 3"}}</tool_call>'


def calculator(expression: str) -> str:
    """Evaluate a sum or difference of whole numbers, e.g. "12 + 7 - 3".

    Args:
        expression: The numbers with + and - between them.
    """
    total, sign = 0, 1
    for part in expression.replace("-", " - ").replace("+", " + ").split():
        if part in "+-":
            sign = 1 if part == "+" else -1
        else:
            total += sign * int(part)
    return str(total)


def right_after_tool(completions, episode, **kwargs):
    """1 when the episode's last turn repeats the tool's answer."""
    return [float(len(e) > 1 and e[-2]["role"] == "tool" and e[-1]["content"] == e[-2]["content"]) for e in episode]


class CallsOnce(episodes_module.BatchGenerator):
    """Each row's first turn calls the calculator, its second answers "5"."""

    def insert(self, prompts, max_tokens=None, caches=None, **kwargs):
        tok = CallsOnce.tokenizer
        scripts = [CALL if len(p) == 1 else "5" for p in prompts]  # a first turn starts from the prompt's last token
        samplers = [_script(tok.encode(s, add_special_tokens=False) + [2]) for s in scripts]
        return super().insert(prompts, max_tokens, caches, samplers=samplers)


def _script(tokens):
    it = iter(tokens)
    return lambda logprobs: mx.array([next(it, 2)] * logprobs.shape[0])


def test_a_run_with_tools_logs_its_episodes(tmp_path, monkeypatch, capsys):
    import mlx_lm

    import mlx_grpo
    from mlx_grpo.models.builtin import builtin_model_path

    CallsOnce.tokenizer = mlx_lm.load(str(builtin_model_path("tiny")))[1]
    monkeypatch.setattr(episodes_module, "BatchGenerator", CallsOnce)
    out = mlx_grpo.train("configs/smoke_test.toml", rewards=[right_after_tool], tools=[calculator],
                         output_dir=str(tmp_path / "run"), training={"max_steps": 2, "prompts_per_step": 2},
                         generation={"max_turns": 3, "max_new_tokens": 80}, logging={"log_completions": 2},
                         grpo={"overlong_penalty": 1.0})
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    m = rows[-1]
    assert m["tools/call_frequency"] == 1.0 and m["tools/failure_frequency"] == 0.0
    assert m["tools/calculator/calls"] == 1.0 and m["tools/turns_per_episode"] == 2.0
    assert m["rewards/right_after_tool/mean"] == 1.0 and m["tools/tool_tokens"] > 0
    # DAPO's overlong penalty measures an episode against its budget (3 x 80), not one turn's 80
    assert m["tools/episode_tokens"] > 80 and m["rewards/overlong_penalty/mean"] == 0.0
    # the loss saw the sampled tokens only: tokens_per_second counts those, not the tool's
    assert m["tools/episode_tokens"] > m["completions/mean_length"] - 1e-9
    assert m["loss"] == pytest.approx(0.0, abs=1e-6)  # equal rewards: no advantage
    sample = json.loads((out / "completions.jsonl").read_text().splitlines()[0])
    assert [x["role"] for x in sample["messages"]] == ["assistant", "tool", "assistant"]
    assert sample["messages"][1] == {"role": "tool", "name": "calculator", "content": "5"} and sample["turns"] == 2
    assert "[tool calculator: 5]" in capsys.readouterr().out
    saved = (out / "config.toml").read_text()
    assert 'test_tool_train:calculator"' in saved  # recorded by name: the CLI can import it


def test_tool_metrics_by_hand():
    def ep(turns, calls, failures, tools, tool_tokens):
        return {"turns": turns, "tool_calls": calls, "tool_failures": failures, "tools": tools,
                "tool_tokens": tool_tokens, "messages": []}

    rollout = Rollout([[1]] * 4, [[5] * 10, [5] * 4, [5] * 20, [5] * 6], [""] * 4, [False] * 4, 2,
                      episodes=[ep(2, 1, 0, {"add": 1}, 3), ep(1, 0, 0, {}, 0),
                                ep(3, 3, 1, {"add": 2, "<malformed>": 1}, 9), ep(2, 2, 2, {"mul": 2}, 4)],
                      tool_time={"tools/seconds": 0.5, "tools/idle_seconds": 0.1})
    m = tool_metrics(rollout, ["add", "mul"])
    assert m["tools/call_frequency"] == 6 / 4 and m["tools/failure_frequency"] == 3 / 6
    assert m["tools/add/calls"] == 3 / 4 and m["tools/mul/calls"] == 2 / 4
    assert m["tools/turns_per_episode"] == 8 / 4 and m["tools/episode_tokens"] == 40 / 4
    assert m["tools/tool_tokens"] == 16 / 4 and m["tools/seconds"] == 0.5


def test_episode_text_marks_the_tool_messages():
    messages = [{"role": "assistant", "content": "<tool_call>..</tool_call>"},
                {"role": "tool", "name": "add", "content": "5"}, {"role": "assistant", "content": "5"}]
    assert episode_text(messages) == "<tool_call>..</tool_call> [tool add: 5] 5"


def test_bench_tools_reports_the_wait_on_tools(monkeypatch):
    """Every episode calls once and each call sleeps 0.3 s: all rows wait together, so the batch
    idles about 0.3 s a step, and the tools' summed seconds are 0.3 per call."""
    import mlx_lm

    from mlx_grpo.commands.bench import generation_limit
    from mlx_grpo.commands.bench_tools import format_tools_report, run_tools_bench
    from mlx_grpo.config import load_config
    from mlx_grpo.models.builtin import builtin_model_path

    CallsOnce.tokenizer = mlx_lm.load(str(builtin_model_path("tiny")))[1]
    monkeypatch.setattr(episodes_module, "BatchGenerator", CallsOnce)
    profile = "configs/tools_smoke.toml"
    cfg = load_config(profile, ["model.path=\"builtin:tiny\"", "training.prompts_per_step=2",
                                "generation.num_generations=2"])
    r = run_tools_bench(cfg, profile, generation_limit, steps=1, tool_seconds=0.3)
    assert r["call_frequency"] == 1.0 and r["turns_per_episode"] == 2.0
    assert 0.2 <= r["idle_s"] < r["rollout_s"] < r["step_s"]  # the first call started before the last row ended
    assert r["tool_s"] == pytest.approx(4 * 0.3, abs=0.2)  # 4 calls that overlapped in time
    assert r["idle_share"] == pytest.approx(r["idle_s"] / r["step_s"]) and r["batching_efficiency"] > 0
    assert "batching efficiency" in format_tools_report(r)


class CalculatorEnv:
    """One instance per episode: reset gets the row; its reward is 1 once the calculator ran."""

    def reset(self, **row):
        self.used, self.question = False, row["prompt"]
        return None

    def calculator(self, expression: str) -> str:
        """Evaluate a sum."""
        self.used = True
        return calculator(expression)

    def reward(self) -> float:
        return float(self.used)


def test_an_environment_reward_is_added_and_logged(tmp_path, monkeypatch):
    import mlx_lm

    import mlx_grpo
    from mlx_grpo.models.builtin import builtin_model_path

    CallsOnce.tokenizer = mlx_lm.load(str(builtin_model_path("tiny")))[1]
    monkeypatch.setattr(episodes_module, "BatchGenerator", CallsOnce)
    out = mlx_grpo.train("configs/smoke_test.toml", rewards=[right_after_tool], environment=CalculatorEnv,
                         output_dir=str(tmp_path / "run"), training={"max_steps": 1, "prompts_per_step": 2},
                         generation={"max_turns": 3, "max_new_tokens": 128})
    m = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert m["rewards/environment/mean"] == 1.0 and m["rewards/right_after_tool/mean"] == 1.0
    assert m["reward"] == 2.0 and m["tools/calculator/calls"] == 1.0
