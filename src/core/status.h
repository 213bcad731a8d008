/* Status codes and the last-error message.
 *
 * Every function that can fail returns tm_status. On failure it also records a
 * human-readable message (file, offset, field, what was expected) with
 * tm_error_set(); the caller prints it with tm_error_message(). The message is
 * thread-local so worker threads cannot clobber each other's errors. */
#ifndef TM_CORE_STATUS_H
#define TM_CORE_STATUS_H

#include "../../include/tiermoe.h"

#ifdef __cplusplus
extern "C" {
#endif

/* tm_status (the enum), tm_error_message and tm_status_name are the public
 * API's (include/tiermoe.h): one definition, here by relative path so that every
 * build of the sources (fuzz, emulation scripts) finds it without -Iinclude. */

/* Record the message for the current thread's last error; returns `st` so a
 * caller can write `return tm_error_set(TM_ERR_IO, "...")`. */
tm_status tm_error_set(tm_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepend context ("while loading x: ") to the current message. */
tm_status tm_error_wrap(tm_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

void tm_error_clear(void);

#ifdef __cplusplus
}
#endif
#endif
