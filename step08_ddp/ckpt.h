// ckpt.h — training checkpoints: everything that makes a resumed run continue bit for bit.
// defines: CKPT_FORMAT, CkptState, CkptKV, CKPT_MAX_KV, ckpt_kv_set, CkptSnapshot, ckpt_step_dir_name,
//          ckpt_write_dir, ckpt_latest, ckpt_incomplete_after, ckpt_load, ckpt_prune,
//          CkptWriter, ckpt_writer_init, ckpt_save, ckpt_wait, ckpt_writer_free
//
// One directory per step, DIR/step-000123/:
//   model.safetensors      every parameter under its Hugging Face name, F32 (train.h's tensor list)
//   optimizer.safetensors  AdamW's moments: "exp_avg.<name>" (m) and "exp_avg_sq.<name>" (v), F32
//   state.json             format, step, AdamW t, the data stream's RNG (PCG32 state and increment),
//                          the model config and the run's options (checked on load), the world size,
//                          and for each file above its size and xxHash64
//   DONE                   written last: the checkpoint is complete
// Atomicity: the files are written (and fsync'ed) into DIR/.tmp-step-000123-<pid>, which is then
// renamed to DIR/step-000123 (one rename: a reader sees all of it or nothing), then DONE is
// written (DONE.tmp renamed to DONE). A directory without DONE is refused by ckpt_load and
// skipped by ckpt_latest; a leftover .tmp-* is never read.
// Several ranks (data parallelism, ddp.h): the parameters and moments are the same on every rank
// (one all-reduced gradient), and so is the data position: every rank draws the whole global
// batch from the one data stream and keeps its own rows. So rank 0 alone writes the checkpoint,
// DONE last as above, and state.json's "world_size" says how many ranks trained it (a resume must
// run as many: the per-rank batch and the order of the gradient sums depend on it).
#pragma once
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "rng.h"
#include "step08_ddp/train.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CKPT_FORMAT 1

// The training state beyond the buffers: what a resumed loop needs to draw the same batches and
// take the same optimizer steps.
typedef struct {
    long step;  // optimizer steps completed (the loop resumes at 0-based step `step`)
    long adam_t;
    Rng data;   // the training data stream, as it is after step `step`'s batch
    int world_size;  // ranks that trained it (0 is written as 1)
} CkptState;

// The run's options that must match on resume (task, batch, schedule ...): key -> value string.
#define CKPT_MAX_KV 24
typedef struct {
    char key[32];
    char val[96];
} CkptKV;
// Append or replace key (printf-formatted value). Returns the new count (exits when full).
int ckpt_kv_set(CkptKV *kv, int n, const char *key, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

// What one checkpoint write reads: the parameter layout and three buffers of n_params floats.
typedef struct {
    const TrainModel *model;  // tensor names, offsets, shapes, config (never its buffers)
    const float *params, *m, *v;
    CkptState st;
    const CkptKV *run;
    int n_run;
} CkptSnapshot;

// "step-000123" into buf.
void ckpt_step_dir_name(long step, char *buf, size_t n);
// Write DIR/step-<st.step> atomically (above). 0, or -1 + one line in err naming the file.
int ckpt_write_dir(const char *dir, const CkptSnapshot *s, char *err, int errlen);
// The newest DIR/step-* holding DONE into path: 1 found, 0 none (or DIR missing).
int ckpt_latest(const char *dir, char *path, size_t n);
// The DIR/step-* directories WITHOUT DONE whose step is above `step` (the ones a resume from
// `step` skips: their write was interrupted), as "step-000020 step-000030" into names (newest
// first). Returns how many.
int ckpt_incomplete_after(const char *dir, long step, char *names, size_t n);
// Load a checkpoint directory into m (already laid out for the same config) and o (n_params),
// after checking: DONE present, state.json readable with every field, format and world size, the
// config and every run option equal to `run`, each file's size and xxHash64, every tensor present
// as F32 with its shape. Any failure is -1 + one line naming the file and what is wrong, and
// leaves m and o untouched.
int ckpt_load(const char *step_dir, TrainModel *m, AdamW *o, CkptState *st, const CkptKV *run, int n_run, char *err,
              int errlen);
// Delete all but the `keep` newest complete checkpoints of DIR (keep <= 0: delete none).
int ckpt_prune(const char *dir, int keep, char *err, int errlen);

// Periodic checkpoints, synchronous or asynchronous. Sync: ckpt_save writes on the calling thread
// (the training loop waits for the whole write). Async: ckpt_save waits for the previous write
// (at most one in flight), copies params, m and v into a host snapshot (memcpy), starts a thread
// that writes it, and returns: training continues while the disk works.
typedef struct {
    char dir[1024];
    int async, keep;
    CkptKV run[CKPT_MAX_KV];
    int n_run;
    float *snap;      // (3, n_params) async snapshot: params, m, v
    size_t n_snap;
    void *(*snap_alloc)(size_t);  // how snap is allocated (NULL: malloc / free)
    void (*snap_free)(void *);
    double t_begin, t_fill;       // when ckpt_snapshot_begin was called, when its wait ended
    CkptSnapshot job;
    pthread_t th;
    int in_flight;
    int failed;       // the background write failed: err holds why
    char err[1024];
    double write_s;   // the last write's wall time (on the writer's thread in async mode)
    // totals
    int n_written;
    double stall_s;     // time the training thread spent in ckpt_save / ckpt_wait
    double write_total_s, snapshot_s;
} CkptWriter;

int ckpt_writer_init(CkptWriter *w, const char *dir, int async, int keep, const CkptKV *run, int n_run, char *err,
                     int errlen);
int ckpt_save(CkptWriter *w, const TrainModel *m, const AdamW *o, const CkptState *st, char *err, int errlen);
// For a trainer whose state lives elsewhere (on a GPU): the caller fills the snapshot itself.
// ckpt_snapshot_begin waits for the write in flight (at most one) and returns the (3, n) buffer to
// fill with params, m and v (allocated once, with `alloc` when ckpt_writer_set_alloc gave one:
// pinned host memory makes a device's download several times faster than into pageable memory);
// ckpt_snapshot_commit then writes it (sync) or starts its write on the background thread (async).
// The time from begin to commit's return counts as the training thread's stall (and, async, as
// snapshot time).
void ckpt_writer_set_alloc(CkptWriter *w, void *(*alloc)(size_t), void (*free_fn)(void *));
float *ckpt_snapshot_begin(CkptWriter *w, size_t n, char *err, int errlen);
int ckpt_snapshot_commit(CkptWriter *w, const TrainModel *m, const CkptState *st, char *err, int errlen);
// Wait for the write in flight (if any); its failure is reported here.
int ckpt_wait(CkptWriter *w, char *err, int errlen);
void ckpt_writer_free(CkptWriter *w);

#ifdef __cplusplus
}
#endif
