/* The op launchers of the host mock (see cuda_mock.c for the model). Each
 * launcher makes the argument checks its src/cuda/<op>.cu launcher makes
 * (TM_ERR_ARG / TM_ERR_UNSUPPORTED at once), then queues a closure that
 * computes the op with the library's CPU reference code on the stream's
 * worker thread (single-threaded: no tm_pool). When it runs, a closure checks
 * that the memory it touches is device-addressable and that the values it
 * reads from device memory (positions, work items) are in range; a failure
 * there is a sticky stream error, as a kernel fault would be.
 *
 * Products dequantize each weight row exactly (quant_row_dequantize) and sum
 * in double; the results are stored as float. The real cuda_gemm's f16 rounding of
 * its inputs (cuda.h) is not reproduced, so the matrix's precise tolerance stays
 * tight, unless MOCK_GEMM_F16=1: then cuda_gemm rounds x and the weights of a
 * non-f32 matrix to f16 first, as gemm.cu does (for the GPU's own precise-mode
 * numbers on the CPU: test_mock_placement's group matrix_gemma4_f16). */
#include <math.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu_ops.h"
#include "cuda/cuda_args.h"

#include "cuda_mock.h"

/* Bytes spanned by `rows` rows of k values, row_bytes apart. */
static size_t rows_span(tm_type type, size_t row_bytes, int64_t rows, int64_t k) {
    return rows > 0 ? (size_t)(rows - 1) * row_bytes + quant_row_size(type, k) : 0;
}

static double dot(const float *a, const float *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

/* ---- mmvq, gemm, dequantize ---- */

typedef struct matvec_arg {
    tm_type type;
    const void *w;
    size_t row_bytes;
    int64_t rows, k, n_tok;
    const float *x;
    float *y;
    bool f16_inputs; /* x and the rows rounded to f16 first (cuda_gemm with MOCK_GEMM_F16=1) */
} matvec_arg;

static float round_f16(float v) {
    return quant_f16_to_f32(quant_f32_to_f16(v));
}

static bool matvec_run(void *arg, char *err, size_t err_size) {
    const matvec_arg *a = arg;
    NEED_DEVICE(a->w, rows_span(a->type, a->row_bytes, a->rows, a->k), "the weights");
    NEED_DEVICE(a->x, (size_t)(a->n_tok * a->k) * 4, "x");
    NEED_DEVICE(a->y, (size_t)(a->n_tok * a->rows) * 4, "y");
    const bool f16 = a->f16_inputs && a->type != TM_TYPE_F32; /* f32 weights: cublasSgemm */
    const int64_t nx = f16 ? a->n_tok * a->k : 0;
    float *row = malloc((size_t)(a->k + nx) * sizeof(float)), *xr = row + a->k;
    if (!row) return mock_fail(err, err_size, "out of host memory");
    for (int64_t i = 0; i < nx; i++) xr[i] = round_f16(a->x[i]);
    const float *x = f16 ? xr : a->x;
    for (int64_t r = 0; r < a->rows; r++) {
        quant_row_dequantize(a->type, (const char *)a->w + r * a->row_bytes, row, a->k);
        for (int64_t i = 0; f16 && i < a->k; i++) row[i] = round_f16(row[i]);
        for (int64_t t = 0; t < a->n_tok; t++)
            a->y[t * a->rows + r] = (float)dot(row, x + t * a->k, a->k);
    }
    free(row);
    return true;
}

tm_status cuda_mmvq(tm_type type, const void *w, size_t row_bytes, int64_t rows, int64_t k,
                    const float *x, int64_t n_tok, float *y, tm_cuda_stream stream) {
    tm_status st = cuda_mmvq_args_check(type, w, row_bytes, rows, k, x, n_tok);
    if (st != TM_OK) return st;
    const matvec_arg a = {type, w, row_bytes, rows, k, n_tok, x, y, false};
    return mock_launch(stream, "cuda_mmvq", matvec_run, &a, sizeof(a));
}

/* The 8-bit activations of cuda_q8x_quantize, computed as the kernel does. */
typedef struct q8x_arg {
    const float *x;
    int64_t k, n_tok;
    void *xq;
} q8x_arg;

static bool q8x_run(void *arg, char *err, size_t err_size) {
    const q8x_arg *a = arg;
    const int64_t n = a->n_tok * a->k;
    NEED_DEVICE(a->x, (size_t)n * 4, "x");
    NEED_DEVICE(a->xq, cuda_q8x_bytes(a->k, a->n_tok), "the quantized activations");
    int8_t *q = a->xq;
    quant_ref_quantize_q8x(a->x, n, q, (float *)(q + n));
    return true;
}

tm_status cuda_q8x_quantize(const float *x, int64_t k, int64_t n_tok, void *xq,
                            tm_cuda_stream stream) {
    tm_status st = cuda_q8x_quantize_args_check(x, k, n_tok, xq);
    if (st != TM_OK) return st;
    const q8x_arg a = {x, k, n_tok, xq};
    return mock_launch(stream, "cuda_q8x_quantize", q8x_run, &a, sizeof(a));
}

typedef struct matvec_q8x_arg {
    tm_type type;
    const void *w;
    size_t row_bytes;
    int64_t rows, k, n_tok;
    const void *xq;
    float *y;
} matvec_q8x_arg;

static bool matvec_q8x_run(void *arg, char *err, size_t err_size) {
    const matvec_q8x_arg *a = arg;
    NEED_DEVICE(a->w, rows_span(a->type, a->row_bytes, a->rows, a->k), "the weights");
    NEED_DEVICE(a->xq, cuda_q8x_bytes(a->k, a->n_tok), "the quantized activations");
    NEED_DEVICE(a->y, (size_t)(a->n_tok * a->rows) * 4, "y");
    const int64_t nb = a->k / 32;
    const int8_t *q = a->xq;
    const float *d = (const float *)(q + a->n_tok * a->k);
    if (a->type != TM_TYPE_Q8_0) { /* q4_K, low-bit: the dequantized row against the values */
        float *row = malloc((size_t)a->k * sizeof(float));
        if (!row) return mock_fail(err, err_size, "out of host memory");
        for (int64_t r = 0; r < a->rows; r++) {
            quant_row_dequantize(a->type, (const uint8_t *)a->w + r * a->row_bytes, row, a->k);
            for (int64_t t = 0; t < a->n_tok; t++) {
                double s = 0;
                for (int64_t i = 0; i < a->k; i++)
                    s += (double)row[i] * q[t * a->k + i] * d[t * nb + i / 32];
                a->y[t * a->rows + r] = (float)s;
            }
        }
        free(row);
        return true;
    }
    for (int64_t r = 0; r < a->rows; r++) {
        const uint8_t *row = (const uint8_t *)a->w + r * a->row_bytes;
        for (int64_t t = 0; t < a->n_tok; t++) {
            double s = 0;
            for (int64_t b = 0; b < nb; b++) {
                const tm_block_q8_0 *wb = (const tm_block_q8_0 *)(row + 34 * b);
                int32_t sum = 0;
                for (int i = 0; i < 32; i++) sum += wb->qs[i] * q[t * a->k + 32 * b + i];
                s += (double)quant_f16_to_f32(wb->d) * d[t * nb + b] * sum;
            }
            a->y[t * a->rows + r] = (float)s;
        }
    }
    return true;
}

tm_status cuda_mmvq_q8x(tm_type type, const void *w, size_t row_bytes, int64_t rows, int64_t k,
                        const void *xq, int64_t n_tok, float *y, tm_cuda_stream stream) {
    tm_status st = cuda_mmvq_q8x_args_check(type, w, row_bytes, rows, k, xq, n_tok);
    if (st != TM_OK) return st;
    const matvec_q8x_arg a = {type, w, row_bytes, rows, k, n_tok, xq, y};
    return mock_launch(stream, "cuda_mmvq_q8x", matvec_q8x_run, &a, sizeof(a));
}

struct tm_cuda_blas {
    tm_cuda_device *dev;
};

tm_status cuda_blas_create(tm_cuda_device *dev, tm_cuda_blas **out) {
    *out = calloc(1, sizeof(**out));
    if (!*out) return tm_error_set(TM_ERR_NOMEM, "cuda_blas_create: out of host memory");
    (*out)->dev = dev;
    return TM_OK;
}

void cuda_blas_free(tm_cuda_blas *b) {
    free(b);
}

size_t cuda_gemm_scratch_bytes(int64_t rows, int64_t k, int64_t n_tok) {
    if (rows <= 0 || k <= 0 || n_tok <= 0) return 0;
    return ((size_t)(n_tok * k) * 2 + 255) & ~(size_t)255; /* the f16 activations' part */
}

tm_status cuda_gemm(tm_cuda_blas *b, tm_type type, const void *w, size_t row_bytes, int64_t rows,
                    int64_t k, const float *x, int64_t n_tok, float *y, void *scratch,
                    tm_cuda_stream stream) {
    tm_status st = cuda_gemm_args_check(b, type, w, row_bytes, rows, k, x, n_tok, y, scratch);
    if (st != TM_OK) return st;
    const char *f16 = getenv("MOCK_GEMM_F16");
    const matvec_arg a = {type, w, row_bytes, rows, k, n_tok, x, y, f16 && !strcmp(f16, "1")};
    return mock_launch(stream, "cuda_gemm", matvec_run, &a, sizeof(a));
}

typedef struct heads_arg {
    tm_type type;
    const void *w;
    size_t row_bytes;
    int64_t in, out, n_head, n_tok, ldx, hx, ldy, hy;
    const float *x;
    float *y;
} heads_arg;

/* y[t][h hy + o] = Σ_i W[h out + o][i] x[t][h hx + i] in double, the weights dequantized
 * to f32 (the real kernel's f16 roundings are within the matrix's prompt tolerance). */
static bool heads_run(void *arg, char *err, size_t err_size) {
    const heads_arg *a = arg;
    NEED_DEVICE(a->w, rows_span(a->type, a->row_bytes, a->n_head * a->out, a->in), "the weights");
    NEED_DEVICE(a->x, (size_t)((a->n_tok - 1) * a->ldx + a->n_head * a->hx) * 4, "x");
    NEED_DEVICE(a->y, (size_t)((a->n_tok - 1) * a->ldy + (a->n_head - 1) * a->hy + a->out) * 4,
                "y");
    float *row = malloc((size_t)a->in * sizeof(float));
    if (!row) return mock_fail(err, err_size, "out of host memory");
    for (int64_t h = 0; h < a->n_head; h++)
        for (int64_t o = 0; o < a->out; o++) {
            quant_row_dequantize(a->type, (const char *)a->w + (h * a->out + o) * a->row_bytes, row,
                                 a->in);
            for (int64_t t = 0; t < a->n_tok; t++) {
                const float *x = a->x + t * a->ldx + h * a->hx;
                double s = 0;
                for (int64_t i = 0; i < a->in; i++) s += (double)row[i] * x[i];
                a->y[t * a->ldy + h * a->hy + o] = (float)s;
            }
        }
    free(row);
    return true;
}

size_t cuda_gemm_heads_scratch_bytes(tm_type type, int64_t in, int64_t out, int64_t n_head) {
    (void)type, (void)in, (void)out, (void)n_head;
    return 0; /* heads_run needs none (the executor's gathers size what it passes) */
}

tm_status cuda_gemm_heads(tm_cuda_blas *b, tm_type type, const void *w, size_t row_bytes,
                          int64_t in, int64_t out, int64_t n_head, const float *x, int64_t ldx,
                          int64_t hx, int64_t n_tok, float *y, int64_t ldy, int64_t hy,
                          void *scratch, tm_cuda_stream stream) {
    tm_status st = cuda_gemm_heads_args_check(b, type, w, row_bytes, in, out, n_head, x, ldx, hx,
                                              n_tok, y, ldy, hy, scratch);
    if (st != TM_OK) return st;
    const heads_arg a = {type, w, row_bytes, in, out, n_head, n_tok, ldx, hx, ldy, hy, x, y};
    return mock_launch(stream, "cuda_gemm_heads", heads_run, &a, sizeof(a));
}

static bool dequant_f16_run(void *arg, char *err, size_t err_size) {
    const matvec_arg *a = arg; /* y: the f16 output */
    NEED_DEVICE(a->w, rows_span(a->type, a->row_bytes, a->rows, a->k), "the weights");
    NEED_DEVICE(a->y, (size_t)(a->rows * a->k) * 2, "the f16 output");
    float *row = malloc((size_t)a->k * sizeof(float));
    if (!row) return mock_fail(err, err_size, "out of host memory");
    tm_half *out = (tm_half *)(void *)a->y;
    for (int64_t r = 0; r < a->rows; r++) {
        quant_row_dequantize(a->type, (const char *)a->w + r * a->row_bytes, row, a->k);
        for (int64_t i = 0; i < a->k; i++) out[r * a->k + i] = quant_f32_to_f16(row[i]);
    }
    free(row);
    return true;
}

tm_status cuda_dequantize_f16(tm_type type, const void *w, size_t row_bytes, int64_t rows,
                              int64_t k, void *out_f16, tm_cuda_stream stream) {
    tm_status st = cuda_dequantize_f16_args_check(type, w, row_bytes, rows, k, out_f16);
    if (st != TM_OK) return st;
    const matvec_arg a = {type, w, row_bytes, rows, k, 0, NULL, out_f16, false};
    return mock_launch(stream, "cuda_dequantize_f16", dequant_f16_run, &a, sizeof(a));
}

/* ---- grouped experts ---- */

/* Buffers of one expert evaluation. */
typedef struct moe_bufs {
    float *row, *g, *u, *h;
} moe_bufs;

static bool moe_bufs_alloc(moe_bufs *b, const tm_cuda_moe_params *p) {
    const int64_t n = p->n_embd > p->n_ff ? p->n_embd : p->n_ff;
    b->row = malloc((size_t)n * sizeof(float));
    b->g = malloc((size_t)p->n_ff * sizeof(float));
    b->u = malloc((size_t)p->n_ff * sizeof(float));
    b->h = malloc((size_t)p->n_ff * sizeof(float));
    return b->row && b->g && b->u && b->h;
}

static void moe_bufs_free(moe_bufs *b) {
    free(b->row), free(b->g), free(b->u), free(b->h);
}

static const char *expert_rows(const tm_cuda_moe_matrix *m, int32_t slot) {
    return (const char *)m->data + (size_t)slot * m->expert_stride;
}

/* h = act(gate x[token] + gb, up x[token] + ub) for one valid item (the biases
 * of its expert id, when the extension has them), into b->h (n_ff floats). */
static bool moe_item_gate_up(const tm_cuda_moe_params *p, const tm_cuda_moe_item *it,
                             const float *x, moe_bufs *b, char *err, size_t err_size) {
    const int64_t E = p->n_embd, F = p->n_ff;
    const tm_cuda_moe_ext *ext = &p->ext;
    const char *gate = expert_rows(&p->gate, it->slot), *up = expert_rows(&p->up, it->slot);
    NEED_DEVICE(gate, rows_span(p->gate.type, p->gate.row_bytes, F, E), "a gate expert");
    NEED_DEVICE(up, rows_span(p->up.type, p->up.row_bytes, F, E), "an up expert");
    const float *gb = ext->gate_bias ? ext->gate_bias + (int64_t)it->expert * F : NULL;
    const float *ub = ext->up_bias ? ext->up_bias + (int64_t)it->expert * F : NULL;
    if (gb) NEED_DEVICE(gb, (size_t)F * 4, "a gate bias");
    if (ub) NEED_DEVICE(ub, (size_t)F * 4, "an up bias");
    const float *xt = x + (int64_t)it->token * E;
    for (int64_t r = 0; r < F; r++) {
        quant_row_dequantize(p->gate.type, gate + r * p->gate.row_bytes, b->row, E);
        b->g[r] = (float)dot(b->row, xt, E) + (gb ? gb[r] : 0.0f);
        quant_row_dequantize(p->up.type, up + r * p->up.row_bytes, b->row, E);
        b->u[r] = (float)dot(b->row, xt, E) + (ub ? ub[r] : 0.0f);
    }
    if (ext->act == TM_CUDA_MOE_SWIGLU_OAI)
        cpu_swiglu_oai(b->h, b->g, b->u, F, ext->alpha, ext->limit);
    else if (ext->act == TM_CUDA_MOE_GEGLU) /* cuda.h's gelu_tanh(g) u, in double */
        for (int64_t r = 0; r < F; r++) {
            const double g = b->g[r];
            b->h[r] = (float)(0.5 * g *
                              (1.0 + tanh(sqrt(2.0 / 3.14159265358979323846) *
                                          (g + 0.044715 * g * g * g))) *
                              b->u[r]);
        }
    else
        cpu_swiglu(b->h, b->g, b->u, F);
    return true;
}

/* y[token] += weight * (down h + db) for one valid item. */
static bool moe_item_down(const tm_cuda_moe_params *p, const tm_cuda_moe_item *it, const float *h,
                          float *y, moe_bufs *b, char *err, size_t err_size) {
    const int64_t E = p->n_embd, F = p->n_ff;
    const char *down = expert_rows(&p->down, it->slot);
    NEED_DEVICE(down, rows_span(p->down.type, p->down.row_bytes, E, F), "a down expert");
    const float *db = p->ext.down_bias ? p->ext.down_bias + (int64_t)it->expert * E : NULL;
    if (db) NEED_DEVICE(db, (size_t)E * 4, "a down bias");
    float *yt = y + (int64_t)it->token * E;
    for (int64_t r = 0; r < E; r++) {
        quant_row_dequantize(p->down.type, down + r * p->down.row_bytes, b->row, F);
        yt[r] += (float)(it->weight * (dot(b->row, h, F) + (db ? db[r] : 0.0f)));
    }
    return true;
}

static bool moe_item_ok(const tm_cuda_moe_item *it, const tm_cuda_moe_params *p, int64_t n_tok) {
    const tm_cuda_moe_ext *x = &p->ext;
    const bool biased = x->gate_bias || x->up_bias || x->down_bias;
    return it->slot >= 0 && it->slot < p->n_slots && it->token >= 0 && it->token < n_tok &&
           (!biased || (it->expert >= 0 && it->expert < x->n_expert));
}

typedef struct moe_arg {
    tm_cuda_moe_params p;
    const tm_cuda_moe_item *items;
    int64_t n_items, n_tok;
    const float *x;
    float *y, *h;
} moe_arg;

/* The values a kernel reads back from 8-bit activations: q d. */
static void q8x_values(const int8_t *q, const float *d, int64_t n, float *out) {
    for (int64_t i = 0; i < n; i++) out[i] = (float)q[i] * d[i / 32];
}

/* The 8-bit path as the kernels run it: x quantized into the scratch where
 * gate/up takes 8-bit activations (cuda_moe_q8x_gate_up), gate/up of every item
 * into h, h quantized after it where down does, then down; the products take
 * the quantized values (in double, as the f32 path here). */
static bool moe_run_q8x(const moe_arg *a, moe_bufs *b, char *err, size_t err_size) {
    const tm_cuda_moe_params *p = &a->p;
    const int64_t E = p->n_embd, F = p->n_ff;
    NEED_DEVICE(a->h, (size_t)cuda_moe_scratch_floats(p, a->n_items) * 4,
                "h_scratch with room for the 8-bit activations");
    const tm_cuda_moe_q8x_scratch q = cuda_moe_q8x_scratch(p, a->n_items, a->n_tok, a->h);
    float *xs = malloc((size_t)(a->n_tok * E) * sizeof(float));
    float *hs = malloc((size_t)(a->n_items * F) * sizeof(float));
    bool ok = (xs && hs) || mock_fail(err, err_size, "out of host memory");
    const bool qgu = cuda_moe_q8x_gate_up(p, a->n_items, a->n_tok),
               qd = cuda_moe_q8x_down(p, a->n_items, a->n_tok);
    if (ok && qgu) {
        quant_ref_quantize_q8x(a->x, a->n_tok * E, q.xq, q.xd);
        q8x_values(q.xq, q.xd, a->n_tok * E, xs);
    } else if (ok) {
        memcpy(xs, a->x, (size_t)(a->n_tok * E) * sizeof(float));
    }
    for (int64_t i = 0; ok && i < a->n_items; i++) {
        float *h = a->h + i * F;
        if (!moe_item_ok(&a->items[i], p, a->n_tok)) {
            memset(h, 0, (size_t)F * sizeof(float));
            continue;
        }
        ok = moe_item_gate_up(p, &a->items[i], xs, b, err, err_size);
        if (ok) memcpy(h, b->h, (size_t)F * sizeof(float));
    }
    if (ok && qd) {
        quant_ref_quantize_q8x(a->h, a->n_items * F, q.hq, q.hd);
        q8x_values(q.hq, q.hd, a->n_items * F, hs);
    } else if (ok) {
        memcpy(hs, a->h, (size_t)(a->n_items * F) * sizeof(float));
    }
    for (int64_t i = 0; ok && i < a->n_items; i++)
        if (moe_item_ok(&a->items[i], p, a->n_tok))
            ok = moe_item_down(p, &a->items[i], hs + i * F, a->y, b, err, err_size);
    free(xs), free(hs);
    return ok;
}

static bool moe_run(void *arg, char *err, size_t err_size) {
    const moe_arg *a = arg;
    const tm_cuda_moe_params *p = &a->p;
    NEED_DEVICE(a->items, (size_t)a->n_items * sizeof(tm_cuda_moe_item), "the work items");
    NEED_DEVICE(a->x, (size_t)(a->n_tok * p->n_embd) * 4, "x");
    NEED_DEVICE(a->y, (size_t)(a->n_tok * p->n_embd) * 4, "y");
    NEED_DEVICE(a->h, (size_t)(a->n_items * p->n_ff) * 4, "h_scratch");
    moe_bufs b;
    bool ok = moe_bufs_alloc(&b, p) || mock_fail(err, err_size, "out of host memory");
    if (ok && (cuda_moe_q8x_gate_up(p, a->n_items, a->n_tok) ||
               cuda_moe_q8x_down(p, a->n_items, a->n_tok))) {
        ok = moe_run_q8x(a, &b, err, err_size);
        moe_bufs_free(&b);
        return ok;
    }
    for (int64_t i = 0; ok && i < a->n_items; i++) {
        const tm_cuda_moe_item it = a->items[i];
        float *h = a->h + i * p->n_ff;
        if (!moe_item_ok(&it, p, a->n_tok)) {
            memset(h, 0, (size_t)p->n_ff * sizeof(float)); /* as the real gate/up kernel */
            continue;
        }
        ok = moe_item_gate_up(p, &it, a->x, &b, err, err_size) &&
             moe_item_down(p, &it, b.h, a->y, &b, err, err_size);
        if (ok) memcpy(h, b.h, (size_t)p->n_ff * sizeof(float));
    }
    moe_bufs_free(&b);
    return ok;
}

tm_status cuda_moe_grouped(const tm_cuda_moe_params *p, const tm_cuda_moe_item *items,
                           int64_t n_items, const float *x, int64_t n_tok, float *y,
                           float *h_scratch, tm_cuda_stream stream) {
    tm_status st = cuda_moe_grouped_args_check(p, n_items, x, n_tok, h_scratch);
    if (st != TM_OK || n_items == 0) return st;
    const moe_arg a = {*p, items, n_items, n_tok, x, y, h_scratch};
    return mock_launch(stream, "cuda_moe_grouped", moe_run, &a, sizeof(a));
}

/* The groups are host arrays read at the launch: copied into the block,
 * data = starts [n_groups + 1] then slots [n_groups]. */
typedef struct moe_gemm_arg {
    tm_cuda_moe_params p;
    const tm_cuda_moe_item *items;
    const float *x;
    float *y;
    int64_t n_tok;
    int32_t n_groups;
    int64_t data[];
} moe_gemm_arg;

static bool moe_gemm_run(void *arg, char *err, size_t err_size) {
    const moe_gemm_arg *a = arg;
    const tm_cuda_moe_params *p = &a->p;
    const int64_t *starts = a->data;
    const int32_t *slots = (const int32_t *)(const void *)(a->data + a->n_groups + 1);
    const int64_t first = starts[0], n_items = starts[a->n_groups] - first;
    NEED_DEVICE(a->items + first, (size_t)n_items * sizeof(tm_cuda_moe_item), "the work items");
    NEED_DEVICE(a->x, (size_t)(a->n_tok * p->n_embd) * 4, "x");
    NEED_DEVICE(a->y, (size_t)(a->n_tok * p->n_embd) * 4, "y");
    moe_bufs b;
    bool ok = moe_bufs_alloc(&b, p) || mock_fail(err, err_size, "out of host memory");
    for (int32_t g = 0; ok && g < a->n_groups; g++) {
        if (slots[g] < 0 || slots[g] >= p->n_slots) continue; /* skipped, as the real op */
        for (int64_t i = starts[g]; ok && i < starts[g + 1]; i++) {
            const tm_cuda_moe_item it = a->items[i];
            if (it.slot != slots[g]) {
                ok = mock_fail(err, err_size, "group %d has slot %d, its item %lld has slot %d", g,
                               slots[g], (long long)i, it.slot);
                break;
            }
            if (moe_item_ok(&it, p, a->n_tok))
                ok = moe_item_gate_up(p, &it, a->x, &b, err, err_size) &&
                     moe_item_down(p, &it, b.h, a->y, &b, err, err_size);
        }
    }
    moe_bufs_free(&b);
    return ok;
}

size_t cuda_moe_grouped_gemm_scratch_bytes(const tm_cuda_moe_params *p, int64_t n_items,
                                           int32_t n_groups) {
    if (!p || p->n_embd <= 0 || p->n_ff <= 0 || n_items < 0 || n_groups <= 0) return 0;
    const int64_t rows = n_items + 15 * (int64_t)n_groups; /* padded rows, as the real layout */
    return ((size_t)(rows * p->n_embd) * 2 + 255) & ~(size_t)255;
}

tm_status cuda_moe_grouped_gemm(tm_cuda_blas *b, const tm_cuda_moe_params *p,
                                const tm_cuda_moe_groups *g, const float *x, int64_t n_tok,
                                float *y, void *scratch, tm_cuda_stream stream) {
    static const char op[] = "cuda_moe_grouped_gemm";
    tm_status st = cuda_moe_grouped_gemm_args_check(b, p, g, x, n_tok, y, scratch);
    const int32_t n = st == TM_OK ? g->n_groups : 0;
    if (n == 0) return st;
    bool work = false;
    for (int32_t i = 0; i < n; i++)
        work |= g->starts[i + 1] > g->starts[i] && g->slots[i] >= 0 && g->slots[i] < p->n_slots;
    /* the real op uploads its row map from pageable memory: not capturable */
    if (work && (st = mock_not_in_capture(stream, op)) != TM_OK) return st;
    const size_t size = sizeof(moe_gemm_arg) + (size_t)(2 * n + 1) * sizeof(int64_t);
    moe_gemm_arg *a = calloc(1, size);
    if (!a) return tm_error_set(TM_ERR_NOMEM, "%s: out of host memory for %d groups", op, n);
    a->p = *p, a->items = g->items, a->x = x, a->y = y, a->n_tok = n_tok, a->n_groups = n;
    memcpy(a->data, g->starts, (size_t)(n + 1) * sizeof(int64_t));
    memcpy(a->data + n + 1, g->slots, (size_t)n * sizeof(int32_t));
    st = mock_launch(stream, op, moe_gemm_run, a, size);
    free(a);
    return st;
}

/* ---- router ---- */

typedef struct router_arg {
    tm_cuda_router_params p;
    const float *logits;
    int64_t n_tok;
    int32_t *ids;
    float *weights;
    tm_cuda_moe_item *items;
} router_arg;

/* (a, ia) ranks before (b, ib): larger, then the lower index; NaN last. */
static bool route_before(double a, int64_t ia, double b, int64_t ib) {
    if (isnan(b)) return !isnan(a) || ia < ib;
    return a > b || (a == b && ia < ib);
}

/* The index of the best of v[0, n) not yet in used (NULL: none used). */
static int64_t route_best(const double *v, int64_t n, const bool *used) {
    int64_t b = -1;
    for (int64_t i = 0; i < n; i++)
        if (!(used && used[i]) && (b < 0 || route_before(v[i], i, v[b], b))) b = i;
    return b;
}

/* One token's routing, written from cuda.h's contract (tm_moe_router_params in
 * src/moe/moe.h) in double, sharing nothing with src/moe/router.c: scores,
 * selection scores (+ bias; groups by the sum of their best two), the k best,
 * weights from the scores. */
static void route_token(const tm_cuda_router_params *p, const float *l, int32_t *ids, float *w) {
    const int64_t E = p->n_expert, K = p->n_used;
    double s[TM_CUDA_ROUTER_MAX_EXPERT], sel[TM_CUDA_ROUTER_MAX_EXPERT], mx = -INFINITY, sum = 0;
    bool out[TM_CUDA_ROUTER_MAX_EXPERT] = {false}; /* ruled out or chosen */
    for (int64_t e = 0; e < E; e++) mx = fmax(mx, l[e]);
    for (int64_t e = 0; e < E; e++) {
        s[e] = p->gating == TM_CUDA_GATING_SIGMOID   ? 1.0 / (1.0 + exp(-(double)l[e]))
               : p->gating == TM_CUDA_GATING_SOFTMAX ? exp((double)l[e] - mx)
                                                     : l[e];
        sum += s[e];
    }
    for (int64_t e = 0; p->gating == TM_CUDA_GATING_SOFTMAX && e < E; e++) s[e] /= sum;
    for (int64_t e = 0; e < E; e++) sel[e] = s[e] + (p->sel_bias ? p->sel_bias[e] : 0.0);
    if (p->n_group > 1) {
        const int64_t G = p->n_group, per = E / G;
        double gs[TM_CUDA_ROUTER_MAX_GROUP];
        bool kept[TM_CUDA_ROUTER_MAX_GROUP] = {false};
        for (int64_t g = 0; g < G; g++) {
            bool two[TM_CUDA_ROUTER_MAX_EXPERT] = {false};
            const int64_t a = route_best(sel + g * per, per, NULL);
            two[a] = true;
            gs[g] = sel[g * per + a] + sel[g * per + route_best(sel + g * per, per, two)];
        }
        for (int64_t r = 0; r < p->n_group_used; r++) kept[route_best(gs, G, kept)] = true;
        for (int64_t e = 0; e < E; e++) out[e] = !kept[e / per];
    }
    double wsum = 0, wmax = -INFINITY;
    for (int64_t j = 0; j < K; j++) {
        const int64_t b = route_best(sel, E, out);
        out[b] = true, ids[j] = (int32_t)b;
        wmax = fmax(wmax, s[b]);
    }
    double ws[TM_CUDA_ROUTER_MAX_USED];
    for (int64_t j = 0; j < K; j++) {
        ws[j] = p->gating == TM_CUDA_GATING_SOFTMAX_TOPK ? exp(s[ids[j]] - wmax) : s[ids[j]];
        wsum += ws[j];
    }
    for (int64_t j = 0; j < K; j++) {
        double v = ws[j];
        if (p->gating == TM_CUDA_GATING_SOFTMAX_TOPK || p->norm_topk) v /= wsum;
        w[j] = (float)(v * p->scale * (p->expert_scale ? p->expert_scale[ids[j]] : 1.0));
    }
}

static bool router_run(void *arg, char *err, size_t err_size) {
    const router_arg *a = arg;
    const int64_t E = a->p.n_expert, K = a->p.n_used;
    NEED_DEVICE(a->logits, (size_t)(a->n_tok * E) * 4, "the logits");
    NEED_DEVICE(a->ids, (size_t)(a->n_tok * K) * 4, "ids");
    NEED_DEVICE(a->weights, (size_t)(a->n_tok * K) * 4, "weights");
    if (a->items) NEED_DEVICE(a->items, (size_t)(a->n_tok * K) * sizeof(*a->items), "the items");
    if (a->p.slot_map) NEED_DEVICE(a->p.slot_map, (size_t)E * 4, "the slot map");
    if (a->p.fetch_map) NEED_DEVICE(a->p.fetch_map, (size_t)E * 4, "the fetch map");
    if (a->p.cpu_slots) NEED_DEVICE(a->p.cpu_slots, (size_t)a->n_tok * 4, "the CPU's slots");
    if (a->p.fetched)
        NEED_DEVICE(a->p.fetched, (size_t)(a->n_tok * K) * sizeof(*a->p.fetched),
                    "the fetched items");
    if (a->p.sel_bias) NEED_DEVICE(a->p.sel_bias, (size_t)E * 4, "the selection bias");
    for (int64_t t = 0; t < a->n_tok; t++)
        route_token(&a->p, a->logits + t * E, a->ids + t * K, a->weights + t * K);
    if (a->p.mapped)
        NEED_DEVICE(a->p.mapped, (size_t)(a->n_tok * K) * sizeof(*a->p.mapped), "the mapped items");
    for (int64_t t = 0; t < a->n_tok; t++) {
        int32_t cold_all = 0;
        for (int64_t j = 0; a->p.slot_map && j < K; j++) {
            const int32_t id = a->ids[t * K + j];
            cold_all += a->p.slot_map[id] < 0 && !(a->p.fetch_map && a->p.fetch_map[id] >= 0);
        }
        const int32_t share =
            a->p.mapped_share_live ? *a->p.mapped_share_live : a->p.mapped_share_q8;
        const int32_t n_map = tm_cuda_mapped_count(cold_all, a->p.n_mapped, share);
        if (a->p.cpu_slots) a->p.cpu_slots[t] = cold_all - n_map;
        int32_t n_cold = 0; /* the cold slots of the token so far, in rank order */
        for (int64_t j = 0; j < K; j++) {
            const int64_t i = t * K + j;
            const int32_t id = a->ids[i], slot = a->p.slot_map ? a->p.slot_map[id] : id;
            const int32_t fslot = slot < 0 && a->p.fetch_map ? a->p.fetch_map[id] : -1;
            if (a->items) a->items[i] = (tm_cuda_moe_item){slot, (int32_t)t, a->weights[i], id};
            if (a->p.fetched)
                a->p.fetched[i] = (tm_cuda_moe_item){fslot, (int32_t)t, a->weights[i], id};
            const bool mapped = slot < 0 && fslot < 0 && n_cold++ < n_map;
            if (a->p.mapped)
                a->p.mapped[i] =
                    (tm_cuda_moe_item){mapped ? id : -1, (int32_t)t, a->weights[i], id};
        }
    }
    return true;
}

tm_status cuda_router_select(const tm_cuda_router_params *p, const float *logits, int64_t n_tok,
                             int32_t *ids, float *weights, tm_cuda_moe_item *items,
                             tm_cuda_stream stream) {
    tm_status st = cuda_router_select_args_check(p, n_tok);
    if (st != TM_OK || n_tok == 0) return st;
    const router_arg a = {*p, logits, n_tok, ids, weights, items};
    return mock_launch(stream, "cuda_router_select", router_run, &a, sizeof(a));
}

/* ---- copying experts ahead ---- */

typedef struct fetch_arg {
    tm_cuda_moe_params src, dst;
    const tm_cuda_moe_item *items;
    int64_t n_items;
    int32_t n_expert, n_slots;
    int32_t *map, *list;
    tm_cuda_fetch_cache cache;
    bool cached;
} fetch_arg;

/* The oldest slot not taken (empty ones first, ties to the lower slot), -1: none. */
static int32_t fetch_victim(const fetch_arg *a, const bool *taken, uint32_t now) {
    int32_t best = -1;
    double best_age = -1;
    for (int32_t s = 0; s < a->cache.n_slots; s++) {
        if (taken[s]) continue;
        const double age =
            a->cache.expert_in[s] < 0 ? INFINITY : (double)(float)(now - a->cache.last_use[s]);
        if (age > best_age) best = s, best_age = age;
    }
    return best;
}

static bool fetch_run(void *arg, char *err, size_t err_size) {
    const fetch_arg *a = arg;
    const tm_cuda_fetch_cache *c = &a->cache;
    NEED_DEVICE(a->items, (size_t)a->n_items * sizeof(*a->items), "the items");
    NEED_DEVICE(a->list, (size_t)a->n_slots * 8, "the fetch list");
    if (a->cached) {
        NEED_DEVICE(c->slot_map, (size_t)a->n_expert * 4, "the cache's slot map");
        NEED_DEVICE(c->expert_in, (size_t)c->n_slots * 4, "the cache's experts");
        NEED_DEVICE(c->last_use, (size_t)c->n_slots * 4, "the cache's ages");
        NEED_DEVICE(c->seq, 4, "the step number");
    } else {
        NEED_DEVICE(a->map, (size_t)a->n_expert * 4, "the fetch map");
    }
    float sum[TM_CUDA_ROUTER_MAX_EXPERT];
    bool seen[TM_CUDA_ROUTER_MAX_EXPERT] = {false}, taken[TM_CUDA_ROUTER_MAX_EXPERT] = {false};
    for (int32_t e = 0; e < a->n_expert; e++) {
        sum[e] = 0.0f;
        if (!a->cached) a->map[e] = -1;
    }
    const uint32_t now = a->cached ? *c->seq : 0;
    for (int64_t i = 0; i < a->n_items; i++) { /* in item order, as the kernel sums */
        const tm_cuda_moe_item *it = &a->items[i];
        if (it->slot < 0 && it->expert >= 0 && it->expert < a->n_expert)
            sum[it->expert] += it->weight, seen[it->expert] = true;
        if (a->cached && it->slot >= 0 && it->slot < c->n_slots) /* this step's: kept */
            taken[it->slot] = true, c->last_use[it->slot] = now;
    }
    const tm_cuda_moe_matrix *s[3] = {&a->src.gate, &a->src.up, &a->src.down};
    const tm_cuda_moe_matrix *d[3] = {&a->dst.gate, &a->dst.up, &a->dst.down};
    const int64_t rows[3] = {a->src.n_ff, a->src.n_ff, a->src.n_embd};
    for (int32_t r = 0; r < a->n_slots; r++) {
        int32_t best = -1;
        for (int32_t e = 0; e < a->n_expert; e++)
            if (seen[e] && (best < 0 || sum[e] > sum[best])) best = e;
        int32_t slot = best < 0 ? -1 : r;
        if (best >= 0 && a->cached && (slot = fetch_victim(a, taken, now)) < 0) best = -1;
        a->list[2 * r] = best, a->list[2 * r + 1] = best < 0 ? -1 : slot;
        if (best < 0) continue;
        seen[best] = false;
        if (a->cached) {
            const int32_t old = c->expert_in[slot];
            if (old >= 0) c->slot_map[old] = -1;
            c->slot_map[best] = slot, c->expert_in[slot] = best, c->last_use[slot] = now;
            taken[slot] = true;
        } else {
            a->map[best] = r;
        }
        for (int m = 0; m < 3; m++) {
            const size_t bytes = (size_t)rows[m] * s[m]->row_bytes;
            const uint8_t *from = (const uint8_t *)s[m]->data + (size_t)best * s[m]->expert_stride;
            uint8_t *to = (uint8_t *)d[m]->data + (size_t)slot * d[m]->expert_stride;
            NEED_DEVICE(to, bytes, "the fetch buffer");
            NEED_DEVICE(from, bytes, "an expert copied ahead");
            memcpy(to, from, bytes);
        }
    }
    return true;
}

tm_status cuda_moe_fetch_ahead(const tm_cuda_moe_params *src, const tm_cuda_moe_params *dst,
                               const tm_cuda_moe_item *items, int64_t n_items, int32_t n_expert,
                               int32_t n_slots, int32_t *map, int32_t *list,
                               const tm_cuda_fetch_cache *cache, tm_cuda_stream stream) {
    tm_status st =
        cuda_moe_fetch_ahead_args_check(src, dst, n_items, n_expert, n_slots, map, list, cache);
    if (st != TM_OK) return st;
    fetch_arg a = {*src, *dst, items, n_items, n_expert, n_slots, map, list, {0}, cache != NULL};
    if (cache) a.cache = *cache;
    return mock_launch(stream, "cuda_moe_fetch_ahead", fetch_run, &a, sizeof(a));
}

/* ---- norm, add, rope ---- */

typedef struct norm_arg {
    float *y, *x;   /* add: x[r] += a[r] first, when a is set */
    const float *a; /* NULL: plain rmsnorm */
    const float *w;
    int64_t n_rows, n;
    float eps;
} norm_arg;

static bool norm_run(void *arg, char *err, size_t err_size) {
    const norm_arg *a = arg;
    const size_t bytes = (size_t)(a->n_rows * a->n) * 4;
    NEED_DEVICE(a->x, bytes, "x");
    NEED_DEVICE(a->y, bytes, "the output");
    if (a->a) NEED_DEVICE(a->a, bytes, "the addend");
    if (a->w) NEED_DEVICE(a->w, (size_t)a->n * 4, "the norm weights");
    for (int64_t r = 0; r < a->n_rows; r++) {
        float *x = a->x + r * a->n;
        if (a->a)
            for (int64_t i = 0; i < a->n; i++) x[i] += a->a[r * a->n + i];
        cpu_rmsnorm(a->y + r * a->n, x, a->w, a->n, a->eps);
    }
    return true;
}

static tm_status norm_launch(const char *op, const norm_arg *a, tm_cuda_stream stream) {
    tm_status st = cuda_rmsnorm_args_check(op, a->n_rows, a->n);
    if (st != TM_OK) return st;
    return mock_launch(stream, op, norm_run, a, sizeof(*a));
}

tm_status cuda_rmsnorm(float *y, const float *x, const float *w, int64_t n_rows, int64_t n,
                       float eps, tm_cuda_stream stream) {
    const norm_arg a = {y, (float *)x, NULL, w, n_rows, n, eps}; /* x only read */
    return norm_launch("cuda_rmsnorm", &a, stream);
}

tm_status cuda_add_rmsnorm(float *x, const float *a, float *h, const float *w, int64_t n_rows,
                           int64_t n, float eps, tm_cuda_stream stream) {
    const norm_arg arg = {h, x, a, w, n_rows, n, eps};
    return norm_launch("cuda_add_rmsnorm", &arg, stream);
}

typedef struct add_arg {
    float *y;
    const float *a, *b;
    int64_t n;
} add_arg;

static bool add_run(void *arg, char *err, size_t err_size) {
    const add_arg *a = arg;
    NEED_DEVICE(a->y, (size_t)a->n * 4, "y");
    NEED_DEVICE(a->a, (size_t)a->n * 4, "a");
    NEED_DEVICE(a->b, (size_t)a->n * 4, "b");
    for (int64_t i = 0; i < a->n; i++) a->y[i] = a->a[i] + a->b[i];
    return true;
}

typedef struct bias_arg {
    float *y;
    const float *b;
    int64_t n_rows, n;
} bias_arg;

static bool bias_run(void *arg, char *err, size_t err_size) {
    const bias_arg *a = arg;
    NEED_DEVICE(a->y, (size_t)(a->n_rows * a->n) * 4, "y");
    NEED_DEVICE(a->b, (size_t)a->n * 4, "b");
    for (int64_t r = 0; r < a->n_rows; r++) cpu_axpy(a->y + r * a->n, 1.0f, a->b, a->n);
    return true;
}

tm_status cuda_add_bias(float *y, const float *b, int64_t n_rows, int64_t n,
                        tm_cuda_stream stream) {
    tm_status st = cuda_add_bias_args_check(n_rows, n);
    if (st != TM_OK || n_rows == 0) return st;
    const bias_arg arg = {y, b, n_rows, n};
    return mock_launch(stream, "cuda_add_bias", bias_run, &arg, sizeof(arg));
}

tm_status cuda_add(float *y, const float *a, const float *b, int64_t n, tm_cuda_stream stream) {
    tm_status st = cuda_add_args_check(n);
    if (st != TM_OK || n == 0) return st;
    const add_arg arg = {y, a, b, n};
    return mock_launch(stream, "cuda_add", add_run, &arg, sizeof(arg));
}

typedef struct rope_arg {
    float *x;
    const int32_t *pos;
    int64_t n_tok, n_head, head_dim;
    float base;
} rope_arg;

static bool rope_run(void *arg, char *err, size_t err_size) {
    const rope_arg *a = arg;
    const int64_t d = a->head_dim;
    NEED_DEVICE(a->x, (size_t)(a->n_tok * a->n_head * d) * 4, "x");
    NEED_DEVICE(a->pos, (size_t)a->n_tok * 4, "the positions");
    float *cs = malloc((size_t)d * sizeof(float)); /* cos [d/2] then sin [d/2] */
    if (!cs) return mock_fail(err, err_size, "out of host memory");
    for (int64_t t = 0; t < a->n_tok; t++) {
        cpu_rope_table(cs, cs + d / 2, d, a->pos[t], a->base);
        for (int64_t h = 0; h < a->n_head; h++)
            cpu_rope_neox_table(a->x + (t * a->n_head + h) * d, d, cs, cs + d / 2);
    }
    free(cs);
    return true;
}

tm_status cuda_rope_neox(float *x, const int32_t *pos, int64_t n_tok, int64_t n_head,
                         int64_t head_dim, float base, tm_cuda_stream stream) {
    tm_status st = cuda_rope_neox_args_check(n_tok, n_head, head_dim);
    if (st != TM_OK) return st;
    const rope_arg a = {x, pos, n_tok, n_head, head_dim, base};
    return mock_launch(stream, "cuda_rope_neox", rope_run, &a, sizeof(a));
}

/* ---- hand-offs ---- */

typedef struct signal_arg {
    tm_cuda_span spans[TM_CUDA_SIGNAL_SPANS];
    int n_spans;
    uint32_t *flag;
    const uint32_t *seq;
} signal_arg;

static bool signal_run(void *arg, char *err, size_t err_size) {
    const signal_arg *a = arg;
    NEED_DEVICE(a->flag, 4, "the flag");
    NEED_DEVICE(a->seq, 4, "seq");
    for (int s = 0; s < a->n_spans; s++) {
        NEED_DEVICE(a->spans[s].dst, (size_t)a->spans[s].bytes, "a span's destination");
        NEED_DEVICE(a->spans[s].src, (size_t)a->spans[s].bytes, "a span's source");
    }
    for (int s = 0; s < a->n_spans; s++)
        memcpy(a->spans[s].dst, a->spans[s].src, (size_t)a->spans[s].bytes);
    /* release: a host that sees the flag sees every byte above */
    __atomic_store_n(a->flag, *a->seq, __ATOMIC_RELEASE);
    return true;
}

tm_status cuda_signal_host(const tm_cuda_span *spans, int n_spans, uint32_t *flag,
                           const uint32_t *seq, tm_cuda_stream stream) {
    tm_status st = cuda_signal_host_args_check(spans, n_spans);
    if (st != TM_OK) return st;
    signal_arg a;
    memset(&a, 0, sizeof(a));
    a.n_spans = n_spans, a.flag = flag, a.seq = seq;
    for (int s = 0; s < n_spans; s++) a.spans[s] = spans[s];
    return mock_launch(stream, "cuda_signal_host", signal_run, &a, sizeof(a));
}

typedef struct wait_arg {
    const int32_t *need;
    int32_t n_need;
    const uint32_t *flag, *seq;
    uint64_t timeout_ns;
    uint32_t *err;
    float *x;
    const float *add;
    int64_t n;
} wait_arg;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static bool wait_run(void *arg, char *err, size_t err_size) {
    const wait_arg *a = arg;
    NEED_DEVICE(a->flag, 4, "the flag");
    NEED_DEVICE(a->seq, 4, "seq");
    NEED_DEVICE(a->err, 4, "err");
    NEED_DEVICE(a->x, (size_t)a->n * 4, "x");
    NEED_DEVICE(a->add, (size_t)a->n * 4, "add");
    if (a->need) {
        NEED_DEVICE(a->need, (size_t)a->n_need * 4, "the needs");
        int64_t needed = 0;
        for (int32_t i = 0; i < a->n_need; i++) needed += a->need[i];
        if (!needed) return true; /* nothing for the host: no wait, nothing added */
    }
    const uint32_t want = *a->seq;
    const uint64_t t0 = now_ns();
    for (unsigned polls = 0; (int32_t)(__atomic_load_n(a->flag, __ATOMIC_ACQUIRE) - want) < 0;
         polls++) {
        if (now_ns() - t0 > a->timeout_ns) { /* not a stream error: the engine reads *err */
            __atomic_store_n(a->err, 1u, __ATOMIC_RELEASE);
            return true;
        }
        if (polls < 100) {
            sched_yield();
        } else {
            const struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
    for (int64_t i = 0; i < a->n; i++) a->x[i] += a->add[i]; /* read after the flag */
    return true;
}

tm_status cuda_wait_host(const uint32_t *flag, const uint32_t *seq, uint64_t timeout_ns,
                         uint32_t *err, float *x, const float *add, int64_t n,
                         tm_cuda_stream stream) {
    return cuda_wait_host_unless(NULL, 0, flag, seq, timeout_ns, err, x, add, n, stream);
}

tm_status cuda_wait_host_unless(const int32_t *need, int32_t n_need, const uint32_t *flag,
                                const uint32_t *seq, uint64_t timeout_ns, uint32_t *err, float *x,
                                const float *add, int64_t n, tm_cuda_stream stream) {
    tm_status st = cuda_wait_host_args_check(need, n_need, x, add, n);
    if (st != TM_OK) return st;
    const wait_arg a = {need, n_need, flag, seq, timeout_ns, err, x, add, n};
    return mock_launch(stream, "cuda_wait_host", wait_run, &a, sizeof(a));
}
