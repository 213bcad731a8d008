/* Import a HuggingFace tokenizer.json (+ tokenizer_config.json, config.json and
 * chat_template.jinja beside it, when present) into tokenizer.ggml.* GGUF keys,
 * the way llama.cpp's convert_hf_to_gguf.py and the gguf package's SpecialVocab
 * write them:
 *   byte-level BPE (decoder ByteLevel, no byte_fallback): model "gpt2", pre from
 *     the pre-tokenizer regex, tokens, token_type (NORMAL; added tokens CONTROL
 *     when special or shaped like <|...|>, else USER_DEFINED; holes "[PAD<id>]"
 *     UNUSED), merges as "left right" strings (the array form's spaces become
 *     U+0120 as SpecialVocab does).
 *   SentencePiece-style BPE (byte_fallback): model "llama", pre "default", the
 *     same plus BYTE for <0xXX>, UNKNOWN for the unk token, scores (minus the rank
 *     of the first merge that makes a token, so rank order survives a file
 *     without merges) and add_space_prefix from the Prepend/Metaspace normalizer.
 *   Special ids from tokenizer_config.json's *_token (looked up among the added
 *     tokens, like SpecialVocab), then config.json's *_token_id; add_bos/add_eos
 *     from the TemplateProcessing post-processor, overridden by the config. */
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer/tokenizer_internal.h"

#define MAX_IMPORT_TOKENS (1u << 24) /* far above any real vocabulary; bounds hostile ids */
/* tokenizer.json numbers its tokens densely (a real vocabulary's holes, filled
 * with "[PAD<id>]", are a handful of ids): an id must stay below twice the
 * entries (model.vocab plus added_tokens) plus this slack, so that a small file
 * cannot make the importer materialise millions of padding tokens. */
#define IMPORT_ID_SLACK 1024

typedef struct import_state {
    const char *path;
    json_t *tj, *cfg, *model_cfg;
    uint32_t n;
    const char **text; /* borrowed from the JSON, or owned pad names */
    char **owned;
    uint8_t *added; /* 0 = base vocab, 1 = added special, 2 = added non-special */
    int32_t *type;
    float *score;
    bool spm;
    const char *pre;
    const char **merges;
    char **merge_owned;
    size_t n_merges;
} import_state;

static tm_status jerr(const import_state *s, const char *what) {
    return tm_error_set(TM_ERR_FORMAT, "%s: %s", s->path, what);
}

/* Parse the file `name` in the directory of `path`. Absent: *out = NULL and OK;
 * present but unreadable: a clear error. Integers are read as reals so that
 * huge values (model_max_length = 1e30) do not fail the parse. */
static tm_status load_json_beside(const char *path, const char *name, json_t **out) {
    *out = NULL;
    const char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash - path + 1) : 0;
    char *p = malloc(dir + strlen(name) + 1);
    if (!p) return tm_error_set(TM_ERR_NOMEM, "tokenizer import: out of memory");
    memcpy(p, path, dir);
    strcpy(p + dir, name);
    FILE *f = fopen(p, "rb");
    if (!f) {
        free(p);
        return TM_OK;
    }
    fclose(f);
    json_error_t e;
    json_t *j = json_load_file(p, JSON_DECODE_INT_AS_REAL, &e);
    tm_status st = TM_OK;
    if (!j || !json_is_object(j)) {
        st = tm_error_set(TM_ERR_FORMAT, "%s:%d:%d: %s", p, e.line, e.column,
                          j ? "expected a JSON object" : e.text);
        json_decref(j);
        j = NULL;
    }
    free(p);
    *out = j;
    return st;
}

static char *read_file_beside(const char *path, const char *name) {
    const char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash - path + 1) : 0;
    char *p = malloc(dir + strlen(name) + 1);
    if (!p) return NULL;
    memcpy(p, path, dir);
    strcpy(p + dir, name);
    FILE *f = fopen(p, "rb");
    free(p);
    if (!f) return NULL;
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 4096 + 1 > cap) {
            cap = 2 * cap + 8192;
            char *nb = realloc(buf, cap);
            if (!nb) break;
            buf = nb;
        }
        size_t r = fread(buf + n, 1, 4096, f);
        n += r;
        if (r < 4096) break;
    }
    fclose(f);
    if (buf) buf[n] = 0;
    return buf;
}

static void state_free(import_state *s) {
    if (s->owned)
        for (uint32_t i = 0; i < s->n; i++) free(s->owned[i]);
    if (s->merge_owned)
        for (size_t i = 0; i < s->n_merges; i++) free(s->merge_owned[i]);
    free(s->owned);
    free(s->text);
    free(s->added);
    free(s->type);
    free(s->score);
    free(s->merges);
    free(s->merge_owned);
    json_decref(s->tj);
    json_decref(s->cfg);
    json_decref(s->model_cfg);
}

static bool looks_special(const char *t) {
    size_t n = strlen(t);
    if (!strcmp(t, "<pad>") || !strcmp(t, "<mask>") || !strcmp(t, "<2mass>") ||
        !strcmp(t, "[@BOS@]"))
        return true;
    if (n >= 4 && !strncmp(t, "<|", 2) && !strcmp(t + n - 2, "|>")) return true;
    if (n >= 8 && !strncmp(t, "<\xef\xbd\x9c", 4) && !strcmp(t + n - 4, "\xef\xbd\x9c>"))
        return true; /* <｜ ｜> */
    if (!strncmp(t, "<unused", 7) && n > 7 && t[n - 1] == '>') return true;
    return false;
}

/* The regex of the pre-tokenizer, or the GPT-2 one for a plain ByteLevel. */
static tm_status find_pre(import_state *s, const json_t *pt) {
    const char *split_re[TM_PRETOK_MAX_REGEX];
    int n_split = 0;
    bool bytelevel_regex = false, split_other = false;
    const char *pt_type = json_string_value(json_object_get(pt, "type"));
    const json_t *list =
        pt_type && !strcmp(pt_type, "Sequence") ? json_object_get(pt, "pretokenizers") : NULL;
    size_t n = list ? json_array_size(list) : (pt && json_is_object(pt) ? 1 : 0);
    for (size_t i = 0; i < n; i++) {
        const json_t *p = list ? json_array_get(list, i) : pt;
        const char *type = json_string_value(json_object_get(p, "type"));
        if (!type) continue;
        if (!strcmp(type, "Split")) {
            const char *re =
                json_string_value(json_object_get(json_object_get(p, "pattern"), "Regex"));
            if (re && n_split < TM_PRETOK_MAX_REGEX)
                split_re[n_split++] = re;
            else
                split_other = true;
        } else if (!strcmp(type, "ByteLevel")) {
            const json_t *ur = json_object_get(p, "use_regex");
            if (!ur || json_is_true(ur)) bytelevel_regex = true;
        }
    }
    if (n_split && !split_other) {
        s->pre = pretok_name_for_regexes(split_re, n_split);
        if (!s->pre)
            return tm_error_set(TM_ERR_UNSUPPORTED,
                                "%s: pre_tokenizer: %d Split regex%s not recognised (the first: "
                                "'%.200s'); supported: the regexes of qwen2, qwen35, llama-bpe "
                                "(Llama 3), gpt-4o (o200k), tekken, gpt2, deepseek-v3 (three)",
                                s->path, n_split, n_split > 1 ? "es" : "", split_re[0]);
        return TM_OK;
    }
    if (bytelevel_regex && !split_other) {
        s->pre = "gpt2";
        return TM_OK;
    }
    return tm_error_set(
        TM_ERR_UNSUPPORTED,
        "%s: pre_tokenizer: no regex found (a byte-level BPE tokenizer.json needs a Split "
        "regex or a ByteLevel with use_regex)",
        s->path);
}

static const char *token_content(const json_t *v) {
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) return json_string_value(json_object_get(v, "content"));
    return NULL;
}

static int32_t added_id_by_content(const import_state *s, const char *content) {
    const json_t *added = json_object_get(s->tj, "added_tokens");
    for (size_t i = 0; i < json_array_size(added); i++) {
        const json_t *a = json_array_get(added, i);
        const char *c = json_string_value(json_object_get(a, "content"));
        if (c && !strcmp(c, content)) return (int32_t)json_integer_value(json_object_get(a, "id"));
    }
    return -1;
}

static tm_status collect_tokens(import_state *s, const json_t *vocab, const json_t *added,
                                uint32_t pad_to) {
    uint64_t n = 0;
    const char *key, *max_text = NULL; /* the token of the largest id and its field */
    char max_field[48] = "";
    json_t *val;
    json_object_foreach((json_t *)vocab, key, val) {
        json_int_t id = json_integer_value(val);
        if (!json_is_integer(val) || id < 0 || id >= MAX_IMPORT_TOKENS)
            return jerr(s, "model.vocab: ids must be integers in [0, 2^24)");
        if ((uint64_t)id + 1 > n) {
            n = (uint64_t)id + 1, max_text = key;
            snprintf(max_field, sizeof(max_field), "model.vocab");
        }
    }
    for (size_t i = 0; i < json_array_size(added); i++) {
        const json_t *a = json_array_get(added, i);
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        if (!json_is_integer(json_object_get(a, "id")) || id < 0 || id >= MAX_IMPORT_TOKENS ||
            !json_is_string(json_object_get(a, "content")))
            return jerr(
                s,
                "added_tokens: each entry needs an integer id in [0, 2^24) and a string content");
        if ((uint64_t)id + 1 > n) {
            n = (uint64_t)id + 1, max_text = json_string_value(json_object_get(a, "content"));
            snprintf(max_field, sizeof(max_field), "added_tokens[%zu].id", i);
        }
    }
    if (n == 0) return jerr(s, "model.vocab: empty");
    const uint64_t entries = json_object_size(vocab) + json_array_size(added);
    if (n > 2 * entries + IMPORT_ID_SLACK)
        return tm_error_set(TM_ERR_FORMAT,
                            "%s: %s: id %" PRIu64 " ('%.64s') is far past the %" PRIu64
                            " entries of model.vocab and added_tokens (ids must be below %" PRIu64
                            ": twice the entries plus %d)",
                            s->path, max_field, n - 1, max_text, entries,
                            2 * entries + IMPORT_ID_SLACK, IMPORT_ID_SLACK);
    if (pad_to && pad_to < n)
        return tm_error_set(TM_ERR_ARG,
                            "%s: the tokenizer has %" PRIu64
                            " tokens, more than the requested vocabulary size %u",
                            s->path, n, pad_to);
    if (pad_to) n = pad_to;
    s->n = (uint32_t)n;
    s->text = calloc(n, sizeof(*s->text));
    s->owned = calloc(n, sizeof(*s->owned));
    s->added = calloc(n, 1);
    s->type = calloc(n, sizeof(*s->type));
    s->score = calloc(n, sizeof(*s->score));
    if (!s->text || !s->owned || !s->added || !s->type || !s->score)
        return tm_error_set(TM_ERR_NOMEM, "tokenizer import: out of memory for %" PRIu64 " tokens",
                            n);
    json_object_foreach((json_t *)vocab, key, val) {
        json_int_t id = json_integer_value(val);
        if (s->text[id])
            return tm_error_set(TM_ERR_FORMAT,
                                "%s: model.vocab: id %" PRId64 " is used by '%.64s' and '%.64s'",
                                s->path, (int64_t)id, s->text[id], key);
        s->text[id] = key;
    }
    for (size_t i = 0; i < json_array_size(added); i++) {
        const json_t *a = json_array_get(added, i);
        json_int_t id = json_integer_value(json_object_get(a, "id"));
        s->text[id] = json_string_value(json_object_get(a, "content"));
        s->added[id] = json_is_true(json_object_get(a, "special")) ? 1 : 2;
    }
    return TM_OK;
}

static tm_status collect_merges(import_state *s, const json_t *merges) {
    s->n_merges = json_array_size(merges);
    s->merges = calloc(s->n_merges ? s->n_merges : 1, sizeof(*s->merges));
    s->merge_owned = calloc(s->n_merges ? s->n_merges : 1, sizeof(*s->merge_owned));
    if (!s->merges || !s->merge_owned)
        return tm_error_set(TM_ERR_NOMEM, "tokenizer import: out of memory for merges");
    for (size_t i = 0; i < s->n_merges; i++) {
        const json_t *m = json_array_get(merges, i);
        if (json_is_string(m)) {
            s->merges[i] = json_string_value(m);
            continue;
        }
        const char *l = json_string_value(json_array_get(m, 0)),
                   *r = json_string_value(json_array_get(m, 1));
        if (!json_is_array(m) || json_array_size(m) != 2 || !l || !r)
            return tm_error_set(
                TM_ERR_FORMAT,
                "%s: model.merges[%zu]: expected \"left right\" or [\"left\", \"right\"]", s->path,
                i);
        /* SpecialVocab's conversion: a space inside a part is written as U+0120 */
        size_t nl = strlen(l), nr = strlen(r);
        char *o = malloc(2 * (nl + nr) + 2);
        if (!o) return tm_error_set(TM_ERR_NOMEM, "tokenizer import: out of memory");
        size_t k = 0;
        for (int part = 0; part < 2; part++) {
            if (part) o[k++] = ' ';
            for (const char *p = part ? r : l; *p; p++) {
                if (*p == ' ') {
                    o[k++] = (char)0xC4;
                    o[k++] = (char)0xA0;
                } else {
                    o[k++] = *p;
                }
            }
        }
        o[k] = 0;
        s->merge_owned[i] = o;
        s->merges[i] = o;
    }
    return TM_OK;
}

static void assign_types(import_state *s, const char *unk) {
    for (uint32_t i = 0; i < s->n; i++) {
        const char *t = s->text[i];
        if (!t) {
            char name[32];
            snprintf(name, sizeof(name), "[PAD%u]", i);
            s->owned[i] = strdup(name);
            s->text[i] = s->owned[i] ? s->owned[i] : "[PAD]";
            s->type[i] = TM_TOKEN_TYPE_UNUSED;
            continue;
        }
        if (s->spm && unk && !strcmp(t, unk))
            s->type[i] = TM_TOKEN_TYPE_UNKNOWN;
        else if (s->added[i] == 1 || (s->added[i] == 2 && looks_special(t)))
            s->type[i] = TM_TOKEN_TYPE_CONTROL;
        else if (s->added[i] == 2)
            s->type[i] = TM_TOKEN_TYPE_USER_DEFINED;
        else if (s->spm && strlen(t) == 6 && !strncmp(t, "<0x", 3) && t[5] == '>')
            s->type[i] = TM_TOKEN_TYPE_BYTE;
        else
            s->type[i] = TM_TOKEN_TYPE_NORMAL;
    }
}

/* SPM scores: -(1 + rank of the first merge producing the token); other normal
 * tokens below every merged one, in id order. */
static void assign_scores(import_state *s, const json_t *vocab) {
    for (uint32_t i = 0; i < s->n; i++)
        s->score[i] = s->type[i] == TM_TOKEN_TYPE_NORMAL ? -(float)(s->n_merges + 1 + i) : 0.0f;
    char *buf = NULL;
    size_t cap = 0;
    for (size_t r = s->n_merges; r-- > 0;) { /* backwards: the first merge's rank wins */
        const char *m = s->merges[r], *sp = strchr(m + (m[0] ? 1 : 0), ' ');
        if (!sp) continue;
        size_t n = strlen(m);
        if (n + 1 > cap) {
            cap = 2 * n + 16;
            char *nb = realloc(buf, cap);
            if (!nb) break;
            buf = nb;
        }
        size_t ll = (size_t)(sp - m);
        memcpy(buf, m, ll);
        strcpy(buf + ll, sp + 1);
        const json_t *id = json_object_get(vocab, buf);
        if (json_is_integer(id) && json_integer_value(id) >= 0 && json_integer_value(id) < s->n)
            s->score[json_integer_value(id)] = -(float)(r + 1);
    }
    free(buf);
}

static bool spm_adds_prefix(const json_t *tj) {
    /* legacy: normalizer Sequence[Prepend("▁"), Replace(" ", "▁")]; newer: Metaspace pre-tokenizer
     */
    const json_t *objs[2] = {json_object_get(tj, "normalizer"),
                             json_object_get(tj, "pre_tokenizer")};
    for (int k = 0; k < 2; k++) {
        const json_t *o = objs[k];
        if (!json_is_object(o)) continue;
        const json_t *list = json_object_get(o, "normalizers");
        if (!list) list = json_object_get(o, "pretokenizers");
        size_t n = list ? json_array_size(list) : 1;
        for (size_t i = 0; i < n; i++) {
            const json_t *e = list ? json_array_get(list, i) : o;
            const char *type = json_string_value(json_object_get(e, "type"));
            if (!type) continue;
            if (!strcmp(type, "Prepend")) return true;
            if (!strcmp(type, "Metaspace")) {
                const char *scheme = json_string_value(json_object_get(e, "prepend_scheme"));
                const json_t *aps = json_object_get(e, "add_prefix_space");
                if (scheme) return strcmp(scheme, "never") != 0;
                return !aps || json_is_true(aps);
            }
        }
    }
    return false;
}

typedef struct special_ids {
    int32_t id[6];        /* bos eos unk sep pad mask */
    int add_bos, add_eos; /* -1 unset */
} special_ids;

static const char *const special_names[6] = {"bos", "eos", "unk", "sep", "pad", "mask"};
static const char *const special_keys[6] = {
    "tokenizer.ggml.bos_token_id",     "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.seperator_token_id",
    "tokenizer.ggml.padding_token_id", "tokenizer.ggml.mask_token_id"};

static void read_post_processor(const import_state *s, special_ids *sp) {
    const json_t *pp = json_object_get(s->tj, "post_processor");
    if (!json_is_object(pp)) return;
    const json_t *list = json_object_get(pp, "processors");
    size_t n = list ? json_array_size(list) : 1;
    const char *bos = token_content(json_object_get(s->cfg, "bos_token"));
    const char *eos = token_content(json_object_get(s->cfg, "eos_token"));
    for (size_t i = 0; i < n; i++) {
        const json_t *p = list ? json_array_get(list, i) : pp;
        const char *type = json_string_value(json_object_get(p, "type"));
        if (!type) continue;
        if (!strcmp(type, "RobertaProcessing")) {
            sp->add_bos = sp->add_eos = 1;
        } else if (!strcmp(type, "TemplateProcessing")) {
            const json_t *single = json_object_get(p, "single");
            size_t k = json_array_size(single);
            if (k < 2) continue;
            const char *first = json_string_value(
                json_object_get(json_object_get(json_array_get(single, 0), "SpecialToken"), "id"));
            const char *last = json_string_value(json_object_get(
                json_object_get(json_array_get(single, k - 1), "SpecialToken"), "id"));
            if (first) sp->add_bos = bos ? !strcmp(first, bos) : 1;
            if (last) sp->add_eos = eos ? !strcmp(last, eos) : 1;
        }
    }
}

static tm_status write_keys(import_state *s, tm_gguf_writer *w, const tm_tokenizer_import_opts *o) {
    tm_status st;
    if ((st = gguf_writer_set_str(w, "tokenizer.ggml.model", s->spm ? "llama" : "gpt2")) ||
        (st = gguf_writer_set_str(w, "tokenizer.ggml.pre", s->pre)) ||
        (st = gguf_writer_set_array(w, "tokenizer.ggml.tokens", TM_GGUF_TYPE_STRING, s->text,
                                    s->n)) ||
        (st = gguf_writer_set_array(w, "tokenizer.ggml.token_type", TM_GGUF_TYPE_INT32, s->type,
                                    s->n)))
        return st;
    if (s->spm && (st = gguf_writer_set_array(w, "tokenizer.ggml.scores", TM_GGUF_TYPE_FLOAT32,
                                              s->score, s->n)))
        return st;
    if ((!s->spm || !o->spm_skip_merges) &&
        (st = gguf_writer_set_array(w, "tokenizer.ggml.merges", TM_GGUF_TYPE_STRING, s->merges,
                                    s->n_merges)))
        return st;

    special_ids sp = {{-1, -1, -1, -1, -1, -1}, -1, -1};
    read_post_processor(s, &sp);
    if (s->cfg) {
        for (int k = 0; k < 6; k++) {
            char key[32];
            snprintf(key, sizeof(key), "%s_token", special_names[k]);
            const char *c = token_content(json_object_get(s->cfg, key));
            if (c) sp.id[k] = added_id_by_content(s, c);
        }
        const json_t *ab = json_object_get(s->cfg, "add_bos_token"),
                     *ae = json_object_get(s->cfg, "add_eos_token");
        if (json_is_boolean(ab)) sp.add_bos = json_is_true(ab);
        if (json_is_boolean(ae)) sp.add_eos = json_is_true(ae);
    }
    if (s->model_cfg) { /* config.json: fills ids the tokenizer config did not give */
        for (int k = 0; k < 6; k++) {
            char key[32];
            snprintf(key, sizeof(key), "%s_token_id", special_names[k]);
            const json_t *v = json_object_get(s->model_cfg, key);
            double d = json_number_value(v);
            if (sp.id[k] < 0 && json_is_number(v) && d >= 0 && d < MAX_IMPORT_TOKENS &&
                d == (int32_t)d)
                sp.id[k] = (int32_t)d;
        }
    }
    for (int k = 0; k < 6; k++) {
        if (sp.id[k] < 0) continue;
        if ((uint32_t)sp.id[k] >= s->n)
            return tm_error_set(TM_ERR_FORMAT,
                                "%s: %s token id %d is outside the vocabulary (%u tokens)", s->path,
                                special_names[k], sp.id[k], s->n);
        if ((st = gguf_writer_set_u32(w, special_keys[k], (uint32_t)sp.id[k]))) return st;
    }
    if (sp.add_bos >= 0 &&
        (st = gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", sp.add_bos)))
        return st;
    if (sp.add_eos >= 0 &&
        (st = gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", sp.add_eos)))
        return st;
    if (s->spm &&
        (st = gguf_writer_set_bool(w, "tokenizer.ggml.add_space_prefix", spm_adds_prefix(s->tj))))
        return st;

    if (s->cfg) {
        const json_t *ct = json_object_get(s->cfg, "chat_template");
        const char *tmpl = json_string_value(ct);
        for (size_t i = 0; !tmpl && i < json_array_size(ct);
             i++) { /* [{name, template}]: the default one */
            const json_t *e = json_array_get(ct, i);
            const char *name = json_string_value(json_object_get(e, "name"));
            if (name && !strcmp(name, "default"))
                tmpl = json_string_value(json_object_get(e, "template"));
        }
        char *jinja = NULL;
        if (!tmpl && !ct) tmpl = jinja = read_file_beside(s->path, "chat_template.jinja");
        if (tmpl) st = gguf_writer_set_str(w, "tokenizer.chat_template", tmpl);
        free(jinja);
        if (st) return st;
    }
    return TM_OK;
}

tm_status tokenizer_import_hf_ex(const char *path, tm_gguf_writer *w,
                                 const tm_tokenizer_import_opts *opts, uint32_t *n_tokens_out) {
    tm_tokenizer_import_opts o = opts ? *opts : (tm_tokenizer_import_opts){0};
    import_state s = {.path = path};
    json_error_t jerror;
    tm_status st = TM_OK;
    s.tj = json_load_file(path, 0, &jerror);
    if (!s.tj) {
        st = tm_error_set(jerror.line < 0 ? TM_ERR_IO : TM_ERR_FORMAT, "%s:%d:%d: %s", path,
                          jerror.line, jerror.column, jerror.text);
        goto done;
    }
    const json_t *model = json_object_get(s.tj, "model");
    const char *mtype = json_string_value(json_object_get(model, "type"));
    if (!json_is_object(s.tj) || !json_is_object(model)) {
        st = jerr(&s, "expected a tokenizer.json object with a \"model\" object");
        goto done;
    }
    if (!mtype || strcmp(mtype, "BPE")) {
        st = tm_error_set(TM_ERR_UNSUPPORTED,
                          "%s: model.type '%s': only BPE tokenizers are supported", path,
                          mtype ? mtype : "(missing)");
        goto done;
    }
    const json_t *vocab = json_object_get(model, "vocab"),
                 *merges = json_object_get(model, "merges");
    const json_t *added = json_object_get(s.tj, "added_tokens");
    if (!json_is_object(vocab)) {
        st = jerr(&s, "model.vocab: missing or not an object");
        goto done;
    }
    if (!json_is_array(merges)) {
        st = jerr(&s, "model.merges: missing or not an array (a BPE vocabulary needs its merges)");
        goto done;
    }
    if (added && !json_is_array(added)) {
        st = jerr(&s, "added_tokens: not an array");
        goto done;
    }
    s.spm = json_is_true(json_object_get(model, "byte_fallback"));
    if ((st = load_json_beside(path, "tokenizer_config.json", &s.cfg)) ||
        (st = load_json_beside(path, "config.json", &s.model_cfg)))
        goto done;

    if (s.spm) {
        s.pre = "default";
    } else {
        const char *dec =
            json_string_value(json_object_get(json_object_get(s.tj, "decoder"), "type"));
        if (!dec || strcmp(dec, "ByteLevel")) {
            st = tm_error_set(
                TM_ERR_UNSUPPORTED,
                "%s: decoder '%s': expected ByteLevel (byte-level BPE) or a model with "
                "byte_fallback (SentencePiece style)",
                path, dec ? dec : "(missing)");
            goto done;
        }
        if ((st = find_pre(&s, json_object_get(s.tj, "pre_tokenizer")))) goto done;
    }
    if ((st = collect_tokens(&s, vocab, added, o.pad_to_n_vocab)) ||
        (st = collect_merges(&s, merges)))
        goto done;
    const char *unk = json_string_value(json_object_get(model, "unk_token"));
    assign_types(&s, unk);
    if (s.spm) assign_scores(&s, vocab);
    st = write_keys(&s, w, &o);
    if (st == TM_OK && n_tokens_out) *n_tokens_out = s.n;
done:
    state_free(&s);
    return st;
}

tm_status tokenizer_import_hf(const char *tokenizer_json_path, tm_gguf_writer *w) {
    return tokenizer_import_hf_ex(tokenizer_json_path, w, NULL, NULL);
}
