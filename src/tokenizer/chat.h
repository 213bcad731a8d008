/* Chat templates, built in for the families we support, recognised from the
 * model's tokenizer.chat_template (a Jinja template we do not execute):
 *
 *   chatml   <|im_start|>role\ncontent<|im_end|>\n ... <|im_start|>assistant\n
 *            (Qwen2/2.5 templates' default system prompt is kept when present)
 *   qwen3    ChatML plus Qwen3's thinking rules: <think>…</think> is dropped from
 *            assistant turns before the last user turn, kept after it;
 *            enable_thinking = false appends an empty <think>\n\n</think>\n\n
 *   llama3   <|start_header_id|>role<|end_header_id|>\n\ncontent(trimmed)<|eot_id|>
 *   mistral  [INST] user [/INST]assistant</s> (system text is prepended to the
 *            first user turn, separated by a blank line)
 *   harmony  gpt-oss: system block (identity, knowledge cutoff, date, reasoning
 *            effort, channels), the system message as the developer
 *            "# Instructions", turns as <|start|>role<|message|>…<|end|>, earlier
 *            assistant answers in the final channel; generation prompt <|start|>assistant
 *   gemma4   <|turn>role\ncontent(trimmed)<turn|>\n, the assistant as "model" with its
 *            <|channel>…<channel|> thoughts dropped, a leading system message as the
 *            system turn; generation prompt <|turn>model\n plus the empty thought the
 *            template writes without enable_thinking
 *
 * The output equals what HF's apply_chat_template renders with the model's own
 * template for plain conversations (no tools), except that the BOS text is only
 * written when the caller asks for it (bos_text): the engine instead tokenizes
 * the result with add_special = true (the tokenizer adds BOS if the model wants
 * one) and parse_special = true (so <|im_start|> etc. become their tokens). */
#ifndef TM_TOKENIZER_CHAT_H
#define TM_TOKENIZER_CHAT_H

#include <stdbool.h>
#include <stddef.h>

#include "core/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tm_chat_format {
    TM_CHAT_UNKNOWN = 0,
    TM_CHAT_CHATML,
    TM_CHAT_QWEN3,
    TM_CHAT_LLAMA3,
    TM_CHAT_MISTRAL,
    TM_CHAT_HARMONY,
    TM_CHAT_GEMMA4,
} tm_chat_format;

/* tm_chat_message {role, content} is the public API's (include/tiermoe.h). */

typedef struct tm_chat_opts {
    bool add_generation_prompt;   /* end with the opening of the assistant's turn */
    bool disable_thinking;        /* qwen3: enable_thinking = false */
    const char *bos_text;         /* written where the template writes bos_token; NULL = nothing */
    const char *date;             /* harmony "Current date:" (YYYY-MM-DD); NULL = today */
    const char *reasoning_effort; /* harmony: "low" | "medium" | "high"; NULL = "medium" */
    const char *default_system;   /* chatml: system prompt used when none is given; set by
                                     chat_format_detect from the template (may be NULL) */
} tm_chat_opts;

/* Recognise a template; TM_CHAT_UNKNOWN for NULL or an unrecognised one. When
 * `default_system` is not NULL it receives the template's built-in default
 * system prompt (Qwen2/2.5), or NULL. */
tm_chat_format chat_format_detect(const char *chat_template, const char **default_system);
const char *chat_format_name(tm_chat_format f);
/* For a command-line override (--chat-template NAME): chatml, qwen3, llama3,
 * mistral, harmony, gemma4. TM_ERR_ARG listing the names otherwise. */
tm_status chat_format_from_name(const char *name, tm_chat_format *out);

/* Render messages into a malloc'd NUL-terminated string (*out, *out_len).
 * TM_ERR_UNSUPPORTED for TM_CHAT_UNKNOWN, with a message telling the user to
 * pick a format with --chat-template or use raw completion (-p). */
tm_status chat_render(tm_chat_format f, const tm_chat_message *msgs, size_t n,
                      const tm_chat_opts *opts, char **out, size_t *out_len);

/* What of a generated reply goes back into the history as the assistant's
 * content: harmony keeps only the final channel's text (the analysis channel is
 * dropped, as its template does); the other formats keep the reply as it is
 * (qwen3's template itself drops old <think> blocks). End-of-turn tokens
 * rendered as text (<|im_end|>, <|eot_id|>, </s>, <|end|>, <|return|>, <turn|>) are cut. */
void chat_reply_content(tm_chat_format f, const char *reply, size_t len, size_t *start, size_t *n);

#ifdef __cplusplus
}
#endif
#endif
