#!/usr/bin/env python3
"""A random-weight Hugging Face checkpoint with the shape of a published model, for benchmarks.

Decode speed depends on the shapes, not on the values, so a random Llama-3.1-8B-shaped checkpoint
measures what the real one would, with nothing to download. Never commit the output (16 GB for
the 8B shape). Run on the GPU machine (initialization happens on the GPU, a few seconds):
    pip install torch transformers safetensors
    python3 tools/make_random_checkpoint.py llama-3.1-8b /data/llama-3.1-8b-random
    python3 tools/make_random_checkpoint.py --list
Quick check on a CPU: a shape with fewer layers (and f32 if you like):
    python3 tools/make_random_checkpoint.py qwen3-0.6b /tmp/qwen3-0.6b-2l --num-layers 2
Writes OUT_DIR/config.json, generation_config.json and model.safetensors, or model-0000i-of-0000n
shards + model.safetensors.index.json when the weights exceed --max-shard-size (as the Hub does);
with --tokenizer FILE also OUT_DIR/tokenizer.json. Weights: every Linear and embedding N(0, 0.02)
(transformers' own init with initializer_range 0.02, seeded), every norm weight 1.
"""
import argparse
import json
import os
import shutil
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

LLAMA3_ROPE_8B = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=8192)
LLAMA3_ROPE_32 = dict(LLAMA3_ROPE_8B, factor=32.0)

# The config.json values of the published checkpoints (hidden, layers, heads, vocab, rope, tying).
# rope_theta + rope_scaling spelling: both transformers 4.x and 5.x accept it.
SHAPES = {
    "llama-3.1-8b": (LlamaConfig, dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072,
        rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE_8B,
        tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001)),
    "llama-3.2-1b": (LlamaConfig, dict(
        hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, head_dim=64, vocab_size=128256, max_position_embeddings=131072,
        rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE_32,
        tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001)),
    "llama-3.2-3b": (LlamaConfig, dict(
        hidden_size=3072, intermediate_size=8192, num_hidden_layers=28, num_attention_heads=24,
        num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072,
        rms_norm_eps=1e-5, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE_32,
        tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128001)),
    "tinyllama-1.1b": (LlamaConfig, dict(
        hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
        num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048, rms_norm_eps=1e-5,
        rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)),
    "qwen2.5-0.5b": (Qwen2Config, dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6,
        rope_theta=1000000.0, tie_word_embeddings=True, use_sliding_window=False,
        bos_token_id=151643, eos_token_id=151643)),
    "qwen3-0.6b": (Qwen3Config, dict(
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, max_position_embeddings=40960,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, attention_bias=False,
        use_sliding_window=False, bos_token_id=151643, eos_token_id=151645)),
}
ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def make_config(shape, num_layers=None):
    cls, args = SHAPES[shape]
    args = dict(args, hidden_act="silu", initializer_range=0.02)
    if num_layers:
        args["num_hidden_layers"] = num_layers
    cfg = cls(**args)
    cfg.architectures = [ARCH[cfg.model_type]]
    return cfg


def count_params(cfg):
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    h, L = cfg.hidden_size, cfg.num_hidden_layers
    attn = h * hd * (2 * cfg.num_attention_heads + 2 * cfg.num_key_value_heads)
    mlp = 3 * h * cfg.intermediate_size
    norms = 2 * h + (2 * hd if cfg.model_type == "qwen3" else 0)  # + q_norm, k_norm
    bias = hd * (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) if cfg.model_type == "qwen2" else 0
    emb = cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2)
    return L * (attn + mlp + norms + bias) + h + emb


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shape", nargs="?", choices=sorted(SHAPES))
    ap.add_argument("out_dir", nargs="?")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    ap.add_argument("--num-layers", type=int, help="fewer layers than published (quick tests)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-shard-size", default="5GB", help="as on the Hub; shards + index above it")
    ap.add_argument("--tokenizer", help="a tokenizer.json to copy into OUT_DIR")
    ap.add_argument("--force", action="store_true", help="overwrite a non-empty OUT_DIR")
    ap.add_argument("--list", action="store_true", help="print the built-in shapes and exit")
    a = ap.parse_args()

    if a.list:
        for name in sorted(SHAPES):
            c = make_config(name)
            print(f"{name:16s} {c.model_type:6s} hidden {c.hidden_size:5d} layers "
                  f"{c.num_hidden_layers:3d} heads {c.num_attention_heads:3d}/{c.num_key_value_heads:2d} "
                  f"inter {c.intermediate_size:6d} "
                  f"vocab {c.vocab_size:6d} tied {str(c.tie_word_embeddings):5s} "
                  f"params {count_params(c) / 1e9:.2f} B")
        return
    if not a.shape or not a.out_dir:
        ap.error("give SHAPE and OUT_DIR (or --list)")
    if os.path.isdir(a.out_dir) and os.listdir(a.out_dir) and not a.force:
        sys.exit(f"error: {a.out_dir} is not empty (use --force to overwrite)")

    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = DTYPES[a.dtype]
    cfg = make_config(a.shape, a.num_layers)
    n = count_params(cfg)
    print(f"{a.shape}: {n / 1e9:.3f} B parameters, {n * dtype.itemsize / 2**30:.2f} GiB in {a.dtype}, "
          f"init on {device}; transformers {transformers.__version__}, torch {torch.__version__}")

    t0 = time.perf_counter()
    torch.manual_seed(a.seed)
    # Create the tensors directly on the device in the target dtype: transformers' init
    # (normal_(0, initializer_range) per Linear/Embedding, ones for the norms) then runs there.
    with torch.device(device):
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        except TypeError:  # transformers < 4.56 spells it torch_dtype
            model = AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t1 = time.perf_counter()
    got = sum(p.numel() for p in model.parameters())
    if got != n:
        sys.exit(f"error: model has {got} parameters, the shape formula says {n}")
    os.makedirs(a.out_dir, exist_ok=True)
    model.save_pretrained(a.out_dir, safe_serialization=True, max_shard_size=a.max_shard_size)
    if a.tokenizer:
        shutil.copyfile(a.tokenizer, os.path.join(a.out_dir, "tokenizer.json"))
    t2 = time.perf_counter()
    w = dict(model.named_parameters())["model.layers.0.self_attn.q_proj.weight"].float()
    with open(os.path.join(a.out_dir, "random_checkpoint.json"), "w") as f:
        json.dump({"shape": a.shape, "dtype": a.dtype, "seed": a.seed, "num_layers": cfg.num_hidden_layers,
                   "params": n, "init": "normal(0, 0.02), norms 1", "device": device,
                   "transformers_version": transformers.__version__, "torch_version": torch.__version__},
                  f, indent=1, sort_keys=True)
        f.write("\n")
    size = sum(os.path.getsize(os.path.join(a.out_dir, x)) for x in os.listdir(a.out_dir))
    print(f"init {t1 - t0:.1f} s, save {t2 - t1:.1f} s; q_proj[0] std {w.std().item():.4f}; "
          f"wrote {a.out_dir}: {size / 2**30:.2f} GiB in {len(os.listdir(a.out_dir))} files")


if __name__ == "__main__":
    main()
