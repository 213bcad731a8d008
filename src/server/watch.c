/* Read deadlines: a connection sends its whole request, headers and body,
 * within --read-timeout seconds of opening or of its previous reply's end.
 * libmicrohttpd's own timeout (600 s, as a stream may wait that long for its
 * next bytes) counts idle time, which a client trickling a byte a second
 * never reaches, and a connection holds one of a bounded number of places;
 * a thread here cuts connections past their deadline
 * (shutdown(2): libmicrohttpd's thread for the connection then reads the end
 * and closes it). A client that had not finished the headers of its first
 * request gets a 408 with a JSON error first; once the headers are in,
 * libmicrohttpd may answer (100 Continue, its own errors), and a kept-alive
 * connection idle between requests may be sending its next one as the 408
 * goes out (a client would take it for that request's answer), so those are
 * only shut. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "server_internal.h"

struct srv_watch_conn {
    srv_watch *w;
    int fd;
    int64_t deadline_ms; /* CLOCK_MONOTONIC */
    bool reading;        /* receiving a request */
    bool headers_in;     /* its headers are in: libmicrohttpd may write */
    bool kept_alive;     /* a reply went out: the next request is the client's choice */
    bool cut;            /* past its deadline: shut */
    srv_watch_conn *prev, *next;
};

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void cut(srv_watch *w, srv_watch_conn *c) {
    c->cut = true;
    w->n_cut++;
    if (!c->headers_in && !c->kept_alive) /* nothing else is on the wire */
        (void)!send(c->fd, w->reply, strlen(w->reply), MSG_NOSIGNAL | MSG_DONTWAIT);
    shutdown(c->fd, SHUT_RDWR);
}

static void *watch_main(void *arg) {
    srv_watch *w = arg;
    pthread_mutex_lock(&w->mu);
    while (!w->stop) {
        const int64_t now = now_ms();
        for (srv_watch_conn *c = w->head; c; c = c->next)
            if (c->reading && !c->cut && now >= c->deadline_ms) cut(w, c);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += SRV_WATCH_TICK_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

tm_status srv_watch_start(srv_watch *w, int timeout_s) {
    w->timeout_ms = (int64_t)timeout_s * 1000;
    char body[256];
    snprintf(body, sizeof(body),
             "{\"error\":{\"code\":408,\"message\":\"the request did not arrive within %d s "
             "(--read-timeout)\",\"type\":\"invalid_request_error\"}}",
             timeout_s);
    const int n =
        snprintf(w->reply, sizeof(w->reply),
                 "HTTP/1.1 408 Request Timeout\r\nContent-Type: application/json; charset=utf-8\r\n"
                 "Connection: close\r\nContent-Length: %zu\r\n\r\n%s",
                 strlen(body), body);
    if (n < 0 || (size_t)n >= sizeof(w->reply)) /* the buffer is sized for it: a broken edit */
        return srv_error_set(TM_ERR_ARG, "the 408 reply does not fit its buffer (%d bytes)", n);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, &ca);
    pthread_condattr_destroy(&ca);
    w->inited = true;
    if (pthread_create(&w->thread, NULL, watch_main, w))
        return srv_error_set(TM_ERR_NOMEM, "cannot start the read-deadline thread");
    w->started = true;
    return TM_OK;
}

void srv_watch_stop(srv_watch *w) {
    if (w->started) {
        pthread_mutex_lock(&w->mu);
        w->stop = true;
        pthread_cond_broadcast(&w->cv);
        pthread_mutex_unlock(&w->mu);
        pthread_join(w->thread, NULL);
        w->started = false;
    }
    if (w->inited) {
        /* the daemon has stopped: every connection was closed and unlisted */
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        w->inited = false;
    }
}

void srv_watch_notify(void *cls, struct MHD_Connection *conn, void **socket_context,
                      enum MHD_ConnectionNotificationCode code) {
    srv_watch *w = cls;
    srv_watch_conn *c = *socket_context;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        if (!ci || !(c = calloc(1, sizeof(*c)))) return; /* no deadline: the idle timeout holds */
        c->w = w, c->fd = ci->connect_fd, c->reading = true;
        pthread_mutex_lock(&w->mu);
        c->deadline_ms = now_ms() + w->timeout_ms;
        c->next = w->head;
        if (w->head) w->head->prev = c;
        w->head = c;
        pthread_mutex_unlock(&w->mu);
        *socket_context = c;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && c) { /* before its socket is closed */
        pthread_mutex_lock(&w->mu);
        if (c->prev)
            c->prev->next = c->next;
        else
            w->head = c->next;
        if (c->next) c->next->prev = c->prev;
        pthread_mutex_unlock(&w->mu);
        free(c);
        *socket_context = NULL;
    }
}

static srv_watch_conn *conn_of(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

bool srv_watch_progress(struct MHD_Connection *conn, bool whole) {
    srv_watch_conn *c = conn_of(conn);
    if (!c) return true;
    pthread_mutex_lock(&c->w->mu);
    c->headers_in = true;
    if (whole) c->reading = false;
    const bool ok = !c->cut;
    pthread_mutex_unlock(&c->w->mu);
    return ok;
}

void srv_watch_next(struct MHD_Connection *conn) {
    srv_watch_conn *c = conn_of(conn);
    if (!c) return;
    pthread_mutex_lock(&c->w->mu);
    c->reading = true, c->headers_in = false, c->kept_alive = true;
    c->deadline_ms = now_ms() + c->w->timeout_ms;
    pthread_mutex_unlock(&c->w->mu);
}

uint64_t srv_watch_cut_count(srv_watch *w) {
    if (!w->inited) return 0;
    pthread_mutex_lock(&w->mu);
    const uint64_t n = w->n_cut;
    pthread_mutex_unlock(&w->mu);
    return n;
}
