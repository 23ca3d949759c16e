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
