/* tok_vocab_gguf: write a GGUF holding only the tokenizer keys imported from a
 * HuggingFace tokenizer.json (the importer `tiermoe mkmodel --vocab` uses).
 * usage: tok_vocab_gguf TOKENIZER_JSON OUT.gguf [--pad N] [--no-merges]
 * --no-merges: SentencePiece-style vocabularies get scores only, as llama.cpp
 * writes them from a tokenizer.model. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer.h"

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: tok_vocab_gguf TOKENIZER_JSON OUT.gguf [--pad N] [--no-merges]\n");
        return 2;
    }
    tm_tokenizer_import_opts o = {0};
    for (int i = 3; i < argc; i++) {
        if (!strcmp(argv[i], "--pad") && i + 1 < argc)
            o.pad_to_n_vocab = (uint32_t)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "--no-merges"))
            o.spm_skip_merges = true;
        else {
            fprintf(stderr, "tok_vocab_gguf: unknown option '%s'\n", argv[i]);
            return 2;
        }
    }
    tm_gguf_writer *w;
    uint32_t n = 0;
    tm_status st = gguf_writer_init(&w, 3, TM_GGUF_DEFAULT_ALIGNMENT);
    if (st == TM_OK) st = gguf_writer_set_str(w, "general.architecture", "tokenizer-only");
    if (st == TM_OK) st = tokenizer_import_hf_ex(argv[1], w, &o, &n);
    if (st == TM_OK) st = gguf_writer_begin(w, argv[2]);
    if (st == TM_OK) st = gguf_writer_finish(w);
    gguf_writer_free(w);
    if (st) {
        fprintf(stderr, "tok_vocab_gguf: %s\n", tm_error_message());
        return 1;
    }
    printf("%s: %u tokens\n", argv[2], n);
    return 0;
}
