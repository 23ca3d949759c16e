"""The run's tools: plain functions and an environment class, resolved and checked once
(`Toolset`), and one `Episode` per rollout row that dispatches the model's calls.

A tool is a typed function (tools/schema.py makes its schema). An environment is a class: one
instance per episode, `reset(**row)` returns the first prompt (text, a list of messages, or None
for the row's own), its public methods are tools, and an optional `reward()` is added to the
rewards' sum. Keyword-only parameters of a tool (after `*`) and its `**kwargs` receive the data
row's fields by name; the model fills the others. Everything here is checked before any weight
loads: a tool without type hints, two tools of one name, an environment without `reset` or a
name that resolves to nothing stops the run with one line. Pure Python, no MLX.
"""

import inspect

from mlx_grpo.tools.schema import ToolError, model_parameters, tool_schema
from mlx_grpo.user_code import load_module

RESERVED = ("reset", "reward")  # an environment's methods that are not tools


def resolve(spec, setting: str, base_dir=None):
    """'package.module:name' or 'path/to/file.py:name' -> the object; a callable is itself."""
    if callable(spec):
        return spec
    if not isinstance(spec, str) or ":" not in spec:
        raise ToolError(f"{setting}: expected 'package.module:name' or 'path/to/file.py:name' (or a function), "
                        f"got {spec!r:.60}")
    target, name = spec.rsplit(":", 1)
    module = load_module(target, base_dir, f"{setting}: {spec!r}", ToolError)
    if not hasattr(module, name):
        raise ToolError(f"{setting}: {spec!r}: module {target!r} has no {name!r}")
    found = getattr(module, name)
    if not callable(found):
        raise ToolError(f"{setting}: {spec!r} is a {type(found).__name__}, not callable")
    return found


def environment_methods(cls) -> dict:
    """The public methods of an environment class that are tools, by name."""
    return {name: fn for name, fn in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_") and name not in RESERVED}


class Toolset:
    """The checked tools of a run: `schemas` (what the chat template is given), the functions,
    and the environment class; `episode(row)` starts one row's episode."""

    def __init__(self, functions=(), environment=None, base_dir=None, timeout_s: float = 10.0):
        self.timeout_s = timeout_s
        self.functions, self.schemas, owner = {}, [], {}
        for i, spec in enumerate(functions):
            fn = resolve(spec, f"tools.functions[{i}]", base_dir)
            name = getattr(fn, "__name__", None)
            if not isinstance(name, str) or name == "<lambda>":
                raise ToolError(f"tools.functions[{i}]: {fn!r:.60} has no name the model can call; wrap it in a def")
            self._add(name, fn, f"tools.functions[{i}]", owner, tool_schema(fn, name, f"tools.functions[{i}] ({name})"))
        self.environment = None
        if environment is not None:
            cls = resolve(environment, "tools.environment", base_dir)
            label = f"tools.environment ({getattr(cls, '__name__', cls)})"
            if not inspect.isclass(cls):
                raise ToolError(f"{label}: expected a class (one instance per episode), got {type(cls).__name__}")
            if not callable(getattr(cls, "reset", None)):
                raise ToolError(f"{label}: has no reset(**row) method; an environment's reset returns the first "
                                "prompt, or None to use the row's")
            for name, fn in environment_methods(cls).items():
                self._add(name, fn, label, owner, tool_schema(fn, name, f"{label}.{name}", method=True))
            self.environment = cls
        if not self.schemas:
            raise ToolError("tools: no tools; give tools.functions or an environment with public methods")

    def _add(self, name: str, fn, where: str, owner: dict, schema: dict) -> None:
        if name in owner:
            raise ToolError(f"{where}: a tool named {name!r} is already given by {owner[name]}; tool names must "
                            "be unique (the model calls them by name)")
        owner[name] = where
        self.functions[name] = fn
        self.schemas.append(schema)

    @property
    def names(self) -> list[str]:
        return [s["function"]["name"] for s in self.schemas]

    def episode(self, row: dict) -> "Episode":
        return Episode(self, row)


class Episode:
    """One rollout row's tools: its environment instance (when there is one) and the row's fields."""

    def __init__(self, toolset: Toolset, row: dict):
        self.toolset, self.row = toolset, row
        self.env = toolset.environment() if toolset.environment else None
        self.prompt = self.env.reset(**row) if self.env is not None else None
        self.tools = dict(toolset.functions)
        if self.env is not None:
            for name in environment_methods(toolset.environment):
                self.tools[name] = getattr(self.env, name)

    def prepare(self, call: dict):
        """(function, keyword arguments) for a parsed call, or an error message for the model."""
        name, arguments = call.get("name"), call.get("arguments", {})
        if name not in self.tools:
            return f"unknown tool {name!r}; the tools are: {', '.join(self.tools)}"
        if not isinstance(arguments, dict):
            return f"tool {name!r}: arguments must be a JSON object, got {arguments!r:.60}"
        fn = self.tools[name]
        params = inspect.signature(fn).parameters
        takes = {p.name for p in model_parameters(fn)}
        unknown = [k for k in arguments if k not in takes]
        if unknown:
            return f"tool {name!r} has no argument {unknown[0]!r}; it takes: {', '.join(sorted(takes)) or 'none'}"
        missing = [p.name for p in model_parameters(fn) if p.default is p.empty and p.name not in arguments]
        if missing:
            return f"tool {name!r}: missing argument {missing[0]!r}"
        kwargs = dict(arguments)
        for p in params.values():  # the row's fields, by name
            if p.kind == p.KEYWORD_ONLY:
                if p.name in self.row:
                    kwargs[p.name] = self.row[p.name]
                elif p.default is p.empty:
                    raise ToolError(f"tool {name!r}: keyword-only parameter {p.name!r} takes the data row's field "
                                    f"of that name, which this row has not (fields: {', '.join(self.row)})")
            elif p.kind == p.VAR_KEYWORD:
                kwargs.update({k: v for k, v in self.row.items() if k not in kwargs})
        return fn, kwargs

    def reward(self) -> float | None:
        """The environment's reward() for the finished episode, or None without one."""
        fn = getattr(self.env, "reward", None)
        return None if fn is None else fn()
