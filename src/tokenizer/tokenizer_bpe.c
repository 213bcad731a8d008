/* Byte-level BPE (GPT-2 family) and the merge loop both tokenizer families share.
 *
 * A piece from the pre-tokenizer becomes one symbol per byte (the token of that
 * byte's GPT-2 alphabet character, which every byte-level vocabulary has); then
 * the adjacent pair with the lowest merge rank is replaced by its merged token,
 * leftmost first on equal ranks, until no adjacent pair has a merge. This is the
 * order HF tokenizers' Word::merge_all and llama.cpp use, so ids agree exactly.
 * Short pieces use a plain scan; long ones (runs of spaces, SPM's whole-segment
 * words) a heap over a linked list, O(n log n). */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tokenizer_internal.h"

/* ---- hashing ---- */

uint64_t tok_hash_bytes(const void *p, size_t n) {
    /* FNV-1a, then a final mix: token texts are short, this is plenty. */
    const uint8_t *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

int32_t tok_vocab_find(const tm_tokenizer *t, const char *s, size_t n) {
    const tm_str_map *m = &t->vocab;
    if (!m->slots) return -1;
    uint32_t i = (uint32_t)tok_hash_bytes(s, n) & m->mask;
    for (;;) {
        int32_t id = m->slots[i];
        if (id < 0) return -1;
        if (t->text_len[id] == n && !memcmp(t->text_blob + t->text_off[id], s, n)) return id;
        i = (i + 1) & m->mask;
    }
}

static inline uint64_t pair_hash(uint64_t k) {
    k ^= k >> 31;
    k *= 0x9e3779b97f4a7c15ull;
    k ^= k >> 29;
    return k;
}

const tm_pair_entry *tok_pair_find(const tm_pair_map *m, int32_t a, int32_t b) {
    uint64_t key = tok_pair_key(a, b);
    uint64_t i = pair_hash(key) & m->mask;
    for (;;) {
        const tm_pair_entry *e = &m->slots[i];
        if (e->key == key) return e;
        if (e->key == UINT64_MAX) return NULL;
        i = (i + 1) & m->mask;
    }
}

/* ---- UTF-8 and the byte alphabet ---- */

int tok_utf8_lead_len(uint8_t c) {
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) return 2;
    if (c >= 0xE0 && c <= 0xEF) return 3;
    if (c >= 0xF0 && c <= 0xF4) return 4;
    return 0;
}

size_t tok_utf8_valid_len(const uint8_t *s, size_t n) {
    if (n == 0) return 0;
    uint8_t c = s[0];
    int len = tok_utf8_lead_len(c);
    if (len == 0 || (size_t)len > n) return 0;
    if (len == 1) return 1;
    /* second byte ranges per RFC 3629 (no overlongs, surrogates or > U+10FFFF) */
    uint8_t lo = 0x80, hi = 0xBF;
    if (c == 0xE0)
        lo = 0xA0;
    else if (c == 0xED)
        hi = 0x9F;
    else if (c == 0xF0)
        lo = 0x90;
    else if (c == 0xF4)
        hi = 0x8F;
    if (s[1] < lo || s[1] > hi) return 0;
    for (int i = 2; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return (size_t)len;
}

size_t tok_utf8_put(uint32_t cp, char *out) {
    uint8_t *o = (uint8_t *)out;
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* GPT-2's bytes_to_unicode(): '!'..'~', '¡'..'¬', '®'..'ÿ' map to themselves,
 * the other 68 bytes to U+0100.. in byte order. */
static bool byte_is_printable(unsigned b) {
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t tok_byte_to_cp(uint8_t b) {
    if (byte_is_printable(b)) return b;
    uint32_t k = 0;
    for (unsigned i = 0; i < b; i++)
        if (!byte_is_printable(i)) k++;
    return 0x100 + k;
}

int tok_cp_to_byte(uint32_t cp) {
    if (cp < 0x100) return byte_is_printable(cp) ? (int)cp : -1;
    if (cp >= 0x100 + 68) return -1;
    uint32_t k = cp - 0x100;
    for (unsigned i = 0; i < 256; i++)
        if (!byte_is_printable(i) && k-- == 0) return (int)i;
    return -1;
}

/* ---- the merge loop ---- */

static void merge_scan(const tm_tokenizer *t, int32_t *ids, size_t *np) {
    size_t n = *np;
    uint32_t rank[64];
    int32_t merged[64];
    for (size_t i = 0; i + 1 < n; i++) {
        const tm_pair_entry *e = tok_pair_find(&t->pairs, ids[i], ids[i + 1]);
        rank[i] = e ? e->rank : UINT32_MAX;
        merged[i] = e ? e->merged : -1;
    }
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == UINT32_MAX) break;
        ids[best] = merged[best];
        /* drop symbol best+1 and pair best+1 */
        memmove(ids + best + 1, ids + best + 2, (n - best - 2) * sizeof(*ids));
        if (best + 2 < n) {
            memmove(rank + best + 1, rank + best + 2, (n - best - 3) * sizeof(*rank));
            memmove(merged + best + 1, merged + best + 2, (n - best - 3) * sizeof(*merged));
        }
        n--;
        for (size_t j = best ? best - 1 : 0; j <= best && j + 1 < n; j++) {
            const tm_pair_entry *e = tok_pair_find(&t->pairs, ids[j], ids[j + 1]);
            rank[j] = e ? e->rank : UINT32_MAX;
            merged[j] = e ? e->merged : -1;
        }
    }
    *np = n;
}

typedef struct merge_cand {
    uint32_t rank;
    uint32_t pos; /* left symbol's original index */
    int32_t left, right;
} merge_cand;

static bool cand_less(const merge_cand *a, const merge_cand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(merge_cand *h, size_t *n, merge_cand c) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!cand_less(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static merge_cand heap_pop(merge_cand *h, size_t *n) {
    merge_cand top = h[0];
    merge_cand last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const merge_cand *best = &last;
        if (l < *n && cand_less(&h[l], best)) {
            m = l;
            best = &h[l];
        }
        if (r < *n && cand_less(&h[r], best)) {
            m = r;
        }
        if (m == i) break;
        h[i] = h[m];
        i = m;
    }
    if (*n) h[i] = last;
    return top;
}

static tm_status merge_heap(const tm_tokenizer *t, int32_t *ids, size_t *np) {
    size_t n = *np;
    int32_t *prev = malloc(n * sizeof(*prev));
    int32_t *next = malloc(n * sizeof(*next));
    merge_cand *heap = malloc(3 * n * sizeof(*heap)); /* n-1 at start, at most 2 per merge */
    if (!prev || !next || !heap) {
        free(prev);
        free(next);
        free(heap);
        return tm_error_set(TM_ERR_NOMEM, "tokenizer: out of memory merging a %zu-symbol piece", n);
    }
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        prev[i] = (int32_t)i - 1;
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        const tm_pair_entry *e = tok_pair_find(&t->pairs, ids[i], ids[i + 1]);
        if (e) heap_push(heap, &hn, (merge_cand){e->rank, (uint32_t)i, ids[i], ids[i + 1]});
    }
    while (hn) {
        merge_cand c = heap_pop(heap, &hn);
        int32_t i = (int32_t)c.pos, j = next[i];
        /* stale: the left symbol was absorbed or either side has changed */
        if (ids[i] != c.left || j < 0 || ids[j] != c.right) continue;
        const tm_pair_entry *e = tok_pair_find(&t->pairs, c.left, c.right);
        ids[i] = e->merged;
        ids[j] = -1; /* absorbed */
        next[i] = next[j];
        if (next[j] >= 0) prev[next[j]] = i;
        if (prev[i] >= 0) {
            int32_t p = prev[i];
            const tm_pair_entry *pe = tok_pair_find(&t->pairs, ids[p], ids[i]);
            if (pe) heap_push(heap, &hn, (merge_cand){pe->rank, (uint32_t)p, ids[p], ids[i]});
        }
        if (next[i] >= 0) {
            int32_t q = next[i];
            const tm_pair_entry *ne = tok_pair_find(&t->pairs, ids[i], ids[q]);
            if (ne) heap_push(heap, &hn, (merge_cand){ne->rank, (uint32_t)i, ids[i], ids[q]});
        }
    }
    size_t m = 0;
    for (int32_t i = 0; i >= 0; i = next[i]) ids[m++] = ids[i];
    *np = m;
    free(prev);
    free(next);
    free(heap);
    return TM_OK;
}

tm_status tok_merge(const tm_tokenizer *t, int32_t *ids, size_t *n) {
    if (*n < 2) return TM_OK;
    if (*n <= 64) {
        merge_scan(t, ids, n);
        return TM_OK;
    }
    return merge_heap(t, ids, n);
}

/* ---- byte-level BPE of a run of text ---- */

typedef struct bpe_ctx {
    const tm_tokenizer *t;
    tm_tokens *out;
    int32_t *sym;
    size_t sym_cap;
    char *mapped;
    size_t mapped_cap;
} bpe_ctx;

static tm_status grow(void **p, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return TM_OK;
    size_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * elem);
    if (!q) return tm_error_set(TM_ERR_NOMEM, "tokenizer: out of memory (%zu bytes)", c * elem);
    *p = q;
    *cap = c;
    return TM_OK;
}

static tm_status bpe_piece(void *vctx, const char *piece, size_t n) {
    bpe_ctx *c = vctx;
    const tm_tokenizer *t = c->t;
    tm_status st;
    if (t->ignore_merges) {
        /* Llama 3: a piece that is itself a token is taken whole, not merged */
        if ((st = grow((void **)&c->mapped, &c->mapped_cap, 2 * n, 1))) return st;
        size_t m = 0;
        for (size_t i = 0; i < n; i++)
            m += tok_utf8_put(tok_byte_to_cp((uint8_t)piece[i]), c->mapped + m);
        int32_t id = tok_vocab_find(t, c->mapped, m);
        if (id >= 0 && t->type[id] == TM_TOKEN_TYPE_NORMAL)
            return tokenizer_tokens_push(c->out, id);
    }
    if ((st = grow((void **)&c->sym, &c->sym_cap, n, sizeof(int32_t)))) return st;
    for (size_t i = 0; i < n; i++) c->sym[i] = t->byte_token[(uint8_t)piece[i]];
    size_t m = n;
    if ((st = tok_merge(t, c->sym, &m))) return st;
    if ((st = grow((void **)&c->out->ids, &c->out->cap, c->out->n + m, sizeof(int32_t)))) return st;
    memcpy(c->out->ids + c->out->n, c->sym, m * sizeof(int32_t));
    c->out->n += m;
    return TM_OK;
}

tm_status bpe_encode_text(const tm_tokenizer *t, tm_pretok_scratch *sc, const char *text,
                          size_t len, tm_tokens *out) {
    uint8_t *norm = NULL;
    if (t->normalize_nfc) {
        bool ascii = true;
        for (size_t i = 0; i < len && ascii; i++) ascii = (uint8_t)text[i] < 0x80;
        if (!ascii) {
            utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)text, (utf8proc_ssize_t)len,
                                              &norm, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
            /* the text was checked to be valid UTF-8, so only memory can fail here */
            if (r < 0)
                return tm_error_set(TM_ERR_NOMEM, "tokenizer: NFC failed: %s", utf8proc_errmsg(r));
            text = (const char *)norm;
            len = (size_t)r;
        }
    }
    bpe_ctx c = {.t = t, .out = out};
    tm_status st = pretok_split(&t->pretok, sc, text, len, bpe_piece, &c);
    free(c.sym);
    free(c.mapped);
    free(norm);
    return st;
}
