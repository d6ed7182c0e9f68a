#!/usr/bin/env python3
"""The prefill's achieved TFLOP/s from an `llm bench --json` run of a prompt-only workload.

  python3 final/bench/workloads.py prefill /tmp/prefill.jsonl
  build/bin/llm bench --model DIR --requests /tmp/prefill.jsonl --device cuda --json > prefill.json
  python3 final/bench/prefill_flops.py --config DIR/config.json --requests /tmp/prefill.jsonl --bench prefill.json

The FLOPs are counted from the model's shape and the requests' prompt lengths, the work a
prefill must do (nothing the engine adds, such as padding rows, is counted):
  projections  2 x (q, k, v, o, gate, up, down weights of every layer) per prompt token
  attention    causal: a prompt of n tokens makes n (n + 1) / 2 query-key pairs a head, each 2 x head_dim
               FLOP for QK^T and 2 x head_dim for PV: 2 x heads x head_dim x n (n + 1) a layer
  lm_head      2 x vocab x hidden per request (only the last prompt row makes logits)
Norms, RoPE and SwiGLU (a few FLOP per element) are left out. The times are the bench's own:
prefill_device_s (CUDA events around the forwards of the steps that hold a prompt chunk) and
prefill_forward_s (the host's wall time around the same forwards); with a prompt-only workload
(max_tokens 1) every step is such a step. Prints one JSON object.
"""
import argparse
import json


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True, help="the model's config.json")
    ap.add_argument("--requests", required=True, help="the request file the bench ran (JSONL)")
    ap.add_argument("--bench", required=True, help="llm bench --json output")
    a = ap.parse_args()
    c = json.load(open(a.config))
    d, L, V = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    H, KV = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    hd = c.get("head_dim") or d // H
    ff = c["intermediate_size"]
    layer_w = d * H * hd + 2 * d * KV * hd + H * hd * d + 3 * d * ff
    lens = [len(json.loads(line)["prompt_ids"]) for line in open(a.requests) if line.strip()]
    tokens = sum(lens)
    proj = 2 * L * layer_w * tokens
    attn = sum(2 * L * H * hd * n * (n + 1) for n in lens)
    head = 2 * V * d * len(lens)
    total = proj + attn + head
    s = json.load(open(a.bench))["summary"]
    if s.get("decode_steps"):
        raise SystemExit(f"{a.bench}: {s['decode_steps']} decode-only steps: run a prompt-only workload (max_tokens 1)")
    dev, fwd = s["prefill_device_s"], s["prefill_forward_s"]  # device time is 0 on the CPU (no events)
    print(json.dumps(dict(requests=len(lens), prompt_tokens=tokens, flop_projections=proj, flop_attention=attn,
                          flop_lm_head=head, flop_total=total, prefill_device_s=dev, prefill_forward_s=fwd,
                          duration_s=s["duration_s"], tflops_device=total / dev / 1e12 if dev else None,
                          tflops_forward=total / fwd / 1e12, tflops_duration=total / s["duration_s"] / 1e12,
                          prompt_tok_s_device=tokens / dev if dev else None)))


if __name__ == "__main__":
    main()
