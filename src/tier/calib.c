/* Calibration profiles: the costs the tier asks (interpolated from the
 * measured points), the decode PCIe share, where a machine's profile lives,
 * loading it or measuring a quick one, and the printed table. The format is
 * calib_json.c's, the measurement calib_measure.c's (docs/calibrate.md). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/timing.h"
#include "tier/calib_internal.h"

const int32_t tm_calib_tokens[TM_CALIB_N_TOKENS] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};

const char *const tm_calib_phase_names[TM_CALIB_PHASE_COUNT] = {"membw", "touch", "cpu",    "copy",
                                                                "pcie",  "gpu",   "handoff"};

/* ---- costs ---- */

double calib_curve_ns(const tm_calib_curve *cv, int64_t n_tok) {
    if (n_tok <= 0) return 0;
    if (!cv || cv->n <= 0) return INFINITY;
    const int32_t n = cv->n;
    if (n_tok <= cv->tokens[0]) return cv->ns[0]; /* fewer tokens never cost more */
    for (int32_t i = 1; i < n; i++)
        if (n_tok <= cv->tokens[i]) {
            const double f =
                (double)(n_tok - cv->tokens[i - 1]) / (double)(cv->tokens[i] - cv->tokens[i - 1]);
            return cv->ns[i - 1] + f * (cv->ns[i] - cv->ns[i - 1]);
        }
    /* above the last point: the last segment's slope; a flat (or single)
     * end would price any number of tokens the same, so proportional then */
    const double tl = cv->tokens[n - 1], nl = cv->ns[n - 1];
    double slope = n >= 2 ? (nl - cv->ns[n - 2]) / (tl - cv->tokens[n - 2]) : 0;
    if (!(slope > 0)) slope = nl / tl;
    return nl + slope * ((double)n_tok - tl);
}

double calib_median(double *v, int n) {
    for (int i = 1; i < n; i++) /* insertion sort: a handful of values */
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            const double t = v[j];
            v[j] = v[j - 1], v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double calib_cpu_expert_ns(const tm_calib *c, int64_t n_tok) {
    return calib_curve_ns(&c->cpu_expert, n_tok);
}

double calib_gpu_expert_ns(const tm_calib *c, int64_t n_tok) {
    return c->key.gpu[0] ? calib_curve_ns(&c->gpu_expert, n_tok) : n_tok <= 0 ? 0 : INFINITY;
}

double calib_copy_ns(const tm_calib *c, uint64_t bytes, bool pinned) {
    if (!bytes) return 0;
    const tm_calib_copy *p = &c->copy;
    const double ge = pinned ? p->h2d_pinned_expert_gbs : p->h2d_pageable_expert_gbs;
    const double gb = pinned ? p->h2d_pinned_big_gbs : p->h2d_pageable_big_gbs;
    if (!c->key.gpu[0] || !(ge > 0) || !(gb > 0) || !p->expert_bytes ||
        p->big_bytes <= p->expert_bytes)
        return INFINITY;
    /* GB/s = bytes per ns */
    const double e = (double)p->expert_bytes, B = (double)p->big_bytes, x = (double)bytes;
    const double te = e / ge, tb = fmax(B / gb, te);
    if (x >= B) return tb + (x - B) / gb;
    if (x >= e) return te + (tb - te) * (x - e) / (B - e);
    const double lat = fmin(fmax(te - e * (tb - te) / (B - e), 0), te);
    return lat + (te - lat) * x / e;
}

double calib_pcie_read_gbs(const tm_calib *c, bool concurrent) {
    if (!c->key.gpu[0]) return 0;
    return concurrent ? c->pcie_read_concurrent_gbs : c->pcie_read_gbs;
}

int32_t calib_pcie_share_q8(const tm_calib *c) {
    const double p = calib_pcie_read_gbs(c, true), q = c->cpu_lane_concurrent_gbs;
    if (!(p > 0) || !(q > 0)) return 0;
    return (int32_t)lround(256.0 * p / (p + q));
}

int32_t calib_fetch_cpu_share_q8(const tm_calib *c, uint64_t expert_bytes,
                                 double tokens_per_expert) {
    if (!c->key.gpu[0]) return 0;
    const double cpu = calib_cpu_expert_ns(c, (int64_t)ceil(tokens_per_expert));
    const double copy = calib_copy_ns(c, expert_bytes, true);
    if (!(cpu > 0) || !(copy > 0) || !isfinite(cpu) || !isfinite(copy)) return 0;
    return (int32_t)lround(256.0 * TM_CALIB_FETCH_CPU_DAMP * copy / (copy + cpu));
}

void calib_curve_fit(tm_calib_curve *cv) {
    double v[TM_CALIB_MAX_POINTS];
    int32_t w[TM_CALIB_MAX_POINTS], m = 0;
    for (int32_t i = 0; i < cv->n; i++) { /* pool adjacent violators, equal weights */
        v[m] = cv->ns[i], w[m++] = 1;
        while (m > 1 && v[m - 2] > v[m - 1]) {
            v[m - 2] = (v[m - 2] * w[m - 2] + v[m - 1] * w[m - 1]) / (w[m - 2] + w[m - 1]);
            w[m - 2] += w[m - 1], m--;
        }
    }
    for (int32_t b = 0, i = 0; b < m; b++)
        for (int32_t j = 0; j < w[b]; j++) cv->ns[i++] = v[b];
}

/* ---- what to measure on ---- */

/* One projection of layer l: its tensor, checked against [ne0, ne1, n_expert]
 * (n_expert 0: any, set from it). */
static tm_status calib_proj(const tm_gguf_file *f, uint32_t l, const char *proj, int64_t ne0,
                            int64_t ne1, uint32_t *n_expert, tm_moe_matrix *out, bool *found) {
    char name[64];
    snprintf(name, sizeof(name), "blk.%u.ffn_%s_exps.weight", l, proj);
    const tm_gguf_tensor *t = gguf_file_find_tensor(f, name);
    *found = t != NULL;
    if (!t) return TM_OK;
    const tm_type_traits *tr = quant_type_traits(t->type);
    if (t->n_dims != 3 || !t->data || !tr || !tr->dequantize || t->ne[0] != ne0 ||
        t->ne[1] != ne1 || t->ne[0] % tr->block_size || t->ne[2] < 1 ||
        (*n_expert && t->ne[2] != *n_expert))
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: tensor '%s' is [%lld, %lld, %lld] of %s, expected [%lld, %lld, "
                            "experts] of a computable type, in the mapping",
                            f->path, name, (long long)t->ne[0], (long long)t->ne[1],
                            (long long)t->ne[2], quant_type_name(t->type), (long long)ne0,
                            (long long)ne1);
    *n_expert = (uint32_t)t->ne[2];
    const size_t row = quant_row_size((tm_type)t->type, t->ne[0]);
    *out = (tm_moe_matrix){.data = t->data,
                           .type = (tm_type)t->type,
                           .expert_stride = row * (size_t)t->ne[1],
                           .row_bytes = row};
    return TM_OK;
}

tm_status calib_experts_from_gguf(const tm_gguf_file *f, tm_moe_experts **layers, uint32_t *n_layer,
                                  uint32_t *n_expert) {
    *layers = NULL, *n_layer = 0, *n_expert = 0;
    uint32_t last = 0, any = 0;
    for (uint64_t i = 0; i < f->n_tensors; i++) {    /* the highest layer with experts */
        const tm_gguf_str *nm = &f->tensors[i].name; /* not NUL-terminated */
        char name[96], rest[32];
        unsigned l;
        if (nm->len >= sizeof(name)) continue;
        memcpy(name, nm->data, nm->len), name[nm->len] = '\0';
        if (sscanf(name, "blk.%u.ffn_gate_exps.%31s", &l, rest) == 2 && l < (1u << 16))
            last = any && l < last ? last : l, any = 1;
    }
    tm_moe_experts *ex = any ? calloc((size_t)last + 1, sizeof(*ex)) : NULL;
    if (any && !ex) return tm_error_set(TM_ERR_NOMEM, "out of memory");
    uint32_t n = 0;
    tm_status st = TM_OK;
    for (uint32_t l = 0; any && l <= last && st == TM_OK; l++) {
        const tm_gguf_tensor *g = NULL;
        char name[64];
        snprintf(name, sizeof(name), "blk.%u.ffn_gate_exps.weight", l);
        if (!(g = gguf_file_find_tensor(f, name))) continue;
        const int64_t E = g->ne[0], F = g->ne[1];
        tm_moe_experts *x = &ex[n];
        bool fg, fu, fd;
        if ((st = calib_proj(f, l, "gate", E, F, n_expert, &x->gate, &fg)) ||
            (st = calib_proj(f, l, "up", E, F, n_expert, &x->up, &fu)) ||
            (st = calib_proj(f, l, "down", F, E, n_expert, &x->down, &fd)))
            break;
        if (!fu || !fd)
            st = tm_error_set(TM_ERR_FORMAT, "%s: layer %u has %s but no ffn_%s_exps", f->path, l,
                              name, fu ? "down" : "up");
        else if (n && (E != ex[0].n_embd || F != ex[0].n_ff))
            st = tm_error_set(TM_ERR_FORMAT, "%s: %s is %lld x %lld, layer 0's experts %lld x %lld",
                              f->path, name, (long long)E, (long long)F, (long long)ex[0].n_embd,
                              (long long)ex[0].n_ff);
        x->n_embd = E, x->n_ff = F, x->act = TM_MOE_ACT_SWIGLU;
        n++;
    }
    if (st == TM_OK && !n)
        st = tm_error_set(TM_ERR_ARG, "%s: no layer has blk.N.ffn_{gate,up,down}_exps tensors",
                          f->path);
    if (st != TM_OK) {
        free(ex);
        *n_expert = 0;
        return st;
    }
    *layers = ex, *n_layer = n;
    return TM_OK;
}

/* ---- where a profile lives ---- */

/* Lower-case letters and digits, anything else one '-', at most n - 1 chars. */
static void calib_slug(const char *s, char *out, size_t n) {
    size_t j = 0;
    for (; *s && j + 1 < n; s++) {
        const char ch = *s;
        if ((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9'))
            out[j++] = ch;
        else if (ch >= 'A' && ch <= 'Z')
            out[j++] = (char)(ch - 'A' + 'a');
        else if (j && out[j - 1] != '-')
            out[j++] = '-';
    }
    while (j && out[j - 1] == '-') j--;
    out[j] = '\0';
}

tm_status calib_default_path(const tm_calib_key *key, char *buf, size_t n) {
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[2048];
    if (xdg && xdg[0] == '/') /* the XDG spec: a relative value is ignored */
        snprintf(dir, sizeof(dir), "%s/tiermoe", xdg);
    else if (home && *home)
        snprintf(dir, sizeof(dir), "%s/.cache/tiermoe", home);
    else
        return tm_error_set(TM_ERR_ARG, "calibration: neither XDG_CACHE_HOME nor HOME is set, so "
                                        "there is no cache directory for the profile; give a path");
    char cpu[64], gpu[64], types[64];
    const tm_calib_expert *x = &key->expert;
    calib_slug(key->cpu, cpu, sizeof(cpu));
    calib_slug(key->gpu[0] ? key->gpu : "no gpu", gpu, sizeof(gpu));
    char t[48];
    snprintf(t, sizeof(t), "%s %s %s", quant_type_name(x->gate_type), quant_type_name(x->up_type),
             quant_type_name(x->down_type));
    calib_slug(t, types, sizeof(types));
    const int w =
        snprintf(buf, n, "%s/calib-%s--%s--t%d--%lldx%lld-%s.json", dir, cpu[0] ? cpu : "cpu", gpu,
                 key->threads, (long long)x->n_embd, (long long)x->n_ff, types);
    if (w < 0 || (size_t)w >= n)
        return tm_error_set(TM_ERR_ARG, "calibration: the profile's path under %s is too long",
                            dir);
    return TM_OK;
}

/* The last quick measurement of this process and the key it was made for:
 * a process that makes several contexts (bench, tests) measures once. */
static pthread_mutex_t calib_kept_mu = PTHREAD_MUTEX_INITIALIZER;
static bool calib_kept_valid;
static tm_calib_key calib_kept_key;
static tm_calib calib_kept;

static bool calib_kept_get(const tm_calib_key *key, tm_calib *out) {
    pthread_mutex_lock(&calib_kept_mu);
    const bool hit = calib_kept_valid && calib_key_check("", &calib_kept_key, key) == TM_OK;
    if (hit) *out = calib_kept;
    pthread_mutex_unlock(&calib_kept_mu);
    return hit;
}

void calib_kept_clear(void) {
    pthread_mutex_lock(&calib_kept_mu);
    calib_kept_valid = false;
    pthread_mutex_unlock(&calib_kept_mu);
}

static void calib_kept_set(const tm_calib_key *key, const tm_calib *c) {
    pthread_mutex_lock(&calib_kept_mu);
    calib_kept_key = *key, calib_kept = *c, calib_kept_valid = true;
    pthread_mutex_unlock(&calib_kept_mu);
}

tm_status calib_load_or_measure(const tm_calib_source *src, const char *path, tm_calib *out,
                                bool *measured) {
    if (measured) *measured = false;
    tm_calib_key key;
    tm_status st = calib_key_make(src, &key);
    if (st != TM_OK) return st;
    char buf[4096], why[1024];
    if (!path || !*path) path = getenv("TIERMOE_CALIB");
    if ((!path || !*path) && calib_default_path(&key, buf, sizeof(buf)) == TM_OK) path = buf;
    tm_status rst = TM_ERR_IO;
    if (path && *path) {
        rst = calib_read_json(path, &key, out);
        if (rst == TM_OK) {
            tm_log_info("calibration: %s (%s, measured %s)", path, out->quick ? "quick" : "full",
                        out->created);
            return TM_OK;
        }
    }
    snprintf(why, sizeof(why), "%s", tm_error_message());
    if (calib_kept_get(&key, out)) {
        tm_log_info("calibration: the quick profile this process measured (%s)", why);
        return TM_OK;
    }
    const uint64_t t0 = tm_time_ns();
    const tm_calib_opts o = {.quick = true};
    st = calib_measure(src, &o, out);
    if (st != TM_OK && src->gpu) { /* fail safe: the CPU's numbers, the GPU's lanes unpriced */
        tm_log_warn("calibration: %s; measuring again without the GPU", tm_error_message());
        tm_calib_source cpu = *src;
        cpu.gpu = NULL;
        st = calib_measure(&cpu, &o, out);
    }
    if (st != TM_OK) return tm_error_wrap(st, "calibration (quick)");
    if (measured) *measured = true;
    calib_kept_set(&key, out);
    const double ms = (double)(tm_time_ns() - t0) * 1e-6;
    if (rst == TM_ERR_FORMAT)
        tm_log_warn("calibration: %s; measured a quick profile instead in %.0f ms", why, ms);
    else
        tm_log_info("calibration: no profile for this machine and expert shape (%s); measured a "
                    "quick one in %.0f ms (`tiermoe calibrate -m MODEL` saves a full one)",
                    why, ms);
    return TM_OK;
}

/* ---- the table ---- */

static double calib_mib(uint64_t b) {
    return (double)b / 1048576.0;
}

void calib_print_head(FILE *f, const tm_calib *c) {
    const tm_calib_expert *x = &c->key.expert;
    fprintf(f, "CPU: %s, %d threads, %s kernels\nGPU: %s\n", c->key.cpu, c->key.threads,
            c->cpu_level, c->key.gpu[0] ? c->key.gpu : "none (the CPU parts only)");
    fprintf(f, "expert: %lld x %lld (gate %s, up %s, down %s), %.2f MiB; %d experts a call%s\n",
            (long long)x->n_embd, (long long)x->n_ff, quant_type_name(x->gate_type),
            quant_type_name(x->up_type), quant_type_name(x->down_type), calib_mib(x->bytes),
            c->experts_per_call, c->quick ? "; quick" : "");
}

void calib_print_membw(FILE *f, const tm_calib *c) {
    if (c->cpu_read_gbs > 0)
        fprintf(f, "CPU read bandwidth: %.1f GB/s\n", c->cpu_read_gbs);
    else
        fprintf(f, "CPU read bandwidth: not measured (quick)\n");
}

void calib_print_cpu_head(FILE *f) {
    fprintf(f, "CPU lane, time per expert (weights read once a call):\n"
               "  tokens   us/expert  weights GB/s   us/token\n");
}

/* Row i of a curve: tokens, us per expert, weight GB/s, and `last` (the
 * caller's column). */
static void calib_print_row(FILE *f, const tm_calib *c, const tm_calib_curve *cv, int i,
                            double last) {
    const double ns = cv->ns[i];
    fprintf(f, "  %6d  %10.1f  %12.1f  %9.2f\n", cv->tokens[i], ns * 1e-3,
            (double)c->key.expert.bytes / ns, last);
    fflush(f);
}

void calib_print_cpu_row(FILE *f, const tm_calib *c, int i) {
    const tm_calib_curve *cv = &c->cpu_expert;
    calib_print_row(f, c, cv, i, cv->ns[i] * 1e-3 / cv->tokens[i]);
}

void calib_print_copy(FILE *f, const tm_calib *c) {
    const tm_calib_copy *p = &c->copy;
    fprintf(f,
            "copies                   one expert (%.2f MiB)   %.0f MiB\n"
            "  host->GPU pinned         %8.1f GB/s       %8.1f GB/s\n"
            "  host->GPU pageable       %8.1f GB/s       %8.1f GB/s   (cuda_upload: pinned "
            "staging)\n"
            "  GPU->host pinned                                %8.1f GB/s\n",
            calib_mib(p->expert_bytes), calib_mib(p->big_bytes), p->h2d_pinned_expert_gbs,
            p->h2d_pinned_big_gbs, p->h2d_pageable_expert_gbs, p->h2d_pageable_big_gbs,
            p->d2h_pinned_big_gbs);
    fflush(f);
}

void calib_print_pcie(FILE *f, const tm_calib *c) {
    const int32_t share = calib_pcie_share_q8(c), k = c->experts_per_call;
    fprintf(f,
            "PCIe lane (GPU kernels reading pinned RAM in place, 1 token, %d experts a launch):\n"
            "  alone %.1f GB/s; while the CPU lane runs %.1f GB/s\n"
            "  the CPU lane (1 token): alone %.1f GB/s; while the GPU reads %.1f GB/s\n"
            "  decode share: %d/256 of a token's cold slots to the PCIe lane (%d of %d)\n",
            k, c->pcie_read_gbs, c->pcie_read_concurrent_gbs, c->cpu_lane_gbs,
            c->cpu_lane_concurrent_gbs, share, share ? tm_cuda_mapped_count(k, k, share) : 0, k);
    fflush(f);
}

void calib_print_gpu_head(FILE *f) {
    fprintf(f, "GPU from VRAM, time per expert:\n"
               "  tokens   us/expert  weights GB/s    CPU/GPU\n");
}

void calib_print_gpu_row(FILE *f, const tm_calib *c, int i) {
    const tm_calib_curve *cv = &c->gpu_expert;
    calib_print_row(f, c, cv, i, calib_cpu_expert_ns(c, cv->tokens[i]) / cv->ns[i]);
}

void calib_print_handoff(FILE *f, const tm_calib *c) {
    fprintf(f, "hand-off round trip (GPU signal, host answer, GPU wait): %.1f us\n",
            c->handoff_round_trip_ns * 1e-3);
    fflush(f);
}

void calib_print_time(FILE *f, const tm_calib *c) {
    double total = 0;
    for (int i = 0; i < TM_CALIB_PHASE_COUNT; i++) total += c->measure_s[i];
    fprintf(f, "time: %.2f s (", total);
    const char *sep = "";
    for (int i = 0; i < TM_CALIB_PHASE_COUNT; i++)
        if (c->measure_s[i] > 0) {
            fprintf(f, "%s%s %.2f", sep, tm_calib_phase_names[i], c->measure_s[i]);
            sep = ", ";
        }
    fprintf(f, ")\n");
    fflush(f);
}

void calib_print(const tm_calib *c, FILE *f) {
    calib_print_head(f, c);
    calib_print_membw(f, c);
    calib_print_cpu_head(f);
    for (int i = 0; i < c->cpu_expert.n; i++) calib_print_cpu_row(f, c, i);
    if (c->key.gpu[0]) {
        calib_print_copy(f, c);
        calib_print_pcie(f, c);
        calib_print_gpu_head(f);
        for (int i = 0; i < c->gpu_expert.n; i++) calib_print_gpu_row(f, c, i);
        calib_print_handoff(f, c);
    }
    calib_print_time(f, c);
}
