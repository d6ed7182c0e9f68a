#!/usr/bin/env python3
"""quant_pack.py — writes tiny GPTQ and AWQ checkpoints from integer weights it draws itself
(fixed seed), with the weights they stand for, for step06's loader tests (tests/test_step06_hf.c).

Written from the published formats, independently of the engine's C code:
  GPTQ (v1, "checkpoint_format": "gptq"), for a linear P with `in` inputs, `out` outputs, G groups:
    P.qweight int32 (in*bits/32, out): row r packs inputs r*32/bits + k, k from the low bits up
    P.qzeros  int32 (G, out*bits/32): packs outputs the same way; it stores z - 1
    P.scales  fp16  (G, out)
    P.g_idx   int32 (in): the group of each input (a permutation's groups with desc_act)
  AWQ gemm: P.qweight int32 (in, out/8): word j of row i packs outputs 8j + [0,2,4,6,1,3,5,7][k]
            in nibble k; P.qzeros int32 (G, out/8) the same, storing z itself; P.scales fp16 (G, out)
  Either way W[o][i] = (q[o][i] - z[o][g]) * s[o][g] with g the group of input i.

Output (for each variant under OUT/<variant>/): config.json (a quantization_config and nothing
else), model.safetensors, and expected/<prefix>.{q,z,s,g,W}.npy: q (out, in) int32, z (out, G)
int32, s (out, G) float32 (the fp16 scales widened), g (in) int32, W (out, in) float32 computed
here in float64 and rounded once (exact: small integer times an fp16 value).
Also a whole tiny Llama (OUT/gptq4_act_model: 2 layers, hidden 64, intermediate 128, 4 heads, 2 kv
heads, vocab 128, its own lm_head) whose seven projections per layer are GPTQ 4-bit, group 32,
asymmetric, desc_act (each projection its own input permutation), with the other tensors drawn
here in float32; and its dequantized twin OUT/gptq4_act_model_dense: the same config without a
quantization_config and each projection's P.weight = W above, for the end-to-end test that both
generate the same tokens (tests/test_step06_engine.c). Its own random stream (seed 20261202), so
the variants above are byte-identical with or without it.
Usage: tools/quant_pack.py OUT     (needs numpy only)
"""
import json
import os
import struct
import sys

import numpy as np

AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]

# (variant, quantization_config, [(prefix, out, in)])
LINEARS = [("model.layers.0.self_attn.q_proj", 16, 256), ("model.layers.0.mlp.down_proj", 8, 384)]
VARIANTS = [
    ("gptq4_sym", {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False,
                   "checkpoint_format": "gptq", "damp_percent": 0.01, "true_sequential": True}),
    ("gptq4_asym", {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": False, "desc_act": False}),
    ("gptq4_act", {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": True,
                   "checkpoint_format": "gptq", "static_groups": False}),
    ("gptq8_sym", {"quant_method": "gptq", "bits": 8, "group_size": 128, "sym": True, "desc_act": False,
                   "checkpoint_format": "gptq"}),
    ("gptq4_perchannel", {"quant_method": "gptq", "bits": 4, "group_size": -1, "sym": False, "desc_act": False,
                          "checkpoint_format": "gptq"}),
    ("awq4", {"quant_method": "awq", "version": "gemm", "bits": 4, "group_size": 128, "zero_point": True,
              "modules_to_not_convert": None}),
]


def write_safetensors(path, tensors):
    """tensors: list of (name, numpy array); dtypes int32 -> I32, float16 -> F16."""
    names = {np.dtype(np.int32): "I32", np.dtype(np.float16): "F16", np.dtype(np.float32): "F32"}
    header, blobs, off = {}, [], 0
    for name, a in tensors:
        a = np.ascontiguousarray(a)
        b = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def pack_words(vals, bits, order=None):
    """vals (..., n): unsigned ints < 2^bits; groups of 32/bits consecutive entries along the last
    axis become one word, entry order[k] of each group in bits k*bits ... (uint32)."""
    per = 32 // bits
    v = vals.astype(np.uint64).reshape(vals.shape[:-1] + (vals.shape[-1] // per, per))
    if order is not None:
        v = v[..., order]
    shifts = np.arange(per, dtype=np.uint64) * bits
    return (v << shifts).sum(axis=-1).astype(np.uint32)


def make_linear(rng, cfg, out, inp):
    bits = cfg["bits"]
    group = inp if cfg["group_size"] == -1 else cfg["group_size"]
    G = inp // group
    maxq = (1 << bits) - 1
    q = rng.integers(0, maxq + 1, size=(out, inp))
    if cfg.get("sym", False) and cfg["quant_method"] == "gptq":
        z = np.full((out, G), 1 << (bits - 1))
    elif cfg["quant_method"] == "gptq":
        z = rng.integers(1, maxq + 1, size=(out, G))  # v1 stores z - 1: z = 0 has no encoding
    else:
        z = rng.integers(0, maxq + 1, size=(out, G))
    s16 = rng.uniform(1e-3, 4e-2, size=(out, G)).astype(np.float16)
    if cfg.get("desc_act", False):
        perm = rng.permutation(inp)  # the order act-order quantized the inputs in
        g_idx = np.empty(inp, dtype=np.int64)
        g_idx[perm] = np.arange(inp) // group
    else:
        g_idx = np.arange(inp) // group
    s = s16.astype(np.float64)
    W = ((q - z[:, g_idx]) * s[:, g_idx]).astype(np.float32)
    if cfg["quant_method"] == "gptq":
        tensors = {
            "qweight": pack_cols(q, bits),                                # (in*bits/32, out)
            "qzeros": pack_words(z.T - 1, bits).view(np.int32),           # (G, out*bits/32)
            "scales": np.ascontiguousarray(s16.T),                        # (G, out)
            "g_idx": g_idx.astype(np.int32),
        }
    else:
        tensors = {
            "qweight": pack_words(np.ascontiguousarray(q.T), bits, AWQ_ORDER).view(np.int32),   # (in, out/8)
            "qzeros": pack_words(np.ascontiguousarray(z.T), bits, AWQ_ORDER).view(np.int32),    # (G, out/8)
            "scales": np.ascontiguousarray(s16.T),
        }
    return tensors, {"q": q.astype(np.int32), "z": z.astype(np.int32), "s": s16.astype(np.float32),
                     "g": g_idx.astype(np.int32), "W": W}


def pack_cols(q, bits):
    """GPTQ qweight: q (out, in) packed along the input: word [r][o] holds q[o][r*per + k]."""
    per = 32 // bits
    out, inp = q.shape
    qt = q.T.astype(np.uint64).reshape(inp // per, per, out)  # [r][k][o] = q[o][r*per + k]
    shifts = (np.arange(per, dtype=np.uint64) * bits)[None, :, None]
    return (qt << shifts).sum(axis=1).astype(np.uint32).view(np.int32)


MODEL_CFG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 128,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
    "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "float32",
}
MODEL_QCFG = {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": False, "desc_act": True,
              "checkpoint_format": "gptq"}


def write_model(root):
    """The whole-model pair described in the module docstring."""
    rng = np.random.default_rng(20261202)
    c = MODEL_CFG
    d, ff, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    qd, kd = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    shapes = {"self_attn.q_proj": (qd, d), "self_attn.k_proj": (kd, d), "self_attn.v_proj": (kd, d),
              "self_attn.o_proj": (d, qd), "mlp.gate_proj": (ff, d), "mlp.up_proj": (ff, d), "mlp.down_proj": (d, ff)}
    f32 = lambda a: a.astype(np.float32)
    common = [("model.embed_tokens.weight", f32(rng.normal(0, 0.5, size=(c["vocab_size"], d)))),
              ("model.norm.weight", f32(rng.normal(1, 0.1, size=d))),
              ("lm_head.weight", f32(rng.normal(0, 0.5, size=(c["vocab_size"], d))))]
    quant, dense = [], []
    for layer in range(c["num_hidden_layers"]):
        pre = f"model.layers.{layer}."
        common += [(pre + "input_layernorm.weight", f32(rng.normal(1, 0.1, size=d))),
                   (pre + "post_attention_layernorm.weight", f32(rng.normal(1, 0.1, size=d)))]
        for name, (out, inp) in shapes.items():
            t, exp = make_linear(rng, MODEL_QCFG, out, inp)
            quant += [(f"{pre}{name}.{k}", v) for k, v in t.items()]
            dense.append((f"{pre}{name}.weight", exp["W"]))
    for sub, tensors, cfg in (("gptq4_act_model", common + quant, dict(c, quantization_config=MODEL_QCFG)),
                              ("gptq4_act_model_dense", common + dense, c)):
        out_dir = os.path.join(root, sub)
        os.makedirs(out_dir, exist_ok=True)
        write_safetensors(os.path.join(out_dir, "model.safetensors"), tensors)
        with open(os.path.join(out_dir, "config.json"), "w") as f:
            json.dump(cfg, f, indent=2)
            f.write("\n")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: quant_pack.py OUT_DIR")
    root = sys.argv[1]
    rng = np.random.default_rng(20261201)
    for name, cfg in VARIANTS:
        d = os.path.join(root, name)
        os.makedirs(os.path.join(d, "expected"), exist_ok=True)
        tensors = []
        for prefix, out, inp in LINEARS:
            t, exp = make_linear(rng, cfg, out, inp)
            tensors += [(f"{prefix}.{k}", v) for k, v in t.items()]
            for k, v in exp.items():
                np.save(os.path.join(d, "expected", f"{prefix}.{k}.npy"), v)
        write_safetensors(os.path.join(d, "model.safetensors"), tensors)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({"quantization_config": cfg}, f, indent=2)
            f.write("\n")
    write_model(root)


if __name__ == "__main__":
    main()
