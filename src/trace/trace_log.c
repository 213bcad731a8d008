/* Routing logs: the writer the tracer feeds and the validating reader. The
 * format is in trace_log.h and docs/trace-format.md. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/file.h"
#include "trace/trace_log.h"

/* ---- writing ---- */

struct tm_trace_log_writer {
    FILE *f;
    char path[4096], tmp[4096];
    uint32_t n_layer, n_expert, k;
    bool begun;    /* a sequence marker was written */
    tm_status err; /* first failure */
    char msg[256];
    uint8_t *buf; /* ids of one call, as written (u16 little-endian) */
    size_t buf_cap;
};

static void put_u32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16),
    p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void writer_fail(tm_trace_log_writer *w, tm_status st, const char *what) {
    if (w->err != TM_OK) return;
    w->err = st;
    snprintf(w->msg, sizeof(w->msg), "%s", what);
}

static void writer_put(tm_trace_log_writer *w, const void *p, size_t n) {
    if (w->err == TM_OK && fwrite(p, 1, n, w->f) != n) writer_fail(w, TM_ERR_IO, strerror(errno));
}

tm_status trace_log_writer_open(const char *path, const tm_trace_shape *shape,
                                tm_trace_log_writer **out) {
    *out = NULL;
    if (!shape->n_layer || !shape->n_expert || shape->n_expert > 65536 || !shape->n_expert_used ||
        shape->n_expert_used > shape->n_expert)
        return tm_error_set(TM_ERR_ARG, "%s: cannot log routing of %u layers x %u experts (top-%u)",
                            path, shape->n_layer, shape->n_expert, shape->n_expert_used);
    tm_trace_log_writer *w = calloc(1, sizeof(*w));
    if (!w) return tm_error_set(TM_ERR_NOMEM, "%s: out of memory", path);
    tm_status st;
    if (snprintf(w->path, sizeof(w->path), "%s", path) >= (int)sizeof(w->path) ||
        (st = tm_file_tmp_path(path, w->tmp, sizeof(w->tmp))) != TM_OK) {
        free(w);
        return tm_error_set(TM_ERR_ARG, "%s: path too long", path);
    }
    w->f = fopen(w->tmp, "wb");
    if (!w->f) {
        st = tm_error_set(TM_ERR_IO, "%s: cannot create: %s", w->tmp, strerror(errno));
        free(w);
        return st;
    }
    setvbuf(w->f, NULL, _IOFBF, 1 << 20);
    w->n_layer = shape->n_layer, w->n_expert = shape->n_expert, w->k = shape->n_expert_used;
    uint8_t h[TM_TRACE_LOG_HEADER] = {0};
    memcpy(h, TM_TRACE_LOG_MAGIC, 4);
    put_u32(h + 4, TM_TRACE_LOG_VERSION);
    put_u32(h + 8, shape->n_layer);
    put_u32(h + 12, shape->n_expert);
    put_u32(h + 16, shape->n_expert_used);
    memcpy(h + 24, shape->arch, strnlen(shape->arch, 31));
    writer_put(w, h, sizeof(h));
    *out = w;
    return TM_OK;
}

void trace_log_writer_sequence(tm_trace_log_writer *w) {
    uint8_t m[4];
    put_u32(m, TM_TRACE_LOG_SEQ);
    writer_put(w, m, 4);
    w->begun = true;
}

void trace_log_writer_record(tm_trace_log_writer *w, uint32_t layer, const int32_t *ids,
                             int64_t n_tok) {
    if (w->err != TM_OK) return;
    if (layer >= w->n_layer || n_tok < 1 || n_tok > TM_TRACE_LOG_MAX_TOKENS) {
        writer_fail(w, TM_ERR_ARG, "a call out of the format's range (layer or token count)");
        return;
    }
    if (!w->begun) trace_log_writer_sequence(w);
    const size_t n = (size_t)n_tok * w->k;
    if (n > w->buf_cap) {
        uint8_t *b = realloc(w->buf, 2 * n);
        if (!b) {
            writer_fail(w, TM_ERR_NOMEM, "out of memory");
            return;
        }
        w->buf = b, w->buf_cap = n;
    }
    for (size_t i = 0; i < n; i++) {
        const int32_t e = ids[i];
        if (e < 0 || (uint32_t)e >= w->n_expert) {
            writer_fail(w, TM_ERR_ARG, "an expert id out of range");
            return;
        }
        w->buf[2 * i] = (uint8_t)e, w->buf[2 * i + 1] = (uint8_t)(e >> 8);
    }
    uint8_t head[8];
    put_u32(head, layer);
    put_u32(head + 4, (uint32_t)n_tok);
    writer_put(w, head, 8);
    writer_put(w, w->buf, 2 * n);
}

tm_status trace_log_writer_close(tm_trace_log_writer *w, bool keep) {
    if (!w) return TM_OK;
    tm_status st = TM_OK;
    if (!keep) {
        fclose(w->f);
        remove(w->tmp);
    } else if (w->err != TM_OK) {
        fclose(w->f);
        remove(w->tmp);
        st = tm_error_set(w->err, "%s: routing log not written: %s", w->path, w->msg);
    } else
        st = tm_file_commit(w->f, w->tmp, w->path);
    free(w->buf);
    free(w);
    return st;
}

/* ---- reading ---- */

void trace_log_free(tm_trace_log *log) {
    if (log->layers)
        for (uint32_t l = 0; l < log->shape.n_layer; l++)
            free(log->layers[l].calls), free(log->layers[l].ids);
    free(log->layers);
    memset(log, 0, sizeof(*log));
}

static tm_status log_header(const uint8_t *d, size_t len, const char *origin, tm_trace_shape *sh) {
    if (len < TM_TRACE_LOG_HEADER)
        return tm_error_set(TM_ERR_FORMAT, "%s: %zu bytes, shorter than the %d-byte header", origin,
                            len, TM_TRACE_LOG_HEADER);
    if (memcmp(d, TM_TRACE_LOG_MAGIC, 4))
        return tm_error_set(TM_ERR_FORMAT, "%s: offset 0: not a routing log (magic \"%s\")", origin,
                            TM_TRACE_LOG_MAGIC);
    const uint32_t version = get_u32(d + 4);
    if (version != TM_TRACE_LOG_VERSION)
        return tm_error_set(TM_ERR_UNSUPPORTED, "%s: offset 4: version %u, this build reads %d",
                            origin, version, TM_TRACE_LOG_VERSION);
    memset(sh, 0, sizeof(*sh));
    sh->n_layer = get_u32(d + 8), sh->n_expert = get_u32(d + 12),
    sh->n_expert_used = get_u32(d + 16);
    if (!sh->n_layer || sh->n_layer > TM_TRACE_MAX_LAYER || !sh->n_expert ||
        sh->n_expert > TM_TRACE_MAX_EXPERT || !sh->n_expert_used ||
        sh->n_expert_used > sh->n_expert || sh->n_expert_used > TM_TRACE_MAX_USED)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: offset 8: unsupported shape %u layers, %u experts, %u used",
                            origin, sh->n_layer, sh->n_expert, sh->n_expert_used);
    if (get_u32(d + 20) || get_u32(d + 56) || get_u32(d + 60))
        return tm_error_set(TM_ERR_FORMAT, "%s: offset %d: reserved field not 0", origin,
                            get_u32(d + 20)   ? 20
                            : get_u32(d + 56) ? 56
                                              : 60);
    if (!memchr(d + 24, 0, 32))
        return tm_error_set(TM_ERR_FORMAT, "%s: offset 24: arch not NUL-terminated", origin);
    memcpy(sh->arch, d + 24, 32);
    return TM_OK;
}

/* Walk the records. Pass 1 (log->layers[].calls NULL): validate and count.
 * Pass 2: fill. */
static tm_status log_walk(const uint8_t *d, size_t len, const char *origin, tm_trace_log *log,
                          uint8_t *seen) {
    const uint32_t L = log->shape.n_layer, E = log->shape.n_expert, k = log->shape.n_expert_used;
    size_t pos = TM_TRACE_LOG_HEADER;
    int64_t seq = -1;
    while (pos < len) {
        if (len - pos < 4)
            return tm_error_set(TM_ERR_FORMAT, "%s: offset %zu: truncated record (%zu bytes left)",
                                origin, pos, len - pos);
        const uint32_t tag = get_u32(d + pos);
        if (tag == TM_TRACE_LOG_SEQ) {
            seq++, pos += 4;
            continue;
        }
        if (seq < 0)
            return tm_error_set(TM_ERR_FORMAT,
                                "%s: offset %zu: a call before the first sequence marker", origin,
                                pos);
        if (tag >= L)
            return tm_error_set(TM_ERR_FORMAT, "%s: offset %zu: layer %u of %u", origin, pos, tag,
                                L);
        if (len - pos < 8)
            return tm_error_set(TM_ERR_FORMAT, "%s: offset %zu: truncated record (%zu bytes left)",
                                origin, pos, len - pos);
        const uint32_t n_tok = get_u32(d + pos + 4);
        if (!n_tok || n_tok > TM_TRACE_LOG_MAX_TOKENS)
            return tm_error_set(TM_ERR_FORMAT, "%s: offset %zu: %u tokens (1..%u)", origin, pos + 4,
                                n_tok, TM_TRACE_LOG_MAX_TOKENS);
        const size_t n = (size_t)n_tok * k;
        if ((len - pos - 8) / 2 < n)
            return tm_error_set(TM_ERR_FORMAT,
                                "%s: offset %zu: truncated record (%zu ids of layer %u, %zu bytes "
                                "left)",
                                origin, pos, n, tag, len - pos - 8);
        tm_trace_log_layer *ly = &log->layers[tag];
        const uint8_t *p = d + pos + 8;
        for (uint32_t t = 0; t < n_tok; t++) {
            for (uint32_t j = 0; j < k; j++) {
                const size_t i = (size_t)t * k + j;
                const uint32_t e = (uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8;
                if (!ly->calls) {
                    if (e >= E)
                        return tm_error_set(TM_ERR_FORMAT, "%s: offset %zu: expert %u of %u",
                                            origin, pos + 8 + 2 * i, e, E);
                    if (seen[e])
                        return tm_error_set(TM_ERR_FORMAT,
                                            "%s: offset %zu: expert %u twice in one token", origin,
                                            pos + 8 + 2 * i, e);
                    seen[e] = 1;
                } else
                    ly->ids[ly->n_ids + i] = (int32_t)e;
            }
            if (!ly->calls)
                for (uint32_t j = 0; j < k; j++) {
                    const size_t i = (size_t)t * k + j;
                    seen[(uint32_t)p[2 * i] | (uint32_t)p[2 * i + 1] << 8] = 0;
                }
        }
        if (ly->calls)
            ly->calls[ly->n_calls] =
                (tm_trace_log_call){.seq = (uint32_t)seq, .n_tok = n_tok, .off = ly->n_ids};
        ly->n_calls++, ly->n_ids += n;
        pos += 8 + 2 * n;
    }
    log->n_seq = (uint32_t)(seq + 1);
    return TM_OK;
}

tm_status trace_log_parse(const uint8_t *data, size_t len, const char *origin, tm_trace_log *out) {
    memset(out, 0, sizeof(*out));
    tm_status st = log_header(data, len, origin, &out->shape);
    if (st != TM_OK) return st;
    const uint32_t L = out->shape.n_layer;
    out->layers = calloc(L, sizeof(*out->layers));
    uint8_t *seen = calloc(out->shape.n_expert, 1);
    if (!out->layers || !seen) {
        free(seen);
        trace_log_free(out);
        return tm_error_set(TM_ERR_NOMEM, "%s: out of memory", origin);
    }
    if ((st = log_walk(data, len, origin, out, seen)) != TM_OK) goto fail;
    for (uint32_t l = 0; l < L; l++) {
        tm_trace_log_layer *ly = &out->layers[l];
        ly->calls = malloc((ly->n_calls ? ly->n_calls : 1) * sizeof(*ly->calls));
        ly->ids = malloc((ly->n_ids ? ly->n_ids : 1) * sizeof(int32_t));
        if (!ly->calls || !ly->ids) {
            st = tm_error_set(TM_ERR_NOMEM, "%s: out of memory for the routing log", origin);
            goto fail;
        }
        ly->n_calls = ly->n_ids = 0;
    }
    if ((st = log_walk(data, len, origin, out, seen)) != TM_OK) goto fail;
    free(seen);
    return TM_OK;
fail:
    free(seen);
    trace_log_free(out);
    return st;
}

tm_status trace_log_read(const char *path, tm_trace_log *out) {
    memset(out, 0, sizeof(*out));
    FILE *f = fopen(path, "rb");
    if (!f) return tm_error_set(TM_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    uint8_t *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len == cap) {
            uint8_t *b = realloc(buf, cap = cap ? 2 * cap : 1 << 20);
            if (!b) {
                free(buf), fclose(f);
                return tm_error_set(TM_ERR_NOMEM, "%s: out of memory reading it", path);
            }
            buf = b;
        }
        const size_t got = fread(buf + len, 1, cap - len, f);
        len += got;
        if (got == 0) break;
    }
    const bool bad = ferror(f) != 0;
    fclose(f);
    if (bad) {
        free(buf);
        return tm_error_set(TM_ERR_IO, "%s: read failed", path);
    }
    tm_status st = trace_log_parse(buf, len, path, out);
    free(buf);
    return st;
}
