/* The element-wise launchers of ew.cu in the host mock: the contract of cuda.h
 * (a scale, a soft-cap, GELU-tanh times the up value) written out in double, one
 * rounding to float a value. */
#include <math.h>
#include <stdint.h>

#include "cuda/cuda_args.h"

#include "cuda_mock.h"

typedef struct ew2_arg {
    float *y;
    const float *g, *u;
    float s;
    int64_t n;
} ew2_arg;

static bool scale_run(void *arg, char *err, size_t err_size) {
    const ew2_arg *a = arg;
    NEED_DEVICE(a->y, (size_t)a->n * 4, "x");
    for (int64_t i = 0; i < a->n; i++) a->y[i] = (float)((double)a->y[i] * a->s);
    return true;
}

static bool softcap_run(void *arg, char *err, size_t err_size) {
    const ew2_arg *a = arg;
    NEED_DEVICE(a->y, (size_t)a->n * 4, "x");
    for (int64_t i = 0; i < a->n; i++) a->y[i] = (float)(a->s * tanh((double)a->y[i] / a->s));
    return true;
}

static bool geglu_run(void *arg, char *err, size_t err_size) {
    const ew2_arg *a = arg;
    NEED_DEVICE(a->y, (size_t)a->n * 4, "y");
    NEED_DEVICE(a->g, (size_t)a->n * 4, "g");
    NEED_DEVICE(a->u, (size_t)a->n * 4, "u");
    const double c = sqrt(2.0 / 3.14159265358979323846);
    for (int64_t i = 0; i < a->n; i++) {
        const double x = a->g[i];
        a->y[i] = (float)(0.5 * x * (1.0 + tanh(c * (x + 0.044715 * x * x * x))) * a->u[i]);
    }
    return true;
}

tm_status cuda_scale(float *x, float s, int64_t n, tm_cuda_stream stream) {
    tm_status st = cuda_ew_args_check("cuda_scale", n, 1.0f);
    if (st != TM_OK || n == 0) return st;
    const ew2_arg a = {.y = x, .s = s, .n = n};
    return mock_launch(stream, "cuda_scale", scale_run, &a, sizeof(a));
}

tm_status cuda_softcap(float *x, float cap, int64_t n, tm_cuda_stream stream) {
    tm_status st = cuda_ew_args_check("cuda_softcap", n, cap);
    if (st != TM_OK || n == 0) return st;
    const ew2_arg a = {.y = x, .s = cap, .n = n};
    return mock_launch(stream, "cuda_softcap", softcap_run, &a, sizeof(a));
}

tm_status cuda_geglu(float *y, const float *g, const float *u, int64_t n, tm_cuda_stream stream) {
    tm_status st = cuda_ew_args_check("cuda_geglu", n, 1.0f);
    if (st != TM_OK || n == 0) return st;
    const ew2_arg a = {.y = y, .g = g, .u = u, .n = n};
    return mock_launch(stream, "cuda_geglu", geglu_run, &a, sizeof(a));
}
