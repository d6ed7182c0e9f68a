// forward.c — run the forward pass of a Hugging Face checkpoint on a prompt: logits of every
// position, the top-5 next tokens, and (with --reps) the prefill time against step01's FLOPs.
//
//   build/bin/forward --model tests/data/models/llama_gqa_f32 --ids 1,2,3
//   build/bin/forward --model DIR --ids-npy prompt.npy --device cuda --logits-out logits.npy --json
//   build/bin/forward --model /tmp/llama8b --device cuda --random-ids 2048 --reps 10 --ceiling-tflops 753
//
// What it teaches: prefill is T tokens through every layer at once, so its work is
// (2 x matmul params) x T FLOPs for the weights plus a T^2 attention term (step01's
// account_flops); --reps times it (validate first: a forward that does not match the goldens
// is not worth timing, see tests/test_step02_attention.c).
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "step01_matmul/ceilings.h"
#include "args.h"
#include "prompt.h"
#include "check.h"
#include "cpu_env.h"
#include "forward.h"
#include "gpu.h"
#include "model.h"
#include "npy.h"
#include "rng.h"
#include "step01_matmul/accounting.h"
#include "table.h"
#include "timer.h"
#include "tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: forward --model DIR (--ids 1,2,3 | --ids-npy FILE | --prompt TEXT | --random-ids T)\n"
            "               [--device cpu|cuda]\n"
            "               [--logits-out FILE.npy] [--reps N] [--ceiling-tflops X] [--seed S] [--json | --csv]\n"
            "  --model       a Hugging Face directory: config.json + model.safetensors (or a sharded index)\n"
            "  --ids         the prompt as token ids; --ids-npy reads them from an int .npy; --random-ids T\n"
            "                draws T random ids (seed --seed) for timing; --prompt encodes TEXT with DIR/tokenizer.json\n"
            "                (the token column shows each id's text when DIR has a tokenizer.json)\n"
            "  --device      cpu (fp32 reference) or cuda (default: cuda when a GPU is usable, else cpu)\n"
            "  --logits-out  write the logits of every position, float32 (T, vocab)\n"
            "  --reps N      after the checked run, time N more forwards (median) and report TFLOP/s\n"
            "  --ceiling-tflops  the peak to compare with (default: build/ceilings.json from build/bin/roofline)\n"
            "  --json/--csv  the top-5 of every position; text prints the last position only\n");
}

// Token ids from an int32/int64 .npy (any shape, read in C order). An id that does not fit in
// an int is refused here; ids outside the vocabulary are refused by the caller.
static int *load_ids_npy(const char *path, int *T) {
    NpyArray a;
    if (npy_load(path, &a) != 0) die("--ids-npy: cannot read %s", path);
    if (a.count < 1) die("--ids-npy: %s is empty", path);
    if (a.count > (1u << 24) || (strcmp(a.dtype, "<i4") && strcmp(a.dtype, "<i8"))) {
        char what[64];
        snprintf(what, sizeof what, "%zu ids of dtype %s", a.count, a.dtype);
        npy_free(&a);
        die("--ids-npy: %s has %s, expected at most %u int32/int64 ids", path, what, 1u << 24);
    }
    int *ids = xmalloc(a.count * sizeof(int));
    for (size_t i = 0; i < a.count; i++) {
        const long long v = !strcmp(a.dtype, "<i4") ? ((const int32_t *)a.data)[i] : ((const int64_t *)a.data)[i];
        if (v < 0 || v > INT_MAX) {
            free(ids), npy_free(&a);
            die("--ids-npy: %s: id %lld at position %zu is not a token id", path, v, i);
        }
        ids[i] = (int)v;
    }
    *T = (int)a.count;
    npy_free(&a);
    return ids;
}

int main(int argc, char **argv) {
    cpu_env_init(argv);
    const char *model_dir = NULL, *ids_arg = NULL, *ids_npy = NULL, *prompt = NULL, *device = NULL, *logits_out = NULL;
    int random_T = 0, reps = 0;
    double ceiling = 0;
    unsigned long long seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int more = i + 1 < argc;
        if (!strcmp(a, "--model") && more) model_dir = argv[++i];
        else if (!strcmp(a, "--ids") && more) ids_arg = argv[++i];
        else if (!strcmp(a, "--ids-npy") && more) ids_npy = argv[++i];
        else if (!strcmp(a, "--prompt") && more) prompt = argv[++i];
        else if (!strcmp(a, "--random-ids") && more) random_T = (int)arg_int(a, argv[++i], 1, 1 << 20);
        else if (!strcmp(a, "--device") && more) device = argv[++i];
        else if (!strcmp(a, "--logits-out") && more) logits_out = argv[++i];
        else if (!strcmp(a, "--reps") && more) reps = (int)arg_int(a, argv[++i], 0, 1000);
        else if (!strcmp(a, "--ceiling-tflops") && more) ceiling = arg_float(a, argv[++i], 0, 1e6, ARG_LO_OPEN);
        else if (!strcmp(a, "--seed") && more) seed = arg_u64(a, argv[++i]);
        else if (!strcmp(a, "--json") || !strcmp(a, "--csv")) continue;
        else arg_help_or_unknown(a, usage);
    }
    if (!model_dir || (!!ids_arg + !!ids_npy + !!prompt + (random_T > 0)) != 1) {
        usage(stderr);
        arg_die("need --model and exactly one of --ids / --ids-npy / --prompt / --random-ids");
    }
    GpuInfo gi;
    int have_gpu;
    const int use_cuda = choose_device(device, &gi, &have_gpu);

    char err[512];
    ModelWeights w;
    double t0 = now_sec();
    if (model_load(model_dir, &w, err, sizeof err) != 0) die("%s", err);
    const ModelConfig *c = &w.cfg;
    // The tokenizer is optional: it only turns ids into text for the table (and --prompt).
    char tok_path[1024];
    Tokenizer *tok = tokenizer_for_model(model_dir, prompt != NULL, tok_path, sizeof tok_path);
    int T = 0;
    int *ids;
    if (prompt) {
        ids = prompt_to_ids(tok, tok_path, prompt, &T);
        check_ids_in_vocab(tok_path, ids, T, c->vocab);
    } else if (ids_arg) {
        ids = parse_int_list(ids_arg, "--ids", &T);
        check_ids_in_vocab("--ids", ids, T, c->vocab);
    } else if (ids_npy) {
        ids = load_ids_npy(ids_npy, &T);
        check_ids_in_vocab("--ids-npy", ids, T, c->vocab);
    } else {
        T = random_T;
        ids = xmalloc((size_t)T * sizeof(int));
        Rng r;
        rng_seed(&r, seed);
        for (int t = 0; t < T; t++) ids[t] = (int)(rng_u32(&r) % (uint32_t)c->vocab);
    }

    CpuModel cm;
    GpuModel *gm = NULL;
    const char *how;
    if (use_cuda) {
        gm = gpu_model_load(&w, err, sizeof err);
        if (!gm) die("%s: %s", model_dir, err);
        how = gpu_model_describe(gm);
    } else {
        if (cpu_model_load(&w, &cm, err, sizeof err) != 0) die("%s: %s", model_dir, err);
        how = "fp32 CPU reference (weights upcast to fp32, OpenBLAS projections, OpenMP attention)";
    }
    const double load_s = now_sec() - t0;

    float *logits = xmalloc((size_t)T * c->vocab * sizeof(float));  // (T, vocab)
    ForwardTimes ft;
    int rc = use_cuda ? forward_cuda(gm, ids, T, logits, &ft) : forward_cpu(&cm, ids, T, logits, &ft);
    if (rc) die("forward failed");
    size_t nbad = 0;
    for (size_t i = 0; i < (size_t)T * c->vocab; i++) nbad += !isfinite(logits[i]);
    if (nbad) die("%zu logits are not finite (of %d x %d; a NaN/Inf weight in %s?)", nbad, T, c->vocab, model_dir);
    if (logits_out) {
        size_t shape[2] = {(size_t)T, (size_t)c->vocab};
        if (npy_save_f32(logits_out, logits, 2, shape) != 0) die("cannot write %s", logits_out);
    }

    // Timing: median of reps forwards without the logits copy (it is not part of the prefill).
    double med_ms = NAN, attn_ms = NAN;
    char ceil_note[640] = "";
    TimeStats spread = {0};
    Flops fl = account_flops(c, T);
    if (reps > 0) {
        double *tt = xmalloc((size_t)reps * sizeof(double)), *ta = xmalloc((size_t)reps * sizeof(double));
        for (int r = 0; r < reps; r++) {
            rc = use_cuda ? forward_cuda(gm, ids, T, NULL, &ft) : forward_cpu(&cm, ids, T, logits, &ft);
            if (rc) die("forward failed");
            tt[r] = ft.total_ms;
            ta[r] = ft.attn_ms;
        }
        spread = time_stats(tt, reps);
        med_ms = spread.median;
        attn_ms = median_d(ta, reps);
        free(tt);
        free(ta);
        if (ceiling <= 0) {
            Ceilings ce;
            if (ceilings_load(&ce) == 0) {
                const int f32 = !strcmp(c->torch_dtype, "float32") || w.layers[0].wq->dtype == ST_F32;
                ceiling = ceilings_gemm_tflops(&ce, use_cuda, f32 ? "fp32" : w.layers[0].wq->dtype == ST_F16 ? "fp16" : "bf16",
                                               ceil_note, sizeof ceil_note);
                if (!use_cuda) snprintf(ceil_note, sizeof ceil_note, "%s", ce.cpu_blas_warning);
            }
        }
    }

    const OutFmt fmt = outfmt_from_args(argc, argv);
    Table *tb = table_new("forward: top-5 next tokens");
    table_std_meta(tb);
    table_meta(tb, "model", "%s (%s, %d layers, d=%d, H=%d, KV=%d, hd=%d, ff=%d, vocab=%d, %s)", model_dir,
               model_arch_name(c->arch), c->n_layers, c->hidden, c->n_heads, c->n_kv_heads, c->head_dim,
               c->intermediate, c->vocab, st_dtype_name(w.layers[0].wq->dtype));
    table_meta(tb, "device", "%s", use_cuda ? gi.name : "cpu");
    if (use_cuda) table_meta(tb, "compute_capability", "%d.%d", gi.cc_major, gi.cc_minor);
    table_meta(tb, "precision", "%s", how);
    table_meta(tb, "tokens", "%d", T);
    table_meta(tb, "load_s", "%.2f", load_s);
    if (logits_out) table_meta(tb, "logits_out", "%s (float32, %d x %d)", logits_out, T, c->vocab);
    if (reps > 0) {
        double tflops = fl.prefill_total / (med_ms * 1e-3) / 1e12;
        table_meta(tb, "prefill_ms", "%.3f (median of %d after the checked run, %s; min %.3f, max %.3f)", med_ms, reps,
                   use_cuda ? "CUDA events" : "wall clock", spread.min, spread.max);
        table_meta(tb, "attention_ms", "%.3f (QK^T + causal softmax + PV, all layers)", attn_ms);
        table_meta(tb, "prefill_flops", "%.4e (step01 account_flops: weights x T + causal attention)", fl.prefill_total);
        char f1[64], f2[64];
        table_meta(tb, "achieved_tflops", "%.4g (%s)", tflops, fmt_flops(tflops * 1e12, f1, sizeof f1));
        if (ceiling > 0)
            table_meta(tb, "pct_of_ceiling", "%.1f%% of %s (%s)", 100.0 * tflops / ceiling, fmt_flops(ceiling * 1e12, f2, sizeof f2),
                       ceilings_path());
        else table_meta(tb, "pct_of_ceiling", "unknown (no %s: run build/bin/roofline or pass --ceiling-tflops)", ceilings_path());
        if (ceil_note[0]) table_meta(tb, use_cuda ? "ceiling_note" : "cpu_warning", "%s", ceil_note);
        table_meta(tb, "tokens_per_s", "%.0f", T / (med_ms * 1e-3));
        table_meta(tb, "scores_bytes_per_layer", "%.0f", ft.scores_bytes);
    }
    table_col(tb, "pos", "%.0f");
    table_col(tb, "rank", "%.0f");
    table_col(tb, "id", "%.0f");
    table_col(tb, "logit", "%.5f");
    table_col(tb, "logprob", "%.5f");
    if (tok) table_col(tb, "token", NULL);
    const int first = fmt == FMT_TEXT ? T - 1 : 0;
    for (int t = first; t < T; t++) {
        const float *row = logits + (size_t)t * c->vocab;
        int top[5];
        const int k = c->vocab < 5 ? c->vocab : 5;
        forward_topk(row, c->vocab, k, top);
        double lse = 0;  // log-sum-exp around the max, in double
        for (int i = 0; i < c->vocab; i++) lse += exp((double)row[i] - row[top[0]]);
        lse = log(lse) + row[top[0]];
        for (int r = 0; r < k; r++) {
            table_row(tb);
            table_num(tb, "pos", t);
            table_num(tb, "rank", r + 1);
            table_num(tb, "id", top[r]);
            table_num(tb, "logit", row[top[r]]);
            table_num(tb, "logprob", row[top[r]] - lse);
            if (tok) {
                int32_t one = top[r];
                char *txt = tokenizer_decode(tok, &one, 1, 0, NULL);
                char shown[96];  // control bytes escaped (\n, \xNN) so the terminal shows what the token is
                text_printable(shown, sizeof shown, txt ? txt : "", txt ? strlen(txt) : 0);
                table_str(tb, "token", shown);
                free(txt);
            }
        }
    }
    table_print(tb, fmt, stdout);
    table_free(tb);

    free(logits);
    free(ids);
    if (gm) gpu_model_free(gm);
    else cpu_model_free(&cm);
    if (tok) tokenizer_free(tok);
    model_free(&w);
    return 0;
}
