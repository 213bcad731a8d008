/* Grouped experts for prompt batches on tensor cores (cuda_moe_grouped_gemm):
 * the work list is expert-major and its groups are known on the host.
 *
 * Host: valid groups (slot in range, at least one item) are sorted by their
 * padded size P = round_up(items, TM_MOE_GEMM_PAD) and laid out one after the
 * other in "rows" (row0 = prefix sum of P), and cut into tiles of at most
 * TM_MOE_MMA_TILE_ROWS rows. One upload carries the sorted slots, the row map
 * (row -> item index, -1 for padding rows) and the tiles {group, row, rows}.
 *
 * Device, for all groups (launch counts per layer in brackets):
 *   gather   [1]  xg[row] = f16(x[item.token]); padding/skipped items: zeros
 * then one of two paths:
 *
 * Fused (moe_mma.cu, when tm_moe_mma_supported: block-quantized gate, up and
 * down with k a multiple of their chunking, and fewer than
 * TM_MOE_GEMM_DEQUANT_ROWS rows a group on average): [2] launches,
 * weights dequantized tile by tile in shared memory only:
 *   gate/up  h[row][f] = f16(silu(gate_e xg[row]) * up_e xg[row])
 *   down     y[token] += weight * down_e h[row] (atomicAdd)
 *   (an extension's biases and activation in the same places: moe_ext.cuh)
 *
 * Dequantize (many rows a group of weights not streamed in, MXFP4 weights, the
 * fallback, or env TIERMOE_MOE_GEMM=dequant):
 *   per chunk of groups whose f16 weights fit TM_MOE_GEMM_WEIGHT_BYTES
 *   (Qwen3-30B-A3B: 9 MiB an expert, 28 per chunk):
 *     dequant  [3]  gate and up into wgu[g] = [gate rows; up rows] (2 n_ff x
 *                   n_embd), down into wd[g] (n_embd x n_ff), one launch per
 *                   matrix over all groups of the chunk
 *     gate/up  [1 per distinct P]  cublasGemmStridedBatchedEx over the groups
 *                   of equal P (consecutive after the sort):
 *                   C = gu + row0*2n_ff  (2n_ff x P, ldc 2n_ff: gu row-major [row][2n_ff])
 *                   A = wgu[g]           (n_embd x 2n_ff, lda n_embd), op T
 *                   B = xg + row0*n_embd (n_embd x P, ldb n_embd), op N
 *                   strides: A 2 n_ff n_embd, B P n_embd, C P 2n_ff
 *     swiglu   [1]  h[row][f] = f16(silu(g) * u), g = gu[row][f], u = gu[row][n_ff+f]
 *     down     [1 per distinct P]  C = dd + row0*n_embd (n_embd x P, ldc n_embd),
 *                   A = wd[g] (n_ff x n_embd, lda n_ff) op T, B = h + row0*n_ff
 *                   (n_ff x P, ldb n_ff) op N; strides n_embd n_ff, P n_ff, P n_embd
 *   scatter  [1]  y[token] += weight * dd[row] (atomicAdd: a token has k items)
 *   Its cost: the f16 weights of every used expert are written and read once
 *   (3 x 2 x n_ff x n_embd bytes each, 1.2 GB a layer for 128 Qwen3 experts).
 * Both: f16 inputs, f32 accumulation and outputs.
 *
 * Scratch (cuda_moe_grouped_gemm_scratch_bytes), each part 256-aligned, with
 * R = n_items + (TM_MOE_GEMM_PAD - 1) n_groups rows at most, T = n_groups +
 * ceil(R / TM_MOE_MMA_TILE_ROWS) tiles at most and G groups per chunk:
 * map int32 [n_groups + R + 3 T] | xg f16 [R][n_embd] | h f16 [R][n_ff] |
 * gu f32 [R][2 n_ff] | dd f32 [R][n_embd] | wgu f16 [G][2 n_ff][n_embd] |
 * wd f16 [G][n_embd][n_ff]. The fused path uses map, xg and h only, and its
 * size is just those (gu, dd, wgu, wd empty): parameters the fused path takes
 * are sized for it, others (float weights, TIERMOE_MOE_GEMM=dequant) for the
 * dequantize path.
 *
 * The upload is a pageable host copy, so this op cannot be captured in a CUDA
 * graph (prompts are not). */
#include "core/log.h"
#include "cuda/cuda_args.h"
#include "cuda/dequant.cuh"
#include "cuda/gemm.cuh"
#include "cuda/moe_ext.cuh"
#include "cuda/moe_mma.cuh"

#include <stdlib.h>
#include <string.h>

#define TM_MOE_GEMM_PAD          16                  /* group rows padded to the tensor-core tile */
#define TM_MOE_GEMM_WEIGHT_BYTES ((size_t)256 << 20) /* dequantized weights a chunk */

/* the fused kernels' MMAs and tiles take whole 16-row blocks of a group */
static_assert(TM_MOE_GEMM_PAD == 16 && TM_MOE_MMA_TILE_ROWS % TM_MOE_GEMM_PAD == 0,
              "group padding vs the fused tiles");

typedef struct tm_moe_gemm_layout {
    size_t map, xg, gu, h, dd, wgu, wd, total;
    int64_t rows, tiles, chunk_groups;
} tm_moe_gemm_layout;

static size_t tm_moe_align(size_t n) {
    return (n + 255) & ~(size_t)255;
}

/* Rows a group (an expert's tokens) from which the dequantize path wins: its
 * cost is the f16 weights written and read once per used expert, which many
 * rows amortize, while cuBLAS's tiles beat the fused kernels' per row. H200,
 * -ngl all, q4_K experts, t/s fused against dequantize: 32 rows a group
 * (GLM-4.5-Air pp512) 9,949 / 9,221, Mixtral pp128 5,413 / 4,681; 64 rows
 * GLM-4.5-Air 12,850 / 15,890, Qwen3-30B shape 39,594 / 46,487, Mixtral
 * 8,393 / 10,714; 128 rows 14,311 / 23,874, 45,763 / 66,148, 2,593 / 5,165. */
#define TM_MOE_GEMM_DEQUANT_ROWS 48

static int64_t tm_moe_gemm_dequant_rows(void) {
    const char *v = getenv("TIERMOE_MOE_GEMM_ROWS");
    return v && *v ? atoll(v) : TM_MOE_GEMM_DEQUANT_ROWS;
}

/* Whether p's products of n_items items over n_used groups with work take
 * the fused path (no dequantized weights in global memory). n_used 0: the
 * sizing's question, whether any such call may take the dequantize path
 * (a batch of at least TM_MOE_GEMM_DEQUANT_ROWS items may). A call takes it
 * only when sizing with at least its items said it may, so a scratch sized
 * for the fused path alone is only ever used by it. MXFP4 always takes the
 * dequantize path: its 17-byte blocks are staged in 4-byte pieces and the
 * fused kernels ran slower than dequantize + cuBLAS (H200, gpt-oss-20b -ngl
 * all: pp512 6,492 against 9,807 t/s, pp128 2,562 against 2,787).
 * TIERMOE_MOE_GEMM=dequant|fused chooses for comparisons;
 * TIERMOE_MOE_GEMM_ROWS moves the threshold. */
static bool tm_moe_gemm_fused(const tm_cuda_moe_params *p, int64_t n_items, int32_t n_used) {
    const char *mode = getenv("TIERMOE_MOE_GEMM");
    if ((mode && strcmp(mode, "dequant") == 0) || !tm_moe_mma_supported(p)) return false;
    if (mode && strcmp(mode, "fused") == 0) return true;
    if (p->gate.type == TM_TYPE_MXFP4 || p->up.type == TM_TYPE_MXFP4 ||
        p->down.type == TM_TYPE_MXFP4)
        return false;
    const int64_t rows = tm_moe_gemm_dequant_rows();
    return p->streamed || rows <= 0 || n_items < rows * (n_used > 0 ? n_used : 1);
}

/* Monotonic in n_items and n_groups, so a scratch sized for larger counts
 * holds the layout of smaller ones. The fused path needs map, xg and h only. */
static tm_moe_gemm_layout tm_moe_gemm_layout_of(const tm_cuda_moe_params *p, int64_t n_items,
                                                int64_t n_groups, bool fused) {
    tm_moe_gemm_layout l;
    const int64_t R = n_items + (TM_MOE_GEMM_PAD - 1) * n_groups;
    const int64_t T = n_groups + (R + TM_MOE_MMA_TILE_ROWS - 1) / TM_MOE_MMA_TILE_ROWS;
    const size_t per_expert = (size_t)3 * p->n_ff * p->n_embd * 2;
    int64_t G = (int64_t)(TM_MOE_GEMM_WEIGHT_BYTES / per_expert);
    if (G < 1) G = 1;
    if (G > 65535) G = 65535; /* grid.y of the dequantize launch */
    if (G > n_groups) G = n_groups;
    size_t o = 0;
    l.map = o, o += tm_moe_align((size_t)(n_groups + R + 3 * T) * 4);
    l.xg = o, o += tm_moe_align((size_t)R * p->n_embd * 2);
    l.h = o, o += tm_moe_align((size_t)R * p->n_ff * 2);
    if (fused) G = 0;
    const int64_t Rd = fused ? 0 : R; /* rows of the dequantize path's buffers */
    l.gu = o, o += tm_moe_align((size_t)Rd * 2 * p->n_ff * 4);
    l.dd = o, o += tm_moe_align((size_t)Rd * p->n_embd * 4);
    l.wgu = o, o += tm_moe_align((size_t)G * 2 * p->n_ff * p->n_embd * 2);
    l.wd = o, o += tm_moe_align((size_t)G * p->n_embd * p->n_ff * 2);
    l.total = o, l.rows = R, l.tiles = T, l.chunk_groups = G;
    return l;
}

/* One block per row: the item's token row of x as f16, or zeros. */
__global__ void __launch_bounds__(256)
    tm_moe_gather_kernel(const int32_t *__restrict__ rowmap,
                         const tm_cuda_moe_item *__restrict__ items, int32_t n_slots,
                         tm_cuda_moe_ext ext, const float *__restrict__ x, int64_t n_tok,
                         int64_t n_embd, __half *__restrict__ xg) {
    const int64_t row = blockIdx.x;
    const int32_t i = rowmap[row];
    __half *o = xg + row * n_embd;
    const tm_cuda_moe_item it = i >= 0 ? items[i] : tm_cuda_moe_item{-1, -1, 0.0f, -1};
    if (!tm_moe_item_valid(it, n_slots, n_tok, ext)) {
        for (int64_t c = threadIdx.x; c < n_embd; c += blockDim.x) o[c] = __float2half_rn(0.0f);
        return;
    }
    const float *xr = x + (int64_t)it.token * n_embd;
    for (int64_t c = threadIdx.x; c < n_embd; c += blockDim.x) o[c] = __float2half_rn(xr[c]);
}

/* h[row][f] = f16(act(g, u)) (moe_ext.cuh) for rows [0, n_rows) of the
 * pointers given; rows whose item is padding or skipped get 0. */
__global__ void __launch_bounds__(256)
    tm_moe_swiglu_kernel(const float *__restrict__ gu, const int32_t *__restrict__ rowmap,
                         const tm_cuda_moe_item *__restrict__ items, int32_t n_slots, int64_t n_tok,
                         tm_cuda_moe_ext ext, int64_t n_rows, int64_t n_ff,
                         __half *__restrict__ h) {
    const int64_t i = (int64_t)blockIdx.x * 256 + threadIdx.x;
    if (i >= n_rows * n_ff) return;
    const int64_t row = i / n_ff, f = i - row * n_ff;
    const int32_t it = rowmap[row];
    const tm_cuda_moe_item m = it >= 0 ? items[it] : tm_cuda_moe_item{-1, -1, 0.0f, -1};
    const float g = gu[row * 2 * n_ff + f], u = gu[row * 2 * n_ff + n_ff + f];
    h[i] = __float2half_rn(tm_moe_item_valid(m, n_slots, n_tok, ext)
                               ? tm_moe_ext_h(ext, m.expert, f, n_ff, g, u)
                               : 0.0f);
}

/* One block per row: y[token] += weight * dd[row] for valid items. */
__global__ void __launch_bounds__(256)
    tm_moe_scatter_kernel(const int32_t *__restrict__ rowmap,
                          const tm_cuda_moe_item *__restrict__ items, int32_t n_slots,
                          tm_cuda_moe_ext ext, const float *__restrict__ dd, int64_t n_tok,
                          int64_t n_embd, float *__restrict__ y) {
    const int64_t row = blockIdx.x;
    const int32_t i = rowmap[row];
    if (i < 0) return;
    const tm_cuda_moe_item it = items[i];
    if (!tm_moe_item_valid(it, n_slots, n_tok, ext)) return;
    const float *dr = dd + row * n_embd;
    float *yr = y + (int64_t)it.token * n_embd;
    for (int64_t c = threadIdx.x; c < n_embd; c += blockDim.x)
        atomicAdd(yr + c, it.weight * (dr[c] + tm_moe_ext_down(ext, it.expert, c, n_embd)));
}

extern "C" size_t cuda_moe_grouped_gemm_scratch_bytes(const tm_cuda_moe_params *p, int64_t n_items,
                                                      int32_t n_groups) {
    if (!p || p->n_embd <= 0 || p->n_ff <= 0 || n_items < 0 || n_groups <= 0) return 0;
    /* the larger layout when a batch this large may take either path */
    const tm_moe_gemm_layout f = tm_moe_gemm_layout_of(p, n_items, n_groups, true),
                             d = tm_moe_gemm_layout_of(p, n_items, n_groups, false);
    return tm_moe_gemm_fused(p, n_items, 0) ? f.total : f.total > d.total ? f.total : d.total;
}

typedef struct tm_moe_sorted {
    int32_t padded, group;
} tm_moe_sorted;

static int tm_moe_sorted_cmp(const void *a, const void *b) {
    const tm_moe_sorted *x = (const tm_moe_sorted *)a, *y = (const tm_moe_sorted *)b;
    if (x->padded != y->padded) return x->padded < y->padded ? -1 : 1;
    return x->group < y->group ? -1 : x->group > y->group;
}

/* The groups' products, one chunk of sorted groups [s0, s1) at a time. */
static tm_status tm_moe_gemm_chunks(tm_cuda_blas *b, const tm_cuda_moe_params *p,
                                    const tm_moe_sorted *srt, const int64_t *row0, int32_t n_srt,
                                    const int32_t *slots_d, const tm_cuda_moe_item *items,
                                    int64_t n_tok, const tm_moe_gemm_layout *l, char *base,
                                    cudaStream_t stream) {
    const int32_t *rowmap = slots_d + n_srt;
    static const char op[] = "cuda_moe_grouped_gemm";
    const int64_t E = p->n_embd, F = p->n_ff;
    __half *xg = (__half *)(base + l->xg), *h = (__half *)(base + l->h);
    __half *wgu = (__half *)(base + l->wgu), *wd = (__half *)(base + l->wd);
    float *gu = (float *)(base + l->gu), *dd = (float *)(base + l->dd);
    tm_status st;
    for (int32_t s0 = 0; s0 < n_srt; s0 += (int32_t)l->chunk_groups) {
        const int32_t s1 = n_srt - s0 < l->chunk_groups ? n_srt : s0 + (int32_t)l->chunk_groups;
        const int32_t cnt = s1 - s0;
        const tm_cuda_moe_matrix *G = &p->gate, *U = &p->up, *D = &p->down;
        if ((st = tm_dequant_f16_run(op, G->type, G->data, G->row_bytes, F, E, G->expert_stride,
                                     slots_d + s0, cnt, wgu, 2 * F * E, stream)) != TM_OK ||
            (st = tm_dequant_f16_run(op, U->type, U->data, U->row_bytes, F, E, U->expert_stride,
                                     slots_d + s0, cnt, wgu + F * E, 2 * F * E, stream)) != TM_OK ||
            (st = tm_dequant_f16_run(op, D->type, D->data, D->row_bytes, E, F, D->expert_stride,
                                     slots_d + s0, cnt, wd, E * F, stream)) != TM_OK)
            return st;
        /* gate and up of equal-P runs: gu rows [row0, row0 + batch*P) */
        for (int32_t i = s0, j; i < s1; i = j) {
            const int64_t P = srt[i].padded;
            for (j = i; j < s1 && srt[j].padded == P; j++) {
            }
            st = tm_blas_gemm_tn(op, b, 2 * F, P, E, wgu + (int64_t)(i - s0) * 2 * F * E, E,
                                 2 * F * E, xg + row0[i] * E, E, P * E, gu + row0[i] * 2 * F, 2 * F,
                                 P * 2 * F, j - i);
            if (st != TM_OK) return st;
        }
        const int64_t r_begin = row0[s0], r_end = row0[s1 - 1] + srt[s1 - 1].padded;
        const int64_t n_el = (r_end - r_begin) * F;
        tm_moe_swiglu_kernel<<<(unsigned)((n_el + 255) / 256), 256, 0, stream>>>(
            gu + r_begin * 2 * F, rowmap + r_begin, items, p->n_slots, n_tok, p->ext,
            r_end - r_begin, F, h + r_begin * F);
        if ((st = tm_cuda_launch_check("cuda_moe_grouped_gemm swiglu", r_end - r_begin, F, 1)) !=
            TM_OK)
            return st;
        for (int32_t i = s0, j; i < s1; i = j) {
            const int64_t P = srt[i].padded;
            for (j = i; j < s1 && srt[j].padded == P; j++) {
            }
            st = tm_blas_gemm_tn(op, b, E, P, F, wd + (int64_t)(i - s0) * E * F, F, E * F,
                                 h + row0[i] * F, F, P * F, dd + row0[i] * E, E, P * E, j - i);
            if (st != TM_OK) return st;
        }
    }
    return TM_OK;
}

extern "C" tm_status cuda_moe_grouped_gemm(tm_cuda_blas *b, const tm_cuda_moe_params *p,
                                           const tm_cuda_moe_groups *g, const float *x,
                                           int64_t n_tok, float *y, void *scratch,
                                           tm_cuda_stream stream) {
    static const char op[] = "cuda_moe_grouped_gemm";
    tm_status st = cuda_moe_grouped_gemm_args_check(b, p, g, x, n_tok, y, scratch);
    const int32_t n = st == TM_OK ? g->n_groups : 0;
    if (n == 0) return st;

    /* sort the groups that have work by padded size; give each its rows */
    const int64_t n_items = g->starts[n] - g->starts[0];
    tm_moe_sorted *srt = (tm_moe_sorted *)malloc((size_t)n * sizeof(*srt));
    int64_t *row0 = (int64_t *)malloc((size_t)n * sizeof(*row0));
    if (!srt || !row0) {
        free(srt), free(row0);
        return tm_error_set(TM_ERR_NOMEM, "%s: out of host memory for %d groups", op, n);
    }
    int32_t n_srt = 0;
    int64_t n_work = 0; /* items of the groups with work */
    for (int32_t i = 0; i < n; i++) {
        const int64_t cnt = g->starts[i + 1] - g->starts[i];
        if (cnt == 0 || g->slots[i] < 0 || g->slots[i] >= p->n_slots) continue; /* skipped */
        srt[n_srt].padded =
            (int32_t)((cnt + TM_MOE_GEMM_PAD - 1) / TM_MOE_GEMM_PAD * TM_MOE_GEMM_PAD);
        srt[n_srt++].group = i;
        n_work += cnt;
    }
    const bool fused = tm_moe_gemm_fused(p, n_work, n_srt);
    const tm_moe_gemm_layout l = tm_moe_gemm_layout_of(p, n_items, n, fused);
    int32_t *hb = (int32_t *)malloc((size_t)(n + l.rows + 3 * l.tiles) * sizeof(*hb));
    if (!hb) {
        free(srt), free(row0);
        return tm_error_set(TM_ERR_NOMEM, "%s: out of host memory for %d groups", op, n);
    }
    qsort(srt, (size_t)n_srt, sizeof(*srt), tm_moe_sorted_cmp);
    int64_t R = 0;
    int32_t *rowmap = hb + n_srt;
    for (int32_t s = 0; s < n_srt; s++) {
        const int32_t gi = srt[s].group;
        const int64_t first = g->starts[gi], cnt = g->starts[gi + 1] - first;
        hb[s] = g->slots[gi];
        row0[s] = R;
        for (int64_t j = 0; j < srt[s].padded; j++)
            rowmap[R + j] = j < cnt ? (int32_t)(first + j) : -1;
        R += srt[s].padded;
    }
    /* tiles of the fused path: {sorted group, first row, rows <= TILE_ROWS} */
    int32_t *tiles = rowmap + R;
    int64_t n_tiles = 0;
    for (int32_t s = 0; fused && s < n_srt; s++)
        for (int32_t j = 0; j < srt[s].padded; j += TM_MOE_MMA_TILE_ROWS, n_tiles++) {
            tiles[3 * n_tiles] = s;
            tiles[3 * n_tiles + 1] = (int32_t)(row0[s] + j);
            tiles[3 * n_tiles + 2] =
                srt[s].padded - j < TM_MOE_MMA_TILE_ROWS ? srt[s].padded - j : TM_MOE_MMA_TILE_ROWS;
        }
    TM_ASSERT(R <= l.rows && n_tiles <= l.tiles);
    char *base = (char *)scratch;
    int32_t *map_d = (int32_t *)(base + l.map);
    __half *xg = (__half *)(base + l.xg);
    st = TM_OK;
    if (n_srt > 0) {
        /* pageable source: staged before the call returns, so hb may be freed */
        cudaError_t e =
            cudaMemcpyAsync(map_d, hb, (size_t)(n_srt + R + 3 * n_tiles) * sizeof(int32_t),
                            cudaMemcpyHostToDevice, stream);
        if (e != cudaSuccess)
            st = tm_error_set(TM_ERR_DEVICE, "%s: uploading the row map (%lld rows) failed: %s", op,
                              (long long)R, cudaGetErrorString(e));
    }
    if (st == TM_OK && n_srt > 0 && !fused) st = tm_blas_bind(op, b, stream);
    if (st == TM_OK && n_srt > 0) {
        tm_moe_gather_kernel<<<(unsigned)R, 256, 0, stream>>>(map_d + n_srt, g->items, p->n_slots,
                                                              p->ext, x, n_tok, p->n_embd, xg);
        st = tm_cuda_launch_check("cuda_moe_grouped_gemm gather", R, p->n_embd, n_srt);
    }
    if (st == TM_OK && n_srt > 0 && fused) {
        tm_moe_mma_work w;
        w.slots = map_d, w.tiles = map_d + n_srt + R, w.n_tiles = n_tiles;
        w.rowmap = map_d + n_srt, w.items = g->items, w.n_tok = n_tok;
        w.xg = xg, w.h = (__half *)(base + l.h), w.y = y;
        st = tm_moe_mma_run(p, &w, stream);
    } else if (st == TM_OK && n_srt > 0) {
        st = tm_moe_gemm_chunks(b, p, srt, row0, n_srt, map_d, g->items, n_tok, &l, base, stream);
        if (st == TM_OK) {
            tm_moe_scatter_kernel<<<(unsigned)R, 256, 0, stream>>>(
                map_d + n_srt, g->items, p->n_slots, p->ext, (const float *)(base + l.dd), n_tok,
                p->n_embd, y);
            st = tm_cuda_launch_check("cuda_moe_grouped_gemm scatter", R, p->n_embd, n_srt);
        }
    }
    free(srt), free(row0), free(hb);
    return st;
}
