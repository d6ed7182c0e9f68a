// bench_main.c — batch_bench's body (bench_main.h), also `llm bench`'s: a whole workload through the scheduler and the batched runner: static vs
// continuous batching on the same requests, and what the token budget trades; step04's KV slots
// vs step05's paged KV (block pool, prefix caching, preemption) at the same KV budget.
//
//   build/bin/batch_bench --preset tiny --trace nano --input-len 8:64 --output-len 8:64 --device cpu
//   build/bin/batch_bench --preset tiny --trace nano --input-len 8:64 --output-len 8:64 --device cpu --policy static
//   build/bin/batch_bench --preset qwen3-0.6b --trace nano --device cuda --json > cont.json
//   build/bin/batch_bench --model DIR --requests reqs.jsonl --json --timeline tl.csv
//   build/bin/batch_bench --preset tiny --trace poisson --rate 50 --num-requests 100 --input-len 16:128 --output-len 8:64
//   build/bin/batch_bench --preset tiny --trace nano --num-requests 64 --input-len 8:64 --output-len 8:64 --device cpu
//       --kv paged --max-num-seqs 64 --num-blocks 129 --steps-csv steps.csv     (step05: 128 blocks of 16 tokens)
//   build/bin/batch_bench --preset tiny --trace nano --num-requests 32 --shared-prefix 256 --input-len 16:16
//       --output-len 8:8 --device cpu --kv paged --prefix-cache on --outputs on.jsonl
//
// How it measures: the engine loop (offline.h) runs on the wall clock from time 0; a request
// is not admitted before its arrival_s. TTFT = first token - arrival; TPOT = (finish - first
// token) / (output tokens - 1); output tok/s = output tokens / (last finish - 0); total tok/s
// counts prompt tokens too. On CUDA a greedy step copies only the argmax of each sampling row
// (computed on the device); a step with a sampled row copies the logits of its sampling rows.
// Warm-up forwards run before the clock starts (a full-budget prompt step and a decode step on CUDA).
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "check.h"
#include "cpu_env.h"
#include "gpu.h"
#include "model.h"
#include "rng.h"
#include "step01_matmul/accounting.h"
#include "step04_batching/batch.h"
#include "step04_batching/bench_main.h"
#include "step04_batching/offline.h"
#include "step04_batching/scheduler.h"
#include "step05_paged/kv_blocks.h"
#include "step06_quant/qmodel.h"  // --quant and quantized checkpoints
#include "table.h"
#include "timer.h"

// A small Qwen3-style model (q/k norm, GQA) for CPU runs and CI: seconds for a scaled-down trace.
static const char *TINY_JSON =
    "{\"architectures\":[\"Qwen3ForCausalLM\"],\"hidden_size\":128,\"intermediate_size\":384,"
    "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,\"head_dim\":32,\"vocab_size\":2048,"
    "\"max_position_embeddings\":4096,\"rms_norm_eps\":1e-6,\"rope_theta\":1000000.0,\"tie_word_embeddings\":true}";

// {"index", "output_ids", "finish_reason"} of a request: the --outputs line, and the start of its
// --json record.
static json_t *request_output_json(const Request *r) {
    json_t *o = json_object(), *ids = json_array();
    for (int t = r->num_prompt; t < r->num_tokens; t++) json_array_append_new(ids, json_integer(r->tokens[t]));
    json_object_set_new(o, "index", json_integer(r->index));
    json_object_set_new(o, "output_ids", ids);
    json_object_set_new(o, "finish_reason", json_string(finish_reason_name(r->finish)));
    return o;
}

static const BenchHooks *g_hooks;  // NULL: batch_bench's
static void usage(FILE *f) {
    if (g_hooks && g_hooks->usage_note) fprintf(f, "%s", g_hooks->usage_note);
    fprintf(f,
            "usage: %s (--model DIR | --preset NAME) (--requests FILE.jsonl | --trace nano | --trace poisson\n"
            "                   --rate R --num-requests N --input-len A:B --output-len C:D) [--policy continuous|static]\n"
            "                   [--max-num-seqs N] [--max-num-batched-tokens N] [--max-model-len N] [--device cpu|cuda]\n"
            "                   [--json] [--timeline FILE.csv] [--outputs FILE.jsonl] [--steps-csv FILE.csv]\n"
            "                   [--kv slots|paged] [--block-size B] [--num-blocks N | --kv-gib G | --gpu-memory-utilization U]\n"
            "                   [--prefix-cache on|off] [--shared-prefix N] [--prefill-attn fused|gather] [--batch-invariant]\n"
            "                   [--quant Q] [--enforce-eager]\n"
            "  --preset        tiny (built in: Qwen3-style, 2 layers, d=128) or a step01 preset (qwen3-0.6b,\n"
            "                  llama-3.1-8b, ...): random weights (bf16 on the GPU, fp32 on the CPU)\n"
            "  --requests      one JSON object per line: {\"prompt_ids\": [...], \"max_tokens\": N, \"temperature\": 0,\n"
            "                  \"top_p\": 1, \"top_k\": 0, \"min_p\": 0, \"seed\": S, \"ignore_eos\": true, \"arrival_s\": 0.0}\n"
            "                  (only prompt_ids and max_tokens are required)\n"
            "  --trace nano    nano-vllm's bench: 256 requests, seed 0, prompt and output lengths uniform in 100..1024,\n"
            "                  random ids, greedy, ignore EOS, all at time 0 (--input-len/--output-len/--num-requests\n"
            "                  override, e.g. 8:64 for a CPU run in seconds)\n"
            "  --trace poisson the same with Poisson arrivals at --rate R requests/s\n"
            "  --policy        continuous (default): vLLM's rule every step; static: fixed batches of max_num_seqs\n"
            "                  in arrival order, each run until its longest request ends\n"
            "  --max-num-seqs  sequences per step at most (default 256; also the number of KV slots)\n"
            "  --max-num-batched-tokens  the token budget of a step (default 8192)\n"
            "  --max-model-len positions per KV slot (default: the longest prompt + max_tokens of a request;\n"
            "                  static: the longest prompt + the longest max_tokens, a padded batch's row length)\n"
            "  --json          {\"requests\": [...in input order], \"summary\": {...}} instead of the table\n"
            "  --timeline      per request: arrival, first scheduled, first token, finish (seconds), lengths\n"
            "  --outputs       one line per request in input order: {\"index\", \"output_ids\", \"finish_reason\"}\n"
            "  --steps-csv     one row per engine step: time, tokens, running/waiting requests, KV tokens written and\n"
            "                  allocated, KV blocks used/cached/free, preemptions so far (slots: a block = one slot)\n"
            "  --kv            slots (default: step04, one max_model_len slot per sequence) or paged (step05: a pool\n"
            "                  of blocks; --block-size, --num-blocks, --kv-gib and --prefix-cache imply it)\n"
            "  --block-size    positions per KV block (default 16)\n"
            "  --num-blocks    the block pool, the null block included (default: the KV tokens of step04's\n"
            "                  max_num_seqs x max_model_len slots, at least one whole sequence, + 1; llm bench on a GPU:\n"
            "                  --gpu-memory-utilization 0.9)\n"
            "  --kv-gib        the block pool as GiB of K/V memory instead (2 x layers x kv_heads x head_dim x\n"
            "                  element bytes per token)\n"
            "  --gpu-memory-utilization  CUDA: the block pool gets this share of the device memory minus what the\n"
            "                  weights and the runner's workspaces take (vLLM's rule)\n"
            "  --enforce-eager CUDA: no CUDA graphs (by default decode steps replay a graph per batch-size bucket)\n"
            "  --prefix-cache  on (default with paged KV) or off: share the full blocks of equal prefixes\n"
            "  --shared-prefix --trace only: every prompt starts with the same N ids, then its own --input-len ids\n"
            "  --prefill-attn  CUDA: the attention of prompt chunks: flash (default: step07's flash attention, one launch\n"
            "                  per layer for every chunk of more than one row, K/V read from the cache; slots or paged),\n"
            "                  fused (paged KV: step05's paged prefill kernel, the same rows) or gather (chunks of more\n"
            "                  than 16 rows: the GEMM path per sequence, its context gathered first when paged; shorter\n"
            "                  chunks as decode rows). A path that does not take the model falls back to the next\n"
            "  --batch-invariant  CUDA, paged KV: a row's result independent of the rest of its step (GEMMs always\n"
            "                  of 256 rows, no GEMV for a lone row, every row's attention by one kernel): greedy outputs identical\n"
            "                  with the prefix cache on or off and under any token budget; slower\n"
            "  --quant         quantized projections (step06): round to nearest at load (INT8 per channel, INT4 groups\n"
            "                  of 128): none (default), rtn-int8, rtn-int4, or either with +lm_head (the lm_head\n"
            "                  too); random integers with --preset on the GPU; a GPTQ / AWQ checkpoint runs\n"
            "                  quantized without it\n", g_hooks ? g_hooks->prog : "batch_bench");
}

// ---------------------------------------------------------------- option values (common/args.h: strict)

static void opt_range(const char *flag, const char *s, int lo, int hi, int *a, int *b) {
    const char *colon = strchr(s, ':');
    if (!colon || colon == s || !colon[1]) arg_die("%s: '%s' is not A:B", flag, s);
    char left[64];
    const size_t n = (size_t)(colon - s);
    if (n >= sizeof left) arg_die("%s: '%s' is not A:B", flag, s);
    memcpy(left, s, n);
    left[n] = 0;
    *a = (int)arg_int(flag, left, lo, hi);
    *b = (int)arg_int(flag, colon + 1, lo, hi);
    if (*a > *b) arg_die("%s: '%s': A must be <= B", flag, s);
}

// ---------------------------------------------------------------- requests

typedef struct {
    Request *r;
    int n, cap;
} ReqList;

static Request *req_push(ReqList *l) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 64;
        l->r = realloc(l->r, (size_t)l->cap * sizeof(Request));
        if (!l->r) die("out of memory");
    }
    return &l->r[l->n++];
}

// A number field of a JSONL line, range-checked; absent: def. Exits naming file, line and field.
static double jnum(const json_t *o, const char *key, double def, double lo, double hi, int integer, const char *file,
                   int line) {
    const json_t *v = json_object_get(o, key);
    if (!v) return def;
    if (integer ? !json_is_integer(v) : !json_is_number(v))
        die("%s:%d: field \"%s\": must be %s", file, line, key, integer ? "an integer" : "a number");
    const double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) die("%s:%d: field \"%s\": %g is outside %g..%g", file, line, key, x, lo, hi);
    return x;
}

static void read_jsonl(const char *path, int vocab, ReqList *l) {
    FILE *f = fopen_check(path, "r");
    char *buf = NULL;
    size_t cap = 0;
    ssize_t len;
    int line = 0;
    static const char *known[] = {"prompt_ids", "max_tokens", "temperature", "top_p", "top_k",
                                  "min_p",      "seed",       "ignore_eos",  "arrival_s"};
    while ((len = getline(&buf, &cap, f)) >= 0) {
        line++;
        int blank = 1;
        for (ssize_t i = 0; i < len; i++) blank &= buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\n' || buf[i] == '\r';
        if (blank) continue;
        json_error_t je;
        json_t *o = json_loads(buf, 0, &je);
        if (!o) die("%s:%d: not JSON: %s (column %d)", path, line, je.text, je.column);
        if (!json_is_object(o)) die("%s:%d: expected one JSON object per line", path, line);
        const char *key;
        json_t *val;
        json_object_foreach(o, key, val) {
            int ok = 0;
            for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) ok |= !strcmp(key, known[k]);
            if (!ok) die("%s:%d: field \"%s\": unknown (known: prompt_ids, max_tokens, temperature, top_p, top_k, min_p, seed, ignore_eos, arrival_s)", path, line, key);
        }
        const json_t *ids = json_object_get(o, "prompt_ids");
        if (!ids) die("%s:%d: field \"prompt_ids\": missing", path, line);
        if (!json_is_array(ids) || json_array_size(ids) == 0)
            die("%s:%d: field \"prompt_ids\": must be a non-empty array of token ids", path, line);
        const int np = (int)json_array_size(ids);
        int *p = xmalloc((size_t)np * sizeof(int));
        for (int i = 0; i < np; i++) {
            const json_t *v = json_array_get(ids, (size_t)i);
            if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab)
                die("%s:%d: field \"prompt_ids\": element %d is not a token id in 0..%d", path, line, i, vocab - 1);
            p[i] = (int)json_integer_value(v);
        }
        if (!json_object_get(o, "max_tokens")) die("%s:%d: field \"max_tokens\": missing", path, line);
        const int mt = (int)jnum(o, "max_tokens", 0, 1, 1 << 20, 1, path, line);
        SamplerParams sp = {.temperature = (float)jnum(o, "temperature", 0, 0, 100, 0, path, line),
                            .top_p = (float)jnum(o, "top_p", 1, 1e-6, 1, 0, path, line),
                            .top_k = (int)jnum(o, "top_k", 0, 0, 1 << 30, 1, path, line),
                            .min_p = (float)jnum(o, "min_p", 0, 0, 0.999999, 0, path, line),
                            .seed = (uint64_t)jnum(o, "seed", 0, 0, 9007199254740992.0, 1, path, line)};
        sp.greedy = sp.temperature <= 0;
        const json_t *ie = json_object_get(o, "ignore_eos");
        if (ie && !json_is_boolean(ie)) die("%s:%d: field \"ignore_eos\": must be true or false", path, line);
        const double arr = jnum(o, "arrival_s", 0, 0, 1e9, 0, path, line);
        Request *r = req_push(l);
        request_init(r, l->n - 1, p, np, mt, &sp, ie ? json_is_true(ie) : 0, arr);
        free(p);
        json_decref(o);
    }
    free(buf);
    fclose(f);
    if (l->n == 0) die("%s: no requests", path);
}

static int uniform_int(Rng *g, int a, int b) { return a + (int)(rng_u32(g) % (uint32_t)(b - a + 1)); }

// nano-vllm's workload (its ids come from Python's random; these from PCG32 seed 0: the same
// distribution, not the same ids); poisson: the same with exponential inter-arrival gaps.
// shared > 0: every prompt starts with the same shared ids (their own PCG32 stream, seed 1), then
// the ids it would have had without them.
static void make_trace(int poisson, int n, int in_a, int in_b, int out_a, int out_b, double rate, int shared, int vocab,
                       ReqList *l) {
    Rng g, gp;
    rng_seed(&g, 0);
    rng_seed(&gp, 1);
    const int id_max = vocab < 10000 ? vocab : 10000;
    int *p = xmalloc((size_t)(shared + in_b) * sizeof(int));
    for (int j = 0; j < shared; j++) p[j] = (int)(rng_u32(&gp) % (uint32_t)id_max);
    const SamplerParams sp = {.greedy = 1, .temperature = 0, .top_p = 1};
    double t = 0;
    for (int i = 0; i < n; i++) {
        const int np = uniform_int(&g, in_a, in_b);
        for (int j = 0; j < np; j++) p[shared + j] = (int)(rng_u32(&g) % (uint32_t)id_max);
        const int mt = uniform_int(&g, out_a, out_b);
        if (poisson && i > 0) t += -log(1.0 - (double)rng_uniform(&g)) / rate;
        request_init(req_push(l), i, p, shared + np, mt, &sp, 1, t);
    }
    free(p);
}

// --steps-csv: one row per engine step (offline.h's on_step)
typedef struct {
    FILE *f;
    long step;
} StepsCsv;

static void on_step_csv(void *ctx, const Scheduler *s, const SchedPlan *p, double t) {
    StepsCsv *c = ctx;
    int used, cached, free_;
    if (s->paged) {
        const KvBlockCounts k = kvb_counts(&s->blocks);
        used = k.in_use, cached = k.cached, free_ = k.free;
    } else used = s->kv.n_slots - s->kv.n_free, cached = 0, free_ = s->kv.n_free;
    fprintf(c->f, "%ld,%.6f,%ld,%d,%d,%ld,%ld,%d,%d,%d,%ld\n", ++c->step, t, p->n_tokens, s->n_running, sched_num_waiting(s),
            s->st.kv_used_now, s->st.kv_reserved_now, used, cached, free_, s->st.preemptions);
}

// ---------------------------------------------------------------- statistics

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pctl(const double *v, int n, double q) {  // linear interpolation, as numpy's default
    if (n == 0) return NAN;
    double *s = xmalloc((size_t)n * sizeof(double));
    memcpy(s, v, (size_t)n * sizeof(double));
    qsort(s, (size_t)n, sizeof(double), cmp_double);
    const double pos = q * (n - 1);
    const int lo = (int)floor(pos), hi = lo + 1 < n ? lo + 1 : lo;
    const double r = s[lo] + (s[hi] - s[lo]) * (pos - lo);
    free(s);
    return r;
}

int bench_main(int argc, char **argv, const BenchHooks *h) {
    g_hooks = h;
    const char *model_dir = NULL, *preset = NULL, *req_path = NULL, *trace = NULL, *device = NULL, *timeline = NULL;
    const char *outputs = NULL, *steps_csv = NULL;
    SchedPolicy policy = POLICY_CONTINUOUS;
    int max_seqs = 256, max_len = 0, n_req = -1, json = 0, in_a = 100, in_b = 1024, out_a = 100, out_b = 1024;
    int lens_given = 0;
    long budget = 8192;
    double rate = -1;
    // KV layout: -1 = not given (slots unless a paged option is), 0 = slots, 1 = paged
    int kv_paged = -1, paged_opt = 0, block_size = 16, num_blocks = 0, prefix_cache = 1, shared = 0;
    int prefill_mode = PREFILL_FLASH, batch_inv = 0, eager = 0;
    double kv_gib = 0, gpu_util = 0;
    QuantSpec qs;
    quant_spec_parse("none", &qs);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int more = i + 1 < argc;
        if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--enforce-eager")) eager = 1;
        else if (!more) arg_help_or_unknown(a, usage);
        else if (!strcmp(a, "--model")) model_dir = argv[++i];
        else if (!strcmp(a, "--preset")) preset = argv[++i];
        else if (!strcmp(a, "--requests")) req_path = argv[++i];
        else if (!strcmp(a, "--trace")) trace = argv[++i];
        else if (!strcmp(a, "--device")) device = argv[++i];
        else if (!strcmp(a, "--timeline")) timeline = argv[++i];
        else if (!strcmp(a, "--rate")) rate = arg_float(a, argv[++i], 0, 1e9, ARG_LO_OPEN);
        else if (!strcmp(a, "--num-requests")) n_req = (int)arg_int(a, argv[++i], 1, 1000000);
        else if (!strcmp(a, "--input-len")) opt_range(a, argv[++i], 1, 1 << 20, &in_a, &in_b), lens_given |= 1;
        else if (!strcmp(a, "--output-len")) opt_range(a, argv[++i], 1, 1 << 20, &out_a, &out_b), lens_given |= 2;
        else if (!strcmp(a, "--max-num-seqs")) max_seqs = (int)arg_int(a, argv[++i], 1, 65536);
        else if (!strcmp(a, "--max-num-batched-tokens")) budget = (long)arg_int(a, argv[++i], 1, 1 << 24);
        else if (!strcmp(a, "--max-model-len")) max_len = (int)arg_int(a, argv[++i], 2, 1 << 22);
        else if (!strcmp(a, "--outputs")) outputs = argv[++i];
        else if (!strcmp(a, "--quant")) {
            if (quant_spec_parse(argv[++i], &qs) != 0) arg_die("--quant %s: expected none, rtn-int8, rtn-int4, rtn-int8+lm_head or rtn-int4+lm_head", argv[i]);
        }
        else if (!strcmp(a, "--steps-csv")) steps_csv = argv[++i];
        else if (!strcmp(a, "--shared-prefix")) shared = (int)arg_int(a, argv[++i], 0, 1 << 20);
        else if (!strcmp(a, "--block-size")) block_size = (int)arg_int(a, argv[++i], 1, 1 << 16), paged_opt = 1;
        else if (!strcmp(a, "--num-blocks")) num_blocks = (int)arg_int(a, argv[++i], 2, 1 << 30), paged_opt = 1;
        else if (!strcmp(a, "--kv-gib")) kv_gib = arg_float(a, argv[++i], 0, 1e6, ARG_LO_OPEN), paged_opt = 1;
        else if (!strcmp(a, "--gpu-memory-utilization")) gpu_util = arg_float(a, argv[++i], 0, 1, ARG_LO_OPEN), paged_opt = 1;
        else if (!strcmp(a, "--kv")) {
            const char *k = argv[++i];
            if (!strcmp(k, "slots")) kv_paged = 0;
            else if (!strcmp(k, "paged")) kv_paged = 1;
            else arg_die("--kv: '%s' is not slots or paged", k);
        } else if (!strcmp(a, "--prefix-cache")) {
            const char *k = argv[++i];
            if (!strcmp(k, "on")) prefix_cache = 1;
            else if (!strcmp(k, "off")) prefix_cache = 0;
            else arg_die("--prefix-cache: '%s' is not on or off", k);
            paged_opt = 1;
        }
        else if (!strcmp(a, "--batch-invariant")) batch_inv = 1;
        else if (!strcmp(a, "--prefill-attn")) {
            const char *k = argv[++i];
            if (!strcmp(k, "flash")) prefill_mode = PREFILL_FLASH;
            else if (!strcmp(k, "fused")) prefill_mode = PREFILL_PAGED;
            else if (!strcmp(k, "gather") || !strcmp(k, "gemm")) prefill_mode = PREFILL_GEMM;
            else arg_die("--prefill-attn: '%s' is not flash, fused or gather", k);
        }
        else if (!strcmp(a, "--policy")) {
            const char *p = argv[++i];
            if (!strcmp(p, "continuous")) policy = POLICY_CONTINUOUS;
            else if (!strcmp(p, "static")) policy = POLICY_STATIC;
            else arg_die("--policy: '%s' is not continuous or static", p);
        } else arg_help_or_unknown(a, usage);
    }
    if (!model_dir == !preset) {
        usage(stderr);
        arg_die("need exactly one of --model and --preset");
    }
    if (!req_path == !trace) {
        usage(stderr);
        arg_die("need exactly one of --requests and --trace");
    }
    const int poisson = trace && !strcmp(trace, "poisson");
    if (trace && !poisson && strcmp(trace, "nano")) arg_die("--trace must be nano or poisson, not %s", trace);
    if (poisson && (rate < 0 || n_req < 0 || lens_given != 3))
        arg_die("--trace poisson needs --rate, --num-requests, --input-len and --output-len");
    if (!poisson && rate >= 0) arg_die("--rate goes with --trace poisson");
    if (req_path && (n_req >= 0 || lens_given)) arg_die("--num-requests/--input-len/--output-len go with --trace");
    if (req_path && shared) arg_die("--shared-prefix goes with --trace");
    if (kv_paged == 0 && paged_opt)
        arg_die("--kv slots: --block-size, --num-blocks, --kv-gib, --gpu-memory-utilization and --prefix-cache are options "
                "of --kv paged");
    const int paged = kv_paged == 1 || paged_opt || (kv_paged == -1 && h && h->paged_default);
    if (h && h->loop && policy == POLICY_STATIC)
        arg_die("--policy static is batch_bench's: %s runs the engine, which batches continuously", h->prog);
    if (h && h->loop && steps_csv) arg_die("--steps-csv is batch_bench's (its loop reports every step; %s's engine does not)", h->prog);
    if ((num_blocks > 0) + (kv_gib > 0) + (gpu_util > 0) > 1)
        arg_die("give one of --num-blocks, --kv-gib and --gpu-memory-utilization");
    if (paged && policy == POLICY_STATIC) arg_die("--policy static keeps step04's KV slots: it does not run with --kv paged");
    GpuInfo gi;
    int have_gpu;
    const int use_cuda = choose_device(device, &gi, &have_gpu);
    if (gpu_util > 0 && !use_cuda) arg_die("--gpu-memory-utilization sizes the KV pool in GPU memory: it needs --device cuda");
    // the engine's default on a GPU, as vLLM's: the pool takes what 90%% of the device memory leaves
    if (h && h->loop && use_cuda && paged && !num_blocks && !(kv_gib > 0) && !(gpu_util > 0)) gpu_util = 0.9;

    // ---- the model
    char err[512];
    ModelWeights w;
    ModelConfig cfg;
    model_or_preset(model_dir, preset, TINY_JSON, &w, &cfg);

    // ---- the requests
    ReqList rl = {0};
    if (req_path) read_jsonl(req_path, cfg.vocab, &rl);
    else make_trace(poisson, n_req > 0 ? n_req : 256, in_a, in_b, out_a, out_b, rate, shared, cfg.vocab, &rl);
    if (max_len == 0) {
        // continuous: the longest prompt + max_tokens of one request. static: the longest prompt +
        // the longest max_tokens, the length of a padded batch's rows, so that a finished member's
        // padding decodes have room in its slot until the batch's longest request ends (the
        // scheduler stops a padding row at max_len when the slots are shorter)
        int lp = 0, lo = 0;
        for (int i = 0; i < rl.n; i++) {
            if (rl.r[i].num_prompt + rl.r[i].max_tokens > max_len) max_len = rl.r[i].num_prompt + rl.r[i].max_tokens;
            if (rl.r[i].num_prompt > lp) lp = rl.r[i].num_prompt;
            if (rl.r[i].max_tokens > lo) lo = rl.r[i].max_tokens;
        }
        if (policy == POLICY_STATIC) max_len = lp + lo;
        if (max_len > cfg.max_pos) max_len = cfg.max_pos;
    }
    long rows = budget < (long)max_seqs * max_len ? budget : (long)max_seqs * max_len;
    // the KV pool of a paged run: --num-blocks, or --kv-gib at the element size the runner
    // allocates (checked below), or by default step04's max_num_seqs x max_model_len tokens (kvb_default_blocks:
    // at least one whole sequence)
    double kv_elem = use_cuda ? 2 : 4;
    if (paged && !num_blocks) {
        const double nb = kv_gib > 0 ? floor(kv_gib * 1073741824.0 / (kv_bytes_per_token(&cfg, kv_elem) * block_size))
                                     : kvb_default_blocks(max_seqs, max_len, block_size);
        if (nb < 2 || nb > (double)(1 << 30))
            arg_die("the KV pool would have %.0f blocks of %d tokens: need 2 .. 2^30", nb, block_size);
        num_blocks = (int)nb;
    }

    CpuModel cm = {0};
    GpuModel *gm = NULL;
    Runner *run;
    char qfmt[256];
    double weight_bytes;
    if (qmodel_load(model_dir ? &w : NULL, &cfg, &qs, use_cuda, &gm, &cm, &weight_bytes, qfmt, sizeof qfmt, err,
                    sizeof err) != 0)
        die("%s", err);
    // --gpu-memory-utilization U (vLLM's rule): the pool gets U x the device memory minus what is
    // in use with the weights loaded and minus the runner's workspaces, measured by making the
    // runner once with a 2-block pool
    double util_pool_gib = 0;
    if (paged && use_cuda && gpu_util > 0) {
        double fr0, tot, fr1, fr_tmp;
        if (gpu_mem_info(&fr0, &tot) != 0) die("--gpu-memory-utilization: cannot read the device memory");
        Runner *probe = runner_new_cuda_paged(gm, 2, block_size, max_len, (int)rows, err, sizeof err);
        if (!probe) die("%s", err);
        if (gpu_mem_info(&fr1, &fr_tmp) != 0) die("--gpu-memory-utilization: cannot read the device memory");
        const double ws = fr0 - fr1 - runner_kv_bytes(probe);
        const double pe = round(runner_kv_bytes(probe) / (2.0 * cfg.n_layers * 2 * block_size * cfg.n_kv_heads * cfg.head_dim));
        if (pe >= 1) kv_elem = pe;  // the cache's element size as allocated (fp32 weights: 4)
        runner_free(probe);
        const double avail = gpu_util * tot - (tot - fr0) - ws - 256.0 * 1048576;  // 256 MiB left to the CUDA context
        const double nb = floor(avail / (kv_bytes_per_token(&cfg, kv_elem) * block_size));
        if (nb < 2)
            arg_die("--gpu-memory-utilization %g: %.2f GiB of %.2f GiB are in use with the weights and workspaces loaded; "
                    "no room for a KV pool", gpu_util, (tot - fr0 + ws) / 1073741824.0, tot / 1073741824.0);
        num_blocks = nb > (double)(1 << 30) ? 1 << 30 : (int)nb;
        util_pool_gib = num_blocks * kv_bytes_per_token(&cfg, kv_elem) * block_size / 1073741824.0;
    }
    // KV rows per layer of the runner: slots x max_len, or blocks x B
    double kv_rows;
    for (int attempt = 0;; attempt++) {
        kv_rows = paged ? (double)num_blocks * block_size : (double)max_seqs * max_len;
        if (paged)
            run = use_cuda ? runner_new_cuda_paged(gm, num_blocks, block_size, max_len, (int)rows, err, sizeof err)
                           : runner_new_cpu_paged(&cm, num_blocks, block_size, max_len, (int)rows, err, sizeof err);
        else
            run = use_cuda ? runner_new_cuda(gm, max_seqs, max_len, (int)rows, err, sizeof err)
                           : runner_new_cpu(&cm, max_seqs, max_len, (int)rows, err, sizeof err);
        if (!run) die("%s", err);
        // element size of the cache as allocated (bf16/f16 on the GPU unless the weights are fp32)
        const double elem = round(runner_kv_bytes(run) / (2.0 * cfg.n_layers * kv_rows * cfg.n_kv_heads * cfg.head_dim));
        if (elem < 1 || elem == kv_elem || !(kv_gib > 0) || attempt > 0) {
            if (elem >= 1) kv_elem = elem;
            break;
        }
        runner_free(run);  // --kv-gib at another element size: size the pool again
        kv_elem = elem;
        num_blocks = (int)floor(kv_gib * 1073741824.0 / (kv_bytes_per_token(&cfg, kv_elem) * block_size));
        if (num_blocks < 2) arg_die("--kv-gib %g holds fewer than 2 blocks of %d tokens", kv_gib, block_size);
    }
    const double kv_tok = kv_bytes_per_token(&cfg, kv_elem);
    // the long-chunk attention path in effect (CUDA paged only: the others have one path)
    const int mode_eff = runner_set_prefill_attn(run, prefill_mode);
    const int inv_eff = runner_set_batch_invariant(run, batch_inv);
    const int graphs_eff = runner_set_graphs(run, !eager);
    static const char *const mode_name[] = {"gather", "fused", "flash"};
    const char *eff_name = !paged && mode_eff == PREFILL_GEMM ? "gemm" : mode_name[mode_eff];  // slots: no gather
    char prefill_attn[160];
    if (!use_cuda) snprintf(prefill_attn, sizeof prefill_attn, "cpu");
    else if (mode_eff == prefill_mode) snprintf(prefill_attn, sizeof prefill_attn, "%s", eff_name);
    else snprintf(prefill_attn, sizeof prefill_attn, "%s (%s does not take this shape or layout here)", eff_name,
                  mode_name[prefill_mode]);

    SchedConfig sc = {.policy = policy, .max_num_seqs = max_seqs, .max_num_batched_tokens = budget, .max_len = max_len};
    if (paged) sc.block_size = block_size, sc.num_blocks = num_blocks, sc.prefix_cache = prefix_cache;
    sc.n_eos = cfg.n_eos < 8 ? cfg.n_eos : 8;
    memcpy(sc.eos, cfg.eos_token_ids, (size_t)sc.n_eos * sizeof(int));
    Scheduler s;
    if (sched_init(&s, &sc, rl.r, rl.n, err, sizeof err) != 0) die("%s", err);

    // ---- warm-up, before the clock starts: on CUDA a prompt step as large as a step can be (the
    // budget's rows over as many sequences as it takes, each below max_len, within the slots or
    // the pool), then a decode step of one row for each of them, so the first timed steps do not
    // pay for loading the kernels of these shapes (CUDA loads a module at a kernel's first
    // launch; cuBLAS picks kernels by the row count); on the CPU one prompt of 16 rows. Its rows
    // are rewritten before any read (a block or slot row is read only where a real forward wrote it).
    {
        const long per = use_cuda || max_len - 1 < 16 ? max_len - 1 : 16;  // rows per sequence
        const long want = use_cuda ? rows : per < rows ? per : rows;
        const int cap_seqs = (int)(want / per) + 1, bts = (max_len + block_size - 1) / block_size;
        for (int pass = 0; pass < (use_cuda ? 2 : 1); pass++) {  // 0: the prompts, 1: one decode row each
            Batch b;
            if (paged) batch_alloc_paged(&b, cap_seqs, (int)want, block_size, bts);
            else batch_alloc(&b, cap_seqs, (int)want);
            long left = want;
            int t = 0, n = 0, next_block = 1;
            while (left > 0 && n < cap_seqs && (paged || n < max_seqs)) {
                long len = per < left ? per : left;
                if (paged) {
                    const long room = (long)(num_blocks - next_block) * block_size;  // blocks 1 .. num_blocks-1
                    if (len > room) len = room;
                    if (len < 1) break;
                    for (int j = 0; j < (len + block_size - 1) / block_size; j++) b.block_tables[(size_t)n * bts + j] = next_block++;
                }
                const int p0 = pass == 0 ? 0 : (int)len - 1, nrow = pass == 0 ? (int)len : 1;
                b.cu_seqlens_q[n] = t, b.seq_lens_k[n] = (int)len, b.seq_slot[n] = paged ? 0 : n;
                for (int p = p0; p < p0 + nrow; p++, t++) {
                    b.token_ids[t] = (int)(((long)t * 7919) % cfg.vocab), b.positions[t] = p;
                    b.slot_mapping[t] = paged ? b.block_tables[(size_t)n * bts + p / block_size] * block_size + p % block_size
                                              : n * max_len + p;
                }
                b.logit_rows[n++] = t - 1;
                left -= len;
            }
            b.n_seqs = n, b.n_tokens = t, b.cu_seqlens_q[n] = t, b.n_logits = n;
            int *am = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(int));
            if (n > 0 && runner_forward(run, &b, NULL, am) != 0) die("warm-up forward failed");
            free(am);
            batch_free(&b);
        }
        // every decode-step graph captured now (vLLM captures its graphs at startup too), so that no
        // timed step pays for a capture
        const double tg = now_sec();
        const int ng = runner_capture_graphs(run);
        if (ng < 0) die("capturing the decode-step graphs failed (see above)");
        if (ng > 0) fprintf(stderr, "[warm-up] %d decode-step graphs captured in %.2f s\n", ng, now_sec() - tg);
    }

    // ---- the run
    OfflineOpts oo = {.real_clock = 1, .progress = 1};
    StepsCsv sc_csv = {0};
    if (steps_csv) {
        sc_csv.f = fopen_check(steps_csv, "w");
        fprintf(sc_csv.f, "step,time_s,n_tokens,running,waiting,kv_tokens_written,kv_tokens_allocated,kv_blocks_used,"
                          "kv_blocks_cached,kv_blocks_free,preemptions\n");
        oo.on_step = on_step_csv, oo.ctx = &sc_csv;
    }
    OfflineStats os;
    if ((h && h->loop ? h->loop : offline_run)(run, cfg.vocab, &s, &oo, &os) != 0) die("the engine loop failed");
    if (sc_csv.f) fclose(sc_csv.f);
    if (os.wall_s > 2.0) fprintf(stderr, "[batch] done: %ld steps in %.1f s\n", os.steps, os.wall_s);

    // ---- per-request numbers
    double *ttft = xmalloc((size_t)rl.n * sizeof(double)), *tpot = xmalloc((size_t)rl.n * sizeof(double));
    double *e2e = xmalloc((size_t)rl.n * sizeof(double));
    int n_ttft = 0, n_tpot = 0, n_err = 0;
    long gen = 0, prompt = 0;
    for (int i = 0; i < rl.n; i++) {
        const Request *r = &rl.r[i];
        if (r->finish == FINISH_ERROR) {
            if (!n_err++)  // said once, with the first one: the JSON and the table count them
                fprintf(stderr, "[bench] request %d (%d prompt + %d output tokens) could not run: the prompt must be shorter "
                                "than max_model_len = %d and the request must fit the KV cache alone\n",
                        i, r->num_prompt, r->max_tokens, max_len);
            continue;
        }
        const int g = r->num_tokens - r->num_prompt;
        gen += g, prompt += r->num_prompt;
        ttft[n_ttft] = (r->first_token_s - r->arrival_s) * 1e3;
        e2e[n_ttft++] = (r->finish_s - r->arrival_s) * 1e3;
        if (g > 1) tpot[n_tpot++] = (r->finish_s - r->first_token_s) / (g - 1) * 1e3;
    }
    const SchedStats *st = &s.st;
    const double dur = os.wall_s > 0 ? os.wall_s : 1e-9;
    const double out_tps = gen / dur, tot_tps = (gen + prompt) / dur;
    const double idle_share = st->tokens + st->idle_slots > 0 ? (double)st->idle_slots / (st->tokens + st->idle_slots) : 0;
    const double unused_res = st->reserved_sum > 0 ? 1.0 - st->used_sum / st->reserved_sum : 0;
    const double unused_alloc = st->steps > 0 ? 1.0 - st->used_sum / (st->steps * kv_rows) : 0;
    // the memory comparison: step04 reserves prompt + max_tokens per sequence (unused: reserved but
    // not written); step05 allocates blocks as tokens come (unused: the tails of the last blocks)
    const char *kv_layout = paged ? "paged" : "slots";
    const int kv_bs = paged ? block_size : max_len, kv_total = paged ? num_blocks - 1 : max_seqs;
    const long kv_budget = paged ? (long)(num_blocks - 1) * block_size : s.cfg.kv_tokens;
    const long kv_peak_blocks = paged ? st->peak_blocks_used : st->peak_running;
    const double hit_rate = st->prefix_query_tokens > 0 ? (double)st->prefix_hit_tokens / st->prefix_query_tokens : 0;
    char model_desc[600], settings[400], dev_desc[400];
    snprintf(model_desc, sizeof model_desc, "%s (%s, %d layers, d=%d, H=%d, KV=%d, hd=%d, ff=%d, vocab=%d)",
             model_dir ? model_dir : preset, model_arch_name(cfg.arch), cfg.n_layers, cfg.hidden, cfg.n_heads,
             cfg.n_kv_heads, cfg.head_dim, cfg.intermediate, cfg.vocab);
    snprintf(settings, sizeof settings, "max_num_seqs=%d max_num_batched_tokens=%ld max_model_len=%d", max_seqs, budget,
             max_len);
    if (paged)
        snprintf(settings + strlen(settings), sizeof settings - strlen(settings),
                 " | KV paged: %d blocks of %d, prefix cache %s", num_blocks, block_size, prefix_cache ? "on" : "off");
    else snprintf(settings + strlen(settings), sizeof settings - strlen(settings), " | KV slots");
    if (use_cuda)
        snprintf(settings + strlen(settings), sizeof settings - strlen(settings),
                 " | prefill attention %s | batch-invariant %s | CUDA graphs %s", prefill_attn, inv_eff ? "on" : "off",
                 graphs_eff ? "on (decode steps)" : "off (eager)");
    if (util_pool_gib > 0)
        snprintf(settings + strlen(settings), sizeof settings - strlen(settings),
                 " | gpu_memory_utilization %.2f: a KV pool of %.2f GiB", gpu_util, util_pool_gib);
    long g_replays, g_captures;
    runner_graph_stats(run, &g_replays, &g_captures);
    snprintf(dev_desc, sizeof dev_desc, "%s", use_cuda ? gi.name : "cpu");
    char workload[300];
    if (req_path) snprintf(workload, sizeof workload, "%s: %d requests", req_path, rl.n);
    else
        snprintf(workload, sizeof workload, "--trace %s: %d requests, prompt %d..%d, output %d..%d tokens%s", trace, rl.n,
                 in_a, in_b, out_a, out_b, poisson ? "" : ", all at t=0");
    if (poisson) snprintf(workload + strlen(workload), sizeof workload - strlen(workload), ", Poisson %.3g req/s", rate);
    if (shared) snprintf(workload + strlen(workload), sizeof workload - strlen(workload), ", a shared prefix of %d ids", shared);

    if (outputs) {
        FILE *f = fopen_check(outputs, "w");
        for (int i = 0; i < rl.n; i++) {
            const Request *r = &rl.r[i];
            json_t *o = request_output_json(r);
            char *line = json_dumps(o, JSON_COMPACT);
            fprintf(f, "%s\n", line);
            free(line);
            json_decref(o);
        }
        fclose(f);
    }

    if (timeline) {
        FILE *f = fopen_check(timeline, "w");
        fprintf(f, "index,arrival_s,first_sched_s,first_token_s,finish_s,prompt_len,output_len,finish_reason\n");
        for (int i = 0; i < rl.n; i++) {
            const Request *r = &rl.r[i];
            fprintf(f, "%d,%.6f,%.6f,%.6f,%.6f,%d,%d,%s\n", r->index, r->arrival_s, r->first_sched_s, r->first_token_s,
                    r->finish_s, r->num_prompt, r->num_tokens - r->num_prompt, finish_reason_name(r->finish));
        }
        fclose(f);
    }

    if (json) {
        json_t *root = json_object(), *reqs = json_array(), *sum = json_object();
        for (int i = 0; i < rl.n; i++) {
            const Request *r = &rl.r[i];
            json_t *o = request_output_json(r);
            const int ok = r->finish != FINISH_ERROR;
            json_object_set_new(o, "ttft_ms", ok ? json_real((r->first_token_s - r->arrival_s) * 1e3) : json_null());
            json_object_set_new(o, "e2e_ms", ok ? json_real((r->finish_s - r->arrival_s) * 1e3) : json_null());
            json_array_append_new(reqs, o);
        }
#define JNUM(k, v) json_object_set_new(sum, k, isfinite((double)(v)) ? json_real((double)(v)) : json_null())
#define JINT(k, v) json_object_set_new(sum, k, json_integer((json_int_t)(v)))
        json_object_set_new(sum, "device", json_string(dev_desc));
        json_object_set_new(sum, "runner", json_string(runner_describe(run)));
        json_object_set_new(sum, "model", json_string(model_desc));
        json_object_set_new(sum, "workload", json_string(workload));
        json_object_set_new(sum, "policy", json_string(policy_name(policy)));
        json_object_set_new(sum, "quant", json_string(qfmt));
        json_object_set_new(sum, "weights", json_string(use_cuda ? gpu_model_describe(gm) : "fp32 CPU reference"));
        JNUM("weight_bytes", weight_bytes);
        json_object_set_new(sum, "commit", json_string(build_commit()));
        JINT("max_num_seqs", max_seqs);
        JINT("max_num_batched_tokens", budget);
        JINT("max_model_len", max_len);
        JINT("num_requests", rl.n);
        JINT("num_errors", n_err);
        JINT("prompt_tokens", prompt);
        JINT("output_tokens", gen);
        JNUM("duration_s", dur);
        JNUM("output_tok_s", out_tps);
        JNUM("total_tok_s", tot_tps);
        JNUM("ttft_ms_p50", pctl(ttft, n_ttft, 0.5));
        JNUM("ttft_ms_p99", pctl(ttft, n_ttft, 0.99));
        JNUM("tpot_ms_p50", pctl(tpot, n_tpot, 0.5));
        JNUM("tpot_ms_p99", pctl(tpot, n_tpot, 0.99));
        JNUM("e2e_ms_p50", pctl(e2e, n_ttft, 0.5));
        JNUM("e2e_ms_p99", pctl(e2e, n_ttft, 0.99));
        JNUM("itl_ms_p50", pctl(os.itl_ms, (int)os.n_itl, 0.5));
        JNUM("itl_ms_p99", pctl(os.itl_ms, (int)os.n_itl, 0.99));
        JNUM("idle_slot_share", idle_share);
        JINT("steps", st->steps);
        JINT("rows_computed", st->tokens + st->idle_slots);
        JINT("padding_rows", st->idle_slots);
        JINT("prompt_padding_rows", st->pad_slots);
        JNUM("mean_seqs_per_step", st->steps ? (double)st->seq_steps / st->steps : 0);
        JNUM("mean_tokens_per_step", st->steps ? (double)st->tokens / st->steps : 0);
        JINT("static_batches", st->batches);
        JINT("peak_kv_used_tokens", st->peak_used);
        JINT("peak_kv_reserved_tokens", st->peak_reserved);
        JNUM("kv_bytes_per_token", kv_tok);
        JNUM("kv_bytes_allocated", runner_kv_bytes(run));
        if (use_cuda) {  // device memory in use at the end of the run (total - free: context, weights, pool, workspaces)
            double fr_end, tot_end;
            JNUM("gpu_memory_used_gib", gpu_mem_info(&fr_end, &tot_end) == 0 ? (tot_end - fr_end) / 1073741824.0 : NAN);
        }
        JNUM("kv_reserved_unused_frac", unused_res);
        JNUM("kv_allocated_unused_frac", unused_alloc);
        JNUM("forward_share", os.forward_s / dur);
        JNUM("device_share", os.device_s / dur);
        // prompt-chunk steps vs decode steps (the steps with any prompt chunk count as prefill)
        JINT("decode_steps", os.decode_steps);
        JINT("overlapped_steps", os.overlapped_steps);
        JNUM("decode_forward_s", os.decode_forward_s);
        JNUM("decode_device_s", os.decode_device_s);
        JNUM("prefill_forward_s", os.forward_s - os.decode_forward_s);
        JNUM("prefill_device_s", os.device_s - os.decode_device_s);
        json_object_set_new(sum, "kv_layout", json_string(kv_layout));
        json_object_set_new(sum, "prefill_attn", json_string(prefill_attn));
        json_object_set_new(sum, "batch_invariant", json_boolean(inv_eff));
        json_object_set_new(sum, "cuda_graphs", json_boolean(graphs_eff));
        JINT("graph_replays", g_replays);
        JINT("graph_captures", g_captures);
        JNUM("gpu_memory_utilization", gpu_util);
        JNUM("kv_pool_gib", paged ? num_blocks * kv_tok * block_size / 1073741824.0 : 0);
        JINT("block_size", kv_bs);
        JINT("num_blocks", paged ? num_blocks : max_seqs);
        JINT("kv_tokens_budget", kv_budget);
        JINT("peak_running", st->peak_running);
        JINT("kv_blocks_peak_used", kv_peak_blocks);
        JINT("kv_blocks_total", kv_total);
        JNUM("prefix_hit_rate", hit_rate);
        JINT("prefix_hit_tokens", st->prefix_hit_tokens);
        JINT("preemptions", st->preemptions);
        JNUM("kv_unused_frac", unused_res);
        json_object_set_new(root, "requests", reqs);
        json_object_set_new(root, "summary", sum);
        char *txt = json_dumps(root, JSON_INDENT(1));
        puts(txt);
        free(txt);
        json_decref(root);
    } else {
        Table *t = table_new(paged ? "step05 paged KV: one workload through the scheduler and the batched runner, KV in blocks"
                                   : "step04 batching: one workload through the scheduler and the batched runner");
        table_std_meta(t);
        table_meta(t, "run", "device %s | model %s | %s | policy %s | %s", dev_desc, model_dir ? model_dir : preset,
                   runner_describe(run), policy_name(policy), settings);
        if (use_cuda) table_meta(t, "compute_capability", "%d.%d", gi.cc_major, gi.cc_minor);
        else table_meta(t, "cpu_threads", "%s", cpu_env_describe());
        table_meta(t, "model", "%s", model_desc);
        table_meta(t, "quant", "%s; weight bytes %.4g%s%s", qfmt, weight_bytes, use_cuda ? "; " : "",
                   use_cuda ? gpu_model_describe(gm) : "");
        table_meta(t, "workload", "%s (%ld prompt + %ld output tokens; %d could not run)", workload, prompt, gen, n_err);
        table_col(t, "metric", NULL);
        table_col(t, "value", "%.4g");
        table_col(t, "how", NULL);
        struct {
            const char *m;
            double v;
            const char *how;
        } rows_[] = {
            {"output tok/s", out_tps, "output tokens / (last finish - start), wall clock"},
            {"total tok/s", tot_tps, "(prompt + output tokens) / the same time"},
            {"TTFT p50 ms", pctl(ttft, n_ttft, 0.5), "first token - arrival, per request"},
            {"TTFT p99 ms", pctl(ttft, n_ttft, 0.99), "(linear interpolation between ranks)"},
            {"TPOT p50 ms", pctl(tpot, n_tpot, 0.5), "(finish - first token) / (output tokens - 1), per request"},
            {"TPOT p99 ms", pctl(tpot, n_tpot, 0.99), ""},
            {"ITL p99 ms", pctl(os.itl_ms, (int)os.n_itl, 0.99), "every gap between two tokens of a request"},
            {"duration s", dur, "start to the last finish"},
            {"steps", (double)st->steps, "forwards run (each one flat batch)"},
            {"mean seqs / step", st->steps ? (double)st->seq_steps / st->steps : 0, "sequences in a step's batch"},
            {"mean tokens / step", st->steps ? (double)st->tokens / st->steps : 0, "new tokens (rows) in a step's batch"},
            {"rows computed", (double)(st->tokens + st->idle_slots), "rows run through the model, padding included"},
            {"idle slot share", idle_share, "static: padding rows (prompt padding + finished members' rows) / rows computed"},
            {"max concurrent seqs", (double)st->peak_running, "max over steps of running sequences (KV holders)"},
            {"KV budget tokens", (double)kv_budget,
             paged ? "(num_blocks - 1) x block_size (block 0 is the null block)" : "max_num_seqs x max_model_len"},
            {"KV blocks total", (double)kv_total, paged ? "usable blocks of block_size tokens" : "slots of max_model_len tokens"},
            {"KV blocks peak used", (double)kv_peak_blocks, paged ? "max over steps of blocks held by a request" : "max over steps of slots held"},
            {"KV blocks free at peak", (double)(kv_total - kv_peak_blocks), "total - peak used"},
            {"peak KV used tokens", (double)st->peak_used,
             paged ? "max over steps of K/V rows written (a shared block once)" : "max over steps of K/V rows written by slot holders"},
            {paged ? "peak KV allocated tokens" : "peak KV reserved tokens", (double)st->peak_reserved,
             paged ? "max over steps of blocks in use x block_size" : "max over steps of the sum of min(prompt + max_tokens, max_len)"},
            {"peak KV used MB", st->peak_used * kv_tok / 1e6, "x 2 * layers * kv_heads * head_dim * bytes"},
            {"KV allocated MB", runner_kv_bytes(run) / 1e6,
             paged ? "num_blocks x block_size positions" : "max_num_seqs slots x max_model_len positions"},
            {paged ? "KV unused (fragmentation)" : "KV reserved-but-unused", unused_res,
             paged ? "1 - sum over steps of written / allocated (the last blocks' tails)"
                   : "1 - sum over steps of used / sum over steps of reserved"},
            {"KV allocated-but-unused", unused_alloc, "1 - sum over steps of used / (steps x allocated)"},
            {"prefix hit rate", hit_rate, "cached tokens / prompt tokens looked up, at admissions (paged, prefix cache on)"},
            {"prefix hit tokens", (double)st->prefix_hit_tokens, "tokens whose K/V came from the prefix cache"},
            {"preemptions", (double)st->preemptions, "requests preempted for blocks and recomputed (paged)"},
            {"forward share of time", os.forward_s / dur, "time inside runner_forward / duration"},
        };
        for (size_t k = 0; k < sizeof rows_ / sizeof rows_[0]; k++) {
            table_row(t);
            table_str(t, "metric", rows_[k].m);
            table_num(t, "value", rows_[k].v);
            table_str(t, "how", rows_[k].how);
        }
        table_print(t, FMT_TEXT, stdout);
        table_free(t);
    }

    free(ttft), free(tpot), free(e2e), free(os.itl_ms);
    runner_free(run);
    sched_free(&s);
    for (int i = 0; i < rl.n; i++) request_free(&rl.r[i]);
    free(rl.r);
    if (gm) gpu_model_free(gm);
    if (cm.layers) cpu_model_free(&cm);
    if (model_dir) model_free(&w);
    return 0;
}
