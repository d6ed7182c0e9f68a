// test_final_server.c — `llm serve` (final/server.c, final/api.c) on the CPU with the tiny test
// checkpoints, driven by the real `openai` Python client (tests/server_client.py) and by curl:
// greedy completions follow the transformers goldens and equal `llm generate`; streamed text equals
// the non-streamed text; usage counts; stop strings; chat through the model's chat template; 64
// concurrent streams; a dropped connection frees its KV (seen on /metrics); bad requests get their
// 4xx and the server keeps serving; a full server answers 503 with Retry-After; SIGTERM drains.
// Also the request parser's pure functions (api.h) directly.
//   build/bin/../tests/run_tests --filter 'final_server/*'
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "final/api.h"
#include "fs_util.h"
#include "golden_util.h"
#include "prompt.h"

#define TOK_MODEL MODELS_DIR "/llama_mha_f32"  // has a tokenizer.json

typedef struct {
    pid_t pid;
    int port;
    char log[64];
} Srv;

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

// `llm serve --model model --device cpu --port 0 extra`, its stderr in s->log; returns when it
// listens (the port it printed).
static void srv_start(Srv *s, const char *model, const char *extra) {
    snprintf(s->log, sizeof s->log, "/tmp/final_server_XXXXXX");
    const int fd = mkstemp(s->log);
    cr_assert(fd >= 0);
    close(fd);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "exec %s/llm serve --model %s --device cpu --port 0 %s >%s 2>&1", BUILD_BIN_DIR, model, extra ? extra : "",
             s->log);
    s->pid = fork();
    cr_assert(s->pid >= 0);
    if (s->pid == 0) {
        setenv("OMP_NUM_THREADS", "1", 1);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    s->port = 0;
    for (int i = 0; i < 600 && !s->port; i++) {
        sleep_s(0.05);
        char *log = test_slurp(s->log, NULL);
        const char *p = log ? strstr(log, "listening on http://127.0.0.1:") : NULL;
        if (p) s->port = atoi(p + strlen("listening on http://127.0.0.1:"));
        int st;
        if (!s->port && waitpid(s->pid, &st, WNOHANG) == s->pid) cr_assert_fail("llm serve exited at start: %s", log ? log : "");
        free(log);
    }
    cr_assert(s->port > 0, "llm serve did not listen within 30 s (%s)", cmd);
}

// The server's log has no sanitizer report (under SANITIZE=1 its stderr is the only place one shows).
static void expect_clean_log(const Srv *s) {
    char *log = test_slurp(s->log, NULL);
    cr_expect(log && !strstr(log, "Sanitizer") && !strstr(log, "runtime error"), "llm serve's log:\n%s", log ? log : "(none)");
    free(log);
}

// SIGTERM; the exit code (-1 when it did not exit within 30 s: then it is killed).
static int srv_stop(Srv *s) {
    kill(s->pid, SIGTERM);
    int st = 0;
    for (int i = 0; i < 600; i++) {
        if (waitpid(s->pid, &st, WNOHANG) == s->pid) {
            expect_clean_log(s);
            unlink(s->log);
            return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        }
        sleep_s(0.05);
    }
    kill(s->pid, SIGKILL);
    waitpid(s->pid, &st, 0);
    return -1;
}

// One HTTP request with curl: the status, the body (malloc'ed) in *body. hdrs: extra curl options.
static int http(const Srv *s, const char *method, const char *path, const char *json_body, const char *hdrs, char **body) {
    char dir[64], in[96], cmd[2048];
    test_mkdtemp(dir, sizeof dir, "final_srv_http");
    snprintf(in, sizeof in, "%s/body", dir);
    if (json_body) {
        FILE *f = fopen(in, "w");
        cr_assert(f);
        fputs(json_body, f);
        fclose(f);
    }
    snprintf(cmd, sizeof cmd, "curl -s -X %s -H 'Content-Type: application/json' %s %s%s -w '\\n%%{http_code}' http://127.0.0.1:%d%s", method,
             hdrs ? hdrs : "", json_body ? "--data-binary @" : "", json_body ? in : "", s->port, path);
    char *out = malloc(1 << 20);
    cr_assert(out);
    cr_assert_eq(test_run_cmd(cmd, out, 1 << 20), 0, "%s failed", cmd);
    test_rmtree(dir);
    char *nl = strrchr(out, '\n');
    cr_assert(nl, "%s: no status", cmd);
    *nl = 0;
    const int status = atoi(nl + 1);
    *body = out;
    return status;
}

// server_client.py's JSON for "cmd --port P --model M args".
static json_t *py(const Srv *s, const char *model, const char *cmd, const char *args) {
    char line[4096];
    snprintf(line, sizeof line, "python3 tests/server_client.py %s --port %d --model %s %s", cmd, s->port, model, args);
    char *out = malloc(4 << 20);
    cr_assert(out);
    const int rc = test_run_cmd(line, out, 4 << 20);
    cr_assert_eq(rc, 0, "%s: exit %d: %s", line, rc, out);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    cr_assert(j, "%s: not JSON: %s", line, out);
    free(out);
    return j;
}

static const char *jstr(const json_t *o, const char *path) {  // "a.b.c" of strings
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    const json_t *v = o;
    for (char *k = strtok(buf, "."); k && v; k = strtok(NULL, ".")) v = json_object_get(v, k);
    return json_is_string(v) ? json_string_value(v) : NULL;
}

static long jint(const json_t *o, const char *path) {
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    const json_t *v = o;
    for (char *k = strtok(buf, "."); k && v; k = strtok(NULL, ".")) v = json_object_get(v, k);
    cr_assert(json_is_integer(v), "%s is not an integer", path);
    return (long)json_integer_value(v);
}

// A sample's value in the /metrics text ("name{...labels containing `with`...} value").
static double metric(const Srv *s, const char *name, const char *with) {
    char *body;
    cr_assert_eq(http(s, "GET", "/metrics", NULL, NULL, &body), 200);
    double v = -1;
    int found = 0;
    for (char *line = strtok(body, "\n"); line; line = strtok(NULL, "\n")) {
        if (strncmp(line, name, strlen(name)) || line[strlen(name)] != '{') continue;
        if (with && !strstr(line, with)) continue;
        const char *sp = strrchr(line, ' ');
        v = atof(sp + 1), found = 1;
        break;
    }
    free(body);
    cr_assert(found, "/metrics has no %s{%s}", name, with ? with : "");
    return v;
}

// `llm generate --json` of model with args (its output ids and text).
static json_t *llm_generate(const char *model, const char *args) {
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s/llm generate --model %s --device cpu --json --ignore-eos %s 2>/dev/null", BUILD_BIN_DIR, model, args);
    char *out = malloc(1 << 20);
    cr_assert(out);
    cr_assert_eq(test_run_cmd(cmd, out, 1 << 20), 0, "%s failed", cmd);
    json_error_t je;
    json_t *j = json_loads(out, 0, &je);
    cr_assert(j, "%s: not JSON: %s", cmd, out);
    free(out);
    return j;
}

// ---------------------------------------------------------------- through the openai client

// Every checkpoint with goldens, served: the golden prompt's ids through client.completions.create
// (greedy, ignore_eos, logprobs=5 with the tokens named by id) give exactly `llm generate`'s ids,
// and they follow transformers' by vLLM's rule (the top-5 from the response's logprobs); the
// stream gives the same text; usage counts the prompt and the completion.
Test(final_server, greedy_completions_follow_the_goldens, .timeout = 300) {
    Ckpt ck[64];
    const int nck = ckpt_list(ck, 64, "goldens/greedy.json");
    cr_assert(nck > 0);
    for (int c = 0; c < nck; c++) {
        Golden gold;
        golden_load(ck[c].dir, &gold);
        char ids[4096], args[4200];
        int o = 0;
        for (int i = 0; i < gold.np; i++) o += snprintf(ids + o, sizeof ids - (size_t)o, "%s%d", i ? "," : "", gold.prompt[i]);
        Srv s;
        srv_start(&s, ck[c].dir, NULL);
        snprintf(args, sizeof args, "--ids %s --max-tokens %d", ids, gold.ng);
        json_t *j = py(&s, ck[c].dir, "greedy", args);
        cr_expect_eq(srv_stop(&s), 0, "%s: llm serve exit code", ck[c].name);
        snprintf(args, sizeof args, "--ids %s --max-tokens %d", ids, gold.ng);
        json_t *g = llm_generate(ck[c].dir, args);
        const json_t *got = json_object_get(j, "ids"), *want = json_object_get(g, "output_ids");
        cr_assert_eq(json_array_size(got), (size_t)gold.ng, "%s: %zu tokens", ck[c].name, json_array_size(got));
        cr_expect(json_equal(got, want), "%s: the server's ids differ from llm generate's", ck[c].name);
        int *srv_ids = malloc((size_t)gold.ng * sizeof(int)), *top5 = malloc((size_t)gold.ng * 5 * sizeof(int));
        const json_t *t5 = json_object_get(j, "top5");
        for (int i = 0; i < gold.ng; i++) {
            srv_ids[i] = (int)json_integer_value(json_array_get(got, (size_t)i));
            const json_t *row = json_array_get(t5, (size_t)i);
            cr_assert_eq(json_array_size(row), 5, "%s step %d: %zu top logprobs", ck[c].name, i, json_array_size(row));
            for (int k = 0; k < 5; k++) top5[i * 5 + k] = (int)json_integer_value(json_array_get(row, (size_t)k));
            cr_expect_eq(top5[i * 5], srv_ids[i], "%s step %d: the greedy token is the most probable", ck[c].name, i);
        }
        char what[400];
        snprintf(what, sizeof what, "%s llm serve vs transformers", ck[c].name);
        const int agreed = vllm_expect(what, srv_ids, top5, gold.gen, gold.top5, gold.ng);
        fprintf(stderr, "[final server] %s: %d of %d tokens identical to transformers\n", ck[c].name, agreed, gold.ng);
        // the logprob of each agreed token against transformers' (log_softmax of its raw logits)
        char *gpath = NULL;
        cr_assert(asprintf(&gpath, "%s/goldens/greedy.json", ck[c].dir) > 0);
        json_error_t je;
        json_t *gj = json_load_file(gpath, 0, &je);
        cr_assert(gj, "%s: %s", gpath, je.text);
        free(gpath);
        const json_t *glp = json_object_get(gj, "top5_logprobs"), *slp = json_object_get(j, "token_logprobs");
        // f32: the same math (measured: within 5e-6). bf16: transformers runs the whole forward in bf16 and
        // the engine in fp32 over bf16 weights; logits of size ~16 at bf16's 2^-8 give up to ~0.08
        const double tol = strstr(ck[c].name, "f32") ? 1e-4 : 0.15;
        double worst = 0;
        for (int i = 0; i < agreed; i++) {
            const double want = json_number_value(json_array_get(json_array_get(glp, (size_t)i), 0)),
                         got_lp = json_number_value(json_array_get(slp, (size_t)i));
            if (fabs(got_lp - want) > worst) worst = fabs(got_lp - want);
            cr_expect(fabs(got_lp - want) <= tol, "%s step %d: logprob %.6f, transformers %.6f", ck[c].name, i, got_lp, want);
        }
        fprintf(stderr, "[final server] %s: logprobs of %d tokens within %.2g of transformers'\n", ck[c].name, agreed, worst);
        json_decref(gj);
        cr_expect_str_eq(jstr(j, "finish_reason"), "length");
        cr_expect_eq(jint(j, "usage.prompt_tokens"), gold.np);
        cr_expect_eq(jint(j, "usage.completion_tokens"), gold.ng);
        cr_expect_eq(jint(j, "usage.total_tokens"), gold.np + gold.ng);
        cr_expect_str_eq(jstr(j, "stream.text"), jstr(j, "text"), "%s: streamed vs non-streamed text", ck[c].name);
        cr_expect_eq(jint(j, "stream.usage.completion_tokens"), gold.ng);
        cr_expect_str_eq(jstr(j, "stream.finish_reason"), "length");
        free(srv_ids), free(top5);
        json_decref(j), json_decref(g);
        golden_free(&gold);
    }
}

// A text prompt: the tokenizer's ids (usage.prompt_tokens), `llm generate --prompt`'s text, the
// same text streamed; a stop string cuts the text before it (finish_reason "stop", stop_reason the
// string), streamed or not; a seeded sampled request gives the same text twice.
Test(final_server, text_prompts_streams_stop_strings_and_seeds, .timeout = 120) {
    Srv s;
    srv_start(&s, TOK_MODEL, NULL);
    const char *prompt = "The quick brown fox";
    json_t *j = py(&s, TOK_MODEL, "text", "--prompt 'The quick brown fox' --max-tokens 24");
    char path[1100];
    Tokenizer *tok = tokenizer_for_model(TOK_MODEL, 1, path, sizeof path);
    int np = 0, *ids = prompt_to_ids(tok, path, prompt, &np);
    cr_expect_eq(jint(j, "usage.prompt_tokens"), np);
    cr_expect_eq(jint(j, "usage.completion_tokens"), 24);
    cr_expect_str_eq(jstr(j, "finish_reason"), "length");
    json_t *g = llm_generate(TOK_MODEL, "--max-tokens 24 --prompt 'The quick brown fox'");
    const char *text = jstr(j, "text");
    cr_assert(text);
    cr_expect_str_eq(text, jstr(g, "text"), "the server's text vs llm generate's");
    cr_expect_str_eq(jstr(j, "stream.text"), text, "streamed vs non-streamed");
    cr_expect_eq(jint(j, "stream.usage.prompt_tokens"), np);
    cr_expect_eq(jint(j, "stream.usage.completion_tokens"), 24);
    // a stop string: two characters from the middle of the text
    const size_t n = strlen(text);
    size_t a = n / 2;
    while (a > 0 && ((unsigned char)text[a] & 0xC0) == 0x80) a--;
    size_t b = a + 1, chars = 1;
    while (b < n && (chars < 2 || ((unsigned char)text[b] & 0xC0) == 0x80)) chars += ((unsigned char)text[b] & 0xC0) != 0x80, b++;
    while (b < n && ((unsigned char)text[b] & 0xC0) == 0x80) b++;
    char stop[64];
    snprintf(stop, sizeof stop, "%.*s", (int)(b - a), text + a);
    const size_t cut = (size_t)(strstr(text, stop) - text);
    char *want = strndup(text, cut);
    char stop_file[64] = "/tmp/final_server_stop_XXXXXX", stop_arg[160];  // the stop string may hold any byte: passed through a file
    const int sfd = mkstemp(stop_file);
    cr_assert(sfd >= 0);
    const ssize_t wrote = write(sfd, stop, strlen(stop));
    cr_assert(wrote == (ssize_t)strlen(stop), "wrote %zd of %zu bytes", wrote, strlen(stop));
    close(sfd);
    snprintf(stop_arg, sizeof stop_arg, "--prompt 'The quick brown fox' --max-tokens 24 --stop \"$(cat %s)\"", stop_file);
    json_t *js = py(&s, TOK_MODEL, "text", stop_arg);
    unlink(stop_file);
    cr_expect_str_eq(jstr(js, "text"), want, "cut before the stop string");
    cr_expect_str_eq(jstr(js, "finish_reason"), "stop");
    cr_expect_str_eq(jstr(js, "stop_reason"), stop);
    cr_expect_str_eq(jstr(js, "stream.text"), want, "streamed: cut before the stop string");
    cr_expect_str_eq(jstr(js, "stream.finish_reason"), "stop");
    cr_expect(jint(js, "usage.completion_tokens") < 24, "the tokens after the stop string are not counted");
    cr_expect_eq(jint(js, "stream.usage.completion_tokens"), jint(js, "usage.completion_tokens"), "streamed or not, the same tokens count");
    // seeded sampling: the non-streamed and the streamed request draw the same tokens
    json_t *jr = py(&s, TOK_MODEL, "text", "--prompt 'The quick brown fox' --max-tokens 16 --temperature 0.9 --seed 1234");
    cr_expect_str_eq(jstr(jr, "stream.text"), jstr(jr, "text"), "one seed, one text");
    cr_expect_eq(jint(jr, "usage.completion_tokens"), 16);
    // a NUL character inside a text prompt (vLLM's random-token prompts can hold one): encoded with
    // the rest, not refused and not cut short
    json_t *jn = py(&s, TOK_MODEL, "text", "--prompt-json '\"The quick\\u0000 brown fox\"' --max-tokens 4");
    static const char nulp[] = "The quick\0 brown fox";
    TokIds nv = {0};
    cr_assert_eq(tokenizer_encode(tok, nulp, sizeof nulp - 1, 1, &nv), 0);
    cr_expect_eq(jint(jn, "usage.prompt_tokens"), (int)nv.n, "a prompt with a NUL: %ld tokens, the tokenizer says %d",
                 jint(jn, "usage.prompt_tokens"), (int)nv.n);
    cr_expect((int)nv.n > np, "the NUL and what follows it are encoded too");
    cr_expect_eq(jint(jn, "usage.completion_tokens"), 4);
    cr_expect_eq(srv_stop(&s), 0);
    free(want), free(ids);
    tokids_free(&nv);
    tokenizer_free(tok);
    json_decref(j), json_decref(g), json_decref(js), json_decref(jr), json_decref(jn);
}

// A model directory with a chat template (ChatML, in tokenizer_config.json): chat completions give
// `llm generate --chat`'s text over the same rendered prompt (usage.prompt_tokens = its ids), the
// same text streamed (first delta: the assistant's role), and logprobs per token with top_logprobs.
// Its generation_config.json says temperature 0: a request that gives none is greedy.
Test(final_server, chat_completions_use_the_chat_template, .timeout = 120) {
    char dir[64], path[256], cwd[1024];
    cr_assert(getcwd(cwd, sizeof cwd));
    test_mkdtemp(dir, sizeof dir, "final_srv_chat");
    static const char *files[] = {"config.json", "model.safetensors", "tokenizer.json"};
    for (int i = 0; i < 3; i++) {
        char src[1400];
        snprintf(src, sizeof src, "%s/%s/%s", cwd, TOK_MODEL, files[i]);
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        cr_assert_eq(symlink(src, path), 0);
    }
    char *tmpl = test_slurp("tests/data/chat_templates/chatml.jinja", NULL);
    cr_assert(tmpl);
    json_t *cfg = json_object();
    json_object_set_new(cfg, "chat_template", json_string(tmpl));
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    cr_assert_eq(json_dump_file(cfg, path, 0), 0);
    json_decref(cfg);
    free(tmpl);
    // the model's sampling defaults: greedy (requests that give no temperature sample with these)
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("{\"bos_token_id\": 0, \"eos_token_id\": 1, \"temperature\": 0.0, \"top_k\": 20}\n", f);
    fclose(f);
    Srv s;
    srv_start(&s, dir, NULL);
    json_t *j = py(&s, dir, "chat", "--content 'Why is the sky blue?' --max-tokens 12");
    json_t *g = llm_generate(dir, "--chat --max-tokens 12 --prompt 'Why is the sky blue?'");
    cr_expect_str_eq(jstr(j, "text"), jstr(g, "text"), "chat vs llm generate --chat");
    cr_expect_eq(jint(j, "usage.prompt_tokens"), (long)json_array_size(json_object_get(g, "prompt_ids")));
    cr_expect_eq(jint(j, "usage.completion_tokens"), 12);
    cr_expect_str_eq(jstr(j, "role"), "assistant");
    cr_expect_str_eq(jstr(j, "finish_reason"), "length");
    cr_expect_eq(jint(j, "logprobs_n"), 12);
    const json_t *tn = json_object_get(j, "top_n");
    for (size_t i = 0; i < json_array_size(tn); i++) cr_expect_eq(json_integer_value(json_array_get(tn, i)), 2);
    cr_expect_str_eq(jstr(j, "stream.text"), jstr(j, "text"), "streamed vs non-streamed chat");
    cr_expect_eq(jint(j, "stream.usage.completion_tokens"), 12);
    cr_expect_str_eq(jstr(j, "stream.finish_reason"), "length");
    const json_t *roles = json_object_get(json_object_get(j, "stream"), "roles");
    cr_expect(json_array_size(roles) == 1 && !strcmp(json_string_value(json_array_get(roles, 0)), "assistant"));
    // a completion that names no temperature is greedy here (generation_config.json's), as vLLM does
    json_t *gt = llm_generate(dir, "--max-tokens 24 --prompt 'The quick brown fox'");
    char *body;
    cr_expect_eq(http(&s, "POST", "/v1/completions", "{\"prompt\": \"The quick brown fox\", \"max_tokens\": 24, \"ignore_eos\": true}", NULL, &body), 200);
    json_error_t je;
    json_t *jd = json_loads(body, 0, &je);
    cr_assert(jd, "%s", body);
    const char *dtext = json_string_value(json_object_get(json_array_get(json_object_get(jd, "choices"), 0), "text"));
    cr_expect_str_eq(dtext ? dtext : "", jstr(gt, "text"), "the model's default temperature 0: greedy");
    json_decref(jd), json_decref(gt);
    free(body);
    cr_expect_eq(srv_stop(&s), 0);
    json_decref(j), json_decref(g);
    test_rmtree(dir);
}

// 64 streams at once (a barrier releases them together), 4 prompts: every one completes with the
// text of the same prompt alone (the CPU runner's rows do not depend on the batch), its usage and
// finish_reason; afterwards nothing runs and no KV is held.
Test(final_server, concurrent_streams_all_complete, .timeout = 180) {
    Srv s;
    srv_start(&s, TOK_MODEL, NULL);
    json_t *j = py(&s, TOK_MODEL, "concurrent", "--n 64 --max-tokens 16");
    const json_t *fails = json_object_get(j, "failures");
    cr_expect_eq(jint(j, "ok"), 64, "%ld of 64 streams ok; first failure: %s", jint(j, "ok"),
                 json_array_size(fails) ? json_string_value(json_array_get(fails, 0)) : "");
    cr_expect_eq(metric(&s, "vllm:num_requests_running", NULL), 0);
    cr_expect_eq(metric(&s, "vllm:kv_cache_usage_perc", NULL), 0);
    cr_expect_eq(metric(&s, "vllm:request_success_total", "finished_reason=\"length\""), 64 + 4);
    cr_expect_eq(metric(&s, "vllm:generation_tokens_total", NULL), (64 + 4) * 16);
    cr_expect_eq(metric(&s, "vllm:time_to_first_token_seconds_count", NULL), 64 + 4);
    cr_expect_eq(metric(&s, "vllm:e2e_request_latency_seconds_bucket", "le=\"+Inf\""), 64 + 4);
    cr_expect_eq(srv_stop(&s), 0);
    json_decref(j);
}

// ---------------------------------------------------------------- through curl and sockets

// Steps of 20 ms at least: a long request is still running when its client goes away. A stream
// closed after its first event, and a non-streamed request whose client gives up, are both aborted:
// /metrics shows them under finished_reason="abort", far fewer tokens generated than asked, no
// request running and the KV pool empty again.
Test(final_server, dropped_connections_free_their_blocks, .timeout = 120) {
    Srv s;
    srv_start(&s, TOK_MODEL, "--min-step-ms 20");
    json_t *j = py(&s, TOK_MODEL, "drop", "--max-tokens 200");
    cr_expect(json_is_true(json_object_get(j, "saw_data")), "the stream started");
    json_decref(j);
    char cmd[512], out[256];
    snprintf(cmd, sizeof cmd,
             "curl -s -m 0.5 http://127.0.0.1:%d/v1/completions -d '{\"prompt\": \"hello world\", \"max_tokens\": 200, "
             "\"ignore_eos\": true, \"temperature\": 0}'", s.port);
    cr_expect_eq(test_run_cmd(cmd, out, sizeof out), 28, "curl gave up after 0.5 s (exit 28)");
    // while it ran it held blocks; once aborted they are back (the engine frees them at its next step)
    int i = 0;
    while (i++ < 100 && (metric(&s, "vllm:num_requests_running", NULL) > 0 || metric(&s, "vllm:kv_cache_usage_perc", NULL) > 0)) sleep_s(0.05);
    cr_expect_eq(metric(&s, "vllm:request_success_total", "finished_reason=\"abort\""), 2);
    cr_expect_eq(metric(&s, "vllm:num_requests_running", NULL), 0);
    cr_expect_eq(metric(&s, "vllm:kv_cache_usage_perc", NULL), 0);
    cr_expect_lt(metric(&s, "vllm:generation_tokens_total", NULL), 200, "the two were stopped early");
    // and the server still serves
    char *body;
    cr_expect_eq(http(&s, "POST", "/v1/completions", "{\"prompt\": [5, 6, 7], \"max_tokens\": 3, \"temperature\": 0}", NULL, &body), 200, "%s", body);
    free(body);
    cr_expect_eq(srv_stop(&s), 0);
}

// Bodies that are not JSON, fields of the wrong type or out of range, an unknown model or path,
// a body over --max-request-bytes, a prompt over --max-model-len, a wrong API key: each gets its
// status and an OpenAI error object ({"error": {"message", "type", "param", "code"}}), and the
// server answers the next good request.
Test(final_server, bad_requests_get_4xx_and_the_server_keeps_serving, .timeout = 120) {
    Srv s;
    srv_start(&s, TOK_MODEL, "--api-key sekret --max-request-bytes 4096 --max-model-len 64");
    const char *key = "-H 'Authorization: Bearer sekret'";
    static char big[8192];
    memset(big, 0, sizeof big);
    strcpy(big, "{\"prompt\": \"");
    memset(big + strlen(big), 'a', 5000);
    strcat(big, "\"}");
    const struct {
        const char *method, *path, *body, *hdrs;
        int status;
        const char *param;
    } bad[] = {
        {"POST", "/v1/completions", "{\"prompt\": ", NULL, 400, NULL},
        {"POST", "/v1/completions", "[1, 2]", NULL, 400, NULL},
        {"POST", "/v1/completions", "{\"max_tokens\": 4}", NULL, 400, "prompt"},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", \"temperature\": \"hot\"}", NULL, 400, "temperature"},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", \"top_p\": 1.5}", NULL, 400, "top_p"},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 0}", NULL, 400, "max_tokens"},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", \"n\": 2}", NULL, 400, "n"},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", \"logprobs\": 21}", NULL, 400, "logprobs"},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", \"stop\": [1]}", NULL, 400, "stop"},
        {"POST", "/v1/completions", "{\"prompt\": [1, 99999]}", NULL, 400, "prompt"},
        {"POST", "/v1/completions", "{\"prompt\": [1, -2]}", NULL, 400, "prompt"},
        {"POST", "/v1/completions", "{\"prompt\": [1, 2], \"max_tokens\": 63}", NULL, 400, "max_tokens"},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\", \"model\": \"gpt-4\"}", NULL, 404, "model"},
        {"POST", "/v1/chat/completions", "{\"messages\": []}", NULL, 400, "messages"},
        {"POST", "/v1/chat/completions", "{\"messages\": [{\"content\": \"hi\"}]}", NULL, 400, "messages"},
        {"POST", "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", NULL, 400, "messages"},  // no template
        {"POST", "/v1/completions", big, NULL, 413, NULL},
        {"GET", "/v1/completions", NULL, NULL, 405, NULL},
        {"GET", "/v1/nothing", NULL, NULL, 404, NULL},
        {"GET", "/v1/models", NULL, "-H 'Authorization: Bearer wrong'", 401, NULL},
        {"POST", "/v1/completions", "{\"prompt\": \"hi\"}", "-H 'X-No: key'", 401, NULL},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *body, hdrs[256];
        snprintf(hdrs, sizeof hdrs, "%s", bad[i].hdrs ? bad[i].hdrs : key);
        const int st = http(&s, bad[i].method, bad[i].path, bad[i].body, hdrs, &body);
        cr_expect_eq(st, bad[i].status, "case %zu (%s %s): status %d, want %d: %s", i, bad[i].method, bad[i].path, st, bad[i].status, body);
        json_error_t je;
        json_t *j = json_loads(body, 0, &je);
        const json_t *e = json_object_get(j, "error");
        cr_expect(json_is_string(json_object_get(e, "message")) && json_is_string(json_object_get(e, "type")) &&
                      json_integer_value(json_object_get(e, "code")) == bad[i].status && json_object_get(e, "param"),
                  "case %zu: not an OpenAI error object: %s", i, body);
        if (bad[i].param) cr_expect_str_eq(jstr(j, "error.param") ? jstr(j, "error.param") : "(null)", bad[i].param, "case %zu: param", i);
        json_decref(j);
        free(body);
        // the server keeps serving
        cr_expect_eq(http(&s, "POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2}", key, &body), 200, "after case %zu: %s", i, body);
        free(body);
    }
    char *body;
    cr_expect_eq(http(&s, "GET", "/health", NULL, NULL, &body), 200, "/health needs no key");
    free(body);
    cr_expect_eq(http(&s, "GET", "/metrics", NULL, NULL, &body), 200, "/metrics needs no key");
    cr_expect(strstr(body, "# TYPE vllm:e2e_request_latency_seconds histogram") != NULL);
    free(body);
    cr_expect_eq(http(&s, "GET", "/v1/models", NULL, key, &body), 200);
    json_error_t je;
    json_t *m = json_loads(body, 0, &je);
    cr_expect_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(m, "data"), 0), "id")), TOK_MODEL);
    json_decref(m);
    free(body);
    cr_expect_eq(srv_stop(&s), 0);
}

// --max-num-seqs 1 --max-queue 0: of 6 requests sent at once one is admitted and the others get
// 503 with Retry-After; once it is done the next one runs.
Test(final_server, a_full_server_answers_503_with_retry_after, .timeout = 120) {
    Srv s;
    srv_start(&s, TOK_MODEL, "--max-num-seqs 1 --max-queue 0 --min-step-ms 10");
    json_t *j = py(&s, TOK_MODEL, "busy", "--n 6 --max-tokens 100");
    const json_t *r = json_object_get(j, "responses");
    int ok = 0, busy = 0;
    for (size_t i = 0; i < json_array_size(r); i++) {
        const json_t *x = json_array_get(r, i);
        const long st = jint(x, "status");
        if (st == 200) ok++;
        else if (st == 503) {
            busy++;
            cr_expect_str_eq(jstr(x, "retry_after"), "1");
            cr_expect_str_eq(jstr(x, "error_type"), "server_overloaded");
        } else cr_expect_fail("status %ld", st);
    }
    cr_expect_geq(ok, 1);
    cr_expect_geq(busy, 1, "%d admitted, %d refused", ok, busy);
    char *body;
    cr_expect_eq(http(&s, "POST", "/v1/completions", "{\"prompt\": \"hi\", \"max_tokens\": 2}", NULL, &body), 200, "%s", body);
    free(body);
    cr_expect_eq(srv_stop(&s), 0);
    json_decref(j);
}

// SIGTERM while a stream runs: the stream still ends normally ([DONE], all its tokens), new
// requests are refused meanwhile, and the server exits 0.
Test(final_server, sigterm_drains_in_flight_streams, .timeout = 120) {
    Srv s;
    srv_start(&s, TOK_MODEL, "--min-step-ms 20");
    char out[64] = "/tmp/final_server_drain_XXXXXX";
    const int fd = mkstemp(out);
    cr_assert(fd >= 0);
    close(fd);
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "exec curl -sN http://127.0.0.1:%d/v1/completions -d '{\"prompt\": \"hello world\", \"max_tokens\": 40, \"ignore_eos\": true, "
             "\"temperature\": 0, \"stream\": true, \"stream_options\": {\"include_usage\": true}}' > %s", s.port, out);
    const pid_t c = fork();
    cr_assert(c >= 0);
    if (c == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200; i++) {  // its first event is out
        size_t n = 0;
        char *t = test_slurp(out, &n);
        const int started = t && strstr(t, "data: ");
        free(t);
        if (started) break;
        sleep_s(0.02);
    }
    kill(s.pid, SIGTERM);
    sleep_s(0.2);
    char hc[64], hcmd[256];  // draining: the listening socket is closed (or, on a connection already open, 503)
    snprintf(hcmd, sizeof hcmd, "curl -s -m 2 -o /dev/null -w '%%{http_code}' http://127.0.0.1:%d/health", s.port);
    test_run_cmd(hcmd, hc, sizeof hc);
    cr_expect_str_neq(hc, "200", "draining: no new work");
    int st = 0;
    waitpid(c, &st, 0);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "curl's stream ended normally");
    for (int i = 0; i < 600 && waitpid(s.pid, &st, WNOHANG) != s.pid; i++) sleep_s(0.05);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0, "llm serve exits 0 after draining");
    char *t = test_slurp(out, NULL);
    cr_assert(t);
    cr_expect(strstr(t, "data: [DONE]") != NULL, "the stream got to [DONE]: %s", t);
    cr_expect(strstr(t, "\"completion_tokens\":40") != NULL, "all 40 tokens: %s", t);
    cr_expect(strstr(t, "\"finish_reason\":\"length\"") != NULL);
    expect_clean_log(&s);
    char *log = test_slurp(s.log, NULL);
    cr_expect(log && strstr(log, "draining"), "the log says it drained");
    free(log), free(t);
    unlink(out), unlink(s.log);
}

// ---------------------------------------------------------------- api.h directly

Test(final_server, request_parser_and_stop_strings) {
    ApiRequest r;
    ApiError err;
    const char *ok = "{\"model\": \"m\", \"prompt\": [[1, 2, 3]], \"max_tokens\": 7, \"temperature\": 0, \"top_k\": -1, \"top_p\": 0.5,"
                     " \"min_p\": 0.1, \"seed\": -3, \"stop\": [\"a\", \"\", \"bc\"], \"ignore_eos\": true, \"n\": 1, \"logprobs\": 3,"
                     " \"stream\": true, \"stream_options\": {\"include_usage\": true}, \"repetition_penalty\": 1.0, \"user\": \"x\"}";
    cr_assert_eq(api_parse_request(API_COMPLETIONS, ok, strlen(ok), &r, &err), 0, "%s", err.message);
    cr_expect_str_eq(r.model, "m");
    cr_expect_eq(r.n_prompt_ids, 3);
    cr_expect_eq(r.prompt_ids[2], 3);
    cr_expect_eq(r.max_tokens, 7);
    cr_expect_eq(r.top_k, 0);
    cr_expect_float_eq(r.top_p, 0.5f, 1e-7);
    cr_expect_eq(r.has_seed, 1);
    cr_expect_eq(r.n_stop, 2, "empty stop strings are dropped");
    cr_expect(r.ignore_eos && r.stream && r.include_usage);
    cr_expect_eq(r.logprobs, 3);
    api_request_free(&r);
    const char *chat = "{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"user\", \"content\": [{\"type\": \"text\", "
                       "\"text\": \"a\"}, {\"type\": \"text\", \"text\": \"b\"}]}], \"logprobs\": true, \"top_logprobs\": 2, "
                       "\"max_completion_tokens\": 5}";
    cr_assert_eq(api_parse_request(API_CHAT, chat, strlen(chat), &r, &err), 0, "%s", err.message);
    cr_expect_eq(r.n_msgs, 2);
    cr_expect_str_eq(r.msgs[1].content, "a\nb");
    cr_expect_eq(r.logprobs, 2);
    cr_expect_eq(r.max_tokens, 5);
    api_request_free(&r);
    // a text prompt may hold NUL characters (vLLM's random-token prompts can): kept, with its length
    const char *nul = "{\"prompt\": \"a\\u0000b\"}";
    cr_assert_eq(api_parse_request(API_COMPLETIONS, nul, strlen(nul), &r, &err), 0, "%s", err.message);
    cr_expect_eq(r.prompt_len, 3);
    cr_expect(r.prompt[0] == 'a' && r.prompt[1] == 0 && r.prompt[2] == 'b');
    api_request_free(&r);
    const struct {
        ApiKind k;
        const char *body, *param;
    } bad[] = {
        {API_COMPLETIONS, "", ""},
        {API_COMPLETIONS, "null", ""},
        {API_COMPLETIONS, "{\"prompt\": []}", "prompt"},
        {API_COMPLETIONS, "{\"prompt\": [\"a\", \"b\"]}", "prompt"},
        {API_COMPLETIONS, "{\"prompt\": [1.5]}", "prompt"},
        {API_COMPLETIONS, "{\"prompt\": \"a\", \"seed\": 1.5}", "seed"},
        {API_COMPLETIONS, "{\"prompt\": \"a\", \"stream_options\": {\"include_usage\": true}}", "stream_options"},
        {API_COMPLETIONS, "{\"prompt\": \"a\", \"echo\": true}", "echo"},
        {API_COMPLETIONS, "{\"prompt\": \"a\", \"presence_penalty\": 0.5}", "presence_penalty"},
        {API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}", "messages"},
        {API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"top_logprobs\": 2}", "top_logprobs"},
        // what the C side reads as C strings refuses NUL characters instead of cutting them short
        {API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\\u0000b\"}]}", "messages"},
        {API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"\\u0000\"}]}]}", "messages"},
        {API_CHAT, "{\"messages\": [{\"role\": \"us\\u0000er\", \"content\": \"a\"}]}", "messages"},
        {API_COMPLETIONS, "{\"prompt\": \"a\", \"stop\": \"x\\u0000\"}", "stop"},
        {API_COMPLETIONS, "{\"prompt\": \"a\", \"stop\": [\"x\", \"\\u0000\"]}", "stop"},
        {API_COMPLETIONS, "{\"prompt\": \"a\", \"model\": \"m\\u0000\"}", "model"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect_eq(api_parse_request(bad[i].k, bad[i].body, strlen(bad[i].body), &r, &err), -1, "case %zu accepted", i);
        cr_expect_eq(err.status, 400);
        cr_expect_str_eq(err.param, bad[i].param, "case %zu: %s", i, err.message);
    }
    char *stops[] = {"world", "ld!", "xyz"};
    const char *t = "hello world!";
    cr_expect_eq(api_stop_find(t, strlen(t), 0, stops, 3), 6);
    cr_expect_eq(api_stop_find(t, strlen(t), 7, stops, 3), 9);
    cr_expect_eq(api_stop_find(t, 5, 0, stops, 3), -1);
    cr_expect_eq(api_stop_holdback("hello wor", 9, stops, 3), 3, "'wor' may become 'world'");
    cr_expect_eq(api_stop_holdback("hello x", 7, stops, 3), 1, "'x' may become 'xyz'");
    cr_expect_eq(api_stop_holdback("hello", 5, stops, 3), 0);
    api_error(&err, 404, "not_found_error", NULL, "no %s", "such");
    char *js = api_error_json(&err);
    cr_expect_str_eq(js, "{\"error\":{\"message\":\"no such\",\"type\":\"not_found_error\",\"param\":null,\"code\":404}}");
    free(js);
}
