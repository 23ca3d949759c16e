"""Chat prompts, the one place they are rendered: the default system prompt, a conversation's
messages, and its text or token ids where the model's answer begins.

Training renders a data set's prompt, one question or a conversation (`prompt_messages`),
generate and chat a whole conversation (`render_messages`); all go through `render_text`. With a chat template the text is the
template's; a tokenizer without one gets plain text (`plain_text`): the system prompt, then
`User: ...` and `Assistant: ...` lines, ending with `Assistant:`. So a model trained on plain
prompts is asked in the format it learned.
"""

from mlx_grpo.config.sections import DEFAULT_SYSTEM_PROMPT  # noqa: F401 (the data.system_prompt default)

ROLES = {"user": "User", "assistant": "Assistant"}
# A template_kwargs key that render_text takes out: text to add to the system message (a tool list
# for a chat template that does not show tools itself, tools/prompt.py).
SYSTEM_EXTRA = "mlx_grpo_system_extra"


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "has_chat_template", getattr(tokenizer, "chat_template", None)))


def plain_text(messages: list[dict]) -> str:
    """A conversation for a tokenizer without a chat template, open for the assistant's answer."""
    system = "".join(f"{m['content']}\n\n" for m in messages if m["role"] == "system")
    turns = "".join(f"{ROLES[m['role']]}: {m['content']}\n" for m in messages if m["role"] != "system")
    return f"{system}{turns}Assistant:"


def plain_prompt(question: str, system_prompt: str = "") -> str:
    """The prompt for one question, for a tokenizer without a chat template."""
    return plain_text(conversation(system_prompt, question))


def render_text(tokenizer, messages: list[dict], template_kwargs: dict | None = None) -> str:
    """The text of a conversation that the model continues with its answer; `template_kwargs`
    (data.chat_template_kwargs) are the chat template's extra variables."""
    kwargs = dict(template_kwargs or {})
    extra = kwargs.pop(SYSTEM_EXTRA, "")
    if extra:
        messages = with_system_text(messages, extra)
    if not has_chat_template(tokenizer):
        return plain_text(messages)
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)


def with_system_text(messages: list[dict], text: str) -> list[dict]:
    """The messages with `text` after the system message's content (or as the system message)."""
    if messages and messages[0]["role"] == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def render_prompt(tokenizer, question: str, system_prompt: str = "", template_kwargs: dict | None = None) -> str:
    """The text of a one-question chat (see `conversation`)."""
    return render_text(tokenizer, conversation(system_prompt, question), template_kwargs)


def render_messages(tokenizer, messages: list[dict], template_kwargs: dict | None = None) -> list[int]:
    """Token ids of a conversation, ending where the assistant's next answer begins."""
    return tokenizer.encode(render_text(tokenizer, messages, template_kwargs), add_special_tokens=False)


def prompt_messages(prompt: str | list[dict], system_prompt: str = "") -> list[dict]:
    """A data set's prompt as messages, in either of TRL's formats: text, one question under the
    system prompt, or conversational, a list of {role, content} messages, whose own system
    message replaces the system prompt."""
    if isinstance(prompt, str):
        return conversation(system_prompt, prompt)
    if any(m["role"] == "system" for m in prompt) or not system_prompt:
        return list(prompt)
    return [{"role": "system", "content": system_prompt}, *prompt]


def conversation(system_prompt: str, prompt: str) -> list[dict]:
    """The messages of a one-question chat: the system prompt (when there is one), then the question."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [{"role": "user", "content": prompt}]
