/* Quantizers of the grid i-quants: iq2_xxs iq2_xs iq2_s iq3_xxs iq3_s iq1_s iq1_m.
 *
 * Our own method, without an importance matrix: quant_iq_fit.h chooses the
 * scales and, for each group, the grid point and signs of least squared error
 * at the step the decoder uses; this file packs the result into the format's
 * bits (layouts in quant.h; the gguf package's dequantizers define them).
 * docs/quant.md lists the round-trip error each type reaches. */
#include <string.h>

#include "core/log.h"
#include "quant/quant.h"
#include "quant/quant_iq_fit.h"
#include "quant/quant_ref.h"

static void put_u32(void *p, uint32_t v) { /* the format's words are little-endian */
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    memcpy(p, b, 4);
}

static void put_u16(void *p, uint16_t v) {
    uint8_t b[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    memcpy(p, b, 2);
}

/* Fit each block of the row, then pack it with the type's layout. */
static void quantize_rows(iq_kind_id kind, const float *src, void *dst, int64_t n, size_t size,
                          void (*pack)(const iq_block_fit *f, void *block)) {
    TM_ASSERT(n % TM_QK_K == 0);
    iq_block_fit f;
    for (int64_t i = 0; i < n / TM_QK_K; i++) {
        quant_iq_fit_block(kind, src + i * TM_QK_K, &f);
        pack(&f, (uint8_t *)dst + (size_t)i * size);
    }
}

/* Per 32 values: four 7-bit sign fields (the 8th sign is the even parity) and sc << 28. */
static uint32_t signs7_word(const iq_unit *u, int sc) {
    uint32_t w = (uint32_t)sc << 28;
    for (int k = 0; k < 4; k++) w |= (uint32_t)(u[k].signs & 0x7f) << (7 * k);
    return w;
}

static void pack_iq2_xxs(const iq_block_fit *f, void *dst) {
    tm_block_iq2_xxs *b = dst;
    put_u16(&b->d, f->d);
    for (int j = 0; j < 8; j++) {
        const iq_unit *u = &f->u[4 * j];
        const uint32_t idx = (uint32_t)u[0].idx[0] | (uint32_t)u[1].idx[0] << 8 |
                             (uint32_t)u[2].idx[0] << 16 | (uint32_t)u[3].idx[0] << 24;
        put_u32(&b->qs[4 * j], idx);
        put_u32(&b->qs[4 * j + 2], signs7_word(u, f->sc[j]));
    }
}

void quant_ref_quantize_iq2_xxs(const float *src, void *dst, int64_t n) {
    quantize_rows(IQ_KIND_2XXS, src, dst, n, sizeof(tm_block_iq2_xxs), pack_iq2_xxs);
}

static void pack_iq2_xs(const iq_block_fit *f, void *dst) {
    tm_block_iq2_xs *b = dst;
    put_u16(&b->d, f->d);
    for (int g = 0; g < 32; g++)
        put_u16(&b->qs[g], (uint16_t)(f->u[g].idx[0] | (f->u[g].signs & 0x7f) << 9));
    for (int j = 0; j < 8; j++) b->scales[j] = (uint8_t)(f->sc[2 * j] | f->sc[2 * j + 1] << 4);
}

void quant_ref_quantize_iq2_xs(const float *src, void *dst, int64_t n) {
    quantize_rows(IQ_KIND_2XS, src, dst, n, sizeof(tm_block_iq2_xs), pack_iq2_xs);
}

static void pack_iq2_s(const iq_block_fit *f, void *dst) {
    tm_block_iq2_s *b = dst;
    memset(b, 0, sizeof(*b));
    put_u16(&b->d, f->d);
    for (int g = 0; g < 32; g++) {
        b->qs[g] = (uint8_t)f->u[g].idx[0];
        b->qs[32 + g] = f->u[g].signs; /* all 8 signs, no parity */
        b->qh[g / 4] |= (uint8_t)((f->u[g].idx[0] >> 8) << (2 * (g % 4)));
    }
    for (int j = 0; j < 8; j++) b->scales[j] = (uint8_t)(f->sc[2 * j] | f->sc[2 * j + 1] << 4);
}

void quant_ref_quantize_iq2_s(const float *src, void *dst, int64_t n) {
    quantize_rows(IQ_KIND_2S, src, dst, n, sizeof(tm_block_iq2_s), pack_iq2_s);
}

static void pack_iq3_xxs(const iq_block_fit *f, void *dst) {
    tm_block_iq3_xxs *b = dst;
    put_u16(&b->d, f->d);
    for (int g = 0; g < 32; g++) {
        b->qs[2 * g] = (uint8_t)f->u[g].idx[0];
        b->qs[2 * g + 1] = (uint8_t)f->u[g].idx[1];
    }
    for (int j = 0; j < 8; j++) put_u32(&b->qs[64 + 4 * j], signs7_word(&f->u[4 * j], f->sc[j]));
}

void quant_ref_quantize_iq3_xxs(const float *src, void *dst, int64_t n) {
    quantize_rows(IQ_KIND_3XXS, src, dst, n, sizeof(tm_block_iq3_xxs), pack_iq3_xxs);
}

static void pack_iq3_s(const iq_block_fit *f, void *dst) {
    tm_block_iq3_s *b = dst;
    memset(b, 0, sizeof(*b));
    put_u16(&b->d, f->d);
    for (int g = 0; g < 32; g++) {
        for (int p = 0; p < 2; p++) {
            const int q = 2 * g + p;
            b->qs[q] = (uint8_t)f->u[g].idx[p];
            b->qh[q / 8] |= (uint8_t)((f->u[g].idx[p] >> 8) << (q % 8));
        }
        b->signs[g] = f->u[g].signs;
    }
    for (int j = 0; j < 4; j++) b->scales[j] = (uint8_t)(f->sc[2 * j] | f->sc[2 * j + 1] << 4);
}

void quant_ref_quantize_iq3_s(const float *src, void *dst, int64_t n) {
    quantize_rows(IQ_KIND_3S, src, dst, n, sizeof(tm_block_iq3_s), pack_iq3_s);
}

static void pack_iq1_s(const iq_block_fit *f, void *dst) {
    tm_block_iq1_s *b = dst;
    put_u16(&b->d, f->d);
    for (int j = 0; j < 8; j++) {
        /* the 4 groups of a sub-block share its delta sign */
        uint16_t qh = (uint16_t)(f->sc[j] << 12 | f->u[4 * j].neg_delta << 15);
        for (int k = 0; k < 4; k++) {
            const iq_unit *u = &f->u[4 * j + k];
            b->qs[4 * j + k] = (uint8_t)u->idx[0];
            qh |= (uint16_t)((u->idx[0] >> 8) << (3 * k));
        }
        put_u16(&b->qh[j], qh);
    }
}

void quant_ref_quantize_iq1_s(const float *src, void *dst, int64_t n) {
    quantize_rows(IQ_KIND_1S, src, dst, n, sizeof(tm_block_iq1_s), pack_iq1_s);
}

static void pack_iq1_m(const iq_block_fit *f, void *dst) {
    tm_block_iq1_m *b = dst;
    memset(b, 0, sizeof(*b));
    for (int g = 0; g < 32; g++) {
        const iq_unit *u = &f->u[g];
        b->qs[g] = (uint8_t)u->idx[0];
        b->qh[g / 2] |= (uint8_t)(((u->idx[0] >> 8) | u->neg_delta << 3) << (4 * (g % 2)));
    }
    /* four u16: 3-bit scales of 16-value sub-blocks 4k..4k+3, and bits 4k..4k+3 of d on top */
    for (int k = 0; k < 4; k++) {
        uint16_t w = (uint16_t)(((f->d >> (4 * k)) & 0xf) << 12);
        for (int s = 0; s < 4; s++) w |= (uint16_t)(f->sc[4 * k + s] << (3 * s));
        put_u16(&b->scales[2 * k], w);
    }
}

void quant_ref_quantize_iq1_m(const float *src, void *dst, int64_t n) {
    quantize_rows(IQ_KIND_1M, src, dst, n, sizeof(tm_block_iq1_m), pack_iq1_m);
}
