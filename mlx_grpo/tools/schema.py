"""A tool's JSON schema, made from a typed Python function, as TRL (transformers' get_json_schema)
and the chat templates take it: {"type": "function", "function": {"name", "description",
"parameters": {"type": "object", "properties", "required"}}}.

The name is the function's, the description the docstring's first paragraph, each parameter's
type its annotation and its description the docstring's `Args:` line. A parameter without a type
hint is an error: the schema is made from them. Keyword-only parameters (after `*`) and
`**kwargs` are not the model's to fill: they receive the data row's fields by name
(tools/toolbox.py). Pure Python, no MLX.
"""

import inspect
import re
import types
import typing

from mlx_grpo.errors import UserError

_JSON = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object",
         tuple: "array", type(None): "null"}


class ToolError(UserError, ValueError):
    """A tool or environment that cannot be used as given; the message names it."""


def _json_type(hint, where: str) -> dict:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is typing.Any:
        return {}
    if origin is typing.Literal:
        kinds = {_JSON.get(type(a), "string") for a in args}
        return {"type": kinds.pop() if len(kinds) == 1 else sorted(kinds), "enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        parts = [_json_type(a, where) for a in args]
        kinds = [p.get("type") for p in parts]
        if all(isinstance(k, str) for k in kinds) and len(parts) == len(set(kinds)):
            return {"type": kinds}  # Optional[int] -> ["integer", "null"], as get_json_schema writes it
        return {"anyOf": parts}
    if origin in (list, tuple, set) or hint in (list, tuple, set):
        out = {"type": "array"}
        if args and args[-1] is not Ellipsis:
            out["items"] = _json_type(args[0], where)
        return out
    if origin is dict or hint is dict:
        return {"type": "object"}
    if hint in _JSON:
        return {"type": _JSON[hint]}
    raise ToolError(f"{where}: type {getattr(hint, '__name__', hint)!r} has no JSON schema type "
                    "(use int, float, str, bool, list[...], dict, Literal[...] or X | None)")


def _arg_docs(doc: str) -> dict[str, str]:
    """Google-style `Args:` lines: `name (type): text` or `name: text`, continued on indented lines."""
    out, current, inside = {}, None, False
    for line in doc.splitlines():
        stripped = line.strip()
        if re.fullmatch(r"(Args|Arguments|Parameters):", stripped):
            inside = True
            continue
        if not inside:
            continue
        if re.fullmatch(r"[A-Z][A-Za-z ]*:", stripped):  # Returns:, Raises:, ...
            break
        m = re.match(r"(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)", stripped)
        if m:
            current = m.group(1).lstrip("*")
            out[current] = m.group(3).strip()
        elif current and stripped:
            out[current] = f"{out[current]} {stripped}".strip()
    return out


def model_parameters(fn, skip_first: bool = False) -> list[inspect.Parameter]:
    """The parameters the model fills: positional-or-keyword ones (`self` left out for a method)."""
    params = list(inspect.signature(fn).parameters.values())
    if skip_first:
        params = params[1:]
    return [p for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY)]


def tool_schema(fn, name: str | None = None, where: str | None = None, method: bool = False) -> dict:
    """The schema of `fn`; `method`: an environment's method, whose `self` is left out."""
    name = name or fn.__name__
    where = where or f"tool {name!r}"
    try:
        hints = typing.get_type_hints(fn)
    except Exception as e:  # a hint naming an undefined type
        raise ToolError(f"{where}: its type hints cannot be read ({type(e).__name__}: {e})") from e
    doc = inspect.getdoc(fn) or ""
    described = _arg_docs(doc)
    properties, required = {}, []
    for p in model_parameters(fn, skip_first=method):
        if p.name not in hints:
            raise ToolError(f"{where}: parameter {p.name!r} has no type hint; a tool's schema is made from its "
                            f"type hints (e.g. def {name}({p.name}: int) -> str)")
        prop = _json_type(hints[p.name], f"{where}: parameter {p.name!r}")
        if p.name in described:
            prop["description"] = described[p.name]
        properties[p.name] = prop
        if p.default is p.empty:
            required.append(p.name)
    description = re.split(r"\n\s*\n", doc, maxsplit=1)[0].replace("\n", " ").strip()
    params = {"type": "object", "properties": properties}
    if required:
        params["required"] = required
    return {"type": "function", "function": {"name": name, "description": description, "parameters": params}}
