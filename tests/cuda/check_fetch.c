/* cuda_moe_fetch_ahead (src/cuda/moe_fetch.cu): the experts a decode step
 * copies ahead, chosen on the device, into a buffer or a cache's slots, against
 * host references; and the copy rate at 30b-a3b's expert size. */
#ifdef TM_HAVE_CUDA /* without CUDA nothing calls it: -O0 keeps it, unlinkable */
#include "cuda_check.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* cuda_moe_fetch_ahead against a host reference: the experts chosen (cold
 * items' weights summed in item order, the largest first, ties to the lower
 * id), the map and list, and the copied bytes (from mapped host memory, as the
 * decode step reads the pinned file). */
void check_fetch_ahead(void **state) {
    (void)state;
    NEED_DEVICE();
    tm_rng r;
    tm_rng_seed(&r, 0xfe7c);
    const tm_cuda_stream s = cuda_device_stream(g_dev);
    static const struct {
        int32_t E, K, n_slots;
        int64_t T;
    } cases[] = {{8, 2, 1, 1}, {128, 8, 2, 1}, {128, 8, 4, 8}, {512, 32, 16, 8}, {60, 4, 3, 300}};
    const int64_t n_embd = 256, n_ff = 96; /* q8_0 rows: 34 bytes a block */
    const size_t row_e = (size_t)(n_embd / 32) * 34, row_f = (size_t)(n_ff / 32) * 34;
    const size_t g_bytes = (size_t)n_ff * row_e, d_bytes = (size_t)n_embd * row_f;
    for (size_t ci = 0; ci < sizeof(cases) / sizeof(cases[0]); ci++) {
        const int32_t E = cases[ci].E, K = cases[ci].K, n = cases[ci].n_slots;
        const int64_t T = cases[ci].T, N = T * K;
        /* strides rounded to 16 bytes, as a GGUF's tensors are aligned */
        const size_t gs = (g_bytes + 15) & ~(size_t)15, ds = (d_bytes + 15) & ~(size_t)15;
        void *host, *hdev;
        const size_t all = (size_t)E * (2 * gs + ds);
        CHECK(cuda_host_alloc_mapped(all, &host, &hdev));
        for (size_t i = 0; i < all; i++) ((uint8_t *)host)[i] = (uint8_t)tm_rng_u64(&r);
        const tm_cuda_moe_params src = {
            .n_embd = n_embd,
            .n_ff = n_ff,
            .n_slots = E,
            .gate = {hdev, TM_TYPE_Q8_0, gs, row_e},
            .up = {(uint8_t *)hdev + (size_t)E * gs, TM_TYPE_Q8_0, gs, row_e},
            .down = {(uint8_t *)hdev + (size_t)E * 2 * gs, TM_TYPE_Q8_0, ds, row_f}};
        cuda_pool_reset(g_pool);
        uint8_t *buf = dev_alloc((size_t)n * (2 * gs + ds));
        CHECK(cuda_fill_bytes(g_dev, buf, 0, (size_t)n * (2 * gs + ds)));
        tm_cuda_moe_params dst = src;
        dst.n_slots = n, dst.gate.data = buf, dst.up.data = buf + (size_t)n * gs;
        dst.down.data = buf + (size_t)n * 2 * gs;
        /* items: a third hot (slot >= 0), the rest cold; some experts repeat, and two
           experts tie exactly */
        tm_cuda_moe_item *it = xmalloc((size_t)N * sizeof(*it));
        for (int64_t i = 0; i < N; i++) {
            const int32_t e = (int32_t)(tm_rng_u64(&r) % (uint64_t)(E < 24 ? E : 24));
            const float w = (float)(tm_rng_u64(&r) % 1000) / 997.0f;
            it[i] = (tm_cuda_moe_item){tm_rng_u64(&r) % 3 ? -1 : e, (int32_t)(i / K), w, e};
        }
        if (N >= 4 && E > 40) {
            it[0] = (tm_cuda_moe_item){-1, 0, 0.75f, 40};
            it[1] = (tm_cuda_moe_item){-1, 0, 0.75f, 30};
        }
        int32_t *map_d = dev_alloc((size_t)E * 4), *list_d = dev_alloc((size_t)n * 8);
        const tm_cuda_moe_item *it_d = dev_upload(it, (size_t)N * sizeof(*it));
        CHECK(cuda_moe_fetch_ahead(&src, &dst, it_d, N, E, n, map_d, list_d, NULL, s));
        CHECK(cuda_device_sync(g_dev));
        /* the reference */
        float *sum = xmalloc((size_t)E * 4);
        bool *seen = xmalloc((size_t)E);
        int32_t *want_map = xmalloc((size_t)E * 4), *want_list = xmalloc((size_t)n * 4);
        for (int32_t e = 0; e < E; e++) sum[e] = 0, seen[e] = false, want_map[e] = -1;
        for (int64_t i = 0; i < N; i++)
            if (it[i].slot < 0) sum[it[i].expert] += it[i].weight, seen[it[i].expert] = true;
        for (int32_t k = 0; k < n; k++) {
            int32_t b = -1;
            for (int32_t e = 0; e < E; e++)
                if (seen[e] && (b < 0 || sum[e] > sum[b])) b = e;
            want_list[k] = b;
            if (b >= 0) seen[b] = false, want_map[b] = k;
        }
        int32_t *map = xmalloc((size_t)E * 4), *list = xmalloc((size_t)n * 8);
        CHECK(cuda_copy_to_host(g_dev, map, map_d, (size_t)E * 4));
        CHECK(cuda_copy_to_host(g_dev, list, list_d, (size_t)n * 8));
        for (int32_t k = 0; k < n; k++)
            if (list[2 * k] != want_list[k] || list[2 * k + 1] != (want_list[k] < 0 ? -1 : k))
                fail_msg("fetch ahead E %d T %lld: pair %d is {%d, %d}, want expert %d", E,
                         (long long)T, k, list[2 * k], list[2 * k + 1], want_list[k]);
        for (int32_t e = 0; e < E; e++)
            if (map[e] != want_map[e])
                fail_msg("fetch ahead E %d T %lld: map[%d] = %d, want %d", E, (long long)T, e,
                         map[e], want_map[e]);
        uint8_t *got = xmalloc((size_t)n * (2 * gs + ds));
        CHECK(cuda_copy_to_host(g_dev, got, buf, (size_t)n * (2 * gs + ds)));
        int copied = 0;
        for (int32_t k = 0; k < n; k++) {
            const uint8_t *zero = NULL;
            const size_t off[3] = {0, (size_t)n * gs, (size_t)n * 2 * gs}, stride[3] = {gs, gs, ds},
                         bytes[3] = {g_bytes, g_bytes, d_bytes};
            const uint8_t *from[3] = {host, (uint8_t *)host + (size_t)E * gs,
                                      (uint8_t *)host + (size_t)E * 2 * gs};
            for (int m = 0; m < 3; m++) {
                const uint8_t *g = got + off[m] + (size_t)k * stride[m];
                if (want_list[k] < 0) { /* an empty slot is left alone */
                    for (size_t i = 0; i < bytes[m] && !zero; i++)
                        if (g[i]) zero = g + i;
                    if (zero) fail_msg("fetch ahead: empty slot %d was written", k);
                    continue;
                }
                if (memcmp(g, from[m] + (size_t)want_list[k] * stride[m], bytes[m]))
                    fail_msg("fetch ahead E %d: slot %d matrix %d differs from expert %d", E, k, m,
                             want_list[k]);
            }
            copied += want_list[k] >= 0;
        }
        printf("fetch ahead: E %d, %lld items, %d of %d slots filled: ok\n", E, (long long)N,
               copied, n);
        free(it), free(sum), free(seen), free(want_map), free(want_list), free(map), free(list);
        free(got);
        cuda_host_free(host);
    }
    /* into a cache: the chosen experts replace the oldest slots the items do not use */
    {
        const int32_t E = 128, NS = 24, n = 4;
        const int64_t T = 3, K = 8, N = T * K;
        const size_t gs = 1024, ds = 1024; /* small f32 slices: the choice is what is checked */
        void *host, *hdev;
        CHECK(cuda_host_alloc_mapped((size_t)E * (2 * gs + ds), &host, &hdev));
        for (size_t i = 0; i < (size_t)E * (2 * gs + ds); i++)
            ((uint8_t *)host)[i] = (uint8_t)(i * 7 + 3);
        const tm_cuda_moe_params src = {
            .n_embd = 16,
            .n_ff = 16,
            .n_slots = E,
            .gate = {hdev, TM_TYPE_F32, gs, 64},
            .up = {(uint8_t *)hdev + (size_t)E * gs, TM_TYPE_F32, gs, 64},
            .down = {(uint8_t *)hdev + (size_t)E * 2 * gs, TM_TYPE_F32, ds, 64}};
        cuda_pool_reset(g_pool);
        uint8_t *cache = dev_alloc((size_t)NS * (2 * gs + ds));
        tm_cuda_moe_params dst = src;
        dst.n_slots = NS, dst.gate.data = cache, dst.up.data = cache + (size_t)NS * gs;
        dst.down.data = cache + (size_t)NS * 2 * gs;
        int32_t slot_map[128], expert_in[24];
        uint32_t last_use[24], seq = 1000;
        for (int32_t e = 0; e < E; e++) slot_map[e] = -1;
        for (int32_t sl = 0; sl < NS; sl++) { /* experts 0, 5, 10, ...; two slots empty */
            expert_in[sl] = sl == 7 || sl == 19 ? -1 : sl * 5;
            if (expert_in[sl] >= 0) slot_map[expert_in[sl]] = sl;
            last_use[sl] = 900 + (uint32_t)(tm_rng_u64(&r) % 90);
        }
        last_use[3] = last_use[4] = 850; /* a tie: the lower slot first */
        tm_cuda_moe_item it[24];
        for (int64_t i = 0; i < N; i++) {
            const int32_t e = (int32_t)(tm_rng_u64(&r) % 40);
            it[i] = (tm_cuda_moe_item){slot_map[e], (int32_t)(i / K), 0.1f + (float)(i % 7), e};
        }
        int32_t *map_dv = dev_upload(slot_map, sizeof(slot_map));
        int32_t *in_dv = dev_upload(expert_in, sizeof(expert_in));
        uint32_t *use_dv = dev_upload(last_use, sizeof(last_use)), *seq_dv = dev_upload(&seq, 4);
        int32_t *list_d = dev_alloc((size_t)n * 8);
        const tm_cuda_moe_item *it_d = dev_upload(it, sizeof(it));
        const tm_cuda_fetch_cache fc = {map_dv, in_dv, use_dv, NS, seq_dv};
        CHECK(cuda_moe_fetch_ahead(&src, &dst, it_d, N, E, n, NULL, list_d, &fc, s));
        CHECK(cuda_device_sync(g_dev));
        /* the reference */
        float sum[128] = {0};
        bool seen[128] = {false}, taken[24] = {false};
        for (int64_t i = 0; i < N; i++) {
            if (it[i].slot < 0)
                sum[it[i].expert] += it[i].weight, seen[it[i].expert] = true;
            else
                taken[it[i].slot] = true, last_use[it[i].slot] = seq;
        }
        int32_t want[8];
        for (int k = 0; k < n; k++) {
            int32_t b = -1, v = -1;
            for (int32_t e = 0; e < E; e++)
                if (seen[e] && (b < 0 || sum[e] > sum[b])) b = e;
            double oldest = -1;
            for (int32_t sl = 0; b >= 0 && sl < NS; sl++) {
                const double age = taken[sl]           ? -2
                                   : expert_in[sl] < 0 ? 1e30
                                                       : (double)(seq - last_use[sl]);
                if (age > oldest) oldest = age, v = sl;
            }
            want[2 * k] = b, want[2 * k + 1] = v;
            if (b < 0) continue;
            seen[b] = false, taken[v] = true;
            if (expert_in[v] >= 0) slot_map[expert_in[v]] = -1;
            slot_map[b] = v, expert_in[v] = b, last_use[v] = seq;
        }
        int32_t got_list[8], got_map[128], got_in[24];
        uint32_t got_use[24];
        CHECK(cuda_copy_to_host(g_dev, got_list, list_d, sizeof(got_list)));
        CHECK(cuda_copy_to_host(g_dev, got_map, map_dv, sizeof(got_map)));
        CHECK(cuda_copy_to_host(g_dev, got_in, in_dv, sizeof(got_in)));
        CHECK(cuda_copy_to_host(g_dev, got_use, use_dv, sizeof(got_use)));
        if (memcmp(got_list, want, sizeof(want)) || memcmp(got_map, slot_map, sizeof(got_map)) ||
            memcmp(got_in, expert_in, sizeof(got_in)) || memcmp(got_use, last_use, sizeof(got_use)))
            fail_msg("fetch ahead into a cache: list {%d %d, %d %d, ...}, want {%d %d, %d %d, ...}",
                     got_list[0], got_list[1], got_list[2], got_list[3], want[0], want[1], want[2],
                     want[3]);
        uint8_t *got = xmalloc((size_t)NS * (2 * gs + ds));
        CHECK(cuda_copy_to_host(g_dev, got, cache, (size_t)NS * (2 * gs + ds)));
        for (int k = 0; k < n; k++) {
            if (want[2 * k] < 0) continue;
            const int32_t e = want[2 * k], sl = want[2 * k + 1];
            if (memcmp(got + (size_t)sl * gs, (uint8_t *)host + (size_t)e * gs, gs) ||
                memcmp(got + (size_t)NS * gs + (size_t)sl * gs,
                       (uint8_t *)host + (size_t)E * gs + (size_t)e * gs, gs) ||
                memcmp(got + (size_t)NS * 2 * gs + (size_t)sl * ds,
                       (uint8_t *)host + (size_t)E * 2 * gs + (size_t)e * ds, ds))
                fail_msg("fetch ahead into a cache: slot %d does not hold expert %d", sl, e);
        }
        printf("fetch ahead into a cache: experts %d %d %d %d into slots %d %d %d %d: ok\n",
               want[0], want[2], want[4], want[6], want[1], want[3], want[5], want[7]);
        free(got);
        cuda_host_free(host);
    }
    /* the copy rate at 30b-a3b's expert size (q4_K gate and up, q6_K down: ~2.5 MiB),
       1..4 experts a launch from mapped host memory */
    const size_t big = 884736, bigd = 1290240;
    void *host, *hdev;
    CHECK(cuda_host_alloc_mapped(8 * (2 * big + bigd), &host, &hdev));
    memset(host, 1, 8 * (2 * big + bigd));
    const tm_cuda_moe_params src = {
        .n_embd = 2048,
        .n_ff = 768,
        .n_slots = 8,
        .gate = {hdev, TM_TYPE_Q8_0, big, big / 768},
        .up = {(uint8_t *)hdev + 8 * big, TM_TYPE_Q8_0, big, big / 768},
        .down = {(uint8_t *)hdev + 16 * big, TM_TYPE_Q8_0, bigd, bigd / 2048}};
    cuda_pool_reset(g_pool);
    uint8_t *buf = dev_alloc(4 * (2 * big + bigd));
    tm_cuda_moe_params dst = src;
    dst.n_slots = 4, dst.gate.data = buf, dst.up.data = buf + 4 * big;
    dst.down.data = buf + 8 * big;
    tm_cuda_moe_item it[8];
    for (int i = 0; i < 8; i++) it[i] = (tm_cuda_moe_item){-1, 0, 1.0f - 0.1f * (float)i, i};
    const tm_cuda_moe_item *it_d = dev_upload(it, sizeof(it));
    int32_t *map_d = dev_alloc(8 * 4), *list_d = dev_alloc(4 * 8);
    tm_cuda_timer *tm;
    CHECK(cuda_timer_create(g_dev, &tm));
    for (int n = 1; n <= 4; n++) {
        float ms = 0, best = 1e9f;
        for (int rep = 0; rep < 5; rep++) {
            CHECK(cuda_timer_start(tm));
            CHECK(cuda_moe_fetch_ahead(&src, &dst, it_d, 8, 8, n, map_d, list_d, NULL, s));
            CHECK(cuda_timer_stop(tm, &ms));
            best = ms < best ? ms : best;
        }
        printf(
            "fetch ahead: %d experts of %.2f MiB from mapped host memory in %.1f us: %.1f GB/s\n",
            n, (2 * big + bigd) / 1048576.0, best * 1e3, n * (2 * big + bigd) / (best * 1e6));
    }
    cuda_timer_free(tm);
    cuda_host_free(host);
}
#endif /* TM_HAVE_CUDA */
