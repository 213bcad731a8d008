/* Placement tests (src/tier/placement.h): -ngl, --cpu-moe, --n-cpu-moe and -ot
 * on the tensor names of a 4-layer qwen3moe model, against expectations
 * written out by hand.
 *
 * - Homes: CPU only, -ngl all, -ngl 2, --cpu-moe, --n-cpu-moe 2, -ot moving one
 *   tensor either way, first match wins, searched (not anchored) patterns, an
 *   -ot that splits a layer's experts (all go to the CPU, one warning), tied
 *   embeddings following the output head.
 * - -ngl auto: budgets that fit 0, 1, 2, 3 and all layers, the sizes summed
 *   here from the tensor table rather than taken from the library.
 * - No usable GPU: auto and the expert flags run on the CPU with one line; an
 *   explicit -ngl or an -ot ...=CUDA0 that places a tensor is an error.
 * - Errors and warnings: messages name the flag, the item and PCRE2's offset;
 *   warnings (an item matching nothing) do not fail.
 * - Hostile input: names that are not NUL-terminated (allocated to their exact
 *   length, so ASan sees an over-read), invalid UTF-8, huge and negative counts,
 *   NULL arguments; placement_tensor_layer / placement_tensor_is_expert edges. */
#include "gguf_test_util.h"

#include <limits.h>

#include "core/log.h"
#include "tier/placement.h"

#define C       TM_DEV_CPU
#define G       TM_DEV_GPU
#define N_LAYER 4

/* ---- the model: qwen3moe's tensor names, small F32 shapes ---- */

typedef struct tdef {
    const char *name; /* in a layer: after "blk.N." */
    uint32_t n_dims;
    int64_t ne[3];
} tdef;

static const tdef layer_defs[] = {
    {"attn_norm.weight", 1, {64, 1, 1}},     {"attn_q.weight", 2, {64, 128, 1}},
    {"attn_k.weight", 2, {64, 32, 1}},       {"attn_v.weight", 2, {64, 32, 1}},
    {"attn_output.weight", 2, {128, 64, 1}}, {"attn_q_norm.weight", 1, {16, 1, 1}},
    {"attn_k_norm.weight", 1, {16, 1, 1}},   {"ffn_norm.weight", 1, {64, 1, 1}},
    {"ffn_gate_inp.weight", 2, {64, 8, 1}},  {"ffn_gate_exps.weight", 3, {64, 16, 8}},
    {"ffn_up_exps.weight", 3, {64, 16, 8}},  {"ffn_down_exps.weight", 3, {16, 64, 8}},
};
#define N_LAYER_DEFS (sizeof(layer_defs) / sizeof(layer_defs[0]))
#define FIRST_EXPERT 9 /* layer_defs from here on are the expert tensors */
static const tdef embd_def = {"token_embd.weight", 2, {64, 96, 1}};
static const tdef onorm_def = {"output_norm.weight", 1, {64, 1, 1}};
static const tdef output_def = {"output.weight", 2, {64, 96, 1}};

static size_t def_bytes(const tdef *d) {
    return (size_t)(d->ne[0] * d->ne[1] * d->ne[2]) * sizeof(float);
}

/* Bytes of one layer's tensors, and of its expert tensors. */
static size_t layer_bytes(void) {
    size_t b = 0;
    for (size_t i = 0; i < N_LAYER_DEFS; i++) b += def_bytes(&layer_defs[i]);
    return b;
}
static size_t expert_bytes(void) {
    size_t b = 0;
    for (size_t i = FIRST_EXPERT; i < N_LAYER_DEFS; i++) b += def_bytes(&layer_defs[i]);
    return b;
}

typedef struct model {
    bb buf;
    tm_gguf_file *f;
} model;

static void add_def(bb *hdr, const tdef *d, const char *name, uint64_t *off) {
    bb_tensor(hdr, name, d->n_dims, d->ne, TM_TYPE_F32, *off);
    *off += (def_bytes(d) + 31) / 32 * 32;
}

/* The model as a GGUF image opened from memory; tied: no output.weight. */
static void model_open(model *m, bool tied) {
    memset(m, 0, sizeof(*m));
    bb tensors = {0};
    uint64_t off = 0, n = 0;
    char name[64];
    add_def(&tensors, &embd_def, embd_def.name, &off), n++;
    for (unsigned l = 0; l < N_LAYER; l++)
        for (size_t i = 0; i < N_LAYER_DEFS; i++) {
            snprintf(name, sizeof(name), "blk.%u.%s", l, layer_defs[i].name);
            add_def(&tensors, &layer_defs[i], name, &off), n++;
        }
    add_def(&tensors, &onorm_def, onorm_def.name, &off), n++;
    if (!tied) add_def(&tensors, &output_def, output_def.name, &off), n++;
    bb_header(&m->buf, 3, n, 0);
    bb_raw(&m->buf, tensors.p, tensors.n);
    bb_pad(&m->buf, 32);
    bb_zeros(&m->buf, (size_t)off);
    free(tensors.p);
    assert_int_equal(
        gguf_file_open_buffer(m->buf.p, m->buf.n, tied ? "tied.gguf" : "qwen3moe.gguf", &m->f),
        TM_OK);
}

static void model_close(model *m) {
    gguf_file_close(m->f);
    free(m->buf.p);
}

/* ---- helpers ---- */

static const tm_placement_gpu gpu_big = {true, NULL, (size_t)1 << 40, 0, 0, NULL};
static const tm_placement_gpu gpu_none = {false, "no CUDA device found", 0, 0, 0, NULL};

static tm_placement_params params(int ngl, bool cpu_moe, int n_cpu_moe, const char *ot) {
    tm_placement_params p = {
        .n_gpu_layers = ngl, .cpu_moe = cpu_moe, .n_cpu_moe = n_cpu_moe, .overrides = ot};
    return p;
}

static int count(const char *hay, const char *needle) {
    int k = 0;
    for (const char *p = hay; (p = strstr(p, needle)); p++) k++;
    return k;
}

/* Place, expecting success; returns the log. */
static char *place_ok(const model *m, const tm_placement_params *p, const tm_placement_gpu *g,
                      tm_placement *pl) {
    capture_begin();
    tm_status st = placement_make(m->f, N_LAYER, p, g, pl);
    char *log = capture_end();
    if (st != TM_OK) fail_msg("placement_make: %s: %s", tm_status_name(st), tm_error_message());
    assert_int_equal(pl->n_tensors, m->f->n_tensors);
    assert_int_equal(pl->n_layer, N_LAYER);
    return log;
}

/* Place, expecting status want and a message containing each needle. */
static void place_fail(const model *m, const tm_placement_params *p, const tm_placement_gpu *g,
                       tm_status want, const char *n1, const char *n2, const char *n3) {
    tm_placement pl;
    memset(&pl, 0xab, sizeof(pl));
    capture_begin();
    tm_status st = placement_make(m->f, N_LAYER, p, g, &pl);
    free(capture_end());
    const char *msg = tm_error_message();
    if (st != want || (n1 && !strstr(msg, n1)) || (n2 && !strstr(msg, n2)) ||
        (n3 && !strstr(msg, n3)))
        fail_msg("got %s \"%s\"; expected %s with '%s' '%s' '%s'", tm_status_name(st), msg,
                 tm_status_name(want), n1 ? n1 : "", n2 ? n2 : "", n3 ? n3 : "");
    /* a failed call leaves nothing to free */
    assert_null(pl.tensor_dev);
    assert_null(pl.layer_dev);
    assert_null(pl.experts_dev);
    placement_free(&pl);
}

/* An exception to the per-layer expectation: one tensor on dev. */
typedef struct except {
    const char *name;
    uint8_t dev;
} except;

/* Check every tensor: layer l's non-expert tensors on layers[l], its experts
 * on experts[l] ('C' or 'G'), output and output_norm on head, token_embd on
 * embd, the exceptions as listed; and layer_dev, experts_dev, gpu_bytes and
 * any_gpu to match. */
static void expect(const model *m, const tm_placement *pl, const char *layers, const char *experts,
                   char head, char embd, const except *ex, size_t n_ex) {
    size_t gpu = 0;
    bool any = false;
    for (uint64_t t = 0; t < m->f->n_tensors; t++) {
        const tm_gguf_tensor *tt = &m->f->tensors[t];
        char name[64];
        snprintf(name, sizeof(name), "%.*s", (int)tt->name.len, tt->name.data);
        unsigned l;
        char rest[64], want = 0;
        if (!strcmp(name, "token_embd.weight"))
            want = embd;
        else if (!strcmp(name, "output.weight") || !strcmp(name, "output_norm.weight"))
            want = head;
        else if (sscanf(name, "blk.%u.%63s", &l, rest) == 2 && l < N_LAYER)
            want = strstr(rest, "_exps") ? experts[l] : layers[l];
        else
            fail_msg("unexpected tensor %s", name);
        for (size_t e = 0; e < n_ex; e++)
            if (!strcmp(ex[e].name, name)) want = ex[e].dev == G ? 'G' : 'C';
        char got = pl->tensor_dev[t] == G ? 'G' : pl->tensor_dev[t] == C ? 'C' : '?';
        if (got != want) fail_msg("%s: on %c, expected %c", name, got, want);
        if (got == 'G') gpu += tt->n_bytes, any = true;
    }
    int n_gpu = 0;
    for (unsigned l = 0; l < N_LAYER; l++) {
        assert_int_equal(pl->layer_dev[l], layers[l] == 'G' ? G : C);
        assert_int_equal(pl->experts_dev[l], experts[l] == 'G' ? G : C);
        if (layers[l] == 'G') n_gpu++, any = true;
    }
    assert_int_equal(pl->n_gpu_layers, n_gpu);
    assert_int_equal(pl->output_gpu, head == 'G');
    assert_int_equal(pl->gpu_bytes, gpu);
    assert_int_equal(pl->any_gpu, any);
}

/* ---- homes ---- */

static void test_cpu_only(void **state) {
    model m;
    model_open(&m, false);
    tm_placement pl;
    tm_placement_params p = params(0, false, 0, NULL);
    char *log = place_ok(&m, &p, &gpu_big, &pl);
    expect(&m, &pl, "CCCC", "CCCC", 'C', 'C', NULL, 0);
    assert_string_equal(log, ""); /* the user asked for the CPU: nothing to say */
    free(log);
    placement_free(&pl);
    placement_free(&pl); /* twice is harmless */
    /* same without a GPU at all */
    p.overrides = "";
    free(place_ok(&m, &p, NULL, &pl));
    expect(&m, &pl, "CCCC", "CCCC", 'C', 'C', NULL, 0);
    placement_free(&pl);
    model_close(&m);
}

static void test_ngl_all(void **state) {
    model m;
    model_open(&m, false);
    const int ngls[] = {N_LAYER, N_LAYER + 1, 99, INT_MAX};
    for (size_t i = 0; i < sizeof(ngls) / sizeof(ngls[0]); i++) {
        tm_placement pl;
        tm_placement_params p = params(ngls[i], false, 0, NULL);
        free(place_ok(&m, &p, &gpu_big, &pl));
        expect(&m, &pl, "GGGG", "GGGG", 'G', 'C', NULL, 0);
        placement_free(&pl);
    }
    model_close(&m);
}

static void test_ngl_2(void **state) {
    model m;
    model_open(&m, false);
    tm_placement pl;
    tm_placement_params p = params(2, false, 0, NULL);
    free(place_ok(&m, &p, &gpu_big, &pl));
    expect(&m, &pl, "GGCC", "GGCC", 'C', 'C', NULL, 0);
    placement_free(&pl);
    /* N = n_layer - 1: the head stays on the CPU */
    p.n_gpu_layers = N_LAYER - 1;
    free(place_ok(&m, &p, &gpu_big, &pl));
    expect(&m, &pl, "GGGC", "GGGC", 'C', 'C', NULL, 0);
    placement_free(&pl);
    model_close(&m);
}

static void test_cpu_moe(void **state) {
    model m;
    model_open(&m, false);
    tm_placement pl;
    tm_placement_params p = params(99, true, 0, NULL);
    char *log = place_ok(&m, &p, &gpu_big, &pl);
    expect(&m, &pl, "GGGG", "CCCC", 'G', 'C', NULL, 0);
    assert_null(strstr(log, "warn")); /* the experts move together: no split */
    free(log);
    placement_free(&pl);
    /* with --n-cpu-moe too: --cpu-moe still covers every layer */
    p.n_cpu_moe = 1;
    free(place_ok(&m, &p, &gpu_big, &pl));
    expect(&m, &pl, "GGGG", "CCCC", 'G', 'C', NULL, 0);
    placement_free(&pl);
    model_close(&m);
}

static void test_n_cpu_moe(void **state) {
    model m;
    model_open(&m, false);
    tm_placement pl;
    tm_placement_params p = params(99, false, 2, NULL);
    char *log = place_ok(&m, &p, &gpu_big, &pl);
    expect(&m, &pl, "GGGG", "CCGG", 'G', 'C', NULL, 0);
    assert_string_equal(log, "");
    free(log);
    placement_free(&pl);
    /* with -ngl 3: layer 3 is on the CPU anyway */
    p.n_gpu_layers = 3;
    free(place_ok(&m, &p, &gpu_big, &pl));
    expect(&m, &pl, "GGGC", "CCGC", 'C', 'C', NULL, 0);
    placement_free(&pl);
    /* N beyond the layers (no N patterns are made: instant) */
    p.n_gpu_layers = 99, p.n_cpu_moe = INT_MAX;
    free(place_ok(&m, &p, &gpu_big, &pl));
    expect(&m, &pl, "GGGG", "CCCC", 'G', 'C', NULL, 0);
    placement_free(&pl);
    model_close(&m);
}

static void test_ot_single_tensor(void **state) {
    model m;
    model_open(&m, false);
    tm_placement pl;
    /* GPU run, one tensor back to the CPU */
    tm_placement_params p = params(99, false, 0, "blk\\.1\\.attn_q\\.weight=CPU");
    free(place_ok(&m, &p, &gpu_big, &pl));
    const except e1[] = {{"blk.1.attn_q.weight", C}};
    expect(&m, &pl, "GGGG", "GGGG", 'G', 'C', e1, 1);
    placement_free(&pl);
    /* CPU run, one tensor to the GPU (device names in any case) */
    p = params(0, false, 0, "blk\\.2\\.attn_k\\.weight=cuda0");
    free(place_ok(&m, &p, &gpu_big, &pl));
    const except e2[] = {{"blk.2.attn_k.weight", G}};
    expect(&m, &pl, "CCCC", "CCCC", 'C', 'C', e2, 1);
    assert_int_equal(pl.gpu_bytes, 64 * 32 * sizeof(float));
    assert_true(pl.any_gpu);
    placement_free(&pl);
    /* the embedding can be moved too */
    p = params(99, false, 0, "^token_embd=Cuda0");
    free(place_ok(&m, &p, &gpu_big, &pl));
    expect(&m, &pl, "GGGG", "GGGG", 'G', 'G', NULL, 0);
    placement_free(&pl);
    /* searched, not anchored: output\.weight is also in attn_output.weight */
    p = params(0, false, 0, "output\\.weight=CUDA0");
    free(place_ok(&m, &p, &gpu_big, &pl));
    const except e3[] = {{"output.weight", G},
                         {"blk.0.attn_output.weight", G},
                         {"blk.1.attn_output.weight", G},
                         {"blk.2.attn_output.weight", G},
                         {"blk.3.attn_output.weight", G}};
    expect(&m, &pl, "CCCC", "CCCC", 'C', 'C', e3, 5);
    placement_free(&pl);
    model_close(&m);
}

static void test_ot_first_match_wins(void **state) {
    model m;
    model_open(&m, false);
    tm_placement pl;
    /* the narrow rule first: it wins for its tensor, the broad one takes the rest */
    tm_placement_params p = params(0, false, 0, "blk\\.1\\.ffn_norm=CPU,blk\\.1\\.=CUDA0");
    char *log = place_ok(&m, &p, &gpu_big, &pl);
    const except e1[] = {{"blk.1.attn_norm.weight", G},   {"blk.1.attn_q.weight", G},
                         {"blk.1.attn_k.weight", G},      {"blk.1.attn_v.weight", G},
                         {"blk.1.attn_output.weight", G}, {"blk.1.attn_q_norm.weight", G},
                         {"blk.1.attn_k_norm.weight", G}, {"blk.1.ffn_gate_inp.weight", G}};
    expect(&m, &pl, "CCCC", "CGCC", 'C', 'C', e1, 8);
    assert_string_equal(log, "");
    free(log);
    placement_free(&pl);
    /* the other way round the broad rule takes all of blk.1; the narrow one
     * still matches a name, so no "matches no tensor" warning */
    p.overrides = "blk\\.1\\.=CUDA0,blk\\.1\\.ffn_norm=CPU";
    log = place_ok(&m, &p, &gpu_big, &pl);
    const except e2[] = {{"blk.1.attn_norm.weight", G},   {"blk.1.attn_q.weight", G},
                         {"blk.1.attn_k.weight", G},      {"blk.1.attn_v.weight", G},
                         {"blk.1.attn_output.weight", G}, {"blk.1.attn_q_norm.weight", G},
                         {"blk.1.attn_k_norm.weight", G}, {"blk.1.ffn_gate_inp.weight", G},
                         {"blk.1.ffn_norm.weight", G}};
    expect(&m, &pl, "CCCC", "CGCC", 'C', 'C', e2, 9);
    assert_string_equal(log, "");
    free(log);
    placement_free(&pl);
    /* -ot comes before --cpu-moe: experts of layer 3 stay on the GPU */
    p = params(99, true, 0, "blk\\.3\\.ffn_.*_exps=CUDA0");
    free(place_ok(&m, &p, &gpu_big, &pl));
    expect(&m, &pl, "GGGG", "CCCG", 'G', 'C', NULL, 0);
    placement_free(&pl);
    /* a pattern with '=' in it (a lookahead): the device follows the last '=' */
    p = params(99, false, 0, "blk\\.0\\.attn_(?=q\\.)=CPU");
    free(place_ok(&m, &p, &gpu_big, &pl));
    const except e3[] = {{"blk.0.attn_q.weight", C}};
    expect(&m, &pl, "GGGG", "GGGG", 'G', 'C', e3, 1);
    placement_free(&pl);
    model_close(&m);
}

static void test_ot_split_experts(void **state) {
    model m;
    model_open(&m, false);
    tm_placement pl;
    const char *ot = "blk\\.2\\.ffn_up_exps=CPU";
    tm_placement_params p = params(99, false, 0, ot);
    char *log = place_ok(&m, &p, &gpu_big, &pl);
    expect(&m, &pl, "GGGG", "GGCG", 'G', 'C', NULL, 0);
    assert_int_equal(count(log, "warn:"), 1);
    assert_non_null(strstr(log, "layer 2"));
    assert_non_null(strstr(log, ot));
    free(log);
    placement_free(&pl);
    /* toward the GPU: the one expert tensor sent there comes back */
    p = params(0, false, 0, "blk\\.(1|3)\\.ffn_down_exps=CUDA0");
    log = place_ok(&m, &p, &gpu_big, &pl);
    expect(&m, &pl, "CCCC", "CCCC", 'C', 'C', NULL, 0);
    assert_int_equal(count(log, "warn:"), 2); /* once per layer */
    assert_non_null(strstr(log, "layer 1"));
    assert_non_null(strstr(log, "layer 3"));
    free(log);
    placement_free(&pl);
    model_close(&m);
}

static void test_tied(void **state) {
    model m;
    model_open(&m, true);
    tm_placement pl;
    tm_placement_params p = params(99, false, 0, NULL);
    free(place_ok(&m, &p, &gpu_big, &pl));
    expect(&m, &pl, "GGGG", "GGGG", 'G', 'G', NULL, 0); /* the embedding is the head */
    placement_free(&pl);
    p.n_gpu_layers = 2;
    free(place_ok(&m, &p, &gpu_big, &pl));
    expect(&m, &pl, "GGCC", "GGCC", 'C', 'C', NULL, 0);
    placement_free(&pl);
    model_close(&m);
}

/* ---- -ngl auto ---- */

static void test_auto(void **state) {
    model m;
    model_open(&m, false);
    const size_t L = layer_bytes(), E = expert_bytes(), kv = 1000, fixed = 5000;
    const size_t head = def_bytes(&output_def) + def_bytes(&onorm_def);
    tm_placement_gpu g = {true, NULL, 0, fixed, kv, NULL};
    tm_placement_params p = params(TM_NGL_AUTO, false, 0, NULL);
    tm_placement pl;
    char *log;
    struct {
        size_t budget;
        const char *layers;
        char head;
    } cases[] = {
        {0, "CCCC", 'C'},
        {L + kv + fixed - 1, "CCCC", 'C'},
        {L + kv + fixed, "GCCC", 'C'},
        {2 * (L + kv) + fixed - 1, "GCCC", 'C'},
        {2 * (L + kv) + fixed, "GGCC", 'C'},
        {4 * (L + kv) + head + fixed - 1, "GGGC", 'C'},
        {4 * (L + kv) + head + fixed, "GGGG", 'G'},
        {SIZE_MAX, "GGGG", 'G'},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        g.budget = cases[i].budget;
        log = place_ok(&m, &p, &g, &pl);
        expect(&m, &pl, cases[i].layers, cases[i].layers, cases[i].head, 'C', NULL, 0);
        assert_int_equal(count(log, "\n"), 1); /* one info line either way */
        if (pl.n_gpu_layers == 0) assert_non_null(strstr(log, "too small"));
        if (pl.n_gpu_layers == 0) assert_non_null(strstr(log, "CPU only"));
        free(log);
        placement_free(&pl);
    }
    /* --cpu-moe leaves room for more layers */
    p.cpu_moe = true;
    g.budget = 4 * (L - E + kv) + head + fixed;
    free(place_ok(&m, &p, &g, &pl));
    expect(&m, &pl, "GGGG", "CCCC", 'G', 'C', NULL, 0);
    placement_free(&pl);
    g.budget--;
    free(place_ok(&m, &p, &g, &pl));
    expect(&m, &pl, "GGGC", "CCCC", 'C', 'C', NULL, 0);
    placement_free(&pl);
    /* an -ot to the GPU counts against the budget */
    p = params(TM_NGL_AUTO, false, 0, "token_embd=CUDA0");
    g.budget = 2 * (L + kv) + def_bytes(&embd_def) + fixed;
    free(place_ok(&m, &p, &g, &pl));
    expect(&m, &pl, "GGCC", "GGCC", 'C', 'G', NULL, 0);
    placement_free(&pl);
    /* ... and when not even that fits, the layers run on the CPU, the tensor stays */
    g.budget = 0;
    log = place_ok(&m, &p, &g, &pl);
    expect(&m, &pl, "CCCC", "CCCC", 'C', 'G', NULL, 0);
    assert_non_null(strstr(log, "too small"));
    free(log);
    placement_free(&pl);
    /* a huge KV cache per layer must not wrap around */
    p = params(TM_NGL_AUTO, false, 0, NULL);
    g.budget = SIZE_MAX - 1, g.kv_bytes_per_layer = SIZE_MAX / 3;
    free(place_ok(&m, &p, &g, &pl));
    assert_int_equal(pl.n_gpu_layers, 2);
    placement_free(&pl);
    /* caches of their own size a layer (sliding layers' rings on even ones): what three
     * layers' take, not three times kv */
    const size_t kv_layer[4] = {kv / 10, kv, kv / 10, kv};
    g.kv_bytes_per_layer = kv, g.kv_bytes_layer = kv_layer;
    g.budget = 3 * L + kv / 10 + kv + kv / 10 + fixed;
    free(place_ok(&m, &p, &g, &pl));
    expect(&m, &pl, "GGGC", "GGGC", 'C', 'C', NULL, 0);
    placement_free(&pl);
    g.budget--;
    free(place_ok(&m, &p, &g, &pl));
    expect(&m, &pl, "GGCC", "GGCC", 'C', 'C', NULL, 0);
    placement_free(&pl);
    g.kv_bytes_layer = NULL;
    model_close(&m);

    /* tied: the embedding is the head, and takes its room */
    model_open(&m, true);
    g.kv_bytes_per_layer = kv;
    size_t all = 4 * (L + kv) + def_bytes(&onorm_def) + def_bytes(&embd_def) + fixed;
    g.budget = all;
    free(place_ok(&m, &p, &g, &pl));
    expect(&m, &pl, "GGGG", "GGGG", 'G', 'G', NULL, 0);
    placement_free(&pl);
    g.budget = all - 1;
    free(place_ok(&m, &p, &g, &pl));
    expect(&m, &pl, "GGGC", "GGGC", 'C', 'C', NULL, 0);
    placement_free(&pl);
    model_close(&m);
}

/* ---- without a usable GPU ---- */

static void test_no_gpu(void **state) {
    model m;
    model_open(&m, false);
    tm_placement pl;
    const tm_placement_params cpu_runs[] = {
        params(TM_NGL_AUTO, false, 0, NULL),
        params(TM_NGL_AUTO, true, 0, NULL),
        params(0, true, 0, NULL),
        params(0, false, 2, NULL),
        params(TM_NGL_AUTO, false, 0, "exps=CPU"),
    };
    for (size_t i = 0; i < sizeof(cpu_runs) / sizeof(cpu_runs[0]); i++) {
        char *log = place_ok(&m, &cpu_runs[i], &gpu_none, &pl);
        expect(&m, &pl, "CCCC", "CCCC", 'C', 'C', NULL, 0);
        assert_int_equal(count(log, "\n"), 1);
        assert_non_null(
            strstr(log, "info: no usable GPU (no CUDA device found): running on the CPU"));
        free(log);
        placement_free(&pl);
    }
    /* a CUDA0 item shadowed by an earlier one places nothing on the GPU: fine */
    tm_placement_params p = params(0, false, 0, "blk=CPU,blk\\.0=CUDA0");
    free(place_ok(&m, &p, &gpu_none, &pl));
    expect(&m, &pl, "CCCC", "CCCC", 'C', 'C', NULL, 0);
    placement_free(&pl);
    /* asking for the GPU is an error naming the flag and why */
    p = params(2, false, 0, NULL);
    place_fail(&m, &p, &gpu_none, TM_ERR_DEVICE, "-ngl 2", "no CUDA device found", NULL);
    p = params(99, true, 0, NULL);
    place_fail(&m, &p, &gpu_none, TM_ERR_DEVICE, "-ngl 99", "no CUDA device found", NULL);
    p = params(1, false, 0, NULL);
    place_fail(&m, &p, NULL, TM_ERR_DEVICE, "-ngl 1", "no usable GPU", NULL);
    p = params(0, false, 0, "exps=CPU,attn_q=CUDA0");
    place_fail(&m, &p, &gpu_none, TM_ERR_DEVICE, "-ot 'attn_q=CUDA0'", "no CUDA device found",
               NULL);
    p = params(TM_NGL_AUTO, false, 0, "attn_q=CUDA0");
    place_fail(&m, &p, &gpu_none, TM_ERR_DEVICE, "-ot 'attn_q=CUDA0'", "no CUDA device found",
               NULL);
    model_close(&m);
}

/* ---- errors and warnings ---- */

static void test_errors(void **state) {
    model m;
    model_open(&m, false);
    tm_placement_params p = params(99, false, 0, NULL);
    const struct {
        const char *ot, *n1, *n2, *n3;
    } bad[] = {
        {"blk\\.(=CUDA0", "-ot 'blk\\.(=CUDA0'", "invalid regular expression at offset 6",
         "missing closing parenthesis"},
        {"exps=GPU1", "-ot 'exps=GPU1'", "unknown buffer type 'GPU1'",
         "(expected CPU or CUDA0, CUDA1, ...)"},
        {"exps=CPU,attn=", "-ot 'attn='", "unknown buffer type ''", NULL},
        {"exps", "-ot 'exps'", "expected PATTERN=BUFFER_TYPE", NULL},
        {"exps=CPU,,attn=CPU", "-ot 'exps=CPU,,attn=CPU'", "empty item at offset 9", NULL},
        {"exps=CPU,", "empty item at offset 9", NULL, NULL},
        {",exps=CPU", "empty item at offset 0", NULL, NULL},
        {",", "empty item", NULL, NULL},
        {"=CPU", "-ot '=CPU'", "empty pattern", NULL},
        {"a\xff=CPU", "-ot 'a\xff=CPU'", "invalid regular expression at offset 1", "UTF-8"},
        {"exps=CPU,x{2,1}=CPU", "-ot 'x{2'", "expected PATTERN=BUFFER_TYPE", NULL},
        {"(?<n>a)(?<n>b)=CPU", "invalid regular expression at offset", "name", NULL},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        p.overrides = bad[i].ot;
        place_fail(&m, &p, &gpu_big, TM_ERR_ARG, bad[i].n1, bad[i].n2, bad[i].n3);
        /* the CLI's check says the same with its flag's name */
        assert_int_equal(placement_overrides_check("--override-tensor", bad[i].ot), TM_ERR_ARG);
        if (strstr(bad[i].n1, "-ot '")) assert_non_null(strstr(tm_error_message(), bad[i].n1 + 4));
        assert_non_null(strstr(tm_error_message(), "--override-tensor"));
    }
    p = params(-2, false, 0, NULL);
    place_fail(&m, &p, &gpu_big, TM_ERR_ARG, "-ngl -2", NULL, NULL);
    p = params(INT_MIN, false, 0, NULL);
    place_fail(&m, &p, &gpu_big, TM_ERR_ARG, "-ngl", NULL, NULL);
    p = params(99, false, -1, NULL);
    place_fail(&m, &p, &gpu_big, TM_ERR_ARG, "--n-cpu-moe -1", NULL, NULL);
    p = params(99, false, 0, NULL);

    /* NULL arguments and impossible sizes */
    tm_placement pl;
    assert_int_equal(placement_make(NULL, N_LAYER, &p, &gpu_big, &pl), TM_ERR_ARG);
    assert_null(pl.tensor_dev);
    assert_int_equal(placement_make(m.f, N_LAYER, NULL, &gpu_big, &pl), TM_ERR_ARG);
    assert_int_equal(placement_make(m.f, N_LAYER, &p, &gpu_big, NULL), TM_ERR_ARG);
    assert_int_equal(placement_make(m.f, UINT32_MAX, &p, &gpu_big, &pl), TM_ERR_ARG);
    assert_non_null(strstr(tm_error_message(), "qwen3moe.gguf"));
    placement_free(NULL);
    model_close(&m);
}

static void test_warnings(void **state) {
    model m;
    model_open(&m, false);
    tm_placement pl;
    tm_placement_params p = params(99, false, 0, "blk\\.7\\.=CPU,attn_q\\.=CPU,nothing=CUDA0");
    char *log = place_ok(&m, &p, &gpu_big, &pl);
    assert_int_equal(count(log, "warn:"), 2);
    assert_non_null(strstr(log, "-ot 'blk\\.7\\.=CPU' matches no tensor of qwen3moe.gguf"));
    assert_non_null(strstr(log, "-ot 'nothing=CUDA0' matches no tensor of qwen3moe.gguf"));
    const except e[] = {{"blk.0.attn_q.weight", C},
                        {"blk.1.attn_q.weight", C},
                        {"blk.2.attn_q.weight", C},
                        {"blk.3.attn_q.weight", C}};
    expect(&m, &pl, "GGGG", "GGGG", 'G', 'C', e, 4);
    free(log);
    placement_free(&pl);
    /* the expert flags' own patterns never warn, even matching nothing */
    p = params(0, true, 3, NULL);
    log = place_ok(&m, &p, &gpu_big, &pl);
    assert_string_equal(log, "");
    free(log);
    placement_free(&pl);
    model_close(&m);
}

static void test_overrides_check(void **state) {
    const char *good[] = {
        NULL,
        "",
        "exps=CPU",
        "\\.ffn_(up|down|gate)_exps=cpu,blk\\.[0-9]\\.=cUdA0",
        "(?=a)b=CPU",
        "a==CPU",
        "\xc3\xa9=CPU", /* é: valid UTF-8 */
        "a=CPU,b=CPU,c=CUDA0,d=cpu",
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        if (placement_overrides_check("-ot", good[i]) != TM_OK)
            fail_msg("'%s': %s", good[i] ? good[i] : "(null)", tm_error_message());
    assert_int_equal(placement_overrides_check(NULL, "x"), TM_ERR_ARG); /* default flag name */
    assert_non_null(strstr(tm_error_message(), "-ot 'x'"));
    assert_int_equal(placement_overrides_check("-ot", "a=CPU "), TM_ERR_ARG);
    assert_int_equal(placement_overrides_check("-ot", "a=CUDA"), TM_ERR_ARG);
    assert_int_equal(placement_overrides_check("-ot", "a=CUDA1"), TM_OK); /* a GPU of -dev's */
    assert_int_equal(placement_overrides_check("-ot", "a=CUDA1x"), TM_ERR_ARG);
    assert_int_equal(placement_overrides_check("-ot", "a=CUDA-1"), TM_ERR_ARG);
    assert_int_equal(placement_overrides_check("-ot", "a=CUDA1000"), TM_ERR_ARG);
    assert_int_equal(placement_overrides_check("-ot", "a=GPU"), TM_ERR_ARG);
    /* many items */
    size_t n = 3000;
    char *spec = malloc(n * 16 + 1), *q = spec;
    for (size_t i = 0; i < n; i++) q += sprintf(q, "%sa%zu=CPU", i ? "," : "", i % 1000);
    assert_int_equal(placement_overrides_check("-ot", spec), TM_OK);
    free(spec);
}

/* ---- names ---- */

static void test_tensor_layer(void **state) {
    const struct {
        const char *s;
        int layer;
    } cases[] = {
        {"blk.12.attn_q.weight", 12},
        {"blk.0.x", 0},
        {"blk.0.", 0},
        {"blk.007.ffn_up_exps.weight", 7},
        {"blk.1000000.x", 1000000},
        {"blk.1000001.x", -1},
        {"blk.99999999999999999999999.x", -1},
        {"blk.x.attn_q.weight", -1},
        {"blk..attn_q.weight", -1},
        {"blk.12", -1},
        {"blk.12attn", -1},
        {"blk.-1.x", -1},
        {"blk.+1.x", -1},
        {"blk. 1.x", -1},
        {"BLK.1.x", -1},
        {"xblk.1.x", -1},
        {"blk.", -1},
        {"", -1},
        {"token_embd.weight", -1},
        {"output.weight", -1},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        if (placement_tensor_layer(cases[i].s, strlen(cases[i].s)) != cases[i].layer)
            fail_msg("'%s': %d, expected %d", cases[i].s,
                     placement_tensor_layer(cases[i].s, strlen(cases[i].s)), cases[i].layer);
    assert_int_equal(placement_tensor_layer(NULL, 0), -1);
    assert_int_equal(placement_tensor_layer(NULL, 10), -1);
    /* the length bounds the name, not a NUL */
    assert_int_equal(placement_tensor_layer("blk.12.attn", 7), 12);
    assert_int_equal(placement_tensor_layer("blk.12.attn", 6), -1);
    assert_int_equal(placement_tensor_layer("blk.12.attn", 5), -1);
}

static void test_tensor_is_expert(void **state) {
    const struct {
        const char *s;
        bool expert;
    } cases[] = {
        {"blk.3.ffn_gate_exps.weight", true}, {"blk.3.ffn_up_exps.weight", true},
        {"blk.3.ffn_down_exps.weight", true}, {"blk.3.ffn_gate_exps.bias", true},
        {"blk.3.ffn_up_chexps.weight", true}, {"blk.3.ffn_down_chexps.weight", true},
        {"blk.3.ffn_gate_inp.weight", false}, {"blk.3.ffn_gate_shexp.weight", false},
        {"blk.3.ffn_up.weight", false},       {"blk.3.exps", false},
        {"ffn_gate_exps.weight", false},      {"blk.x.ffn_gate_exps.weight", false},
        {"blk.3.ffn_gate_exp.weight", false}, {"", false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        if (placement_tensor_is_expert(cases[i].s, strlen(cases[i].s)) != cases[i].expert)
            fail_msg("'%s': expected %d", cases[i].s, cases[i].expert);
    assert_false(placement_tensor_is_expert(NULL, 0));
    assert_false(placement_tensor_is_expert("blk.3.ffn_up_exps.weight", 14)); /* "blk.3.ffn_up_e" */
    assert_true(placement_tensor_is_expert("blk.3.ffn_up_exps.weight", 17));
}

/* ---- hostile input: a file made by hand, names allocated to their exact length ---- */

static void test_hostile_names(void **state) {
    static const char *const names[] = {
        "blk.0.ffn_up_exps.weight",
        "blk.0.ffn_gate_exps.bias",
        "blk.0.ffn_down_chexps.weight",
        "blk.0.attn_q.weight",
        "blk.1.ffn_up_exps.weight",
        "blk.1.ffn_gate_exps.weight",
        "",
        "blk.",
        "blk.5.ffn_up_exps.weight", /* a layer the model does not have */
        "blk.99999999999999999999.ffn_up_exps",
        "\xff\xfe\x80",
        "blk.1.\xc3(",
        "token_embd.weight",
        "output.weight",
    };
    const size_t n = sizeof(names) / sizeof(names[0]);
    tm_gguf_tensor *t = calloc(n, sizeof(*t));
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(names[i]);
        char *s = malloc(len ? len : 1);
        memcpy(s, names[i], len);
        t[i].name.data = len ? s : NULL;
        t[i].name.len = len;
        t[i].n_bytes = 100 + i;
        if (!len) free(s);
    }
    tm_gguf_file f;
    memset(&f, 0, sizeof(f));
    f.n_tensors = n, f.tensors = t, f.path = "hand.gguf";
    tm_placement pl;
    tm_placement_params p = params(99, false, 0, "gate_exps\\.bias=CPU");
    capture_begin();
    tm_status st = placement_make(&f, 2, &p, &gpu_big, &pl);
    char *log = capture_end();
    assert_int_equal(st, TM_OK);
    /* layer 0's experts (bias and chexps included) all go to the CPU, with a warning */
    for (size_t i = 0; i < 3; i++) assert_int_equal(pl.tensor_dev[i], C);
    assert_int_equal(pl.experts_dev[0], C);
    assert_int_equal(pl.tensor_dev[3], G);
    assert_int_equal(pl.tensor_dev[4], G);
    assert_int_equal(pl.tensor_dev[5], G);
    assert_int_equal(pl.experts_dev[1], G);
    assert_int_equal(count(log, "warn:"), 1);
    assert_non_null(strstr(log, "layer 0"));
    /* not layers: "other" tensors, on the GPU as every layer is; a layer past the model's
       (a NextN layer it does not run) stays in the mapped file */
    for (size_t i = 6; i < 12; i++) assert_int_equal(pl.tensor_dev[i], i == 8 ? C : G);
    assert_int_equal(pl.tensor_dev[12], C);
    assert_int_equal(pl.tensor_dev[13], G);
    free(log);
    placement_free(&pl);

    /* patterns against every name, invalid UTF-8 included; --n-cpu-moe beyond n_layer */
    const char *ots[] = {".=CUDA0",    "^$=CPU",     "\\x{fffd}=CPU",
                         "(?s).*=CPU", "blk\\.=CPU", "\\C=CUDA0"};
    for (size_t i = 0; i < sizeof(ots) / sizeof(ots[0]); i++) {
        p = params(INT_MAX, true, INT_MAX, ots[i]);
        capture_begin();
        st = placement_make(&f, 2, &p, &gpu_big, &pl);
        free(capture_end());
        if (st != TM_OK && st != TM_ERR_ARG) fail_msg("%s: %s", ots[i], tm_error_message());
        placement_free(&pl);
    }
    /* n_layer 0: everything is "other" */
    p = params(0, false, 0, NULL);
    assert_int_equal(placement_make(&f, 0, &p, &gpu_big, &pl), TM_OK);
    for (size_t i = 0; i < n; i++) assert_int_equal(pl.tensor_dev[i], C);
    assert_false(pl.any_gpu);
    placement_free(&pl);
    p = params(TM_NGL_AUTO, false, 0, NULL);
    assert_int_equal(placement_make(&f, 0, &p, &gpu_big, &pl), TM_OK);
    assert_false(pl.any_gpu);
    placement_free(&pl);
    /* no tensors at all */
    tm_gguf_file empty;
    memset(&empty, 0, sizeof(empty));
    p = params(TM_NGL_AUTO, true, 2, "a=CPU");
    capture_begin();
    st = placement_make(&empty, 3, &p, &gpu_big, &pl);
    log = capture_end();
    assert_int_equal(st, TM_OK);
    assert_non_null(strstr(log, "matches no tensor of the model"));
    assert_int_equal(pl.n_gpu_layers, 3);
    assert_int_equal(pl.layer_dev[2], G);
    free(log);
    placement_free(&pl);

    for (size_t i = 0; i < n; i++) free((void *)t[i].name.data);
    free(t);
}

int main(void) {
    tm_log_set_level(TM_LOG_INFO);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_only),
        cmocka_unit_test(test_ngl_all),
        cmocka_unit_test(test_ngl_2),
        cmocka_unit_test(test_cpu_moe),
        cmocka_unit_test(test_n_cpu_moe),
        cmocka_unit_test(test_ot_single_tensor),
        cmocka_unit_test(test_ot_first_match_wins),
        cmocka_unit_test(test_ot_split_experts),
        cmocka_unit_test(test_tied),
        cmocka_unit_test(test_auto),
        cmocka_unit_test(test_no_gpu),
        cmocka_unit_test(test_errors),
        cmocka_unit_test(test_warnings),
        cmocka_unit_test(test_overrides_check),
        cmocka_unit_test(test_tensor_layer),
        cmocka_unit_test(test_tensor_is_expert),
        cmocka_unit_test(test_hostile_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
