/* The worker thread that owns the context, and the slots (--parallel N) that
 * run generations on it (server_internal.h).
 *
 * Each slot has a thread that runs one generation at a time (srv_generate:
 * sampling, text, stop strings) and asks the worker for the steps it needs:
 * its prompt evaluated (srv_slot_eval) or a token appended (srv_slot_post, then
 * srv_slot_wait: the slot decodes and sends the token's text while the step runs).
 * The worker creates the context in its own thread and loops:
 *   - queued jobs go to free slots in arrival order, each to the free slot
 *     whose cached tokens share the longest prefix with its prompt (ties: the
 *     least recently used); a job cancelled while it waited is dropped unrun;
 *     other jobs (a cache plan) run on the worker between steps;
 *   - prompts go in prompt steps of up to the batch's rows (tm_eval_batch):
 *     every slot with prompt work waiting gives the step its next chunk, the
 *     batch split evenly between them (a short rest leaves its rows to the
 *     others; the odd rows go round robin), so waiting prompts share each
 *     step (with experts in RAM on a GPU, each routed expert's copy);
 *   - a decode step runs when every decoding slot has handed in its token:
 *     one row per slot (tm_eval_rows); each slot samples its row of the
 *     step's logits in place (tm_logits right after the step), and no step
 *     runs until all have (a prompt's last logits are copied to its slot);
 *     when prompts and decodes
 *     both wait, the steps alternate, so a long prompt (or several) delays the
 *     streams by one prompt step (at most the batch's rows) at a time;
 *   - after a generation ends, the VRAM cache's updater between steps.
 * The steps hold step_mu (readers of the counters and the cache take it).
 * The worker frees the context in its own thread when the server stops.
 * Everything goes through the library's API (include/tiermoe.h); the slots'
 * threads read the context only where the API says a read of one sequence
 * may run beside another's step (tm_seq_tokens) or the logits stay until the
 * next step (tm_logits), which the worker does not run while a slot reads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

/* ---- a slot's side (its thread) ---- */

/* Post sl's request and wait for the worker's answer (under q_mu). */
static tm_status slot_ask(tm_server *s, srv_slot *sl, srv_slot_req req) {
    sl->req = req;
    pthread_cond_broadcast(&s->q_cv);
    while (sl->req != SRV_SLOT_NONE) pthread_cond_wait(&sl->cv, &s->q_mu);
    return sl->st;
}

tm_status srv_slot_eval(tm_server *s, srv_slot *sl, const int32_t *ids, int64_t n, bool fresh,
                        int64_t *n_eval) {
    pthread_mutex_lock(&s->q_mu);
    sl->ids = ids, sl->n_ids = n, sl->fresh = fresh, sl->eval_begun = false, sl->n_eval = 0;
    tm_status st = slot_ask(s, sl, SRV_SLOT_EVAL);
    *n_eval = sl->n_eval;
    if (st == TM_OK) sl->decoding = true;
    pthread_mutex_unlock(&s->q_mu);
    if (st != TM_OK) srv_error_set(st, "%s", sl->msg);
    return st;
}

/* The slot has sampled: steps may overwrite the context's logits (q_mu held). */
static void slot_view_release(tm_server *s, srv_slot *sl) {
    if (!sl->viewing) return;
    sl->viewing = false;
    if (--s->n_viewing == 0) pthread_cond_broadcast(&s->q_cv);
}

/* Whether every decoding slot has handed in its token (q_mu held). */
static bool slots_all_posted(const tm_server *s) {
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].decoding && s->slots[i].req != SRV_SLOT_PUSH) return false;
    return true;
}

void srv_slot_post(tm_server *s, srv_slot *sl, int32_t tok) {
    pthread_mutex_lock(&s->q_mu);
    slot_view_release(s, sl);
    sl->tok = tok;
    sl->req = SRV_SLOT_PUSH;
    /* wake the worker only for the post that lets the step run (a wake at every post
       made it take q_mu 8 times a step at 8 streams; measured on the H200 machine, the
       8-stream speed did not change: 834.0 and 826.0 t/s against 827.1 and 826.4) */
    if (!s->n_viewing && slots_all_posted(s)) pthread_cond_broadcast(&s->q_cv);
    pthread_mutex_unlock(&s->q_mu);
}

tm_status srv_slot_wait(tm_server *s, srv_slot *sl) {
    pthread_mutex_lock(&s->q_mu);
    while (sl->req != SRV_SLOT_NONE) pthread_cond_wait(&sl->cv, &s->q_mu);
    const tm_status st = sl->st;
    if (st != TM_OK) sl->decoding = false;
    pthread_mutex_unlock(&s->q_mu);
    if (st != TM_OK) srv_error_set(st, "%s", sl->msg);
    return st;
}

/* The slot is free for the next job (q_mu held). */
static void slot_free(tm_server *s, srv_slot *sl) {
    sl->job = NULL, sl->decoding = false;
    s->n_busy--;
    s->update_pending = true;
    pthread_cond_broadcast(&s->q_cv);
}

void srv_slot_end(tm_server *s, srv_slot *sl) {
    pthread_mutex_lock(&s->q_mu);
    slot_view_release(s, sl);
    slot_free(s, sl);
    pthread_mutex_unlock(&s->q_mu);
}

static void count_cancelled(tm_server *s) {
    pthread_mutex_lock(&s->metrics.mu);
    s->metrics.c.requests[SRV_OUTCOME_CANCELLED]++;
    pthread_mutex_unlock(&s->metrics.mu);
}

static void *slot_main(void *arg) {
    srv_slot *sl = arg;
    tm_server *s = sl->server;
    pthread_mutex_lock(&s->q_mu);
    for (;;) {
        while (!sl->job && !s->slots_exit) pthread_cond_wait(&sl->cv, &s->q_mu);
        srv_job *j = sl->job;
        if (!j) break;
        pthread_mutex_unlock(&s->q_mu);
        j->run(s, j);
        pthread_mutex_lock(&s->q_mu);
        if (sl->job == j) slot_free(s, sl); /* a job that ended before srv_slot_end */
        pthread_mutex_unlock(&s->q_mu);
        srv_job_unref(j);
        pthread_mutex_lock(&s->q_mu);
    }
    pthread_mutex_unlock(&s->q_mu);
    return NULL;
}

/* ---- the worker's side ---- */

/* The free slot for job j: the longest shared prefix, then the least recently used. */
static srv_slot *slot_pick(tm_server *s, const srv_job *j) {
    srv_slot *best = NULL;
    int64_t best_keep = -1;
    for (int i = 0; i < s->n_slots; i++) {
        srv_slot *sl = &s->slots[i];
        if (sl->job) continue;
        int64_t keep = 0;
        if (j->prompt && tm_seq_shared(s->ctx, sl->id, j->prompt, j->n_prompt, &keep) != TM_OK)
            keep = 0; /* cannot fail: a slot's sequence, a prompt of at least one token */
        if (keep > best_keep || (keep == best_keep && sl->last_used < best->last_used))
            best = sl, best_keep = keep;
    }
    return best;
}

/* Hand queued jobs to free slots (under q_mu; may drop it to run a job that
 * is not a generation). */
static void worker_dispatch(tm_server *s) {
    while (s->q_head && !atomic_load(&s->stopping)) {
        srv_job *j = s->q_head;
        srv_slot *sl = NULL;
        if (!srv_job_cancelled(j) && j->generation && !(sl = slot_pick(s, j))) return;
        s->q_head = j->next, j->next = NULL;
        if (!s->q_head) s->q_tail = NULL;
        s->q_len--;
        if (srv_job_cancelled(j)) { /* the client left while it waited */
            pthread_mutex_unlock(&s->q_mu);
            if (j->generation) count_cancelled(s);
            srv_job_finish(j, 499, NULL);
            srv_job_unref(j);
            pthread_mutex_lock(&s->q_mu);
        } else if (!j->generation) { /* between steps, on this thread */
            s->n_busy++;
            pthread_mutex_unlock(&s->q_mu);
            j->run(s, j);
            srv_job_unref(j);
            pthread_mutex_lock(&s->q_mu);
            s->n_busy--;
        } else {
            j->slot = sl;
            sl->job = j, sl->last_used = ++s->slot_clock;
            s->n_busy++;
            pthread_cond_broadcast(&sl->cv);
        }
    }
}

/* Answer a slot's request (under q_mu). */
static void slot_answer(tm_server *s, srv_slot *sl, tm_status st) {
    sl->st = st;
    if (st != TM_OK) snprintf(sl->msg, sizeof(sl->msg), "%s", server_error_message());
    sl->req = SRV_SLOT_NONE;
    pthread_cond_broadcast(&sl->cv);
}

/* A prompt step's share of each slot's rest (rest[0..k), in round-robin
 * order): the batch split evenly, what a short rest leaves over going to the
 * others, the last few rows to the first slots in that order (take[i] may be
 * 0 when more slots wait than the batch has rows). */
static void prompt_shares(int64_t batch, const int64_t *rest, int64_t *take, int k) {
    int left = k;
    for (int i = 0; i < k; i++) take[i] = -1;
    for (bool fit = true; fit && left;) { /* rests within an even share take all of it */
        fit = false;
        for (int i = 0; i < k; i++)
            if (take[i] < 0 && rest[i] <= batch / left) {
                take[i] = rest[i], batch -= rest[i], left--, fit = true;
                break;
            }
    }
    const int64_t even = left ? batch / left : 0;
    int64_t extra = left ? batch % left : 0;
    for (int i = 0; i < k; i++)
        if (take[i] < 0) take[i] = even + (extra > 0), extra -= extra > 0;
}

/* Where slot sl's prompt goes on from before its first chunk: its sequence
 * rewound to the prefix it shares with the prompt (none when fresh). Under step_mu. */
static tm_status prompt_start(tm_server *s, srv_slot *sl) {
    int64_t keep = 0;
    tm_status st = TM_OK;
    if (sl->fresh) st = tm_seq_rewind(s->ctx, sl->id, 0, NULL);
    if (st == TM_OK) st = tm_seq_shared(s->ctx, sl->id, sl->ids, sl->n_ids, &keep);
    if (st == TM_OK) st = tm_seq_rewind(s->ctx, sl->id, keep, NULL);
    return st;
}

/* One prompt step of the k slots in p (round-robin order): the next chunk of
 * each, together at most the batch (tm_eval_batch: one step, so one copy of
 * each routed expert serves them all). q_mu held on entry and exit, dropped
 * for the step; answers each slot once its prompt is in. */
static void worker_prompts(tm_server *s, srv_slot **p, int k) {
    int n = 0;
    bool first[TM_SERVER_MAX_PARALLEL];
    for (int i = 0; i < k; i++) {
        if (p[i]->eval_begun && srv_job_cancelled(p[i]->job)) { /* stop between chunks */
            slot_answer(s, p[i], TM_OK);
            continue;
        }
        first[n] = !p[i]->eval_begun;
        p[i]->eval_begun = true;
        p[n++] = p[i];
    }
    if (!n) return;
    pthread_mutex_unlock(&s->q_mu);
    pthread_mutex_lock(&s->step_mu);
    tm_status st[TM_SERVER_MAX_PARALLEL];
    int64_t len[TM_SERVER_MAX_PARALLEL] = {0}, rest[TM_SERVER_MAX_PARALLEL],
            share[TM_SERVER_MAX_PARALLEL], take[TM_SERVER_MAX_PARALLEL] = {0};
    int go[TM_SERVER_MAX_PARALLEL], m = 0; /* the slots that go on */
    for (int i = 0; i < n; i++) {
        st[i] = first[i] ? prompt_start(s, p[i]) : TM_OK;
        if (st[i] == TM_OK) st[i] = tm_seq_length(s->ctx, p[i]->id, &len[i]);
        if (srv_error_api(st[i]) != TM_OK)
            snprintf(p[i]->msg, sizeof(p[i]->msg), "%s", server_error_message());
        else
            rest[m] = p[i]->n_ids - len[i], go[m++] = i;
    }
    prompt_shares(s->n_batch, rest, share, m);
    int64_t rows = 0;
    for (int j = 0; j < m; j++) {
        const int i = go[j];
        take[i] = share[j];
        for (int64_t t = 0; t < take[i]; t++)
            s->batch_seqs[rows] = p[i]->id, s->batch_ids[rows++] = p[i]->ids[len[i] + t];
    }
    tm_status bst = TM_OK;
    const uint64_t t0 = srv_time_ns();
    if (rows) bst = srv_error_api(tm_eval_batch(s->ctx, rows, s->batch_seqs, s->batch_ids));
    const uint64_t t1 = srv_time_ns();
    for (int i = 0; i < n; i++) {
        srv_slot *sl = p[i];
        const float *logits = NULL;
        if (!take[i]) continue; /* failed before the step, or no row left for it this time */
        st[i] = bst;
        if (st[i] == TM_OK && len[i] + take[i] == sl->n_ids &&
            (st[i] = srv_error_api(tm_logits(s->ctx, sl->id, &logits))) == TM_OK) {
            memcpy(sl->logits, logits, (size_t)s->info.n_vocab * sizeof(float));
            sl->view = sl->logits;
        }
        if (st[i] != TM_OK) snprintf(sl->msg, sizeof(sl->msg), "%s", server_error_message());
    }
    pthread_mutex_unlock(&s->step_mu);
    if (rows) {
        pthread_mutex_lock(&s->metrics.mu);
        s->metrics.c.prompt_steps++, s->metrics.c.prompt_step_rows += (uint64_t)rows;
        for (int i = 0; i < n; i++) s->metrics.c.prompt_step_seqs += take[i] > 0;
        s->metrics.c.prompt_step_s += (t1 - t0) * 1e-9;
        pthread_mutex_unlock(&s->metrics.mu);
    }
    pthread_mutex_lock(&s->q_mu);
    for (int i = 0; i < n; i++) {
        srv_slot *sl = p[i];
        if (st[i] == TM_OK) sl->n_eval += take[i];
        if (st[i] != TM_OK || len[i] + take[i] == sl->n_ids) { /* sl->msg says why it failed */
            sl->st = st[i], sl->req = SRV_SLOT_NONE;
            pthread_cond_broadcast(&sl->cv);
        }
    }
}

/* One decode step of the n slots in rows (q_mu held on entry and exit). */
static void worker_decode(tm_server *s, srv_slot **rows, int n) {
    int32_t seqs[TM_SERVER_MAX_PARALLEL], ids[TM_SERVER_MAX_PARALLEL];
    const float *view[TM_SERVER_MAX_PARALLEL];
    for (int i = 0; i < n; i++) seqs[i] = rows[i]->id, ids[i] = rows[i]->tok;
    pthread_mutex_unlock(&s->q_mu);
    pthread_mutex_lock(&s->step_mu);
    const uint64_t t0 = srv_time_ns();
    tm_status st = tm_eval_rows(s->ctx, n, seqs, ids);
    const uint64_t t1 = srv_time_ns();
    for (int i = 0; i < n && st == TM_OK; i++) st = tm_logits(s->ctx, seqs[i], &view[i]);
    srv_error_api(st);
    pthread_mutex_unlock(&s->step_mu);
    pthread_mutex_lock(&s->metrics.mu);
    s->metrics.c.decode_steps++, s->metrics.c.decode_rows += (uint64_t)n;
    s->metrics.c.decode_step_s += (t1 - t0) * 1e-9;
    pthread_mutex_unlock(&s->metrics.mu);
    pthread_mutex_lock(&s->q_mu);
    for (int i = 0; i < n; i++) {
        if (st == TM_OK) { /* each slot samples its row in place, all at once */
            rows[i]->view = view[i];
            rows[i]->viewing = true, s->n_viewing++;
        }
        slot_answer(s, rows[i], st);
    }
}

/* Create the context (with the expert counters) and the slots in this thread. */
static tm_status worker_setup(tm_server *s) {
    tm_context_opts o = s->opts;
    o.n_seq = s->p.parallel > 0 ? s->p.parallel : 1;
    o.expert_stats = !s->p.no_trace;
    o.expert_trace_names = !s->p.no_trace && s->p.trace_names;
    tm_status st = srv_error_api(tm_context_create(s->m, &o, &s->ctx));
    if (st != TM_OK) return st;
    s->counters = o.expert_stats;
    tm_context_info ci;
    if ((st = srv_error_api(tm_context_describe(s->ctx, &ci))) != TM_OK) return st;
    s->has_cache = ci.cache;
    s->n_ctx = ci.n_ctx, s->n_batch = ci.n_batch;
    s->batch_seqs = malloc((size_t)s->n_batch * sizeof(int32_t));
    s->batch_ids = malloc((size_t)s->n_batch * sizeof(int32_t));
    srv_slot *slots = calloc((size_t)o.n_seq, sizeof(*slots));
    if (!slots || !s->batch_seqs || !s->batch_ids) {
        free(slots);
        return srv_error_set(TM_ERR_NOMEM, "out of memory for %d slots", o.n_seq);
    }
    pthread_mutex_lock(&s->q_mu); /* handlers count the busy slots */
    s->slots = slots;
    for (int i = 0; i < o.n_seq && st == TM_OK; i++) {
        srv_slot *sl = &s->slots[i];
        sl->id = i, sl->server = s;
        pthread_cond_init(&sl->cv, NULL);
        s->n_slots = i + 1;
        if (!(sl->logits = malloc((size_t)s->info.n_vocab * sizeof(float))))
            st = srv_error_set(TM_ERR_NOMEM, "out of memory for a slot's logits");
        else if (pthread_create(&sl->thread, NULL, slot_main, sl))
            st = srv_error_set(TM_ERR_NOMEM, "cannot start the thread of slot %d", i);
        else
            sl->thread_started = true;
    }
    pthread_mutex_unlock(&s->q_mu);
    return st;
}

/* Run what is ready (q_mu held); false when nothing is. */
static bool worker_work(tm_server *s) {
    srv_slot *rows[TM_SERVER_MAX_PARALLEL], *prompts[TM_SERVER_MAX_PARALLEL];
    int n_rows = 0, n_decoding = 0, n_prompts = 0;
    /* round robin: from the slot after the last prompt step's first */
    for (int k = 0; k < s->n_slots; k++) {
        srv_slot *sl = &s->slots[(s->prompt_next + k) % s->n_slots];
        if (sl->req == SRV_SLOT_EVAL) prompts[n_prompts++] = sl;
    }
    const bool prompt = n_prompts > 0;
    for (int i = 0; i < s->n_slots; i++) {
        srv_slot *sl = &s->slots[i];
        n_decoding += sl->decoding;
        if (sl->decoding && sl->req == SRV_SLOT_PUSH) rows[n_rows++] = sl;
    }
    /* a decode step once every decoding slot has its token in; when a prompt
     * waits too, the two take turns */
    const bool decode = n_rows && n_rows == n_decoding;
    if (s->n_viewing && (decode || prompt)) return false; /* a slot still reads the logits */
    if (decode && (!prompt || !s->last_was_decode)) {
        s->last_was_decode = true;
        worker_decode(s, rows, n_rows);
        return true;
    }
    if (prompt) {
        s->prompt_next = (prompts[0]->id + 1) % s->n_slots;
        s->last_was_decode = false;
        worker_prompts(s, prompts, n_prompts);
        return true;
    }
    if (s->update_pending) {
        s->update_pending = false;
        if (atomic_load(&s->stopping)) return true;
        pthread_mutex_unlock(&s->q_mu);
        pthread_mutex_lock(&s->step_mu);
        if (tm_cache_update(s->ctx) != TM_OK)
            fprintf(stderr, "tiermoe serve: the cache update failed: %s\n", tm_error_message());
        pthread_mutex_unlock(&s->step_mu);
        pthread_mutex_lock(&s->q_mu);
        return true;
    }
    return false;
}

static void worker_slots_end(tm_server *s) {
    pthread_mutex_lock(&s->q_mu);
    s->slots_exit = true;
    for (int i = 0; i < s->n_slots; i++) pthread_cond_broadcast(&s->slots[i].cv);
    pthread_mutex_unlock(&s->q_mu);
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].thread_started) pthread_join(s->slots[i].thread, NULL);
}

/* The counters' summary on stderr and their learn file (--expert-trace-output),
 * as `tiermoe run` ends; the outcome goes to server_stop. */
static void worker_counters_finish(tm_server *s) {
    size_t len = 0;
    char *text = NULL;
    tm_status st = tm_expert_stats_summary(s->ctx, s->p.trace_per_layer, NULL, 0, &len);
    if (st == TM_ERR_ARG && (text = malloc(len + 1)))
        st = tm_expert_stats_summary(s->ctx, s->p.trace_per_layer, text, len + 1, &len);
    if (st == TM_OK) fputs(text, stderr);
    free(text);
    const char *out = s->p.trace_output;
    if (st == TM_OK && out && (st = tm_expert_stats_write(s->ctx, out)) == TM_OK)
        fprintf(stderr, "expert trace: wrote %s\n", out);
    if (st != TM_OK) snprintf(s->trace_error, sizeof(s->trace_error), "%s", tm_error_message());
    s->trace_status = st;
}

static void *worker_main(void *arg) {
    tm_server *s = arg;
    const tm_status setup = worker_setup(s);
    pthread_mutex_lock(&s->q_mu);
    s->worker_status = setup;
    if (setup != TM_OK) snprintf(s->error, sizeof(s->error), "%s", server_error_message());
    s->worker_ready = true;
    pthread_cond_broadcast(&s->q_cv);
    while (setup == TM_OK) {
        worker_dispatch(s);
        if (atomic_load(&s->stopping) && !s->n_busy) break;
        if (!worker_work(s)) pthread_cond_wait(&s->q_cv, &s->q_mu);
    }
    pthread_mutex_unlock(&s->q_mu);
    worker_slots_end(s);
    /* the context stays until the connections are closed (handlers read its counters) */
    pthread_mutex_lock(&s->q_mu);
    while (!s->release) pthread_cond_wait(&s->q_cv, &s->q_mu);
    pthread_mutex_unlock(&s->q_mu);
    for (int i = 0; i < s->n_slots; i++) {
        free(s->slots[i].logits);
        pthread_cond_destroy(&s->slots[i].cv);
    }
    free(s->slots);
    free(s->batch_seqs), free(s->batch_ids);
    s->slots = NULL, s->n_slots = 0, s->batch_seqs = s->batch_ids = NULL;
    if (s->ctx && s->counters) worker_counters_finish(s); /* they live in the context */
    tm_context_free(s->ctx);
    s->ctx = NULL;
    return NULL;
}

tm_status srv_worker_start(tm_server *s) {
    if (pthread_create(&s->worker, NULL, worker_main, s))
        return srv_error_set(TM_ERR_NOMEM, "cannot start the worker thread");
    s->worker_started = true;
    pthread_mutex_lock(&s->q_mu);
    while (!s->worker_ready) pthread_cond_wait(&s->q_cv, &s->q_mu);
    const tm_status st = s->worker_status;
    pthread_mutex_unlock(&s->q_mu);
    if (st != TM_OK) srv_error_set(st, "%s", s->error);
    return st;
}

static json_t *shutdown_error(void) {
    return json_pack("{s:{s:i, s:s, s:s}}", "error", "code", 503, "message",
                     "the server is shutting down", "type", "unavailable_error");
}

void srv_worker_stop(tm_server *s) {
    pthread_mutex_lock(&s->q_mu);
    atomic_store(&s->stopping, true);
    for (int i = 0; i < s->n_slots; i++)
        if (s->slots[i].job) atomic_store(&s->slots[i].job->cancel, true);
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
