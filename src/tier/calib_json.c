/* The calibration profile as JSON (docs/calibrate.md):
 *
 *   {"format": "tiermoe-calib", "version": 1, "created": "2026-11-30T12:00:00Z", "quick": false,
 *    "key": {"cpu": "...", "gpu": "..." ("" without one), "threads": 16,
 *            "expert": {"n_embd", "n_ff", "gate_type", "up_type", "down_type", "bytes"}},
 *    "host": {"cpu_level": "amx", "cpu_read_gbs": 117.3 (0: not measured)},
 *    "experts_per_call": 8,
 *    "cpu_expert_ns": [{"tokens": 1, "ns": 33000.0}, ...],
 *    "gpu": {                                   (only with a GPU)
 *        "copy": {"expert_bytes", "big_bytes", "h2d_pinned_expert_gbs", "h2d_pinned_big_gbs",
 *                 "h2d_pageable_expert_gbs", "h2d_pageable_big_gbs", "d2h_pinned_big_gbs"},
 *        "pcie_read_gbs", "pcie_read_concurrent_gbs", "cpu_lane_gbs", "cpu_lane_concurrent_gbs",
 *        "handoff_round_trip_ns", "gpu_expert_ns": [{"tokens", "ns"}, ...]},
 *    "measure_s": {"membw": 0.4, "touch": ..., ...}}
 *
 * Reading validates every field (type, range, curves increasing in tokens
 * and non-decreasing in ns); errors name the file and the field. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tier/calib_internal.h"

#define CALIB_FORMAT "tiermoe-calib"

/* ---- write ---- */

static json_t *calib_curve_json(const tm_calib_curve *cv) {
    json_t *a = json_array();
    for (int32_t i = 0; a && i < cv->n; i++)
        if (json_array_append_new(
                a, json_pack("{s:i, s:f}", "tokens", (json_int_t)cv->tokens[i], "ns", cv->ns[i]))) {
            json_decref(a);
            return NULL;
        }
    return a;
}

static json_t *calib_to_json(const tm_calib *c) {
    const tm_calib_expert *x = &c->key.expert;
    json_t *measure = json_object();
    for (int i = 0; measure && i < TM_CALIB_PHASE_COUNT; i++)
        if (json_object_set_new(measure, tm_calib_phase_names[i], json_real(c->measure_s[i]))) {
            json_decref(measure);
            measure = NULL;
        }
    json_t *root = json_pack(
        "{s:s, s:i, s:s, s:b, s:{s:s, s:s, s:i, s:{s:I, s:I, s:s, s:s, s:s, s:I}}, s:{s:s, s:f}, "
        "s:i, s:o, s:o}",
        "format", CALIB_FORMAT, "version", TM_CALIB_VERSION, "created", c->created, "quick",
        c->quick, "key", "cpu", c->key.cpu, "gpu", c->key.gpu, "threads", c->key.threads, "expert",
        "n_embd", (json_int_t)x->n_embd, "n_ff", (json_int_t)x->n_ff, "gate_type",
        quant_type_name(x->gate_type), "up_type", quant_type_name(x->up_type), "down_type",
        quant_type_name(x->down_type), "bytes", (json_int_t)x->bytes, "host", "cpu_level",
        c->cpu_level, "cpu_read_gbs", c->cpu_read_gbs, "experts_per_call", c->experts_per_call,
        "cpu_expert_ns", calib_curve_json(&c->cpu_expert), "measure_s", measure);
    if (!root || !c->key.gpu[0]) return root;
    const tm_calib_copy *p = &c->copy;
    json_t *gpu = json_pack(
        "{s:{s:I, s:I, s:f, s:f, s:f, s:f, s:f}, s:f, s:f, s:f, s:f, s:f, s:o}", "copy",
        "expert_bytes", (json_int_t)p->expert_bytes, "big_bytes", (json_int_t)p->big_bytes,
        "h2d_pinned_expert_gbs", p->h2d_pinned_expert_gbs, "h2d_pinned_big_gbs",
        p->h2d_pinned_big_gbs, "h2d_pageable_expert_gbs", p->h2d_pageable_expert_gbs,
        "h2d_pageable_big_gbs", p->h2d_pageable_big_gbs, "d2h_pinned_big_gbs",
        p->d2h_pinned_big_gbs, "pcie_read_gbs", c->pcie_read_gbs, "pcie_read_concurrent_gbs",
        c->pcie_read_concurrent_gbs, "cpu_lane_gbs", c->cpu_lane_gbs, "cpu_lane_concurrent_gbs",
        c->cpu_lane_concurrent_gbs, "handoff_round_trip_ns", c->handoff_round_trip_ns,
        "gpu_expert_ns", calib_curve_json(&c->gpu_expert));
    if (!gpu || json_object_set_new(root, "gpu", gpu)) {
        json_decref(root);
        return NULL;
    }
    return root;
}

/* mkdir -p of the directories above path. */
static tm_status calib_make_parents(const char *path) {
    char dir[4096];
    if (snprintf(dir, sizeof(dir), "%s", path) >= (int)sizeof(dir))
        return tm_error_set(TM_ERR_ARG, "%s: path too long", path);
    for (char *s = dir + 1; *s; s++) {
        if (*s != '/') continue;
        *s = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return tm_error_set(TM_ERR_IO, "%s: cannot make directory %s: %s", path, dir,
                                strerror(errno));
        *s = '/';
    }
    return TM_OK;
}

tm_status calib_write_json(const tm_calib *c, const char *path) {
    tm_status st = calib_make_parents(path);
    if (st != TM_OK) return st;
    json_t *root = calib_to_json(c);
    if (!root)
        return tm_error_set(TM_ERR_ARG,
                            "%s: the profile holds a value JSON cannot (not finite) or memory "
                            "ran out",
                            path);
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long)getpid());
    const int rc = json_dump_file(root, tmp, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    if (rc != 0) {
        remove(tmp);
        return tm_error_set(TM_ERR_IO, "%s: cannot write %s", path, tmp);
    }
    if (rename(tmp, path) != 0) {
        const int e = errno;
        remove(tmp);
        return tm_error_set(TM_ERR_IO, "%s: cannot rename %s to it: %s", path, tmp, strerror(e));
    }
    return TM_OK;
}

/* ---- read ---- */

/* A field of obj named `name`, at `where` ("key.expert."): its value, or an
 * error naming the file and the field. */
typedef struct calib_reader {
    const char *path;
} calib_reader;

static tm_status calib_field(const calib_reader *r, json_t *obj, const char *where,
                             const char *name, json_t **out) {
    *out = json_object_get(obj, name);
    if (!*out)
        return tm_error_set(TM_ERR_FORMAT, "%s: field '%s%s' is missing", r->path, where, name);
    return TM_OK;
}

static tm_status calib_get_obj(const calib_reader *r, json_t *obj, const char *where,
                               const char *name, json_t **out) {
    tm_status st = calib_field(r, obj, where, name, out);
    if (st == TM_OK && !json_is_object(*out))
        return tm_error_set(TM_ERR_FORMAT, "%s: field '%s%s' must be an object", r->path, where,
                            name);
    return st;
}

static tm_status calib_get_num(const calib_reader *r, json_t *obj, const char *where,
                               const char *name, double lo, double hi, double *out) {
    json_t *v;
    tm_status st = calib_field(r, obj, where, name, &v);
    if (st != TM_OK) return st;
    const double d = json_number_value(v);
    if (!json_is_number(v) || !isfinite(d) || d < lo || d > hi)
        return tm_error_set(TM_ERR_FORMAT, "%s: field '%s%s' must be a number in [%g, %g]", r->path,
                            where, name, lo, hi);
    *out = d;
    return TM_OK;
}

static tm_status calib_get_int(const calib_reader *r, json_t *obj, const char *where,
                               const char *name, long long lo, long long hi, long long *out) {
    json_t *v;
    tm_status st = calib_field(r, obj, where, name, &v);
    if (st != TM_OK) return st;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return tm_error_set(TM_ERR_FORMAT, "%s: field '%s%s' must be an integer in [%lld, %lld]",
                            r->path, where, name, lo, hi);
    *out = (long long)json_integer_value(v);
    return TM_OK;
}

static tm_status calib_get_str(const calib_reader *r, json_t *obj, const char *where,
                               const char *name, char *buf, size_t n) {
    json_t *v;
    tm_status st = calib_field(r, obj, where, name, &v);
    if (st != TM_OK) return st;
    if (!json_is_string(v) || json_string_length(v) >= n)
        return tm_error_set(TM_ERR_FORMAT, "%s: field '%s%s' must be a string of at most %zu bytes",
                            r->path, where, name, n - 1);
    memcpy(buf, json_string_value(v), json_string_length(v) + 1);
    return TM_OK;
}

static tm_status calib_get_type(const calib_reader *r, json_t *obj, const char *where,
                                const char *name, tm_type *out) {
    char s[32];
    tm_status st = calib_get_str(r, obj, where, name, s, sizeof(s));
    if (st == TM_OK && quant_type_from_name(s, out) != TM_OK)
        return tm_error_set(TM_ERR_FORMAT, "%s: field '%s%s': unknown type '%s'", r->path, where,
                            name, s);
    return st;
}

static tm_status calib_get_curve(const calib_reader *r, json_t *obj, const char *where,
                                 const char *name, tm_calib_curve *cv) {
    json_t *a;
    tm_status st = calib_field(r, obj, where, name, &a);
    if (st != TM_OK) return st;
    if (!json_is_array(a) || !json_array_size(a) || json_array_size(a) > TM_CALIB_MAX_POINTS)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: field '%s%s' must be an array of 1 to %d {tokens, ns} points",
                            r->path, where, name, TM_CALIB_MAX_POINTS);
    cv->n = (int32_t)json_array_size(a);
    for (int32_t i = 0; i < cv->n; i++) {
        char at[96];
        snprintf(at, sizeof(at), "%s%s[%d].", where, name, i);
        json_t *p = json_array_get(a, (size_t)i);
        long long tok;
        if (!json_is_object(p))
            return tm_error_set(TM_ERR_FORMAT, "%s: field '%s%s[%d]' must be an object", r->path,
                                where, name, i);
        if ((st = calib_get_int(r, p, at, "tokens", 1, 1 << 20, &tok)) ||
            (st = calib_get_num(r, p, at, "ns", 1e-3, 1e15, &cv->ns[i])))
            return st;
        cv->tokens[i] = (int32_t)tok;
        if (i && cv->tokens[i] <= cv->tokens[i - 1])
            return tm_error_set(TM_ERR_FORMAT,
                                "%s: field '%stokens': %d after %d (tokens must increase)", r->path,
                                at, cv->tokens[i], cv->tokens[i - 1]);
        if (i && cv->ns[i] < cv->ns[i - 1])
            return tm_error_set(TM_ERR_FORMAT,
                                "%s: field '%sns': %g after %g (more tokens never cost less)",
                                r->path, at, cv->ns[i], cv->ns[i - 1]);
    }
    return TM_OK;
}

static tm_status calib_read_key(const calib_reader *r, json_t *root, tm_calib_key *k) {
    json_t *key, *ex;
    long long v[3];
    tm_status st;
    if ((st = calib_get_obj(r, root, "", "key", &key)) ||
        (st = calib_get_str(r, key, "key.", "cpu", k->cpu, sizeof(k->cpu))) ||
        (st = calib_get_str(r, key, "key.", "gpu", k->gpu, sizeof(k->gpu))) ||
        (st = calib_get_int(r, key, "key.", "threads", 1, 4096, &v[0])) ||
        (st = calib_get_obj(r, key, "key.", "expert", &ex)) ||
        (st = calib_get_int(r, ex, "key.expert.", "n_embd", 1, 1 << 20, &v[1])) ||
        (st = calib_get_int(r, ex, "key.expert.", "n_ff", 1, 1 << 20, &v[2])) ||
        (st = calib_get_type(r, ex, "key.expert.", "gate_type", &k->expert.gate_type)) ||
        (st = calib_get_type(r, ex, "key.expert.", "up_type", &k->expert.up_type)) ||
        (st = calib_get_type(r, ex, "key.expert.", "down_type", &k->expert.down_type)))
        return st;
    long long bytes;
    if ((st = calib_get_int(r, ex, "key.expert.", "bytes", 1, 1LL << 40, &bytes))) return st;
    k->threads = (int32_t)v[0], k->expert.n_embd = v[1], k->expert.n_ff = v[2];
    k->expert.bytes = (uint64_t)bytes;
    return TM_OK;
}

static tm_status calib_read_gpu(const calib_reader *r, json_t *root, tm_calib *c) {
    json_t *gpu, *cp;
    tm_calib_copy *p = &c->copy;
    long long eb, bb;
    tm_status st;
    if ((st = calib_get_obj(r, root, "", "gpu", &gpu)) ||
        (st = calib_get_obj(r, gpu, "gpu.", "copy", &cp)) ||
        (st = calib_get_int(r, cp, "gpu.copy.", "expert_bytes", 1, 1LL << 40, &eb)) ||
        (st = calib_get_int(r, cp, "gpu.copy.", "big_bytes", eb + 1, 1LL << 42, &bb)) ||
        (st = calib_get_num(r, cp, "gpu.copy.", "h2d_pinned_expert_gbs", 1e-6, 1e6,
                            &p->h2d_pinned_expert_gbs)) ||
        (st = calib_get_num(r, cp, "gpu.copy.", "h2d_pinned_big_gbs", 1e-6, 1e6,
                            &p->h2d_pinned_big_gbs)) ||
        (st = calib_get_num(r, cp, "gpu.copy.", "h2d_pageable_expert_gbs", 1e-6, 1e6,
                            &p->h2d_pageable_expert_gbs)) ||
        (st = calib_get_num(r, cp, "gpu.copy.", "h2d_pageable_big_gbs", 1e-6, 1e6,
                            &p->h2d_pageable_big_gbs)) ||
        (st = calib_get_num(r, cp, "gpu.copy.", "d2h_pinned_big_gbs", 1e-6, 1e6,
                            &p->d2h_pinned_big_gbs)) ||
        (st = calib_get_num(r, gpu, "gpu.", "pcie_read_gbs", 1e-6, 1e6, &c->pcie_read_gbs)) ||
        (st = calib_get_num(r, gpu, "gpu.", "pcie_read_concurrent_gbs", 1e-6, 1e6,
                            &c->pcie_read_concurrent_gbs)) ||
        (st = calib_get_num(r, gpu, "gpu.", "cpu_lane_gbs", 1e-6, 1e6, &c->cpu_lane_gbs)) ||
        (st = calib_get_num(r, gpu, "gpu.", "cpu_lane_concurrent_gbs", 1e-6, 1e6,
                            &c->cpu_lane_concurrent_gbs)) ||
        (st = calib_get_num(r, gpu, "gpu.", "handoff_round_trip_ns", 1e-3, 1e12,
                            &c->handoff_round_trip_ns)) ||
        (st = calib_get_curve(r, gpu, "gpu.", "gpu_expert_ns", &c->gpu_expert)))
        return st;
    p->expert_bytes = (uint64_t)eb, p->big_bytes = (uint64_t)bb;
    return TM_OK;
}

static tm_status calib_from_json(const calib_reader *r, json_t *root, tm_calib *c) {
    if (!json_is_object(root)) return tm_error_set(TM_ERR_FORMAT, "%s: not a JSON object", r->path);
    char format[32];
    long long version, per_call;
    json_t *host, *measure, *quick;
    tm_status st;
    if ((st = calib_get_str(r, root, "", "format", format, sizeof(format)))) return st;
    if (strcmp(format, CALIB_FORMAT))
        return tm_error_set(TM_ERR_FORMAT, "%s: field 'format' is \"%s\", expected \"%s\"", r->path,
                            format, CALIB_FORMAT);
    if ((st = calib_get_int(r, root, "", "version", 0, 1 << 30, &version))) return st;
    if (version != TM_CALIB_VERSION)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: field 'version' is %lld, this build reads %d (measure again)",
                            r->path, version, TM_CALIB_VERSION);
    if ((st = calib_get_str(r, root, "", "created", c->created, sizeof(c->created))) ||
        (st = calib_field(r, root, "", "quick", &quick)))
        return st;
    if (!json_is_boolean(quick))
        return tm_error_set(TM_ERR_FORMAT, "%s: field 'quick' must be true or false", r->path);
    c->quick = json_is_true(quick);
    if ((st = calib_read_key(r, root, &c->key)) ||
        (st = calib_get_obj(r, root, "", "host", &host)) ||
        (st = calib_get_str(r, host, "host.", "cpu_level", c->cpu_level, sizeof(c->cpu_level))) ||
        (st = calib_get_num(r, host, "host.", "cpu_read_gbs", 0, 1e6, &c->cpu_read_gbs)) ||
        (st = calib_get_int(r, root, "", "experts_per_call", 1, 4096, &per_call)) ||
        (st = calib_get_curve(r, root, "", "cpu_expert_ns", &c->cpu_expert)) ||
        (st = calib_get_obj(r, root, "", "measure_s", &measure)))
        return st;
    c->experts_per_call = (int32_t)per_call;
    for (int i = 0; i < TM_CALIB_PHASE_COUNT; i++)
        if ((st = calib_get_num(r, measure, "measure_s.", tm_calib_phase_names[i], 0, 1e6,
                                &c->measure_s[i])))
            return st;
    if (c->key.gpu[0]) return calib_read_gpu(r, root, c);
    if (json_object_get(root, "gpu"))
        return tm_error_set(TM_ERR_FORMAT, "%s: field 'gpu' is there but key.gpu is empty",
                            r->path);
    return TM_OK;
}

tm_status calib_key_check(const char *path, const tm_calib_key *k, const tm_calib_key *e) {
    const tm_calib_expert *a = &k->expert, *b = &e->expert;
    if (strcmp(k->cpu, e->cpu))
        return tm_error_set(TM_ERR_ARG, "%s: key.cpu is \"%s\", this machine's \"%s\"", path,
                            k->cpu, e->cpu);
    if (strcmp(k->gpu, e->gpu))
        return tm_error_set(TM_ERR_ARG, "%s: key.gpu is \"%s\", this run's \"%s\"", path, k->gpu,
                            e->gpu);
    if (k->threads != e->threads)
        return tm_error_set(TM_ERR_ARG, "%s: key.threads is %d, this run uses %d", path, k->threads,
                            e->threads);
    if (a->n_embd != b->n_embd || a->n_ff != b->n_ff || a->gate_type != b->gate_type ||
        a->up_type != b->up_type || a->down_type != b->down_type || a->bytes != b->bytes)
        return tm_error_set(TM_ERR_ARG,
                            "%s: key.expert is %lld x %lld %s/%s/%s (%llu bytes), this model's "
                            "%lld x %lld %s/%s/%s (%llu bytes): a profile for another expert "
                            "shape is not rescaled",
                            path, (long long)a->n_embd, (long long)a->n_ff,
                            quant_type_name(a->gate_type), quant_type_name(a->up_type),
                            quant_type_name(a->down_type), (unsigned long long)a->bytes,
                            (long long)b->n_embd, (long long)b->n_ff, quant_type_name(b->gate_type),
                            quant_type_name(b->up_type), quant_type_name(b->down_type),
                            (unsigned long long)b->bytes);
    return TM_OK;
}

tm_status calib_read_json(const char *path, const tm_calib_key *expect, tm_calib *out) {
    memset(out, 0, sizeof(*out));
    json_error_t err;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        if (err.line < 0 ||
            (err.position == 0 && err.line <= 1 && strstr(err.text, "unable to open")))
            return tm_error_set(TM_ERR_IO, "%s: %s", path, err.text);
        return tm_error_set(TM_ERR_FORMAT, "%s: not valid JSON (line %d, column %d): %s", path,
                            err.line, err.column, err.text);
    }
    const calib_reader r = {path};
    tm_status st = calib_from_json(&r, root, out);
    json_decref(root);
    if (st == TM_OK && expect) st = calib_key_check(path, &out->key, expect);
    if (st != TM_OK) memset(out, 0, sizeof(*out));
    return st;
}
