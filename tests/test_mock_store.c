/* The SSD tier (--ram-cache, src/tier/store*.c) on a real file on disk:
 *
 *   - the reader: random aligned reads at several queue depths, through
 *     io_uring and pread, O_DIRECT, give the file's bytes; a read past the
 *     file's end is a clear error naming the offset;
 *   - the same logits, bit for bit, as the model computing from its mapping
 *     (the store changes where the bytes come from, never what is computed):
 *     a prompt in several batches, then decode steps, with a budget smaller
 *     than the experts a token uses (every layer evicts every step), a small
 *     one, one of half the experts (a prompt batch reads what it lacked
 *     plus at most TM_STORE_STAGE a layer) and one that holds every expert
 *     (each expert read once), with the
 *     expert tensors' pages of the mapping made unreadable (so the lane reads
 *     the store's copies, never the page cache); on the
 *     CPU and with --cpu-moe on the mock GPU (the decode hand-off's host
 *     task reads from the store); and all of it again on a file whose
 *     layers' gate, up and down have other types than each other and than
 *     the next layer's (each projection's piece of a slot follows its type);
 *   - a failed read (TIERMOE_STORE_FAIL_READ) that a retry fixes gives the
 *     same logits; one that keeps failing, and a file truncated under a
 *     running context, fail the step with a message naming the offset,
 *     never a wrong token.
 * Linked with the host mock of the CUDA backend (a test_mock_ test). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "core/rng.h"
#include "gguf/gguf.h"
#include "model/model.h"
#include "model/synth.h"
#include "tier/store.h"
#include "tier/store_io.h"

#define ALL      (1 << 20)
#define N_PROMPT 40
#define N_GEN    6

static char model_path[512], mixed_path[512];

static void tmp_path(char *out, size_t len, const char *name) {
    const char *tmp = getenv("TM_TEST_TMP");
    snprintf(out, len, "%s/%s", tmp ? tmp : ".", name);
}

static int setup(void **state) {
    (void)state;
    tmp_path(model_path, sizeof(model_path), "store_tiny.gguf");
    tm_synth_config sc;
    if (synth_config_preset(&sc, "tiny") != TM_OK) fail_msg("%s", tm_error_message());
    sc.n_layer = 3, sc.n_expert = 32, sc.n_threads = 2, sc.seed = 5;
    if (synth_model_write(&sc, model_path) != TM_OK) fail_msg("mkmodel: %s", tm_error_message());
    /* the same with every layer's gate, up and down of other types than each other and than
       the next layer's: each projection's slot piece follows its own type */
    tmp_path(mixed_path, sizeof(mixed_path), "store_mixed.gguf");
    static const char *const rules[] = {
        "blk\\.0\\.ffn_gate=q5_K",  "blk\\.0\\.ffn_up=q8_0", "blk\\.0\\.ffn_down=q4_0",
        "blk\\.1\\.ffn_gate=mxfp4", "blk\\.1\\.ffn_up=q6_K", "blk\\.1\\.ffn_down=q4_K",
        "blk\\.2\\.ffn_gate=q4_0",  "blk\\.2\\.ffn_up=q4_K", "blk\\.2\\.ffn_down=q8_0",
    };
    for (size_t i = 0; i < sizeof(rules) / sizeof(rules[0]); i++)
        if (synth_config_tensor_type(&sc, rules[i]) != TM_OK) fail_msg("%s", tm_error_message());
    if (synth_model_write(&sc, mixed_path) != TM_OK) fail_msg("mkmodel: %s", tm_error_message());
    return 0;
}

static int teardown(void **state) {
    (void)state;
    remove(model_path), remove(mixed_path);
    return 0;
}

/* ---- the reader ---- */

static void check_reads(const char *path, const uint8_t *want, size_t size, int depth, bool uring) {
    tm_store_io *io;
    const tm_store_io_params p = {.depth = depth, .no_uring = !uring, .quiet = true};
    assert_int_equal(store_io_open(path, &p, &io), TM_OK);
    if (uring) assert_true(store_io_uring(io) || !getenv("TM_REQUIRE_URING"));
    enum { N = 40 };
    uint8_t *buf[N];
    uint64_t off[N], len[N], seq = 0;
    tm_rng r;
    tm_rng_seed(&r, (uint64_t)depth * 7 + uring);
    for (int i = 0; i < N; i++) {
        len[i] = (1 + tm_rng_u64(&r) % 300) * TM_STORE_ALIGN; /* up to 1.2 MiB: split reads */
        off[i] = tm_rng_u64(&r) % ((size - len[i]) / TM_STORE_ALIGN) * TM_STORE_ALIGN;
        buf[i] = aligned_alloc(TM_STORE_ALIGN, len[i]);
        assert_non_null(buf[i]);
        assert_int_equal(store_io_read(io, off[i], len[i], len[i], buf[i], &seq), TM_OK);
        if (i % 7 == 3) assert_int_equal(store_io_submit(io), TM_OK);
    }
    assert_int_equal(store_io_wait(io, seq), TM_OK);
    for (int i = 0; i < N; i++) {
        assert_memory_equal(buf[i], want + off[i], len[i]);
        free(buf[i]);
    }
    /* the last page: a read of whole pages that ends past the file is fine
       while it covers what is needed; more than the file has is an error */
    const uint64_t last = (size - 1) / TM_STORE_ALIGN * TM_STORE_ALIGN;
    uint8_t *b = aligned_alloc(TM_STORE_ALIGN, 2 * TM_STORE_ALIGN);
    assert_int_equal(store_io_read(io, last, 2 * TM_STORE_ALIGN, size - last, b, &seq), TM_OK);
    assert_int_equal(store_io_wait(io, seq), TM_OK);
    assert_memory_equal(b, want + last, size - last);
    assert_int_equal(store_io_read(io, last, 2 * TM_STORE_ALIGN, size - last + 1, b, &seq), TM_OK);
    assert_int_equal(store_io_wait(io, seq), TM_ERR_IO);
    assert_non_null(strstr(tm_error_message(), "truncated"));
    char at[64];
    snprintf(at, sizeof(at), "offset %llu", (unsigned long long)last);
    assert_non_null(strstr(tm_error_message(), at));
    free(b);
    store_io_close(io);
}

static void test_reader(void **state) {
    (void)state;
    char path[512];
    tmp_path(path, sizeof(path), "store_io.bin");
    const size_t size = (6u << 20) + 1234; /* not a whole number of pages */
    uint8_t *want = malloc(size);
    assert_non_null(want);
    tm_rng r;
    tm_rng_seed(&r, 3);
    for (size_t i = 0; i < size; i++) want[i] = (uint8_t)tm_rng_u64(&r);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(want, 1, size, f), size);
    fclose(f);
    const int depths[] = {1, 4, 32};
    for (int d = 0; d < 3; d++) {
        check_reads(path, want, size, depths[d], true);
        check_reads(path, want, size, depths[d], false);
    }
    remove(path);
    free(want);
}

/* ---- the model ---- */

static tm_context_params params(bool gpu, int64_t ram_mib) {
    return (tm_context_params){.n_ctx = 128,
                               .n_batch = 16,
                               .n_threads = 2,
                               .kv_type = TM_TYPE_F32,
                               .n_gpu_layers = gpu ? ALL : 0,
                               .cpu_moe = gpu,
                               /* the lanes --ram-cache turns off, off in the reference too:
                                  the CPU lane computes every expert in RAM in both */
                               .moe_pcie = gpu ? TM_MOE_PCIE_OFF : 0,
                               .moe_fetch = gpu ? TM_MOE_FETCH_OFF : 0,
                               .moe_ahead = gpu ? TM_MOE_AHEAD_OFF : 0,
                               .ram_cache_mib = ram_mib};
}

/* --cpu-moe with prompts' fetch lane copying every cold expert to the GPU
 * (from the mapping's pinned pages, or with ram_mib from the store's slots);
 * decode's lanes off, as --ram-cache turns them off. */
static tm_context_params params_fetch(int64_t ram_mib) {
    tm_context_params p = params(true, ram_mib);
    p.moe_fetch = TM_MOE_FETCH_COPY;
    return p;
}

/* the last run_seq's experts the fetch lane copied, and their copies' time (--profile) */
static uint64_t fetched_experts, copy_ns;

/* A prompt (batches of 16) and N_GEN decode steps; the last logits of each
 * call into out [1 + N_GEN][n_vocab]; the store's counters into *stats. */
static tm_status run_seq(tm_model *m, const tm_context_params *p, float *out,
                         tm_store_stats *stats) {
    tm_context *c;
    tm_status st = model_context_create(m, p, &c);
    if (st != TM_OK) return st;
    const int64_t V = m->cfg.n_vocab;
    int32_t toks[N_PROMPT];
    tm_rng r;
    tm_rng_seed(&r, 17);
    for (int i = 0; i < N_PROMPT; i++) toks[i] = (int32_t)(tm_rng_u64(&r) % (uint64_t)V);
    /* the prompt a batch a call, so each call is one step of each layer */
    const tm_store_stats *s = tier_store_stats(c->tier);
    for (int64_t i = 0; i < N_PROMPT && st == TM_OK; i += p->n_batch) {
        const int64_t n = N_PROMPT - i < p->n_batch ? N_PROMPT - i : p->n_batch;
        const tm_store_stats s0 = s ? *s : (tm_store_stats){0};
        st = model_decode(c, toks + i, n, TM_MOE_PHASE_PROMPT, false);
        /* a batch reads each routed expert at most once (its worklist is expert-major, an
           expert's tokens are computed together), every one not resident at least once,
           and of those resident at most TM_STORE_STAGE a layer again (evicted to keep
           reads in flight) */
        const uint64_t routed = s ? s->routed - s0.routed : 0, hits = s ? s->hits - s0.hits : 0,
                       faults = s ? s->faults - s0.faults : 0;
        if (st == TM_OK && s &&
            (faults > routed || faults < routed - hits ||
             faults > routed - hits + (uint64_t)TM_STORE_STAGE * m->cfg.n_layer))
            fail_msg("--ram-cache %lld, prompt batch at %lld: %llu reads for %llu routed experts "
                     "of which %llu were resident",
                     (long long)p->ram_cache_mib, (long long)i, (unsigned long long)faults,
                     (unsigned long long)routed, (unsigned long long)hits);
    }
    if (st == TM_OK) memcpy(out, c->logits, (size_t)V * sizeof(float));
    for (int i = 0; i < N_GEN && st == TM_OK; i++) {
        int32_t id = (int32_t)(tm_rng_u64(&r) % (uint64_t)V);
        if ((st = model_decode(c, &id, 1, TM_MOE_PHASE_DECODE, false)) == TM_OK)
            memcpy(out + (1 + i) * V, c->logits, (size_t)V * sizeof(float));
    }
    if (stats) *stats = s ? *s : (tm_store_stats){0};
    fetched_experts = copy_ns = 0;
    const tm_tier_stats *ts = tier_stats(c->tier);
    for (int i = 0; ts && i < TM_TIER_CLASS_COUNT; i++)
        fetched_experts += ts[i].fetch_experts, copy_ns += ts[i].copy_ns;
    model_context_free(c);
    return st;
}

/* Set the protection of the whole pages inside f's expert tensors. */
static void mapping_protect(const tm_gguf_file *f, int prot) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const tm_gguf_tensor *t = &f->tensors[i];
        char name[256];
        snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.data);
        if (!strstr(name, "_exps")) continue;
        const uintptr_t b = ((uintptr_t)t->data + page - 1) & ~(page - 1),
                        e = ((uintptr_t)t->data + t->n_bytes) & ~(page - 1);
        if (e > b) assert_int_equal(mprotect((void *)b, e - b, prot), 0);
    }
}

/* The model, and the logits of run_seq computed from the mapping (ref). */
typedef struct fixture {
    tm_model *m;
    size_t n; /* logits in ref and got */
    float *ref, *got;
} fixture;

static void fixture_open(fixture *f, const char *path, bool gpu) {
    assert_int_equal(model_load(path, &f->m), TM_OK);
    f->n = (size_t)(1 + N_GEN) * (size_t)f->m->cfg.n_vocab;
    f->ref = malloc(f->n * sizeof(float)), f->got = malloc(f->n * sizeof(float));
    assert_non_null(f->ref), assert_non_null(f->got);
    const tm_context_params p = params(gpu, 0);
    assert_int_equal(run_seq(f->m, &p, f->ref, NULL), TM_OK);
}

static void fixture_close(fixture *f) {
    free(f->ref), free(f->got);
    model_free(f->m);
}

static void check_same(const char *path, bool gpu) {
    fixture fx;
    fixture_open(&fx, path, gpu);
    tm_model *m = fx.m;
    const size_t n = fx.n;
    float *ref = fx.ref, *got = fx.got;
    tm_context_params p;
    const uint32_t L = m->cfg.n_layer, E = m->cfg.n_expert, K = m->cfg.n_expert_used;
    /* the expert tensors' pages of the mapping may not be read with the store: protect them */
    mapping_protect(m->file, PROT_NONE);
    /* 1 MiB: fewer slots a layer than a token's experts; 3 MiB: several
       tokens' worth; 6 MiB: about half the experts (a prompt batch's first
       chunks find every slot holding an expert it uses); ALL: every expert
       (capped) */
    const int64_t budgets[] = {1, 3, 6, ALL};
    const int n_budget = (int)(sizeof(budgets) / sizeof(budgets[0]));
    for (int b = 0; b < n_budget; b++) {
        p = params(gpu, budgets[b]);
        tm_store_stats s;
        if (run_seq(m, &p, got, &s) != TM_OK)
            fail_msg("--ram-cache %lld: %s", (long long)budgets[b], tm_error_message());
        for (size_t i = 0; i < n; i++)
            if (memcmp(&got[i], &ref[i], sizeof(float)))
                fail_msg("--ram-cache %lld (%s): logit %zu is %.9g, from the mapping %.9g",
                         (long long)budgets[b], gpu ? "--cpu-moe, mock GPU" : "CPU", i, got[i],
                         ref[i]);
        assert_true(s.faults > 0);
        assert_true(s.bytes_read > 0);
        assert_true(s.hits <= s.routed);
        /* decode steps predict the next layer's experts from this layer's input */
        assert_true(s.pred_routed > 0 && s.pred_hits <= s.pred_routed);
        assert_true(2 * s.pred_hits >= s.pred_routed); /* chance would name k/E = 1/8 */
        printf("    --ram-cache %lld: the next layer's router named %.1f%% of its experts\n",
               (long long)budgets[b], 100.0 * (double)s.pred_hits / (double)s.pred_routed);
        if (b == 0) { /* every layer evicts, every step */
            assert_true(s.max_resident < (int32_t)K);
            /* reads into empty slots: at most each layer's slots */
            assert_true(s.faults + s.prefetched - s.evictions <= (uint64_t)L * s.max_resident);
            assert_true(s.faults >= (uint64_t)(L * (N_GEN + 1)));
        }
        if (b == n_budget - 1) { /* all fit: each expert read once, nothing evicted */
            assert_int_equal(s.evictions, 0);
            assert_true(s.faults + s.prefetched <= (uint64_t)L * E);
            assert_true(s.max_resident <= (int32_t)E);
        }
    }
    mapping_protect(m->file, PROT_READ);
    fixture_close(&fx);
}

static void test_same_logits_cpu(void **state) {
    (void)state;
    check_same(model_path, false);
}

static void test_same_logits_cpu_moe_mock_gpu(void **state) {
    (void)state;
    check_same(model_path, true);
}

/* The same on the mixed-type file, CPU and --cpu-moe. */
static void test_same_logits_mixed(void **state) {
    (void)state;
    check_same(mixed_path, false);
    check_same(mixed_path, true);
}

/* GLM-4.5's router (sigmoid scores, a selection bias, groups; a dense first
 * layer) through the store: the converter-written tiny file gives the
 * mapping's logits bit for bit at the smallest budget, and the read-ahead
 * predicts with the router's own choice (moe_router_select), so it names
 * experts of the chosen groups only. */
static void test_same_logits_glm(void **state) {
    (void)state;
    const char *data = getenv("TM_TEST_DATA");
    char path[512];
    snprintf(path, sizeof(path), "%s/hf_glm4moe/tiny-f16.gguf", data ? data : "tests/data");
    fixture fx;
    fixture_open(&fx, path, false);
    tm_store_stats s;
    const tm_context_params p = params(false, 1);
    if (run_seq(fx.m, &p, fx.got, &s) != TM_OK) fail_msg("--ram-cache 1: %s", tm_error_message());
    for (size_t i = 0; i < fx.n; i++)
        if (memcmp(&fx.got[i], &fx.ref[i], sizeof(float)))
            fail_msg("glm4moe --ram-cache 1: logit %zu is %.9g, from the mapping %.9g", i,
                     fx.got[i], fx.ref[i]);
    assert_true(s.pred_routed > 0 && s.pred_hits <= s.pred_routed);
    /* this file, this prompt: 78.4% named; 62.2% by the top k of the raw logits (as before:
       experts of groups the router rules out, the bias left out) */
    assert_true(10 * s.pred_hits >= 7 * s.pred_routed);
    printf("    glm4moe --ram-cache 1: the next layer's router named %.1f%% of its experts\n",
           100.0 * (double)s.pred_hits / (double)s.pred_routed);
    fixture_close(&fx);
}

/* Prompts' experts in RAM copied to the mock GPU from the store's pinned
 * slots (TIER_PROMPT_STORE) give the logits of copying them from the
 * mapping's pinned pages, bit for bit (the same kernels, the same experts in
 * the same order, only another source of the bytes), at every budget; once
 * with the mock GPU's streams slow (MOCK_GPU_LATENCY_US), so a copy still
 * queued when the store reads the next chunk would copy the wrong expert,
 * and --profile (the copies' time is counted). */
static void test_same_logits_fetch_from_store(void **state) {
    (void)state;
    setenv("TIERMOE_FETCH_CPU_SHARE", "0", 1); /* every cold expert to the GPU, as the store */
    tm_model *m;
    assert_int_equal(model_load(model_path, &m), TM_OK);
    const size_t n = (size_t)(1 + N_GEN) * (size_t)m->cfg.n_vocab;
    float *ref = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
    assert_non_null(ref), assert_non_null(got);
    tm_context_params p = params_fetch(0);
    assert_int_equal(run_seq(m, &p, ref, NULL), TM_OK);
    assert_true(fetched_experts > 0);
    const uint64_t from_mapping = fetched_experts; /* every cold expert of each prompt step */
    printf("    the mapping: %llu experts copied\n", (unsigned long long)from_mapping);
    mapping_protect(m->file, PROT_NONE);
    const int64_t budgets[] = {1, 3, 6, ALL, 3};
    for (int b = 0; b < 5; b++) {
        const bool slow = b == 4;
        if (slow) setenv("MOCK_GPU_LATENCY_US", "300", 1);
        p = params_fetch(budgets[b]);
        p.profile = slow; /* the copies' time counted too */
        tm_store_stats s;
        const tm_status st = run_seq(m, &p, got, &s);
        unsetenv("MOCK_GPU_LATENCY_US");
        if (st != TM_OK)
            fail_msg("--ram-cache %lld: %s", (long long)budgets[b], tm_error_message());
        for (size_t i = 0; i < n; i++)
            if (memcmp(&got[i], &ref[i], sizeof(float)))
                fail_msg("--ram-cache %lld%s, experts copied from the store: logit %zu is %.9g, "
                         "copied from the mapping %.9g",
                         (long long)budgets[b], slow ? " (slow GPU)" : "", i, got[i], ref[i]);
        /* the prompt's experts went to the GPU, read once each a batch (run_seq), only the
           routed ones */
        assert_true(fetched_experts > 0 && fetched_experts <= from_mapping);
        assert_true(s.faults > 0);
        assert_true(slow == (copy_ns > 0));
        printf("    --ram-cache %lld%s: %llu experts copied from the store, %llu faulted\n",
               (long long)budgets[b], slow ? " (slow GPU)" : "",
               (unsigned long long)fetched_experts, (unsigned long long)s.faults);
    }
    /* a read that fails while a prompt's chunks are copied: retried, or the step fails
       naming the offset, never a copy of a slot the read did not fill */
    p = params_fetch(1);
    setenv("TIERMOE_STORE_FAIL_READ", "5:once", 1);
    assert_int_equal(run_seq(m, &p, got, NULL), TM_OK);
    assert_memory_equal(got, ref, n * sizeof(float));
    setenv("TIERMOE_STORE_FAIL_READ", "5", 1);
    assert_int_equal(run_seq(m, &p, got, NULL), TM_ERR_IO);
    if (!strstr(tm_error_message(), "offset"))
        fail_msg("a failed read while copying should name the offset: %s", tm_error_message());
    unsetenv("TIERMOE_STORE_FAIL_READ");
    mapping_protect(m->file, PROT_READ);
    unsetenv("TIERMOE_FETCH_CPU_SHARE");
    free(ref), free(got);
    model_free(m);
}

static void test_failed_read(void **state) {
    (void)state;
    fixture fx;
    fixture_open(&fx, model_path, false);
    const tm_context_params p = params(false, 1);
    setenv("TIERMOE_STORE_FAIL_READ", "7:once", 1); /* the retry reads it */
    assert_int_equal(run_seq(fx.m, &p, fx.got, NULL), TM_OK);
    assert_memory_equal(fx.got, fx.ref, fx.n * sizeof(float));
    setenv("TIERMOE_STORE_FAIL_READ", "7", 1); /* every try fails */
    assert_int_equal(run_seq(fx.m, &p, fx.got, NULL), TM_ERR_IO);
    const char *msg = tm_error_message();
    if (!strstr(msg, "offset") || !strstr(msg, "failed 3 times") || !strstr(msg, model_path))
        fail_msg("the message should name the file, the offset and the tries: %s", msg);
    unsetenv("TIERMOE_STORE_FAIL_READ");
    fixture_close(&fx);
}

static bool is_expert(const tm_gguf_tensor *t) {
    char name[256];
    snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.data);
    return strstr(name, "_exps") != NULL;
}

/* A copy of f with the expert tensors last in the file. */
static void copy_experts_last(const tm_gguf_file *f, const char *path) {
    tm_gguf_writer *w;
    assert_int_equal(gguf_writer_init(&w, f->version, f->alignment), TM_OK);
    char name[256];
    for (uint64_t i = 0; i < f->n_kv; i++) {
        snprintf(name, sizeof(name), "%.*s", (int)f->kv[i].key.len, f->kv[i].key.data);
        assert_int_equal(gguf_writer_set_value(w, name, &f->kv[i].value), TM_OK);
    }
    for (int pass = 0; pass < 2; pass++)
        for (uint64_t i = 0; i < f->n_tensors; i++) {
            const tm_gguf_tensor *t = &f->tensors[i];
            if (is_expert(t) != (pass == 1)) continue;
            snprintf(name, sizeof(name), "%.*s", (int)t->name.len, t->name.data);
            assert_int_equal(gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, NULL),
                             TM_OK);
        }
    assert_int_equal(gguf_writer_begin(w, path), TM_OK);
    for (int pass = 0; pass < 2; pass++)
        for (uint64_t i = 0; i < f->n_tensors; i++) {
            const tm_gguf_tensor *t = &f->tensors[i];
            if (is_expert(t) != (pass == 1)) continue;
            assert_int_equal(gguf_writer_write_data(w, t->data, (size_t)t->n_bytes), TM_OK);
        }
    assert_int_equal(gguf_writer_finish(w), TM_OK);
    gguf_writer_free(w);
}

/* The file shrinks under a running context: the reads of the experts past
 * the new end fail the step naming the offset (a copy of the model with its
 * expert tensors last, so the mapping's other weights stay in the file). */
static void test_truncated(void **state) {
    (void)state;
    char path[512];
    tmp_path(path, sizeof(path), "store_trunc.gguf");
    tm_model *m0;
    assert_int_equal(model_load(model_path, &m0), TM_OK);
    copy_experts_last(m0->file, path);
    model_free(m0);
    tm_model *m;
    assert_int_equal(model_load(path, &m), TM_OK);
    const tm_gguf_file *f = m->file;
    uint64_t first_expert = f->file_size;
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (is_expert(&f->tensors[i]) && f->tensors[i].file_offset < first_expert)
            first_expert = f->tensors[i].file_offset;
    const tm_context_params p = params(false, 1);
    tm_context *c;
    assert_int_equal(model_context_create(m, &p, &c), TM_OK);
    /* half of the experts are gone */
    assert_int_equal(truncate(path, (off_t)(first_expert + (f->file_size - first_expert) / 2)), 0);
    int32_t toks[N_PROMPT];
    for (int i = 0; i < N_PROMPT; i++) toks[i] = i * 7 % (int32_t)m->cfg.n_vocab;
    tm_status st = model_decode(c, toks, N_PROMPT, TM_MOE_PHASE_PROMPT, false);
    for (int i = 0; i < 8 && st == TM_OK; i++)
        st = model_decode(c, &toks[i], 1, TM_MOE_PHASE_DECODE, false);
    assert_int_equal(st, TM_ERR_IO);
    if (!strstr(tm_error_message(), "truncated") || !strstr(tm_error_message(), "offset"))
        fail_msg("want a message naming the truncation and the offset: %s", tm_error_message());
    model_context_free(c);
    model_free(m);
    remove(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reader),
        cmocka_unit_test(test_same_logits_cpu),
        cmocka_unit_test(test_same_logits_cpu_moe_mock_gpu),
        cmocka_unit_test(test_same_logits_mixed),
        cmocka_unit_test(test_same_logits_glm),
        cmocka_unit_test(test_same_logits_fetch_from_store),
        cmocka_unit_test(test_failed_read),
        cmocka_unit_test(test_truncated),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
