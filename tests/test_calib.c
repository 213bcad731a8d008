/* Calibration profiles (src/tier/calib.h), without a GPU:
 *   - the costs: curves exact at the measured points, linear between, the
 *     hand-computed extrapolation, non-decreasing; the copy model exact at its
 *     two sizes; INFINITY / 0 for what a CPU-only profile lacks;
 *   - the decode PCIe share against hand computations (39 and 78 GB/s: 85/256,
 *     3 of 8 slots, the constant the tier had);
 *   - JSON: a round trip keeps every field exactly; each kind of bad field is
 *     refused with the file and the field named; a profile for another key
 *     (CPU, GPU, threads, expert shape) is refused naming key.*;
 *   - the default path under $XDG_CACHE_HOME or ~/.cache;
 *   - the experts of the tiny model found by their tensor names;
 *   - the CPU measurement on the tiny model: the points asked, positive and
 *     non-decreasing, the shape and bytes as computed from q4_K's block;
 *   - calib_load_or_measure: a profile that matches is loaded, an absent or
 *     mismatched one measured (quick), $TIERMOE_CALIB honoured.
 * The GPU parts run on the host mock in test_mock_calib.c. */
#include <jansson.h>
#include <math.h>

#include "calib_test_util.h"
#include "tier/calib_internal.h"

/* ---- a hand-made profile ---- */

static tm_calib sample(bool gpu) {
    tm_calib c;
    memset(&c, 0, sizeof(c));
    snprintf(c.key.cpu, sizeof(c.key.cpu), "Test CPU 9000 (R)");
    if (gpu) snprintf(c.key.gpu, sizeof(c.key.gpu), "Test GPU X");
    c.key.threads = 16;
    c.key.expert.n_embd = 2048, c.key.expert.n_ff = 768;
    c.key.expert.gate_type = TM_TYPE_Q4_K, c.key.expert.up_type = TM_TYPE_Q4_K;
    c.key.expert.down_type = TM_TYPE_Q6_K;
    c.key.expert.bytes = 2 * 768 * (2048 / 256 * 144) + 2048 * (768 / 256 * 210);
    snprintf(c.created, sizeof(c.created), "2026-11-30T12:00:00Z");
    snprintf(c.cpu_level, sizeof(c.cpu_level), "avx512");
    c.cpu_read_gbs = 117.3, c.experts_per_call = 8;
    c.cpu_expert.n = TM_CALIB_N_TOKENS;
    for (int i = 0; i < TM_CALIB_N_TOKENS; i++)
        c.cpu_expert.tokens[i] = tm_calib_tokens[i],
        c.cpu_expert.ns[i] = 30000.1 + 1000.0 / 3 * tm_calib_tokens[i];
    for (int i = 0; i < TM_CALIB_PHASE_COUNT; i++) c.measure_s[i] = 0.05 + 0.1 * i;
    if (!gpu) return c;
    c.copy = (tm_calib_copy){2654208, 256ull << 20, 50.4, 55.1, 6.1, 8.7, 55.1};
    c.pcie_read_gbs = 46.5, c.pcie_read_concurrent_gbs = 39.0;
    c.cpu_lane_gbs = 80.1, c.cpu_lane_concurrent_gbs = 78.0;
    c.handoff_round_trip_ns = 12345.6;
    c.gpu_expert.n = 8;
    for (int i = 0; i < 8; i++)
        c.gpu_expert.tokens[i] = tm_calib_tokens[i],
        c.gpu_expert.ns[i] = 8000.0 + 51.7 * tm_calib_tokens[i];
    return c;
}

static tm_calib_curve curve(int n, const int32_t *tok, const double *ns) {
    tm_calib_curve c;
    memset(&c, 0, sizeof(c));
    c.n = n;
    for (int i = 0; i < n; i++) c.tokens[i] = tok[i], c.ns[i] = ns[i];
    return c;
}

/* ---- costs ---- */

static void test_curve(void **state) {
    (void)state;
    const tm_calib_curve c = curve(4, (int32_t[]){1, 2, 4, 8}, (double[]){100, 150, 200, 400});
    for (int i = 0; i < 4; i++) assert_true(calib_curve_ns(&c, c.tokens[i]) == c.ns[i]);
    assert_true(calib_curve_ns(&c, 3) == 175);
    assert_true(calib_curve_ns(&c, 6) == 300);
    assert_true(calib_curve_ns(&c, 0) == 0 && calib_curve_ns(&c, -5) == 0);
    assert_true(calib_curve_ns(&c, 16) == 400 + 50.0 * 8); /* the last slope, (400-200)/4 */
    double prev = 0;
    for (int64_t n = 0; n <= 2000; n++) {
        const double v = calib_curve_ns(&c, n);
        if (v < prev)
            fail_msg("curve decreases at %lld tokens: %g after %g", (long long)n, v, prev);
        prev = v;
    }
    /* a first point above 1 token: its value below it */
    const tm_calib_curve late = curve(2, (int32_t[]){4, 8}, (double[]){100, 120});
    assert_true(calib_curve_ns(&late, 1) == 100 && calib_curve_ns(&late, 16) == 120 + 5.0 * 8);
    /* one point, or a flat end: proportional above it, never flat forever */
    const tm_calib_curve one = curve(1, (int32_t[]){4}, (double[]){100});
    assert_true(calib_curve_ns(&one, 8) == 200 && calib_curve_ns(&one, 2) == 100);
    const tm_calib_curve flat = curve(2, (int32_t[]){1, 2}, (double[]){100, 100});
    assert_true(calib_curve_ns(&flat, 4) == 200);
    const tm_calib_curve none = curve(0, NULL, NULL);
    assert_true(isinf(calib_curve_ns(&none, 1)) && calib_curve_ns(&none, 0) == 0);
    /* the profile's two curves; a CPU-only profile prices the GPU at infinity */
    const tm_calib g = sample(true), cpu = sample(false);
    assert_true(calib_cpu_expert_ns(&g, 8) == g.cpu_expert.ns[3]);
    assert_true(calib_gpu_expert_ns(&g, 8) == g.gpu_expert.ns[3]);
    const double far = g.gpu_expert.ns[7] + 51.7 * (1024 - 128); /* the last slope, 51.7 */
    assert_true(fabs(calib_gpu_expert_ns(&g, 1024) - far) < 1e-9 * far);
    assert_true(isinf(calib_gpu_expert_ns(&cpu, 1)) && calib_gpu_expert_ns(&cpu, 0) == 0);
}

/* The fit of a noisy curve against hand-computed pools; never moves a monotone one. */
static void test_curve_fit(void **state) {
    (void)state;
    const int32_t tok[5] = {1, 2, 4, 8, 16};
    struct {
        int n;
        double in[5], want[5];
    } cases[] = {
        {4, {1375, 588, 948, 2385}, {2911.0 / 3, 2911.0 / 3, 2911.0 / 3, 2385}},
        {4, {1, 3, 2, 4}, {1, 2.5, 2.5, 4}},
        {5, {5, 4, 3, 2, 1}, {3, 3, 3, 3, 3}},
        {5, {1, 2, 2, 7, 9}, {1, 2, 2, 7, 9}},
        {5, {4, 1, 9, 8, 7}, {2.5, 2.5, 8, 8, 8}},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(*cases); c++) {
        tm_calib_curve cv = curve(cases[c].n, tok, cases[c].in);
        calib_curve_fit(&cv);
        for (int i = 0; i < cases[c].n; i++)
            if (fabs(cv.ns[i] - cases[c].want[i]) > 1e-12 * cases[c].want[i])
                fail_msg("case %zu point %d: %.17g, want %.17g", c, i, cv.ns[i], cases[c].want[i]);
    }
}

static void test_copy(void **state) {
    (void)state;
    tm_calib c = sample(true);
    c.copy = (tm_calib_copy){1 << 20, 64 << 20, 10.0, 50.0, 2.0, 8.0, 50.0};
    const double e = 1 << 20, B = 64 << 20, te = e / 10.0, tb = B / 50.0;
    assert_true(calib_copy_ns(&c, 0, true) == 0);
    assert_true(fabs(calib_copy_ns(&c, 1 << 20, true) - te) < 1e-9 * te);
    assert_true(fabs(calib_copy_ns(&c, 64 << 20, true) - tb) < 1e-9 * tb);
    assert_true(fabs(calib_copy_ns(&c, 128 << 20, true) - (tb + B / 50.0)) < 1e-9 * tb);
    /* below the expert: from the intercept of the line through both points */
    const double slope = (tb - te) / (B - e), lat = te - e * slope;
    assert_true(lat > 0);
    assert_true(fabs(calib_copy_ns(&c, 1 << 19, true) - (lat + (te - lat) / 2)) < 1e-9 * te);
    assert_true(fabs(calib_copy_ns(&c, 1 << 20, false) - e / 2.0) < 1e-9 * e);
    double prev = 0;
    for (uint64_t b = 1; b < (256ull << 20); b = b * 3 / 2 + 1) {
        const double v = calib_copy_ns(&c, b, true);
        if (v < prev) fail_msg("copy time decreases at %llu bytes", (unsigned long long)b);
        prev = v;
    }
    /* an intercept below 0 (the small copy relatively fast) is held at 0 */
    c.copy.h2d_pinned_expert_gbs = 60;
    assert_true(calib_copy_ns(&c, 1, true) > 0 && calib_copy_ns(&c, 1, true) < e / 60.0);
    const tm_calib cpu = sample(false);
    assert_true(isinf(calib_copy_ns(&cpu, 100, true)) && calib_copy_ns(&cpu, 0, true) == 0);
    assert_true(calib_pcie_read_gbs(&c, false) == 46.5 && calib_pcie_read_gbs(&c, true) == 39.0);
    assert_true(calib_pcie_read_gbs(&cpu, true) == 0);
}

static void test_share(void **state) {
    (void)state;
    tm_calib c = sample(true); /* PCIe 39 GB/s beside the CPU lane's 78: a third */
    assert_int_equal(calib_pcie_share_q8(&c), 85); /* 256 * 39 / 117 = 85.33 */
    /* the mapped lane's count ends the slower lane soonest: against every count, in
       doubles (the GPU lane's time n / pcie, the CPU's (cold - n) / cpu) */
    for (int32_t share = 1; share < 256; share++)
        for (int32_t cold = 0; cold <= 32; cold++) {
            const int32_t n = tm_cuda_mapped_count(cold, 32, share);
            const double pcie = share, cpu = 256 - share;
            double best = INFINITY;
            for (int32_t m = 0; m <= cold; m++) best = fmin(best, fmax(m / pcie, (cold - m) / cpu));
            assert_true(n >= 0 && n <= cold);
            assert_true(fmax(n / pcie, (cold - n) / cpu) <= best * (1 + 1e-12));
            assert_true(tm_cuda_mapped_count(cold, 2, share) == (n < 2 ? n : 2)); /* capped */
        }
    assert_int_equal(tm_cuda_mapped_count(8, 8, 85), 2); /* of 8 cold slots: 2.66, not 3 */
    assert_int_equal(tm_cuda_mapped_count(3, 8, 85), 1);
    assert_int_equal(tm_cuda_mapped_count(2, 8, 85), 0); /* 1 would end later than none */
    assert_int_equal(tm_cuda_mapped_count(5, 8, 0), 8);  /* no share: n_mapped */
    c.pcie_read_concurrent_gbs = 46.5, c.cpu_lane_concurrent_gbs = 65.0; /* 106.76 */
    assert_int_equal(calib_pcie_share_q8(&c), 107);
    c.pcie_read_concurrent_gbs = c.cpu_lane_concurrent_gbs = 20;
    assert_int_equal(calib_pcie_share_q8(&c), 128);
    c.pcie_read_concurrent_gbs = 0;
    assert_int_equal(calib_pcie_share_q8(&c), 0);
    const tm_calib cpu = sample(false);
    assert_int_equal(calib_pcie_share_q8(&cpu), 0);
    /* prompts copying ahead: an expert's copy 2654208 B / 50.4 GB/s = 52663 ns, the CPU
       lane's expert at 32 tokens 30000.1 + 32000 / 3 = 40666.8 ns: 256 * 0.75 * 52663 /
       93329.8 = 108.34; at 3.2 tokens (rounded up to 4) 31333.4 ns: 120.37 */
    c = sample(true);
    assert_int_equal(calib_fetch_cpu_share_q8(&c, 2654208, 32), 108);
    assert_int_equal(calib_fetch_cpu_share_q8(&c, 2654208, 3.2), 120);
    assert_int_equal(calib_fetch_cpu_share_q8(&cpu, 2654208, 32), 0); /* no GPU: no share */
}

/* ---- JSON ---- */

static void test_round_trip(void **state) {
    (void)state;
    char path[512];
    calib_test_path(path, sizeof(path), "calib_rt/a/b/profile.json"); /* directories made */
    const tm_calib g = sample(true), cpu = sample(false);
    calib_check_round_trip(&g, path);
    calib_check_round_trip(&cpu, path);
    tm_calib back;
    assert_int_equal(calib_read_json(path, NULL, &back), TM_OK); /* no key to match */
}

/* The JSON value at "a.b[2].c" under root (NULL if absent); *parent and
 * *last name where it hangs. */
static json_t *json_at(json_t *root, const char *path, json_t **parent, char *last, size_t n) {
    char buf[128];
    snprintf(buf, sizeof(buf), "%s", path);
    json_t *v = root;
    *parent = NULL;
    for (char *tok = strtok(buf, "."); tok; tok = strtok(NULL, ".")) {
        char *br = strchr(tok, '[');
        if (br) *br = '\0';
        *parent = v, snprintf(last, n, "%s", tok);
        v = json_object_get(v, tok);
        if (br)
            *parent = v, snprintf(last, n, "[%d", atoi(br + 1)),
            v = json_array_get(v, atoi(br + 1));
    }
    return v;
}

typedef struct bad_case {
    const char *field; /* dotted path */
    const char *value; /* JSON text, NULL: delete the field */
    const char *named; /* what the message must name */
} bad_case;

static void test_bad_fields(void **state) {
    (void)state;
    char path[512], bad[512];
    calib_test_path(path, sizeof(path), "calib_good.json");
    calib_test_path(bad, sizeof(bad), "calib_bad.json");
    const tm_calib g = sample(true);
    assert_int_equal(calib_write_json(&g, path), TM_OK);
    const bad_case cases[] = {
        {"format", NULL, "'format'"},
        {"format", "\"other\"", "'format'"},
        {"version", "2", "'version'"},
        {"quick", "1", "'quick'"},
        {"created", "5", "'created'"},
        {"key.threads", "\"16\"", "'key.threads'"},
        {"key.threads", "0", "'key.threads'"},
        {"key.cpu", NULL, "'key.cpu'"},
        {"key.expert.n_embd", "0", "'key.expert.n_embd'"},
        {"key.expert.gate_type", "\"q9_Z\"", "'key.expert.gate_type'"},
        {"key.expert.bytes", "-1", "'key.expert.bytes'"},
        {"host.cpu_read_gbs", "1e300", "'host.cpu_read_gbs'"},
        {"experts_per_call", "0", "'experts_per_call'"},
        {"cpu_expert_ns", "[]", "'cpu_expert_ns'"},
        {"cpu_expert_ns", "{}", "'cpu_expert_ns'"},
        {"cpu_expert_ns[2].tokens", "2", "'cpu_expert_ns[2].tokens'"},
        {"cpu_expert_ns[3].ns", "1.5", "'cpu_expert_ns[3].ns'"},
        {"cpu_expert_ns[0].ns", "-1", "'cpu_expert_ns[0].ns'"},
        {"cpu_expert_ns[1]", "7", "'cpu_expert_ns[1]'"},
        {"measure_s.cpu", "\"x\"", "'measure_s.cpu'"},
        {"gpu", NULL, "'gpu'"},
        {"gpu.copy.big_bytes", "2654208", "'gpu.copy.big_bytes'"},
        {"gpu.copy.h2d_pinned_expert_gbs", "0", "'gpu.copy.h2d_pinned_expert_gbs'"},
        {"gpu.pcie_read_concurrent_gbs", NULL, "'gpu.pcie_read_concurrent_gbs'"},
        {"gpu.handoff_round_trip_ns", "null", "'gpu.handoff_round_trip_ns'"},
        {"gpu.gpu_expert_ns[4].ns", "1", "'gpu.gpu_expert_ns[4].ns'"},
        {"key.gpu", "\"\"", "'gpu' is there"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
        const bad_case *b = &cases[i];
        json_error_t je;
        json_t *root = json_load_file(path, 0, &je), *parent;
        assert_non_null(root);
        char last[64];
        json_at(root, b->field, &parent, last, sizeof(last));
        assert_non_null(parent);
        json_t *v = b->value ? json_loads(b->value, JSON_DECODE_ANY, &je) : NULL;
        if (last[0] == '[')
            json_array_set_new(parent, (size_t)atoi(last + 1), v);
        else if (v)
            json_object_set_new(parent, last, v);
        else
            json_object_del(parent, last);
        assert_int_equal(json_dump_file(root, bad, 0), 0);
        json_decref(root);
        tm_calib c;
        const tm_status st = calib_read_json(bad, NULL, &c);
        const char *msg = tm_error_message();
        if (st != TM_ERR_FORMAT || !strstr(msg, bad) || !strstr(msg, b->named))
            fail_msg("%s = %s: status %d, message '%s' (want the file and %s)", b->field,
                     b->value ? b->value : "(deleted)", st, msg, b->named);
    }
    /* not JSON, not an object, no file */
    FILE *f = fopen(bad, "w");
    fputs("{\"format\": ", f);
    fclose(f);
    tm_calib c;
    assert_int_equal(calib_read_json(bad, NULL, &c), TM_ERR_FORMAT);
    assert_non_null(strstr(tm_error_message(), "not valid JSON"));
    f = fopen(bad, "w");
    fputs("[1, 2]", f);
    fclose(f);
    assert_int_equal(calib_read_json(bad, NULL, &c), TM_ERR_FORMAT);
    assert_non_null(strstr(tm_error_message(), "not a JSON object"));
    remove(bad);
    assert_int_equal(calib_read_json(bad, NULL, &c), TM_ERR_IO);
    assert_non_null(strstr(tm_error_message(), bad));
}

static void test_key_mismatch(void **state) {
    (void)state;
    char path[512];
    calib_test_path(path, sizeof(path), "calib_key.json");
    const tm_calib g = sample(true);
    assert_int_equal(calib_write_json(&g, path), TM_OK);
    tm_calib c;
    tm_calib_key k = g.key;
    assert_int_equal(calib_read_json(path, &k, &c), TM_OK);
    const char *named[] = {"key.cpu", "key.gpu", "key.threads", "key.expert", "key.expert"};
    for (int i = 0; i < 5; i++) {
        k = g.key;
        if (i == 0) snprintf(k.cpu, sizeof(k.cpu), "Other CPU");
        if (i == 1) k.gpu[0] = '\0';
        if (i == 2) k.threads = 8;
        if (i == 3) k.expert.n_ff = 1536, k.expert.bytes *= 2;
        if (i == 4) k.expert.down_type = TM_TYPE_Q4_K;
        const tm_status st = calib_read_json(path, &k, &c);
        if (st != TM_ERR_ARG || !strstr(tm_error_message(), named[i]) ||
            !strstr(tm_error_message(), path))
            fail_msg("change %d: status %d, '%s' (want %s)", i, st, tm_error_message(), named[i]);
    }
}

/* ---- paths ---- */

static void test_default_path(void **state) {
    (void)state;
    const char *xdg0 = getenv("XDG_CACHE_HOME"), *home0 = getenv("HOME");
    char xdg_save[1024] = "", home_save[1024] = "";
    if (xdg0) snprintf(xdg_save, sizeof(xdg_save), "%s", xdg0);
    if (home0) snprintf(home_save, sizeof(home_save), "%s", home0);
    const tm_calib g = sample(true), cpu = sample(false);
    char p[4096];
    setenv("XDG_CACHE_HOME", "/var/cache/x", 1);
    setenv("HOME", "/home/u", 1);
    assert_int_equal(calib_default_path(&g.key, p, sizeof(p)), TM_OK);
    assert_string_equal(p, "/var/cache/x/tiermoe/"
                           "calib-test-cpu-9000-r--test-gpu-x--t16--2048x768-q4-k-q4-k-q6-k.json");
    assert_int_equal(calib_default_path(&cpu.key, p, sizeof(p)), TM_OK);
    assert_string_equal(
        p, "/var/cache/x/tiermoe/calib-test-cpu-9000-r--no-gpu--t16--2048x768-q4-k-q4-k-q6-k.json");
    setenv("XDG_CACHE_HOME", "relative/dir", 1); /* ignored, as the XDG spec says */
    assert_int_equal(calib_default_path(&g.key, p, sizeof(p)), TM_OK);
    assert_non_null(strstr(p, "/home/u/.cache/tiermoe/calib-test-cpu"));
    unsetenv("XDG_CACHE_HOME");
    unsetenv("HOME");
    assert_int_equal(calib_default_path(&g.key, p, sizeof(p)), TM_ERR_ARG);
    assert_non_null(strstr(tm_error_message(), "HOME"));
    if (xdg0) setenv("XDG_CACHE_HOME", xdg_save, 1);
    if (home0) setenv("HOME", home_save, 1);
}

/* ---- the tiny model ---- */

static void test_experts_from_gguf(void **state) {
    (void)state;
    calib_fixture f;
    calib_fixture_open(&f, "calib_tiny.gguf", 1, NULL);
    assert_int_equal(f.n_layer, 3);
    assert_int_equal(f.n_expert, 16);
    const size_t row = 256 / 256 * 144; /* a q4_K row of 256 values: one block */
    for (uint32_t l = 0; l < f.n_layer; l++) {
        const tm_moe_experts *x = &f.layers[l];
        const char *proj[3] = {"gate", "up", "down"};
        const tm_moe_matrix *m[3] = {&x->gate, &x->up, &x->down};
        assert_int_equal(x->n_embd, 256);
        assert_int_equal(x->n_ff, 256);
        for (int p = 0; p < 3; p++) {
            char name[64];
            snprintf(name, sizeof(name), "blk.%u.ffn_%s_exps.weight", l, proj[p]);
            const tm_gguf_tensor *t = gguf_file_find_tensor(f.m->file, name);
            assert_ptr_equal(m[p]->data, t->data);
            assert_int_equal(m[p]->type, TM_TYPE_Q4_K);
            assert_int_equal(m[p]->row_bytes, row);
            assert_int_equal(m[p]->expert_stride, 256 * row);
        }
    }
    calib_fixture_close(&f);
}

static void test_cpu_measure(void **state) {
    (void)state;
    calib_fixture f;
    calib_fixture_open(&f, "calib_tiny.gguf", 2, NULL);
    tm_calib c;
    const tm_calib_opts o = {.quick = false, .max_tokens = 16, .log = stdout};
    if (calib_measure(&f.src, &o, &c) != TM_OK) fail_msg("%s", tm_error_message());
    calib_check_curve(&c.cpu_expert, 5, "CPU lane");
    assert_int_equal(c.experts_per_call, 4);
    assert_int_equal(c.key.threads, 2);
    assert_string_equal(c.key.gpu, "");
    assert_int_equal(c.key.expert.n_embd, 256);
    assert_int_equal(c.key.expert.bytes, 3 * 256 * 144);
    assert_int_equal(c.key.expert.down_type, TM_TYPE_Q4_K);
    assert_true(c.cpu_read_gbs > 0 && c.measure_s[TM_CALIB_PHASE_CPU] > 0);
    assert_int_equal(c.gpu_expert.n, 0);
    assert_int_equal(calib_pcie_share_q8(&c), 0);
    assert_false(c.quick);
    char path[512];
    calib_test_path(path, sizeof(path), "calib_cpu.json");
    calib_check_round_trip(&c, path);
    calib_fixture_close(&f);
}

static void test_load_or_measure(void **state) {
    (void)state;
    calib_fixture f;
    calib_fixture_open(&f, "calib_tiny.gguf", 2, NULL);
    char absent[512], path[512];
    calib_test_path(absent, sizeof(absent), "calib_absent.json");
    calib_test_path(path, sizeof(path), "calib_loaded.json");
    remove(absent);
    calib_kept_clear();
    tm_calib c, q;
    bool measured = false;
    assert_int_equal(calib_load_or_measure(&f.src, absent, &q, &measured), TM_OK);
    assert_true(measured && q.quick && q.cpu_expert.n >= 2);
    calib_check_curve(&q.cpu_expert, q.cpu_expert.n, "quick CPU lane");
    tm_calib again; /* the process keeps it: the same profile, not measured again */
    assert_int_equal(calib_load_or_measure(&f.src, absent, &again, &measured), TM_OK);
    assert_false(measured);
    calib_check_equal(&q, &again);
    /* a profile of this machine and shape is loaded as it is */
    c = q;
    c.quick = false, c.cpu_expert.ns[0] = 4242.25;
    assert_int_equal(calib_write_json(&c, path), TM_OK);
    tm_calib l;
    assert_int_equal(calib_load_or_measure(&f.src, path, &l, &measured), TM_OK);
    assert_false(measured);
    calib_check_equal(&c, &l);
    setenv("TIERMOE_CALIB", path, 1);
    assert_int_equal(calib_load_or_measure(&f.src, NULL, &l, &measured), TM_OK);
    assert_false(measured);
    assert_true(l.cpu_expert.ns[0] == 4242.25);
    unsetenv("TIERMOE_CALIB");
    calib_fixture_close(&f);
    /* other threads: measured again */
    calib_fixture_open(&f, "calib_tiny.gguf", 1, NULL);
    assert_int_equal(calib_load_or_measure(&f.src, path, &l, &measured), TM_OK);
    assert_true(measured && l.key.threads == 1);
    calib_fixture_close(&f);
}

static void test_bad_source(void **state) {
    (void)state;
    calib_fixture f;
    calib_fixture_open(&f, "calib_tiny.gguf", 1, NULL);
    tm_calib c;
    tm_calib_source s = f.src;
    s.n_used = s.n_expert + 1;
    assert_int_equal(calib_measure(&s, &(tm_calib_opts){.quick = true}, &c), TM_ERR_ARG);
    assert_non_null(strstr(tm_error_message(), "17 of them a token"));
    s = f.src;
    tm_moe_experts bad[2] = {f.layers[0], f.layers[1]};
    bad[1].n_ff = 0;
    s.layers = bad, s.n_layer = 2;
    assert_int_equal(calib_measure(&s, &(tm_calib_opts){.quick = true}, &c), TM_ERR_ARG);
    assert_non_null(strstr(tm_error_message(), "layer 1"));
    /* mixed expert types (llama.cpp's Q4_K_M): keyed on the most common, first on a tie */
    tm_moe_experts mix[3] = {f.layers[0], f.layers[1], f.layers[2]};
    mix[1].down.type = mix[2].down.type = TM_TYPE_Q6_K;
    mix[1].down.row_bytes = mix[2].down.row_bytes = 210; /* a q6_K row of 256 */
    s.layers = mix, s.n_layer = 3;
    tm_calib_key k;
    assert_int_equal(calib_key_make(&s, &k), TM_OK);
    assert_int_equal(k.expert.down_type, TM_TYPE_Q6_K);
    assert_int_equal(k.expert.bytes, 2 * 256 * 144 + 256 * 210);
    s.n_layer = 2;
    assert_int_equal(calib_key_make(&s, &k), TM_OK);
    assert_int_equal(k.expert.down_type, TM_TYPE_Q4_K);
    /* measured on the layers of the key's kind only: the first one here */
    const tm_calib_opts o = {.quick = true, .max_tokens = 2};
    assert_int_equal(calib_measure(&s, &o, &c), TM_OK);
    assert_int_equal(c.key.expert.bytes, 3 * 256 * 144);
    calib_fixture_close(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_curve),
        cmocka_unit_test(test_curve_fit),
        cmocka_unit_test(test_copy),
        cmocka_unit_test(test_share),
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_bad_fields),
        cmocka_unit_test(test_key_mismatch),
        cmocka_unit_test(test_default_path),
        cmocka_unit_test(test_experts_from_gguf),
        cmocka_unit_test(test_cpu_measure),
        cmocka_unit_test(test_load_or_measure),
        cmocka_unit_test(test_bad_source),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
