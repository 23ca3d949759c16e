"""Tools from typed functions and environment classes: the schemas, the [tools] table and the
Python API, and the one-line errors a bad tool gives before any weight loads."""

import textwrap
from typing import Literal

import pytest

from mlx_grpo.config import load_config
from mlx_grpo.tools import ToolError, Toolset, make_toolset, tool_schema


def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: The first number.
        b (int): The second
            number.
    """
    return a + b


def lookup(key: str, unit: Literal["m", "km"] = "m", limit: float | None = None, *, answer) -> str:
    """Look something up."""
    return f"{key}{unit}{answer}"


class Counter:
    """One instance per episode."""

    def reset(self, **row):
        self.count = 0
        return None

    def bump(self, by: int) -> int:
        """Bump the counter."""
        self.count += by
        return self.count

    def reward(self) -> float:
        return float(self.count)

    def _private(self, x):
        return x


def test_schema_from_hints_and_docstring_in_trl_form():
    assert tool_schema(add) == {"type": "function", "function": {
        "name": "add", "description": "Add two whole numbers.",
        "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "description": "The first number."},
            "b": {"type": "integer", "description": "The second number."}},
            "required": ["a", "b"]}}}
    params = tool_schema(lookup)["function"]["parameters"]
    # keyword-only `answer` takes the data row's field: not the model's to fill, not in the schema
    assert params == {"type": "object", "required": ["key"], "properties": {
        "key": {"type": "string"}, "unit": {"type": "string", "enum": ["m", "km"]},
        "limit": {"type": ["number", "null"]}}}


def test_environment_methods_are_tools_without_self_reset_reward_or_private():
    ts = Toolset([add], Counter)
    assert ts.names == ["add", "bump"]
    assert ts.schemas[1]["function"]["parameters"]["properties"] == {"by": {"type": "integer"}}
    ep = ts.episode({"prompt": "q"})
    fn, kwargs = ep.prepare({"name": "bump", "arguments": {"by": 2}})
    assert fn(**kwargs) == 2 and ep.reward() == 2.0


def test_row_fields_reach_keyword_only_parameters():
    ep = Toolset([lookup]).episode({"prompt": "q", "answer": 7})
    fn, kwargs = ep.prepare({"name": "lookup", "arguments": {"key": "k"}})
    assert kwargs == {"key": "k", "answer": 7} and fn(**kwargs) == "km7"


def test_bad_calls_are_messages_for_the_model():
    ep = Toolset([add]).episode({})
    assert ep.prepare({"name": "mul", "arguments": {}}) == "unknown tool 'mul'; the tools are: add"
    assert ep.prepare({"name": "add", "arguments": {"a": 1}}) == "tool 'add': missing argument 'b'"
    assert ep.prepare({"name": "add", "arguments": {"a": 1, "b": 2, "c": 3}}) == \
        "tool 'add' has no argument 'c'; it takes: a, b"


def untyped(a, b: int):
    return a


class NoReset:
    def go(self, x: int) -> int:
        return x


@pytest.mark.parametrize("functions, environment, message", [
    ([untyped], None, "tools.functions[0] (untyped): parameter 'a' has no type hint"),
    ([add, add], None, "tools.functions[1]: a tool named 'add' is already given by tools.functions[0]"),
    ([add], "tests.test_tools_schema:NoReset", "tools.environment (NoReset): has no reset(**row) method"),
    (["tests.test_tools_schema:nothing"], None,
     "tools.functions[0]: 'tests.test_tools_schema:nothing': module 'tests.test_tools_schema' has no 'nothing'"),
    (["no_such_file.py:f"], None, "tools.functions[0]: 'no_such_file.py:f': file not found"),
])
def test_bad_tools_stop_with_one_line_naming_them(functions, environment, message):
    with pytest.raises(ToolError) as e:
        Toolset(functions, environment)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_environment_method_clashing_with_a_function_is_named():
    class Env:
        def reset(self, **row):
            return None

        def add(self, a: int) -> int:
            return a

    with pytest.raises(ToolError, match=r"tools.environment \(Env\): a tool named 'add' is already given by "
                                        r"tools.functions\[0\]"):
        Toolset([add], Env)


def test_tools_table_names_functions_in_a_file_next_to_the_profile(tmp_path):
    (tmp_path / "calc.py").write_text(textwrap.dedent('''
        def calculator(expression: str) -> str:
            """Evaluate + and - over integers."""
            return str(eval(expression))
    '''))
    (tmp_path / "p.toml").write_text('[tools]\nfunctions = ["calc.py:calculator"]\ntimeout_s = 2.5\n'
                                     '[generation]\nmax_turns = 3\n')
    cfg = load_config(tmp_path / "p.toml")
    ts = make_toolset(cfg, str(tmp_path / "p.toml"))
    assert ts.names == ["calculator"] and ts.timeout_s == 2.5 and cfg.generation.max_turns == 3
    assert make_toolset(load_config(None)) is None  # no [tools]: single-turn, as before


def test_a_file_holding_a_tool_and_a_reward_is_loaded_once(tmp_path):
    from mlx_grpo.rewards.registry import resolve_reward
    from mlx_grpo.tools.toolbox import resolve

    (tmp_path / "task.py").write_text("LOADS = []\nLOADS.append(1)\n"
                                      "def tool(x: int) -> int:\n    return x\n"
                                      "def score(completions, **kw):\n    return [1.0] * len(completions)\n")
    tool = resolve("task.py:tool", "tools.functions[0]", tmp_path)
    reward = resolve_reward("task.py:score", tmp_path)
    assert tool.__globals__ is reward.__globals__ and tool.__globals__["LOADS"] == [1]


def test_api_checks_tools_before_any_weight_loads(tmp_path):
    import mlx_grpo

    cfg = {"model": {"path": str(tmp_path / "no-such-model")}, "output_dir": str(tmp_path / "run")}
    with pytest.raises(ToolError, match="parameter 'a' has no type hint"):
        mlx_grpo.train(cfg, tools=[untyped])  # a model error would mean the weights were tried first
    with pytest.raises(TypeError, match=r"tools=\[<function add"):
        mlx_grpo.train(cfg, tools=add)
    with pytest.raises(ToolError, match="tools.environment"):
        mlx_grpo.train({**cfg, "tools": {"environment": "tests.test_tools_schema:NoReset"}})


def test_eval_during_training_with_tools_is_refused_before_any_weight_loads(tmp_path):
    import mlx_grpo
    from mlx_grpo.config import ConfigError

    cfg = {"model": {"path": str(tmp_path / "no-such-model")}, "output_dir": str(tmp_path / "run"),
           "eval": {"every": 5}}
    with pytest.raises(ConfigError, match="eval.every: evaluation during training samples single-turn"):
        mlx_grpo.train(cfg, tools=[add])
