#!/usr/bin/env python3
"""server_client.py — drives `llm serve` with the real `openai` Python client (and, where the
client hides what is tested, plain sockets) for tests/test_final_server.c. Each command prints one
JSON object on stdout; the C test judges it.

  python3 tests/server_client.py greedy --port P --model M --ids 1,2,3 --max-tokens 8
  python3 tests/server_client.py text --port P --model M --prompt "The quick" --max-tokens 16 [--stop S]
  python3 tests/server_client.py chat --port P --model M --content "Hi" --max-tokens 8
  python3 tests/server_client.py concurrent --port P --model M --n 64 --max-tokens 16
  python3 tests/server_client.py drop --port P --model M --max-tokens 200
  python3 tests/server_client.py busy --port P --model M --n 8 --max-tokens 200
"""
import argparse
import http.client
import json
import socket
import sys
import threading

import openai


def client(a):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{a.port}/v1", api_key=a.api_key or "none",
                         max_retries=0, timeout=120)


def stream_completion(c, **kw):
    """Text, finish_reason, stop_reason, usage and the chunk count of a streamed completion."""
    text, fin, stop, usage, chunks = "", None, None, None, 0
    for ch in c.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
        chunks += 1
        if ch.usage is not None:
            usage = ch.usage.model_dump()
        for choice in ch.choices:
            text += choice.text or ""
            if choice.finish_reason is not None:
                fin = choice.finish_reason
                stop = getattr(choice, "stop_reason", None) or (choice.model_extra or {}).get("stop_reason")
    return {"text": text, "finish_reason": fin, "stop_reason": stop, "usage": usage, "chunks": chunks}


def cmd_greedy(a):
    c = client(a)
    ids = [int(x) for x in a.ids.split(",")]
    extra = {"ignore_eos": True, "return_tokens_as_token_ids": True}
    r = c.completions.create(model=a.model, prompt=ids, max_tokens=a.max_tokens, temperature=0, logprobs=5,
                             extra_body=extra)
    ch = r.choices[0]
    lp = ch.logprobs
    out_ids = [int(t.split(":")[1]) for t in lp.tokens]
    top5 = []
    for d in lp.top_logprobs:
        ranked = sorted(d.items(), key=lambda kv: (-kv[1], int(kv[0].split(":")[1])))
        top5.append([int(k.split(":")[1]) for k, _ in ranked])
    s = stream_completion(c, model=a.model, prompt=ids, max_tokens=a.max_tokens, temperature=0,
                          extra_body={"ignore_eos": True})
    print(json.dumps({"ids": out_ids, "top5": top5, "token_logprobs": lp.token_logprobs, "text": ch.text,
                      "finish_reason": ch.finish_reason, "usage": r.usage.model_dump(), "stream": s}))


def cmd_text(a):
    c = client(a)
    kw = dict(model=a.model, prompt=a.prompt, max_tokens=a.max_tokens, temperature=a.temperature,
              extra_body={"ignore_eos": True})
    if a.seed is not None:
        kw["seed"] = a.seed
    if a.stop:
        kw["stop"] = a.stop
    r = c.completions.create(**kw)
    ch = r.choices[0]
    stop = (ch.model_extra or {}).get("stop_reason")
    s = stream_completion(c, **kw)
    print(json.dumps({"text": ch.text, "finish_reason": ch.finish_reason, "stop_reason": stop,
                      "usage": r.usage.model_dump(), "stream": s}))


def cmd_chat(a):
    c = client(a)
    msgs = [{"role": "user", "content": a.content}]
    r = c.chat.completions.create(model=a.model, messages=msgs, max_tokens=a.max_tokens, temperature=0, logprobs=True,
                                  top_logprobs=2, extra_body={"ignore_eos": True})
    ch = r.choices[0]
    text, fin, usage, roles = "", None, None, []
    for k in c.chat.completions.create(model=a.model, messages=msgs, max_tokens=a.max_tokens, temperature=0,
                                       stream=True, stream_options={"include_usage": True},
                                       extra_body={"ignore_eos": True}):
        if k.usage is not None:
            usage = k.usage.model_dump()
        for x in k.choices:
            if x.delta.role:
                roles.append(x.delta.role)
            text += x.delta.content or ""
            fin = x.finish_reason or fin
    lp = ch.logprobs.content
    print(json.dumps({"text": ch.message.content, "role": ch.message.role, "finish_reason": ch.finish_reason,
                      "usage": r.usage.model_dump(), "logprobs_n": len(lp),
                      "top_n": [len(t.top_logprobs) for t in lp],
                      "stream": {"text": text, "finish_reason": fin, "usage": usage, "roles": roles}}))


PROMPTS = ["The quick brown fox", "hello world", "Once upon a time", "a b c d e f g"]


def cmd_concurrent(a):
    c = client(a)
    ref = {}
    for p in PROMPTS:
        r = c.completions.create(model=a.model, prompt=p, max_tokens=a.max_tokens, temperature=0,
                                 extra_body={"ignore_eos": True})
        ref[p] = r.choices[0].text
    results = [None] * a.n
    start = threading.Barrier(a.n)

    def one(i):
        p = PROMPTS[i % len(PROMPTS)]
        try:
            start.wait()
            s = stream_completion(client(a), model=a.model, prompt=p, max_tokens=a.max_tokens, temperature=0,
                                  extra_body={"ignore_eos": True})
            ok = (s["text"] == ref[p] and s["finish_reason"] == "length" and s["usage"] is not None
                  and s["usage"]["completion_tokens"] == a.max_tokens)
            results[i] = "ok" if ok else f"stream {i}: {s} vs reference {ref[p]!r}"
        except Exception as e:  # noqa: BLE001 - reported to the C test
            results[i] = f"stream {i}: {type(e).__name__}: {e}"

    th = [threading.Thread(target=one, args=(i,)) for i in range(a.n)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    print(json.dumps({"n": a.n, "ok": sum(r == "ok" for r in results),
                      "failures": [r for r in results if r != "ok"][:5]}))


def request_bytes(a, body):
    data = json.dumps(body).encode()
    return (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def cmd_drop(a):
    """A stream read up to its first SSE event, then the connection closed."""
    s = socket.create_connection(("127.0.0.1", a.port), timeout=30)
    s.sendall(request_bytes(a, {"model": a.model, "prompt": "The quick brown fox", "max_tokens": a.max_tokens,
                                "temperature": 0, "ignore_eos": True, "stream": True}))
    got = b""
    while b"data: " not in got:
        k = s.recv(4096)
        if not k:
            break
        got += k
    s.close()
    print(json.dumps({"status_line": got.split(b"\r\n", 1)[0].decode(errors="replace"), "saw_data": b"data: " in got}))


def cmd_busy(a):
    """n requests at once against a server that admits fewer: their statuses and Retry-After."""
    out = [None] * a.n
    start = threading.Barrier(a.n)

    def one(i):
        conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=120)
        body = json.dumps({"model": a.model, "prompt": "The quick brown fox", "max_tokens": a.max_tokens,
                           "temperature": 0, "ignore_eos": True})
        start.wait()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        payload = r.read().decode()
        out[i] = {"status": r.status, "retry_after": r.getheader("Retry-After"),
                  "error_type": (json.loads(payload).get("error") or {}).get("type") if r.status != 200 else None}
        conn.close()

    th = [threading.Thread(target=one, args=(i,)) for i in range(a.n)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    print(json.dumps({"responses": out}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cmd", choices=["greedy", "text", "chat", "concurrent", "drop", "busy"])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--api-key")
    ap.add_argument("--ids")
    ap.add_argument("--prompt")
    ap.add_argument("--prompt-json", help="the prompt as a JSON string literal (for characters argv cannot carry, NUL)")
    ap.add_argument("--content")
    ap.add_argument("--stop", action="append")
    ap.add_argument("--seed", type=int)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--n", type=int, default=64)
    a = ap.parse_args()
    if a.prompt_json is not None:
        a.prompt = json.loads(a.prompt_json)
    {"greedy": cmd_greedy, "text": cmd_text, "chat": cmd_chat, "concurrent": cmd_concurrent, "drop": cmd_drop,
     "busy": cmd_busy}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
