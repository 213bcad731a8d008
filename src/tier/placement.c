/* Placement: one device per tensor from -ngl, --cpu-moe, --n-cpu-moe and -ot
 * (the rules are in placement.h and docs/executor.md, "Placement").
 *
 * The overrides form one list of rules, tried in order: the -ot items as
 * written, then --n-cpu-moe's and --cpu-moe's. Which rule a tensor matches
 * first does not depend on -ngl, so it is found once per tensor; a placement
 * for a layer count N is then one pass over the tensors (the rule's device, or
 * the default home for N) followed by the expert-triple fix. -ngl auto runs
 * such passes in a binary search over N: moving N up only moves default homes
 * from the CPU to the GPU, so the GPU's bytes never shrink as N grows. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tier/placement.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/log.h"

/* Layer numbers above this are not layers (placement_tensor_layer), so no model
 * may have more. */
#define MAX_LAYER 1000000

/* --cpu-moe's pattern (llama.cpp's; gate_up: the fused experts of Gemma 4's files).
 * --n-cpu-moe N stands for N patterns blk\.i\.ffn_(up|down|gate|gate_up)_(ch|)exps, i < N; for GGUF's names that is this
 * pattern and a layer below N, which does not compile N patterns (N may be
 * anything the user typed). */
#define CPU_MOE_PATTERN "\\.ffn_(up|down|gate|gate_up)_(ch|)exps"

#define OT_FLAG "-ot"

typedef enum rule_kind { RULE_OT, RULE_N_CPU_MOE, RULE_CPU_MOE } rule_kind;

typedef struct rule {
    pcre2_code *re;
    tm_dev dev;
    rule_kind kind;
    const char *item; /* the -ot item as written (not terminated: item_len) */
    size_t item_len;
    int below;        /* RULE_N_CPU_MOE: layers below this */
    int cuda;         /* dev TM_DEV_GPU: the CUDA index the item names (CUDAn) */
    int slot;         /* and its place in the GPU list (placement_run) */
    uint64_t n_match; /* tensors whose name it matches (first or not) */
    uint64_t n_win;   /* tensors it places (the first rule to match them) */
} rule;

typedef struct rules {
    rule *r;
    size_t n, cap;
} rules;

static void rules_free(rules *rs) {
    for (size_t i = 0; i < rs->n; i++) pcre2_code_free(rs->r[i].re);
    free(rs->r);
    memset(rs, 0, sizeof(*rs));
}

/* An item's length as printf's precision (error messages cut longer ones anyway). */
static int prec(size_t len) {
    return len > INT_MAX ? INT_MAX : (int)len;
}

static tm_status rules_add(rules *rs, const char *flag, const char *item, size_t item_len,
                           const char *pat, size_t pat_len, tm_dev dev, rule_kind kind) {
    if (rs->n == rs->cap) {
        size_t cap = rs->cap ? rs->cap * 2 : 8;
        rule *r = realloc(rs->r, cap * sizeof(*r));
        if (!r) return tm_error_set(TM_ERR_NOMEM, "%s: out of memory", flag);
        rs->r = r, rs->cap = cap;
    }
    int err;
    PCRE2_SIZE off;
    /* MATCH_INVALID_UTF: a tensor name that is not UTF-8 can match in its valid
     * parts instead of failing the match (names come from the file). No JIT: a pattern
     * runs once per tensor name, once per context; compiling it would cost
     * more than it saves. */
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pat, pat_len, PCRE2_UTF | PCRE2_MATCH_INVALID_UTF,
                                   &err, &off, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        if (pcre2_get_error_message(err, msg, sizeof(msg)) < 0)
            strcpy((char *)msg, "unknown error");
        return tm_error_set(TM_ERR_ARG, "%s '%.*s': invalid regular expression at offset %zu: %s",
                            flag, prec(item_len), item, (size_t)off, (const char *)msg);
    }
    rule *r = &rs->r[rs->n++];
    memset(r, 0, sizeof(*r));
    r->re = re, r->dev = dev, r->kind = kind, r->item = item, r->item_len = item_len;
    return TM_OK;
}

/* One -ot item, PATTERN=DEV. Split at the last '=': device names have none,
 * so a pattern may (a lookahead "(?=...)"). */
static tm_status rules_add_item(rules *rs, const char *flag, const char *item, size_t len) {
    const char *eq = memrchr(item, '=', len);
    if (!eq)
        return tm_error_set(TM_ERR_ARG, "%s '%.*s': expected PATTERN=BUFFER_TYPE", flag, prec(len),
                            item);
    size_t pat_len = (size_t)(eq - item), dev_len = len - pat_len - 1;
    if (pat_len == 0)
        return tm_error_set(TM_ERR_ARG, "%s '%.*s': empty pattern (expected PATTERN=BUFFER_TYPE)",
                            flag, prec(len), item);
    int dev = -1, cuda = 0;
    const char *d = eq + 1;
    if (dev_len == 3 && !strncasecmp(d, "CPU", 3)) {
        dev = TM_DEV_CPU;
    } else if (dev_len > 4 && dev_len <= 7 && !strncasecmp(d, "CUDA", 4)) { /* CUDA0 .. CUDA999 */
        dev = TM_DEV_GPU;
        for (size_t i = 4; i < dev_len && dev >= 0; i++)
            if (d[i] >= '0' && d[i] <= '9')
                cuda = cuda * 10 + (d[i] - '0');
            else
                dev = -1;
    }
    if (dev < 0)
        return tm_error_set(TM_ERR_ARG,
                            "%s '%.*s': unknown buffer type '%.*s' (expected CPU or CUDA0, "
                            "CUDA1, ...)",
                            flag, prec(len), item, prec(dev_len), d);
    tm_status st = rules_add(rs, flag, item, len, item, pat_len, (tm_dev)dev, RULE_OT);
    if (st == TM_OK) rs->r[rs->n - 1].cuda = cuda;
    return st;
}

/* The -ot items of spec, in order. Items point into spec. */
static tm_status rules_parse(rules *rs, const char *flag, const char *spec) {
    if (!spec || !spec[0]) return TM_OK;
    size_t n = strlen(spec);
    for (size_t s = 0;;) {
        const char *comma = memchr(spec + s, ',', n - s);
        size_t e = comma ? (size_t)(comma - spec) : n;
        if (e == s)
            return tm_error_set(TM_ERR_ARG,
                                "%s '%s': empty item at offset %zu (expected "
                                "PATTERN=BUFFER_TYPE[,PATTERN=BUFFER_TYPE...])",
                                flag, spec, s);
        tm_status st = rules_add_item(rs, flag, spec + s, e - s);
        if (st != TM_OK) return st;
        if (!comma) return TM_OK;
        s = e + 1;
    }
}

/* How warnings name the flag behind a rule. */
static void rule_describe(const rule *r, char *buf, size_t n) {
    if (r->kind == RULE_OT)
        snprintf(buf, n, "%s '%.*s'", OT_FLAG, prec(r->item_len), r->item);
    else if (r->kind == RULE_N_CPU_MOE)
        snprintf(buf, n, "--n-cpu-moe %d", r->below);
    else
        snprintf(buf, n, "--cpu-moe");
}

tm_status placement_overrides_check(const char *flag, const char *spec) {
    rules rs = {0};
    tm_status st = rules_parse(&rs, flag ? flag : OT_FLAG, spec);
    rules_free(&rs);
    return st;
}

int placement_tensor_layer(const char *name, size_t len) {
    if (!name || len < 6 || memcmp(name, "blk.", 4)) return -1;
    long v = 0;
    size_t i = 4;
    for (; i < len && name[i] >= '0' && name[i] <= '9'; i++) {
        v = v * 10 + (name[i] - '0');
        if (v > MAX_LAYER) return -1;
    }
    return i > 4 && i < len && name[i] == '.' ? (int)v : -1;
}

bool placement_tensor_is_expert(const char *name, size_t len) {
    return placement_tensor_layer(name, len) >= 0 &&
           (memmem(name, len, "_exps", 5) || memmem(name, len, "_chexps", 7));
}

/* ---- placing ---- */

/* T_UNRUN: a tensor of a layer at or past n_layer, which the model does not run
 * (GLM-4.5's NextN layer): it stays in the mapped file, whatever the flags. */
typedef enum tensor_kind { T_LAYER, T_EXPERT, T_EMBD, T_OTHER, T_UNRUN } tensor_kind;

/* What placement_make knows about the file before choosing N. */
typedef struct plan {
    const tm_gguf_file *f;
    uint32_t n_layer;
    const rules *rs;
    int32_t *win;        /* [n_tensors] the first rule to match the tensor, or -1 */
    int32_t *layer;      /* [n_tensors] its layer, or -1 (none, or >= n_layer) */
    uint8_t *kind;       /* [n_tensors] tensor_kind */
    uint16_t *seen;      /* [n_layer] where the layer's expert tensors are: bit 0 the CPU,
                            bit 1 + g GPU g */
    int32_t *split_rule; /* [n_layer] a rule that placed one of the layer's experts, or -1 */
    bool tied;           /* no output.weight: token_embd is the output head */
    int n_gpu;           /* the GPU list: gpus[0 .. n_gpu) */
    const tm_placement_gpu *gpus;
    int cuda[TM_MAX_GPUS];   /* their CUDA indices */
    float prop[TM_MAX_GPUS]; /* the spans' proportions */
} plan;

static bool name_is(const tm_gguf_str *s, const char *lit) {
    size_t n = strlen(lit);
    return s->len == n && !memcmp(s->data, lit, n);
}

static size_t add_sat(size_t a, size_t b) {
    return a > SIZE_MAX - b ? SIZE_MAX : a + b;
}

/* Match every tensor against every rule (counting matches for the warning on
 * an item that matches nothing) and keep the first. */
static tm_status plan_match(plan *pl, pcre2_match_data *md) {
    const tm_gguf_file *f = pl->f;
    pl->tied = true;
    for (uint64_t t = 0; t < f->n_tensors; t++) {
        const tm_gguf_str *nm = &f->tensors[t].name;
        const char *name = nm->len ? nm->data : ""; /* PCRE2 refuses a NULL subject */
        int l = placement_tensor_layer(name, nm->len);
        const bool unrun = l >= (int64_t)pl->n_layer;
        if (unrun) l = -1;
        pl->layer[t] = l;
        if (l >= 0)
            pl->kind[t] = placement_tensor_is_expert(name, nm->len) ? T_EXPERT : T_LAYER;
        else
            pl->kind[t] = unrun ? T_UNRUN : name_is(nm, "token_embd.weight") ? T_EMBD : T_OTHER;
        if (name_is(nm, "output.weight")) pl->tied = false;
        pl->win[t] = -1;
        for (size_t i = 0; i < pl->rs->n; i++) {
            rule *r = &pl->rs->r[i];
            if (r->kind == RULE_N_CPU_MOE && (l < 0 || l >= r->below)) continue;
            int rc = pcre2_match(r->re, (PCRE2_SPTR)name, nm->len, 0, 0, md, NULL);
            if (rc == PCRE2_ERROR_NOMATCH) continue;
            if (rc < 0) { /* a limit hit by a pathological pattern: no silent "no match" */
                PCRE2_UCHAR msg[256];
                if (pcre2_get_error_message(rc, msg, sizeof(msg)) < 0)
                    strcpy((char *)msg, "unknown error");
                char desc[256];
                rule_describe(r, desc, sizeof(desc));
                return tm_error_set(TM_ERR_ARG, "%s: matching tensor '%.*s' failed: %s", desc,
                                    prec(nm->len), name, (const char *)msg);
            }
            r->n_match++;
            if (pl->win[t] < 0) pl->win[t] = (int32_t)i, r->n_win++;
        }
    }
    return TM_OK;
}

/* A device's name in messages: CPU, or CUDAn of GPU g (bit 1 + g of a seen mask). */
static void dev_name(const plan *pl, int bit, char *buf, size_t n) {
    if (bit == 0)
        snprintf(buf, n, "%s", tm_dev_names[TM_DEV_CPU]);
    else
        snprintf(buf, n, "CUDA%d", pl->cuda[bit - 1]);
}

/* Place every tensor for layers < n on the GPUs, in spans (all_gpu: every layer, so the
 * output head too) into out; returns the GPUs' bytes. warn: log split experts (only the
 * final pass does). */
static size_t plan_apply(plan *pl, uint32_t n, bool all_gpu, tm_placement *out, bool warn) {
    const tm_gguf_file *f = pl->f;
    gpus_spans_make(pl->n_gpu, pl->prop, n, out->span_first);
    for (int g = pl->n_gpu + 1; g <= TM_MAX_GPUS; g++) out->span_first[g] = n;
    for (uint32_t l = 0; l < pl->n_layer; l++) {
        out->layer_dev[l] = l < n ? TM_DEV_GPU : TM_DEV_CPU;
        int g = 0;
        while (l < n && g + 1 < pl->n_gpu && l >= out->span_first[g + 1]) g++;
        out->layer_gpu[l] = (uint8_t)g;
        pl->seen[l] = 0;
        pl->split_rule[l] = -1;
    }
    /* the output head and what is not a layer's: the last span's GPU */
    const int out_gpu = n > 0 ? out->layer_gpu[n - 1] : 0;
    for (uint64_t t = 0; t < f->n_tensors; t++) {
        int l = pl->layer[t], w = pl->win[t];
        tm_dev home;
        int home_gpu = l >= 0 ? out->layer_gpu[l] : out_gpu;
        if (l >= 0)
            home = (tm_dev)out->layer_dev[l];
        else if (pl->kind[t] == T_EMBD && !pl->tied)
            home = TM_DEV_CPU; /* a row lookup per token: nothing to gain on the GPU */
        else
            home = all_gpu ? TM_DEV_GPU : TM_DEV_CPU;
        tm_dev d = pl->kind[t] == T_UNRUN ? TM_DEV_CPU : w >= 0 ? pl->rs->r[w].dev : home;
        const int gpu = w >= 0 && d == TM_DEV_GPU ? pl->rs->r[w].slot : home_gpu;
        out->tensor_dev[t] = (uint8_t)d;
        out->tensor_gpu[t] = (uint8_t)(d == TM_DEV_GPU ? gpu : 0);
        if (pl->kind[t] == T_EXPERT) {
            pl->seen[l] |= (uint16_t)(1u << (d == TM_DEV_GPU ? 1 + gpu : 0));
            if (w >= 0 && pl->split_rule[l] < 0) pl->split_rule[l] = w;
        }
    }
    for (uint32_t l = 0; l < pl->n_layer; l++) {
        /* The tier computes an expert in one place: a split layer's go to the CPU. */
        const uint16_t s = pl->seen[l];
        const bool split = s & (s - 1);
        out->experts_dev[l] = split || s == 1 ? TM_DEV_CPU : s ? TM_DEV_GPU : out->layer_dev[l];
        int eg = out->layer_gpu[l];
        for (int b = 1; !split && b <= pl->n_gpu; b++)
            if (s == 1u << b) eg = b - 1;
        out->experts_gpu[l] = (uint8_t)(out->experts_dev[l] == TM_DEV_GPU ? eg : 0);
        if (warn && split) {
            char desc[256] = "the overrides"; /* a split needs a rule: defaults are per layer */
            if (pl->split_rule[l] >= 0)
                rule_describe(&pl->rs->r[pl->split_rule[l]], desc, sizeof(desc));
            int b0 = 0;
            while (!(s & (1u << b0))) b0++;
            int b1 = b0 + 1;
            while (!(s & (1u << b1))) b1++;
            char n0[16], n1[16];
            dev_name(pl, b0, n0, sizeof(n0));
            dev_name(pl, b1, n1, sizeof(n1));
            tm_log_warn("layer %u: %s splits the layer's expert tensors between %s and %s: all of "
                        "them go to the %s (an expert is computed in one place)",
                        l, desc, n0, n1, tm_dev_names[TM_DEV_CPU]);
        }
    }
    size_t bytes = 0;
    bool any = n > 0;
    memset(out->gpu_bytes_each, 0, sizeof(out->gpu_bytes_each));
    for (uint64_t t = 0; t < f->n_tensors; t++) {
        if (pl->kind[t] == T_EXPERT) {
            out->tensor_dev[t] = out->experts_dev[pl->layer[t]];
            out->tensor_gpu[t] = out->experts_gpu[pl->layer[t]];
        }
        if (out->tensor_dev[t] == TM_DEV_GPU) {
            bytes = add_sat(bytes, f->tensors[t].n_bytes);
            size_t *each = &out->gpu_bytes_each[out->tensor_gpu[t]];
            *each = add_sat(*each, f->tensors[t].n_bytes);
            any = true;
        }
    }
    out->n_gpu_used = 0;
    for (int g = 0; g < pl->n_gpu; g++) {
        bool used = out->gpu_bytes_each[g] > 0;
        for (uint32_t l = 0; l < n && !used; l++) used = out->layer_gpu[l] == g;
        out->n_gpu_used += used;
    }
    out->n_gpu_layers = (int)n;
    out->output_gpu = all_gpu;
    out->output_gpu_index = out_gpu;
    out->any_gpu = any;
    out->gpu_bytes = bytes;
    return bytes;
}

/* What each GPU needs with layers < n there (need[g]): tensors, their KV caches, and the
 * fixed part once anything is there. Returns whether every GPU's fits its budget. */
static bool plan_need(plan *pl, uint32_t n, tm_placement *out, size_t *need) {
    plan_apply(pl, n, n > 0 && n == pl->n_layer, out, false);
    bool fits = true;
    for (int g = 0; g < pl->n_gpu; g++) {
        const tm_placement_gpu *gp = &pl->gpus[g];
        size_t b = out->gpu_bytes_each[g];
        bool used = b > 0;
        for (uint32_t l = 0; l < n; l++) {
            if (out->layer_gpu[l] != g) continue;
            b = add_sat(b, gp->kv_bytes_layer ? gp->kv_bytes_layer[l] : gp->kv_bytes_per_layer);
            used = true;
        }
        need[g] = used ? add_sat(b, gp->fixed_bytes) : b;
        fits &= need[g] <= gp->budget;
    }
    return fits;
}

static double mib(size_t b) {
    return (double)b / (1024.0 * 1024.0);
}

/* One line of -ngl auto's: each GPU's need and budget. */
static void plan_auto_log(const plan *pl, uint32_t n, const size_t *need) {
    char line[512] = "";
    size_t k = 0;
    for (int g = 0; g < pl->n_gpu && k < sizeof(line); g++)
        k += (size_t)snprintf(line + k, sizeof(line) - k, "%sCUDA%d %.1f of %.1f MiB",
                              g ? ", " : "", pl->cuda[g], mib(need[g]), mib(pl->gpus[g].budget));
    tm_log_info("-ngl auto: %u of %u layers on %d GPUs (%s)", n, pl->n_layer, pl->n_gpu, line);
}

/* -ngl auto: the most layers that fit (0 when none does). One GPU: a binary search
 * (its bytes never shrink as n grows); several: from the top down, since moving a span
 * boundary can shrink one GPU's bytes while another's grow. */
static uint32_t plan_auto(plan *pl, tm_placement *out) {
    size_t need[TM_MAX_GPUS];
    uint32_t lo = 0;
    if (pl->n_gpu == 1) {
        uint32_t hi = pl->n_layer;
        while (lo < hi) { /* the answer is in [lo, hi] */
            uint32_t mid = lo + (hi - lo + 1) / 2;
            if (plan_need(pl, mid, out, need))
                lo = mid;
            else
                hi = mid - 1;
        }
    } else {
        for (lo = pl->n_layer; lo > 0 && !plan_need(pl, lo, out, need); lo--) {
        }
    }
    const tm_placement_gpu *g = &pl->gpus[0];
    if (lo == 0 && pl->n_layer > 0) {
        plan_need(pl, 1, out, need);
        const size_t one = need[0];
        plan_apply(pl, 0, false, out, false);
        tm_log_info("-ngl auto: the GPU is too small for one layer (%.1f MiB needed, %.1f MiB "
                    "budget): %s",
                    mib(one), mib(g->budget),
                    out->any_gpu ? "the layers run on the CPU" : "running on the CPU only");
    } else if (pl->n_layer > 0) {
        plan_need(pl, lo, out, need);
        if (pl->n_gpu == 1)
            tm_log_info("-ngl auto: %u of %u layers on the GPU (%.1f MiB of a %.1f MiB budget)", lo,
                        pl->n_layer, mib(need[0]), mib(g->budget));
        else
            plan_auto_log(pl, lo, need);
    }
    return lo;
}

void placement_free(tm_placement *pl) {
    if (!pl) return;
    free(pl->tensor_dev);
    free(pl->layer_dev);
    free(pl->experts_dev);
    free(pl->tensor_gpu);
    free(pl->layer_gpu);
    free(pl->experts_gpu);
    memset(pl, 0, sizeof(*pl));
}

/* The checks that need the rules' matches but not N. */
static tm_status plan_check(const plan *pl, const tm_placement_params *p,
                            const tm_placement_gpu *g) {
    const char *why = g && g->why ? g->why : "none was given";
    bool usable = g && g->usable;
    if (!usable && p->n_gpu_layers > 0)
        return tm_error_set(TM_ERR_DEVICE, "-ngl %d: no usable GPU (%s)", p->n_gpu_layers, why);
    for (size_t i = 0; i < pl->rs->n; i++) {
        const rule *r = &pl->rs->r[i];
        if (!usable && r->dev == TM_DEV_GPU && r->n_win)
            return tm_error_set(TM_ERR_DEVICE,
                                "%s '%.*s': CUDA%d requested, but no usable GPU (%s)", OT_FLAG,
                                prec(r->item_len), r->item, r->cuda, why);
        if (usable && r->dev == TM_DEV_GPU && r->slot < 0) {
            char list[128] = "";
            size_t k = 0;
            for (int k2 = 0; k2 < pl->n_gpu && k < sizeof(list); k2++)
                k += (size_t)snprintf(list + k, sizeof(list) - k, "%sCUDA%d", k2 ? "," : "",
                                      pl->cuda[k2]);
            return tm_error_set(TM_ERR_DEVICE,
                                "%s '%.*s': CUDA%d is not one of the GPUs used (%s; -dev sets "
                                "them)",
                                OT_FLAG, prec(r->item_len), r->item, r->cuda, list);
        }
    }
    for (size_t i = 0; i < pl->rs->n; i++) {
        const rule *r = &pl->rs->r[i];
        if (r->kind == RULE_OT && !r->n_match)
            tm_log_warn("%s '%.*s' matches no tensor of %s", OT_FLAG, prec(r->item_len), r->item,
                        pl->f->path ? pl->f->path : "the model");
    }
    if (!usable && (p->n_gpu_layers == TM_NGL_AUTO || p->cpu_moe || p->n_cpu_moe > 0))
        tm_log_info("no usable GPU (%s): running on the CPU", why);
    return TM_OK;
}

static tm_status placement_run(const tm_gguf_file *f, uint32_t n_layer,
                               const tm_placement_params *p, const tm_placement_gpu *g,
                               tm_placement *out, rules *rs, plan *pl) {
    tm_status st = rules_parse(rs, OT_FLAG, p->overrides);
    if (st != TM_OK) return st;
    static const char cpu_moe[] = CPU_MOE_PATTERN;
    if (p->n_cpu_moe > 0) {
        st = rules_add(rs, "--n-cpu-moe", cpu_moe, sizeof(cpu_moe) - 1, cpu_moe,
                       sizeof(cpu_moe) - 1, TM_DEV_CPU, RULE_N_CPU_MOE);
        if (st != TM_OK) return st;
        rs->r[rs->n - 1].below = p->n_cpu_moe;
    }
    if (p->cpu_moe) {
        st = rules_add(rs, "--cpu-moe", cpu_moe, sizeof(cpu_moe) - 1, cpu_moe, sizeof(cpu_moe) - 1,
                       TM_DEV_CPU, RULE_CPU_MOE);
        if (st != TM_OK) return st;
    }
    size_t nt = f->n_tensors ? (size_t)f->n_tensors : 1, nl = n_layer ? n_layer : 1;
    out->tensor_dev = calloc(nt, 1);
    out->layer_dev = calloc(nl, 1);
    out->experts_dev = calloc(nl, 1);
    out->tensor_gpu = calloc(nt, 1);
    out->layer_gpu = calloc(nl, 1);
    out->experts_gpu = calloc(nl, 1);
    pl->win = calloc(nt, sizeof(int32_t));
    pl->layer = calloc(nt, sizeof(int32_t));
    pl->kind = calloc(nt, 1);
    pl->seen = calloc(nl, sizeof(uint16_t));
    pl->split_rule = calloc(nl, sizeof(int32_t));
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    if (!out->tensor_dev || !out->layer_dev || !out->experts_dev || !out->tensor_gpu ||
        !out->layer_gpu || !out->experts_gpu || !pl->win || !pl->layer || !pl->kind || !pl->seen ||
        !pl->split_rule || !md) {
        pcre2_match_data_free(md);
        return tm_error_set(TM_ERR_NOMEM, "placement: out of memory for %u tensors, %u layers",
                            out->n_tensors, n_layer);
    }
    pl->f = f, pl->n_layer = n_layer, pl->rs = rs;
    pl->n_gpu = p->n_gpu > 1 ? p->n_gpu : 1;
    pl->gpus = g;
    out->n_gpu = pl->n_gpu;
    for (int i = 0; i < pl->n_gpu; i++) {
        pl->cuda[i] = p->gpu_cuda ? p->gpu_cuda[i] : i;
        pl->prop[i] = p->split ? p->split[i] : (float)mib(g[i].budget);
    }
    for (size_t i = 0; i < rs->n; i++) {
        rs->r[i].slot = -1;
        for (int k = 0; k < pl->n_gpu; k++)
            if (rs->r[i].dev == TM_DEV_GPU && rs->r[i].cuda == pl->cuda[k]) rs->r[i].slot = k;
    }
    st = plan_match(pl, md);
    pcre2_match_data_free(md);
    if (st != TM_OK) return st;
    if ((st = plan_check(pl, p, g)) != TM_OK) return st;

    uint32_t n = 0;
    bool all_gpu = false;
    if (g && g->usable && p->n_gpu_layers == TM_NGL_AUTO) {
        n = plan_auto(pl, out);
        all_gpu = n > 0 && n == n_layer;
    } else if (g && g->usable && p->n_gpu_layers > 0) {
        n = (uint32_t)p->n_gpu_layers < n_layer ? (uint32_t)p->n_gpu_layers : n_layer;
        all_gpu = (uint32_t)p->n_gpu_layers >= n_layer;
    }
    plan_apply(pl, n, all_gpu, out, true);
    return TM_OK;
}

tm_status placement_make(const tm_gguf_file *f, uint32_t n_layer, const tm_placement_params *p,
                         const tm_placement_gpu *gpu, tm_placement *out) {
    if (!out) return tm_error_set(TM_ERR_ARG, "placement_make: out is NULL");
    memset(out, 0, sizeof(*out));
    if (!f || !p || (f->n_tensors && !f->tensors))
        return tm_error_set(TM_ERR_ARG, "placement_make: no model file or parameters");
    if (f->n_tensors > UINT32_MAX || n_layer > MAX_LAYER)
        return tm_error_set(TM_ERR_ARG, "placement: %s has %llu tensors and %u layers, too many",
                            f->path ? f->path : "the model", (unsigned long long)f->n_tensors,
                            n_layer);
    if (p->n_gpu_layers < 0 && p->n_gpu_layers != TM_NGL_AUTO)
        return tm_error_set(TM_ERR_ARG, "-ngl %d: expected a number of layers >= 0, or auto",
                            p->n_gpu_layers);
    if (p->n_cpu_moe < 0)
        return tm_error_set(TM_ERR_ARG, "--n-cpu-moe %d: expected a number of layers >= 0",
                            p->n_cpu_moe);
    static const tm_placement_gpu none = {false, "none was given", 0, 0, 0, NULL};
    if (p->n_gpu < 0 || p->n_gpu > TM_MAX_GPUS || (!gpu && p->n_gpu > 1))
        return tm_error_set(TM_ERR_ARG, "placement_make: %d GPUs (0 .. %d, and their budgets)",
                            p->n_gpu, TM_MAX_GPUS);
    if (!gpu) gpu = &none;
    for (int i = 0; p->split && i < p->n_gpu; i++)
        if (!(p->split[i] >= 0))
            return tm_error_set(TM_ERR_ARG, "--tensor-split: proportion %d is %g (expected >= 0)",
                                i, (double)p->split[i]);
    out->n_tensors = (uint32_t)f->n_tensors, out->n_layer = n_layer;
    rules rs = {0};
    plan pl = {0};
    tm_status st = placement_run(f, n_layer, p, gpu, out, &rs, &pl);
    rules_free(&rs);
    free(pl.win);
    free(pl.layer);
    free(pl.kind);
    free(pl.seen);
    free(pl.split_rule);
    if (st != TM_OK) placement_free(out);
    return st;
}
