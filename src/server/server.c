/* The server's life: create (bind, answer /health "loading"), load (the
 * worker makes the context), stop (in the order that lets every thread
 * finish: no new connections, jobs ended, connections closed, then the
 * context freed by the worker that made it), free. See server.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server_internal.h"

static char *dup_or_null(const char *s) {
    return s ? strdup(s) : NULL;
}

tm_status server_create(const tm_server_params *p, tm_server **out) {
    *out = NULL;
    if (p->parallel < 0 || p->parallel > TM_SERVER_MAX_PARALLEL)
        return srv_error_set(TM_ERR_ARG, "--parallel %d: want 1 .. %d", p->parallel,
                             TM_SERVER_MAX_PARALLEL);
    if (p->chat_template && tm_chat_format_check(p->chat_template) != TM_OK)
        return srv_error_set(TM_ERR_ARG, "--chat-template: %s", tm_error_message());
    tm_server *s = calloc(1, sizeof(*s));
    if (!s) return srv_error_set(TM_ERR_NOMEM, "out of memory");
    s->p = *p;
    s->host = strdup(p->host ? p->host : "127.0.0.1");
    s->api_key = p->api_key && *p->api_key ? strdup(p->api_key) : NULL;
    s->alias = dup_or_null(p->alias);
    s->chat_template = dup_or_null(p->chat_template);
    s->cors_origin = dup_or_null(p->cors_origin);
    s->p.host = s->host, s->p.api_key = s->api_key, s->p.alias = s->alias;
    s->p.chat_template = s->chat_template, s->p.cors_origin = s->cors_origin;
    if (!s->p.max_body) s->p.max_body = 8u << 20;
    if (!s->p.max_queue) s->p.max_queue = 64;
    if (!s->p.max_connections) s->p.max_connections = 64;
    /* one address (all local clients, a reverse proxy) may fill the work limit and get its
     * 503s; a quarter of libmicrohttpd's connections stays for the other addresses */
    if (!s->p.max_per_ip) s->p.max_per_ip = s->p.max_connections + (s->p.max_connections + 1) / 2;
    if (!s->p.read_timeout) s->p.read_timeout = 10;
    s->listen_fd = -1;
    atomic_init(&s->state, SRV_LOADING);
    atomic_init(&s->stopping, false);
    atomic_init(&s->in_flight, 0);
    atomic_init(&s->next_id, 1);
    atomic_init(&s->seed_counter, 0);
    pthread_mutex_init(&s->q_mu, NULL);
    pthread_cond_init(&s->q_cv, NULL);
    pthread_mutex_init(&s->step_mu, NULL);
    srv_metrics_init(&s->metrics);
    json_object_seed(0); /* before any thread makes objects */
    tm_status st = s->host ? srv_http_start(s) : srv_error_set(TM_ERR_NOMEM, "out of memory");
    if (st != TM_OK) {
        server_free(s);
        return st;
    }
    *out = s;
    return TM_OK;
}

int server_port(const tm_server *s) {
    return s->port;
}

/* Add a name a request may give (valid UTF-8, not empty, not listed yet). */
static void name_add(tm_server *s, const char *name, size_t len) {
    json_t *probe = len ? json_stringn(name, len) : NULL; /* JSON carries only UTF-8 */
    json_decref(probe);
    if (!probe || len >= sizeof(s->model_name)) return;
    for (int i = 0; i < s->n_names; i++)
        if (strlen(s->names[i]) == len && !memcmp(s->names[i], name, len)) return;
    char **grown = realloc(s->names, (size_t)(s->n_names + 1) * sizeof(*grown));
    char *copy = grown ? strndup(name, len) : NULL;
    if (grown) s->names = grown;
    if (copy) s->names[s->n_names++] = copy;
}

/* The names a request's "model" may give: each --alias, the file's base name
 * (less and with ".gguf") and the GGUF's general.name. The first is the id. */
static void model_names(tm_server *s) {
    for (const char *a = s->alias; a && *a;) {
        const char *end = strchr(a, ',');
        const size_t n = end ? (size_t)(end - a) : strlen(a);
        size_t lo = 0, hi = n;
        while (lo < hi && a[lo] == ' ') lo++;
        while (hi > lo && a[hi - 1] == ' ') hi--;
        name_add(s, a + lo, hi - lo);
        a = end ? end + 1 : a + n;
    }
    const char *path = s->info.path, *slash = path ? strrchr(path, '/') : NULL;
    const char *base = slash ? slash + 1 : path ? path : "";
    const size_t n = strlen(base);
    name_add(s, base, n > 5 && !strcmp(base + n - 5, ".gguf") ? n - 5 : n);
    name_add(s, base, n);
    if (s->info.name) name_add(s, s->info.name, strlen(s->info.name));
    snprintf(s->model_name, sizeof(s->model_name), "%s", s->n_names ? s->names[0] : "model");
}

bool srv_model_known(const tm_server *s, const char *name) {
    for (int i = 0; i < s->n_names; i++)
        if (!strcmp(s->names[i], name)) return true;
    return false;
}

/* A load that cannot go on: /health says why. */
static tm_status load_error(tm_server *s, tm_status st) {
    atomic_store(&s->state, SRV_ERROR);
    snprintf(s->error, sizeof(s->error), "%s", server_error_message());
    return st;
}

tm_status server_load(tm_server *s, tm_model *m, const tm_context_opts *o) {
    s->m = m, s->opts = *o;
    const int np = s->p.parallel > 0 ? s->p.parallel : 1;
    if (o->n_ctx > 0 && o->n_ctx < 2 * (int64_t)np)
        return load_error(s, srv_error_set(TM_ERR_ARG,
                                           "-c %lld over --parallel %d leaves fewer than 2 "
                                           "positions a slot",
                                           (long long)o->n_ctx, np));
    if (o->n_batch > 0 && o->n_batch < np)
        return load_error(s, srv_error_set(TM_ERR_ARG,
                                           "-b %lld is below --parallel %d: a decode step takes "
                                           "a row per slot",
                                           (long long)o->n_batch, np));
    tm_status st = srv_error_api(tm_model_describe(m, &s->info));
    tm_vocab_info vi;
    if (st == TM_OK && s->info.has_vocab) st = srv_error_api(tm_vocab_describe(m, &vi));
    if (st == TM_OK && !s->info.has_vocab)
        st = srv_error_set(TM_ERR_UNSUPPORTED, "the model has no vocabulary");
    if (st != TM_OK) return load_error(s, st);
    s->n_tokens = vi.n_tokens;
    s->chat = s->p.chat_template ? s->p.chat_template : s->info.chat_format;
    s->chat_harmony = s->chat && !strcmp(s->chat, "harmony");
    s->created = (int64_t)time(NULL);
    model_names(s);
    st = srv_worker_start(s);
    if (st != TM_OK) {
        snprintf(s->error, sizeof(s->error), "%s", server_error_message());
        atomic_store(&s->state, SRV_ERROR);
        return st;
    }
    /* the limits, now that the context's size is known */
    s->max_prompt =
        s->p.max_prompt > 0 && s->p.max_prompt < s->n_ctx ? s->p.max_prompt : s->n_ctx - 1;
    s->max_tokens = s->p.max_tokens > 0 ? s->p.max_tokens : s->n_ctx;
    s->default_tokens = s->p.default_tokens > 0 ? s->p.default_tokens : s->max_tokens;
    if (s->default_tokens > s->max_tokens) s->default_tokens = s->max_tokens;
    atomic_store(&s->state, SRV_READY);
    return TM_OK;
}

tm_status server_stop(tm_server *s) {
    if (!s || atomic_load(&s->stopping)) return TM_OK;
    srv_http_quiesce(s);
    srv_worker_stop(s);
    /* the running job ends (cancelled), then the replies and streams in flight go out */
    const struct timespec tick = {0, 10 * 1000000L};
    for (int i = 0; i < 500 && (srv_queue_busy(s) || atomic_load(&s->in_flight) > 0); i++)
        nanosleep(&tick, NULL);
    srv_http_stop(s);
    srv_worker_release(s); /* the worker printed the counters' summary, wrote their file */
    if (s->trace_status != TM_OK) srv_error_set(s->trace_status, "%s", s->trace_error);
    return s->trace_status;
}

void server_free(tm_server *s) {
    if (!s) return;
    if (!atomic_load(&s->stopping)) server_stop(s);
    srv_http_stop(s);
    srv_worker_release(s);
    srv_metrics_free(&s->metrics);
    pthread_mutex_destroy(&s->step_mu);
    pthread_cond_destroy(&s->q_cv);
    pthread_mutex_destroy(&s->q_mu);
    for (int i = 0; i < s->n_names; i++) free(s->names[i]);
    free(s->names);
    free(s->host), free(s->api_key), free(s->alias), free(s->chat_template);
    free(s->cors_origin);
    free(s);
}
