/* HTTP plumbing on libmicrohttpd: the daemon (a thread per connection), the
 * routes, request bodies (bounded by --max-body), the API key, replies in
 * OpenAI's error shape, and answering with a job: waiting for its reply or
 * streaming its server-sent events, watching the connection so a client that
 * leaves cancels its request. No HTTP is parsed here: libmicrohttpd does it. */
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "server_internal.h"

/* ---- text that goes into JSON must be valid UTF-8 ---- */

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is not one. */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    const unsigned c = s[0];
    size_t len;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf)
        len = 2, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef)
        len = 3, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4)
        len = 4, min = 0x10000;
    else
        return 0;
    if (n < len) return 0;
    unsigned cp = c & (0x3f >> (len - 1));
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3f);
    }
    return cp >= min && cp <= 0x10ffff && !(cp >= 0xd800 && cp <= 0xdfff) ? len : 0;
}

/* Replace every byte that is not part of valid UTF-8 with '?', in place. */
static void utf8_sanitize(char *s) {
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        const size_t k = utf8_seq((const unsigned char *)s + i, n - i);
        if (k)
            i += k;
        else
            s[i++] = '?';
    }
}

/* ---- replies ---- */

static void log_reply(const srv_req *r, unsigned status, const char *what) {
    if (!r->s->p.quiet)
        fprintf(stderr, "tiermoe serve: %s %s -> %u%s\n", r->method, r->path, status, what);
}

static enum MHD_Result queue(srv_req *r, unsigned status, struct MHD_Response *resp,
                             const char *content_type) {
    if (!resp) return MHD_NO;
    if (content_type) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    if (status == 503) MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, SRV_RETRY_AFTER);
    srv_guard_cors_headers(r, resp);
    const enum MHD_Result res = MHD_queue_response(r->conn, status, resp);
    MHD_destroy_response(resp);
    srv_metrics_http(&r->s->metrics, status);
    log_reply(r, status, "");
    return res;
}

enum MHD_Result srv_reply_text(srv_req *r, unsigned status, const char *content_type,
                               const char *text, size_t len) {
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(len, (void *)text, MHD_RESPMEM_MUST_COPY);
    return queue(r, status, resp, content_type);
}

enum MHD_Result srv_reply_json(srv_req *r, unsigned status, json_t *body) {
    char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
    json_decref(body);
    if (!text) return srv_reply_error(r, 500, "out of memory writing the reply");
    const size_t n = strlen(text);
    struct MHD_Response *resp = MHD_create_response_from_buffer(n, text, MHD_RESPMEM_MUST_FREE);
    if (!resp) free(text);
    return queue(r, status, resp, "application/json; charset=utf-8");
}

static const char *error_type(unsigned status) {
    switch (status) {
    case 401:
        return "authentication_error";
    case 403:
        return "permission_error";
    case 404:
        return "not_found_error";
    case 501:
        return "not_supported_error";
    case 503:
        return "unavailable_error";
    default:
        return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

/* {"error":{"code","message","type"}}, the message made valid UTF-8. */
static json_t *error_json(unsigned status, const char *msg) {
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s", msg);
    utf8_sanitize(buf);
    return json_pack("{s:{s:i, s:s, s:s}}", "error", "code", (int)status, "message", buf, "type",
                     error_type(status));
}

/* The error reply (or NULL out of memory). */
static struct MHD_Response *error_response(unsigned status, const char *msg) {
    json_t *j = error_json(status, msg);
    char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!text) return NULL;
    struct MHD_Response *resp =
        MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
    if (!resp) free(text);
    return resp;
}

enum MHD_Result srv_reply_error(srv_req *r, unsigned status, const char *fmt, ...) {
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return queue(r, status, error_response(status, msg), "application/json; charset=utf-8");
}

enum MHD_Result srv_reply_error_code(srv_req *r, unsigned status, const char *type,
                                     const char *code, const char *param, const char *msg) {
    char buf[1024];
    snprintf(buf, sizeof(buf), "%s", msg);
    utf8_sanitize(buf);
    return srv_reply_json(r, status,
                          json_pack("{s:{s:s, s:s, s:s, s:s}}", "error", "message", buf, "type",
                                    type, "param", param, "code", code));
}

json_t *srv_body_object(srv_req *r, enum MHD_Result *res) {
    json_error_t err;
    json_t *j = json_loadb(r->body ? r->body : "", r->body_len, JSON_REJECT_DUPLICATES, &err);
    if (!j) {
        *res = srv_reply_error(r, 400, "request body: not valid JSON (line %d, column %d): %s",
                               err.line, err.column, err.text);
        return NULL;
    }
    if (!json_is_object(j)) {
        json_decref(j);
        *res = srv_reply_error(r, 400, "request body: expected a JSON object");
        return NULL;
    }
    return j;
}

bool srv_ready(srv_req *r, enum MHD_Result *res) {
    const int st = atomic_load(&r->s->state);
    if (st == SRV_READY) return true;
    *res = st == SRV_LOADING ? srv_reply_error(r, 503, "the model is loading")
                             : srv_reply_error(r, 503, "the model failed to load: %s", r->s->error);
    return false;
}

/* ---- answering with a job ---- */

static int conn_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* The peer closed its end (or the socket broke). Data the client sent on
 * does not count: only a hang-up. */
static bool conn_closed(int fd) {
    if (fd < 0) return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

/* Wait (j->mu held) until the job has bytes or is done, or the connection
 * closed (then the job is cancelled and false returned). */
static bool job_wait(srv_job *j, int fd, bool want_bytes) {
    while (!j->done && !(want_bytes && j->out_pos < j->out_len)) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += SRV_WAIT_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (!j->done && !(want_bytes && j->out_pos < j->out_len) && conn_closed(fd)) {
            atomic_store(&j->cancel, true);
            return false;
        }
    }
    return true;
}

typedef struct srv_stream {
    srv_job *job;
    int fd;
    srv_req req; /* for the log line (method and path are static strings of MHD's: copied) */
    char method[16], path[64];
} srv_stream;

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    srv_stream *st = cls;
    srv_job *j = st->job;
    pthread_mutex_lock(&j->mu);
    if (!job_wait(j, st->fd, true)) {
        pthread_mutex_unlock(&j->mu);
        log_reply(&st->req, 200, " (stream: the client left)");
        return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    ssize_t n = MHD_CONTENT_READER_END_OF_STREAM;
    if (j->out_pos == j->out_len && j->reply) { /* ended before it ran (the server stops) */
        char *text = json_dumps(j->reply, JSON_COMPACT);
        json_decref(j->reply), j->reply = NULL;
        if (text) {
            pthread_mutex_unlock(&j->mu);
            srv_job_emit(j, "data: ", 6), srv_job_emit(j, text, strlen(text));
            srv_job_emit(j, "\n\n", 2);
            pthread_mutex_lock(&j->mu);
            free(text);
        }
    }
    if (j->out_pos < j->out_len) {
        const size_t k = j->out_len - j->out_pos < max ? j->out_len - j->out_pos : max;
        memcpy(buf, j->out + j->out_pos, k);
        j->out_pos += k;
        if (j->out_pos == j->out_len) j->out_pos = j->out_len = 0;
        n = (ssize_t)k;
    }
    pthread_mutex_unlock(&j->mu);
    return n;
}

static void stream_free(void *cls) {
    srv_stream *st = cls;
    atomic_store(&st->job->cancel, true); /* a no-op when it is done */
    srv_job_unref(st->job);
    free(st);
}

enum MHD_Result srv_reply_job(srv_req *r, srv_job *j, bool stream) {
    if (srv_queue_push(r->s, j) != TM_OK) {
        srv_job_unref(j);
        return srv_reply_error(r, 503, "%s", server_error_message());
    }
    const int fd = conn_fd(r->conn);
    if (!stream) {
        pthread_mutex_lock(&j->mu);
        const bool ok = job_wait(j, fd, false);
        pthread_mutex_unlock(&j->mu);
        if (!ok) { /* nobody to answer: close the connection */
            log_reply(r, 499, " (the client left)");
            srv_job_unref(j);
            return MHD_NO;
        }
        const unsigned status = j->status;
        json_t *reply = j->reply;
        j->reply = NULL;
        srv_job_unref(j);
        return srv_reply_json(r, status, reply);
    }
    srv_stream *st = calloc(1, sizeof(*st));
    if (!st) {
        atomic_store(&j->cancel, true);
        srv_job_unref(j);
        return srv_reply_error(r, 500, "out of memory");
    }
    st->job = j, st->fd = fd, st->req = *r;
    snprintf(st->method, sizeof(st->method), "%s", r->method);
    snprintf(st->path, sizeof(st->path), "%s", r->path);
    st->req.method = st->method, st->req.path = st->path;
    struct MHD_Response *resp =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_read, st, stream_free);
    if (!resp) {
        stream_free(st);
        return MHD_NO;
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    srv_guard_cors_headers(r, resp);
    const enum MHD_Result res = MHD_queue_response(r->conn, 200, resp);
    MHD_destroy_response(resp);
    srv_metrics_http(&r->s->metrics, 200);
    log_reply(r, 200, " (stream)");
    return res;
}

/* ---- routes ---- */

static enum MHD_Result handle_health(srv_req *r) {
    switch (atomic_load(&r->s->state)) {
    case SRV_READY:
        return srv_reply_json(r, 200, json_pack("{s:s}", "status", "ok"));
    case SRV_LOADING:
        return srv_reply_json(r, 503, json_pack("{s:s}", "status", "loading"));
    default: {
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", r->s->error);
        utf8_sanitize(msg);
        return srv_reply_json(r, 500, json_pack("{s:s, s:s}", "status", "error", "error", msg));
    }
    }
}

typedef struct srv_route {
    const char *method, *path;
    enum MHD_Result (*fn)(srv_req *r);
} srv_route;

static const srv_route routes[] = {
    {"GET", "/health", handle_health},
    {"GET", "/", srv_handle_dashboard},
    {"GET", "/v1/models", srv_handle_models},
    {"GET", "/models", srv_handle_models},
    {"POST", "/v1/chat/completions", srv_handle_chat},
    {"POST", "/chat/completions", srv_handle_chat},
    {"POST", "/v1/completions", srv_handle_completions},
    {"POST", "/completions", srv_handle_completions},
    {"POST", "/tokenize", srv_handle_tokenize},
    {"POST", "/detokenize", srv_handle_detokenize},
    {"GET", "/metrics", srv_handle_metrics},
    {"GET", "/moe-layer-perf", srv_handle_perf_get},
    {"POST", "/moe-layer-perf", srv_handle_perf_post},
    {"GET", "/moe-hot-cache", srv_handle_cache_get},
    {"POST", "/moe-hot-cache", srv_handle_cache_post},
};

/* "Bearer KEY": the scheme in any case (RFC 9110), then spaces; the key or NULL. */
static const char *bearer_token(const char *auth) {
    if (!auth || strncasecmp(auth, "Bearer", 6) || (auth[6] != ' ' && auth[6] != '\t')) return NULL;
    auth += 6;
    while (*auth == ' ' || *auth == '\t') auth++;
    return auth;
}

/* Constant-time comparison of the bearer token with the key. */
static bool key_matches(const char *given, const char *key) {
    const size_t n = strlen(key), m = strlen(given);
    unsigned diff = (unsigned)(n ^ m);
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)key[i] ^ (unsigned char)given[i < m ? i : 0];
    return diff == 0 && m > 0;
}

static enum MHD_Result route(srv_req *r) {
    const bool head = !strcmp(r->method, "HEAD");
    char allow[32] = ""; /* the methods the path takes (405 names them) */
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        if (strcmp(routes[i].path, r->path)) continue;
        snprintf(allow + strlen(allow), sizeof(allow) - strlen(allow), "%s%s", *allow ? ", " : "",
                 !strcmp(routes[i].method, "GET") ? "GET, HEAD" : routes[i].method);
        if (strcmp(routes[i].method, r->method) && !(head && !strcmp(routes[i].method, "GET")))
            continue;
        /* the page holds no data: it asks for the key (#key=) and sends it itself */
        if (r->s->api_key && routes[i].fn != handle_health &&
            routes[i].fn != srv_handle_dashboard) {
            const char *auth = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND,
                                                           MHD_HTTP_HEADER_AUTHORIZATION);
            const char *token = bearer_token(auth);
            if (!token || !key_matches(token, r->s->api_key))
                return srv_reply_error(r, 401, "Invalid API Key");
        }
        enum MHD_Result res;
        if (strcmp(routes[i].method, "GET") && !srv_guard_post(r, &res)) return res;
        return routes[i].fn(r);
    }
    if (*allow && !strcmp(r->method, "OPTIONS") &&
        MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND, "Origin")) {
        if (!srv_guard_cors_origin(r))
            return srv_reply_error(r, 403,
                                   "Origin: not allowed to call this server (--cors-origin)");
        /* a CORS preflight from a page --cors-origin allows */
        struct MHD_Response *resp = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        if (resp) {
            MHD_add_response_header(resp, "Access-Control-Allow-Methods", allow);
            MHD_add_response_header(resp, "Access-Control-Allow-Headers",
                                    "Authorization, Content-Type");
            MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
        }
        return queue(r, 204, resp, NULL);
    }
    if (*allow) {
        char msg[256];
        snprintf(msg, sizeof(msg), "%s is not allowed on %s (%s)", r->method, r->path, allow);
        struct MHD_Response *resp = error_response(405, msg);
        if (resp) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, allow);
        return queue(r, 405, resp, "application/json; charset=utf-8");
    }
    return srv_reply_error(r, 404, "File Not Found: %s", r->path);
}

/* What one connection's current request has received. */
typedef struct srv_conn {
    char *body;
    size_t len, cap;
    bool too_large;
} srv_conn;

static enum MHD_Result on_access(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version, const char *upload,
                                 size_t *upload_size, void **con_cls) {
    (void)version;
    tm_server *s = cls;
    srv_req r = {.s = s, .conn = c, .method = method, .path = url};
    srv_conn *sc = *con_cls;
    if (!sc) { /* the headers: say no to a body that is too large before reading it */
        if (!srv_watch_progress(c, false) || !(sc = calloc(1, sizeof(*sc)))) return MHD_NO;
        *con_cls = sc;
        /* past the work limit only /health is answered, so it answers under any load */
        if (atomic_fetch_add(&s->in_flight, 1) >= s->p.max_connections && strcmp(url, "/health")) {
            srv_watch_progress(c, true);
            return srv_reply_error(&r, 503,
                                   "the server is busy: %d requests are being served "
                                   "(--max-connections); retry later",
                                   s->p.max_connections);
        }
        const char *cl =
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl) {
            errno = 0;
            char *end;
            const unsigned long long n = strtoull(cl, &end, 10);
            if (errno || *end || n > s->p.max_body) {
                sc->too_large = true;
                srv_watch_progress(c, true);
                return srv_reply_error(&r, 413, "request body: more than %zu bytes (--max-body)",
                                       s->p.max_body);
            }
        }
        return MHD_YES;
    }
    if (*upload_size) {
        if (!sc->too_large && sc->len + *upload_size > s->p.max_body) {
            sc->too_large = true;
            free(sc->body), sc->body = NULL, sc->len = sc->cap = 0;
        }
        if (!sc->too_large) {
            if (sc->len + *upload_size + 1 > sc->cap) {
                size_t cap = sc->cap ? sc->cap : 4096;
                while (cap < sc->len + *upload_size + 1) cap *= 2;
                char *b = realloc(sc->body, cap);
                if (!b) return MHD_NO;
                sc->body = b, sc->cap = cap;
            }
            memcpy(sc->body + sc->len, upload, *upload_size);
            sc->len += *upload_size;
            sc->body[sc->len] = '\0';
        }
        *upload_size = 0;
        return MHD_YES;
    }
    if (!srv_watch_progress(c, true)) return MHD_NO; /* cut at its deadline */
    if (sc->too_large)
        return srv_reply_error(&r, 413, "request body: more than %zu bytes (--max-body)",
                               s->p.max_body);
    r.body = sc->body, r.body_len = sc->len;
    return route(&r);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe) {
    (void)toe;
    tm_server *s = cls;
    srv_conn *sc = *con_cls;
    if (sc) free(sc->body), free(sc), atomic_fetch_sub(&s->in_flight, 1);
    *con_cls = NULL;
    srv_watch_next(c); /* a kept-alive connection's next request has its own deadline */
}

/* libmicrohttpd 0.9.75 (Debian 12) answers requests it cannot parse (an
 * unparseable Content-Length, no Host, ...) without calling on_access, with an
 * HTML page whose status line and headers go out twice. It logs why, then
 * "Error processing request (HTTP response code is N ...)", on the
 * connection's thread before it writes: there the reply is written once, as
 * JSON, and the socket's sending side shut, so its own goes nowhere. */
static _Thread_local int tls_fd = -1;      /* the connection this thread serves */
static _Thread_local char tls_reason[256]; /* libmicrohttpd's last message about it */

static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c) {
    (void)cls, (void)uri;
    tls_fd = conn_fd(c);
    return NULL; /* *con_cls stays NULL for on_access's first call */
}

static void reply_for_mhd(tm_server *s, unsigned status) {
    char *reason = strstr(tls_reason, ". Closing connection");
    if (reason) *reason = '\0';
    char msg[512];
    snprintf(msg, sizeof(msg), "the HTTP layer refused the request: %s", tls_reason);
    json_t *j = error_json(status, msg);
    char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!body) return;
    char head[256];
    const int n = snprintf(head, sizeof(head),
                           "HTTP/1.1 %u %s\r\nContent-Type: application/json; charset=utf-8\r\n"
                           "Connection: close\r\nContent-Length: %zu\r\n\r\n",
                           status, MHD_get_reason_phrase_for(status), strlen(body));
    if (send(tls_fd, head, (size_t)n, MSG_NOSIGNAL) == n)
        (void)!send(tls_fd, body, strlen(body), MSG_NOSIGNAL);
    free(body);
    shutdown(tls_fd, SHUT_WR);
    srv_metrics_http(&s->metrics, status);
    if (!s->p.quiet) fprintf(stderr, "tiermoe serve: -> %u (%s)\n", status, msg);
}

static void on_log(void *cls, const char *fmt, va_list ap) {
    char msg[1024];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    fprintf(stderr, "tiermoe serve: libmicrohttpd: %s", msg);
    unsigned status;
    if (sscanf(msg, "Error processing request (HTTP response code is %u", &status) == 1) {
        if (tls_fd >= 0 && status >= 400 && status < 600) reply_for_mhd(cls, status);
    } else {
        snprintf(tls_reason, sizeof(tls_reason), "%.255s", msg);
    }
}

/* ---- the daemon ---- */

tm_status srv_http_start(tm_server *s) {
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE},
                    *ai = NULL;
    char port[16];
    snprintf(port, sizeof(port), "%d", s->p.port);
    const int gai = getaddrinfo(s->host, port, &hints, &ai);
    if (gai || !ai) return srv_error_set(TM_ERR_ARG, "--host %s: %s", s->host, gai_strerror(gai));
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    tm_status st = srv_watch_start(&s->watch, s->p.read_timeout);
    if (st != TM_OK) {
        freeaddrinfo(ai);
        return st;
    }
    /* Twice the work limit (--max-connections): past it, /health and the 503s still get
     * through. libmicrohttpd's idle timeout stays long: it also cuts a stream whose next
     * bytes take longer (queued, or a long prompt before the first token); a request's
     * arrival has the read deadline (watch.c). */
    const unsigned idle = SRV_IDLE_TIMEOUT_S;
    s->daemon = MHD_start_daemon(
        flags, (uint16_t)s->p.port, NULL, NULL, on_access, s, MHD_OPTION_EXTERNAL_LOGGER, on_log, s,
        MHD_OPTION_SOCK_ADDR, ai->ai_addr, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_URI_LOG_CALLBACK, on_uri, s, MHD_OPTION_NOTIFY_CONNECTION, srv_watch_notify,
        &s->watch, MHD_OPTION_CONNECTION_LIMIT, 2 * (unsigned)s->p.max_connections,
        MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->p.max_per_ip,
        MHD_OPTION_CONNECTION_TIMEOUT, idle, MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->daemon)
        return srv_error_set(TM_ERR_IO, "cannot listen on %s:%d (in use, or not an address here?)",
                             s->host, s->p.port);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->p.port;
    return TM_OK;
}

void srv_http_quiesce(tm_server *s) {
    if (s->daemon && s->listen_fd < 0) s->listen_fd = MHD_quiesce_daemon(s->daemon);
}

void srv_http_stop(tm_server *s) {
    if (s->daemon) MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
    srv_watch_stop(&s->watch);                  /* after the daemon: its connections are gone */
    if (s->listen_fd >= 0) close(s->listen_fd); /* after the daemon, as MHD asks */
    s->listen_fd = -1;
}
