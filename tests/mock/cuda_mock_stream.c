/* The streams, graphs and events of the host mock of the CUDA backend: the
 * stream's closure queue and worker thread, graph capture and replay, events
 * and timers (the model: cuda_mock.c). */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_mock_stream.h"

/* ---- closures and the stream ---- */

static void sleep_us(long us) {
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

typedef struct mock_closure {
    struct mock_closure *next;
    mock_fn fn;
    void (*queued)(void *arg); /* when it enters a run queue (not a capture): events */
    void (*cancel)(void *arg); /* instead of fn once the stream has failed: events */
    const char *op;
    bool delay;  /* MOCK_GPU_LATENCY_US applies */
    bool placed; /* dev set: the stream it was first put on (a graph's node keeps its GPU) */
    int dev;     /* that stream's device */
    size_t size;
    max_align_t arg[]; /* size bytes */
} mock_closure;

static mock_closure *closure_new(const char *op, mock_fn fn, const void *arg, size_t size) {
    mock_closure *c = malloc(sizeof(*c) + size);
    if (!c) return NULL;
    memset(c, 0, sizeof(*c));
    c->fn = fn, c->op = op, c->delay = true, c->size = size;
    if (size) memcpy(c->arg, arg, size);
    return c;
}

static void closure_list_free(mock_closure *c) {
    while (c) {
        mock_closure *next = c->next;
        free(c);
        c = next;
    }
}

static void *stream_worker(void *p) {
    struct CUstream_st *s = p;
    char err[512];
    mock_t_dev = s->dev;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop) pthread_cond_wait(&s->work, &s->mu);
        if (!s->head) break; /* stop, and everything queued has run */
        mock_closure *c = s->head;
        s->head = c->next;
        if (!s->head) s->tail = NULL;
        s->busy = true;
        const bool skip = s->failed;
        pthread_mutex_unlock(&s->mu);
        bool ok = true;
        if (skip) {
            if (c->cancel) c->cancel(c->arg);
        } else {
            if (c->delay && s->latency_us > 0) sleep_us(s->latency_us);
            mock_t_dev = c->placed ? c->dev : s->dev; /* a replayed graph's node: its own GPU's */
            err[0] = '\0';
            ok = c->fn(c->arg, err, sizeof(err));
        }
        pthread_mutex_lock(&s->mu);
        if (!ok && !s->failed) {
            s->failed = true;
            snprintf(s->err, sizeof(s->err), "%s: %s", c->op, err);
        }
        free(c);
        s->busy = false;
        if (!s->head) pthread_cond_broadcast(&s->idle);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* Under s->mu. */
static tm_status stream_sticky(const struct CUstream_st *s) {
    return tm_error_set(TM_ERR_DEVICE, "mock GPU: the stream failed: %s", s->err);
}

/* Under s->mu: a synchronous call during a capture. */
tm_status mock_capture_break(struct CUstream_st *s, const char *op) {
    if (!s->cap_invalid) snprintf(s->cap_why, sizeof(s->cap_why), "%s", op);
    s->cap_invalid = true;
    return tm_error_set(TM_ERR_DEVICE,
                        "mock GPU: %s while the stream is capturing a graph (CUDA: operation not "
                        "permitted when stream is capturing); the capture is invalidated",
                        op);
}

/* Queue a NULL-terminated list of closures (or append it to the capture). */
static tm_status stream_put(struct CUstream_st *s, mock_closure *first) {
    if (!first) return TM_OK;
    mock_closure *last = first;
    for (;; last = last->next) {
        if (!last->placed) last->placed = true, last->dev = s->dev;
        if (!last->next) break;
    }
    pthread_mutex_lock(&s->mu);
    if (s->origin) { /* joined: the work goes to the capture it joined */
        struct CUstream_st *o = s->origin;
        s->unjoined = true;
        pthread_mutex_unlock(&s->mu);
        return stream_put(o, first);
    }
    if (s->failed) {
        const tm_status st = stream_sticky(s);
        pthread_mutex_unlock(&s->mu);
        closure_list_free(first);
        return st;
    }
    if (s->capturing) {
        if (s->cap_tail)
            s->cap_tail->next = first;
        else
            s->cap_head = first;
        s->cap_tail = last;
    } else {
        for (mock_closure *c = first; c; c = c->next)
            if (c->queued) c->queued(c->arg);
        if (s->tail)
            s->tail->next = first;
        else
            s->head = first;
        s->tail = last;
        pthread_cond_signal(&s->work);
    }
    pthread_mutex_unlock(&s->mu);
    return TM_OK;
}

tm_status mock_stream_check(tm_cuda_stream s, const char *op) {
    return s ? TM_OK
             : tm_error_set(TM_ERR_ARG, "%s: NULL stream (the mock has no default stream)", op);
}

tm_status mock_launch(tm_cuda_stream stream, const char *op, mock_fn fn, const void *arg,
                      size_t size) {
    if (stream && stream->dev >= 0 && stream->dev != mock_t_cur)
        return tm_error_set(TM_ERR_DEVICE,
                            "mock: %s on GPU %d's stream while GPU %d is current (invalid "
                            "resource handle: the thread must cuda_device_select it)",
                            op, stream->dev, mock_t_cur);
    return mock_stream_launch(stream, op, fn, arg, size);
}

tm_status mock_stream_launch(tm_cuda_stream stream, const char *op, mock_fn fn, const void *arg,
                             size_t size) {
    tm_status st = mock_stream_check(stream, op);
    if (st != TM_OK) return st;
    mock_closure *c = closure_new(op, fn, arg, size);
    if (!c) return tm_error_set(TM_ERR_NOMEM, "%s: out of host memory for the launch", op);
    return stream_put(stream, c);
}

tm_status mock_not_in_capture(tm_cuda_stream stream, const char *op) {
    tm_status st = mock_stream_check(stream, op);
    if (st != TM_OK) return st;
    pthread_mutex_lock(&stream->mu);
    if (stream->capturing || stream->origin) st = mock_capture_break(stream, op);
    pthread_mutex_unlock(&stream->mu);
    return st;
}

struct CUstream_st *mock_stream_create(int dev) {
    struct CUstream_st *s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->dev = dev;
    s->latency_us = mock_env_long("MOCK_GPU_LATENCY_US", 0);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    pthread_cond_init(&s->idle, NULL);
    if (pthread_create(&s->thread, NULL, stream_worker, s) != 0) {
        pthread_cond_destroy(&s->idle);
        pthread_cond_destroy(&s->work);
        pthread_mutex_destroy(&s->mu);
        free(s);
        return NULL;
    }
    pthread_setname_np(s->thread, "mock-gpu");
    return s;
}

void mock_stream_destroy(struct CUstream_st *s) {
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL); /* after the queue has drained, as cudaStreamSynchronize */
    closure_list_free(s->cap_head);
    pthread_cond_destroy(&s->idle);
    pthread_cond_destroy(&s->work);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

tm_status cuda_stream_create(tm_cuda_stream *out) {
    *out =
        mock_stream_create(mock_t_cur); /* its kernels launch with that device current, and address
                                    its memory only (copies go anywhere, as in CUDA) */
    if (*out) (*out)->side = true;
    return *out ? TM_OK : tm_error_set(TM_ERR_DEVICE, "mock: cannot start a stream's worker");
}

void cuda_stream_free(tm_cuda_stream stream) {
    if (stream) mock_stream_destroy(stream);
}

tm_status cuda_stream_sync(tm_cuda_stream s) {
    tm_status st = mock_stream_check(s, "cuda_stream_sync");
    if (st != TM_OK) return st;
    pthread_mutex_lock(&s->mu);
    if (s->capturing || s->origin) {
        st = mock_capture_break(s, "cuda_stream_sync");
    } else {
        while (s->head || s->busy) pthread_cond_wait(&s->idle, &s->mu);
        if (s->failed) st = stream_sticky(s);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

tm_status cuda_stream_query(tm_cuda_stream s, bool *idle) {
    *idle = false;
    tm_status st = mock_stream_check(s, "cuda_stream_query");
    if (st != TM_OK) return st;
    pthread_mutex_lock(&s->mu);
    if (s->capturing || s->origin) {
        st = mock_capture_break(s, "cuda_stream_query");
    } else {
        *idle = !s->head && !s->busy;
        if (s->failed) st = stream_sticky(s);
    }
    pthread_mutex_unlock(&s->mu);
    return st;
}

/* ---- graphs ---- */

struct tm_cuda_graph {
    mock_closure *head; /* the captured closures, in order */
};

tm_status cuda_graph_begin(tm_cuda_stream stream) {
    tm_status st = mock_stream_check(stream, "cuda_graph_begin");
    if (st != TM_OK) return st;
    pthread_mutex_lock(&stream->mu);
    if (stream->capturing)
        st = tm_error_set(TM_ERR_DEVICE, "mock: cuda_graph_begin: the stream is already capturing");
    else if (stream->failed)
        st = stream_sticky(stream);
    else {
        stream->capturing = true, stream->cap_invalid = false, stream->cap_why[0] = '\0';
        stream->cap_head = stream->cap_tail = NULL, stream->n_joined = 0;
    }
    pthread_mutex_unlock(&stream->mu);
    return st;
}

tm_status cuda_graph_end(tm_cuda_stream stream, bool keep, tm_cuda_graph **out) {
    *out = NULL;
    tm_status st = mock_stream_check(stream, "cuda_graph_end");
    if (st != TM_OK) return st;
    pthread_mutex_lock(&stream->mu);
    const bool was = stream->capturing;
    bool invalid = stream->cap_invalid;
    char why[sizeof(stream->cap_why)];
    memcpy(why, stream->cap_why, sizeof(why));
    mock_closure *list = stream->cap_head;
    stream->capturing = false, stream->cap_invalid = false;
    stream->cap_head = stream->cap_tail = NULL;
    bool unjoined = false;
    for (int i = 0; i < stream->n_joined; i++) { /* the joined streams leave the capture */
        struct CUstream_st *j = stream->joined[i];
        pthread_mutex_lock(&j->mu);
        unjoined |= j->unjoined;
        if (j->cap_invalid && !invalid) /* a joined stream broke the capture */
            invalid = true, memcpy(why, j->cap_why, sizeof(why));
        j->origin = NULL, j->unjoined = false, j->cap_invalid = false;
        pthread_mutex_unlock(&j->mu);
    }
    stream->n_joined = 0;
    pthread_mutex_unlock(&stream->mu);
    if (was && keep && unjoined && !invalid) {
        closure_list_free(list);
        return tm_error_set(TM_ERR_DEVICE, "mock: cuda_graph_end: a stream joined the capture and "
                                           "was not waited for (CUDA: capture unjoined)");
    }
    if (!was)
        return tm_error_set(TM_ERR_DEVICE, "mock: cuda_graph_end: the stream is not capturing");
    if (!keep) {
        closure_list_free(list);
        return TM_OK;
    }
    if (invalid) {
        closure_list_free(list);
        return tm_error_set(TM_ERR_DEVICE,
                            "mock: cuda_graph_end: the capture was invalidated by %s (CUDA: "
                            "operation failed due to a previous error during capture)",
                            why);
    }
    tm_cuda_graph *g = calloc(1, sizeof(*g));
    if (!g) {
        closure_list_free(list);
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    }
    g->head = list;
    *out = g;
    return TM_OK;
}

tm_status cuda_graph_launch(tm_cuda_graph *g, tm_cuda_stream stream) {
    tm_status st = mock_stream_check(stream, "cuda_graph_launch");
    if (st != TM_OK) return st;
    if (!g) return tm_error_set(TM_ERR_ARG, "cuda_graph_launch: NULL graph");
    mock_closure *first = NULL, **tail = &first;
    for (const mock_closure *c = g->head; c; c = c->next) {
        mock_closure *k = malloc(sizeof(*k) + c->size); /* the arguments, by value */
        if (!k) {
            closure_list_free(first);
            return tm_error_set(TM_ERR_NOMEM, "cuda_graph_launch: out of host memory");
        }
        memcpy(k, c, sizeof(*k) + c->size);
        k->next = NULL;
        *tail = k, tail = &k->next;
    }
    return stream_put(stream, first);
}

void cuda_graph_free(tm_cuda_graph *g) {
    if (!g) return;
    closure_list_free(g->head);
    free(g);
}

/* ---- events and timers ---- */

struct CUevent_st {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct CUstream_st *cap;    /* last recorded in this stream's capture (NULL: outside one) */
    struct CUstream_st *cap_by; /* by this stream (the capturing one or one that joined it) */
    uint64_t queued, done;      /* records put on a run queue / run or dropped */
    bool dropped;               /* the last record was dropped: its stream had failed */
    double t_ms;                /* host monotonic time of the last record that ran */
    int dev;                    /* the device current when it was made */
};

typedef struct event_arg {
    struct CUevent_st *e;
} event_arg;

static void event_queued(void *arg) {
    struct CUevent_st *e = ((event_arg *)arg)->e;
    pthread_mutex_lock(&e->mu);
    e->queued++;
    pthread_mutex_unlock(&e->mu);
}

static void event_finish(struct CUevent_st *e, bool dropped) {
    pthread_mutex_lock(&e->mu);
    if (!dropped) e->t_ms = mock_now_ms();
    e->done++, e->dropped = dropped;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

static bool event_run(void *arg, char *err, size_t err_size) {
    event_finish(((event_arg *)arg)->e, false);
    return true;
}

static void event_cancel(void *arg) {
    event_finish(((event_arg *)arg)->e, true);
}

tm_status cuda_event_create(tm_cuda_event *out) {
    struct CUevent_st *e = calloc(1, sizeof(*e));
    *out = e;
    if (!e) return tm_error_set(TM_ERR_NOMEM, "mock: out of host memory for an event");
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->dev = mock_t_cur;
    return TM_OK;
}

void cuda_event_free(tm_cuda_event e) {
    if (!e) return;
    pthread_mutex_lock(&e->mu); /* a queued record still points here */
    while (e->done < e->queued) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

tm_status cuda_event_record(tm_cuda_event e, tm_cuda_stream stream) {
    tm_status st = mock_stream_check(stream, "cuda_event_record");
    if (st != TM_OK) return st;
    if (!e) return tm_error_set(TM_ERR_ARG, "cuda_event_record: NULL event");
    if (stream->dev >= 0 && stream->dev != e->dev) /* as CUDA's: an event records only there */
        return tm_error_set(TM_ERR_DEVICE,
                            "mock: cuda_event_record of an event made on GPU %d on GPU %d's "
                            "stream (CUDA: invalid resource handle)",
                            e->dev, stream->dev);
    pthread_mutex_lock(&stream->mu);
    struct CUstream_st *cap = stream->origin ? stream->origin : stream->capturing ? stream : NULL;
    pthread_mutex_unlock(&stream->mu);
    pthread_mutex_lock(&e->mu);
    e->cap = cap, e->cap_by = stream;
    pthread_mutex_unlock(&e->mu);
    if (cap) return TM_OK; /* a node of the graph: the list's order keeps what it orders */
    const event_arg a = {e};
    mock_closure *c = closure_new("cuda_event_record", event_run, &a, sizeof(a));
    if (!c) return tm_error_set(TM_ERR_NOMEM, "cuda_event_record: out of host memory");
    c->queued = event_queued, c->cancel = event_cancel, c->delay = false;
    return stream_put(stream, c);
}

/* Wait for the event's latest record (as queued now) and give its time. */
static tm_status event_wait(struct CUevent_st *e, double *t_ms) {
    pthread_mutex_lock(&e->mu);
    const uint64_t want = e->queued;
    while (e->done < want) pthread_cond_wait(&e->cv, &e->mu);
    const bool dropped = e->dropped;
    *t_ms = e->t_ms;
    pthread_mutex_unlock(&e->mu);
    if (want == 0)
        return tm_error_set(
            TM_ERR_DEVICE,
            "mock: an event that was never recorded (CUDA: invalid resource handle)");
    if (dropped)
        return tm_error_set(TM_ERR_DEVICE, "mock: the event's stream failed before the record");
    return TM_OK;
}

/* The stream's worker blocks until the event's record number `want` has run
 * (or been dropped), as a GPU stream waits on an event from another. */
typedef struct wait_event_arg {
    struct CUevent_st *e;
    uint64_t want;
} wait_event_arg;

static bool wait_event_run(void *arg, char *err, size_t err_size) {
    (void)err, (void)err_size;
    const wait_event_arg *a = arg;
    pthread_mutex_lock(&a->e->mu);
    while (a->e->done < a->want) pthread_cond_wait(&a->e->cv, &a->e->mu);
    pthread_mutex_unlock(&a->e->mu);
    return true;
}

tm_status cuda_stream_wait_event(tm_cuda_stream stream, tm_cuda_event e) {
    tm_status st = mock_stream_check(stream, "cuda_stream_wait_event");
    if (st != TM_OK) return st;
    if (!e) return tm_error_set(TM_ERR_ARG, "cuda_stream_wait_event: NULL event");
    pthread_mutex_lock(&e->mu);
    struct CUstream_st *cap = e->cap, *by = e->cap_by;
    pthread_mutex_unlock(&e->mu);
    if (cap) { /* recorded in a capture */
        pthread_mutex_lock(&cap->mu);
        const bool live = cap->capturing;
        pthread_mutex_unlock(&cap->mu);
        if (!live)
            return tm_error_set(TM_ERR_DEVICE, "mock: cuda_stream_wait_event: the event was "
                                               "recorded in a capture that has ended");
        if (stream == cap) { /* the capturing stream waits for a joined one: joined back */
            if (by != cap) {
                pthread_mutex_lock(&by->mu);
                by->unjoined = false;
                pthread_mutex_unlock(&by->mu);
            }
            return TM_OK;
        }
        pthread_mutex_lock(&stream->mu);
        if (stream->capturing || (stream->origin && stream->origin != cap))
            st = mock_capture_break(stream, "cuda_stream_wait_event (another capture)");
        const bool join = st == TM_OK && !stream->origin;
        if (join) stream->origin = cap;
        pthread_mutex_unlock(&stream->mu);
        if (st == TM_OK && by != cap && by != stream) {
            /* a joined stream waits for another: that one's work is joined once this one
               is (CUDA: the capturing stream's dependency reaches it through this one) */
            pthread_mutex_lock(&by->mu);
            const bool carried = by->unjoined;
            by->unjoined = false;
            pthread_mutex_unlock(&by->mu);
            if (carried) {
                pthread_mutex_lock(&stream->mu);
                stream->unjoined = true;
                pthread_mutex_unlock(&stream->mu);
            }
        }
        if (join) {
            pthread_mutex_lock(&cap->mu);
            if (cap->n_joined < 2 * MOCK_MAX_GPUS)
                cap->joined[cap->n_joined++] = stream;
            else
                st = mock_capture_break(cap, "too many streams joining the capture");
            pthread_mutex_unlock(&cap->mu);
        }
        return st;
    }
    if ((st = mock_not_in_capture(stream, "cuda_stream_wait_event"))) return st;
    pthread_mutex_lock(&e->mu);
    const wait_event_arg a = {e, e->queued};
    pthread_mutex_unlock(&e->mu);
    if (!a.want) return TM_OK; /* never recorded: nothing to wait for */
    return mock_stream_launch(stream, "cuda_stream_wait_event", wait_event_run, &a, sizeof(a));
}

tm_status cuda_event_query(tm_cuda_event e, bool *done) {
    if (!e) return tm_error_set(TM_ERR_ARG, "cuda_event_query: NULL event");
    pthread_mutex_lock(&e->mu);
    *done = e->done >= e->queued;
    const bool dropped = e->dropped && *done;
    pthread_mutex_unlock(&e->mu);
    return dropped ? tm_error_set(TM_ERR_DEVICE, "mock: the event's stream failed") : TM_OK;
}

tm_status cuda_event_elapsed(tm_cuda_event a, tm_cuda_event b, float *ms) {
    double ta = 0, tb = 0;
    if (a->dev != b->dev)
        return tm_error_set(TM_ERR_DEVICE,
                            "mock: cuda_event_elapsed between events of GPUs %d and %d (CUDA: "
                            "invalid resource handle)",
                            a->dev, b->dev);
    tm_status st = event_wait(b, &tb);
    if (st == TM_OK) st = event_wait(a, &ta);
    if (st != TM_OK) return tm_error_wrap(st, "cuda_event_elapsed: ");
    *ms = (float)(tb - ta);
    return TM_OK;
}

struct tm_cuda_timer {
    tm_cuda_stream stream;
    tm_cuda_event start, stop;
};

tm_status cuda_timer_create(tm_cuda_device *dev, tm_cuda_timer **out) {
    *out = NULL;
    tm_cuda_timer *t = calloc(1, sizeof(*t));
    if (!t) return tm_error_set(TM_ERR_NOMEM, "mock: out of host memory for a timer");
    t->stream = cuda_device_stream(dev);
    tm_status st = cuda_event_create(&t->start);
    if (st == TM_OK) st = cuda_event_create(&t->stop);
    if (st != TM_OK) {
        cuda_timer_free(t);
        return st;
    }
    *out = t;
    return TM_OK;
}

tm_status cuda_timer_start(tm_cuda_timer *t) {
    return cuda_event_record(t->start, t->stream);
}

tm_status cuda_timer_stop(tm_cuda_timer *t, float *ms) {
    tm_status st = mock_not_in_capture(t->stream, "cuda_timer_stop"); /* it waits */
    if (st == TM_OK) st = cuda_event_record(t->stop, t->stream);
    return st != TM_OK ? st : cuda_event_elapsed(t->start, t->stop, ms);
}

void cuda_timer_free(tm_cuda_timer *t) {
    if (!t) return;
    cuda_event_free(t->start);
    cuda_event_free(t->stop);
    free(t);
}
