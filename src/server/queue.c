/* Jobs and the FIFO request queue (the worker and the slots that run the
 * jobs: slots.c).
 *
 * A job is shared by the handler thread that made it (waiting for its reply,
 * or reading its streamed bytes) and the thread running it: reference
 * counted, one mutex and condition for its bytes and its end. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

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
        st = srv_error_set(TM_ERR_ARG, "the server is shutting down");
    else if (s->q_len >= s->p.max_queue)
        st = srv_error_set(TM_ERR_ARG, "the queue is full: %d requests wait (--max-queue)",
                           s->q_len);
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
    const bool b = s->n_busy > 0;
    pthread_mutex_unlock(&s->q_mu);
    return b;
}

int srv_slots_busy(tm_server *s) {
    pthread_mutex_lock(&s->q_mu);
    int n = 0;
    for (int i = 0; i < s->n_slots; i++) n += s->slots[i].job != NULL;
    pthread_mutex_unlock(&s->q_mu);
    return n;
}
