/* Routing of synthetic models (see synth.h): the popularity law and the
 * router biases calibrated to it, the recency head's layout (temporal
 * locality), the named routing profiles and the label tools print. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "cpu/cpu_ops.h"
#include "model/synth.h"
#include "model/synth_consts.h"

/* ---- popularity ---- */

void synth_zipf_targets(uint32_t n_expert, uint32_t k, double s, double q, double *target) {
    double sum = 0;
    for (uint32_t r = 0; r < n_expert; r++) sum += target[r] = pow(r + 1.0 + q, -s);
    for (uint32_t r = 0; r < n_expert; r++) target[r] *= k / sum;
    /* Water-filling: a frequency above the cap is clipped and the excess goes
     * to the others in proportion, until none is above. */
    for (int iter = 0; iter < 64; iter++) {
        double excess = 0, free_mass = 0;
        for (uint32_t r = 0; r < n_expert; r++) {
            if (target[r] > SYNTH_ZIPF_CAP)
                excess += target[r] - SYNTH_ZIPF_CAP, target[r] = SYNTH_ZIPF_CAP;
            else if (target[r] < SYNTH_ZIPF_CAP)
                free_mass += target[r];
        }
        if (excess <= 1e-12 || free_mass <= 0) break;
        for (uint32_t r = 0; r < n_expert; r++)
            if (target[r] < SYNTH_ZIPF_CAP) target[r] += excess * target[r] / free_mass;
    }
}

/* Biases by popularity rank so top-k of (bias + N(0, noise^2)) selects rank r
 * with frequency target[r]. Fixed noise samples keep it deterministic. */
static tm_status synth_calibrate_bias(uint32_t n_expert, uint32_t k, double s, double q,
                                      uint64_t seed, float *bias_by_rank) {
    for (uint32_t e = 0; e < n_expert; e++) bias_by_rank[e] = 0;
    if (s == 0) return TM_OK;
    enum { M = 4096, ITERS = 120 };
    double *target = malloc(n_expert * sizeof(double));
    float *noise = malloc((size_t)M * n_expert * sizeof(float));
    float *logit = malloc(n_expert * sizeof(float));
    uint32_t *count = malloc(n_expert * sizeof(uint32_t));
    if (!target || !noise || !logit || !count) {
        free(target), free(noise), free(logit), free(count);
        return tm_error_set(TM_ERR_NOMEM, "router calibration: out of memory");
    }
    synth_zipf_targets(n_expert, k, s, q, target);
    tm_rng rng;
    tm_rng_seed(&rng, seed ^ 0x5eed0b1a5ull);
    for (size_t i = 0; i < (size_t)M * n_expert; i++)
        noise[i] = SYNTH_ROUTER_NOISE * tm_rng_normal(&rng);
    int32_t idx[64];
    for (int it = 0; it < ITERS; it++) {
        memset(count, 0, n_expert * sizeof(uint32_t));
        for (int m = 0; m < M; m++) {
            for (uint32_t e = 0; e < n_expert; e++)
                logit[e] = bias_by_rank[e] + noise[(size_t)m * n_expert + e];
            cpu_topk(logit, n_expert, k, idx);
            for (uint32_t j = 0; j < k; j++) count[idx[j]]++;
        }
        for (uint32_t e = 0; e < n_expert; e++) {
            double got = (count[e] + 0.5) / M;
            bias_by_rank[e] += (float)(0.7 * log(target[e] / got));
        }
    }
    /* Only differences matter to softmax and top-k: centre them. */
    double mean = 0;
    for (uint32_t e = 0; e < n_expert; e++) mean += bias_by_rank[e];
    mean /= n_expert;
    for (uint32_t e = 0; e < n_expert; e++) bias_by_rank[e] -= (float)mean;
    free(target), free(noise), free(logit), free(count);
    return TM_OK;
}

tm_status synth_router_biases(const tm_synth_config *c, float *bias) {
    float *by_rank = malloc(c->n_expert * sizeof(float));
    uint32_t *perm = malloc(c->n_expert * sizeof(uint32_t));
    if (!by_rank || !perm) {
        free(by_rank), free(perm);
        return tm_error_set(TM_ERR_NOMEM, "router biases: out of memory");
    }
    tm_status st = synth_calibrate_bias(c->n_expert, c->n_expert_used, c->skew, c->skew_offset,
                                        c->seed, by_rank);
    for (uint32_t l = 0; st == TM_OK && l < c->n_layer; l++) {
        /* A different popularity ranking in every layer. */
        tm_rng rng;
        tm_rng_seed(&rng, c->seed * 0x9e3779b97f4a7c15ull + 1000003ull * (l + 1));
        for (uint32_t e = 0; e < c->n_expert; e++) perm[e] = e;
        for (uint32_t e = c->n_expert - 1; e > 0; e--) {
            uint32_t j = (uint32_t)(tm_rng_u64(&rng) % (e + 1));
            uint32_t t = perm[e];
            perm[e] = perm[j], perm[j] = t;
        }
        for (uint32_t r = 0; r < c->n_expert; r++)
            bias[(size_t)l * c->n_expert + perm[r]] = by_rank[r];
    }
    free(by_rank), free(perm);
    return st;
}

/* ---- profiles ---- */

const tm_routing_targets synth_qwen3_targets = {
    .top_half = 0.90, .top1 = 0.043, .reuse_prev = 0.45, .reuse_win = 0.80, .win = 8};

static const struct {
    const char *name;
    double skew, offset, locality, span;
} synth_profiles[] = {
    {"uniform", 0, 0, 0, 0},
    /* calibrated with bench/routing_profile.py, docs/mkmodel.md "Routing profiles" */
    {"qwen3-30b-a3b", 4.2, 70, 0.65, 14},
};

tm_status synth_routing_profile(tm_synth_config *c, const char *name) {
    for (size_t i = 0; i < sizeof(synth_profiles) / sizeof(synth_profiles[0]); i++)
        if (!strcmp(name, synth_profiles[i].name)) {
            c->skew = synth_profiles[i].skew, c->skew_offset = synth_profiles[i].offset;
            c->locality = synth_profiles[i].locality;
            c->locality_span = synth_profiles[i].span;
            c->routing = synth_profiles[i].name;
            return TM_OK;
        }
    return tm_error_set(TM_ERR_ARG,
                        "unknown routing profile '%s' (expected uniform or qwen3-30b-a3b)", name);
}

/* ---- locality ---- */

double synth_locality_score(const tm_synth_config *c, const tm_synth_locality *loc, uint32_t lag) {
    /* NeoX RoPE rotates the pair (i, i + r/2) of the first r = n_rot values by
     * lag * base^(-2i/r); with q = k the pair contributes |q_pair|^2 cos(lag * theta_i)
     * (the values past r, 0 here, would add a constant). */
    const uint32_t d = c->head_dim, r = loc->n_rot, half = r / 2;
    double s = 0;
    for (uint32_t i = 0; i < half; i++) {
        const double th = pow(c->rope_base, -2.0 * i / r);
        const double a =
            (double)loc->qk[i] * loc->qk[i] + (double)loc->qk[i + half] * loc->qk[i + half];
        s += a * cos(lag * th);
    }
    return s * loc->qk_gain * loc->qk_gain / sqrt((double)d);
}

void synth_locality_plan(const tm_synth_config *c, tm_synth_locality *loc) {
    memset(loc, 0, sizeof(*loc));
    const uint32_t E = c->n_embd, d = c->head_dim, r = c->n_rot ? c->n_rot : d, half = r / 2;
    loc->t0 = SYNTH_BIAS_CHANNEL + 1, loc->t_len = d;
    loc->n_tok_dims = E - 1 - d;
    loc->n_rot = r;
    /* the first full-attention layer (hybrid models: the others are linear attention) */
    loc->layer = c->full_attn_interval ? c->full_attn_interval - 1 : 0;
    loc->n_q_heads = c->n_head / c->n_head_kv;
    loc->qk_gain = SYNTH_LOC_QK_GAIN;
    /* A tent s(lag) = H (1 - lag / D) for lag < D has the spectrum
     * (1 - cos(theta D)) / theta^2 >= 0, so it is a sum of the RoPE pairs'
     * cosines with non-negative weights; sampled at RoPE's log-spaced
     * frequencies each pair gets (1 - cos(theta D)) / theta. Softmax of a tent
     * of height H decays as exp(-lag H / D): D = span * H. */
    const double H = (double)SYNTH_LOC_QK_GAIN * SYNTH_LOC_QK_GAIN * sqrt((double)d);
    const double D = c->locality_span * H;
    double p[SYNTH_LOC_MAX_HEAD_DIM / 2], sum = 0;
    for (uint32_t i = 0; i < half; i++) {
        const double th = pow(c->rope_base, -2.0 * i / r);
        sum += p[i] = (1 - cos(th * D)) / th;
    }
    for (uint32_t i = 0; i < half; i++) loc->qk[i] = (float)sqrt(d * p[i] / sum);
    loc->height = synth_locality_score(c, loc, 0);
    /* The average the head makes over a long context, to scale it to unit variance. */
    double sw = 0, sw2 = 0;
    for (uint32_t lag = 0; lag < 4096; lag++) {
        const double w = exp(synth_locality_score(c, loc, lag) - loc->height);
        sw += w, sw2 += w * w;
    }
    loc->n_eff = sw * sw / sw2;
    /* Layer 0's input: token dims of std 1, the bias channel, T empty: rms0.
     * v = Wv rmsnorm(x) then has std 1 / rms0, and the head's average of n_eff
     * of them std 1 / (rms0 sqrt(n_eff)): out_gain brings T to std 1. */
    const double rms0 = sqrt((loc->n_tok_dims * (double)SYNTH_EMBD_STD * SYNTH_EMBD_STD +
                              (double)SYNTH_BIAS_BETA * SYNTH_BIAS_BETA) /
                             E);
    loc->v_std = (float)(1.0 / sqrt((double)loc->n_tok_dims));
    loc->out_gain = (float)(sqrt(loc->n_eff) * rms0);
    loc->router_tok_std = (float)(SYNTH_ROUTER_NOISE * sqrt((1 - c->locality) / loc->n_tok_dims));
    loc->router_topic_std = (float)(SYNTH_ROUTER_NOISE * sqrt(c->locality / d));
    loc->router_full_std = (float)(SYNTH_ROUTER_NOISE * sqrt(1.0 / loc->n_tok_dims));
}

/* ---- label ---- */

bool synth_routing_label(const tm_gguf_file *f, char *out, size_t n) {
    float skew = 0, offset = 0, locality = 0, span = 0;
    tm_gguf_str name = {NULL, 0};
    if (n) out[0] = '\0';
    if (!f || !gguf_file_find_kv(f, "tiermoe.synth.skew") ||
        gguf_file_get_f32(f, "tiermoe.synth.skew", &skew) != TM_OK)
        return false;
    tm_error_clear();
    if (gguf_file_find_kv(f, "tiermoe.synth.skew_offset"))
        gguf_file_get_f32(f, "tiermoe.synth.skew_offset", &offset);
    if (gguf_file_find_kv(f, "tiermoe.synth.locality"))
        gguf_file_get_f32(f, "tiermoe.synth.locality", &locality);
    if (gguf_file_find_kv(f, "tiermoe.synth.locality_span"))
        gguf_file_get_f32(f, "tiermoe.synth.locality_span", &span);
    if (gguf_file_find_kv(f, "tiermoe.synth.routing"))
        gguf_file_get_str(f, "tiermoe.synth.routing", &name);
    tm_error_clear();
    if (skew == 0 && locality == 0) {
        snprintf(out, n, "%.*s", name.data ? (int)name.len : 7, name.data ? name.data : "uniform");
        return true;
    }
    int w = snprintf(out, n, "%.*s: skew %g", name.data ? (int)name.len : 6,
                     name.data ? name.data : "custom", skew);
    if (offset != 0 && w >= 0 && (size_t)w < n)
        w += snprintf(out + w, n - (size_t)w, ", offset %g", offset);
    if (locality != 0 && w >= 0 && (size_t)w < n)
        snprintf(out + w, n - (size_t)w, ", locality %g, span %g", locality, span);
    return true;
}

void synth_routing_print(const tm_gguf_file *f, FILE *out) {
    char label[128];
    if (!synth_routing_label(f, label, sizeof(label))) return;
    fprintf(out, "synthetic routing: %s\n", label);
    uint32_t rows = 0;
    if (gguf_file_find_kv(f, "tiermoe.synth.fill_rows") &&
        gguf_file_get_u32(f, "tiermoe.synth.fill_rows", &rows) == TM_OK)
        fprintf(out,
                "synthetic weights: %u distinct rows a matrix, repeated (mkmodel --fill "
                "repeat: for speed only)\n",
                rows);
    tm_error_clear();
}
