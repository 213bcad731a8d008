/* The executor: setup (the context, activations, groups, attention and KV
 * caches), steps (eager or a captured CUDA graph), host tasks, profiling parts,
 * and the ops' entry points, each dispatched to the side its weight lives on
 * (where activations and ops live: exec_residency.c). See exec.h and
 * docs/executor.md. */
#include "exec/exec_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/log.h"
#include "core/timing.h"

const char *const tm_dev_names[TM_DEV_COUNT] = {"CPU", "CUDA0"};

const char *const tm_prof_part_names[TM_PROF_COUNT] = {
    "embed", "norms+rope", "attn proj", "attention", "router", "experts", "output",
};

static const exec_ops *const exec_side_ops[TM_DEV_COUNT] = {&exec_cpu_ops, &exec_gpu_ops};

tm_status exec_grow(void **p, int *cap, int n, size_t size) {
    if (n <= *cap) return TM_OK;
    const int c = n > 2 * *cap ? n : 2 * *cap;
    void *q = realloc(*p, (size_t)c * size);
    if (!q) return tm_error_set(TM_ERR_NOMEM, "executor: out of memory");
    *p = q, *cap = c;
    return TM_OK;
}

/* ---- setup ---- */

tm_status exec_create(const tm_exec_params *p, tm_exec **out) {
    *out = NULL;
    /* gpus[] holds EXEC_MAX_GPUS: a count above it is a caller's bug, its devices unknown */
    if (p->n_gpus < 0 || p->n_gpus > EXEC_MAX_GPUS)
        return tm_error_set(TM_ERR_ARG, "executor: %d GPUs (0 .. %d)", p->n_gpus, EXEC_MAX_GPUS);
    tm_exec *e = calloc(1, sizeof(*e));
    if (!e) {
        for (int g = 0; g < p->n_gpus; g++) cuda_device_close(p->gpus[g]);
        return tm_error_set(TM_ERR_NOMEM, "executor: out of memory");
    }
    e->p = *p;
    e->cur = &e->gpus[0];
    e->n_gpus = p->n_gpus > 0 ? p->n_gpus : 1;
    for (int g = 0; g < p->n_gpus; g++) e->gpus[g].gpu = p->gpus[g];
    if (e->p.n_seq < 1) e->p.n_seq = 1;
    e->n_ctx_seq = p->n_ctx / e->p.n_seq;
    if (e->n_ctx_seq < 1 || p->n_ctx > INT32_MAX) {
        exec_free(e);
        return tm_error_set(TM_ERR_ARG,
                            "executor: a context of %lld positions for %d sequences (want at "
                            "least 1 a sequence, at most 2^31 in all)",
                            (long long)p->n_ctx, p->n_seq);
    }
    e->n_tensors = (uint32_t)p->file->n_tensors;
    e->tensor_dev = malloc(e->n_tensors ? e->n_tensors : 1);
    e->tensor_gpu = calloc(e->n_tensors ? e->n_tensors : 1, 1);
    bool wdev_ok = true;
    for (int g = 0; g < e->n_gpus; g++)
        wdev_ok &= (e->gpus[g].wdev =
                        calloc(e->n_tensors ? e->n_tensors : 1, sizeof(*e->gpus[g].wdev))) != NULL;
    e->row_pos = calloc((size_t)(p->n_batch > 0 ? p->n_batch : 1), sizeof(int32_t));
    e->row_seq = calloc((size_t)(p->n_batch > 0 ? p->n_batch : 1), sizeof(int32_t));
    if (!e->tensor_dev || !e->tensor_gpu || !wdev_ok || !e->row_pos || !e->row_seq) {
        exec_free(e);
        return tm_error_set(TM_ERR_NOMEM, "executor: out of memory");
    }
    memcpy(e->tensor_dev, p->tensor_dev, e->n_tensors);
    if (p->tensor_gpu) memcpy(e->tensor_gpu, p->tensor_gpu, e->n_tensors);
    for (uint32_t i = 0; i < e->n_tensors; i++)
        if (e->tensor_dev[i] == TM_DEV_GPU && e->tensor_gpu[i] >= e->n_gpus) {
            const tm_gguf_tensor *t = &p->file->tensors[i];
            const int g = e->tensor_gpu[i];
            exec_free(e);
            return tm_error_set(TM_ERR_ARG, "executor: tensor '%.*s' placed on GPU %d of %d",
                                (int)t->name.len, t->name.data, g, p->n_gpus);
        }
    /* spans: each GPU reads the activations of any other at a boundary with its own
     * kernel (a graph can capture it; cudaMemcpyPeerAsync it cannot) */
    for (int g = 0; g < e->n_gpus; g++)
        for (int h = 0; h < e->n_gpus; h++) {
            bool on = true;
            tm_status st = g == h || !e->gpus[g].gpu || !e->gpus[h].gpu
                               ? TM_OK
                               : cuda_device_peer_enable(e->gpus[g].gpu, e->gpus[h].gpu, &on);
            if (st != TM_OK) {
                exec_free(e);
                return st;
            }
            if (!on)
                tm_log_info("GPU %d has no peer access to GPU %d: activations cross through the "
                            "host, and decode steps run without a graph",
                            cuda_device_info(e->gpus[g].gpu)->index,
                            cuda_device_info(e->gpus[h].gpu)->index);
        }
    tm_status sel = exec_select(e); /* the pools below go to the current device */
    if (sel != TM_OK) {
        exec_free(e);
        return sel;
    }
    for (int g = 0; g < e->n_gpus; g++)
        if (e->gpus[g].gpu) e->gpus[g].stream = cuda_device_stream(e->gpus[g].gpu);
    const char *graph = getenv("TIERMOE_CUDA_GRAPH");
    e->graph_off = !p->graph || (graph && !strcmp(graph, "0"));
    *out = e;
    return TM_OK;
}

static void exec_act_release(tm_exec *e, tm_act *a) {
    if (e->cur->gpu)
        cuda_host_free(a->host);
    else
        free(a->host);
    a->host = a->dev = a->dev_own = NULL;
}

void exec_free(tm_exec *e) {
    if (!e) return;
    for (int g = 0; g < e->n_gpus; g++) /* nothing in flight may outlive its buffers */
        if (e->gpus[g].gpu) cuda_stream_sync(e->gpus[g].stream);
    for (int i = 0; i < e->n_acts; i++) exec_act_release(e, e->acts[i]);
    exec_cpu_free(e);
    exec_ssm_free(e);
    exec_gpu_free(e);
    if (e->k_cache)
        for (uint32_t l = 0; l < e->n_layer; l++)
            if (e->layer_dev[l] == TM_DEV_CPU)
                free(e->k_cache[l]), free(e->v_cache[l]); /* v NULL when latent */
    free(e->k_cache), free(e->v_cache), free(e->layer_dev);
    free(e->window), free(e->kv_rows), free(e->kv_bytes), free(e->layer_shape),
        free(e->layer_rope_dev);
    free(e->acts), free(e->groups);
    for (int n = 0; n <= TM_CUDA_MMVQ_MAX_TOK; n++) free(e->graphs[n].pre), free(e->graphs[n].post);
    for (int g = 0; g < e->n_gpus; g++) free(e->gpus[g].wdev);
    free(e->tensor_dev), free(e->tensor_gpu), free(e->layer_gpu), free(e->row_pos),
        free(e->row_seq);
    free(e->rope_freq);
    free(e);
}

tm_status exec_act_create(tm_exec *e, tm_act *a, const char *name, int64_t n, bool is_int,
                          int64_t dev_rows) {
    memset(a, 0, sizeof(*a));
    const int64_t rows = e->p.n_batch;
    a->name = name, a->n = n, a->rows = rows, a->is_int = is_int;
    a->dev_rows = dev_rows > 0 && dev_rows < rows ? dev_rows : rows;
    const size_t bytes = (size_t)(rows * n) * 4;
    tm_status st = exec_grow((void **)&e->acts, &e->cap_acts, e->n_acts + 1, sizeof(*e->acts));
    if (st != TM_OK) return st;
    if (e->cur->gpu) {
        if ((st = cuda_host_alloc(bytes, &a->host)) != TM_OK) return st;
    } else if (!(a->host = malloc(bytes ? bytes : 4))) {
        return tm_error_set(TM_ERR_NOMEM, "out of memory for activation '%s' (%lld x %lld)", name,
                            (long long)rows, (long long)n);
    }
    e->acts[e->n_acts++] = a;
    return TM_OK;
}

tm_status exec_weight_group(tm_exec *e, int n, const tm_weight *const *ws) {
    if (n < 1 || n > CPU_MATMUL_MAX)
        return tm_error_set(TM_ERR_ARG, "exec_weight_group: %d matrices (1..%d)", n,
                            CPU_MATMUL_MAX);
    tm_status st =
        exec_grow((void **)&e->groups, &e->cap_groups, e->n_groups + 1, sizeof(*e->groups));
    if (st != TM_OK) return st;
    exec_group *g = &e->groups[e->n_groups++];
    memset(g, 0, sizeof(*g));
    g->n = n;
    for (int i = 0; i < n; i++) g->ws[i] = ws[i], g->rows += ws[i]->ne[1];
    return TM_OK;
}

/* The caches' bytes in a log line: with rings, what they saved. */
static void exec_kv_log(const tm_exec *e, size_t row) {
    size_t bytes = 0, full = 0; /* full: without rings */
    uint32_t n_ring = 0, n_win = 0, n_kv = 0;
    int64_t lo = 0, hi = 0;                     /* the rings' rows */
    const size_t n_rows = e->kv_latent ? 1 : 2; /* K and V, or a latent's K alone */
    for (uint32_t l = 0; l < e->n_layer; l++) {
        bytes += n_rows * e->kv_bytes[l], n_win += e->window[l] > 0, n_kv += e->kv_bytes[l] > 0;
        if (e->kv_bytes[l]) /* the layer's row: its own with a shape a layer */
            full += n_rows * (size_t)e->p.n_ctx *
                    (e->kv_bytes[l] / ((size_t)e->kv_rows[l] * (size_t)e->p.n_seq));
        if (!exec_kv_ring(e, l)) continue;
        lo = n_ring && lo < e->kv_rows[l] ? lo : e->kv_rows[l];
        hi = hi > e->kv_rows[l] ? hi : e->kv_rows[l];
        n_ring++;
    }
    const bool big = full >= (size_t)1 << 30; /* GiB, else MiB */
    const double unit = big ? 1073741824.0 : 1048576.0;
    const char *u = big ? "GiB" : "MiB";
    char seqs[48] = "";
    if (e->p.n_seq > 1) snprintf(seqs, sizeof(seqs), " x %d sequences", e->p.n_seq);
    const char *type = e->p.kv_type == TM_TYPE_F16 ? "f16" : "f32";
    char layers[64];
    if (n_kv < e->n_layer) /* the others are linear attention's: no KV */
        snprintf(layers, sizeof(layers), "%u of %u layers", n_kv, e->n_layer);
    else
        snprintf(layers, sizeof(layers), "%u layers", n_kv);
    if (e->kv_latent) { /* the point of MLA: what a position costs */
        const tm_attn_desc *a = &e->attn_shape;
        tm_log_info("KV cache: %s of %lld positions%s (%s), latent: %lld values a position a "
                    "layer (latent %lld + RoPE key %lld; %zu bytes a position over the layers): "
                    "%.2f %s",
                    layers, (long long)e->n_ctx_seq, seqs, type, (long long)a->head_dim,
                    (long long)a->v_dim, (long long)(a->head_dim - a->v_dim), row * n_kv,
                    bytes / unit, u);
        return;
    }
    if (!n_ring) {
        tm_log_info("KV cache: %s of %lld positions%s (%s): %.2f %s%s", layers,
                    (long long)e->n_ctx_seq, seqs, type, bytes / unit, u,
                    n_win && e->p.kv_full ? " (sliding layers without rings: TIERMOE_KV_RING=0)"
                                          : "");
        return;
    }
    char rows[48];
    snprintf(rows, sizeof(rows), lo == hi ? "%lld" : "%lld-%lld", (long long)lo, (long long)hi);
    tm_log_info("KV cache: %s of %lld positions%s (%s), %u of them rings of %s rows: %.2f "
                "%s (%.2f %s without rings)",
                layers, (long long)e->n_ctx_seq, seqs, type, n_ring, rows, bytes / unit, u,
                full / unit, u);
}

static tm_status attention_setup(tm_exec *e, uint32_t n_layer, const uint8_t *layer_dev,
                                 const tm_attn_desc *shape, const tm_attn_desc *shapes,
                                 const int64_t *window);

tm_status exec_attention_setup(tm_exec *e, uint32_t n_layer, const uint8_t *layer_dev,
                               const tm_attn_desc *shape, const int64_t *window) {
    return attention_setup(e, n_layer, layer_dev, shape, NULL, window);
}

tm_status exec_attention_setup_layers(tm_exec *e, uint32_t n_layer, const uint8_t *layer_dev,
                                      const tm_attn_desc *shapes, const int64_t *window) {
    /* the scratch's shape: the most of each size */
    tm_attn_desc max = {.n_head = 1, .n_head_kv = 1, .head_dim = 2};
    for (uint32_t l = 0; l < n_layer; l++) {
        const tm_attn_desc *s = &shapes[l];
        if (s->latent || s->n_head < 1 || s->n_head_kv < 1 || s->head_dim < 2 || s->head_dim % 2 ||
            s->n_head % s->n_head_kv)
            return tm_error_set(TM_ERR_ARG,
                                "attention of layer %u: %lld heads, %lld KV heads of %lld values "
                                "(want KV heads dividing the heads, an even head, no latent)",
                                l, (long long)s->n_head, (long long)s->n_head_kv,
                                (long long)s->head_dim);
        if (s->n_head > max.n_head) max.n_head = s->n_head;
        if (s->n_head_kv > max.n_head_kv) max.n_head_kv = s->n_head_kv;
        if (s->head_dim > max.head_dim) max.head_dim = s->head_dim;
    }
    if (!(e->layer_shape = malloc((n_layer ? n_layer : 1) * sizeof(*e->layer_shape))) ||
        !(e->layer_rope_dev = calloc(n_layer ? n_layer : 1, sizeof(*e->layer_rope_dev))))
        return tm_error_set(TM_ERR_NOMEM, "executor: out of memory");
    memcpy(e->layer_shape, shapes, n_layer * sizeof(*shapes));
    return attention_setup(e, n_layer, layer_dev, &max, shapes, window);
}

static tm_status attention_setup(tm_exec *e, uint32_t n_layer, const uint8_t *layer_dev,
                                 const tm_attn_desc *shape, const tm_attn_desc *shapes,
                                 const int64_t *window) {
    e->n_layer = n_layer;
    e->attn_shape = *shape;
    e->kv_latent = shape->latent;
    if (shape->latent && (shape->n_head_kv != 1 || shape->v_dim < 1 || shape->n_rot < 2 ||
                          shape->n_rot % 2 || shape->v_dim + shape->n_rot != shape->head_dim))
        return tm_error_set(TM_ERR_ARG,
                            "latent attention: %lld KV heads of %lld values, latent %lld, RoPE "
                            "%lld (expected one KV head of latent + RoPE values, RoPE even)",
                            (long long)shape->n_head_kv, (long long)shape->head_dim,
                            (long long)shape->v_dim, (long long)shape->n_rot);
    if (shape->rope_freq) { /* kept: the GPU gets a copy at exec_finalize */
        const int64_t rot = shape->latent && shape->n_rot ? shape->n_rot : shape->head_dim;
        const size_t bytes = (size_t)(rot / 2) * sizeof(float);
        if (!(e->rope_freq = malloc(bytes)))
            return tm_error_set(TM_ERR_NOMEM, "executor: out of memory");
        memcpy(e->rope_freq, shape->rope_freq, bytes);
        e->attn_shape.rope_freq = e->rope_freq;
    }
    const size_t nl = n_layer ? n_layer : 1;
    e->layer_dev = malloc(nl);
    if (!(e->layer_gpu = calloc(nl, 1)))
        return tm_error_set(TM_ERR_NOMEM, "executor: out of memory");
    if (e->p.layer_gpu) memcpy(e->layer_gpu, e->p.layer_gpu, n_layer);
    e->k_cache = calloc(nl, sizeof(void *));
    e->v_cache = calloc(nl, sizeof(void *));
    e->window = calloc(nl, sizeof(int64_t));
    e->kv_rows = calloc(nl, sizeof(int64_t));
    e->kv_bytes = calloc(nl, sizeof(size_t));
    if (!e->layer_dev || !e->k_cache || !e->v_cache || !e->window || !e->kv_rows || !e->kv_bytes)
        return tm_error_set(TM_ERR_NOMEM, "executor: out of memory");
    memcpy(e->layer_dev, layer_dev, n_layer);
    const size_t kv_type = e->p.kv_type == TM_TYPE_F16 ? 2 : 4;
    const size_t row = (size_t)(shape->n_head_kv * shape->head_dim) * kv_type;
    for (uint32_t l = 0; l < n_layer; l++) {
        const tm_attn_desc *s = shapes ? &shapes[l] : shape;
        e->window[l] = window && (window[l] > 0 || window[l] == EXEC_NO_ATTENTION) ? window[l] : 0;
        e->kv_rows[l] = exec_kv_rows(e->n_ctx_seq, e->p.n_batch, e->window[l], e->p.kv_full);
        e->kv_bytes[l] = (size_t)e->kv_rows[l] * (size_t)e->p.n_seq *
                         (size_t)(s->n_head_kv * s->head_dim) * kv_type;
    }
    exec_kv_log(e, row);
    for (uint32_t l = 0; l < n_layer; l++) {
        if (layer_dev[l] == TM_DEV_GPU && (!e->cur->gpu || e->layer_gpu[l] >= e->n_gpus))
            return tm_error_set(TM_ERR_ARG,
                                "layer %u placed on GPU %d, which the context does not have", l,
                                e->layer_gpu[l]);
        if (e->layer_dev[l] != TM_DEV_CPU || !e->kv_bytes[l]) continue; /* the GPU's at finalize */
        if (!(e->k_cache[l] = malloc(e->kv_bytes[l])) ||
            (!e->kv_latent && !(e->v_cache[l] = malloc(e->kv_bytes[l]))))
            return tm_error_set(TM_ERR_NOMEM,
                                "out of memory for the KV cache of layer %u (%.1f MiB)", l,
                                (e->kv_latent ? 1.0 : 2.0) * e->kv_bytes[l] / 1048576.0);
    }
    return TM_OK;
}

int64_t exec_kv_rows(int64_t n_ctx_seq, int64_t n_batch, int64_t window, bool kv_full) {
    if (window < 0) return 0; /* EXEC_NO_ATTENTION */
    /* a ring: the window before a step's first token, and the step */
    const int64_t ring = window + n_batch;
    return window > 0 && !kv_full && ring < n_ctx_seq ? ring : n_ctx_seq;
}

int64_t exec_kv_keep(const tm_exec *e, int64_t n_written, int64_t n_keep) {
    for (uint32_t l = 0; l < e->n_layer; l++) {
        if (!exec_kv_ring(e, l)) continue;
        /* position n_keep sees keys from `first` on; the write of position p took the row
         * of p - rows, so they are there while nothing past first + rows - 1 was written */
        const int64_t first = n_keep + 1 - e->window[l];
        if (n_written > (first > 0 ? first : 0) + e->kv_rows[l]) return 0;
    }
    return n_keep;
}

int64_t exec_kv_ring(const tm_exec *e, uint32_t layer) {
    /* fewer rows than a sequence's positions: a ring */
    return layer < e->n_layer && e->kv_rows[layer] < e->n_ctx_seq ? e->kv_rows[layer] : 0;
}

tm_status exec_finalize(tm_exec *e) {
    tm_status st = exec_cpu_finalize(e);
    if (st == TM_OK && e->cur->gpu) st = exec_gpu_finalize(e);
    return st;
}

static void exec_prof_charge(tm_exec *e, uint64_t now);

/* ---- host tasks ---- */

tm_status exec_not_capturable(tm_exec *e, const char *what) {
    e->capture_failed = true;
    return tm_error_set(TM_ERR_UNSUPPORTED, "a captured decode step cannot %s", what);
}

static void exec_task_run(tm_exec *e, exec_task t) {
    const tm_status st = t.fn(t.ud);
    if (st != TM_OK && e->task_status == TM_OK) {
        e->task_status = st;
        snprintf(e->task_msg, sizeof(e->task_msg), "%s", tm_error_message());
    }
}

static void exec_pending_run(tm_exec *e) {
    const exec_task t = e->pending;
    if (!t.fn) return;
    e->pending = (exec_task){0};
    exec_task_run(e, t);
}

static tm_status exec_record(exec_task **list, int *n, int *cap, tm_exec_task_fn fn, void *ud) {
    tm_status st = exec_grow((void **)list, cap, *n + 1, sizeof(**list));
    if (st == TM_OK) (*list)[(*n)++] = (exec_task){fn, ud};
    return st;
}

tm_status exec_host_task(tm_exec *e, tm_exec_task_fn fn, void *ud) {
    if (e->capturing) return exec_record(&e->rec->post, &e->rec->n_post, &e->rec->cap_post, fn, ud);
    exec_pending_run(e);
    if (e->p.profile) /* per-part times stay clean: no overlap with the next layer's ops */
        exec_task_run(e, (exec_task){fn, ud});
    else
        e->pending = (exec_task){fn, ud};
    return TM_OK;
}

void exec_step_check(tm_exec *e, tm_exec_task_fn fn, void *ud) {
    e->check = (exec_task){fn, ud};
}

/* The step's last wait, then the step check. */
static tm_status exec_step_end(tm_exec *e) {
    tm_status st = exec_sync(e);
    if (e->check.fn) {
        const tm_status c = e->check.fn(e->check.ud);
        if (st == TM_OK) st = c;
    }
    exec_prof_charge(e, tm_time_ns());
    return st;
}

tm_status exec_sync(tm_exec *e) {
    if (e->capturing) return exec_not_capturable(e, "wait for the stream");
    exec_pending_run(e);
    tm_status st = TM_OK;
    for (int g = 0; g < e->n_gpus && st == TM_OK; g++)
        if (e->gpus[g].gpu) st = cuda_stream_sync(e->gpus[g].stream);
    if (st == TM_OK && e->task_status != TM_OK)
        st = tm_error_set(e->task_status, "%s", e->task_msg);
    return st;
}

/* ---- steps ---- */

static void exec_prof_charge(tm_exec *e, uint64_t now) {
    e->prof_ns[e->part] += now - e->part_t0;
    e->part_t0 = now;
}

tm_status exec_part(tm_exec *e, tm_prof_part part) {
    if (e->capturing) {
        e->part = part;
        return TM_OK;
    }
    if (e->p.profile && e->cur->gpu) {
        tm_status st = exec_sync(e);
        if (st != TM_OK) return st;
    }
    exec_prof_charge(e, tm_time_ns());
    e->part = part;
    return TM_OK;
}

const uint64_t *exec_prof_ns(const tm_exec *e) {
    return e->prof_ns;
}

void exec_step_counts(const tm_exec *e, uint64_t *steps, uint64_t *rows) {
    *steps = e->n_steps, *rows = e->n_rows;
}

static tm_status exec_embed_rows(void *ud) {
    tm_exec *e = ud;
    const tm_weight *w = e->embed_w;
    float *x = e->embed_x->host;
    for (int64_t t = 0; t < e->n_tok; t++)
        quant_row_dequantize(w->type, w->data + (size_t)e->tokens[t] * w->row_bytes,
                             x + t * e->embed_x->n, e->embed_x->n);
    return TM_OK;
}

tm_status exec_embed(tm_exec *e, tm_act *x, const tm_weight *embd) {
    e->embed_x = x, e->embed_w = embd;
    exec_act_wrote(x, TM_DEV_CPU);
    if (e->capturing) /* each replay looks its token up before the launch */
        return exec_record(&e->rec->pre, &e->rec->n_pre, &e->rec->cap_pre, exec_embed_rows, e);
    return exec_embed_rows(e);
}

static void exec_step_reset(tm_exec *e) {
    e->cur = &e->gpus[0];
    for (int i = 0; i < e->n_acts; i++) {
        tm_act *a = e->acts[i];
        a->valid = 0, a->cross = NULL, a->dev = a->dev_own = a->dev_gpu[0];
    }
    e->task_status = TM_OK;
    e->pending = (exec_task){0};
}

static tm_status exec_step_info(tm_exec *e) {
    tm_status st = TM_OK;
    for (int g = 0; g < e->n_gpus && st == TM_OK; g++) /* each GPU's attention reads its own */
        if (e->gpus[g].gpu)
            st = cuda_copy_async(e->gpus[g].step_dev, e->step_host,
                                 (size_t)(2 + 2 * e->p.n_batch) * 4, e->gpus[g].stream);
    return st;
}

/* Replay the captured decode step: its embedding before the launch, its host
 * tasks (in order) while it runs. */
static tm_status exec_replay(tm_exec *e) {
    const exec_graph *g = e->rec;
    for (int i = 0; i < g->n_pre; i++) exec_task_run(e, g->pre[i]);
    tm_status st = cuda_graph_launch(g->g, e->gpus[0].stream); /* the stream it was captured on */
    if (st != TM_OK) return st;
    for (int i = 0; i < e->n_gpus; i++)
        e->gpus[i].peer.copies += g->peer[i].copies, e->gpus[i].peer.bytes += g->peer[i].bytes;
    for (int i = 0; i < g->n_post; i++) exec_task_run(e, g->post[i]);
    return exec_step_end(e);
}

/* Spans over several GPUs are one graph: the other GPUs' streams join the capture of
 * the first's (fork: they wait on its event, so their work becomes nodes of the graph)
 * and the first waits on each of theirs before the capture ends (join), as CUDA
 * requires of every stream that joined. */
static tm_status exec_capture_fork(tm_exec *e) {
    if (e->n_gpus < 2) return TM_OK;
    tm_status st = cuda_event_record(e->gpus[0].done, e->gpus[0].stream);
    for (int g = 1; g < e->n_gpus && st == TM_OK; g++)
        if (!(st = cuda_device_select(e->gpus[g].gpu)))
            st = cuda_stream_wait_event(e->gpus[g].stream, e->gpus[0].done);
    const tm_status sel = exec_select(e); /* e->cur: the first */
    return st != TM_OK ? st : sel;
}

static tm_status exec_capture_join(tm_exec *e) {
    if (e->n_gpus < 2) return TM_OK;
    tm_status st = TM_OK;
    for (int g = 1; g < e->n_gpus && st == TM_OK; g++)
        if (!(st = cuda_device_select(e->gpus[g].gpu)) &&
            !(st = cuda_event_record(e->gpus[g].done, e->gpus[g].stream)))
            st = cuda_stream_wait_event(e->gpus[0].stream, e->gpus[g].done);
    e->cur = &e->gpus[0];
    const tm_status sel = exec_select(e);
    return st != TM_OK ? st : sel;
}

/* Capture the step's forward as a graph. *captured false: it cannot be
 * captured (a CPU op, a wait for the stream), nothing ran, run it eagerly. */
static tm_status exec_capture(tm_exec *e, tm_exec_forward_fn forward, void *ud, bool *captured) {
    *captured = false;
    e->rec->n_pre = e->rec->n_post = 0;
    memset(e->rec->peer, 0, sizeof(e->rec->peer));
    e->capture_failed = false;
    tm_status st = cuda_graph_begin(e->gpus[0].stream);
    if (st != TM_OK) return st;
    e->capturing = true;
    st = exec_capture_fork(e);
    if (st == TM_OK) st = exec_step_info(e);
    if (st == TM_OK) st = forward(ud);
    const tm_status join = exec_capture_join(e); /* also after a failure: none left unjoined */
    if (st == TM_OK) st = join;
    e->capturing = false;
    tm_cuda_graph *g = NULL;
    const tm_status end = cuda_graph_end(e->gpus[0].stream, st == TM_OK && !e->capture_failed, &g);
    if (e->capture_failed || end != TM_OK) {
        tm_log_info("decode step not captured as a CUDA graph (%s): decoding without one",
                    e->capture_failed || end != TM_OK ? tm_error_message() : "capture failed");
        e->graph_off = true;
        exec_step_reset(e);
        return exec_select(e); /* the eager step starts on the first GPU, as the capture did */
    }
    if (st != TM_OK) return st;
    e->rec->g = g;
    *captured = true;
    return TM_OK;
}

/* The step's rows: their positions and sequences, checked against the context. */
static tm_status exec_step_rows_set(tm_exec *e, int64_t n_tok, const int32_t *pos,
                                    const int32_t *seq) {
    if (n_tok < 1 || n_tok > e->p.n_batch)
        return tm_error_set(TM_ERR_ARG, "a step of %lld tokens (1 .. the batch, %lld)",
                            (long long)n_tok, (long long)e->p.n_batch);
    e->one_seq = true, e->pos_max = 0;
    for (int64_t t = 0; t < n_tok; t++) {
        if (pos[t] < 0 || pos[t] >= e->n_ctx_seq || seq[t] < 0 || seq[t] >= e->p.n_seq)
            return tm_error_set(TM_ERR_ARG,
                                "step row %lld: position %d of sequence %d is outside the "
                                "context (%d sequences of %lld positions)",
                                (long long)t, pos[t], seq[t], e->p.n_seq, (long long)e->n_ctx_seq);
        e->row_pos[t] = pos[t], e->row_seq[t] = seq[t];
        if (t && (seq[t] != seq[0] || pos[t] != pos[0] + t)) e->one_seq = false;
        if (pos[t] > e->pos_max) e->pos_max = pos[t];
    }
    e->pos = pos[0], e->seq0 = seq[0];
    if (e->step_host) {
        e->step_host[0] = pos[0];
        memcpy(e->step_host + 2, pos, (size_t)n_tok * 4);
        memcpy(e->step_host + 2 + e->p.n_batch, seq, (size_t)n_tok * 4);
    }
    return TM_OK;
}

tm_status exec_step(tm_exec *e, const int32_t *tokens, int64_t n_tok, int64_t pos,
                    tm_moe_phase phase, tm_exec_forward_fn forward, void *ud) {
    if (n_tok < 1 || n_tok > e->p.n_batch)
        return tm_error_set(TM_ERR_ARG, "a step of %lld tokens (1 .. the batch, %lld)",
                            (long long)n_tok, (long long)e->p.n_batch);
    for (int64_t t = 0; t < n_tok; t++) e->row_pos[t] = (int32_t)(pos + t), e->row_seq[t] = 0;
    return exec_step_rows(e, tokens, n_tok, e->row_pos, e->row_seq, phase, forward, ud);
}

tm_status exec_step_rows(tm_exec *e, const int32_t *tokens, int64_t n_tok, const int32_t *pos,
                         const int32_t *seq, tm_moe_phase phase, tm_exec_forward_fn forward,
                         void *ud) {
    tm_status st = exec_step_rows_set(e, n_tok, pos, seq);
    if (st != TM_OK) return st;
    exec_step_reset(e);                   /* on the first GPU */
    if ((st = exec_select(e))) return st; /* a server's steps run on its slots' threads */
    e->tokens = tokens, e->n_tok = n_tok, e->phase = phase;
    e->seq++, e->n_steps++, e->n_rows += (uint64_t)n_tok;
    if (e->step_host) e->step_host[1] = (int32_t)e->seq;
    e->part = TM_PROF_EMBED, e->part_t0 = tm_time_ns();
    const bool graph = e->cur->gpu && !e->graph_off && phase == TM_MOE_PHASE_DECODE &&
                       n_tok <= TM_CUDA_MMVQ_MAX_TOK && !e->p.cb && !e->p.profile;
    e->rec = &e->graphs[n_tok <= TM_CUDA_MMVQ_MAX_TOK ? n_tok : 0];
    if (graph && !e->rec->g) {
        bool captured;
        if ((st = exec_capture(e, forward, ud, &captured)) != TM_OK) return st;
        if (captured) return exec_replay(e);
    } else if (graph) {
        return exec_replay(e);
    }
    if ((st = exec_step_info(e)) == TM_OK) st = forward(ud);
    const tm_status end = exec_step_end(e); /* also when forward failed: leave nothing in flight */
    return st != TM_OK ? st : end;
}

bool exec_graph_ready(const tm_exec *e) {
    return e->graphs[1].g != NULL;
}
bool exec_graph_ready_rows(const tm_exec *e, int64_t n_rows) {
    return n_rows >= 1 && n_rows <= TM_CUDA_MMVQ_MAX_TOK && e->graphs[n_rows].g != NULL;
}
int64_t exec_n_tok(const tm_exec *e) {
    return e->n_tok;
}
int64_t exec_n_batch(const tm_exec *e) {
    return e->p.n_batch;
}
int64_t exec_pos(const tm_exec *e) {
    return e->pos;
}
tm_moe_phase exec_phase(const tm_exec *e) {
    return e->phase;
}
const int32_t *exec_tokens(const tm_exec *e) {
    return e->tokens;
}
const uint32_t *exec_step_seq_dev(const tm_exec *e) {
    return (const uint32_t *)(e->cur->step_dev + 1);
}
uint32_t exec_step_seq(const tm_exec *e) {
    return e->seq;
}
tm_pool *exec_pool(tm_exec *e) {
    return e->p.pool;
}
bool exec_precise(const tm_exec *e) {
    return e->p.precise;
}
bool exec_profiling(const tm_exec *e) {
    return e->p.profile;
}
bool exec_capturing(const tm_exec *e) {
    return e->capturing;
}
tm_cuda_device *exec_gpu(tm_exec *e) {
    return e->cur->gpu;
}
tm_status exec_select(tm_exec *e) {
    return e->cur->gpu ? cuda_device_select(e->cur->gpu) : TM_OK;
}
int exec_gpu_count(const tm_exec *e) {
    return e->n_gpus;
}
int exec_gpu_device(const tm_exec *e, int g) {
    return g >= 0 && g < e->n_gpus && e->gpus[g].gpu ? cuda_device_info(e->gpus[g].gpu)->index : -1;
}
int exec_gpu_index(const tm_exec *e) {
    return (int)(e->cur - e->gpus);
}
tm_cuda_stream exec_stream(tm_exec *e) {
    return e->cur->stream;
}
tm_status exec_streams_query(tm_exec *e, bool *idle) {
    *idle = true;
    for (int g = 0; g < e->n_gpus; g++) {
        bool one = true;
        const tm_status st = e->gpus[g].gpu ? cuda_stream_query(e->gpus[g].stream, &one) : TM_OK;
        if (st != TM_OK) return st;
        *idle &= one;
    }
    return TM_OK;
}
tm_cuda_blas *exec_blas(tm_exec *e) {
    return e->cur->blas;
}
bool exec_emitting(const tm_exec *e) {
    return e->p.cb != NULL;
}

/* ---- ops ---- */

tm_status exec_rmsnorm(tm_exec *e, tm_act *y, tm_act *x, const tm_weight *w, float eps) {
    const tm_dev d = exec_weight_home(e, w);
    tm_status st;
    if ((st = exec_go(e, d, w)) || (st = exec_act_to(e, x, d, e->n_tok)) ||
        (st = exec_side_ops[d]->rmsnorm(e, exec_at(y, d), exec_at(x, d), exec_vector(e, w, d),
                                        e->n_tok, x->n, eps)))
        return st;
    exec_act_wrote(y, d);
    return TM_OK;
}

tm_status exec_add_rmsnorm(tm_exec *e, tm_act *x, tm_act *a, tm_act *h, const tm_weight *w,
                           float eps) {
    const tm_dev d = exec_weight_home(e, w);
    tm_status st;
    if ((st = exec_go(e, d, w)) || (st = exec_act_to(e, x, d, e->n_tok)) ||
        (st = exec_act_to(e, a, d, e->n_tok)) ||
        (st = exec_side_ops[d]->add_rmsnorm(e, exec_at(x, d), exec_at(a, d), exec_at(h, d),
                                            exec_vector(e, w, d), e->n_tok, x->n, eps)))
        return st;
    exec_act_wrote(x, d), exec_act_wrote(h, d);
    return TM_OK;
}

/* y rows [0, n) = W x rows [first, first + n), on side d. A GPU output whose
 * device buffer holds fewer rows goes in chunks through it to the host. */
static tm_status exec_product(tm_exec *e, tm_dev d, const exec_matrix *m, tm_act *x, int64_t first,
                              int64_t n, tm_act *y) {
    tm_status st;
    if ((st = exec_side(e, d)) || (st = exec_act_to(e, x, d, first + n))) return st;
    const float *xs = (const float *)exec_at(x, d) + first * x->n;
    if (d == TM_DEV_CPU || n <= y->dev_rows) {
        if ((st = exec_side_ops[d]->matmul(e, m, xs, n, exec_at(y, d)))) return st;
        exec_act_wrote(y, d);
        return TM_OK;
    }
    for (int64_t r = 0; r < n; r += y->dev_rows) {
        const int64_t c = n - r < y->dev_rows ? n - r : y->dev_rows;
        if ((st = exec_gpu_ops.matmul(e, m, xs + r * x->n, c, y->dev_own)) ||
            (st = cuda_copy_async((float *)y->host + r * y->n, y->dev_own, (size_t)(c * y->n) * 4,
                                  e->cur->stream)))
            return st;
    }
    if ((st = exec_sync(e))) return st;
    exec_act_wrote(y, TM_DEV_CPU);
    return TM_OK;
}

tm_status exec_matmul(tm_exec *e, tm_act *y, const tm_weight *w, tm_act *x) {
    const tm_dev d = exec_weight_home(e, w);
    const tm_status st = exec_go(e, d, w); /* first: the matrix is that GPU's copy */
    if (st != TM_OK) return st;
    const exec_matrix m = exec_matrix_of(e, w, d);
    return exec_product(e, d, &m, x, 0, e->n_tok, y);
}

tm_status exec_matmul_rows(tm_exec *e, tm_act *y, const tm_weight *w, tm_act *x, int64_t first,
                           int64_t n) {
    if (first < 0 || n < 1 || first + n > e->n_tok)
        return tm_error_set(TM_ERR_ARG, "exec_matmul_rows: rows [%lld, %lld) of %lld",
                            (long long)first, (long long)(first + n), (long long)e->n_tok);
    const tm_dev d = exec_weight_home(e, w);
    const tm_status st = exec_go(e, d, w);
    if (st != TM_OK) return st;
    const exec_matrix m = exec_matrix_of(e, w, d);
    return exec_product(e, d, &m, x, first, n, y);
}

static const exec_group *exec_group_find(const tm_exec *e, int n, const tm_weight *const *ws) {
    for (int g = 0; g < e->n_groups; g++) {
        const exec_group *gr = &e->groups[g];
        bool same = gr->n == n;
        for (int i = 0; same && i < n; i++) same = gr->ws[i] == ws[i];
        if (same) return gr;
    }
    return NULL;
}

tm_status exec_matmul_n(tm_exec *e, int n, tm_act *const *ys, const tm_weight *const *ws,
                        tm_act *x) {
    const tm_dev d = exec_weight_home(e, ws[0]);
    bool one_side = n <= CPU_MATMUL_MAX;
    for (int i = 1; i < n && one_side; i++) /* and one GPU */
        one_side = exec_weight_home(e, ws[i]) == d &&
                   (d == TM_DEV_CPU || e->tensor_gpu[ws[i]->id] == e->tensor_gpu[ws[0]->id]);
    if (!one_side || (d == TM_DEV_CPU && e->p.precise)) { /* each where it lives */
        for (int i = 0; i < n; i++) {
            tm_status st = exec_matmul(e, ys[i], ws[i], x);
            if (st != TM_OK) return st;
        }
        return TM_OK;
    }
    tm_status st;
    if ((st = exec_go(e, d, ws[0])) || (st = exec_act_to(e, x, d, e->n_tok))) return st;
    const exec_group *g = d == TM_DEV_GPU && e->n_tok == 1 ? exec_group_find(e, n, ws) : NULL;
    if (g && g->stack) { /* one launch over the stacked rows; the outputs are slices of one row */
        const exec_matrix m = {g->stack, ws[0]->type, ws[0]->row_bytes, ws[0]->ne[0], g->rows};
        if ((st = exec_gpu_ops.matmul(e, &m, x->dev, 1, g->out))) return st;
        int64_t off = 0;
        for (int i = 0; i < n; i++) {
            ys[i]->dev = g->out + off;
            off += ws[i]->ne[1];
            exec_act_wrote(ys[i], TM_DEV_GPU);
        }
        return TM_OK;
    }
    exec_matrix ms[CPU_MATMUL_MAX];
    float *out[CPU_MATMUL_MAX];
    for (int i = 0; i < n; i++) ms[i] = exec_matrix_of(e, ws[i], d), out[i] = exec_at(ys[i], d);
    if ((st = exec_side_ops[d]->matmul_n(e, n, ms, exec_at(x, d), e->n_tok, out))) return st;
    for (int i = 0; i < n; i++) exec_act_wrote(ys[i], d);
    return TM_OK;
}

tm_status exec_add_bias(tm_exec *e, tm_act *y, const tm_weight *b) {
    const tm_dev d = exec_weight_home(e, b);
    if (!exec_side_ops[d]->add_bias)
        return tm_error_set(TM_ERR_UNSUPPORTED, "bias '%.*s': no bias op on %s yet",
                            (int)b->name_len, b->name, tm_dev_names[d]);
    if (b->type != TM_TYPE_F32 || b->ne[0] != y->n)
        return tm_error_set(TM_ERR_ARG, "bias '%.*s': %s of %lld values, expected f32 of %lld",
                            (int)b->name_len, b->name, quant_type_name(b->type),
                            (long long)b->ne[0], (long long)y->n);
    tm_status st;
    if ((st = exec_go(e, d, b)) || (st = exec_act_to(e, y, d, e->n_tok)) ||
        (st = exec_side_ops[d]->add_bias(e, exec_at(y, d), exec_vector(e, b, d), e->n_tok, y->n)))
        return st;
    exec_act_wrote(y, d);
    return TM_OK;
}

tm_status exec_attention(tm_exec *e, uint32_t layer, const tm_attn_desc *a, tm_act *q, tm_act *k,
                         tm_act *v, tm_act *out) {
    if (layer >= e->n_layer)
        return tm_error_set(TM_ERR_ARG, "exec_attention: layer %u of %u", layer, e->n_layer);
    const tm_dev d = (tm_dev)e->layer_dev[layer];
    tm_status st;
    if (a->latent != e->kv_latent ||
        (a->latent && (a->head_dim != e->attn_shape.head_dim || a->v_dim != e->attn_shape.v_dim ||
                       a->n_rot != e->attn_shape.n_rot || a->q_norm || a->sinks || a->window || v)))
        return tm_error_set(TM_ERR_ARG,
                            "exec_attention: layer %u's latent attention differs from the shape "
                            "given at exec_attention_setup (or has a q norm, sinks, a window or "
                            "a value)",
                            layer);
    const tm_attn_desc *ls = e->layer_shape ? &e->layer_shape[layer] : NULL;
    if (ls && (a->n_head != ls->n_head || a->n_head_kv != ls->n_head_kv ||
               a->head_dim != ls->head_dim || a->rope_freq != ls->rope_freq))
        return tm_error_set(TM_ERR_ARG,
                            "exec_attention: layer %u: %lld heads, %lld KV heads of %lld values "
                            "(or its RoPE table) differ from its shape at "
                            "exec_attention_setup_layers (%lld, %lld of %lld)",
                            layer, (long long)a->n_head, (long long)a->n_head_kv,
                            (long long)a->head_dim, (long long)ls->n_head, (long long)ls->n_head_kv,
                            (long long)ls->head_dim);
    if (a->v_norm && a->head_dim > EXEC_MAX_HEAD_DIM)
        return tm_error_set(TM_ERR_ARG,
                            "exec_attention: layer %u: a value norm of %lld values "
                            "(at most %d)",
                            layer, (long long)a->head_dim, EXEC_MAX_HEAD_DIM);
    if (a->v_is_k == (v != NULL) && !a->latent)
        return tm_error_set(TM_ERR_ARG, "exec_attention: layer %u: %s", layer,
                            a->v_is_k ? "a value given, but the value is the key (v_is_k)"
                                      : "no value");
    if ((st = exec_go_layer(e, d, layer)) || (st = exec_act_to(e, q, d, e->n_tok)) ||
        (st = exec_act_to(e, k, d, e->n_tok)) || (v && (st = exec_act_to(e, v, d, e->n_tok))))
        return st;
    if (!ls && (a->rope_freq != NULL) != (e->attn_shape.rope_freq != NULL))
        return tm_error_set(TM_ERR_ARG,
                            "exec_attention: layer %u's RoPE table differs from the one given "
                            "at exec_attention_setup",
                            layer);
    if (!a->latent &&
        (a->n_rot < 0 || a->n_rot > a->head_dim || a->n_rot % 2 || (a->n_rot && a->rope_freq) ||
         (a->rope_interleaved && a->n_rot && a->n_rot != a->head_dim)))
        return tm_error_set(TM_ERR_ARG,
                            "exec_attention: layer %u rotates %lld of %lld values%s (even, at most "
                            "all; a scaled or interleaved RoPE rotates all)",
                            layer, (long long)a->n_rot, (long long)a->head_dim,
                            a->rope_interleaved ? " interleaved" : "");
    if (a->window != e->window[layer])
        return tm_error_set(TM_ERR_ARG,
                            "exec_attention: layer %u's window %lld differs from the %lld given "
                            "at exec_attention_setup (its KV cache is sized by it)",
                            layer, (long long)a->window, (long long)e->window[layer]);
    const exec_attn at = {a,
                          exec_vector(e, a->q_norm, d),
                          exec_vector(e, a->k_norm, d),
                          exec_vector(e, a->sinks, d),
                          e->k_cache[layer],
                          e->v_cache[layer],
                          e->kv_rows[layer],
                          exec_kv_ring(e, layer) != 0,
                          d != TM_DEV_GPU ? NULL
                          : ls            ? e->layer_rope_dev[layer]
                                          : e->cur->rope_freq_dev};
    if ((st = exec_side_ops[d]->attention(e, &at, exec_at(q, d), exec_at(k, d),
                                          v ? exec_at(v, d) : NULL, exec_at(out, d), e->n_tok)))
        return st;
    exec_act_wrote(q, d), exec_act_wrote(out, d);
    k->valid = 0; /* consumed (the CPU norms and rotates it in place) */
    return TM_OK;
}

tm_status exec_weight_heads(tm_exec *e, const tm_weight *w) {
    if (w->n_dims != 3)
        return tm_error_set(TM_ERR_ARG,
                            "exec_weight_heads: '%.*s' is %u-d, expected [in, out, "
                            "n_head]",
                            (int)w->name_len, w->name, w->n_dims);
    const int64_t n = w->ne[0] + w->ne[1]; /* a head's gathered input and its output */
    if (exec_weight_home(e, w) == TM_DEV_GPU) {
        const size_t g = cuda_gemm_heads_scratch_bytes(w->type, w->ne[0], w->ne[1], w->ne[2]);
        if (n > e->heads_width) e->heads_width = n;
        if (g > e->heads_gemm_bytes) e->heads_gemm_bytes = g;
    }
    return TM_OK;
}

tm_status exec_matmul_heads(tm_exec *e, tm_act *y, const tm_weight *w, tm_act *x, int64_t n_pass) {
    const int64_t H = w->n_dims == 3 ? w->ne[2] : 0, in = w->ne[0], out = w->ne[1];
    if (H < 1 || x->n % H || y->n % H || n_pass < 0 || in + n_pass > x->n / H ||
        out + n_pass > y->n / H)
        return tm_error_set(TM_ERR_ARG,
                            "exec_matmul_heads: '%.*s' [%lld, %lld, %lld] (%u-d) with %lld "
                            "carried values: inputs of %lld, outputs of %lld a row do not split "
                            "into its heads",
                            (int)w->name_len, w->name, (long long)in, (long long)out, (long long)H,
                            w->n_dims, (long long)n_pass, (long long)x->n, (long long)y->n);
    const tm_dev d = exec_weight_home(e, w);
    if (d == TM_DEV_GPU && w->ne[0] + w->ne[1] > e->heads_width)
        return tm_error_set(TM_ERR_ARG,
                            "exec_matmul_heads: '%.*s' was not declared (exec_weight_heads)",
                            (int)w->name_len, w->name);
    tm_status st;
    if ((st = exec_go(e, d, w)) || (st = exec_act_to(e, x, d, e->n_tok)) ||
        (st = d == TM_DEV_GPU ? exec_gpu_matmul_heads(e, w, x->dev, x->n, y->dev, y->n, n_pass)
                              : exec_cpu_matmul_heads(e, w, x->host, x->n, y->host, y->n, n_pass)))
        return st;
    exec_act_wrote(y, d);
    return TM_OK;
}

tm_status exec_emit(tm_exec *e, const char *name, int layer, tm_act *a, int64_t n_rows) {
    if (!e->p.cb) return TM_OK;
    tm_status st = exec_act_to(e, a, TM_DEV_CPU, n_rows);
    if (st != TM_OK) return st;
    e->p.cb(e->p.cb_ud, name, layer, a->host, n_rows, a->n, a->is_int);
    return TM_OK;
}
