/* The hyper-parameters of a model: every numeric key the architectures read,
 * its range, and how keys relate, in two tables, so that a file with a NaN
 * RoPE base or more experts used than it has is refused at load with a
 * message naming the key, the value and what was expected, instead of
 * loading and computing NaN logits. */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "model/model.h"

typedef enum hparam_kind { HP_U32, HP_F32 } hparam_kind;

/* One key "<arch>.<key>" and the values it may take: lo <= v <= hi (lo < v
 * when lo_open); floats must also be finite. An optional key that is absent
 * takes dflt, or a value derived from others (hparams_derive). */
typedef struct hparam {
    const char *arch; /* NULL: every architecture */
    const char *key;
    hparam_kind kind;
    size_t field; /* offsetof(tm_model_config, ...) */
    bool optional;
    double dflt;
    double lo, hi;
    bool lo_open;
    bool even;           /* RoPE rotates pairs */
    const char *what;    /* what the value means, for the message */
    const char *derived; /* optional and absent: where the value came from (NULL: dflt) */
} hparam;

#define HP_MAX_DIM ((double)(1 << 20)) /* embedding, heads, ff: far above any model */
/* the architectures with one head width for q, k and v (deepseek2's MLA has keys of its own) */
#define HP_MHA "qwen3moe gpt-oss qwen3next qwen35moe llama olmoe glm4moe gemma4"
/* one KV head count in every layer (gemma4's is an array: gemma4.c) */
#define HP_KV1 "qwen3moe gpt-oss qwen3next qwen35moe llama olmoe glm4moe deepseek2"
#define HP_DS  "deepseek2"
#define HP(arch_, key_, kind_, field_)                                                             \
    .arch = arch_, .key = key_, .kind = HP_##kind_, .field = offsetof(tm_model_config, field_)

static const hparam hparams[] = {
    {HP(NULL, "block_count", U32, n_layer), .lo = 1, .hi = 65536, .what = "layers"},
    {HP(NULL, "embedding_length", U32, n_embd), .lo = 1, .hi = HP_MAX_DIM,
     .what = "the residual stream's width"},
    {HP(NULL, "attention.head_count", U32, n_head), .lo = 1, .hi = 65536, .what = "query heads"},
    {HP(HP_KV1, "attention.head_count_kv", U32, n_head_kv), .lo = 1, .hi = 65536,
     .what = "key/value heads"},
    {HP(NULL, "context_length", U32, n_ctx_train), .lo = 1, .hi = INT32_MAX,
     .what = "the trained context"},
    {HP(NULL, "expert_count", U32, n_expert), .lo = 1, .hi = TM_MODEL_MAX_EXPERTS,
     .what = "experts per layer"},
    {HP(NULL, "expert_used_count", U32, n_expert_used), .lo = 1, .hi = TM_MODEL_MAX_EXPERTS_USED,
     .what = "experts a token uses"},
    {HP("qwen3moe gpt-oss qwen3next qwen35moe glm4moe gemma4 " HP_DS, "expert_feed_forward_length",
        U32, n_ff_exp),
     .lo = 1, .hi = HP_MAX_DIM, .what = "an expert's hidden width"},
    /* Mixtral (arch llama) and OLMoE: the experts' width is the FFN width */
    {HP("llama olmoe", "feed_forward_length", U32, n_ff_exp), .lo = 1, .hi = HP_MAX_DIM,
     .what = "an expert's hidden width"},
    {HP(NULL, "attention.layer_norm_rms_epsilon", F32, rms_eps), .lo = 0, .lo_open = true,
     .hi = 0.01, .what = "RMSNorm's epsilon"},
    {HP(NULL, "rope.freq_base", F32, rope_base), .lo = 1, .lo_open = true, .hi = INFINITY,
     .what = "RoPE's base"},
    /* absent: derived as llama.cpp does */
    {HP(HP_MHA, "attention.key_length", U32, head_dim), .optional = true, .lo = 2,
     .hi = TM_MODEL_MAX_HEAD_DIM, .even = true, .what = "a head's width",
     .derived = "embedding_length / head_count"},
    {HP(HP_MHA, "attention.value_length", U32, v_head_dim), .optional = true, .lo = 2,
     .hi = TM_MODEL_MAX_HEAD_DIM, .even = true, .what = "a value head's width",
     .derived = "key_length"},
    {HP(NULL, "rope.dimension_count", U32, n_rot), .optional = true, .lo = 2,
     .hi = TM_MODEL_MAX_HEAD_DIM, .even = true, .what = "the rotated dimensions of a head",
     .derived = "key_length"},
    {HP("gpt-oss", "attention.sliding_window", U32, window), .lo = 1, .hi = INT32_MAX,
     .what = "the window of the even layers"},
    {HP("gpt-oss", "attention.sliding_window_pattern", U32, window_pattern), .optional = true,
     .dflt = 2, .lo = 2, .hi = 2, .what = "gpt-oss alternates sliding and full layers"},
    {HP("gpt-oss", "rope.scaling.factor", F32, rope_factor), .lo = 1, .hi = INFINITY,
     .what = "YaRN's factor"},
    {HP("gpt-oss", "rope.scaling.original_context_length", U32, rope_orig_ctx), .lo = 1,
     .hi = INT32_MAX, .what = "YaRN's original context"},
    {HP("gpt-oss", "rope.scaling.yarn_beta_fast", F32, yarn_beta_fast), .optional = true,
     .dflt = 32, .lo = 0, .lo_open = true, .hi = INFINITY, .what = "YaRN's beta_fast"},
    {HP("gpt-oss", "rope.scaling.yarn_beta_slow", F32, yarn_beta_slow), .optional = true, .dflt = 1,
     .lo = 0, .lo_open = true, .hi = INFINITY, .what = "YaRN's beta_slow"},
#define HP_QNEXT "qwen3next qwen35moe"
    {HP(HP_QNEXT, "ssm.conv_kernel", U32, ssm_conv), .lo = 2, .hi = 16,
     .what = "linear attention's convolution width"},
    {HP(HP_QNEXT, "ssm.state_size", U32, ssm_state), .lo = 1, .hi = TM_MODEL_MAX_HEAD_DIM,
     .what = "a linear-attention key head's width"},
    {HP(HP_QNEXT, "ssm.group_count", U32, ssm_group), .lo = 1, .hi = 65536,
     .what = "linear attention's key heads"},
    {HP(HP_QNEXT, "ssm.time_step_rank", U32, ssm_dt_rank), .lo = 1, .hi = 65536,
     .what = "linear attention's value heads"},
    {HP(HP_QNEXT, "ssm.inner_size", U32, ssm_inner), .lo = 1, .hi = HP_MAX_DIM,
     .what = "linear attention's value heads times their width"},
    {HP(HP_QNEXT, "full_attention_interval", U32, full_attn_interval), .optional = true, .dflt = 4,
     .lo = 1, .hi = 65536, .what = "every n-th layer is full attention"},
    {HP(HP_QNEXT, "expert_shared_feed_forward_length", U32, n_ff_shexp), .lo = 1, .hi = HP_MAX_DIM,
     .what = "the shared expert's hidden width"},
    {HP("glm4moe gemma4 " HP_DS, "feed_forward_length", U32, n_ff), .lo = 1, .hi = HP_MAX_DIM,
     .what = "a dense FFN's width"},
    {HP("glm4moe " HP_DS, "leading_dense_block_count", U32, n_dense), .optional = true, .dflt = 0,
     .lo = 0, .hi = 65536, .what = "leading dense layers"},
    {HP("glm4moe " HP_DS, "expert_shared_count", U32, n_shexp), .optional = true, .dflt = 0,
     .lo = 0, .hi = 64, .what = "shared experts"},
    {HP("glm4moe " HP_DS, "expert_group_count", U32, n_group), .optional = true, .dflt = 1, .lo = 1,
     .hi = 32, .what = "the router's expert groups"},
    {HP("glm4moe " HP_DS, "expert_group_used_count", U32, n_group_used), .optional = true,
     .dflt = 1, .lo = 1, .hi = 32, .what = "expert groups a token uses"},
    /* llama.cpp: 1 softmax, 2 sigmoid; absent: sigmoid, as llama.cpp takes GLM-4.5's */
    {HP("glm4moe", "expert_gating_func", U32, gating_func), .optional = true, .dflt = 2, .lo = 1,
     .hi = 2, .what = "the router's scores: 1 softmax, 2 sigmoid"},
    {HP("glm4moe " HP_DS, "expert_weights_scale", F32, expert_scale), .optional = true, .dflt = 1,
     .lo = 0, .lo_open = true, .hi = 1e6, .what = "the routed experts' scaling factor"},
    {HP("glm4moe " HP_DS, "nextn_predict_layers", U32, n_nextn), .optional = true, .dflt = 0,
     .lo = 0, .hi = 16, .what = "NextN (MTP) layers at the end of block_count"},
    /* llama.cpp takes deepseek2 without the key as softmax (DeepSeek-V2) */
    {HP(HP_DS, "expert_gating_func", U32, gating_func), .optional = true, .dflt = 1, .lo = 1,
     .hi = 2, .what = "the router's scores: 1 softmax, 2 sigmoid"},
    /* MLA: the cache's key is kv_lora_rank + rope.dimension_count values (key_length), its
     * value kv_lora_rank (value_length); the heads' widths are the _mla keys (older files
     * without them: key_length and value_length are the heads', deepseek2.c) */
    {HP(HP_DS, "attention.key_length", U32, head_dim), .lo = 2, .hi = 4096,
     .what = "the latent key's width (kv_lora_rank + rope.dimension_count)"},
    {HP(HP_DS, "attention.value_length", U32, v_head_dim), .lo = 1, .hi = 4096,
     .what = "the latent value's width (kv_lora_rank)"},
    {HP(HP_DS, "attention.key_length_mla", U32, head_dim_mla), .optional = true, .lo = 2,
     .hi = 4096, .what = "a query/key head's width (nope + RoPE)",
     .derived = "attention.key_length"},
    {HP(HP_DS, "attention.value_length_mla", U32, v_head_dim_mla), .optional = true, .lo = 1,
     .hi = 4096, .what = "a value head's width", .derived = "attention.value_length"},
    {HP(HP_DS, "attention.q_lora_rank", U32, n_lora_q), .optional = true, .dflt = 0, .lo = 0,
     .hi = HP_MAX_DIM, .what = "q's low rank (absent or 0: a plain attn_q)"},
    {HP(HP_DS, "attention.kv_lora_rank", U32, n_lora_kv), .lo = 1, .hi = 4096,
     .what = "the KV latent's width"},
    {HP(HP_DS, "rope.scaling.factor", F32, rope_factor), .optional = true, .dflt = 1, .lo = 1,
     .hi = INFINITY, .what = "YaRN's factor"},
    {HP(HP_DS, "rope.scaling.original_context_length", U32, rope_orig_ctx), .optional = true,
     .dflt = 4096, .lo = 1, .hi = INT32_MAX, .what = "YaRN's original context"},
    {HP(HP_DS, "rope.scaling.yarn_beta_fast", F32, yarn_beta_fast), .optional = true, .dflt = 32,
     .lo = 0, .lo_open = true, .hi = INFINITY, .what = "YaRN's beta_fast"},
    {HP(HP_DS, "rope.scaling.yarn_beta_slow", F32, yarn_beta_slow), .optional = true, .dflt = 1,
     .lo = 0, .lo_open = true, .hi = INFINITY, .what = "YaRN's beta_slow"},
    {HP(HP_DS, "rope.scaling.yarn_log_multiplier", F32, yarn_log_mul), .optional = true, .dflt = 0,
     .lo = 0, .hi = 100, .what = "YaRN's softmax mscale: 1 + it ln(factor)"},
    /* gemma4: sliding layers with heads and a RoPE of their own; the global layers' are
     * key_length, rope.dimension_count (the whole head: rope_freqs leaves most of it
     * unturned, gemma4.c) and rope.freq_base */
    {HP("gemma4", "attention.sliding_window", U32, window), .lo = 1, .hi = INT32_MAX,
     .what = "the sliding layers' window"},
    {HP("gemma4", "attention.key_length_swa", U32, head_dim_swa), .lo = 2,
     .hi = TM_MODEL_MAX_HEAD_DIM, .even = true, .what = "a sliding layer's head width"},
    {HP("gemma4", "attention.value_length_swa", U32, v_head_dim_swa), .lo = 2,
     .hi = TM_MODEL_MAX_HEAD_DIM, .even = true, .what = "a sliding layer's value head width"},
    {HP("gemma4", "rope.dimension_count_swa", U32, n_rot_swa), .lo = 2, .hi = TM_MODEL_MAX_HEAD_DIM,
     .even = true, .what = "a sliding layer's rotated dimensions"},
    {HP("gemma4", "rope.freq_base_swa", F32, rope_base_swa), .lo = 1, .lo_open = true,
     .hi = INFINITY, .what = "the sliding layers' RoPE base"},
    {HP("gemma4", "final_logit_softcapping", F32, logit_softcap), .optional = true, .dflt = 0,
     .lo = 0, .hi = 1e6, .what = "the final logit soft-cap (0: none)"},
    {HP("gemma4", "embedding_length_per_layer_input", U32, n_embd_per_layer), .optional = true,
     .dflt = 0, .lo = 0, .hi = 0,
     .what = "per-layer input embeddings (Gemma 4's E2B / E4B): not supported"},
    {HP("gemma4", "attention.shared_kv_layers", U32, n_kv_shared), .optional = true, .dflt = 0,
     .lo = 0, .hi = 0,
     .what = "layers sharing an earlier layer's KV (Gemma 4's E2B / E4B): not "
             "supported"},
};

#define HP_N (sizeof(hparams) / sizeof(hparams[0]))

/* a OP b between two keys of the table (both read for the architecture). */
typedef enum hparam_op { HP_LE, HP_LT, HP_EQ, HP_MULTIPLE_OF } hparam_op;

typedef struct hparam_rel {
    const char *arch; /* as hparam's */
    const char *a;
    hparam_op op;
    const char *b;
} hparam_rel;

static const hparam_rel relations[] = {
    {NULL, "expert_used_count", HP_LE, "expert_count"},
    {NULL, "attention.head_count", HP_MULTIPLE_OF, "attention.head_count_kv"},
    {HP_MHA, "attention.value_length", HP_EQ, "attention.key_length"}, /* one width: the kernels */
    {"qwen3moe gpt-oss llama olmoe gemma4", "rope.dimension_count", HP_EQ,
     "attention.key_length"}, /* whole heads */
    {"gemma4", "attention.value_length_swa", HP_EQ, "attention.key_length_swa"},
    {"gemma4", "rope.dimension_count_swa", HP_EQ, "attention.key_length_swa"},
    {HP_QNEXT " glm4moe", "rope.dimension_count", HP_LE,
     "attention.key_length"}, /* a head's first part */
    {"glm4moe " HP_DS, "expert_count", HP_MULTIPLE_OF, "expert_group_count"},
    {"glm4moe " HP_DS, "expert_group_used_count", HP_LE, "expert_group_count"},
    {"glm4moe " HP_DS, "nextn_predict_layers", HP_LT, "block_count"},
    {"glm4moe " HP_DS, "leading_dense_block_count", HP_LT, "block_count"},
    {HP_DS, "rope.dimension_count", HP_LT, "attention.key_length_mla"}, /* nope + RoPE */
    {HP_DS, "attention.value_length", HP_EQ, "attention.kv_lora_rank"}, /* the latent */
    {"gpt-oss", "rope.scaling.yarn_beta_slow", HP_LT, "rope.scaling.yarn_beta_fast"},
    /* Kimi K2: both 1 (HF widens an empty ramp by 0.001, model_rope_yarn too) */
    {HP_DS, "rope.scaling.yarn_beta_slow", HP_LE, "rope.scaling.yarn_beta_fast"},
    {HP_QNEXT, "ssm.time_step_rank", HP_MULTIPLE_OF, "ssm.group_count"},
    {HP_QNEXT, "ssm.inner_size", HP_MULTIPLE_OF, "ssm.time_step_rank"},
};

/* Whether name is one of the space-separated words of list (NULL: every name). */
static bool hparam_arch_in(const char *list, const char *name) {
    if (!list) return true;
    const size_t n = strlen(name);
    for (const char *p = list; *p;) {
        const size_t w = strcspn(p, " ");
        if (w == n && !strncmp(p, name, n)) return true;
        p += w;
        p += *p == ' ';
    }
    return false;
}

static bool hparam_applies(const hparam *h, const tm_model *m) {
    return hparam_arch_in(h->arch, m->arch->name);
}

static double hparam_value(const hparam *h, const tm_model_config *c) {
    const char *p = (const char *)c + h->field;
    return h->kind == HP_U32 ? (double)*(const uint32_t *)p : (double)*(const float *)p;
}

static void hparam_store(const hparam *h, tm_model_config *c, double v) {
    char *p = (char *)c + h->field;
    if (h->kind == HP_U32)
        *(uint32_t *)p = (uint32_t)v;
    else
        *(float *)p = (float)v;
}

static const hparam *hparam_find(const tm_model *m, const char *key) {
    for (size_t i = 0; i < HP_N; i++)
        if (hparam_applies(&hparams[i], m) && !strcmp(hparams[i].key, key)) return &hparams[i];
    return NULL;
}

static void hparam_format(const hparam *h, double v, char *buf, size_t n) {
    if (h->kind == HP_U32)
        snprintf(buf, n, "%u", (uint32_t)v);
    else
        snprintf(buf, n, "%g", v);
}

/* "<arch>.<key>" */
static void hparam_name(const tm_model *m, const char *key, char *buf, size_t n) {
    snprintf(buf, n, "%s.%s", m->arch->name, key);
}

/* Read every key of the architecture into m->cfg; absent optional keys take
 * their defaults. *present: bit i set when hparams[i] was in the file. */
static tm_status hparams_read(tm_model *m, uint64_t *present) {
    _Static_assert(HP_N <= 64, "the presence mask holds 64 keys");
    *present = 0;
    for (size_t i = 0; i < HP_N; i++) {
        const hparam *h = &hparams[i];
        if (!hparam_applies(h, m)) continue;
        char key[128];
        hparam_name(m, h->key, key, sizeof(key));
        if (h->optional && !gguf_file_find_kv(m->file, key)) {
            hparam_store(h, &m->cfg, h->dflt);
            continue;
        }
        char *p = (char *)&m->cfg + h->field;
        tm_status st = h->kind == HP_U32 ? gguf_file_get_u32(m->file, key, (uint32_t *)p)
                                         : gguf_file_get_f32(m->file, key, (float *)p);
        if (st) return st; /* the reader's message names the file and the key */
        *present |= (uint64_t)1 << i;
    }
    return TM_OK;
}

static bool hparam_present(const tm_model *m, uint64_t present, const char *key) {
    return present >> (hparam_find(m, key) - hparams) & 1;
}

/* Absent widths follow from the others. */
static void hparams_derive(tm_model *m, uint64_t present) {
    tm_model_config *c = &m->cfg;
    if (!hparam_present(m, present, "attention.key_length"))
        c->head_dim = c->n_head ? c->n_embd / c->n_head : 0;
    if (!hparam_present(m, present, "attention.value_length")) c->v_head_dim = c->head_dim;
    if (!hparam_present(m, present, "rope.dimension_count")) c->n_rot = c->head_dim;
    const hparam *mla = hparam_find(m, "attention.key_length_mla");
    if (mla && !(present >> (mla - hparams) & 1)) c->head_dim_mla = c->head_dim;
    if (mla && !hparam_present(m, present, "attention.value_length_mla"))
        c->v_head_dim_mla = c->v_head_dim;
}

static tm_status hparams_check_ranges(const tm_model *m, uint64_t present) {
    for (size_t i = 0; i < HP_N; i++) {
        const hparam *h = &hparams[i];
        if (!hparam_applies(h, m)) continue;
        const double v = hparam_value(h, &m->cfg);
        if (isfinite(v) && (h->lo_open ? v > h->lo : v >= h->lo) && v <= h->hi &&
            (!h->even || fmod(v, 2) == 0))
            continue;
        char key[128], val[32], want[96], absent[96] = "";
        hparam_name(m, h->key, key, sizeof(key));
        hparam_format(h, v, val, sizeof(val));
        if (h->kind == HP_U32 && h->lo == h->hi)
            snprintf(want, sizeof(want), "%.0f", h->lo);
        else if (h->kind == HP_U32)
            snprintf(want, sizeof(want), "%s integer in [%.0f, %.0f]", h->even ? "an even" : "an",
                     h->lo, h->hi);
        else if (isinf(h->hi))
            snprintf(want, sizeof(want), "a finite number %s %g", h->lo_open ? ">" : ">=", h->lo);
        else
            snprintf(want, sizeof(want), "a finite number in %c%g, %g]", h->lo_open ? '(' : '[',
                     h->lo, h->hi);
        if (!(present >> i & 1))
            snprintf(absent, sizeof(absent), " (absent: %s)", h->derived ? h->derived : "default");
        return tm_error_set(TM_ERR_FORMAT, "%s: key %s is %s%s, expected %s (%s)", m->file->path,
                            key, val, absent, want, h->what);
    }
    return TM_OK;
}

static tm_status hparams_check_relations(const tm_model *m) {
    static const char *const op_words[] = {"at most", "less than", "equal to", "a multiple of"};
    for (size_t i = 0; i < sizeof(relations) / sizeof(relations[0]); i++) {
        const hparam_rel *r = &relations[i];
        if (!hparam_arch_in(r->arch, m->arch->name)) continue;
        const hparam *ha = hparam_find(m, r->a), *hb = hparam_find(m, r->b);
        if (!ha || !hb) continue; /* not this architecture's */
        const double a = hparam_value(ha, &m->cfg), b = hparam_value(hb, &m->cfg);
        const bool ok = r->op == HP_LE   ? a <= b
                        : r->op == HP_LT ? a < b
                        : r->op == HP_EQ ? a == b
                                         : b > 0 && fmod(a, b) == 0;
        if (ok) continue;
        char ka[128], kb[128], va[32], vb[32];
        hparam_name(m, r->a, ka, sizeof(ka));
        hparam_name(m, r->b, kb, sizeof(kb));
        hparam_format(ha, a, va, sizeof(va));
        hparam_format(hb, b, vb, sizeof(vb));
        return tm_error_set(TM_ERR_FORMAT, "%s: key %s is %s, expected %s %s (%s)", m->file->path,
                            ka, va, op_words[r->op], kb, vb);
    }
    return TM_OK;
}

tm_status model_hparams_load(tm_model *m) {
    uint64_t present;
    tm_status st = hparams_read(m, &present);
    if (st) return st;
    hparams_derive(m, present);
    if ((st = hparams_check_ranges(m, present))) return st;
    return hparams_check_relations(m);
}
