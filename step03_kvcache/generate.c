// generate.c — autoregressive generation with (default) or without (--no-cache) a KV cache, on
// the CPU reference or CUDA, greedy or sampled; prints the tokens and TTFT, TPOT, tok/s, KV bytes.
//
//   build/bin/generate --model tests/data/models/llama_mha_bf16 --ids 1,2,3 --max-new-tokens 16
//   build/bin/generate --model DIR --prompt "The quick brown fox" --max-new-tokens 32 --temperature 0.8 --top-p 0.9 --seed 7
//   build/bin/generate --model DIR --ids 1,2,3 --max-new-tokens 32 --no-cache --json --logprobs 5
//
// What it teaches: TTFT (time to first token) is the prefill, one pass over the prompt; TPOT
// (time per output token) is one decode step. With the cache a decode step costs the same at
// every position (plus a small attention term); with --no-cache step t recomputes all t tokens.
//
// The times are what the user waits for, on one wall clock: TTFT = start of the prefill to the
// first token sampled and printed; TPOT = (last token printed - first token printed) / (tokens - 1),
// so it holds the forward, the sampling, the top-k logprobs and the detokenize + print of every
// token; decode tok/s = 1 / TPOT; end-to-end tok/s = tokens / (start of prefill to last token).
// The forward and the sampling alone are printed beside them, per token.
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "args.h"
#include "prompt.h"
#include "check.h"
#include "cpu_env.h"
#include "gpu.h"
#include "kvcache.h"
#include "model.h"
#include "step06_quant/qmodel.h"  // --quant and quantized checkpoints
#include "table.h"
#include "timer.h"
#include "tokenizer.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: generate --model DIR (--ids 1,2,3 | --prompt TEXT) --max-new-tokens N [--device cpu|cuda]\n"
            "                [--no-cache] [--greedy | --temperature T --top-k K --top-p P --min-p M --seed S]\n"
            "                [--ignore-eos] [--logprobs K] [--max-seq N] [--quant Q] [--json]\n"
            "  --model        a Hugging Face directory (config.json, model.safetensors, optional tokenizer.json)\n"
            "  --ids          the prompt as token ids; --prompt encodes TEXT with DIR/tokenizer.json\n"
            "  --device       cpu (fp32 reference) or cuda (default: cuda when a GPU is usable)\n"
            "  --no-cache     recompute the whole prefix at every step (step02's forward) instead of the KV cache\n"
            "  --greedy       argmax (the default when no sampling option is given)\n"
            "  --temperature T, --top-k K (0 off), --top-p P (1 off), --min-p M (0 off), --seed S: seeded sampling\n"
            "  --ignore-eos   do not stop at the EOS ids of generation_config.json / config.json\n"
            "  --logprobs K   the top-K log-probabilities of every step (in --json)\n"
            "  --quant        quantize the projections at load (round to nearest: INT8 per channel, INT4 groups of\n"
            "                 128; step06): none (default), rtn-int8, rtn-int4, or either with +lm_head (the\n"
            "                 lm_head too); a quantized checkpoint (GPTQ / AWQ) runs quantized without it\n"
            "  --json         one object: ids (generated), prompt_ids, logprobs, times, KV bytes\n");
}

// NaN or Inf logits (a NaN weight, an overflow) would sample as id 0 forever: stop instead.
static void check_logits(const float *logits, int V, int step, const char *model_dir) {
    int nbad = 0;
    for (int i = 0; i < V; i++) nbad += !isfinite(logits[i]);
    char when[64];
    if (step) snprintf(when, sizeof when, "after decode step %d", step);
    else snprintf(when, sizeof when, "after the prefill");
    if (nbad) die("%d logits are not finite (of %d, %s; a NaN/Inf weight in %s?)", nbad, V, when, model_dir);
}

int main(int argc, char **argv) {
    cpu_env_init(argv);
    const double t_start = now_sec();
    const char *model_dir = NULL, *ids_arg = NULL, *prompt = NULL, *device = NULL;
    int max_new = 16, no_cache = 0, ignore_eos = 0, n_logprobs = 0, json = 0, max_seq = 0, sampling = 0;
    QuantSpec qs;
    quant_spec_parse("none", &qs);
    SamplerParams sp = {.greedy = 1, .temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int more = i + 1 < argc;
        if (!strcmp(a, "--model") && more) model_dir = argv[++i];
        else if (!strcmp(a, "--ids") && more) ids_arg = argv[++i];
        else if (!strcmp(a, "--prompt") && more) prompt = argv[++i];
        else if (!strcmp(a, "--device") && more) device = argv[++i];
        else if (!strcmp(a, "--max-new-tokens") && more) max_new = (int)arg_int(a, argv[++i], 1, 1 << 20);
        else if (!strcmp(a, "--max-seq") && more) max_seq = (int)arg_int(a, argv[++i], 1, 1 << 24);
        else if (!strcmp(a, "--no-cache")) no_cache = 1;
        else if (!strcmp(a, "--greedy")) sp.greedy = 1;
        else if (sampler_option(argc, argv, &i, &sp)) sampling = 1;
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = 1;
        else if (!strcmp(a, "--logprobs") && more) n_logprobs = (int)arg_int(a, argv[++i], 0, 20);
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--quant") && more) {
            if (quant_spec_parse(argv[++i], &qs) != 0) arg_die("--quant %s: expected none, rtn-int8, rtn-int4, rtn-int8+lm_head or rtn-int4+lm_head", argv[i]);
        }
        else arg_help_or_unknown(a, usage);
    }
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--greedy") && sampling) arg_die("--greedy and sampling options exclude each other");
    if (sampling) sp.greedy = 0;
    if (!model_dir || !ids_arg == !prompt) {
        usage(stderr);
        arg_die("need --model and one of --ids or --prompt");
    }
    GpuInfo gi;
    int have_gpu;
    const int use_cuda = choose_device(device, &gi, &have_gpu);

    char err[512];
    ModelWeights w;
    if (model_load(model_dir, &w, err, sizeof err) != 0) die("%s", err);
    const ModelConfig *c = &w.cfg;
    char tok_path[1100];
    Tokenizer *tok = tokenizer_for_model(model_dir, prompt != NULL, tok_path, sizeof tok_path);
    int np = 0;
    int *prompt_ids;
    if (prompt) {
        prompt_ids = prompt_to_ids(tok, tok_path, prompt, &np);
    } else {
        prompt_ids = parse_int_list(ids_arg, "--ids", &np);
    }
    check_ids_in_vocab(prompt ? tok_path : "--ids", prompt_ids, np, c->vocab);
    // The context the model was built for bounds prompt + generated tokens (and the cache).
    if ((long long)np + max_new > c->max_pos)
        arg_die("--max-new-tokens %d: the prompt's %d tokens + %d new ones exceed max_position_embeddings = %d of %s",
                max_new, np, max_new, c->max_pos, model_dir);
    if (max_seq && max_seq < np + max_new)
        arg_die("--max-seq %d is less than the prompt's %d tokens + --max-new-tokens %d", max_seq, np, max_new);
    if (max_seq > c->max_pos)
        arg_die("--max-seq %d exceeds max_position_embeddings = %d of %s", max_seq, c->max_pos, model_dir);
    if (!max_seq) max_seq = np + max_new;
    int eos[16];
    const int n_eos = model_eos_ids(model_dir, c, eos, 16);

    // ---- model + cache on the chosen device
    CpuModel cm = {0};
    CpuKvCache kv = {0};
    GpuModel *gm = NULL;
    GpuDecoder *dec = NULL;
    double kv_elem = 4, weight_bytes;
    char qfmt[256];
    if (use_cuda) {
        gm = qmodel_gpu_load(&w, &qs, qfmt, sizeof qfmt, err, sizeof err);
        if (!gm) die("%s: %s", model_dir, err);
        weight_bytes = gpu_model_weight_bytes(gm);
        if (!no_cache) {
            dec = gpu_decoder_new(gm, max_seq, err, sizeof err);
            if (!dec) die("%s", err);
            kv_elem = gpu_decoder_kv_elem_bytes(dec);
        }
    } else {
        if (qmodel_cpu_load(&w, &qs, &cm, qfmt, sizeof qfmt, err, sizeof err) != 0) die("%s: %s", model_dir, err);
        weight_bytes = qmodel_cpu_weight_bytes(&cm);
        if (!no_cache && cpu_kv_init(&kv, c, max_seq) != 0) die("cannot make the cache");
    }

    // ---- generate
    const int V = c->vocab, total = np + max_new;
    int *seq = xmalloc((size_t)total * sizeof(int));
    memcpy(seq, prompt_ids, (size_t)np * sizeof(int));
    float *logits = xmalloc((size_t)V * sizeof(float));
    int *lp_ids = xcalloc((size_t)max_new * (n_logprobs ? n_logprobs : 1), sizeof(int));
    float *lp = xcalloc((size_t)max_new * (n_logprobs ? n_logprobs : 1), sizeof(float));
    Sampler smp;
    sampler_init(&smp, &sp, V);
    TokStream *ts = (tok && !json) ? tokstream_new(tok, 0) : NULL;
    int prompt_ends_eos = 0;
    for (int e = 0; e < n_eos; e++) prompt_ends_eos |= np > 0 && prompt_ids[np - 1] == eos[e];
    if (!json && tok) {  // the prompt, then the generated text on its own line, control bytes escaped
        char *txt = tokenizer_decode(tok, prompt_ids, (size_t)np, 0, NULL);
        printf("prompt (%d ids):    ", np);
        if (txt) fput_printable(txt, strlen(txt), stdout);
        if (prompt_ends_eos) printf("   [the prompt ends with EOS id %d: the tokenizer's post-processor appended it]", prompt_ids[np - 1]);
        printf("\ngenerated:          ");
        free(txt);
    }

    int n = np, ngen = 0, rc = 0;
    const char *finish = "length";
    const double load_s = now_sec() - t_start;
    double sample_s = 0, forward_s = 0, t_first = 0, t_last = 0;
    double *gap_ms = xcalloc((size_t)max_new, sizeof(double));  // (max_new) time between consecutive tokens out
    double t0 = now_sec();
    if (no_cache) rc = use_cuda ? forward_last_cuda(gm, seq, n, logits, NULL) : forward_last_cpu(&cm, seq, n, logits);
    else if (use_cuda)
        for (int i = 0; i < np && rc == 0; i++) rc = gpu_decoder_step(dec, seq[i], i == np - 1 ? logits : NULL);
    else rc = forward_cached_cpu(&cm, &kv, seq, np, logits);
    if (rc != 0) die("prefill failed");
    const double prefill_s = now_sec() - t0;
    check_logits(logits, V, 0, model_dir);
    for (;;) {
        const double s0 = now_sec();
        const int next = sampler_sample(&smp, logits);
        sample_s += now_sec() - s0;
        if (n_logprobs) logprobs_topk(logits, V, n_logprobs, lp_ids + (size_t)ngen * n_logprobs, lp + (size_t)ngen * n_logprobs);
        seq[n++] = next;
        ngen++;
        int is_eos = 0;
        for (int e = 0; e < n_eos; e++) is_eos |= next == eos[e];
        if (ts) {
            size_t len;
            const char *piece = tokstream_step(ts, next, &len);
            if (piece) fput_printable(piece, len, stdout);
            if (is_eos) printf("[EOS]");
            fflush(stdout);
        }
        const double t_out = now_sec();  // this token is out: what the user waited for ends here
        if (ngen == 1) t_first = t_out;
        else gap_ms[ngen - 2] = (t_out - t_last) * 1e3;
        t_last = t_out;
        if (is_eos && !ignore_eos) {
            finish = "eos";
            break;
        }
        if (ngen == max_new) break;
        const double ts0 = now_sec();
        if (no_cache) rc = use_cuda ? forward_last_cuda(gm, seq, n, logits, NULL) : forward_last_cpu(&cm, seq, n, logits);
        else if (use_cuda) rc = gpu_decoder_step(dec, next, logits);
        else rc = forward_cached_cpu(&cm, &kv, &next, 1, logits);
        if (rc != 0) die("decode step %d failed", ngen);
        forward_s += now_sec() - ts0;
        check_logits(logits, V, ngen, model_dir);
    }
    const double ttft = t_first - t0, total_s = t_last - t0;
    if (ts) {
        size_t len;
        const char *piece = tokstream_flush(ts, &len);
        if (piece) fput_printable(piece, len, stdout);
        printf("   [%s: %d tokens]\n", !strcmp(finish, "eos") ? "stopped at EOS" : "stopped at --max-new-tokens", ngen);
        tokstream_free(ts);
    }
    const double tpot = ngen > 1 ? (t_last - t_first) / (ngen - 1) : 0;
    const TimeStats gaps = time_stats(gap_ms, ngen - 1);  // the spread behind the mean TPOT
    const double e2e_tok_s = total_s > 0 ? ngen / total_s : 0;
    const double kv_tok = kv_bytes_per_token(c, kv_elem);
    const double kv_alloc = no_cache ? 0 : use_cuda ? gpu_decoder_kv_bytes(dec) : cpu_kv_bytes(&kv);

    if (json) {
        json_t *o = json_object(), *a = json_array(), *pa = json_array();
        for (int i = 0; i < np; i++) json_array_append_new(pa, json_integer(seq[i]));
        for (int i = np; i < n; i++) json_array_append_new(a, json_integer(seq[i]));
        json_object_set_new(o, "prompt_ids", pa);
        json_object_set_new(o, "ids", a);
        if (n_logprobs) {
            json_t *L = json_array();
            for (int s = 0; s < ngen; s++) {
                json_t *st = json_object(), *ia = json_array(), *la = json_array();
                for (int k = 0; k < n_logprobs; k++) {
                    json_array_append_new(ia, json_integer(lp_ids[(size_t)s * n_logprobs + k]));
                    json_array_append_new(la, json_real(lp[(size_t)s * n_logprobs + k]));
                }
                json_object_set_new(st, "ids", ia);
                json_object_set_new(st, "logprobs", la);
                json_array_append_new(L, st);
            }
            json_object_set_new(o, "logprobs", L);
        }
        if (tok) {
            char *txt = tokenizer_decode(tok, seq + np, (size_t)ngen, 0, NULL);
            if (txt) json_object_set_new(o, "text", json_string(txt));
            free(txt);
        }
        json_object_set_new(o, "finish_reason", json_string(finish));
        json_object_set_new(o, "device", json_string(use_cuda ? gi.name : "cpu"));
        json_object_set_new(o, "cache", json_boolean(!no_cache));
        json_object_set_new(o, "ttft_ms", json_real(ttft * 1e3));
        json_object_set_new(o, "tpot_ms", json_real(tpot * 1e3));
        json_object_set_new(o, "tok_per_s", json_real(tpot > 0 ? 1.0 / tpot : 0));
        json_object_set_new(o, "total_ms", json_real(total_s * 1e3));
        json_object_set_new(o, "tpot_p10_ms", json_real(gaps.p10));
        json_object_set_new(o, "tpot_p90_ms", json_real(gaps.p90));
        json_object_set_new(o, "tok_per_s_end_to_end", json_real(e2e_tok_s));
        json_object_set_new(o, "prefill_ms", json_real(prefill_s * 1e3));
        json_object_set_new(o, "forward_ms_per_token", json_real(ngen > 1 ? forward_s / (ngen - 1) * 1e3 : 0));
        json_object_set_new(o, "sampling_ms_per_token", json_real(sample_s / ngen * 1e3));
        json_object_set_new(o, "load_ms", json_real(load_s * 1e3));
        json_object_set_new(o, "kv_bytes_per_token", json_real(kv_tok));
        json_object_set_new(o, "kv_bytes", json_real(no_cache ? 0 : kv_tok * (n - 1)));
        json_object_set_new(o, "kv_bytes_allocated", json_real(kv_alloc));
        json_object_set_new(o, "quant", json_string(qfmt));
        json_object_set_new(o, "weight_bytes", json_real(weight_bytes));
        json_dumpf(o, stdout, JSON_COMPACT);
        printf("\n");
        json_decref(o);
    } else {
        Table *t = table_new("generate");
        table_std_meta(t);
        table_meta(t, "model", "%s (%s, %d layers, d=%d, H=%d, KV=%d, hd=%d)", model_dir, model_arch_name(c->arch),
                   c->n_layers, c->hidden, c->n_heads, c->n_kv_heads, c->head_dim);
        table_meta(t, "device", "%s", use_cuda ? gi.name : "cpu (fp32 reference)");
        table_meta(t, "weights", "%s", use_cuda ? gpu_model_describe(gm)
                                           : strncmp(qfmt, "none", 4) ? "fp32 reference, quantized projections "
                                                                          "dequantized row by row (linear_q_cpu)"
                                                                        : "fp32 reference");
        table_meta(t, "quant", "%s; weight bytes %.4g", qfmt, weight_bytes);
        table_meta(t, "mode", "%s, %s", no_cache ? "no cache (recompute the prefix every step)" : "KV cache",
                   sp.greedy ? "greedy" : "sampled");
        table_meta(t, "ids", "%d prompt + %d generated (%s)", np, ngen, finish);
        table_col(t, "quantity", NULL);
        table_col(t, "value", "%.4g");
        table_col(t, "unit", NULL);
        table_meta(t, "timing", "one wall clock; TTFT: prefill start -> first token out; TPOT: first -> last token "
                                "out / (tokens - 1): forward + sampling + detokenize + print");
        if (!use_cuda) table_meta(t, "cpu_threads", "%s", cpu_env_describe());
        if (ngen > 1)
            table_meta(t, "tpot_spread", "per-token gaps: min %.4g, p10 %.4g, median %.4g, p90 %.4g, max %.4g ms", gaps.min,
                       gaps.p10, gaps.median, gaps.p90, gaps.max);
        const char *names[] = {"TTFT (prefill + first token)", "TPOT (per token, all it waits for)", "decode tok/s",
                               "total (prefill + all tokens)", "end-to-end tok/s", "  of which: prefill", "  decode forward per token",
                               "  sampling per token", "load (before the prefill)", "KV bytes per token", "KV bytes held",
                               "KV bytes allocated"};
        const double vals[] = {ttft * 1e3, tpot * 1e3, tpot > 0 ? 1.0 / tpot : 0, total_s * 1e3, e2e_tok_s, prefill_s * 1e3,
                               ngen > 1 ? forward_s / (ngen - 1) * 1e3 : 0, sample_s / ngen * 1e3, load_s * 1e3, kv_tok,
                               no_cache ? 0 : kv_tok * (n - 1), kv_alloc};
        char kv_unit[128];
        snprintf(kv_unit, sizeof kv_unit, "B = 2*layers*kv_heads*head_dim*%g bytes%s", kv_elem,
                 no_cache ? " (fp32; this run keeps no cache)" : "");
        const char *units[] = {"ms", "ms", "tok/s = 1 / TPOT", "ms", "tok/s = tokens / total", "ms", "ms", "ms", "ms",
                               kv_unit, "B", "B"};
        for (int i = 0; i < 12; i++) {
            table_row(t);
            table_str(t, "quantity", names[i]);
            table_num(t, "value", vals[i]);
            table_str(t, "unit", units[i]);
        }
        printf("generated ids:");
        for (int i = np; i < n; i++) printf("%s%d", i == np ? " " : ",", seq[i]);
        printf("\n");
        table_print(t, FMT_TEXT, stdout);
        table_free(t);
    }
    sampler_free(&smp);
    free(seq), free(logits), free(lp_ids), free(lp), free(prompt_ids), free(gap_ms);
    if (dec) gpu_decoder_free(dec);
    if (gm) gpu_model_free(gm);
    if (cm.layers) cpu_model_free(&cm);
    if (kv.k) cpu_kv_free(&kv);
    if (tok) tokenizer_free(tok);
    model_free(&w);
    return 0;
}
