// task.h — a synthetic task where learning shows at tiny scale: copy or reverse a random sequence.
// defines: TaskKind, TASK_BOS, TASK_SEP, TASK_SYM0, task_parse, task_name, task_seq_len,
//          task_make_batch, task_eval
//
// One example of L symbols (ids TASK_SYM0 .. TASK_SYM0 + n_sym - 1, uniform):
//   BOS s1 .. sL SEP o1 .. oL          (T = 2L + 2 tokens)
// copy: o = s;  reverse: o_i = s_{L+1-i}. The loss counts only the L positions that predict
// o1 .. oL (the prompt is random: nothing there can be learned). Copy needs one fixed relative
// jump back (L + 1 positions, which rope makes easy); reverse needs a different jump per position.
// A trained model is asked to do it through the engine: greedy decoding with step03's KV-cached forward (forward_cached_cpu).
#pragma once
#include <stdint.h>

#include "rng.h"
#include "step02_attention/forward.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { TASK_COPY = 0, TASK_REVERSE } TaskKind;
enum { TASK_BOS = 0, TASK_SEP = 1, TASK_SYM0 = 2 };

int task_parse(const char *s, TaskKind *k);  // "copy" / "reverse": 0, else -1
const char *task_name(TaskKind k);
static inline int task_seq_len(int L) { return 2 * L + 2; }
// B examples into ids (B, 2L+2) and targets (B, 2L+2) (next token; TRAIN_IGNORE outside the answer).
void task_make_batch(TaskKind k, Rng *r, int B, int L, int n_sym, int *ids, int *targets);
// n fresh examples (from `seed`), each answered by greedy decoding of L tokens with forward_cached_cpu on
// the prompt BOS s SEP. Returns the fraction answered exactly; *tok_acc (may be NULL) the
// fraction of answer tokens right.
double task_eval(const CpuModel *cm, TaskKind k, uint64_t seed, int n, int L, int n_sym, double *tok_acc);

#ifdef __cplusplus
}
#endif
