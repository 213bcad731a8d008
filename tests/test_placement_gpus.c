/* Several GPUs: the GPU list's flags (src/tier/gpus.h) and the placement over
 * two GPUs (src/tier/placement.h), against expectations written out by hand.
 *
 * - Flags: -dev CUDA0,CUDA1 / none, --split-mode, --tensor-split, -mg,
 *   --moe-cache A,B; bad input (-dev CUDA7 on two GPUs, a negative or
 *   malformed proportion, the wrong count, -mg out of the list) fails with a
 *   message naming the flag and the GPU.
 * - Spans: llama.cpp's rule (layer l on the last GPU whose cumulative share
 *   starts at or before l / n), worked out here for even, uneven, zero and
 *   three-way splits.
 * - Placement on a 6-layer model over two GPUs: -ngl all in spans with the
 *   output head on the last span's GPU, --cpu-moe, -ot ...=CUDA1 moving one
 *   layer's experts to the other GPU, an -ot that splits a layer's experts
 *   between the GPUs (all to the CPU, a warning naming both), -ot naming a GPU
 *   not in the list, -dev CUDA1,CUDA0 (CUDAn names the device, not the
 *   position), -ngl auto filling both GPUs' budgets (sizes summed here). */
#include "gguf_test_util.h"

#include "core/log.h"
#include "tier/gpus.h"
#include "tier/placement.h"

#define N_LAYER 6

/* ---- the flags ---- */

static void want_error(tm_status st, tm_status want, const char *n1, const char *n2) {
    const char *msg = tm_error_message();
    if (st != want || (n1 && !strstr(msg, n1)) || (n2 && !strstr(msg, n2)))
        fail_msg("got %s \"%s\"; expected %s with '%s' '%s'", tm_status_name(st), msg,
                 tm_status_name(want), n1 ? n1 : "", n2 ? n2 : "");
}

static void test_flags(void **state) {
    (void)state;
    tm_gpu_opts o = {0};
    int n, used[TM_MAX_GPUS];
    assert_int_equal(gpus_devices_parse("-dev", "CUDA0,CUDA1", &o), TM_OK);
    assert_int_equal(o.n_dev, 2);
    assert_int_equal(gpus_resolve(&o, 2, &n, used), TM_OK);
    assert_int_equal(n, 2);
    assert_int_equal(used[0], 0);
    assert_int_equal(used[1], 1);
    /* -dev CUDA7 on a host of two: the flag and the GPU named */
    assert_int_equal(gpus_devices_parse("-dev", "CUDA7", &o), TM_OK);
    want_error(gpus_resolve(&o, 2, &n, used), TM_ERR_DEVICE, "-dev: CUDA7: no such GPU",
               "2 present: CUDA0 .. CUDA1");
    want_error(gpus_resolve(&o, 0, &n, used), TM_ERR_DEVICE, "-dev: CUDA7: no GPU present", NULL);
    want_error(gpus_devices_parse("-dev", "GPU1", &o), TM_ERR_ARG, "-dev 'GPU1'",
               "unknown device 'GPU1'");
    want_error(gpus_devices_parse("-dev", "CUDA0,CUDA0", &o), TM_ERR_ARG, "CUDA0 given twice",
               NULL);
    want_error(gpus_devices_parse("-dev", "CUDA0,", &o), TM_ERR_ARG, "empty item", NULL);
    want_error(gpus_devices_parse("-dev", "CUDA", &o), TM_ERR_ARG, "unknown device", NULL);
    want_error(
        gpus_devices_parse("-dev", "CUDA0,CUDA1,CUDA2,CUDA3,CUDA4,CUDA5,CUDA6,CUDA7,CUDA8", &o),
        TM_ERR_ARG, "more than 8 GPUs", NULL);
    assert_int_equal(gpus_devices_parse("-dev", "none", &o), TM_OK);
    assert_true(o.dev_given);
    assert_int_equal(o.n_dev, 0);
    assert_int_equal(gpus_resolve(&o, 2, &n, used), TM_OK);
    assert_int_equal(n, 0);
    /* no -dev: every GPU present */
    memset(&o, 0, sizeof(o));
    assert_int_equal(gpus_resolve(&o, 3, &n, used), TM_OK);
    assert_int_equal(n, 3);

    /* --tensor-split */
    assert_int_equal(gpus_split_parse("--tensor-split", "3,1", &o), TM_OK);
    assert_int_equal(o.n_split, 2);
    assert_true(o.split[0] == 3.0f && o.split[1] == 1.0f);
    want_error(gpus_resolve(&o, 3, &n, used), TM_ERR_ARG,
               "--tensor-split: 2 proportions for 3 GPUs", NULL);
    assert_int_equal(gpus_split_parse("--tensor-split", "0.5/0.5", &o), TM_OK);
    want_error(gpus_split_parse("--tensor-split", "1,-1", &o), TM_ERR_ARG, "--tensor-split '1,-1'",
               "item 1 '-1' is not a proportion");
    want_error(gpus_split_parse("-ts", "1,x", &o), TM_ERR_ARG, "-ts '1,x'", NULL);
    want_error(gpus_split_parse("-ts", "1,nan", &o), TM_ERR_ARG, "item 1 'nan'", NULL);
    want_error(gpus_split_parse("-ts", "0,0", &o), TM_ERR_ARG, "every proportion is 0", NULL);

    /* --split-mode, -mg */
    memset(&o, 0, sizeof(o));
    assert_int_equal(gpus_split_mode_parse("--split-mode", "none", &o), TM_OK);
    assert_int_equal(gpus_main_parse("-mg", "1", &o), TM_OK);
    assert_int_equal(gpus_resolve(&o, 2, &n, used), TM_OK);
    assert_int_equal(n, 1);
    assert_int_equal(used[0], 1);
    assert_int_equal(gpus_main_parse("-mg", "2", &o), TM_OK);
    want_error(gpus_resolve(&o, 2, &n, used), TM_ERR_DEVICE, "-mg 2", "has 2 (0 .. 1)");
    want_error(gpus_main_parse("-mg", "-1", &o), TM_ERR_ARG, "-mg '-1'", NULL);
    want_error(gpus_split_mode_parse("-sm", "row", &o), TM_ERR_ARG, "-sm row: not supported", NULL);
    want_error(gpus_split_mode_parse("-sm", "layers", &o), TM_ERR_ARG, "expected layer or none",
               NULL);

    /* --moe-cache A,B */
    memset(&o, 0, sizeof(o));
    assert_int_equal(gpus_cache_parse("--moe-cache", "1024,2048", &o), TM_OK);
    assert_int_equal(o.n_cache, 2);
    assert_true(o.cache_mib[1] == 2048);
    assert_int_equal(gpus_resolve(&o, 2, &n, used), TM_OK);
    want_error(gpus_resolve(&o, 3, &n, used), TM_ERR_ARG, "--moe-cache: 2 sizes for 3 GPUs", NULL);
    want_error(gpus_cache_parse("--moe-cache", "1024,-5", &o), TM_ERR_ARG, "item 1 '-5'", NULL);
}

static void spans(int n_gpu, const float *prop, uint32_t n, const uint32_t *want) {
    uint32_t first[TM_MAX_GPUS + 1];
    gpus_spans_make(n_gpu, prop, n, first);
    for (int g = 0; g <= n_gpu; g++)
        if (first[g] != want[g])
            fail_msg("%d GPUs, %u layers: first[%d] = %u, want %u", n_gpu, n, g, first[g], want[g]);
}

static void test_spans(void **state) {
    (void)state;
    spans(2, (const float[]){1, 1}, 8, (const uint32_t[]){0, 4, 8});
    spans(2, (const float[]){3, 1}, 8, (const uint32_t[]){0, 6, 8});
    /* 5 layers, halves: layers at 0, .2, .4 before .5; .6, .8 after */
    spans(2, (const float[]){1, 1}, 5, (const uint32_t[]){0, 3, 5});
    spans(2, (const float[]){0, 1}, 8, (const uint32_t[]){0, 0, 8});
    spans(2, (const float[]){1, 0}, 8, (const uint32_t[]){0, 8, 8});
    /* thirds of 4: 0 and .25 before 1/3, .5 before 2/3, .75 after */
    spans(3, (const float[]){1, 1, 1}, 4, (const uint32_t[]){0, 2, 3, 4});
    spans(3, (const float[]){1, 0, 1}, 4, (const uint32_t[]){0, 2, 2, 4});
    spans(2, (const float[]){1, 1}, 0, (const uint32_t[]){0, 0, 0});
    spans(2, (const float[]){1, 1}, 1, (const uint32_t[]){0, 1, 1});
}

/* ---- placement over two GPUs ---- */

typedef struct tdef {
    const char *name;
    uint32_t n_dims;
    int64_t ne[3];
} tdef;

static const tdef layer_defs[] = {
    {"attn_norm.weight", 1, {64, 1, 1}},    {"attn_q.weight", 2, {64, 128, 1}},
    {"ffn_gate_inp.weight", 2, {64, 8, 1}}, {"ffn_gate_exps.weight", 3, {64, 16, 8}},
    {"ffn_up_exps.weight", 3, {64, 16, 8}}, {"ffn_down_exps.weight", 3, {16, 64, 8}},
};
#define N_DEFS       (sizeof(layer_defs) / sizeof(layer_defs[0]))
#define FIRST_EXPERT 3
static const tdef io_defs[] = {{"token_embd.weight", 2, {64, 96, 1}},
                               {"output_norm.weight", 1, {64, 1, 1}},
                               {"output.weight", 2, {64, 96, 1}}};

static size_t def_bytes(const tdef *d) {
    return (size_t)(d->ne[0] * d->ne[1] * d->ne[2]) * sizeof(float);
}

typedef struct model {
    bb buf;
    tm_gguf_file *f;
} model;

static void model_open(model *m) {
    memset(m, 0, sizeof(*m));
    bb tensors = {0};
    uint64_t off = 0, n = 0;
    char name[64];
    for (unsigned l = 0; l < N_LAYER; l++)
        for (size_t i = 0; i < N_DEFS; i++) {
            snprintf(name, sizeof(name), "blk.%u.%s", l, layer_defs[i].name);
            bb_tensor(&tensors, name, layer_defs[i].n_dims, layer_defs[i].ne, TM_TYPE_F32, off);
            off += (def_bytes(&layer_defs[i]) + 31) / 32 * 32, n++;
        }
    for (size_t i = 0; i < 3; i++) {
        bb_tensor(&tensors, io_defs[i].name, io_defs[i].n_dims, io_defs[i].ne, TM_TYPE_F32, off);
        off += (def_bytes(&io_defs[i]) + 31) / 32 * 32, n++;
    }
    bb_header(&m->buf, 3, n, 0);
    bb_raw(&m->buf, tensors.p, tensors.n);
    bb_pad(&m->buf, 32);
    bb_zeros(&m->buf, (size_t)off);
    free(tensors.p);
    assert_int_equal(gguf_file_open_buffer(m->buf.p, m->buf.n, "two.gguf", &m->f), TM_OK);
}

static void model_close(model *m) {
    gguf_file_close(m->f);
    free(m->buf.p);
}

static int64_t tensor_of(const model *m, const char *name) {
    for (uint64_t t = 0; t < m->f->n_tensors; t++)
        if (m->f->tensors[t].name.len == strlen(name) &&
            !memcmp(m->f->tensors[t].name.data, name, strlen(name)))
            return (int64_t)t;
    fail_msg("no tensor %s", name);
    return -1;
}

/* Where tensor `name` is: -1 the CPU, else its GPU. */
static int where(const model *m, const tm_placement *pl, const char *name) {
    const int64_t t = tensor_of(m, name);
    return pl->tensor_dev[t] == TM_DEV_CPU ? -1 : pl->tensor_gpu[t];
}

static int where_layer(const model *m, const tm_placement *pl, unsigned l, const char *what) {
    char name[64];
    snprintf(name, sizeof(name), "blk.%u.%s", l, what);
    return where(m, pl, name);
}

static const tm_placement_gpu big2[2] = {{true, NULL, (size_t)1 << 40, 0, 0, NULL},
                                         {true, NULL, (size_t)1 << 40, 0, 0, NULL}};
static const int cuda01[2] = {0, 1};

static tm_placement_params two(int ngl, bool cpu_moe, const char *ot, const float *split) {
    return (tm_placement_params){.n_gpu_layers = ngl,
                                 .cpu_moe = cpu_moe,
                                 .overrides = ot,
                                 .n_gpu = 2,
                                 .gpu_cuda = cuda01,
                                 .split = split};
}

static void test_two_spans(void **state) {
    (void)state;
    model m;
    model_open(&m);
    tm_placement pl;
    /* -ngl all, halves: layers 0-2 on GPU 0, 3-5 and the head on GPU 1 */
    tm_placement_params p = two(99, false, NULL, (const float[]){1, 1});
    tm_log_set_level(TM_LOG_ERROR);
    assert_int_equal(placement_make(m.f, N_LAYER, &p, big2, &pl), TM_OK);
    assert_int_equal(pl.n_gpu, 2);
    assert_int_equal(pl.n_gpu_used, 2);
    assert_int_equal(pl.span_first[1], 3);
    size_t layer_b = 0, io_b = def_bytes(&io_defs[1]) + def_bytes(&io_defs[2]);
    for (size_t i = 0; i < N_DEFS; i++) layer_b += def_bytes(&layer_defs[i]);
    for (unsigned l = 0; l < N_LAYER; l++) {
        const int g = l < 3 ? 0 : 1;
        assert_int_equal(pl.layer_dev[l], TM_DEV_GPU);
        assert_int_equal(pl.layer_gpu[l], g);
        assert_int_equal(pl.experts_gpu[l], g);
        assert_int_equal(where_layer(&m, &pl, l, "attn_q.weight"), g);
        assert_int_equal(where_layer(&m, &pl, l, "ffn_up_exps.weight"), g);
    }
    assert_int_equal(where(&m, &pl, "output.weight"), 1);
    assert_int_equal(where(&m, &pl, "output_norm.weight"), 1);
    assert_int_equal(where(&m, &pl, "token_embd.weight"), -1); /* a row lookup on the host */
    assert_int_equal(pl.output_gpu_index, 1);
    assert_int_equal(pl.gpu_bytes_each[0], 3 * layer_b);
    assert_int_equal(pl.gpu_bytes_each[1], 3 * layer_b + io_b);
    assert_int_equal(pl.gpu_bytes, 6 * layer_b + io_b);
    placement_free(&pl);

    /* -ngl 4 of 6, 3:1: layers 0-2 on GPU 0, 3 on GPU 1, 4-5 and the head on the CPU */
    p = two(4, false, NULL, (const float[]){3, 1});
    assert_int_equal(placement_make(m.f, N_LAYER, &p, big2, &pl), TM_OK);
    for (unsigned l = 0; l < N_LAYER; l++)
        assert_int_equal(where_layer(&m, &pl, l, "attn_q.weight"), l < 3 ? 0 : l < 4 ? 1 : -1);
    assert_int_equal(where(&m, &pl, "output.weight"), -1);
    placement_free(&pl);

    /* --cpu-moe: attention in spans, every expert on the CPU */
    p = two(99, true, NULL, (const float[]){1, 1});
    assert_int_equal(placement_make(m.f, N_LAYER, &p, big2, &pl), TM_OK);
    for (unsigned l = 0; l < N_LAYER; l++) {
        assert_int_equal(where_layer(&m, &pl, l, "attn_q.weight"), l < 3 ? 0 : 1);
        assert_int_equal(pl.experts_dev[l], TM_DEV_CPU);
        assert_int_equal(where_layer(&m, &pl, l, "ffn_down_exps.weight"), -1);
    }
    placement_free(&pl);

    /* -ot blk.0's experts=CUDA1: they go to the other GPU, the layer's attention stays */
    p = two(99, false, "blk\\.0\\.ffn_.*_exps=CUDA1", (const float[]){1, 1});
    assert_int_equal(placement_make(m.f, N_LAYER, &p, big2, &pl), TM_OK);
    assert_int_equal(where_layer(&m, &pl, 0, "attn_q.weight"), 0);
    assert_int_equal(where_layer(&m, &pl, 0, "ffn_gate_exps.weight"), 1);
    assert_int_equal(pl.experts_dev[0], TM_DEV_GPU);
    assert_int_equal(pl.experts_gpu[0], 1);
    placement_free(&pl);

    /* -dev CUDA1,CUDA0: CUDA1 names the device, the first of the list */
    const int cuda10[2] = {1, 0};
    p.gpu_cuda = cuda10;
    assert_int_equal(placement_make(m.f, N_LAYER, &p, big2, &pl), TM_OK);
    assert_int_equal(pl.experts_gpu[0], 0);
    assert_int_equal(pl.experts_gpu[1], 0);
    assert_int_equal(pl.experts_gpu[4], 1);
    placement_free(&pl);
    tm_log_set_level(TM_LOG_INFO);
    model_close(&m);
}

static void test_two_errors(void **state) {
    (void)state;
    model m;
    model_open(&m);
    tm_placement pl;
    /* an -ot that puts one of layer 0's expert tensors on the other GPU: all to the CPU */
    tm_placement_params p = two(99, false, "blk\\.0\\.ffn_up_exps=CUDA1", NULL);
    capture_begin();
    tm_status st = placement_make(m.f, N_LAYER, &p, big2, &pl);
    char *log = capture_end();
    assert_int_equal(st, TM_OK);
    assert_non_null(strstr(log, "layer 0: -ot 'blk\\.0\\.ffn_up_exps=CUDA1' splits the layer's "
                                "expert tensors between CUDA0 and CUDA1"));
    free(log);
    assert_int_equal(pl.experts_dev[0], TM_DEV_CPU);
    assert_int_equal(where_layer(&m, &pl, 0, "ffn_gate_exps.weight"), -1);
    assert_int_equal(where_layer(&m, &pl, 0, "ffn_up_exps.weight"), -1);
    assert_int_equal(where_layer(&m, &pl, 1, "ffn_up_exps.weight"), 0);
    placement_free(&pl);
    /* a GPU not in the list */
    p = two(99, false, "exps=CUDA2", NULL);
    want_error(placement_make(m.f, N_LAYER, &p, big2, &pl), TM_ERR_DEVICE, "-ot 'exps=CUDA2'",
               "CUDA2 is not one of the GPUs used (CUDA0,CUDA1");
    assert_null(pl.tensor_gpu);
    /* a negative proportion (the CLI's parser refuses it first) */
    p = two(99, false, NULL, (const float[]){1, -1});
    want_error(placement_make(m.f, N_LAYER, &p, big2, &pl), TM_ERR_ARG, "--tensor-split",
               "proportion 1 is -1");
    p.split = NULL;
    p.n_gpu = TM_MAX_GPUS + 1;
    want_error(placement_make(m.f, N_LAYER, &p, big2, &pl), TM_ERR_ARG, "9 GPUs", NULL);
    model_close(&m);
}

/* -ngl auto: each GPU's budget taken, spans in proportion to the budgets. */
static void test_two_auto(void **state) {
    (void)state;
    model m;
    model_open(&m);
    size_t layer_b = 0, io_b = def_bytes(&io_defs[1]) + def_bytes(&io_defs[2]);
    for (size_t i = 0; i < N_DEFS; i++) layer_b += def_bytes(&layer_defs[i]);
    const size_t kv = 1000, fixed = 5000, per = layer_b + kv;
    tm_placement pl;
    tm_placement_params p = two(TM_NGL_AUTO, false, NULL, NULL);
    tm_log_set_level(TM_LOG_ERROR);
    /* equal budgets of 3 layers each and the head: everything, 3 and 3 */
    tm_placement_gpu g[2] = {{true, NULL, fixed + 3 * per + io_b, fixed, kv, NULL},
                             {true, NULL, fixed + 3 * per + io_b, fixed, kv, NULL}};
    assert_int_equal(placement_make(m.f, N_LAYER, &p, g, &pl), TM_OK);
    assert_int_equal(pl.n_gpu_layers, N_LAYER);
    assert_int_equal(pl.span_first[1], 3);
    assert_true(pl.output_gpu);
    placement_free(&pl);
    /* GPU 0 without room for the head, GPU 1 a byte short of it: 5 layers, 3 and 2 (GPU 0's
       share is a little under half) */
    g[0].budget = fixed + 3 * per;
    g[1].budget = fixed + 3 * per + io_b - 1;
    assert_int_equal(placement_make(m.f, N_LAYER, &p, g, &pl), TM_OK);
    assert_int_equal(pl.n_gpu_layers, 5);
    assert_false(pl.output_gpu);
    assert_int_equal(pl.span_first[1], 3);
    placement_free(&pl);
    /* GPU 1 with room for one layer, GPU 0 for 4: budgets 4:1 give spans 4 and 1 of 5 */
    g[0].budget = fixed + 4 * per;
    g[1].budget = fixed + 1 * per;
    assert_int_equal(placement_make(m.f, N_LAYER, &p, g, &pl), TM_OK);
    assert_int_equal(pl.n_gpu_layers, 5);
    assert_int_equal(pl.span_first[1], 4);
    assert_int_equal(pl.layer_gpu[4], 1);
    placement_free(&pl);
    tm_log_set_level(TM_LOG_INFO);
    model_close(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_flags),     cmocka_unit_test(test_spans),
        cmocka_unit_test(test_two_spans), cmocka_unit_test(test_two_errors),
        cmocka_unit_test(test_two_auto),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
