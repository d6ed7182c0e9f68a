// export.h — train -> serve: a trained model written as a Hugging Face directory.
// defines: train_export_hf, TrainGradDump, train_export_grad_dump, train_export_check_dir, export_symbol_text, EXPORT_MAX_SYMBOLS, EXPORT_BOS_TEXT, EXPORT_SEP_TEXT
//
// The directory holds what a Hugging Face checkpoint holds, so that step03's generate (model_load),
// final/'s server and transformers read it with no conversion:
//   config.json             architectures, model_type, every size, rope (theta, llama3 scaling),
//                           biases, torch_dtype, tie_word_embeddings, bos/eos ids
//   model.safetensors       every tensor under its HF name (train.h's list), fp32 or bf16; with tied
//                           embeddings only model.embed_tokens.weight, no lm_head.weight (as
//                           save_pretrained writes a tied checkpoint)
//   generation_config.json  greedy by default, the same bos/eos ids
//   tokenizer.json          (when the task's vocabulary is given) the task's ids as text: BOS
//   tokenizer_config.json   "<bos>", SEP "<sep>" (special tokens), symbol i a single character
//                           (export_symbol_text); a character-level BPE with no merges
// A gradient dump (train --grad-dump DIR, train_export_grad_dump) is that directory in fp32 (the
// weights the batch was run with) plus, for an autograd framework to redo the same step
// (tools/make_grad_goldens.py):
//   batch.json              {"batch": B, "seq_len": T, "ignore_index": -1, "input_ids": (B, T),
//                           "targets": (B, T), "loss": how the loss is defined}: targets are the
//                           next tokens already (no shift), -1 = not counted
//   c_loss.json             {"loss": L, "loss_hex": L as a C99 hex float, "n_counted": n}
//   c_grads.safetensors     dL/dparam of every tensor, fp32, under the weights' HF names and shapes
//                           (with tied embeddings the lm_head's part is in model.embed_tokens.weight)
// Everything is written into DIR.tmp-XXXXXX beside DIR and renamed to DIR at the end, so DIR
// either does not exist or is complete; an existing non-empty DIR is refused (never overwritten).
#pragma once
#include <stddef.h>

#include "safetensors.h"
#include "step08_ddp/train.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EXPORT_BOS_TEXT "<bos>"
#define EXPORT_SEP_TEXT "<sep>"
// a-z, A-Z, 0-9 (62), then the CJK ideographs U+4E00..U+9FFF: one character per symbol
#define EXPORT_MAX_SYMBOLS (62 + 0x5200)

// The UTF-8 text of task symbol i (0 .. EXPORT_MAX_SYMBOLS-1, token id TASK_SYM0 + i) into buf
// (n >= 5). Returns buf, or NULL for an i out of range.
const char *export_symbol_text(int i, char *buf, size_t n);

// Write m as a Hugging Face directory `dir` (see above). dtype: ST_F32 (the trained values
// exactly) or ST_BF16 (each value rounded to the nearest bf16, ties to even). n_sym > 0: the
// task's vocabulary (BOS, SEP and n_sym symbols, task.h's ids) goes into tokenizer.json and the
// config's bos_token_id is the task's BOS, with no eos (the task has none: generation ends at
// --max-new-tokens); n_sym = 0: no tokenizer, the config's own bos/eos ids. Returns 0, or -1 with
// a one-line reason naming the file in err (nothing is left behind then).
int train_export_hf(const TrainModel *m, const char *dir, StDtype dtype, int n_sym, char *err, int errlen);

// One batch, its loss and the gradients in m->grads (of train_forward + train_backward on it).
typedef struct {
    const int *ids, *targets;  // (B, T), targets TRAIN_IGNORE where not counted
    int B, T;
    double loss;  // train_forward's
    int n_counted;
} TrainGradDump;

// train_export_hf(m, dir, ST_F32, n_sym) plus batch.json, c_loss.json and c_grads.safetensors
// (m->grads) from g, all in one atomic write. Returns 0, or -1 + the reason in err.
int train_export_grad_dump(const TrainModel *m, const char *dir, int n_sym, const TrainGradDump *g, char *err,
                           int errlen);

// 0 when dir is missing or an empty directory (an export may go there), else -1 + the reason.
int train_export_check_dir(const char *dir, char *err, int errlen);

#ifdef __cplusplus
}
#endif
