/* The executor's GPU side: what the context keeps in VRAM and its ops, on
 * the kernels of src/cuda (through cuda.h only: the same code links with the
 * CUDA kernels, the no-CUDA stub, or the tests' host mock).
 *
 * exec_finalize allocates everything once, so nothing is allocated per token:
 *   weights pool: every tensor placed on the GPU, every vector tensor (norm
 *                 gains, biases: tiny, and ops on either side may read them),
 *                 a group's matrices back to back when they share a type;
 *   state pool:   KV caches of the GPU's layers, device activations, a group's
 *                 decode output row, the step's position and number, scratch
 *                 of the tensor-core products and of attention.
 * Products: matrix-vector kernels up to TM_CUDA_MMVQ_MAX_TOK rows, tensor
 * cores above. */
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/timing.h"
#include "exec/exec_internal.h"

static size_t align256(size_t n) {
    return (n + 255) & ~(size_t)255;
}

/* What gpu_pool_take takes of a pool for `bytes` (an empty buffer still gets a word). */
static size_t take_size(size_t bytes) {
    return align256(bytes ? bytes : 4);
}

static size_t tensor_bytes(const tm_gguf_tensor *t) {
    return (size_t)t->n_bytes;
}

/* The GPU ops run on now (an index of e->gpus). */
static int gpu_cur(const tm_exec *e) {
    return (int)(e->cur - e->gpus);
}

/* Whether tensor i lives on the GPU ops run on now. */
static bool on_this_gpu(const tm_exec *e, uint32_t i) {
    return e->tensor_dev[i] == TM_DEV_GPU && e->tensor_gpu[i] == gpu_cur(e);
}

/* Whether layer l runs on the GPU ops run on now. */
static bool layer_here(const tm_exec *e, uint32_t l) {
    return e->layer_dev[l] == TM_DEV_GPU && e->layer_gpu[l] == gpu_cur(e);
}

/* A group whose matrices all live on the GPU now set up with one type and row
 * length is stacked: uploaded back to back, so its rows form one matrix. */
static bool group_stackable(const tm_exec *e, const exec_group *g) {
    for (int i = 0; i < g->n; i++) {
        const tm_weight *w = g->ws[i];
        if (!on_this_gpu(e, (uint32_t)w->id) || w->type != g->ws[0]->type ||
            w->ne[0] != g->ws[0]->ne[0] || w->row_bytes != g->ws[0]->row_bytes)
            return false;
    }
    return true;
}

static bool in_stacked_group(const tm_exec *e, uint32_t id) {
    for (int g = 0; g < e->n_groups; g++)
        if (group_stackable(e, &e->groups[g]))
            for (int i = 0; i < e->groups[g].n; i++)
                if ((uint32_t)e->groups[g].ws[i]->id == id) return true;
    return false;
}

/* Whether the GPU now set up keeps a copy of tensor i (vectors: every GPU). */
static bool on_gpu(const tm_exec *e, uint32_t i) {
    return on_this_gpu(e, i) || e->p.file->tensors[i].n_dims == 1;
}

static tm_status gpu_upload(tm_exec *e, void *dst, const void *src, size_t bytes) {
    const uint64_t t0 = tm_time_ns();
    tm_status st = cuda_upload(e->cur->gpu, dst, src, bytes, NULL);
    e->cur->upload_s += (tm_time_ns() - t0) * 1e-9, e->cur->upload_bytes += (double)bytes;
    return st;
}

static tm_status gpu_pool_take(tm_cuda_pool *pool, size_t bytes, void **out) {
    return cuda_pool_alloc(pool, bytes ? bytes : 4, 256, out);
}

static tm_status gpu_pool_add(tm_exec *e, size_t bytes, tm_cuda_pool **out) {
    tm_status st = exec_grow((void **)&e->cur->pools, &e->cur->cap_pools, e->cur->n_pools + 1,
                             sizeof(*e->cur->pools));
    if (st != TM_OK) return st;
    if ((st = cuda_pool_create(e->cur->gpu, bytes ? bytes : 256, out)) != TM_OK) return st;
    e->cur->pools[e->cur->n_pools++] = *out;
    return TM_OK;
}

tm_status exec_dev_alloc(tm_exec *e, size_t bytes, void **out) {
    *out = NULL;
    if (!e->cur->gpu) return tm_error_set(TM_ERR_ARG, "exec_dev_alloc: the context has no GPU");
    tm_cuda_pool *pool;
    tm_status st = gpu_pool_add(e, align256(bytes), &pool);
    return st == TM_OK ? gpu_pool_take(pool, bytes, out) : st;
}

/* The weights: sizes, then one pool, then the uploads. */
static tm_status gpu_weights(tm_exec *e) {
    const tm_gguf_file *f = e->p.file;
    size_t bytes = 0;
    for (uint32_t i = 0; i < e->n_tensors; i++)
        if (on_gpu(e, i)) bytes += take_size(tensor_bytes(&f->tensors[i]));
    tm_cuda_pool *pool;
    tm_status st = gpu_pool_add(e, bytes, &pool);
    if (st != TM_OK) return st;
    for (int g = 0; g < e->n_groups; g++) { /* stacked groups first, each back to back */
        exec_group *gr = &e->groups[g];
        if (!group_stackable(e, gr)) continue;
        size_t total = 0;
        for (int i = 0; i < gr->n; i++) total += tensor_bytes(&f->tensors[gr->ws[i]->id]);
        uint8_t *d;
        if ((st = gpu_pool_take(pool, total, (void **)&d))) return st;
        gr->stack = d;
        for (int i = 0; i < gr->n; i++) {
            const tm_gguf_tensor *t = &f->tensors[gr->ws[i]->id];
            if ((st = gpu_upload(e, d, t->data, tensor_bytes(t)))) return st;
            e->cur->wdev[gr->ws[i]->id] = d;
            d += tensor_bytes(t);
        }
    }
    for (uint32_t i = 0; i < e->n_tensors; i++) {
        if (!on_gpu(e, i) || e->cur->wdev[i] || in_stacked_group(e, i)) continue;
        const tm_gguf_tensor *t = &f->tensors[i];
        void *d;
        if ((st = gpu_pool_take(pool, tensor_bytes(t), &d)) ||
            (st = gpu_upload(e, d, t->data, tensor_bytes(t))))
            return st;
        e->cur->wdev[i] = d;
    }
    return TM_OK;
}

/* A layer's attention as the kernels take it: its cache holds n_seq sequences of
 * at->seq_rows rows each, a ring or a row a position. */
static tm_cuda_attn_params gpu_attn_params(const tm_exec *e, const exec_attn *at) {
    const tm_attn_desc *a = at->d;
    return (tm_cuda_attn_params){.n_head = (int32_t)a->n_head,
                                 .n_head_kv = (int32_t)a->n_head_kv,
                                 .head_dim = (int32_t)a->head_dim,
                                 .n_ctx = at->seq_rows * e->p.n_seq,
                                 .seq_rows = at->seq_rows,
                                 .ring = at->ring,
                                 .kv_type = e->p.kv_type,
                                 .scale = a->scale,
                                 .rms_eps = a->rms_eps,
                                 .rope_base = a->rope_base,
                                 .rope_freq = a->rope_freq ? at->rope_freq : NULL,
                                 .rope_mscale = a->rope_mscale,
                                 .window = a->window,
                                 .sinks = at->sinks,
                                 .precise = e->gpu_attn_f32,
                                 .n_rot = (int32_t)a->n_rot,
                                 .rope_interleaved = a->rope_interleaved,
                                 .v_norm = a->v_norm};
}

/* Scratch of the tensor-core products: the largest need of any GPU matrix. */
static size_t gpu_gemm_scratch(const tm_exec *e) {
    const tm_gguf_file *f = e->p.file;
    size_t most = 0;
    for (uint32_t i = 0; i < e->n_tensors; i++) {
        const tm_gguf_tensor *t = &f->tensors[i];
        if (!on_this_gpu(e, i) || t->n_dims != 2) continue;
        const size_t b = cuda_gemm_scratch_bytes(t->ne[1], t->ne[0], e->p.n_batch);
        most = b > most ? b : most;
    }
    return most;
}

/* Whether rows of this type, alignment and length take 8-bit activations: q8_0 and
 * low-bit rows the integer kernels read (the low-bit ones unless e->gpu_q8x_q8_0_only),
 * and q4_K ones when e->gpu_q8x_q4k is on. */
static bool gpu_q8x_rows(const tm_exec *e, tm_type type, uintptr_t align, int64_t k) {
    if (type == TM_TYPE_Q4_K && !e->gpu_q8x_q4k) return false;
    if (cuda_lbx_type(type) && e->gpu_q8x_q8_0_only) return false;
    return cuda_mmvq_q8x_ok(type, align, k);
}

/* Set e->gpu_q8x_q4k, e->gpu_q8x_q8_0_only and e->gpu_q8x_k, the longest row of a GPU
 * matrix whose decode products take 8-bit activations, in the normal mode (the precise
 * mode, a test reference, keeps f32 activations).
 * TIERMOE_MMVQ_Q8X=0 turns them off, =q4_K gives them to q4_K matrices too, =q8_0 keeps
 * them to q8_0 matrices (low-bit ones back on f32) (all for comparisons: H200, 30b-a3b
 * with q4_K attention, -ngl all, tg64 335.2 t/s with f32 activations for its q4_K
 * products against 330.1 with 8-bit ones, x8 985.6 against 988.2). 0: none. */
static void gpu_q8x_setup(tm_exec *e) {
    const char *env = getenv("TIERMOE_MMVQ_Q8X");
    e->gpu_q8x_k = 0;
    if (e->p.precise || (env && strcmp(env, "0") == 0)) return;
    e->gpu_q8x_q4k = env && strcmp(env, "q4_K") == 0;
    e->gpu_q8x_q8_0_only = env && strcmp(env, "q8_0") == 0;
    const tm_gguf_file *f = e->p.file;
    int64_t most = 0;
    for (uint32_t i = 0; i < e->n_tensors; i++) {
        const tm_gguf_tensor *t = &f->tensors[i];
        if (e->tensor_dev[i] != TM_DEV_GPU || t->n_dims != 2) continue;
        const size_t row_bytes = quant_row_size(t->type, t->ne[0]);
        if (gpu_q8x_rows(e, t->type, row_bytes, t->ne[0]) && t->ne[0] > most) most = t->ne[0];
    }
    e->gpu_q8x_k = most;
}

/* The first GPU layer with layer l's RoPE table (the same table and length: one
 * device copy for them), l itself when none before it; n_layer without a table. */
static uint32_t layer_rope_first(const tm_exec *e, uint32_t l) {
    const tm_attn_desc *s = &e->layer_shape[l];
    if (!s->rope_freq) return e->n_layer;
    for (uint32_t j = 0; j < l; j++)
        if (layer_here(e, j) && e->layer_shape[j].rope_freq == s->rope_freq &&
            e->layer_shape[j].head_dim == s->head_dim)
            return j;
    return l;
}

/* What the GPU now set up (e->cur) holds: its weights, its layers' caches, its
 * copy of every activation and its scratch. */
static tm_status gpu_finalize_one(tm_exec *e) {
    const uint64_t t0 = tm_time_ns();
    tm_status st;
    const size_t step_bytes = (size_t)(2 + 2 * e->p.n_batch) * sizeof(int32_t);
    if ((st = gpu_weights(e)) || (st = cuda_blas_create(e->cur->gpu, &e->cur->blas)) ||
        (st = cuda_event_create(&e->cur->done)) ||
        (e->p.profile && ((st = cuda_event_create(&e->cur->peer_ev[0])) ||
                          (st = cuda_event_create(&e->cur->peer_ev[1])))))
        return st;
    /* prompt attention on tensor cores in the normal mode; TIERMOE_ATTN_TC=0
     * keeps the f32 kernel (for comparison) */
    const char *tc = getenv("TIERMOE_ATTN_TC");
    e->gpu_attn_f32 = e->p.precise || (tc && strcmp(tc, "0") == 0);
    /* the state pool: sizes first (attention's scratch as for a layer without a ring:
     * a ring's keys are fewer) */
    const exec_attn shape = {.d = &e->attn_shape, .seq_rows = e->n_ctx_seq};
    const tm_cuda_attn_params ap = gpu_attn_params(e, &shape);
    bool gpu_attention = false, gpu_layers = false; /* the first: grouped-query attention */
    for (uint32_t l = 0; l < e->n_layer; l++) gpu_layers |= layer_here(e, l);
    gpu_attention = gpu_layers && !e->kv_latent;
    e->cur->gpu_scratch_bytes = gpu_gemm_scratch(e);
    /* attention splits the keys of a few tokens over blocks (scratch), not a
     * batch's; rows of several sequences each as many as one token alone */
    size_t attn_floats = 0;
    /* with a shape a layer: the most any GPU layer's shape needs */
    for (uint32_t l = 0; gpu_attention && l < (e->layer_shape ? e->n_layer : 1); l++) {
        if (e->layer_shape && !layer_here(e, l)) continue;
        const exec_attn ls = {.d = e->layer_shape ? &e->layer_shape[l] : &e->attn_shape,
                              .seq_rows = e->n_ctx_seq};
        const tm_cuda_attn_params al = gpu_attn_params(e, &ls);
        tm_cuda_attn_params apr = al;
        apr.row_pos = apr.row_seq = (const int32_t *)e; /* any non-NULL: only the plan is asked */
        for (int64_t n = 1; n <= TM_CUDA_MMVQ_MAX_TOK + 1; n++) {
            const int64_t rows = n <= TM_CUDA_MMVQ_MAX_TOK ? n : e->p.n_batch;
            size_t f = (size_t)cuda_attention_scratch_floats(&al, rows, e->n_ctx_seq);
            const size_t fr = (size_t)cuda_attention_scratch_floats(&apr, rows, e->n_ctx_seq);
            f = fr > f ? fr : f;
            attn_floats = f > attn_floats ? f : attn_floats;
        }
    }
    /* latent attention: the key splits' records of a decode step (a few tokens) */
    tm_cuda_attn_params apl = ap;
    apl.latent = true, apl.v_dim = (int32_t)e->attn_shape.v_dim;
    for (int64_t n = 1; gpu_layers && e->kv_latent && n <= 16; n++) {
        const size_t f = (size_t)cuda_mla_scratch_floats(&apl, n);
        attn_floats = f > attn_floats ? f : attn_floats;
    }
    const int64_t rot = e->kv_latent ? e->attn_shape.n_rot : e->attn_shape.head_dim;
    const size_t rope_bytes = e->rope_freq && gpu_layers ? (size_t)(rot / 2) * sizeof(float) : 0;
    /* per-head products: one batched GEMM's scratch, or the precise mode's gathers */
    size_t heads_bytes = (size_t)(e->p.n_batch * e->heads_width) * sizeof(float);
    heads_bytes = e->heads_gemm_bytes > heads_bytes ? e->heads_gemm_bytes : heads_bytes;
    /* a shape a layer: each GPU layer's RoPE table, one copy a table */
    size_t layer_rope_bytes = 0;
    for (uint32_t l = 0; e->layer_shape && l < e->n_layer; l++)
        if (layer_here(e, l) && layer_rope_first(e, l) == l)
            layer_rope_bytes += take_size((size_t)(e->layer_shape[l].head_dim / 2) * sizeof(float));
    const size_t n_kv = e->kv_latent ? 1 : 2; /* K and V, or a latent's K */
    gpu_q8x_setup(e);
    const size_t q8x_bytes = cuda_q8x_bytes(e->gpu_q8x_k, TM_CUDA_MMVQ_MAX_TOK);
    size_t bytes = take_size(step_bytes) + take_size(e->cur->gpu_scratch_bytes) +
                   take_size(attn_floats * sizeof(float)) + take_size(q8x_bytes) +
                   take_size(rope_bytes) + take_size(heads_bytes) + layer_rope_bytes;
    for (uint32_t l = 0; l < e->n_layer; l++)
        if (layer_here(e, l)) bytes += n_kv * take_size(e->kv_bytes[l]);
    for (int i = 0; i < e->n_acts; i++)
        bytes += take_size((size_t)(e->acts[i]->dev_rows * e->acts[i]->n) * 4);
    for (int g = 0; g < e->n_groups; g++)
        if (e->groups[g].stack && on_this_gpu(e, (uint32_t)e->groups[g].ws[0]->id))
            bytes += take_size((size_t)e->groups[g].rows * 4);
    tm_cuda_pool *pool;
    if ((st = gpu_pool_add(e, bytes, &pool)) ||
        (st = gpu_pool_take(pool, step_bytes, (void **)&e->cur->step_dev)) ||
        (st = gpu_pool_take(pool, e->cur->gpu_scratch_bytes, &e->cur->gpu_scratch)) ||
        (st = gpu_pool_take(pool, attn_floats * sizeof(float), (void **)&e->cur->gpu_attn)) ||
        (st = gpu_pool_take(pool, q8x_bytes, &e->cur->gpu_q8x)) ||
        (st = gpu_pool_take(pool, heads_bytes, (void **)&e->cur->gpu_heads)))
        return st;
    if (rope_bytes && ((st = gpu_pool_take(pool, rope_bytes, (void **)&e->cur->rope_freq_dev)) ||
                       (st = gpu_upload(e, e->cur->rope_freq_dev, e->rope_freq, rope_bytes))))
        return st;
    for (uint32_t l = 0; e->layer_shape && l < e->n_layer && st == TM_OK; l++) {
        const float *tab = e->layer_shape[l].rope_freq;
        if (!layer_here(e, l) || !tab) continue;
        const uint32_t first = layer_rope_first(e, l);
        const size_t b = (size_t)(e->layer_shape[l].head_dim / 2) * sizeof(float);
        if (first < l)
            e->layer_rope_dev[l] = e->layer_rope_dev[first];
        else if ((st = gpu_pool_take(pool, b, (void **)&e->layer_rope_dev[l])) == TM_OK)
            st = gpu_upload(e, e->layer_rope_dev[l], tab, b);
    }
    for (uint32_t l = 0; l < e->n_layer && st == TM_OK; l++)
        if (layer_here(e, l) &&
            ((st = gpu_pool_take(pool, e->kv_bytes[l], &e->k_cache[l])) == TM_OK) && !e->kv_latent)
            st = gpu_pool_take(pool, e->kv_bytes[l], &e->v_cache[l]);
    for (int i = 0; i < e->n_acts && st == TM_OK; i++) {
        tm_act *a = e->acts[i];
        st = gpu_pool_take(pool, (size_t)(a->dev_rows * a->n) * 4, &a->dev_gpu[gpu_cur(e)]);
    }
    for (int g = 0; g < e->n_groups && st == TM_OK; g++)
        if (e->groups[g].stack && on_this_gpu(e, (uint32_t)e->groups[g].ws[0]->id))
            st = gpu_pool_take(pool, (size_t)e->groups[g].rows * 4, (void **)&e->groups[g].out);
    if (st != TM_OK) return st;
    size_t free_b = 0, total_b = 0;
    cuda_device_memory(e->cur->gpu, &free_b, &total_b);
    size_t held = 0;
    for (int i = 0; i < e->cur->n_pools; i++) held += cuda_pool_size(e->cur->pools[i]);
    tm_log_info("GPU %s: %.2f GiB held (%.2f GB of weights uploaded at %.1f GB/s), %.2f GiB "
                "free; set up in %.2f s",
                cuda_device_info(e->cur->gpu)->name, held / 1073741824.0,
                e->cur->upload_bytes * 1e-9,
                e->cur->upload_s > 0 ? e->cur->upload_bytes / e->cur->upload_s * 1e-9 : 0.0,
                free_b / 1073741824.0, (tm_time_ns() - t0) * 1e-9);
    return TM_OK;
}

tm_status exec_gpu_finalize(tm_exec *e) {
    const size_t step_bytes = (size_t)(2 + 2 * e->p.n_batch) * sizeof(int32_t);
    tm_status st = cuda_host_alloc(step_bytes, (void **)&e->step_host);
    if (st != TM_OK) return st;
    memset(e->step_host, 0, step_bytes);
    /* each GPU's memory with that GPU current (its pools must be made there) */
    for (int g = 0; g < e->n_gpus && st == TM_OK; g++) {
        e->cur = &e->gpus[g];
        if ((st = cuda_device_select(e->cur->gpu)) == TM_OK) st = gpu_finalize_one(e);
    }
    e->cur = &e->gpus[0];
    for (int i = 0; i < e->n_acts; i++)
        e->acts[i]->dev = e->acts[i]->dev_own = e->acts[i]->dev_gpu[0];
    return st == TM_OK ? exec_select(e) : st;
}

void exec_gpu_free(tm_exec *e) {
    for (int n = 0; n <= TM_CUDA_MMVQ_MAX_TOK; n++)
        cuda_graph_free(e->graphs[n].g), e->graphs[n].g = NULL;
    for (int g = 0; g < e->n_gpus; g++) {
        exec_gpu_state *s = &e->gpus[g];
        if (s->gpu) cuda_device_select(s->gpu); /* its pools are freed on it */
        cuda_blas_free(s->blas);
        if (s->done) cuda_event_free(s->done);
        for (int i = 0; i < 2; i++)
            if (s->peer_ev[i]) cuda_event_free(s->peer_ev[i]), s->peer_ev[i] = NULL;
        for (int i = 0; i < s->n_pools; i++) cuda_pool_free(s->pools[i]);
        free(s->pools);
        cuda_device_close(s->gpu);
        s->blas = NULL, s->pools = NULL, s->n_pools = s->cap_pools = 0, s->done = NULL;
        s->gpu = NULL;
    }
    cuda_host_free(e->step_host);
    e->step_host = NULL;
    e->cur = &e->gpus[0];
}

/* ---- ops ---- */

static tm_status gpu_rmsnorm_op(tm_exec *e, float *y, const float *x, const float *w, int64_t rows,
                                int64_t n, float eps) {
    return cuda_rmsnorm(y, x, w, rows, n, eps, e->cur->stream);
}

static tm_status gpu_add_rmsnorm_op(tm_exec *e, float *x, const float *a, float *h, const float *w,
                                    int64_t rows, int64_t n, float eps) {
    return cuda_add_rmsnorm(x, a, h, w, rows, n, eps, e->cur->stream);
}

static tm_status gpu_matmul_op(tm_exec *e, const exec_matrix *m, const float *x, int64_t rows,
                               float *y) {
    if (rows <= TM_CUDA_MMVQ_MAX_TOK) {
        if (m->k <= e->gpu_q8x_k &&
            gpu_q8x_rows(e, m->type, (uintptr_t)m->data | m->row_bytes, m->k)) {
            tm_status st = cuda_q8x_quantize(x, m->k, rows, e->cur->gpu_q8x, e->cur->stream);
            return st != TM_OK ? st
                               : cuda_mmvq_q8x(m->type, m->data, m->row_bytes, m->rows, m->k,
                                               e->cur->gpu_q8x, rows, y, e->cur->stream);
        }
        return cuda_mmvq(m->type, m->data, m->row_bytes, m->rows, m->k, x, rows, y, e->cur->stream);
    }
    const size_t need = cuda_gemm_scratch_bytes(m->rows, m->k, rows);
    if (need > e->cur->gpu_scratch_bytes)
        return tm_error_set(TM_ERR_ARG,
                            "GPU product of %lld x %lld for %lld rows needs %zu bytes "
                            "of scratch, %zu were sized",
                            (long long)m->rows, (long long)m->k, (long long)rows, need,
                            e->cur->gpu_scratch_bytes);
    return cuda_gemm(e->cur->blas, m->type, m->data, m->row_bytes, m->rows, m->k, x, rows, y,
                     e->cur->gpu_scratch, e->cur->stream);
}

static tm_status gpu_matmul_n_op(tm_exec *e, int n, const exec_matrix *ms, const float *x,
                                 int64_t rows, float *const *ys) {
    for (int i = 0; i < n; i++) {
        tm_status st = gpu_matmul_op(e, &ms[i], x, rows, ys[i]);
        if (st != TM_OK) return st;
    }
    return TM_OK;
}

/* Latent attention (MLA): its key row prepared and stored, then every head over the
 * sequence's rows; each row at its position (the kernels read them from device memory,
 * so a captured graph replays anywhere). */
static tm_status gpu_attention_latent(tm_exec *e, const exec_attn *a, float *q, float *k,
                                      float *out, int64_t rows) {
    tm_cuda_attn_params p = gpu_attn_params(e, a);
    p.latent = true, p.v_dim = (int32_t)a->d->v_dim;
    p.row_pos = exec_row_pos_dev(e), p.row_seq = exec_row_seq_dev(e);
    tm_status st =
        cuda_mla_prepare(&p, q, k, a->k_norm, e->cur->step_dev, rows, a->k_cache, e->cur->stream);
    return st ? st
              : cuda_mla_attention(&p, q, a->k_cache, e->cur->step_dev, rows, out, e->cur->gpu_attn,
                                   e->cur->stream);
}

/* exec_gpu_matmul_heads in the precise mode: a product a head in f32 (a batch's rows
 * gathered into e->cur->gpu_heads and scattered back). */
static tm_status gpu_matmul_heads_each(tm_exec *e, const tm_weight *w, const uint8_t *base,
                                       const float *x, int64_t xn, float *y, int64_t yn) {
    const int64_t H = w->ne[2], in = w->ne[0], out = w->ne[1], T = e->n_tok, xs = xn / H,
                  ys = yn / H;
    float *gx = e->cur->gpu_heads,
          *gy = e->cur->gpu_heads + T * in; /* a head's rows, its product */
    tm_status st = TM_OK;
    for (int64_t h = 0; h < H && st == TM_OK; h++) {
        const exec_matrix m = {base + (size_t)(h * out) * w->row_bytes, w->type, w->row_bytes, in,
                               out};
        if (T == 1) { /* one row: the head's values are contiguous */
            st = gpu_matmul_op(e, &m, x + h * xs, 1, y + h * ys);
            continue;
        }
        if ((st = cuda_copy_rows(gx, in, x + h * xs, xn, T, in, e->cur->stream)) ||
            (st = gpu_matmul_op(e, &m, gx, T, gy)))
            break;
        st = cuda_copy_rows(y + h * ys, yn, gy, out, T, out, e->cur->stream);
    }
    return st;
}

tm_status exec_gpu_matmul_heads(tm_exec *e, const tm_weight *w, const float *x, int64_t xn,
                                float *y, int64_t yn, int64_t n_pass) {
    const int64_t H = w->ne[2], in = w->ne[0], out = w->ne[1], T = e->n_tok, xs = xn / H,
                  ys = yn / H;
    const uint8_t *base = exec_weight_dev(e, w);
    /* one batched product on tensor cores (f16 inputs); the precise mode keeps a product a
     * head in f32 (a launch a head: with DeepSeek-V3's 128 heads 256 launches a layer; H200,
     * 9 layers, -ngl all: tg128 99 t/s against llama.cpp's 280, 2026-11-29) */
    tm_status st = e->p.precise
                       ? gpu_matmul_heads_each(e, w, base, x, xn, y, yn)
                       : cuda_gemm_heads(e->cur->blas, w->type, base, w->row_bytes, in, out, H, x,
                                         xn, xs, T, y, yn, ys, e->cur->gpu_heads, e->cur->stream);
    /* the carried values: row t h of [T H][xs] to [T H][ys] */
    if (st == TM_OK && n_pass)
        st = cuda_copy_rows(y + out, ys, x + in, xs, T * H, n_pass, e->cur->stream);
    return st;
}

static tm_status gpu_attention_op(tm_exec *e, const exec_attn *a, float *q, float *k,
                                  const float *v, float *out, int64_t rows) {
    if (a->d->latent) return gpu_attention_latent(e, a, q, k, out, rows);
    tm_cuda_attn_params p = gpu_attn_params(e, a);
    const int32_t *pos = e->cur->step_dev; /* read when the kernels run: a graph replays as is */
    void *kc = a->k_cache, *vc = a->v_cache;
    int64_t n_kv_max;
    if (exec_rows_apart(e)) { /* each row at its position, over its sequence's cache rows */
        p.row_pos = exec_row_pos_dev(e), p.row_seq = exec_row_seq_dev(e);
        /* a captured step serves every position: its grid covers a whole sequence */
        n_kv_max = e->capturing ? e->n_ctx_seq : e->pos_max + 1;
    } else { /* one sequence's rows from pos: its cache rows as a cache of their own */
        const size_t base = (size_t)(e->seq0 * a->seq_rows) * (size_t)(p.n_head_kv * p.head_dim) *
                            (e->p.kv_type == TM_TYPE_F16 ? 2 : 4);
        kc = (uint8_t *)kc + base, vc = (uint8_t *)vc + base;
        p.n_ctx = a->seq_rows;
        n_kv_max = e->pos + rows;
    }
    /* K as V: the value is k as given (the kernel reads k without writing it) */
    const float *vv = a->d->v_is_k ? k : v;
    tm_status st =
        cuda_attn_prepare(&p, q, k, vv, a->q_norm, a->k_norm, pos, rows, kc, vc, e->cur->stream);
    if (st == TM_OK)
        st = cuda_attention(&p, q, kc, vc, pos, rows, n_kv_max, out, e->cur->gpu_attn,
                            e->cur->stream);
    return st;
}

static tm_status gpu_add_bias_op(tm_exec *e, float *y, const float *b, int64_t rows, int64_t n) {
    return cuda_add_bias(y, b, rows, n, e->cur->stream);
}

const exec_ops exec_gpu_ops = {
    .rmsnorm = gpu_rmsnorm_op,
    .add_rmsnorm = gpu_add_rmsnorm_op,
    .matmul = gpu_matmul_op,
    .matmul_n = gpu_matmul_n_op,
    .attention = gpu_attention_op,
    .add_bias = gpu_add_bias_op,
};
