/* Status codes and the last-error message.
 *
 * Every function that can fail returns tm_status. On failure it also records a
 * human-readable message (file, offset, field, what was expected) with
 * tm_error_set(); the caller prints it with tm_error_message(). The message is
 * thread-local so worker threads cannot clobber each other's errors. */
#ifndef TM_CORE_STATUS_H
#define TM_CORE_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tm_status {
    TM_OK = 0,
    TM_ERR_ARG,         /* bad argument or flag from the caller or user */
    TM_ERR_IO,          /* open/read/write/mmap failed */
    TM_ERR_FORMAT,      /* malformed input file */
    TM_ERR_UNSUPPORTED, /* valid input we do not handle (type, architecture) */
    TM_ERR_NOMEM,       /* allocation failed */
    TM_ERR_DEVICE,      /* GPU missing, too old, or out of memory */
} tm_status;

/* Record the message for the current thread's last error; returns `st` so a
 * caller can write `return tm_error_set(TM_ERR_IO, "...")`. */
tm_status tm_error_set(tm_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Prepend context ("while loading x: ") to the current message. */
tm_status tm_error_wrap(tm_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

const char *tm_error_message(void);
const char *tm_status_name(tm_status st);
void tm_error_clear(void);

#ifdef __cplusplus
}
#endif
#endif
