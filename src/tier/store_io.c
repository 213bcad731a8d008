/* The SSD tier's reader (store_io.h): io_uring or pread, O_DIRECT or not.
 *
 * Reads live in a ring of records indexed by sequence number: those up to
 * done_through are done; [done_through + 1, next_submit) are submitted (in
 * flight or done out of order); [next_submit, next_seq) wait for room in the
 * queue. */
#include "tier/store_io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/log.h"

#ifdef TM_HAVE_URING
#include <liburing.h>
#endif

#define IO_RING_RECS 4096 /* reads queued at most before read waits for the oldest */

typedef struct io_rec {
    uint64_t off;
    size_t len, need, got; /* asked, must exist, read so far */
    uint8_t *dst;
    int tries;
    uint64_t number; /* the reader's count of reads, from 1 (TIERMOE_STORE_FAIL_READ) */
    bool done;
} io_rec;

struct tm_store_io {
    int fd, depth;
    bool direct, uring;
    char *path;
    uint64_t file_size;
    io_rec *recs; /* [IO_RING_RECS], record of seq at seq % IO_RING_RECS */
    uint64_t next_seq, next_submit, done_through;
    int in_flight;
    uint64_t n_reads;
    uint64_t fail_at; /* TIERMOE_STORE_FAIL_READ */
    bool fail_once;
    tm_status err;
    char msg[512];
#ifdef TM_HAVE_URING
    struct io_uring ring;
#endif
};

static io_rec *io_rec_of(tm_store_io *io, uint64_t seq) {
    return &io->recs[seq % IO_RING_RECS];
}

/* The first error is kept and returned by every later call. */
static tm_status io_fail(tm_store_io *io, const io_rec *r, int error) {
    if (io->err == TM_OK) {
        if (error == 0)
            snprintf(io->msg, sizeof(io->msg),
                     "%s: truncated: %zu bytes expected at offset %llu, the file ends at %llu",
                     io->path, r->need, (unsigned long long)r->off,
                     (unsigned long long)(r->off + r->got));
        else
            snprintf(io->msg, sizeof(io->msg),
                     "%s: read of %zu bytes at offset %llu failed %d times: %s", io->path, r->len,
                     (unsigned long long)r->off, r->tries, strerror(error));
        io->err = TM_ERR_IO;
    }
    return tm_error_set(io->err, "%s", io->msg);
}

static bool io_injected(const tm_store_io *io, const io_rec *r) {
    return io->fail_at && r->number == io->fail_at && (!io->fail_once || r->tries == 0);
}

static tm_status io_issue(tm_store_io *io, uint64_t seq);

/* A read's attempt ended with res (bytes, or -errno). */
static tm_status io_complete(tm_store_io *io, uint64_t seq, long res) {
    io_rec *r = io_rec_of(io, seq);
    if (res == -EINTR || res == -EAGAIN) return io_issue(io, seq);
    if (res < 0) {
        if (++r->tries < TM_STORE_IO_TRIES) {
            tm_log_warn("%s: read at offset %llu failed (%s); trying again", io->path,
                        (unsigned long long)(r->off + r->got), strerror((int)-res));
            return io_issue(io, seq);
        }
        r->done = true;
        return io_fail(io, r, (int)-res);
    }
    r->got += (size_t)res;
    if (r->got >= r->need) {
        r->done = true;
        return TM_OK;
    }
    if (res == 0) { /* the file ends before the bytes asked for */
        r->done = true;
        return io_fail(io, r, 0);
    }
    return io_issue(io, seq); /* a short read: the rest */
}

/* One attempt at the rest of read seq. */
static tm_status io_issue(tm_store_io *io, uint64_t seq) {
    io_rec *r = io_rec_of(io, seq);
    if (io_injected(io, r)) return io_complete(io, seq, -EIO);
#ifdef TM_HAVE_URING
    if (io->uring) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
        if (!sqe) { /* the ring is full: make room */
            if (io_uring_submit(&io->ring) < 0 || !(sqe = io_uring_get_sqe(&io->ring))) {
                r->done = true;
                return io_fail(io, r, EBUSY);
            }
        }
        io_uring_prep_read(sqe, io->fd, r->dst + r->got, (unsigned)(r->len - r->got),
                           r->off + r->got);
        io_uring_sqe_set_data64(sqe, seq);
        return TM_OK;
    }
#endif
    const ssize_t n = pread(io->fd, r->dst + r->got, r->len - r->got, (off_t)(r->off + r->got));
    return io_complete(io, seq, n < 0 ? -errno : n);
}

static bool io_all_done(tm_store_io *io) {
    while (io->done_through < io->next_submit - 1 && io_rec_of(io, io->done_through + 1)->done)
        io->done_through++;
    return io->done_through >= io->next_submit - 1;
}

tm_status store_io_submit(tm_store_io *io) {
    if (io->err) return tm_error_set(io->err, "%s", io->msg);
    tm_status st = TM_OK;
    bool queued = false;
    while (io->next_submit < io->next_seq && io->in_flight < io->depth && st == TM_OK) {
        const uint64_t seq = io->next_submit++;
        io_rec *r = io_rec_of(io, seq);
        r->number = ++io->n_reads;
        io->in_flight++;
        st = io_issue(io, seq);
        if (r->done) io->in_flight--;
        queued = true;
    }
#ifdef TM_HAVE_URING
    if (io->uring && queued) {
        const int n = io_uring_submit(&io->ring);
        if (n < 0 && st == TM_OK) {
            io_rec r = {.off = 0, .tries = 1};
            st = io_fail(io, &r, -n);
        }
    }
#else
    (void)queued;
#endif
    io_all_done(io);
    return st;
}

/* Reap completions: wait for one when block is set. */
static tm_status io_reap(tm_store_io *io, bool block) {
#ifdef TM_HAVE_URING
    if (!io->uring) return TM_OK;
    struct io_uring_cqe *cqe;
    tm_status st = TM_OK;
    bool resubmit = false;
    for (;;) {
        int rc = block ? io_uring_wait_cqe(&io->ring, &cqe) : io_uring_peek_cqe(&io->ring, &cqe);
        if (rc == -EINTR) continue;
        if (rc == -EAGAIN) break;
        if (rc < 0) {
            io_rec r = {.off = 0, .tries = 1};
            return io_fail(io, &r, -rc);
        }
        const uint64_t seq = io_uring_cqe_get_data64(cqe);
        const long res = cqe->res;
        io_uring_cqe_seen(&io->ring, cqe);
        io_rec *r = io_rec_of(io, seq);
        tm_status s = io_complete(io, seq, res);
        if (st == TM_OK) st = s;
        if (r->done)
            io->in_flight--;
        else
            resubmit = true;
        block = false;
    }
    if (resubmit && io_uring_submit(&io->ring) < 0 && st == TM_OK) {
        io_rec r = {.off = 0, .tries = 1};
        st = io_fail(io, &r, EIO);
    }
    return st;
#else
    (void)io, (void)block;
    return TM_OK;
#endif
}

tm_status store_io_read(tm_store_io *io, uint64_t off, size_t len, size_t need, void *dst,
                        uint64_t *seq) {
    if (io->err) return tm_error_set(io->err, "%s", io->msg);
    if (io->direct && ((off | len | (uintptr_t)dst) & (TM_STORE_ALIGN - 1)))
        return tm_error_set(TM_ERR_ARG, "%s: O_DIRECT read of %zu bytes at %llu is not aligned",
                            io->path, len, (unsigned long long)off);
    tm_status st;
    while (io->next_seq - io->done_through > IO_RING_RECS - 1) { /* the ring is full */
        if ((st = store_io_submit(io)) || (st = store_io_wait(io, io->done_through + 1))) return st;
    }
    *seq = io->next_seq++;
    *io_rec_of(io, *seq) = (io_rec){.off = off, .len = len, .need = need, .dst = dst};
    return TM_OK;
}

bool store_io_done(tm_store_io *io, uint64_t seq) {
    if (seq <= io->done_through) return true;
    if (seq < io->next_submit) (void)io_reap(io, false);
    io_all_done(io);
    return io->done_through >= seq;
}

tm_status store_io_wait(tm_store_io *io, uint64_t seq) {
    tm_status st = TM_OK;
    while (st == TM_OK && !io->err) {
        io_all_done(io);
        if (io->done_through >= seq) break;
        if ((st = store_io_submit(io))) break;
        if (io->done_through >= seq) break;
        st = io_reap(io, true);
        if (st == TM_OK) st = store_io_submit(io);
    }
    if (io->err) return tm_error_set(io->err, "%s", io->msg);
    return st;
}

int store_io_in_flight(const tm_store_io *io) {
    return io->in_flight;
}
int store_io_depth(const tm_store_io *io) {
    return io->depth;
}
bool store_io_uring(const tm_store_io *io) {
    return io->uring;
}
bool store_io_direct(const tm_store_io *io) {
    return io->direct;
}
uint64_t store_io_file_size(const tm_store_io *io) {
    return io->file_size;
}

static void io_fail_env(tm_store_io *io) {
    const char *env = getenv("TIERMOE_STORE_FAIL_READ");
    if (!env || !*env) return;
    char *end;
    io->fail_at = strtoull(env, &end, 10);
    io->fail_once = !strcmp(end, ":once");
}

tm_status store_io_open(const char *path, const tm_store_io_params *p, tm_store_io **out) {
    *out = NULL;
    tm_store_io *io = calloc(1, sizeof(*io));
    if (!io || !(io->path = strdup(path)) || !(io->recs = calloc(IO_RING_RECS, sizeof(io_rec)))) {
        store_io_close(io);
        return tm_error_set(TM_ERR_NOMEM, "out of memory");
    }
    io->fd = -1;
    io->next_seq = io->next_submit = 1;
    io->depth = p->depth > 0 ? p->depth : TM_STORE_IO_DEPTH;
    if (io->depth > TM_STORE_IO_MAX) io->depth = TM_STORE_IO_MAX;
    io_fail_env(io);
    if (!p->no_direct) {
        io->fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
        io->direct = io->fd >= 0;
        if (io->fd < 0 && errno != EINVAL) {
            const int e = errno;
            store_io_close(io);
            return tm_error_set(TM_ERR_IO, "%s: cannot open: %s", path, strerror(e));
        }
        if (io->fd < 0 && !p->quiet)
            tm_log_warn("%s: the file system does not take O_DIRECT; experts are read through "
                        "the page cache",
                        path);
    }
    if (io->fd < 0 && (io->fd = open(path, O_RDONLY | O_CLOEXEC)) < 0) {
        const int e = errno;
        store_io_close(io);
        return tm_error_set(TM_ERR_IO, "%s: cannot open: %s", path, strerror(e));
    }
    struct stat sb;
    if (fstat(io->fd, &sb) == 0) io->file_size = (uint64_t)sb.st_size;
#ifdef TM_HAVE_URING
    if (!p->no_uring) {
        const int rc = io_uring_queue_init((unsigned)io->depth * 2, &io->ring, 0);
        io->uring = rc == 0;
        if (rc < 0 && !p->quiet)
            tm_log_warn("io_uring is not available (%s): experts are read with pread",
                        strerror(-rc));
    }
#else
    if (!p->no_uring && !p->quiet)
        tm_log_warn("this build has no liburing: experts are read with pread");
#endif
    *out = io;
    return TM_OK;
}

void store_io_close(tm_store_io *io) {
    if (!io) return;
#ifdef TM_HAVE_URING
    if (io->uring) {
        /* the kernel may not write into buffers freed after this */
        struct io_uring_cqe *cqe;
        (void)io_uring_submit(&io->ring);
        while (io->in_flight > 0) {
            const int rc = io_uring_wait_cqe(&io->ring, &cqe);
            if (rc == -EINTR) continue;
            if (rc < 0) break;
            io_uring_cqe_seen(&io->ring, cqe);
            io->in_flight--;
        }
        io_uring_queue_exit(&io->ring);
    }
#endif
    if (io->fd >= 0) close(io->fd);
    free(io->recs), free(io->path), free(io);
}
