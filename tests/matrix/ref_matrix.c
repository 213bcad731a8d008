/* The placement matrix's reference: the double-precision forward of
 * tests/ref/ref_forward.h, computed once per model (pm_ref_make) and compared
 * with every placement's runs (pm_compare_ref, pm_greedy_ref). See
 * placement_matrix.h for the rules. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/rng.h"
#include "greedy_test_util.h"
#include "placement_matrix.h"
#include "ref/ref_forward.h"

#define PM_REF_TRIES 256 /* tokens tried for a position before giving up on a decisive one */

static void *pm_ref_alloc(size_t n) {
    void *p = calloc(1, n ? n : 1);
    if (!p) fail_msg("out of memory (%zu bytes)", n);
    return p;
}

static void pm_ref_keep(pm_ref *r, const ref_model *m, const ref_step_out *o, int64_t pos,
                        double *logits) {
    const int L = r->n_layer, E = r->n_expert, K = r->k;
    for (int64_t v = 0; v < r->n_vocab; v++) logits[v] = o->logits[v];
    memcpy(r->router + pos * L * E, o->router_logits, (size_t)(L * E) * sizeof(double));
    for (int l = 0; l < L; l++)
        r->gap[pos * L + l] = ref_layer_route_gap(m, l, o->router_logits + (int64_t)l * E);
    memcpy(r->ids + pos * L * K, o->topk_ids, (size_t)(L * K) * sizeof(int32_t));
}

pm_ref *pm_ref_make(const char *path, int32_t *toks, int64_t n_pos, int n_greedy, double tie,
                    double tie_greedy) {
    ref_model *m;
    if (ref_model_load(path, &m) != TM_OK) fail_msg("reference: %s", tm_error_message());
    pm_ref *r = pm_ref_alloc(sizeof(*r));
    r->n_layer = m->n_layer, r->k = m->n_used, r->n_expert = m->n_expert;
    r->n_vocab = m->n_vocab, r->n_pos = n_pos, r->n_greedy = n_greedy, r->tie = tie;
    r->tie_greedy = tie_greedy;
    const int L = r->n_layer, E = r->n_expert, K = r->k;
    const int64_t V = r->n_vocab, n_all = n_pos + n_greedy;
    r->logits = pm_ref_alloc((size_t)(n_all * V) * sizeof(double));
    r->router = pm_ref_alloc((size_t)(n_all * L * E) * sizeof(double));
    r->gap = pm_ref_alloc((size_t)(n_all * L) * sizeof(double));
    r->ids = pm_ref_alloc((size_t)(n_all * L * K) * sizeof(int32_t));
    r->greedy = pm_ref_alloc((size_t)n_greedy * sizeof(int32_t));
    r->greedy_gap = pm_ref_alloc((size_t)n_greedy * sizeof(double));

    /* the tokens: each position's token from toks, or another one drawn while the
     * reference's routing of the position has a gap below tie in some layer */
    tm_rng rng;
    tm_rng_seed(&rng, 1234);
    ref_seq *s;
    if (ref_seq_create(m, n_pos > n_greedy ? n_pos : n_greedy, &s) != TM_OK)
        fail_msg("reference: %s", tm_error_message());
    for (int64_t p = 0; p < n_pos; p++) {
        int tries = 0;
        for (;; tries++) {
            if (ref_seq_step(s, toks[p]) != TM_OK) fail_msg("reference: %s", tm_error_message());
            const ref_step_out *o = ref_seq_out(s);
            if (ref_step_route_gap(m, o) >= tie) break;
            if (tries == PM_REF_TRIES)
                fail_msg("reference: no token at position %lld routes with gaps >= %g",
                         (long long)p, tie);
            /* a linear-attention state cannot step back: evaluate positions 0 .. p - 1 again */
            if (ref_seq_rewind(s, p) != TM_OK) {
                ref_seq_free(s);
                if (ref_seq_create(m, n_pos > n_greedy ? n_pos : n_greedy, &s) != TM_OK)
                    fail_msg("reference: %s", tm_error_message());
                for (int64_t q = 0; q < p; q++)
                    if (ref_seq_step(s, toks[q]) != TM_OK)
                        fail_msg("reference: %s", tm_error_message());
            }
            toks[p] = (int32_t)(tm_rng_u64(&rng) % (uint64_t)V);
            r->redrawn++;
        }
        pm_ref_keep(r, m, ref_seq_out(s), p, r->logits + p * V);
    }
    ref_seq_free(s);

    /* greedy from toks[0]: the reference's own tokens, its top-2 logit margins and the
     * first step whose routing is a near tie (where comparing stops) */
    if (ref_seq_create(m, n_greedy, &s) != TM_OK) fail_msg("reference: %s", tm_error_message());
    r->greedy_tie_at = n_greedy;
    int32_t id = toks[0];
    for (int i = 0; i < n_greedy; i++) {
        if (ref_seq_step(s, id) != TM_OK) fail_msg("reference: %s", tm_error_message());
        const ref_step_out *o = ref_seq_out(s);
        pm_ref_keep(r, m, o, n_pos + i, r->logits + (n_pos + i) * V);
        if (r->greedy_tie_at == n_greedy && ref_step_route_gap(m, o) < tie_greedy)
            r->greedy_tie_at = i;
        int64_t b = 0, b2 = -1;
        for (int64_t v = 1; v < V; v++)
            if (o->logits[v] > o->logits[b])
                b2 = b, b = v;
            else if (b2 < 0 || o->logits[v] > o->logits[b2])
                b2 = v;
        r->greedy[i] = id = (int32_t)b;
        r->greedy_gap[i] = o->logits[b] - o->logits[b2];
    }
    ref_seq_free(s);
    ref_model_free(m);
    return r;
}

void pm_ref_free(pm_ref *r) {
    if (!r) return;
    free(r->logits), free(r->router), free(r->gap), free(r->ids), free(r->greedy),
        free(r->greedy_gap);
    free(r);
}

static double pm_rel_l2_ref(const float *a, const double *ref, int64_t n) {
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        const double d = (double)a[i] - ref[i];
        e += d * d, s += ref[i] * ref[i];
    }
    return sqrt(e / (s + 1e-300));
}

/* Routing of the run's last call (tokens at positions [pos, pos + n)) against the
 * reference's: router logits within tie / 2 of their RMS, the same k experts, except where
 * the reference's gap is below tie (only where tie > ref->tie: then that token's later
 * layers are not compared). Returns the number of such near ties; *last: whether the last
 * token is one. */
static int pm_route_compare_ref(const pm_ref *ref, const pm_run *run, int64_t pos, int64_t n,
                                double tie, double *worst_router, bool *last, const char *what) {
    const int L = ref->n_layer, E = ref->n_expert, K = ref->k;
    int ties = 0;
    *last = false;
    for (int64_t t = 0; t < n; t++)
        for (int l = 0; l < L; l++) {
            const double *want = ref->router + ((pos + t) * L + l) * E;
            const float *got = run->logits + ((int64_t)l * run->n_tok + t) * E;
            double err = 0, ss = 0;
            for (int e = 0; e < E; e++) err = fmax(err, fabs(got[e] - want[e]));
            for (int e = 0; e < E; e++) ss += want[e] * want[e];
            err /= fmax(sqrt(ss / E), 1e-300); /* relative to the RMS of the reference's */
            if (!(err <= tie / 2))
                fail_msg("%s: layer %d position %lld: router logits off by %.3g of their RMS, "
                         "more than half the tie margin %g",
                         what, l, (long long)(pos + t), err, tie);
            *worst_router = fmax(*worst_router, err);
            const int32_t *a = ref->ids + ((pos + t) * L + l) * K;
            const int32_t *b = run->ids + ((int64_t)l * run->n_tok + t) * K;
            bool same = true;
            for (int j = 0; j < K; j++) {
                bool found = false;
                for (int i = 0; i < K; i++) found |= a[j] == b[i];
                same &= found;
            }
            if (same) continue;
            const double gap = ref->gap[(pos + t) * L + l]; /* ref_layer_route_gap's */
            if (!(gap < tie))
                fail_msg("%s: layer %d position %lld: routed to other experts than the "
                         "reference's (its gap %.3g of the RMS, near ties below %g)",
                         what, l, (long long)(pos + t), gap, tie);
            ties++;
            *last |= t == n - 1;
            break; /* the token's later layers follow another routing */
        }
    return ties;
}

int pm_compare_ref(tm_model *m, const int32_t *toks, int64_t n_prompt, int64_t n_decode,
                   const pm_ref *ref, pm_run *run, double tol_prompt, double tol_decode, double tie,
                   const char *what) {
    const int64_t V = m->cfg.n_vocab, B = run->ctx->params.n_batch;
    if (V != ref->n_vocab || n_prompt + n_decode > ref->n_pos)
        fail_msg("%s: the reference does not cover this run", what);
    double worst_p = 0, worst_d = 0, worst_router = 0;
    int ties = 0;
    for (int64_t i = 0; i < n_prompt + n_decode;) {
        const int64_t n = i < n_prompt ? (n_prompt - i < B ? n_prompt - i : B) : 1;
        const tm_moe_phase ph = i < n_prompt ? TM_MOE_PHASE_PROMPT : TM_MOE_PHASE_DECODE;
        if (model_decode(run->ctx, toks + i, n, ph, false) != TM_OK)
            fail_msg("%s: model_decode: %s", what, tm_error_message());
        bool t;
        ties += pm_route_compare_ref(ref, run, i, n, tie, &worst_router, &t, what);
        const double err = pm_rel_l2_ref(run->ctx->logits, ref->logits + (i + n - 1) * V, V);
        const double tol = ph == TM_MOE_PHASE_PROMPT ? tol_prompt : tol_decode;
        if (!t && !(err <= tol))
            fail_msg("%s: logits after tokens [%lld, %lld): relative error %.3g > %.3g from the "
                     "f64 reference",
                     what, (long long)i, (long long)(i + n), err, tol);
        if (!t && ph == TM_MOE_PHASE_PROMPT) worst_p = fmax(worst_p, err);
        if (!t && ph == TM_MOE_PHASE_DECODE) worst_d = fmax(worst_d, err);
        i += n;
    }
    printf("    %s: worst logits error prompt %.3g (tol %.3g), decode %.3g (tol %.3g), router "
           "logits %.3g of their RMS (tol %.3g), %d near ties\n",
           what, worst_p, tol_prompt, worst_d, tol_decode, worst_router, tie / 2, ties);
    return ties;
}

int pm_greedy_ref(tm_context *ctx, const int32_t *toks, const pm_ref *ref, double tol,
                  const char *what) {
    const int64_t V = ref->n_vocab;
    const double *logits = ref->logits + ref->n_pos * V;
    int32_t id = toks[0];
    int either = 0;
    for (int i = 0; i < ref->greedy_tie_at; i++) {
        if (model_decode(ctx, &id, 1, TM_MOE_PHASE_DECODE, false) != TM_OK)
            fail_msg("%s: step %d: %s", what, i, tm_error_message());
        const double err = pm_rel_l2_ref(ctx->logits, logits + i * V, V);
        if (!(err <= tol))
            fail_msg("%s: greedy step %d: logits relative error %.3g > %.3g from the f64 "
                     "reference",
                     what, i, err, tol);
        double norm = 0;
        for (int64_t v = 0; v < V; v++) norm += logits[i * V + v] * logits[i * V + v];
        const int32_t got = test_argmax(ctx->logits, V);
        if (got != ref->greedy[i]) {
            if (!(ref->greedy_gap[i] < 2 * tol * sqrt(norm)))
                fail_msg("%s: greedy token %d is %d, the reference's %d (its top-2 margin %.3g)",
                         what, i, got, ref->greedy[i], ref->greedy_gap[i]);
            either++;
        }
        id = ref->greedy[i]; /* on from the reference's choice */
    }
    return either;
}
