/* libFuzzer target for routing logs: parse any bytes with trace_log_parse();
 * when a log is accepted, check what the reader promises (calls in order and
 * contiguous in each layer's ids, every id in range, sequence indices rising
 * and below n_seq), then write the log again with the writer (to /dev/shm),
 * in its original record order, and parse that: the same log (abort()
 * otherwise). Build and run: see fuzz/README.md. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "trace/trace_log.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(bool ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "trace_log_fuzz: invariant broken: %s\n", what);
        abort();
    }
}

static uint32_t get_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    tm_trace_log log, back;
    if (trace_log_parse(data, size, "fuzz", &log) != TM_OK) return 0;
    const uint32_t L = log.shape.n_layer, k = log.shape.n_expert_used;
    for (uint32_t l = 0; l < L; l++) {
        const tm_trace_log_layer *ly = &log.layers[l];
        uint64_t off = 0;
        for (uint64_t c = 0; c < ly->n_calls; c++) {
            check(ly->calls[c].off == off && ly->calls[c].n_tok >= 1, "calls contiguous");
            check(ly->calls[c].seq < log.n_seq && (!c || ly->calls[c].seq >= ly->calls[c - 1].seq),
                  "sequences in order");
            off += (uint64_t)ly->calls[c].n_tok * k;
        }
        check(off == ly->n_ids, "ids counted");
        for (uint64_t i = 0; i < ly->n_ids; i++)
            check(ly->ids[i] >= 0 && (uint32_t)ly->ids[i] < log.shape.n_expert, "ids in range");
    }
    /* write it again: walk the records of the input in order */
    char path[64];
    snprintf(path, sizeof(path), "/dev/shm/trace_log_fuzz.%ld", (long)getpid());
    tm_trace_log_writer *w;
    check(trace_log_writer_open(path, &log.shape, &w) == TM_OK, "writer opens");
    uint64_t *next = calloc(L, sizeof(uint64_t));
    for (size_t pos = TM_TRACE_LOG_HEADER; pos < size;) {
        const uint32_t tag = get_u32(data + pos);
        if (tag == TM_TRACE_LOG_SEQ) {
            trace_log_writer_sequence(w);
            pos += 4;
            continue;
        }
        const tm_trace_log_call *c = &log.layers[tag].calls[next[tag]++];
        trace_log_writer_record(w, tag, log.layers[tag].ids + c->off, c->n_tok);
        pos += 8 + 2 * (size_t)c->n_tok * k;
    }
    free(next);
    check(trace_log_writer_close(w, true) == TM_OK, "writer closes");
    check(trace_log_read(path, &back) == TM_OK, "reads its own output");
    remove(path);
    check(back.n_seq == log.n_seq && !strcmp(back.shape.arch, log.shape.arch), "header");
    for (uint32_t l = 0; l < L; l++) {
        const tm_trace_log_layer *a = &log.layers[l], *b = &back.layers[l];
        check(a->n_calls == b->n_calls && a->n_ids == b->n_ids, "layer sizes");
        check(!a->n_calls || !memcmp(a->calls, b->calls, a->n_calls * sizeof(*a->calls)), "calls");
        check(!a->n_ids || !memcmp(a->ids, b->ids, a->n_ids * sizeof(int32_t)), "ids");
    }
    trace_log_free(&back);
    trace_log_free(&log);
    return 0;
}
