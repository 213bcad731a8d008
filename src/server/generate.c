/* One generation on its slot's thread: the prompt evaluated with prefix
 * reuse (tm_seq_prompt) and tokens evaluated one by one, each in a step the
 * worker runs (slots.c: with the other slots' tokens), tokens sampled, text
 * decoded as it comes (complete UTF-8 characters only, invalid bytes as
 * U+FFFD, so JSON can carry it), and stop strings: text that may be the
 * start of one is held back until it is known not to be, and the reply ends
 * where one begins. */
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

void srv_gen_params_free(srv_gen_params *p) {
    free(p->prompt);
    for (int i = 0; i < p->n_stop; i++) free(p->stop[i]);
    memset(p, 0, sizeof(*p));
}

void srv_gen_out_free(srv_gen_out *o) {
    free(o->text);
    memset(o, 0, sizeof(*o));
}

size_t srv_stop_scan(char *const *stops, int n_stop, const char *text, size_t len, size_t from,
                     bool *hit) {
    *hit = false;
    size_t first = len;
    for (int i = 0; i < n_stop; i++) {
        const size_t n = strlen(stops[i]);
        if (!n || n > len - from) continue;
        const char *p = memmem(text + from, len - from, stops[i], n);
        if (p && (size_t)(p - text) < first) first = (size_t)(p - text), *hit = true;
    }
    if (*hit) return first;
    size_t hold = 0; /* the longest tail of text that begins a stop string */
    for (int i = 0; i < n_stop; i++) {
        const size_t n = strlen(stops[i]);
        if (!n) continue;
        for (size_t k = n - 1 < len - from ? n - 1 : len - from; k > hold; k--)
            if (!memcmp(text + len - k, stops[i], k)) {
                hold = k;
                break;
            }
    }
    return len - hold;
}

static tm_status out_append(srv_gen_out *o, const char *text, size_t n) {
    if (o->len + n + 1 > o->cap) {
        size_t cap = o->cap ? o->cap : 256;
        while (cap < o->len + n + 1) cap *= 2;
        char *t = realloc(o->text, cap);
        if (!t) return srv_error_set(TM_ERR_NOMEM, "out of memory for the reply");
        o->text = t, o->cap = cap;
    }
    memcpy(o->text + o->len, text, n);
    o->len += n;
    o->text[o->len] = '\0';
    return TM_OK;
}

/* Send what is safe of the text so far (all of it when final); true at a stop string. */
static bool out_send(srv_gen_out *o, const srv_gen_params *p, srv_delta_fn fn, void *ud,
                     bool final) {
    bool hit;
    size_t safe = srv_stop_scan(p->stop, p->n_stop, o->text, o->len, o->sent, &hit);
    if (hit) o->len = safe, o->text[safe] = '\0';
    if (final) safe = o->len;
    if (safe > o->sent && fn) fn(ud, o->text + o->sent, safe - o->sent);
    if (safe > o->sent) o->sent = safe;
    return hit;
}

static void count(tm_server *s, const srv_gen_out *o, tm_status st) {
    pthread_mutex_lock(&s->metrics.mu);
    srv_counts *m = &s->metrics.c;
    m->requests[st != TM_OK ? SRV_OUTCOME_ERROR
                : o->finish ? SRV_OUTCOME_OK
                            : SRV_OUTCOME_CANCELLED]++;
    m->prompt_tokens += (uint64_t)o->n_prompt;
    m->prompt_eval_tokens += (uint64_t)o->n_eval;
    m->gen_tokens += (uint64_t)o->n_gen;
    m->prompt_s += o->prompt_ms * 1e-3;
    m->gen_s += o->gen_ms * 1e-3;
    if (o->n_eval && o->prompt_ms > 0) m->last_prompt_tps = 1e3 * o->n_eval / o->prompt_ms;
    if (o->n_gen && o->gen_ms > 0) m->last_gen_tps = 1e3 * o->n_gen / o->gen_ms;
    pthread_mutex_unlock(&s->metrics.mu);
}

tm_status srv_generate(tm_server *s, const srv_gen_params *p, srv_job *j, srv_delta_fn fn, void *ud,
                       srv_gen_out *o) {
    memset(o, 0, sizeof(*o));
    o->n_prompt = p->n_prompt;
    tm_sampler *smp = NULL;
    tm_detokenizer *ds = NULL; /* invalid bytes as U+FFFD: JSON carries only UTF-8 */
    tm_status st = srv_error_api(tm_detokenizer_create(s->m, false, true, &ds));
    if (st == TM_OK) st = srv_error_api(tm_sampler_create(s->m, &p->sp, &smp));
    if (st == TM_OK) st = out_append(o, "", 0);
    if (st != TM_OK) goto done;

    srv_slot *sl = j->slot;
    uint64_t t0 = srv_time_ns();
    st = srv_slot_eval(s, sl, p->prompt, p->n_prompt, p->fresh, &o->n_eval);
    o->prompt_ms = (srv_time_ns() - t0) * 1e-6;
    if (st != TM_OK) goto done;

    t0 = srv_time_ns();
    bool hit = false;
    while (!srv_job_cancelled(j)) {
        /* the sequence's tokens are the penalty's history; tm_seq_tokens reads only this
           slot's sequence, which no step changes until the slot posts */
        const int32_t *held = NULL;
        int64_t n_held = 0;
        int32_t id = -1;
        bool end = false;
        if ((st = srv_error_api(tm_seq_tokens(s->ctx, sl->id, &held, &n_held))) != TM_OK ||
            (st = srv_error_api(tm_sampler_sample(smp, sl->view, held, (size_t)n_held, &id))) !=
                TM_OK ||
            (st = srv_error_api(tm_token_is_end(s->m, id, &end))) != TM_OK)
            break;
        if (!p->ignore_eos && end) {
            o->finish = "stop";
            break;
        }
        o->n_gen++;
        /* the next step runs while this token's text is made and sent (a stop string
         * found meanwhile leaves that step's logits unused) */
        const bool last = o->n_gen >= p->max_tokens || n_held >= s->n_ctx;
        if (!last) srv_slot_post(s, sl, id);
        const char *text;
        size_t n;
        if ((st = srv_error_api(tm_detokenizer_push(ds, id, &text, &n))) == TM_OK &&
            (st = out_append(o, text, n)) == TM_OK && (hit = out_send(o, p, fn, ud, false)))
            o->finish = "stop";
        const tm_status waited = last ? TM_OK : srv_slot_wait(s, sl);
        if (st == TM_OK) st = waited;
        if (st != TM_OK || hit) break;
        if (last) {
            o->finish = "length";
            break;
        }
    }
    srv_slot_end(s, sl);
    o->gen_ms = (srv_time_ns() - t0) * 1e-6;
    if (st == TM_OK && o->finish && !hit) { /* what the decoder held, and the held-back tail */
        const char *text;
        size_t n;
        if ((st = srv_error_api(tm_detokenizer_flush(ds, &text, &n))) == TM_OK &&
            (st = out_append(o, text, n)) == TM_OK && out_send(o, p, fn, ud, false))
            o->finish = "stop";
        else if (st == TM_OK)
            out_send(o, p, fn, ud, true);
    }
done:
    tm_detokenizer_free(ds);
    tm_sampler_free(smp);
    count(s, o, st);
    return st;
}
