/* The SSD tier's reader: explicit reads of a file into aligned buffers,
 * O_DIRECT (the page cache is bypassed, so RAM holds only what the expert
 * store decides) through io_uring at a queue depth of 16-64, one file
 * descriptor.
 *
 * A read is queued with store_io_read and gets a sequence number; reads are
 * submitted as the queue depth allows and complete in any order;
 * store_io_wait(io, seq) returns once every read up to seq is done, so the
 * caller can keep reads of the next layer in flight while it computes.
 * Without io_uring (no liburing in the build, an old kernel, seccomp) reads
 * run at queue time with pread, after one log line; without O_DIRECT (tmpfs,
 * some network file systems) the file is read through the page cache, after
 * one log line.
 *
 * Failures: a short read is continued (a read that ends at the file's end
 * is complete when it covers the bytes asked for); a failed read is tried
 * again TM_STORE_IO_TRIES times in all; then the status is TM_ERR_IO naming
 * the file, the offset, the bytes expected and the error, and every later
 * wait returns it. TIERMOE_STORE_FAIL_READ=N[:once] makes the N-th read (from
 * 1) fail with EIO, every try or only the first (tests). */
#ifndef TM_TIER_STORE_IO_H
#define TM_TIER_STORE_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TM_STORE_ALIGN    4096u      /* O_DIRECT offsets, lengths and buffers */
#define TM_STORE_IO_DEPTH 32         /* default queue depth */
#define TM_STORE_IO_MAX   64         /* queue depth at most */
#define TM_STORE_IO_CHUNK (1u << 20) /* a longer read is split into reads of this size */
#define TM_STORE_IO_TRIES 3

typedef struct tm_store_io tm_store_io;

typedef struct tm_store_io_params {
    int depth;      /* reads in flight at most (0: TM_STORE_IO_DEPTH; capped to TM_STORE_IO_MAX) */
    bool no_direct; /* read through the page cache (calibrate's comparison) */
    bool no_uring;  /* pread even when io_uring works (tests, calibrate) */
    bool quiet;     /* no log line for fallbacks (calibrate prints its own) */
} tm_store_io_params;

/* Open path for reading. TM_ERR_IO names the file and the error. */
tm_status store_io_open(const char *path, const tm_store_io_params *p, tm_store_io **out);
void store_io_close(tm_store_io *io);

/* Queue a read of len bytes at offset off into dst (with O_DIRECT: off, len
 * and dst multiples of TM_STORE_ALIGN); need (<= len) is the part that must
 * exist in the file. Returns the read's sequence number (> 0) in *seq. */
tm_status store_io_read(tm_store_io *io, uint64_t off, size_t len, size_t need, void *dst,
                        uint64_t *seq);
/* Submit what the queue depth allows (reads queued beyond it wait). */
tm_status store_io_submit(tm_store_io *io);
/* Wait until every read with a sequence number <= seq is done. */
tm_status store_io_wait(tm_store_io *io, uint64_t seq);
/* Whether every read <= seq is done, without waiting (reaps completions). */
bool store_io_done(tm_store_io *io, uint64_t seq);
/* Reads submitted and not yet done. */
int store_io_in_flight(const tm_store_io *io);
int store_io_depth(const tm_store_io *io);

bool store_io_uring(const tm_store_io *io);  /* reads go through io_uring */
bool store_io_direct(const tm_store_io *io); /* the file is open with O_DIRECT */
uint64_t store_io_file_size(const tm_store_io *io);

#ifdef __cplusplus
}
#endif
#endif
