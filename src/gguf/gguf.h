/* GGUF: the file format of ggml/llama.cpp models, versions 2 and 3.
 *
 * Layout (little-endian):
 *   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
 *   n_kv × { string key | u32 value_type | value }
 *   n_tensors × { string name | u32 n_dims | u64 dims[n_dims] | u32 type | u64 offset }
 *   padding to `general.alignment` (default 32)
 *   tensor data; each tensor at data_start + offset, offset a multiple of the alignment
 * string = u64 length + bytes (no terminator); array = u32 elem_type | u64 n | n values.
 *
 * The reader maps the file read-only and validates everything before returning:
 * a file it accepts can be walked without further bounds checks. Strings and
 * tensor data point into the map; they stay valid until gguf_file_close(). */
#ifndef TM_GGUF_GGUF_H
#define TM_GGUF_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TM_GGUF_MAGIC             0x46554747u /* "GGUF" read as little-endian u32 */
#define TM_GGUF_DEFAULT_ALIGNMENT 32
#define TM_GGUF_MAX_DIMS          4
/* Arrays may hold arrays; the reader and writer refuse nesting deeper than
 * this (a key's array counts as level 1), so hostile files cannot recurse. */
#define TM_GGUF_MAX_ARRAY_DEPTH 8

typedef enum tm_gguf_value_type {
    TM_GGUF_TYPE_UINT8 = 0,
    TM_GGUF_TYPE_INT8 = 1,
    TM_GGUF_TYPE_UINT16 = 2,
    TM_GGUF_TYPE_INT16 = 3,
    TM_GGUF_TYPE_UINT32 = 4,
    TM_GGUF_TYPE_INT32 = 5,
    TM_GGUF_TYPE_FLOAT32 = 6,
    TM_GGUF_TYPE_BOOL = 7,
    TM_GGUF_TYPE_STRING = 8,
    TM_GGUF_TYPE_ARRAY = 9,
    TM_GGUF_TYPE_UINT64 = 10,
    TM_GGUF_TYPE_INT64 = 11,
    TM_GGUF_TYPE_FLOAT64 = 12,
    TM_GGUF_TYPE_COUNT = 13,
} tm_gguf_value_type;

/* A string in the file: not NUL-terminated. */
typedef struct tm_gguf_str {
    const char *data;
    uint64_t len;
} tm_gguf_str;

typedef struct tm_gguf_value tm_gguf_value;

typedef struct tm_gguf_array {
    tm_gguf_value_type elem_type;
    uint64_t n;
    /* Scalar elements: the raw little-endian bytes in the file (maybe
     * unaligned; read with gguf_array_get_*). Strings: tm_gguf_str[n].
     * Arrays: tm_gguf_value[n] (each of type ARRAY). */
    const void *data;
} tm_gguf_array;

struct tm_gguf_value {
    tm_gguf_value_type type;
    union {
        uint8_t u8;
        int8_t i8;
        uint16_t u16;
        int16_t i16;
        uint32_t u32;
        int32_t i32;
        float f32;
        bool b;
        uint64_t u64;
        int64_t i64;
        double f64;
        tm_gguf_str str;
        tm_gguf_array arr;
    } v;
};

typedef struct tm_gguf_kv {
    tm_gguf_str key;
    uint64_t file_offset; /* where the key's record starts in the file */
    tm_gguf_value value;
} tm_gguf_kv;

typedef struct tm_gguf_tensor {
    tm_gguf_str name;
    uint32_t type; /* tm_type id */
    uint32_t n_dims;
    int64_t ne[TM_GGUF_MAX_DIMS]; /* ne[0] is the row length (fastest dim); unused dims are 1 */
    int64_t n_elements;
    uint64_t offset;      /* relative to the data section, as stored */
    uint64_t file_offset; /* absolute byte offset in the file (for O_DIRECT reads) */
    uint64_t n_bytes;
    const void *data; /* in the map, or NULL when the file was opened without mapping */
} tm_gguf_tensor;

typedef struct tm_gguf_file {
    char *path;
    int fd;
    uint64_t file_size;
    const uint8_t *map; /* the whole file, read-only */
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset; /* absolute offset of the data section */
    uint64_t n_kv;
    tm_gguf_kv *kv;
    uint64_t n_tensors;
    tm_gguf_tensor *tensors;
    void *priv; /* reader-owned allocations and lookup tables */
} tm_gguf_file;

/* ---- reading ---- */

/* Map and validate `path`. On failure returns a status, *out is NULL and the
 * error message names the file, byte offset, field and what was expected.
 * Status: TM_ERR_IO (cannot open/map), TM_ERR_UNSUPPORTED (GGUF version other
 * than 2 or 3, big-endian file, unknown tensor type id), TM_ERR_FORMAT
 * (anything malformed), TM_ERR_NOMEM. */
tm_status gguf_file_open(const char *path, tm_gguf_file **out);

/* Parse and validate an in-memory image (the fuzzer and tests use this; the
 * buffer must outlive the returned file). `name` appears in error messages. */
tm_status gguf_file_open_buffer(const void *buf, size_t size, const char *name, tm_gguf_file **out);

void gguf_file_close(tm_gguf_file *f);

/* Lookups by name; NULL / -1 when absent. */
const tm_gguf_kv *gguf_file_find_kv(const tm_gguf_file *f, const char *key);
const tm_gguf_tensor *gguf_file_find_tensor(const tm_gguf_file *f, const char *name);
int64_t gguf_file_find_tensor_index(const tm_gguf_file *f, const char *name);

/* Typed getters: TM_ERR_FORMAT naming the key when missing or of another
 * type. The integer getters accept any integer type whose value fits. */
tm_status gguf_file_get_u32(const tm_gguf_file *f, const char *key, uint32_t *out);
tm_status gguf_file_get_u64(const tm_gguf_file *f, const char *key, uint64_t *out);
tm_status gguf_file_get_f32(const tm_gguf_file *f, const char *key, float *out); /* f32 or f64 */
tm_status gguf_file_get_bool(const tm_gguf_file *f, const char *key, bool *out);
tm_status gguf_file_get_str(const tm_gguf_file *f, const char *key, tm_gguf_str *out);
tm_status gguf_file_get_array(const tm_gguf_file *f, const char *key, const tm_gguf_array **out);

/* Array element access (index must be < n; elem_type must match). */
uint32_t gguf_array_get_u32(const tm_gguf_array *a,
                            uint64_t i); /* any integer elem type ≤ 32 bits */
int32_t gguf_array_get_i32(const tm_gguf_array *a, uint64_t i);
float gguf_array_get_f32(const tm_gguf_array *a, uint64_t i);
tm_gguf_str gguf_array_get_str(const tm_gguf_array *a, uint64_t i);

const char *gguf_value_type_name(tm_gguf_value_type t);
size_t gguf_value_type_size(tm_gguf_value_type t); /* scalar size; 0 for STRING/ARRAY */
bool gguf_str_eq(tm_gguf_str s, const char *cstr);

/* ---- writing ----
 * Build the header in memory, then stream tensor data in declaration order,
 * so files larger than RAM can be written. The file is written to
 * "<path>.tmp" and renamed on success: a failed write never leaves a
 * half-written file under the final name. */

typedef struct tm_gguf_writer tm_gguf_writer;

/* version: 2 or 3 (0 = 3). alignment: a power of two (0 = 32). A
 * `general.alignment` key set on the writer (uint32 power of two) overrides
 * it; when the alignment is not 32 and no such key was set, begin() adds it,
 * so the file reads back with the alignment it was written with. */
tm_status gguf_writer_init(tm_gguf_writer **out, uint32_t version, uint64_t alignment);
void gguf_writer_free(tm_gguf_writer *w);

/* Metadata. Keys are copied; duplicate keys are rejected. */
tm_status gguf_writer_set_u32(tm_gguf_writer *w, const char *key, uint32_t v);
tm_status gguf_writer_set_i32(tm_gguf_writer *w, const char *key, int32_t v);
tm_status gguf_writer_set_u64(tm_gguf_writer *w, const char *key, uint64_t v);
tm_status gguf_writer_set_f32(tm_gguf_writer *w, const char *key, float v);
tm_status gguf_writer_set_bool(tm_gguf_writer *w, const char *key, bool v);
tm_status gguf_writer_set_str(tm_gguf_writer *w, const char *key, const char *v);
/* Any value, including arrays of strings and nested arrays (deep-copied). */
tm_status gguf_writer_set_value(tm_gguf_writer *w, const char *key, const tm_gguf_value *v);
tm_status gguf_writer_set_array(tm_gguf_writer *w, const char *key, tm_gguf_value_type elem_type,
                                const void *data,
                                uint64_t n); /* scalars: native array; strings: const char *[n] */

/* Declare a tensor; returns its index. ne[0] is the row length. */
tm_status gguf_writer_add_tensor(tm_gguf_writer *w, const char *name, uint32_t type,
                                 uint32_t n_dims, const int64_t *ne, uint64_t *index_out);

/* Start writing: header, metadata and tensor infos go to disk. */
tm_status gguf_writer_begin(tm_gguf_writer *w, const char *path);
/* Append bytes of the current tensor (any chunking); tensors come in
 * declaration order, each exactly its byte size. */
tm_status gguf_writer_write_data(tm_gguf_writer *w, const void *data, size_t size);
/* Check every tensor was written in full, flush, rename into place. */
tm_status gguf_writer_finish(tm_gguf_writer *w);

/* Copy every kv and tensor of a file into a new file (round-trip tests). */
tm_status gguf_file_copy(const tm_gguf_file *f, const char *path);
/* The same with one key changed: set to *value (added at the end when the
 * file lacks it), or left out when value is NULL (tests of bad files). */
tm_status gguf_file_copy_edit(const tm_gguf_file *f, const char *path, const char *key,
                              const tm_gguf_value *value);

#ifdef __cplusplus
}
#endif
#endif
