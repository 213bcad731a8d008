/* Built-in chat templates (see chat.h). Each renderer follows its family's
 * published Jinja template step by step for conversations without tools, so
 * the oracle test can compare with jinja2 rendering the real template. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "tokenizer/chat.h"

/* ---- a growable string ---- */

typedef struct sbuf {
    char *p;
    size_t n, cap;
    bool oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n) {
    if (b->oom || n == 0) return;
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1) c *= 2;
        char *q = realloc(b->p, c);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = c;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void sb_str(sbuf *b, const char *s) {
    sb_add(b, s, strlen(s));
}

/* ---- string slices (Python's str methods the templates use) ---- */

typedef struct slice {
    const char *p;
    size_t n;
} slice;

static slice sl(const char *s) {
    return (slice){s ? s : "", s ? strlen(s) : 0};
}

static const char *sl_find(slice s, const char *needle) { /* first occurrence or NULL */
    size_t k = strlen(needle);
    for (size_t i = 0; k <= s.n && i + k <= s.n; i++)
        if (!memcmp(s.p + i, needle, k)) return s.p + i;
    return NULL;
}

static const char *sl_rfind(slice s, const char *needle) { /* last occurrence or NULL */
    size_t k = strlen(needle);
    if (k > s.n) return NULL;
    for (size_t i = s.n - k + 1; i-- > 0;)
        if (!memcmp(s.p + i, needle, k)) return s.p + i;
    return NULL;
}

static slice sl_lstrip_nl(slice s) {
    while (s.n && s.p[0] == '\n') s.p++, s.n--;
    return s;
}

static slice sl_rstrip_nl(slice s) {
    while (s.n && s.p[s.n - 1] == '\n') s.n--;
    return s;
}

static bool sl_starts(slice s, const char *pre) {
    return s.n >= strlen(pre) && !memcmp(s.p, pre, strlen(pre));
}
static bool sl_ends(slice s, const char *suf) {
    size_t k = strlen(suf);
    return s.n >= k && !memcmp(s.p + s.n - k, suf, k);
}

/* Python's str.isspace() for one code point (what Jinja's trim strips). */
static bool cp_is_space(utf8proc_int32_t c) {
    if ((c >= 9 && c <= 13) || (c >= 0x1C && c <= 0x1F) || c == 0x85) return true;
    utf8proc_category_t cat = utf8proc_category(c);
    return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL ||
           cat == UTF8PROC_CATEGORY_ZP;
}

static slice sl_trim(slice s) { /* Jinja's |trim = Python's str.strip() */
    for (;;) {
        utf8proc_int32_t c;
        utf8proc_ssize_t k =
            utf8proc_iterate((const utf8proc_uint8_t *)s.p, (utf8proc_ssize_t)s.n, &c);
        if (k <= 0 || !cp_is_space(c)) break;
        s.p += k;
        s.n -= (size_t)k;
    }
    while (s.n) {
        size_t i = s.n - 1; /* start of the last character */
        while (i > 0 && ((uint8_t)s.p[i] & 0xC0) == 0x80) i--;
        utf8proc_int32_t c;
        utf8proc_ssize_t k =
            utf8proc_iterate((const utf8proc_uint8_t *)s.p + i, (utf8proc_ssize_t)(s.n - i), &c);
        if (k <= 0 || (size_t)k != s.n - i || !cp_is_space(c)) break;
        s.n = i;
    }
    return s;
}

static bool role_is(const tm_chat_message *m, const char *r) {
    return m->role && !strcmp(m->role, r);
}

/* ---- detection ---- */

static const char QWEN25_SYSTEM[] =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
static const char QWEN2_SYSTEM[] = "You are a helpful assistant.";

tm_chat_format chat_format_detect(const char *t, const char **default_system) {
    if (default_system) *default_system = NULL;
    if (!t) return TM_CHAT_UNKNOWN;
    if (strstr(t, "<|start|>") && strstr(t, "<|channel|>")) return TM_CHAT_HARMONY;
    if (strstr(t, "<|start_header_id|>")) return TM_CHAT_LLAMA3;
    if (strstr(t, "<|im_start|>")) {
        if (strstr(t, "<think>") || strstr(t, "enable_thinking")) return TM_CHAT_QWEN3;
        if (default_system) {
            if (strstr(t, QWEN25_SYSTEM))
                *default_system = QWEN25_SYSTEM;
            else if (strstr(t, "<|im_start|>system\\n"
                               "You are a helpful assistant.") ||
                     strstr(t, "<|im_start|>system\n"
                               "You are a helpful assistant."))
                *default_system = QWEN2_SYSTEM;
        }
        return TM_CHAT_CHATML;
    }
    if (strstr(t, "[INST]")) return TM_CHAT_MISTRAL;
    if (strstr(t, "<|turn>")) return TM_CHAT_GEMMA4;
    return TM_CHAT_UNKNOWN;
}

static const char *const format_names[] = {"unknown", "chatml",  "qwen3", "llama3",
                                           "mistral", "harmony", "gemma4"};

const char *chat_format_name(tm_chat_format f) {
    return (unsigned)f < sizeof(format_names) / sizeof(format_names[0]) ? format_names[f]
                                                                        : "unknown";
}

tm_status chat_format_from_name(const char *name, tm_chat_format *out) {
    for (int f = TM_CHAT_CHATML; f <= TM_CHAT_GEMMA4; f++)
        if (!strcmp(name, format_names[f])) {
            *out = (tm_chat_format)f;
            return TM_OK;
        }
    return tm_error_set(
        TM_ERR_ARG,
        "unknown chat template '%s' (known: chatml, qwen3, llama3, mistral, harmony, gemma4)",
        name);
}

/* ---- renderers ---- */

static void render_chatml(sbuf *b, const tm_chat_message *m, size_t n, const tm_chat_opts *o) {
    if (o->default_system && (n == 0 || !role_is(&m[0], "system"))) {
        sb_str(b, "<|im_start|>system\n");
        sb_str(b, o->default_system);
        sb_str(b, "<|im_end|>\n");
    }
    for (size_t i = 0; i < n; i++) {
        sb_str(b, "<|im_start|>");
        sb_str(b, m[i].role ? m[i].role : "user");
        sb_str(b, "\n");
        sb_str(b, m[i].content ? m[i].content : "");
        sb_str(b, "<|im_end|>\n");
    }
    if (o->add_generation_prompt) sb_str(b, "<|im_start|>assistant\n");
}

static void render_qwen3(sbuf *b, const tm_chat_message *m, size_t n, const tm_chat_opts *o) {
    if (n > 0 && role_is(&m[0], "system")) {
        sb_str(b, "<|im_start|>system\n");
        sb_str(b, m[0].content ? m[0].content : "");
        sb_str(b, "<|im_end|>\n");
    }
    /* the last user turn that is not a wrapped tool response */
    size_t last_query = n ? n - 1 : 0;
    for (size_t i = n; i-- > 0;) {
        slice c = sl(m[i].content);
        if (role_is(&m[i], "user") &&
            !(sl_starts(c, "<tool_response>") && sl_ends(c, "</tool_response>"))) {
            last_query = i;
            break;
        }
    }
    for (size_t i = 0; i < n; i++) {
        slice c = sl(m[i].content);
        if (role_is(&m[i], "user") || (role_is(&m[i], "system") && i != 0)) {
            sb_str(b, "<|im_start|>");
            sb_str(b, m[i].role);
            sb_str(b, "\n");
            sb_add(b, c.p, c.n);
            sb_str(b, "<|im_end|>\n");
        } else if (role_is(&m[i], "assistant")) {
            slice content = c, reasoning = {"", 0};
            if (sl_find(c, "</think>")) {
                const char *last_end = sl_rfind(c, "</think>");
                content = sl_lstrip_nl((slice){last_end + 8, (size_t)(c.p + c.n - (last_end + 8))});
                const char *first_end = sl_find(c, "</think>");
                slice before = sl_rstrip_nl((slice){c.p, (size_t)(first_end - c.p)});
                const char *open = sl_rfind(before, "<think>");
                if (open) before = (slice){open + 7, (size_t)(before.p + before.n - (open + 7))};
                reasoning = sl_lstrip_nl(before);
            }
            sb_str(b, "<|im_start|>assistant\n");
            if (i > last_query && (i == n - 1 || reasoning.n > 0)) {
                slice r = sl_rstrip_nl(sl_lstrip_nl(reasoning));
                sb_str(b, "<think>\n");
                sb_add(b, r.p, r.n);
                sb_str(b, "\n</think>\n\n");
                content = sl_lstrip_nl(content);
            }
            sb_add(b, content.p, content.n);
            sb_str(b, "<|im_end|>\n");
        } else if (role_is(&m[i], "tool")) {
            if (i == 0 || !role_is(&m[i - 1], "tool")) sb_str(b, "<|im_start|>user");
            sb_str(b, "\n<tool_response>\n");
            sb_add(b, c.p, c.n);
            sb_str(b, "\n</tool_response>");
            if (i == n - 1 || !role_is(&m[i + 1], "tool")) sb_str(b, "<|im_end|>\n");
        }
    }
    if (o->add_generation_prompt) {
        sb_str(b, "<|im_start|>assistant\n");
        if (o->disable_thinking) sb_str(b, "<think>\n\n</think>\n\n");
    }
}

static void render_llama3(sbuf *b, const tm_chat_message *m, size_t n, const tm_chat_opts *o) {
    for (size_t i = 0; i < n; i++) {
        if (i == 0 && o->bos_text) sb_str(b, o->bos_text);
        slice c = sl_trim(sl(m[i].content));
        sb_str(b, "<|start_header_id|>");
        sb_str(b, m[i].role ? m[i].role : "user");
        sb_str(b, "<|end_header_id|>\n\n");
        sb_add(b, c.p, c.n);
        sb_str(b, "<|eot_id|>");
    }
    if (o->add_generation_prompt) sb_str(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void render_mistral(sbuf *b, const tm_chat_message *m, size_t n, const tm_chat_opts *o) {
    if (o->bos_text) sb_str(b, o->bos_text);
    const char *system = NULL;
    for (size_t i = 0; i < n; i++) {
        const char *c = m[i].content ? m[i].content : "";
        if (role_is(&m[i], "system")) {
            system = c; /* Mistral's templates have no system turn: it leads the next user turn */
        } else if (role_is(&m[i], "user")) {
            sb_str(b, "[INST] ");
            if (system) {
                sb_str(b, system);
                sb_str(b, "\n\n");
                system = NULL;
            }
            sb_str(b, c);
            sb_str(b, " [/INST]");
        } else if (role_is(&m[i], "assistant")) {
            sb_str(b, c);
            sb_str(b, "</s>");
        }
    }
}

static void render_harmony(sbuf *b, const tm_chat_message *m, size_t n, const tm_chat_opts *o) {
    char today[16];
    const char *date = o->date;
    if (!date) {
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        strftime(today, sizeof(today), "%Y-%m-%d", &tmv);
        date = today;
    }
    sb_str(b,
           "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
           "Knowledge cutoff: 2024-06\nCurrent date: ");
    sb_str(b, date);
    sb_str(b, "\n\nReasoning: ");
    sb_str(b, o->reasoning_effort ? o->reasoning_effort : "medium");
    sb_str(b, "\n\n# Valid channels: analysis, commentary, final. Channel must be included for "
              "every message.<|end|>");
    size_t first = 0;
    if (n > 0 && (role_is(&m[0], "system") || role_is(&m[0], "developer"))) {
        first = 1;
        if (m[0].content && m[0].content[0]) {
            sb_str(b, "<|start|>developer<|message|># Instructions\n\n");
            sb_str(b, m[0].content);
            sb_str(b, "\n\n<|end|>");
        }
    }
    for (size_t i = first; i < n; i++) {
        const char *c = m[i].content ? m[i].content : "";
        if (role_is(&m[i], "assistant")) {
            sb_str(b, "<|start|>assistant<|channel|>final<|message|>");
            sb_str(b, c);
            sb_str(b, i == n - 1 && !o->add_generation_prompt ? "<|return|>" : "<|end|>");
        } else if (role_is(&m[i], "user")) {
            sb_str(b, "<|start|>user<|message|>");
            sb_str(b, c);
            sb_str(b, "<|end|>");
        }
    }
    if (o->add_generation_prompt) sb_str(b, "<|start|>assistant");
}

/* Gemma 4's strip_thinking: each <|channel>…<channel|> thought dropped, then trimmed. */
static void gemma4_strip_thinking(sbuf *b, slice c) {
    sbuf t = {0};
    for (;;) { /* Python's text.split('<channel|>'), each part cut at its '<|channel>' */
        const char *close = sl_find(c, "<channel|>");
        slice part = {c.p, close ? (size_t)(close - c.p) : c.n};
        const char *open = sl_find(part, "<|channel>");
        sb_add(&t, part.p, open ? (size_t)(open - part.p) : part.n);
        if (!close) break;
        c = (slice){close + 10, (size_t)(c.p + c.n - (close + 10))};
    }
    slice r = sl_trim((slice){t.p ? t.p : "", t.n});
    sb_add(b, r.p, r.n);
    b->oom |= t.oom;
    free(t.p);
}

static void render_gemma4(sbuf *b, const tm_chat_message *m, size_t n, const tm_chat_opts *o) {
    if (o->bos_text) sb_str(b, o->bos_text);
    size_t first = 0;
    if (n > 0 && (role_is(&m[0], "system") || role_is(&m[0], "developer"))) {
        slice c = sl_trim(sl(m[0].content));
        sb_str(b, "<|turn>system\n");
        sb_add(b, c.p, c.n);
        sb_str(b, "<turn|>\n");
        first = 1;
    }
    const char *prev = NULL; /* the role of the previous message that is not a tool's */
    for (size_t i = first; i < n; i++) {
        if (role_is(&m[i], "tool")) continue; /* only after tool calls, which we do not render */
        const char *role = m[i].role ? m[i].role : "user";
        const bool model = !strcmp(role, "assistant");
        if (!(model && prev && !strcmp(prev, "assistant"))) { /* a model turn goes on */
            sb_str(b, "<|turn>");
            sb_str(b, model ? "model" : role);
            sb_str(b, "\n");
        }
        if (model) {
            gemma4_strip_thinking(b, sl(m[i].content));
        } else {
            slice c = sl_trim(sl(m[i].content));
            sb_add(b, c.p, c.n);
        }
        sb_str(b, "<turn|>\n");
        prev = role;
    }
    /* without enable_thinking the template opens the answer past an empty thought */
    if (o->add_generation_prompt) sb_str(b, "<|turn>model\n<|channel>thought\n<channel|>");
}

tm_status chat_render(tm_chat_format f, const tm_chat_message *msgs, size_t n,
                      const tm_chat_opts *opts, char **out, size_t *out_len) {
    *out = NULL;
    if (out_len) *out_len = 0;
    tm_chat_opts o = opts ? *opts : (tm_chat_opts){.add_generation_prompt = true};
    sbuf b = {0};
    switch (f) {
    case TM_CHAT_CHATML:
        render_chatml(&b, msgs, n, &o);
        break;
    case TM_CHAT_QWEN3:
        render_qwen3(&b, msgs, n, &o);
        break;
    case TM_CHAT_LLAMA3:
        render_llama3(&b, msgs, n, &o);
        break;
    case TM_CHAT_MISTRAL:
        render_mistral(&b, msgs, n, &o);
        break;
    case TM_CHAT_HARMONY:
        render_harmony(&b, msgs, n, &o);
        break;
    case TM_CHAT_GEMMA4:
        render_gemma4(&b, msgs, n, &o);
        break;
    case TM_CHAT_UNKNOWN:
    default:
        return tm_error_set(
            TM_ERR_UNSUPPORTED,
            "the model's chat template is not one we recognise (built in: chatml, qwen3, llama3, "
            "mistral, harmony, gemma4); choose one with --chat-template NAME, or use raw "
            "completion with "
            "-p");
    }
    sb_add(&b, "", 0);
    if (!b.p && !b.oom) b.p = calloc(1, 1), b.oom = b.p == NULL;
    if (b.oom) {
        free(b.p);
        return tm_error_set(TM_ERR_NOMEM, "chat template: out of memory");
    }
    *out = b.p;
    if (out_len) *out_len = b.n;
    return TM_OK;
}

void chat_reply_content(tm_chat_format f, const char *reply, size_t len, size_t *start, size_t *n) {
    slice s = {reply, len};
    size_t a = 0, e = len;
    if (f == TM_CHAT_HARMONY) {
        const char *fin = sl_rfind(s, "<|channel|>final<|message|>");
        if (fin)
            a = (size_t)(fin - reply) + strlen("<|channel|>final<|message|>");
        else if (sl_find(s, "<|channel|>"))
            a = len; /* only analysis: no answer to keep */
    }
    static const char *const ends[] = {"<|im_end|>", "<|eot_id|>", "</s>",   "<|end|>",
                                       "<|return|>", "<|call|>",   "<turn|>"};
    slice rest = {reply + a, len - a};
    for (size_t k = 0; k < sizeof(ends) / sizeof(ends[0]); k++) {
        const char *p = sl_find(rest, ends[k]);
        if (p && (size_t)(p - reply) < e) e = (size_t)(p - reply);
    }
    *start = a;
    *n = e - a;
}
