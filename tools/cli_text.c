/* Text through the public API for run and tokenize: a tokenization of any
 * length into a buffer of its own. */
#include <stdlib.h>

#include "cli.h"

tm_status cli_tokenize(const tm_model *m, const char *text, size_t len, bool add_special,
                       bool parse_special, int32_t **ids, size_t *n) {
    size_t cap = len + 16; /* a token has a byte at least, but for BOS and EOS */
    *n = 0;
    for (;;) {
        int32_t *v = realloc(*ids, cap * sizeof(int32_t));
        if (!v) return TM_ERR_NOMEM;
        *ids = v;
        const tm_status st = tm_tokenize(m, text, len, add_special, parse_special, v, cap, n);
        if (st != TM_ERR_ARG || *n <= cap) return st;
        cap = *n; /* more tokens than that: the size it asked for */
    }
}
