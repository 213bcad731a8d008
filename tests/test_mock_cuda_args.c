/* The launchers' argument contract (src/cuda/cuda_args.h) through the host
 * mock: each case makes one argument of an otherwise valid call bad and
 * expects the error at once (TM_ERR_ARG or TM_ERR_UNSUPPORTED, the message
 * naming the argument), also where the call has no work (zero tokens or
 * items: the checks come before the early return), and nothing queued: the
 * stream is still healthy after all of them. The same checks run in the real
 * launchers (src/cuda/<op>.cu), so what fails here fails on a GPU. */
#include "cuda/cuda_args.h"
#include "mock/mock_gpu_util.h"

#define BIG_ROWS 0x80000000LL /* one more than a kernel's int holds */

/* st is `want` and the message names `what`. */
static void expect_error(tm_status st, tm_status want, const char *what, const char *call) {
    if (st != want)
        fail_msg("%s: got %s, want %s (%s)", call, tm_status_name(st), tm_status_name(want),
                 st ? tm_error_message() : "accepted");
    if (!strstr(tm_error_message(), what))
        fail_msg("%s: the message \"%s\" does not name \"%s\"", call, tm_error_message(), what);
    tm_error_clear();
}
#define EXPECT_ARG(call, what)         expect_error((call), TM_ERR_ARG, (what), #call)
#define EXPECT_UNSUPPORTED(call, what) expect_error((call), TM_ERR_UNSUPPORTED, (what), #call)

/* A valid router: 8 experts, 2 used, softmax. */
static tm_cuda_router_params router(void) {
    tm_cuda_router_params p;
    memset(&p, 0, sizeof(p));
    p.gating = TM_CUDA_GATING_SOFTMAX, p.n_expert = 8, p.n_used = 2, p.scale = 1.0f;
    return p;
}

static void test_router_args(void **state) {
    (void)state;
    gpu g = gpu_open(0);
    float *l = dalloc(&g, 64 * 4), *w = dalloc(&g, 64 * 4);
    int32_t *ids = dalloc(&g, 64 * 4), *map = dalloc(&g, 64 * 4);
    tm_cuda_moe_item *items = dalloc(&g, 64 * sizeof(tm_cuda_moe_item));
    tm_cuda_router_params p = router();
    assert_int_equal(cuda_router_select(&p, l, 0, ids, w, items, g.s), TM_OK); /* no work */
    p.fetched = items; /* a fetched list without its map: with and without tokens */
    EXPECT_ARG(cuda_router_select(&p, l, 0, ids, w, items, g.s), "fetch_map");
    EXPECT_ARG(cuda_router_select(&p, l, 4, ids, w, items, g.s), "fetch_map");
    p = router(), p.mapped = items; /* a mapped list without a slot map */
    EXPECT_ARG(cuda_router_select(&p, l, 0, ids, w, items, g.s), "slot_map");
    p.slot_map = map, p.mapped_share_q8 = 257;
    EXPECT_ARG(cuda_router_select(&p, l, 0, ids, w, items, g.s), "mapped_share_q8");
    p = router(), p.n_used = 9;
    EXPECT_ARG(cuda_router_select(&p, l, 0, ids, w, items, g.s), "9 used");
    p = router(), p.n_expert = TM_CUDA_ROUTER_MAX_EXPERT + 1, p.n_used = 2;
    EXPECT_ARG(cuda_router_select(&p, l, 1, ids, w, items, g.s), "513 experts");
    p = router(), p.gating = (tm_cuda_gating)3;
    EXPECT_ARG(cuda_router_select(&p, l, 0, ids, w, items, g.s), "gating");
    p = router();
    EXPECT_ARG(cuda_router_select(&p, l, -1, ids, w, items, g.s), "n_tok");
    EXPECT_ARG(cuda_router_select(&p, l, BIG_ROWS, ids, w, items, g.s), "n_tok");
    assert_int_equal(cuda_stream_sync(g.s), TM_OK); /* nothing bad was queued */
    gpu_close(&g);
}

static void test_product_args(void **state) {
    (void)state;
    gpu g = gpu_open(0);
    const int64_t k = 256;
    const size_t rb = quant_row_size(TM_TYPE_Q8_0, k), rb4 = quant_row_size(TM_TYPE_Q4_K, k);
    uint8_t *w = dalloc(&g, 4 * rb4);
    float *x = dalloc(&g, (size_t)k * 4 * 2), *y = dalloc(&g, 64 * 4);
    void *xq = dalloc(&g, cuda_q8x_bytes(k, 2)), *scratch = dalloc(&g, 1 << 16);
    assert_int_equal(cuda_mmvq(TM_TYPE_Q8_0, w, rb, 4, k, x, 1, y, g.s), TM_OK);
    /* rows past a kernel's int: the real mmvq refused them on its fast path only */
    EXPECT_ARG(cuda_mmvq(TM_TYPE_Q8_0, w, rb, BIG_ROWS, k, x, 1, y, g.s), "rows");
    EXPECT_ARG(cuda_mmvq(TM_TYPE_Q8_0, w, rb, 0, k, x, 1, y, g.s), "rows");
    EXPECT_ARG(cuda_mmvq(TM_TYPE_Q8_0, w, rb, 4, k, x, 9, y, g.s), "n_tok");
    EXPECT_ARG(cuda_mmvq(TM_TYPE_Q8_0, w, rb, 4, k, x + 1, 1, y, g.s), "activations x");
    EXPECT_ARG(cuda_mmvq(TM_TYPE_Q8_0, w, rb - 1, 4, k, x, 1, y, g.s), "row stride");
    EXPECT_ARG(cuda_mmvq(TM_TYPE_Q8_0, w, rb, 4, 48, x, 1, y, g.s), "k = 48");
    EXPECT_ARG(cuda_mmvq(TM_TYPE_F32, w + 2, 1024, 4, k, x, 1, y, g.s), "aligned");
    EXPECT_UNSUPPORTED(cuda_mmvq(TM_TYPE_NVFP4, w, rb, 4, k, x, 1, y, g.s), "no CUDA kernel");
    EXPECT_ARG(cuda_q8x_quantize(x, 48, 1, xq, g.s), "k 48");
    EXPECT_ARG(cuda_q8x_quantize(x, k, 1, (char *)xq + 4, g.s), "xq");
    EXPECT_ARG(cuda_q8x_quantize(NULL, k, 1, xq, g.s), "x (nil)");
    EXPECT_ARG(cuda_mmvq_q8x(TM_TYPE_Q4_K, w, rb4, BIG_ROWS, k, xq, 1, y, g.s), "rows");
    EXPECT_ARG(cuda_mmvq_q8x(TM_TYPE_Q4_K, w, rb4, 4, k, (char *)xq + 8, 1, y, g.s), "xq");
    EXPECT_ARG(cuda_mmvq_q8x(TM_TYPE_Q8_0, w, rb, 4, 96, xq, 1, y, g.s), "k 96");
    EXPECT_ARG(cuda_dequantize_f16(TM_TYPE_Q8_0, w, rb, BIG_ROWS, k, scratch, g.s), "rows");
    EXPECT_ARG(cuda_dequantize_f16(TM_TYPE_Q8_0, w, rb, 4, k, (char *)scratch + 1, g.s), "output");
    tm_cuda_blas *blas;
    assert_int_equal(cuda_blas_create(g.dev, &blas), TM_OK);
    EXPECT_ARG(cuda_gemm(NULL, TM_TYPE_Q8_0, w, rb, 4, k, x, 2, y, scratch, g.s), "handle");
    EXPECT_ARG(cuda_gemm(blas, TM_TYPE_Q8_0, w, rb, BIG_ROWS, k, x, 2, y, scratch, g.s), "rows");
    EXPECT_ARG(cuda_gemm(blas, TM_TYPE_Q8_0, w, rb, 4, k, x, 2, y, (char *)scratch + 8, g.s),
               "scratch");
    cuda_blas_free(blas);
    assert_int_equal(cuda_stream_sync(g.s), TM_OK);
    gpu_close(&g);
}

/* Valid grouped-expert params over q8_0 experts at w: n_embd = n_ff = 64, 2 slots. */
static tm_cuda_moe_params moe(const void *w) {
    tm_cuda_moe_params p;
    memset(&p, 0, sizeof(p));
    p.n_embd = p.n_ff = 64, p.n_slots = 2;
    const size_t rb = quant_row_size(TM_TYPE_Q8_0, 64);
    const tm_cuda_moe_matrix m = {w, TM_TYPE_Q8_0, 64 * rb, rb};
    p.gate = p.up = p.down = m;
    return p;
}

static void test_moe_args(void **state) {
    (void)state;
    gpu g = gpu_open(0);
    const size_t bytes = 2 * 64 * quant_row_size(TM_TYPE_Q8_0, 64);
    void *w = dalloc(&g, bytes), *scratch = dalloc(&g, 1 << 16);
    float *x = dalloc(&g, 64 * 4 * 2), *y = dalloc(&g, 64 * 4 * 2), *h = dalloc(&g, 64 * 4 * 4);
    tm_cuda_moe_item *items = dalloc(&g, 4 * sizeof(tm_cuda_moe_item));
    tm_cuda_moe_params p = moe(w);
    assert_int_equal(cuda_moe_grouped(&p, items, 0, x, 1, y, h, g.s), TM_OK); /* no work */
    p.ext.act = (tm_cuda_moe_act)7; /* bad with and without items */
    EXPECT_ARG(cuda_moe_grouped(&p, items, 0, x, 1, y, h, g.s), "ext.act");
    p = moe(w), p.ext.down_bias = x; /* biases for no experts */
    EXPECT_ARG(cuda_moe_grouped(&p, items, 0, x, 1, y, h, g.s), "ext.n_expert");
    /* the generic kernels' grid: TM_MOE_WARPS rows a block, at most 65535 blocks */
    p = moe(w), p.n_ff = (int64_t)TM_MOE_WARPS * 65535 + 4;
    EXPECT_ARG(cuda_moe_grouped(&p, items, 0, x, 1, y, h, g.s), "too large for the grid");
    p = moe(w), p.down.expert_stride = 8;
    EXPECT_ARG(cuda_moe_grouped(&p, items, 0, x, 1, y, h, g.s), "expert stride");
    p = moe(w);
    EXPECT_ARG(cuda_moe_grouped(&p, items, 0, x + 1, 1, y, h, g.s), "activations x");
    EXPECT_ARG(cuda_moe_grouped(&p, items, -1, x, 1, y, h, g.s), "-1 items");
    EXPECT_ARG(cuda_moe_grouped(&p, items, 2, x, 0, y, h, g.s), "n_tok 0");
    p.n_slots = 0;
    EXPECT_ARG(cuda_moe_grouped(&p, items, 0, x, 1, y, h, g.s), "0 slots");

    tm_cuda_blas *blas;
    assert_int_equal(cuda_blas_create(g.dev, &blas), TM_OK);
    const tm_cuda_moe_groups none = {0, NULL, NULL, items};
    p = moe(w);
    assert_int_equal(cuda_moe_grouped_gemm(blas, &p, &none, x, 1, y, scratch, g.s), TM_OK);
    p.ext.act = (tm_cuda_moe_act)7; /* checked with no groups too */
    EXPECT_ARG(cuda_moe_grouped_gemm(blas, &p, &none, x, 1, y, scratch, g.s), "ext.act");
    p = moe(w), p.up.expert_stride = 8;
    EXPECT_ARG(cuda_moe_grouped_gemm(blas, &p, &none, x, 1, y, scratch, g.s), "up: expert stride");
    p = moe(w);
    const int64_t starts[3] = {0, 2, 1};
    const int32_t slots[2] = {0, 1};
    const tm_cuda_moe_groups bad = {2, slots, starts, items};
    EXPECT_ARG(cuda_moe_grouped_gemm(blas, &p, &bad, x, 1, y, scratch, g.s), "group 1");
    EXPECT_ARG(cuda_moe_grouped_gemm(blas, &p, &none, x, 1, y, (char *)scratch + 16, g.s),
               "scratch");
    cuda_blas_free(blas);

    /* copying ahead: the matrices' alignment and the cache's arrays */
    int32_t *map = dalloc(&g, 8 * 4), *list = dalloc(&g, 8 * 4);
    tm_cuda_moe_params src = moe(w), dst = moe(w);
    src.gate.data = (const char *)w + 8;
    EXPECT_ARG(cuda_moe_fetch_ahead(&src, &dst, items, 0, 8, 2, map, list, NULL, g.s), "matrix 0");
    src = moe(w), dst.down.type = TM_TYPE_F32;
    EXPECT_ARG(cuda_moe_fetch_ahead(&src, &dst, items, 0, 8, 2, map, list, NULL, g.s), "matrix 2");
    dst = moe(w);
    EXPECT_ARG(cuda_moe_fetch_ahead(&src, &dst, items, 0, 8, 2, NULL, list, NULL, g.s), "map");
    EXPECT_ARG(cuda_moe_fetch_ahead(&src, &dst, items, 0, 8, 2, map, NULL, NULL, g.s), "list");
    EXPECT_ARG(cuda_moe_fetch_ahead(&src, &dst, items, 0, 8, 17, map, list, NULL, g.s), "17 slots");
    const tm_cuda_fetch_cache cache = {map, map, (uint32_t *)list, 2, NULL};
    EXPECT_ARG(cuda_moe_fetch_ahead(&src, &dst, items, 0, 8, 2, NULL, list, &cache, g.s), "seq");
    assert_int_equal(cuda_stream_sync(g.s), TM_OK);
    gpu_close(&g);
}

static void test_small_op_args(void **state) {
    (void)state;
    gpu g = gpu_open(0);
    float *x = dalloc(&g, 256 * 4), *y = dalloc(&g, 256 * 4);
    int32_t *pos = dalloc(&g, 16);
    assert_int_equal(cuda_add(y, x, x, 0, g.s), TM_OK);
    assert_int_equal(cuda_add_bias(y, x, 0, 4, g.s), TM_OK);
    EXPECT_ARG(cuda_add(y, x, x, -1, g.s), "n = -1");
    EXPECT_ARG(cuda_add_bias(y, x, 0, 0, g.s), "n 0"); /* checked with no rows too */
    EXPECT_ARG(cuda_rmsnorm(y, x, NULL, BIG_ROWS, 4, 1e-6f, g.s), "n_rows");
    EXPECT_ARG(cuda_add_rmsnorm(x, y, y, NULL, 1, 0, 1e-6f, g.s), "cuda_add_rmsnorm");
    EXPECT_ARG(cuda_rope_neox(x, pos, 1, 2, 7, 1e4f, g.s), "head_dim 7");
    const tm_cuda_span spans[2] = {{y, x, 8}, {y, x, 6}};
    uint32_t *flag = mapped(8);
    EXPECT_ARG(cuda_signal_host(spans, 2, flag, flag + 1, g.s), "span 1");
    EXPECT_ARG(cuda_signal_host(spans, TM_CUDA_SIGNAL_SPANS + 1, flag, flag + 1, g.s), "n_spans");
    EXPECT_ARG(cuda_wait_host_unless(NULL, 2, flag, flag + 1, 1000, flag, x, y, 4, g.s), "n_need");
    EXPECT_ARG(cuda_wait_host(flag, flag + 1, 1000, flag, x, NULL, 4, g.s), "add");
    assert_int_equal(cuda_stream_sync(g.s), TM_OK);
    cuda_host_free(flag);
    gpu_close(&g);
}

static void test_ssm_args(void **state) {
    (void)state;
    gpu g = gpu_open(0);
    float *f = dalloc(&g, 4096 * 4);
    int32_t *ip = dalloc(&g, 64);
    const tm_cuda_ssm_rows rows = {ip, ip, 4, 2}, none = {ip, ip, 0, 2};
    const tm_cuda_delta_params ok = {2, 4, 16, 16, false, false, f, f};
    tm_cuda_delta_params p = ok;
    assert_int_equal(cuda_ssm_conv(&none, f, 64, 4, f, f, g.s), TM_OK); /* no work */
    EXPECT_ARG(cuda_ssm_conv(&rows, f, 64, 1, f, f, g.s), "conv width K 1");
    EXPECT_ARG(cuda_ssm_conv(&none, f, 64, 17, f, f, g.s), "conv width K 17");
    EXPECT_ARG(cuda_ssm_conv(&(tm_cuda_ssm_rows){NULL, ip, 4, 2}, f, 64, 4, f, f, g.s), "row_pos");
    EXPECT_ARG(cuda_ssm_conv(&(tm_cuda_ssm_rows){ip, ip, 4, 0}, f, 64, 4, f, f, g.s), "n_seq 0");
    assert_int_equal(cuda_delta_rule(&p, &none, f, f, f, f, f, g.s), TM_OK);
    p.k_dim = 24;
    EXPECT_ARG(cuda_delta_rule(&p, &none, f, f, f, f, f, g.s), "k_dim 24");
    p = ok, p.v_dim = TM_CUDA_DELTA_MAX_V + 1;
    EXPECT_ARG(cuda_delta_rule(&p, &rows, f, f, f, f, f, g.s), "v_dim 257");
    p = ok, p.n_v_head = 3;
    EXPECT_ARG(cuda_delta_rule(&p, &rows, f, f, f, f, f, g.s), "3 value heads");
    p = ok;
    EXPECT_ARG(cuda_delta_rule(&p, &rows, f, f, NULL, f, f, g.s), "missing a");
    p.ba_grouped = true;
    EXPECT_ARG(cuda_delta_rule(&p, &rows, f, f, f + 8, f, f, g.s), "separate a");
    p = ok, p.A = NULL;
    EXPECT_ARG(cuda_delta_rule(&p, &rows, f, f, f, f, f, g.s), "A/dt_bias");
    EXPECT_ARG(cuda_rmsnorm_gated(f, f, f, 2, 48, 32, 1e-6f, g.s), "groups of n 32");
    EXPECT_ARG(cuda_rmsnorm_gated(f, f, NULL, 0, 64, 32, 1e-6f, g.s), "w given");
    EXPECT_ARG(cuda_unzip(f, f, f, 2, 0, 4, 4, g.s), "0 groups");
    EXPECT_ARG(cuda_swiglu(f, f, f, -1, g.s), "cuda_swiglu: n = -1");
    EXPECT_ARG(cuda_gate_mul(f, f, -1, g.s), "cuda_gate_mul: n = -1");
    EXPECT_ARG(cuda_gate_add(f, f, f, 0, 0, g.s), "n 0");
    assert_int_equal(cuda_stream_sync(g.s), TM_OK);
    gpu_close(&g);
}

int main(void) {
    mock_rng_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_router_args), cmocka_unit_test(test_product_args),
        cmocka_unit_test(test_moe_args),    cmocka_unit_test(test_small_op_args),
        cmocka_unit_test(test_ssm_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
