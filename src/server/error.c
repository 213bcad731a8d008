/* The server's messages: its functions return tm_status as the library's do,
 * with a message of their own per thread (the library's tm_error_message is
 * for the library's calls; the server copies it when one of them fails). */
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include "server_internal.h"

static _Thread_local char srv_message[1024] = "no error message";

const char *server_error_message(void) {
    return srv_message;
}

tm_status srv_error_set(tm_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(srv_message, sizeof(srv_message), fmt, ap);
    va_end(ap);
    return st;
}

tm_status srv_error_api(tm_status st) {
    if (st != TM_OK) srv_error_set(st, "%s", tm_error_message());
    return st;
}

uint64_t srv_time_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
