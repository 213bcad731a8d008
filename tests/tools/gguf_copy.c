/* gguf_copy: read IN with our GGUF reader and write it to OUT with our writer
 * (gguf_file_copy), for the oracle's "files we write" direction.
 * usage: gguf_copy IN OUT; on error: message on stderr, exit 1. */
#include <stdio.h>

#include "gguf/gguf.h"

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: gguf_copy IN OUT\n");
        return 2;
    }
    tm_gguf_file *f;
    tm_status st = gguf_file_open(argv[1], &f);
    if (!st) {
        st = gguf_file_copy(f, argv[2]);
        gguf_file_close(f);
    }
    if (st) {
        fprintf(stderr, "gguf_copy: %s (%s)\n", tm_error_message(), tm_status_name(st));
        return 1;
    }
    return 0;
}
