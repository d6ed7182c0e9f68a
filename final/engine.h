// engine.h — final/'s engine: step04's loop (schedule, flat batch, forward, sample, update) on a
// thread of its own, with requests that arrive while it runs.
// defines: EngineConfig, EngineMetrics, Engine, engine_new, engine_free, engine_submit, engine_read,
//          engine_cancel, engine_release, engine_times, engine_metrics, engine_sched_stats, engine_itl,
//          engine_decode_split, ENGINE_MAX_LOGPROBS, engine_submit_lp, engine_read_lp
//
// One engine thread owns the scheduler (step04, with step05's block pool when
// EngineConfig.sched.block_size > 0), the runner (CPU or CUDA, any of steps 04-07's) and the
// sampler. Other threads (a CLI, the HTTP server's connections) never touch those: they
//   - submit a request: it is copied into a bounded queue and gets its id at once;
//   - read a request's stream: block until it has generated tokens they have not seen yet, or has
//     finished (or a timeout), and copy the new tokens out;
//   - cancel a request: it ends with FINISH_ERROR at the next step boundary, its KV freed;
//   - read the metrics (running, waiting, KV in use, token counts, ...).
// One mutex guards the queue, the request table and the scheduler's state between steps; the
// engine thread holds it to take in the queue, to plan a step and to apply the step's tokens, never
// during the forward, which is where the time goes. The engine never waits on a reader.
//
// Asynchronous scheduling (EngineConfig.overlap, vLLM's --async-scheduling): the host's part of a
// step (plan, flat batch, upload, launch) runs while the device still computes the previous one.
// When step N's tokens are drawn on the device (greedy or temperature-only rows, no logprobs), the
// engine launches N (runner_launch) and, before its tokens are back, applies N to the scheduler
// with a placeholder for every sampled token (Request.pending): each such request has one more
// token and N's rows computed, and finishes by length already. Step N+1 is then planned and
// launched at once; a decode row whose input is N's placeholder takes N's token on the device
// (the launch's fix-ups). Only then does the host wait for N's tokens and put them in place. A
// token that turns out to be an EOS ends its request there (sched_stop): its row in N+1, already
// launched, is dropped (its K/V lands in a block the request just gave back, before any later
// step uses it: the device runs the steps in order). Readers never see a pending token. Steps
// whose tokens the host draws (top-k/top-p/min-p rows, logprobs) run as before, after the step in
// flight has been applied. The tokens are the same as without overlap: a token depends on its
// request, position and logits only.
#pragma once
#include "step04_batching/batch.h"
#include "step04_batching/scheduler.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    SchedConfig sched;  // the step's limits, the KV layout, the EOS ids (scheduler.h)
    int queue_cap;      // submitted requests not yet taken in by the engine thread, at most (0: 256)
    double min_step_s;  // a step that ran a forward lasts at least this long (0: off). For tests: with a tiny
                        // model requests stay in flight long enough to be cancelled, to queue, to drain
    int overlap;        // 1: asynchronous scheduling (the file's top comment); 0: every step waits for its tokens
} EngineConfig;

typedef struct {
    int running, waiting;         // after the last step (waiting: admitted neither yet, nor preempted back)
    int queued;                   // submitted, not yet taken in
    double kv_usage;              // paged: blocks in use / the pool (without the null block); slots: reserved / budget
    long steps;                   // steps that ran a forward
    long prompt_tokens;           // Σ prompt tokens of the requests taken in
    long generation_tokens;       // Σ tokens generated
    long finished[4];             // finished requests by FinishReason (FINISH_STOP, FINISH_LENGTH, FINISH_ERROR)
    long preemptions;             // paged: requests preempted (recomputed later)
    long prefix_query_tokens, prefix_hit_tokens;  // paged, prefix cache: tokens looked up and found
    int peak_running;
    long overlapped_steps;        // steps launched while the previous step was still running (EngineConfig.overlap)
} EngineMetrics;

typedef struct Engine Engine;

// Starts the engine thread over runner r (borrowed: the caller frees it after engine_free), for a
// model of vocab ids. The runner's KV must match c->sched (slots: max_num_seqs x max_len; paged:
// num_blocks of block_size) and take min(max_num_batched_tokens, max_num_seqs x max_len) rows a
// step. NULL + err on bad limits.
Engine *engine_new(Runner *r, int vocab, const EngineConfig *c, char *err, int errlen);
// Every request already submitted runs to its end, then the thread stops and everything the engine
// holds is freed (the runner is not).
void engine_free(Engine *e);
// A request of n_prompt ids (copied): its id (>= 0, in submission order), or -1 when the queue is
// full (try again later), -2 when the engine is shutting down, -3 on bad arguments (no prompt, an
// id outside the vocabulary, max_tokens < 1). A request that can never run (a prompt of max_len
// ids or more, more KV than the pool holds) is not refused here: it finishes with FINISH_ERROR.
// key: its sampling key (sample_keyed's request index: a sampled token depends on seed, key and
// position only); -1 = its id.
long engine_submit(Engine *e, int key, const int *prompt, int n_prompt, int max_tokens, const SamplerParams *sp,
                   int ignore_eos);
// The same, with logprobs >= 0: every generated token also gets its log-probability under the
// model (log_softmax of the raw logits, before temperature and the filters, as vLLM's default) and
// the `logprobs` most probable ids with theirs (0 .. ENGINE_MAX_LOGPROBS); logprobs < 0: none.
// A step where some row asks for them brings its logits to the host (runner_forward with logits)
// and samples there; steps without such rows run as before. -3 also for logprobs > the maximum.
enum { ENGINE_MAX_LOGPROBS = 20 };
long engine_submit_lp(Engine *e, int key, const int *prompt, int n_prompt, int max_tokens, const SamplerParams *sp,
                      int ignore_eos, int logprobs);
// Request id's stream: waits until it has more than *seen generated tokens or has finished, or
// until timeout_s has passed (timeout_s < 0: no limit), then copies its generated tokens
// *seen .. (at most cap of them) to out and advances *seen. *finish: FINISH_NONE while it runs,
// else why it ended (set once every token has been read). Returns the tokens copied, or -1 for an
// unknown or released id.
int engine_read(Engine *e, long id, int *seen, int *out, int cap, FinishReason *finish, double timeout_s);
// engine_read plus, for a request submitted with logprobs = N >= 0, each copied token's
// log-probability into lp (cap) and its top N ids and log-probabilities, most probable first, into
// top_ids and top_lp (cap, N); any of the three may be NULL (a request without logprobs leaves
// them untouched).
int engine_read_lp(Engine *e, long id, int *seen, int *out, float *lp, int *top_ids, float *top_lp, int cap,
                   FinishReason *finish, double timeout_s);
// Asks request id to end (FINISH_ERROR) at the next step boundary; its KV goes back to the pool
// then. Unknown or finished ids: nothing.
void engine_cancel(Engine *e, long id);
// The caller is done with finished request id: its token memory is freed and the id is unknown
// from then on. A request that has not finished is cancelled first and released when it ends.
void engine_release(Engine *e, long id);
// Request id's times on the engine's clock (seconds since engine_new), as its scheduler records
// them: taken in from the queue, first scheduled, its first token sampled, its end (-1 until each
// happens; a token's time is the end of the step that sampled it). 0, or -1 for an id not taken in yet or released.
int engine_times(Engine *e, long id, double *arrival_s, double *first_sched_s, double *first_token_s, double *finish_s);
void engine_metrics(Engine *e, EngineMetrics *m);
// The scheduler's counters (scheduler.h's SchedStats: steps, tokens, peaks, preemptions, prefix
// cache) as of the last step.
void engine_sched_stats(Engine *e, SchedStats *st);
// Every inter-token gap so far (ms, the steps' end times: a request's token minus its previous
// one), malloc'ed into *itl_ms (n in *n), the seconds spent inside runner_forward and the
// forwards' device time (CUDA events; 0 on the CPU).
void engine_itl(Engine *e, double **itl_ms, long *n, double *forward_s, double *device_s);
// The decode steps alone (every sequence one new row): how many, their time inside runner_forward
// and their device time; the other steps hold prompt chunks.
void engine_decode_split(Engine *e, long *steps, double *forward_s, double *device_s);

#ifdef __cplusplus
}
#endif
