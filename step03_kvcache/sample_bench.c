// sample_bench.c — what sampling one token costs at a real vocabulary size, with the whole
// vocabulary sorted (the reference) and with only the filters' survivors sorted (the sampler).
//
//   build/bin/sample_bench                          vocab 128256 (Llama 3) and 151936 (Qwen), CPU
//   build/bin/sample_bench --vocab 32000 --tokens 50 --csv
//
// Logits: N(0, sigma^2) per id, a fresh vector per token (seeded), sigma 3 by default: a peaked
// distribution like a trained model's, where top-p 0.9 keeps tens to hundreds of ids. For every
// setting both ways run on the same logits; `same` counts the tokens whose candidate list (ids,
// order and probabilities) is bit-identical, so the draws are too. Times: median of --tokens
// calls after 2 warm-up calls, wall clock, one thread (sampling is serial per sequence).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "check.h"
#include "cpu_env.h"
#include "kvcache.h"
#include "rng.h"
#include "table.h"
#include "timer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: sample_bench [--vocab V1,V2,...] [--tokens N] [--sigma S] [--csv | --json]\n"
            "  --vocab   vocabulary sizes (default 128256,151936)\n"
            "  --tokens  timed tokens per setting (default 30; median)\n"
            "  --sigma   standard deviation of the random logits (default 3)\n");
}

int main(int argc, char **argv) {
    cpu_env_init(argv);
    const char *vocab_arg = "128256,151936";
    int tokens = 30;
    double sigma = 3;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int more = i + 1 < argc;
        if (!strcmp(a, "--vocab") && more) vocab_arg = argv[++i];
        else if (!strcmp(a, "--tokens") && more) tokens = (int)arg_int(a, argv[++i], 1, 1000);
        else if (!strcmp(a, "--sigma") && more) sigma = arg_float(a, argv[++i], 0, 1e3, ARG_LO_OPEN);
        else if (!strcmp(a, "--csv") || !strcmp(a, "--json")) continue;
        else arg_help_or_unknown(a, usage);
    }
    if (tokens < 1 || tokens > 1000) die("--tokens must be in 1..1000");
    if (!(sigma > 0)) die("--sigma must be > 0");
    int nv;
    int *vocabs = arg_int_list("--vocab", vocab_arg, 2, 1 << 24, &nv);
    const struct {
        const char *name;
        SamplerParams p;
    } settings[] = {
        {"T=0.8 (no filter)", {.temperature = 0.8f, .top_p = 1.0f}},
        {"T=0.8 top-k 50", {.temperature = 0.8f, .top_k = 50, .top_p = 1.0f}},
        {"T=0.8 top-p 0.9", {.temperature = 0.8f, .top_p = 0.9f}},
        {"T=0.8 min-p 0.05", {.temperature = 0.8f, .top_p = 1.0f, .min_p = 0.05f}},
        {"T=0.7 top-k 40 top-p 0.95", {.temperature = 0.7f, .top_k = 40, .top_p = 0.95f}},
        {"T=1.0 top-p 0.95 min-p 0.01", {.temperature = 1.0f, .top_p = 0.95f, .min_p = 0.01f}},
    };
    const int ns = sizeof settings / sizeof settings[0];

    Table *t = table_new("step03 sampling: milliseconds per token, full sort vs only the survivors sorted");
    table_std_meta(t);
    table_meta(t, "device", "cpu, one thread");
    table_meta(t, "logits", "N(0, %.2g^2) per id, a fresh vector per token", sigma);
    table_meta(t, "timing", "median of %d tokens after 2 warm-up tokens (wall clock), min and max beside it", tokens);
    table_col(t, "vocab", "%.0f");
    table_col(t, "setting", NULL);
    table_col(t, "kept", "%.1f");
    table_col(t, "full_sort_ms", "%.3f");
    table_col(t, "full_sort_max_ms", "%.3f");
    table_col(t, "partial_ms", "%.3f");
    table_col(t, "partial_min_ms", "%.3f");
    table_col(t, "partial_max_ms", "%.3f");
    table_col(t, "speedup", "%.1f");
    table_col(t, "same", "%.0f");
    Rng r;
    for (int vi = 0; vi < nv; vi++) {
        const int V = vocabs[vi];
        if (V < 1) die("--vocab: sizes must be >= 1");
        float *l = xmalloc((size_t)V * sizeof(float));
        int *ids = xmalloc((size_t)V * sizeof(int));
        float *prob = xmalloc((size_t)V * sizeof(float));
        for (int si = 0; si < ns; si++) {
            Sampler a, b;
            sampler_init(&a, &settings[si].p, V);
            sampler_init(&b, &settings[si].p, V);
            double *tf = xmalloc((size_t)tokens * sizeof(double)), *tp = xmalloc((size_t)tokens * sizeof(double));
            double kept = 0;
            int same = 0;
            rng_seed(&r, 1000 + (uint64_t)V);
            for (int k = -2; k < tokens; k++) {  // k < 0: warm-up
                rng_fill_normal(&r, l, (size_t)V, 0.0f, (float)sigma);
                double t0 = now_sec();
                const int nf = sampler_candidates_full_sort(&a, l);
                const double dt_full = now_sec() - t0;
                memcpy(ids, a.idx, (size_t)nf * sizeof(int));
                memcpy(prob, a.prob, (size_t)nf * sizeof(float));
                t0 = now_sec();
                const int np = sampler_candidates(&b, l);
                const double dt_part = now_sec() - t0;
                if (k < 0) continue;
                tf[k] = dt_full * 1e3, tp[k] = dt_part * 1e3;
                kept += np;
                same += np == nf && !memcmp(ids, b.idx, (size_t)np * sizeof(int)) &&
                        !memcmp(prob, b.prob, (size_t)np * sizeof(float));
            }
            const TimeStats sf = time_stats(tf, tokens), sp = time_stats(tp, tokens);
            table_row(t);
            table_num(t, "vocab", V);
            table_str(t, "setting", settings[si].name);
            table_num(t, "kept", kept / tokens);
            table_num(t, "full_sort_ms", sf.median);
            table_num(t, "full_sort_max_ms", sf.max);
            table_num(t, "partial_ms", sp.median);
            table_num(t, "partial_min_ms", sp.min);
            table_num(t, "partial_max_ms", sp.max);
            table_num(t, "speedup", sf.median / sp.median);
            table_num(t, "same", same);
            free(tf), free(tp);
            sampler_free(&a), sampler_free(&b);
        }
        free(l), free(ids), free(prob);
    }
    table_print(t, outfmt_from_args(argc, argv), stdout);
    table_free(t);
    free(vocabs);
    return 0;
}
