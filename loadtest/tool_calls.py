"""Function calling in the cascade Thinker: does the model call when it should, and right?

Twenty typed prompts against three tools (weather, timer, message); twelve need a tool, eight
do not. Each prompt runs through the real `ThinkerEngine` twice: with tool_choice auto (does
the model decide right? which tool? what arguments?) and, for the prompts that need a tool,
with tool_choice required (given that it calls, does it pick the right tool and fill the
arguments right?). Printed per model:

- decision accuracy under auto (called when needed, answered when not), and the accuracy that
  other thresholds on log P(call marker) would give (the decision's only knob);
- right tool, argument validity (JSON Schema, with `jsonschema`) and argument correctness
  (the expected values appear), for auto and for required;
- latency from the request to its first ToolCallDelta (median, p90) and the model's load time.

Each model runs once per weight format in `--weights` (the Thinker's `weights` engine
argument: fp32, or int8 matrices, `int8_weights.py`).

    .venv/bin/python -m loadtest.tool_calls [--model PACKAGE:FILE ...] [--threshold -7]
        [--weights fp32,int8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import numpy as np
import torch

from pipeline.engines.cascade.smollm import DEFAULT_FILE, DEFAULT_PACKAGE
from pipeline.engines.cascade.thinker import ThinkerEngine
from pipeline.engines.cascade.tool_prompt import CALL_OPEN
from pipeline.types import ErrorChunk, PipelineRequest, TextDelta, ToolCallDelta, ToolSpec

WEATHER = ToolSpec(
    "get_weather",
    "Get the current weather in a city",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "The city, e.g. Paris"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city"],
        "additionalProperties": False,
    },
)
TIMER = ToolSpec(
    "set_timer",
    "Start a countdown timer",
    {
        "type": "object",
        "properties": {
            "minutes": {"type": "integer", "description": "How long, in minutes"},
            "label": {"type": "string"},
        },
        "required": ["minutes"],
        "additionalProperties": False,
    },
)
MESSAGE = ToolSpec(
    "send_message",
    "Send a text message to a contact",
    {
        "type": "object",
        "properties": {
            "to": {"type": "string", "description": "The contact's name"},
            "text": {"type": "string"},
        },
        "required": ["to", "text"],
        "additionalProperties": False,
    },
)
TOOLS = (WEATHER, TIMER, MESSAGE)


@dataclass(frozen=True)
class Case:
    prompt: str
    tool: str | None  # the tool it needs, None: answer in words
    expect: dict[str, Any] = field(default_factory=dict)  # argument -> value (strings: contained)


CASES = [
    Case("What is the weather in Paris?", "get_weather", {"city": "Paris"}),
    Case("Is it raining in London right now?", "get_weather", {"city": "London"}),
    Case("How hot is it in Tokyo today, in fahrenheit?", "get_weather", {"city": "Tokyo"}),
    Case("Do I need an umbrella in Berlin?", "get_weather", {"city": "Berlin"}),
    Case("Set a timer for 5 minutes.", "set_timer", {"minutes": 5}),
    Case("Start a ten minute timer for the pasta.", "set_timer", {"minutes": 10}),
    Case("Remind me in 30 minutes with a timer.", "set_timer", {"minutes": 30}),
    Case("Time my tea for 3 minutes please.", "set_timer", {"minutes": 3}),
    Case("Send a message to Alice saying I am late.", "send_message", {"to": "Alice"}),
    Case("Text Bob that dinner is ready.", "send_message", {"to": "Bob"}),
    Case("Tell Maria by message that the meeting moved.", "send_message", {"to": "Maria"}),
    Case("What's the temperature in Madrid?", "get_weather", {"city": "Madrid"}),
    Case("What is the capital of France?", None),
    Case("Tell me a joke.", None),
    Case("How many legs does a spider have?", None),
    Case("Hello, how are you?", None),
    Case("Who wrote Romeo and Juliet?", None),
    Case("What is two plus two?", None),
    Case("Can you recommend a good book?", None),
    Case("Thank you, that's all.", None),
]


@dataclass
class Outcome:
    called: str | None = None
    arguments: str = ""
    first_call_s: float | None = None
    text: str = ""
    error: str = ""


async def run(engine: ThinkerEngine, case: Case, choice: str) -> Outcome:
    request = PipelineRequest(
        request_id="eval", audio=np.zeros(0, dtype=np.int16), text=case.prompt,
        tools=TOOLS, tool_choice=choice,
    )  # fmt: skip
    out = Outcome()
    started = time.perf_counter()
    async for chunk in engine.generate("eval", request):
        if isinstance(chunk, ToolCallDelta):
            if out.first_call_s is None:
                out.first_call_s = time.perf_counter() - started
            out.called = chunk.name
            out.arguments += chunk.arguments
        elif isinstance(chunk, TextDelta) and chunk.kind == "output":
            out.text += chunk.text
        elif isinstance(chunk, ErrorChunk):
            out.error = chunk.message
    return out


def marker_logprob(engine: ThinkerEngine, case: Case) -> float:
    """What the auto decision compares with the threshold: log P(first marker token)."""
    lm = engine._lm  # noqa: SLF001 (the engine's own model, to score without generating)
    assert lm is not None
    request = PipelineRequest("eval", np.zeros(0, dtype=np.int16), text=case.prompt, tools=TOOLS)
    ids = lm.tokenizer(engine.chat_prompt(request, case.prompt), return_tensors="pt")
    marker = lm.tokenizer(CALL_OPEN, add_special_tokens=False).input_ids[0]
    with torch.inference_mode():
        logits = lm.model(input_ids=ids.input_ids).logits[0, -1]
    return float(torch.log_softmax(logits.float(), dim=-1)[marker])


def valid(tool: str, arguments: str) -> bool:
    spec = {t.name: t for t in TOOLS}[tool]
    try:
        jsonschema.validate(json.loads(arguments), spec.parameters)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def correct(case: Case, arguments: str) -> bool:
    try:
        got = json.loads(arguments)
    except ValueError:
        return False
    for key, want in case.expect.items():
        value = got.get(key)
        if isinstance(want, str) and not (isinstance(value, str) and want.lower() in value.lower()):
            return False
        if not isinstance(want, str) and value != want:
            return False
    return True


def pct(part: int, whole: int) -> str:
    return f"{part}/{whole} ({100 * part / max(1, whole):.0f}%)"


def latency(outcomes: list[Outcome]) -> str:
    times = sorted(o.first_call_s for o in outcomes if o.first_call_s is not None)
    if not times:
        return "-"
    p90 = times[min(len(times) - 1, int(0.9 * len(times)))]
    return f"median {statistics.median(times):.2f} s, p90 {p90:.2f} s (n={len(times)})"


def report_calls(label: str, cases: list[Case], outcomes: list[Outcome]) -> None:
    called = [(c, o) for c, o in zip(cases, outcomes, strict=True) if o.called]
    needed = [(c, o) for c, o in called if c.tool]
    right = [(c, o) for c, o in needed if o.called == c.tool]
    valid_n = sum(valid(o.called or "", o.arguments) for _, o in called)
    correct_n = sum(correct(c, o.arguments) for c, o in right)
    print(
        f"  {label}: right tool {pct(len(right), len(needed))} of calls that a tool was needed "
        f"for; arguments valid {pct(valid_n, len(called))} of all calls, "
        f"correct {pct(correct_n, len(right))} of right-tool calls"
    )
    print(f"  {label}: first ToolCallDelta {latency([o for _, o in called])}")


async def evaluate(
    package: str, filename: str, threshold: float | None, verbose: bool, weights: str = "fp32"
) -> None:
    engine = ThinkerEngine(
        model_package=package, model_file=filename, call_threshold=threshold, weights=weights
    )
    started = time.perf_counter()
    await engine.start()
    took = time.perf_counter() - started
    threshold = engine.call_threshold
    print(f"\n== {package}:{filename}, {weights} weights (started in {took:.1f} s)")
    try:
        needed = [c for c in CASES if c.tool]
        auto = [await run(engine, c, "auto") for c in CASES]
        required = [await run(engine, c, "required") for c in needed]
        scores = [marker_logprob(engine, c) for c in CASES]
    finally:
        await engine.close()
    decided = sum(
        (o.called is not None) == (c.tool is not None) for c, o in zip(CASES, auto, strict=True)
    )  # noqa: E501
    print(
        f"  auto: decision accuracy {pct(decided, len(CASES))} at threshold {threshold}", end="; "
    )
    print("by threshold:", ", ".join(
        f"{t:g}: {sum((s >= t) == (c.tool is not None) for c, s in zip(CASES, scores, strict=True))}/{len(CASES)}"  # noqa: E501
        for t in np.arange(-10.0, -3.0, 0.5)
    ))  # fmt: skip
    report_calls("auto", CASES, auto)
    report_calls("required", needed, required)
    errors = [o.error for o in auto + required if o.error]
    print(f"  errors: {len(errors)} {errors[:2]}")
    if verbose:
        for case, out, score in zip(CASES, auto, scores, strict=True):
            what = f"{out.called}({out.arguments})" if out.called else repr(out.text[:50])
            print(f"    {score:6.2f} {case.prompt!r} -> {what}")
        for case, out in zip(needed, required, strict=True):
            print(f"    required {case.prompt!r} -> {out.called}({out.arguments})")


def main() -> None:
    parser = argparse.ArgumentParser(description="function calling in the cascade Thinker")
    parser.add_argument(
        "--model", action="append", default=[], help="PACKAGE:FILE (default: SmolLM2-135M)"
    )
    parser.add_argument(
        "--threshold", type=float, help="call threshold (default: the weight format's)"
    )
    parser.add_argument("--weights", default="fp32", help="weight formats, e.g. fp32,int8")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for spec in args.model or [f"{DEFAULT_PACKAGE}:{DEFAULT_FILE}"]:
        package, _, filename = spec.partition(":")
        for weights in args.weights.split(","):
            asyncio.run(evaluate(package, filename, args.threshold, args.verbose, weights))


if __name__ == "__main__":
    main()
