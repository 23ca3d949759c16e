"""Where the model is shown its tools' schemas (tools.schemas_in).

Qwen's and Llama's chat templates list the tools given as `tools=`; many others (Gemma 3, SmolLM2,
a base model's, a plain-text prompt) drop them without a word, and a model that is never shown
its tools cannot learn to call them. "auto" renders a probe with and without the schemas: where
the template shows them it gets `tools=`, else a tool list in the call format the rollout parses
is added to the system message. Pure Python, no MLX.
"""

import json

from mlx_grpo.data.chat import SYSTEM_EXTRA, has_chat_template
from mlx_grpo.tools.calls import ToolFormat


def template_shows_tools(tokenizer, schemas: list[dict], kwargs: dict) -> bool:
    """Whether the chat template renders something of `tools=` (a template that raises on it does not)."""
    if not has_chat_template(tokenizer):
        return False
    probe = [{"role": "user", "content": "?"}]
    try:
        bare = tokenizer.apply_chat_template(probe, add_generation_prompt=True, tokenize=False, **kwargs)
        shown = tokenizer.apply_chat_template(probe, add_generation_prompt=True, tokenize=False,
                                              **{**kwargs, "tools": schemas})
    except Exception:  # a template's own error (jinja, a role it refuses): it cannot show tools
        return False
    return shown != bare


def tool_list(schemas: list[dict], fmt: ToolFormat) -> str:
    """The tools as the system message lists them, with how to call one."""
    listed = "\n".join(json.dumps(s) for s in schemas)
    return (f"Tools you may call, as JSON schemas:\n<tools>\n{listed}\n</tools>\n"
            f'To call one, write {fmt.start}{{"name": ..., "arguments": {{...}}}}{fmt.end}; '
            "its result comes back in the next message.")


def schemas_placement(tokenizer, schemas: list[dict], kwargs: dict, schemas_in: str) -> str:
    """"template", "system" or "none": tools.schemas_in with "auto" decided for this tokenizer."""
    if schemas_in != "auto":
        return schemas_in
    return "template" if template_shows_tools(tokenizer, schemas, kwargs) else "system"


def template_kwargs(kwargs: dict, toolset, tokenizer=None, schemas_in: str = "template") -> dict:
    """data.chat_template_kwargs, with the tools' schemas where tools.schemas_in puts them."""
    if not toolset:
        return dict(kwargs)
    where = schemas_placement(tokenizer, toolset.schemas, kwargs, schemas_in)
    if where == "template":
        return {**kwargs, "tools": toolset.schemas}
    if where == "system":
        return {**kwargs, SYSTEM_EXTRA: tool_list(toolset.schemas, ToolFormat.of(tokenizer))}
    return dict(kwargs)
