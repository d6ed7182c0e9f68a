// server.h — `llm serve`: the OpenAI-compatible HTTP server in front of the engine (libmicrohttpd).
// defines: ServerConfig, server_catch_signals, server_run
//
// Endpoints: POST /v1/completions, POST /v1/chat/completions (stream or not), GET /v1/models,
// GET /health, GET /metrics (Prometheus text, vLLM's metric names). Concurrency: one engine thread
// runs the model (engine.h); every HTTP connection has
// a thread of its own (libmicrohttpd's thread-per-connection mode) that parses and validates the
// body (api.h), tokenizes, submits to the engine's bounded queue, and then blocks in engine_read
// with a timeout, turning the tokens into text (incremental detokenization, stop strings) and
// writing them to its socket. An HTTP thread never runs the model and the engine never waits on a
// socket. A client that goes away (its socket closes: polled between reads, or a write fails)
// gets its request cancelled and released: the engine frees its KV at its next step.
//
//   server_catch_signals();            // first: SIGTERM / SIGINT start the drain from then on
//   ... load the model, engine_new ...
//   server_run(&cfg, engine, tok, ct, vocab);   // returns after SIGTERM / SIGINT, drained
#pragma once
#include "chat_template.h"
#include "final/engine.h"
#include "tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    const char *host;        // address to bind (default 127.0.0.1)
    int port;                // 0: any free port (the one bound is printed)
    const char *api_key;     // NULL: none; else /v1/* needs "Authorization: Bearer <key>"
    const char *model_name;  // the name served in /v1/models and checked against "model"
    int max_model_len;       // prompt + max_tokens at most
    int max_num_seqs;        // the engine's running sequences at most
    int max_queue;           // requests beyond max_num_seqs that may wait; more get 503 + Retry-After
    long max_body;           // request bodies larger than this get 413
    int max_connections;     // open connections at most (each has a thread)
    // sampling defaults for the requests that do not say (vLLM's rule: the model's
    // generation_config.json temperature / top_p / top_k / min_p, else 1, 1, off, off)
    float temperature, top_p, min_p;
    int top_k;
} ServerConfig;

// SIGTERM and SIGINT from now on ask server_run to drain (a handler posts a semaphore, whichever
// thread takes the signal: OpenBLAS's and CUDA's threads included); SIGPIPE is ignored. Call it
// before loading the model, so that a SIGTERM during the load is not fatal either.
void server_catch_signals(void);
// Serves until SIGTERM or SIGINT, then drains: stops accepting connections, answers 503 to new
// requests on open ones, waits for the requests in flight to finish, and returns 0 (1 when the
// server could not start, with a message on stderr). tok: NULL refuses text prompts; ct: NULL
// refuses chat requests. The engine is the caller's to free.
int server_run(const ServerConfig *c, Engine *e, Tokenizer *tok, const ChatTemplate *ct, int vocab);

#ifdef __cplusplus
}
#endif
