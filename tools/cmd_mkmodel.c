/* tiermoe mkmodel: write a synthetic random-weight qwen3moe, gpt-oss, qwen3next or
 * qwen35moe GGUF (src/model/synth.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_internal.h"
#include "core/timing.h"
#include "model/synth.h"
#include "quant/quant.h"

static void mkmodel_usage(FILE *out) {
    fprintf(
        out,
        "usage: tiermoe mkmodel [--preset NAME] -o FILE.gguf [options]\n"
        "  --preset NAME        tiny (default; tests), 30b-a3b (Qwen3-30B-A3B shape),\n"
        "                       gpt-oss-20b, gpt-oss-120b (their shapes and llama.cpp's types:\n"
        "                       MXFP4 experts, Q8_0 matrices) or tiny-gpt-oss (tests);\n"
        "                       qwen3-next-80b-a3b (qwen3next), qwen3.5-35b-a3b = qwen3.6-35b-a3b\n"
        "                       (qwen35moe): hybrid linear/full attention, shared expert; or\n"
        "                       tiny-qwen3next, tiny-qwen35moe (tests: the shapes and f16 types\n"
        "                       of tests/data/hf_*/tiny-f16.gguf); mixtral-8x7b (arch llama),\n"
        "                       olmoe-1b-7b, glm-4.5-air, glm-4.5 (glm4moe: dense first layers,\n"
        "                       a shared expert, the sigmoid router, its MTP layer),\n"
        "                       deepseek-v3, kimi-k2 (deepseek2: MLA, YaRN, dense first\n"
        "                       layers, a shared expert, the sigmoid router with groups); or\n"
        "                       tiny-mixtral, tiny-olmoe, tiny-glm4moe, tiny-deepseek-v3 (tests,\n"
        "                       as above), tiny-deepseek-v2-lite (tests: no q_lora, softmax);\n"
        "                       gemma-4-26b-a4b (gemma4: sliding and global layers, a dense MLP\n"
        "                       beside the experts) or tiny-gemma-4 (tests, as above)\n"
        "  -o, --output FILE    where to write (written to FILE.tmp, then renamed)\n"
        "  --seed N             random seed; the same seed gives the same bytes (default 42)\n"
        "  --skew S             Zipf exponent of expert popularity, 0 = uniform (default 0)\n"
        "  --skew-offset Q      Zipf-Mandelbrot offset: popularity ~ (rank + Q)^-S (default 0)\n"
        "  --locality X         share of router-logit variance that is an average over the last\n"
        "                       tokens (temporal locality, 0 <= X < 1; default 0 = none)\n"
        "  --locality-span T    tokens over which that average decays by e (default 8)\n"
        "  --routing NAME       routing profile: uniform (skew and locality 0) or qwen3-30b-a3b\n"
        "                       (calibrated to Qwen3-30B-A3B's published routing statistics);\n"
        "                       not with --skew, --skew-offset, --locality or --locality-span;\n"
        "                       gpt-oss: skew only (locality is not calibrated for it yet)\n"
        "  --type-experts T     quant type of ffn_{gate,up,down}_exps (default q4_K)\n"
        "  --type-gate-exps T --type-up-exps T --type-down-exps T\n"
        "                       one projection of the experts (over --type-experts)\n"
        "  --type-attn T        attn_q/k/v/output, and linear attention's attn_qkv, attn_gate,\n"
        "                       ssm_ba (ssm_alpha, ssm_beta), ssm_out (default q8_0; ssm_conv1d,\n"
        "                       ssm_a, ssm_dt, ssm_norm are always f32)\n"
        "  --type-shexp T       the shared expert's ffn_{gate,up,down}_shexp (default q8_0)\n"
        "  --type-embd T        token_embd (default q4_K)\n"
        "  --type-output T      output (default q8_0); norms and router are always f32\n"
        "  --tensor-type P=T    tensors whose name the regular expression P matches get T\n"
        "                       (repeatable; the first matching rule wins, over every other\n"
        "                       flag), e.g. --tensor-type 'blk\\.[0-3]\\.ffn_down_exps=q6_K'\n"
        "  --mix NAME           types per tensor by a recipe like llama-quantize's\n"
        "                       (docs/quant.md); --type-* flags override it for their class:\n");
    size_t n_mix;
    const tm_synth_mix_info *mix = synth_mix_list(&n_mix);
    for (size_t i = 0; i < n_mix; i++) fprintf(out, "      %-8s %s\n", mix[i].name, mix[i].summary);
    fprintf(out, "  types mkmodel can write in this build:");
    for (uint32_t t = 0; t < TM_TYPE_COUNT; t++)
        if (t != TM_TYPE_Q8_K && quant_type_is_compute(t)) fprintf(out, " %s", quant_type_name(t));
    fprintf(out, "\n");
    fprintf(
        out,
        "  --n-layer N --n-embd N --n-head N --n-head-kv N --head-dim N --n-expert N\n"
        "  --n-expert-used N --n-ff-exp N --n-ff N --n-vocab N --n-ctx N\n"
        "  --rope-base F --rms-eps F    override any dimension of the preset\n"
        "  --full-attn-interval N --rope-dim N --ssm-conv N --ssm-k-heads N --ssm-v-heads N\n"
        "  --ssm-k-dim N --ssm-v-dim N --n-ff-shexp N   the hybrid presets' own dimensions\n"
        "  --vocab FILE         embed a HuggingFace tokenizer.json (and the tokenizer_config.json\n"
        "                       beside it); n_vocab grows to the vocabulary's size\n"
        "  --fill MODE          random (default): every row of every matrix its own random\n"
        "                       values; repeat: for speed benches only, each weight matrix\n"
        "                       (attention, experts, output) gets --fill-rows distinct random\n"
        "                       rows, quantized once and repeated through it: the weights\n"
        "                       repeat; the file's tensors, types and sizes, the bytes a\n"
        "                       token reads and the kernels' work are those of a normal file;\n"
        "                       token embeddings, norms and routers are made in full, so\n"
        "                       routing stays random (the file says fill_rows). Low-bit\n"
        "                       types quantize at 3-18 M values/s a thread: a 30b-a3b file\n"
        "                       takes 2-10 minutes on 16 cores in full, seconds this way\n"
        "  --fill-rows N        distinct rows a matrix with --fill repeat (default %d)\n"
        "  -t, --threads N      generation threads (default: physical cores)\n"
        "  -q, --quiet          no progress\n",
        SYNTH_FILL_ROWS_DEFAULT);
}

/* A class's type for the progress line: "recipe" where --mix decides. */
static const char *mkmodel_type_name(tm_type t) {
    return t == TM_TYPE_COUNT ? "recipe" : quant_type_name(t);
}

int cmd_mkmodel(int argc, char **argv) {
    tm_synth_config cfg;
    const char *preset = "tiny", *out = NULL, *routing_knob = NULL, *fill = "random";
    long long fill_rows = 0;
    /* The preset comes first so that other flags override it, wherever they stand. */
    const char *mix = NULL;
    for (int i = 1; i + 1 < argc; i++) {
        if (!strcmp(argv[i], "--preset")) preset = argv[i + 1];
        if (!strcmp(argv[i], "--mix")) mix = argv[i + 1];
    }
    if (synth_config_preset(&cfg, preset) != TM_OK) {
        fprintf(stderr, "tiermoe mkmodel: --preset: %s\n", tm_error_message());
        return 2;
    }
    /* then the recipe, so that --type-* flags anywhere override it */
    if (mix && synth_config_mix(&cfg, mix) != TM_OK) {
        fprintf(stderr, "tiermoe mkmodel: %s\n", tm_error_message());
        return 2;
    }
    cfg.progress = 1;
    struct {
        const char *flag;
        uint32_t *dst;
    } dims[] = {
        {"--n-layer", &cfg.n_layer},
        {"--n-embd", &cfg.n_embd},
        {"--n-head", &cfg.n_head},
        {"--n-head-kv", &cfg.n_head_kv},
        {"--head-dim", &cfg.head_dim},
        {"--n-expert", &cfg.n_expert},
        {"--n-expert-used", &cfg.n_expert_used},
        {"--n-ff-exp", &cfg.n_ff_exp},
        {"--n-ff", &cfg.n_ff},
        {"--n-vocab", &cfg.n_vocab},
        {"--n-ctx", &cfg.n_ctx},
        /* qwen3next / qwen35moe only (from here on: hybrid_dims) */
        {"--full-attn-interval", &cfg.full_attn_interval},
        {"--rope-dim", &cfg.n_rot},
        {"--ssm-conv", &cfg.ssm_conv},
        {"--ssm-k-heads", &cfg.ssm_k_heads},
        {"--ssm-v-heads", &cfg.ssm_v_heads},
        {"--ssm-k-dim", &cfg.ssm_k_dim},
        {"--ssm-v-dim", &cfg.ssm_v_dim},
        {"--n-ff-shexp", &cfg.n_ff_shexp},
    };
    const size_t hybrid_dims = 11;
    const char *hybrid_flag = NULL; /* one given, refused for the other architectures */
    struct {
        const char *flag;
        tm_type *dst;
    } types[] = {
        {"--type-experts", &cfg.type_experts},     {"--type-attn", &cfg.type_attn},
        {"--type-embd", &cfg.type_embd},           {"--type-output", &cfg.type_output},
        {"--type-gate-exps", &cfg.type_gate_exps}, {"--type-up-exps", &cfg.type_up_exps},
        {"--type-down-exps", &cfg.type_down_exps}, {"--type-shexp", &cfg.type_shexp},
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            mkmodel_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            cfg.progress = 0;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "tiermoe mkmodel: %s needs a value (or is unknown)\n", a);
            mkmodel_usage(stderr);
            return 2;
        }
        const char *v = argv[++i];
        long long n;
        double d;
        int done = 0, rc = 0;
        for (size_t k = 0; !done && k < sizeof(dims) / sizeof(dims[0]); k++)
            if (!strcmp(a, dims[k].flag)) {
                done = 1;
                if (k >= hybrid_dims) hybrid_flag = a;
                if (!(rc = cli_parse_i64(a, v, 1, 1 << 24, &n))) *dims[k].dst = (uint32_t)n;
            }
        for (size_t k = 0; !done && k < sizeof(types) / sizeof(types[0]); k++)
            if (!strcmp(a, types[k].flag)) {
                done = 1;
                /* a known type without a quantizer is refused by synth_config_validate,
                   naming the tensors */
                if (quant_type_from_name(v, types[k].dst) != TM_OK) {
                    fprintf(stderr, "tiermoe mkmodel: %s: unknown type '%s'\n", a, v);
                    rc = 2;
                }
            }
        if (done) {
            if (rc) return rc;
        } else if (!strcmp(a, "--preset") || !strcmp(a, "--mix")) {
            /* handled above */
        } else if (!strcmp(a, "--tensor-type")) {
            if (synth_config_tensor_type(&cfg, v) != TM_OK) {
                fprintf(stderr, "tiermoe mkmodel: %s\n", tm_error_message());
                return 2;
            }
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            out = v;
        } else if (!strcmp(a, "--fill")) {
            if (strcmp(v, "random") && strcmp(v, "repeat")) {
                fprintf(stderr, "tiermoe mkmodel: --fill: '%s': expected random or repeat\n", v);
                return 2;
            }
            fill = v;
        } else if (!strcmp(a, "--fill-rows")) {
            if (cli_parse_i64(a, v, 1, 1 << 20, &fill_rows)) return 2;
        } else if (!strcmp(a, "--vocab")) {
            cfg.vocab_json = v;
        } else if (!strcmp(a, "--seed") || !strcmp(a, "-s")) {
            if (cli_parse_i64(a, v, 0, 0x7fffffffffffffffll, &n)) return 2;
            cfg.seed = (uint64_t)n;
        } else if (!strcmp(a, "--skew") || !strcmp(a, "--skew-offset") ||
                   !strcmp(a, "--locality") || !strcmp(a, "--locality-span")) {
            /* ranges are checked by synth_config_validate, naming the flag */
            if (cli_parse_f64(a, v, 0, 1e4, &d)) return 2;
            *(!strcmp(a, "--skew")          ? &cfg.skew
              : !strcmp(a, "--skew-offset") ? &cfg.skew_offset
              : !strcmp(a, "--locality")    ? &cfg.locality
                                            : &cfg.locality_span) = d;
            routing_knob = a;
        } else if (!strcmp(a, "--routing")) {
            if (synth_routing_profile(&cfg, v) != TM_OK) {
                fprintf(stderr, "tiermoe mkmodel: --routing: %s\n", tm_error_message());
                return 2;
            }
        } else if (!strcmp(a, "--rope-base")) {
            if (cli_parse_f64(a, v, 1e-3, 1e12, &d)) return 2;
            cfg.rope_base = (float)d;
        } else if (!strcmp(a, "--rms-eps")) {
            if (cli_parse_f64(a, v, 1e-12, 1, &d)) return 2;
            cfg.rms_eps = (float)d;
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            if (cli_parse_i64(a, v, 1, 1024, &n)) return 2;
            cfg.n_threads = (int)n;
        } else {
            fprintf(stderr, "tiermoe mkmodel: unknown flag '%s'\n", a);
            mkmodel_usage(stderr);
            return 2;
        }
    }
    if (hybrid_flag &&
        !(cfg.arch && (!strcmp(cfg.arch, "qwen3next") || !strcmp(cfg.arch, "qwen35moe")))) {
        fprintf(stderr, "tiermoe mkmodel: %s is for the qwen3next / qwen35moe presets, not %s\n",
                hybrid_flag, cfg.arch ? cfg.arch : "qwen3moe");
        return 2;
    }
    if (cfg.routing && routing_knob) {
        fprintf(stderr,
                "tiermoe mkmodel: --routing %s sets the routing knobs; give it or %s, not both\n",
                cfg.routing, routing_knob);
        return 2;
    }
    if (fill_rows && strcmp(fill, "repeat")) {
        fprintf(stderr, "tiermoe mkmodel: --fill-rows needs --fill repeat\n");
        return 2;
    }
    if (!strcmp(fill, "repeat"))
        cfg.fill_rows = fill_rows ? (uint32_t)fill_rows : SYNTH_FILL_ROWS_DEFAULT;
    if (!out) {
        fprintf(stderr, "tiermoe mkmodel: missing -o FILE.gguf\n");
        mkmodel_usage(stderr);
        return 2;
    }
    if (synth_config_apply_vocab(&cfg) != TM_OK) {
        fprintf(stderr, "tiermoe mkmodel: --vocab: %s\n", tm_error_message());
        return 2;
    }
    if (synth_config_validate(&cfg) != TM_OK) {
        fprintf(stderr, "tiermoe mkmodel: %s\n", tm_error_message());
        return 2;
    }
    const bool gemma4 = cfg.arch && !strcmp(cfg.arch, "gemma4");
    if (cfg.progress && gemma4)
        fprintf(stderr,
                "mkmodel: gemma4: every %u-th layer and the last global (heads of %u, %u KV "
                "heads, RoPE on %u, K as V %s), the others sliding (window %u, heads of %u, %u "
                "KV heads); dense MLP %u (%s); soft-cap %g\n",
                cfg.full_attn_interval, cfg.head_dim, cfg.n_head_kv, cfg.n_rot,
                cfg.k_eq_v ? "yes" : "no", cfg.window, cfg.head_dim_swa, cfg.n_head_kv_swa,
                cfg.n_ff, mkmodel_type_name(cfg.type_shexp), cfg.logit_softcap);
    else if (cfg.progress && cfg.full_attn_interval)
        fprintf(stderr,
                "mkmodel: %s: every %u-th layer full attention (RoPE on %u of %u), the others "
                "linear: %u key / %u value heads of %u / %u, conv %u; shared expert %u (%s)\n",
                cfg.arch, cfg.full_attn_interval, cfg.n_rot, cfg.head_dim, cfg.ssm_k_heads,
                cfg.ssm_v_heads, cfg.ssm_k_dim, cfg.ssm_v_dim, cfg.ssm_conv, cfg.n_ff_shexp,
                mkmodel_type_name(cfg.type_shexp));
    if (cfg.progress && cfg.arch && !strcmp(cfg.arch, "glm4moe"))
        fprintf(stderr,
                "mkmodel: glm4moe: %u dense layers of %u, %u shared experts, RoPE on %u of %u, "
                "%u of %u expert groups, scale %g, QK norm %s, %u NextN layers (%s dense and "
                "shared)\n",
                cfg.n_dense, cfg.n_ff, cfg.n_shexp, cfg.n_rot, cfg.head_dim, cfg.n_group_used,
                cfg.n_group, cfg.expert_scale, cfg.qk_norm ? "yes" : "no", cfg.n_nextn,
                mkmodel_type_name(cfg.type_shexp));
    if (cfg.progress && cfg.arch && !strcmp(cfg.arch, "deepseek2"))
        fprintf(stderr,
                "mkmodel: deepseek2: %u dense layers of %u, %u shared experts, MLA q_lora %u, "
                "kv_lora %u, heads of %u nope + %u RoPE, values of %u, %u of %u expert groups, "
                "scale %g, YaRN factor %g over %u (%s dense and shared)\n",
                cfg.n_dense, cfg.n_ff, cfg.n_shexp, cfg.mla_q_lora, cfg.mla_kv_lora,
                cfg.head_dim - cfg.n_rot, cfg.n_rot, cfg.mla_v_head, cfg.n_group_used, cfg.n_group,
                cfg.expert_scale, cfg.rope_factor, cfg.rope_orig_ctx,
                mkmodel_type_name(cfg.type_shexp));
    if (cfg.progress)
        fprintf(stderr,
                "mkmodel: %s %u layers, n_embd %u, %u heads (%u kv) of %u, %u experts (%u "
                "used) of %u, vocab %u, experts %s, attention %s, embd %s, output %s%s%s, skew %g "
                "(offset %g), locality %g (span %g)%s%s, seed %llu%s -> %s (%.2f GiB)\n",
                cfg.arch ? cfg.arch : "qwen3moe", cfg.n_layer, cfg.n_embd, cfg.n_head,
                cfg.n_head_kv, cfg.head_dim, cfg.n_expert, cfg.n_expert_used, cfg.n_ff_exp,
                cfg.n_vocab, mkmodel_type_name(cfg.type_experts), mkmodel_type_name(cfg.type_attn),
                mkmodel_type_name(cfg.type_embd), mkmodel_type_name(cfg.type_output),
                cfg.mix ? ", mix " : "", cfg.mix ? cfg.mix : "", cfg.skew, cfg.skew_offset,
                cfg.locality, cfg.locality_span, cfg.routing ? ", profile " : "",
                cfg.routing ? cfg.routing : "", (unsigned long long)cfg.seed,
                cfg.fill_rows ? ", fill repeat (weights repeat: speed benches only)" : "", out,
                synth_config_tensor_bytes(&cfg) / 1073741824.0);
    if (synth_model_write(&cfg, out) != TM_OK) {
        fprintf(stderr, "tiermoe mkmodel: %s\n", tm_error_message());
        return 1;
    }
    return 0;
}
