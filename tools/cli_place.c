/* The placement flags of run, bench, trace and serve (as llama.cpp's users
 * know them: -ngl, --cpu-moe, --n-cpu-moe, -ot) and the VRAM expert cache
 * (--moe-cache, --moe-learn, ...) into the public context options; what the
 * library checks (-ot's patterns, the cache's names) it checks as each flag
 * is read, so a bad value is a usage error before the model loads. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

const char cli_place_help[] =
    "  -ngl, --n-gpu-layers N  the first N layers on the GPU; all (or N >= layers) puts the\n"
    "                         output head there too; auto: as many as fit (default 0, or auto\n"
    "                         when an expert flag below is given)\n"
    "  -cmoe, --cpu-moe       keep every layer's experts in RAM (computed by the CPU)\n"
    "  -ncmoe, --n-cpu-moe N  keep the experts of the first N layers in RAM\n"
    "  -ot, --override-tensor PATTERN=CPU|CUDA0|CUDA1...[,...]\n"
    "                         tensors whose name matches the regex go there (first match wins)\n"
    "  -dev, --device CUDA0,CUDA1|none  the GPUs, in the order their spans of layers run\n"
    "                         (default CUDA0; bench, serve and trace: not yet run)\n"
    "  -sm, --split-mode layer|none  layer: each GPU a contiguous span of layers (default);\n"
    "                         none: -mg's GPU alone\n"
    "  -ts, --tensor-split A,B  the spans' proportions, one a GPU (default: free memory)\n"
    "  -mg, --main-gpu N      split-mode none's GPU, an index into -dev's list (default 0)\n"
    "  --moe-cache MIB|auto|A,B  VRAM for the most used experts of the layers whose experts are\n"
    "                         in RAM, split evenly over those layers (auto: what is free; A,B:\n"
    "                         each GPU's)\n"
    "  --moe-learn FILE       learn file (tiermoe trace): the cache is planned from it and its\n"
    "                         policies start from its counts (default: the lowest expert ids)\n"
    "  --moe-cache-plan FILE  the cache holds this plan's experts (tiermoe plan; its size is the\n"
    "                         plan's, --moe-cache not needed)\n"
    "  --moe-cache-weighting flat|pressure|smooth_pressure|time|balanced  how the plan made at\n"
    "                         load weighs layers (default flat), --moe-cache-curve X its curve\n"
    "  --moe-cache-update update|full|off  update (default): weak slots are exchanged between\n"
    "                         requests; full: also the cache policy admits routed experts after\n"
    "                         each step; off: the planned experts stay\n"
    "  --moe-cache-policy adaptive|lru|lfu|static  the policy of 'full' (default adaptive)\n"
    "  --moe-cache-admit N    uploads a layer a step at most (default 1; 0: no cap)\n"
    "  --moe-pcie N|auto|off  of each decode token's experts in RAM, the GPU reads the first N\n"
    "                         over PCIe (pinned in place) while the CPU computes the rest\n"
    "                         (auto: the calibration's share to start, then the fastest of\n"
    "                         the counts the first decode steps time)\n"
    "  --moe-fetch auto|copy|pcie|off  prompts: the GPU computes experts in RAM, copied into a\n"
    "                         VRAM ring ahead of routing (copy) or read in place (pcie), while\n"
    "                         the CPU lane takes a balanced share (auto: copy when a batch uses\n"
    "                         nearly every expert, else pcie; off: the CPU computes them)\n"
    "  --moe-ahead N|auto|off decode: while a layer runs, the GPU predicts the next layer's\n"
    "                         experts (its router on this layer's input) and copies up to N\n"
    "                         of the cold ones to VRAM, computing them there; with --moe-cache\n"
    "                         into its least recently used slots, its updates then off (auto: 1\n"
    "                         with a cache whose --moe-cache-update is the default, and then\n"
    "                         --moe-pcie auto is off; else off)\n"
    "  --ram-cache MIB|auto   the SSD tier: experts in RAM are read from the file (O_DIRECT,\n"
    "                         io_uring) into a RAM cache of this size instead of the page cache\n"
    "                         (auto: available RAM less a reserve), pinned when prompts copy\n"
    "                         their routed experts from it to the GPU (--moe-fetch auto|copy);\n"
    "                         decode's PCIe lane and copies ahead are off with it\n";

/* A flag's N|auto|off value (N from 0 to max, 0 meaning off as TM_OFF) into
 * *out; -1 after a message naming the flag. */
static int cli_place_count(const char *cmd, const char *flag, const char *v, int64_t max,
                           int32_t *out) {
    long long n = 0;
    if (!strcmp(v, "auto"))
        *out = TM_AUTO;
    else if (!strcmp(v, "off"))
        *out = TM_OFF;
    else if (cli_parse_i64(flag, v, 0, max, &n)) {
        fprintf(stderr, "tiermoe %s: %s: or 'auto' or 'off'\n", cmd, flag);
        return -1;
    } else {
        *out = n ? (int32_t)n : TM_OFF;
    }
    return 0;
}

/* What the library checks of one field, set alone in o (the others at their
 * defaults): 0, or -1 after a message naming cmd and the flag. */
static int cli_place_check(const char *cmd, const char *flag, const tm_context_opts *o) {
    if (tm_context_opts_check(o) == TM_OK) return 0;
    fprintf(stderr, "tiermoe %s: %s: %s\n", cmd, flag, tm_error_message());
    return -1;
}

int cli_place_parse(cli_place *p, const char *cmd, int argc, char **argv, int i) {
    const char *a = argv[i];
    tm_context_opts *o = p->o;
    if (!strcmp(a, "-cmoe") || !strcmp(a, "--cpu-moe")) {
        o->cpu_moe = true;
        return 1;
    }
    const bool ours =
        !strcmp(a, "-ngl") || !strcmp(a, "--n-gpu-layers") || !strcmp(a, "-ncmoe") ||
        !strcmp(a, "--n-cpu-moe") || !strcmp(a, "-ot") || !strcmp(a, "--override-tensor") ||
        !strcmp(a, "--moe-cache") || !strcmp(a, "--moe-learn") || !strcmp(a, "--moe-pcie") ||
        !strcmp(a, "--moe-fetch") || !strcmp(a, "--moe-ahead") || !strncmp(a, "--moe-cache-", 12) ||
        !strcmp(a, "--ram-cache") || !strcmp(a, "-dev") || !strcmp(a, "--device") ||
        !strcmp(a, "-sm") || !strcmp(a, "--split-mode") || !strcmp(a, "-ts") ||
        !strcmp(a, "--tensor-split") || !strcmp(a, "-mg") || !strcmp(a, "--main-gpu");
    if (!ours) return 0;
    if (i + 1 >= argc) {
        fprintf(stderr, "tiermoe %s: %s needs a value\n", cmd, a);
        return -1;
    }
    const char *v = argv[i + 1];
    long long n;
    if (!strcmp(a, "-ngl") || !strcmp(a, "--n-gpu-layers")) {
        if (cli_parse_ngl(a, v, &p->ngl)) return -1;
        p->ngl_given = true;
    } else if (!strcmp(a, "-ncmoe") || !strcmp(a, "--n-cpu-moe")) {
        if (cli_parse_i64(a, v, 0, 1 << 20, &n)) return -1;
        o->n_cpu_moe = (int32_t)n;
    } else if (!strcmp(a, "-ot") || !strcmp(a, "--override-tensor")) {
        tm_context_opts one;
        tm_context_opts_init(&one);
        one.override_tensor = v;
        if (cli_place_check(cmd, a, &one)) return -1;
        /* several -ot flags: one list, in order */
        const size_t old = p->overrides ? strlen(p->overrides) : 0;
        char *s = realloc(p->overrides, old + strlen(v) + 2);
        if (!s) return -1;
        sprintf(s + old, "%s%s", old ? "," : "", v);
        o->override_tensor = p->overrides = s;
    } else if (!strcmp(a, "-dev") || !strcmp(a, "--device") || !strcmp(a, "-ts") ||
               !strcmp(a, "--tensor-split") || (!strcmp(a, "--moe-cache") && strchr(v, ','))) {
        tm_context_opts one = *o; /* with this flag's value, checked before it is taken */
        if (!strcmp(a, "-dev") || !strcmp(a, "--device"))
            one.devices = v;
        else if (!strcmp(a, "-ts") || !strcmp(a, "--tensor-split"))
            one.tensor_split = v;
        else
            one.moe_cache_gpus = v;
        if (cli_place_check(cmd, a, &one)) return -1;
        *o = one;
    } else if (!strcmp(a, "-sm") || !strcmp(a, "--split-mode")) {
        if (!strcmp(v, "layer") || !strcmp(v, "none")) {
            o->split_mode = !strcmp(v, "layer") ? TM_SPLIT_LAYER : TM_SPLIT_NONE;
        } else {
            fprintf(stderr, "tiermoe %s: %s '%s': expected layer or none%s\n", cmd, a, v,
                    strcmp(v, "row") ? "" : " (row: not supported)");
            return -1;
        }
    } else if (!strcmp(a, "-mg") || !strcmp(a, "--main-gpu")) {
        if (cli_parse_i64(a, v, 0, TM_MAX_GPUS - 1, &n)) return -1;
        o->main_gpu = (int32_t)n;
    } else if (!strcmp(a, "--moe-cache")) {
        o->moe_cache_gpus = NULL;
        if (!strcmp(v, "auto"))
            o->moe_cache_mib = TM_AUTO;
        else if (cli_parse_i64(a, v, 0, 1ll << 30, &n)) {
            fprintf(stderr, "tiermoe %s: --moe-cache: or 'auto' (the free VRAM)\n", cmd);
            return -1;
        } else {
            o->moe_cache_mib = n;
        }
    } else if (!strcmp(a, "--ram-cache")) {
        if (!strcmp(v, "auto"))
            o->ram_cache_mib = TM_AUTO;
        else if (cli_parse_i64(a, v, 1, 1ll << 30, &n)) {
            fprintf(stderr, "tiermoe %s: --ram-cache: MiB (at least 1) or 'auto'\n", cmd);
            return -1;
        } else {
            o->ram_cache_mib = n;
        }
    } else if (!strcmp(a, "--moe-pcie")) {
        if (cli_place_count(cmd, a, v, TM_MOE_PCIE_MAX, &o->moe_pcie)) return -1;
    } else if (!strcmp(a, "--moe-ahead")) {
        if (cli_place_count(cmd, a, v, TM_MOE_AHEAD_MAX, &o->moe_ahead)) return -1;
    } else if (!strcmp(a, "--moe-fetch")) {
        static const char *const names[] = {"auto", "copy", "pcie", "off"};
        static const int32_t modes[] = {TM_AUTO, TM_FETCH_COPY, TM_FETCH_PCIE, TM_OFF};
        int k = 0;
        while (k < 4 && strcmp(v, names[k])) k++;
        if (k == 4) {
            fprintf(stderr, "tiermoe %s: --moe-fetch: expected auto, copy, pcie or off, got '%s'\n",
                    cmd, v);
            return -1;
        }
        o->moe_fetch = modes[k];
    } else if (!strcmp(a, "--moe-cache-plan")) {
        o->moe_cache_plan = v;
    } else if (!strcmp(a, "--moe-cache-weighting") || !strcmp(a, "--moe-cache-policy")) {
        const bool weighting = !strcmp(a, "--moe-cache-weighting");
        tm_context_opts one;
        tm_context_opts_init(&one);
        *(weighting ? &one.moe_cache_weighting : &one.moe_cache_policy) = v;
        if (cli_place_check(cmd, a, &one)) return -1;
        *(weighting ? &o->moe_cache_weighting : &o->moe_cache_policy) = v;
    } else if (!strcmp(a, "--moe-cache-curve")) {
        if (cli_parse_f64(a, v, 0, TM_MOE_CACHE_CURVE_MAX, &o->moe_cache_curve)) return -1;
    } else if (!strcmp(a, "--moe-cache-update")) {
        static const char *const names[] = {"full", "update", "off"};
        int k = 0;
        while (k < 3 && strcmp(v, names[k])) k++;
        if (k == 3) {
            fprintf(stderr, "tiermoe %s: %s: expected full, update or off, got '%s'\n", cmd, a, v);
            return -1;
        }
        static const int32_t modes[] = {TM_CACHE_UPDATE_FULL, TM_CACHE_UPDATE_BETWEEN, TM_OFF};
        o->moe_cache_update = modes[k];
    } else if (!strcmp(a, "--moe-cache-admit")) {
        if (cli_parse_i64(a, v, 0, 1 << 20, &n)) return -1;
        o->moe_cache_admit = n ? (int32_t)n : TM_OFF;
    } else if (!strcmp(a, "--moe-learn")) {
        o->moe_learn = v;
    } else {
        fprintf(stderr, "tiermoe %s: unknown flag %s\n", cmd, a);
        return -1;
    }
    return 2;
}

void cli_place_finish(cli_place *p, const char *cmd) {
    tm_context_opts *o = p->o;
    const bool cache = o->moe_cache_mib != 0 || o->moe_cache_gpus || o->moe_cache_plan;
    const bool experts = o->cpu_moe || o->n_cpu_moe > 0 || cache;
    o->n_gpu_layers = p->ngl_given || !experts ? p->ngl : TM_AUTO;
    if (o->moe_learn && !cache)
        fprintf(stderr, "tiermoe %s: --moe-learn is used with --moe-cache; ignored\n", cmd);
}

void cli_place_free(cli_place *p) {
    free(p->overrides);
    p->overrides = NULL;
}
