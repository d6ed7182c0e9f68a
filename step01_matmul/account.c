// account.c — where do a model's parameters, FLOPs and memory go? Computed on paper from a
// Hugging Face config.json (or a built-in preset), placed on this machine's roofline.
//
//   build/bin/account --preset llama-2-7b
//   build/bin/account --config path/to/config.json --batch 8 --context 4096 --dtype bf16 --kv-dtype fp8
//   build/bin/account --preset llama-3.1-8b --json      (one JSON object, for scripts)
//
// Self-check: Llama-2-7B has 6,738,415,616 parameters and a 0.5 MiB/token fp16 KV cache;
// Llama-3.1-8B has 8,030,261,248 (GQA: 8 KV heads, so 128 KiB/token in bf16).
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "accounting.h"
#include "args.h"
#include "ceilings.h"
#include "check.h"
#include "hf_config.h"
#include "table.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: account (--preset NAME | --config FILE_OR_DIR) [options]\n"
            "  --preset NAME        built-in config (--list-presets shows them)\n"
            "  --config PATH        a Hugging Face config.json, or the model directory holding it\n"
            "  --batch B            sequences decoded together (default 1)\n"
            "  --context T          tokens per sequence: prompt + generated (default 4096)\n"
            "  --dtype D            weight dtype: fp32 bf16 fp16 int8 int4 (default: the config's, else bf16)\n"
            "  --kv-dtype D         KV cache dtype (default: --dtype, int4 weights keep a bf16 cache)\n"
            "  --act-dtype D        activation dtype (default bf16, fp32 when --dtype fp32)\n"
            "  --peak-tflops X      compute ceiling for the roofline (default: measured, %s)\n"
            "  --peak-gbps X        memory ceiling in GB/s, read+write (default: measured)\n"
            "  --csv | --json       machine-readable output\n",
            ceilings_path());
}

static const char *fmt_bytes(double b, char *buf, size_t n) {
    const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int i = 0;
    while (b >= 1024 && i < 4) b /= 1024, i++;
    snprintf(buf, n, "%.3g %s", b, u[i]);
    return buf;
}

static void row(Table *t, const char *sec, const char *item, double v, const char *unit, const char *note) {
    table_row(t);
    table_str(t, "section", sec);
    table_str(t, "item", item);
    table_num(t, "value", v);
    table_str(t, "unit", unit);
    if (note) table_str(t, "note", note);
}

int main(int argc, char **argv) {
    const char *preset = NULL, *config = NULL, *dtype = NULL, *kv_dtype = NULL, *act_dtype = NULL;
    long long batch = 1, context = 4096;
    double peak_tflops = 0, peak_gbps = 0;
    static struct option opts[] = {{"preset", 1, 0, 'p'},     {"config", 1, 0, 'c'},     {"batch", 1, 0, 'b'},
                                   {"context", 1, 0, 't'},    {"dtype", 1, 0, 'd'},      {"kv-dtype", 1, 0, 'k'},
                                   {"act-dtype", 1, 0, 'a'},  {"peak-tflops", 1, 0, 'F'}, {"peak-gbps", 1, 0, 'G'},
                                   {"list-presets", 0, 0, 'l'}, {"csv", 0, 0, 'C'},      {"json", 0, 0, 'J'},
                                   {"help", 0, 0, 'h'},       {0, 0, 0, 0}};
    int o;
    while ((o = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
        switch (o) {
        case 'p': preset = optarg; break;
        case 'c': config = optarg; break;
        case 'b': batch = arg_int("--batch", optarg, 1, 1 << 20); break;
        case 't': context = arg_int("--context", optarg, 1, 1 << 24); break;
        case 'd': dtype = optarg; break;
        case 'k': kv_dtype = optarg; break;
        case 'a': act_dtype = optarg; break;
        case 'F': peak_tflops = arg_float("--peak-tflops", optarg, 0, 1e6, ARG_LO_OPEN); break;
        case 'G': peak_gbps = arg_float("--peak-gbps", optarg, 0, 1e6, ARG_LO_OPEN); break;
        case 'l':
            for (const char *const *n = preset_names(); *n; n++) printf("%s\n", *n);
            return 0;
        case 'C': case 'J': break;  // read by outfmt_from_args
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) die("unexpected argument '%s' (see --help)", argv[optind]);
    if (!preset == !config) {
        usage(stderr);
        die("give exactly one of --preset or --config");
    }
    ModelConfig cfg;
    char err[512], src[128];
    if (preset) {
        const char *js = preset_config_json(preset);
        if (!js) die("unknown preset '%s' (--list-presets shows the built-in ones)", preset);
        snprintf(src, sizeof src, "preset %s", preset);
        if (hf_config_parse_lenient(js, src, &cfg, err, sizeof err)) die("%s", err);
    } else if (hf_config_load_lenient(config, &cfg, err, sizeof err)) {
        die("%s", err);
    }
    if (!dtype) dtype = !strcmp(cfg.torch_dtype, "float32") ? "fp32" : !strcmp(cfg.torch_dtype, "float16") ? "fp16" : "bf16";
    if (!kv_dtype) kv_dtype = dtype_bytes(dtype) < 2 ? "bf16" : dtype;
    if (!act_dtype) act_dtype = dtype_bytes(dtype) == 4 ? "fp32" : "bf16";
    double wb = dtype_bytes(dtype), kvb = dtype_bytes(kv_dtype), ab = dtype_bytes(act_dtype);
    if (!wb) die("unknown --dtype '%s' (fp32 bf16 fp16 int8 int4)", dtype);
    if (!kvb) die("unknown --kv-dtype '%s' (fp32 bf16 fp16 int8 fp8 int4)", kv_dtype);
    if (!ab) die("unknown --act-dtype '%s'", act_dtype);

    // Ceilings: explicit flags win, else what roofline measured on this machine.
    const char *ceil_src = "--peak-tflops/--peak-gbps";
    char ceil_buf[1200], ceil_note[256] = "", blas_warn[640] = "";
    Ceilings ce;
    if ((peak_tflops <= 0 || peak_gbps <= 0) && ceilings_load(&ce) == 0) {
        int gpu = ce.gpu_copy_gbps > 0;
        double tf = ceilings_gemm_tflops(&ce, gpu, dtype, ceil_note, sizeof ceil_note);
        double bw = gpu ? ce.gpu_copy_gbps : ce.cpu_copy_gbps;
        if (peak_tflops <= 0) peak_tflops = tf;
        if (peak_gbps <= 0) peak_gbps = bw;
        if (!gpu) snprintf(blas_warn, sizeof blas_warn, "%s", ce.cpu_blas_warning);
        snprintf(ceil_buf, sizeof ceil_buf, "measured by roofline on %s (file %s)%s%s", gpu ? ce.gpu_name : ce.cpu_name,
                 ceilings_path(), ceil_note[0] ? "; " : "", ceil_note);
        ceil_src = ceil_buf;
    }
    int have_roof = peak_tflops > 0 && peak_gbps > 0;

    ParamCount p = account_params(&cfg);
    Flops f = account_flops(&cfg, context);
    MemUsage m = account_memory(&cfg, batch, context, wb, kvb, ab);
    // Roofline placement. Decode step at batch B (account_decode_step, the one formula): every
    // weight is read once and B tokens use it (of the embedding table only B rows, unless tied);
    // each sequence reads its whole KV cache. Prefill of the context: weights read once for B*T
    // tokens, the KV cache written once.
    const DecodeStep ds = account_decode_step(&cfg, batch, context, wb, kvb);
    double dec_flops = ds.flops;
    double dec_bytes = ds.bytes;
    double pre_flops = (double)batch * f.prefill_total;
    double pre_bytes = weight_bytes_read(&cfg, wb, batch * context) + m.kv_cache + m.activations * cfg.n_layers;
    double dec_ai = dec_flops / dec_bytes, pre_ai = pre_flops / pre_bytes;
    double ridge = have_roof ? peak_tflops * 1e12 / (peak_gbps * 1e9) : NAN;
    double dec_time = have_roof ? fmax(dec_flops / (peak_tflops * 1e12), dec_bytes / (peak_gbps * 1e9)) : NAN;
    double pre_time = have_roof ? fmax(pre_flops / (peak_tflops * 1e12), pre_bytes / (peak_gbps * 1e9)) : NAN;

    OutFmt fmt = outfmt_from_args(argc, argv);
    if (fmt == FMT_JSON) {
        json_t *j = json_object();
        json_object_set_new(j, "model", json_string(preset ? preset : config));
        json_object_set_new(j, "architecture", json_string(model_arch_name(cfg.arch)));
        if (cfg.unsupported[0]) json_object_set_new(j, "unsupported", json_string(cfg.unsupported));
        json_object_set_new(j, "batch", json_integer(batch));
        json_object_set_new(j, "context", json_integer(context));
        json_object_set_new(j, "dtype", json_string(dtype));
        json_object_set_new(j, "kv_dtype", json_string(kv_dtype));
        json_object_set_new(j, "params_total", json_integer(p.total));
        json_object_set_new(j, "params_embedding", json_integer(p.embedding));
        json_object_set_new(j, "params_attention", json_integer(p.q + p.k + p.v + p.o));
        json_object_set_new(j, "params_q", json_integer(p.q));
        json_object_set_new(j, "params_k", json_integer(p.k));
        json_object_set_new(j, "params_v", json_integer(p.v));
        json_object_set_new(j, "params_o", json_integer(p.o));
        json_object_set_new(j, "params_mlp", json_integer(p.mlp));
        json_object_set_new(j, "params_norms", json_integer(p.norms));
        json_object_set_new(j, "params_lm_head", json_integer(p.lm_head));
        json_object_set_new(j, "params_per_layer", json_integer(p.per_layer));
        json_object_set_new(j, "tied_embeddings", json_boolean(cfg.tie_embeddings));
        json_object_set_new(j, "kv_cache_bytes_per_token", json_real(m.kv_per_token));
        json_object_set_new(j, "weights_bytes", json_real(m.weights));
        json_object_set_new(j, "kv_cache_bytes", json_real(m.kv_cache));
        json_object_set_new(j, "activations_bytes", json_real(m.activations));
        json_object_set_new(j, "workspace_bytes", json_real(m.workspace));
        json_object_set_new(j, "memory_total_bytes", json_real(m.total));
        json_object_set_new(j, "flops_per_token_decode", json_real(f.decode_per_token));
        json_object_set_new(j, "flops_per_token_weights", json_real(f.weights_per_token));
        json_object_set_new(j, "flops_attention_per_token_per_context", json_real(f.attn_per_token_per_ctx));
        json_object_set_new(j, "flops_per_token_prefill", json_real(f.prefill_per_token));
        json_object_set_new(j, "flops_prefill_per_sequence", json_real(f.prefill_total));
        json_object_set_new(j, "flops_prefill_total", json_real(pre_flops));  // all `batch` sequences, as the text
        json_object_set_new(j, "decode_weight_bytes_read", json_real(ds.weights));
        json_object_set_new(j, "decode_kv_bytes_read", json_real(ds.kv));
        json_object_set_new(j, "decode_bytes_read", json_real(ds.bytes));
        if (blas_warn[0]) json_object_set_new(j, "warning", json_string(blas_warn));
        json_object_set_new(j, "intensity_decode", json_real(dec_ai));
        json_object_set_new(j, "intensity_prefill", json_real(pre_ai));
        if (have_roof) {
            json_object_set_new(j, "peak_tflops", json_real(peak_tflops));
            json_object_set_new(j, "peak_gbps", json_real(peak_gbps));
            json_object_set_new(j, "ridge_flops_per_byte", json_real(ridge));
            json_object_set_new(j, "decode_bound", json_string(dec_ai < ridge ? "memory" : "compute"));
            json_object_set_new(j, "prefill_bound", json_string(pre_ai < ridge ? "memory" : "compute"));
            json_object_set_new(j, "decode_step_floor_s", json_real(dec_time));
            json_object_set_new(j, "decode_tokens_per_s_ceiling", json_real((double)batch / dec_time));
            json_object_set_new(j, "prefill_floor_s", json_real(pre_time));
            json_object_set_new(j, "ceilings_source", json_string(ceil_src));
            json_object_set_new(j, "ceilings_file", json_string(ceil_src == ceil_buf ? ceilings_path() : ""));
        }
        char *s = json_dumps(j, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
        printf("%s\n", s);
        free(s);
        json_decref(j);
        return 0;
    }

    Table *t = table_new("account: parameters, FLOPs and memory on paper");
    table_std_meta(t);
    table_meta(t, "model", "%s (%s)", preset ? preset : config, model_arch_name(cfg.arch));
    table_meta(t, "shape", "hidden %d, intermediate %d, layers %d, heads %d, kv_heads %d (%s), head_dim %d, vocab %d%s%s%s",
               cfg.hidden, cfg.intermediate, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads,
               cfg.n_kv_heads == cfg.n_heads ? "MHA" : cfg.n_kv_heads == 1 ? "MQA" : "GQA", cfg.head_dim, cfg.vocab,
               cfg.tie_embeddings ? ", tied embeddings" : "", cfg.qkv_bias ? ", q/k/v bias" : "",
               cfg.qk_norm ? ", q/k norm" : "");
    if (cfg.unsupported[0])
        table_meta(t, "note", "counted anyway; the engine cannot run this model yet: %s", cfg.unsupported);
    table_meta(t, "setting", "batch %lld, context %lld, weights %s, kv %s, activations %s", batch, context, dtype,
               kv_dtype, act_dtype);
    if (have_roof) table_meta(t, "ceilings", "%s", ceil_src);
    else table_meta(t, "ceilings", "none: %s not found; run build/bin/roofline or pass --peak-tflops/--peak-gbps", ceilings_path());
    if (blas_warn[0]) table_meta(t, "warning", "%s", blas_warn);
    table_col(t, "section", NULL);
    table_col(t, "item", NULL);
    table_col(t, "value", "%.10g");
    table_col(t, "unit", NULL);
    table_col(t, "note", NULL);
    char b1[64], b2[64], note[256];
    const double P = (double)p.total;
#define PCT(x) (snprintf(note, sizeof note, "%.1f%% of params", 100.0 * (double)(x) / P), note)
    row(t, "params", "embedding", (double)p.embedding, "params", PCT(p.embedding));
    row(t, "params", "attention q", (double)p.q, "params", PCT(p.q));
    row(t, "params", "attention k", (double)p.k, "params", PCT(p.k));
    row(t, "params", "attention v", (double)p.v, "params", PCT(p.v));
    row(t, "params", "attention o", (double)p.o, "params", PCT(p.o));
    row(t, "params", "mlp gate+up+down", (double)p.mlp, "params", PCT(p.mlp));
    row(t, "params", "norms", (double)p.norms, "params", PCT(p.norms));
    row(t, "params", "lm_head", (double)p.lm_head, "params", cfg.tie_embeddings ? "tied: shares the embedding, counted once" : PCT(p.lm_head));
    row(t, "params", "per layer", (double)p.per_layer, "params", NULL);
    snprintf(note, sizeof note, "%.3f B", P / 1e9);
    row(t, "params", "total", P, "params", note);
    row(t, "flops", "decode, weights", f.weights_per_token, "FLOP/token", "2 x every multiplied weight (incl. lm_head)");
    snprintf(note, sizeof note, "4 x layers x heads x head_dim = %.3g per token of context", f.attn_per_token_per_ctx);
    row(t, "flops", "decode, attention", f.attn_per_token_per_ctx * (double)context, "FLOP/token", note);
    row(t, "flops", "decode, total at context", f.decode_per_token, "FLOP/token", NULL);
    row(t, "flops", "prefill, per token", f.prefill_per_token, "FLOP/token", "causal: average over the prompt");
    row(t, "flops", "prefill, whole prompt", pre_flops, "FLOP", batch > 1 ? "all sequences of the batch" : NULL);
    snprintf(note, sizeof note, "2 x %d layers x %d kv_heads x %d head_dim x %g B = %s", cfg.n_layers, cfg.n_kv_heads,
             cfg.head_dim, kvb, fmt_bytes(m.kv_per_token, b1, sizeof b1));
    row(t, "memory", "KV cache per token", m.kv_per_token, "bytes", note);
    if (cfg.n_kv_heads != cfg.n_heads) {
        snprintf(note, sizeof note, "GQA: %dx smaller than MHA (%s/token)", cfg.n_heads / cfg.n_kv_heads,
                 fmt_bytes(m.kv_per_token * cfg.n_heads / cfg.n_kv_heads, b1, sizeof b1));
        table_str(t, "note", note);
    }
#define MEMROW(name, x, what)                                                                                  \
    snprintf(note, sizeof note, "%s, %.1f%%: %s", fmt_bytes(x, b1, sizeof b1), 100.0 * (x) / m.total, what); \
    row(t, "memory", name, x, "bytes", note)
    MEMROW("weights", m.weights, "every parameter once");
    MEMROW("KV cache", m.kv_cache, "batch x context x per-token");
    MEMROW("activations", m.activations, "one layer's live tensors, prefill of the context");
    MEMROW("workspace", m.workspace, "naive attention scores (fp32) + logits");
    snprintf(note, sizeof note, "%s", fmt_bytes(m.total, b1, sizeof b1));
    row(t, "memory", "total", m.total, "bytes", note);
    snprintf(note, sizeof note, "weights %s (embedding: %s) + KV %s", fmt_bytes(ds.weights, b1, sizeof b1),
             cfg.tie_embeddings ? "read whole, as the tied lm_head" : "one row per sequence", fmt_bytes(ds.kv, b2, sizeof b2));
    row(t, "roofline", "decode bytes per step", ds.bytes, "bytes", note);
    row(t, "roofline", "decode intensity", dec_ai, "FLOP/byte", "batch x decode FLOPs / decode bytes per step");
    row(t, "roofline", "prefill intensity", pre_ai, "FLOP/byte", "prompt FLOPs / (weights + KV written + activations)");
    if (have_roof) {
        snprintf(note, sizeof note, "%s / %.4g GB/s", fmt_flops(peak_tflops * 1e12, b1, sizeof b1), peak_gbps);
        row(t, "roofline", "ridge point", ridge, "FLOP/byte", note);
        row(t, "roofline", "decode is", NAN, "", dec_ai < ridge ? "MEMORY-bound (left of the ridge)" : "COMPUTE-bound (right of the ridge)");
        row(t, "roofline", "prefill is", NAN, "", pre_ai < ridge ? "MEMORY-bound (left of the ridge)" : "COMPUTE-bound (right of the ridge)");
        snprintf(note, sizeof note, "%.1f tok/s ceiling for the batch", (double)batch / dec_time);
        row(t, "roofline", "decode step floor", dec_time * 1e3, "ms", note);
        row(t, "roofline", "prefill floor", pre_time * 1e3, "ms", "whole prompt, all sequences");
    }
    table_print(t, fmt, stdout);
    table_free(t);
    return 0;
}
