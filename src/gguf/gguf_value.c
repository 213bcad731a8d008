/* GGUF value helpers shared by reader and writer: value type names and
 * sizes, array element access, string comparison and the tensor shape rules.
 * Array elements of scalar type are the file's raw little-endian bytes
 * (possibly unaligned), so they are read with memcpy. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "core/log.h"
#include "gguf/gguf.h"
#include "gguf/gguf_internal.h"
#include "quant/quant.h"

const char *gguf_value_type_name(tm_gguf_value_type t) {
    switch (t) {
    case TM_GGUF_TYPE_UINT8:
        return "uint8";
    case TM_GGUF_TYPE_INT8:
        return "int8";
    case TM_GGUF_TYPE_UINT16:
        return "uint16";
    case TM_GGUF_TYPE_INT16:
        return "int16";
    case TM_GGUF_TYPE_UINT32:
        return "uint32";
    case TM_GGUF_TYPE_INT32:
        return "int32";
    case TM_GGUF_TYPE_FLOAT32:
        return "float32";
    case TM_GGUF_TYPE_BOOL:
        return "bool";
    case TM_GGUF_TYPE_STRING:
        return "string";
    case TM_GGUF_TYPE_ARRAY:
        return "array";
    case TM_GGUF_TYPE_UINT64:
        return "uint64";
    case TM_GGUF_TYPE_INT64:
        return "int64";
    case TM_GGUF_TYPE_FLOAT64:
        return "float64";
    case TM_GGUF_TYPE_COUNT:
        break;
    }
    return "?";
}

size_t gguf_value_type_size(tm_gguf_value_type t) {
    switch (t) {
    case TM_GGUF_TYPE_UINT8:
    case TM_GGUF_TYPE_INT8:
    case TM_GGUF_TYPE_BOOL:
        return 1;
    case TM_GGUF_TYPE_UINT16:
    case TM_GGUF_TYPE_INT16:
        return 2;
    case TM_GGUF_TYPE_UINT32:
    case TM_GGUF_TYPE_INT32:
    case TM_GGUF_TYPE_FLOAT32:
        return 4;
    case TM_GGUF_TYPE_UINT64:
    case TM_GGUF_TYPE_INT64:
    case TM_GGUF_TYPE_FLOAT64:
        return 8;
    case TM_GGUF_TYPE_STRING:
    case TM_GGUF_TYPE_ARRAY:
    case TM_GGUF_TYPE_COUNT:
        break;
    }
    return 0;
}

bool gguf_str_eq(tm_gguf_str s, const char *cstr) {
    size_t n = strlen(cstr);
    return s.len == n && (n == 0 || memcmp(s.data, cstr, n) == 0);
}

/* Element i of a scalar array as a signed 64-bit value (integers ≤ 32 bits). */
static int64_t array_small_int(const tm_gguf_array *a, uint64_t i) {
    TM_ASSERT(i < a->n);
    const uint8_t *p = (const uint8_t *)a->data;
    switch (a->elem_type) {
    case TM_GGUF_TYPE_UINT8:
        return p[i];
    case TM_GGUF_TYPE_INT8:
        return (int8_t)p[i];
    case TM_GGUF_TYPE_UINT16: {
        uint16_t v;
        memcpy(&v, p + 2 * i, 2);
        return v;
    }
    case TM_GGUF_TYPE_INT16: {
        int16_t v;
        memcpy(&v, p + 2 * i, 2);
        return v;
    }
    case TM_GGUF_TYPE_UINT32: {
        uint32_t v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    case TM_GGUF_TYPE_INT32: {
        int32_t v;
        memcpy(&v, p + 4 * i, 4);
        return v;
    }
    default:
        break;
    }
    TM_ASSERT(!"gguf array element is not an integer of 32 bits or less");
    return 0;
}

uint32_t gguf_array_get_u32(const tm_gguf_array *a, uint64_t i) {
    return (uint32_t)array_small_int(a, i);
}

int32_t gguf_array_get_i32(const tm_gguf_array *a, uint64_t i) {
    return (int32_t)array_small_int(a, i);
}

float gguf_array_get_f32(const tm_gguf_array *a, uint64_t i) {
    TM_ASSERT(i < a->n);
    const uint8_t *p = (const uint8_t *)a->data;
    if (a->elem_type == TM_GGUF_TYPE_FLOAT64) {
        double d;
        memcpy(&d, p + 8 * i, 8);
        return (float)d;
    }
    TM_ASSERT(a->elem_type == TM_GGUF_TYPE_FLOAT32);
    float f;
    memcpy(&f, p + 4 * i, 4);
    return f;
}

tm_gguf_str gguf_array_get_str(const tm_gguf_array *a, uint64_t i) {
    TM_ASSERT(a->elem_type == TM_GGUF_TYPE_STRING && i < a->n);
    return ((const tm_gguf_str *)a->data)[i];
}

tm_status gguf_tensor_shape_check(uint32_t type, uint32_t n_dims, const int64_t *ne,
                                  int64_t *n_elements, uint64_t *n_bytes, char *field,
                                  size_t field_cap, char *why, size_t why_cap) {
    const tm_type_traits *tr = quant_type_traits(type);
    if (!tr) {
        snprintf(field, field_cap, "type");
        snprintf(why, why_cap,
                 "expected a known ggml type id (the highest this build knows is %d, %s), got "
                 "%" PRIu32,
                 TM_TYPE_COUNT - 1, quant_type_name(TM_TYPE_COUNT - 1), type);
        return TM_ERR_UNSUPPORTED;
    }
    if (n_dims < 1 || n_dims > TM_GGUF_MAX_DIMS) {
        snprintf(field, field_cap, "n_dims");
        snprintf(why, why_cap, "expected 1 to %d dimensions, got %" PRIu32, TM_GGUF_MAX_DIMS,
                 n_dims);
        return TM_ERR_FORMAT;
    }
    int64_t n = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] < 1) {
            snprintf(field, field_cap, "ne[%" PRIu32 "]", d);
            snprintf(why, why_cap, "expected a dimension of at least 1, got %" PRId64, ne[d]);
            return TM_ERR_FORMAT;
        }
        if (__builtin_mul_overflow(n, ne[d], &n)) {
            snprintf(field, field_cap, "ne[%" PRIu32 "]", d);
            snprintf(why, why_cap,
                     "element count overflows 64 bits at this dimension (%" PRId64 ")", ne[d]);
            return TM_ERR_FORMAT;
        }
    }
    if (ne[0] % tr->block_size != 0) {
        snprintf(field, field_cap, "ne[0]");
        snprintf(why, why_cap, "expected a multiple of %s's block size %" PRId64 ", got %" PRId64,
                 tr->name, tr->block_size, ne[0]);
        return TM_ERR_FORMAT;
    }
    /* bytes = blocks per row × block bytes × rows; each step checked */
    uint64_t bytes = (uint64_t)(ne[0] / tr->block_size);
    if (__builtin_mul_overflow(bytes, (uint64_t)tr->type_size, &bytes)) goto overflow;
    for (uint32_t d = 1; d < n_dims; d++)
        if (__builtin_mul_overflow(bytes, (uint64_t)ne[d], &bytes)) goto overflow;
    *n_elements = n;
    *n_bytes = bytes;
    return TM_OK;
overflow:
    snprintf(field, field_cap, "ne");
    snprintf(why, why_cap, "byte size of the %s tensor overflows 64 bits", tr->name);
    return TM_ERR_FORMAT;
}
