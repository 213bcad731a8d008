/* Synthetic qwen3moe models: see synth.h for the weight scaling and the
 * router-bias channel that gives expert popularity a chosen Zipf law. */
#include "model/synth.h"

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/rng.h"
#include "core/timing.h"
#include "cpu/cpu.h"
#include "cpu/cpu_ops.h"
#include "gguf/gguf.h"
#include "model/synth_consts.h"
#include "model/synth_mix.h"
#include "model/synth_tensor.h"
#include "tokenizer/tokenizer.h"

tm_status synth_config_preset(tm_synth_config *cfg, const char *preset) {
    memset(cfg, 0, sizeof(*cfg));
    cfg->rope_base = 1e6f;
    cfg->rms_eps = 1e-6f;
    cfg->seed = 42;
    cfg->locality_span = 8; /* used only with locality > 0 */
    cfg->type_experts = TM_TYPE_Q4_K;
    cfg->type_attn = TM_TYPE_Q8_0;
    cfg->type_embd = TM_TYPE_Q4_K;
    cfg->type_output = TM_TYPE_Q8_0;
    cfg->type_shexp = TM_TYPE_Q8_0; /* the hybrid presets' shared expert */
    cfg->type_gate_exps = cfg->type_up_exps = cfg->type_down_exps = TM_TYPE_COUNT;
    if (synth_hybrid_preset(cfg, preset) || synth_moe_arch_preset(cfg, preset) ||
        synth_gemma4_preset(cfg, preset))
        return TM_OK;
    if (!strcmp(preset, "tiny")) {
        /* Smallest shape that still takes K-quants (rows of 256) and GQA. */
        cfg->n_layer = 3, cfg->n_embd = 256, cfg->n_head = 4, cfg->n_head_kv = 2;
        cfg->head_dim = 64, cfg->n_expert = 16, cfg->n_expert_used = 4, cfg->n_ff_exp = 256;
        cfg->n_ff = 512, cfg->n_vocab = 1024, cfg->n_ctx = 4096;
        cfg->name = "tiermoe tiny qwen3moe";
        return TM_OK;
    }
    if (!strcmp(preset, "30b-a3b")) {
        /* Qwen3-30B-A3B. */
        cfg->n_layer = 48, cfg->n_embd = 2048, cfg->n_head = 32, cfg->n_head_kv = 4;
        cfg->head_dim = 128, cfg->n_expert = 128, cfg->n_expert_used = 8, cfg->n_ff_exp = 768;
        cfg->n_ff = 6144, cfg->n_vocab = 151936, cfg->n_ctx = 40960;
        cfg->name = "tiermoe synthetic Qwen3-30B-A3B";
        return TM_OK;
    }
    if (!strncmp(preset, "gpt-oss-", 8) || !strcmp(preset, "tiny-gpt-oss")) {
        /* gpt-oss as llama.cpp's converter writes OpenAI's release: experts MXFP4, the other
         * matrices Q8_0; YaRN x32 over 4096, window 128 on even layers */
        cfg->arch = "gpt-oss", cfg->window = 128, cfg->rope_factor = 32, cfg->rope_orig_ctx = 4096;
        cfg->rope_base = 150000, cfg->rms_eps = 1e-5f;
        cfg->type_experts = TM_TYPE_MXFP4, cfg->type_embd = TM_TYPE_Q8_0;
        cfg->n_head = 64, cfg->n_head_kv = 8, cfg->head_dim = 64, cfg->n_expert_used = 4;
        cfg->n_embd = cfg->n_ff_exp = cfg->n_ff = 2880, cfg->n_vocab = 201088, cfg->n_ctx = 131072;
        if (!strcmp(preset, "gpt-oss-20b")) {
            cfg->n_layer = 24, cfg->n_expert = 32;
            cfg->name = "tiermoe synthetic gpt-oss-20b";
            return TM_OK;
        }
        if (!strcmp(preset, "gpt-oss-120b")) {
            cfg->n_layer = 36, cfg->n_expert = 128;
            cfg->name = "tiermoe synthetic gpt-oss-120b";
            return TM_OK;
        }
        if (!strcmp(preset, "tiny-gpt-oss")) { /* 4 layers: both attention kinds twice */
            cfg->n_layer = 4, cfg->n_embd = cfg->n_ff_exp = cfg->n_ff = 256, cfg->n_head = 4;
            cfg->n_head_kv = 2, cfg->n_expert = 16, cfg->n_vocab = 1024, cfg->n_ctx = 4096;
            cfg->window = 16;
            cfg->name = "tiermoe tiny gpt-oss";
            return TM_OK;
        }
    }
    return tm_error_set(TM_ERR_ARG,
                        "unknown preset '%s' (expected tiny, 30b-a3b, gpt-oss-20b, gpt-oss-120b, "
                        "tiny-gpt-oss, qwen3-next-80b-a3b, qwen3.5-35b-a3b, qwen3.6-35b-a3b, "
                        "tiny-qwen3next, tiny-qwen35moe, mixtral-8x7b, olmoe-1b-7b, glm-4.5-air, "
                        "glm-4.5, deepseek-v3, kimi-k2, tiny-mixtral, tiny-olmoe, tiny-glm4moe, "
                        "tiny-deepseek-v3, tiny-deepseek-v2-lite, gemma-4-26b-a4b or "
                        "tiny-gemma-4)",
                        preset);
}

tm_status synth_dims_check(const synth_dim *dims, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (dims[i].v < dims[i].lo || dims[i].v > dims[i].hi)
            return tm_error_set(TM_ERR_ARG, "--%s: %u is outside [%u, %u]%s%s%s", dims[i].name,
                                dims[i].v, dims[i].lo, dims[i].hi, what ? " (" : "",
                                what ? what : "", what ? ")" : "");
    return TM_OK;
}

static bool synth_gptoss(const tm_synth_config *c) {
    return c->arch && !strcmp(c->arch, "gpt-oss");
}

static tm_status synth_types_check(const tm_synth_config *c);

tm_status synth_config_validate(const tm_synth_config *c) {
    const synth_dim dims[] = {
        {"n-layer", c->n_layer, 1, 1024},
        {"n-embd", c->n_embd, 2, 65536},
        {"n-head", c->n_head, 1, 1024},
        {"n-head-kv", c->n_head_kv, 1, 1024},
        {"head-dim", c->head_dim, 2, 1024},
        {"n-expert", c->n_expert, 1, 1024},
        {"n-expert-used", c->n_expert_used, 1, 32},
        {"n-ff-exp", c->n_ff_exp, 1, 1 << 20},
        {"n-vocab", c->n_vocab, 1, 1 << 24},
        {"n-ctx", c->n_ctx, 1, 1 << 24},
    };
    tm_status st = synth_dims_check(dims, sizeof(dims) / sizeof(dims[0]), NULL);
    if (st != TM_OK) return st;
    if (c->n_head % c->n_head_kv)
        return tm_error_set(TM_ERR_ARG, "--n-head %u is not a multiple of --n-head-kv %u",
                            c->n_head, c->n_head_kv);
    if (c->head_dim % 2)
        return tm_error_set(TM_ERR_ARG, "--head-dim %u must be even (RoPE rotates pairs)",
                            c->head_dim);
    if (c->n_expert_used > c->n_expert)
        return tm_error_set(TM_ERR_ARG, "--n-expert-used %u exceeds --n-expert %u",
                            c->n_expert_used, c->n_expert);
    if (!(c->skew >= 0 && c->skew <= 8))
        return tm_error_set(TM_ERR_ARG, "--skew %g is outside [0, 8]", c->skew);
    if (!(c->skew_offset >= 0 && c->skew_offset <= 10000))
        return tm_error_set(TM_ERR_ARG, "--skew-offset %g is outside [0, 10000]", c->skew_offset);
    if (!(c->locality >= 0 && c->locality < 1))
        return tm_error_set(TM_ERR_ARG, "--locality %g is outside [0, 1)", c->locality);
    if (c->locality > 0) {
        if (!(c->locality_span >= 0.25 && c->locality_span <= 1024))
            return tm_error_set(TM_ERR_ARG, "--locality-span %g is outside [0.25, 1024]",
                                c->locality_span);
        if (c->n_embd < 2 * c->head_dim + 2 || c->head_dim > SYNTH_LOC_MAX_HEAD_DIM)
            return tm_error_set(TM_ERR_ARG,
                                "--locality needs --n-embd >= 2 * --head-dim + 2 (the topic "
                                "subspace takes head-dim dimensions; head-dim at most %d), got "
                                "n-embd %u, head-dim %u",
                                SYNTH_LOC_MAX_HEAD_DIM, c->n_embd, c->head_dim);
    }
    if (c->arch && strcmp(c->arch, "qwen3moe") && !synth_gptoss(c) && !synth_is_hybrid(c) &&
        !synth_is_moe_arch(c) && !synth_is_gemma4(c))
        return tm_error_set(TM_ERR_ARG,
                            "architecture '%s': expected qwen3moe, gpt-oss, qwen3next, qwen35moe, "
                            "llama, olmoe, glm4moe, deepseek2 or gemma4",
                            c->arch);
    /* the recency head is built for qwen3moe's attention, which the hybrid's full layers share */
    if (c->locality > 0 && c->arch && strcmp(c->arch, "qwen3moe") && !synth_is_hybrid(c))
        return tm_error_set(TM_ERR_UNSUPPORTED,
                            "--locality %g: the recency head is calibrated for qwen3moe's "
                            "attention (QK norm, NeoX RoPE), not %s's yet",
                            c->locality, c->arch);
    if (synth_is_gemma4(c) && (st = synth_gemma4_validate(c)) != TM_OK) return st;
    if (synth_is_hybrid(c) && (st = synth_hybrid_validate(c)) != TM_OK) return st;
    if (synth_is_moe_arch(c) && (st = synth_moe_arch_validate(c)) != TM_OK) return st;
    if (synth_gptoss(c) && (!c->window || !(c->rope_factor >= 1) || !c->rope_orig_ctx))
        return tm_error_set(TM_ERR_ARG, "gpt-oss: window %u, YaRN factor %g over %u", c->window,
                            c->rope_factor, c->rope_orig_ctx);
    if (c->fill_rows > (1u << 20))
        return tm_error_set(TM_ERR_ARG, "--fill-rows %u is outside [1, %u]", c->fill_rows,
                            1u << 20);
    if (!(c->rope_base > 0) || !(c->rms_eps > 0))
        return tm_error_set(TM_ERR_ARG, "rope base and rms epsilon must be positive");
    return synth_types_check(c);
}

/* ---- tensors ---- */

static int64_t synth_tensor_rows(const synth_tensor *t) {
    return t->ne[1] * t->ne[2];
}

/* The tensor list llama.cpp's converter writes for gpt-oss, in its order (biases
 * after their weights, sinks after the attention). Biases and sinks are small
 * random values so that a missing one shows; the router's skew rides on the
 * bias channel as for qwen3moe (its bias tensor stays small). */
static uint32_t synth_tensors_build_gptoss(const tm_synth_config *c, const float *bias,
                                           synth_tensor *t) {
    uint32_t n = 0;
    const int64_t E = c->n_embd, Q = (int64_t)c->n_head * c->head_dim,
                  KV = (int64_t)c->n_head_kv * c->head_dim, F = c->n_ff_exp, X = c->n_expert;
    const float in_std = 1.0f / sqrtf((float)E);
    synth_tensor_set(&t[n++], "token_embd.weight", TM_SYNTH_EMBD, INIT_EMBD, SYNTH_EMBD_STD, 2, E,
                     c->n_vocab, 1);
    for (uint32_t l = 0; l < c->n_layer; l++) {
        char nm[64];
#define SYNTH_T(suffix, ...)                                                                       \
    (snprintf(nm, sizeof(nm), "blk.%u." suffix, l), synth_tensor_set(&t[n++], nm, __VA_ARGS__),    \
     t[n - 1].layer = l)
        SYNTH_T("attn_norm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, E, 1, 1);
        SYNTH_T("attn_q.weight", TM_SYNTH_ATTN_Q, INIT_NORMAL, in_std, 2, E, Q, 1);
        SYNTH_T("attn_q.bias", TM_SYNTH_F32, INIT_NORMAL, SYNTH_BIAS_STD, 1, Q, 1, 1);
        SYNTH_T("attn_k.weight", TM_SYNTH_ATTN_K, INIT_NORMAL, in_std, 2, E, KV, 1);
        SYNTH_T("attn_k.bias", TM_SYNTH_F32, INIT_NORMAL, SYNTH_BIAS_STD, 1, KV, 1, 1);
        SYNTH_T("attn_v.weight", TM_SYNTH_ATTN_V, INIT_NORMAL, in_std, 2, E, KV, 1);
        SYNTH_T("attn_v.bias", TM_SYNTH_F32, INIT_NORMAL, SYNTH_BIAS_STD, 1, KV, 1, 1);
        SYNTH_T("attn_output.weight", TM_SYNTH_ATTN_O, INIT_NORMAL,
                SYNTH_ATTN_OUT_STD / sqrtf((float)Q), 2, Q, E, 1);
        SYNTH_T("attn_output.bias", TM_SYNTH_F32, INIT_NORMAL, SYNTH_BIAS_STD, 1, E, 1, 1);
        SYNTH_T("attn_sinks.weight", TM_SYNTH_F32, INIT_NORMAL, SYNTH_SINK_STD, 1, c->n_head, 1, 1);
        SYNTH_T("post_attention_norm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, E, 1, 1);
        SYNTH_T("ffn_gate_inp.weight", TM_SYNTH_F32, INIT_ROUTER, SYNTH_ROUTER_NOISE * in_std, 2, E,
                X, 1);
        t[n - 1].bias = bias + (size_t)l * X;
        SYNTH_T("ffn_gate_inp.bias", TM_SYNTH_F32, INIT_NORMAL, SYNTH_BIAS_STD, 1, X, 1, 1);
        SYNTH_T("ffn_gate_exps.weight", TM_SYNTH_GATE_EXPS, INIT_NORMAL, in_std, 3, E, F, X);
        SYNTH_T("ffn_up_exps.weight", TM_SYNTH_UP_EXPS, INIT_NORMAL, in_std, 3, E, F, X);
        SYNTH_T("ffn_down_exps.weight", TM_SYNTH_DOWN_EXPS, INIT_NORMAL,
                SYNTH_FFN_OUT_STD / (SYNTH_SWIGLU_OAI_RMS * sqrtf((float)F)), 3, F, E, X);
        SYNTH_T("ffn_gate_exps.bias", TM_SYNTH_F32, INIT_NORMAL, SYNTH_BIAS_STD, 2, F, X, 1);
        SYNTH_T("ffn_up_exps.bias", TM_SYNTH_F32, INIT_NORMAL, SYNTH_BIAS_STD, 2, F, X, 1);
        SYNTH_T("ffn_down_exps.bias", TM_SYNTH_F32, INIT_NORMAL, SYNTH_BIAS_STD, 2, E, X, 1);
#undef SYNTH_T
    }
    synth_tensor_set(&t[n++], "output_norm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, E, 1, 1);
    synth_tensor_set(&t[n++], "output.weight", TM_SYNTH_OUTPUT, INIT_NORMAL, in_std, 2, E,
                     c->n_vocab, 1);
    return n;
}

/* The tensor list llama.cpp's converter writes for qwen3moe, in its order;
 * loc (NULL when locality is 0) is attached to the tensors it changes. */
static uint32_t synth_tensors_list(const tm_synth_config *c, const float *bias,
                                   const tm_synth_locality *loc, synth_tensor *t) {
    if (synth_gptoss(c)) return synth_tensors_build_gptoss(c, bias, t);
    if (synth_is_hybrid(c)) return synth_hybrid_tensors(c, bias, loc, t);
    if (synth_is_moe_arch(c)) return synth_moe_arch_tensors(c, bias, t);
    if (synth_is_gemma4(c)) return synth_gemma4_tensors(c, bias, t);
    uint32_t n = 0;
    const int64_t E = c->n_embd, Q = (int64_t)c->n_head * c->head_dim,
                  KV = (int64_t)c->n_head_kv * c->head_dim;
    const float in_std = 1.0f / sqrtf((float)E);
    synth_tensor_set(&t[n++], "token_embd.weight", TM_SYNTH_EMBD, INIT_EMBD, SYNTH_EMBD_STD, 2, E,
                     c->n_vocab, 1);
    t[n - 1].role = ROLE_EMBD, t[n - 1].loc = loc;
    for (uint32_t l = 0; l < c->n_layer; l++) {
        char nm[64];
#define SYNTH_T(suffix, ...)                                                                       \
    (snprintf(nm, sizeof(nm), "blk.%u." suffix ".weight", l),                                      \
     synth_tensor_set(&t[n++], nm, __VA_ARGS__), t[n - 1].layer = l)
#define SYNTH_ROLE(r) (t[n - 1].role = (r), t[n - 1].layer = l, t[n - 1].loc = loc)
        SYNTH_T("attn_norm", TM_SYNTH_F32, INIT_ONES, 0, 1, E, 1, 1);
        SYNTH_T("attn_q", TM_SYNTH_ATTN_Q, INIT_NORMAL, in_std, 2, E, Q, 1);
        SYNTH_ROLE(ROLE_Q);
        SYNTH_T("attn_k", TM_SYNTH_ATTN_K, INIT_NORMAL, in_std, 2, E, KV, 1);
        SYNTH_ROLE(ROLE_K);
        SYNTH_T("attn_v", TM_SYNTH_ATTN_V, INIT_NORMAL, in_std, 2, E, KV, 1);
        SYNTH_ROLE(ROLE_V);
        SYNTH_T("attn_output", TM_SYNTH_ATTN_O, INIT_NORMAL, SYNTH_ATTN_OUT_STD / sqrtf((float)Q),
                2, Q, E, 1);
        SYNTH_ROLE(ROLE_O);
        SYNTH_T("attn_q_norm", TM_SYNTH_F32, INIT_ONES, 0, 1, c->head_dim, 1, 1);
        SYNTH_ROLE(ROLE_QK_NORM);
        SYNTH_T("attn_k_norm", TM_SYNTH_F32, INIT_ONES, 0, 1, c->head_dim, 1, 1);
        SYNTH_ROLE(ROLE_QK_NORM);
        SYNTH_T("ffn_norm", TM_SYNTH_F32, INIT_ONES, 0, 1, E, 1, 1);
        SYNTH_T("ffn_gate_inp", TM_SYNTH_F32, INIT_ROUTER, SYNTH_ROUTER_NOISE * in_std, 2, E,
                c->n_expert, 1);
        t[n - 1].bias = bias + (size_t)l * c->n_expert;
        SYNTH_ROLE(ROLE_ROUTER);
        SYNTH_T("ffn_gate_exps", TM_SYNTH_GATE_EXPS, INIT_NORMAL, in_std, 3, E, c->n_ff_exp,
                c->n_expert);
        SYNTH_T("ffn_up_exps", TM_SYNTH_UP_EXPS, INIT_NORMAL, in_std, 3, E, c->n_ff_exp,
                c->n_expert);
        SYNTH_T("ffn_down_exps", TM_SYNTH_DOWN_EXPS, INIT_NORMAL,
                SYNTH_FFN_OUT_STD / (SYNTH_SWIGLU_STD * sqrtf((float)c->n_ff_exp)), 3, c->n_ff_exp,
                E, c->n_expert);
        SYNTH_ROLE(ROLE_DOWN);
#undef SYNTH_ROLE
#undef SYNTH_T
    }
    synth_tensor_set(&t[n++], "output_norm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, E, 1, 1);
    synth_tensor_set(&t[n++], "output.weight", TM_SYNTH_OUTPUT, INIT_NORMAL, in_std, 2, E,
                     c->n_vocab, 1);
    return n;
}

/* The tensor list with each tensor's type (synth_mix.c); *why_out (NULL: not
 * wanted) gets, per tensor, what chose its type. */
static tm_status synth_tensors_build(const tm_synth_config *c, const float *bias,
                                     const tm_synth_locality *loc, synth_tensor *t, uint32_t *n_out,
                                     const char **why_out, synth_types **types_out) {
    synth_types *types;
    tm_status st = synth_types_open(c, &types);
    if (st != TM_OK) return st;
    const uint32_t n = synth_tensors_list(c, bias, loc, t);
    for (uint32_t i = 0; i < n; i++) {
        const char *why;
        t[i].type = synth_types_pick(types, t[i].kind, t[i].layer, t[i].name, &why);
        if (why_out) why_out[i] = why;
    }
    *n_out = n;
    if (types_out)
        *types_out = types; /* the reasons live in it */
    else
        synth_types_close(types);
    return TM_OK;
}

/* Every tensor's type is set, can be written, and fits its rows: else an
 * error naming the tensor, its type and the flag or recipe that chose it. */
static tm_status synth_types_check(const tm_synth_config *c) {
    synth_tensor *t = malloc(SYNTH_MAX_TENSORS(c) * sizeof(*t));
    const char **why = malloc(SYNTH_MAX_TENSORS(c) * sizeof(*why));
    float *bias = calloc((size_t)c->n_layer * c->n_expert, sizeof(float));
    synth_types *types = NULL;
    uint32_t n = 0;
    tm_status st = t && why && bias ? synth_tensors_build(c, bias, NULL, t, &n, why, &types)
                                    : tm_error_set(TM_ERR_NOMEM, "mkmodel: out of memory");
    for (uint32_t i = 0; i < n && st == TM_OK; i++) {
        const tm_type_traits *tr = quant_type_traits((uint32_t)t[i].type);
        if (!tr)
            st = tm_error_set(TM_ERR_ARG, "%s: no quant type given (%s, or a --mix recipe)",
                              t[i].name, why[i]);
        else if (!tr->quantize)
            st = tm_error_set(TM_ERR_UNSUPPORTED,
                              "%s: type %s (%s) has no quantizer in this build: mkmodel cannot "
                              "write it yet",
                              t[i].name, tr->name, why[i]);
        else if (t[i].ne[0] % tr->block_size)
            st = tm_error_set(TM_ERR_ARG,
                              "%s: rows of %lld values do not fit type %s (%s; block size %lld); "
                              "choose dimensions that are multiples of %lld or another type",
                              t[i].name, (long long)t[i].ne[0], tr->name, why[i],
                              (long long)tr->block_size, (long long)tr->block_size);
    }
    synth_types_close(types);
    free(t), free(why), free(bias);
    return st;
}

uint64_t synth_config_tensor_bytes(const tm_synth_config *c) {
    synth_tensor *t = malloc(SYNTH_MAX_TENSORS(c) * sizeof(*t));
    float *bias = calloc((size_t)c->n_layer * c->n_expert, sizeof(float));
    uint64_t total = 0;
    uint32_t nt = 0;
    if (t && bias && synth_tensors_build(c, bias, NULL, t, &nt, NULL, NULL) == TM_OK)
        for (uint32_t i = 0; i < nt; i++)
            if (quant_type_is_known((uint32_t)t[i].type))
                total += quant_row_size(t[i].type, t[i].ne[0]) * (uint64_t)synth_tensor_rows(&t[i]);
    free(t), free(bias);
    return total;
}

/* ---- generation ---- */

/* Approximately normal from one 64-bit draw: the sum of four 16-bit uniforms
 * (Irwin-Hall), scaled to unit variance. Bounded at ±3.46 sigma, which random
 * weights do not mind, and several times faster than Box-Muller. */
static inline float synth_normal_fast(tm_rng *r) {
    uint64_t u = tm_rng_u64(r);
    float s = (float)(u & 0xffff) + (float)((u >> 16) & 0xffff) + (float)((u >> 32) & 0xffff) +
              (float)(u >> 48);
    return (s * (1.0f / 65536.0f) - 2.0f) * 1.7320508f;
}

static inline bool synth_in_topic(const tm_synth_locality *L, int64_t i) {
    return i >= L->t0 && i < (int64_t)(L->t0 + L->t_len);
}

/* Locality's changes to a generated row x (synth.h): embeddings and every
 * writer but the recency head leave the topic subspace T empty; the head
 * (layer L->layer, the first KV group: query heads [0, n_q_heads), KV head 0)
 * has the same q and k for every token, values from the token dims, and
 * writes only T; every router reads T. */
static void synth_row_locality(const synth_tensor *t, int64_t row, float *x) {
    const tm_synth_locality *L = t->loc;
    const int64_t n = t->ne[0], hd = L->t_len; /* T is one head wide */
    const bool head_layer = t->layer == L->layer;
    switch (t->role) {
    case ROLE_EMBD:
        memset(x + L->t0, 0, L->t_len * sizeof(float));
        break;
    case ROLE_Q: /* rows: query heads x head_dim; the head reads the bias channel alone */
    case ROLE_K: /* rows: KV heads x head_dim */
        if (head_layer && row < (t->role == ROLE_Q ? (int64_t)L->n_q_heads : 1) * hd) {
            memset(x, 0, (size_t)n * sizeof(float));
            x[SYNTH_BIAS_CHANNEL] = L->qk[row % hd];
        }
        break;
    case ROLE_V:
        if (head_layer && row < hd)
            for (int64_t i = 0; i < n; i++)
                x[i] = i == SYNTH_BIAS_CHANNEL || synth_in_topic(L, i) ? 0
                                                                       : x[i] * (L->v_std / t->std);
        break;
    case ROLE_O: /* rows: residual dims; columns: query heads x head_dim */
        if (synth_in_topic(L, row)) {
            memset(x, 0, (size_t)n * sizeof(float));
            if (head_layer) x[row - L->t0] = L->out_gain;
        } else if (head_layer) {
            memset(x, 0, (size_t)L->n_q_heads * hd * sizeof(float));
        }
        break;
    case ROLE_QK_NORM:
        if (head_layer)
            for (int64_t i = 0; i < n; i++) x[i] = L->qk_gain;
        break;
    case ROLE_QG: /* rows: query heads x (head_dim of q, head_dim of the gate) */
        if (head_layer && row < (int64_t)L->n_q_heads * 2 * hd) {
            memset(x, 0, (size_t)n * sizeof(float));
            /* the gate reads the bias channel alone too: held open, sigmoid ~ 1 */
            x[SYNTH_BIAS_CHANNEL] = row % (2 * hd) < hd ? L->qk[row % hd] : SYNTH_LOC_GATE_W;
        }
        break;
    case ROLE_ROUTER: {
        /* layers before the head's (hybrid models) read an empty T: their token
         * dims keep the whole variance */
        const float tok_std = t->layer < L->layer ? L->router_full_std : L->router_tok_std;
        for (int64_t i = 0; i < n; i++)
            if (i != SYNTH_BIAS_CHANNEL)
                x[i] *= (synth_in_topic(L, i) ? L->router_topic_std : tok_std) / t->std;
        break;
    }
    case ROLE_DOWN: /* rows: experts x residual dims */
        if (synth_in_topic(L, row % t->ne[1])) memset(x, 0, (size_t)n * sizeof(float));
        break;
    case ROLE_OTHER:
        break;
    }
}

/* Whether the locality layout sets row `row` of t (synth_row_locality changes
 * it): such rows are made in full under --fill repeat. Follows that switch. */
static bool synth_row_locality_touches(const synth_tensor *t, int64_t row) {
    const tm_synth_locality *L = t->loc;
    if (!L) return false;
    const bool head_layer = t->layer == L->layer;
    switch (t->role) {
    case ROLE_Q:
    case ROLE_K:
        return head_layer && row < (t->role == ROLE_Q ? (int64_t)L->n_q_heads : 1) * L->t_len;
    case ROLE_QG:
        return head_layer && row < (int64_t)L->n_q_heads * 2 * L->t_len;
    case ROLE_V:
        return head_layer && row < L->t_len;
    case ROLE_O:
        return head_layer || synth_in_topic(L, row);
    case ROLE_DOWN:
        return synth_in_topic(L, row % t->ne[1]);
    case ROLE_OTHER:
        return false;
    default: /* embeddings, QK norms, routers: never pooled */
        return true;
    }
}

/* The row's values before locality's changes. */
static void synth_row_values(const synth_tensor *t, uint64_t seed, uint32_t tensor_index,
                             int64_t row, float *tmp) {
    tm_rng rng;
    uint64_t h = seed ^ ((uint64_t)tensor_index << 48);
    tm_rng_seed(&rng, tm_splitmix64(&h) ^ (uint64_t)row * 0xd1b54a32d192ed03ull);
    const int64_t n = t->ne[0];
    switch (t->init) {
    case INIT_ONES:
        for (int64_t i = 0; i < n; i++) tmp[i] = 1.0f;
        break;
    case INIT_NORMAL:
        for (int64_t i = 0; i < n; i++) tmp[i] = t->std * synth_normal_fast(&rng);
        break;
    case INIT_EMBD: /* the channel scaled as the rest (gemma4's embeddings are 1/sqrt(n_embd)) */
        for (int64_t i = 0; i < n; i++) tmp[i] = t->std * synth_normal_fast(&rng);
        tmp[SYNTH_BIAS_CHANNEL] = SYNTH_BIAS_BETA * (t->std / SYNTH_EMBD_STD);
        break;
    case INIT_CONST:
        for (int64_t i = 0; i < n; i++) tmp[i] = t->std;
        break;
    case INIT_ROPE_FREQS:
        for (int64_t i = 0; i < n; i++) tmp[i] = i < (int64_t)t->std ? 1.0f : 1e30f;
        break;
    case INIT_ROUTER:
        for (int64_t i = 0; i < n; i++) tmp[i] = t->std * synth_normal_fast(&rng);
        /* rmsnorm(x)[channel] ≈ beta (the embedding's rms is ≈ 1), so this adds bias[row]. */
        tmp[SYNTH_BIAS_CHANNEL] = t->bias[row] / SYNTH_BIAS_BETA;
        break;
    case INIT_SSM_A: /* per head: decay rates log-uniform over [lo, hi] (synth_consts.h) */
        for (int64_t i = 0; i < n; i++)
            tmp[i] = -expf(logf(SYNTH_SSM_A_LO) +
                           tm_rng_f32(&rng) * (logf(SYNTH_SSM_A_HI) - logf(SYNTH_SSM_A_LO)));
        break;
    }
}

static void synth_row_generate(const synth_tensor *t, uint64_t seed, uint32_t tensor_index,
                               int64_t row, float *tmp) {
    synth_row_values(t, seed, tensor_index, row, tmp);
    if (t->loc) synth_row_locality(t, row, tmp);
}

/* --fill repeat: whether t's rows come from a pool of n distinct rows. The
 * matrices only: token embeddings carry each token's identity (routing follows
 * it), norms and routers are small and f32. */
static bool synth_tensor_pooled(const synth_tensor *t, uint32_t n) {
    switch (t->kind) {
    case TM_SYNTH_OUTPUT:
    case TM_SYNTH_ATTN_Q:
    case TM_SYNTH_ATTN_K:
    case TM_SYNTH_ATTN_V:
    case TM_SYNTH_ATTN_O:
    case TM_SYNTH_ATTN_QKV:
    case TM_SYNTH_ATTN_LIN:
    case TM_SYNTH_GATE_EXPS:
    case TM_SYNTH_UP_EXPS:
    case TM_SYNTH_DOWN_EXPS:
    case TM_SYNTH_GATE_SHEXP:
    case TM_SYNTH_UP_SHEXP:
    case TM_SYNTH_DOWN_SHEXP:
        return n && t->init == INIT_NORMAL && synth_tensor_rows(t) > (int64_t)n;
    default:
        return false;
    }
}

/* The pool row that row `row` repeats: itself for the first n (they are the
 * normal file's), then a pseudo-random one, so that no two experts hold the
 * same rows in the same order. */
static int64_t synth_pool_slot(uint64_t seed, uint32_t tensor_index, int64_t row, uint32_t n) {
    if (row < (int64_t)n) return row;
    uint64_t h = seed ^ ((uint64_t)tensor_index << 40) ^ (uint64_t)row * 0xd1b54a32d192ed03ull;
    return (int64_t)(tm_splitmix64(&h) % n);
}

typedef struct synth_slab_job {
    const synth_tensor *t;
    uint32_t tensor_index;
    uint64_t seed;
    int64_t row0;
    size_t row_bytes;
    uint8_t *out;
    float **tmp;         /* one row buffer per thread */
    const uint8_t *pool; /* --fill repeat: n_pool quantized rows (NULL: every row made) */
    uint32_t n_pool;
} synth_slab_job;

static void synth_slab_rows(void *ctx, int64_t begin, int64_t end, int ith) {
    synth_slab_job *job = ctx;
    for (int64_t r = begin; r < end; r++) {
        const int64_t row = job->row0 + r;
        uint8_t *dst = job->out + (size_t)r * job->row_bytes;
        if (job->pool && !synth_row_locality_touches(job->t, row)) {
            const int64_t slot = synth_pool_slot(job->seed, job->tensor_index, row, job->n_pool);
            memcpy(dst, job->pool + (size_t)slot * job->row_bytes, job->row_bytes);
            continue;
        }
        synth_row_generate(job->t, job->seed, job->tensor_index, row, job->tmp[ith]);
        quant_row_quantize(job->t->type, job->tmp[ith], dst, job->t->ne[0]);
    }
}

/* --fill repeat: the pool's rows, quantized from the values of the tensor's
 * first rows (before locality, which sets its rows in full). */
static void synth_pool_rows(void *ctx, int64_t begin, int64_t end, int ith) {
    synth_slab_job *job = ctx;
    for (int64_t r = begin; r < end; r++) {
        synth_row_values(job->t, job->seed, job->tensor_index, r, job->tmp[ith]);
        quant_row_quantize(job->t->type, job->tmp[ith], job->out + (size_t)r * job->row_bytes,
                           job->t->ne[0]);
    }
}

/* The writer thread drains one slab while the pool generates the next. */
typedef struct synth_write_job {
    tm_gguf_writer *w;
    const void *data;
    size_t size;
    tm_status st;
} synth_write_job;

static void *synth_write_thread(void *arg) {
    synth_write_job *j = arg;
    j->st = gguf_writer_write_data(j->w, j->data, j->size);
    return NULL;
}

/* general.* and the architecture's keys of qwen3moe and gpt-oss. */
static tm_status synth_arch_keys_write(const tm_synth_config *c, tm_gguf_writer *w) {
    const uint32_t ftype = synth_mix_ftype(c);
    tm_status st;
    const char *arch = synth_gptoss(c) ? "gpt-oss" : "qwen3moe";
    char key[96];
    SYNTH_KV(gguf_writer_set_str(w, "general.architecture", arch));
    SYNTH_KV(gguf_writer_set_str(w, "general.type", "model"));
    SYNTH_KV(gguf_writer_set_str(w, "general.name", c->name ? c->name : "tiermoe synthetic"));
    SYNTH_KV(gguf_writer_set_u32(w, "general.file_type", ftype));
    SYNTH_KV(gguf_writer_set_u32(w, "general.quantization_version", 2));
    SYNTH_ARCH(gguf_writer_set_u32, "block_count", c->n_layer);
    SYNTH_ARCH(gguf_writer_set_u32, "context_length", c->n_ctx);
    SYNTH_ARCH(gguf_writer_set_u32, "embedding_length", c->n_embd);
    SYNTH_ARCH(gguf_writer_set_u32, "feed_forward_length", c->n_ff);
    SYNTH_ARCH(gguf_writer_set_u32, "attention.head_count", c->n_head);
    SYNTH_ARCH(gguf_writer_set_u32, "attention.head_count_kv", c->n_head_kv);
    SYNTH_ARCH(gguf_writer_set_f32, "rope.freq_base", c->rope_base);
    SYNTH_ARCH(gguf_writer_set_f32, "attention.layer_norm_rms_epsilon", c->rms_eps);
    SYNTH_ARCH(gguf_writer_set_u32, "expert_used_count", c->n_expert_used);
    SYNTH_ARCH(gguf_writer_set_u32, "attention.key_length", c->head_dim);
    SYNTH_ARCH(gguf_writer_set_u32, "attention.value_length", c->head_dim);
    SYNTH_ARCH(gguf_writer_set_u32, "expert_count", c->n_expert);
    if (synth_gptoss(c)) { /* GptOssModel.set_gguf_parameters */
        SYNTH_ARCH(gguf_writer_set_u32, "attention.sliding_window", c->window);
        SYNTH_ARCH(gguf_writer_set_u32, "expert_feed_forward_length", c->n_ff_exp);
        SYNTH_ARCH(gguf_writer_set_str, "rope.scaling.type", "yarn");
        SYNTH_ARCH(gguf_writer_set_f32, "rope.scaling.factor", c->rope_factor);
        SYNTH_ARCH(gguf_writer_set_u32, "rope.scaling.original_context_length", c->rope_orig_ctx);
    } else {
        SYNTH_ARCH(gguf_writer_set_u32, "expert_feed_forward_length", c->n_ff_exp);
    }
    /* a file without a tokenizer ("no_vocab") tells llama.cpp its vocabulary's size here */
    if (!synth_gptoss(c) || !c->vocab_json)
        SYNTH_ARCH(gguf_writer_set_u32, "vocab_size", c->n_vocab);
    return TM_OK;
}

static tm_status synth_metadata_write(const tm_synth_config *c, tm_gguf_writer *w) {
    tm_status st = synth_is_hybrid(c)     ? synth_hybrid_metadata(c, w)
                   : synth_is_moe_arch(c) ? synth_moe_arch_metadata(c, w)
                   : synth_is_gemma4(c)   ? synth_gemma4_metadata(c, w)
                                          : synth_arch_keys_write(c, w);
    if (st != TM_OK) return st;
    /* How the weights were made, so tests can check the routing law. */
    SYNTH_KV(gguf_writer_set_u64(w, "tiermoe.synth.seed", c->seed));
    SYNTH_KV(gguf_writer_set_f32(w, "tiermoe.synth.skew", (float)c->skew));
    /* written only when set, so a file without them has the bytes it always had */
    if (c->skew_offset != 0)
        SYNTH_KV(gguf_writer_set_f32(w, "tiermoe.synth.skew_offset", (float)c->skew_offset));
    if (c->locality != 0) {
        SYNTH_KV(gguf_writer_set_f32(w, "tiermoe.synth.locality", (float)c->locality));
        SYNTH_KV(gguf_writer_set_f32(w, "tiermoe.synth.locality_span", (float)c->locality_span));
    }
    if (c->routing) SYNTH_KV(gguf_writer_set_str(w, "tiermoe.synth.routing", c->routing));
    if (c->fill_rows) /* --fill repeat: the weights repeat (speed benches only) */
        SYNTH_KV(gguf_writer_set_u32(w, "tiermoe.synth.fill_rows", c->fill_rows));
    if (c->vocab_json) {
        /* pad to n_vocab as llama.cpp's converter pads to config.json's vocab_size */
        tm_tokenizer_import_opts o = {.pad_to_n_vocab = c->n_vocab};
        SYNTH_KV(tokenizer_import_hf_ex(c->vocab_json, w, &o, NULL));
    } else {
        SYNTH_KV(gguf_writer_set_str(w, "tokenizer.ggml.model", "no_vocab"));
    }
    return TM_OK;
}

typedef struct synth_progress {
    uint64_t total, done, t0, last;
    int enabled;
} synth_progress;

static void synth_progress_update(synth_progress *p, int final) {
    uint64_t now = tm_time_ns();
    if (!p->enabled || (!final && now - p->last < 500000000ull)) return;
    p->last = now;
    double s = (now - p->t0) * 1e-9, gib = p->done / 1073741824.0;
    fprintf(stderr, "\rmkmodel: %.2f / %.2f GiB (%3.0f%%) %6.1f s %7.1f MB/s%s", gib,
            p->total / 1073741824.0, 100.0 * p->done / (p->total ? p->total : 1), s,
            s > 0 ? p->done / s / 1e6 : 0.0, final ? "\n" : "");
    fflush(stderr);
}

tm_status synth_config_apply_vocab(tm_synth_config *c) {
    if (!c->vocab_json) return TM_OK;
    /* count the vocabulary by importing it into a writer that is never written */
    tm_gguf_writer *scratch;
    uint32_t n_tokens = 0;
    tm_status st = gguf_writer_init(&scratch, 3, TM_GGUF_DEFAULT_ALIGNMENT);
    if (st != TM_OK) return st;
    st = tokenizer_import_hf_ex(c->vocab_json, scratch, NULL, &n_tokens);
    gguf_writer_free(scratch);
    if (st == TM_OK && n_tokens > c->n_vocab) c->n_vocab = n_tokens;
    return st;
}

tm_status synth_model_write(const tm_synth_config *c, const char *path) {
    tm_status st = synth_config_validate(c);
    if (st != TM_OK) return st;
    synth_tensor *t = malloc(SYNTH_MAX_TENSORS(c) * sizeof(*t));
    float *bias = malloc((size_t)c->n_layer * c->n_expert * sizeof(float));
    tm_pool *pool = NULL;
    tm_gguf_writer *w = NULL;
    uint8_t *slab[2] = {NULL, NULL}, *pool_rows = NULL;
    float **tmp = NULL;
    tm_synth_locality *loc = NULL;
    int n_threads = c->n_threads > 0 ? c->n_threads : cpu_physical_cores();
    if (!t || !bias) {
        st = tm_error_set(TM_ERR_NOMEM, "mkmodel: out of memory");
        goto done;
    }
    if ((st = synth_router_biases(c, bias)) != TM_OK) goto done;
    if (c->locality > 0) {
        if (!(loc = malloc(sizeof(*loc)))) {
            st = tm_error_set(TM_ERR_NOMEM, "mkmodel: out of memory");
            goto done;
        }
        synth_locality_plan(c, loc);
    }
    uint32_t n = 0;
    if ((st = synth_tensors_build(c, bias, loc, t, &n, NULL, NULL)) != TM_OK) goto done;

    if ((st = gguf_writer_init(&w, 3, TM_GGUF_DEFAULT_ALIGNMENT)) != TM_OK) goto done;
    if ((st = synth_metadata_write(c, w)) != TM_OK) goto done;
    synth_progress prog = {.t0 = tm_time_ns(), .enabled = c->progress};
    size_t max_row_bytes = 0;
    int64_t max_ne0 = 0;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t index;
        if ((st = gguf_writer_add_tensor(w, t[i].name, (uint32_t)t[i].type, t[i].n_dims, t[i].ne,
                                         &index)))
            goto done;
        size_t rb = quant_row_size(t[i].type, t[i].ne[0]);
        prog.total += rb * (uint64_t)synth_tensor_rows(&t[i]);
        if (rb > max_row_bytes) max_row_bytes = rb;
        if (t[i].ne[0] > max_ne0) max_ne0 = t[i].ne[0];
    }
    if ((st = gguf_writer_begin(w, path)) != TM_OK) goto done;

    /* Slabs of ~32 MiB, double-buffered: generate one while the other is written. */
    const size_t slab_bytes = (size_t)32 << 20 > max_row_bytes ? (size_t)32 << 20 : max_row_bytes;
    if ((st = cpu_pool_create(n_threads, &pool)) != TM_OK) goto done;
    slab[0] = malloc(slab_bytes), slab[1] = malloc(slab_bytes);
    if (c->fill_rows) pool_rows = malloc((size_t)c->fill_rows * max_row_bytes);
    tmp = calloc((size_t)n_threads, sizeof(float *));
    for (int i = 0; tmp && i < n_threads; i++) tmp[i] = malloc((size_t)max_ne0 * sizeof(float));
    if (!slab[0] || !slab[1] || !tmp || !tmp[n_threads - 1] || (c->fill_rows && !pool_rows)) {
        st = tm_error_set(TM_ERR_NOMEM, "mkmodel: out of memory for %zu-byte slabs", slab_bytes);
        goto done;
    }
    synth_write_job wj = {.w = w, .st = TM_OK};
    pthread_t writer;
    int writing = 0, cur = 0;
    for (uint32_t i = 0; i < n && st == TM_OK; i++) {
        const size_t rb = quant_row_size(t[i].type, t[i].ne[0]);
        const int64_t rows = synth_tensor_rows(&t[i]), per_slab = (int64_t)(slab_bytes / rb);
        const bool pooled = synth_tensor_pooled(&t[i], c->fill_rows);
        if (pooled) {
            synth_slab_job pj = {&t[i], i, c->seed, 0, rb, pool_rows, tmp, NULL, 0};
            cpu_pool_for(pool, c->fill_rows, 4, synth_pool_rows, &pj);
        }
        for (int64_t r0 = 0; r0 < rows && st == TM_OK; r0 += per_slab) {
            int64_t nr = rows - r0 < per_slab ? rows - r0 : per_slab;
            synth_slab_job job = {
                &t[i], i, c->seed, r0, rb, slab[cur], tmp, pooled ? pool_rows : NULL, c->fill_rows};
            cpu_pool_for(pool, nr, pooled ? 256 : 16, synth_slab_rows, &job);
            if (writing) {
                pthread_join(writer, NULL);
                writing = 0;
                if ((st = wj.st) != TM_OK) break;
            }
            wj.data = slab[cur], wj.size = (size_t)nr * rb;
            if (pthread_create(&writer, NULL, synth_write_thread, &wj)) {
                st = tm_error_set(TM_ERR_IO, "mkmodel: cannot start the writer thread");
                break;
            }
            writing = 1, cur ^= 1;
            prog.done += (uint64_t)nr * rb;
            synth_progress_update(&prog, 0);
        }
    }
    if (writing) {
        pthread_join(writer, NULL);
        if (st == TM_OK) st = wj.st;
    }
    if (st == TM_OK) st = gguf_writer_finish(w);
    synth_progress_update(&prog, 1);

done:
    if (tmp)
        for (int i = 0; i < n_threads; i++) free(tmp[i]);
    free(tmp), free(slab[0]), free(slab[1]), free(pool_rows);
    if (pool) cpu_pool_free(pool);
    if (w) gguf_writer_free(w);
    free(t), free(bias), free(loc);
    return st;
}
