// server.c — see server.h. `llm serve` (llm.c) builds the engine and calls server_run.
//
//   build/bin/llm serve --model tests/data/models/llama_mha_f32 --device cpu --port 8000
//   curl -s localhost:8000/v1/completions -H 'Content-Type: application/json' -d '{"model": "tests/data/models/llama_mha_f32", "prompt": "The quick", "max_tokens": 8, "temperature": 0}'
//
// One request's life: the connection's thread reads the body (413 past --max-request-bytes),
// api_parse_request checks it (400), the prompt becomes ids (the chat template for chat; the
// tokenizer, under a lock, for text), the length is checked against --max-model-len (400), the
// in-flight count against --max-num-seqs + --max-queue (503 + Retry-After), and engine_submit_lp
// queues it. Then gen_pump reads the engine's stream: each token is decoded incrementally
// (tokstream: never half a UTF-8 character), the text is searched for the stop strings (a match
// cancels the engine request and cuts the text before it), and what could still be the beginning
// of a stop string is held back. Non-streaming requests pump until the end in the handler; streams
// pump inside libmicrohttpd's content reader, one SSE chunk per read. Between reads (0.25 s at
// most) the socket is polled: a client that has gone away is cancelled and released.
#define _GNU_SOURCE  // POLLRDHUP
#include "server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "final/api.h"
#include "timer.h"

// ---------------------------------------------------------------- metrics (vLLM's names and buckets)
typedef struct {
    const double *le;
    int n;
    long count[32];  // (n + 1) the last is +Inf
    double sum;
    long total;
} Hist;

static const double TTFT_LE[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                                 1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
static const double ITL_LE[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
                                0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
static const double E2E_LE[] = {0.3,  0.5,  0.8,  1.0,  1.5,  2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                                30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

static void hist_add(Hist *h, double x) {
    int i = 0;
    while (i < h->n && x > h->le[i]) i++;
    h->count[i]++;
    h->sum += x;
    h->total++;
}

enum { DONE_STOP, DONE_LENGTH, DONE_ABORT, N_DONE };
static const char *const DONE_NAME[N_DONE] = {"stop", "length", "abort"};

typedef struct {
    ServerConfig cfg;
    Engine *e;
    Tokenizer *tok;
    const ChatTemplate *ct;
    int vocab;
    uint64_t seed;           // sampling seed of the requests that give none
    double t_start;
    pthread_mutex_t tok_mu;  // tokenizer_encode is not thread-safe
    pthread_mutex_t mu;      // what follows
    pthread_cond_t idle;     // in_flight reached 0
    int in_flight, draining;
    long next_id;
    Hist ttft, itl, e2e;
    long done[N_DONE];
} Server;

// ---------------------------------------------------------------- one generation
typedef struct {
    Server *s;
    ApiRequest r;
    long id;                 // the engine's, -1 before submission
    int n_prompt;
    int *toks, n_toks, cap;  // generated ids
    size_t *tok_end;         // (cap) the text's length once each token was decoded
    float *lp, *top_lp;      // logprobs: (cap), (cap, n_top)
    int *top_ids, n_top;
    TokStream *ts;
    char *text;              // decoded text so far (cut at a stop string)
    size_t text_len, text_cap, sent;  // sent: bytes already written to the client
    int lp_sent;             // tokens whose logprobs were written
    FinishReason fin;
    int done, stopped, counted, lost;
    char *stop_hit;          // the stop string that matched
    double t_arrival, t_first, t_last;
    long created;
    char rid[48];
    int fd;                  // the client's socket
    // the stream's bytes not yet handed to libmicrohttpd
    char *out;
    size_t out_len, out_off, out_cap;
    int role_sent, end_sent;
} Gen;

typedef struct {
    Server *s;
    char *body;
    size_t len, cap;
    int too_large;
    Gen *g;
} Conn;

static char *dupstr(const char *s) {
    const size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

static void grow(char **buf, size_t *cap, size_t need) {
    if (need <= *cap) return;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    *buf = realloc(*buf, c);
    if (!*buf) die("server: out of memory");
    *cap = c;
}

static void append(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    grow(buf, cap, *len + n + 1);
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
}

// A JSON string of s[0..n): as it is when valid UTF-8, else with each bad byte as U+FFFD.
static json_t *jstr(const char *s, size_t n) {
    json_t *j = json_stringn(s, n);
    if (j) return j;
    char *o = xmalloc(3 * n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        const unsigned char c = (unsigned char)s[i];
        const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        json_t *t = len && i + (size_t)len <= n ? json_stringn(s + i, (size_t)len) : NULL;
        if (t) {
            memcpy(o + k, s + i, (size_t)len), k += (size_t)len, i += (size_t)len;
            json_decref(t);
        } else {
            memcpy(o + k, "\xEF\xBF\xBD", 3), k += 3, i++;
        }
    }
    j = json_stringn(o, k);
    free(o);
    return j;
}

// The client closed its end (or the socket failed).
static int client_gone(int fd) {
    if (fd < 0) return 0;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static void count_done(Gen *g, int how) {
    if (g->counted) return;
    g->counted = 1;
    Server *s = g->s;
    pthread_mutex_lock(&s->mu);
    s->done[how]++;
    if (how != DONE_ABORT) {
        if (g->t_first >= 0) hist_add(&s->ttft, g->t_first - g->t_arrival);
        hist_add(&s->e2e, now_sec() - g->t_arrival);
    }
    pthread_mutex_unlock(&s->mu);
}

static void gen_free(Gen *g) {
    if (!g) return;
    Server *s = g->s;
    if (g->id >= 0) {
        if (!g->done) count_done(g, DONE_ABORT);
        engine_release(s->e, g->id);  // not finished: cancelled, its KV freed at the next step
        pthread_mutex_lock(&s->mu);
        if (--s->in_flight == 0) pthread_cond_broadcast(&s->idle);
        pthread_mutex_unlock(&s->mu);
    }
    if (g->ts) tokstream_free(g->ts);
    api_request_free(&g->r);
    free(g->toks), free(g->tok_end), free(g->lp), free(g->top_lp), free(g->top_ids), free(g->text), free(g->out);
    free(g);
}

static int finish_kind(const Gen *g) {
    if (g->stopped || g->fin == FINISH_STOP) return DONE_STOP;
    if (g->fin == FINISH_LENGTH) return DONE_LENGTH;
    return DONE_ABORT;
}

// Reads what the engine has for g (waiting up to timeout_s): tokens, logprobs, text; applies the
// stop strings. Returns the tokens read, -1 when the engine lost the request.
static int gen_pump(Gen *g, double timeout_s) {
    Server *s = g->s;
    enum { CHUNK = 64 };
    int ids[CHUNK], top_ids[CHUNK * API_MAX_LOGPROBS];
    float lp[CHUNK], top_lp[CHUNK * API_MAX_LOGPROBS];
    int seen = g->n_toks;
    FinishReason fin = FINISH_NONE;
    const int want_lp = g->r.logprobs >= 0;
    const int k = engine_read_lp(s->e, g->id, &seen, ids, want_lp ? lp : NULL, want_lp ? top_ids : NULL,
                                 want_lp ? top_lp : NULL, CHUNK, &fin, timeout_s);
    if (k < 0) return -1;
    const double t = now_sec();
    if (k > 0) {
        if (g->t_first < 0) g->t_first = t;
        else {
            pthread_mutex_lock(&s->mu);
            for (int i = 0; i < k; i++) hist_add(&s->itl, (t - g->t_last) / k);
            pthread_mutex_unlock(&s->mu);
        }
        g->t_last = t;
    }
    if (g->n_toks + k > g->cap) die("server: request %s read more tokens than it asked for", g->rid);
    const size_t from = g->sent;
    for (int i = 0; i < k; i++) {
        const int n = g->n_toks + i;
        g->toks[n] = ids[i];
        if (want_lp) {
            g->lp[n] = lp[i];
            memcpy(g->top_ids + (size_t)n * g->n_top, top_ids + (size_t)i * g->n_top, (size_t)g->n_top * sizeof(int));
            memcpy(g->top_lp + (size_t)n * g->n_top, top_lp + (size_t)i * g->n_top, (size_t)g->n_top * sizeof(float));
        }
        size_t len = 0;
        const char *piece = g->ts ? tokstream_step(g->ts, ids[i], &len) : "";
        append(&g->text, &g->text_len, &g->text_cap, piece, len);
        g->tok_end[n] = g->text_len;
    }
    const int n0 = g->n_toks;
    g->n_toks += k;
    if (fin != FINISH_NONE) {
        size_t len = 0;
        const char *rest = g->ts ? tokstream_flush(g->ts, &len) : "";
        append(&g->text, &g->text_len, &g->text_cap, rest, len);
        if (g->n_toks > 0) g->tok_end[g->n_toks - 1] = g->text_len;
    }
    if (g->r.n_stop && g->text_len > from) {
        // a stop string cannot start inside text already sent (it was held back)
        const long p = api_stop_find(g->text, g->text_len, from, g->r.stop, g->r.n_stop);
        if (p >= 0) {
            for (int i = 0; i < g->r.n_stop && !g->stop_hit; i++)
                if (!strncmp(g->text + p, g->r.stop[i], strlen(g->r.stop[i]))) g->stop_hit = g->r.stop[i];
            // the tokens after the one that completed the stop string are dropped (ids, logprobs, usage)
            const size_t end = (size_t)p + strlen(g->stop_hit);
            int last = n0;
            while (last < g->n_toks - 1 && g->tok_end[last] < end) last++;
            g->n_toks = last + 1;
            g->text_len = (size_t)p;
            g->text[p] = 0;
            g->stopped = 1;
            engine_cancel(s->e, g->id);
        }
    }
    if (fin != FINISH_NONE || g->stopped) {
        g->fin = g->stopped ? FINISH_STOP : fin;
        if (!g->done) g->done = 1, count_done(g, finish_kind(g));
    }
    return k;
}

// The text that can go to the client now: up to the end, or short of a possible stop string.
static size_t gen_ready(const Gen *g) {
    if (g->done) return g->text_len;
    const size_t hold = g->r.n_stop ? api_stop_holdback(g->text, g->text_len, g->r.stop, g->r.n_stop) : 0;
    return g->text_len - hold;
}

static json_t *finish_json(const Gen *g) {
    if (!g->done) return json_null();
    if (g->fin == FINISH_ERROR && !g->stopped) return json_string("abort");
    return json_string(g->stopped || g->fin == FINISH_STOP ? "stop" : "length");
}

// A choice: index 0, the text (or the chat message / delta), the logprobs of tokens lp0..lp1.
static json_t *choice_json(const Gen *g, const char *text, size_t n, int delta, int lp0, int lp1, int with_finish,
                           long text_offset) {
    json_t *c = json_object();
    json_object_set_new(c, "index", json_integer(0));
    if (g->r.kind == API_CHAT) {
        json_t *m = json_object();
        if (!delta) json_object_set_new(m, "role", json_string("assistant"));
        if (!delta || n > 0) json_object_set_new(m, "content", jstr(text, n));
        json_object_set_new(c, delta ? "delta" : "message", m);
    } else {
        json_object_set_new(c, "text", jstr(text, n));
    }
    json_t *lps = json_null();
    if (g->r.logprobs >= 0 && lp1 > lp0)
        lps = api_logprobs_json(g->r.kind, g->r.tokens_as_ids ? NULL : g->s->tok, g->toks + lp0, g->lp + lp0, g->top_ids + (size_t)lp0 * g->n_top,
                                g->top_lp + (size_t)lp0 * g->n_top, lp1 - lp0, g->n_top, text_offset);
    json_object_set_new(c, "logprobs", lps);
    json_object_set_new(c, "finish_reason", with_finish ? finish_json(g) : json_null());
    if (with_finish)
        json_object_set_new(c, "stop_reason", g->stop_hit ? json_string(g->stop_hit) : json_null());
    return c;
}

static json_t *envelope(const Gen *g, int chunk) {
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(g->rid));
    json_object_set_new(o, "object", json_string(g->r.kind == API_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                                       : "text_completion"));
    json_object_set_new(o, "created", json_integer(g->created));
    json_object_set_new(o, "model", json_string(g->s->cfg.model_name));
    return o;
}

// ---------------------------------------------------------------- responses
static enum MHD_Result reply(struct MHD_Connection *c, int status, const char *type, char *body /* freed */,
                             const char *retry_after) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, "Content-Type", type);
    if (retry_after) MHD_add_response_header(r, "Retry-After", retry_after);
    const enum MHD_Result rc = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result reply_json(struct MHD_Connection *c, int status, json_t *o) {
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return reply(c, status, "application/json", s, NULL);
}

static enum MHD_Result reply_error(struct MHD_Connection *c, int status, const char *type, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static enum MHD_Result reply_error(struct MHD_Connection *c, int status, const char *type, const char *param, const char *fmt, ...) {
    ApiError err;
    char msg[sizeof err.message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    api_error(&err, status, type, param, "%s", msg);
    return reply(c, status, "application/json", api_error_json(&err), status == 503 ? "1" : NULL);
}

// The stream's next SSE event into g->out.
static void sse(Gen *g, json_t *o) {
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    append(&g->out, &g->out_len, &g->out_cap, "data: ", 6);
    append(&g->out, &g->out_len, &g->out_cap, s, strlen(s));
    append(&g->out, &g->out_len, &g->out_cap, "\n\n", 2);
    free(s);
}

static void sse_choice(Gen *g, size_t upto, int with_finish) {
    json_t *o = envelope(g, 1), *a = json_array();
    json_array_append_new(a, choice_json(g, g->text + g->sent, upto - g->sent, 1, g->lp_sent, g->n_toks, with_finish, (long)g->sent));
    json_object_set_new(o, "choices", a);
    g->sent = upto, g->lp_sent = g->n_toks;
    sse(g, o);
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    Gen *g = cls;
    for (;;) {
        if (g->out_off < g->out_len) {
            const size_t n = g->out_len - g->out_off < max ? g->out_len - g->out_off : max;
            memcpy(buf, g->out + g->out_off, n);
            g->out_off += n;
            return (ssize_t)n;
        }
        g->out_len = g->out_off = 0;
        if (g->end_sent) return MHD_CONTENT_READER_END_OF_STREAM;
        if (g->r.kind == API_CHAT && !g->role_sent) {  // the first chunk opens the assistant's message
            g->role_sent = 1;
            json_t *o = envelope(g, 1), *a = json_array(), *c = json_object(), *d = json_object();
            json_object_set_new(d, "role", json_string("assistant"));
            json_object_set_new(d, "content", json_string(""));
            json_object_set_new(c, "index", json_integer(0));
            json_object_set_new(c, "delta", d);
            json_object_set_new(c, "logprobs", json_null());
            json_object_set_new(c, "finish_reason", json_null());
            json_array_append_new(a, c);
            json_object_set_new(o, "choices", a);
            sse(g, o);
            continue;
        }
        if (g->done) {
            sse_choice(g, g->text_len, 1);
            if (g->r.include_usage) {
                json_t *o = envelope(g, 1);
                json_object_set_new(o, "choices", json_array());
                json_object_set_new(o, "usage", api_usage_json(g->n_prompt, g->n_toks));
                sse(g, o);
            }
            append(&g->out, &g->out_len, &g->out_cap, "data: [DONE]\n\n", 14);
            g->end_sent = 1;
            continue;
        }
        if (client_gone(g->fd)) return MHD_CONTENT_READER_END_WITH_ERROR;
        const int k = gen_pump(g, 0.25);
        if (k < 0) {
            g->lost = 1;
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        // a chunk whenever tokens came, as vLLM's (its text may be "": a character not complete yet,
        // or text held back for a stop string); the last one carries finish_reason
        if (!g->done && k > 0) sse_choice(g, gen_ready(g), 0);
    }
}

// ---------------------------------------------------------------- the endpoints
static enum MHD_Result do_generate(Server *s, struct MHD_Connection *c, Conn *cn, ApiKind kind) {
    ApiError err;
    ApiRequest r;
    if (api_parse_request(kind, cn->body ? cn->body : "", cn->len, &r, &err) != 0)
        return reply(c, err.status, "application/json", api_error_json(&err), NULL);
    Gen *g = xcalloc(1, sizeof *g);
    g->s = s, g->r = r, g->id = -1, g->fd = -1, g->t_first = -1, g->t_arrival = now_sec(), g->created = (long)time(NULL);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci) g->fd = ci->connect_fd;
    enum MHD_Result rc;
#define FAIL(status, type, param, ...)                               \
    do {                                                             \
        rc = reply_error(c, status, type, param, __VA_ARGS__);       \
        gen_free(g);                                                 \
        return rc;                                                   \
    } while (0)
    if (r.model && strcmp(r.model, s->cfg.model_name))
        FAIL(404, "not_found_error", "model", "The model `%s` does not exist.", r.model);
    // ---- the prompt's ids
    int *ids = NULL, n = 0;
    if (kind == API_CHAT || r.prompt) {
        char *text = NULL;
        if (kind == API_CHAT) {
            if (!s->ct) FAIL(400, "invalid_request_error", "messages", "this model has no chat template (tokenizer_config.json's chat_template)");
            char msg[512];
            text = chat_template_render(s->ct->text, r.msgs, r.n_msgs, 1, s->ct->bos_token, s->ct->eos_token, msg, sizeof msg);
            if (!text) FAIL(400, "invalid_request_error", "messages", "the chat template: %s", msg);
        }
        if (!s->tok) {
            free(text);
            FAIL(400, "invalid_request_error", "prompt", "this model has no tokenizer.json: give the prompt as token ids");
        }
        TokIds v = {0};
        pthread_mutex_lock(&s->tok_mu);
        // a chat prompt is encoded as rendered (the template writes BOS); a text prompt gets the
        // tokenizer's special tokens, as vLLM's completions do
        const char *src = text ? text : r.prompt;
        const int erc = tokenizer_encode(s->tok, src, text ? strlen(text) : r.prompt_len, text == NULL, &v);
        char tmsg[256];
        snprintf(tmsg, sizeof tmsg, "%s", erc ? tokenizer_error(s->tok) : "");
        pthread_mutex_unlock(&s->tok_mu);
        free(text);
        if (erc != 0) {
            tokids_free(&v);
            FAIL(400, "invalid_request_error", "prompt", "the prompt cannot be tokenized: %s", tmsg);
        }
        n = (int)v.n;
        ids = xmalloc((v.n ? v.n : 1) * sizeof(int));
        for (size_t i = 0; i < v.n; i++) ids[i] = v.ids[i];
        tokids_free(&v);
    } else {
        n = r.n_prompt_ids;
        ids = xmalloc((size_t)n * sizeof(int));
        memcpy(ids, r.prompt_ids, (size_t)n * sizeof(int));
    }
    for (int i = 0; i < n; i++)
        if (ids[i] >= s->vocab) {
            const int bad = ids[i];
            free(ids);
            FAIL(400, "invalid_request_error", "prompt", "token id %d is outside the vocabulary (%d ids)", bad, s->vocab);
        }
    if (n == 0) {
        free(ids);
        FAIL(400, "invalid_request_error", "prompt", "the prompt has no tokens");
    }
    const int L = s->cfg.max_model_len;
    if (n >= L || (r.max_tokens > 0 && n + r.max_tokens > L)) {
        free(ids);
        FAIL(400, "invalid_request_error", r.max_tokens > 0 ? "max_tokens" : "prompt",
             "This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the prompt, %d "
             "for the completion). Please reduce the length of the prompt or the completion.",
             L, n + (r.max_tokens > 0 ? r.max_tokens : 0), n, r.max_tokens > 0 ? r.max_tokens : 0);
    }
    const int max_tokens = r.max_tokens > 0 ? r.max_tokens : L - n;
    // ---- admission and submission
    pthread_mutex_lock(&s->mu);
    const int draining = s->draining, full = s->in_flight >= s->cfg.max_num_seqs + s->cfg.max_queue;
    if (!draining && !full) s->in_flight++;
    const long seq = s->next_id++;
    pthread_mutex_unlock(&s->mu);
    if (draining || full) {
        free(ids);
        FAIL(503, "server_overloaded", NULL, draining ? "the server is shutting down" : "the server is busy (%d requests in flight): retry later",
             s->cfg.max_num_seqs + s->cfg.max_queue);
    }
    if (!(r.given & API_GAVE_TEMPERATURE)) r.temperature = s->cfg.temperature;
    if (!(r.given & API_GAVE_TOP_P)) r.top_p = s->cfg.top_p;
    if (!(r.given & API_GAVE_TOP_K)) r.top_k = s->cfg.top_k;
    if (!(r.given & API_GAVE_MIN_P)) r.min_p = s->cfg.min_p;
    SamplerParams sp = {.greedy = r.temperature < 1e-5f, .temperature = r.temperature, .top_k = r.top_k, .top_p = r.top_p,
                        .min_p = r.min_p, .seed = r.has_seed ? r.seed : s->seed};
    g->id = engine_submit_lp(s->e, r.has_seed ? 0 : -1, ids, n, max_tokens, &sp, r.ignore_eos, r.logprobs);
    free(ids);
    if (g->id < 0) {
        const long why = g->id;
        g->id = -1;
        pthread_mutex_lock(&s->mu);
        if (--s->in_flight == 0) pthread_cond_broadcast(&s->idle);
        pthread_mutex_unlock(&s->mu);
        if (why == -3) FAIL(400, "invalid_request_error", NULL, "the engine refused the request's parameters");
        FAIL(503, "server_overloaded", NULL, "the engine's queue is full: retry later");
    }
    g->n_prompt = n, g->cap = max_tokens, g->n_top = r.logprobs > 0 ? r.logprobs : 0;
    g->toks = xmalloc((size_t)max_tokens * sizeof(int)), g->tok_end = xmalloc((size_t)max_tokens * sizeof(size_t));
    if (r.logprobs >= 0) {
        const size_t nt = (size_t)(g->n_top ? g->n_top : 1);
        g->lp = xmalloc((size_t)max_tokens * sizeof(float));
        g->top_ids = xmalloc((size_t)max_tokens * nt * sizeof(int)), g->top_lp = xmalloc((size_t)max_tokens * nt * sizeof(float));
    }
    g->ts = s->tok ? tokstream_new(s->tok, 1) : NULL;
    snprintf(g->rid, sizeof g->rid, "%s-%016llx%08lx", kind == API_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)s->seed, seq);
    cn->g = g;
#undef FAIL
    if (r.stream) {
        struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, g, NULL);
        MHD_add_response_header(resp, "Content-Type", "text/event-stream");
        MHD_add_response_header(resp, "Cache-Control", "no-cache");
        rc = MHD_queue_response(c, MHD_HTTP_OK, resp);
        MHD_destroy_response(resp);
        return rc;
    }
    while (!g->done) {
        if (client_gone(g->fd)) return MHD_NO;  // the completion callback cancels and releases it
        if (gen_pump(g, 0.25) < 0) return reply_error(c, 500, "internal_error", NULL, "the engine lost the request");
    }
    if (g->fin == FINISH_ERROR && !g->stopped)
        return reply_error(c, 400, "invalid_request_error", NULL,
                           "the request could not run: its %d prompt tokens + %d do not fit the KV pool", n, max_tokens);
    json_t *o = envelope(g, 0), *a = json_array();
    json_array_append_new(a, choice_json(g, g->text, g->text_len, 0, 0, g->n_toks, 1, 0));
    json_object_set_new(o, "choices", a);
    json_object_set_new(o, "usage", api_usage_json(g->n_prompt, g->n_toks));
    return reply_json(c, MHD_HTTP_OK, o);
}

static void label_escape(char *dst, size_t cap, const char *s) {
    size_t k = 0;
    for (; *s && k + 3 < cap; s++) {
        if (*s == '\\' || *s == '"') dst[k++] = '\\', dst[k++] = *s;
        else if (*s == '\n') dst[k++] = '\\', dst[k++] = 'n';
        else dst[k++] = *s;
    }
    dst[k] = 0;
}

// Prometheus text format 0.0.4, as vLLM's prometheus_client writes it: HELP, TYPE, samples; labels
// model_name and engine ("0": one engine); counters end in _total; histograms have cumulative
// _bucket{le} samples, then _count and _sum.
static char *metrics_text(Server *s) {
    EngineMetrics m;
    engine_metrics(s->e, &m);
    pthread_mutex_lock(&s->mu);
    Hist h[3] = {s->ttft, s->itl, s->e2e};
    long done[N_DONE];
    memcpy(done, s->done, sizeof done);
    pthread_mutex_unlock(&s->mu);
    char name[512], lab[700];
    label_escape(name, sizeof name, s->cfg.model_name);
    snprintf(lab, sizeof lab, "model_name=\"%s\",engine=\"0\"", name);
    char *out = NULL;
    size_t len = 0, cap = 0;
    char line[1024];
#define EMIT(...)                                                          \
    do {                                                                   \
        const int k_ = snprintf(line, sizeof line, __VA_ARGS__);           \
        append(&out, &len, &cap, line, (size_t)k_ < sizeof line ? (size_t)k_ : sizeof line - 1); \
    } while (0)
    const struct {
        const char *name, *type, *help;
        double v;
    } scal[] = {
        {"vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", m.running},
        {"vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", m.waiting + m.queued},
        {"vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", m.kv_usage},
        {"vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.", (double)m.prefix_query_tokens},
        {"vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.", (double)m.prefix_hit_tokens},
        {"vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", (double)m.preemptions},
        {"vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", (double)m.prompt_tokens},
        {"vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", (double)m.generation_tokens},
    };
    for (size_t i = 0; i < sizeof scal / sizeof scal[0]; i++) {
        EMIT("# HELP %s %s\n# TYPE %s %s\n", scal[i].name, scal[i].help, scal[i].name, scal[i].type);
        EMIT("%s{%s} %.17g\n", scal[i].name, lab, scal[i].v);
    }
    EMIT("# HELP vllm:request_success_total Count of successfully processed requests.\n"
         "# TYPE vllm:request_success_total counter\n");
    for (int i = 0; i < N_DONE; i++) EMIT("vllm:request_success_total{%s,finished_reason=\"%s\"} %ld\n", lab, DONE_NAME[i], done[i]);
    static const char *const hname[3] = {"vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
                                         "vllm:e2e_request_latency_seconds"};
    static const char *const hhelp[3] = {"Histogram of time to first token in seconds.", "Histogram of inter-token latency in seconds.",
                                         "Histogram of e2e request latency in seconds."};
    for (int k = 0; k < 3; k++) {
        EMIT("# HELP %s %s\n# TYPE %s histogram\n", hname[k], hhelp[k], hname[k]);
        long cum = 0;
        for (int i = 0; i <= h[k].n; i++) {
            cum += h[k].count[i];
            if (i < h[k].n) EMIT("%s_bucket{%s,le=\"%g\"} %ld\n", hname[k], lab, h[k].le[i], cum);
            else EMIT("%s_bucket{%s,le=\"+Inf\"} %ld\n", hname[k], lab, cum);
        }
        EMIT("%s_count{%s} %ld\n%s_sum{%s} %.17g\n", hname[k], lab, h[k].total, hname[k], lab, h[k].sum);
    }
#undef EMIT
    return out;
}

static enum MHD_Result handler(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                               const char *version, const char *upload_data, size_t *upload_size, void **con_cls) {
    (void)version;
    Server *s = cls;
    Conn *cn = *con_cls;
    if (!cn) {  // the headers are in: refuse an oversized body before reading it
        cn = xcalloc(1, sizeof *cn);
        cn->s = s;
        *con_cls = cn;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoll(cl, NULL, 10) > s->cfg.max_body)
            return reply_error(c, 413, "invalid_request_error", NULL, "the request body (%s bytes) is larger than %ld bytes", cl, s->cfg.max_body);
        return MHD_YES;
    }
    if (*upload_size) {
        if (cn->len + *upload_size > (size_t)s->cfg.max_body) cn->too_large = 1;
        else append(&cn->body, &cn->len, &cn->cap, upload_data, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    const int is_get = !strcmp(method, "GET"), is_post = !strcmp(method, "POST");
    if (!strncmp(url, "/v1/", 4) && s->cfg.api_key) {
        const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
        if (!auth || strncmp(auth, "Bearer ", 7) || strcmp(auth + 7, s->cfg.api_key))
            return reply_error(c, 401, "authentication_error", NULL, "Incorrect API key provided.");
    }
    if (cn->too_large)
        return reply_error(c, 413, "invalid_request_error", NULL, "the request body is larger than %ld bytes", s->cfg.max_body);
    const ApiKind kind = !strcmp(url, "/v1/chat/completions") ? API_CHAT : API_COMPLETIONS;
    if (!strcmp(url, "/v1/completions") || !strcmp(url, "/v1/chat/completions")) {
        if (!is_post) return reply_error(c, 405, "invalid_request_error", NULL, "%s takes POST, not %s", url, method);
        return do_generate(s, c, cn, kind);
    }
    if (!strcmp(url, "/health")) {
        pthread_mutex_lock(&s->mu);
        const int draining = s->draining;
        pthread_mutex_unlock(&s->mu);
        return reply(c, draining ? 503 : 200, "text/plain", dupstr(""), NULL);
    }
    if (!strcmp(url, "/metrics") && is_get) return reply(c, 200, "text/plain; version=0.0.4; charset=utf-8", metrics_text(s), NULL);
    if (!strcmp(url, "/v1/models") && is_get) {
        json_t *o = json_object(), *a = json_array(), *m = json_object();
        json_object_set_new(m, "id", json_string(s->cfg.model_name));
        json_object_set_new(m, "object", json_string("model"));
        json_object_set_new(m, "created", json_integer((json_int_t)s->t_start));
        json_object_set_new(m, "owned_by", json_string("llm"));
        json_object_set_new(m, "root", json_string(s->cfg.model_name));
        json_object_set_new(m, "parent", json_null());
        json_object_set_new(m, "max_model_len", json_integer(s->cfg.max_model_len));
        json_array_append_new(a, m);
        json_object_set_new(o, "object", json_string("list"));
        json_object_set_new(o, "data", a);
        return reply_json(c, 200, o);
    }
    return reply_error(c, 404, "not_found_error", NULL, "no route %s %s", method, url);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why) {
    (void)cls, (void)c, (void)why;
    Conn *cn = *con_cls;
    if (!cn) return;
    gen_free(cn->g);  // a request that has not finished (a client gone, a failed write) is cancelled here
    free(cn->body);
    free(cn);
    *con_cls = NULL;
}

static sem_t g_stop;  // posted by the signal handler (sem_post is async-signal-safe)
static volatile sig_atomic_t g_signal;

static void on_signal(int sig) {
    g_signal = sig;
    sem_post(&g_stop);
}

void server_catch_signals(void) {
    sem_init(&g_stop, 0, 0);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
}

int server_run(const ServerConfig *c, Engine *e, Tokenizer *tok, const ChatTemplate *ct, int vocab) {
    Server *s = xcalloc(1, sizeof *s);
    s->cfg = *c, s->e = e, s->tok = tok, s->ct = ct, s->vocab = vocab;
    s->t_start = (double)time(NULL);
    s->seed = ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid();
    s->ttft.le = TTFT_LE, s->ttft.n = (int)(sizeof TTFT_LE / sizeof TTFT_LE[0]);
    s->itl.le = ITL_LE, s->itl.n = (int)(sizeof ITL_LE / sizeof ITL_LE[0]);
    s->e2e.le = E2E_LE, s->e2e.n = (int)(sizeof E2E_LE / sizeof E2E_LE[0]);
    pthread_mutex_init(&s->tok_mu, NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->idle, NULL);
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", c->port);
    const int gai = getaddrinfo(c->host, port, &hints, &ai);
    if (gai != 0) {
        fprintf(stderr, "llm serve: --host %s: %s\n", c->host, gai_strerror(gai));
        free(s);
        return 1;
    }
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC | MHD_USE_ERROR_LOG,
        (uint16_t)c->port, NULL, NULL, handler, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, completed, s,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)c->max_connections, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600,
        MHD_OPTION_THREAD_STACK_SIZE, (size_t)(1 << 20), MHD_OPTION_LISTENING_ADDRESS_REUSE, 1u, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "llm serve: cannot listen on %s:%d (%s)\n", c->host, c->port, strerror(errno));
        freeaddrinfo(ai);
        free(s);
        return 1;
    }
    freeaddrinfo(ai);
    int bound = c->port;
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_LISTEN_FD);
    struct sockaddr_in sa;
    socklen_t sl = sizeof sa;
    if (di && getsockname(di->listen_fd, (struct sockaddr *)&sa, &sl) == 0) bound = ntohs(sa.sin_port);
    fprintf(stderr, "[llm serve] listening on http://%s:%d (model %s, max_model_len %d, max_num_seqs %d)\n", c->host, bound,
            c->model_name, c->max_model_len, c->max_num_seqs);
    while (sem_wait(&g_stop) != 0 && errno == EINTR) {
    }
    fprintf(stderr, "[llm serve] %s: draining (no new requests; waiting for those in flight)\n", g_signal == SIGTERM ? "SIGTERM" : "SIGINT");
    pthread_mutex_lock(&s->mu);
    s->draining = 1;
    pthread_mutex_unlock(&s->mu);
    const MHD_socket lfd = MHD_quiesce_daemon(d);
    if (lfd != MHD_INVALID_SOCKET) close(lfd);
    pthread_mutex_lock(&s->mu);
    while (s->in_flight > 0) pthread_cond_wait(&s->idle, &s->mu);
    pthread_mutex_unlock(&s->mu);
    MHD_stop_daemon(d);
    fprintf(stderr, "[llm serve] drained; bye\n");
    pthread_mutex_destroy(&s->tok_mu);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->idle);
    free(s);
    return 0;
}
