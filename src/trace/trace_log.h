/* Routing logs: every forward call's top-k expert ids per layer, in order,
 * with sequence boundaries, so cache policies can be replayed offline
 * (docs/trace-format.md, "Routing log"). Written by the tracer
 * (`tiermoe trace --routing-log FILE`), read by `tiermoe report --replay`.
 *
 * Binary, little-endian. Header (64 bytes):
 *   0  char[4]  magic "TMRL"
 *   4  u32      version (1)
 *   8  u32      n_layer      12 u32 n_expert     16 u32 n_expert_used (k)
 *   20 u32      reserved (0)
 *   24 char[32] arch, NUL-padded (at least one NUL)
 *   56 u32[2]   reserved (0)
 * Records, one after another to the end of the file:
 *   u32 0xFFFFFFFF                      a sequence begins (context reset)
 *   u32 layer, u32 n_tok, u16 ids[n_tok][k]   one forward call of a layer
 * The first record is a sequence marker; layer < n_layer; 1 <= n_tok <= 2^24;
 * every id < n_expert and the k ids of a token distinct. */
#ifndef TM_TRACE_TRACE_LOG_H
#define TM_TRACE_TRACE_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "trace/trace.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TM_TRACE_LOG_MAGIC      "TMRL"
#define TM_TRACE_LOG_VERSION    1
#define TM_TRACE_LOG_HEADER     64
#define TM_TRACE_LOG_SEQ        0xFFFFFFFFu
#define TM_TRACE_LOG_MAX_TOKENS (1u << 24)

/* ---- writing ---- */

typedef struct tm_trace_log_writer tm_trace_log_writer;

/* Start a log for a model shape at path (written to path.tmp.PID until
 * trace_log_writer_close renames it over path). */
tm_status trace_log_writer_open(const char *path, const tm_trace_shape *shape,
                                tm_trace_log_writer **out);
/* A sequence begins. Errors are kept and reported by close (the tracer's
 * callback cannot fail). */
void trace_log_writer_sequence(tm_trace_log_writer *w);
/* One forward call of layer: ids [n_tok][k]. A marker is written first when
 * no sequence was begun. */
void trace_log_writer_record(tm_trace_log_writer *w, uint32_t layer, const int32_t *ids,
                             int64_t n_tok);
/* Finish: flush, close and rename; frees w. Fails (removing the temporary
 * file) when any write failed. keep false: discard the log instead. */
tm_status trace_log_writer_close(tm_trace_log_writer *w, bool keep);

/* ---- reading ---- */

typedef struct tm_trace_log_call {
    uint32_t seq;   /* sequence index (0-based) */
    uint32_t n_tok; /* tokens of the call */
    uint64_t off;   /* first id in the layer's ids[] */
} tm_trace_log_call;

typedef struct tm_trace_log_layer {
    uint64_t n_calls, n_ids;
    tm_trace_log_call *calls; /* [n_calls] in order */
    int32_t *ids;             /* [n_ids] = sum of n_tok * k */
} tm_trace_log_layer;

typedef struct tm_trace_log {
    tm_trace_shape shape;
    uint32_t n_seq;
    tm_trace_log_layer *layers; /* [n_layer] */
} tm_trace_log;

/* Validate and load a log held in memory; origin is named in errors with the
 * byte offset of the damage ("log.bin: offset 1234: layer 70 of 48"). */
tm_status trace_log_parse(const uint8_t *data, size_t len, const char *origin, tm_trace_log *out);
tm_status trace_log_read(const char *path, tm_trace_log *out);
void trace_log_free(tm_trace_log *log);

#ifdef __cplusplus
}
#endif
#endif
