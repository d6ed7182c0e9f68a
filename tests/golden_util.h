// golden_util.h — what the model tests share: the checkpoints under tests/data/models/, their
// greedy goldens (goldens/greedy.json, written by tools/make_goldens.py) and vLLM's rule.
// defines: MODELS_DIR, Ckpt, ckpt_list, CkptModels, ckpt_models_load, ckpt_models_free, Golden,
//          golden_read, golden_load, golden_free, each_golden_ckpt, in_top5,
//          vllm_first_diff, vllm_expect
//
// vLLM's rule between two greedy runs a and b, each with its top-5 per step: identical until the
// first difference, where each side's token is in the other's top-5 (after it the two sequences
// have diverged and are not compared).
#pragma once
#include "model.h"
#include "step02_attention/forward.h"

#define MODELS_DIR "tests/data/models"

typedef struct {
    char dir[300], name[256];  // MODELS_DIR/<name>, <name>
    int has_golden;            // goldens/greedy.json exists
} Ckpt;

// Every MODELS_DIR/<name>/ (at most max) that has the file or folder <name>/need, sorted by name;
// with TEST_MODELS=name,name,... in the environment only those.
int ckpt_list(Ckpt *out, int max, const char *need);

// A checkpoint loaded for the GPU tests: its weights, step02's fp32 CPU model and GPU model
// (loading failures fail the test); f32 = its weights are fp32.
typedef struct {
    ModelWeights w;
    CpuModel cm;
    GpuModel *gm;
    int f32;
} CkptModels;
void ckpt_models_load(const Ckpt *c, CkptModels *L);
void ckpt_models_free(CkptModels *L);

typedef struct {
    int np, ng;
    int *prompt, *gen, *top5;  // (np) (ng) (ng, 5): transformers' greedy tokens and its top-5 per step
} Golden;

// dir/goldens/greedy.json into g: 1 when read, 0 when it cannot be opened (only when !required;
// required, that fails the test); a malformed file fails the test.
int golden_read(const char *dir, Golden *g, int required);
static inline void golden_load(const char *dir, Golden *g) { golden_read(dir, g, 1); }
void golden_free(Golden *g);

// fn for every checkpoint under MODELS_DIR that has goldens (ckpt_list's order, TEST_MODELS
// honoured), with its goldens and its models (GPU included) loaded and freed around the call.
// Returns how many; the GPU tests skip when it is 0.
int each_golden_ckpt(void (*fn)(const Ckpt *ck, const Golden *G, CkptModels *L, void *arg), void *arg);

int in_top5(const int *top5, int id);  // id is one of the 5
// The first step where a and b differ (n when identical); *ok = 0 when the rule is broken there.
int vllm_first_diff(const int *a, const int *a5, const int *b, const int *b5, int n, int *ok);
// The same, as a test expectation "<what>: step i: a vs b, not in each other's top-5";
// returns the agreed prefix length.
int vllm_expect(const char *what, const int *a, const int *a5, const int *b, const int *b5, int n);
