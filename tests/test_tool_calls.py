"""Reading tool calls out of a turn's text, and the text a tool result appends after it."""

import jinja2
import mlx_lm.tool_parsers.pythonic as pythonic

from mlx_grpo.tools.calls import ToolFormat, tool_turn_text

HERMES = ToolFormat.of(object())  # a tokenizer without a parser of its own: Qwen/Hermes JSON


def test_hermes_calls_in_order_with_errors_for_the_unreadable():
    text = ('I will add. <tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>\n'
            '<tool_call>{"name": "mul", "arguments": "{\\"x\\": 3}"}</tool_call>'
            '<tool_call>{"arguments": {}}</tool_call><tool_call>{"name": "add", "arguments": {"a": 1')
    calls = HERMES.calls(text)
    assert calls[:2] == [{"name": "add", "arguments": {"a": 1, "b": 2}}, {"name": "mul", "arguments": {"x": 3}}]
    assert calls[2] == 'malformed tool call: expected an object with a "name", got {"arguments": {}}'
    assert calls[3] == "malformed tool call: no </tool_call> after <tool_call>"
    assert HERMES.calls("The answer is 3.") == []


def test_a_tokenizer_with_mlx_lm_tool_parser_uses_it():
    class Tok:
        has_tool_calling = True
        tool_call_start, tool_call_end = pythonic.tool_call_start, pythonic.tool_call_end
        tool_parser = staticmethod(pythonic.parse_tool_call)

    fmt = ToolFormat.of(Tok())
    assert fmt.calls("<|tool_call_start|>[add(a=1, b=2)]<|tool_call_end|>") == [
        {"name": "add", "arguments": {"a": 1, "b": 2}}]


# Qwen2.5's template, its tool-message part: consecutive tool messages share one user turn.
QWEN_TOOLS = (
    "{%- for m in messages %}"
    "{%- if m.role != 'tool' %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
    "{%- else %}{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}{%- endif %}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


class QwenLike:
    chat_template = QWEN_TOOLS
    eos_token = "<|im_end|>"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, **kwargs):
        return jinja2.Template(QWEN_TOOLS).render(messages=messages, add_generation_prompt=add_generation_prompt)


def test_tool_results_follow_the_turn_as_the_template_renders_them():
    # the model's EOS (<|im_end|>) was sampled and is scored: the appended text starts after it
    assert tool_turn_text(QwenLike(), [("add", "5"), ("add", "7")], ended_with_eos=True) == (
        "\n<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n7\n</tool_response>"
        "<|im_end|>\n<|im_start|>assistant\n")
    # a turn cut before its EOS gets the turn's end from the environment
    assert tool_turn_text(QwenLike(), [("add", "5")], ended_with_eos=False).startswith("<|im_end|>\n<|im_start|>user")

    class Plain:  # no chat template: the plain User:/Assistant: format
        chat_template = None

    assert tool_turn_text(Plain(), [("add", "5")], ended_with_eos=True) == "\nTool: 5\nAssistant:"


class Templated:
    """A tokenizer whose chat template is `source` (jinja), rendered with the template's variables."""

    eos_token = "<|im_end|>"

    def __init__(self, source: str):
        self.chat_template = source

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, **kwargs):
        env = jinja2.Environment()
        env.globals["raise_exception"] = lambda text: (_ for _ in ()).throw(jinja2.TemplateError(text))
        return env.from_string(self.chat_template).render(messages=messages,
                                                          add_generation_prompt=add_generation_prompt, **kwargs)


CHATML = ("{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
          "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
WITH_TOOLS = "{%- if tools %}{{- '<|im_start|>system\\nTOOLS ' + tools|length|string + '<|im_end|>\\n' }}{%- endif %}" + CHATML
NO_TOOL_ROLE = ("{%- for m in messages %}{%- if m.role not in ['system', 'user', 'assistant'] %}"
                "{{- raise_exception('Conversation roles must be user or assistant') }}{%- endif %}{%- endfor %}" + CHATML)


def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


def _prompt(tokenizer, schemas_in, system="Be brief."):
    from mlx_grpo.data.chat import conversation, render_text
    from mlx_grpo.tools import Toolset
    from mlx_grpo.tools.prompt import template_kwargs

    kwargs = template_kwargs({}, Toolset([add]), tokenizer, schemas_in)
    return render_text(tokenizer, conversation(system, "What is 2 + 3?"), kwargs)


def test_auto_shows_the_schemas_through_a_template_that_lists_tools_else_in_the_system_message():
    shows, ignores = Templated(WITH_TOOLS), Templated(CHATML)
    assert _prompt(shows, "auto") == _prompt(shows, "template") and _prompt(shows, "auto").startswith(
        "<|im_start|>system\nTOOLS 1<|im_end|>\n<|im_start|>system\nBe brief.<|im_end|>")
    listed = _prompt(ignores, "auto")  # the template drops tools=: the list joins the system message
    assert listed == _prompt(ignores, "system") != _prompt(ignores, "template") == _prompt(ignores, "none")
    system = listed.split("<|im_end|>")[0]
    assert system.startswith("<|im_start|>system\nBe brief.\n\nTools you may call, as JSON schemas:\n<tools>\n")
    assert '{"type": "function", "function": {"name": "add"' in system
    assert '<tool_call>{"name": ..., "arguments": {...}}</tool_call>' in system
    no_system = _prompt(ignores, "auto", system="")
    assert no_system.startswith("<|im_start|>system\nTools you may call") and "<|im_start|>user\nWhat is 2 + 3?" in no_system


def test_a_template_without_a_tool_role_gets_the_results_as_a_user_turn():
    text = tool_turn_text(Templated(NO_TOOL_ROLE), [("add", "5"), ("add", "7")], ended_with_eos=True)
    assert text == ('\n<|im_start|>user\n<tool_response name="add">\n5\n</tool_response>\n'
                    '<tool_response name="add">\n7\n</tool_response><|im_end|>\n<|im_start|>assistant\n')
    assert tool_turn_text(Templated(CHATML), [("add", "5")], ended_with_eos=True) == (
        "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n")  # a template with a tool role keeps it
