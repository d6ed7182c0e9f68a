// api.c — see api.h.
#include "api.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

static char *xstrdup(const char *s) {
    const size_t n = strlen(s) + 1;
    return memcpy(xmalloc(n), s, n);
}

int api_error(ApiError *err, int status, const char *type, const char *param, const char *fmt, ...) {
    err->status = status;
    snprintf(err->type, sizeof err->type, "%s", type);
    snprintf(err->param, sizeof err->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return -1;
}

char *api_error_json(const ApiError *err) {
    json_t *e = json_object();
    json_object_set_new(e, "message", json_string(err->message));
    json_object_set_new(e, "type", json_string(err->type));
    json_object_set_new(e, "param", err->param[0] ? json_string(err->param) : json_null());
    json_object_set_new(e, "code", json_integer(err->status));
    json_t *o = json_object();
    json_object_set_new(o, "error", e);
    char *s = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    return s;
}

static int bad(ApiError *err, const char *param, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int bad(ApiError *err, const char *param, const char *fmt, ...) {
    char msg[sizeof err->message];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return api_error(err, 400, "invalid_request_error", param, "%s", msg);
}

// A field that is absent or null: NULL.
static json_t *field(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return v && !json_is_null(v) ? v : NULL;
}

static int get_number(json_t *o, const char *key, double lo, double hi, float *out, ApiError *err) {
    json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_number(v)) return bad(err, key, "%s must be a number", key);
    const double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return bad(err, key, "%s must be in [%g, %g], got %g", key, lo, hi, x);
    *out = (float)x;
    return 0;
}

static int get_int(json_t *o, const char *key, long long lo, long long hi, long long *out, ApiError *err) {
    json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_integer(v)) return bad(err, key, "%s must be an integer", key);
    const long long x = json_integer_value(v);
    if (x < lo || x > hi) return bad(err, key, "%s must be in [%lld, %lld], got %lld", key, lo, hi, x);
    *out = x;
    return 0;
}

static int get_bool(json_t *o, const char *key, int *out, ApiError *err) {
    json_t *v = field(o, key);
    if (!v) return 0;
    if (!json_is_boolean(v)) return bad(err, key, "%s must be a boolean", key);
    *out = json_is_true(v);
    return 0;
}

// A list of ids into r->prompt_ids; -1 with err when it is not one.
static int id_list(json_t *a, ApiRequest *r, ApiError *err) {
    const size_t n = json_array_size(a);
    if (n == 0) return bad(err, "prompt", "prompt must not be empty");
    r->prompt_ids = xmalloc(n * sizeof(int));
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(a, i);
        if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > 0x7fffffff)
            return bad(err, "prompt", "prompt[%zu] is not a token id (a non-negative integer)", i);
        r->prompt_ids[i] = (int)json_integer_value(x);
    }
    r->n_prompt_ids = (int)n;
    return 0;
}

// A JSON string's bytes, NUL characters ("\u0000") included, NUL-terminated (malloc'ed).
static char *xstrdup_json(json_t *s, size_t *len) {
    *len = json_string_length(s);
    char *d = xmalloc(*len + 1);
    memcpy(d, json_string_value(s), *len);
    d[*len] = 0;
    return d;
}
// A string the C side reads up to its first NUL (chat roles and contents: the chat template
// renders C strings; stop strings): one with "\u0000" in it is refused, not cut short.
static int has_nul(json_t *s) { return strlen(json_string_value(s)) != json_string_length(s); }

static int parse_prompt(json_t *p, ApiRequest *r, ApiError *err) {
    if (!p) return bad(err, "prompt", "prompt is required");
    if (json_is_string(p)) {
        r->prompt = xstrdup_json(p, &r->prompt_len);
        return 0;
    }
    if (!json_is_array(p)) return bad(err, "prompt", "prompt must be a string, a list of token ids, or a list of one of either");
    if (json_array_size(p) == 0) return bad(err, "prompt", "prompt must not be empty");
    json_t *first = json_array_get(p, 0);
    if (json_is_integer(first)) return id_list(p, r, err);
    if (json_array_size(p) > 1) return bad(err, "prompt", "one prompt per request (a list of %zu prompts was given)", json_array_size(p));
    if (json_is_string(first)) {
        r->prompt = xstrdup_json(first, &r->prompt_len);
        return 0;
    }
    if (json_is_array(first)) return id_list(first, r, err);
    return bad(err, "prompt", "prompt must be a string, a list of token ids, or a list of one of either");
}

// A message's content: a string, or a list of text parts joined by newlines (vLLM's rule).
static int content_text(json_t *c, size_t i, char **out, ApiError *err) {
    if (!c) {
        *out = NULL;
        return 0;
    }
    if (json_is_string(c)) {
        if (has_nul(c)) return bad(err, "messages", "messages[%zu].content holds a NUL character (\\u0000)", i);
        *out = xstrdup(json_string_value(c));
        return 0;
    }
    if (!json_is_array(c)) return bad(err, "messages", "messages[%zu].content must be a string or a list of text parts", i);
    size_t len = 0, np = json_array_size(c);
    for (size_t k = 0; k < np; k++) {
        json_t *part = json_array_get(c, k), *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
        if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text") || !json_is_string(text))
            return bad(err, "messages", "messages[%zu].content[%zu]: only {\"type\": \"text\", \"text\": ...} parts are supported", i, k);
        if (has_nul(text)) return bad(err, "messages", "messages[%zu].content[%zu] holds a NUL character (\\u0000)", i, k);
        len += json_string_length(text) + 1;
    }
    char *s = xmalloc(len + 1);
    size_t o = 0;
    for (size_t k = 0; k < np; k++) {
        json_t *text = json_object_get(json_array_get(c, k), "text");
        if (k) s[o++] = '\n';
        memcpy(s + o, json_string_value(text), json_string_length(text));
        o += json_string_length(text);
    }
    s[o] = 0;
    *out = s;
    return 0;
}

static int parse_messages(json_t *m, ApiRequest *r, ApiError *err) {
    if (!m) return bad(err, "messages", "messages is required");
    if (!json_is_array(m) || json_array_size(m) == 0) return bad(err, "messages", "messages must be a non-empty list");
    const size_t n = json_array_size(m);
    r->msgs = xcalloc(n, sizeof(ChatMessage));
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(m, i), *role = json_object_get(x, "role");
        if (!json_is_object(x) || !json_is_string(role)) return bad(err, "messages", "messages[%zu] needs a role (a string)", i);
        if (has_nul(role)) return bad(err, "messages", "messages[%zu].role holds a NUL character (\\u0000)", i);
        char *content = NULL;
        if (content_text(field(x, "content"), i, &content, err) != 0) return -1;
        r->msgs[i].role = xstrdup(json_string_value(role));
        r->msgs[i].content = content;
        r->n_msgs = (int)i + 1;
    }
    return 0;
}

static int parse_stop(json_t *s, ApiRequest *r, ApiError *err) {
    if (!s) return 0;
    if (json_is_string(s)) {
        if (has_nul(s)) return bad(err, "stop", "a stop string holds a NUL character (\\u0000)");
        if (json_string_length(s) > 0) r->stop[r->n_stop++] = xstrdup(json_string_value(s));
        return 0;
    }
    if (!json_is_array(s)) return bad(err, "stop", "stop must be a string or a list of strings");
    if (json_array_size(s) > API_MAX_STOP) return bad(err, "stop", "at most %d stop strings", API_MAX_STOP);
    for (size_t i = 0; i < json_array_size(s); i++) {
        json_t *x = json_array_get(s, i);
        if (!json_is_string(x)) return bad(err, "stop", "stop[%zu] is not a string", i);
        if (has_nul(x)) return bad(err, "stop", "stop[%zu] holds a NUL character (\\u0000)", i);
        if (json_string_length(x) > 0) r->stop[r->n_stop++] = xstrdup(json_string_value(x));
    }
    return 0;
}

// The options every request has.
static int parse_common(json_t *o, ApiRequest *r, ApiError *err) {
    json_t *model = field(o, "model");
    if (model && (!json_is_string(model) || has_nul(model))) return bad(err, "model", "model must be a string (without NUL characters)");
    if (model) r->model = xstrdup(json_string_value(model));
    long long v = -1;
    const char *mt_key = r->kind == API_CHAT && field(o, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    if (get_int(o, mt_key, 1, 1 << 24, &v, err) != 0) return -1;
    r->max_tokens = (int)v;
    if (get_number(o, "temperature", 0, 1e4, &r->temperature, err) != 0) return -1;
    if (get_number(o, "top_p", 0, 1, &r->top_p, err) != 0) return -1;
    if (field(o, "top_p") && !(r->top_p > 0)) return bad(err, "top_p", "top_p must be in (0, 1]");
    if (get_number(o, "min_p", 0, 1, &r->min_p, err) != 0) return -1;
    v = 0;
    if (get_int(o, "top_k", -1, 1 << 30, &v, err) != 0) return -1;
    r->top_k = v < 0 ? 0 : (int)v;
    r->given = (field(o, "temperature") ? API_GAVE_TEMPERATURE : 0) | (field(o, "top_p") ? API_GAVE_TOP_P : 0) |
               (field(o, "top_k") ? API_GAVE_TOP_K : 0) | (field(o, "min_p") ? API_GAVE_MIN_P : 0);
    json_t *seed = field(o, "seed");
    if (seed) {
        if (!json_is_integer(seed)) return bad(err, "seed", "seed must be an integer");
        r->has_seed = 1, r->seed = (uint64_t)json_integer_value(seed);
    }
    if (parse_stop(field(o, "stop"), r, err) != 0) return -1;
    if (get_bool(o, "ignore_eos", &r->ignore_eos, err) != 0) return -1;
    if (get_bool(o, "stream", &r->stream, err) != 0) return -1;
    json_t *so = field(o, "stream_options");
    if (so) {
        if (!json_is_object(so)) return bad(err, "stream_options", "stream_options must be an object");
        if (!r->stream) return bad(err, "stream_options", "stream_options is only allowed with stream = true");
        if (get_bool(so, "include_usage", &r->include_usage, err) != 0) return -1;
    }
    v = 1;
    if (get_int(o, "n", 1, 1, &v, err) != 0) return bad(err, "n", "n must be 1 (one completion per request)");
    v = 1;
    if (get_int(o, "best_of", 1, 1, &v, err) != 0) return bad(err, "best_of", "best_of must be 1");
    // penalties: only their neutral values (vLLM's client sends repetition_penalty 1.0)
    static const struct {
        const char *key;
        double neutral;
    } pen[] = {{"repetition_penalty", 1}, {"presence_penalty", 0}, {"frequency_penalty", 0}};
    for (size_t i = 0; i < sizeof pen / sizeof pen[0]; i++) {
        float x = (float)pen[i].neutral;
        if (get_number(o, pen[i].key, -1e9, 1e9, &x, err) != 0) return -1;
        if (x != (float)pen[i].neutral) return bad(err, pen[i].key, "%s is not supported (only %g)", pen[i].key, pen[i].neutral);
    }
    if (get_bool(o, "return_tokens_as_token_ids", &r->tokens_as_ids, err) != 0) return -1;
    json_t *lb = field(o, "logit_bias");
    if (lb && !(json_is_object(lb) && json_object_size(lb) == 0)) return bad(err, "logit_bias", "logit_bias is not supported");
    return 0;
}

int api_parse_request(ApiKind kind, const char *body, size_t len, ApiRequest *r, ApiError *err) {
    memset(r, 0, sizeof *r);
    r->kind = kind, r->max_tokens = -1, r->temperature = 1, r->top_p = 1, r->logprobs = -1;
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_ALLOW_NUL, &je);  // "\u0000" in a prompt: a random-token prompt may hold it
    if (!o) return bad(err, NULL, "the body is not JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    int rc = -1;
    if (!json_is_object(o)) {
        bad(err, NULL, "the body must be a JSON object");
        goto out;
    }
    if (parse_common(o, r, err) != 0) goto out;
    if (kind == API_COMPLETIONS) {
        if (parse_prompt(field(o, "prompt"), r, err) != 0) goto out;
        long long lp = -1;
        if (get_int(o, "logprobs", 0, API_MAX_LOGPROBS, &lp, err) != 0) goto out;
        r->logprobs = (int)lp;
        int echo = 0;
        if (get_bool(o, "echo", &echo, err) != 0) goto out;
        if (echo) {
            bad(err, "echo", "echo is not supported");
            goto out;
        }
        if (field(o, "suffix")) {
            bad(err, "suffix", "suffix is not supported");
            goto out;
        }
    } else {
        if (parse_messages(field(o, "messages"), r, err) != 0) goto out;
        int want = 0;
        if (get_bool(o, "logprobs", &want, err) != 0) goto out;
        long long top = 0;
        if (get_int(o, "top_logprobs", 0, API_MAX_LOGPROBS, &top, err) != 0) goto out;
        if (field(o, "top_logprobs") && !want) {
            bad(err, "top_logprobs", "top_logprobs needs logprobs = true");
            goto out;
        }
        r->logprobs = want ? (int)top : -1;
    }
    rc = 0;
out:
    json_decref(o);
    if (rc != 0) api_request_free(r);
    return rc;
}

void api_request_free(ApiRequest *r) {
    free(r->model), free(r->prompt), free(r->prompt_ids);
    for (int i = 0; i < r->n_msgs; i++) free((char *)r->msgs[i].role), free((char *)r->msgs[i].content);
    free(r->msgs);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    memset(r, 0, sizeof *r);
}

long api_stop_find(const char *t, size_t n, size_t from, char *const *stop, int n_stop) {
    long best = -1;
    for (int k = 0; k < n_stop; k++) {
        const size_t ls = strlen(stop[k]);
        for (size_t p = from; p + ls <= n; p++) {
            if (best >= 0 && (long)p >= best) break;
            if (!memcmp(t + p, stop[k], ls)) {
                best = (long)p;
                break;
            }
        }
    }
    return best;
}

size_t api_stop_holdback(const char *t, size_t n, char *const *stop, int n_stop) {
    size_t hold = 0;
    for (int k = 0; k < n_stop; k++) {
        const size_t ls = strlen(stop[k]);
        for (size_t m = ls - 1 < n ? ls - 1 : n; m > hold; m--)  // the longest suffix that is a proper prefix
            if (!memcmp(t + n - m, stop[k], m)) {
                hold = m;
                break;
            }
    }
    return hold;
}

static json_t *bytes_json(const char *s, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer((unsigned char)s[i]));
    return a;
}

// A token's text (malloc'ed; its raw bytes in *raw when raw != NULL, malloc'ed, *nraw of them).
static char *token_text(const Tokenizer *tok, int id, char **raw, size_t *nraw) {
    const int32_t i32 = id;
    size_t n = 0;
    char *s = tok ? tokenizer_decode(tok, &i32, 1, 0, &n) : NULL;
    if (!s) {
        char buf[32];
        n = (size_t)snprintf(buf, sizeof buf, "token_id:%d", id);
        s = xstrdup(buf);
    }
    if (raw) *raw = xmalloc(n + 1), memcpy(*raw, s, n + 1), *nraw = n;
    return s;
}

static json_t *lp_value(float x) { return json_real(isfinite(x) ? x : -9999.0); }  // JSON has no -inf

json_t *api_logprobs_json(ApiKind kind, const Tokenizer *tok, const int *ids, const float *lp, const int *top_ids,
                          const float *top_lp, int n, int n_top, long offset0) {
    if (kind == API_CHAT) {
        json_t *content = json_array();
        for (int i = 0; i < n; i++) {
            json_t *e = json_object(), *tops = json_array();
            char *raw;
            size_t nraw;
            char *t = token_text(tok, ids[i], &raw, &nraw);
            json_object_set_new(e, "token", json_string(t));
            json_object_set_new(e, "logprob", lp_value(lp[i]));
            json_object_set_new(e, "bytes", bytes_json(raw, nraw));
            free(t), free(raw);
            for (int k = 0; k < n_top; k++) {
                json_t *x = json_object();
                t = token_text(tok, top_ids[(size_t)i * n_top + k], &raw, &nraw);
                json_object_set_new(x, "token", json_string(t));
                json_object_set_new(x, "logprob", lp_value(top_lp[(size_t)i * n_top + k]));
                json_object_set_new(x, "bytes", bytes_json(raw, nraw));
                free(t), free(raw);
                json_array_append_new(tops, x);
            }
            json_object_set_new(e, "top_logprobs", tops);
            json_array_append_new(content, e);
        }
        json_t *o = json_object();
        json_object_set_new(o, "content", content);
        return o;
    }
    json_t *tokens = json_array(), *tlp = json_array(), *tops = json_array(), *offs = json_array();
    long off = offset0;
    for (int i = 0; i < n; i++) {
        char *t = token_text(tok, ids[i], NULL, NULL);
        json_array_append_new(tokens, json_string(t));
        json_array_append_new(tlp, lp_value(lp[i]));
        json_array_append_new(offs, json_integer(off));
        off += (long)strlen(t);
        free(t);
        json_t *d = json_object();
        for (int k = 0; k < n_top; k++) {
            char *s = token_text(tok, top_ids[(size_t)i * n_top + k], NULL, NULL);
            if (!json_object_get(d, s)) json_object_set_new(d, s, lp_value(top_lp[(size_t)i * n_top + k]));
            free(s);
        }
        json_array_append_new(tops, d);
    }
    json_t *o = json_object();
    json_object_set_new(o, "tokens", tokens);
    json_object_set_new(o, "token_logprobs", tlp);
    json_object_set_new(o, "top_logprobs", tops);
    json_object_set_new(o, "text_offset", offs);
    return o;
}

json_t *api_usage_json(int prompt_tokens, int completion_tokens) {
    json_t *u = json_object();
    json_object_set_new(u, "prompt_tokens", json_integer(prompt_tokens));
    json_object_set_new(u, "total_tokens", json_integer(prompt_tokens + completion_tokens));
    json_object_set_new(u, "completion_tokens", json_integer(completion_tokens));
    return u;
}
