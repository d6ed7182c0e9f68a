// llm.c — the engine's command line.
//
//   build/bin/llm generate --model DIR --prompt "The quick brown fox" --max-tokens 32
//   build/bin/llm generate --model DIR --ids 1,2,3 --max-tokens 16 --temperature 0.8 --top-p 0.9 --seed 7 --json
//   build/bin/llm generate --model DIR --chat --prompt "Why is the sky blue?"
//
// generate: one request through the engine (engine.h: the scheduler, the paged KV pool and the
// runner on the engine's thread); this thread submits it and prints its text as the engine's
// stream hands the tokens over, decoded incrementally (a token that ends inside a UTF-8 character
// waits for the next one). Then, on stderr: prompt and generated tokens, why it ended, and the
// engine's times: TTFT (taken in to the end of the step that sampled the first token), TPOT
// ((the last token's step end - the first's) / (tokens - 1)); and the wall time from submission
// to the last token read here. --chat: the prompt is one user message put through the model's chat
// template (common/chat_template.h) with the assistant's turn opened, as transformers'
// apply_chat_template(add_generation_prompt=True) makes it.
//
// bench: batch_bench's workloads, options and report (step04_batching/bench_main.c: how each number
// is measured) with the requests submitted to the engine at their arrival times and read back from
// its streams; paged KV by default.
//   build/bin/llm bench --preset tiny --trace nano --num-requests 64 --input-len 8:64 --output-len 8:64 --device cpu
//   build/bin/llm bench --model DIR --requests reqs.jsonl --json
// On a GPU decode steps replay CUDA graphs (step04_batching/runner_gpu.cu); --enforce-eager turns them off.
//
// serve: the OpenAI-compatible HTTP server (server.h) over the engine, until SIGTERM.
//   build/bin/llm serve --model DIR --device cuda --port 8000
#define _GNU_SOURCE  // qsort_r
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "chat_template.h"
#include "check.h"
#include "cpu_env.h"
#include "final/engine.h"
#include "final/server.h"
#include "gpu.h"
#include "model.h"
#include "prompt.h"
#include "step04_batching/batch.h"
#include "step04_batching/bench_main.h"
#include "step05_paged/kv_blocks.h"
#include "step06_quant/qmodel.h"
#include "timer.h"
#include "tokenizer.h"

// --async-scheduling on|off (vLLM's name): the next step planned and launched while the device runs
// this one (engine.h). On by default.
static int async_arg(const char *v) {
    if (strcmp(v, "on") && strcmp(v, "off")) arg_die("--async-scheduling: '%s' is not on or off", v);
    return !strcmp(v, "on");
}

static void usage(FILE *f) {
    fprintf(f,
            "usage: llm generate --model DIR (--prompt TEXT [--chat] | --ids 1,2,3) [--max-tokens N] [--device cpu|cuda]\n"
            "                    [--greedy | --temperature T --top-k K --top-p P --min-p M --seed S] [--ignore-eos]\n"
            "                    [--quant Q] [--max-model-len N] [--block-size B] [--max-num-batched-tokens N]\n"
            "                    [--prefix-cache on|off] [--async-scheduling on|off] [--enforce-eager] [--json]\n"
            "  generate        one prompt through the engine; the text is printed as it is generated\n"
            "  --model         a Hugging Face directory (config.json, *.safetensors, tokenizer.json for --prompt and text)\n"
            "  --prompt        the prompt as text (encoded with DIR/tokenizer.json, special tokens added); --ids: as ids\n"
            "  --chat          the prompt is a user message: rendered with the model's chat template (DIR/tokenizer_config.json's\n"
            "                  chat_template, or DIR/chat_template.jinja) with the assistant's turn opened, then encoded as it is\n"
            "                  (the template writes BOS and the turn markers; they are read as special tokens)\n"
            "  --max-tokens    tokens to generate at most (default 64)\n"
            "  --device        cpu (the fp32 reference) or cuda (default: cuda when a GPU is usable)\n"
            "  --greedy        argmax (the default without sampling options); --temperature, --top-k (0 off), --top-p\n"
            "                  (1 off), --min-p (0 off), --seed: seeded sampling (step03's sampler)\n"
            "  --ignore-eos    do not stop at the model's EOS ids (generation_config.json, else config.json)\n"
            "  --quant         none (default), rtn-int8, rtn-int4, or either +lm_head: quantize at load (step06)\n"
            "  --max-model-len the KV pool's positions (default: prompt + --max-tokens)\n"
            "  --block-size    KV block size in positions (default 16)\n"
            "  --max-num-batched-tokens  tokens a step at most: longer prompts are chunked (default 2048)\n"
            "  --prefix-cache  on (default) or off\n"
            "  --async-scheduling  on (default): the next step is planned and launched while the device runs this one;\n"
            "                  off: every step waits for its tokens first (the same tokens either way)\n"
            "  --enforce-eager CUDA: no CUDA graphs (by default every decode step replays one captured graph)\n"
            "  --json          no streaming: one JSON object at the end (prompt_ids, output_ids, text, times; with --chat\n"
            "                  chat_prompt, the rendered text)\n");
}

static void usage_top(FILE *f) {
    fprintf(f, "usage: llm <command> [options]\n"
               "  generate   one prompt through the engine, the text streamed as it is generated\n"
               "  bench      a workload (a trace or a JSONL file of requests) through the engine: throughput and latency\n"
               "  serve      the OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, /metrics, ...)\n"
               "`llm generate --help`, `llm bench --help`, `llm serve --help` list their options.\n");
}

// --chat: the prompt as one user message through the model's chat template, the assistant's turn
// opened (malloc'ed). Done before the weights load, so that a model without a template is refused
// at once.
static char *chat_prompt(const char *model_dir, const char *prompt) {
    char err[512];
    ChatTemplate ct;
    if (chat_template_load(model_dir, &ct, err, sizeof err) != 0) die("--chat: %s", err);
    const ChatMessage m = {"user", prompt};
    char *text = chat_template_render(ct.text, &m, 1, 1, ct.bos_token, ct.eos_token, err, sizeof err);
    if (!text) die("--chat: the chat template of %s: %s", ct.source, err);
    fprintf(stderr, "[llm] --chat: the prompt through the chat template of %s\n", ct.source);
    chat_template_free(&ct);
    return text;
}

// The ids of the rendered chat prompt. Encoded without the tokenizer's own special tokens, as
// transformers' apply_chat_template(tokenize=True) and vLLM's chat do: the template writes BOS
// where the model wants one (a second would make another prompt), and the special tokens it
// writes (<|im_start|>, <|eot_id|>, ...) are matched as tokens by tokenizer_encode.
static int *chat_prompt_ids(Tokenizer *tok, const char *tok_path, const char *text, int *n) {
    if (!tok) die("--chat needs %s", tok_path);
    TokIds v = {0};
    if (tokenizer_encode(tok, text, strlen(text), 0, &v) != 0) die("--chat: %s", tokenizer_error(tok));
    if (v.n == 0) die("--chat: the chat template rendered no tokens");
    *n = (int)v.n;
    int *ids = xmalloc(v.n * sizeof(int));
    for (size_t i = 0; i < v.n; i++) ids[i] = v.ids[i];
    tokids_free(&v);
    return ids;
}

static int cmd_generate(int argc, char **argv) {
    const char *model_dir = NULL, *ids_arg = NULL, *prompt = NULL, *device = NULL;
    int max_tokens = 64, ignore_eos = 0, json = 0, max_len = 0, block = 16, prefix = 1, sampling = 0, greedy_flag = 0, chat = 0;
    int eager = 0, overlap = 1;
    long budget = 2048;
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
        else if (!strcmp(a, "--max-tokens") && more) max_tokens = (int)arg_int(a, argv[++i], 1, 1 << 20);
        else if (!strcmp(a, "--max-model-len") && more) max_len = (int)arg_int(a, argv[++i], 2, 1 << 24);
        else if (!strcmp(a, "--block-size") && more) block = (int)arg_int(a, argv[++i], 1, 1024);
        else if (!strcmp(a, "--max-num-batched-tokens") && more) budget = arg_int(a, argv[++i], 1, 1 << 24);
        else if (!strcmp(a, "--prefix-cache") && more) {
            const char *v = argv[++i];
            if (strcmp(v, "on") && strcmp(v, "off")) arg_die("--prefix-cache: '%s' is not on or off", v);
            prefix = !strcmp(v, "on");
        } else if (!strcmp(a, "--async-scheduling") && more) overlap = async_arg(argv[++i]);
        else if (!strcmp(a, "--greedy")) greedy_flag = 1;
        else if (sampler_option(argc, argv, &i, &sp)) sampling = 1;
        else if (!strcmp(a, "--ignore-eos")) ignore_eos = 1;
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--chat")) chat = 1;
        else if (!strcmp(a, "--enforce-eager")) eager = 1;
        else if (!strcmp(a, "--quant") && more) {
            if (quant_spec_parse(argv[++i], &qs) != 0)
                arg_die("--quant %s: expected none, rtn-int8, rtn-int4, rtn-int8+lm_head or rtn-int4+lm_head", argv[i]);
        } else arg_help_or_unknown(a, usage);
    }
    if (greedy_flag && sampling) arg_die("--greedy and sampling options exclude each other");
    if (sampling) sp.greedy = 0;
    if (!model_dir || !ids_arg == !prompt) {
        usage(stderr);
        arg_die("need --model and one of --ids or --prompt");
    }
    if (chat && !prompt) arg_die("--chat needs --prompt (the user message), not --ids");
    char *chat_text = chat ? chat_prompt(model_dir, prompt) : NULL;
    GpuInfo gi;
    const int use_cuda = choose_device(device, &gi, NULL);

    const double t_load = now_sec();
    fprintf(stderr, "[llm] loading %s ...\n", model_dir);
    char err[512];
    ModelWeights w;
    if (model_load(model_dir, &w, err, sizeof err) != 0) die("%s", err);
    const ModelConfig *c = &w.cfg;
    char tok_path[1100];
    Tokenizer *tok = tokenizer_for_model(model_dir, prompt != NULL, tok_path, sizeof tok_path);
    int np = 0, *ids = chat     ? chat_prompt_ids(tok, tok_path, chat_text, &np)
                       : prompt ? prompt_to_ids(tok, tok_path, prompt, &np)
                                : parse_int_list(ids_arg, "--ids", &np);
    check_ids_in_vocab(prompt ? tok_path : "--ids", ids, np, c->vocab);
    if (!max_len) max_len = np + max_tokens < c->max_pos ? np + max_tokens : c->max_pos;
    if (max_len > c->max_pos) arg_die("--max-model-len %d exceeds max_position_embeddings = %d of %s", max_len, c->max_pos, model_dir);
    if (np >= max_len)
        arg_die("the prompt's %d tokens leave no room to generate within %d positions (--max-model-len, or the model's %d)", np,
                max_len, c->max_pos);
    SchedConfig sc = {.policy = POLICY_CONTINUOUS, .max_num_seqs = 1, .max_num_batched_tokens = budget, .max_len = max_len,
                      .block_size = block, .prefix_cache = prefix};
    sc.num_blocks = (max_len + block - 1) / block + 1;  // one sequence's blocks + the null block
    sc.n_eos = model_eos_ids(model_dir, c, sc.eos, 8);
    const long rows = budget < max_len ? budget : max_len;
    CpuModel cm = {0};
    GpuModel *gm = NULL;
    Runner *run;
    char qfmt[256];
    if (use_cuda) {
        gm = qmodel_gpu_load(&w, &qs, qfmt, sizeof qfmt, err, sizeof err);
        if (!gm) die("%s: %s", model_dir, err);
        run = runner_new_cuda_paged(gm, sc.num_blocks, block, max_len, (int)rows, err, sizeof err);
    } else {
        if (qmodel_cpu_load(&w, &qs, &cm, qfmt, sizeof qfmt, err, sizeof err) != 0) die("%s: %s", model_dir, err);
        run = runner_new_cpu_paged(&cm, sc.num_blocks, block, max_len, (int)rows, err, sizeof err);
    }
    if (!run) die("%s", err);
    runner_set_graphs(run, !eager);
    fprintf(stderr, "[llm] loaded in %.2f s: %s (%s), %s\n", now_sec() - t_load, model_dir, qfmt, runner_describe(run));
    EngineConfig ec = {.sched = sc, .overlap = overlap};
    Engine *e = engine_new(run, c->vocab, &ec, err, sizeof err);
    if (!e) die("%s", err);

    const double t0 = now_sec();
    const long id = engine_submit(e, -1, ids, np, max_tokens, &sp, ignore_eos);
    if (id < 0) die("the engine refused the request (%ld)", id);
    int *out = xmalloc((size_t)max_tokens * sizeof(int)), n = 0, seen = 0;
    TokStream *ts = tok && !json ? tokstream_new(tok, 1) : NULL;
    double t_last = -1;
    FinishReason fin = FINISH_NONE;
    while (fin == FINISH_NONE) {
        const int k = engine_read(e, id, &seen, out + n, max_tokens - n, &fin, -1);
        if (k < 0) die("the engine lost request %ld", id);
        if (k > 0) t_last = now_sec();
        for (int i = n; i < n + k && !json; i++) {
            if (ts) {
                size_t len;
                const char *s = tokstream_step(ts, out[i], &len);
                fput_printable(s, len, stdout);
            } else {
                printf("%s%d", i ? " " : "", out[i]);
            }
        }
        if (!json) fflush(stdout);
        n += k;
    }
    if (ts) {
        size_t len;
        const char *s = tokstream_flush(ts, &len);
        fput_printable(s, len, stdout);
        tokstream_free(ts);
    }
    double arr = -1, sched = -1, first = -1, end = -1;  // the engine's clock: a token's time is the end of its step
    if (engine_times(e, id, &arr, &sched, &first, &end) != 0) die("the engine lost request %ld", id);
    const double ttft = first >= 0 ? first - arr : -1, tpot = n > 1 ? (end - first) / (n - 1) : -1;
    const double e2e = t_last >= 0 ? t_last - t0 : -1;
    if (json) {
        json_t *o = json_object(), *pa = json_array(), *oa = json_array();
        for (int i = 0; i < np; i++) json_array_append_new(pa, json_integer(ids[i]));
        for (int i = 0; i < n; i++) json_array_append_new(oa, json_integer(out[i]));
        json_object_set_new(o, "prompt_ids", pa);
        if (chat_text) json_object_set_new(o, "chat_prompt", json_string(chat_text));
        json_object_set_new(o, "output_ids", oa);
        if (tok) {
            char *text = tokenizer_decode(tok, out, (size_t)n, 1, NULL);
            json_object_set_new(o, "text", json_string(text ? text : ""));
            free(text);
        }
        json_object_set_new(o, "finish_reason", json_string(finish_reason_name(fin)));
        json_object_set_new(o, "device", json_string(use_cuda ? "cuda" : "cpu"));
        json_object_set_new(o, "ttft_s", json_real(ttft));
        json_object_set_new(o, "tpot_s", json_real(tpot));
        json_object_set_new(o, "e2e_s", json_real(e2e));
        char *txt = json_dumps(o, JSON_COMPACT);
        printf("%s\n", txt);
        free(txt);
        json_decref(o);
    } else {
        printf("\n");
    }
    fprintf(stderr, "[llm] %d prompt tokens, %d generated (%s) on %s: TTFT %.2f ms, TPOT %.3f ms (%.1f tok/s), %.2f ms from submission to the last token read\n",
            np, n, finish_reason_name(fin), use_cuda ? gi.name : "cpu", ttft * 1e3, tpot * 1e3, tpot > 0 ? 1.0 / tpot : 0.0, e2e * 1e3);
    engine_release(e, id);
    engine_free(e);
    runner_free(run);
    if (gm) gpu_model_free(gm);
    cpu_model_free(&cm);
    model_free(&w);
    if (tok) tokenizer_free(tok);
    free(ids), free(out), free(chat_text);
    return fin == FINISH_ERROR ? 1 : 0;
}

// ---------------------------------------------------------------- llm bench
// batch_bench's workloads, options and report (step04_batching/bench_main.h) with the requests
// going through the engine: submitted from this thread at their arrival times (sorted by arrival,
// then input order, as the scheduler orders them; the input index is the sampling key, so the
// tokens are batch_bench's on the CPU), read back from the streams, their tokens and times copied
// into the request table the report is computed from.
static int by_arrival(const void *a, const void *b, void *ctx) {
    const Request *r = ctx;
    const int i = *(const int *)a, j = *(const int *)b;
    if (r[i].arrival_s != r[j].arrival_s) return r[i].arrival_s < r[j].arrival_s ? -1 : 1;
    return i - j;
}

static int bench_overlap = 1;  // llm bench --async-scheduling

static int engine_loop(Runner *r, int vocab, Scheduler *s, const OfflineOpts *o, OfflineStats *st) {
    memset(st, 0, sizeof *st);
    if (o->on_logits || o->on_step) die("llm bench: per-step hooks are batch_bench's");
    const int n = s->n_reqs;
    int *ord = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(int));
    long *ids = xmalloc((size_t)(n > 0 ? n : 1) * sizeof(long));
    for (int i = 0; i < n; i++) ord[i] = i;
    qsort_r(ord, (size_t)n, sizeof(int), by_arrival, s->reqs);
    EngineConfig ec = {.sched = s->cfg, .queue_cap = 1024, .overlap = bench_overlap};
    char err[256];
    Engine *e = engine_new(r, vocab, &ec, err, sizeof err);  // its clock starts here: time 0 of arrival_s
    if (!e) die("%s", err);
    const double t0 = now_sec();
    double last_progress = t0;
    for (int k = 0; k < n; k++) {
        const int i = ord[k];
        Request *q = &s->reqs[i];
        ids[i] = -1;
        if (q->status == REQ_FINISHED) continue;  // can never run (sched_init said so)
        for (double wait; o->real_clock && (wait = q->arrival_s - (now_sec() - t0)) > 0;) {
            struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
            nanosleep(&ts, NULL);
        }
        while ((ids[i] = engine_submit(e, q->index, q->tokens, q->num_prompt, q->max_tokens, &q->sp, q->ignore_eos)) == -1) {
            struct timespec ts = {0, 1000000};  // the queue is full: the engine takes it in at its next step
            nanosleep(&ts, NULL);
        }
        if (ids[i] < 0) die("llm bench: the engine refused request %d (%ld)", i, ids[i]);
    }
    int done = 0;
    for (int k = 0; k < n; k++) {
        const int i = ord[k];
        Request *q = &s->reqs[i];
        if (ids[i] < 0) continue;
        int seen = 0;
        FinishReason fin = FINISH_NONE;
        while (fin == FINISH_NONE) {
            const int got = engine_read(e, ids[i], &seen, q->tokens + q->num_prompt + seen, q->max_tokens - seen, &fin, 2.0);
            if (got < 0) die("llm bench: the engine lost request %d", i);
            if (o->progress && now_sec() - last_progress > 2.0) {
                EngineMetrics m;
                engine_metrics(e, &m);
                last_progress = now_sec();
                fprintf(stderr, "[llm bench] %d/%d requests read, %d running, %d waiting, t = %.1f s\n", done, n, m.running,
                        m.waiting + m.queued, now_sec() - t0);
            }
        }
        double arr, sched, first, end;
        if (engine_times(e, ids[i], &arr, &sched, &first, &end) != 0) die("llm bench: no times for request %d", i);
        q->num_tokens = q->num_prompt + seen;
        q->status = REQ_FINISHED, q->finish = fin;
        q->first_sched_s = sched, q->first_token_s = first, q->finish_s = end;  // arrival_s stays the nominal one
        if (end > st->wall_s) st->wall_s = end;
        engine_release(e, ids[i]);
        done++;
    }
    s->n_finished = n;
    engine_sched_stats(e, &s->st);
    st->steps = s->st.steps;
    engine_itl(e, &st->itl_ms, &st->n_itl, &st->forward_s, &st->device_s);
    engine_decode_split(e, &st->decode_steps, &st->decode_forward_s, &st->decode_device_s);
    EngineMetrics em;
    engine_metrics(e, &em);
    st->overlapped_steps = em.overlapped_steps;
    fprintf(stderr, "[llm bench] async scheduling %s: %ld of %ld steps launched while the one before was running\n",
                bench_overlap ? "on" : "off", em.overlapped_steps, em.steps);
    engine_free(e);
    free(ord), free(ids);
    return 0;
}

static int cmd_bench(int argc, char **argv) {
    static const BenchHooks hooks = {
        .prog = "llm bench",
        .usage_note = "llm bench: batch_bench's workloads and report through the engine (paged KV by default; the\n"
                      "options below are batch_bench's, except --policy static and --steps-csv), and\n"
                      "  --async-scheduling on|off  on (default): the next step is planned and launched while the device\n"
                      "                  runs this one; off: every step waits for its tokens first\n",
        .loop = engine_loop,
        .paged_default = 1,
    };
    // this command's own option, taken out before batch_bench's parser sees the rest
    char **av = xmalloc((size_t)(argc + 1) * sizeof(char *));
    int ac = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--async-scheduling")) {
            if (i + 1 >= argc) arg_die("--async-scheduling needs on or off");
            bench_overlap = async_arg(argv[++i]);
        } else av[ac++] = argv[i];
    }
    av[ac] = NULL;
    const int rc = bench_main(ac, av, &hooks);
    free(av);
    return rc;
}

// ---------------------------------------------------------------- llm serve
static void usage_serve(FILE *f) {
    fprintf(f,
            "usage: llm serve --model DIR [--device cpu|cuda] [--host 127.0.0.1] [--port 8000] [--api-key KEY]\n"
            "                 [--served-model-name NAME] [--max-model-len N] [--max-num-seqs N] [--max-num-batched-tokens N]\n"
            "                 [--block-size B] [--num-blocks N | --kv-gib G | --gpu-memory-utilization U] [--prefix-cache on|off]\n"
            "                 [--quant Q] [--enforce-eager] [--async-scheduling on|off] [--prefill-attn flash|fused|gather]\n"
            "                 [--max-queue N]\n"
            "                 [--max-request-bytes N] [--max-connections N] [--min-step-ms MS]\n"
            "  serve           the OpenAI-compatible server: POST /v1/completions, POST /v1/chat/completions (stream or\n"
            "                  not), GET /v1/models, GET /health, GET /metrics (Prometheus, vLLM's names); SIGTERM drains\n"
            "  --model         a Hugging Face directory (config.json, *.safetensors; tokenizer.json for text prompts,\n"
            "                  tokenizer_config.json's chat_template or chat_template.jinja for chat)\n"
            "  --device        cpu or cuda (default: cuda when a GPU is usable)\n"
            "  --host, --port  where to listen (default 127.0.0.1:8000; --port 0: any free port, printed on stderr)\n"
            "  --api-key       /v1/* requests need \"Authorization: Bearer KEY\" (else 401)\n"
            "  --served-model-name  the name in /v1/models and in requests' \"model\" (default: --model as given)\n"
            "  --max-model-len prompt + completion tokens at most (default: the model's max_position_embeddings)\n"
            "The engine's options, as llm bench's:\n"
            "  --max-num-seqs  running sequences at most (default 256)\n"
            "  --max-num-batched-tokens  tokens a step at most: longer prompts are chunked (default 8192)\n"
            "  --block-size    KV block size in positions (default 16)\n"
            "  --num-blocks    the KV pool in blocks; or --kv-gib G; or --gpu-memory-utilization U (CUDA: the pool takes\n"
            "                  U x the device memory minus what the weights and workspaces use; default 0.9 on CUDA; on the\n"
            "                  CPU the default pool holds max_num_seqs x max_model_len positions, at least one whole\n"
            "                  sequence)\n"
            "  --prefix-cache  on (default) or off\n"
            "  --quant         none (default), rtn-int8, rtn-int4, or either +lm_head: quantize at load (step06)\n"
            "  --enforce-eager CUDA: no CUDA graphs\n"
            "  --async-scheduling  on (default): the next step is planned and launched while the device runs this one\n"
            "  --prefill-attn  CUDA: flash (default), fused or gather attention for prompt chunks\n"
            "The server's limits:\n"
            "  --max-queue     requests that may wait beyond --max-num-seqs; more get 503 with Retry-After (default 4096)\n"
            "  --max-request-bytes  larger request bodies get 413 (default 8388608)\n"
            "  --max-connections    open connections at most, each with a thread (default 1024)\n"
            "  --min-step-ms   every engine step lasts at least this long (default 0; for tests and demos: a tiny model\n"
            "                  keeps requests in flight long enough to see cancels, a full queue and draining)\n");
}

// The sampling defaults of requests that do not say, as vLLM's server takes them: the model's
// generation_config.json temperature, top_p, top_k and min_p where it has them.
static void generation_defaults(const char *dir, ServerConfig *c) {
    c->temperature = 1, c->top_p = 1, c->top_k = 0, c->min_p = 0;
    char path[1100];
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    json_error_t je;
    json_t *g = json_load_file(path, 0, &je), *v;
    if (!g) return;
    int any = 0;
    if (json_is_number(v = json_object_get(g, "temperature"))) c->temperature = (float)json_number_value(v), any = 1;
    if (json_is_number(v = json_object_get(g, "top_p"))) c->top_p = (float)json_number_value(v), any = 1;
    if (json_is_integer(v = json_object_get(g, "top_k"))) c->top_k = json_integer_value(v) > 0 ? (int)json_integer_value(v) : 0, any = 1;
    if (json_is_number(v = json_object_get(g, "min_p"))) c->min_p = (float)json_number_value(v), any = 1;
    json_decref(g);
    if (any)
        fprintf(stderr, "[llm serve] requests that do not say sample with %s's temperature %g, top_p %g, top_k %d, min_p %g\n", path,
                c->temperature, c->top_p, c->top_k, c->min_p);
}

static int cmd_serve(int argc, char **argv) {
    const char *model_dir = NULL, *device = NULL, *host = "127.0.0.1", *api_key = NULL, *served = NULL;
    int port = 8000, max_len = 0, max_seqs = 256, block = 16, num_blocks = 0, prefix = 1, eager = 0, prefill_mode = PREFILL_FLASH;
    int max_queue = 4096, max_conn = 1024, overlap = 1;
    long budget = 8192, max_body = 8 << 20;
    double kv_gib = 0, gpu_util = 0, min_step_ms = 0;
    QuantSpec qs;
    quant_spec_parse("none", &qs);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const int more = i + 1 < argc;
        if (!strcmp(a, "--enforce-eager")) eager = 1;
        else if (!strcmp(a, "--min-step-ms") && more) min_step_ms = arg_float(a, argv[++i], 0, 1e5, 0);
        else if (!more) arg_help_or_unknown(a, usage_serve);
        else if (!strcmp(a, "--model")) model_dir = argv[++i];
        else if (!strcmp(a, "--device")) device = argv[++i];
        else if (!strcmp(a, "--host")) host = argv[++i];
        else if (!strcmp(a, "--port")) port = (int)arg_int(a, argv[++i], 0, 65535);
        else if (!strcmp(a, "--api-key")) api_key = argv[++i];
        else if (!strcmp(a, "--served-model-name")) served = argv[++i];
        else if (!strcmp(a, "--async-scheduling")) overlap = async_arg(argv[++i]);
        else if (!strcmp(a, "--max-model-len")) max_len = (int)arg_int(a, argv[++i], 2, 1 << 24);
        else if (!strcmp(a, "--max-num-seqs")) max_seqs = (int)arg_int(a, argv[++i], 1, 65536);
        else if (!strcmp(a, "--max-num-batched-tokens")) budget = arg_int(a, argv[++i], 1, 1 << 24);
        else if (!strcmp(a, "--block-size")) block = (int)arg_int(a, argv[++i], 1, 1024);
        else if (!strcmp(a, "--num-blocks")) num_blocks = (int)arg_int(a, argv[++i], 2, 1 << 30);
        else if (!strcmp(a, "--kv-gib")) kv_gib = arg_float(a, argv[++i], 0, 1e6, ARG_LO_OPEN);
        else if (!strcmp(a, "--gpu-memory-utilization")) gpu_util = arg_float(a, argv[++i], 0, 1, ARG_LO_OPEN);
        else if (!strcmp(a, "--max-queue")) max_queue = (int)arg_int(a, argv[++i], 0, 1 << 24);
        else if (!strcmp(a, "--max-request-bytes")) max_body = arg_int(a, argv[++i], 64, 1L << 32);
        else if (!strcmp(a, "--max-connections")) max_conn = (int)arg_int(a, argv[++i], 1, 1 << 20);
        else if (!strcmp(a, "--prefix-cache")) {
            const char *v = argv[++i];
            if (strcmp(v, "on") && strcmp(v, "off")) arg_die("--prefix-cache: '%s' is not on or off", v);
            prefix = !strcmp(v, "on");
        } else if (!strcmp(a, "--prefill-attn")) {
            const char *k = argv[++i];
            if (!strcmp(k, "flash")) prefill_mode = PREFILL_FLASH;
            else if (!strcmp(k, "fused")) prefill_mode = PREFILL_PAGED;
            else if (!strcmp(k, "gather")) prefill_mode = PREFILL_GEMM;
            else arg_die("--prefill-attn: '%s' is not flash, fused or gather", k);
        } else if (!strcmp(a, "--quant")) {
            if (quant_spec_parse(argv[++i], &qs) != 0)
                arg_die("--quant %s: expected none, rtn-int8, rtn-int4, rtn-int8+lm_head or rtn-int4+lm_head", argv[i]);
        } else arg_help_or_unknown(a, usage_serve);
    }
    if (!model_dir) {
        usage_serve(stderr);
        arg_die("need --model");
    }
    if ((num_blocks > 0) + (kv_gib > 0) + (gpu_util > 0) > 1) arg_die("give one of --num-blocks, --kv-gib and --gpu-memory-utilization");
    server_catch_signals();  // from here SIGTERM drains (once the server runs) instead of killing
    GpuInfo gi;
    const int use_cuda = choose_device(device, &gi, NULL);
    if (gpu_util > 0 && !use_cuda) arg_die("--gpu-memory-utilization sizes the KV pool in GPU memory: it needs --device cuda");
    if (use_cuda && !num_blocks && !(kv_gib > 0) && !(gpu_util > 0)) gpu_util = 0.9;

    const double t_load = now_sec();
    fprintf(stderr, "[llm serve] loading %s ...\n", model_dir);
    char err[512];
    ModelWeights w;
    if (model_load(model_dir, &w, err, sizeof err) != 0) die("%s", err);
    const ModelConfig *c = &w.cfg;
    if (!max_len) max_len = c->max_pos;
    if (max_len > c->max_pos) arg_die("--max-model-len %d exceeds max_position_embeddings = %d of %s", max_len, c->max_pos, model_dir);
    char tok_path[1100];
    Tokenizer *tok = tokenizer_for_model(model_dir, 0, tok_path, sizeof tok_path);
    if (!tok) fprintf(stderr, "[llm serve] no %s: prompts must be token ids, and chat is off\n", tok_path);
    ChatTemplate ct, *ctp = NULL;
    if (tok && chat_template_load(model_dir, &ct, err, sizeof err) == 0) ctp = &ct;
    else if (tok) fprintf(stderr, "[llm serve] /v1/chat/completions is off: %s\n", err);
    const long rows = budget < (long)max_seqs * max_len ? budget : (long)max_seqs * max_len;
    CpuModel cm = {0};
    GpuModel *gm = NULL;
    char qfmt[256];
    if (use_cuda) {
        gm = qmodel_gpu_load(&w, &qs, qfmt, sizeof qfmt, err, sizeof err);
        if (!gm) die("%s: %s", model_dir, err);
    } else if (qmodel_cpu_load(&w, &qs, &cm, qfmt, sizeof qfmt, err, sizeof err) != 0) {
        die("%s: %s", model_dir, err);
    }
    // the KV pool, as llm bench sizes it: --num-blocks; --kv-gib at the runner's element size; on
    // CUDA --gpu-memory-utilization (what is left of U x the memory once the weights and a probe
    // runner's workspaces are in); else max_num_seqs x max_model_len positions
    double kv_elem = use_cuda ? 2 : 4;
    if (use_cuda && gpu_util > 0) {
        double fr0, tot, fr1, tmp;
        if (gpu_mem_info(&fr0, &tot) != 0) die("--gpu-memory-utilization: cannot read the device memory");
        Runner *probe = runner_new_cuda_paged(gm, 2, block, max_len, (int)rows, err, sizeof err);
        if (!probe) die("%s", err);
        if (gpu_mem_info(&fr1, &tmp) != 0) die("--gpu-memory-utilization: cannot read the device memory");
        const double ws = fr0 - fr1 - runner_kv_bytes(probe);
        const double pe = round(runner_kv_bytes(probe) / (2.0 * c->n_layers * 2 * block * c->n_kv_heads * c->head_dim));
        if (pe >= 1) kv_elem = pe;
        runner_free(probe);
        const double nb = floor((gpu_util * tot - (tot - fr0) - ws - 256.0 * 1048576) / (kv_bytes_per_token(c, kv_elem) * block));
        if (nb < 2) arg_die("--gpu-memory-utilization %g: no room for a KV pool", gpu_util);
        num_blocks = nb > (double)(1 << 30) ? 1 << 30 : (int)nb;
    } else if (!num_blocks) {
        const double nb = kv_gib > 0 ? floor(kv_gib * 1073741824.0 / (kv_bytes_per_token(c, kv_elem) * block))
                                     : kvb_default_blocks(max_seqs, max_len, block);
        if (nb < 2 || nb > (double)(1 << 30)) arg_die("the KV pool would have %.0f blocks of %d tokens: need 2 .. 2^30", nb, block);
        num_blocks = (int)nb;
    }
    Runner *run = use_cuda ? runner_new_cuda_paged(gm, num_blocks, block, max_len, (int)rows, err, sizeof err)
                           : runner_new_cpu_paged(&cm, num_blocks, block, max_len, (int)rows, err, sizeof err);
    if (!run) die("%s", err);
    runner_set_graphs(run, !eager);
    runner_set_prefill_attn(run, prefill_mode);
    const double t_graphs = now_sec();
    const int ngraphs = runner_capture_graphs(run);  // before the first request, as vLLM at startup
    if (ngraphs < 0) die("capturing the decode-step graphs failed (see above)");
    if (ngraphs > 0) fprintf(stderr, "[llm serve] %d decode-step graphs captured in %.2f s\n", ngraphs, now_sec() - t_graphs);
    SchedConfig sc = {.policy = POLICY_CONTINUOUS, .max_num_seqs = max_seqs, .max_num_batched_tokens = budget, .max_len = max_len,
                      .block_size = block, .num_blocks = num_blocks, .prefix_cache = prefix};
    sc.n_eos = model_eos_ids(model_dir, c, sc.eos, 8);
    EngineConfig ec = {.sched = sc, .queue_cap = max_seqs + max_queue + 16, .min_step_s = min_step_ms / 1e3, .overlap = overlap};
    Engine *e = engine_new(run, c->vocab, &ec, err, sizeof err);
    if (!e) die("%s", err);
    fprintf(stderr, "[llm serve] loaded in %.2f s: %s (%s), %s; KV pool %d blocks of %d\n", now_sec() - t_load, model_dir, qfmt,
            runner_describe(run), num_blocks, block);
    ServerConfig scfg = {.host = host, .port = port, .api_key = api_key, .model_name = served ? served : model_dir,
                               .max_model_len = max_len, .max_num_seqs = max_seqs, .max_queue = max_queue, .max_body = max_body,
                               .max_connections = max_conn};
    generation_defaults(model_dir, &scfg);
    const int rc = server_run(&scfg, e, tok, ctp, c->vocab);
    engine_free(e);
    runner_free(run);
    if (gm) gpu_model_free(gm);
    cpu_model_free(&cm);
    model_free(&w);
    if (ctp) chat_template_free(ctp);
    if (tok) tokenizer_free(tok);
    return rc;
}

int main(int argc, char **argv) {
    cpu_env_init(argv);
    if (argc < 2) {
        usage_top(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage_top(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "generate")) return cmd_generate(argc - 1, argv + 1);
    if (!strcmp(argv[1], "bench")) return cmd_bench(argc - 1, argv + 1);
    if (!strcmp(argv[1], "serve")) return cmd_serve(argc - 1, argv + 1);
    fprintf(stderr, "llm: '%s' is not a command\n", argv[1]);
    usage_top(stderr);
    return 2;
}
