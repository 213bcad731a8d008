/* Synthetic qwen3next (Qwen3-Next) and qwen35moe (Qwen3.5 / 3.6 MoE) models:
 * the presets, the tensor list and keys of llama.cpp's converter
 * (convert_hf_to_gguf.py's Qwen3NextModel and Qwen3_5MoeTextModel, as the files
 * in tests/data/hf_qwen3next and hf_qwen35moe have them), and the scales that
 * keep the random model healthy (synth.h, synth_consts.h). What each tensor
 * computes: src/model/qwen3next.c's header. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "model/synth_consts.h"
#include "model/synth_mix.h"
#include "model/synth_tensor.h"

bool synth_is_hybrid(const tm_synth_config *c) {
    return c->arch && (!strcmp(c->arch, "qwen3next") || !strcmp(c->arch, "qwen35moe"));
}

bool synth_hybrid_linear(const tm_synth_config *c, uint32_t l) {
    return (l + 1) % c->full_attn_interval != 0;
}

/* qwen3next: b and a from one matrix (ssm_ba), value heads grouped under their
 * key head; qwen35moe: ssm_beta and ssm_alpha, tiled. */
static bool synth_fused_ba(const tm_synth_config *c) {
    return !strcmp(c->arch, "qwen3next");
}

bool synth_hybrid_preset(tm_synth_config *c, const char *preset) {
    const bool next80 = !strcmp(preset, "qwen3-next-80b-a3b"),
               q35 = !strcmp(preset, "qwen3.5-35b-a3b") || !strcmp(preset, "qwen3.6-35b-a3b"),
               tiny_next = !strcmp(preset, "tiny-qwen3next"),
               tiny_35 = !strcmp(preset, "tiny-qwen35moe");
    if (!next80 && !q35 && !tiny_next && !tiny_35) return false;
    c->arch = next80 || tiny_next ? "qwen3next" : "qwen35moe";
    c->rms_eps = 1e-6f;
    if (next80 || q35) {
        /* Qwen3-Next-80B-A3B and Qwen3.5-35B-A3B (Qwen3.6-35B-A3B has the same
         * shapes): transformers' Qwen3NextConfig / Qwen3_5MoeTextConfig defaults,
         * with the released config.json's rope_theta 1e7 and context 262144
         * (transformers' defaults: 10000, 32768). Hybrid layout 3 linear : 1 full;
         * gated attention 16 q / 2 KV heads of 256, RoPE on the first 64 of them
         * (partial_rotary_factor 0.25); Gated DeltaNet 16 key heads / 32 value
         * heads of 128, conv 4; experts of 512 and a shared one of 512. */
        c->n_embd = 2048, c->n_head = 16, c->n_head_kv = 2, c->head_dim = 256, c->n_rot = 64;
        c->full_attn_interval = 4, c->ssm_conv = 4, c->ssm_k_heads = 16, c->ssm_v_heads = 32;
        c->ssm_k_dim = c->ssm_v_dim = 128, c->n_ff_exp = c->n_ff_shexp = 512;
        c->rope_base = 1e7f, c->n_ctx = 262144;
        if (next80) {
            c->n_layer = 48, c->n_expert = 512, c->n_expert_used = 10, c->n_vocab = 151936;
            c->n_ff = 5120; /* intermediate_size: metadata only (no dense layer) */
            c->name = "tiermoe synthetic Qwen3-Next-80B-A3B";
        } else {
            c->n_layer = 40, c->n_expert = 256, c->n_expert_used = 8, c->n_vocab = 248320;
            c->name = "tiermoe synthetic Qwen3.5-35B-A3B";
        }
        return true;
    }
    /* The shapes of tests/data/hf_*: (tiny-f16.gguf, by llama.cpp's converter), in
     * its types: matrices f16, norms, routers, conv, ssm_a, ssm_dt f32. Rows of 64
     * and 16 take no K-quant; --n-embd 256 --n-ff-exp 256 do. */
    c->n_layer = 4, c->n_embd = 64, c->n_head = 4, c->n_head_kv = 2, c->head_dim = 32;
    c->n_rot = 8, c->full_attn_interval = 2, c->ssm_conv = 4, c->ssm_k_heads = 2;
    c->ssm_v_heads = 4, c->ssm_k_dim = c->ssm_v_dim = 16, c->n_expert = 8, c->n_expert_used = 2;
    c->n_ff_exp = 16, c->n_ff_shexp = 32, c->n_ff = 128, c->n_vocab = 256, c->n_ctx = 256;
    c->rope_base = 10000;
    c->type_experts = c->type_attn = c->type_embd = c->type_output = c->type_shexp = TM_TYPE_F16;
    c->name = tiny_next ? "tiermoe tiny qwen3next" : "tiermoe tiny qwen35moe";
    return true;
}

tm_status synth_hybrid_validate(const tm_synth_config *c) {
    const synth_dim dims[] = {
        {"full-attn-interval", c->full_attn_interval, 1, 1024},
        {"ssm-conv", c->ssm_conv, 2, 16},
        {"ssm-k-heads", c->ssm_k_heads, 1, 1024},
        {"ssm-v-heads", c->ssm_v_heads, 1, 1024},
        {"ssm-k-dim", c->ssm_k_dim, 1, 1024},
        {"ssm-v-dim", c->ssm_v_dim, 1, 1024},
        {"n-ff-shexp", c->n_ff_shexp, 1, 1 << 20},
        {"rope-dim", c->n_rot, 2, c->head_dim},
    };
    tm_status st = synth_dims_check(dims, sizeof(dims) / sizeof(dims[0]), c->arch);
    if (st != TM_OK) return st;
    if (c->n_rot % 2)
        return tm_error_set(TM_ERR_ARG, "--rope-dim %u must be even (RoPE rotates pairs)",
                            c->n_rot);
    if (c->ssm_v_heads % c->ssm_k_heads)
        return tm_error_set(TM_ERR_ARG, "--ssm-v-heads %u is not a multiple of --ssm-k-heads %u",
                            c->ssm_v_heads, c->ssm_k_heads);
    if (c->locality > 0 && c->n_layer < c->full_attn_interval)
        return tm_error_set(TM_ERR_ARG,
                            "--locality needs a full-attention layer for its recency head: "
                            "--n-layer %u is below --full-attn-interval %u",
                            c->n_layer, c->full_attn_interval);
    return TM_OK;
}

uint32_t synth_hybrid_tensors(const tm_synth_config *c, const float *bias,
                              const tm_synth_locality *loc, synth_tensor *t) {
    uint32_t n = 0;
    const int64_t E = c->n_embd, D = c->head_dim, Q = (int64_t)c->n_head * D,
                  KV = (int64_t)c->n_head_kv * D, Hv = c->ssm_v_heads,
                  V = (int64_t)Hv * c->ssm_v_dim,
                  CH = 2 * (int64_t)c->ssm_k_heads * c->ssm_k_dim + V, F = c->n_ff_exp,
                  FS = c->n_ff_shexp, X = c->n_expert;
    const float in_std = 1.0f / sqrtf((float)E);
    synth_tensor_set(&t[n++], "output.weight", TM_SYNTH_OUTPUT, INIT_NORMAL, in_std, 2, E,
                     c->n_vocab, 1);
    synth_tensor_set(&t[n++], "token_embd.weight", TM_SYNTH_EMBD, INIT_EMBD, SYNTH_EMBD_STD, 2, E,
                     c->n_vocab, 1);
    t[n - 1].role = ROLE_EMBD, t[n - 1].loc = loc;
    for (uint32_t l = 0; l < c->n_layer; l++) {
        char nm[64];
#define SYNTH_T(suffix, ...)                                                                       \
    (snprintf(nm, sizeof(nm), "blk.%u." suffix, l), synth_tensor_set(&t[n++], nm, __VA_ARGS__),    \
     t[n - 1].layer = l)
#define SYNTH_ROLE(r) (t[n - 1].role = (r), t[n - 1].loc = loc)
        SYNTH_T("attn_norm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, E, 1, 1);
        if (synth_hybrid_linear(c, l)) {
            SYNTH_T("ssm_a", TM_SYNTH_F32, INIT_SSM_A, 0, 1, Hv, 1, 1);
            /* the taps of each channel: the conv keeps the variance of its input */
            SYNTH_T("ssm_conv1d.weight", TM_SYNTH_F32, INIT_NORMAL,
                    1.0f / sqrtf((float)c->ssm_conv), 2, c->ssm_conv, CH, 1);
            SYNTH_T("ssm_dt.bias", TM_SYNTH_F32, INIT_NORMAL, SYNTH_DT_STD, 1, Hv, 1, 1);
            const float ba_std = SYNTH_GATE_LOGIT_STD * in_std;
            if (synth_fused_ba(c)) {
                SYNTH_T("ssm_ba.weight", TM_SYNTH_ATTN_LIN, INIT_NORMAL, ba_std, 2, E, 2 * Hv, 1);
            } else {
                SYNTH_T("ssm_alpha.weight", TM_SYNTH_ATTN_LIN, INIT_NORMAL, ba_std, 2, E, Hv, 1);
                SYNTH_T("ssm_beta.weight", TM_SYNTH_ATTN_LIN, INIT_NORMAL, ba_std, 2, E, Hv, 1);
            }
            SYNTH_T("attn_qkv.weight", TM_SYNTH_ATTN_QKV, INIT_NORMAL, in_std, 2, E, CH, 1);
            SYNTH_T("attn_gate.weight", TM_SYNTH_ATTN_LIN, INIT_NORMAL, in_std, 2, E, V, 1);
            SYNTH_T("ssm_norm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, c->ssm_v_dim, 1, 1);
            /* its input rmsnorm(o) silu(z) has rms ~0.6: the layer adds ~0.03 a dim */
            SYNTH_T("ssm_out.weight", TM_SYNTH_ATTN_LIN, INIT_NORMAL,
                    SYNTH_ATTN_OUT_STD / (SYNTH_SILU_RMS * sqrtf((float)V)), 2, V, E, 1);
            SYNTH_ROLE(ROLE_O);
        }
        SYNTH_T("ffn_down_exps.weight", TM_SYNTH_DOWN_EXPS, INIT_NORMAL,
                SYNTH_FFN_OUT_STD / (SYNTH_SWIGLU_STD * sqrtf((float)F)), 3, F, E, X);
        SYNTH_ROLE(ROLE_DOWN);
        SYNTH_T("ffn_gate_exps.weight", TM_SYNTH_GATE_EXPS, INIT_NORMAL, in_std, 3, E, F, X);
        SYNTH_T("ffn_up_exps.weight", TM_SYNTH_UP_EXPS, INIT_NORMAL, in_std, 3, E, F, X);
        SYNTH_T("ffn_gate_inp.weight", TM_SYNTH_F32, INIT_ROUTER, SYNTH_ROUTER_NOISE * in_std, 2, E,
                X, 1);
        t[n - 1].bias = bias + (size_t)l * X;
        SYNTH_ROLE(ROLE_ROUTER);
        SYNTH_T("ffn_down_shexp.weight", TM_SYNTH_DOWN_SHEXP, INIT_NORMAL,
                SYNTH_FFN_OUT_STD / (SYNTH_SWIGLU_STD * sqrtf((float)FS)), 2, FS, E, 1);
        SYNTH_ROLE(ROLE_DOWN);
        SYNTH_T("ffn_gate_shexp.weight", TM_SYNTH_GATE_SHEXP, INIT_NORMAL, in_std, 2, E, FS, 1);
        SYNTH_T("ffn_up_shexp.weight", TM_SYNTH_UP_SHEXP, INIT_NORMAL, in_std, 2, E, FS, 1);
        /* the shared expert's gate logit: std 1, sigmoid mostly 0.27-0.73 */
        SYNTH_T("ffn_gate_inp_shexp.weight", TM_SYNTH_F32, INIT_NORMAL, in_std, 2, E, 1, 1);
        SYNTH_T("post_attention_norm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, E, 1, 1);
        if (!synth_hybrid_linear(c, l)) {
            SYNTH_T("attn_k_norm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, D, 1, 1);
            SYNTH_ROLE(ROLE_QK_NORM);
            SYNTH_T("attn_k.weight", TM_SYNTH_ATTN_K, INIT_NORMAL, in_std, 2, E, KV, 1);
            SYNTH_ROLE(ROLE_K);
            SYNTH_T("attn_output.weight", TM_SYNTH_ATTN_O, INIT_NORMAL,
                    SYNTH_ATTN_OUT_STD / sqrtf((float)Q), 2, Q, E, 1);
            SYNTH_ROLE(ROLE_O);
            SYNTH_T("attn_q_norm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, D, 1, 1);
            SYNTH_ROLE(ROLE_QK_NORM);
            SYNTH_T("attn_q.weight", TM_SYNTH_ATTN_Q, INIT_NORMAL, in_std, 2, E, 2 * Q, 1);
            SYNTH_ROLE(ROLE_QG);
            SYNTH_T("attn_v.weight", TM_SYNTH_ATTN_V, INIT_NORMAL, in_std, 2, E, KV, 1);
            SYNTH_ROLE(ROLE_V);
        }
#undef SYNTH_ROLE
#undef SYNTH_T
    }
    synth_tensor_set(&t[n++], "output_norm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, E, 1, 1);
    return n;
}

tm_status synth_hybrid_metadata(const tm_synth_config *c, tm_gguf_writer *w) {
    const char *arch = c->arch;
    const bool q35 = !synth_fused_ba(c);
    tm_status st;
    char key[96];
    /* in the converter's order */
    SYNTH_KV(gguf_writer_set_str(w, "general.architecture", arch));
    SYNTH_KV(gguf_writer_set_str(w, "general.type", "model"));
    SYNTH_KV(gguf_writer_set_str(w, "general.name", c->name ? c->name : "tiermoe synthetic"));
    SYNTH_ARCH(gguf_writer_set_u32, "block_count", c->n_layer);
    SYNTH_ARCH(gguf_writer_set_u32, "context_length", c->n_ctx);
    SYNTH_ARCH(gguf_writer_set_u32, "embedding_length", c->n_embd);
    if (!q35) /* Qwen3-Next's config has a dense intermediate_size (no layer uses it) */
        SYNTH_ARCH(gguf_writer_set_u32, "feed_forward_length", c->n_ff);
    SYNTH_ARCH(gguf_writer_set_u32, "attention.head_count", c->n_head);
    SYNTH_ARCH(gguf_writer_set_u32, "attention.head_count_kv", c->n_head_kv);
    if (q35) {
        /* M-RoPE's sections of the rotated pairs (temporal, height, width), padded to
         * four: [11, 11, 10] of 32 pairs as Qwen3.5's mrope_section; for text every
         * section sees the same position, so they are metadata here */
        const int32_t p = (int32_t)c->n_rot / 2, sec[4] = {(p + 2) / 3, (p + 1) / 3, p / 3, 0};
        SYNTH_ARCH(gguf_writer_set_array, "rope.dimension_sections", TM_GGUF_TYPE_INT32, sec, 4);
    }
    SYNTH_ARCH(gguf_writer_set_f32, "rope.freq_base", c->rope_base);
    SYNTH_ARCH(gguf_writer_set_f32, "attention.layer_norm_rms_epsilon", c->rms_eps);
    SYNTH_ARCH(gguf_writer_set_u32, "expert_count", c->n_expert);
    SYNTH_ARCH(gguf_writer_set_u32, "expert_used_count", c->n_expert_used);
    SYNTH_ARCH(gguf_writer_set_u32, "attention.key_length", c->head_dim);
    SYNTH_ARCH(gguf_writer_set_u32, "attention.value_length", c->head_dim);
    SYNTH_KV(gguf_writer_set_u32(w, "general.file_type", synth_mix_ftype(c)));
    SYNTH_ARCH(gguf_writer_set_u32, "expert_feed_forward_length", c->n_ff_exp);
    SYNTH_ARCH(gguf_writer_set_u32, "expert_shared_feed_forward_length", c->n_ff_shexp);
    SYNTH_ARCH(gguf_writer_set_u32, "ssm.conv_kernel", c->ssm_conv);
    SYNTH_ARCH(gguf_writer_set_u32, "ssm.state_size", c->ssm_k_dim);
    SYNTH_ARCH(gguf_writer_set_u32, "ssm.group_count", c->ssm_k_heads);
    SYNTH_ARCH(gguf_writer_set_u32, "ssm.time_step_rank", c->ssm_v_heads);
    SYNTH_ARCH(gguf_writer_set_u32, "ssm.inner_size", c->ssm_v_heads * c->ssm_v_dim);
    uint8_t *rec = malloc(c->n_layer);
    if (!rec) return tm_error_set(TM_ERR_NOMEM, "mkmodel: out of memory");
    for (uint32_t l = 0; l < c->n_layer; l++) rec[l] = synth_hybrid_linear(c, l);
    snprintf(key, sizeof(key), "%s.attention.recurrent_layers", arch);
    st = gguf_writer_set_array(w, key, TM_GGUF_TYPE_BOOL, rec, c->n_layer);
    free(rec);
    if (st != TM_OK) return st;
    SYNTH_ARCH(gguf_writer_set_u32, "full_attention_interval", c->full_attn_interval);
    SYNTH_ARCH(gguf_writer_set_u32, "rope.dimension_count", c->n_rot);
    SYNTH_KV(gguf_writer_set_u32(w, "general.quantization_version", 2));
    /* a file without a tokenizer ("no_vocab") tells llama.cpp its vocabulary's size here */
    if (!c->vocab_json) SYNTH_ARCH(gguf_writer_set_u32, "vocab_size", c->n_vocab);
    return TM_OK;
}
