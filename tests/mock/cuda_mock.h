/* Internals of the host mock of the CUDA backend, shared by its two halves:
 * the runtime, cuda_mock.c (device, memory, copies) and cuda_mock_stream.c
 * (stream worker, graphs, events), and the op launchers (cuda_mock_ops.c and
 * the other cuda_mock_*.c). Nothing outside tests/mock includes it. */
#ifndef TM_TESTS_MOCK_CUDA_MOCK_H
#define TM_TESTS_MOCK_CUDA_MOCK_H

#include <stdbool.h>
#include <stddef.h>

#include "cuda/cuda.h"

/* A closure's body, run on the stream's worker thread with its own copy of
 * the argument block. Returns false after writing why into err (at most
 * err_size bytes): the stream is then sticky failed, as after a kernel fault. */
typedef bool (*mock_fn)(void *arg, char *err, size_t err_size);

/* Queue fn with a copy of arg[0 .. size) on stream (or append it to the
 * graph being captured there) and return at once. The block is copied with
 * memcpy, here and again for every graph replay, so it must hold no pointer
 * into itself (variable parts go in a flexible array member, found from the
 * block's address). TM_ERR_DEVICE once the stream has failed. */
tm_status mock_launch(tm_cuda_stream stream, const char *op, mock_fn fn, const void *arg,
                      size_t size);

/* For an operation CUDA cannot capture: outside a capture TM_OK; during one
 * it invalidates the capture (cuda_graph_end then fails) and returns
 * TM_ERR_DEVICE naming op. */
tm_status mock_not_in_capture(tm_cuda_stream stream, const char *op);

/* Whether [p, p + bytes) lies in one block the device can address (a live
 * pool, or pinned host memory from cuda_host_alloc / cuda_host_alloc_mapped).
 * A kernel given anything else fails, as an illegal address would on a GPU. */
bool mock_device_range(const void *p, size_t bytes);

/* Write the message into err (snprintf) and return false: `return mock_fail(...)`. */
bool mock_fail(char *err, size_t err_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* In a closure: fail unless [p, p + bytes) is device-addressable. */
#define NEED_DEVICE(p, bytes, what)                                                                \
    do {                                                                                           \
        if (!mock_device_range((p), (bytes)))                                                      \
            return mock_fail(err, err_size,                                                        \
                             "illegal address: %s (%zu bytes at %p) is not device memory", what,   \
                             (size_t)(bytes), (const void *)(p));                                  \
    } while (0)

#endif
