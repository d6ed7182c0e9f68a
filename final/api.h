// api.h — the OpenAI API's request bodies and response JSON, as pure functions (no sockets, no
// engine): what `llm serve` (server.c) parses and writes, and what the request fuzzer drives.
// defines: ApiKind, ApiError, ApiRequest, api_parse_request, api_request_free, api_error,
//          api_error_json, api_stop_find, api_stop_holdback, api_logprobs_json, api_usage_json,
//          API_MAX_STOP
//
// POST /v1/completions and /v1/chat/completions take a JSON object. api_parse_request checks every
// field it knows (its type, its range) and fills an ApiRequest, or fills an ApiError with the
// HTTP status (400), the OpenAI error type and the parameter at fault:
//   model, prompt (a string, a list of one string, a list of ids, a list of one list of ids) or
//   messages (role + content: a string or a list of {"type": "text", "text": ...} parts),
//   max_tokens (chat also max_completion_tokens), temperature, top_p, top_k, min_p, seed, stop (a
//   string or a list of them), ignore_eos, n (1 only), logprobs (completions: an int 0..20; chat:
//   a bool, with top_logprobs 0..20), return_tokens_as_token_ids (vLLM's: logprobs name each token
//   "token_id:N"), stream, stream_options.include_usage, and, as vLLM's client
//   sends them, repetition/presence/frequency penalties at their neutral values. null is "not given"
//   for every field. Unknown fields are ignored (clients send user, metadata, ...).
//
//   ApiRequest r; ApiError err;
//   if (api_parse_request(API_COMPLETIONS, body, len, &r, &err) != 0) reply(err.status, api_error_json(&err));
//
// Run the fuzzer over it: make fuzz FUZZ_TARGETS=request
#pragma once
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "chat_template.h"
#include "tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { API_COMPLETIONS = 0, API_CHAT } ApiKind;

enum { API_MAX_STOP = 16, API_MAX_LOGPROBS = 20 };
enum { API_GAVE_TEMPERATURE = 1, API_GAVE_TOP_P = 2, API_GAVE_TOP_K = 4, API_GAVE_MIN_P = 8 };

// An error the way the OpenAI API returns it: {"error": {"message", "type", "param", "code"}}.
typedef struct {
    int status;         // HTTP status (also "code")
    char type[40];      // "invalid_request_error", "authentication_error", "not_found_error", ...
    char param[40];     // the field at fault, "" when none
    char message[400];
} ApiError;

typedef struct {
    ApiKind kind;
    char *model;                 // NULL when not given
    char *prompt;                // completions: the prompt text, or NULL when given as ids
    size_t prompt_len;           // its bytes (a text prompt may hold NUL characters: "\u0000")
    int *prompt_ids, n_prompt_ids;
    ChatMessage *msgs;           // chat: (n_msgs) role and content (both malloc'ed)
    int n_msgs;
    int max_tokens;              // -1: not given (the room left in the context)
    float temperature, top_p, min_p;  // defaults 1, 1, 0
    int top_k;                   // 0: off (-1 in a request means off too)
    int given;                   // which of the four the request gave (API_GAVE_*): the server's defaults fill the others
    int has_seed;
    uint64_t seed;
    char *stop[API_MAX_STOP];    // stop strings (non-empty)
    int n_stop;
    int ignore_eos, stream, include_usage;
    int logprobs;                // -1: none; else the top-N alternatives per token (0 .. 20)
    int tokens_as_ids;           // return_tokens_as_token_ids (vLLM's): logprobs name tokens "token_id:N"
} ApiRequest;

// Parses body[0..len) as a request of this kind. 0, or -1 with *err filled (status 400); on -1
// nothing needs freeing. (The model name, the prompt's length and the chat template are the
// server's to check.)
int api_parse_request(ApiKind kind, const char *body, size_t len, ApiRequest *r, ApiError *err);
void api_request_free(ApiRequest *r);

// Fills *err (status, type, param or NULL, printf message); returns -1.
int api_error(ApiError *err, int status, const char *type, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
// {"error": {...}} (malloc'ed).
char *api_error_json(const ApiError *err);

// Stop strings over generated text t[0..n): the earliest position where one of them starts
// (searched from `from`, which may be any earlier offset), or -1.
long api_stop_find(const char *t, size_t n, size_t from, char *const *stop, int n_stop);
// How many bytes at the end of t[0..n) could be the beginning of a stop string (they are held
// back from a stream until the next tokens tell).
size_t api_stop_holdback(const char *t, size_t n, char *const *stop, int n_stop);

// The logprobs of n generated tokens (ids; lp: (n); top_ids, top_lp: (n, n_top)) in the response's
// shape: completions {"tokens", "token_logprobs", "top_logprobs", "text_offset"} (text_offset from
// offset0); chat {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}. A token's text
// is its decoded bytes (invalid UTF-8 as U+FFFD), or "token_id:N" when tok is NULL.
json_t *api_logprobs_json(ApiKind kind, const Tokenizer *tok, const int *ids, const float *lp, const int *top_ids,
                          const float *top_lp, int n, int n_top, long offset0);
// {"prompt_tokens", "total_tokens", "completion_tokens"}
json_t *api_usage_json(int prompt_tokens, int completion_tokens);

#ifdef __cplusplus
}
#endif
