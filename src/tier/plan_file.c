/* Plan files: the JSON of docs/plan-format.md, written atomically and read
 * by one validating parser (files, request bodies, the fuzzer). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "tier/plan.h"

json_t *plan_to_json(const tm_plan *plan) {
    const tm_trace_shape *sh = &plan->shape;
    json_t *root = json_object(), *layers = json_array();
    json_t *model = json_pack("{s:s, s:I, s:I, s:I}", "arch", sh->arch, "n_layer",
                              (json_int_t)sh->n_layer, "n_expert", (json_int_t)sh->n_expert,
                              "n_expert_used", (json_int_t)sh->n_expert_used);
    if (!root || !layers || !model) goto fail;
    json_object_set_new(root, "format", json_string(TM_PLAN_FORMAT));
    json_object_set_new(root, "version", json_integer(TM_PLAN_VERSION));
    json_object_set_new(root, "model", model);
    model = NULL;
    json_object_set_new(root, "weighting", json_string(plan_weighting_name(plan->mode)));
    json_object_set_new(root, "layer_curve", json_real(plan->layer_curve));
    json_object_set_new(root, "budget_bytes", json_integer((json_int_t)plan->budget_bytes));
    json_object_set_new(root, "used_bytes", json_integer((json_int_t)plan->used_bytes));
    for (uint32_t l = 0; l < sh->n_layer; l++) {
        json_t *ids = json_array();
        for (int32_t i = 0; ids && i < plan->n_slots[l]; i++)
            if (json_array_append_new(ids, json_integer(plan->experts[l][i]))) {
                json_decref(ids);
                ids = NULL;
            }
        json_t *o = ids ? json_pack("{s:I, s:I, s:o}", "layer", (json_int_t)l, "expert_bytes",
                                    (json_int_t)plan->expert_bytes[l], "experts", ids)
                        : NULL;
        if (!o || json_array_append_new(layers, o)) goto fail;
    }
    json_object_set_new(root, "layers", layers);
    return root;
fail:
    json_decref(root), json_decref(layers), json_decref(model);
    return NULL;
}

/* One entry of layers[]: index, expert bytes, ids in range and distinct. */
static tm_status plan_layer_from_json(const json_t *o, const char *origin, uint32_t l,
                                      uint8_t *seen, tm_plan *out) {
    const uint32_t E = out->shape.n_expert;
    char where[48];
    snprintf(where, sizeof(where), "layers[%u].", l);
    uint64_t idx = 0, bytes = 0;
    tm_status st;
    if (!json_is_object(o))
        return tm_error_set(TM_ERR_FORMAT, "%s: layers[%u]: expected an object", origin, l);
    if ((st = trace_json_u64(o, "layer", origin, where, &idx))) return st;
    if (idx != l)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: layers[%u].layer: is %llu, expected %u (layers in order)", origin,
                            l, (unsigned long long)idx, l);
    if ((st = trace_json_u64(o, "expert_bytes", origin, where, &bytes))) return st;
    const json_t *a = json_object_get(o, "experts");
    if (!json_is_array(a))
        return tm_error_set(TM_ERR_FORMAT, "%s: layers[%u].experts: missing or not an array",
                            origin, l);
    const size_t n = json_array_size(a);
    if (n > E)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: layers[%u].experts: %zu entries, a layer has %u experts", origin,
                            l, n, E);
    if (n && !bytes)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: layers[%u].expert_bytes: 0, but the layer has experts", origin, l);
    if (n && bytes > UINT64_MAX / n)
        return tm_error_set(TM_ERR_FORMAT, "%s: layers[%u].expert_bytes: %llu is too large", origin,
                            l, (unsigned long long)bytes);
    int32_t *ids = malloc((n ? n : 1) * sizeof(int32_t));
    if (!ids) return tm_error_set(TM_ERR_NOMEM, "%s: out of memory", origin);
    memset(seen, 0, E);
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_integer(v)) {
            free(ids);
            return tm_error_set(TM_ERR_FORMAT, "%s: layers[%u].experts[%zu]: expected an integer",
                                origin, l, i);
        }
        const json_int_t e = json_integer_value(v);
        if (e < 0 || e >= (json_int_t)E) {
            free(ids);
            return tm_error_set(TM_ERR_FORMAT, "%s: layers[%u].experts[%zu]: expert %lld of %u",
                                origin, l, i, (long long)e, E);
        }
        if (seen[e]) {
            free(ids);
            return tm_error_set(TM_ERR_FORMAT,
                                "%s: layers[%u].experts[%zu]: expert %lld is listed twice", origin,
                                l, i, (long long)e);
        }
        seen[e] = 1, ids[i] = (int32_t)e;
    }
    out->experts[l] = ids;
    out->n_slots[l] = (int32_t)n;
    out->expert_bytes[l] = bytes;
    return TM_OK;
}

tm_status plan_from_json(const json_t *root, const char *origin, const tm_trace_shape *expect,
                         tm_plan *out) {
    memset(out, 0, sizeof(*out));
    tm_trace_shape sh;
    tm_status st;
    if ((st = trace_json_check_format(root, origin, TM_PLAN_FORMAT, TM_PLAN_VERSION)) ||
        (st = trace_shape_from_json(root, origin, expect, &sh)))
        return st;
    const json_t *w = json_object_get(root, "weighting"),
                 *curve = json_object_get(root, "layer_curve");
    tm_plan_weighting mode;
    if (!json_is_string(w))
        return tm_error_set(TM_ERR_FORMAT, "%s: weighting: missing or not a string", origin);
    if (plan_weighting_parse(json_string_value(w), &mode) != TM_OK)
        return tm_error_wrap(TM_ERR_FORMAT, "%s: weighting", origin);
    if (!json_is_number(curve) || !(json_number_value(curve) >= 0) ||
        json_number_value(curve) > TM_PLAN_CURVE_MAX)
        return tm_error_set(TM_ERR_FORMAT, "%s: layer_curve: expected a number in [0, %g]", origin,
                            TM_PLAN_CURVE_MAX);
    uint64_t budget = 0, used = 0;
    if ((st = trace_json_u64(root, "budget_bytes", origin, "", &budget)) ||
        (st = trace_json_u64(root, "used_bytes", origin, "", &used)))
        return st;
    const json_t *layers = json_object_get(root, "layers");
    if (!json_is_array(layers))
        return tm_error_set(TM_ERR_FORMAT, "%s: layers: missing or not an array", origin);
    if (json_array_size(layers) != sh.n_layer)
        return tm_error_set(TM_ERR_FORMAT, "%s: layers: %zu entries, model.n_layer is %u", origin,
                            json_array_size(layers), sh.n_layer);
    if ((st = plan_init(out, &sh))) return st;
    out->mode = mode, out->layer_curve = json_number_value(curve);
    out->budget_bytes = budget;
    uint8_t *seen = malloc(sh.n_expert);
    if (!seen) {
        plan_free(out);
        return tm_error_set(TM_ERR_NOMEM, "%s: out of memory", origin);
    }
    uint64_t sum = 0;
    bool overflow = false;
    for (uint32_t l = 0; l < sh.n_layer && st == TM_OK; l++) {
        st = plan_layer_from_json(json_array_get(layers, l), origin, l, seen, out);
        if (st != TM_OK) break;
        const uint64_t b = (uint64_t)out->n_slots[l] * out->expert_bytes[l];
        overflow |= sum + b < sum;
        sum += b;
    }
    free(seen);
    if (st == TM_OK && (overflow || sum != used))
        st = tm_error_set(
            TM_ERR_FORMAT,
            "%s: used_bytes: is %llu, the layers' experts * expert_bytes sum to %s%llu", origin,
            (unsigned long long)used, overflow ? "more than 2^64, " : "", (unsigned long long)sum);
    if (st == TM_OK && used > budget)
        st = tm_error_set(TM_ERR_FORMAT, "%s: used_bytes: %llu exceed budget_bytes %llu", origin,
                          (unsigned long long)used, (unsigned long long)budget);
    if (st != TM_OK) {
        plan_free(out);
        return st;
    }
    out->used_bytes = used;
    return TM_OK;
}

/* Text of the plan: the header on the first line, then one layer a line
 * (readable; a diff shows which layers changed). NULL out of memory. */
static char *plan_dump(const tm_plan *plan) {
    json_t *root = plan_to_json(plan);
    if (!root) return NULL;
    json_t *layers = json_incref(json_object_get(root, "layers"));
    json_object_del(root, "layers");
    char *head = json_dumps(root, JSON_PRESERVE_ORDER | JSON_COMPACT);
    json_decref(root);
    size_t cap = head ? strlen(head) + 16 : 0, n = 0;
    char *buf = head ? malloc(cap) : NULL;
    if (buf) n = (size_t)snprintf(buf, cap, "%.*s,\"layers\":[\n", (int)(strlen(head) - 1), head);
    free(head);
    for (size_t l = 0; buf && l < json_array_size(layers); l++) {
        char *o = json_dumps(json_array_get(layers, l), JSON_PRESERVE_ORDER | JSON_COMPACT);
        const size_t m = o ? strlen(o) : 0;
        char *nb = o ? realloc(buf, cap = n + m + 8) : NULL;
        if (!nb) {
            free(o), free(buf);
            buf = NULL;
            break;
        }
        buf = nb;
        n += (size_t)snprintf(buf + n, cap - n, "%s%s\n", o,
                              l + 1 < json_array_size(layers) ? "," : "");
        free(o);
    }
    json_decref(layers);
    if (!buf) return NULL;
    char *nb = realloc(buf, n + 4);
    if (!nb) {
        free(buf);
        return NULL;
    }
    memcpy(nb + n, "]}\n", 4);
    return nb;
}

tm_status plan_write_json(const tm_plan *plan, const char *path) {
    char *text = plan_dump(plan);
    if (!text) return tm_error_set(TM_ERR_NOMEM, "%s: out of memory serialising the plan", path);
    tm_status st = tm_file_write_atomic(path, text, strlen(text));
    free(text);
    return st;
}

tm_status plan_parse_json(const char *text, size_t len, const char *origin,
                          const tm_trace_shape *expect, tm_plan *out) {
    memset(out, 0, sizeof(*out));
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!root)
        return tm_error_set(TM_ERR_FORMAT, "%s: not valid JSON (line %d, column %d): %s", origin,
                            err.line, err.column, err.text);
    tm_status st = plan_from_json(root, origin, expect, out);
    json_decref(root);
    return st;
}

tm_status plan_read_json(const char *path, const tm_trace_shape *expect, tm_plan *out) {
    memset(out, 0, sizeof(*out));
    json_t *root;
    tm_status st = trace_json_load(path, &root);
    if (st != TM_OK) return st;
    st = plan_from_json(root, path, expect, out);
    json_decref(root);
    return st;
}
