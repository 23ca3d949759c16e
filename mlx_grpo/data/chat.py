"""Chat prompts, the one place they are rendered: the default system prompt, a conversation's
messages, and its text or token ids where the model's answer begins.

Training renders one question (`render_prompt`); generate and chat render a whole conversation
(`render_messages`). With a chat template both are the template's text. A tokenizer without one
gets plain text: training's `User: ...\nAssistant:` (`plain_prompt`), while generate and chat
join the messages' contents as they are, as before (a base model continues raw text).
"""

from mlx_grpo.config.sections import DEFAULT_SYSTEM_PROMPT  # noqa: F401 (the data.system_prompt default)


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "has_chat_template", getattr(tokenizer, "chat_template", None)))


def plain_prompt(question: str, system_prompt: str = "") -> str:
    """The prompt for a tokenizer without a chat template."""
    return (f"{system_prompt}\n\n" if system_prompt else "") + f"User: {question}\nAssistant:"


def render_prompt(tokenizer, question: str, system_prompt: str = "") -> str:
    """The chat-template text that the model continues with its answer (plain text without one)."""
    if not has_chat_template(tokenizer):
        return plain_prompt(question, system_prompt)
    return tokenizer.apply_chat_template(conversation(system_prompt, question), add_generation_prompt=True,
                                         tokenize=False)


def render_messages(tokenizer, messages: list[dict]) -> list[int]:
    """Token ids of a conversation, ending where the assistant's next answer begins."""
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:  # a base model: no roles to mark, the text is the prompt
        text = "\n".join(m["content"] for m in messages)
    return tokenizer.encode(text, add_special_tokens=False)


def conversation(system_prompt: str, prompt: str) -> list[dict]:
    """The messages of a one-question chat: the system prompt (when there is one), then the question."""
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [{"role": "user", "content": prompt}]
