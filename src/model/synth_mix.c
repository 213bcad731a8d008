/* Which quant type each tensor of a synthetic model gets: the class flags
 * (--type-experts ...), the per-projection flags (--type-gate-exps ...),
 * llama-quantize-like --tensor-type PATTERN=TYPE rules and the named recipes
 * (--mix). The recipes follow llama.cpp's llama_tensor_get_type for the
 * tensors a qwen3moe / gpt-oss file has, without an importance matrix
 * (docs/quant.md states each one as a table). In the hybrid models (qwen3next,
 * qwen35moe) attn_qkv follows llama.cpp's attn_qkv rule (Q3_K_M: q4_K, Q4_K_M:
 * q5_K), the shared expert's down projection its ffn_down rule (the name
 * matches it), the other linear-attention and shared-expert matrices the
 * recipe's base type; "dynamic" keeps the shared expert at q8_0 with attention. */
#include "model/synth_mix.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* llama.cpp's use_more_bits: the first and last eighth of the layers and every
 * third layer between them get the larger type. */
static bool mix_more_bits(uint32_t l, uint32_t n) {
    return l < n / 8 || l >= 7 * n / 8 || (l - n / 8) % 3 == 2;
}

static tm_type mix_q2_k(const tm_synth_config *c, tm_synth_kind k, uint32_t l) {
    (void)l;
    switch (k) {
    case TM_SYNTH_OUTPUT:
        return TM_TYPE_Q6_K;
    case TM_SYNTH_ATTN_V:
        return c->n_head >= 4 * c->n_head_kv ? TM_TYPE_Q4_K : TM_TYPE_Q3_K;
    case TM_SYNTH_ATTN_O:
    case TM_SYNTH_DOWN_EXPS:
    case TM_SYNTH_DOWN_SHEXP:
        return TM_TYPE_Q3_K;
    default:
        return TM_TYPE_Q2_K;
    }
}

static tm_type mix_q3_k_m(const tm_synth_config *c, tm_synth_kind k, uint32_t l) {
    switch (k) {
    case TM_SYNTH_OUTPUT:
        return TM_TYPE_Q6_K;
    case TM_SYNTH_ATTN_V:
        return l < 2 ? TM_TYPE_Q5_K : TM_TYPE_Q4_K;
    case TM_SYNTH_ATTN_O:
    case TM_SYNTH_ATTN_QKV:
        return TM_TYPE_Q4_K;
    case TM_SYNTH_DOWN_EXPS:
    case TM_SYNTH_DOWN_SHEXP:
        return l < c->n_layer / 16 ? TM_TYPE_Q5_K : TM_TYPE_Q4_K;
    default:
        return TM_TYPE_Q3_K;
    }
}

static tm_type mix_q4_k_m(const tm_synth_config *c, tm_synth_kind k, uint32_t l) {
    switch (k) {
    case TM_SYNTH_OUTPUT:
        return TM_TYPE_Q6_K;
    case TM_SYNTH_ATTN_V:
    case TM_SYNTH_DOWN_EXPS:
    case TM_SYNTH_DOWN_SHEXP:
        return mix_more_bits(l, c->n_layer) ? TM_TYPE_Q6_K : TM_TYPE_Q4_K;
    case TM_SYNTH_ATTN_QKV:
        return TM_TYPE_Q5_K;
    default:
        return TM_TYPE_Q4_K;
    }
}

static tm_type mix_iq4_xs(const tm_synth_config *c, tm_synth_kind k, uint32_t l) {
    switch (k) {
    case TM_SYNTH_OUTPUT:
        return TM_TYPE_Q6_K;
    case TM_SYNTH_ATTN_V:
        return c->n_head >= 4 * c->n_head_kv ? TM_TYPE_Q5_K : TM_TYPE_IQ4_XS;
    case TM_SYNTH_DOWN_EXPS:
    case TM_SYNTH_DOWN_SHEXP:
        return l < c->n_layer / 8 ? TM_TYPE_Q5_K : TM_TYPE_IQ4_XS;
    default:
        return TM_TYPE_IQ4_XS;
    }
}

static tm_type mix_iq2_xxs(const tm_synth_config *c, tm_synth_kind k, uint32_t l) {
    switch (k) {
    case TM_SYNTH_EMBD:
        return TM_TYPE_Q2_K;
    case TM_SYNTH_OUTPUT:
        return TM_TYPE_Q5_K;
    case TM_SYNTH_ATTN_V: /* llama.cpp: 4 or more experts (or GQA >= 4) */
        return TM_TYPE_Q4_K;
    case TM_SYNTH_DOWN_EXPS:
    case TM_SYNTH_DOWN_SHEXP:
        return l < c->n_layer / 8 ? TM_TYPE_Q2_K : TM_TYPE_IQ2_XXS;
    default:
        return TM_TYPE_IQ2_XXS;
    }
}

/* The "dynamic" low-bit MoE mixes published for DeepSeek / Kimi / GLM / Qwen:
 * routed experts at 1.75-2 bits, their down projections (the most sensitive,
 * as every llama.cpp recipe also treats them) one step up, the first MoE
 * layers' experts at 4.5 bits, everything every token reads (attention,
 * embeddings, output) at 6.5-8.5 bits. */
static tm_type mix_dynamic(const tm_synth_config *c, tm_synth_kind k, uint32_t l) {
    const uint32_t first = c->n_layer / 16 ? c->n_layer / 16 : 1;
    switch (k) {
    case TM_SYNTH_EMBD:
    case TM_SYNTH_OUTPUT:
        return TM_TYPE_Q6_K;
    case TM_SYNTH_GATE_EXPS:
    case TM_SYNTH_UP_EXPS:
        return l < first ? TM_TYPE_Q4_K : TM_TYPE_IQ1_M;
    case TM_SYNTH_DOWN_EXPS:
        return l < first ? TM_TYPE_Q4_K : TM_TYPE_IQ2_XXS;
    default:
        return TM_TYPE_Q8_0;
    }
}

typedef struct synth_mix {
    tm_synth_mix_info info;
    uint32_t ftype; /* general.file_type: llama_ftype as llama-quantize labels the recipe */
    tm_type (*type)(const tm_synth_config *c, tm_synth_kind k, uint32_t layer);
} synth_mix;

static const synth_mix synth_mixes[] = {
    {{"Q2_K", "q2_K; ffn_down, attn_output q3_K; attn_v q3_K (q4_K at GQA >= 4); output q6_K"},
     10,
     mix_q2_k},
    {{"Q3_K_M", "q3_K; ffn_down q4_K (q5_K first 1/16), attn_v q5_K/q4_K, attn_output q4_K; "
                "output q6_K"},
     12,
     mix_q3_k_m},
    {{"Q4_K_M", "q4_K; ffn_down, attn_v q6_K in about half the layers; output q6_K"},
     15,
     mix_q4_k_m},
    {{"IQ4_XS", "iq4_xs; ffn_down q5_K first 1/8; attn_v q5_K at GQA >= 4; output q6_K"},
     30,
     mix_iq4_xs},
    {{"IQ2_XXS", "iq2_xxs; ffn_down q2_K first 1/8; attn_v q4_K; embd q2_K; output q5_K"},
     19,
     mix_iq2_xxs},
    {{"dynamic", "experts iq1_m, down iq2_xxs, first 1/16 q4_K; attn q8_0; embd, output q6_K"},
     31,
     mix_dynamic},
};
#define SYNTH_N_MIXES (sizeof(synth_mixes) / sizeof(synth_mixes[0]))

const tm_synth_mix_info *synth_mix_list(size_t *n) {
    static tm_synth_mix_info infos[SYNTH_N_MIXES];
    for (size_t i = 0; i < SYNTH_N_MIXES; i++) infos[i] = synth_mixes[i].info;
    *n = SYNTH_N_MIXES;
    return infos;
}

static const synth_mix *synth_mix_find(const char *name) {
    for (size_t i = 0; name && i < SYNTH_N_MIXES; i++)
        if (!strcasecmp(synth_mixes[i].info.name, name)) return &synth_mixes[i];
    return NULL;
}

tm_status synth_config_mix(tm_synth_config *cfg, const char *name) {
    const synth_mix *m = synth_mix_find(name);
    if (!m) {
        char list[256];
        size_t at = 0;
        for (size_t i = 0; i < SYNTH_N_MIXES && at < sizeof(list); i++)
            at += (size_t)snprintf(list + at, sizeof(list) - at, "%s%s", i ? ", " : "",
                                   synth_mixes[i].info.name);
        return tm_error_set(TM_ERR_ARG, "--mix: unknown recipe '%s' (expected one of %s)", name,
                            list);
    }
    cfg->mix = m->info.name;
    cfg->type_experts = cfg->type_attn = cfg->type_embd = cfg->type_output = TM_TYPE_COUNT;
    cfg->type_shexp = TM_TYPE_COUNT;
    cfg->type_gate_exps = cfg->type_up_exps = cfg->type_down_exps = TM_TYPE_COUNT;
    return TM_OK;
}

tm_status synth_config_tensor_type(tm_synth_config *cfg, const char *spec) {
    const char *eq = strrchr(spec, '=');
    if (!eq || eq == spec || !eq[1])
        return tm_error_set(TM_ERR_ARG, "--tensor-type '%s': expected PATTERN=TYPE", spec);
    if (cfg->n_tensor_types >= TM_SYNTH_MAX_TENSOR_TYPES)
        return tm_error_set(TM_ERR_ARG, "--tensor-type '%s': more than %d rules", spec,
                            TM_SYNTH_MAX_TENSOR_TYPES);
    tm_type t;
    if (quant_type_from_name(eq + 1, &t) != TM_OK)
        return tm_error_set(TM_ERR_ARG, "--tensor-type '%s': unknown type '%s'", spec, eq + 1);
    /* the pattern is the spec up to '=': kept as given (the caller's string outlives cfg) */
    cfg->tensor_types[cfg->n_tensor_types++] = (tm_synth_tensor_type){spec, t};
    return TM_OK;
}

uint32_t synth_mix_ftype(const tm_synth_config *c) {
    const synth_mix *m = synth_mix_find(c->mix);
    if (m) return m->ftype;
    static const struct {
        tm_type experts;
        uint32_t ftype;
    } ftypes[] = {
        /* llama_ftype of the dominant (expert) type, as llama.cpp's quantizer labels the mix */
        {TM_TYPE_F32, 0},      {TM_TYPE_F16, 1},     {TM_TYPE_Q4_0, 2},     {TM_TYPE_Q4_1, 3},
        {TM_TYPE_Q8_0, 7},     {TM_TYPE_Q5_0, 8},    {TM_TYPE_Q5_1, 9},     {TM_TYPE_Q2_K, 10},
        {TM_TYPE_Q3_K, 12},    {TM_TYPE_Q4_K, 15},   {TM_TYPE_Q5_K, 17},    {TM_TYPE_Q6_K, 18},
        {TM_TYPE_IQ2_XXS, 19}, {TM_TYPE_IQ2_XS, 20}, {TM_TYPE_IQ3_XXS, 23}, {TM_TYPE_IQ1_S, 24},
        {TM_TYPE_IQ4_NL, 25},  {TM_TYPE_IQ3_S, 26},  {TM_TYPE_IQ2_S, 28},   {TM_TYPE_IQ4_XS, 30},
        {TM_TYPE_IQ1_M, 31},   {TM_TYPE_BF16, 32},   {TM_TYPE_TQ1_0, 36},   {TM_TYPE_TQ2_0, 37},
        {TM_TYPE_MXFP4, 38},
    };
    for (size_t i = 0; i < sizeof(ftypes) / sizeof(ftypes[0]); i++)
        if (ftypes[i].experts == c->type_experts) return ftypes[i].ftype;
    return 0;
}

/* ---- picking ---- */

struct synth_types {
    const tm_synth_config *c;
    const synth_mix *mix;
    uint32_t n;
    pcre2_code *re[TM_SYNTH_MAX_TENSOR_TYPES];
    pcre2_match_data *md;
    char why[TM_SYNTH_MAX_TENSOR_TYPES][160];
    char mix_why[64];
};

void synth_types_close(synth_types *s) {
    if (!s) return;
    for (uint32_t i = 0; i < s->n; i++) pcre2_code_free(s->re[i]);
    pcre2_match_data_free(s->md);
    free(s);
}

tm_status synth_types_open(const tm_synth_config *c, synth_types **out) {
    *out = NULL;
    synth_types *s = calloc(1, sizeof(*s));
    if (!s) return tm_error_set(TM_ERR_NOMEM, "mkmodel: out of memory");
    s->c = c, s->mix = synth_mix_find(c->mix);
    if (c->mix && !s->mix) {
        free(s);
        return tm_error_set(TM_ERR_ARG, "--mix: unknown recipe '%s'", c->mix);
    }
    if (s->mix) snprintf(s->mix_why, sizeof(s->mix_why), "--mix %s", s->mix->info.name);
    for (uint32_t i = 0; i < c->n_tensor_types && i < TM_SYNTH_MAX_TENSOR_TYPES; i++) {
        const char *spec = c->tensor_types[i].pattern, *eq = strrchr(spec, '=');
        const size_t len = eq ? (size_t)(eq - spec) : strlen(spec);
        int err;
        PCRE2_SIZE off;
        s->re[i] = pcre2_compile((PCRE2_SPTR)spec, len, 0, &err, &off, NULL);
        if (!s->re[i]) {
            PCRE2_UCHAR msg[160];
            if (pcre2_get_error_message(err, msg, sizeof(msg)) < 0)
                strcpy((char *)msg, "unknown error");
            synth_types_close(s);
            return tm_error_set(TM_ERR_ARG,
                                "--tensor-type '%s': invalid regular expression at offset %zu: %s",
                                spec, (size_t)off, (const char *)msg);
        }
        s->n = i + 1;
        snprintf(s->why[i], sizeof(s->why[i]), "--tensor-type %s", spec);
    }
    if (!(s->md = pcre2_match_data_create(1, NULL))) {
        synth_types_close(s);
        return tm_error_set(TM_ERR_NOMEM, "mkmodel: out of memory");
    }
    *out = s;
    return TM_OK;
}

tm_type synth_types_pick(const synth_types *s, tm_synth_kind kind, uint32_t layer, const char *name,
                         const char **why) {
    const tm_synth_config *c = s->c;
    *why = "f32 always";
    if (kind == TM_SYNTH_F32) return TM_TYPE_F32;
    for (uint32_t i = 0; i < s->n; i++)
        if (pcre2_match(s->re[i], (PCRE2_SPTR)name, strlen(name), 0, 0, s->md, NULL) >= 0) {
            *why = s->why[i];
            return c->tensor_types[i].type;
        }
    static const char *const flag[] = {
        [TM_SYNTH_EMBD] = "--type-embd",         [TM_SYNTH_OUTPUT] = "--type-output",
        [TM_SYNTH_ATTN_Q] = "--type-attn",       [TM_SYNTH_ATTN_K] = "--type-attn",
        [TM_SYNTH_ATTN_V] = "--type-attn",       [TM_SYNTH_ATTN_O] = "--type-attn",
        [TM_SYNTH_ATTN_QKV] = "--type-attn",     [TM_SYNTH_ATTN_LIN] = "--type-attn",
        [TM_SYNTH_GATE_EXPS] = "--type-experts", [TM_SYNTH_UP_EXPS] = "--type-experts",
        [TM_SYNTH_DOWN_EXPS] = "--type-experts", [TM_SYNTH_GATE_SHEXP] = "--type-shexp",
        [TM_SYNTH_UP_SHEXP] = "--type-shexp",    [TM_SYNTH_DOWN_SHEXP] = "--type-shexp",
    };
    const tm_type proj = kind == TM_SYNTH_GATE_EXPS   ? c->type_gate_exps
                         : kind == TM_SYNTH_UP_EXPS   ? c->type_up_exps
                         : kind == TM_SYNTH_DOWN_EXPS ? c->type_down_exps
                                                      : TM_TYPE_COUNT;
    if (proj != TM_TYPE_COUNT) {
        *why = kind == TM_SYNTH_GATE_EXPS ? "--type-gate-exps"
               : kind == TM_SYNTH_UP_EXPS ? "--type-up-exps"
                                          : "--type-down-exps";
        return proj;
    }
    const tm_type cls = kind == TM_SYNTH_EMBD        ? c->type_embd
                        : kind == TM_SYNTH_OUTPUT    ? c->type_output
                        : kind <= TM_SYNTH_ATTN_LIN  ? c->type_attn
                        : kind <= TM_SYNTH_DOWN_EXPS ? c->type_experts
                                                     : c->type_shexp;
    if (cls != TM_TYPE_COUNT) {
        *why = flag[kind];
        return cls;
    }
    if (s->mix) {
        *why = s->mix_why;
        return s->mix->type(c, kind, layer);
    }
    *why = flag[kind];
    return TM_TYPE_COUNT;
}
