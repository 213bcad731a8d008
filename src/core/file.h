/* Files written whole and atomically: to "path.tmp.PID", then renamed over
 * path, so a reader sees the old file or the new one, never half of one
 * (learn files, plans, routing logs). */
#ifndef TM_CORE_FILE_H
#define TM_CORE_FILE_H

#include <stddef.h>
#include <stdio.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The temporary name beside path ("path.tmp.PID"); TM_ERR_ARG when it does not fit. */
tm_status tm_file_tmp_path(const char *path, char *tmp, size_t cap);
/* Close f (written to tmp) and rename tmp over path; on any failure tmp is
 * removed and the message names the file. f may be NULL (only the cleanup). */
tm_status tm_file_commit(FILE *f, const char *tmp, const char *path);
/* Write len bytes to path atomically. */
tm_status tm_file_write_atomic(const char *path, const void *data, size_t len);

#ifdef __cplusplus
}
#endif
#endif
