#!/usr/bin/env python3
"""Structured output and tool calls of `damascus serve` through the real `openai` client.

Usage: python3 tools/server_structured_test.py --base-url http://127.0.0.1:8080/v1 [--api-key KEY]
       [--runs 20]
Each check runs --runs times at temperature 0.8 and every reply must parse and validate against
its JSON schema (python `jsonschema`): a Pydantic model through the client's `parse` helper,
a raw json_schema response_format, json_object, tool_choice required, a named tool, streamed
tool calls; then a tool result fed back. Exits non-zero on the first failure.
"""
import argparse
import json
import sys
import time
from typing import List, Literal

import jsonschema
import openai
from pydantic import BaseModel, Field


class Pet(BaseModel):
    kind: Literal["cat", "dog", "fish"]
    name: str = Field(max_length=12)


class Person(BaseModel):
    name: str = Field(max_length=16)
    age: int = Field(ge=0, le=120)
    pets: List[Pet] = Field(min_length=1, max_length=2)


RAW_SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "temp_c": {"type": "number"},
        "ok": {"type": "boolean"},
        "note": {"type": ["string", "null"], "maxLength": 10},
        "tags": {"type": "array", "items": {"enum": ["a\"b", "x\\y", "é"]}, "minItems": 2, "maxItems": 3},
    },
    "required": ["city", "temp_c", "ok", "note", "tags"],
    "additionalProperties": False,
}

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 16},
        "unit": {"enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city", "unit"],
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "maxLength": 12}},
    "required": ["zone"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                      "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "Current time in a time zone",
                                      "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}


T0 = time.time()


def check(name, cond, detail=""):
    if not cond:
        print(f"FAIL {name}  {detail}")
        sys.exit(1)


def validate_calls(name, calls, only=None):
    check(name + ": has tool_calls", calls, calls)
    for c in calls:
        check(name + ": type", c.type == "function", c)
        check(name + ": id", bool(c.id), c)
        fn = c.function.name
        check(name + ": known function", fn in SCHEMAS and (only is None or fn == only), fn)
        args = json.loads(c.function.arguments)
        jsonschema.validate(args, SCHEMAS[fn])


def run(base, key, runs):
    c = openai.OpenAI(base_url=base, api_key=key or "none", max_retries=0, timeout=300)
    model = c.models.list().data[0].id
    ask = [{"role": "user", "content": "Describe a person with pets as JSON."}]
    common = dict(model=model, temperature=0.8, max_tokens=160)

    # 1. Pydantic model through the client's parse helper.
    parse = getattr(getattr(c, "beta", c).chat.completions, "parse", None) or c.chat.completions.parse
    for i in range(runs):
        r = parse(messages=ask, response_format=Person, seed=i, **common)
        msg = r.choices[0].message
        check("parse: finish", r.choices[0].finish_reason == "stop", r.choices[0].finish_reason)
        check("parse: parsed", isinstance(msg.parsed, Person), msg.content)
        jsonschema.validate(json.loads(msg.content), Person.model_json_schema())
    print(f"[{time.time() - T0:6.1f}s] ok   pydantic parse x{runs}")

    # 2. A raw json_schema (escaped strings, number, nullable, enum array with minItems).
    rf = {"type": "json_schema", "json_schema": {"name": "weather", "schema": RAW_SCHEMA, "strict": True}}
    for i in range(runs):
        r = c.chat.completions.create(messages=[{"role": "user", "content": "Weather report as JSON."}],
                                      response_format=rf, seed=100 + i, **common)
        check("json_schema: finish", r.choices[0].finish_reason == "stop", r.choices[0].message.content)
        jsonschema.validate(json.loads(r.choices[0].message.content), RAW_SCHEMA)
    print(f"[{time.time() - T0:6.1f}s] ok   json_schema x{runs}")

    # 3. json_object: any object.
    for i in range(runs):
        r = c.chat.completions.create(messages=ask, response_format={"type": "json_object"},
                                      seed=200 + i, model=model, temperature=0.8, max_tokens=48)
        text = r.choices[0].message.content
        if r.choices[0].finish_reason == "stop":
            check("json_object: an object", isinstance(json.loads(text), dict), text)
        else:
            check("json_object: prefix of an object", text.lstrip().startswith("{"), text)
    print(f"[{time.time() - T0:6.1f}s] ok   json_object x{runs}")

    q = [{"role": "user", "content": "What is the weather in Paris?"}]
    # 4. tool_choice required.
    for i in range(runs):
        r = c.chat.completions.create(messages=q, tools=TOOLS, tool_choice="required", seed=300 + i, **common)
        check("required: finish", r.choices[0].finish_reason == "tool_calls", r.choices[0])
        validate_calls("required", r.choices[0].message.tool_calls)
    print(f"[{time.time() - T0:6.1f}s] ok   tool_choice required x{runs}")

    # 5. A named function.
    named = {"type": "function", "function": {"name": "get_time"}}
    for i in range(runs):
        r = c.chat.completions.create(messages=q, tools=TOOLS, tool_choice=named, seed=400 + i, **common)
        check("named: finish", r.choices[0].finish_reason == "tool_calls", r.choices[0])
        validate_calls("named", r.choices[0].message.tool_calls, only="get_time")
    print(f"[{time.time() - T0:6.1f}s] ok   named tool x{runs}")

    # 6. Streamed tool calls, accumulated from the deltas as clients do.
    for i in range(runs):
        stream = c.chat.completions.create(messages=q, tools=TOOLS, tool_choice="required", seed=500 + i,
                                           stream=True, **common)
        calls, finish = {}, None
        for ch in stream:
            if not ch.choices:
                continue
            d = ch.choices[0].delta
            for tc in d.tool_calls or []:
                e = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                if tc.id:
                    e["id"] = tc.id
                if tc.function and tc.function.name:
                    e["name"] += tc.function.name
                if tc.function and tc.function.arguments:
                    e["arguments"] += tc.function.arguments
            finish = ch.choices[0].finish_reason or finish
        check("stream: finish", finish == "tool_calls", finish)
        check("stream: calls", calls, calls)
        for e in calls.values():
            check("stream: id", bool(e["id"]), e)
            check("stream: name", e["name"] in SCHEMAS, e)
            jsonschema.validate(json.loads(e["arguments"]), SCHEMAS[e["name"]])
    print(f"[{time.time() - T0:6.1f}s] ok   streamed tool calls x{runs}")

    # 7. The tool result fed back: an assistant turn with tool_calls, then a tool message.
    r = c.chat.completions.create(messages=q, tools=TOOLS, tool_choice="required", seed=1, **common)
    call = r.choices[0].message.tool_calls[0]
    follow = q + [
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 21, "sky": "clear"})},
    ]
    r = c.chat.completions.create(messages=follow, tools=TOOLS, model=model, temperature=0, max_tokens=40)
    check("tool result: answered", r.choices[0].finish_reason in ("stop", "length", "tool_calls"), r)
    # tool_choice auto / none: a reply either way (text, or a call that validates).
    for choice in ("auto", "none"):
        r = c.chat.completions.create(messages=q, tools=TOOLS, tool_choice=choice, model=model, temperature=0,
                                      max_tokens=40)
        m = r.choices[0].message
        if m.tool_calls:
            check(f"{choice}: calls only when allowed", choice == "auto", m)
            validate_calls(choice, m.tool_calls)
        else:
            check(f"{choice}: content", m.content is not None, m)
    print("ok   tool results fed back, auto and none")

    # 8. A GBNF grammar (llama-server's field) and bad inputs.
    r = c.chat.completions.create(messages=ask, model=model, temperature=0.8, max_tokens=10,
                                  extra_body={"grammar": 'root ::= ("yes" | "no") "!"'})
    check("grammar", r.choices[0].message.content in ("yes!", "no!"), r.choices[0].message.content)
    for body, needle in [({"grammar": "root ::= foo"}, "not defined"),
                         ({"response_format": {"type": "json_schema", "json_schema": {
                             "name": "x", "schema": {"type": "string", "pattern": "^a+$"}}}}, "pattern")]:
        try:
            c.chat.completions.create(messages=ask, model=model, max_tokens=5, extra_body=body)
            check("bad request refused", False, body)
        except openai.BadRequestError as e:
            check("bad request message", needle in str(e), str(e))
    print("ok   gbnf grammar and clear errors")
    print("all structured output checks passed")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--runs", type=int, default=20)
    a = ap.parse_args()
    run(a.base_url, a.api_key, a.runs)


if __name__ == "__main__":
    main()
