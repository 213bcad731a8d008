#include "core/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define TM_ERROR_CAP 1024

static _Thread_local char error_buf[TM_ERROR_CAP];

tm_status tm_error_set(tm_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(error_buf, sizeof(error_buf), fmt, ap);
    va_end(ap);
    return st;
}

tm_status tm_error_wrap(tm_status st, const char *fmt, ...) {
    char prefix[TM_ERROR_CAP], old[TM_ERROR_CAP];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof(prefix), fmt, ap);
    va_end(ap);
    memcpy(old, error_buf, sizeof(old));
    /* Truncation is acceptable here: the message is for people. */
    size_t n = strlen(prefix);
    if (n > TM_ERROR_CAP - 3) n = TM_ERROR_CAP - 3;
    memcpy(error_buf, prefix, n);
    memcpy(error_buf + n, ": ", 2);
    size_t rest = strlen(old);
    if (rest > TM_ERROR_CAP - n - 3) rest = TM_ERROR_CAP - n - 3;
    memcpy(error_buf + n + 2, old, rest);
    error_buf[n + 2 + rest] = '\0';
    return st;
}

const char *tm_error_message(void) {
    return error_buf[0] ? error_buf : "no error message";
}

void tm_error_clear(void) {
    error_buf[0] = '\0';
}

const char *tm_status_name(tm_status st) {
    switch (st) {
    case TM_OK:
        return "ok";
    case TM_ERR_ARG:
        return "bad argument";
    case TM_ERR_IO:
        return "I/O error";
    case TM_ERR_FORMAT:
        return "format error";
    case TM_ERR_UNSUPPORTED:
        return "unsupported";
    case TM_ERR_NOMEM:
        return "out of memory";
    case TM_ERR_DEVICE:
        return "device error";
    }
    return "unknown status";
}
