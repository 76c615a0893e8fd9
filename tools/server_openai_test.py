#!/usr/bin/env python3
"""Checks `damascus serve` with the real `openai` Python client (pip install openai).

Usage: python3 tools/server_openai_test.py [--base-url http://127.0.0.1:8080/v1] [--api-key KEY]
       python3 tools/server_openai_test.py --spawn target/release/damascus [-m MODEL]
With --spawn it starts the server on a free loopback port itself and stops it at the end.
Covers: models (list, retrieve), chat, streamed chat (+ include_usage), completions, stop
strings, seed reproducibility, usage counts, greedy parity between whole and streamed replies,
logit_bias, n > 1, lists of prompts, unsupported parameters, error statuses.
Exits non-zero on the first failure.
"""
import argparse
import json
import socket
import subprocess
import sys
import time
import urllib.request

import openai


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_health(base, timeout=120):
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            with urllib.request.urlopen(base.rsplit("/v1", 1)[0] + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            time.sleep(0.3)
    raise SystemExit("server did not come up")


def check(name, cond, detail=""):
    print(("ok   " if cond else "FAIL ") + name + (f"  {detail}" if detail else ""))
    if not cond:
        raise SystemExit(1)


def run(base, key):
    c = openai.OpenAI(base_url=base, api_key=key or "none", max_retries=0, timeout=300)
    models = c.models.list().data
    check("models.list", len(models) == 1, models[0].id)
    model = models[0].id
    msgs = [{"role": "user", "content": "What is the capital of France?"}]

    r = c.chat.completions.create(model=model, messages=msgs, max_tokens=12, temperature=0)
    text = r.choices[0].message.content
    check("chat", bool(text), repr(text))
    u = r.usage
    check("chat usage", u.total_tokens == u.prompt_tokens + u.completion_tokens
          and 1 <= u.completion_tokens <= 12, str(u))

    # The streamed request is compared with a fresh whole request; `cache_prompt: False` (a
    # llama.cpp server option) makes both evaluate the whole prompt, so the comparison is about
    # streaming, not about which slot's cached prefix each reused (a cached prefix plus a short
    # rest rounds differently from one whole prompt, and can flip a near-tie greedy token).
    nocache = {"cache_prompt": False}
    r2 = c.chat.completions.create(model=model, messages=msgs, max_tokens=12, temperature=0,
                                   extra_body=nocache)
    text = r2.choices[0].message.content
    parts, usage, finish = [], None, None
    for ch in c.chat.completions.create(model=model, messages=msgs, max_tokens=12, temperature=0,
                                        stream=True, stream_options={"include_usage": True},
                                        extra_body=nocache):
        if ch.usage:
            usage = ch.usage
        for choice in ch.choices:
            parts.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    check("streamed chat == whole (greedy)", "".join(parts) == text, repr("".join(parts)))
    check("stream usage chunk", usage is not None
          and usage.completion_tokens == r2.usage.completion_tokens, str(usage))
    check("stream finish_reason", finish in ("stop", "length"), str(finish))

    r = c.completions.create(model=model, prompt="1, 2, 3, 4,", max_tokens=16, temperature=0,
                             extra_body=nocache)
    full = r.choices[0].text
    check("completions", bool(full), repr(full))
    r = c.completions.create(model=model, prompt="1, 2, 3, 4,", max_tokens=16, temperature=0,
                             stop=[","], extra_body=nocache)
    cut = r.choices[0].text
    check("stop string", "," not in cut and full.startswith(cut)
          and r.choices[0].finish_reason == "stop", repr(cut))

    def sampled(seed):
        return c.completions.create(model=model, prompt="Once upon a time", max_tokens=16,
                                    temperature=1.0, seed=seed,
                                    extra_body=nocache).choices[0].text
    a, b = sampled(7), sampled(7)
    check("seed reproducibility", a == b, repr(a))

    r = c.chat.completions.create(model=model, messages=msgs, max_tokens=4, logprobs=True,
                                  top_logprobs=2)
    lp = r.choices[0].logprobs.content
    check("logprobs", len(lp) >= 1 and len(lp[0].top_logprobs) == 2)

    check("models.retrieve", c.models.retrieve(model).id == model)
    try:
        c.models.retrieve("no-such-model")
        check("models.retrieve unknown -> 404", False)
    except openai.NotFoundError as e:
        check("models.retrieve unknown -> 404", e.status_code == 404)

    # logit_bias: ban the greedy first token, and the reply starts differently.
    r = c.completions.create(model=model, prompt="The capital of France is", max_tokens=1,
                             temperature=0, logprobs=0, extra_body=nocache)
    first = r.choices[0].text
    tok = urllib.request.Request(base.rsplit("/v1", 1)[0] + "/tokenize", method="POST",
                                 data=('{"content": %s}' % json.dumps(first)).encode(),
                                 headers={"Authorization": f"Bearer {key}",
                                          "Content-Type": "application/json"})
    with urllib.request.urlopen(tok) as resp:
        first_id = json.load(resp)["tokens"][0]
    r = c.completions.create(model=model, prompt="The capital of France is", max_tokens=1,
                             temperature=0, logit_bias={str(first_id): -100}, extra_body=nocache)
    check("logit_bias bans a token", r.choices[0].text != first, repr(r.choices[0].text))

    r = c.chat.completions.create(model=model, messages=msgs, max_tokens=4, n=2, seed=3)
    check("n = 2 choices", [ch.index for ch in r.choices] == [0, 1], str(r.choices))
    r = c.completions.create(model=model, prompt=["1, 2, 3,", "a, b, c,"], max_tokens=3,
                             temperature=0)
    check("list of prompts", len(r.choices) == 2 and r.choices[1].index == 1)

    # Embeddings: the client asks for base64 by default and decodes it; float on request.
    e = c.embeddings.create(model=model, input=["a cat sat on the mat", "a kitten sat on the rug",
                                                "quarterly tax filing deadline"])
    vecs = [d.embedding for d in e.data]
    norms = [sum(x * x for x in v) for v in vecs]
    dot = lambda a, b: sum(x * y for x, y in zip(a, b))
    check("embeddings (base64)", len(vecs) == 3 and len(set(map(len, vecs))) == 1
          and all(abs(n - 1.0) < 1e-4 for n in norms) and e.usage.prompt_tokens > 0,
          f"dim {len(vecs[0])}")
    check("embeddings: similar texts are closer", dot(vecs[0], vecs[1]) > dot(vecs[0], vecs[2]),
          f"{dot(vecs[0], vecs[1]):.3f} vs {dot(vecs[0], vecs[2]):.3f}")
    f = c.embeddings.create(model=model, input="a cat sat on the mat", encoding_format="float")
    check("embeddings (float) == base64", max(abs(a - b) for a, b in
                                              zip(f.data[0].embedding, vecs[0])) < 1e-6)
    try:
        c.completions.create(model=model, prompt="Hi", max_tokens=2, suffix="!")
        check("suffix -> 400 unsupported_parameter", False)
    except openai.BadRequestError as e:
        body = e.body if isinstance(e.body, dict) else {}
        body = body.get("error", body)
        check("suffix -> 400 unsupported_parameter", e.status_code == 400
              and body.get("code") == "unsupported_parameter" and body.get("param") == "suffix",
              str(e.body))

    try:
        c.chat.completions.create(model="no-such-model", messages=msgs, max_tokens=2)
        check("unknown model -> 404", False)
    except openai.NotFoundError as e:
        check("unknown model -> 404", e.status_code == 404)
    try:
        c.chat.completions.create(model=model, messages=msgs, max_tokens=-1)
        check("negative max_tokens -> 400", False)
    except openai.BadRequestError as e:
        check("negative max_tokens -> 400", e.status_code == 400)
    if key:
        bad = openai.OpenAI(base_url=base, api_key="wrong", max_retries=0)
        try:
            bad.models.list()
            check("wrong key -> 401", False)
        except openai.AuthenticationError as e:
            check("wrong key -> 401", e.status_code == 401)
    print("all openai client checks passed")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--spawn", help="path to the damascus binary to start")
    ap.add_argument("-m", "--model", default=None)
    a = ap.parse_args()
    proc = None
    if a.spawn:
        port = free_port()
        a.base_url = f"http://127.0.0.1:{port}/v1"
        a.api_key = a.api_key or "openai-test-key"
        cmd = [a.spawn, "serve", "--port", str(port), "-c", "1024", "--api-key", a.api_key]
        if a.model:
            cmd += ["-m", a.model]
        proc = subprocess.Popen(cmd)
    try:
        wait_health(a.base_url)
        run(a.base_url, a.api_key)
    finally:
        if proc:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    sys.exit(main())
