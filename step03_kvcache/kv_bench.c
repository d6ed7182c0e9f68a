// kv_bench.c — the step's table: per-token decode latency vs position with and without the KV
// cache, KV memory measured vs the formula (and what GQA saves vs MHA), and on the GPU the batch-1
// decode bandwidth = (weights + KV bytes read per token) / time per token vs the measured copy
// bandwidth.
//
//   build/bin/kv_bench --device cpu --preset tiny                       (CI-sized, seconds)
//   build/bin/kv_bench --device cuda --model /tmp/llama8b --positions 1,128,256,512,1024 --csv
//   build/bin/kv_bench --device cuda --preset llama-3.1-8b               (random bf16 weights on the device)
//
// How it measures: greedy runs from position 0 to the largest position, every step timed
// (CUDA events between graph replays on the GPU, wall clock on the CPU); the latency at position
// p is the median of the steps p-w .. p+w (--window) over all runs (the GPU: one run after a
// warm-up; the CPU: a warm-up run, then --reps runs). Without the cache, the step at position p
// is step02's forward over p+1 tokens (median of --reps after one warm-up). p10/p90 (cached) and
// min/max (uncached) columns show the spread behind each median. The `agree` column checks,
// before believing any time, that the uncached forward's argmax at p is the token the cached
// run produced there; where it is not, `gap` says by how much the uncached forward prefers its own
// token ((top logit - the cached token's logit) / the largest |logit|: a near tie is ~1e-4 or
// less). CPU threads: common/cpu_env.h (one policy, no spinning pools).
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "args.h"
#include "check.h"
#include "cpu_env.h"
#include "gpu.h"
#include "kvcache.h"
#include "model.h"
#include "step01_matmul/accounting.h"
#include "step01_matmul/ceilings.h"
#include "step01_matmul/roofline_gpu.h"
#include "step06_quant/qlinear_bench_gpu.h"  // --qgemv: the quantized GEMV's ladder
#include "step06_quant/qmodel.h"            // --quant and quantized checkpoints
#include "table.h"
#include "timer.h"

// A small model for the CPU table and CI: big enough that the weights dominate a step.
static const char *TINY_JSON =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":256,\"intermediate_size\":688,"
    "\"num_hidden_layers\":4,\"num_attention_heads\":8,\"num_key_value_heads\":2,\"vocab_size\":4096,"
    "\"max_position_embeddings\":4096,\"rms_norm_eps\":1e-5,\"rope_theta\":10000.0,\"tie_word_embeddings\":false}";

static void usage(FILE *f) {
    fprintf(f,
            "usage: kv_bench (--model DIR | --preset NAME) [--device cpu|cuda] [--positions 1,64,256,...]\n"
            "                [--window W] [--reps N] [--copy-gbps X] [--quant Q] [--qgemv V]\n"
            "                [--fused 0|1|2] [--attn 1|2|4] [--gemv-split K] [--gemv-rows 0..3]\n"
            "                [--gemv-short 0|1] [--qtma-grid 0|1] [--qchain 0|1]\n"
            "                [--no-ladders] [--csv | --json]\n"
            "  --preset     tiny (built in) or a step01 preset (llama-3.1-8b, ...): random weights (bf16 on the GPU)\n"
            "  --positions  context positions to report (default 1,64,128,256,512,1024; cpu tiny: up to 512)\n"
            "  --window     latency at p = median of the cached steps p-W .. p+W (default 8)\n"
            "  --reps       uncached forwards timed per position, and CPU cached runs (median; default 3)\n"
            "  --copy-gbps  the bandwidth ceiling (default: measured now on the GPU, build/ceilings.json on the CPU)\n"
            "  --fused M    GPU: the decode step of the table: 0 step03's own (10 kernels a layer), 1 step07's fusions\n"
            "               (5 a layer), 2 fusions + programmatic dependent launch on sm_90 (default); all three are\n"
            "               timed first (decode_step_by_fusion)\n"
            "  --attn V     GPU, the fused step's attention kernel: 1 step07's k_attn_fused (4 warps a block of 128\n"
            "               keys), 2 k_attn_fused2 (8-16 warps, only the rounds that hold keys), 4 k_attn_mma (the\n"
            "               tensor cores; default where it runs: a bf16 cache, head_dim 64 or 128, sm_80+, else 2);\n"
            "               all are timed first in the fused_pdl step (decode_step_by_attention)\n"
            "  --gemv-split K GPU, the fused step's dense GEMVs: warps per output row, 1, 2 or 4, or 0 (default: 2\n"
            "               where 8-row blocks would be fewer than two per SM, else 1); all are timed first in the\n"
            "               fused_pdl step (decode_step_by_gemv_split)\n"
            "  --gemv-rows R GPU, the fused step's dense GEMVs of short rows: 0 (default) a grid that fills the GPU\n"
            "               once and loops over the rows where one warp a row would be more than 8 such grids (the\n"
            "               lm_heads; rows of 9-16 chunks a lane with x in shared memory, as the 8B's), 1 never, 2\n"
            "               wherever the rows fit, 3 as 0 without the rows of 9-16 chunks a lane; all four are timed\n"
            "               first in the fused_pdl step (decode_step_by_gemv_rows)\n"
            "  --gemv-short S GPU, the fused step's dense GEMV rows of at most 4 16-byte chunks a lane: 1 (default)\n"
            "               with 4 chunks a lane in flight, 0 with 8 (more registers); both are timed first in the\n"
            "               fused_pdl step (decode_step_by_gemv_short)\n"
            "  --qtma-grid G GPU, quantized: the TMA GEMV rungs' grid, 0 (default) the fewest blocks in the fewest\n"
            "               rounds, 1 the grid whose busiest SM has the fewest 16-row strips; both are timed first in\n"
            "               the fused_pdl step (decode_step_by_qtma_grid)\n"
            "  --qchain C   GPU, INT4 quantized: 1 runs each layer's o, gate|up, down and the next q|k|v as one\n"
            "               kernel (step06's k_qtmc) where the layers allow it, 0 one kernel each (default: 0, or\n"
            "               the environment's QLINEAR_CHAIN)\n"
            "  --no-ladders GPU: skip the fusion and GEMV ladders (the table only: --fused, --gemv or v2)\n"
            "  --gemv V     GPU: GEMV version 1..4 of step03's unfused step (default: the fastest decode of its ladder,\n"
            "               measured first)\n"
            "  --quant      quantized projections (step06): round to nearest at load (INT8 per channel, INT4 groups of\n"
            "               128): none (default), rtn-int8, rtn-int4, or either with +lm_head (the lm_head too);\n"
            "               random integers with --preset; a GPTQ / AWQ checkpoint runs quantized without it\n"
            "  --qgemv V    GPU, quantized projections: the quantized GEMV's version 1..N of its ladder (qgemm_bench\n"
            "               names them; default: the fastest measured in this decode, INT4 v12, INT8 v13)\n");
}

// --positions: at most `max` positions, each in 0..2^20 (the model's context is checked later).
static int parse_list(const char *s, int *out, int max) {
    int n;
    int *v = arg_int_list("--positions", s, 0, 1 << 20, &n);
    if (n <= max) memcpy(out, v, (size_t)n * sizeof(int));
    free(v);
    if (n > max) arg_die("--positions: %d positions given, at most %d", n, max);
    return n;
}

static double rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    long size = 0, res = 0;
    if (!f) return -1;
    if (fscanf(f, "%ld %ld", &size, &res) != 2) res = -1;
    fclose(f);
    return (double)res * (double)sysconf(_SC_PAGESIZE);
}

// The steps a .. b of every run (v is (runs, n)): min/p10/p90/max over all of them; the median
// is the median of the runs' own medians, so one run hit by a burst of other load does not move
// it (with 3 runs it is the middle run).
static TimeStats steps_stats(const double *v, int runs, int n, int a, int b) {
    const int k = b - a + 1;
    double *t = xmalloc((size_t)k * runs * sizeof(double)), *med = xmalloc((size_t)runs * sizeof(double));
    for (int r = 0; r < runs; r++) {
        for (int i = a; i <= b; i++) t[r * k + i - a] = v[(size_t)r * n + i];
        double *one = xmalloc((size_t)k * sizeof(double));
        memcpy(one, t + r * k, (size_t)k * sizeof(double));
        med[r] = median_d(one, k);
        free(one);
    }
    TimeStats st = time_stats(t, k * runs);
    st.median = median_d(med, runs);
    free(t), free(med);
    return st;
}

// The steps p-w .. p+w of every run.
static TimeStats window_stats(const double *v, int runs, int n, int p, int w) {
    return steps_stats(v, runs, n, p - w < 0 ? 0 : p - w, p + w >= n ? n - 1 : p + w);
}

// The median time of decode steps 1..128 of a fresh decoder (160 greedy steps after a warm-up of
// 32), in the fusion mode and GEMV version set now; *kernels = its graph's kernel nodes.
static double decode_median_ms(GpuModel *gm, int *kernels) {
    char err[256];
    GpuDecoder *dv = gpu_decoder_new(gm, 160, err, sizeof err);
    if (!dv) die("%s", err);
    int ids[160];
    float ms[160];
    if (gpu_decoder_greedy(dv, 1, 32, ids, NULL) != 0) die("decode failed");  // warm-up
    gpu_decoder_reset(dv);
    if (gpu_decoder_greedy(dv, 1, 160, ids, ms) != 0) die("decode failed");
    double md[128];
    for (int i = 0; i < 128; i++) md[i] = ms[1 + i];
    *kernels = gpu_decoder_kernels(dv);
    gpu_decoder_free(dv);
    return median_d(md, 128);
}

// The fused_pdl step timed with each value of one of its knobs (set(vals[i]) before each decoder:
// the graph captures it), as "name ms; name ms; ..." into buf; the knob is then set to keep.
static void knob_ladder(GpuModel *gm, void (*set)(int), const int *vals, const char *const *names, int n, int keep,
                        char *buf, size_t size) {
    int off = 0, kernels;
    buf[0] = 0;
    for (int i = 0; i < n; i++) {
        set(vals[i]);
        const double m = decode_median_ms(gm, &kernels);
        off += snprintf(buf + off, size - (size_t)off, "%s%s %.4f ms", i ? "; " : "", names[i], m);
    }
    set(keep);
}

int main(int argc, char **argv) {
    cpu_env_init(argv);
    const char *model_dir = NULL, *preset = NULL, *device = NULL, *pos_arg = NULL;
    int window = 8, reps = 3, gemv_ver = -1, qgemv_ver = -1, fused = 2, attn = 4, gsplit = 0, grows = 0, gshort = 1, qgrid = 0, ladders = 1, qchain = -1;
    double copy_gbps = 0;
    QuantSpec qs;
    quant_spec_parse("none", &qs);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int more = i + 1 < argc;
        if (!strcmp(a, "--model") && more) model_dir = argv[++i];
        else if (!strcmp(a, "--preset") && more) preset = argv[++i];
        else if (!strcmp(a, "--device") && more) device = argv[++i];
        else if (!strcmp(a, "--positions") && more) pos_arg = argv[++i];
        else if (!strcmp(a, "--window") && more) window = (int)arg_int(a, argv[++i], 0, 1024);
        else if (!strcmp(a, "--reps") && more) reps = (int)arg_int(a, argv[++i], 1, 1000);
        else if (!strcmp(a, "--copy-gbps") && more) copy_gbps = arg_float(a, argv[++i], 0, 1e6, ARG_LO_OPEN);
        else if (!strcmp(a, "--gemv") && more) gemv_ver = (int)arg_int(a, argv[++i], 1, 64) - 1;
        else if (!strcmp(a, "--qgemv") && more) qgemv_ver = (int)arg_int(a, argv[++i], 1, 64) - 1;
        else if (!strcmp(a, "--fused") && more) fused = (int)arg_int(a, argv[++i], 0, 2);
        else if (!strcmp(a, "--attn") && more) {
            attn = (int)arg_int(a, argv[++i], 1, 4);
            if (attn == 3) arg_die("--attn 3: expected 1, 2 or 4");
        }
        else if (!strcmp(a, "--gemv-split") && more) {
            gsplit = (int)arg_int(a, argv[++i], 0, 4);
            if (gsplit == 3) arg_die("--gemv-split 3: expected 0, 1, 2 or 4");
        } else if (!strcmp(a, "--gemv-rows") && more) grows = (int)arg_int(a, argv[++i], 0, 3);
        else if (!strcmp(a, "--gemv-short") && more) gshort = (int)arg_int(a, argv[++i], 0, 1);
        else if (!strcmp(a, "--qtma-grid") && more) qgrid = (int)arg_int(a, argv[++i], 0, 1);
        else if (!strcmp(a, "--qchain") && more) qchain = (int)arg_int(a, argv[++i], 0, 1);
        else if (!strcmp(a, "--no-ladders")) ladders = 0;
        else if (!strcmp(a, "--quant") && more) {
            if (quant_spec_parse(argv[++i], &qs) != 0) arg_die("--quant %s: expected none, rtn-int8, rtn-int4, rtn-int8+lm_head or rtn-int4+lm_head", argv[i]);
        } else if (!strcmp(a, "--csv") || !strcmp(a, "--json")) continue;
        else arg_help_or_unknown(a, usage);
    }
    if (!model_dir == !preset) {
        usage(stderr);
        arg_die("need exactly one of --model and --preset");
    }
    GpuInfo gi;
    int have_gpu;
    const int use_cuda = choose_device(device, &gi, &have_gpu);

    int pos[64], npos;
    if (pos_arg) npos = parse_list(pos_arg, pos, 64);
    else {
        const int def[] = {1, 64, 128, 256, 512, 1024};
        npos = (!use_cuda && preset && !strcmp(preset, "tiny")) ? 5 : 6;
        memcpy(pos, def, sizeof def);
    }
    int maxp = 0;
    for (int i = 0; i < npos; i++) maxp = pos[i] > maxp ? pos[i] : maxp;
    const int nsteps = maxp + window + 1;  // steps at positions 0 .. nsteps-1

    // ---- the model
    char err[512];
    ModelWeights w;
    ModelConfig cfg;
    const char *dtype = "fp32";
    model_or_preset(model_dir, preset, TINY_JSON, &w, &cfg);
    if (nsteps > cfg.max_pos)
        arg_die("--positions: the largest position %d + --window %d runs past max_position_embeddings = %d of %s", maxp,
                window, cfg.max_pos, model_dir ? model_dir : preset);
    if (use_cuda && gemv_ver >= gemv_n_versions())
        arg_die("--gemv: %d is out of range (allowed: 1..%d)", gemv_ver + 1, gemv_n_versions());
    if (use_cuda && qgemv_ver >= qlinear_gemv_n_versions())
        arg_die("--qgemv: %d is out of range (allowed: 1..%d)", qgemv_ver + 1, qlinear_gemv_n_versions());
    if (use_cuda) qlinear_gemv_set_version(qgemv_ver), qlinear_gemv_set_grid(qgrid);
    if (use_cuda && qchain >= 0) qlinear_gemv_set_chain(qchain);
    CpuModel cm = {0};
    GpuModel *gm = NULL;
    char qfmt[256];
    double weight_bytes;  // as held on the device (GPU) or in memory (CPU)
    if (qmodel_load(model_dir ? &w : NULL, &cfg, &qs, use_cuda, &gm, &cm, &weight_bytes, qfmt, sizeof qfmt, err,
                    sizeof err) != 0)
        die("%s", err);
    if (use_cuda) dtype = gpu_model_describe(gm);
    const int quantized = (model_dir && w.quantized) || qs.method != QLOAD_NONE;
    const ModelConfig *c = &cfg;

    // ---- GPU: the decode step of each fusion mode, then the GEMV ladder inside step03's own
    // (unfused) step; 160 greedy steps per decoder, the median of steps 1..128
    char ladder[600] = "", fusion[600] = "", attns[200] = "", splits[300] = "", rowl[300] = "", shortl[200] = "", qgridl[200] = "";
    if (use_cuda) {
        gpu_decoder_set_attn(attn), gpu_decoder_set_gemv_split(gsplit);
        gpu_decoder_set_gemv_rows(grows), gpu_decoder_set_gemv_short(gshort);
    }
    if (use_cuda && ladders) {
        int off = 0, kernels;
        for (int f = 0; f <= 2; f++) {
            gpu_decoder_set_fused(f);  // before gpu_decoder_new: the graph captures the mode
            const double m = decode_median_ms(gm, &kernels);
            off += snprintf(fusion + off, sizeof fusion - (size_t)off, "%s%s %.4f ms (%d kernels)", f ? "; " : "",
                            gpu_decoder_fused_name(f), m, kernels);
        }
        static const int av[] = {1, 2, 4}, sv[] = {0, 1, 2, 4}, rv[] = {0, 1, 2, 3}, uv[] = {1, 0}, qv[] = {0, 1};
        static const char *const an[] = {"v1", "v2", "v4"}, *const sn[] = {"auto", "1", "2", "4"},
                                 *const rn[] = {"auto", "none", "all", "auto without 16-chunk rows"},
                                 *const un[] = {"4 chunks a lane (default)", "8 chunks a lane"},
                                 *const qn[] = {"fewest rounds", "balanced over the SMs"};
        knob_ladder(gm, gpu_decoder_set_attn, av, an, 3, attn, attns, sizeof attns);
        knob_ladder(gm, gpu_decoder_set_gemv_split, sv, sn, 4, gsplit, splits, sizeof splits);
        knob_ladder(gm, gpu_decoder_set_gemv_rows, rv, rn, 4, grows, rowl, sizeof rowl);
        knob_ladder(gm, gpu_decoder_set_gemv_short, uv, un, 2, gshort, shortl, sizeof shortl);
        if (quantized) knob_ladder(gm, qlinear_gemv_set_grid, qv, qn, 2, qgrid, qgridl, sizeof qgridl);
        gpu_decoder_set_fused(0);
        double best = 1e30;
        int bestv = 1;
        off = 0;
        for (int v = 0; v < gemv_n_versions(); v++) {
            gemv_set_version(v);  // before gpu_decoder_new: the graph captures the version
            const double m = decode_median_ms(gm, &kernels);
            off += snprintf(ladder + off, sizeof ladder - (size_t)off, "%s%s %.4f ms", v ? "; " : "", gemv_version_name(v), m);
            if (m < best) best = m, bestv = v;
        }
        if (gemv_ver < 0) gemv_ver = bestv;
    }
    if (use_cuda) {
        if (gemv_ver < 0) gemv_ver = 1;  // --no-ladders: v2
        gemv_set_version(gemv_ver);
        gpu_decoder_set_fused(fused);  // the table's decoder
    }

    // ---- KV memory: measured vs the formula
    double kv_meas_tok = 0, kv_elem = 4;
    CpuKvCache kv = {0};
    GpuDecoder *dec = NULL;
    if (use_cuda) {
        dec = gpu_decoder_new(gm, nsteps, err, sizeof err);
        if (!dec) die("%s", err);
        kv_elem = gpu_decoder_kv_elem_bytes(dec);
        kv_meas_tok = gpu_decoder_kv_bytes(dec) / nsteps;
    } else {
        const double r0 = rss_bytes();
        if (cpu_kv_init(&kv, c, nsteps) != 0) die("cache");
        const size_t n = (size_t)c->n_layers * nsteps * kv.kv_dim * sizeof(float);
        memset(kv.k, 0, n);  // touch every page so the resident set grows by what the cache holds
        memset(kv.v, 0, n);
        kv_meas_tok = (rss_bytes() - r0) / nsteps;
    }
    const double kv_tok = kv_bytes_per_token(c, kv_elem);
    ModelConfig mha = *c;
    mha.n_kv_heads = c->n_heads;
    const double kv_mha = kv_bytes_per_token(&mha, kv_elem);

    // ---- bytes a decode step must read: step01's account_decode_step (every weight once, the
    // embedding table one row unless it is the tied lm_head; the KV rows of every position so far)
    const double es = use_cuda ? kv_elem : 4.0;
    // Quantized: the bytes the projections take as stored (integers + scales), not es per weight:
    // every weight held, less the embedding table but one row unless it is the tied lm_head.
    // A tied table whose lm_head is quantized (+lm_head, or a checkpoint that holds it so) is read
    // one row, as an untied one.
    const int lm_quantized = use_cuda ? gpu_model_lm_head_quantized(gm) : cm.q_lm_head != NULL;
    const double emb_unread = c->tie_embeddings && !lm_quantized ? 0 : ((double)c->vocab - 1) * c->hidden * es;
    const double weights_dense = account_decode_step(c, 1, 0, es, kv_elem).weights;
    const double weights_read = quantized ? weight_bytes - emb_unread : weights_dense;
    const double weights_extra = weights_read - weights_dense;  // added to account_decode_step's bytes below
    if (copy_gbps <= 0) {
        if (use_cuda) {
            double rd, wr;
            if (roofline_gpu_bandwidth((size_t)1 << 31, 20, &copy_gbps, &rd, &wr) != 0) copy_gbps = 0;
        } else {
            Ceilings ce;
            if (ceilings_load(&ce) == 0) copy_gbps = ce.cpu_copy_gbps;
        }
    }

    // ---- cached: greedy runs, every step timed (after a warm-up run); step_ms is (runs, nsteps)
    const int runs = use_cuda ? 1 : reps;
    double *step_ms = xcalloc((size_t)runs * nsteps, sizeof(double));
    int *toks = xcalloc((size_t)nsteps + 1, sizeof(int));  // toks[p] = the token fed at position p
    toks[0] = 1 % c->vocab;
    float *logits = xmalloc((size_t)c->vocab * sizeof(float));
    if (use_cuda) {
        float *ms = xmalloc((size_t)nsteps * sizeof(float));
        const int warm = nsteps < 32 ? nsteps : 32;
        if (gpu_decoder_greedy(dec, toks[0], warm, toks + 1, NULL) != 0) die("decode failed");
        gpu_decoder_reset(dec);
        if (gpu_decoder_greedy(dec, toks[0], nsteps, toks + 1, ms) != 0) die("decode failed");
        for (int i = 0; i < nsteps; i++) step_ms[i] = ms[i];
        free(ms);
    }
    // ---- uncached: step02's forward over p+1 tokens; nocache_ms is (npos, reps). First a warm-up
    // that also checks the argmax. On the CPU the rounds interleave: round r = cached run r, then
    // one uncached forward per position, so a burst of other load on the machine lands in one
    // round of every statistic instead of in all the samples of one.
    double *nocache_ms = xcalloc((size_t)npos * reps, sizeof(double));
    int *agree = xcalloc((size_t)npos, sizeof(int));
    double *gap = xcalloc((size_t)npos, sizeof(double));  // (top logit - the cached token's) / max |logit|
    for (int r = -1; r < reps; r++) {
        if (!use_cuda && r < runs) {  // the cached run of this round (r = -1: the warm-up run)
            kv.len = 0;
            for (int p = 0; p < nsteps; p++) {
                const double t0 = now_sec();
                if (forward_cached_cpu(&cm, &kv, &toks[p], 1, logits) != 0) die("decode failed");
                const double ms = (now_sec() - t0) * 1e3;
                if (r >= 0) step_ms[(size_t)r * nsteps + p] = ms;
                const int next = argmax_f32(logits, c->vocab);
                if (r > -1 && next != toks[p + 1]) die("cached run %d: position %d gave token %d, the first run %d", r, p, next, toks[p + 1]);
                toks[p + 1] = next;
            }
        }
        for (int i = 0; i < npos; i++) {
            const int p = pos[i];
            double ms = 0;
            if (use_cuda) {
                if (forward_last_cuda(gm, toks, p + 1, r < 0 ? logits : NULL, &ms) != 0) die("forward failed");
            } else {
                const double t0 = now_sec();
                if (forward_last_cpu(&cm, toks, p + 1, logits) != 0) die("forward failed");
                ms = (now_sec() - t0) * 1e3;
            }
            if (r < 0) {
                const int top = argmax_f32(logits, c->vocab);
                float amax = 0.0f;
                for (int v = 0; v < c->vocab; v++) amax = fmaxf(amax, fabsf(logits[v]));
                agree[i] = top == toks[p + 1];
                gap[i] = amax > 0.0f ? (logits[top] - logits[toks[p + 1]]) / amax : 0.0;
            }
            else nocache_ms[(size_t)i * reps + r] = ms;
        }
    }

    Table *t = table_new("step03 decode: per-token latency vs position, with and without the KV cache");
    table_std_meta(t);
    table_meta(t, "device", "%s", use_cuda ? gi.name : "cpu (fp32 reference, OpenBLAS projections)");
    if (use_cuda) table_meta(t, "compute_capability", "%d.%d", gi.cc_major, gi.cc_minor);
    table_meta(t, "model", "%s (%s, %d layers, d=%d, H=%d, KV=%d, hd=%d, ff=%d, vocab=%d)", model_dir ? model_dir : preset,
               model_arch_name(c->arch), c->n_layers, c->hidden, c->n_heads, c->n_kv_heads, c->head_dim, c->intermediate,
               c->vocab);
    table_meta(t, "precision", "%s", dtype);
    table_meta(t, "quant", "%s", qfmt);
    if (use_cuda && quantized) table_meta(t, "qgemv", "%s (quantized GEMV version %d; 0 = auto)", qlinear_gemv_version_name(qgemv_ver), qgemv_ver + 1);
    if (use_cuda && quantized) table_meta(t, "qchain", "%s", qchain == 1 ? "on where the layers allow it (k_qtmc)" : qchain == 0 ? "off" : "default (QLINEAR_CHAIN)");
    table_meta(t, "weight_bytes", "%.4g (held; %s)", weight_bytes, use_cuda ? "device allocations" : "host arrays");
    if (!use_cuda) table_meta(t, "cpu_threads", "%s", cpu_env_describe());
    table_meta(t, "timing", "%s", use_cuda ? "CUDA events; one cached run after a warm-up run"
                                           : "wall clock; a warm-up round, then --reps rounds of (one cached run, one uncached "
                                             "forward per position); cached: median of the rounds' medians; "
                                             "spread: p10/p90 of all steps, min/max of the rounds");
    table_meta(t, "kv_bytes_per_token_formula", "%.0f (2 * %d layers * %d kv_heads * %d head_dim * %.0f bytes)", kv_tok,
               c->n_layers, c->n_kv_heads, c->head_dim, kv_elem);
    table_meta(t, "kv_bytes_per_token_measured", "%.0f (%s over %d positions)", kv_meas_tok,
               use_cuda ? "cudaMemGetInfo before/after allocating the cache" : "resident-set growth after touching the cache",
               nsteps);
    table_meta(t, "kv_bytes_per_token_if_mha", "%.0f (kv_heads = %d): GQA stores %.1fx less", kv_mha, c->n_heads,
               kv_mha / kv_tok);
    table_meta(t, "weights_read_per_token", "%.4g bytes (all weights once%s; the embedding table one row)", weights_read,
               quantized ? ", the quantized projections as stored" : "");
    table_meta(t, "copy_gbps", "%.1f (%s)", copy_gbps,
               copy_gbps > 0 ? (use_cuda ? "measured now: device copy, read+write counted" : ceilings_path())
                             : "unknown: pct columns empty");
    if (use_cuda && ladders) {  // the GEMV alone on this model's weight shapes (cold weights), vs the copy ceiling
        const int d = c->hidden, qkv = (c->n_heads + 2 * c->n_kv_heads) * c->head_dim, qd = c->n_heads * c->head_dim;
        const int shp[5][2] = {{qkv, d}, {d, qd}, {2 * c->intermediate, d}, {d, c->intermediate}, {c->vocab, d}};
        const char *nm[5] = {"qkv", "o", "gate_up", "down", "lm_head"};
        for (int v = 0; v < gemv_n_versions(); v++) {
            char buf[512], key[64];
            int off = 0;
            for (int i = 0; i < 5; i++) {
                const double gb = gemv_gpu_bench_gbps(v, shp[i][0], shp[i][1], kv_elem == 4 ? ST_F32 : ST_BF16);
                off += snprintf(buf + off, sizeof buf - (size_t)off, "%s%s %dx%d %.0f GB/s (%.0f%%)", i ? "; " : "", nm[i],
                                shp[i][0], shp[i][1], gb, copy_gbps > 0 ? 100.0 * gb / copy_gbps : 0.0);
            }
            snprintf(key, sizeof key, "gemv_alone_%s", gemv_version_name(v));
            table_meta(t, key, "%s", buf);
        }
        if (ladders) {
            table_meta(t, "decode_step_by_fusion", "median of steps 1..128: %s", fusion);
            table_meta(t, "decode_step_by_attention", "median of steps 1..128, fused_pdl step: %s", attns);
            table_meta(t, "decode_step_by_gemv_split", "median of steps 1..128, fused_pdl step, warps per row: %s", splits);
            table_meta(t, "decode_step_by_gemv_rows", "median of steps 1..128, fused_pdl step, row-loop GEMVs: %s", rowl);
            table_meta(t, "decode_step_by_gemv_short", "median of steps 1..128, fused_pdl step, GEMV rows of <= 4 chunks a lane run with: %s", shortl);
            if (quantized)
                table_meta(t, "decode_step_by_qtma_grid", "median of steps 1..128, fused_pdl step, the TMA rungs' grid: %s", qgridl);
            table_meta(t, "decode_step_by_gemv_version", "median of steps 1..128, step03's unfused step: %s", ladder);
        }
        table_meta(t, "gemv_version_used", "%s%s", gemv_version_name(gemv_ver), fused ? " (in the unfused step only)" : "");
        table_meta(t, "decode_step_used", "%s (%d kernels per step)", gpu_decoder_fused_name(fused), gpu_decoder_kernels(dec));
        if (fused) table_meta(t, "decode_attention_used", "v%d; GEMV split %d (0: auto); row loop %d (0: auto); short rows on %d chunks a lane",
                              attn, gsplit, grows, gshort ? 4 : 8);
    }
    table_col(t, "position", "%.0f");
    table_col(t, "cached_ms", "%.4f");
    table_col(t, "cached_p10_ms", "%.4f");
    table_col(t, "cached_p90_ms", "%.4f");
    table_col(t, "nocache_ms", "%.4f");
    table_col(t, "nocache_min_ms", "%.4f");
    table_col(t, "nocache_max_ms", "%.4f");
    table_col(t, "nocache_over_cached", "%.2f");
    table_col(t, "kv_bytes_read", "%.4g");
    table_col(t, "bytes_per_token", "%.4g");
    table_col(t, "cached_gbps", "%.1f");
    table_col(t, "pct_of_copy", "%.1f");
    table_col(t, "agree", "%.0f");
    table_col(t, "gap", "%.2e");
    for (int i = 0; i < npos; i++) {
        const int p = pos[i];
        const TimeStats cst = window_stats(step_ms, runs, nsteps, p, window);
        const double cms = cst.median;
        const TimeStats nst = time_stats(nocache_ms + (size_t)i * reps, reps);
        const double nms = nst.median;
        const DecodeStep ds = account_decode_step(c, 1, p + 1, es, kv_elem);  // position p reads p + 1 K/V rows
        const double kvb = ds.kv, bytes = ds.bytes + weights_extra;
        table_row(t);
        table_num(t, "position", p);
        table_num(t, "cached_ms", cms);
        table_num(t, "cached_p10_ms", cst.p10);
        table_num(t, "cached_p90_ms", cst.p90);
        table_num(t, "nocache_ms", nms);
        table_num(t, "nocache_min_ms", nst.min);
        table_num(t, "nocache_max_ms", nst.max);
        table_num(t, "nocache_over_cached", nms / cms);
        table_num(t, "kv_bytes_read", kvb);
        table_num(t, "bytes_per_token", bytes);
        table_num(t, "cached_gbps", bytes / cms * 1e-6);
        table_num(t, "pct_of_copy", copy_gbps > 0 ? 100.0 * bytes / cms * 1e-6 / copy_gbps : 0.0 / 0.0);
        table_num(t, "agree", agree[i]);
        table_num(t, "gap", gap[i]);
    }
    // headline: the median decode step over positions 1 .. min(128, nsteps-1)
    const int hn = nsteps - 1 < 128 ? nsteps - 1 : 128;
    if (hn >= 1) {
        const TimeStats hs = steps_stats(step_ms, runs, nsteps, 1, hn);
        const double hm = hs.median;
        const int mid_ctx = 1 + (hn + 1) / 2;  // the middle of positions 1..hn, as a context length
        const double hb = account_decode_step(c, 1, mid_ctx, es, kv_elem).bytes + weights_extra;
        table_meta(t, "decode_batch1", "median step %.4f ms over positions 1..%d = %.1f tok/s; %.4g bytes/token -> %.1f GB/s = %.1f%% of copy",
                   hm, hn, 1e3 / hm, hb, hb / hm * 1e-6, copy_gbps > 0 ? 100.0 * hb / hm * 1e-6 / copy_gbps : 0.0);
        table_meta(t, "decode_batch1_spread", "p10 %.4f, p90 %.4f ms over %d steps (%d run%s)", hs.p10, hs.p90, hs.n, runs,
                   runs > 1 ? "s" : "");
        if (copy_gbps > 0)
            table_meta(t, "roofline_tok_s", "%.1f (copy bandwidth / bytes of a decode step at context %d: the same as "
                       "account --batch 1 --context %d --peak-gbps %.0f)", copy_gbps * 1e9 / hb, mid_ctx, mid_ctx, copy_gbps);
    }
    table_print(t, outfmt_from_args(argc, argv), stdout);
    table_free(t);
    free(step_ms), free(toks), free(logits), free(nocache_ms), free(agree), free(gap);
    if (dec) gpu_decoder_free(dec);
    if (gm) gpu_model_free(gm);
    if (cm.layers) cpu_model_free(&cm);
    if (kv.k) cpu_kv_free(&kv);
    if (model_dir) model_free(&w);
    return 0;
}
