/* What the server's files share: the server struct, jobs and the queue,
 * requests and replies, one generation, the endpoints' handlers. Nothing
 * outside src/server includes it. */
#ifndef TM_SERVER_SERVER_INTERNAL_H
#define TM_SERVER_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>
#include <microhttpd.h>

#include "server.h"

#define SRV_MAX_STOP       4   /* stop strings a request may give (OpenAI's limit) */
#define SRV_MAX_STOP_LEN   256 /* bytes of one */
#define SRV_WAIT_MS        100 /* how often a waiting handler looks for a closed connection */
#define SRV_WATCH_TICK_MS  100 /* how often the read deadlines are looked at */
#define SRV_RETRY_AFTER    "1" /* seconds a 503 asks the client to wait */
#define SRV_IDLE_TIMEOUT_S 600 /* a connection sending and receiving nothing (a stream's wait) */
#define TM_SERVER_VERSION  "0.1.0"

typedef enum srv_state { SRV_LOADING, SRV_READY, SRV_ERROR } srv_state;

/* ---- the server's messages (error.c) ---- */
/* Set this thread's message (server_error_message); returns st. */
tm_status srv_error_set(tm_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* After a library call: on a failure its message becomes the server's; returns st. */
tm_status srv_error_api(tm_status st);
/* Nanoseconds of a monotonic clock. */
uint64_t srv_time_ns(void);

/* ---- counters behind /metrics (metrics.c) ---- */
typedef enum srv_outcome { SRV_OUTCOME_OK, SRV_OUTCOME_CANCELLED, SRV_OUTCOME_ERROR } srv_outcome;
typedef struct srv_counts {
    uint64_t http[600];   /* replies by status code */
    uint64_t requests[3]; /* generations by srv_outcome */
    uint64_t prompt_tokens, prompt_eval_tokens, gen_tokens;
    double prompt_s, gen_s;
    double last_prompt_tps, last_gen_tps;
    uint64_t decode_steps, decode_rows; /* batched decode steps and their rows */
    double decode_step_s;               /* in the engine's decode steps (what the slots wait besides
                             their own sampling and text: the server's share is the rest) */
    uint64_t prompt_steps, prompt_step_rows; /* prompt steps (every waiting prompt's next chunk
                                                together), their rows and */
    uint64_t prompt_step_seqs;               /* the prompts they held (one a step when alone) */
    double prompt_step_s;                    /* in the engine's prompt steps */
} srv_counts;
typedef struct srv_metrics {
    pthread_mutex_t mu;
    srv_counts c;
} srv_metrics;
void srv_metrics_init(srv_metrics *m);
void srv_metrics_free(srv_metrics *m);
void srv_metrics_http(srv_metrics *m, unsigned status);

/* ---- jobs and the queue (queue.c) ---- */
typedef struct srv_job srv_job;
typedef struct srv_slot srv_slot;
typedef void (*srv_job_fn)(tm_server *s, srv_job *j);
struct srv_job {
    srv_job_fn run;              /* a generation on its slot's thread, else on the worker's; ends
                                    with srv_job_finish */
    void (*release)(void *data); /* frees data with the job */
    void *data;
    bool generation;       /* runs on a slot; the updater runs after it */
    const int32_t *prompt; /* a generation's prompt (in data), to pick the slot that holds the */
    int64_t n_prompt;      /* longest prefix of it */
    srv_slot *slot;        /* the slot running it */
    srv_job *next;         /* in the queue */
    pthread_mutex_t mu;
    pthread_cond_t cv; /* bytes emitted, or done */
    int refs;
    bool done;
    atomic_bool cancel; /* the client left, or the server stops */
    char *out;          /* streamed bytes; the reader consumed out[0..out_pos) */
    size_t out_len, out_cap, out_pos;
    unsigned status; /* the reply's HTTP status once done */
    json_t *reply;   /* the reply once done (NULL for a stream) */
};
/* A job with one reference (the caller's); NULL out of memory. */
srv_job *srv_job_new(srv_job_fn run, void (*release)(void *), void *data);
void srv_job_ref(srv_job *j);
void srv_job_unref(srv_job *j);
/* Worker: append streamed bytes (wakes the reader). */
void srv_job_emit(srv_job *j, const char *data, size_t n);
/* Worker: the job is over; reply (may be NULL) is taken over. */
void srv_job_finish(srv_job *j, unsigned status, json_t *reply);
bool srv_job_cancelled(srv_job *j);
/* Queue a job (a reference is taken); 503 reasons as TM_ERR_ARG: the queue is
 * full or the server stops. */
tm_status srv_queue_push(tm_server *s, srv_job *j);
int srv_queue_depth(tm_server *s);
bool srv_queue_busy(tm_server *s);
/* Slots running a generation (a snapshot; takes q_mu). */
int srv_slots_busy(tm_server *s);

/* ---- slots and the worker (slots.c) ----
 * A slot (--parallel N of them) is one sequence of the context (its id): its KV
 * range, its tokens (prompt prefix reuse: tm_seq_prompt), its logits, and a thread that runs one
 * generation at a time. The worker thread owns the context: it hands queued
 * jobs to free slots (the one whose cached tokens share the longest prefix
 * with the prompt), evaluates the waiting prompts' chunks together in prompt
 * steps of up to the batch's rows, and runs decode steps of one row per
 * decoding slot, alternating the two when both wait. */
typedef enum srv_slot_req { SRV_SLOT_NONE, SRV_SLOT_EVAL, SRV_SLOT_PUSH } srv_slot_req;
struct srv_slot {
    tm_server *server;
    int id;
    float *logits;     /* [n_vocab]: of the slot's prompt (copied: steps may run while it
                          samples them) */
    const float *view; /* the logits to sample: logits, or the slot's row of the context's
                           last decode step (read in place, see viewing) */
    bool viewing;      /* under q_mu: view is in the context, which no step may overwrite
                           until the slot has sampled (srv_slot_post or srv_slot_end) */
    pthread_t thread;
    bool thread_started;
    pthread_cond_t cv; /* with q_mu: a job came, or the request was answered */
    srv_job *job;      /* running (NULL: free) */
    uint64_t last_used;
    /* under q_mu: a request to the worker and its answer */
    srv_slot_req req;
    const int32_t *ids; /* eval: the prompt */
    int64_t n_ids;
    bool fresh, eval_begun;
    int32_t tok;    /* push: the token */
    tm_status st;   /* the answer */
    int64_t n_eval; /* eval: prompt tokens evaluated */
    bool decoding;  /* its prompt is in: the decode steps wait for its token */
    char msg[512];  /* why the last request failed */
};
/* On a slot's thread: make its cache hold ids[0..n) (prefix reuse unless
 * fresh; *n_eval: tokens evaluated); its logits are then the last token's.
 * A cancelled job's prompt may stop between chunks (TM_OK). */
tm_status srv_slot_eval(tm_server *s, srv_slot *sl, const int32_t *ids, int64_t n, bool fresh,
                        int64_t *n_eval);
/* On a slot's thread: append tok in the next decode step (with the other slots');
 * post returns at once (the slot is done with sl->view), wait returns once the step
 * ran (its logits in sl->view). */
void srv_slot_post(tm_server *s, srv_slot *sl, int32_t tok);
tm_status srv_slot_wait(tm_server *s, srv_slot *sl);
/* On a slot's thread: it pushes no more (the decode steps stop waiting for it)
 * and its sequence is final: the slot is free again before the reply is done, so
 * a request sent as soon as the reply arrives finds the slot with its tokens
 * (freed after the reply, a quick follow-up went to another slot and kept none). */
void srv_slot_end(tm_server *s, srv_slot *sl);
/* Start the worker thread (creates the context and the slots, then serves);
 * returns once the context exists or failed. */
tm_status srv_worker_start(tm_server *s);
/* Refuse new jobs, answer the queued ones 503, cancel the running ones. */
void srv_worker_stop(tm_server *s);
/* Once no handler can read the context: the worker frees it and ends. */
void srv_worker_release(tm_server *s);

/* ---- read deadlines (watch.c) ---- */
typedef struct srv_watch_conn srv_watch_conn;
typedef struct srv_watch {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    srv_watch_conn *head; /* the open connections */
    int64_t timeout_ms;
    uint64_t n_cut;  /* connections cut at their deadline */
    char reply[384]; /* the 408 sent to a client whose headers did not come in time */
    pthread_t thread;
    bool inited, started, stop;
} srv_watch;
/* Start the thread that cuts connections past their deadline. */
tm_status srv_watch_start(srv_watch *w, int timeout_s);
/* After the daemon stopped (no connection left). */
void srv_watch_stop(srv_watch *w);
/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION callback (cls: the srv_watch). */
void srv_watch_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                      enum MHD_ConnectionNotificationCode code);
/* The request's headers are in (whole: all of it; no deadline until the
 * reply ends); false when the connection was cut at its deadline (then
 * answer nothing). */
bool srv_watch_progress(struct MHD_Connection *conn, bool whole);
/* The reply ended: the next request's deadline starts now. */
void srv_watch_next(struct MHD_Connection *conn);
uint64_t srv_watch_cut_count(srv_watch *w);

struct tm_server {
    tm_server_params p;
    char *host, *api_key, *alias, *chat_template, *cors_origin; /* owned copies of the params' */
    char **names; /* what a request's "model" may be (the first: the id); server_load */
    int n_names;
    struct MHD_Daemon *daemon;
    srv_watch watch;
    int port;
    int listen_fd;    /* MHD_quiesce_daemon's socket, closed after the daemon stops (-1: none) */
    atomic_int state; /* srv_state */
    char error[512];  /* why state is SRV_ERROR */
    atomic_bool stopping;
    atomic_int in_flight; /* requests received and not yet answered in full */
    /* the model (server_load) */
    tm_model *m;
    tm_model_info info;
    uint32_t n_tokens; /* the vocabulary's (ids a request may give /detokenize) */
    tm_context_opts opts;
    const char *chat;  /* the chat format: --chat-template's, else the model's (NULL: none) */
    bool chat_harmony; /* it has a developer role of its own */
    char model_name[256];
    int64_t created; /* unix time the model was loaded */
    int64_t n_ctx, n_batch, max_prompt, max_tokens, default_tokens;
    /* the queue */
    pthread_mutex_t q_mu;
    pthread_cond_t q_cv;
    srv_job *q_head, *q_tail;
    int q_len;
    int n_busy;      /* slots running a job, and a job on the worker */
    srv_slot *slots; /* [n_slots] */
    int n_slots;
    uint64_t slot_clock;             /* for the least recently used slot */
    bool update_pending;             /* a generation ended: the updater runs between steps */
    int prompt_next;                 /* prompts are served round robin from this slot */
    int32_t *batch_seqs, *batch_ids; /* [n_batch]: a prompt step's rows (the worker's) */
    bool last_was_decode;
    int n_viewing;   /* slots still to sample from the context's logits: no step until 0 */
    bool slots_exit; /* the slots' threads end */
    bool release;    /* the worker may free the context and end */
    pthread_t worker;
    bool worker_started;
    tm_status worker_status; /* the context's creation */
    bool worker_ready;
    /* the worker's; readers of the counters and the cache take step_mu */
    pthread_mutex_t step_mu;
    tm_context *ctx;
    bool counters;          /* the context counts expert selections (not --no-expert-trace) */
    bool has_cache;         /* some layer has VRAM cache slots */
    tm_status trace_status; /* the counters' summary and file at the stop */
    char trace_error[512];
    atomic_uint_fast64_t next_id;
    atomic_uint_fast64_t seed_counter;
    srv_metrics metrics;
};

/* ---- one generation (generate.c) ---- */
typedef struct srv_gen_params {
    int32_t *prompt; /* owned */
    int64_t n_prompt;
    int64_t max_tokens;
    tm_sampler_params sp;
    char *stop[SRV_MAX_STOP]; /* owned */
    int n_stop;
    bool ignore_eos;
    bool fresh; /* cache_prompt false: evaluate the whole prompt, reusing nothing */
} srv_gen_params;
void srv_gen_params_free(srv_gen_params *p);

typedef struct srv_gen_out {
    char *text; /* the reply (cut before a stop string), NUL-terminated */
    size_t len, cap;
    size_t sent;              /* bytes handed to the delta callback */
    int64_t n_prompt, n_eval; /* prompt tokens; those evaluated (the rest reused) */
    int64_t n_gen;            /* tokens sampled, an end-of-generation token not counted */
    const char *finish;       /* "stop", "length"; NULL when cancelled */
    double prompt_ms, gen_ms;
} srv_gen_out;
void srv_gen_out_free(srv_gen_out *o);

/* Text ready to send: valid UTF-8, never a part of a stop string. */
typedef void (*srv_delta_fn)(void *ud, const char *text, size_t len);
/* On the job's slot: evaluate the prompt (reusing the slot's cached prefix),
 * sample up to max_tokens, stop at end-of-generation tokens and stop
 * strings, hand text out as it is safe. Counts into the metrics. TM_OK with
 * out->finish NULL when cancelled; an engine error otherwise. */
tm_status srv_generate(tm_server *s, const srv_gen_params *p, srv_job *j, srv_delta_fn fn, void *ud,
                       srv_gen_out *out);
/* Of text[0..len) (valid UTF-8; text[0..from) already known to be free of
 * any whole stop string), how much can be sent: up to the first stop string
 * (*hit true), else all but a tail that may begin one. */
size_t srv_stop_scan(char *const *stops, int n_stop, const char *text, size_t len, size_t from,
                     bool *hit);

/* ---- requests and replies (http.c) ---- */
/* Bind and start the daemon (s->port gets the port bound). */
tm_status srv_http_start(tm_server *s);
/* Stop accepting connections (the open ones go on). */
void srv_http_quiesce(tm_server *s);
/* Close every connection and stop the daemon. */
void srv_http_stop(tm_server *s);
typedef struct srv_req {
    tm_server *s;
    struct MHD_Connection *conn;
    const char *method, *path;
    const char *body;
    size_t body_len;
} srv_req;
/* Each queues the reply and returns MHD's result. */
enum MHD_Result srv_reply_json(srv_req *r, unsigned status, json_t *body); /* takes body */
enum MHD_Result srv_reply_error(srv_req *r, unsigned status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
enum MHD_Result srv_reply_text(srv_req *r, unsigned status, const char *content_type,
                               const char *text, size_t len);
/* The body as a JSON object, or NULL after replying 400 naming why. */
json_t *srv_body_object(srv_req *r, enum MHD_Result *res);
/* Queue the job and answer with it: wait for its reply, or (stream) send its
 * bytes as server-sent events as they come. A closed connection cancels it. */
enum MHD_Result srv_reply_job(srv_req *r, srv_job *j, bool stream);
/* 503 while the model loads or after it failed; true when it may be used. */
bool srv_ready(srv_req *r, enum MHD_Result *res);
/* OpenAI's error shape with a string code and the parameter it is about
 * ({"error":{"message","type","param","code"}}), e.g. model_not_found. */
enum MHD_Result srv_reply_error_code(srv_req *r, unsigned status, const char *type,
                                     const char *code, const char *param, const char *msg);
/* Whether a request's "model" names the loaded model (server.c). */
bool srv_model_known(const tm_server *s, const char *name);

/* ---- who may send what (guard.c) ---- */
/* A state-changing request (not GET or HEAD): its Content-Type is JSON, its
 * Origin (when sent) this server's or one --cors-origin allows, and on a
 * loopback address its Host a loopback name. false after replying 403/415. */
bool srv_guard_post(srv_req *r, enum MHD_Result *res);
/* The request's Origin when --cors-origin allows it, else NULL. */
const char *srv_guard_cors_origin(srv_req *r);
/* The CORS headers of a reply to an origin --cors-origin allows (none else). */
void srv_guard_cors_headers(srv_req *r, struct MHD_Response *resp);

/* ---- the endpoints ---- */
enum MHD_Result srv_handle_chat(srv_req *r);        /* POST /v1/chat/completions */
enum MHD_Result srv_handle_completions(srv_req *r); /* POST /v1/completions */
enum MHD_Result srv_handle_models(srv_req *r);      /* GET /v1/models */
enum MHD_Result srv_handle_tokenize(srv_req *r);    /* POST /tokenize */
enum MHD_Result srv_handle_detokenize(srv_req *r);  /* POST /detokenize */
enum MHD_Result srv_handle_perf_get(srv_req *r);    /* GET /moe-layer-perf */
enum MHD_Result srv_handle_perf_post(srv_req *r);   /* POST /moe-layer-perf */
enum MHD_Result srv_handle_cache_get(srv_req *r);   /* GET /moe-hot-cache */
enum MHD_Result srv_handle_cache_post(srv_req *r);  /* POST /moe-hot-cache */
enum MHD_Result srv_handle_metrics(srv_req *r);     /* GET /metrics */
enum MHD_Result srv_handle_dashboard(srv_req *r);   /* GET / */
/* The dashboard page (src/server/dashboard.html, embedded by CMake). */
extern const unsigned char srv_dashboard_html[];
extern const size_t srv_dashboard_html_len;

#endif
