/* Logging to stderr with a level threshold (TIERMOE_LOG=error|warn|info|debug). */
#ifndef TM_CORE_LOG_H
#define TM_CORE_LOG_H

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* tm_log_level is the public API's (include/tiermoe.h, through status.h), as is the
 * callback that takes the lines instead of stderr (tm_log_set_callback). */

void tm_log_set_level(tm_log_level level);
tm_log_level tm_log_get_level(void);
void tm_log(tm_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define tm_log_error(...) tm_log(TM_LOG_ERROR, __VA_ARGS__)
#define tm_log_warn(...)  tm_log(TM_LOG_WARN, __VA_ARGS__)
#define tm_log_info(...)  tm_log(TM_LOG_INFO, __VA_ARGS__)
#define tm_log_debug(...) tm_log(TM_LOG_DEBUG, __VA_ARGS__)

/* Invariant checks: a broken invariant is a bug, not bad input; stop with file:line. */
void tm_panic(const char *file, int line, const char *expr) __attribute__((noreturn));
#define TM_ASSERT(x) ((x) ? (void)0 : tm_panic(__FILE__, __LINE__, #x))

#ifdef __cplusplus
}
#endif
#endif
