#!/usr/bin/env python3
"""Tiny random-weight checkpoints of every supported variant, and what transformers computes on them.

The C engine (step02 onwards) is proven correct by comparing it with Hugging Face transformers on
these checkpoints; the C code and its tests never need Python. Run (CPU is enough, ~1 minute):
    pip install torch transformers safetensors numpy
    python3 tools/make_goldens.py --out tests/data/models            # --device cuda on a GPU / Colab
Writes, for each variant in VARIANTS and each dtype in (f32, bf16), tests/data/models/<name>_<dtype>/:
    config.json, generation_config.json, model.safetensors    as save_pretrained writes them
    goldens/prompt_T<n>.npy        int32 (n,)           fixed random prompt ids, n in PROMPT_LENS
    goldens/logits_T<n>.npy        float32 (n, vocab)   logits of that prompt, one row per position
    goldens/greedy.json            32 greedy tokens after prompt_T7, top-5 ids and logprobs per step
    goldens/logits_full.npy        float32 (7+32, vocab) one uncached forward over prompt + generated
    goldens/meta.json              versions, device, seeds, shapes, and the flatness statistics
For bf16 the goldens above are computed WITH the bf16 model (what the engine's bf16 path is compared
against); each logits file also has a `*_f32ref.npy` twin: the same bf16-rounded weights upcast to
f32 and run in f32 (what the engine's f32 CPU path on the bf16 checkpoint is compared against).
One extra directory, llama3_tied_rope_v4cfg_bf16, holds the llama3 bf16 weights with config.json
in the transformers 4.x spelling (top-level rope_theta + rope_scaling, torch_dtype, no head_dim);
its goldens are recomputed from that directory with from_pretrained and must equal those of
llama3_tied_rope_bf16.
The llama_mha_* directories also get tests/data/tokenizers/tiny-tokenizer.json as tokenizer.json
(vocab 608 covers its 605 ids): that pair is the small model `make demo` runs by default.

Every f32 golden (for bf16, the f32ref one) is also checked against numpy_reference_logits, an
independent float64 NumPy forward pass written from the architecture description.
Deterministic and idempotent: weights come from a seeded CPU generator whatever the device, every
output directory is cleared and rewritten, JSON is written with sorted keys. The script exits non-zero
if a continuation is degenerate (too few distinct tokens) or the logits are flat (small top1-top2 gap).
"""
import argparse
import json
import math
import os
import platform
import shutil
import sys
import zlib

import numpy as np
import safetensors
import safetensors.torch
import torch
import transformers
from transformers import AutoModelForCausalLM, GenerationConfig, LlamaConfig, Qwen2Config, Qwen3Config

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, ".."))
TINY_TOKENIZER = os.path.join(REPO, "tests", "data", "tokenizers", "tiny-tokenizer.json")

PROMPT_LENS = (1, 7, 33)
GREEDY_PROMPT_LEN = 7
NEW_TOKENS = 32
TOPK = 5
RESID_GAIN = 4.0       # o_proj/down_proj std gain: blocks outweigh the token's own embedding
LOGIT_STD = 4.0        # target std of the logits: peaked enough that top1-top2 gaps beat bf16 noise
MIN_DISTINCT = 6       # a 32-token greedy continuation with fewer distinct tokens fails the run
MIN_MEDIAN_GAP = 0.25  # median top1-top2 logit gap below this fails the run (bf16 noise ~0.02-0.05)

# Each variant: the config class, its arguments (tiny shapes, real structure), and what it exercises.
# Shapes: hidden 64-96, 2-3 layers, vocab 320-608; n_heads / n_kv_heads cover MHA, GQA and MQA.
COMMON = dict(max_position_embeddings=256, rms_norm_eps=1e-6, hidden_act="silu")
VARIANTS = {
    "llama_mha": dict(
        cls=LlamaConfig,
        args=dict(hidden_size=64, intermediate_size=172, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=4, vocab_size=608, rope_theta=10000.0, rms_norm_eps=1e-5,
                  tie_word_embeddings=False, bos_token_id=0, eos_token_id=1),
        what="Llama, MHA (4 q heads = 4 kv heads, head_dim 16 = hidden/heads), rope theta 1e4, untied "
             "lm_head, rms_norm_eps 1e-5. Vocab 608 matches tests/data/tokenizers/tiny-tokenizer.json "
             "(copied here as tokenizer.json): the `make demo` default model."),
    "llama_gqa_hd": dict(
        cls=LlamaConfig,
        args=dict(hidden_size=64, intermediate_size=151, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=24, vocab_size=384, rope_theta=10000.0,
                  tie_word_embeddings=False),
        what="Llama, GQA (4 q heads share 2 kv heads), explicit head_dim 24 != hidden/heads = 16 "
             "(q_proj is 96x64, o_proj 64x96), head_dim not a power of two, 3 layers."),
    "llama3_tied_rope": dict(
        cls=LlamaConfig,
        args=dict(hidden_size=64, intermediate_size=120, num_hidden_layers=2, num_attention_heads=2,
                  num_key_value_heads=1, vocab_size=320, tie_word_embeddings=True,
                  rope_parameters=dict(rope_type="llama3", rope_theta=100000.0, factor=8.0,
                                       low_freq_factor=1.0, high_freq_factor=4.0,
                                       original_max_position_embeddings=32)),
        what="Llama-3.x: MQA (2 q heads, 1 kv head, head_dim 32), rope_type llama3 with factor 8, "
             "original_max_position_embeddings 32 and theta 1e5, chosen so the 16 rope frequencies "
             "fall in all three bands (wavelengths 6.3 < 8: kept; 13.2 and 27.9 in 8..32: "
             "interpolated; the rest > 32: divided by 8) and prompts + continuation (up to 65 "
             "positions) run past 32; tied embeddings (no lm_head.weight in the file)."),
    "qwen2_bias": dict(
        cls=Qwen2Config,
        args=dict(hidden_size=64, intermediate_size=136, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=352, rope_theta=1000000.0,
                  tie_word_embeddings=True, use_sliding_window=False),
        what="Qwen2: q/k/v projections with bias (random, nonzero), o_proj without; GQA (4 q, 2 kv), "
             "rope theta 1e6, tied embeddings as in the small Qwen2/2.5 models."),
    "qwen3_qknorm": dict(
        cls=Qwen3Config,
        args=dict(hidden_size=64, intermediate_size=163, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, vocab_size=416, rope_theta=1000000.0,
                  tie_word_embeddings=False, attention_bias=False, use_sliding_window=False),
        what="Qwen3: RMSNorm on q and k per head (q_norm/k_norm, random weights) before rope, "
             "explicit head_dim 32 != hidden/heads = 16, GQA (4 q, 2 kv), 3 layers, untied."),
}
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def seed_of(name):
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def make_config(name):
    v = VARIANTS[name]
    args = dict(COMMON)
    args.update(v["args"])
    cfg = v["cls"](**args)
    cfg.architectures = [{"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                          "qwen3": "Qwen3ForCausalLM"}[cfg.model_type]]
    return cfg


@torch.no_grad()
def init_weights(model, cfg, seed):
    """Scaled-up random init, so the logits are not flat and every weight matters.

    Linear weights N(0, 1/fan_in) keep each block's output O(1), times RESID_GAIN for o_proj and
    down_proj so the residual stream is not dominated by the current token's embedding (with tied
    embeddings that makes greedy decoding repeat the input token forever); the lm_head (or the tied
    embedding) gets std LOGIT_STD/sqrt(hidden) so the logits have std ~LOGIT_STD. Norm weights
    are 1 + N(0, 0.2^2) and biases N(0, 0.2^2): a forward pass that forgets one of them is wrong.
    Drawn on the CPU in sorted-name order from one seeded generator, so any device gets the same
    weights."""
    g = torch.Generator().manual_seed(seed)
    hidden = cfg.hidden_size
    for pname, p in sorted(model.named_parameters()):  # tied weights appear once
        shape = tuple(p.shape)
        if pname.endswith("norm.weight"):
            w = 1.0 + 0.2 * torch.randn(shape, generator=g)
        elif pname.endswith(".bias"):
            w = 0.2 * torch.randn(shape, generator=g)
        elif pname == "lm_head.weight" or (pname == "model.embed_tokens.weight" and cfg.tie_word_embeddings):
            w = (LOGIT_STD / math.sqrt(hidden)) * torch.randn(shape, generator=g)
        elif pname == "model.embed_tokens.weight":
            w = torch.randn(shape, generator=g)
        elif pname.endswith(("o_proj.weight", "down_proj.weight")):
            w = RESID_GAIN * torch.randn(shape, generator=g) / math.sqrt(shape[1])
        elif len(shape) == 2:
            w = torch.randn(shape, generator=g) / math.sqrt(shape[1])
        else:
            raise RuntimeError(f"no init rule for {pname} {shape}")
        p.copy_(w.to(p.dtype))


def build_model(name):
    cfg = make_config(name)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    init_weights(model, cfg, seed_of(name))
    return model.eval()


def load(path, dtype, device):
    return AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager",
                                                dtype=dtype).to(device).eval()


def prompt_ids(name, n, vocab):
    rng = np.random.default_rng(seed_of(name) + 1000 * n)
    return rng.integers(0, vocab, size=n, dtype=np.int64).astype(np.int32)


@torch.no_grad()
def forward_logits(model, ids, device):
    x = torch.tensor(np.asarray(ids, dtype=np.int64)[None, :], device=device)
    out = model(input_ids=x, use_cache=False)
    return out.logits[0].float().cpu().numpy()


@torch.no_grad()
def greedy(model, ids, device):
    """HF generate, greedy, exactly NEW_TOKENS tokens (eos off), with raw logits per step."""
    gc = GenerationConfig(do_sample=False, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                          eos_token_id=None, bos_token_id=None, pad_token_id=0, num_beams=1,
                          output_logits=True, return_dict_in_generate=True)
    saved_eos = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = None  # so min_new_tokens never masks a logit
    x = torch.tensor(np.asarray(ids, dtype=np.int64)[None, :], device=device)
    out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=gc)
    model.generation_config.eos_token_id = saved_eos
    gen = out.sequences[0, len(ids):].cpu().numpy().astype(np.int64)
    logits = torch.stack([l[0].float().cpu() for l in out.logits])  # (NEW_TOKENS, vocab)
    assert len(gen) == NEW_TOKENS, len(gen)
    # greedy must be the argmax of the very logits we store (no processor changed the choice)
    assert np.array_equal(gen, logits.argmax(-1).numpy()), "generated tokens != argmax(logits)"
    logp = torch.log_softmax(logits, dim=-1)
    top = torch.topk(logp, TOPK, dim=-1)
    return gen, top.indices.numpy(), top.values.numpy(), logits.numpy()


def numpy_reference_logits(path, ids):
    """An independent float64 NumPy forward pass over the saved files (config.json in either
    spelling, model.safetensors), written from the architecture description, not from
    transformers: the goldens are only trusted when the two agree."""
    with open(os.path.join(path, "config.json")) as f:
        c = json.load(f)
    tensors = safetensors.torch.load_file(os.path.join(path, "model.safetensors"))  # F32 or BF16
    W = {k: v.float().numpy().astype(np.float64) for k, v in tensors.items()}
    H, nh, nkv = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"]
    hd, eps, T = c.get("head_dim") or H // nh, c["rms_norm_eps"], len(ids)

    def rmsnorm(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w

    # rope: inv_freq, with llama3 scaling (keep high frequencies, divide low ones by factor,
    # interpolate between) when the config asks for it
    rp = c.get("rope_parameters") or dict(c.get("rope_scaling") or {}, rope_theta=c["rope_theta"])
    inv = 1.0 / rp["rope_theta"] ** (np.arange(0, hd, 2) / hd)
    if rp.get("rope_type", rp.get("type")) == "llama3":
        f, lo, hi = rp["factor"], rp["low_freq_factor"], rp["high_freq_factor"]
        om = rp["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv
        smooth = np.clip((om / wavelen - lo) / (hi - lo), 0.0, 1.0)
        inv = np.where(wavelen < om / hi, inv, np.where(wavelen > om / lo, inv / f,
                                                         (1 - smooth) * inv / f + smooth * inv))
    ang = np.arange(T)[:, None] * inv[None, :]
    ang = np.concatenate([ang, ang], -1)[:, None, :]  # (T, 1, hd): same angle for both halves
    cos, sin = np.cos(ang), np.sin(ang)

    def rope(x):  # (T, heads, hd), rotate-half convention
        return x * cos + np.concatenate([-x[..., hd // 2:], x[..., :hd // 2]], -1) * sin

    x = W["model.embed_tokens.weight"][np.asarray(ids)]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for layer in range(c["num_hidden_layers"]):
        p = f"model.layers.{layer}."

        def linear(name, v):
            y = v @ W[p + name + ".weight"].T
            return y + W[p + name + ".bias"] if p + name + ".bias" in W else y
        h = rmsnorm(x, W[p + "input_layernorm.weight"])
        q = linear("self_attn.q_proj", h).reshape(T, nh, hd)
        k = linear("self_attn.k_proj", h).reshape(T, nkv, hd)
        v = linear("self_attn.v_proj", h).reshape(T, nkv, hd)
        if p + "self_attn.q_norm.weight" in W:
            q = rmsnorm(q, W[p + "self_attn.q_norm.weight"])
            k = rmsnorm(k, W[p + "self_attn.k_norm.weight"])
        q, k = rope(q), rope(k)
        o = np.empty((T, nh, hd))
        for i in range(nh):
            j = i // (nh // nkv)  # the kv head this query head reads
            s = q[:, i] @ k[:, j].T / math.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            o[:, i] = (s / s.sum(-1, keepdims=True)) @ v[:, j]
        x = x + linear("self_attn.o_proj", o.reshape(T, nh * hd))
        h = rmsnorm(x, W[p + "post_attention_layernorm.weight"])
        g = linear("mlp.gate_proj", h)
        x = x + linear("mlp.down_proj", g / (1 + np.exp(-g)) * linear("mlp.up_proj", h))
    x = rmsnorm(x, W["model.norm.weight"])
    return x @ W.get("lm_head.weight", W["model.embed_tokens.weight"]).T


def gap_stats(logits):
    s = np.sort(logits, axis=-1)
    return s[:, -1] - s[:, -2]


def versions(device):
    return {"transformers_version": transformers.__version__, "torch_version": torch.__version__,
            "safetensors_version": safetensors.__version__, "numpy_version": np.__version__,
            "python_version": platform.python_version(), "device": device,
            "device_name": (torch.cuda.get_device_name() if device.startswith("cuda")
                            else platform.processor() or platform.machine())}


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")


def fresh_dir(path):
    if os.path.isdir(path):
        shutil.rmtree(path)
    os.makedirs(os.path.join(path, "goldens"))


def write_goldens(model, name, dtag, gdir, device, ref_model=None):
    """Prompt logits, greedy continuation and full-sequence logits of `model` into gdir.
    ref_model (bf16 only): the same weights upcast to f32; its logits go to *_f32ref.npy."""
    vocab = model.config.vocab_size
    stats = {"prompt_top1_top2_gap": {}, "bf16_vs_f32ref_max_abs_diff": {},
             "bf16_vs_f32ref_median_abs_diff": {}, "bf16_vs_f32ref_argmax_agree": {}}
    all_gaps = []
    for n in PROMPT_LENS:
        ids = prompt_ids(name, n, vocab)
        np.save(os.path.join(gdir, f"prompt_T{n}.npy"), ids)
        lg = forward_logits(model, ids, device)
        np.save(os.path.join(gdir, f"logits_T{n}.npy"), lg.astype(np.float32))
        gaps = gap_stats(lg)
        all_gaps.append(gaps)
        stats["prompt_top1_top2_gap"][f"T{n}"] = {"median": float(np.median(gaps)), "min": float(gaps.min())}
        if ref_model is not None:
            lr = forward_logits(ref_model, ids, device)
            np.save(os.path.join(gdir, f"logits_T{n}_f32ref.npy"), lr.astype(np.float32))
            stats["bf16_vs_f32ref_max_abs_diff"][f"T{n}"] = float(np.abs(lg - lr).max())
            stats["bf16_vs_f32ref_median_abs_diff"][f"T{n}"] = float(np.median(np.abs(lg - lr)))
            agree = int((lg.argmax(-1) == lr.argmax(-1)).sum())
            stats["bf16_vs_f32ref_argmax_agree"][f"T{n}"] = f"{agree}/{n}"
    ids = prompt_ids(name, GREEDY_PROMPT_LEN, vocab)
    gen, top_ids, top_lp, step_logits = greedy(model, ids, device)
    seq = np.concatenate([ids.astype(np.int64), gen])
    full = forward_logits(model, seq, device)
    np.save(os.path.join(gdir, "logits_full.npy"), full.astype(np.float32))
    # uncached forward vs cached generate: rows T-1 .. T+30 of full predict the 32 generated tokens
    cached_vs_uncached = float(np.abs(full[GREEDY_PROMPT_LEN - 1:-1] - step_logits).max())
    uncached_argmax_agrees = int((full[GREEDY_PROMPT_LEN - 1:-1].argmax(-1) == gen).sum())
    if ref_model is not None:
        np.save(os.path.join(gdir, "logits_full_f32ref.npy"),
                forward_logits(ref_model, seq, device).astype(np.float32))
    # the f32 goldens (for bf16: the f32ref ones) against the independent NumPy forward pass
    ckpt = os.path.dirname(gdir)
    f32_full = full if ref_model is None else np.load(os.path.join(gdir, "logits_full_f32ref.npy"))
    f32_t33 = np.load(os.path.join(gdir, "logits_T33" + ("" if ref_model is None else "_f32ref") + ".npy"))
    stats["numpy_f64_reference_max_abs_diff"] = max(
        float(np.abs(numpy_reference_logits(ckpt, seq) - f32_full).max()),
        float(np.abs(numpy_reference_logits(ckpt, prompt_ids(name, 33, vocab)) - f32_t33).max()))
    step_gaps = gap_stats(step_logits)
    all_gaps.append(step_gaps)
    g = {"prompt_ids": [int(t) for t in ids], "generated_ids": [int(t) for t in gen],
         "top5_ids": [[int(t) for t in row] for row in top_ids],
         "top5_logprobs": [[float(v) for v in row] for row in top_lp],
         "dtype": dtag, "new_tokens": NEW_TOKENS, "eos": "ignored (eos_token_id=None)",
         "method": "model.generate(do_sample=False, num_beams=1, output_logits=True); logprobs = "
                   "log_softmax of the raw step logits in float32",
         **versions(device)}
    write_json(os.path.join(gdir, "greedy.json"), g)
    stats.update({
        "greedy_distinct_tokens": int(len(set(gen.tolist()))),
        "greedy_top1_top2_gap": {"median": float(np.median(step_gaps)), "min": float(step_gaps.min())},
        "all_rows_top1_top2_gap_median": float(np.median(np.concatenate(all_gaps))),
        "cached_generate_vs_uncached_forward_max_abs_diff": cached_vs_uncached,
        "uncached_argmax_equals_generated": f"{uncached_argmax_agrees}/{NEW_TOKENS}",
    })
    return stats


def save_checkpoint(model, path):
    model.save_pretrained(path, safe_serialization=True)
    # save_pretrained may add files we do not want to commit (none expected for these models)
    allowed = {"config.json", "generation_config.json", "model.safetensors", "goldens"}
    extra = set(os.listdir(path)) - allowed
    if extra:
        raise RuntimeError(f"{path}: unexpected files from save_pretrained: {sorted(extra)}")


def old_style_config(v5_config_path, out_path):
    """Rewrite a transformers-5 config.json in the transformers-4.x spelling (as on the Hub for
    Llama-3.2-1B): top-level rope_theta, rope_scaling without rope_theta, torch_dtype; and no
    head_dim when it is hidden / heads (as in older Llama configs)."""
    with open(v5_config_path) as f:
        c = json.load(f)
    rp = dict(c.pop("rope_parameters"))
    c["rope_theta"] = rp.pop("rope_theta")
    c["rope_scaling"] = rp if rp.get("rope_type", "default") != "default" else None
    if "dtype" in c:
        c["torch_dtype"] = c.pop("dtype")
    if c.get("head_dim") == c["hidden_size"] // c["num_attention_heads"]:
        del c["head_dim"]  # as in TinyLlama / Llama-2 configs: the reader must use hidden / heads
    write_json(out_path, c)


def check(stats, label, failures):
    d = stats["greedy_distinct_tokens"]
    m = stats["all_rows_top1_top2_gap_median"]
    print(f"  {label:28s} distinct greedy tokens {d:2d}/32, median top1-top2 gap {m:.3f} "
          f"(greedy steps {stats['greedy_top1_top2_gap']['median']:.3f}), cached vs uncached "
          f"{stats['cached_generate_vs_uncached_forward_max_abs_diff']:.2e}, uncached argmax = "
          f"generated {stats['uncached_argmax_equals_generated']}"
          + ("" if not stats["bf16_vs_f32ref_max_abs_diff"] else
             f", bf16 vs f32ref |diff| max {max(stats['bf16_vs_f32ref_max_abs_diff'].values()):.3f} "
             f"median {stats['bf16_vs_f32ref_median_abs_diff']['T33']:.3f}, argmax agree "
             f"{' '.join(stats['bf16_vs_f32ref_argmax_agree'].values())}"))
    r = stats["numpy_f64_reference_max_abs_diff"]
    print(f"  {'':28s} f32 goldens vs the float64 NumPy forward pass: max |diff| {r:.1e}")
    if r > 1e-3:
        failures.append(f"{label}: f32 goldens differ from the NumPy reference by {r:.2e}")
    if d < MIN_DISTINCT:
        failures.append(f"{label}: only {d} distinct tokens in the greedy continuation")
    if m < MIN_MEDIAN_GAP:
        failures.append(f"{label}: median top1-top2 gap {m:.3f} < {MIN_MEDIAN_GAP}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "data", "models"))
    ap.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:1 ...")
    ap.add_argument("--only", nargs="*", help="variant names (default: all)")
    args = ap.parse_args()

    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cuda.matmul.allow_tf32 = False  # f32 goldens must be f32, not tf32
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    if args.device.startswith("cuda"):
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

    if int(transformers.__version__.split(".")[0]) < 5:
        sys.exit("error: needs transformers >= 5 (its config.json spelling, rope_parameters, is part "
                 f"of what the goldens test); this is {transformers.__version__}")
    names = args.only or list(VARIANTS)
    failures = []
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, device {args.device}")
    for name in names:
        cfg = make_config(name)
        print(f"{name}: hidden {cfg.hidden_size}, layers {cfg.num_hidden_layers}, heads "
              f"{cfg.num_attention_heads}/{cfg.num_key_value_heads} kv, head_dim "
              f"{getattr(cfg, 'head_dim', None)}, intermediate {cfg.intermediate_size}, vocab "
              f"{cfg.vocab_size}, tied {cfg.tie_word_embeddings}")
        for dtag, dt in DTYPES.items():
            path = os.path.join(args.out, f"{name}_{dtag}")
            fresh_dir(path)
            # f32 weights as drawn; bf16 = the same weights rounded by .to(torch.bfloat16)
            save_checkpoint(build_model(name).to(dt), path)
            # goldens come from the saved directory, loaded the way a user loads a checkpoint:
            # this checks the files, and keeps buffers (rope inv_freq) in f32 as from_pretrained
            # does for a bf16 checkpoint (model.to(bfloat16) would round inv_freq to bf16 too)
            model = load(path, dt, args.device)
            ref = load(path, torch.float32, args.device) if dt != torch.float32 else None
            stats = write_goldens(model, name, dtag, os.path.join(path, "goldens"), args.device, ref)
            meta = {"variant": name, "dtype": dtag, "what": VARIANTS[name]["what"],
                    "weight_seed": seed_of(name), "prompt_lens": list(PROMPT_LENS),
                    "greedy_prompt_len": GREEDY_PROMPT_LEN, "logit_std_target": LOGIT_STD,
                    "command": "python3 tools/make_goldens.py --out tests/data/models", "stats": stats,
                    **versions(args.device)}
            write_json(os.path.join(path, "goldens", "meta.json"), meta)
            if name == "llama_mha" and os.path.exists(TINY_TOKENIZER):
                shutil.copyfile(TINY_TOKENIZER, os.path.join(path, "tokenizer.json"))
            check(stats, f"{name}_{dtag}", failures)

            if name == "llama3_tied_rope" and dtag == "bf16":
                # the same weights under a transformers-4.x config.json; reload it and recompute
                opath = os.path.join(args.out, f"{name}_v4cfg_{dtag}")
                fresh_dir(opath)
                shutil.copyfile(os.path.join(path, "model.safetensors"),
                                os.path.join(opath, "model.safetensors"))
                if os.path.exists(os.path.join(path, "generation_config.json")):
                    shutil.copyfile(os.path.join(path, "generation_config.json"),
                                    os.path.join(opath, "generation_config.json"))
                old_style_config(os.path.join(path, "config.json"), os.path.join(opath, "config.json"))
                om = load(opath, torch.bfloat16, args.device)
                oref = load(opath, torch.float32, args.device)
                ostats = write_goldens(om, name, dtag, os.path.join(opath, "goldens"),
                                          args.device, oref)
                for f in sorted(os.listdir(os.path.join(path, "goldens"))):
                    if f.endswith(".npy"):
                        a = np.load(os.path.join(path, "goldens", f))
                        b = np.load(os.path.join(opath, "goldens", f))
                        if not np.array_equal(a, b):
                            failures.append(f"{name}_v4cfg_{dtag}: {f} differs from the v5-config model")
                meta.update(variant=f"{name}_v4cfg", what="llama3_tied_rope_bf16's weights with config.json "
                            "in the transformers 4.x spelling (rope_theta + rope_scaling, torch_dtype, "
                            "no head_dim); "
                            "goldens recomputed from this directory, identical to llama3_tied_rope_bf16's.",
                            stats=ostats)
                write_json(os.path.join(opath, "goldens", "meta.json"), meta)
                check(ostats, f"{name}_v4cfg_{dtag}", failures)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("ok")


if __name__ == "__main__":
    main()
