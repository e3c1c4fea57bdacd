"""Native tool calls in the episode runner (``spec.environment.toolFormat: Native``, ``agents.native``): the
Calculator's tool rendered by the model's chat template, each policy turn read in the model's tool-call format, the
results fed back as ``tool`` messages, and the token record exactly what the engine sampled.

The engine is ``test_agents_runner``'s scripted one (one byte token per character, the tiny tokenizer's); the
tokenizer carries SmolLM2's template as it ships or the Hermes / Qwen2.5 fixture (``_toolcall_util``). The real
vLLM engine and SmolLM2 run the same runner in tests/runtime/test_multiturn_learning.py (toolFormat Tags).
"""
from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest

from _toolcall_util import hermes_template, smollm2_template, tokenizer
from kubeforge.api import load, rljob
from kubeforge.runtime import config, types
from kubeforge.runtime.agents import native, protocol, runner
from kubeforge.runtime.agents.envs import calculator, registry
from kubeforge.runtime.agents.hosts import host, workers
from test_agents_runner import Script

SMOL = '<tool_call>[{"name": "calculate", "arguments": {"expression": "314 * 27"}}]</tool_call>'
HERMES_TWO = ('<tool_call>\n{"name": "calculate", "arguments": {"expression": "314 * 27"}}\n</tool_call>\n'
              '<tool_call>\n{"name": "calculate", "arguments": {"expression": "1 / 0"}}\n</tool_call>')
PROMPT = types.Prompt(index=0, text="What is 314 * 27? Answer with the number only.", answer="8478")
NATIVE = rljob.EnvironmentSpec.model_validate({"type": "Calculator", "maxTurns": 3, "toolFormat": "Native"})


def sampler(tok: Any, turns: list[str | list[str]], *, env_host: Any = None,
            spec: rljob.EnvironmentSpec = NATIVE) -> tuple[runner.EpisodeSampler, Script]:
    eng = Script(turns, tok)
    h = env_host or host.InProcessHost(registry.kind(spec).make(spec), bounds=host.Bounds(timeout_s=5.0))
    algo = rljob.AlgorithmSpec.model_validate({"groupSize": 2, "maxNewTokens": 256})
    return runner.EpisodeSampler(engine=eng, host=h, spec=spec, algorithm=algo, chat_template=True, seed=0,
                                 max_context=4096), eng


def test_smollm2_calls_the_calculator_natively_and_answers() -> None:
    tok = tokenizer(smollm2_template())
    s, eng = sampler(tok, [SMOL, "8478"])
    (group,) = s.sample([PROMPT])
    assert s.stop == ("</tool_call>",)
    stats, c = group.episode_stats[0], group.completions[0]    # type: ignore[index]
    assert (stats.turns, stats.tool_calls, stats.tool_errors, stats.env_reward) == (2, 1, 0, 1.0)
    prompt = tok.decode(group.prompt_token_ids.tolist())
    # the tools and the worked example are rendered in SmolLM2's format; the system message follows the tools
    assert '<tools>[{"name": "calculate"' in prompt and calculator.NATIVE_SYSTEM in prompt
    assert "<|im_start|>assistant\n" + SMOL + "<|im_end|>\n<|im_start|>user\n<tool_response>\n8478\n" in prompt
    # the record: the policy's ids exactly as sampled, the tool's answer as the template renders it, masked
    (a, b), (c2, d) = group.policy_spans[0]                    # type: ignore[index]
    ids = c.token_ids.tolist()
    assert ids[a:b] == tok.encode(SMOL, add_special_tokens=False) and ids[c2:d] == tok.encode("8478")
    assert tok.decode(ids[b:c2]) == ("<|im_end|>\n<|im_start|>user\n<tool_response>\n8478\n</tool_response>"
                                     "<|im_end|>\n<|im_start|>assistant\n")
    assert set(c.logprobs.tolist()[b:c2]) == {0.0} and eng.calls == [2, 2]


def test_hermes_two_calls_get_two_answers_in_one_turn() -> None:
    tok = tokenizer(hermes_template())
    s, _ = sampler(tok, [HERMES_TWO, "8478"])
    (group,) = s.sample([PROMPT])
    stats = group.episode_stats[0]                              # type: ignore[index]
    assert (stats.tool_calls, stats.tool_errors, stats.env_reward) == (2, 1, 1.0)
    text = group.completions[0].text
    assert ("<tool_response>\n8478\n</tool_response>\n<tool_response>\nerror: division by zero\n</tool_response>"
            "<|im_end|>") in text
    assert '"name": "calculate"' in tok.decode(group.prompt_token_ids.tolist())


def test_malformed_markup_is_a_tool_error_and_the_turn_a_final_answer() -> None:
    s, _ = sampler(tokenizer(smollm2_template()), ['<tool_call>[{"name": "calculate", "arguments": {"expr'])
    (group,) = s.sample([PROMPT])
    stats = group.episode_stats[0]                              # type: ignore[index]
    assert (stats.turns, stats.tool_calls, stats.tool_errors, stats.env_reward) == (1, 0, 1, 0.0)


def test_native_environments_run_in_worker_processes() -> None:
    """(role, content) messages on the host's pipe: the worked call and the tool answers cross it unchanged."""
    h = workers.SubprocessHost(NATIVE, workers=1)
    try:
        s, _ = sampler(tokenizer(hermes_template()), [HERMES_TWO.split("\n<tool_call>", 1)[0], "8478"], env_host=h)
        (group,) = s.sample([PROMPT])
    finally:
        h.shutdown()
    stats = group.episode_stats[0]                              # type: ignore[index]
    assert (stats.tool_calls, stats.tool_errors, stats.env_reward) == (1, 0, 1.0)


@pytest.mark.parametrize("template, chat_template, why", [
    (None, True, "writes no tool-call format"),
    ("{% for m in messages %}{{ m['content'] }}{% endfor %}", True, "writes no tool-call format"),
    (None, False, "spec.task.chatTemplate is false"),
])
def test_a_model_without_a_tool_format_is_refused_naming_the_field(template: str | None, chat_template: bool,
                                                                   why: str) -> None:
    tok = tokenizer(template if chat_template else smollm2_template())
    with pytest.raises(native.NoToolFormat, match=f"spec.environment.toolFormat: .*{why}"):
        runner.EpisodeSampler(engine=Script([], tok), host=host.InProcessHost(calculator.Calculator,
                                                                              bounds=host.Bounds()),
                              spec=NATIVE, algorithm=rljob.AlgorithmSpec(), chat_template=chat_template, seed=0,
                              max_context=512)


def test_the_calculators_native_step() -> None:
    env = calculator.Calculator(native=True)
    start = env.reset(PROMPT)
    assert start[2]["content"].startswith(protocol.TOOL_CALLS_MARK) and start[3]["role"] == "tool"

    def turn(*calls: tuple[str, dict[str, Any]]) -> str:
        return json.dumps({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for i, (n, a) in enumerate(calls)]})

    r = env.step(turn(("calculate", {"expression": "2 ** 10"}), ("calculate", {"x": "1"}), ("search", {})))
    assert [m["content"] for m in r.observation] == ["1024", 'error: call calculate with {"expression": "..."}',
                                                     'error: call calculate with {"expression": "..."}']
    assert (r.done, r.tool_calls, r.tool_errors) == (False, 3, 2)
    assert env.step(json.dumps({"role": "assistant", "content": "It is 8478."})).reward == 1.0


def test_native_expands_worked_calls_and_names_each_answer() -> None:
    n = native.Native(tokenizer=tokenizer(hermes_template()), tools=calculator.TOOLS, chat_template=True)
    shown = n.start([{"role": "user", "content": "q"},
                     protocol.assistant_tool_calls([("calculate", {"expression": "1"}), ("calculate", {"e": 2})]),
                     {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}])
    calls = shown[1]["tool_calls"]
    assert [json.loads(c["function"]["arguments"]) for c in calls] == [{"expression": "1"}, {"e": 2}]
    assert [m.get("tool_call_id") for m in shown[2:]] == [calls[0]["id"], calls[1]["id"]]


def test_a_path_models_template_is_checked_before_any_start(tmp_path: pathlib.Path) -> None:
    job = {"apiVersion": "kubeforge.dev/v1alpha1", "kind": "RLJob", "metadata": {"name": "native"},
           "spec": {"model": {"path": str(tmp_path)}, "task": {"arithmetic": {}},
                    "verifiers": [{"name": "a", "type": "ExactAnswer"}],
                    "environment": {"type": "Calculator", "toolFormat": "Native"}}}
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages[0]['content'] }}"}))
    problems = config.local_problems(load.parse(job).spec)
    assert len(problems) == 1 and problems[0].startswith("spec.environment.toolFormat: Invalid value: 'Native'")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [
        {"name": "default", "template": hermes_template()}]}))
    assert config.local_problems(load.parse(job).spec) == []
    (tmp_path / "chat_template.jinja").write_text(smollm2_template())     # transformers reads this one first
    assert config.local_problems(load.parse(job).spec) == []
