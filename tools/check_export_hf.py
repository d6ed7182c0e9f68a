#!/usr/bin/env python3
"""Check a directory written by `train --save` (step08_ddp/export.h) with Hugging Face transformers.

Run where torch and transformers are installed (CPU is enough; the directory is small):
    pip install torch transformers tokenizers numpy
    build/bin/train --preset tiny --task copy --steps 300 --save /tmp/copy
    python3 tools/check_export_hf.py /tmp/copy --prompt '<bos>abcdef<sep>'
It loads DIR with AutoTokenizer and AutoModelForCausalLM (weights upcast to float32, as the C CPU
path does), and compares with the C programs on the same directory:
    ids       AutoTokenizer(prompt) vs build/bin/tokenize --json            must be identical
    logits    model(ids).logits vs build/bin/forward --logits-out (every position, float32)
              max |diff| / max |logit| must be <= --rtol (default 1e-4)
    greedy    model.generate(do_sample=False) vs build/bin/generate --greedy --json   identical ids
Exits 1 on any mismatch, 0 with one line per check otherwise.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out[out.index("{"):])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="the exported Hugging Face directory")
    ap.add_argument("--prompt", default="<bos>abcdef<sep>", help="prompt text (the task's symbols)")
    ap.add_argument("--new", type=int, default=6, help="greedy tokens to generate (the task's L)")
    ap.add_argument("--bin", default="build/bin", help="where the C programs are")
    ap.add_argument("--rtol", type=float, default=1e-4)
    a = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ok = True
    tok = AutoTokenizer.from_pretrained(a.dir)
    hf_ids = tok(a.prompt, add_special_tokens=False)["input_ids"]
    c_ids = run_json([os.path.join(a.bin, "tokenize"), "--tokenizer", os.path.join(a.dir, "tokenizer.json"),
                      "--text", a.prompt, "--json"])["ids"]
    same = hf_ids == c_ids
    ok &= same
    print(f"ids:    transformers {hf_ids} / C {c_ids}: {'identical' if same else 'DIFFERENT'}")

    model = AutoModelForCausalLM.from_pretrained(a.dir, torch_dtype=torch.float32)
    model.eval()
    x = torch.tensor([hf_ids])
    with torch.no_grad():
        hf_logits = model(x).logits[0].float().numpy()
    with tempfile.TemporaryDirectory() as td:
        npy = os.path.join(td, "logits.npy")
        subprocess.run([os.path.join(a.bin, "forward"), "--model", a.dir, "--device", "cpu", "--ids",
                        ",".join(map(str, hf_ids)), "--logits-out", npy], check=True, capture_output=True)
        c_logits = np.load(npy)
    rel = float(np.max(np.abs(c_logits - hf_logits)) / np.max(np.abs(hf_logits)))
    ok &= c_logits.shape == hf_logits.shape and rel <= a.rtol
    print(f"logits: shape {hf_logits.shape}, max |diff| / max |logit| = {rel:.3g} (allowed {a.rtol:g})")

    with torch.no_grad():
        gen = model.generate(x, max_new_tokens=a.new, do_sample=False, pad_token_id=0)[0, len(hf_ids):].tolist()
    c_gen = run_json([os.path.join(a.bin, "generate"), "--model", a.dir, "--device", "cpu", "--ids",
                      ",".join(map(str, hf_ids)), "--max-new-tokens", str(a.new), "--greedy", "--json"])["ids"]
    same = gen == c_gen
    ok &= same
    print(f"greedy: transformers {gen} '{tok.decode(gen)}' / C {c_gen}: {'identical' if same else 'DIFFERENT'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
