/* Synthetic Gemma 4 MoE models (arch gemma4): the presets, the tensor list and
 * keys of llama.cpp's converter (conversion/gemma.py's Gemma4Model, as
 * tests/data/hf_gemma4/tiny-f16.gguf has them) and the scales that keep the
 * random model healthy. What each tensor computes: src/model/gemma4.c.
 *
 * Healthy here: the embeddings are scaled by sqrt(n_embd) in the forward, so
 * they are made 1/sqrt(n_embd) (their bias channel too: rmsnorm(x) of the
 * channel is still SYNTH_BIAS_BETA, and --skew works); the router reads
 * rmsnorm(x) * scale * n_embd^-0.5, so its scale is sqrt(n_embd) (its logits,
 * and so the weights' spread, as the other families'); every block's output is normed before the
 * residual adds it, so post_attention_norm and post_ffw_norm are the other
 * families' per-dimension output scales (SYNTH_ATTN_OUT_STD, SYNTH_FFN_OUT_STD);
 * the QK norms are head_dim^-0.25, so q·k (scale 1) is of unit size. */
#include <math.h>
#include <string.h>

#include "model/synth_consts.h"
#include "model/synth_mix.h"
#include "model/synth_tensor.h"

bool synth_is_gemma4(const tm_synth_config *c) {
    return c->arch && !strcmp(c->arch, "gemma4");
}

/* Layer l is global (full attention): every full_attn_interval-th, and the last (HF forces it). */
static bool synth_gemma4_global(const tm_synth_config *c, uint32_t l) {
    return (l + 1) % c->full_attn_interval == 0 || l + 1 == c->n_layer;
}

/* gemma-4-26B-A4B and the tiny file of scripts/make_gemma4_goldens.py. transformers 5.24
 * has no 26B-A4B config (configuration_gemma4.py's defaults are a dense model's); the
 * numbers are the release's config.json text_config as we know it (30 layers of 2816, 16
 * heads; sliding heads 256 with 8 KV heads, window 1024; global heads 512 with 2 KV heads,
 * K as V, every 6th layer; 128 experts of 704, 8 used; dense MLP 2112; vocab 262144,
 * context 262144, soft-cap 30, RoPE 1e4 / 1e6 with a quarter of the global head turned),
 * the global heads, their KV heads and the experts' 704 confirmed by llama.cpp's sources
 * (test-backend-ops, the OpenVINO backend). Types as the other presets': experts q4_K
 * (their down rows of 704 take no K-quant: q5_0, as llama-quantize falls back), attention
 * and the dense MLP q8_0, embeddings q4_K, tied output. */
bool synth_gemma4_preset(tm_synth_config *c, const char *preset) {
    const bool big = !strcmp(preset, "gemma-4-26b-a4b"), tiny = !strcmp(preset, "tiny-gemma-4");
    if (!big && !tiny) return false;
    c->arch = "gemma4", c->rms_eps = 1e-6f, c->k_eq_v = true;
    c->rope_base = 1e6f, c->rope_base_swa = 1e4f;
    if (tiny) { /* tests/data/hf_gemma4 (tiny-f16.gguf): matrices f16, the rest f32 */
        c->n_layer = 5, c->n_embd = 64, c->n_head = 4, c->n_head_kv = 1, c->n_head_kv_swa = 2;
        c->head_dim = 32, c->head_dim_swa = 16, c->n_rot = 8, c->full_attn_interval = 3;
        c->window = 8, c->n_expert = 8, c->n_expert_used = 2, c->n_ff_exp = 16, c->n_ff = 48;
        c->n_vocab = 288, c->n_ctx = 4096, c->logit_softcap = 3.0f;
        c->type_experts = c->type_attn = c->type_embd = c->type_output = c->type_shexp =
            TM_TYPE_F16;
        c->name = "tiermoe tiny gemma4";
        return true;
    }
    c->n_layer = 30, c->n_embd = 2816, c->n_head = 16, c->n_head_kv = 2, c->n_head_kv_swa = 8;
    c->head_dim = 512, c->head_dim_swa = 256, c->n_rot = 128, c->full_attn_interval = 6;
    c->window = 1024, c->n_expert = 128, c->n_expert_used = 8, c->n_ff_exp = 704, c->n_ff = 2112;
    c->n_vocab = 262144, c->n_ctx = 262144, c->logit_softcap = 30.0f;
    c->type_down_exps = TM_TYPE_Q5_0;
    c->name = "tiermoe synthetic gemma-4-26B-A4B";
    return true;
}

tm_status synth_gemma4_validate(const tm_synth_config *c) {
    const synth_dim dims[] = {
        {"head-dim-swa", c->head_dim_swa, 2, 512},
        {"n-head-kv-swa", c->n_head_kv_swa, 1, c->n_head},
        {"head-dim", c->head_dim, 2, 512},
        {"rope-dim", c->n_rot, 2, c->head_dim},
        {"n-ff", c->n_ff, 1, 1 << 20},
        {"window", c->window, 1, 1u << 30},
        {"full-attn-interval", c->full_attn_interval, 1, c->n_layer},
    };
    tm_status st = synth_dims_check(dims, sizeof(dims) / sizeof(dims[0]), "gemma4");
    if (st != TM_OK) return st;
    if (c->head_dim_swa % 2 || c->n_rot % 2 || c->n_head % c->n_head_kv_swa)
        return tm_error_set(TM_ERR_ARG,
                            "gemma4: sliding heads of %u, %u turned values, %u sliding KV heads "
                            "for %u heads (even, even, a divisor)",
                            c->head_dim_swa, c->n_rot, c->n_head_kv_swa, c->n_head);
    if (!(c->logit_softcap >= 0))
        return tm_error_set(TM_ERR_ARG, "gemma4: soft-cap %g (want >= 0)", c->logit_softcap);
    return TM_OK;
}

uint32_t synth_gemma4_tensors(const tm_synth_config *c, const float *bias, synth_tensor *t) {
    uint32_t n = 0;
    const int64_t E = c->n_embd, F = c->n_ff_exp, FD = c->n_ff, X = c->n_expert;
    const float in_std = 1.0f / sqrtf((float)E);
    /* the global layers' turned pairs: rope_freqs 1, the others 1e30 (gemma4.c) */
    synth_tensor_set(&t[n++], "rope_freqs.weight", TM_SYNTH_F32, INIT_ROPE_FREQS,
                     (float)(c->n_rot / 2), 1, c->head_dim / 2, 1, 1);
    synth_tensor_set(&t[n++], "token_embd.weight", TM_SYNTH_EMBD, INIT_EMBD,
                     SYNTH_EMBD_STD * in_std, 2, E, c->n_vocab, 1);
    t[n - 1].role = ROLE_EMBD;
    for (uint32_t l = 0; l < c->n_layer; l++) {
        const bool global = synth_gemma4_global(c, l);
        const int64_t D = global ? c->head_dim : c->head_dim_swa,
                      KV = (int64_t)(global ? c->n_head_kv : c->n_head_kv_swa) * D,
                      Q = (int64_t)c->n_head * D;
        const float qk = powf((float)D, -0.25f);
        char nm[64];
#define SYNTH_T(suffix, ...)                                                                       \
    (snprintf(nm, sizeof(nm), "blk.%u." suffix, l), synth_tensor_set(&t[n++], nm, __VA_ARGS__),    \
     t[n - 1].layer = l)
        /* the converter's order */
        SYNTH_T("ffn_down_exps.weight", TM_SYNTH_DOWN_EXPS, INIT_NORMAL, 1.0f / sqrtf((float)F), 3,
                F, E, X);
        t[n - 1].role = ROLE_DOWN;
        SYNTH_T("ffn_gate_up_exps.weight", TM_SYNTH_GATE_EXPS, INIT_NORMAL, in_std, 3, E, 2 * F, X);
        SYNTH_T("attn_norm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, E, 1, 1);
        SYNTH_T("layer_output_scale.weight", TM_SYNTH_F32, INIT_CONST, 1.0f, 1, 1, 1, 1);
        SYNTH_T("ffn_down.weight", TM_SYNTH_DOWN_SHEXP, INIT_NORMAL, 1.0f / sqrtf((float)FD), 2, FD,
                E, 1);
        t[n - 1].role = ROLE_DOWN;
        SYNTH_T("ffn_gate.weight", TM_SYNTH_GATE_SHEXP, INIT_NORMAL, in_std, 2, E, FD, 1);
        SYNTH_T("ffn_up.weight", TM_SYNTH_UP_SHEXP, INIT_NORMAL, in_std, 2, E, FD, 1);
        SYNTH_T("post_attention_norm.weight", TM_SYNTH_F32, INIT_CONST, SYNTH_ATTN_OUT_STD, 1, E, 1,
                1);
        SYNTH_T("post_ffw_norm.weight", TM_SYNTH_F32, INIT_CONST, SYNTH_FFN_OUT_STD, 1, E, 1, 1);
        SYNTH_T("post_ffw_norm_1.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, E, 1, 1);
        SYNTH_T("post_ffw_norm_2.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, E, 1, 1);
        SYNTH_T("ffn_norm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, E, 1, 1);
        SYNTH_T("pre_ffw_norm_2.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, E, 1, 1);
        SYNTH_T("ffn_down_exps.scale", TM_SYNTH_F32, INIT_ONES, 0, 1, X, 1, 1);
        SYNTH_T("ffn_gate_inp.weight", TM_SYNTH_F32, INIT_ROUTER, SYNTH_ROUTER_NOISE * in_std, 2, E,
                X, 1);
        t[n - 1].bias = bias + (size_t)l * X, t[n - 1].role = ROLE_ROUTER;
        SYNTH_T("ffn_gate_inp.scale", TM_SYNTH_F32, INIT_CONST, sqrtf((float)E), 1, E, 1, 1);
        SYNTH_T("attn_k_norm.weight", TM_SYNTH_F32, INIT_CONST, qk, 1, D, 1, 1);
        SYNTH_T("attn_k.weight", TM_SYNTH_ATTN_K, INIT_NORMAL, in_std, 2, E, KV, 1);
        SYNTH_T("attn_output.weight", TM_SYNTH_ATTN_O, INIT_NORMAL, 1.0f / sqrtf((float)Q), 2, Q, E,
                1);
        SYNTH_T("attn_q_norm.weight", TM_SYNTH_F32, INIT_CONST, qk, 1, D, 1, 1);
        SYNTH_T("attn_q.weight", TM_SYNTH_ATTN_Q, INIT_NORMAL, in_std, 2, E, Q, 1);
        if (!global || !c->k_eq_v)
            SYNTH_T("attn_v.weight", TM_SYNTH_ATTN_V, INIT_NORMAL, in_std, 2, E, KV, 1);
#undef SYNTH_T
    }
    synth_tensor_set(&t[n++], "output_norm.weight", TM_SYNTH_F32, INIT_ONES, 0, 1, E, 1, 1);
    return n; /* no output.weight: tied, as the converter writes Gemma's */
}

tm_status synth_gemma4_metadata(const tm_synth_config *c, tm_gguf_writer *w) {
    tm_status st;
    char key[96];
    const char *arch = "gemma4";
    int32_t kv[1024]; /* the converter writes INT32 */
    uint8_t swa[1024];
    for (uint32_t l = 0; l < c->n_layer && l < 1024; l++) {
        swa[l] = !synth_gemma4_global(c, l);
        kv[l] = (int32_t)(swa[l] ? c->n_head_kv_swa : c->n_head_kv);
    }
    /* in the converter's order (where it writes a key twice: the first place, the last value) */
    SYNTH_KV(gguf_writer_set_str(w, "general.architecture", "gemma4"));
    SYNTH_KV(gguf_writer_set_str(w, "general.type", "model"));
    SYNTH_KV(gguf_writer_set_str(w, "general.name", c->name ? c->name : "tiermoe synthetic"));
    SYNTH_ARCH(gguf_writer_set_u32, "block_count", c->n_layer);
    SYNTH_ARCH(gguf_writer_set_u32, "context_length", c->n_ctx);
    SYNTH_ARCH(gguf_writer_set_u32, "embedding_length", c->n_embd);
    SYNTH_ARCH(gguf_writer_set_u32, "feed_forward_length", c->n_ff);
    SYNTH_ARCH(gguf_writer_set_u32, "attention.head_count", c->n_head);
    SYNTH_ARCH(gguf_writer_set_array, "attention.head_count_kv", TM_GGUF_TYPE_INT32, kv,
               c->n_layer);
    SYNTH_ARCH(gguf_writer_set_f32, "rope.freq_base", c->rope_base);
    SYNTH_ARCH(gguf_writer_set_f32, "rope.freq_base_swa", c->rope_base_swa);
    SYNTH_ARCH(gguf_writer_set_f32, "attention.layer_norm_rms_epsilon", c->rms_eps);
    SYNTH_ARCH(gguf_writer_set_u32, "expert_count", c->n_expert);
    SYNTH_ARCH(gguf_writer_set_u32, "expert_used_count", c->n_expert_used);
    SYNTH_ARCH(gguf_writer_set_u32, "attention.key_length", c->head_dim);
    SYNTH_ARCH(gguf_writer_set_u32, "attention.value_length", c->head_dim);
    SYNTH_KV(gguf_writer_set_u32(w, "general.file_type", synth_mix_ftype(c)));
    if (c->logit_softcap > 0)
        SYNTH_ARCH(gguf_writer_set_f32, "final_logit_softcapping", c->logit_softcap);
    SYNTH_ARCH(gguf_writer_set_u32, "attention.sliding_window", c->window);
    SYNTH_ARCH(gguf_writer_set_u32, "attention.shared_kv_layers", 0);
    SYNTH_ARCH(gguf_writer_set_u32, "embedding_length_per_layer_input", 0);
    SYNTH_ARCH(gguf_writer_set_array, "attention.sliding_window_pattern", TM_GGUF_TYPE_BOOL, swa,
               c->n_layer);
    SYNTH_ARCH(gguf_writer_set_u32, "attention.key_length_swa", c->head_dim_swa);
    SYNTH_ARCH(gguf_writer_set_u32, "attention.value_length_swa", c->head_dim_swa);
    SYNTH_ARCH(gguf_writer_set_u32, "expert_feed_forward_length", c->n_ff_exp);
    SYNTH_ARCH(gguf_writer_set_u32, "rope.dimension_count", c->head_dim);
    SYNTH_ARCH(gguf_writer_set_u32, "rope.dimension_count_swa", c->head_dim_swa);
    if (!c->vocab_json) SYNTH_ARCH(gguf_writer_set_u32, "vocab_size", c->n_vocab);
    SYNTH_KV(gguf_writer_set_u32(w, "general.quantization_version", 2));
    return TM_OK;
}
