// attn_bench.c — prefill time and memory against sequence length: where the O(T^2) term shows.
//
//   build/bin/attn_bench                                   GPU: llama-3.1-8b shape, T = 128 .. 8192
//   build/bin/attn_bench --device cpu                      CPU: llama-3.2-1b shape, 1 layer, T = 64 .. 512
//   build/bin/attn_bench --preset qwen3-0.6b --tmin 256 --tmax 4096 --csv
//   build/bin/attn_bench --model tests/data/models/DIR --device cpu
//
// For each T (doubling) it runs the whole prefill (random weights of the preset's shape, made
// on the device, or a checkpoint with --model) and times it and its attention part (QK^T,
// causal softmax, PV of every layer). Next to the times: step01's predicted FLOPs, split into
// the weights term (linear in T) and the attention term (quadratic: 4*L*H*hd * T(T+1)/2 with
// the causal mask; the naive kernels compute the full T^2, twice that), the bytes of one
// layer's (H, T, T) fp32 score matrix, and the device memory in use. Double T: the weights
// term doubles, the attention term and the scores quadruple.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "step01_matmul/ceilings.h"
#include "args.h"
#include "check.h"
#include "cpu_env.h"
#include "forward.h"
#include "gpu.h"
#include "model.h"
#include "rng.h"
#include "step01_matmul/accounting.h"
#include "table.h"
#include "timer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: attn_bench [--device cpu|cuda] [--preset NAME | --model DIR] [--layers L] [--vocab V]\n"
            "                  [--dtype bf16|fp16|fp32] [--tmin T] [--tmax T] [--reps R] [--ceiling-tflops X]\n"
            "                  [--csv | --json]\n"
            "  defaults: cuda (when usable): llama-3.1-8b, bf16, T 128..8192, 3 reps;\n"
            "            cpu: llama-3.2-1b shape with --layers 1 --vocab 32000, fp32, T 64..512, 3 reps\n"
            "  every T: 1 warm-up run, then the median of --reps runs (min and max beside it)\n");
}

int main(int argc, char **argv) {
    cpu_env_init(argv);
    const char *device = NULL, *preset = NULL, *model_dir = NULL, *dtype = "bf16";
    int layers = 0, vocab = 0, tmin = 0, tmax = 0, reps = 0;
    double ceiling = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int more = i + 1 < argc;
        if (!strcmp(a, "--device") && more) device = argv[++i];
        else if (!strcmp(a, "--preset") && more) preset = argv[++i];
        else if (!strcmp(a, "--model") && more) model_dir = argv[++i];
        else if (!strcmp(a, "--layers") && more) layers = (int)arg_int(a, argv[++i], 1, 4096);
        else if (!strcmp(a, "--vocab") && more) vocab = (int)arg_int(a, argv[++i], 1, 1 << 20);
        else if (!strcmp(a, "--dtype") && more) dtype = argv[++i];
        else if (!strcmp(a, "--tmin") && more) tmin = (int)arg_int(a, argv[++i], 1, 1 << 20);
        else if (!strcmp(a, "--tmax") && more) tmax = (int)arg_int(a, argv[++i], 1, 1 << 20);
        else if (!strcmp(a, "--reps") && more) reps = (int)arg_int(a, argv[++i], 1, 1000);
        else if (!strcmp(a, "--ceiling-tflops") && more) ceiling = arg_float(a, argv[++i], 0, 1e6, ARG_LO_OPEN);
        else if (!strcmp(a, "--csv") || !strcmp(a, "--json")) continue;
        else arg_help_or_unknown(a, usage);
    }
    GpuInfo gi;
    int have_gpu;
    const int use_cuda = choose_device(device, &gi, &have_gpu);
    if (!preset && !model_dir) {
        preset = use_cuda ? "llama-3.1-8b" : "llama-3.2-1b";
        if (!use_cuda && !layers) layers = 1;
        if (!use_cuda && !vocab) vocab = 32000;
    }
    if (!tmin) tmin = use_cuda ? 128 : 64;
    if (!tmax) tmax = use_cuda ? 8192 : 512;
    if (!reps) reps = 3;
    if (tmax < tmin) arg_die("--tmin %d is larger than --tmax %d", tmin, tmax);
    StDtype wdt = !strcmp(dtype, "bf16") ? ST_BF16 : !strcmp(dtype, "fp16") ? ST_F16 : ST_F32;
    if (wdt == ST_F32 && strcmp(dtype, "fp32")) arg_die("--dtype: '%s' is not a dtype (allowed: bf16, fp16, fp32)", dtype);
    if (!use_cuda) wdt = ST_F32;

    char err[512], src[256];
    ModelConfig cfg;
    ModelWeights w;
    const int have_w = model_or_preset(model_dir, preset, NULL, &w, &cfg);
    if (have_w) {
        snprintf(src, sizeof src, "%s", model_dir);
        if (layers || vocab) arg_die("--layers / --vocab apply to --preset only");
    } else {
        if (layers > 0) cfg.n_layers = layers;
        if (vocab > 0) cfg.vocab = vocab;
        snprintf(src, sizeof src, "preset %s%s, random weights", preset, layers || vocab ? " (resized)" : "");
    }

    CpuModel cm;
    GpuModel *gm = NULL;
    const char *how;
    char ceil_note[640] = "";
    if (use_cuda) {
        gm = have_w ? gpu_model_load(&w, err, sizeof err) : gpu_model_random(&cfg, wdt, 1, err, sizeof err);
        if (!gm) die("%s", err);
        how = gpu_model_describe(gm);
        if (ceiling <= 0) {
            Ceilings ce;
            if (ceilings_load(&ce) == 0)
                ceiling = ceilings_gemm_tflops(&ce, 1, wdt == ST_F32 ? "fp32" : wdt == ST_F16 ? "fp16" : "bf16", ceil_note,
                                               sizeof ceil_note);
        }
    } else {
        if (have_w) {
            if (cpu_model_load(&w, &cm, err, sizeof err) != 0) die("%s", err);
        } else {
            cpu_model_random(&cfg, 1, &cm);
        }
        how = "fp32 CPU reference";
        if (ceiling <= 0) {
            Ceilings ce;
            if (ceilings_load(&ce) == 0) {
                ceiling = ce.cpu_sgemm_gflops / 1e3;
                snprintf(ceil_note, sizeof ceil_note, "%s", ce.cpu_blas_warning);
            }
        }
    }

    Table *tb = table_new("attn_bench: prefill time and memory vs sequence length");
    table_std_meta(tb);
    table_meta(tb, "device", "%s", use_cuda ? gi.name : "cpu");
    table_meta(tb, "model", "%s: %s, %d layers, d=%d, H=%d, KV=%d, hd=%d, ff=%d, vocab=%d", src,
               model_arch_name(cfg.arch), cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
               cfg.intermediate, cfg.vocab);
    table_meta(tb, "precision", "%s", how);
    table_meta(tb, "timing", "median of %d after 1 warm-up (%s); min and max beside it", reps,
               use_cuda ? "CUDA events" : "wall clock");
    if (!use_cuda) table_meta(tb, "cpu_threads", "%s", cpu_env_describe());
    table_meta(tb, "flops", "step01 account_flops: weights = 2*matmul_params*T; attn = 4*L*H*hd*T(T+1)/2 (causal); "
                            "attn_computed = what the kernels do: 4*L*H*hd*T^2 on the GPU (full GEMMs, "
                            "mask applied after), the causal count on the CPU (the loop skips j > i)");
    if (ceiling > 0) {
        char fb[64];
        table_meta(tb, "ceiling_tflops", "%.4g = %s (measured: %s, or --ceiling-tflops)", ceiling,
                   fmt_flops(ceiling * 1e12, fb, sizeof fb), ceilings_path());
    }
    if (ceil_note[0]) table_meta(tb, use_cuda ? "ceiling_note" : "cpu_warning", "%s", ceil_note);
    table_col(tb, "T", "%.0f");
    table_col(tb, "prefill_ms", "%.3f");
    table_col(tb, "prefill_min_ms", "%.3f");
    table_col(tb, "prefill_max_ms", "%.3f");
    table_col(tb, "attn_ms", "%.3f");
    table_col(tb, "attn_pct", "%.1f");
    table_col(tb, "weights_gflop", "%.1f");
    table_col(tb, "attn_gflop", "%.2f");
    table_col(tb, "attn_computed_gflop", "%.2f");
    table_col(tb, "attn_tflops", "%.3g");
    table_col(tb, "prefill_tflops", "%.3g");
    table_col(tb, "pct_of_ceiling", "%.1f");
    table_col(tb, "scores_mib", "%.1f");
    table_col(tb, "workspace_mib", "%.1f");
    table_col(tb, "mem_used_gib", "%.2f");
    table_col(tb, "attn_x_prev", "%.2f");

    Rng r;
    rng_seed(&r, 7);
    double prev_attn = NAN;
    for (int T = tmin; T <= tmax; T *= 2) {
        int *ids = xmalloc((size_t)T * sizeof(int));
        for (int t = 0; t < T; t++) ids[t] = (int)(rng_u32(&r) % (uint32_t)cfg.vocab);
        float *logits = use_cuda ? NULL : xmalloc((size_t)T * cfg.vocab * sizeof(float));
        ForwardTimes ft;
        double *tt = xmalloc((size_t)reps * sizeof(double)), *ta = xmalloc((size_t)reps * sizeof(double));
        for (int i = -1; i < reps; i++) {  // i = -1: warm-up (the GPU allocates its workspace there)
            int rc = use_cuda ? forward_cuda(gm, ids, T, NULL, &ft) : forward_cpu(&cm, ids, T, logits, &ft);
            if (rc) die("forward failed at T = %d", T);
            if (i >= 0) tt[i] = ft.total_ms, ta[i] = ft.attn_ms;
        }
        const TimeStats st = time_stats(tt, reps);
        const double ms = st.median, ams = median_d(ta, reps);
        Flops f = account_flops(&cfg, T);
        const double attn_pred = f.attn_per_token_per_ctx * (double)T * (T + 1) / 2.0;
        // The GPU's naive GEMMs compute every score and mask afterwards; the CPU loop skips j > i.
        const double attn_full = use_cuda ? f.attn_per_token_per_ctx * (double)T * T : attn_pred;
        const double wflops = f.prefill_total - attn_pred;
        table_row(tb);
        table_num(tb, "T", T);
        table_num(tb, "prefill_ms", ms);
        table_num(tb, "prefill_min_ms", st.min);
        table_num(tb, "prefill_max_ms", st.max);
        table_num(tb, "attn_ms", ams);
        table_num(tb, "attn_pct", 100.0 * ams / ms);
        table_num(tb, "weights_gflop", wflops / 1e9);
        table_num(tb, "attn_gflop", attn_pred / 1e9);
        table_num(tb, "attn_computed_gflop", attn_full / 1e9);
        table_num(tb, "attn_tflops", attn_full / (ams * 1e-3) / 1e12);
        table_num(tb, "prefill_tflops", f.prefill_total / (ms * 1e-3) / 1e12);
        if (ceiling > 0) table_num(tb, "pct_of_ceiling", 100.0 * f.prefill_total / (ms * 1e-3) / 1e12 / ceiling);
        table_num(tb, "scores_mib", ft.scores_bytes / 1048576.0);
        table_num(tb, "workspace_mib", ft.workspace_bytes / 1048576.0);
        if (use_cuda) table_num(tb, "mem_used_gib", gpu_mem_used_bytes() / 1073741824.0);
        if (isfinite(prev_attn)) table_num(tb, "attn_x_prev", ams / prev_attn);
        prev_attn = ams;
        free(tt);
        free(ta);
        free(ids);
        free(logits);
        if ((long long)T * 2 > tmax) break;
    }
    table_print(tb, outfmt_from_args(argc, argv), stdout);
    table_free(tb);
    if (gm) gpu_model_free(gm);
    else cpu_model_free(&cm);
    if (have_w) model_free(&w);
    return 0;
}
