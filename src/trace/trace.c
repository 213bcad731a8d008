/* The live expert usage tracer: counts routing decisions from the forward's
 * "topk_ids" intermediate, keeps the sliding working-set window and the
 * previous token's experts per layer, times routing and experts between the
 * forward's named intermediates, and prints summaries. See trace.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/timing.h"
#include "trace/trace.h"
#include "trace/trace_log.h"

/* ---- counters ---- */

tm_status trace_stats_init(tm_trace_stats *s, const tm_trace_shape *shape, uint32_t window) {
    memset(s, 0, sizeof(*s));
    if (!shape->n_layer || shape->n_layer > TM_TRACE_MAX_LAYER || !shape->n_expert ||
        shape->n_expert > TM_TRACE_MAX_EXPERT || !shape->n_expert_used ||
        shape->n_expert_used > shape->n_expert || shape->n_expert_used > TM_TRACE_MAX_USED)
        return tm_error_set(TM_ERR_ARG,
                            "trace: unsupported shape %u layers, %u experts, %u used (at most %d "
                            "layers, %d experts, "
                            "%d used)",
                            shape->n_layer, shape->n_expert, shape->n_expert_used,
                            TM_TRACE_MAX_LAYER, TM_TRACE_MAX_EXPERT, TM_TRACE_MAX_USED);
    s->shape = *shape;
    s->window = window ? window : TM_TRACE_WINDOW_DEFAULT;
    s->reuse_window = TM_TRACE_REUSE_WINDOW;
    s->layers = calloc(shape->n_layer, sizeof(*s->layers));
    if (!s->layers) return tm_error_set(TM_ERR_NOMEM, "trace: out of memory");
    for (uint32_t l = 0; l < shape->n_layer; l++) {
        tm_trace_layer *L = &s->layers[l];
        /* one block for the three per-expert arrays */
        L->experts = calloc(3 * (size_t)shape->n_expert, sizeof(uint64_t));
        if (!L->experts) {
            trace_stats_free(s);
            return tm_error_set(TM_ERR_NOMEM, "trace: out of memory");
        }
        L->hot_experts = L->experts + shape->n_expert;
        L->cold_experts = L->experts + 2 * (size_t)shape->n_expert;
    }
    return TM_OK;
}

void trace_stats_free(tm_trace_stats *s) {
    if (s->layers)
        for (uint32_t l = 0; l < s->shape.n_layer; l++) free(s->layers[l].experts);
    free(s->layers);
    memset(s, 0, sizeof(*s));
}

bool trace_stats_equal(const tm_trace_stats *a, const tm_trace_stats *b) {
    if (strcmp(a->shape.arch, b->shape.arch) || a->shape.n_layer != b->shape.n_layer ||
        a->shape.n_expert != b->shape.n_expert ||
        a->shape.n_expert_used != b->shape.n_expert_used || a->window != b->window ||
        a->reuse_window != b->reuse_window || strcmp(a->routing, b->routing) ||
        a->tokens != b->tokens)
        return false;
    for (uint32_t l = 0; l < a->shape.n_layer; l++) {
        const tm_trace_layer *x = &a->layers[l], *y = &b->layers[l];
        if (x->calls != y->calls || x->tokens != y->tokens ||
            x->expert_hits_total != y->expert_hits_total ||
            x->hot_slots_total != y->hot_slots_total ||
            x->cold_slots_total != y->cold_slots_total || x->routing_ns != y->routing_ns ||
            x->experts_ns != y->experts_ns || x->merge_ns != y->merge_ns ||
            x->wait_ns != y->wait_ns || x->ws_sum != y->ws_sum || x->ws_samples != y->ws_samples ||
            x->ws_max != y->ws_max || x->reuse_shared != y->reuse_shared ||
            x->reuse_pairs != y->reuse_pairs || x->reuse_win_shared != y->reuse_win_shared ||
            x->reuse_win_tokens != y->reuse_win_tokens ||
            memcmp(x->experts, y->experts, 3 * (size_t)a->shape.n_expert * sizeof(uint64_t)))
            return false;
    }
    return true;
}

/* ---- the tracer ---- */

typedef struct trace_window {
    int32_t *ring;   /* [window][k] ids of the last tokens */
    uint32_t *count; /* [n_expert] occurrences inside the window */
    uint32_t distinct, pos;
    uint64_t n_seen;       /* tokens of the current sequence */
    int32_t *recent;       /* [reuse_window][k] ids of the last reuse_window tokens */
    uint8_t *recent_count; /* [n_expert] occurrences among them (at most reuse_window) */
    uint32_t recent_pos;
} trace_window;

struct tm_trace {
    tm_trace_config cfg;
    tm_trace_stats stats;
    trace_window *win; /* [n_layer] */
    tm_trace_tensor_fn next_cb;
    void *next_ud;
    tm_trace_log_writer *rlog; /* cfg.routing_log */
    int t_attn_layer, t_topk_layer;
    uint64_t t_attn, t_topk;
    tm_trace_resident_fn resident; /* NULL: hot and cold not counted */
    void *resident_ud;
};

void trace_set_resident(tm_trace *t, tm_trace_resident_fn fn, void *ud) {
    t->resident = fn, t->resident_ud = ud;
}

tm_status trace_create(const tm_trace_config *cfg, const tm_trace_shape *shape_in,
                       const char *routing, tm_trace **out) {
    *out = NULL;
    tm_trace *t = calloc(1, sizeof(*t));
    if (!t) return tm_error_set(TM_ERR_NOMEM, "trace: out of memory");
    t->cfg = *cfg;
    if (!t->cfg.log) t->cfg.log = stderr;
    t->t_attn_layer = t->t_topk_layer = -1;
    const tm_trace_shape shape = *shape_in;
    tm_status st = trace_stats_init(&t->stats, &shape, cfg->window);
    if (st != TM_OK) {
        free(t);
        return st;
    }
    snprintf(t->stats.routing, sizeof(t->stats.routing), "%s", routing ? routing : "");
    const uint32_t W = t->stats.window, k = shape.n_expert_used;
    t->win = calloc(shape.n_layer, sizeof(*t->win));
    if (!t->win) goto nomem;
    for (uint32_t l = 0; l < shape.n_layer; l++) {
        t->win[l].ring = malloc((size_t)W * k * sizeof(int32_t));
        t->win[l].count = calloc(shape.n_expert, sizeof(uint32_t));
        t->win[l].recent = malloc((size_t)TM_TRACE_REUSE_WINDOW * k * sizeof(int32_t));
        t->win[l].recent_count = calloc(shape.n_expert, 1);
        if (!t->win[l].ring || !t->win[l].count || !t->win[l].recent || !t->win[l].recent_count)
            goto nomem;
    }
    if (cfg->routing_log && (st = trace_log_writer_open(cfg->routing_log, &shape, &t->rlog))) {
        trace_free(t);
        return st;
    }
    *out = t;
    return TM_OK;
nomem:
    trace_free(t);
    return tm_error_set(TM_ERR_NOMEM, "trace: out of memory for a working-set window of %u tokens",
                        W);
}

void trace_free(tm_trace *t) {
    if (!t) return;
    if (t->win)
        for (uint32_t l = 0; l < t->stats.shape.n_layer; l++)
            free(t->win[l].ring), free(t->win[l].count), free(t->win[l].recent),
                free(t->win[l].recent_count);
    free(t->win);
    trace_log_writer_close(t->rlog, false); /* not finished: no log */
    trace_stats_free(&t->stats);
    free(t);
}

void trace_attach(tm_trace *t, tm_trace_tensor_fn *cb, void **cb_ud) {
    if (*cb == trace_tensor_cb && *cb_ud == t) return; /* already attached */
    t->next_cb = *cb, t->next_ud = *cb_ud;
    *cb = trace_tensor_cb, *cb_ud = t;
}

void trace_reset(tm_trace *t) {
    tm_trace_stats *s = &t->stats;
    s->tokens = 0;
    for (uint32_t l = 0; l < s->shape.n_layer; l++) {
        tm_trace_layer *L = &s->layers[l];
        uint64_t *experts = L->experts; /* the block of the three per-expert arrays */
        memset(L, 0, sizeof(*L));
        memset(experts, 0, 3 * (size_t)s->shape.n_expert * sizeof(uint64_t));
        L->experts = experts, L->hot_experts = experts + s->shape.n_expert;
        L->cold_experts = experts + 2 * (size_t)s->shape.n_expert;
    }
}

void trace_sequence_begin(tm_trace *t) {
    for (uint32_t l = 0; l < t->stats.shape.n_layer; l++) {
        trace_window *w = &t->win[l];
        memset(w->count, 0, t->stats.shape.n_expert * sizeof(uint32_t));
        memset(w->recent_count, 0, t->stats.shape.n_expert);
        w->distinct = w->pos = w->recent_pos = 0, w->n_seen = 0;
    }
    t->t_attn_layer = t->t_topk_layer = -1;
    if (t->rlog) trace_log_writer_sequence(t->rlog);
}

/* Window reuse for one token (before it counts as seen): how many of its k
 * (distinct) experts one of the previous R tokens of the sequence used, once
 * it has R predecessors; then it takes the oldest token's place. */
static void trace_reuse_window(tm_trace_layer *L, trace_window *w, const int32_t *row, uint32_t k) {
    const uint32_t R = TM_TRACE_REUSE_WINDOW;
    int32_t *slot = w->recent + (size_t)w->recent_pos * k;
    if (w->n_seen >= R) {
        uint32_t shared = 0;
        for (uint32_t j = 0; j < k; j++) shared += w->recent_count[row[j]] > 0;
        L->reuse_win_shared += shared;
        L->reuse_win_tokens++;
        for (uint32_t j = 0; j < k; j++) w->recent_count[slot[j]]--;
    }
    for (uint32_t j = 0; j < k; j++) w->recent_count[row[j]]++, slot[j] = row[j];
    w->recent_pos = (w->recent_pos + 1) % R;
}

void trace_record(tm_trace *t, uint32_t layer, const int32_t *ids, int64_t n_tok) {
    tm_trace_stats *s = &t->stats;
    TM_ASSERT(layer < s->shape.n_layer);
    tm_trace_layer *L = &s->layers[layer];
    trace_window *w = &t->win[layer];
    const uint32_t k = s->shape.n_expert_used, W = s->window, E = s->shape.n_expert;
    L->calls++;
    if (layer == 0) s->tokens += (uint64_t)n_tok;
    if (t->rlog) trace_log_writer_record(t->rlog, layer, ids, n_tok);
    for (int64_t i = 0; i < n_tok; i++) {
        const int32_t *row = ids + i * k;
        for (uint32_t j = 0; j < k; j++) {
            TM_ASSERT(row[j] >= 0 && (uint32_t)row[j] < E);
            L->experts[row[j]]++;
            if (t->resident) {
                const bool hot = t->resident(t->resident_ud, layer, row[j]);
                (hot ? L->hot_experts : L->cold_experts)[row[j]]++;
                ++*(hot ? &L->hot_slots_total : &L->cold_slots_total);
            }
            if (t->cfg.names)
                fprintf(t->cfg.log,
                        "[expert-trace] token %llu layer %u slot %u: expert %d: "
                        "blk.%u.ffn_gate_exps / ffn_up_exps / "
                        "ffn_down_exps slice %d\n",
                        (unsigned long long)(L->tokens + (uint64_t)i), layer, j, row[j], layer,
                        row[j]);
        }
        /* reuse against the previous token of this sequence (before it can leave a window of 1) */
        if (w->n_seen > 0) {
            const int32_t *prev = w->ring + (size_t)((w->pos + W - 1) % W) * k;
            uint32_t shared = 0;
            for (uint32_t j = 0; j < k; j++)
                for (uint32_t q = 0; q < k; q++) shared += row[j] == prev[q];
            L->reuse_shared += shared;
            L->reuse_pairs++;
        }
        trace_reuse_window(L, w, row, k);
        int32_t *slot = w->ring + (size_t)w->pos * k;
        if (w->n_seen >= W)
            for (uint32_t j = 0; j < k; j++) w->distinct -= --w->count[slot[j]] == 0;
        for (uint32_t j = 0; j < k; j++) {
            w->distinct += w->count[row[j]]++ == 0;
            slot[j] = row[j];
        }
        w->pos = (w->pos + 1) % W;
        if (++w->n_seen >= W) {
            L->ws_sum += w->distinct;
            L->ws_samples++;
            if (w->distinct > L->ws_max) L->ws_max = w->distinct;
        }
    }
    L->tokens += (uint64_t)n_tok;
    L->expert_hits_total += (uint64_t)n_tok * k;
}

void trace_tensor_cb(void *ud, const char *name, int layer, const void *data, int64_t n_tok,
                     int64_t n, bool is_int) {
    tm_trace *t = ud;
    if (layer >= 0 && (uint32_t)layer < t->stats.shape.n_layer) {
        if (name[0] == 'a' && !strcmp(name, "attn_out")) {
            t->t_attn = tm_time_ns(), t->t_attn_layer = layer;
        } else if (name[0] == 't' && is_int && n == t->stats.shape.n_expert_used &&
                   !strcmp(name, "topk_ids")) {
            uint64_t now = tm_time_ns();
            if (t->t_attn_layer == layer) t->stats.layers[layer].routing_ns += now - t->t_attn;
            trace_record(t, (uint32_t)layer, data, n_tok);
            /* counting (tens of ns) lands in expert time; name logging would not be small */
            t->t_topk = t->cfg.names ? tm_time_ns() : now, t->t_topk_layer = layer;
        } else if (name[0] == 'f' && !strcmp(name, "ffn_out")) {
            if (t->t_topk_layer == layer)
                t->stats.layers[layer].experts_ns += tm_time_ns() - t->t_topk;
            t->t_topk_layer = -1;
        }
    }
    if (t->next_cb) t->next_cb(t->next_ud, name, layer, data, n_tok, n, is_int);
}

const tm_trace_stats *trace_get_stats(const tm_trace *t) {
    return &t->stats;
}

/* ---- summaries ---- */

static void trace_layer_top(const tm_trace_layer *L, uint32_t E, uint32_t n, uint32_t *top) {
    /* n largest counts, ties to the lower id; n is small */
    for (uint32_t i = 0; i < n; i++) top[i] = UINT32_MAX;
    for (uint32_t e = 0; e < E; e++) {
        uint32_t i = n;
        while (i > 0 && (top[i - 1] == UINT32_MAX || L->experts[e] > L->experts[top[i - 1]])) i--;
        if (i >= n) continue;
        memmove(top + i + 1, top + i, (n - i - 1) * sizeof(uint32_t));
        top[i] = e;
    }
}

void trace_stats_print(const tm_trace_stats *s, bool per_layer, FILE *out) {
    const tm_trace_shape *sh = &s->shape;
    double ent = 0, top10 = 0, ws = 0, reuse = 0, reuse_win = 0, routing = 0, experts = 0;
    uint64_t ws_max = 0;
    if (per_layer)
        fprintf(out,
                "expert trace per layer (shares of the layer's routed slots; working set over %u "
                "tokens):\n",
                s->window);
    for (uint32_t l = 0; l < sh->n_layer; l++) {
        const tm_trace_layer *L = &s->layers[l];
        tm_trace_skew sk;
        trace_layer_skew(s, l, &sk);
        const double lws = L->ws_samples ? (double)L->ws_sum / L->ws_samples : 0;
        const double lre =
            L->reuse_pairs ? (double)L->reuse_shared / ((double)L->reuse_pairs * sh->n_expert_used)
                           : 0;
        const double lrw =
            L->reuse_win_tokens
                ? (double)L->reuse_win_shared / ((double)L->reuse_win_tokens * sh->n_expert_used)
                : 0;
        ent += sk.entropy, top10 += sk.top[0], ws += lws, reuse += lre, reuse_win += lrw;
        routing += L->routing_ns * 1e-6, experts += L->experts_ns * 1e-6;
        if (L->ws_max > ws_max) ws_max = L->ws_max;
        if (!per_layer) continue;
        fprintf(
            out,
            "layer %3u: calls %llu tokens %llu hits %llu used %u | entropy %.4f top10%% %.4f "
            "top25%% %.4f "
            "top50%% %.4f | ws %.2f max %llu | reuse %.4f within %u %.4f | routing %.3f ms experts "
            "%.3f ms | top",
            l, (unsigned long long)L->calls, (unsigned long long)L->tokens,
            (unsigned long long)L->expert_hits_total, sk.n_used, sk.entropy, sk.top[0], sk.top[1],
            sk.top[2], lws, (unsigned long long)L->ws_max, lre, s->reuse_window, lrw,
            L->routing_ns * 1e-6, L->experts_ns * 1e-6);
        uint32_t top[5], nt = sh->n_expert < 5 ? sh->n_expert : 5;
        trace_layer_top(L, sh->n_expert, nt, top);
        for (uint32_t i = 0; i < nt; i++)
            fprintf(out, " e%u %.1f%%", top[i],
                    L->expert_hits_total ? 100.0 * L->experts[top[i]] / L->expert_hits_total : 0.0);
        fprintf(out, "\n");
    }
    const double nl = sh->n_layer;
    char wss[96];
    if (s->layers[0].ws_samples)
        snprintf(wss, sizeof(wss), "%.1f of %u (max %llu, W %u)", ws / nl, sh->n_expert,
                 (unsigned long long)ws_max, s->window);
    else
        snprintf(wss, sizeof(wss), "n/a (no sequence reached W = %u tokens)", s->window);
    char rws[64] = "";
    if (s->layers[0].reuse_win_tokens)
        snprintf(rws, sizeof(rws), " (%.1f%% within %u tokens)", 100 * reuse_win / nl,
                 s->reuse_window);
    fprintf(out,
            "expert trace: %s, %u layers x %u experts (top-%u), %llu tokens | mean over layers: "
            "entropy %.4f, "
            "top 10%% of experts %.1f%% of hits, working set %s, reuse %.1f%%%s | routing %.2f ms, "
            "experts %.2f ms\n",
            sh->arch, sh->n_layer, sh->n_expert, sh->n_expert_used, (unsigned long long)s->tokens,
            ent / nl, 100 * top10 / nl, wss, 100 * reuse / nl, rws, routing, experts);
}

tm_status trace_finish(tm_trace *t) {
    if (t->cfg.stats || t->cfg.per_layer || t->cfg.output)
        trace_stats_print(&t->stats, t->cfg.per_layer, t->cfg.log);
    if (t->rlog) {
        tm_status st = trace_log_writer_close(t->rlog, true);
        t->rlog = NULL;
        if (st != TM_OK) return st;
        fprintf(t->cfg.log, "expert trace: wrote the routing log %s\n", t->cfg.routing_log);
    }
    if (!t->cfg.output) return TM_OK;
    const char *o = t->cfg.output;
    const tm_status st = trace_stats_write(&t->stats, o);
    if (st == TM_OK) fprintf(t->cfg.log, "expert trace: wrote %s\n", o);
    return st;
}
