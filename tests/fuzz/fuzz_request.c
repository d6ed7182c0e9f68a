// fuzz_request.c — libFuzzer target for the OpenAI request parser of `llm serve` (final/api.c).
// The first input byte picks the endpoint (even: /v1/completions, odd: /v1/chat/completions), the
// rest is the request body. api_parse_request must return 0 or -1 on anything, never crash, leak
// or read outside the input, and keep its promises, checked on every input:
//   - refused: status 400, a non-empty message, and api_error_json gives a JSON object whose
//     error.code is the status;
//   - accepted: exactly one prompt form (text or ids, completions) or >= 1 message (chat), every
//     field in its documented range, stop strings non-empty and at most API_MAX_STOP;
//   - the stop-string helpers over the body itself: a match found is a match, the earliest one,
//     and what is held back is a proper prefix of some stop string;
//   - the logprobs JSON of the prompt ids (tokens named "token_id:N") has one entry per token.
//   make fuzz FUZZ_TARGETS=request                   # FUZZ_SECONDS, default 60
//   build/fuzz/fuzz_request -max_total_time=600 build/fuzz/corpus_request tests/fuzz/seeds_request
#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "final/api.h"

static void check(int ok) {
    if (!ok) abort();
}

static void check_stops(const char *t, size_t n, char *const *stop, int n_stop) {
    const long p = api_stop_find(t, n, 0, stop, n_stop);
    check(p >= -1 && p <= (long)n);
    int matched = 0;
    for (int k = 0; k < n_stop; k++) {
        const size_t ls = strlen(stop[k]);
        if (p >= 0 && (size_t)p + ls <= n && !memcmp(t + p, stop[k], ls)) matched = 1;
        for (size_t q = 0; q + ls <= n && (p < 0 || (long)q < p); q++) check(memcmp(t + q, stop[k], ls) != 0);  // none earlier
    }
    check(p < 0 || matched);
    const size_t h = api_stop_holdback(t, n, stop, n_stop);
    check(h <= n);
    if (h > 0) {
        int prefix = 0;
        for (int k = 0; k < n_stop; k++) prefix |= h < strlen(stop[k]) && !memcmp(t + n - h, stop[k], h);
        check(prefix);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const ApiKind kind = data[0] & 1 ? API_CHAT : API_COMPLETIONS;
    const char *body = (const char *)data + 1;
    const size_t len = size - 1;
    ApiRequest r;
    ApiError err;
    memset(&err, 0, sizeof err);
    const int rc = api_parse_request(kind, body, len, &r, &err);
    check(rc == 0 || rc == -1);
    if (rc != 0) {
        check(err.status == 400 && err.message[0] && memchr(err.message, 0, sizeof err.message));
        char *js = api_error_json(&err);
        json_error_t je;
        json_t *o = json_loads(js, 0, &je);
        check(o && json_integer_value(json_object_get(json_object_get(o, "error"), "code")) == 400);
        json_decref(o);
        free(js);
        return 0;
    }
    check(r.kind == kind);
    if (kind == API_COMPLETIONS) check((r.prompt != NULL) != (r.n_prompt_ids > 0) && r.n_msgs == 0);
    else check(r.n_msgs >= 1 && r.msgs && !r.prompt && r.n_prompt_ids == 0);
    for (int i = 0; i < r.n_msgs; i++) check(r.msgs[i].role != NULL);
    for (int i = 0; i < r.n_prompt_ids; i++) check(r.prompt_ids[i] >= 0);
    check(r.max_tokens == -1 || r.max_tokens >= 1);
    check(r.temperature >= 0 && r.top_p > 0 && r.top_p <= 1 && r.min_p >= 0 && r.min_p <= 1 && r.top_k >= 0);
    check(r.logprobs >= -1 && r.logprobs <= API_MAX_LOGPROBS);
    check(r.n_stop >= 0 && r.n_stop <= API_MAX_STOP);
    for (int i = 0; i < r.n_stop; i++) check(r.stop[i] && r.stop[i][0]);
    check(!r.include_usage || r.stream);
    if (r.n_stop) check_stops(body, len, r.stop, r.n_stop);
    if (r.n_prompt_ids > 0) {
        const int n = r.n_prompt_ids < 64 ? r.n_prompt_ids : 64, nt = 2;
        float lp[64], top_lp[64 * 2];
        int top_ids[64 * 2];
        for (int i = 0; i < n; i++) lp[i] = -(float)i, top_ids[2 * i] = top_ids[2 * i + 1] = r.prompt_ids[i], top_lp[2 * i] = top_lp[2 * i + 1] = 0;
        json_t *o = api_logprobs_json(kind, NULL, r.prompt_ids, lp, top_ids, top_lp, n, nt, 0);
        const json_t *a = kind == API_CHAT ? json_object_get(o, "content") : json_object_get(o, "tokens");
        check(json_array_size(a) == (size_t)n);
        json_decref(o);
    }
    api_request_free(&r);
    return 0;
}
