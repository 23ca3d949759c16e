"""The chat template a saved model folder carries, so other tools prompt it as training did.

mlx-grpo puts the run's `data.system_prompt` in front of every question; `mlx_lm.generate`,
`mlx_lm.server` and anything else reading the folder apply its chat template to the user's
messages only. A full checkpoint and an export therefore get a template that opens with the
system prompt when the conversation has no system message of its own (a conversation that
has one is rendered as before); a folder without a template gets training's plain text as one.
The run's `data.chat_template_kwargs` are set in the template too (e.g. `enable_thinking = false`).
Plain `mlx-grpo generate`, which sends the system prompt
itself, sees the same tokens. A LoRA adapter folder cannot carry a template (mlx-lm takes
the tokenizer from the base): give the system prompt to those tools yourself.
"""

import json
from pathlib import Path

TEMPLATE_FILE = "chat_template.jinja"  # transformers 5 saves and reads the template here
TOKENIZER_CONFIG = "tokenizer_config.json"  # ... older folders keep it under "chat_template"
_BEGIN = "{#- mlx-grpo: the run's system prompt when the chat has none -#}\n"
_END = "{#- mlx-grpo: end -#}\n"


# data/chat.plain_text as a template: the system prompt, `User:`/`Assistant:` lines, `Assistant:`.
PLAIN_TEMPLATE = (
    "{%- for m in messages if m['role'] == 'system' %}{{ m['content'] + '\\n\\n' }}{%- endfor %}"
    "{%- for m in messages if m['role'] != 'system' %}"
    "{{ ('User' if m['role'] == 'user' else 'Assistant') + ': ' + m['content'] + '\\n' }}{%- endfor %}"
    "{{- 'Assistant:' if add_generation_prompt else '' }}"
)


def with_system_prompt(template: str, system_prompt: str, template_kwargs: dict | None = None) -> str:
    """`template`, opening with `system_prompt` as a system message when the chat has none, and
    with the variables of `template_kwargs` (data.chat_template_kwargs) set to the run's values.
    Set, not defaulted: mlx-lm passes `enable_thinking` itself on every call."""
    if template.startswith(_BEGIN) and _END in template:  # written by an earlier save: replace it
        template = template.split(_END, 1)[1]
    # A JSON string literal (or number, true/false) is a valid Jinja one, whatever it holds.
    prefix = "".join(f"{{%- set {k} = {json.dumps(v)} -%}}\n" for k, v in (template_kwargs or {}).items())
    if system_prompt:
        prefix += (
            "{%- if not (messages and messages[0]['role'] == 'system') -%}"
            f"{{%- set messages = [{{'role': 'system', 'content': {json.dumps(system_prompt)}}}] + messages -%}}"
            "{%- endif -%}\n"
        )
    return _BEGIN + prefix + _END + template if prefix else template


def write_system_prompt(folder, system_prompt: str, template_kwargs: dict | None = None) -> None:
    """Rewrite the chat template saved in `folder` (see the module docstring); a folder without
    one gets training's plain text (data/chat.plain_text) as its template."""
    folder = Path(folder)
    jinja = folder / TEMPLATE_FILE
    if jinja.is_file():
        jinja.write_text(with_system_prompt(jinja.read_text(), system_prompt, template_kwargs))
        return
    config_path = folder / TOKENIZER_CONFIG
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    if not isinstance(config.get("chat_template"), str):
        # No template: training used plain text, which mlx-lm would not; give it that text.
        jinja.write_text(with_system_prompt(PLAIN_TEMPLATE, system_prompt, template_kwargs))
        return
    config["chat_template"] = with_system_prompt(config["chat_template"], system_prompt, template_kwargs)
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
