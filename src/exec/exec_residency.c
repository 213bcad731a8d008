/* The executor's residency: where activations and ops live across the sides
 * and GPUs. Each activation has a host and a device copy and knows which are
 * valid (copies only where the side changes, exec_act_to); an op's side is its
 * weight's (or layer's) home, and on the GPU side the dispatcher makes the GPU
 * of that weight or layer the one ops run on (exec_go, exec_gpu_use), whose
 * copies of activations written on another GPU come across at the span's
 * boundary. See exec.h and docs/executor.md, "Several GPUs". */
#include "exec/exec_internal.h"

void exec_act_wrote(tm_act *a, tm_dev d) {
    a->valid = 1u << d, a->cross = NULL; /* on the GPU ops run on, at a->dev */
}

tm_status exec_act_to(tm_exec *e, tm_act *a, tm_dev d, int64_t n_rows) {
    if (exec_act_on(a, d) && (d == TM_DEV_CPU || !a->cross)) return TM_OK;
    if (!a->valid)
        return tm_error_set(TM_ERR_ARG, "activation '%s' is read before anything wrote it",
                            a->name);
    if (n_rows > a->dev_rows)
        return tm_error_set(TM_ERR_ARG,
                            "activation '%s': %lld rows wanted on the GPU, its buffer holds %lld",
                            a->name, (long long)n_rows, (long long)a->dev_rows);
    const size_t bytes = (size_t)(n_rows * a->n) * 4;
    tm_status st;
    if (d == TM_DEV_GPU && a->cross && exec_act_on(a, TM_DEV_GPU)) {
        /* a span boundary: from the GPU that wrote it, on this one's stream (which
         * waits for that one's work since exec_gpu_use) */
        a->dev = a->dev_own;
        const bool timed = e->p.profile && !e->capturing; /* profiling: no graph */
        if ((timed && (st = cuda_event_record(e->cur->peer_ev[0], e->cur->stream))) ||
            (st = cuda_copy_peer_async(e->cur->gpu, a->dev, e->gpus[a->cross_gpu].gpu, a->cross,
                                       bytes, e->cur->stream)) ||
            (timed && (st = cuda_event_record(e->cur->peer_ev[1], e->cur->stream))))
            return st;
        /* a captured copy counts at each replay of its graph */
        tm_exec_peer_stats *ps = e->capturing ? &e->rec->peer[e->cur - e->gpus] : &e->cur->peer;
        ps->copies++, ps->bytes += bytes;
        float ms = 0;
        if (timed && (st = cuda_event_elapsed(e->cur->peer_ev[0], e->cur->peer_ev[1], &ms)))
            return st;
        ps->ns += (uint64_t)((double)ms * 1e6);
        a->cross = NULL;
        a->valid = (a->valid & (1u << TM_DEV_CPU)) | 1u << TM_DEV_GPU;
        return TM_OK;
    }
    if (d == TM_DEV_GPU) { /* pinned host -> device, queued */
        a->dev = a->dev_own, a->cross = NULL;
        if ((st = cuda_copy_async(a->dev, a->host, bytes, e->cur->stream))) return st;
    } else { /* device -> host: the host reads it next, so wait */
        if (e->capturing) return exec_not_capturable(e, "bring an activation to the host");
        const exec_gpu_state *from = a->cross ? &e->gpus[a->cross_gpu] : e->cur;
        if ((st = cuda_copy_async(a->host, a->cross ? a->cross : a->dev, bytes, from->stream)) ||
            (st = exec_sync(e)))
            return st;
    }
    a->valid |= 1u << d;
    return TM_OK;
}

tm_status exec_side(tm_exec *e, tm_dev d) {
    if (d == TM_DEV_CPU && e->capturing) return exec_not_capturable(e, "run a CPU op");
    if (d == TM_DEV_GPU && !e->cur->gpu)
        return tm_error_set(TM_ERR_ARG, "an op is placed on a GPU the context does not have");
    return TM_OK;
}

tm_status exec_gpu_use(tm_exec *e, int g) {
    exec_gpu_state *to = &e->gpus[g], *from = e->cur;
    if (to == from) return TM_OK;
    tm_status st; /* captured: the record and the wait are the graph's edge between GPUs */
    if ((st = cuda_device_select(to->gpu)) || (st = cuda_event_record(from->done, from->stream)) ||
        (st = cuda_stream_wait_event(to->stream, from->done)))
        return st;
    const int g_from = (int)(from - e->gpus);
    for (int i = 0; i < e->n_acts; i++) {
        tm_act *a = e->acts[i];
        if (exec_act_on(a, TM_DEV_GPU) && !a->cross) /* its values stay where they were written */
            a->cross = a->dev, a->cross_gpu = g_from;
        a->dev = a->dev_own = a->dev_gpu[g];
        if (a->cross && a->cross_gpu == g) a->dev = (void *)a->cross, a->cross = NULL; /* back */
    }
    e->cur = to;
    return TM_OK;
}

tm_status exec_gpu_set(tm_exec *e, int g) {
    if (g < 0 || g >= e->n_gpus || !e->gpus[g].gpu)
        return tm_error_set(TM_ERR_ARG, "executor: GPU %d of %d", g, e->n_gpus);
    return exec_gpu_use(e, g);
}

tm_status exec_go(tm_exec *e, tm_dev d, const tm_weight *w) {
    tm_status st = exec_side(e, d);
    if (st == TM_OK && d == TM_DEV_GPU && w) st = exec_gpu_use(e, e->tensor_gpu[w->id]);
    return st;
}

tm_status exec_go_layer(tm_exec *e, tm_dev d, uint32_t l) {
    tm_status st = exec_side(e, d);
    if (st == TM_OK && d == TM_DEV_GPU) st = exec_gpu_use(e, e->layer_gpu[l]);
    return st;
}

tm_dev exec_weight_home(const tm_exec *e, const tm_weight *w) {
    return (tm_dev)e->tensor_dev[w->id];
}

const void *exec_weight_dev(const tm_exec *e, const tm_weight *w) {
    /* a GPU tensor's copy on its GPU (a vector's on the GPU ops run on, which every GPU has) */
    const exec_gpu_state *g =
        e->tensor_dev[w->id] == TM_DEV_GPU ? &e->gpus[e->tensor_gpu[w->id]] : e->cur;
    return g->wdev ? g->wdev[w->id] : NULL;
}

exec_matrix exec_matrix_of(const tm_exec *e, const tm_weight *w, tm_dev d) {
    return (exec_matrix){d == TM_DEV_GPU ? e->cur->wdev[w->id] : w->data, w->type, w->row_bytes,
                         w->ne[0], w->ne[1] * w->ne[2] * w->ne[3]};
}

const float *exec_vector(const tm_exec *e, const tm_weight *w, tm_dev d) {
    if (!w) return NULL;
    return d == TM_DEV_GPU ? e->cur->wdev[w->id] : (const float *)w->data;
}

tm_status exec_fetch(tm_exec *e, tm_act *a, int64_t n_rows) {
    if (exec_act_on(a, TM_DEV_CPU)) return TM_OK;
    if (!exec_act_on(a, TM_DEV_GPU))
        return tm_error_set(TM_ERR_ARG, "activation '%s' is fetched before anything wrote it",
                            a->name);
    /* the step's final wait makes it valid on the host */
    const exec_gpu_state *from = a->cross ? &e->gpus[a->cross_gpu] : e->cur;
    return cuda_copy_async(a->host, a->cross ? a->cross : a->dev, (size_t)(n_rows * a->n) * 4,
                           from->stream);
}

tm_exec_peer_stats exec_peer_stats(const tm_exec *e, int g) {
    return g >= 0 && g < e->n_gpus ? e->gpus[g].peer : (tm_exec_peer_stats){0};
}
