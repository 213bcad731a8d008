/* Pieces shared by the GGUF reader and writer (not part of the public API):
 * the name hash, checked arithmetic and the tensor shape rules, so both
 * sides accept exactly the same tensors. */
#ifndef TM_GGUF_GGUF_INTERNAL_H
#define TM_GGUF_GGUF_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "gguf/gguf.h"

/* The reader and writer store scalars as the file's little-endian bytes. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tiermoe's GGUF code assumes a little-endian host"
#endif

/* FNV-1a 64 over a byte string: the lookup tables' hash. */
static inline uint64_t gguf_hash_bytes(const void *p, size_t n) {
    const uint8_t *s = (const uint8_t *)p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= s[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static inline int gguf_is_pow2(uint64_t x) {
    return x != 0 && (x & (x - 1)) == 0;
}

/* Round `x` up to a multiple of `align` (a power of two); 0 on overflow. */
static inline int gguf_align_up(uint64_t x, uint64_t align, uint64_t *out) {
    uint64_t t;
    if (__builtin_add_overflow(x, align - 1, &t)) return 0;
    *out = t & ~(align - 1);
    return 1;
}

/* Check a tensor's type and shape and compute its element and byte counts.
 * Returns TM_OK when valid; otherwise TM_ERR_UNSUPPORTED (unknown type id) or
 * TM_ERR_FORMAT, with the offending field ("type", "n_dims", "ne[1]") in
 * `field` and what was expected in `why`; the caller adds file and offset.
 * Rules: known type id, 1 <= n_dims <= 4, every dim >= 1, ne[0] a multiple of
 * the type's block size, no overflow of elements or bytes. */
tm_status gguf_tensor_shape_check(uint32_t type, uint32_t n_dims, const int64_t *ne,
                                  int64_t *n_elements, uint64_t *n_bytes, char *field,
                                  size_t field_cap, char *why, size_t why_cap);

#endif
