/* The drive read test of `tiermoe calibrate --drive` (calib.h): random reads
 * of one size spread over a file, O_DIRECT through the SSD tier's reader
 * (store_io.h) at a given queue depth, for a given time: MB/s and reads/s.
 * What the SSD tier can expect of the drive its model is on. */
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "core/timing.h"
#include "tier/calib.h"
#include "tier/store_io.h"

tm_status calib_drive_measure(const char *path, int depth, size_t block, double seconds,
                              tm_calib_drive *out) {
    memset(out, 0, sizeof(*out));
    out->depth = depth, out->block = block;
    if (block % TM_STORE_ALIGN || !block || depth < 1 || depth > TM_STORE_IO_MAX)
        return tm_error_set(TM_ERR_ARG,
                            "drive test: block %zu (a multiple of %u), depth %d (1..%d)", block,
                            TM_STORE_ALIGN, depth, TM_STORE_IO_MAX);
    tm_store_io *io;
    const tm_store_io_params p = {.depth = depth, .quiet = true};
    tm_status st = store_io_open(path, &p, &io);
    if (st != TM_OK) return st;
    out->direct = store_io_direct(io), out->uring = store_io_uring(io);
    const uint64_t size = store_io_file_size(io);
    uint8_t *buf = aligned_alloc(TM_STORE_ALIGN, (size_t)depth * block);
    uint64_t *seqs = calloc((size_t)depth, sizeof(uint64_t));
    if (!buf || !seqs || size < block) {
        st = !buf || !seqs ? tm_error_set(TM_ERR_NOMEM, "out of memory")
                           : tm_error_set(TM_ERR_ARG, "drive test: %s is smaller than %zu bytes",
                                          path, block);
        goto out;
    }
    tm_rng r;
    tm_rng_seed(&r, 1);
    const uint64_t blocks = size / block;
    const uint64_t t0 = tm_time_ns(), limit = (uint64_t)(seconds * 1e9);
    uint64_t n = 0, now = t0;
    /* keep depth reads in flight: the oldest is waited for, then reissued */
    for (uint64_t i = 0; st == TM_OK; i++) {
        const size_t b = (size_t)(i % (uint64_t)depth);
        if (i >= (uint64_t)depth) {
            if ((st = store_io_wait(io, seqs[b]))) break;
            n++;
            if ((now = tm_time_ns()) - t0 > limit) break;
        }
        const uint64_t off = tm_rng_u64(&r) % blocks * block;
        if ((st = store_io_read(io, off, block, block, buf + b * block, &seqs[b])) ||
            (st = store_io_submit(io)))
            break;
    }
    if (st == TM_OK && now > t0) {
        const double s = (now - t0) * 1e-9;
        out->mbs = (double)n * block / s / 1e6;
        out->iops = (double)n / s;
    }
out:
    free(buf), free(seqs);
    store_io_close(io);
    return st;
}
