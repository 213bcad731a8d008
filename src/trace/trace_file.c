/* Learn/perf files: the JSON of docs/trace-format.md (written atomically,
 * read by one validating parser), the CSV export, merging, and the skew
 * numbers of a layer. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "trace/trace.h"

/* ---- writing ---- */

static json_t *u64_array(const uint64_t *v, uint32_t n) {
    json_t *a = json_array();
    for (uint32_t i = 0; a && i < n; i++)
        if (json_array_append_new(a, json_integer((json_int_t)v[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

json_t *trace_stats_to_json(const tm_trace_stats *s) {
    const tm_trace_shape *sh = &s->shape;
    json_t *root = json_object(), *layers = json_array();
    json_t *model = json_pack("{s:s, s:I, s:I, s:I}", "arch", sh->arch, "n_layer",
                              (json_int_t)sh->n_layer, "n_expert", (json_int_t)sh->n_expert,
                              "n_expert_used", (json_int_t)sh->n_expert_used);
    if (!root || !layers || !model) goto fail;
    if (s->routing[0]) json_object_set_new(model, "synthetic_routing", json_string(s->routing));
    json_object_set_new(root, "format", json_string(TM_TRACE_FORMAT));
    json_object_set_new(root, "version", json_integer(TM_TRACE_VERSION));
    json_object_set_new(root, "model", model);
    model = NULL;
    json_object_set_new(root, "tokens", json_integer((json_int_t)s->tokens));
    json_object_set_new(root, "window", json_integer(s->window));
    json_object_set_new(root, "reuse_window", json_integer(s->reuse_window));
    for (uint32_t l = 0; l < sh->n_layer; l++) {
        const tm_trace_layer *L = &s->layers[l];
        json_t *o = json_pack(
            "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I}", "layer",
            (json_int_t)l, "calls", (json_int_t)L->calls, "tokens", (json_int_t)L->tokens,
            "expert_hits_total", (json_int_t)L->expert_hits_total, "hot_slots_total",
            (json_int_t)L->hot_slots_total, "cold_slots_total", (json_int_t)L->cold_slots_total,
            "routing_time_ns", (json_int_t)L->routing_ns, "experts_time_ns",
            (json_int_t)L->experts_ns, "merge_time_ns", (json_int_t)L->merge_ns, "wait_time_ns",
            (json_int_t)L->wait_ns, "working_set_sum", (json_int_t)L->ws_sum, "working_set_samples",
            (json_int_t)L->ws_samples, "working_set_max", (json_int_t)L->ws_max, "reuse_shared",
            (json_int_t)L->reuse_shared, "reuse_pairs", (json_int_t)L->reuse_pairs);
        if (!o) goto fail;
        json_object_set_new(o, "reuse_window_shared",
                            json_integer((json_int_t)L->reuse_win_shared));
        json_object_set_new(o, "reuse_window_tokens",
                            json_integer((json_int_t)L->reuse_win_tokens));
        /* derived, for readers; the parser ignores them */
        json_object_set_new(o, "working_set_mean",
                            json_real(L->ws_samples ? (double)L->ws_sum / L->ws_samples : 0));
        json_object_set_new(
            o, "reuse",
            json_real(L->reuse_pairs
                          ? (double)L->reuse_shared / ((double)L->reuse_pairs * sh->n_expert_used)
                          : 0));
        json_object_set_new(o, "reuse_window_share",
                            json_real(L->reuse_win_tokens
                                          ? (double)L->reuse_win_shared /
                                                ((double)L->reuse_win_tokens * sh->n_expert_used)
                                          : 0));
        json_t *e = u64_array(L->experts, sh->n_expert),
               *h = u64_array(L->hot_experts, sh->n_expert),
               *c = u64_array(L->cold_experts, sh->n_expert);
        if (!e || !h || !c || json_array_append_new(layers, o)) {
            json_decref(e), json_decref(h), json_decref(c), json_decref(o);
            goto fail;
        }
        json_object_set_new(o, "experts", e);
        json_object_set_new(o, "hot_experts", h);
        json_object_set_new(o, "cold_experts", c);
    }
    json_object_set_new(root, "layers", layers);
    return root;
fail:
    json_decref(root), json_decref(layers), json_decref(model);
    return NULL;
}

tm_status trace_stats_write_json(const tm_trace_stats *s, const char *path) {
    json_t *root = trace_stats_to_json(s);
    /* one line: the per-expert arrays would take a line per number indented */
    char *text = root ? json_dumps(root, JSON_PRESERVE_ORDER | JSON_COMPACT) : NULL;
    json_decref(root);
    if (!text) return tm_error_set(TM_ERR_NOMEM, "%s: out of memory serialising the trace", path);
    const size_t n = strlen(text);
    char *t2 = realloc(text, n + 2);
    if (!t2) {
        free(text);
        return tm_error_set(TM_ERR_NOMEM, "%s: out of memory", path);
    }
    t2[n] = '\n', t2[n + 1] = '\0';
    tm_status st = tm_file_write_atomic(path, t2, n + 1);
    free(t2);
    return st;
}

tm_status trace_stats_write_csv(const tm_trace_stats *s, const char *path) {
    size_t cap = 64 + (size_t)s->shape.n_layer * s->shape.n_expert * 96, n = 0;
    char *buf = malloc(cap);
    if (!buf) return tm_error_set(TM_ERR_NOMEM, "%s: out of memory", path);
    n += (size_t)snprintf(buf, cap, "layer,expert,hits,hot,cold,share\n");
    for (uint32_t l = 0; l < s->shape.n_layer; l++) {
        const tm_trace_layer *L = &s->layers[l];
        for (uint32_t e = 0; e < s->shape.n_expert; e++)
            n += (size_t)snprintf(
                buf + n, cap - n, "%u,%u,%llu,%llu,%llu,%.6g\n", l, e,
                (unsigned long long)L->experts[e], (unsigned long long)L->hot_experts[e],
                (unsigned long long)L->cold_experts[e],
                L->expert_hits_total ? (double)L->experts[e] / L->expert_hits_total : 0.0);
    }
    tm_status st = tm_file_write_atomic(path, buf, n);
    free(buf);
    return st;
}

tm_status trace_stats_write(const tm_trace_stats *s, const char *path) {
    const size_t n = strlen(path);
    return n > 4 && !strcmp(path + n - 4, ".csv") ? trace_stats_write_csv(s, path)
                                                  : trace_stats_write_json(s, path);
}

/* ---- reading ---- */

tm_status trace_json_u64(const json_t *o, const char *key, const char *origin, const char *where,
                         uint64_t *out) {
    const json_t *v = json_object_get(o, key);
    if (!v) return tm_error_set(TM_ERR_FORMAT, "%s: %s%s: missing", origin, where, key);
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return tm_error_set(TM_ERR_FORMAT, "%s: %s%s: expected a non-negative integer", origin,
                            where, key);
    *out = (uint64_t)json_integer_value(v);
    return TM_OK;
}

static tm_status get_u64_array(const json_t *o, const char *key, const char *origin,
                               const char *where, uint32_t n, uint64_t *out) {
    const json_t *a = json_object_get(o, key);
    if (!a) return tm_error_set(TM_ERR_FORMAT, "%s: %s%s: missing", origin, where, key);
    if (!json_is_array(a))
        return tm_error_set(TM_ERR_FORMAT, "%s: %s%s: expected an array", origin, where, key);
    if (json_array_size(a) != n)
        return tm_error_set(TM_ERR_FORMAT, "%s: %s%s: %zu entries, the model has %u experts",
                            origin, where, key, json_array_size(a), n);
    for (uint32_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0)
            return tm_error_set(TM_ERR_FORMAT, "%s: %s%s[%u]: expected a non-negative integer",
                                origin, where, key, i);
        out[i] = (uint64_t)json_integer_value(v);
    }
    return TM_OK;
}

static tm_status shape_check(const char *origin, const char *field, uint64_t have, uint32_t want) {
    if (have != want)
        return tm_error_set(TM_ERR_FORMAT, "%s: model.%s is %llu, the model has %u", origin, field,
                            (unsigned long long)have, want);
    return TM_OK;
}

tm_status trace_shape_from_json(const json_t *root, const char *origin,
                                const tm_trace_shape *expect, tm_trace_shape *out) {
    tm_status st;
    uint64_t n_layer = 0, n_expert = 0, n_used = 0;
    const json_t *model = json_object_get(root, "model");
    if (!json_is_object(model))
        return tm_error_set(TM_ERR_FORMAT, "%s: model: missing or not an object", origin);
    const json_t *arch = json_object_get(model, "arch");
    if (!json_is_string(arch) || json_string_length(arch) >= sizeof(out->arch))
        return tm_error_set(TM_ERR_FORMAT, "%s: model.arch: expected a string of at most %zu bytes",
                            origin, sizeof(out->arch) - 1);
    if ((st = trace_json_u64(model, "n_layer", origin, "model.", &n_layer)) ||
        (st = trace_json_u64(model, "n_expert", origin, "model.", &n_expert)) ||
        (st = trace_json_u64(model, "n_expert_used", origin, "model.", &n_used)))
        return st;
    if (expect) {
        if (strcmp(json_string_value(arch), expect->arch))
            return tm_error_set(TM_ERR_FORMAT, "%s: model.arch is \"%s\", the model is \"%s\"",
                                origin, json_string_value(arch), expect->arch);
        if ((st = shape_check(origin, "n_layer", n_layer, expect->n_layer)) ||
            (st = shape_check(origin, "n_expert", n_expert, expect->n_expert)) ||
            (st = shape_check(origin, "n_expert_used", n_used, expect->n_expert_used)))
            return st;
    }
    if (!n_layer || n_layer > TM_TRACE_MAX_LAYER || !n_expert || n_expert > TM_TRACE_MAX_EXPERT ||
        !n_used || n_used > n_expert || n_used > TM_TRACE_MAX_USED)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: model: unsupported shape %llu layers, %llu experts, %llu used",
                            origin, (unsigned long long)n_layer, (unsigned long long)n_expert,
                            (unsigned long long)n_used);
    memset(out, 0, sizeof(*out));
    snprintf(out->arch, sizeof(out->arch), "%s", json_string_value(arch));
    out->n_layer = (uint32_t)n_layer, out->n_expert = (uint32_t)n_expert;
    out->n_expert_used = (uint32_t)n_used;
    return TM_OK;
}

tm_status trace_json_load(const char *path, json_t **out) {
    json_error_t err;
    *out = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    if (*out) return TM_OK;
    if (err.line < 0 || (err.position == 0 && err.line <= 1 && strstr(err.text, "unable to open")))
        return tm_error_set(TM_ERR_IO, "%s: %s", path, err.text);
    return tm_error_set(TM_ERR_FORMAT, "%s: not valid JSON (line %d, column %d): %s", path,
                        err.line, err.column, err.text);
}

tm_status trace_json_check_format(const json_t *root, const char *origin, const char *format,
                                  int version) {
    tm_status st;
    if (!json_is_object(root))
        return tm_error_set(TM_ERR_FORMAT, "%s: expected a JSON object at the top", origin);
    const json_t *fmt = json_object_get(root, "format");
    if (!json_is_string(fmt) || strcmp(json_string_value(fmt), format))
        return tm_error_set(TM_ERR_FORMAT, "%s: format: expected \"%s\"", origin, format);
    uint64_t v = 0;
    if ((st = trace_json_u64(root, "version", origin, "", &v))) return st;
    if (v != (uint64_t)version)
        return tm_error_set(TM_ERR_UNSUPPORTED, "%s: version: %llu, this build reads version %d",
                            origin, (unsigned long long)v, version);
    return TM_OK;
}

tm_status trace_stats_from_json(const json_t *root, const char *origin,
                                const tm_trace_shape *expect, tm_trace_stats *out) {
    memset(out, 0, sizeof(*out));
    tm_status st;
    tm_trace_shape sh;
    uint64_t tokens = 0, window = 0;
    if ((st = trace_json_check_format(root, origin, TM_TRACE_FORMAT, TM_TRACE_VERSION)) ||
        (st = trace_shape_from_json(root, origin, expect, &sh)) ||
        (st = trace_json_u64(root, "tokens", origin, "", &tokens)) ||
        (st = trace_json_u64(root, "window", origin, "", &window)))
        return st;
    if (!window || window > 1u << 20)
        return tm_error_set(TM_ERR_FORMAT, "%s: window: expected 1..2^20", origin);
    if (trace_stats_init(out, &sh, (uint32_t)window) != TM_OK)
        return tm_error_set(TM_ERR_NOMEM, "%s: out of memory", origin);
    const uint32_t n_layer = sh.n_layer;
    out->tokens = tokens;
    /* Optional (files written before they existed have neither): the window
     * reuse's W' (0 = no window-reuse counts in the file) and the label of a
     * synthetic model's routing. */
    uint64_t reuse_window = 0;
    if (json_object_get(root, "reuse_window") &&
        (st = trace_json_u64(root, "reuse_window", origin, "", &reuse_window)))
        goto fail;
    if (reuse_window > 1u << 20) {
        st = tm_error_set(TM_ERR_FORMAT, "%s: reuse_window: expected 0..2^20", origin);
        goto fail;
    }
    out->reuse_window = (uint32_t)reuse_window;
    const json_t *synth = json_object_get(json_object_get(root, "model"), "synthetic_routing");
    if (synth && !json_is_string(synth)) {
        st = tm_error_set(TM_ERR_FORMAT, "%s: model.synthetic_routing: expected a string", origin);
        goto fail;
    }
    if (synth) snprintf(out->routing, sizeof(out->routing), "%s", json_string_value(synth));
    const json_t *layers = json_object_get(root, "layers");
    if (!json_is_array(layers)) {
        st = tm_error_set(TM_ERR_FORMAT, "%s: layers: missing or not an array", origin);
        goto fail;
    }
    if (json_array_size(layers) != n_layer) {
        st = tm_error_set(TM_ERR_FORMAT, "%s: layers: %zu entries, model.n_layer is %u", origin,
                          json_array_size(layers), n_layer);
        goto fail;
    }
    for (uint32_t l = 0; l < sh.n_layer; l++) {
        const json_t *o = json_array_get(layers, l);
        tm_trace_layer *L = &out->layers[l];
        char where[48];
        snprintf(where, sizeof(where), "layers[%u].", l);
        uint64_t idx = 0;
        if (!json_is_object(o)) {
            st = tm_error_set(TM_ERR_FORMAT, "%s: layers[%u]: expected an object", origin, l);
            goto fail;
        }
        if ((st = trace_json_u64(o, "layer", origin, where, &idx))) goto fail;
        if (idx != l) {
            st = tm_error_set(TM_ERR_FORMAT,
                              "%s: layers[%u].layer: is %llu, expected %u (layers in order)",
                              origin, l, (unsigned long long)idx, l);
            goto fail;
        }
        struct {
            const char *key;
            uint64_t *v;
        } f[] = {{"calls", &L->calls},
                 {"tokens", &L->tokens},
                 {"expert_hits_total", &L->expert_hits_total},
                 {"hot_slots_total", &L->hot_slots_total},
                 {"cold_slots_total", &L->cold_slots_total},
                 {"routing_time_ns", &L->routing_ns},
                 {"experts_time_ns", &L->experts_ns},
                 {"merge_time_ns", &L->merge_ns},
                 {"wait_time_ns", &L->wait_ns},
                 {"working_set_sum", &L->ws_sum},
                 {"working_set_samples", &L->ws_samples},
                 {"working_set_max", &L->ws_max},
                 {"reuse_shared", &L->reuse_shared},
                 {"reuse_pairs", &L->reuse_pairs}};
        for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++)
            if ((st = trace_json_u64(o, f[i].key, origin, where, f[i].v))) goto fail;
        if (reuse_window &&
            ((st = trace_json_u64(o, "reuse_window_shared", origin, where, &L->reuse_win_shared)) ||
             (st = trace_json_u64(o, "reuse_window_tokens", origin, where, &L->reuse_win_tokens))))
            goto fail;
        if (L->reuse_win_shared > L->reuse_win_tokens * sh.n_expert_used ||
            L->reuse_win_tokens > L->tokens) {
            st = tm_error_set(TM_ERR_FORMAT,
                              "%s: layers[%u].reuse_window_*: more shared experts than "
                              "reuse_window_tokens * n_expert_used, or more tokens than the layer "
                              "routed",
                              origin, l);
            goto fail;
        }
        if ((st = get_u64_array(o, "experts", origin, where, sh.n_expert, L->experts)) ||
            (st = get_u64_array(o, "hot_experts", origin, where, sh.n_expert, L->hot_experts)) ||
            (st = get_u64_array(o, "cold_experts", origin, where, sh.n_expert, L->cold_experts)))
            goto fail;
        /* consistency: the per-expert counts are the slots */
        uint64_t sum = 0;
        for (uint32_t e = 0; e < sh.n_expert; e++) sum += L->experts[e];
        if (sum != L->expert_hits_total) {
            st = tm_error_set(
                TM_ERR_FORMAT,
                "%s: layers[%u].expert_hits_total: is %llu, the experts[] sum to %llu", origin, l,
                (unsigned long long)L->expert_hits_total, (unsigned long long)sum);
            goto fail;
        }
        if (L->expert_hits_total != L->tokens * sh.n_expert_used) {
            st = tm_error_set(
                TM_ERR_FORMAT,
                "%s: layers[%u].expert_hits_total: is %llu, tokens * n_expert_used is %llu", origin,
                l, (unsigned long long)L->expert_hits_total,
                (unsigned long long)(L->tokens * sh.n_expert_used));
            goto fail;
        }
        if (L->ws_max > sh.n_expert || L->ws_sum > L->ws_samples * sh.n_expert) {
            st = tm_error_set(
                TM_ERR_FORMAT,
                "%s: layers[%u].working_set_*: more distinct experts than the model has", origin,
                l);
            goto fail;
        }
    }
    return TM_OK;
fail:
    trace_stats_free(out);
    return st;
}

tm_status trace_stats_read_json(const char *path, const tm_trace_shape *expect,
                                tm_trace_stats *out) {
    memset(out, 0, sizeof(*out));
    json_t *root;
    tm_status st = trace_json_load(path, &root);
    if (st != TM_OK) return st;
    st = trace_stats_from_json(root, path, expect, out);
    json_decref(root);
    return st;
}

/* ---- merge ---- */

tm_status trace_stats_merge(tm_trace_stats *dst, const tm_trace_stats *src, const char *src_name) {
    const tm_trace_shape *a = &dst->shape, *b = &src->shape;
    if (strcmp(a->arch, b->arch))
        return tm_error_set(TM_ERR_ARG, "%s: model.arch is \"%s\", the others' \"%s\"", src_name,
                            b->arch, a->arch);
    if (a->n_layer != b->n_layer || a->n_expert != b->n_expert ||
        a->n_expert_used != b->n_expert_used)
        return tm_error_set(TM_ERR_ARG,
                            "%s: model shape %u layers x %u experts (top-%u) differs from the "
                            "others' %u x %u (top-%u)",
                            src_name, b->n_layer, b->n_expert, b->n_expert_used, a->n_layer,
                            a->n_expert, a->n_expert_used);
    if (dst->window != src->window)
        return tm_error_set(
            TM_ERR_ARG, "%s: window is %u, the others' %u (working sets would not be comparable)",
            src_name, src->window, dst->window);
    /* a file without window-reuse counts (reuse_window 0) adds none */
    if (dst->reuse_window && src->reuse_window && dst->reuse_window != src->reuse_window)
        return tm_error_set(TM_ERR_ARG, "%s: reuse_window is %u, the others' %u", src_name,
                            src->reuse_window, dst->reuse_window);
    if (!dst->reuse_window) dst->reuse_window = src->reuse_window;
    if (strcmp(dst->routing, src->routing)) snprintf(dst->routing, sizeof(dst->routing), "mixed");
    dst->tokens += src->tokens;
    for (uint32_t l = 0; l < a->n_layer; l++) {
        tm_trace_layer *x = &dst->layers[l];
        const tm_trace_layer *y = &src->layers[l];
        x->calls += y->calls, x->tokens += y->tokens, x->expert_hits_total += y->expert_hits_total;
        x->hot_slots_total += y->hot_slots_total, x->cold_slots_total += y->cold_slots_total;
        x->routing_ns += y->routing_ns, x->experts_ns += y->experts_ns;
        x->merge_ns += y->merge_ns, x->wait_ns += y->wait_ns;
        x->ws_sum += y->ws_sum, x->ws_samples += y->ws_samples;
        if (y->ws_max > x->ws_max) x->ws_max = y->ws_max;
        x->reuse_shared += y->reuse_shared, x->reuse_pairs += y->reuse_pairs;
        x->reuse_win_shared += y->reuse_win_shared, x->reuse_win_tokens += y->reuse_win_tokens;
        for (size_t e = 0; e < 3 * (size_t)a->n_expert; e++) x->experts[e] += y->experts[e];
    }
    return TM_OK;
}

/* ---- skew ---- */

static int cmp_desc(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

void trace_layer_skew(const tm_trace_stats *s, uint32_t layer, tm_trace_skew *out) {
    const uint32_t E = s->shape.n_expert;
    const tm_trace_layer *L = &s->layers[layer];
    static const double frac[3] = {0.10, 0.25, 0.50};
    memset(out, 0, sizeof(*out));
    uint64_t *c = malloc(E * sizeof(uint64_t));
    uint64_t total = 0;
    for (uint32_t e = 0; e < E; e++) total += L->experts[e], out->n_used += L->experts[e] > 0;
    for (int i = 0; i < 3; i++) {
        uint32_t m = (uint32_t)ceil(frac[i] * E - 1e-9);
        out->n_top[i] = m < 1 ? 1 : m;
    }
    if (!total || !c) {
        free(c);
        return;
    }
    memcpy(c, L->experts, E * sizeof(uint64_t));
    qsort(c, E, sizeof(uint64_t), cmp_desc);
    double h = 0, acc = 0;
    uint32_t next = 0;
    for (uint32_t e = 0; e < E; e++) {
        const double p = (double)c[e] / (double)total;
        if (p > 0) h -= p * log(p);
        acc += p;
        while (next < 3 && e + 1 == out->n_top[next]) out->top[next++] = acc;
    }
    out->entropy = E > 1 ? h / log((double)E) : 0;
    out->top1 = (double)c[0] / (double)total;
    free(c);
}
