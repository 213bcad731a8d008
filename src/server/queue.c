/* Jobs, the FIFO request queue and the worker thread that owns the context.
 *
 * A job is shared by the handler thread that made it (waiting for its reply,
 * or reading its streamed bytes) and the worker (running it): reference
 * counted, one mutex and condition for its bytes and its end. The worker
 * creates the context (and the tracer) in its own thread, runs the jobs in
 * arrival order (a job cancelled while it waited is dropped unrun), lets the
 * VRAM cache's updater exchange weak slots after each generation, and frees
 * the context in its own thread when the server stops. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/server_internal.h"

srv_job *srv_job_new(srv_job_fn run, void (*release)(void *), void *data) {
    srv_job *j = calloc(1, sizeof(*j));
    if (!j) return NULL;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* handlers wait with CLOCK_MONOTONIC */
    pthread_mutex_init(&j->mu, NULL);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    j->run = run, j->release = release, j->data = data;
    j->refs = 1;
    atomic_init(&j->cancel, false);
    return j;
}

void srv_job_ref(srv_job *j) {
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
}

void srv_job_unref(srv_job *j) {
    if (!j) return;
    pthread_mutex_lock(&j->mu);
    const int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left) return;
    if (j->release) j->release(j->data);
    json_decref(j->reply);
    free(j->out);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

void srv_job_emit(srv_job *j, const char *data, size_t n) {
    pthread_mutex_lock(&j->mu);
    if (j->out_len + n > j->out_cap) {
        size_t cap = j->out_cap ? j->out_cap : 4096;
        while (cap < j->out_len + n) cap *= 2;
        char *b = realloc(j->out, cap);
        if (!b) { /* the stream loses these bytes: end it rather than send a hole */
            atomic_store(&j->cancel, true);
            pthread_mutex_unlock(&j->mu);
            return;
        }
        j->out = b, j->out_cap = cap;
    }
    memcpy(j->out + j->out_len, data, n);
    j->out_len += n;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

void srv_job_finish(srv_job *j, unsigned status, json_t *reply) {
    pthread_mutex_lock(&j->mu);
    if (!j->done) {
        j->status = status;
        j->reply = reply;
        j->done = true;
    } else {
        json_decref(reply);
    }
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

bool srv_job_cancelled(srv_job *j) {
    return atomic_load(&j->cancel);
}

/* ---- the queue ---- */

tm_status srv_queue_push(tm_server *s, srv_job *j) {
    pthread_mutex_lock(&s->q_mu);
    tm_status st = TM_OK;
    if (atomic_load(&s->stopping))
        st = tm_error_set(TM_ERR_ARG, "the server is shutting down");
    else if (s->q_len >= s->p.max_queue)
        st =
            tm_error_set(TM_ERR_ARG, "the queue is full: %d requests wait (--max-queue)", s->q_len);
    if (st == TM_OK) {
        srv_job_ref(j);
        if (s->q_tail)
            s->q_tail->next = j;
        else
            s->q_head = j;
        s->q_tail = j, s->q_len++;
        pthread_cond_broadcast(&s->q_cv);
    }
    pthread_mutex_unlock(&s->q_mu);
    return st;
}

int srv_queue_depth(tm_server *s) {
    pthread_mutex_lock(&s->q_mu);
    const int n = s->q_len;
    pthread_mutex_unlock(&s->q_mu);
    return n;
}

bool srv_queue_busy(tm_server *s) {
    pthread_mutex_lock(&s->q_mu);
    const bool b = s->busy;
    pthread_mutex_unlock(&s->q_mu);
    return b;
}

static json_t *shutdown_error(void) {
    return json_pack("{s:{s:i, s:s, s:s}}", "error", "code", 503, "message",
                     "the server is shutting down", "type", "unavailable_error");
}

/* ---- the worker ---- */

/* Create the tracer and the context in this thread. */
static tm_status worker_setup(tm_server *s) {
    tm_context_params cp = s->cp;
    tm_status st;
    if (!s->p.no_trace) {
        tm_trace_config tc = s->p.trace;
        tc.stats = true;
        if ((st = trace_create(&tc, s->m, &s->tr)) != TM_OK) return st;
        trace_attach(s->tr, &cp);
    }
    if ((st = model_context_create(s->m, &cp, &s->ctx)) != TM_OK) return st;
    if ((st = model_session_init(&s->seq, s->ctx)) != TM_OK) return st;
    for (uint32_t l = 0; l < s->m->cfg.n_layer; l++)
        s->has_cache |= tier_cache_slots(s->ctx->tier, l) > 0;
    s->n_ctx = s->ctx->n_ctx;
    return TM_OK;
}

static void *worker_main(void *arg) {
    tm_server *s = arg;
    const tm_status setup = worker_setup(s);
    pthread_mutex_lock(&s->q_mu);
    s->worker_status = setup;
    if (setup != TM_OK) snprintf(s->error, sizeof(s->error), "%s", tm_error_message());
    s->worker_ready = true;
    pthread_cond_broadcast(&s->q_cv);
    pthread_mutex_unlock(&s->q_mu);
    for (;;) {
        pthread_mutex_lock(&s->q_mu);
        while (setup == TM_OK && !s->q_head && !atomic_load(&s->stopping))
            pthread_cond_wait(&s->q_cv, &s->q_mu);
        srv_job *j = setup == TM_OK && !atomic_load(&s->stopping) ? s->q_head : NULL;
        if (j) {
            s->q_head = j->next, j->next = NULL;
            if (!s->q_head) s->q_tail = NULL;
            s->q_len--;
            s->busy = true;
            s->running = j;
        }
        pthread_mutex_unlock(&s->q_mu);
        if (!j) break;
        if (srv_job_cancelled(j)) { /* the client left while it waited */
            if (j->generation) {
                pthread_mutex_lock(&s->metrics.mu);
                s->metrics.c.requests[SRV_OUTCOME_CANCELLED]++;
                pthread_mutex_unlock(&s->metrics.mu);
            }
            srv_job_finish(j, 499, NULL);
        } else
            j->run(s, j);
        if (j->generation && !atomic_load(&s->stopping)) {
            pthread_mutex_lock(&s->step_mu);
            if (tier_cache_update(s->ctx->tier, TM_MOE_UPDATE_RATE) != TM_OK)
                fprintf(stderr, "tiermoe serve: the cache update failed: %s\n", tm_error_message());
            pthread_mutex_unlock(&s->step_mu);
        }
        pthread_mutex_lock(&s->q_mu);
        s->busy = false;
        s->running = NULL;
        pthread_mutex_unlock(&s->q_mu);
        srv_job_unref(j);
    }
    /* the context stays until the connections are closed (handlers read its counters) */
    pthread_mutex_lock(&s->q_mu);
    while (!s->release) pthread_cond_wait(&s->q_cv, &s->q_mu);
    pthread_mutex_unlock(&s->q_mu);
    model_session_free(&s->seq);
    model_context_free(s->ctx);
    s->ctx = NULL;
    return NULL;
}

tm_status srv_worker_start(tm_server *s) {
    if (pthread_create(&s->worker, NULL, worker_main, s))
        return tm_error_set(TM_ERR_NOMEM, "cannot start the worker thread");
    s->worker_started = true;
    pthread_mutex_lock(&s->q_mu);
    while (!s->worker_ready) pthread_cond_wait(&s->q_cv, &s->q_mu);
    const tm_status st = s->worker_status;
    pthread_mutex_unlock(&s->q_mu);
    if (st != TM_OK) tm_error_set(st, "%s", s->error);
    return st;
}

void srv_worker_stop(tm_server *s) {
    pthread_mutex_lock(&s->q_mu);
    atomic_store(&s->stopping, true);
    if (s->running) atomic_store(&s->running->cancel, true);
    while (s->q_head) {
        srv_job *j = s->q_head;
        s->q_head = j->next;
        atomic_store(&j->cancel, true);
        srv_job_finish(j, 503, shutdown_error());
        srv_job_unref(j);
    }
    s->q_tail = NULL, s->q_len = 0;
    pthread_cond_broadcast(&s->q_cv);
    pthread_mutex_unlock(&s->q_mu);
}

void srv_worker_release(tm_server *s) {
    if (!s->worker_started) return;
    pthread_mutex_lock(&s->q_mu);
    s->release = true;
    pthread_cond_broadcast(&s->q_cv);
    pthread_mutex_unlock(&s->q_mu);
    pthread_join(s->worker, NULL);
    s->worker_started = false;
}
