#!/usr/bin/env python3
"""PyTorch autograd goldens for step08's training: the same loss and gradients as train_cpu.c.

    build/bin/train --preset tiny --task copy --batch 4 --grad-dump DIR
    python3 tools/make_grad_goldens.py DIR

DIR is what `train --grad-dump` writes (step08_ddp/export.h): a Hugging Face directory of the
starting weights (fp32), batch.json (input_ids and targets, each (B, T), ignore_index -1),
c_loss.json and c_grads.safetensors (the C side's loss and gradients). This script loads DIR with
transformers (AutoModelForCausalLM, float32, eager attention, training mode: the configs have no
dropout, so train and eval modes compute the same), runs the batch, backpropagates with autograd
and writes beside them:
    torch_grads.safetensors   d loss / d param for every parameter, fp32, under its HF name
                              (a tied lm_head is the embedding's parameter: one tensor)
    torch_loss.json           the loss, n_counted, and the versions used
It then prints, per tensor, max_rel = max|C - torch| / max|torch| against the C gradients.

How the loss maps to train_cpu.c's (cross_entropy_cpu and task_make_batch):
  - targets are already the next tokens (the C batch stores target[t] = id[t+1] on counted
    positions), so the logits are NOT shifted here, unlike transformers' own `labels=` loss;
  - a target of -1 (TRAIN_IGNORE) does not count; the loss is the mean over ALL counted positions
    of the whole (B, T) batch together (one count n_counted, not a mean per sequence);
  - C computes log-sum-exp in double from the fp32 logits and rounds dL/dlogits to fp32; here the
    fp32 logits are cast to float64 for log_softmax and the mean, and autograd casts the gradient
    back to fp32 at the cast, so both sides differ only by the fp32 rounding of the network.
Each row of the batch is its own causal sequence at positions 0..T-1 with no padding, which is
what the model computes when called on (B, T) input_ids without an attention mask.
"""
import argparse
import json
import os
import sys

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="a directory written by train --grad-dump")
    a = ap.parse_args()

    import safetensors
    import torch
    import transformers
    from safetensors.numpy import load_file
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    with open(os.path.join(a.dir, "batch.json")) as f:
        batch = json.load(f)
    ids = torch.tensor(batch["input_ids"], dtype=torch.long)
    tg = torch.tensor(batch["targets"], dtype=torch.long)
    B, T = batch["batch"], batch["seq_len"]
    if ids.shape != (B, T) or tg.shape != (B, T):
        sys.exit(f"{a.dir}/batch.json: input_ids {tuple(ids.shape)} / targets {tuple(tg.shape)}, expected ({B}, {T})")

    model = AutoModelForCausalLM.from_pretrained(a.dir, dtype=torch.float32, attn_implementation="eager")
    model.train()
    logits = model(input_ids=ids, use_cache=False).logits  # (B, T, V) fp32
    counted = tg != batch["ignore_index"]
    n = int(counted.sum())
    logp = torch.log_softmax(logits.double(), dim=-1)
    picked = logp.gather(-1, tg.clamp(min=0).unsqueeze(-1)).squeeze(-1)  # ignored rows: any id, masked out below
    loss = -(picked * counted).sum() / n
    loss.backward()

    grads = {}
    for name, p in model.named_parameters():  # a tied lm_head is not listed again
        if p.grad is None:
            sys.exit(f"{name}: no gradient (not used by the forward?)")
        grads[name] = p.grad.detach().to(torch.float32).contiguous()
    save_file(grads, os.path.join(a.dir, "torch_grads.safetensors"), metadata={"format": "pt"})
    out = {"loss": loss.item(), "loss_hex": float.hex(loss.item()), "n_counted": n,
           "torch": torch.__version__, "transformers": transformers.__version__,
           "safetensors": safetensors.__version__, "numpy": np.__version__,
           "python": sys.version.split()[0], "device": "cpu"}
    with open(os.path.join(a.dir, "torch_loss.json"), "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")

    # against the C side, when it is there
    cg_path = os.path.join(a.dir, "c_grads.safetensors")
    if not os.path.exists(cg_path):
        return
    cg = load_file(cg_path)
    with open(os.path.join(a.dir, "c_loss.json")) as f:
        closs = json.load(f)
    if set(cg) != set(grads):
        sys.exit(f"tensor names differ: only C {sorted(set(cg) - set(grads))}, only torch {sorted(set(grads) - set(cg))}")
    print(f"loss: torch {loss.item():.10f} / C {closs['loss']:.10f} (rel {abs(loss.item() - closs['loss']) / abs(loss.item()):.2e}), "
          f"n_counted {n} / {closs['n_counted']}")
    worst = 0.0
    for name in sorted(grads):
        ref = grads[name].numpy().astype(np.float64)
        c = cg[name].astype(np.float64)
        if c.shape != ref.shape:
            sys.exit(f"{name}: C shape {c.shape}, torch {ref.shape}")
        rel = np.abs(c - ref).max() / np.abs(ref).max()
        worst = max(worst, rel)
        print(f"  {name:48s} max_rel {rel:.2e}  max|g| {np.abs(ref).max():.3e}")
    print(f"worst max_rel {worst:.2e}")


if __name__ == "__main__":
    main()
