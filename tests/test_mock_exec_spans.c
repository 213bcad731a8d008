/* The executor over two GPUs (MOCK_GPUS=2): layer 0 on GPU 0, layers 1.. on GPU 1,
 * each GPU holding its own weights, KV caches and activation buffers; the residual
 * crosses at the span boundary by a peer copy (the mock faults a kernel reading the
 * other device's memory, so a missing copy fails).
 *
 * The forward is the tiny model's attention blocks (norm, q/k/v as a group, attention
 * with QK norms and RoPE over a KV cache, output projection, residual add + norm),
 * without the experts (the tier runs one GPU so far), for a prompt of 12 rows
 * (tensor-core products) then decode steps (matrix-vector products, q/k/v stacked).
 * Compared with the same executor on one GPU (bit for bit: the same mock arithmetic,
 * the copy exact) and with the CPU executor in double precision (independent of the
 * mock's kernels), within 2e-3 of the largest value. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "exec/exec.h"
#include "model/model.h"
#include "model/synth.h"

#define N_LAYER  3
#define N_PROMPT 12
#define N_DEC    3
#define N_STEP   (N_PROMPT + N_DEC)

static char model_path[512];

typedef struct net {
    tm_model *m;
    tm_exec *e;
    tm_weight embd, attn_norm[N_LAYER], q[N_LAYER], k[N_LAYER], v[N_LAYER], o[N_LAYER],
        q_norm[N_LAYER], k_norm[N_LAYER], ffn_norm[N_LAYER];
    tm_attn_desc shape;
    tm_act x, h, qa, ka, va, att, out;
    float *result; /* [N_STEP][n_embd]: each token's last normed residual */
} net;

/* Tensor blk.l.what (l < 0: what alone). */
static void bind(const tm_model *m, const char *what, int l, tm_weight *w) {
    char name[96];
    if (l < 0)
        snprintf(name, sizeof(name), "%s", what);
    else
        snprintf(name, sizeof(name), "blk.%d.%s", l, what);
    const tm_gguf_tensor *t = gguf_file_find_tensor(m->file, name);
    if (!t) fail_msg("no tensor %s", name);
    if (model_weight_bind(m, name, t->n_dims, t->ne, w) != TM_OK)
        fail_msg("%s: %s", name, tm_error_message());
}

static tm_status forward(void *ud) {
    net *n = ud;
    tm_exec *e = n->e;
    tm_status st = exec_embed(e, &n->x, &n->embd);
    if (st == TM_OK) st = exec_rmsnorm(e, &n->h, &n->x, &n->attn_norm[0], n->m->cfg.rms_eps);
    for (int l = 0; l < N_LAYER && st == TM_OK; l++) {
        tm_act *ys[3] = {&n->qa, &n->ka, &n->va};
        const tm_weight *ws[3] = {&n->q[l], &n->k[l], &n->v[l]};
        tm_attn_desc a = n->shape;
        a.q_norm = &n->q_norm[l], a.k_norm = &n->k_norm[l];
        const tm_weight *next = l + 1 < N_LAYER ? &n->attn_norm[l + 1] : &n->ffn_norm[l];
        if ((st = exec_matmul_n(e, 3, ys, ws, &n->h)) ||
            (st = exec_attention(e, (uint32_t)l, &a, &n->qa, &n->ka, &n->va, &n->att)) ||
            (st = exec_matmul(e, &n->out, &n->o[l], &n->att)))
            break;
        st = exec_add_rmsnorm(e, &n->x, &n->out, &n->h, next, n->m->cfg.rms_eps);
    }
    return st == TM_OK ? exec_fetch(e, &n->h, exec_n_tok(e)) : st;
}

/* gpus GPUs (0: the CPU, in double): layer l on GPU l > 0 && gpus > 1. */
static void run(tm_model *m, int gpus, net *n) {
    memset(n, 0, sizeof(*n));
    n->m = m;
    const tm_gguf_file *f = m->file;
    const tm_model_config *c = &m->cfg;
    bind(m, "token_embd.weight", -1, &n->embd);
    for (int l = 0; l < N_LAYER; l++) {
        bind(m, "attn_norm.weight", l, &n->attn_norm[l]);
        bind(m, "attn_q.weight", l, &n->q[l]);
        bind(m, "attn_k.weight", l, &n->k[l]);
        bind(m, "attn_v.weight", l, &n->v[l]);
        bind(m, "attn_output.weight", l, &n->o[l]);
        bind(m, "attn_q_norm.weight", l, &n->q_norm[l]);
        bind(m, "attn_k_norm.weight", l, &n->k_norm[l]);
        bind(m, "ffn_norm.weight", l, &n->ffn_norm[l]);
    }
    uint8_t *tdev = calloc(f->n_tensors, 1), *tgpu = calloc(f->n_tensors, 1);
    uint8_t ldev[N_LAYER], lgpu[N_LAYER];
    for (int l = 0; l < N_LAYER; l++) {
        ldev[l] = gpus ? TM_DEV_GPU : TM_DEV_CPU, lgpu[l] = gpus > 1 && l > 0;
        const tm_weight *ws[] = {&n->attn_norm[l], &n->q[l],      &n->k[l],      &n->v[l],
                                 &n->o[l],         &n->q_norm[l], &n->k_norm[l], &n->ffn_norm[l]};
        for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++)
            tdev[ws[i]->id] = ldev[l], tgpu[ws[i]->id] = lgpu[l];
    }
    tm_exec_params p = {.file = f,
                        .tensor_dev = tdev,
                        .tensor_gpu = tgpu,
                        .layer_gpu = lgpu,
                        .n_gpus = gpus,
                        .n_batch = 16,
                        .n_ctx = 64,
                        .kv_type = TM_TYPE_F32,
                        .precise = gpus == 0};
    for (int g = 0; g < gpus; g++)
        if (cuda_device_open(g, &p.gpus[g]) != TM_OK) fail_msg("GPU %d: %s", g, tm_error_message());
    assert_int_equal(cpu_pool_create(2, &p.pool), TM_OK);
    if (exec_create(&p, &n->e) != TM_OK) fail_msg("exec_create: %s", tm_error_message());
    tm_exec *e = n->e;
    const int64_t E = c->n_embd, Q = (int64_t)c->n_head * c->head_dim,
                  KV = (int64_t)c->n_head_kv * c->head_dim;
    n->shape = (tm_attn_desc){.n_head = c->n_head,
                              .n_head_kv = c->n_head_kv,
                              .head_dim = c->head_dim,
                              .scale = 1.0f / sqrtf((float)c->head_dim),
                              .rms_eps = c->rms_eps,
                              .rope_base = c->rope_base};
    tm_status st;
    if ((st = exec_act_create(e, &n->x, "x", E, false, 0)) ||
        (st = exec_act_create(e, &n->h, "h", E, false, 0)) ||
        (st = exec_act_create(e, &n->qa, "q", Q, false, 0)) ||
        (st = exec_act_create(e, &n->ka, "k", KV, false, 0)) ||
        (st = exec_act_create(e, &n->va, "v", KV, false, 0)) ||
        (st = exec_act_create(e, &n->att, "att", Q, false, 0)) ||
        (st = exec_act_create(e, &n->out, "out", E, false, 0)))
        fail_msg("acts: %s", tm_error_message());
    for (int l = 0; l < N_LAYER; l++) {
        const tm_weight *g[3] = {&n->q[l], &n->k[l], &n->v[l]};
        assert_int_equal(exec_weight_group(e, 3, g), TM_OK);
    }
    if ((st = exec_attention_setup(e, N_LAYER, ldev, &n->shape, NULL)) || (st = exec_finalize(e)))
        fail_msg("setup: %s", tm_error_message());
    n->result = malloc((size_t)(N_STEP * E) * sizeof(float));
    int32_t toks[N_STEP];
    for (int t = 0; t < N_STEP; t++) toks[t] = (int32_t)((t * 389 + 17) % c->n_vocab);
    if ((st = exec_step(e, toks, N_PROMPT, 0, TM_MOE_PHASE_PROMPT, forward, n)))
        fail_msg("%d GPUs, prompt: %s", gpus, tm_error_message());
    memcpy(n->result, n->h.host, (size_t)(N_PROMPT * E) * sizeof(float));
    for (int t = N_PROMPT; t < N_STEP; t++) {
        if ((st = exec_step(e, &toks[t], 1, t, TM_MOE_PHASE_DECODE, forward, n)))
            fail_msg("%d GPUs, decode %d: %s", gpus, t, tm_error_message());
        memcpy(n->result + t * E, n->h.host, (size_t)E * sizeof(float));
    }
    exec_free(e);
    cpu_pool_free(p.pool);
    free(tdev), free(tgpu);
}

static void test_two_spans(void **state) {
    (void)state;
    tm_model *m;
    assert_int_equal(model_load(model_path, &m), TM_OK);
    const int64_t n = N_STEP * (int64_t)m->cfg.n_embd;
    net cpu, one, two;
    run(m, 0, &cpu);
    run(m, 1, &one);
    run(m, 2, &two);
    double most = 0, err = 0;
    for (int64_t i = 0; i < n; i++) {
        if (two.result[i] != one.result[i])
            fail_msg("value %lld (token %lld): %g on two GPUs, %g on one", (long long)i,
                     (long long)(i / m->cfg.n_embd), (double)two.result[i], (double)one.result[i]);
        most = fmax(most, fabs(cpu.result[i]));
        err = fmax(err, fabs((double)two.result[i] - cpu.result[i]));
    }
    printf("two GPUs against the CPU in double: largest difference %.3g of values up to %.3g\n",
           err, most);
    assert_true(most > 0 && err <= 2e-3 * most);
    free(cpu.result), free(one.result), free(two.result);
    model_free(m);
}

int main(void) {
    const char *tmp = getenv("TM_TEST_TMP");
    snprintf(model_path, sizeof(model_path), "%s/mock_exec_spans.gguf", tmp ? tmp : ".");
    tm_synth_config sc;
    if (synth_config_preset(&sc, "tiny") != TM_OK || synth_model_write(&sc, model_path) != TM_OK) {
        fprintf(stderr, "mkmodel: %s\n", tm_error_message());
        return 1;
    }
    setenv("MOCK_GPUS", "2", 1);
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_two_spans)};
    const int rc = cmocka_run_group_tests(tests, NULL, NULL);
    remove(model_path);
    return rc;
}
