/* The MoE router of every family (src/moe/router.c: softmax, sigmoid or
 * softmax over the top k; a selection bias; group-limited top-k; renormalised
 * or not; a scaling factor) and the GPU's (cuda_router_select, here the host
 * mock of router.cu), each against a transcription in double of the HF
 * transformers routers (modeling_deepseek_v3.py / modeling_glm4_moe.py's
 * get_topk_indices and route_tokens_to_experts; Mixtral's and Qwen3-MoE's
 * softmax top-k; gpt-oss's softmax over the k; Gemma 4's per_expert_scale,
 * modeling_gemma4.py's Gemma4TextRouter), written here again and
 * sharing nothing with either:
 *   s = softmax(l) | sigmoid(l) | l;  sel = s + bias
 *   groups: score = sum of a group's two largest sel, the topk_group best
 *           kept (stable: the lower group on a tie), the others' sel = -inf
 *   ids = the k largest sel (stable: the lower id on a tie)
 *   w = s[ids] (gpt-oss: softmax over the k); w / sum(w) when renormalised; x scale;
 *       x per_expert_scale[ids] (Gemma 4) when given
 * Every option and their combinations, 8..256 experts, 1..8 groups, exact ties
 * (equal logits, equal groups: both sides must take the lower id or group) and
 * random logits. ids must be the transcription's, except a near tie (a gap
 * below float rounding, counted and bounded); weights within float rounding.
 * Also: the argument checks of both (moe_router_check, the launcher's). */
#include "cuda/cuda_args.h"
#include "mock/mock_gpu_util.h"
#include "moe/moe.h"

#define MAX_E 256
#define MAX_K 8

typedef struct rcase {
    tm_moe_gating gating;
    uint32_t E, K, groups, groups_used;
    bool norm, bias;
    float scale;
    bool expert_scale; /* a factor an expert (Gemma 4's per_expert_scale) */
} rcase;

/* The transcription: ids [K] and weights [K] of one token; sel_gap: the
 * smallest gap between a chosen and an unchosen selectable score, and between
 * a kept and a dropped group (what a float implementation may order otherwise). */
static void ref_route(const rcase *c, const float *l, const float *bias, const float *escale,
                      int32_t *ids, double *w, double *sel_gap) {
    const int E = (int)c->E, K = (int)c->K;
    double s[MAX_E], sel[MAX_E];
    if (c->gating == TM_MOE_GATING_SOFTMAX) {
        double mx = -INFINITY, sum = 0;
        for (int e = 0; e < E; e++) mx = fmax(mx, l[e]);
        for (int e = 0; e < E; e++) sum += s[e] = exp((double)l[e] - mx);
        for (int e = 0; e < E; e++) s[e] /= sum;
    } else {
        for (int e = 0; e < E; e++)
            s[e] = c->gating == TM_MOE_GATING_SIGMOID ? 1 / (1 + exp(-(double)l[e])) : l[e];
    }
    for (int e = 0; e < E; e++) sel[e] = s[e] + (bias ? bias[e] : 0);
    *sel_gap = INFINITY;
    if (c->groups > 1) {
        const int G = (int)c->groups, per = E / G;
        double gs[MAX_E];
        int order[MAX_E];
        for (int g = 0; g < G; g++) {
            double a = -INFINITY, b = -INFINITY;
            for (int i = 0; i < per; i++) {
                const double v = sel[g * per + i];
                if (v > a)
                    b = a, a = v;
                else if (v > b)
                    b = v;
            }
            gs[g] = a + b;
            order[g] = g;
        }
        for (int i = 1; i < G; i++) /* stable sort, descending */
            for (int j = i; j > 0 && gs[order[j]] > gs[order[j - 1]]; j--) {
                const int x = order[j];
                order[j] = order[j - 1], order[j - 1] = x;
            }
        const double gap = gs[order[c->groups_used - 1]] - gs[order[c->groups_used]];
        if (gap > 0) *sel_gap = gap; /* 0: an exact tie, decided by the group's index */
        for (int r = (int)c->groups_used; r < G; r++)
            for (int i = 0; i < per; i++) sel[order[r] * per + i] = -INFINITY;
    }
    int order[MAX_E];
    for (int e = 0; e < E; e++) order[e] = e;
    for (int i = 1; i < E; i++)
        for (int j = i; j > 0 && sel[order[j]] > sel[order[j - 1]]; j--) {
            const int x = order[j];
            order[j] = order[j - 1], order[j - 1] = x;
        }
    if (K < E && isfinite(sel[order[K]]) && sel[order[K - 1]] > sel[order[K]])
        *sel_gap = fmin(*sel_gap, sel[order[K - 1]] - sel[order[K]]);
    double sum = 0, mx = -INFINITY;
    for (int j = 0; j < K; j++) ids[j] = order[j], mx = fmax(mx, s[order[j]]);
    for (int j = 0; j < K; j++) {
        w[j] = c->gating == TM_MOE_GATING_SOFTMAX_TOPK ? exp(s[ids[j]] - mx) : s[ids[j]];
        sum += w[j];
    }
    for (int j = 0; j < K; j++) {
        if (c->gating == TM_MOE_GATING_SOFTMAX_TOPK || c->norm) w[j] /= sum;
        w[j] *= c->scale;
        if (escale) w[j] *= escale[ids[j]]; /* top_k_weights * per_expert_scale[top_k_index] */
    }
}

typedef enum side { SIDE_CPU, SIDE_GPU } side;

/* T tokens of case c on one side; returns the near ties. */
static int run_case(gpu *g, const rcase *c, side sd, int64_t T) {
    const int E = (int)c->E, K = (int)c->K;
    float *l = malloc((size_t)T * E * sizeof(float)), bias[MAX_E], escale[MAX_E], w[MAX_E * MAX_K];
    int32_t ids[MAX_E * MAX_K];
    fill(l, T * E, c->gating == TM_MOE_GATING_SIGMOID ? 1.5f : 2.0f);
    for (int e = 0; e < E; e++) bias[e] = 0.1f * tm_rng_normal(&rng);
    for (int e = 0; e < E; e++) escale[e] = 1.0f + 0.5f * tm_rng_normal(&rng);
    const int per = c->groups > 1 ? E / (int)c->groups : E;
    for (int64_t t = 0; t < T; t++) {
        float *lt = l + t * E;
        if (t % 4 == 1) /* exact ties: the same logit three times */
            lt[E - 1] = lt[E / 2] = lt[0] = 3.0f;
        if (t % 4 == 2 && c->groups > 1) /* every group the same: the lower groups win */
            for (int e = per; e < E; e++) lt[e] = lt[e % per];
        if (t % 4 == 3) /* every logit equal */
            for (int e = 0; e < E; e++) lt[e] = 0.5f;
    }
    if (c->groups > 1) /* equal groups only where their biases are equal, too */
        for (int e = per; e < E; e++) bias[e] = bias[e % per];
    const tm_moe_router_params p = {.gating = c->gating,
                                    .n_expert = c->E,
                                    .n_used = c->K,
                                    .norm_topk = c->norm,
                                    .scale = c->scale,
                                    .n_group = c->groups,
                                    .n_group_used = c->groups_used,
                                    .sel_bias = c->bias ? bias : NULL,
                                    .expert_scale = c->expert_scale ? escale : NULL};
    assert_int_equal(moe_router_check(&p, "case"), TM_OK);
    if (sd == SIDE_CPU) {
        moe_router_select(NULL, &p, l, T, ids, w);
    } else {
        const tm_cuda_router_params gp = {
            .gating = (tm_cuda_gating)c->gating,
            .n_expert = (int32_t)c->E,
            .n_used = (int32_t)c->K,
            .norm_topk = c->norm,
            .scale = c->scale,
            .sel_bias = c->bias ? upload(g, bias, (size_t)E * 4) : NULL,
            .n_group = (int32_t)c->groups,
            .n_group_used = (int32_t)c->groups_used,
            .expert_scale = c->expert_scale ? upload(g, escale, (size_t)E * 4) : NULL};
        const float *ld = upload(g, l, (size_t)(T * E) * 4);
        int32_t *idd = dalloc(g, (size_t)(T * K) * 4);
        float *wd = dalloc(g, (size_t)(T * K) * 4);
        assert_int_equal(cuda_router_select(&gp, ld, T, idd, wd, NULL, g->s), TM_OK);
        assert_int_equal(cuda_stream_sync(g->s), TM_OK);
        download(g, ids, idd, (size_t)(T * K) * 4);
        download(g, w, wd, (size_t)(T * K) * 4);
    }
    int near = 0;
    for (int64_t t = 0; t < T; t++) {
        int32_t want[MAX_K];
        double ww[MAX_K], gap;
        ref_route(c, l + t * E, c->bias ? bias : NULL, c->expert_scale ? escale : NULL, want, ww,
                  &gap);
        bool same = true;
        for (int j = 0; j < K; j++) same &= ids[t * K + j] == want[j];
        if (!same) {
            /* float scores may order two within their rounding otherwise */
            if (!(gap < 1e-6))
                fail_msg("%s: gating %d E %u k %u groups %u/%u bias %d token %lld: ids %d %d .. "
                         "want %d %d .. (gap %.3g)",
                         sd == SIDE_CPU ? "CPU" : "GPU", c->gating, c->E, c->K, c->groups,
                         c->groups_used, c->bias, (long long)t, ids[t * K], ids[t * K + K - 1],
                         want[0], want[K - 1], gap);
            near++;
            continue;
        }
        for (int j = 0; j < K; j++)
            if (!(fabs(w[t * K + j] - ww[j]) <= 2e-6 * fabs(ww[j]) + 1e-7))
                fail_msg("%s: gating %d E %u k %u token %lld weight %d: %.9g, want %.9g",
                         sd == SIDE_CPU ? "CPU" : "GPU", c->gating, c->E, c->K, (long long)t, j,
                         w[t * K + j], ww[j]);
    }
    free(l);
    return near;
}

static void run_all(side sd) {
    gpu g = {0};
    if (sd == SIDE_GPU) g = gpu_open(0);
    static const tm_moe_gating gatings[] = {TM_MOE_GATING_SOFTMAX, TM_MOE_GATING_SIGMOID,
                                            TM_MOE_GATING_SOFTMAX_TOPK};
    static const uint32_t Es[] = {8, 16, 64, 256}, Ks[] = {1, 2, 6, 8};
    static const uint32_t groups[][2] = {{0, 0}, {1, 1}, {4, 2}, {8, 3}, {2, 2}};
    int n = 0, near = 0, tokens = 0;
    for (size_t gi = 0; gi < 3; gi++)
        for (size_t ei = 0; ei < 4; ei++)
            for (size_t ki = 0; ki < 4; ki++)
                for (size_t gr = 0; gr < 5; gr++)
                    for (int opt = 0; opt < 8; opt++) {
                        const rcase c = {
                            gatings[gi],   Es[ei],  Ks[ki],  groups[gr][0],
                            groups[gr][1], opt & 1, opt & 2, (opt & 3) == 3 ? 2.5f : 1.0f,
                            opt & 4};
                        if (c.K > c.E || (c.groups > 1 && (c.E / c.groups < 2 ||
                                                           c.K > c.groups_used * (c.E / c.groups))))
                            continue;
                        if (sd == SIDE_GPU) cuda_pool_reset(g.pool);
                        near += run_case(&g, &c, sd, 24);
                        n++, tokens += 24;
                    }
    /* random logits rarely come within float rounding of each other */
    if (near > tokens / 1000 + 2)
        fail_msg("%d near ties of %d tokens: more than rounding explains", near, tokens);
    printf("  %s router: %d cases, %d tokens, %d near ties\n", sd == SIDE_CPU ? "CPU" : "GPU", n,
           tokens, near);
    if (sd == SIDE_GPU) gpu_close(&g);
}

static void test_router_cpu(void **state) {
    (void)state;
    run_all(SIDE_CPU);
}

static void test_router_gpu(void **state) {
    (void)state;
    run_all(SIDE_GPU);
}

/* Bad parameters: a message naming the counts, never a crash. */
static void test_router_check(void **state) {
    (void)state;
    tm_moe_router_params p = {.gating = TM_MOE_GATING_SIGMOID,
                              .n_expert = 8,
                              .n_used = 2,
                              .n_group = 3,
                              .n_group_used = 2};
    assert_int_equal(moe_router_check(&p, "x.gguf"), TM_ERR_FORMAT);
    assert_non_null(strstr(tm_error_message(), "8 experts in 3 groups"));
    p.n_group = 8, p.n_group_used = 1; /* groups of one */
    assert_int_equal(moe_router_check(&p, "x.gguf"), TM_ERR_FORMAT);
    p.n_group = 4, p.n_group_used = 5;
    assert_int_equal(moe_router_check(&p, "x.gguf"), TM_ERR_FORMAT);
    assert_non_null(strstr(tm_error_message(), "5 of 4 groups"));
    p.n_group_used = 1, p.n_used = 3; /* one group of 2 for 3 experts */
    assert_int_equal(moe_router_check(&p, "x.gguf"), TM_ERR_FORMAT);
    p.n_used = 2;
    assert_int_equal(moe_router_check(&p, "x.gguf"), TM_OK);
    p.n_used = 9;
    assert_int_equal(moe_router_check(&p, "x.gguf"), TM_ERR_FORMAT);
    tm_error_clear();

    gpu g = gpu_open(0);
    float *l = dalloc(&g, 64 * 4), *w = dalloc(&g, 64 * 4);
    int32_t *ids = dalloc(&g, 64 * 4);
    tm_cuda_router_params gp = {.gating = TM_CUDA_GATING_SIGMOID,
                                .n_expert = 8,
                                .n_used = 2,
                                .scale = 1,
                                .n_group = 3,
                                .n_group_used = 1};
    assert_int_equal(cuda_router_select(&gp, l, 1, ids, w, NULL, g.s), TM_ERR_ARG);
    assert_non_null(strstr(tm_error_message(), "in 3 groups"));
    gp.n_group = 4, gp.n_group_used = 0;
    assert_int_equal(cuda_router_select(&gp, l, 1, ids, w, NULL, g.s), TM_ERR_ARG);
    gp.n_group_used = 1, gp.n_used = 3;
    assert_int_equal(cuda_router_select(&gp, l, 1, ids, w, NULL, g.s), TM_ERR_ARG);
    gp.n_used = 2;
    assert_int_equal(cuda_router_select(&gp, l, 1, ids, w, NULL, g.s), TM_OK);
    assert_int_equal(cuda_stream_sync(g.s), TM_OK);
    tm_error_clear();
    gpu_close(&g);
}

int main(void) {
    mock_rng_seed();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_router_cpu),
        cmocka_unit_test(test_router_gpu),
        cmocka_unit_test(test_router_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
