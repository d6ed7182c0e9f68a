// batch_scan.c — where batching stops being free, on the GPU: the decode step time and tokens
// per second at batch 1, 2, 4, ..., 256 at a fixed context, against the roofline (step01's
// ridge); and with --prefill T one T-token prompt through the same batched path, in TFLOP/s.
//
//   build/bin/batch_scan --preset llama-3.1-8b --context 256 --csv     (random bf16 weights on the device)
//   build/bin/batch_scan --preset qwen3-0.6b
//   build/bin/batch_scan --preset llama-3.1-8b --prefill 2048
//   build/bin/batch_scan --model DIR ...
//
// How it measures: every sequence's first context-1 tokens are prefilled once (random ids, in
// batched chunks); a decode step of batch B is then B rows, one per sequence, each at position
// context-1 over `context` keys (the step rewrites the same cache row, so the context stays
// fixed); its time is the median of --steps steps after --warmup, each timed with CUDA events
// around the runner's forward (batch upload to the last kernel), the argmax computed on the
// device and only it copied back. Bytes a step must read: every weight once (the embedding
// table: B rows) + every sequence's K and V (context positions). The roofline time of a step is
// max(bytes / copy bandwidth, FLOPs / GEMM peak): the weights' bytes are shared by the batch,
// the FLOPs are not, so the step time stays flat until the arithmetic intensity reaches the
// ridge (peak / bandwidth) — the batch at which batching stops being free.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "check.h"
#include "gpu.h"
#include "model.h"
#include "rng.h"
#include "step01_matmul/accounting.h"
#include "step01_matmul/ceilings.h"
#include "step01_matmul/roofline_gpu.h"
#include "step04_batching/runner_gpu.h"
#include "table.h"
#include "timer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: batch_scan (--preset NAME | --model DIR) [--context C] [--batches 1,2,4,...] [--steps N]\n"
            "                  [--warmup W] [--prefill T] [--copy-gbps X] [--ceiling-tflops X] [--small-chunk R]\n"
            "                  [--csv | --json]\n"
            "  --preset          a step01 preset (llama-3.1-8b, qwen3-0.6b, ...): random bf16 weights made on the device\n"
            "  --context         keys every decoding sequence attends over (default 256)\n"
            "  --batches         batch sizes (default 1,2,4,8,16,32,64,128,256)\n"
            "  --steps           timed decode steps per batch size (median; default 50), after --warmup (default 5)\n"
            "  --prefill T       instead: one T-token prompt through the batched path (chunk = T), --steps timed\n"
            "  --copy-gbps       the bandwidth ceiling (default: measured now, device copy, read + write counted)\n"
            "  --ceiling-tflops  the dense GEMM ceiling (default: build/ceilings.json, else measured now: cuBLAS 8192^3)\n"
            "  --small-chunk R   sequences with <= R new rows use the decode attention kernel (default 16)\n");
}

// Bytes one decode step of batch B must read: every weight once (the embedding table only the
// B rows looked up), plus every sequence's K and V over `context` positions.
static double step_bytes(const ModelConfig *c, double es, int B, int context) {
    const ParamCount pc = account_params(c);
    const double emb = (double)c->vocab * c->hidden * es;
    const double weights = (double)pc.total * es - (c->tie_embeddings ? 0 : emb) + (double)B * c->hidden * es;
    return weights + (double)B * context * kv_bytes_per_token(c, es);
}

// Rows of sequences (slot s, positions p0 .. p0+n-1) added to a batch.h Batch here: the runner
// is driven directly, without a scheduler.
static void scan_reset(Batch *b) {
    b->n_seqs = b->n_tokens = b->n_logits = 0;
    b->cu_seqlens_q[0] = 0;
}
static void scan_add(Batch *b, int slot, int p0, int n, const int *ids, int want_logits, int max_len) {
    for (int j = 0; j < n; j++) {
        const int r = b->n_tokens + j;
        b->token_ids[r] = ids[j], b->positions[r] = p0 + j, b->slot_mapping[r] = slot * max_len + p0 + j;
    }
    b->n_tokens += n;
    b->seq_lens_k[b->n_seqs] = p0 + n, b->seq_slot[b->n_seqs] = slot;
    b->cu_seqlens_q[++b->n_seqs] = b->n_tokens;
    if (want_logits) b->logit_rows[b->n_logits++] = b->n_tokens - 1;
}

int main(int argc, char **argv) {
    const char *model_dir = NULL, *preset = NULL, *batches_arg = NULL;
    int context = 256, steps = 50, warmup = 5, prefill = 0, small_chunk = -1;
    double copy_gbps = 0, ceiling = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int more = i + 1 < argc;
        if (!strcmp(a, "--model") && more) model_dir = argv[++i];
        else if (!strcmp(a, "--preset") && more) preset = argv[++i];
        else if (!strcmp(a, "--context") && more) context = (int)arg_int(a, argv[++i], 2, 1 << 20);
        else if (!strcmp(a, "--batches") && more) batches_arg = argv[++i];
        else if (!strcmp(a, "--steps") && more) steps = (int)arg_int(a, argv[++i], 1, 100000);
        else if (!strcmp(a, "--warmup") && more) warmup = (int)arg_int(a, argv[++i], 0, 100000);
        else if (!strcmp(a, "--prefill") && more) prefill = (int)arg_int(a, argv[++i], 1, 1 << 20);
        else if (!strcmp(a, "--copy-gbps") && more) copy_gbps = arg_float(a, argv[++i], 0, 1e6, ARG_LO_OPEN);
        else if (!strcmp(a, "--ceiling-tflops") && more) ceiling = arg_float(a, argv[++i], 0, 1e6, ARG_LO_OPEN);
        else if (!strcmp(a, "--small-chunk") && more) small_chunk = (int)arg_int(a, argv[++i], 0, 1 << 20);
        else if (!strcmp(a, "--csv") || !strcmp(a, "--json")) continue;
        else arg_help_or_unknown(a, usage);
    }
    if (!model_dir == !preset) {
        usage(stderr);
        die("need exactly one of --model and --preset");
    }
    if (context < 2 || steps < 1 || warmup < 0 || prefill < 0) die("--context >= 2, --steps >= 1, --warmup >= 0, --prefill >= 1");
    int nb = 0, *batches;
    if (batches_arg) batches = arg_int_list("--batches", batches_arg, 1, 4096, &nb);
    else {
        static const int def[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
        nb = 9;
        batches = xmalloc(sizeof def);
        memcpy(batches, def, sizeof def);
    }
    GpuInfo gi;
    if (gpu_info(&gi) != 0) die("batch_scan runs on a CUDA device: %s", gi.reason);
    int maxB = 0;
    for (int i = 0; i < nb; i++) {
        if (batches[i] < 1) die("--batches: every size must be >= 1");
        maxB = batches[i] > maxB ? batches[i] : maxB;
    }

    // ---- the model
    char err[512];
    ModelWeights w;
    ModelConfig cfg;
    GpuModel *gm;
    if (model_or_preset(model_dir, preset, NULL, &w, &cfg)) gm = gpu_model_load(&w, err, sizeof err);
    else gm = gpu_model_random(&cfg, ST_BF16, 1, err, sizeof err);
    if (!gm) die("%s", err);
    const ModelConfig *c = &cfg;
    const char *wdesc = gpu_model_describe(gm);
    // element size on the device: as stored, except bf16 on a GPU without bf16 tensor cores (fp32)
    const StDtype stored = model_dir ? w.layers[0].wq->dtype : ST_BF16;
    const double es = (stored == ST_F32 || (stored == ST_BF16 && gi.cc_major < 8)) ? 4 : 2;

    // ---- ceilings: copy bandwidth and dense GEMM peak (measured now unless given)
    const char *copy_src = "given (--copy-gbps)", *ceil_src = "given (--ceiling-tflops)";
    if (copy_gbps <= 0) {
        double rd, wr;
        if (roofline_gpu_bandwidth((size_t)1 << 31, 20, &copy_gbps, &rd, &wr) != 0) copy_gbps = 0;
        copy_src = "measured now: device copy of 2 GiB, read + write counted, median of 20";
    }
    if (ceiling <= 0) {
        Ceilings ce;
        if (ceilings_load(&ce) == 0 && ce.gpu_bf16_tflops > 0) {
            ceiling = es == 4 ? ce.gpu_sgemm_tflops : ce.gpu_bf16_tflops;
            ceil_src = "build/ceilings.json (build/bin/roofline)";
        } else {
            const int n = 8192;
            const double ms = roofline_gpu_gemm_ms(es == 4 ? 0 : 2, n, n, n, 10);
            ceiling = ms > 0 ? 2.0 * n * n * (double)n / (ms * 1e-3) / 1e12 : 0;
            ceil_src = es == 4 ? "measured now: cuBLAS SGEMM 8192^3, median of 10"
                               : "measured now: cuBLAS bf16 GEMM 8192^3 (fp32 accumulation), median of 10";
        }
    }

    Table *t = table_new(prefill ? "step04 batched prefill: one prompt through the flat-batch path"
                                 : "step04 decode step vs batch size at a fixed context: where batching stops being free");
    table_std_meta(t);
    table_meta(t, "device", "%s", gi.name);
    table_meta(t, "compute_capability", "%d.%d", gi.cc_major, gi.cc_minor);
    table_meta(t, "model", "%s (%s, %d layers, d=%d, H=%d, KV=%d, hd=%d, ff=%d, vocab=%d)", model_dir ? model_dir : preset,
               model_arch_name(c->arch), c->n_layers, c->hidden, c->n_heads, c->n_kv_heads, c->head_dim, c->intermediate,
               c->vocab);
    table_meta(t, "precision", "%s", wdesc);
    table_meta(t, "copy_gbps", "%.1f (%s)", copy_gbps, copy_src);
    table_meta(t, "gemm_ceiling_tflops", "%.1f (%s)", ceiling, ceil_src);
    const double ridge = copy_gbps > 0 ? ceiling * 1e12 / (copy_gbps * 1e9) : 0;
    table_meta(t, "ridge_flop_per_byte", "%.1f (GEMM ceiling / copy bandwidth, step01's ridge)", ridge);

    Rng rng;
    rng_seed(&rng, 2024);
    if (prefill) {
        const int T = prefill;
        GpuRunner *r = gpu_runner_new(gm, 1, T, T, err, sizeof err);
        if (!r) die("%s", err);
        if (small_chunk >= 0) gpu_runner_set_small_chunk(r, small_chunk);
        table_meta(t, "runner", "%s", gpu_runner_describe(r));
        Batch sb;
        batch_alloc(&sb, 1, T);
        int *ids = xmalloc((size_t)T * 4), am;
        for (int i = 0; i < T; i++) ids[i] = (int)(rng_u32(&rng) % (unsigned)c->vocab);
        double *ms = xmalloc((size_t)steps * sizeof(double));
        for (int s = 0; s < warmup + steps; s++) {
            scan_reset(&sb);
            scan_add(&sb, 0, 0, T, ids, 1, T);
            if (gpu_runner_forward(r, &sb, NULL, &am) != 0) die("forward failed");
            if (s >= warmup) ms[s - warmup] = gpu_runner_last_ms(r);
        }
        const double med = median_d(ms, steps);
        const Flops f = account_flops(c, T);
        const double lm = 2.0 * c->vocab * c->hidden;  // lm_head FLOPs of one row
        const double done = f.prefill_total - (T - 1) * lm;
        table_meta(t, "tokens", "%d (one sequence, one chunk)", T);
        table_meta(t, "flops", "%.4e done (step01 account_flops prefill_total %.4e, less the lm_head of the %d rows "
                   "that sample nothing: only the last row's logits are computed)", done, f.prefill_total, T - 1);
        table_meta(t, "method", "median of %d forwards after %d warm-up, CUDA events from the batch upload to the last kernel", steps, warmup);
        table_meta(t, "launches_per_step", "%d", gpu_runner_launches(r));
        table_col(t, "path", NULL);
        table_col(t, "tokens", "%.0f");
        table_col(t, "ms", "%.3f");
        table_col(t, "tflops", "%.1f");
        table_col(t, "pct_of_ceiling", "%.1f");
        table_col(t, "tok_s", "%.0f");
        table_row(t);
        table_str(t, "path", "step04 batched (flat batch, KV into the cache)");
        table_num(t, "tokens", T);
        table_num(t, "ms", med);
        table_num(t, "tflops", done / (med * 1e-3) / 1e12);
        table_num(t, "pct_of_ceiling", ceiling > 0 ? 100.0 * done / (med * 1e-3) / 1e12 / ceiling : NAN);
        table_num(t, "tok_s", T / (med * 1e-3));
        gpu_runner_free(r);
        // step02's forward on the same ids (no cache, logits of every row), for comparison
        for (int s = 0; s < 1 + steps; s++) {
            ForwardTimes ft;
            if (forward_cuda(gm, ids, T, NULL, &ft) != 0) die("step02 forward failed");
            if (s) ms[s - 1] = ft.total_ms;
        }
        const double m2 = median_d(ms, steps);
        table_row(t);
        table_str(t, "path", "step02 forward_cuda (no cache, all T rows' logits)");
        table_num(t, "tokens", T);
        table_num(t, "ms", m2);
        table_num(t, "tflops", f.prefill_total / (m2 * 1e-3) / 1e12);
        table_num(t, "pct_of_ceiling", ceiling > 0 ? 100.0 * f.prefill_total / (m2 * 1e-3) / 1e12 / ceiling : NAN);
        table_num(t, "tok_s", T / (m2 * 1e-3));
        free(ms), free(ids);
        batch_free(&sb);
    } else {
        const int max_len = context, chunk = 2048 > maxB ? 2048 : maxB;
        GpuRunner *r = gpu_runner_new(gm, maxB, max_len, chunk, err, sizeof err);
        if (!r) die("%s", err);
        if (small_chunk >= 0) gpu_runner_set_small_chunk(r, small_chunk);
        table_meta(t, "runner", "%s", gpu_runner_describe(r));
        table_meta(t, "context", "%d keys per sequence (positions 0 .. %d prefilled once, the step at position %d)", context,
                   context - 2, context - 1);
        table_meta(t, "method", "median of %d decode steps after %d warm-up, CUDA events from the batch upload to the last "
                   "kernel (argmax on the device, only it copied back)", steps, warmup);
        table_meta(t, "bytes_per_step", "weights once (embedding: B rows) + B * context * %.0f KV bytes per token",
                   kv_bytes_per_token(c, es));
        // ---- prefill every sequence's first context-1 tokens, batched chunks of <= chunk rows
        Batch sb;
        batch_alloc(&sb, maxB > chunk ? maxB : chunk, chunk);
        int *ids = xmalloc((size_t)context * 4), *am = xmalloc((size_t)maxB * 4), *next = xmalloc((size_t)maxB * 4);
        const double tp0 = now_sec();
        scan_reset(&sb);
        for (int s = 0; s < maxB; s++)
            for (int p0 = 0; p0 < context - 1;) {
                int n = context - 1 - p0;
                if (n > chunk - sb.n_tokens) n = chunk - sb.n_tokens;
                for (int j = 0; j < n; j++) ids[j] = (int)(rng_u32(&rng) % (unsigned)c->vocab);
                scan_add(&sb, s, p0, n, ids, 0, max_len);
                p0 += n;
                if (sb.n_tokens == chunk || (s == maxB - 1 && p0 == context - 1)) {
                    if (gpu_runner_forward(r, &sb, NULL, NULL) != 0) die("prefill failed");
                    scan_reset(&sb);
                }
            }
        table_meta(t, "prefill_s", "%.2f (%d sequences x %d tokens, batched)", now_sec() - tp0, maxB, context - 1);
        for (int s = 0; s < maxB; s++) next[s] = (int)(rng_u32(&rng) % (unsigned)c->vocab);
        // ---- the roofline: step time max(bytes / bandwidth, FLOPs / peak); where it leaves the flat part
        const Flops f = account_flops(c, context);
        int knee = 0;
        for (int B = 1; B <= 65536 && !knee; B++)
            if (ceiling > 0 && copy_gbps > 0 && B * f.decode_per_token / (ceiling * 1e12) >= step_bytes(c, es, B, context) / (copy_gbps * 1e9))
                knee = B;
        table_meta(t, "roofline_knee", "batch %d: from there the FLOPs (%.4g per token) outlast the bytes; below it a "
                   "step's time is the weights' and KV's read time", knee, f.decode_per_token);
        const double roof1 = fmax(step_bytes(c, es, 1, context) / (copy_gbps * 1e9), f.decode_per_token / (ceiling * 1e12)) * 1e3;
        table_meta(t, "ratios", "x_over_batch1 = step_ms / step_ms of batch %d; tok_s_ratio = tok_s / its tok_s; "
                   "roofline_x = roofline_ms / its roofline_ms", batches[0]);
        table_col(t, "batch", "%.0f");
        table_col(t, "step_ms", "%.4f");
        table_col(t, "tok_s", "%.1f");
        table_col(t, "x_over_batch1", "%.3f");
        table_col(t, "tok_s_ratio", "%.2f");
        table_col(t, "bytes_per_step", "%.4g");
        table_col(t, "gbps", "%.1f");
        table_col(t, "pct_of_copy", "%.1f");
        table_col(t, "roofline_ms", "%.4f");
        table_col(t, "roofline_x", "%.3f");
        table_col(t, "launches", "%.0f");
        double ms1 = 0;
        double *ms = xmalloc((size_t)steps * sizeof(double));
        for (int bi = 0; bi < nb; bi++) {
            const int B = batches[bi];
            for (int s = 0; s < warmup + steps; s++) {
                scan_reset(&sb);
                for (int q = 0; q < B; q++) scan_add(&sb, q, context - 1, 1, &next[q], 1, max_len);
                if (gpu_runner_forward(r, &sb, NULL, am) != 0) die("decode step failed");
                for (int q = 0; q < B; q++) next[q] = am[q];
                if (s >= warmup) ms[s - warmup] = gpu_runner_last_ms(r);
            }
            const double med = median_d(ms, steps);
            if (bi == 0) ms1 = med;  // the first batch size listed (1 by default) is the baseline
            const double bytes = step_bytes(c, es, B, context);
            const double roof = fmax(bytes / (copy_gbps * 1e9), B * f.decode_per_token / (ceiling * 1e12)) * 1e3;
            table_row(t);
            table_num(t, "batch", B);
            table_num(t, "step_ms", med);
            table_num(t, "tok_s", B / (med * 1e-3));
            table_num(t, "x_over_batch1", med / ms1);
            table_num(t, "tok_s_ratio", (B / med) / (1.0 / ms1));
            table_num(t, "bytes_per_step", bytes);
            table_num(t, "gbps", bytes / (med * 1e-3) * 1e-9);
            table_num(t, "pct_of_copy", copy_gbps > 0 ? 100.0 * bytes / (med * 1e-3) * 1e-9 / copy_gbps : NAN);
            table_num(t, "roofline_ms", roof);
            table_num(t, "roofline_x", roof / roof1);
            table_num(t, "launches", gpu_runner_launches(r));
        }
        free(ms), free(ids), free(am), free(next);
        batch_free(&sb);
        gpu_runner_free(r);
    }
    table_print(t, outfmt_from_args(argc, argv), stdout);
    table_free(t);
    free(batches);
    gpu_model_free(gm);
    if (model_dir) model_free(&w);
    return 0;
}
