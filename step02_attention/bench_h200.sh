#!/usr/bin/env bash
# bench_h200.sh — step02 on a GPU machine in one go: the step02 tests (goldens on the GPU), a
# random-weight Llama-3.1-8B-shaped bf16 checkpoint made with transformers, a check of our
# logits against transformers on it, the 2048-token prefill timing, and the attention bench.
#   step02_attention/bench_h200.sh OUTDIR          (after `make all`; OUTDIR gets <= 6 files)
# Needs python3 with torch + transformers on the machine (never downloads anything).
set -u -o pipefail
OUT=${1:?usage: bench_h200.sh OUTDIR}
CKPT=${CKPT:-/tmp/llama8b}
CEIL=${CEIL:-753}   # dense bf16 GEMM peak measured on an H200 of this kind (top README; build/bin/roofline)
mkdir -p "$OUT"
B=build/bin

echo "== step02 tests"
build/tests/run_tests --filter 'step02/*' --verbose 2>&1 | tee "$OUT/tests_step02_h200.log" | grep -E "FAIL|SKIP|golden|Synthesis"

echo "== random-weight Llama-3.1-8B-shaped bf16 checkpoint -> $CKPT"
t0=$(date +%s)
if [ -f tools/make_random_checkpoint.py ]; then
    python3 tools/make_random_checkpoint.py llama-3.1-8b "$CKPT" --force 2>&1 | tail -3
else  # fallback: the same thing inline (transformers, random init on the GPU, save_pretrained)
    python3 - "$CKPT" <<'EOF'
import sys, torch
from transformers import LlamaConfig, AutoModelForCausalLM
cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                  num_key_value_heads=8, vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5,
                  rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                                       high_freq_factor=4.0, original_max_position_embeddings=8192),
                  tie_word_embeddings=False)
torch.manual_seed(0)
with torch.device("cuda"):
    m = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
m.save_pretrained(sys.argv[1])
EOF
fi
echo "checkpoint: $(( $(date +%s) - t0 )) s, $(du -sh "$CKPT" | cut -f1)"

echo "== transformers on the same checkpoint: its 2048-token prefill time; logits of 64 tokens in bf16 and in f32"
python3 - "$CKPT" <<'EOF' 2>&1 | tee "$OUT/hf_ref_h200.txt"
import sys, numpy as np, torch
from transformers import AutoModelForCausalLM
m = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16, device_map="cuda").eval()
rng = np.random.default_rng(1)
ids = rng.integers(0, m.config.vocab_size, size=64).astype(np.int32)
np.save("/tmp/ref_ids.npy", ids)
with torch.no_grad():
    lg = m(torch.tensor(ids[None].astype(np.int64), device="cuda")).logits[0].float().cpu().numpy()
np.save("/tmp/ref_logits.npy", lg)
x = torch.tensor(rng.integers(0, m.config.vocab_size, size=(1, 2048)), device="cuda")
ts = []
with torch.no_grad():
    for i in range(6):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); m(x); b.record(); torch.cuda.synchronize()
        if i: ts.append(a.elapsed_time(b))
print(f"transformers {m.config._attn_implementation} bf16 prefill T=2048: median {np.median(ts):.2f} ms of {len(ts)}")
# The truth both bf16 runs are judged against: the same bf16 weights upcast, run in f32 (no TF32).
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
m = m.float()
with torch.no_grad():
    l32 = m(torch.tensor(ids[None].astype(np.int64), device="cuda")).logits[0].float().cpu().numpy()
np.save("/tmp/ref32_logits.npy", l32)
EOF

echo "== our CUDA forward on the same 64 tokens vs transformers"
$B/forward --model "$CKPT" --device cuda --ids-npy /tmp/ref_ids.npy --logits-out /tmp/our_logits.npy | tail -8
python3 - <<'EOF' 2>&1 | tee -a "$OUT/hf_ref_h200.txt"
import numpy as np
a, b, r = np.load("/tmp/our_logits.npy"), np.load("/tmp/ref_logits.npy"), np.load("/tmp/ref32_logits.npy")
def rel(x, y): return np.abs(x - y).max() / np.abs(y).max()
top1 = (a.argmax(1) == b.argmax(1)).mean()
in5 = np.mean([b[i].argmax() in np.argsort(-a[i])[:5] for i in range(len(a))])
print(f"8B bf16 T=64 max|diff|/max|logit|: ours vs transformers bf16 {rel(a, b):.3e}; "
      f"ours vs transformers f32 {rel(a, r):.3e}; transformers bf16 vs transformers f32 {rel(b, r):.3e}")
print(f"top-1 agreement with transformers bf16 {top1:.3f}, with f32 {(a.argmax(1) == r.argmax(1)).mean():.3f} "
      f"(transformers bf16 vs f32: {(b.argmax(1) == r.argmax(1)).mean():.3f}); transformers bf16 top-1 in our top-5 {in5:.3f}")
EOF

echo "== 8B-shape bf16 prefill, T = 2048"
$B/forward --model "$CKPT" --device cuda --random-ids 2048 --reps 10 --ceiling-tflops "$CEIL" 2>&1 | tee "$OUT/prefill_8b_h200.txt"

echo "== attention bench (random weights made on the device, llama-3.1-8b shape)"
$B/attn_bench --device cuda --ceiling-tflops "$CEIL" --csv 2>&1 | tee "$OUT/attn_bench_h200.csv"
