/* The GPU parts of calibration on the host mock of the CUDA backend
 * (tests/mock/: a stream thread runs the kernels' contracts in order, events
 * take the host's clock, the hand-off flags are real atomics), so every GPU
 * code path of calib_measure runs in CI on the tiny model:
 *   - a full measurement up to 16 tokens per expert (cuda_moe_grouped up to 8,
 *     cuda_moe_grouped_gemm at 16): every GPU field measured and positive, the
 *     curve's points, the PCIe share equal to its formula on the measured
 *     rates, the JSON round trip, the printed table, the stream idle after;
 *   - calib_load_or_measure without a profile: a quick one, the GPU included;
 *   - a host that cannot pin memory (MOCK_NOREGISTER=1): calib_measure fails
 *     naming the PCIe lane; calib_load_or_measure falls back to the CPU parts;
 *   - a context with GPU lanes and no saved profile measures a quick one at
 *     load and takes the PCIe lane's share from it. */
#include <math.h>

#include "calib_test_util.h"
#include "tier/calib_internal.h"
#include "tier/tier.h"

static void check_gpu_profile(const tm_calib *c, int points) {
    assert_string_equal(c->key.gpu, "mock GPU");
    assert_int_equal(c->copy.expert_bytes, 3 * 256 * 144);
    assert_true(c->copy.big_bytes >= 4 * c->copy.expert_bytes);
    const double v[] = {c->copy.h2d_pinned_expert_gbs,   c->copy.h2d_pinned_big_gbs,
                        c->copy.h2d_pageable_expert_gbs, c->copy.h2d_pageable_big_gbs,
                        c->copy.d2h_pinned_big_gbs,      c->pcie_read_gbs,
                        c->pcie_read_concurrent_gbs,     c->cpu_lane_gbs,
                        c->cpu_lane_concurrent_gbs,      c->handoff_round_trip_ns};
    for (size_t i = 0; i < sizeof(v) / sizeof(*v); i++)
        if (!(v[i] > 0) || !isfinite(v[i])) fail_msg("GPU value %zu is %g", i, v[i]);
    if (points)
        calib_check_curve(&c->gpu_expert, points, "GPU from VRAM");
    else
        calib_check_curve(&c->gpu_expert, c->gpu_expert.n, "GPU from VRAM (quick)");
    assert_true(c->gpu_expert.n >= 2);
    const double p = c->pcie_read_concurrent_gbs, q = c->cpu_lane_concurrent_gbs;
    assert_int_equal(calib_pcie_share_q8(c), (int32_t)lround(256.0 * p / (p + q)));
    assert_true(isfinite(calib_copy_ns(c, c->copy.expert_bytes, true)));
    assert_true(isfinite(calib_gpu_expert_ns(c, 100)));
    for (int i = TM_CALIB_PHASE_COPY; i <= TM_CALIB_PHASE_HANDOFF; i++)
        assert_true(c->measure_s[i] > 0);
}

static void check_idle(tm_cuda_device *dev) {
    bool idle = false;
    assert_int_equal(cuda_stream_query(cuda_device_stream(dev), &idle), TM_OK);
    assert_true(idle);
}

/* The tiny model with the mock's GPU. */
static void gpu_fixture_open(calib_fixture *f) {
    tm_cuda_device *dev = NULL;
    assert_int_equal(cuda_device_open(0, &dev), TM_OK);
    calib_fixture_open(f, "mock_calib_tiny.gguf", 2, dev);
}

static void gpu_fixture_close(calib_fixture *f) {
    tm_cuda_device *dev = f->src.gpu;
    check_idle(dev);
    calib_fixture_close(f);
    cuda_device_close(dev);
}

/* calib_load_or_measure without a profile (nor one kept by the process): it
 * measures (quick). */
static void measure_absent(calib_fixture *f, tm_calib *c) {
    calib_kept_clear();
    char absent[512];
    calib_test_path(absent, sizeof(absent), "mock_calib_absent.json");
    remove(absent);
    bool measured = false;
    assert_int_equal(calib_load_or_measure(&f->src, absent, c, &measured), TM_OK);
    assert_true(measured && c->quick);
    check_idle(f->src.gpu);
}

static void test_measure(void **state) {
    (void)state;
    calib_fixture f;
    gpu_fixture_open(&f);
    tm_cuda_blas *blas = NULL; /* the caller's handle (test_quick: one of its own) */
    assert_int_equal(cuda_blas_create(f.src.gpu, &blas), TM_OK);
    f.src.blas = blas;
    tm_calib c;
    const tm_calib_opts o = {.quick = false, .max_tokens = 16, .log = stdout};
    if (calib_measure(&f.src, &o, &c) != TM_OK) fail_msg("%s", tm_error_message());
    cuda_blas_free(blas);
    check_idle(f.src.gpu);
    check_gpu_profile(&c, 5);
    calib_check_curve(&c.cpu_expert, 5, "CPU lane");
    char path[512];
    calib_test_path(path, sizeof(path), "mock_calib.json");
    calib_check_round_trip(&c, path);
    /* the saved profile's table (--show): every section, a GPU row per point */
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    calib_print(&c, mem);
    fclose(mem);
    const char *want[] = {"GPU: mock GPU", "host->GPU pinned",    "decode share:",
                          "GPU from VRAM", "hand-off round trip", "time: "};
    for (size_t i = 0; i < sizeof(want) / sizeof(*want); i++)
        if (!strstr(text, want[i])) fail_msg("calib_print: no '%s' in\n%s", want[i], text);
    int rows = 0; /* "tokens us GB/s ratio" lines between the GPU's head and the hand-off */
    const char *end = strstr(text, "hand-off");
    for (const char *l = strstr(text, "GPU from VRAM"); l && l < end; l = strchr(l + 1, '\n')) {
        int tok;
        double a, b, r;
        rows += sscanf(l + 1, "%d %lf %lf %lf", &tok, &a, &b, &r) == 4;
    }
    assert_int_equal(rows, 5);
    free(text);
    gpu_fixture_close(&f);
}

static void test_quick(void **state) {
    (void)state;
    calib_fixture f;
    gpu_fixture_open(&f);
    tm_calib c;
    measure_absent(&f, &c);
    check_gpu_profile(&c, 0);
    gpu_fixture_close(&f);
}

static void test_no_register(void **state) {
    (void)state;
    calib_fixture f;
    gpu_fixture_open(&f);
    setenv("MOCK_NOREGISTER", "1", 1);
    tm_calib c;
    const tm_calib_opts o = {.quick = true, .max_tokens = 4};
    assert_int_equal(calib_measure(&f.src, &o, &c), TM_ERR_DEVICE);
    assert_non_null(strstr(tm_error_message(), "PCIe lane"));
    check_idle(f.src.gpu);
    measure_absent(&f, &c);
    assert_string_equal(c.key.gpu, ""); /* the CPU parts only: the GPU's lanes unpriced */
    assert_int_equal(calib_pcie_share_q8(&c), 0);
    assert_true(isinf(calib_gpu_expert_ns(&c, 1)));
    unsetenv("MOCK_NOREGISTER");
    gpu_fixture_close(&f);
}

/* A context whose experts the GPU's lanes read, with no saved profile,
 * measures a quick one at load (kept for the process: asking again does not
 * measure) and sets the PCIe lane's count from its share. */
static void test_tier_measures(void **state) {
    (void)state;
    calib_fixture f;
    gpu_fixture_open(&f);
    const char *env = getenv("TIERMOE_CALIB"), *xdg = getenv("XDG_CACHE_HOME");
    char env_save[512] = "", xdg_save[512] = "", dir[512];
    if (env) snprintf(env_save, sizeof(env_save), "%s", env);
    if (xdg) snprintf(xdg_save, sizeof(xdg_save), "%s", xdg);
    calib_test_path(dir, sizeof(dir), "calib_no_cache"); /* no profile under it */
    unsetenv("TIERMOE_CALIB");
    setenv("XDG_CACHE_HOME", dir, 1);
    calib_kept_clear();
    const tm_context_params p = {.n_ctx = 64,
                                 .n_batch = 16,
                                 .n_threads = 2,
                                 .kv_type = TM_TYPE_F32,
                                 .n_gpu_layers = 1 << 20,
                                 .cpu_moe = true};
    tm_context *c = NULL;
    if (model_context_create(f.m, &p, &c) != TM_OK) fail_msg("%s", tm_error_message());
    tm_calib kept;
    bool measured = true;
    assert_int_equal(calib_load_or_measure(&f.src, NULL, &kept, &measured), TM_OK);
    assert_false(measured); /* the context's measurement, kept */
    assert_true(kept.quick);
    const int32_t k = (int32_t)f.m->cfg.n_expert_used, share = calib_pcie_share_q8(&kept);
    assert_int_equal(tier_pcie_slots(c->tier), share ? tm_cuda_mapped_count(k, k, share) : 0);
    model_context_free(c);
    if (*env_save) setenv("TIERMOE_CALIB", env_save, 1);
    if (*xdg_save)
        setenv("XDG_CACHE_HOME", xdg_save, 1);
    else
        unsetenv("XDG_CACHE_HOME");
    calib_kept_clear();
    gpu_fixture_close(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_measure),
        cmocka_unit_test(test_quick),
        cmocka_unit_test(test_no_register),
        cmocka_unit_test(test_tier_measures),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
