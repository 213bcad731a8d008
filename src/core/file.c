/* Atomic whole-file writes: tmp file beside the target, then rename. See file.h. */
#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "core/file.h"

tm_status tm_file_tmp_path(const char *path, char *tmp, size_t cap) {
    const int n = snprintf(tmp, cap, "%s.tmp.%ld", path, (long)getpid());
    if (n < 0 || (size_t)n >= cap) return tm_error_set(TM_ERR_ARG, "%s: path too long", path);
    return TM_OK;
}

tm_status tm_file_commit(FILE *f, const char *tmp, const char *path) {
    bool ok = f && !ferror(f);
    int e = errno;
    if (f && fclose(f) != 0 && ok) ok = false, e = errno;
    if (!ok) {
        remove(tmp);
        return tm_error_set(TM_ERR_IO, "%s: write failed: %s", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        e = errno;
        remove(tmp);
        return tm_error_set(TM_ERR_IO, "%s: cannot rename %s to it: %s", path, tmp, strerror(e));
    }
    return TM_OK;
}

tm_status tm_file_write_atomic(const char *path, const void *data, size_t len) {
    char tmp[4096];
    tm_status st = tm_file_tmp_path(path, tmp, sizeof(tmp));
    if (st != TM_OK) return st;
    FILE *f = fopen(tmp, "wb");
    if (!f) return tm_error_set(TM_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    if (len && fwrite(data, 1, len, f) != len) {
        const int e = errno;
        fclose(f);
        remove(tmp);
        return tm_error_set(TM_ERR_IO, "%s: write failed: %s", tmp, strerror(e));
    }
    return tm_file_commit(f, tmp, path);
}
