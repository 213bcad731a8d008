/* tiermoe serve: an OpenAI-compatible HTTP server over one model context
 * (docs/server.md).
 *
 *   handler threads (libmicrohttpd, one a connection)      worker thread (owns the context)
 *   parse + validate the request, tokenize  ──job──►  FIFO  ──►  prompt (prefix reuse), decode,
 *   wait for the reply, or stream its SSE bytes  ◄─────────────  sample, stop strings, SSE chunks
 *
 * One request is generated at a time, in arrival order; between requests the
 * worker lets the VRAM cache's updater exchange weak slots. A client that
 * disconnects cancels its request. The live expert counters (the tracer) and
 * the tier's counters are read by handler threads under the worker's step
 * lock, so they change while a request streams.
 *
 * Files: http.c (the daemon, routes, bodies, auth, errors, streaming),
 * queue.c (jobs, the FIFO and the worker), generate.c (one generation: prefix
 * reuse, sampling, stop strings), openai.c (the OpenAI endpoints, tokenize),
 * perf.c (/moe-layer-perf, /moe-hot-cache), metrics.c (/metrics). */
#ifndef TM_SERVER_SERVER_H
#define TM_SERVER_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tiermoe.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tm_server_params {
    const char *host;       /* address to bind (NULL: 127.0.0.1) */
    int port;               /* 0: any free port (server_port tells which) */
    const char *api_key;    /* NULL: none; else every endpoint but /health needs
                                "Authorization: Bearer KEY" */
    const char *alias;      /* names a request's "model" may give, comma-separated, the first
                               the id in /v1/models (NULL: the file's base name is the id) */
    int parallel;           /* slots: sequences decoded together, each with n_ctx / parallel
                               positions of the KV cache (0: 1; at most TM_SERVER_MAX_PARALLEL) */
    size_t max_body;        /* request body bytes (0: 8 MiB) */
    int64_t max_prompt;     /* prompt tokens (0: the context size less one) */
    int64_t max_tokens;     /* the largest max_tokens a request may ask for (0: the context size) */
    int64_t default_tokens; /* max_tokens when a request gives none (0: the context size) */
    int max_queue;          /* requests waiting (0: 64); more get 503 */
    int max_connections;    /* requests served at once (0: 64); more get 503 but /health.
                               libmicrohttpd holds up to twice as many connections */
    int max_per_ip;         /* connections from one address (0: 1.5 x max_connections) */
    int read_timeout;       /* seconds to receive a request, headers and body, from the
                               connection's start or the previous reply's end (0: 10) */
    const char *cors_origin;    /* origins (comma-separated, "*": any) whose pages may send
                                requests: CORS headers, and POSTs from them accepted */
    tm_sampler_params sampling; /* defaults for what a request does not set */
    bool seed_given;            /* sampling.seed applies to requests without a seed; else each
                                   gets a fresh seed */
    const char *chat_template;  /* a chat format name overriding the model's (NULL: detect) */
    bool no_trace;              /* no expert counters: /moe-layer-perf answers 409 (full-GPU
                                   decode keeps its CUDA graph); else they are on, and their
                                   summary is printed at the stop */
    bool trace_names;           /* --expert-trace-names: a line per routed slot */
    bool trace_per_layer;       /* the summary with its per-layer table */
    const char *trace_output;   /* --expert-trace-output: the learn file written at the stop */
    bool quiet;                 /* no line per request on stderr */
} tm_server_params;

typedef struct tm_server tm_server;

#define TM_SERVER_MAX_PARALLEL 256

/* The server is a client of the library: it uses include/tiermoe.h alone.
 * Its functions' messages (server_error_message) are its own; where the
 * library failed, they are the library's message. */

/* The message of this thread's last failing server_ call. */
const char *server_error_message(void);

/* Bind the address and start answering (/health says "loading" until
 * server_load finishes). TM_ERR_IO naming the address when it cannot bind;
 * TM_ERR_ARG for bad parameters (--parallel out of range, an unknown chat
 * template). */
tm_status server_create(const tm_server_params *p, tm_server **out);
/* The port bound (the one chosen when params.port was 0). */
int server_port(const tm_server *s);

/* Hand the server a model loaded by tm_model_load, with a vocabulary (it
 * stays the caller's and must outlive the server), and the context's options
 * (n_seq, expert_stats and expert_trace_names are the server's): a worker
 * thread creates the context and serves the queue. Returns once the context
 * exists, or with its error (then /health says "error"). */
tm_status server_load(tm_server *s, tm_model *m, const tm_context_opts *o);

/* Stop: no new connections, queued requests answered 503, the running one
 * cancelled, connections closed, the worker joined. Prints the expert
 * counters' summary and writes trace_output when one was asked for (the
 * error of that, if any). */
tm_status server_stop(tm_server *s);
void server_free(tm_server *s);

#ifdef __cplusplus
}
#endif
#endif
