/* Synthetic Mixtral (arch llama), OLMoE, GLM-4.5 (glm4moe) and DeepSeek-V3 /
 * Kimi K2 (deepseek2) models: the presets, the tensor list and keys of
 * llama.cpp's converter (LlamaModel with experts, OlmoeModel, Glm4MoeModel,
 * DeepseekV2Model, as the files in tests/data/hf_mixtral, hf_olmoe, hf_glm4moe
 * and hf_deepseek2 have them), and the scales that keep the random model
 * healthy (synth.h, synth_consts.h). What each tensor computes: the header of
 * src/model/mixtral.c, olmoe.c, glm4moe.c, deepseek2.c. */
#include <math.h>
#include <string.h>

#include "model/synth_consts.h"
#include "model/synth_mix.h"
#include "model/synth_tensor.h"

#define SYNTH_MLA_MAX_ROPE 512 /* the engine's widest RoPE part (TM_MODEL_MAX_HEAD_DIM) */

static bool synth_arch_is(const tm_synth_config *c, const char *a) {
    return c->arch && !strcmp(c->arch, a);
}

bool synth_is_moe_arch(const tm_synth_config *c) {
    return synth_arch_is(c, "llama") || synth_arch_is(c, "olmoe") || synth_arch_is(c, "glm4moe") ||
           synth_arch_is(c, "deepseek2");
}

/* DeepSeek-V3 (its config.json: 61 layers of 7168, the first 3 dense of 18432, 256 experts of
 * 2048 (8 used) in 8 groups of which 4, one shared, scale 2.5; MLA: 128 heads, q_lora 1536,
 * kv_lora 512, nope 128 + rope 64, v 128; YaRN factor 40 over 4096, beta 32 / 1, mscale_all_dim
 * 1; vocab 129280, context 163840), Kimi K2 (Kimi-K2-Instruct's: the same layer shape with 64
 * heads, 384 experts in one group, the first layer dense, scale 2.827; rope_theta 50000, YaRN
 * factor 32, beta 1 / 1; vocab 163840, context 131072) and the tiny file of
 * scripts/make_moe_goldens.py. The converter writes no NextN layer for them. */
static bool synth_deepseek_preset(tm_synth_config *c, const char *preset) {
    const bool v3 = !strcmp(preset, "deepseek-v3"), k2 = !strcmp(preset, "kimi-k2"),
               v2 = !strcmp(preset, "tiny-deepseek-v2-lite"),
               tiny = v2 || !strcmp(preset, "tiny-deepseek-v3");
    if (!v3 && !k2 && !tiny) return false;
    c->arch = "deepseek2";
    c->n_head_kv = 1, c->n_shexp = 1, c->n_nextn = 0, c->rms_eps = 1e-6f;
    c->yarn_beta_fast = 32, c->yarn_beta_slow = 1, c->yarn_log_mul = 0.1f, c->rope_orig_ctx = 4096;
    if (tiny) { /* tests/data/hf_deepseek2 (tiny-f16.gguf, by llama.cpp's converter) */
        c->n_layer = 4, c->n_embd = 64, c->n_head = 4, c->head_dim = 24, c->n_rot = 8;
        c->mla_q_lora = 32, c->mla_kv_lora = 32, c->mla_v_head = 16;
        c->n_expert = 8, c->n_expert_used = 2, c->n_ff_exp = 16, c->n_ff = 96, c->n_dense = 1;
        c->n_group = 4, c->n_group_used = 2, c->expert_scale = 2.5f, c->n_vocab = 256;
        c->n_ctx = 163840, c->rope_base = 1e4f, c->rope_factor = 40;
        c->type_experts = c->type_attn = c->type_embd = c->type_output = c->type_shexp =
            TM_TYPE_F16;
        c->name = "tiermoe tiny deepseek2";
        if (v2) { /* DeepSeek-V2-Lite's kind (a test shape, no converter file): a plain
                     attn_q, the softmax router without bias or groups, mscale_all_dim 0.707 */
            c->mla_q_lora = 0, c->n_group = c->n_group_used = 1, c->expert_scale = 1.0f;
            c->ds_v2_router = true, c->yarn_log_mul = 0.0707f;
            c->name = "tiermoe tiny deepseek2 (V2-Lite's kind)";
        }
        return true;
    }
    c->n_layer = 61, c->n_embd = 7168, c->head_dim = 192, c->n_rot = 64;
    c->mla_q_lora = 1536, c->mla_kv_lora = 512, c->mla_v_head = 128;
    c->n_ff_exp = 2048, c->n_ff = 18432, c->n_expert_used = 8;
    if (v3) {
        c->n_head = 128, c->n_expert = 256, c->n_dense = 3, c->n_group = 8, c->n_group_used = 4;
        c->expert_scale = 2.5f, c->n_vocab = 129280, c->n_ctx = 163840, c->rope_base = 1e4f;
        c->rope_factor = 40;
        c->name = "tiermoe synthetic DeepSeek-V3";
    } else {
        c->n_head = 64, c->n_expert = 384, c->n_dense = 1, c->n_group = c->n_group_used = 1;
        c->expert_scale = 2.827f, c->n_vocab = 163840, c->n_ctx = 131072, c->rope_base = 5e4f;
        c->rope_factor = 32, c->yarn_beta_fast = 1;
        c->name = "tiermoe synthetic Kimi-K2";
    }
    return true;
}

bool synth_moe_arch_preset(tm_synth_config *c, const char *preset) {
    const bool mixtral = !strcmp(preset, "mixtral-8x7b"), olmoe = !strcmp(preset, "olmoe-1b-7b"),
               air = !strcmp(preset, "glm-4.5-air"), glm = !strcmp(preset, "glm-4.5"),
               tiny_mixtral = !strcmp(preset, "tiny-mixtral"),
               tiny_olmoe = !strcmp(preset, "tiny-olmoe"),
               tiny_glm = !strcmp(preset, "tiny-glm4moe");
    if (synth_deepseek_preset(c, preset)) return true;
    if (!mixtral && !olmoe && !air && !glm && !tiny_mixtral && !tiny_olmoe && !tiny_glm)
        return false;
    c->arch = mixtral || tiny_mixtral ? "llama" : olmoe || tiny_olmoe ? "olmoe" : "glm4moe";
    c->rms_eps = 1e-5f;
    if (tiny_mixtral || tiny_olmoe || tiny_glm) {
        /* The shapes of tests/data/hf_*: (tiny-f16.gguf, by llama.cpp's converter), in its
         * types: matrices f16, norms, routers and biases f32 */
        c->n_layer = tiny_glm ? 4 : 3, c->n_embd = 64, c->n_head = 4, c->n_head_kv = 2;
        c->head_dim = 16, c->n_expert = 8, c->n_expert_used = 2, c->n_vocab = 256;
        c->n_ctx = 4096, c->rope_base = tiny_mixtral ? 1e6f : 1e4f;
        c->n_ff_exp = c->n_ff = tiny_glm ? 16 : 32;
        c->type_experts = c->type_attn = c->type_embd = c->type_output = c->type_shexp =
            TM_TYPE_F16;
        if (tiny_glm) { /* scripts/make_moe_goldens.py's glm4moe, converted --no-mtp */
            c->n_ff = 96, c->n_rot = 8, c->n_dense = 1, c->n_shexp = 1, c->n_group = 4;
            c->n_group_used = 2, c->expert_scale = 2.5f, c->qk_norm = true;
        }
        c->name = tiny_mixtral ? "tiermoe tiny mixtral"
                  : tiny_olmoe ? "tiermoe tiny olmoe"
                               : "tiermoe tiny glm4moe";
        return true;
    }
    if (mixtral) {
        /* Mixtral-8x7B (transformers' MixtralConfig defaults; the release's context 32768) */
        c->n_layer = 32, c->n_embd = 4096, c->n_head = 32, c->n_head_kv = 8, c->head_dim = 128;
        c->n_expert = 8, c->n_expert_used = 2, c->n_ff_exp = c->n_ff = 14336, c->n_vocab = 32000;
        c->n_ctx = 32768, c->rope_base = 1e6f;
        c->name = "tiermoe synthetic Mixtral-8x7B";
        return true;
    }
    if (olmoe) {
        /* OLMoE-1B-7B-0924 (transformers' OlmoeConfig defaults but the release's expert width
         * 1024) */
        c->n_layer = 16, c->n_embd = 2048, c->n_head = 16, c->n_head_kv = 16, c->head_dim = 128;
        c->n_expert = 64, c->n_expert_used = 8, c->n_ff_exp = c->n_ff = 1024, c->n_vocab = 50304;
        c->n_ctx = 4096, c->rope_base = 1e4f;
        c->name = "tiermoe synthetic OLMoE-1B-7B";
        return true;
    }
    /* GLM-4.5-Air (transformers' Glm4MoeConfig defaults with the release's rope_theta 1e6 and
     * attention biases) and GLM-4.5 (the release's config.json); both with their MTP layer
     * (the converter writes it unless --no-mtp). Heads of 128, RoPE on their first half; the
     * experts' down rows (1408 for Air) take no K-quant: q5_0 there, as llama-quantize falls
     * back; the dense layers' down rows (10944) q8_0 as the shared expert's. */
    c->n_head = 96, c->n_head_kv = 8, c->head_dim = 128, c->n_rot = 64, c->n_expert_used = 8;
    c->n_vocab = 151552, c->n_ctx = 131072, c->rope_base = 1e6f, c->n_shexp = 1, c->n_nextn = 1;
    c->n_group = c->n_group_used = 1;
    if (air) {
        c->n_layer = 46, c->n_embd = 4096, c->n_ff = 10944, c->n_ff_exp = 1408, c->n_expert = 128;
        c->n_dense = 1, c->expert_scale = 1.0f;
        c->type_down_exps = TM_TYPE_Q5_0;
        c->name = "tiermoe synthetic GLM-4.5-Air";
    } else {
        c->n_layer = 92, c->n_embd = 5120, c->n_ff = 12288, c->n_ff_exp = 1536, c->n_expert = 160;
        c->n_dense = 3, c->expert_scale = 2.5f, c->qk_norm = true;
        c->name = "tiermoe synthetic GLM-4.5";
    }
    return true;
}

tm_status synth_moe_arch_validate(const tm_synth_config *c) {
    const bool ds = synth_arch_is(c, "deepseek2");
    if (!synth_arch_is(c, "glm4moe") && !ds) return TM_OK;
    const uint32_t n_group = c->n_group ? c->n_group : 1;
    if (ds && (c->n_head_kv != 1 || !c->mla_kv_lora || !c->mla_v_head ||
               c->n_rot > SYNTH_MLA_MAX_ROPE || c->n_rot >= c->head_dim || c->n_nextn))
        return tm_error_set(TM_ERR_ARG,
                            "deepseek2: %u KV heads, kv_lora %u, v %u, RoPE %u of heads of %u, "
                            "%u NextN layers: MLA wants one KV head, a latent, value heads, RoPE "
                            "on fewer values than a head (at most %d), no NextN layer",
                            c->n_head_kv, c->mla_kv_lora, c->mla_v_head, c->n_rot, c->head_dim,
                            SYNTH_MLA_MAX_ROPE, c->n_nextn);
    const synth_dim dims[] = {
        {"rope-dim", c->n_rot, 2, c->head_dim},
        {"n-ff", c->n_ff, 1, 1 << 20},
        {"n-dense", c->n_dense, 0, c->n_layer - 1},
        {"n-group", n_group, 1, 32},
    };
    tm_status st = synth_dims_check(dims, sizeof(dims) / sizeof(dims[0]), c->arch);
    if (st != TM_OK) return st;
    if (c->n_rot % 2)
        return tm_error_set(TM_ERR_ARG, "--rope-dim %u must be even (RoPE rotates pairs)",
                            c->n_rot);
    if (c->n_expert % n_group || (n_group > 1 && c->n_expert / n_group < 2) ||
        c->n_group_used > n_group ||
        (n_group > 1 && c->n_expert_used > c->n_group_used * (c->n_expert / n_group)))
        return tm_error_set(TM_ERR_ARG,
                            "%s: %u experts in %u groups, %u used, %u experts a token: the "
                            "groups must divide the experts into 2 or more and hold the token's",
                            c->arch, c->n_expert, n_group, c->n_group_used, c->n_expert_used);
    return TM_OK;
}

/* Layer l's MLA tensors in the converter's order (after ffn_norm). */
static uint32_t synth_mla_tensors(const tm_synth_config *c, uint32_t l, synth_tensor *t) {
    const int64_t E = c->n_embd, H = c->n_head, DK = c->head_dim, R = c->n_rot, NOPE = DK - R,
                  C = c->mla_kv_lora, V = c->mla_v_head, QL = c->mla_q_lora;
    const float in_std = 1.0f / sqrtf((float)E);
    uint32_t n = 0;
    char nm[64];
#define SYNTH_T(suffix, ...)                                                                       \
    (snprintf(nm, sizeof(nm), "blk.%u." suffix, l), synth_tensor_set(&t[n++], nm, __VA_ARGS__),    \
     t[n - 1].layer = l)
    SYNTH_T("attn_kv_a_norm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, C, 1, 1);
    SYNTH_T("attn_kv_a_mqa.weight", TM_SYNTH_ATTN_K, INIT_NORMAL, in_std, 2, E, C + R, 1);
    /* the latent is normed: each product of it sums C unit values */
    SYNTH_T("attn_k_b.weight", TM_SYNTH_ATTN_K, INIT_NORMAL, 1.0f / sqrtf((float)NOPE), 3, NOPE, C,
            H);
    SYNTH_T("attn_v_b.weight", TM_SYNTH_ATTN_V, INIT_NORMAL, 1.0f / sqrtf((float)C), 3, C, V, H);
    SYNTH_T("attn_output.weight", TM_SYNTH_ATTN_O, INIT_NORMAL,
            SYNTH_ATTN_OUT_STD / sqrtf((float)(H * V)), 2, H * V, E, 1);
    if (QL) {
        SYNTH_T("attn_q_a_norm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, QL, 1, 1);
        SYNTH_T("attn_q_a.weight", TM_SYNTH_ATTN_Q, INIT_NORMAL, in_std, 2, E, QL, 1);
        SYNTH_T("attn_q_b.weight", TM_SYNTH_ATTN_Q, INIT_NORMAL, 1.0f / sqrtf((float)QL), 2, QL,
                H * DK, 1);
    } else {
        SYNTH_T("attn_q.weight", TM_SYNTH_ATTN_Q, INIT_NORMAL, in_std, 2, E, H * DK, 1);
    }
#undef SYNTH_T
    return n;
}

uint32_t synth_moe_arch_tensors(const tm_synth_config *c, const float *bias, synth_tensor *t) {
    const bool llama = synth_arch_is(c, "llama"), ds = synth_arch_is(c, "deepseek2");
    const bool glm = synth_arch_is(c, "glm4moe") || ds; /* dense layers, shared experts, bias */
    uint32_t n = 0;
    const int64_t E = c->n_embd, D = c->head_dim, Q = (int64_t)c->n_head * D,
                  KV = (int64_t)c->n_head_kv * D, F = c->n_ff_exp, FD = c->n_ff,
                  FS = (int64_t)c->n_ff_exp * c->n_shexp, X = c->n_expert;
    const float in_std = 1.0f / sqrtf((float)E);
    synth_tensor_set(&t[n++], "output.weight", TM_SYNTH_OUTPUT, INIT_NORMAL, in_std, 2, E,
                     c->n_vocab, 1);
    synth_tensor_set(&t[n++], "token_embd.weight", TM_SYNTH_EMBD, INIT_EMBD, SYNTH_EMBD_STD, 2, E,
                     c->n_vocab, 1);
    t[n - 1].role = ROLE_EMBD;
    for (uint32_t l = 0; l < c->n_layer + c->n_nextn; l++) {
        char nm[64];
        const bool dense = glm && l < c->n_dense, nextn = l >= c->n_layer;
        const float *lb = bias + (size_t)(nextn ? c->n_layer - 1 : l) * X; /* NextN: the last */
#define SYNTH_T(suffix, ...)                                                                       \
    (snprintf(nm, sizeof(nm), "blk.%u." suffix, l), synth_tensor_set(&t[n++], nm, __VA_ARGS__),    \
     t[n - 1].layer = l)
        const float down_std = SYNTH_FFN_OUT_STD / (SYNTH_SWIGLU_STD * sqrtf((float)F));
        /* the converter's order: the experts (and for llama the router) first */
        if (llama) {
            SYNTH_T("ffn_gate_exps.weight", TM_SYNTH_GATE_EXPS, INIT_NORMAL, in_std, 3, E, F, X);
            SYNTH_T("ffn_down_exps.weight", TM_SYNTH_DOWN_EXPS, INIT_NORMAL, down_std, 3, F, E, X);
            t[n - 1].role = ROLE_DOWN;
            SYNTH_T("ffn_up_exps.weight", TM_SYNTH_UP_EXPS, INIT_NORMAL, in_std, 3, E, F, X);
            SYNTH_T("ffn_gate_inp.weight", TM_SYNTH_F32, INIT_ROUTER, SYNTH_ROUTER_NOISE * in_std,
                    2, E, X, 1);
            t[n - 1].bias = lb, t[n - 1].role = ROLE_ROUTER;
        }
        SYNTH_T("attn_norm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, E, 1, 1);
        if (dense) { /* a dense FFN: the shared expert's type */
            SYNTH_T("ffn_down.weight", TM_SYNTH_DOWN_SHEXP, INIT_NORMAL,
                    SYNTH_FFN_OUT_STD / (SYNTH_SWIGLU_STD * sqrtf((float)FD)), 2, FD, E, 1);
            t[n - 1].role = ROLE_DOWN;
            SYNTH_T("ffn_gate.weight", TM_SYNTH_GATE_SHEXP, INIT_NORMAL, in_std, 2, E, FD, 1);
            SYNTH_T("ffn_up.weight", TM_SYNTH_UP_SHEXP, INIT_NORMAL, in_std, 2, E, FD, 1);
        } else if (!llama) {
            SYNTH_T("ffn_down_exps.weight", TM_SYNTH_DOWN_EXPS, INIT_NORMAL, down_std, 3, F, E, X);
            t[n - 1].role = ROLE_DOWN;
            SYNTH_T("ffn_gate_exps.weight", TM_SYNTH_GATE_EXPS, INIT_NORMAL, in_std, 3, E, F, X);
            SYNTH_T("ffn_up_exps.weight", TM_SYNTH_UP_EXPS, INIT_NORMAL, in_std, 3, E, F, X);
            /* small, so a missing one shows; the skew rides on the router's bias channel */
            if (glm && !c->ds_v2_router)
                SYNTH_T("exp_probs_b.bias", TM_SYNTH_F32, INIT_NORMAL, SYNTH_BIAS_STD, 1, X, 1, 1);
            SYNTH_T("ffn_gate_inp.weight", TM_SYNTH_F32, INIT_ROUTER, SYNTH_ROUTER_NOISE * in_std,
                    2, E, X, 1);
            t[n - 1].bias = lb, t[n - 1].role = ROLE_ROUTER;
            if (glm && FS) {
                SYNTH_T("ffn_down_shexp.weight", TM_SYNTH_DOWN_SHEXP, INIT_NORMAL,
                        SYNTH_FFN_OUT_STD / (SYNTH_SWIGLU_STD * sqrtf((float)FS)), 2, FS, E, 1);
                t[n - 1].role = ROLE_DOWN;
                SYNTH_T("ffn_gate_shexp.weight", TM_SYNTH_GATE_SHEXP, INIT_NORMAL, in_std, 2, E, FS,
                        1);
                SYNTH_T("ffn_up_shexp.weight", TM_SYNTH_UP_SHEXP, INIT_NORMAL, in_std, 2, E, FS, 1);
            }
        }
        if (!glm || ds) SYNTH_T("ffn_norm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, E, 1, 1);
        if (ds) {
            n += synth_mla_tensors(c, l, t + n);
            continue;
        }
        if (glm) SYNTH_T("post_attention_norm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, E, 1, 1);
        /* OLMoE's norms span the whole projection, GLM's a head */
        const int64_t qn = glm ? D : Q, kn = glm ? D : KV;
        const bool norms = !llama && (!glm || c->qk_norm), biases = glm;
        if (norms) SYNTH_T("attn_k_norm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, kn, 1, 1);
        if (biases) SYNTH_T("attn_k.bias", TM_SYNTH_F32, INIT_NORMAL, SYNTH_BIAS_STD, 1, KV, 1, 1);
        SYNTH_T("attn_k.weight", TM_SYNTH_ATTN_K, INIT_NORMAL, in_std, 2, E, KV, 1);
        SYNTH_T("attn_output.weight", TM_SYNTH_ATTN_O, INIT_NORMAL,
                SYNTH_ATTN_OUT_STD / sqrtf((float)Q), 2, Q, E, 1);
        if (norms) SYNTH_T("attn_q_norm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, qn, 1, 1);
        if (biases) SYNTH_T("attn_q.bias", TM_SYNTH_F32, INIT_NORMAL, SYNTH_BIAS_STD, 1, Q, 1, 1);
        SYNTH_T("attn_q.weight", TM_SYNTH_ATTN_Q, INIT_NORMAL, in_std, 2, E, Q, 1);
        if (biases) SYNTH_T("attn_v.bias", TM_SYNTH_F32, INIT_NORMAL, SYNTH_BIAS_STD, 1, KV, 1, 1);
        SYNTH_T("attn_v.weight", TM_SYNTH_ATTN_V, INIT_NORMAL, in_std, 2, E, KV, 1);
        if (nextn) { /* checked by the engine, never run */
            SYNTH_T("nextn.eh_proj.weight", TM_SYNTH_ATTN_O, INIT_NORMAL, in_std, 2, 2 * E, E, 1);
            SYNTH_T("nextn.enorm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, E, 1, 1);
            SYNTH_T("nextn.hnorm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, E, 1, 1);
            SYNTH_T("nextn.shared_head_norm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, E, 1, 1);
        }
#undef SYNTH_T
    }
    synth_tensor_set(&t[n++], "output_norm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, E, 1, 1);
    return n;
}

tm_status synth_moe_arch_metadata(const tm_synth_config *c, tm_gguf_writer *w) {
    const char *arch = c->arch;
    const bool llama = synth_arch_is(c, "llama"), ds = synth_arch_is(c, "deepseek2");
    const bool glm = synth_arch_is(c, "glm4moe") || ds;
    tm_status st;
    char key[96];
    /* in the converter's order */
    SYNTH_KV(gguf_writer_set_str(w, "general.architecture", arch));
    SYNTH_KV(gguf_writer_set_str(w, "general.type", "model"));
    SYNTH_KV(gguf_writer_set_str(w, "general.name", c->name ? c->name : "tiermoe synthetic"));
    SYNTH_ARCH(gguf_writer_set_u32, "block_count", c->n_layer + c->n_nextn);
    SYNTH_ARCH(gguf_writer_set_u32, "context_length", c->n_ctx);
    SYNTH_ARCH(gguf_writer_set_u32, "embedding_length", c->n_embd);
    /* llama, olmoe: the experts' width; glm4moe: the dense layers' */
    SYNTH_ARCH(gguf_writer_set_u32, "feed_forward_length", glm ? c->n_ff : c->n_ff_exp);
    SYNTH_ARCH(gguf_writer_set_u32, "attention.head_count", c->n_head);
    SYNTH_ARCH(gguf_writer_set_u32, "attention.head_count_kv", c->n_head_kv);
    if (ds && c->rope_factor > 1) { /* DeepseekV2Model's YaRN keys, before the base */
        SYNTH_ARCH(gguf_writer_set_str, "rope.scaling.type", "yarn");
        SYNTH_ARCH(gguf_writer_set_f32, "rope.scaling.factor", c->rope_factor);
        SYNTH_ARCH(gguf_writer_set_u32, "rope.scaling.original_context_length", c->rope_orig_ctx);
        SYNTH_ARCH(gguf_writer_set_f32, "rope.scaling.yarn_beta_fast", c->yarn_beta_fast);
        SYNTH_ARCH(gguf_writer_set_f32, "rope.scaling.yarn_beta_slow", c->yarn_beta_slow);
    }
    SYNTH_ARCH(gguf_writer_set_f32, "rope.freq_base", c->rope_base);
    SYNTH_ARCH(gguf_writer_set_f32, "attention.layer_norm_rms_epsilon", c->rms_eps);
    SYNTH_ARCH(gguf_writer_set_u32, "expert_count", c->n_expert);
    SYNTH_ARCH(gguf_writer_set_u32, "expert_used_count", c->n_expert_used);
    if (glm) {
        SYNTH_ARCH(gguf_writer_set_u32, "expert_group_count", c->n_group ? c->n_group : 1);
        SYNTH_ARCH(gguf_writer_set_u32, "expert_group_used_count",
                   c->n_group_used ? c->n_group_used : 1);
        if (ds) { /* the cache's latent key and value */
            SYNTH_ARCH(gguf_writer_set_u32, "expert_gating_func",
                       c->ds_v2_router ? 1 : 2); /* softmax, sigmoid */
            SYNTH_ARCH(gguf_writer_set_u32, "attention.key_length", c->mla_kv_lora + c->n_rot);
            SYNTH_ARCH(gguf_writer_set_u32, "attention.value_length", c->mla_kv_lora);
        } else {
            SYNTH_ARCH(gguf_writer_set_u32, "attention.key_length", c->head_dim);
            SYNTH_ARCH(gguf_writer_set_u32, "attention.value_length", c->head_dim);
        }
    }
    SYNTH_KV(gguf_writer_set_u32(w, "general.file_type", synth_mix_ftype(c)));
    if (ds) {
        SYNTH_ARCH(gguf_writer_set_u32, "leading_dense_block_count", c->n_dense);
        if (!c->vocab_json) SYNTH_ARCH(gguf_writer_set_u32, "vocab_size", c->n_vocab);
        if (c->mla_q_lora) SYNTH_ARCH(gguf_writer_set_u32, "attention.q_lora_rank", c->mla_q_lora);
        SYNTH_ARCH(gguf_writer_set_u32, "attention.kv_lora_rank", c->mla_kv_lora);
        SYNTH_ARCH(gguf_writer_set_u32, "attention.key_length_mla", c->head_dim);
        SYNTH_ARCH(gguf_writer_set_u32, "attention.value_length_mla", c->mla_v_head);
        SYNTH_ARCH(gguf_writer_set_u32, "expert_feed_forward_length", c->n_ff_exp);
        SYNTH_ARCH(gguf_writer_set_u32, "expert_shared_count", c->n_shexp);
        SYNTH_ARCH(gguf_writer_set_f32, "expert_weights_scale", c->expert_scale);
        SYNTH_ARCH(gguf_writer_set_bool, "expert_weights_norm", !c->ds_v2_router);
        SYNTH_ARCH(gguf_writer_set_u32, "rope.dimension_count", c->n_rot);
        if (c->rope_factor > 1)
            SYNTH_ARCH(gguf_writer_set_f32, "rope.scaling.yarn_log_multiplier", c->yarn_log_mul);
        SYNTH_KV(gguf_writer_set_u32(w, "general.quantization_version", 2));
        return TM_OK;
    }
    /* a file without a tokenizer ("no_vocab") tells llama.cpp its vocabulary's size here;
       the converter writes llama's always */
    if (llama || !c->vocab_json) SYNTH_ARCH(gguf_writer_set_u32, "vocab_size", c->n_vocab);
    if (llama) SYNTH_ARCH(gguf_writer_set_u32, "rope.dimension_count", c->head_dim);
    if (glm) {
        SYNTH_ARCH(gguf_writer_set_u32, "rope.dimension_count", c->n_rot);
        SYNTH_ARCH(gguf_writer_set_u32, "expert_feed_forward_length", c->n_ff_exp);
        SYNTH_ARCH(gguf_writer_set_u32, "expert_shared_count", c->n_shexp);
        SYNTH_ARCH(gguf_writer_set_u32, "leading_dense_block_count", c->n_dense);
        SYNTH_ARCH(gguf_writer_set_u32, "expert_gating_func", 2); /* sigmoid */
        SYNTH_ARCH(gguf_writer_set_f32, "expert_weights_scale", c->expert_scale);
        SYNTH_ARCH(gguf_writer_set_bool, "expert_weights_norm", true);
        if (c->n_nextn) SYNTH_ARCH(gguf_writer_set_u32, "nextn_predict_layers", c->n_nextn);
    }
    SYNTH_KV(gguf_writer_set_u32(w, "general.quantization_version", 2));
    return TM_OK;
}
