"""Native tool-call formats (``agents.toolcalls``): the family each chat template writes, rendering tools and calls
through the template, parsing a turn back into OpenAI ``tool_calls``, and what ``tool_choice`` makes of a turn.

Round trips run on SmolLM2-Instruct's template as the demo model ships it and on the Hermes / Qwen2.5 fixture
(``_toolcall_util``): an assistant message with ``tool_calls`` rendered by the template is the text a model of that
family writes; parsing that text gives the same calls back."""
from __future__ import annotations

import json
import re
from typing import Any

import pytest

from _toolcall_util import CALC, TOOLS, call, hermes_template, render, smollm2_template
from kubeforge.runtime.agents.endpoint import chat as endpoint_chat
from kubeforge.runtime.agents.toolcalls import base, choice, hermes, registry, smollm2, tagged

NAMES = {"calculate", "weather"}
AUTO = choice.Choice()


def ids() -> Any:
    counter = iter(range(100))
    return lambda: f"call_{next(counter)}"


def assistant_text(rendered: str) -> str:
    """The last assistant turn's text in a ChatML rendering."""
    return rendered.rsplit("<|im_start|>assistant", 1)[1].split("<|im_end|>", 1)[0].removeprefix("\n")


# ---------------------------------------------------------------- which family a template writes


def test_each_template_finds_its_family() -> None:
    assert registry.for_template(smollm2_template()) is smollm2.FORMAT
    assert registry.for_template(smollm2.TEMPLATE) is smollm2.FORMAT
    assert registry.for_template(hermes_template()) is hermes.FORMAT
    assert registry.for_template(endpoint_chat.PLAIN_TEMPLATE) is None      # the tiny model: no tool format
    chatml = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    assert registry.for_template(chatml) is None and registry.for_template(None) is None


def test_the_shipped_smollm2_template_ignores_tools() -> None:
    """Why the SmolLM2 format brings its own template: the shipped one renders the same text with or without."""
    messages = [{"role": "user", "content": "What is 12 * 34?"}]
    assert render(smollm2_template(), messages, tools=TOOLS, generation_prompt=True) == \
        render(smollm2_template(), messages, generation_prompt=True)


CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
    [{"role": "system", "content": "S"}, {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("generation_prompt", [True, False])
def test_smollm2_tool_template_is_the_shipped_one_without_tools(messages: list[dict[str, Any]],
                                                                generation_prompt: bool) -> None:
    assert render(smollm2.TEMPLATE, messages, generation_prompt=generation_prompt) == \
        render(smollm2_template(), messages, generation_prompt=generation_prompt)


def test_smollm2_tools_go_in_the_system_turn_with_the_conversations_system_message() -> None:
    text = render(smollm2.TEMPLATE, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q"}],
                  tools=TOOLS, generation_prompt=True)
    system = text.split("<|im_end|>", 1)[0]
    listed = json.loads(re.search(r"<tools>(\[.*\])</tools>", system, re.S).group(1))   # type: ignore[union-attr]
    assert listed == [t["function"] for t in TOOLS]
    assert system.endswith("\n\nBe brief.") and "named SmolLM" not in text
    assert text.endswith("<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n")


# ---------------------------------------------------------------- render -> parse round trips


FAMILIES = {"smollm2": (smollm2.FORMAT, lambda: smollm2.TEMPLATE),
            "hermes": (hermes.FORMAT, hermes_template)}


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("calls", [
    [call("a", "calculate", '{"expression": "314 * 27"}')],
    [call("a", "calculate", '{"expression": "1 + 2"}'), call("b", "weather", '{"city": "Zürich"}')],
    [call("a", "weather", "{}")],
])
def test_render_then_parse_gives_the_calls_back(family: str, calls: list[dict[str, Any]]) -> None:
    fmt, template = FAMILIES[family]
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": calls}]
    text = assistant_text(render(template(), messages, tools=TOOLS))
    r = choice.reply(fmt, text, offered=NAMES, choice=AUTO, new_id=ids())
    assert r.outcome == choice.TOOL_CALLS and r.content is None
    assert [(c.name, json.loads(c.arguments)) for c in r.calls] == \
        [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]
    assert [c.id for c in r.calls] == [f"call_{i}" for i in range(len(calls))]
    assert r.message()["tool_calls"][0]["type"] == "function" and r.finish_reason("stop") == "tool_calls"


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tool_results_come_back_as_tool_responses(family: str) -> None:
    _, template = FAMILIES[family]
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": None, "tool_calls": [call("a", "calculate", '{"expression": "1"}')]},
                {"role": "tool", "tool_call_id": "a", "content": "8478"}]
    text = render(template(), messages, tools=TOOLS, generation_prompt=True)
    assert "<|im_start|>user\n<tool_response>\n8478\n</tool_response><|im_end|>\n<|im_start|>assistant\n" in text


def test_text_before_the_calls_is_the_content() -> None:
    text = 'Let me compute.\n<tool_call>\n{"name": "calculate", "arguments": {"expression": "2*3"}}\n</tool_call>'
    r = choice.reply(hermes.FORMAT, text, offered=NAMES, choice=AUTO)
    assert r.content == "Let me compute.\n" and r.calls[0].arguments == '{"expression": "2*3"}'
    assert r.calls[0].id.startswith("call_") and len(r.calls[0].id) == 29


def test_either_payload_shape_parses_in_either_family() -> None:
    listed = '<tool_call>[{"name": "weather", "arguments": {"city": "Bern"}}]</tool_call>'
    single = '<tool_call>{"name": "weather", "parameters": "{\\"city\\": \\"Bern\\"}"}</tool_call>'
    for fmt in (smollm2.FORMAT, hermes.FORMAT):
        for text in (listed, single):
            parsed = fmt.parse(text)
            assert [(c.name, c.arguments) for c in parsed.calls] == [("weather", '{"city": "Bern"}')], text


# ---------------------------------------------------------------- malformed output, choices


@pytest.mark.parametrize("text, problem", [
    ('<tool_call>[{"name": "calculate", "arguments": {"expression": "1', "without </tool_call>"),
    ("<tool_call>[calculate(1)]</tool_call>", "not JSON"),
    ('<tool_call>[{"arguments": {}}]</tool_call>', '"name"'),
    ('<tool_call>[{"name": "calculate", "arguments": [1, 2]}]</tool_call>', "no JSON object"),
    ('<tool_call>[{"name": "calculate", "arguments": "x=1"}]</tool_call>', "no JSON object"),
    ('<tool_call>[{"name": "search", "arguments": {}}]</tool_call>', "not offered: search"),
])
def test_malformed_markup_is_content_with_its_problem(text: str, problem: str) -> None:
    r = choice.reply(smollm2.FORMAT, text, offered=NAMES, choice=AUTO)
    assert r.outcome == choice.MALFORMED and r.content == text and not r.calls and problem in r.problem
    assert "tool_calls" not in r.message() and r.finish_reason("length") == "length"


def test_one_bad_block_makes_the_whole_turn_malformed() -> None:
    text = ('<tool_call>\n{"name": "calculate", "arguments": {"expression": "1"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "calculate", "arguments": \n</tool_call>')
    assert choice.reply(hermes.FORMAT, text, offered=NAMES, choice=AUTO).outcome == choice.MALFORMED


def test_plain_text_and_an_empty_call_list_are_text() -> None:
    for text in ("8478", "<tool_call>[]</tool_call>"):
        r = choice.reply(smollm2.FORMAT, text, offered=NAMES, choice=AUTO)
        assert (r.outcome, r.content, r.calls) == (choice.TEXT, text, ())


def test_choice_none_reads_nothing() -> None:
    text = '<tool_call>[{"name": "calculate", "arguments": {"expression": "1"}}]</tool_call>'
    r = choice.reply(smollm2.FORMAT, text, offered=NAMES, choice=choice.Choice(mode=choice.NONE))
    assert (r.outcome, r.content, r.calls) == ("", text, ())


def test_required_and_named_choices_are_asked_not_forced() -> None:
    calc = '<tool_call>[{"name": "calculate", "arguments": {"expression": "1"}}]</tool_call>'
    required = choice.Choice(mode=choice.REQUIRED)
    named = choice.Choice(mode=choice.FUNCTION, name="weather")
    assert choice.reply(smollm2.FORMAT, "no call", offered=NAMES, choice=required).outcome == choice.UNMET
    assert choice.reply(smollm2.FORMAT, calc, offered=NAMES, choice=required).outcome == choice.TOOL_CALLS
    r = choice.reply(smollm2.FORMAT, calc, offered=NAMES, choice=named)
    assert (r.outcome, r.content, r.calls) == (choice.UNMET, calc, ())
    weather = '<tool_call>[{"name": "weather", "arguments": {"city": "Bern"}}]</tool_call>'
    assert choice.reply(smollm2.FORMAT, weather, offered=NAMES, choice=named).outcome == choice.TOOL_CALLS


def test_arguments_are_openai_json_text() -> None:
    assert base.arguments_json({"a": "ü"}) == '{"a": "ü"}'
    assert base.arguments_json('{"a": 1}') == '{"a": 1}'
    assert base.arguments_json("[1]") is None and base.arguments_json(3) is None
    assert base.function_schemas([CALC, {"name": "bare"}]) == [CALC["function"], {"name": "bare"}]
    assert tagged.parse("no markup").content == "no markup"
