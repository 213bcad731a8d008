/* What the two halves of the host mock's runtime share: cuda_mock.c (device,
 * memory, copies) and cuda_mock_stream.c (streams, graphs, events). Nothing
 * outside tests/mock includes it. */
#ifndef TM_TESTS_MOCK_CUDA_MOCK_STREAM_H
#define TM_TESTS_MOCK_CUDA_MOCK_STREAM_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

#include "cuda_mock.h"

#define MOCK_MAX_GPUS 8

/* The device whose stream the calling thread runs (-1: the host), set by a
 * stream's worker; the calling host thread's current device (cudaSetDevice).
 * Both defined in cuda_mock.c. */
extern _Thread_local int mock_t_dev;
extern _Thread_local int mock_t_cur;

/* The environment variable's value as a non-negative integer, def when unset
 * or not one. */
long mock_env_long(const char *name, long def);

/* The host's monotonic time in milliseconds. */
double mock_now_ms(void);

/* A queued function and a copy of its argument block (cuda_mock_stream.c). */
typedef struct mock_closure mock_closure;

struct CUstream_st {
    pthread_mutex_t mu;
    pthread_cond_t work, idle;
    pthread_t thread;
    mock_closure *head, *tail; /* queued, not started */
    bool busy, stop;           /* the worker runs a closure; close asked */
    bool capturing, cap_invalid;
    mock_closure *cap_head, *cap_tail;
    struct CUstream_st *origin; /* joined into this stream's capture (NULL: none) */
    /* capturing: the streams that joined it (each GPU's compute stream and copies ahead) */
    struct CUstream_st *joined[2 * MOCK_MAX_GPUS];
    int n_joined;
    bool unjoined;    /* joined: work since the origin last waited for it */
    char cap_why[96]; /* what invalidated the capture */
    bool failed;      /* sticky */
    bool side;        /* made by cuda_stream_create (MOCK_FAIL_SIDE_COPY) */
    int dev;          /* its device: a compute stream's, or the one current when a side
                         stream was made (as CUDA's streams belong to a device) */
    char err[640];
    long latency_us;
};

/* A stream of device dev with its worker thread started (NULL: it could not
 * start); mock_stream_destroy drains its queue, joins the worker and frees it. */
struct CUstream_st *mock_stream_create(int dev);
void mock_stream_destroy(struct CUstream_st *s);

/* TM_ERR_ARG naming op for a NULL stream (the mock has no default stream). */
tm_status mock_stream_check(tm_cuda_stream s, const char *op);

/* mock_launch without the current-device check: copies, which CUDA queues on any
 * device's stream. */
tm_status mock_stream_launch(tm_cuda_stream stream, const char *op, mock_fn fn, const void *arg,
                             size_t size);

/* Under s->mu: a synchronous call during a capture; invalidates it and
 * returns TM_ERR_DEVICE naming op. */
tm_status mock_capture_break(struct CUstream_st *s, const char *op);

#endif
