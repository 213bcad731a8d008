/* Offline replay of routing logs against the cache policies, the plan and
 * Belady's optimum. See cache_replay.h for what is measured. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tier/cache_replay.h"

const char *const tm_replay_policy_names[TM_REPLAY_COUNT] = {"static", "update",   "lru",
                                                             "lfu",    "adaptive", "belady"};

tm_replay_params cache_replay_params_default(void) {
    return (tm_replay_params){.train_fraction = 0.5,
                              .lag = 1,
                              .max_admit = 0,
                              .weighting = TM_PLAN_FLAT,
                              .update_rate = 0.25,
                              .update_half_life = 4096,
                              .knobs = cache_policy_params_default(TM_CACHE_ADAPTIVE)};
}

tm_status cache_replay_counts(const tm_trace_log *log, uint32_t n_seq_train, tm_trace_stats *out) {
    tm_status st = trace_stats_init(out, &log->shape, 0);
    if (st != TM_OK) return st;
    const uint32_t k = log->shape.n_expert_used;
    for (uint32_t l = 0; l < log->shape.n_layer; l++) {
        const tm_trace_log_layer *ly = &log->layers[l];
        tm_trace_layer *y = &out->layers[l];
        for (uint64_t i = 0; i < ly->n_calls && ly->calls[i].seq < n_seq_train; i++) {
            const tm_trace_log_call *c = &ly->calls[i];
            y->calls++, y->tokens += c->n_tok, y->expert_hits_total += (uint64_t)c->n_tok * k;
            for (uint64_t j = 0; j < (uint64_t)c->n_tok * k; j++) y->experts[ly->ids[c->off + j]]++;
        }
    }
    out->tokens = out->layers[0].tokens;
    return TM_OK;
}

/* ---- Belady ---- */

#define KEY_NEVER  (INT64_C(1) << 62) /* never routed again */
#define KEY_LATER  (INT64_C(1) << 61) /* next routed in a prompt call: + its next decode use */
#define STEP_NEVER INT64_MAX

/* What keeping an expert is worth after a step, from its next routing and
 * its next decode use: the sooner, the smaller. */
static int64_t belady_key(int64_t next_any, int64_t next_dec) {
    if (next_any == STEP_NEVER) return KEY_NEVER;
    if (next_any == next_dec) return next_any;
    return next_dec == STEP_NEVER ? KEY_NEVER : KEY_LATER + next_dec;
}

typedef struct belady_cand {
    int64_t key;
    int32_t e;
} belady_cand;

static int belady_cand_cmp(const void *a, const void *b) {
    const belady_cand *x = a, *y = b;
    return x->key < y->key ? -1 : x->key > y->key ? 1 : x->e - y->e;
}

tm_status cache_replay_belady(const tm_trace_log_layer *ly, uint64_t first, uint32_t k,
                              uint32_t n_expert, int32_t n_slots, const int32_t *initial,
                              uint64_t *hits, uint64_t *uploads, uint64_t *prompt_uploads) {
    *hits = *uploads = *prompt_uploads = 0;
    const uint64_t T = ly->n_calls > first ? ly->n_calls - first : 0;
    const uint64_t n_ids = T ? ly->n_ids - ly->calls[first].off : 0;
    uint64_t *doff = malloc((T + 1) * sizeof(uint64_t));
    belady_cand *d = malloc((n_ids ? n_ids : 1) * sizeof(belady_cand)); /* distinct, with keys */
    int64_t *next_any = malloc(n_expert * sizeof(int64_t)),
            *next_dec = malloc(n_expert * sizeof(int64_t));
    int64_t *stamp = malloc(n_expert * sizeof(int64_t)),
            *rkey = malloc((n_slots + 1) * sizeof(int64_t));
    int32_t *slot_of = malloc(n_expert * sizeof(int32_t)),
            *at = malloc((n_slots + 1) * sizeof(int32_t));
    tm_status st = TM_OK;
    if (!doff || !d || !next_any || !next_dec || !stamp || !rkey || !slot_of || !at) {
        st = tm_error_set(TM_ERR_NOMEM, "replay: out of memory for Belady over %llu steps",
                          (unsigned long long)T);
        goto done;
    }
    /* each step's distinct experts */
    for (uint32_t e = 0; e < n_expert; e++) stamp[e] = -1, next_any[e] = next_dec[e] = STEP_NEVER;
    uint64_t n = 0;
    for (uint64_t u = 0; u < T; u++) {
        const tm_trace_log_call *c = &ly->calls[first + u];
        doff[u] = n;
        for (uint64_t j = 0; j < (uint64_t)c->n_tok * k; j++) {
            const int32_t e = ly->ids[c->off + j];
            if (stamp[e] != (int64_t)u) stamp[e] = (int64_t)u, d[n++].e = e;
        }
    }
    doff[T] = n;
    /* keys, backwards: after step u, what each of its experts is worth */
    for (uint64_t u = T; u-- > 0;) {
        const bool dec = ly->calls[first + u].n_tok == 1;
        for (uint64_t i = doff[u]; i < doff[u + 1]; i++) {
            const int32_t e = d[i].e;
            d[i].key = belady_key(next_any[e], next_dec[e]);
            next_any[e] = (int64_t)u;
            if (dec) next_dec[e] = (int64_t)u;
        }
    }
    for (uint32_t e = 0; e < n_expert; e++) slot_of[e] = -1;
    for (int32_t s = 0; s < n_slots; s++) {
        const int32_t e = initial ? initial[s] : -1;
        at[s] = e, rkey[s] = e >= 0 ? belady_key(next_any[e], next_dec[e]) : 0;
        if (e >= 0) slot_of[e] = s;
    }
    for (uint64_t u = 0; u < T; u++) {
        const bool dec = ly->calls[first + u].n_tok == 1;
        belady_cand *cand = d + doff[u];
        uint64_t nc = 0;
        for (uint64_t i = doff[u]; i < doff[u + 1]; i++) {
            const int32_t s = slot_of[d[i].e];
            if (s >= 0) {
                *hits += dec;
                rkey[s] = d[i].key;
            } else
                cand[nc++] = d[i]; /* in place: the residents were read first */
        }
        qsort(cand, nc, sizeof(*cand), belady_cand_cmp);
        for (uint64_t i = 0; i < nc && n_slots > 0; i++) {
            int32_t m = 0; /* an empty slot, else the resident needed last */
            for (int32_t s = 0; s < n_slots; s++) {
                if (at[s] < 0) {
                    m = s;
                    break;
                }
                if (rkey[s] > rkey[m]) m = s;
            }
            if (at[m] >= 0 && !(cand[i].key < rkey[m])) break; /* the rest are needed later */
            if (at[m] >= 0) slot_of[at[m]] = -1;
            at[m] = cand[i].e, rkey[m] = cand[i].key, slot_of[cand[i].e] = m;
            ++*(dec ? uploads : prompt_uploads);
        }
    }
done:
    free(doff), free(d), free(next_any), free(next_dec), free(stamp), free(rkey), free(slot_of),
        free(at);
    return st;
}

/* ---- the policies ---- */

typedef struct replay_run {
    const tm_trace_log_layer *ly;
    uint64_t first; /* first held-out call */
    uint32_t k, n_expert;
    int32_t n_slots;
    const int32_t *initial;
    const uint64_t *warm; /* training counts of the layer */
    int32_t lag;
} replay_run;

/* One policy over one layer's held-out calls, with the lag model. update:
 * exchange between sequences at that rate (< 0: never). */
static tm_status replay_policy(const replay_run *r, const tm_cache_policy_params *pp, double update,
                               uint64_t *hits, uint64_t *up_dec, uint64_t *up_prompt) {
    tm_cache_policy *pol;
    tm_status st = cache_policy_create(pp, r->n_expert, r->n_slots, r->initial, &pol);
    if (st != TM_OK) return st;
    cache_policy_warm(pol, r->warm);
    const int32_t room = r->n_slots ? r->n_slots : 1;
    tm_cache_admit *adm = malloc((size_t)room * sizeof(*adm));
    int64_t *ready = calloc((size_t)room, sizeof(int64_t)); /* step from which a slot serves */
    if (!adm || !ready) {
        st = tm_error_set(TM_ERR_NOMEM, "replay: out of memory");
        goto done;
    }
    const tm_trace_log_layer *ly = r->ly;
    for (uint64_t i = r->first; i < ly->n_calls; i++) {
        const tm_trace_log_call *c = &ly->calls[i];
        const int64_t u = (int64_t)(i - r->first);
        if (update >= 0 && i > r->first && c->seq != ly->calls[i - 1].seq) {
            const int32_t n = cache_policy_update(pol, NULL, update, adm);
            *up_prompt += (uint64_t)n; /* between requests: ready for the next one */
        }
        const int32_t *ids = ly->ids + c->off;
        if (c->n_tok == 1)
            for (uint32_t j = 0; j < r->k; j++) {
                const int32_t s = cache_policy_slot_of(pol, ids[j]);
                *hits += s >= 0 && ready[s] <= u;
            }
        int64_t own;
        const int32_t n = cache_policy_step(pol, ids, c->n_tok, r->k, adm, &own);
        for (int32_t a = 0; a < n; a++) ready[adm[a].slot] = u + 1 + r->lag;
        *(c->n_tok == 1 ? up_dec : up_prompt) += (uint64_t)n;
    }
done:
    free(adm), free(ready);
    cache_policy_free(pol);
    return st;
}

tm_status cache_replay(const tm_trace_log *log, const tm_replay_params *p, double residency,
                       tm_replay_result *out) {
    memset(out, 0, sizeof(*out));
    const uint32_t L = log->shape.n_layer, E = log->shape.n_expert, k = log->shape.n_expert_used;
    if (!(residency > 0 && residency <= 1) || !(p->train_fraction >= 0 && p->train_fraction < 1) ||
        p->lag < 0 || p->max_admit < 0 || !(p->update_rate >= 0 && p->update_rate <= 1) ||
        !(p->update_half_life > 0))
        return tm_error_set(TM_ERR_ARG,
                            "replay: residency %g (0..1], train fraction %g [0..1), lag %d, "
                            "max admit %d, update rate %g [0..1]",
                            residency, p->train_fraction, p->lag, p->max_admit, p->update_rate);
    const uint32_t n_train = (uint32_t)floor(p->train_fraction * log->n_seq);
    if (log->n_seq < 1 || n_train >= log->n_seq)
        return tm_error_set(TM_ERR_ARG,
                            "replay: %u sequences in the log, %u for training: none held out",
                            log->n_seq, n_train);
    out->residency = residency, out->n_train = n_train, out->n_eval = log->n_seq - n_train;
    tm_trace_stats counts;
    tm_plan plan;
    tm_status st = cache_replay_counts(log, n_train, &counts);
    if (st != TM_OK) return st;
    uint64_t *bytes = malloc(L * sizeof(uint64_t));
    if (!bytes) {
        trace_stats_free(&counts);
        return tm_error_set(TM_ERR_NOMEM, "replay: out of memory");
    }
    for (uint32_t l = 0; l < L; l++) bytes[l] = 1;
    const uint64_t per_layer = (uint64_t)llround(residency * E);
    const tm_plan_params pp = {.mode = p->weighting,
                               .layer_curve = TM_PLAN_CURVE_DEFAULT,
                               .budget_bytes = per_layer * L,
                               .expert_bytes = bytes};
    st = plan_make(&counts, &pp, &plan);
    free(bytes);
    if (st != TM_OK) {
        trace_stats_free(&counts);
        return st;
    }
    out->slots = (int64_t)plan.used_bytes;
    tm_cache_policy_params kp[TM_REPLAY_BELADY];
    for (int q = 0; q < TM_REPLAY_BELADY; q++) {
        kp[q] = p->knobs;
        kp[q].max_admit = p->max_admit;
    }
    kp[TM_REPLAY_STATIC].kind = kp[TM_REPLAY_UPDATE].kind = TM_CACHE_STATIC;
    kp[TM_REPLAY_UPDATE].half_life = p->update_half_life;
    kp[TM_REPLAY_LRU].kind = TM_CACHE_LRU;
    kp[TM_REPLAY_LFU].kind = TM_CACHE_LFU;
    kp[TM_REPLAY_ADAPTIVE].kind = TM_CACHE_ADAPTIVE;
    for (uint32_t l = 0; l < L && st == TM_OK; l++) {
        const tm_trace_log_layer *ly = &log->layers[l];
        replay_run r = {.ly = ly,
                        .k = k,
                        .n_expert = E,
                        .n_slots = plan.n_slots[l],
                        .initial = plan.experts[l],
                        .warm = counts.layers[l].experts,
                        .lag = p->lag};
        while (r.first < ly->n_calls && ly->calls[r.first].seq < n_train) r.first++;
        uint64_t dec = 0;
        for (uint64_t i = r.first; i < ly->n_calls; i++) dec += ly->calls[i].n_tok == 1;
        out->routed += dec * k;
        if (dec > out->decode_tokens) out->decode_tokens = dec;
        for (int q = 0; q < TM_REPLAY_BELADY && st == TM_OK; q++)
            st = replay_policy(&r, &kp[q], q == TM_REPLAY_UPDATE ? p->update_rate : -1,
                               &out->hits[q], &out->uploads[q], &out->prompt_uploads[q]);
        uint64_t h = 0, up = 0, upp = 0;
        if (st == TM_OK)
            st = cache_replay_belady(ly, r.first, k, E, r.n_slots, r.initial, &h, &up, &upp);
        out->hits[TM_REPLAY_BELADY] += h, out->uploads[TM_REPLAY_BELADY] += up;
        out->prompt_uploads[TM_REPLAY_BELADY] += upp;
    }
    plan_free(&plan);
    trace_stats_free(&counts);
    return st;
}
