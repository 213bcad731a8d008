/* Model loading, contexts (placement, executor, tier) and the helpers
 * architecture files share. */
#include "model/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "cpu/cpu_ops.h"

extern const tm_arch tm_arch_qwen3moe, tm_arch_gptoss, tm_arch_qwen3next, tm_arch_qwen35moe,
    tm_arch_mixtral, tm_arch_olmoe, tm_arch_glm4moe, tm_arch_deepseek2, tm_arch_gemma4;

static const tm_arch *const archs[] = {&tm_arch_qwen3moe,  &tm_arch_gptoss,    &tm_arch_qwen3next,
                                       &tm_arch_qwen35moe, &tm_arch_mixtral,   &tm_arch_olmoe,
                                       &tm_arch_glm4moe,   &tm_arch_deepseek2, &tm_arch_gemma4};

/* VRAM left free when sizing -ngl auto and --moe-cache auto: cuBLAS's
 * workspace and handles, the CUDA context, other programs' small needs. */
#define GPU_RESERVE ((size_t)768 << 20)

tm_status model_load(const char *path, tm_model **out) {
    *out = NULL;
    tm_gguf_file *f;
    tm_status st = gguf_file_open(path, &f);
    if (st != TM_OK) return st;
    tm_gguf_str arch;
    if (gguf_file_get_str(f, "general.architecture", &arch) != TM_OK) {
        gguf_file_close(f);
        return tm_error_set(TM_ERR_FORMAT, "%s: missing key general.architecture", path);
    }
    const tm_arch *a = NULL;
    for (size_t i = 0; i < sizeof(archs) / sizeof(archs[0]); i++)
        if (gguf_str_eq(arch, archs[i]->name)) a = archs[i];
    if (!a) {
        tm_error_set(
            TM_ERR_UNSUPPORTED,
            "%s: architecture '%.*s' is not supported (supported: qwen3moe, gpt-oss, qwen3next, "
            "qwen35moe, llama with experts (Mixtral), olmoe, glm4moe, deepseek2, gemma4)",
            path, (int)(arch.len > 64 ? 64 : arch.len), arch.data);
        gguf_file_close(f);
        return TM_ERR_UNSUPPORTED;
    }
    tm_model *m = calloc(1, sizeof(*m));
    if (!m) {
        gguf_file_close(f);
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    }
    m->file = f, m->arch = a;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        m->n_params += (uint64_t)f->tensors[i].n_elements;
        m->weight_bytes += f->tensors[i].n_bytes;
    }
    if ((st = a->load(m)) != TM_OK) {
        model_free(m);
        return st;
    }
    *out = m;
    return TM_OK;
}

void model_free(tm_model *m) {
    if (!m) return;
    if (m->arch && m->weights) m->arch->unload(m);
    free(m->window);
    gguf_file_close(m->file);
    free(m);
}

static tm_status weight_bind(const tm_model *m, const char *name, uint32_t n_dims,
                             const int64_t *ne, tm_weight *w, bool optional) {
    memset(w, 0, sizeof(*w));
    const tm_gguf_tensor *t = gguf_file_find_tensor(m->file, name);
    if (!t) {
        if (optional) return TM_OK;
        return tm_error_set(TM_ERR_FORMAT, "%s: missing tensor '%s'", m->file->path, name);
    }
    char want[96], got[96];
    int nw = 0, ng = 0;
    bool ok = t->n_dims <= 4;
    for (uint32_t d = 0; d < 4; d++) {
        int64_t e = d < n_dims ? ne[d] : 1, g = t->ne[d];
        if (d < t->n_dims)
            ng += snprintf(got + ng, sizeof(got) - (size_t)ng, "%s%lld", d ? " x " : "",
                           (long long)g);
        if (d < n_dims)
            nw += snprintf(want + nw, sizeof(want) - (size_t)nw, "%s%lld", d ? " x " : "",
                           (long long)e);
        if (e != g) ok = false;
    }
    if (!ok)
        return tm_error_set(TM_ERR_FORMAT, "%s: tensor '%s' has shape [%s], expected [%s]",
                            m->file->path, name, got, want);
    /* per tensor: any type the CPU can compute (a dequantizer for the reference
       paths and embedding rows, a product kernel), whatever its neighbours' */
    const tm_type_traits *tr = quant_type_traits(t->type);
    if (!tr || !tr->dequantize || !cpu_gemm_supports((tm_type)t->type))
        return tm_error_set(TM_ERR_UNSUPPORTED,
                            "%s: tensor '%s' has type %s (id %u), which tiermoe cannot compute yet",
                            m->file->path, name, quant_type_name(t->type), (unsigned)t->type);
    w->name = t->name.data, w->name_len = (uint32_t)t->name.len;
    w->id = (int32_t)(t - m->file->tensors);
    w->type = (tm_type)t->type, w->n_dims = t->n_dims;
    for (int d = 0; d < 4; d++) w->ne[d] = t->ne[d];
    w->row_bytes = quant_row_size(w->type, w->ne[0]);
    w->data = t->data;
    return TM_OK;
}

tm_status model_weight_bind(const tm_model *m, const char *name, uint32_t n_dims, const int64_t *ne,
                            tm_weight *w) {
    return weight_bind(m, name, n_dims, ne, w, false);
}

tm_status model_weight_bind_optional(const tm_model *m, const char *name, uint32_t n_dims,
                                     const int64_t *ne, tm_weight *w) {
    return weight_bind(m, name, n_dims, ne, w, true);
}

tm_status model_weight_f32(const tm_model *m, const tm_weight *w) {
    if (!w->data || w->type == TM_TYPE_F32) return TM_OK;
    return tm_error_set(TM_ERR_UNSUPPORTED, "%s: tensor '%.*s' must be f32, is %s", m->file->path,
                        (int)w->name_len, w->name, quant_type_name(w->type));
}

/* ---- contexts ---- */

/* A batch of B rows of every activation, roughly. */
static size_t context_act_bytes(const tm_model_config *cfg, int64_t B) {
    const int64_t E = cfg->n_embd, Q = (int64_t)cfg->n_head * cfg->head_dim,
                  KV = (int64_t)cfg->n_head_kv * cfg->head_dim;
    return (size_t)(B * (6 * E + 2 * Q + 2 * KV + cfg->n_expert + 2 * cfg->n_expert_used)) * 4;
}

/* The GPUs a context may use: params.gpus resolved against the GPUs present, each
 * opened, and what each offers the placement. */
typedef struct context_gpus {
    int n; /* the list's length: 0 when no flag wants a GPU or -dev none */
    int cuda[TM_MAX_GPUS];
    tm_cuda_device *dev[TM_MAX_GPUS];
    tm_placement_gpu g[TM_MAX_GPUS]; /* g[0] says why there is none when n is 0 */
} context_gpus;

static void context_gpus_close(context_gpus *cg) {
    for (int i = 0; i < cg->n; i++) cuda_device_close(cg->dev[i]);
    cg->n = 0;
}

/* What one GPU offers the placement. kv_layer: [n_layer] room for each layer's KV bytes
 * (NULL: every layer's alike). */
static tm_status context_gpu_offer(const tm_context *c, tm_cuda_device *dev, const size_t *kv_layer,
                                   tm_placement_gpu *g) {
    const tm_context_params *p = &c->params;
    const tm_model_config *cfg = &c->model->cfg;
    size_t free_b = 0, total_b = 0;
    tm_status st = cuda_device_memory(dev, &free_b, &total_b);
    if (st != TM_OK) return st;
    const int64_t KV = (int64_t)cfg->n_head_kv * cfg->head_dim;
    memset(g, 0, sizeof(*g));
    g->usable = true;
    g->budget = free_b > GPU_RESERVE ? free_b - GPU_RESERVE : 0;
    const size_t row = (size_t)KV * (p->kv_type == TM_TYPE_F16 ? 2 : 4);
    g->kv_bytes_per_layer = 2 * (size_t)(c->n_ctx * c->n_seq) * row;
    g->kv_bytes_layer = kv_layer;
    /* activations and scratch, roughly: a batch of every activation, 64 rows
     * of logits, tensor-core scratch */
    g->fixed_bytes =
        context_act_bytes(cfg, p->n_batch) + (size_t)64 * cfg->n_vocab * 4 + ((size_t)96 << 20);
    return TM_OK;
}

/* The GPUs, opened when a flag may want one. An explicit -ngl N > 0 needs one; otherwise
 * its absence means CPU only. Without -dev (and a flag that names several GPUs:
 * --tensor-split, --moe-cache A,B) CUDA0 alone, as before the executor ran several. */
static tm_status context_gpus_open(const tm_context *c, context_gpus *cg, size_t *kv_layer,
                                   char *why, size_t why_len) {
    const tm_context_params *p = &c->params;
    const tm_model_config *cfg = &c->model->cfg;
    memset(cg, 0, sizeof(*cg));
    cg->g[0].why = why;
    snprintf(why, why_len, "no GPU flag given");
    const bool wanted =
        p->n_gpu_layers != 0 || p->moe_cache_mib || (p->override_tensor && *p->override_tensor);
    tm_gpu_opts o = p->gpus;
    if (o.dev_given && o.n_dev == 0) {
        snprintf(why, why_len, "-dev none");
        return TM_OK;
    }
    const bool explicit = o.dev_given || o.n_split || o.n_cache;
    if (!explicit) o.dev_given = true, o.n_dev = 1, o.dev[0] = 0;
    int n_avail = 0, n = 0, cuda[TM_MAX_GPUS];
    if (cuda_device_count(&n_avail) != TM_OK) n_avail = 0;
    tm_status st;
    if (n_avail > 0 || explicit) { /* -dev CUDA7 is an error even where no GPU is */
        if ((st = gpus_resolve(&o, n_avail, &n, cuda)) != TM_OK) return st;
    } else {
        n = 1, cuda[0] = 0; /* opening it says why there is none */
    }
    if (!wanted) return TM_OK;
    for (uint32_t l = 0; kv_layer && l < cfg->n_layer; l++) /* sliding layers' rings */
        kv_layer[l] = 2 *
                      (size_t)exec_kv_rows(c->n_ctx, p->n_batch, c->model->window[l], p->kv_full) *
                      (size_t)c->n_seq * (size_t)cfg->n_head_kv * cfg->head_dim *
                      (p->kv_type == TM_TYPE_F16 ? 2 : 4);
    for (int i = 0; i < n; i++) {
        st = cuda_device_open(cuda[i], &cg->dev[i]);
        if (st != TM_OK && i == 0 && n == 1 && !explicit && p->n_gpu_layers <= 0) {
            snprintf(why, why_len, "%s", tm_error_message()); /* CPU only, saying why */
            return TM_OK;
        }
        if (st == TM_OK) cg->n = i + 1, cg->cuda[i] = cuda[i];
        if (st == TM_OK) st = context_gpu_offer(c, cg->dev[i], kv_layer, &cg->g[i]);
        if (st != TM_OK) {
            context_gpus_close(cg);
            return o.dev_given && explicit ? tm_error_wrap(st, "-dev: CUDA%d", cuda[i]) : st;
        }
    }
    return TM_OK;
}

/* The prompt batch when -b is not given (docs/flags.md). 512, or, when a GPU computes
 * layers whose experts are in RAM, the largest of 4096, 2048 and 1024 whose batch-sized
 * GPU buffers fit the VRAM the placement left: each batch copies (or reads over PCIe)
 * the experts it routes to once, so a larger batch serves more tokens a copy (H200,
 * 30b-a3b --cpu-moe pp4096: 1,762 t/s in batches of 512, 8,175 in one of 4096). The
 * buffers that grow with the batch, computed as they are allocated: activations and
 * the output rows (g->fixed_bytes' formula), the grouped experts' scratch
 * (tier_gemm_scratch_bound) and sliding layers' KV
 * rings; a quarter of what is left when --moe-cache auto would take it all. */
#define BATCH_DEFAULT 512

static size_t context_batch_bytes(const tm_context *c, const tm_placement *pl, int64_t B) {
    const tm_model_config *cfg = &c->model->cfg;
    size_t b =
        context_act_bytes(cfg, B) +
        tier_gemm_scratch_bound(cfg->n_embd, cfg->n_ff_exp, cfg->n_expert, B * cfg->n_expert_used);
    const size_t row =
        (size_t)cfg->n_head_kv * cfg->head_dim * (c->params.kv_type == TM_TYPE_F16 ? 2 : 4);
    for (uint32_t l = 0; c->model->window && l < cfg->n_layer; l++) /* sliding layers' rings */
        if (c->model->window[l] && pl->layer_dev[l] == TM_DEV_GPU)
            b += 2 * (size_t)exec_kv_rows(c->n_ctx, B, c->model->window[l], c->params.kv_full) *
                 (size_t)c->n_seq * row;
    return b;
}

static int64_t context_batch_auto(const tm_context *c, const tm_placement_gpu *g,
                                  const tm_placement *pl, const size_t *kv_layer) {
    const tm_model_config *cfg = &c->model->cfg;
    bool ram = false;
    size_t used = pl->gpu_bytes + g->fixed_bytes;
    for (uint32_t l = 0; l < cfg->n_layer; l++) {
        if (pl->layer_dev[l] != TM_DEV_GPU) continue;
        ram |= pl->experts_dev[l] != TM_DEV_GPU && cfg->n_expert;
        used += kv_layer ? kv_layer[l] : g->kv_bytes_per_layer;
    }
    int64_t best = BATCH_DEFAULT;
    const int64_t mib = c->params.moe_cache_mib;
    if (ram && used < g->budget && !(mib > 0 && (size_t)mib << 20 >= g->budget - used)) {
        size_t room = g->budget - used - (mib > 0 ? (size_t)mib << 20 : 0);
        if (mib == TM_MOE_CACHE_AUTO) room /= 4;
        const size_t base = context_batch_bytes(c, pl, BATCH_DEFAULT);
        static const int64_t sizes[] = {4096, 2048, 1024};
        for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]) && best == BATCH_DEFAULT; i++)
            if (sizes[i] <= c->params.n_ctx &&
                context_batch_bytes(c, pl, sizes[i]) - base <= room - room / 5)
                best = sizes[i];
    }
    return best;
}

/* The GPUs the executor runs (docs/flags.md, "Several GPUs"): a placement over several
 * keeps the whole list (its GPU numbers are the list's places; --moe-cache A,B then sizes
 * each GPU's cache, model_moe_state_finish_tier). One GPU in use is moved to cg's first
 * place and the others closed (--moe-cache A,B: that GPU's size). */
static tm_status context_gpus_pick(tm_context *c, context_gpus *cg) {
    tm_placement *pl = &c->placement;
    if (pl->n_gpu_used > 1) return TM_OK;
    int keep = 0;
    for (int i = 0; i < cg->n; i++)
        if (pl->gpu_bytes_each[i]) keep = i;
    for (uint32_t l = 0; l < pl->n_layer; l++)
        if (pl->layer_dev[l] == TM_DEV_GPU) keep = pl->layer_gpu[l];
    if (c->params.gpus.n_cache && keep < c->params.gpus.n_cache)
        c->params.moe_cache_mib = c->params.gpus.cache_mib[keep];
    for (int i = 0; i < cg->n; i++)
        if (i != keep) cuda_device_close(cg->dev[i]);
    if (cg->n) {
        cg->dev[0] = cg->dev[keep], cg->cuda[0] = cg->cuda[keep], cg->g[0] = cg->g[keep];
        cg->n = 1;
    }
    return TM_OK;
}

tm_status model_context_create(tm_model *m, const tm_context_params *p, tm_context **out) {
    *out = NULL;
    tm_context *c = calloc(1, sizeof(*c));
    if (!c) return tm_error_set(TM_ERR_NOMEM, "out of memory");
    c->model = m;
    c->params = *p;
    const tm_model_config *cfg = &m->cfg;
    if (c->params.n_ctx <= 0) c->params.n_ctx = cfg->n_ctx_train < 4096 ? cfg->n_ctx_train : 4096;
    const bool batch_auto = c->params.n_batch <= 0;
    if (batch_auto) c->params.n_batch = BATCH_DEFAULT;
    if (c->params.n_batch > c->params.n_ctx) c->params.n_batch = c->params.n_ctx;
    if (c->params.kv_type != TM_TYPE_F32) c->params.kv_type = TM_TYPE_F16;
    if (c->params.n_seq <= 0) c->params.n_seq = 1;
    c->n_seq = c->params.n_seq;
    c->n_ctx = c->params.n_ctx / c->n_seq;
    if (c->n_ctx < 1 || c->n_ctx * c->n_seq > INT32_MAX) {
        const int64_t n = c->params.n_ctx;
        free(c);
        return tm_error_set(TM_ERR_ARG,
                            "a context of %lld positions for %d sequences (-c, --parallel): want "
                            "at least 1 a sequence, at most 2^31 in all",
                            (long long)n, p->n_seq);
    }
    c->seq_past = calloc((size_t)c->n_seq, sizeof(int64_t));
    c->seq_hi = calloc((size_t)c->n_seq, sizeof(int64_t));
    if (!c->seq_past || !c->seq_hi) {
        free(c->seq_past), free(c->seq_hi), free(c);
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    }
    const char *ring = getenv("TIERMOE_KV_RING"); /* 0: full caches, for comparison */
    if (ring && !strcmp(ring, "0")) c->params.kv_full = true;
    tm_status st =
        cpu_pool_create(p->n_threads > 0 ? p->n_threads : cpu_physical_cores(), &c->pool);
    if (st != TM_OK) {
        free(c->seq_past), free(c->seq_hi), free(c->row_pos), free(c->row_seq), free(c);
        return st;
    }
    context_gpus cg;
    char why[512];
    size_t *kv_layer = m->window ? calloc(cfg->n_layer, sizeof(size_t)) : NULL;
    if (m->window && !kv_layer) st = tm_error_set(TM_ERR_NOMEM, "out of memory");
    if (st || (st = context_gpus_open(c, &cg, kv_layer, why, sizeof(why)))) {
        free(kv_layer);
        model_context_free(c);
        return st;
    }
    const tm_gpu_opts *go = &c->params.gpus;
    const tm_placement_params pp = {c->params.n_gpu_layers,
                                    c->params.cpu_moe,
                                    c->params.n_cpu_moe,
                                    c->params.override_tensor,
                                    cg.n,
                                    cg.cuda,
                                    go->n_split && go->split_mode == TM_SPLIT_LAYER ? go->split
                                                                                    : NULL};
    if ((st = placement_make(m->file, cfg->n_layer, &pp, cg.g, &c->placement)) ||
        (st = context_gpus_pick(c, &cg))) {
        free(kv_layer);
        context_gpus_close(&cg);
        model_context_free(c);
        return st;
    }
    /* the GPUs the executor runs: all of the list, or one (context_gpus_pick closed the
       others) */
    tm_cuda_device *gpu = cg.n ? cg.dev[0] : NULL;
    const bool spans = cg.n > 1;
    const tm_placement_gpu g = cg.g[0];
    if (batch_auto && gpu && c->placement.any_gpu) {
        const int64_t b = context_batch_auto(c, &g, &c->placement, kv_layer);
        if (b != c->params.n_batch)
            tm_log_info("prompt batch %lld: a GPU computes layers whose experts are in RAM, and "
                        "each batch copies the experts it routes to once (-b sets it)",
                        (long long)b);
        c->params.n_batch = b;
    }
    free(kv_layer);
    c->row_pos = calloc((size_t)c->params.n_batch, sizeof(int32_t));
    c->row_seq = calloc((size_t)c->params.n_batch, sizeof(int32_t));
    c->pick_rows = calloc((size_t)c->params.n_batch, sizeof(int64_t));
    if (!c->row_pos || !c->row_seq || !c->pick_rows) {
        for (int i = 0; i < (spans ? cg.n : 1); i++) cuda_device_close(cg.dev[i]);
        model_context_free(c);
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    }
    if (!c->placement.any_gpu) { /* nothing landed there: let it go */
        cuda_device_close(gpu);
        gpu = NULL;
    }
    c->n_gpu_layers = c->placement.n_gpu_layers, c->gpu_output = c->placement.output_gpu;
    tm_exec_params ep = {
        .pool = c->pool,
        .file = m->file,
        .tensor_dev = c->placement.tensor_dev,
        .n_gpus = spans ? cg.n : gpu != NULL,
        .tensor_gpu = spans ? c->placement.tensor_gpu : NULL,
        .layer_gpu = spans ? c->placement.layer_gpu : NULL,
        .n_batch = c->params.n_batch,
        .n_ctx = c->n_ctx * c->n_seq,
        .n_seq = c->n_seq,
        .kv_full = c->params.kv_full,
        .kv_type = c->params.kv_type,
        .precise = c->params.precise,
        .profile = c->params.profile,
        .graph = true,
        .cb = c->params.cb,
        .cb_ud = c->params.cb_ud,
    };
    ep.gpus[0] = gpu;
    for (int i = 1; spans && i < cg.n; i++) ep.gpus[i] = cg.dev[i];
    if ((st = exec_create(&ep, &c->exec)) || (st = m->arch->state_create(c))) {
        model_context_free(c);
        return st;
    }
    *out = c;
    return TM_OK;
}

void model_context_free(tm_context *c) {
    if (!c) return;
    tier_free(c->tier);
    exec_free(c->exec); /* frees the activations' buffers: before the state that holds them */
    if (c->state) c->model->arch->state_free(c);
    placement_free(&c->placement);
    cpu_pool_free(c->pool);
    free(c->seq_past), free(c->seq_hi), free(c->row_pos), free(c->row_seq), free(c->pick_rows);
    free(c);
}

const uint64_t *model_prof_ns(const tm_context *c) {
    return exec_prof_ns(c->exec);
}

const tm_moe_lane_stats *model_lane_stats(const tm_context *c) {
    return tier_lane_stats(c->tier);
}

void model_context_reset(tm_context *c) {
    for (int i = 0; i < c->n_seq; i++) {
        exec_ssm_rewind(c->exec, i, c->seq_past[i], 0);
        c->seq_past[i] = c->seq_hi[i] = 0;
    }
}

int64_t model_seq_keep(const tm_context *c, int seq, int64_t n_keep) {
    TM_ASSERT(n_keep >= 0 && seq >= 0 && seq < c->n_seq);
    if (n_keep > c->seq_past[seq]) n_keep = c->seq_past[seq];
    /* linear attention's state stands for all positions, its checkpoint's, or none */
    n_keep = exec_ssm_keep(c->exec, seq, c->seq_past[seq], n_keep);
    return exec_kv_keep(c->exec, c->seq_hi[seq], n_keep);
}

int64_t model_seq_rewind(tm_context *c, int seq, int64_t n_keep) {
    const int64_t keep = model_seq_keep(c, seq, n_keep);
    exec_ssm_rewind(c->exec, seq, c->seq_past[seq], keep);
    c->seq_past[seq] = keep;
    if (!keep) c->seq_hi[seq] = 0; /* empty: nothing it held matters any more */
    return keep;
}

int64_t model_context_rewind(tm_context *c, int64_t n_keep) {
    return model_seq_rewind(c, 0, n_keep);
}

typedef struct context_step {
    tm_context *c;
    int64_t n_tok;
    bool all_logits;
} context_step;

static tm_status context_forward(void *ud) {
    const context_step *s = ud;
    return s->c->model->arch->forward(s->c, s->n_tok, s->all_logits);
}

static tm_status check_tokens(const tm_context *c, const int32_t *tokens, int64_t n_tok) {
    for (int64_t i = 0; i < n_tok; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= c->model->cfg.n_vocab)
            return tm_error_set(TM_ERR_ARG,
                                "token id %d at position %lld is outside the vocabulary [0, %u)",
                                tokens[i], (long long)i, c->model->cfg.n_vocab);
    return TM_OK;
}

tm_status model_decode_seq(tm_context *c, int seq, const int32_t *tokens, int64_t n_tok,
                           tm_moe_phase phase, bool all_logits) {
    if (n_tok <= 0) return tm_error_set(TM_ERR_ARG, "no tokens to evaluate");
    if (seq < 0 || seq >= c->n_seq)
        return tm_error_set(TM_ERR_ARG, "sequence %d of %d", seq, c->n_seq);
    int64_t *past = &c->seq_past[seq];
    if (*past + n_tok > c->n_ctx)
        return tm_error_set(
            TM_ERR_ARG,
            "context full: %lld positions used + %lld new tokens > context size %lld (-c%s)",
            (long long)*past, (long long)n_tok, (long long)c->n_ctx,
            c->n_seq > 1 ? " over --parallel" : "");
    if (all_logits && n_tok > c->params.n_batch)
        return tm_error_set(TM_ERR_ARG, "all logits of %lld tokens asked, batch holds %lld",
                            (long long)n_tok, (long long)c->params.n_batch);
    tm_status st = check_tokens(c, tokens, n_tok);
    if (st != TM_OK) return st;
    for (int64_t i = 0; i < n_tok; i += c->params.n_batch) {
        const int64_t n = n_tok - i < c->params.n_batch ? n_tok - i : c->params.n_batch;
        for (int64_t t = 0; t < n; t++) c->row_pos[t] = (int32_t)(*past + t), c->row_seq[t] = seq;
        /* counted before the step: a failed one may have written its rows */
        if (*past + n > c->seq_hi[seq]) c->seq_hi[seq] = *past + n;
        context_step step = {c, n, all_logits};
        st = exec_step_rows(c->exec, tokens + i, n, c->row_pos, c->row_seq, phase, context_forward,
                            &step);
        if (st != TM_OK) return st;
        *past += n;
    }
    /* a prompt's end: where a continuation of the conversation starts from */
    if (phase == TM_MOE_PHASE_PROMPT) exec_ssm_checkpoint(c->exec, seq, *past);
    c->n_logits_rows = all_logits ? n_tok : 1;
    return TM_OK;
}

tm_status model_decode(tm_context *c, const int32_t *tokens, int64_t n_tok, tm_moe_phase phase,
                       bool all_logits) {
    return model_decode_seq(c, 0, tokens, n_tok, phase, all_logits);
}

tm_status model_decode_rows(tm_context *c, int64_t n, const int *seqs, const int32_t *tokens) {
    if (n < 1 || n > c->params.n_batch)
        return tm_error_set(TM_ERR_ARG, "a decode step of %lld rows (1 .. the batch, %lld)",
                            (long long)n, (long long)c->params.n_batch);
    tm_status st = check_tokens(c, tokens, n);
    if (st != TM_OK) return st;
    for (int64_t i = 0; i < n; i++) {
        const int q = seqs[i];
        if (q < 0 || q >= c->n_seq)
            return tm_error_set(TM_ERR_ARG, "row %lld: sequence %d of %d", (long long)i, q,
                                c->n_seq);
        for (int64_t j = 0; j < i; j++)
            if (seqs[j] == q)
                return tm_error_set(TM_ERR_ARG, "rows %lld and %lld: both of sequence %d",
                                    (long long)j, (long long)i, q);
        if (c->seq_past[q] >= c->n_ctx)
            return tm_error_set(TM_ERR_ARG, "sequence %d: its context of %lld positions is full", q,
                                (long long)c->n_ctx);
        c->row_pos[i] = (int32_t)c->seq_past[q], c->row_seq[i] = q;
    }
    for (int64_t i = 0; i < n; i++) /* before the step: a failed one may have written its rows */
        if (c->seq_past[seqs[i]] + 1 > c->seq_hi[seqs[i]])
            c->seq_hi[seqs[i]] = c->seq_past[seqs[i]] + 1;
    context_step step = {c, n, true};
    st = exec_step_rows(c->exec, tokens, n, c->row_pos, c->row_seq, TM_MOE_PHASE_DECODE,
                        context_forward, &step);
    if (st != TM_OK) return st;
    for (int64_t i = 0; i < n; i++) c->seq_past[seqs[i]]++;
    c->n_logits_rows = n;
    return TM_OK;
}

tm_status model_decode_batch(tm_context *c, int64_t n, const int *seqs, const int32_t *tokens,
                             int64_t *n_runs) {
    if (n < 1 || n > c->params.n_batch)
        return tm_error_set(TM_ERR_ARG, "a prompt step of %lld rows (1 .. the batch, %lld)",
                            (long long)n, (long long)c->params.n_batch);
    tm_status st = check_tokens(c, tokens, n);
    if (st != TM_OK) return st;
    int64_t k = 0; /* runs; pick_rows[r]: run r's last row */
    for (int64_t i = 0, t0 = 0; i < n; i++) {
        const int q = seqs[i];
        if (q < 0 || q >= c->n_seq)
            return tm_error_set(TM_ERR_ARG, "row %lld: sequence %d of %d", (long long)i, q,
                                c->n_seq);
        if (i && q == seqs[i - 1]) {
            c->pick_rows[k - 1] = i;
        } else {
            for (int64_t r = 0; r < k; r++) /* a run a sequence: its rows go in one go */
                if (seqs[c->pick_rows[r]] == q)
                    return tm_error_set(TM_ERR_ARG,
                                        "row %lld: sequence %d's rows are not consecutive "
                                        "(it has rows before %lld)",
                                        (long long)i, q, (long long)t0);
            t0 = i, c->pick_rows[k++] = i;
        }
        if (c->seq_past[q] + (i - t0) >= c->n_ctx)
            return tm_error_set(
                TM_ERR_ARG,
                "context full: sequence %d holds %lld positions, %lld more do not fit %lld (-c)", q,
                (long long)c->seq_past[q], (long long)(i - t0 + 1), (long long)c->n_ctx);
        c->row_pos[i] = (int32_t)(c->seq_past[q] + (i - t0)), c->row_seq[i] = q;
    }
    for (int64_t r = 0; r < k; r++) { /* before the step: a failed one may have written its rows */
        const int q = seqs[c->pick_rows[r]];
        const int64_t end = c->row_pos[c->pick_rows[r]] + 1;
        if (end > c->seq_hi[q]) c->seq_hi[q] = end;
    }
    c->n_pick = k > 1 ? k : 0; /* one run: its last row is the step's */
    context_step step = {c, n, false};
    st = exec_step_rows(c->exec, tokens, n, c->row_pos, c->row_seq, TM_MOE_PHASE_PROMPT,
                        context_forward, &step);
    c->n_pick = 0;
    if (st != TM_OK) return st;
    for (int64_t r = 0; r < k; r++) { /* each run's end is a prompt's (model_decode_seq) */
        const int q = seqs[c->pick_rows[r]];
        c->seq_past[q] = c->row_pos[c->pick_rows[r]] + 1;
        exec_ssm_checkpoint(c->exec, q, c->seq_past[q]);
    }
    c->n_logits_rows = k;
    *n_runs = k;
    return TM_OK;
}

/* ---- what MoE decoders share ---- */

tm_status model_nextn_bind(tm_model *m, uint32_t l) {
    const tm_model_config *c = &m->cfg;
    const int64_t E = c->n_embd, V = c->n_vocab;
    static const struct {
        const char *suffix;
        bool optional;
        uint32_t nd;
        int rows;  /* ne[1]: 0 none, 1 n_embd, 2 n_vocab */
        int width; /* ne[0]: 1 n_embd, 2 2 n_embd */
    } t[] = {{"eh_proj", false, 2, 1, 2},         {"enorm", false, 1, 0, 1},
             {"hnorm", false, 1, 0, 1},           {"embed_tokens", true, 2, 2, 1},
             {"shared_head_head", true, 2, 2, 1}, {"shared_head_norm", true, 1, 0, 1}};
    for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
        char name[96];
        snprintf(name, sizeof(name), "blk.%u.nextn.%s.weight", l, t[i].suffix);
        const int64_t ne[2] = {t[i].width * E, t[i].rows == 1 ? E : V};
        tm_weight w;
        tm_status st = t[i].optional ? model_weight_bind_optional(m, name, t[i].nd, ne, &w)
                                     : model_weight_bind(m, name, t[i].nd, ne, &w);
        if (st)
            return tm_error_wrap(st, "NextN layer %u (%s.nextn_predict_layers)", l, m->arch->name);
    }
    return TM_OK;
}

void model_rope_yarn(double base, double factor, double orig_ctx, double beta_fast,
                     double beta_slow, int64_t dim, bool truncate, float *freq) {
    const double pi = 3.14159265358979323846, d = (double)dim;
    double lo = d * log(orig_ctx / (beta_fast * 2 * pi)) / (2 * log(base));
    double hi = d * log(orig_ctx / (beta_slow * 2 * pi)) / (2 * log(base));
    if (truncate) lo = floor(lo), hi = ceil(hi);
    lo = lo > 0 ? lo : 0, hi = hi < d - 1 ? hi : d - 1;
    if (lo == hi) hi += 0.001; /* as HF: no division by zero */
    for (int64_t i = 0; i < dim / 2; i++) {
        const double f = pow(base, -2.0 * (double)i / d), r = ((double)i - lo) / (hi - lo);
        const double ramp = r < 0 ? 0 : r > 1 ? 1 : r;
        freq[i] = (float)(f / factor * ramp + f * (1 - ramp));
    }
}

tm_status model_io_bind(tm_model *m, tm_weight *embd, tm_weight *norm, tm_weight *out) {
    tm_model_config *c = &m->cfg;
    const int64_t E = c->n_embd;
    const tm_gguf_tensor *te = gguf_file_find_tensor(m->file, "token_embd.weight");
    c->n_vocab = 0; /* not 2-d: the binding below names the shape */
    if (te && te->n_dims == 2) {
        if (te->ne[1] < 1 || te->ne[1] > INT32_MAX)
            return tm_error_set(TM_ERR_FORMAT,
                                "%s: tensor 'token_embd.weight' has %lld rows (the vocabulary), "
                                "expected 1 to 2^31-1 (token ids are int32)",
                                m->file->path, (long long)te->ne[1]);
        c->n_vocab = (uint32_t)te->ne[1];
    }
    tm_status st;
    if ((st = model_weight_bind(m, "token_embd.weight", 2, (int64_t[]){E, c->n_vocab}, embd)) ||
        (st = model_weight_bind(m, "output_norm.weight", 1, (int64_t[]){E}, norm)) ||
        (st = model_weight_bind_optional(m, "output.weight", 2, (int64_t[]){E, c->n_vocab}, out)))
        return st;
    if (!out->data) *out = *embd; /* tied embeddings */
    if (norm->type != TM_TYPE_F32)
        return tm_error_set(TM_ERR_UNSUPPORTED, "%s: output_norm must be f32", m->file->path);
    return TM_OK;
}

tm_moe_experts model_moe_experts(const tm_weight *gate, const tm_weight *up, const tm_weight *down,
                                 const tm_weight *router) {
    const int64_t E = gate->ne[0], F = gate->ne[1];
    return (tm_moe_experts){
        .n_embd = E,
        .n_ff = F,
        .act = TM_MOE_ACT_SWIGLU,
        .gate = {gate->data, gate->type, gate->row_bytes * (size_t)F, gate->row_bytes},
        .up = {up->data, up->type, up->row_bytes * (size_t)F, up->row_bytes},
        .down = {down->data, down->type, down->row_bytes * (size_t)E, down->row_bytes},
        .router = router->type == TM_TYPE_F32 ? (const float *)router->data : NULL,
    };
}

/* Logits rows the GPU holds at a time (a whole batch's would be n_batch x n_vocab). */
#define MODEL_LOGIT_ROWS 64

tm_status model_moe_acts_create(tm_context *c, tm_moe_acts *s) {
    const tm_model_config *m = &c->model->cfg;
    tm_exec *e = c->exec;
    const int64_t E = m->n_embd, Q = (int64_t)m->n_head * m->head_dim,
                  KV = (int64_t)m->n_head_kv * m->head_dim, K = m->n_expert_used;
    tm_status st;
    if ((st = exec_act_create(e, &s->x, "x", E, false, 0)) ||
        (st = exec_act_create(e, &s->h, "h", E, false, 0)) ||
        (st = exec_act_create(e, &s->q, "q", Q, false, 0)) ||
        (st = exec_act_create(e, &s->k, "k", KV, false, 0)) ||
        (st = exec_act_create(e, &s->v, "v", KV, false, 0)) ||
        (st = exec_act_create(e, &s->att, "att", Q, false, 0)) ||
        (st = exec_act_create(e, &s->attn_out, "attn_out", E, false, 0)) ||
        (st = exec_act_create(e, &s->router_logits, "router_logits", m->n_expert, false, 0)) ||
        (st = exec_act_create(e, &s->topk_ids, "topk_ids", K, true, 0)) ||
        (st = exec_act_create(e, &s->topk_w, "topk_weights", K, false, 0)) ||
        (st = exec_act_create(e, &s->ffn_out, "ffn_out", E, false, 0)) ||
        (st = exec_act_create(e, &s->logits, "logits", m->n_vocab, false, MODEL_LOGIT_ROWS)))
        return st;
    return TM_OK;
}

tm_status model_moe_emit(tm_context *c, uint32_t l, tm_moe_acts *s, int64_t n_tok) {
    tm_exec *e = c->exec;
    if (!exec_emitting(e)) return TM_OK;
    MODEL_DO(exec_emit(e, "router_logits", (int)l, &s->router_logits, n_tok));
    MODEL_DO(exec_emit(e, "topk_ids", (int)l, &s->topk_ids, n_tok));
    MODEL_DO(exec_emit(e, "topk_weights", (int)l, &s->topk_w, n_tok));
    MODEL_DO(exec_emit(e, "ffn_out", (int)l, &s->ffn_out, n_tok));
    MODEL_DO(exec_emit(e, "x_out", (int)l, &s->x, n_tok));
    return TM_OK;
}

tm_status model_logits_rows(tm_context *c, tm_act *h, int64_t n_tok, bool all_logits,
                            int64_t *first, int64_t *rows) {
    if (c->n_pick) { /* several sequences' runs: their last rows to the front */
        *first = 0, *rows = c->n_pick;
        return exec_rows_pick(c->exec, h, c->pick_rows, c->n_pick);
    }
    *first = all_logits ? 0 : n_tok - 1, *rows = n_tok - *first;
    return TM_OK;
}

tm_status model_logits_forward(tm_context *c, tm_moe_acts *s, const tm_weight *norm,
                               const tm_weight *out, int64_t n_tok, bool all_logits) {
    tm_exec *e = c->exec;
    int64_t first, rows;
    MODEL_DO(exec_part(e, TM_PROF_OUTPUT));
    MODEL_DO(exec_rmsnorm(e, &s->h, &s->x, norm, c->model->cfg.rms_eps));
    MODEL_DO(model_logits_rows(c, &s->h, n_tok, all_logits, &first, &rows));
    MODEL_DO(exec_matmul_rows(e, &s->logits, out, &s->h, first, rows));
    MODEL_DO(exec_fetch(e, &s->logits, rows));
    MODEL_DO(exec_emit(e, "logits", -1, &s->logits, rows));
    return TM_OK;
}

tm_status model_moe_state_create(tm_context *c, const tm_weight *const *qkv,
                                 const tm_tier_layer *tl, const tm_moe_router_params *router,
                                 const float *rope_freq) {
    const tm_model_config *m = &c->model->cfg;
    tm_moe_acts *s = calloc(1, sizeof(*s));
    if (!s) return tm_error_set(TM_ERR_NOMEM, "out of memory");
    c->state = s;
    tm_status st;
    if ((st = model_moe_acts_create(c, s))) return st;
    for (uint32_t l = 0; l < m->n_layer; l++) /* q, k and v share their input */
        if ((st = exec_weight_group(c->exec, 3, qkv + 3 * l))) return st;
    return model_moe_state_finish(c, tl, router, rope_freq, NULL, NULL);
}

tm_status model_moe_state_finish(tm_context *c, const tm_tier_layer *tl,
                                 const tm_moe_router_params *router, const float *rope_freq,
                                 const bool *ssm, const tm_ssm_desc *ssm_shape) {
    const tm_model_config *m = &c->model->cfg;
    const tm_attn_desc shape = {.n_head = m->n_head,
                                .n_head_kv = m->n_head_kv,
                                .head_dim = m->head_dim,
                                .rope_freq = rope_freq};
    return model_moe_state_finish_attn(c, tl, router, &shape, ssm, ssm_shape);
}

tm_status model_moe_state_finish_attn(tm_context *c, const tm_tier_layer *tl,
                                      const tm_moe_router_params *router, const tm_attn_desc *shape,
                                      const bool *ssm, const tm_ssm_desc *ssm_shape) {
    const tm_model_config *m = &c->model->cfg;
    tm_exec *e = c->exec;
    tm_status st;
    if ((st = exec_attention_setup(e, m->n_layer, c->placement.layer_dev, shape,
                                   c->model->window)) ||
        (ssm && (st = exec_ssm_setup(e, m->n_layer, ssm, ssm_shape))))
        return st;
    return model_moe_state_finish_tier(c, tl, router);
}

tm_status model_moe_state_finish_tier(tm_context *c, const tm_tier_layer *tl,
                                      const tm_moe_router_params *router) {
    const tm_model_config *m = &c->model->cfg;
    tm_exec *e = c->exec;
    const tm_moe_acts *s = c->state;
    tm_status st;
    if ((st = exec_finalize(e))) return st;
    c->logits = s->logits.host;
    tm_tier_params tp = {.cache_mib = c->params.moe_cache_mib,
                         .cache = c->params.moe_cache,
                         .reserve = GPU_RESERVE,
                         .pcie = c->params.moe_pcie,
                         .fetch = c->params.moe_fetch,
                         .ahead = c->params.moe_ahead,
                         .store = {.budget_mib = c->params.ram_cache_mib,
                                   .path = c->model->file->path,
                                   .map = c->model->file->map}};
    if (exec_gpu_count(e) > 1) /* spans: --moe-cache A,B sizes each GPU's cache */
        for (int g = 0; g < c->params.gpus.n_cache && g < EXEC_MAX_GPUS; g++)
            tp.cache_mib_gpu[g] = c->params.gpus.cache_mib[g], tp.n_cache_gpu = g + 1;
    return tier_create(e, &c->placement, m->n_layer, tl, router, &tp, &c->tier);
}

void model_moe_state_free(tm_context *c) {
    free(c->state);
    c->state = NULL;
}
