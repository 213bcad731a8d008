/* Qwen3-MoE on the GPU: the same math as qwen3moe.c, step by step, with the
 * kernels of src/cuda. The first n_gpu_layers layers (and the output head
 * when all layers are there) live in one device pool allocated at load: the
 * weights copied from the mapped file, the KV cache, the activations and the
 * scratch, so nothing is allocated per token.
 *
 * Per layer, for a batch of n_tok tokens at positions pos.. (pos is read by
 * the kernels from device memory, so a captured decode step replays as is):
 *     h = rmsnorm(x) * attn_norm
 *     q, k, v = Wq h, Wk h, Wv h             (one launch over the stacked rows at decode)
 *     q, k = rope(rmsnorm(q) * q_norm), rope(rmsnorm(k) * k_norm); K, V cache rows at pos
 *     x += Wo · attention(q, K, V)
 *     h = rmsnorm(x) * ffn_norm
 *     ids, weights = top-k(softmax(W_router h))
 *     x += Σ weight · down(silu(gate h) ⊙ up h)  decode: a work list made on the GPU;
 *                                               prompt: expert-major groups on the host
 * Products: matrix-vector kernels up to TM_CUDA_MMVQ_MAX_TOK tokens, tensor
 * cores (cuda_gemm) above. The decode step (one token) is captured once as a
 * CUDA graph and replayed per token (TIERMOE_CUDA_GRAPH=0 turns it off). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/timing.h"
#include "model/qwen3moe.h"

#ifdef TM_HAVE_CUDA
#include "cuda/cuda.h"

#define GPU_LOGIT_ROWS 64 /* output head rows per chunk (bounds the logits buffer) */
#define GPU_RESERVE    ((size_t)768 << 20) /* left free for cuBLAS and the CUDA context (auto) */

typedef struct gpu_matrix {
    const void *data; /* device */
    tm_type type;
    size_t row_bytes;
    int64_t rows, k;
} gpu_matrix;

typedef struct gpu_layer {
    gpu_matrix wq, wk, wv, wo, router;
    gpu_matrix wqkv; /* wq, wk, wv back to back when they share a type (data NULL otherwise) */
    const float *attn_norm, *q_norm, *k_norm, *ffn_norm;
    tm_cuda_moe_params moe;
    void *k_cache, *v_cache;
} gpu_layer;

struct qwen3moe_gpu {
    tm_cuda_device *dev;
    tm_cuda_pool *pool; /* NULL in the sizing pass */
    size_t need;        /* bytes the sizing pass counted */
    tm_cuda_blas *blas;
    tm_cuda_stream s;
    int n_layers;
    bool output;
    gpu_layer *layers;
    gpu_matrix out;
    const float *output_norm;
    tm_cuda_attn_params attn;
    tm_cuda_router_params router;
    /* activations, [n_batch][...] */
    float *x, *h, *q, *k, *v, *qkv, *att, *attn_out, *router_logits, *topk_w, *moe_h, *logits;
    int32_t *topk_ids, *pos;
    tm_cuda_moe_item *items;
    float *attn_scratch;
    void *scratch;
    /* pinned host staging */
    float *x_host, *w_host;
    int32_t *pos_host, *ids_host;
    tm_cuda_moe_item *items_host;
    /* host: expert-major groups of a prompt step */
    tm_moe_worklist wl;
    int32_t *group_slots;
    int64_t *group_starts;
    tm_cuda_graph *graph; /* the captured decode step */
    bool graph_off;
    double upload_s, upload_bytes;
};

/* ---- setup: run twice, once to size the pool, once to fill it ---- */

static tm_status gpu_take(qwen3moe_gpu *g, size_t bytes, void **out) {
    *out = NULL;
    if (!g->pool) {
        g->need += (bytes + 255) & ~(size_t)255;
        return TM_OK;
    }
    return cuda_pool_alloc(g->pool, bytes, 256, out);
}

static tm_status gpu_upload(qwen3moe_gpu *g, void *dst, const void *src, size_t bytes) {
    if (!g->pool) return TM_OK;
    const uint64_t t0 = tm_time_ns();
    tm_status st = cuda_upload(g->dev, dst, src, bytes, NULL);
    g->upload_s += (tm_time_ns() - t0) * 1e-9, g->upload_bytes += (double)bytes;
    return st;
}

static size_t weight_bytes(const tm_weight *w) {
    return w->row_bytes * (size_t)(w->ne[1] * w->ne[2] * w->ne[3]);
}

static tm_status gpu_weight(qwen3moe_gpu *g, const tm_weight *w, gpu_matrix *m) {
    void *d;
    tm_status st = gpu_take(g, weight_bytes(w), &d);
    if (st == TM_OK) st = gpu_upload(g, d, w->data, weight_bytes(w));
    *m = (gpu_matrix){d, w->type, w->row_bytes, w->ne[1] * w->ne[2], w->ne[0]};
    return st;
}

static tm_status gpu_norm(qwen3moe_gpu *g, const tm_weight *w, const float **out) {
    gpu_matrix m;
    tm_status st = gpu_weight(g, w, &m);
    *out = m.data;
    return st;
}

/* q, k and v rows in one buffer, so a decode step reads them with one launch. */
static tm_status gpu_qkv(qwen3moe_gpu *g, const qwen3moe_layer *L, gpu_layer *G) {
    const tm_weight *ws[3] = {&L->wq, &L->wk, &L->wv};
    gpu_matrix *ms[3] = {&G->wq, &G->wk, &G->wv};
    if (L->wq.type != L->wk.type || L->wq.type != L->wv.type) {
        G->wqkv.data = NULL;
        for (int i = 0; i < 3; i++) {
            tm_status st = gpu_weight(g, ws[i], ms[i]);
            if (st != TM_OK) return st;
        }
        return TM_OK;
    }
    const size_t total = weight_bytes(ws[0]) + weight_bytes(ws[1]) + weight_bytes(ws[2]);
    uint8_t *d;
    tm_status st = gpu_take(g, total, (void **)&d);
    size_t off = 0;
    for (int i = 0; i < 3 && st == TM_OK; i++) {
        uint8_t *at = d ? d + off : NULL; /* NULL while sizing */
        *ms[i] = (gpu_matrix){at, ws[i]->type, ws[i]->row_bytes, ws[i]->ne[1], ws[i]->ne[0]};
        st = gpu_upload(g, at, ws[i]->data, weight_bytes(ws[i]));
        off += weight_bytes(ws[i]);
    }
    G->wqkv = (gpu_matrix){d, L->wq.type, L->wq.row_bytes, L->wq.ne[1] + L->wk.ne[1] + L->wv.ne[1],
                           L->wq.ne[0]};
    return st;
}

static tm_cuda_moe_matrix gpu_moe_matrix(const gpu_matrix *m, int64_t rows_per_expert) {
    return (tm_cuda_moe_matrix){m->data, m->type, m->row_bytes * (size_t)rows_per_expert,
                                m->row_bytes};
}

/* One pass over everything the GPU holds (sizing when g->pool is NULL). */
static tm_status gpu_setup(tm_context *ctx, qwen3moe_gpu *g) {
    const tm_model_config *c = &ctx->model->cfg;
    const qwen3moe_weights *w = ctx->model->weights;
    const int64_t B = ctx->params.n_batch, E = c->n_embd, D = c->head_dim;
    const int64_t Q = (int64_t)c->n_head * D, KV = (int64_t)c->n_head_kv * D, K = c->n_expert_used;
    const size_t kv_bytes =
        (size_t)ctx->n_ctx * (size_t)KV * (ctx->params.kv_type == TM_TYPE_F16 ? 2 : 4);
    tm_status st = TM_OK;
    for (int l = 0; l < g->n_layers && st == TM_OK; l++) {
        const qwen3moe_layer *L = &w->layers[l];
        gpu_layer *G = &g->layers[l];
        gpu_matrix gate, up, down;
        if ((st = gpu_norm(g, &L->attn_norm, &G->attn_norm)) ||
            (st = gpu_norm(g, &L->q_norm, &G->q_norm)) ||
            (st = gpu_norm(g, &L->k_norm, &G->k_norm)) ||
            (st = gpu_norm(g, &L->ffn_norm, &G->ffn_norm)) || (st = gpu_qkv(g, L, G)) ||
            (st = gpu_weight(g, &L->wo, &G->wo)) || (st = gpu_weight(g, &L->router, &G->router)) ||
            (st = gpu_weight(g, &L->gate_exps, &gate)) || (st = gpu_weight(g, &L->up_exps, &up)) ||
            (st = gpu_weight(g, &L->down_exps, &down)) ||
            (st = gpu_take(g, kv_bytes, &G->k_cache)) || (st = gpu_take(g, kv_bytes, &G->v_cache)))
            break;
        G->moe = (tm_cuda_moe_params){
            .n_embd = E,
            .n_ff = c->n_ff_exp,
            .n_slots = (int32_t)c->n_expert,
            .gate = gpu_moe_matrix(&gate, c->n_ff_exp),
            .up = gpu_moe_matrix(&up, c->n_ff_exp),
            .down = gpu_moe_matrix(&down, E),
        };
    }
    if (st == TM_OK && g->output)
        if ((st = gpu_norm(g, &w->output_norm, &g->output_norm)) ||
            (st = gpu_weight(g, &w->output, &g->out)))
            return st;
    if (st != TM_OK) return st;

    /* activations */
    const int64_t logit_rows = B < GPU_LOGIT_ROWS ? B : GPU_LOGIT_ROWS;
    const int64_t n_items = B * K;
    void **bufs[] = {(void **)&g->x,
                     (void **)&g->h,
                     (void **)&g->q,
                     (void **)&g->k,
                     (void **)&g->v,
                     (void **)&g->qkv,
                     (void **)&g->att,
                     (void **)&g->attn_out,
                     (void **)&g->router_logits,
                     (void **)&g->topk_w,
                     (void **)&g->topk_ids,
                     (void **)&g->items,
                     (void **)&g->moe_h,
                     (void **)&g->attn_scratch,
                     (void **)&g->logits,
                     (void **)&g->pos};
    const tm_cuda_moe_params *moe = g->n_layers ? &g->layers[0].moe : NULL;
    const size_t sizes[] = {
        (size_t)(B * E) * 4,
        (size_t)(B * E) * 4,
        (size_t)(B * Q) * 4,
        (size_t)(B * KV) * 4,
        (size_t)(B * KV) * 4,
        (size_t)(TM_CUDA_MMVQ_MAX_TOK * (Q + 2 * KV)) * 4,
        (size_t)(B * Q) * 4,
        (size_t)(B * E) * 4,
        (size_t)(B * c->n_expert) * 4,
        (size_t)n_items * 4,
        (size_t)n_items * 4,
        (size_t)n_items * sizeof(tm_cuda_moe_item),
        moe ? (size_t)cuda_moe_scratch_floats(moe, TM_CUDA_MMVQ_MAX_TOK * K) * 4 : 0,
        (size_t)cuda_attention_scratch_floats(&g->attn, B, ctx->n_ctx) * 4,
        g->output ? (size_t)(logit_rows * c->n_vocab) * 4 : 0,
        64,
    };
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]) && st == TM_OK; i++)
        st = gpu_take(g, sizes[i] ? sizes[i] : 4, bufs[i]);
    /* scratch of the tensor-core products: the largest need of any of them */
    size_t scratch = 0;
    const int64_t mm[][3] = {{Q, E, B},
                             {KV, E, B},
                             {E, Q, B},
                             {c->n_expert, E, B},
                             {g->output ? c->n_vocab : 1, E, logit_rows}};
    for (size_t i = 0; i < sizeof(mm) / sizeof(mm[0]); i++) {
        const size_t b = cuda_gemm_scratch_bytes(mm[i][0], mm[i][1], mm[i][2]);
        scratch = b > scratch ? b : scratch;
    }
    if (moe) {
        const size_t b = cuda_moe_grouped_gemm_scratch_bytes(moe, n_items, (int32_t)c->n_expert);
        scratch = b > scratch ? b : scratch;
    }
    if (st == TM_OK) st = gpu_take(g, scratch, &g->scratch);
    return st;
}

static size_t gpu_size(tm_context *ctx, qwen3moe_gpu *g, int n_layers, bool output) {
    g->n_layers = n_layers, g->output = output, g->need = 0, g->pool = NULL;
    tm_status st = gpu_setup(ctx, g);
    TM_ASSERT(st == TM_OK); /* sizing allocates nothing and fails on nothing */
    return g->need;
}

void qwen3moe_gpu_free(tm_context *ctx) {
    qwen3moe_state *s = ctx->state;
    qwen3moe_gpu *g = s ? s->gpu : NULL;
    if (!g) return;
    cuda_graph_free(g->graph);
    cuda_blas_free(g->blas);
    cuda_pool_free(g->pool);
    cuda_device_close(g->dev);
    cuda_host_free(g->x_host), cuda_host_free(g->w_host), cuda_host_free(g->pos_host);
    cuda_host_free(g->ids_host), cuda_host_free(g->items_host);
    if (ctx->gpu_output) { /* ctx->logits was swapped for pinned memory */
        cuda_host_free(ctx->logits);
        ctx->logits = NULL;
    }
    moe_worklist_free(&g->wl);
    free(g->group_slots), free(g->group_starts), free(g->layers);
    free(g);
    s->gpu = NULL;
    ctx->n_gpu_layers = 0, ctx->gpu_output = false;
}

tm_status qwen3moe_gpu_create(tm_context *ctx) {
    const tm_model_config *c = &ctx->model->cfg;
    qwen3moe_state *s = ctx->state;
    const int want = ctx->params.n_gpu_layers;
    const bool automatic = want == TM_NGL_AUTO;
    ctx->n_gpu_layers = 0, ctx->gpu_output = false;
    if (want == 0) return TM_OK;
    if (want < TM_NGL_AUTO)
        return tm_error_set(TM_ERR_ARG, "-ngl %d: want a layer count >= 0 or auto", want);
    if (ctx->params.precise) {
        if (automatic) return TM_OK;
        return tm_error_set(TM_ERR_ARG,
                            "-ngl %d: the precise (double) reference runs on the CPU only", want);
    }

    qwen3moe_gpu *g = calloc(1, sizeof(*g));
    if (!g) return tm_error_set(TM_ERR_NOMEM, "out of memory");
    s->gpu = g;
    tm_status st = cuda_device_open(0, &g->dev);
    if (st != TM_OK) {
        if (!automatic) return st;
        tm_log_info("no usable GPU (%s): running on the CPU", tm_error_message());
        qwen3moe_gpu_free(ctx);
        return TM_OK;
    }
    g->s = cuda_device_stream(g->dev);
    g->attn = (tm_cuda_attn_params){(int32_t)c->n_head,   (int32_t)c->n_head_kv,
                                    (int32_t)c->head_dim, ctx->n_ctx,
                                    ctx->params.kv_type,  1.0f / sqrtf((float)c->head_dim),
                                    c->rms_eps,           c->rope_base};
    g->router = (tm_cuda_router_params){TM_CUDA_GATING_SOFTMAX, (int32_t)c->n_expert,
                                        (int32_t)c->n_expert_used, 1, 1.0f};
    if (!(g->layers = calloc(c->n_layer, sizeof(gpu_layer)))) {
        qwen3moe_gpu_free(ctx);
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    }

    /* how many layers: as asked, or (auto) as many as the free memory holds */
    int n = automatic || want > (int)c->n_layer ? (int)c->n_layer : want;
    bool output = n == (int)c->n_layer;
    size_t free_b = 0, total_b = 0;
    if ((st = cuda_device_memory(g->dev, &free_b, &total_b))) {
        qwen3moe_gpu_free(ctx);
        return st;
    }
    size_t need = gpu_size(ctx, g, n, output);
    while (automatic && n > 0 && need + GPU_RESERVE > free_b) {
        n--, output = false;
        need = gpu_size(ctx, g, n, output);
    }
    if (automatic && n == 0) {
        tm_log_info("the GPU has %.2f GiB free, too little for one layer: running on the CPU",
                    free_b / 1073741824.0);
        qwen3moe_gpu_free(ctx);
        return TM_OK;
    }
    if ((st = cuda_pool_create(g->dev, need, &g->pool))) { /* names needed and free bytes */
        qwen3moe_gpu_free(ctx);
        return tm_error_set(st, "%s (-ngl %d: %d layers%s on the GPU; try a smaller -ngl)",
                            tm_error_message(), want, n, output ? " and the output head" : "");
    }
    g->n_layers = n, g->output = output;
    const uint64_t t0 = tm_time_ns();
    if ((st = gpu_setup(ctx, g)) || (st = cuda_blas_create(g->dev, &g->blas))) {
        qwen3moe_gpu_free(ctx);
        return st;
    }
    const int64_t B = ctx->params.n_batch, K = c->n_expert_used;
    if ((st = cuda_host_alloc((size_t)(B * c->n_embd) * 4, (void **)&g->x_host)) ||
        (st = cuda_host_alloc((size_t)(B * K) * 4, (void **)&g->w_host)) ||
        (st = cuda_host_alloc((size_t)(B * K) * 4, (void **)&g->ids_host)) ||
        (st = cuda_host_alloc(64, (void **)&g->pos_host)) ||
        (st = cuda_host_alloc((size_t)(B * K) * sizeof(tm_cuda_moe_item),
                              (void **)&g->items_host))) {
        qwen3moe_gpu_free(ctx);
        return st;
    }
    if (!(g->group_slots = malloc(c->n_expert * sizeof(int32_t))) ||
        !(g->group_starts = malloc((c->n_expert + 1) * sizeof(int64_t)))) {
        qwen3moe_gpu_free(ctx);
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    }
    if (output) { /* logits come back through pinned memory */
        void *pinned;
        if ((st = cuda_host_alloc((size_t)B * c->n_vocab * sizeof(float), &pinned))) {
            qwen3moe_gpu_free(ctx);
            return st;
        }
        free(ctx->logits);
        ctx->logits = pinned;
    }
    const char *graph = getenv("TIERMOE_CUDA_GRAPH");
    g->graph_off = graph && !strcmp(graph, "0");
    ctx->n_gpu_layers = n, ctx->gpu_output = output;
    const double secs = (tm_time_ns() - t0) * 1e-9;
    tm_log_info("GPU %s: %d of %u layers%s, %.2f GiB of %.2f GiB free; weights uploaded at %.1f "
                "GB/s (%.2f GB in %.2f s)",
                cuda_device_info(g->dev)->name, n, c->n_layer, output ? " and the output head" : "",
                need / 1073741824.0, free_b / 1073741824.0,
                g->upload_s > 0 ? g->upload_bytes / g->upload_s * 1e-9 : 0.0,
                g->upload_bytes * 1e-9, secs);
    return TM_OK;
}

/* ---- forward ---- */

static void emit(tm_context *ctx, const char *name, int layer, const void *data, int64_t n_tok,
                 int64_t n, bool is_int) {
    if (ctx->params.cb) ctx->params.cb(ctx->params.cb_ud, name, layer, data, n_tok, n, is_int);
}

/* Part timing for --profile: a sync per part (only when asked for). */
static tm_status gpu_prof(tm_context *ctx, qwen3moe_gpu *g, tm_prof_part part, uint64_t *t) {
    if (!ctx->params.profile) return TM_OK;
    tm_status st = cuda_stream_sync(g->s);
    const uint64_t now = tm_time_ns();
    model_prof_add(ctx, part, *t, now);
    *t = now;
    return st;
}

static tm_status gpu_matmul(qwen3moe_gpu *g, const gpu_matrix *m, const float *x, int64_t n_tok,
                            float *y) {
    if (n_tok <= TM_CUDA_MMVQ_MAX_TOK)
        return cuda_mmvq(m->type, m->data, m->row_bytes, m->rows, m->k, x, n_tok, y, g->s);
    return cuda_gemm(g->blas, m->type, m->data, m->row_bytes, m->rows, m->k, x, n_tok, y,
                     g->scratch, g->s);
}

/* x += Σ weight · expert(h) over the routed experts of a prompt batch: the
 * work list goes expert-major on the host, one group per expert. */
static tm_status gpu_moe_prompt(tm_context *ctx, qwen3moe_gpu *g, const gpu_layer *G,
                                int64_t n_tok) {
    const tm_model_config *c = &ctx->model->cfg;
    const int64_t K = c->n_expert_used;
    tm_status st;
    if ((st = cuda_copy_async(g->ids_host, g->topk_ids, (size_t)(n_tok * K) * 4, g->s)) ||
        (st = cuda_copy_async(g->w_host, g->topk_w, (size_t)(n_tok * K) * 4, g->s)) ||
        (st = cuda_stream_sync(g->s)) ||
        (st = moe_worklist_build(&g->wl, g->ids_host, g->w_host, n_tok, c->n_expert,
                                 c->n_expert_used, TM_MOE_PHASE_PROMPT)))
        return st;
    int32_t n_groups = 0;
    for (uint32_t e = 0; e < c->n_expert; e++)
        if (g->wl.expert_begin[e + 1] > g->wl.expert_begin[e]) {
            g->group_slots[n_groups] = (int32_t)e;
            g->group_starts[n_groups++] = g->wl.expert_begin[e];
        }
    g->group_starts[n_groups] = g->wl.n_slots;
    for (int64_t i = 0; i < g->wl.n_slots; i++) {
        const tm_moe_slot *sl = &g->wl.slots[i];
        g->items_host[i] = (tm_cuda_moe_item){sl->expert, sl->token, sl->weight};
    }
    if ((st = cuda_copy_async(g->items, g->items_host,
                              (size_t)g->wl.n_slots * sizeof(tm_cuda_moe_item), g->s)))
        return st;
    const tm_cuda_moe_groups groups = {n_groups, g->group_slots, g->group_starts, g->items};
    return cuda_moe_grouped_gemm(g->blas, &G->moe, &groups, g->h, n_tok, g->x, g->scratch, g->s);
}

/* One layer for n_tok tokens (x in g->x, positions from g->pos). */
static tm_status gpu_layer_run(tm_context *ctx, qwen3moe_gpu *g, int l, int64_t n_tok,
                               int64_t n_kv_max) {
    const tm_model_config *c = &ctx->model->cfg;
    const gpu_layer *G = &g->layers[l];
    const int64_t E = c->n_embd, Q = (int64_t)c->n_head * c->head_dim,
                  KV = (int64_t)c->n_head_kv * c->head_dim, K = c->n_expert_used;
    const bool decode = n_tok <= TM_CUDA_MMVQ_MAX_TOK;
    uint64_t t = tm_time_ns();
    tm_status st;

    /* attention */
    float *q = g->q, *k = g->k, *v = g->v;
    if ((st = cuda_rmsnorm(g->h, g->x, G->attn_norm, n_tok, E, c->rms_eps, g->s)) ||
        (st = gpu_prof(ctx, g, TM_PROF_NORM, &t)))
        return st;
    if (n_tok == 1 && G->wqkv.data) { /* one launch over the stacked rows */
        if ((st = gpu_matmul(g, &G->wqkv, g->h, 1, g->qkv))) return st;
        q = g->qkv, k = g->qkv + Q, v = g->qkv + Q + KV;
    } else if ((st = gpu_matmul(g, &G->wq, g->h, n_tok, q)) ||
               (st = gpu_matmul(g, &G->wk, g->h, n_tok, k)) ||
               (st = gpu_matmul(g, &G->wv, g->h, n_tok, v)))
        return st;
    if ((st = gpu_prof(ctx, g, TM_PROF_ATTN_PROJ, &t)) ||
        (st = cuda_attn_prepare(&g->attn, q, k, v, G->q_norm, G->k_norm, g->pos, n_tok, G->k_cache,
                                G->v_cache, g->s)) ||
        (st = cuda_attention(&g->attn, q, G->k_cache, G->v_cache, g->pos, n_tok, n_kv_max, g->att,
                             g->attn_scratch, g->s)) ||
        (st = gpu_prof(ctx, g, TM_PROF_ATTENTION, &t)) ||
        (st = gpu_matmul(g, &G->wo, g->att, n_tok, g->attn_out)) ||
        (st = gpu_prof(ctx, g, TM_PROF_ATTN_PROJ, &t)) ||
        (st = cuda_add_rmsnorm(g->x, g->attn_out, g->h, G->ffn_norm, n_tok, E, c->rms_eps, g->s)) ||
        (st = gpu_prof(ctx, g, TM_PROF_NORM, &t)))
        return st;

    /* mixture of experts: the residual stream takes the weighted expert sum directly */
    if ((st = gpu_matmul(g, &G->router, g->h, n_tok, g->router_logits)) ||
        (st = cuda_router_select(&g->router, g->router_logits, n_tok, g->topk_ids, g->topk_w,
                                 decode ? g->items : NULL, g->s)) ||
        (st = gpu_prof(ctx, g, TM_PROF_ROUTER, &t)))
        return st;
    if (ctx->params.cb) { /* the tracer and the tests see the routing as on the CPU */
        qwen3moe_state *s = ctx->state;
        if ((st = cuda_copy_async(s->topk_ids, g->topk_ids, (size_t)(n_tok * K) * 4, g->s)) ||
            (st = cuda_copy_async(s->topk_w, g->topk_w, (size_t)(n_tok * K) * 4, g->s)) ||
            (st = cuda_copy_async(s->router_logits, g->router_logits,
                                  (size_t)(n_tok * c->n_expert) * 4, g->s)) ||
            (st = cuda_stream_sync(g->s)))
            return st;
        emit(ctx, "router_logits", l, s->router_logits, n_tok, c->n_expert, false);
        emit(ctx, "topk_ids", l, s->topk_ids, n_tok, K, true);
        emit(ctx, "topk_weights", l, s->topk_w, n_tok, K, false);
    }
    if (decode) {
        /* the router wrote the work items */
        if ((st =
                 cuda_moe_grouped(&G->moe, g->items, n_tok * K, g->h, n_tok, g->x, g->moe_h, g->s)))
            return st;
    } else if ((st = gpu_moe_prompt(ctx, g, G, n_tok)))
        return st;
    if ((st = gpu_prof(ctx, g, TM_PROF_EXPERTS, &t))) return st;
    if (ctx->params.cb) {
        qwen3moe_state *s = ctx->state;
        if ((st = cuda_copy_async(s->x, g->x, (size_t)(n_tok * E) * 4, g->s)) ||
            (st = cuda_stream_sync(g->s)))
            return st;
        emit(ctx, "x_out", l, s->x, n_tok, E, false);
    }
    return TM_OK;
}

/* Final norm and the output head for rows [first, n_tok), in chunks, into ctx->logits. */
static tm_status gpu_output(tm_context *ctx, qwen3moe_gpu *g, int64_t first, int64_t n_tok) {
    const tm_model_config *c = &ctx->model->cfg;
    const int64_t E = c->n_embd, V = c->n_vocab;
    const int64_t chunk =
        ctx->params.n_batch < GPU_LOGIT_ROWS ? ctx->params.n_batch : GPU_LOGIT_ROWS;
    tm_status st =
        cuda_rmsnorm(g->h, g->x + first * E, g->output_norm, n_tok - first, E, c->rms_eps, g->s);
    for (int64_t r = 0; r < n_tok - first && st == TM_OK; r += chunk) {
        const int64_t n = n_tok - first - r < chunk ? n_tok - first - r : chunk;
        if ((st = gpu_matmul(g, &g->out, g->h + r * E, n, g->logits))) break;
        st = cuda_copy_async(ctx->logits + r * V, g->logits, (size_t)(n * V) * 4, g->s);
    }
    return st;
}

/* The layers (and output) of one step, as launched or as captured. */
static tm_status gpu_step(tm_context *ctx, qwen3moe_gpu *g, int64_t n_tok, bool all_logits,
                          int64_t n_kv_max) {
    tm_status st = TM_OK;
    for (int l = 0; l < g->n_layers && st == TM_OK; l++)
        st = gpu_layer_run(ctx, g, l, n_tok, n_kv_max);
    if (st == TM_OK && g->output) {
        uint64_t t = tm_time_ns();
        st = gpu_output(ctx, g, all_logits ? 0 : n_tok - 1, n_tok);
        if (st == TM_OK) st = gpu_prof(ctx, g, TM_PROF_OUTPUT, &t);
    }
    return st;
}

/* Decode steps replay one captured graph; its attention grid covers the whole
 * context (n_kv_max = n_ctx) so the same graph serves every position. */
static tm_status gpu_step_graph(tm_context *ctx, qwen3moe_gpu *g) {
    tm_status st;
    if (!g->graph) {
        if ((st = cuda_graph_begin(g->s))) return st;
        st = gpu_step(ctx, g, 1, false, ctx->n_ctx);
        tm_cuda_graph *graph = NULL;
        const tm_status end = cuda_graph_end(g->s, st == TM_OK, &graph);
        if (st != TM_OK) return st;
        if (end != TM_OK) { /* not capturable here: run without a graph from now on */
            tm_log_warn("CUDA graph capture failed (%s): decoding without a graph",
                        tm_error_message());
            g->graph_off = true;
            return gpu_step(ctx, g, 1, false, ctx->n_past + 1);
        }
        g->graph = graph;
    }
    return cuda_graph_launch(g->graph, g->s);
}

tm_status qwen3moe_gpu_forward(tm_context *ctx, const int32_t *tokens, int64_t n_tok,
                               bool all_logits, float *x_host) {
    const tm_model_config *c = &ctx->model->cfg;
    const qwen3moe_weights *w = ctx->model->weights;
    qwen3moe_gpu *g = ((qwen3moe_state *)ctx->state)->gpu;
    const int64_t E = c->n_embd;
    uint64_t t = tm_time_ns();
    tm_status st;

    for (int64_t i = 0; i < n_tok; i++) /* x = token_embd[tok], on the host from the mapped file */
        quant_row_dequantize(w->token_embd.type,
                             w->token_embd.data + (size_t)tokens[i] * w->token_embd.row_bytes,
                             g->x_host + i * E, E);
    g->pos_host[0] = (int32_t)ctx->n_past;
    if ((st = cuda_copy_async(g->x, g->x_host, (size_t)(n_tok * E) * 4, g->s)) ||
        (st = cuda_copy_async(g->pos, g->pos_host, sizeof(int32_t), g->s)))
        return st;
    model_prof_add(ctx, TM_PROF_EMBED, t, tm_time_ns());

    const bool graph =
        n_tok == 1 && g->output && !g->graph_off && !ctx->params.profile && !ctx->params.cb;
    if (graph)
        st = gpu_step_graph(ctx, g);
    else
        st = gpu_step(ctx, g, n_tok, all_logits, ctx->n_past + n_tok);
    if (st != TM_OK) return st;
    if (!g->output) /* the CPU layers go on from here */
        st = cuda_copy_async(x_host, g->x, (size_t)(n_tok * E) * 4, g->s);
    if (st == TM_OK) st = cuda_stream_sync(g->s);
    if (st == TM_OK && g->output)
        emit(ctx, "logits", -1, ctx->logits, all_logits ? n_tok : 1, c->n_vocab, false);
    return st;
}

#else /* no CUDA in this build */

tm_status qwen3moe_gpu_create(tm_context *ctx) {
    ctx->n_gpu_layers = 0, ctx->gpu_output = false;
    if (ctx->params.n_gpu_layers == TM_NGL_AUTO) {
        tm_log_info("this build has no CUDA backend: running on the CPU");
        return TM_OK;
    }
    return tm_error_set(TM_ERR_UNSUPPORTED,
                        "-ngl %d: this build has no CUDA backend (rebuild where nvcc is found, "
                        "or use -ngl 0)",
                        ctx->params.n_gpu_layers);
}

void qwen3moe_gpu_free(tm_context *ctx) {
    (void)ctx;
}

tm_status qwen3moe_gpu_forward(tm_context *ctx, const int32_t *tokens, int64_t n_tok,
                               bool all_logits, float *x_host) {
    (void)ctx, (void)tokens, (void)n_tok, (void)all_logits, (void)x_host;
    return tm_error_set(TM_ERR_UNSUPPORTED, "this build has no CUDA backend");
}

#endif
