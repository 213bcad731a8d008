#include "core/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static tm_log_level log_level = TM_LOG_INFO;
static int log_level_from_env_done;
/* The public API's one piece of global state (tm_log_set_callback): set once at
 * start-up by an embedding program, read by every thread that logs. */
static _Atomic(tm_log_fn) log_fn;
static void *_Atomic log_user;

static void log_level_from_env(void) {
    const char *s = getenv("TIERMOE_LOG");
    log_level_from_env_done = 1;
    if (!s) return;
    if (!strcmp(s, "error"))
        log_level = TM_LOG_ERROR;
    else if (!strcmp(s, "warn"))
        log_level = TM_LOG_WARN;
    else if (!strcmp(s, "info"))
        log_level = TM_LOG_INFO;
    else if (!strcmp(s, "debug"))
        log_level = TM_LOG_DEBUG;
}

void tm_log_set_level(tm_log_level level) {
    log_level_from_env_done = 1;
    log_level = level;
}

tm_log_level tm_log_get_level(void) {
    if (!log_level_from_env_done) log_level_from_env();
    return log_level;
}

void tm_log_set_callback(tm_log_fn fn, void *user) {
    atomic_store(&log_user, user);
    atomic_store(&log_fn, fn);
}

void tm_log(tm_log_level level, const char *fmt, ...) {
    static const char *names[] = {"error", "warn", "info", "debug"};
    if (level > tm_log_get_level()) return;
    va_list ap;
    va_start(ap, fmt);
    const tm_log_fn fn = atomic_load(&log_fn);
    if (fn) {
        char text[1024]; /* a log line; longer ones are cut */
        vsnprintf(text, sizeof(text), fmt, ap);
        va_end(ap);
        fn(level, text, atomic_load(&log_user));
        return;
    }
    fprintf(stderr, "tiermoe: %s: ", names[level]);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

void tm_panic(const char *file, int line, const char *expr) {
    fprintf(stderr, "tiermoe: internal error at %s:%d: assertion `%s` failed\n", file, line, expr);
    abort();
}
