/* tiermoe.h: the public C API of libtiermoe (docs/library.md).
 *
 * What the CLI and the server do, as a library (`tiermoe run`, `tokenize`
 * and `detokenize` are built on it alone): load a GGUF model (or only its
 * vocabulary), make a context with a placement (the flags' options: -ngl,
 * --cpu-moe, --n-cpu-moe, -ot, --moe-cache, --ram-cache, ...), tokenize and
 * detokenize (whole or streamed), render a chat, evaluate tokens of one or
 * more sequences, read logits and sample, read the per-layer expert counts
 * (their summary, their learn file) and the VRAM cache's experts, apply a
 * cache plan (docs/plan-format.md), and report where the time went.
 *
 * Contracts that hold for every function below unless its comment says
 * otherwise:
 * - A function that can fail returns tm_status. On anything but TM_OK,
 *   tm_error_message() on the same thread says what was wrong (naming the
 *   argument or file and what was expected) until the next failing call of
 *   this thread; output arguments are then left as they were, except where
 *   a comment says what they get.
 * - A NULL handle or a NULL pointer where a value is needed is TM_ERR_ARG.
 * - Free functions accept NULL and do nothing then.
 * - No global state but the log callback: models, contexts and samplers are
 *   independent. A model may be shared by threads (its functions read it
 *   only) while its contexts live; a context or a sampler is used by one
 *   thread at a time (tm_seq_tokens excepted, as its comment says).
 * - Sizes of caller buffers: a function that writes into (buf, cap) sets
 *   *len (or *n) to the size it needs; when cap is too small it writes
 *   nothing and returns TM_ERR_ARG, so a call with cap 0 (buf may then be
 *   NULL) asks for the size.
 *
 * The types tm_model, tm_context and tm_sampler are opaque; the library's
 * own sources define them (this header is also their status enum's, log
 * levels' and plain structs' only definition: src/core/status.h includes it).
 * Compiles as C11 and C++17. */
#ifndef TIERMOE_H
#define TIERMOE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define TIERMOE_VERSION_MAJOR 0
#define TIERMOE_VERSION_MINOR 1
#define TIERMOE_VERSION_PATCH 0

typedef enum tm_status {
    TM_OK = 0,
    TM_ERR_ARG,         /* bad argument or flag from the caller or user */
    TM_ERR_IO,          /* open/read/write/mmap failed */
    TM_ERR_FORMAT,      /* malformed input file */
    TM_ERR_UNSUPPORTED, /* valid input we do not handle (type, architecture) */
    TM_ERR_NOMEM,       /* allocation failed */
    TM_ERR_DEVICE,      /* GPU missing, too old, or out of memory */
} tm_status;

typedef enum tm_log_level { TM_LOG_ERROR, TM_LOG_WARN, TM_LOG_INFO, TM_LOG_DEBUG } tm_log_level;

typedef struct tm_model tm_model;
typedef struct tm_context tm_context;
typedef struct tm_sampler tm_sampler;

/* ---- version, status, log ---- */

/* "0.1.0": the library's version (TIERMOE_VERSION_* are the header's). */
const char *tm_version(void);
/* A status's name ("ok", "bad argument", ...); "unknown status" for others. */
const char *tm_status_name(tm_status st);
/* The message of this thread's last failing call ("no error message" when
 * there was none). Valid until the thread's next failing call. */
const char *tm_error_message(void);

/* Where the library's log lines go: fn(level, text without newline, user)
 * from any thread; NULL (the default) writes them to stderr. Only lines
 * whose level is at most TIERMOE_LOG's (info unless set) are passed. Some
 * progress lines of the placement are still printed to stderr directly. */
typedef void (*tm_log_fn)(tm_log_level level, const char *text, void *user);
void tm_log_set_callback(tm_log_fn fn, void *user);

/* ---- models ---- */

/* Open and validate a GGUF file (weights stay mapped) and its vocabulary
 * when it has one. TM_ERR_IO / TM_ERR_FORMAT / TM_ERR_UNSUPPORTED name the
 * file and the key or tensor. */
tm_status tm_model_load(const char *path, tm_model **out);
/* Open only the vocabulary of a GGUF file (its tokenizer.ggml.* keys; the
 * architecture and the tensors are neither read nor checked, so a file holding
 * only a vocabulary works): what `tiermoe tokenize` loads. The text functions
 * work on it; tm_model_describe gives arch NULL, n_vocab the vocabulary's
 * tokens and 0 for the other sizes; tm_context_create and tm_sampler_create
 * answer TM_ERR_UNSUPPORTED. A file without a usable vocabulary is
 * TM_ERR_IO / TM_ERR_FORMAT / TM_ERR_UNSUPPORTED naming the file and the key. */
tm_status tm_model_load_vocab(const char *path, tm_model **out);
/* Free a model; its contexts and detokenizers must be freed first. */
void tm_model_free(tm_model *m);

typedef struct tm_model_info {
    const char *arch; /* general.architecture ("qwen3moe", ...); owned by the model */
    uint32_t n_layer, n_embd, n_vocab, n_ctx_train;
    uint32_t n_expert, n_expert_used; /* routed experts of a layer, and per token */
    uint64_t n_params, weight_bytes;
    bool has_vocab;          /* tokenize, detokenize and chat need it */
    const char *chat_format; /* the template recognised: "chatml", "qwen3", "llama3",
                                "mistral", "harmony", "gemma4", or NULL */
    const char *name;        /* general.name, or NULL (none, or a vocabulary alone); owned by
                                the model */
    const char *path;        /* the file it was loaded from; owned by the model */
} tm_model_info;
tm_status tm_model_describe(const tm_model *m, tm_model_info *out);

/* ---- text ---- */

/* The ids of text[0..len) into ids[0..cap) (*n_ids: how many). add_special:
 * BOS/EOS as the vocabulary asks; parse_special: control tokens written in
 * the text (<|im_start|>: a chat template's output) become their ids, else
 * they are plain text. TM_ERR_UNSUPPORTED for a model without a vocabulary. */
tm_status tm_tokenize(const tm_model *m, const char *text, size_t len, bool add_special,
                      bool parse_special, int32_t *ids, size_t cap, size_t *n_ids);
/* The text of ids[0..n) into text[0..cap), NUL-terminated (*len: its length
 * without the NUL; cap must be at least *len + 1). render_special: control
 * tokens give their text. An id out of range is TM_ERR_ARG. */
tm_status tm_detokenize(const tm_model *m, const int32_t *ids, size_t n, bool render_special,
                        char *text, size_t cap, size_t *len);
/* The bytes one token stands for (control tokens: none), pointing into the
 * model (not NUL-terminated; may be part of a UTF-8 character: printing the
 * pieces in order gives the text). */
tm_status tm_token_piece(const tm_model *m, int32_t id, const char **bytes, size_t *len);
/* Whether the token ends a generated turn (eos, eot, <|im_end|>, ...). */
tm_status tm_token_is_end(const tm_model *m, int32_t id, bool *is_end);

/* A token's type: tokenizer.ggml.token_type's values (llama.cpp's). */
typedef enum tm_token_type {
    TM_TOKEN_TYPE_UNDEFINED = 0,
    TM_TOKEN_TYPE_NORMAL = 1,
    TM_TOKEN_TYPE_UNKNOWN = 2,
    TM_TOKEN_TYPE_CONTROL = 3, /* <|im_start|>, </s>: parsed only with parse_special */
    TM_TOKEN_TYPE_USER_DEFINED = 4,
    TM_TOKEN_TYPE_UNUSED = 5,
    TM_TOKEN_TYPE_BYTE = 6 /* SentencePiece's <0x0A>: one byte */
} tm_token_type;

typedef struct tm_token_info {
    tm_token_type type;
    const char *text; /* the bytes it stands for, a control token's own text included
                         (`tiermoe tokenize` shows these): len bytes, not NUL-terminated,
                         pointing into the model */
    size_t len;
} tm_token_info;
/* A token's type and bytes. An id out of range is TM_ERR_ARG. */
tm_status tm_token_describe(const tm_model *m, int32_t id, tm_token_info *out);

typedef struct tm_vocab_info {
    uint32_t n_tokens; /* ids 0 .. n_tokens - 1 (n_vocab may count more embedding rows) */
    const char *model; /* tokenizer.ggml.model: "gpt2" (byte-level BPE) or "llama"
                          (SentencePiece); owned by the model */
    const char *pre;   /* tokenizer.ggml.pre ("qwen2", "llama-bpe", ...) or "default" */
} tm_vocab_info;
/* The vocabulary's size and kind; TM_ERR_UNSUPPORTED without a vocabulary. */
tm_status tm_vocab_describe(const tm_model *m, tm_vocab_info *out);

/* A streaming detokenizer: ids pushed one at a time, as they are generated,
 * give the text to print now, which never ends inside a UTF-8 character (the
 * first bytes of one are held until the rest comes). The first piece of a
 * SentencePiece stream loses its leading space, as tm_detokenize's text does.
 * render_special: control tokens give their text. replace_invalid: bytes that
 * can never become a character come out as U+FFFD (for output that must be
 * valid UTF-8); without it they come out as they are, and all the text pushed
 * and flushed equals tm_detokenize's of the same ids. It reads m's
 * vocabulary: free it before m. TM_ERR_UNSUPPORTED without a vocabulary. */
typedef struct tm_detokenizer tm_detokenizer;
tm_status tm_detokenizer_create(const tm_model *m, bool render_special, bool replace_invalid,
                                tm_detokenizer **out);
/* The text id completes: text[0..*len) (*len may be 0), owned by d and valid
 * until its next call. An id out of range is TM_ERR_ARG (d is unchanged). */
tm_status tm_detokenizer_push(tm_detokenizer *d, int32_t id, const char **text, size_t *len);
/* The end of the text: the bytes still held (*len may be 0), as push gives
 * them. Pushing more goes on from there. */
tm_status tm_detokenizer_flush(tm_detokenizer *d, const char **text, size_t *len);
void tm_detokenizer_free(tm_detokenizer *d);

typedef struct tm_chat_message {
    const char *role; /* "system", "user", "assistant" (others: skipped, except "developer" = system
                         for harmony) */
    const char *content; /* UTF-8, NUL-terminated */
} tm_chat_message;

/* Render a conversation with the model's chat template (format NULL) or a
 * named one ("chatml", "qwen3", "llama3", "mistral", "harmony", "gemma4") into
 * text[0..cap), NUL-terminated, as tm_detokenize sizes it. Tokenize the
 * result with add_special and parse_special. add_generation_prompt: end with
 * the opening of the assistant's turn. TM_ERR_UNSUPPORTED when the model's
 * template is not one of those and format is NULL; TM_ERR_ARG for another
 * name. */
tm_status tm_chat_apply(const tm_model *m, const char *format, const tm_chat_message *msgs,
                        size_t n_msgs, bool add_generation_prompt, char *text, size_t cap,
                        size_t *len);
/* Whether format names a built-in chat format ("chatml", "qwen3", "llama3",
 * "mistral", "harmony", "gemma4"), before any model is loaded (a flag's check):
 * TM_ERR_ARG naming it and the known ones otherwise. */
tm_status tm_chat_format_check(const char *format);
/* tm_chat_render's switches beyond tm_chat_apply's. */
typedef struct tm_chat_params {
    bool add_generation_prompt; /* end with the opening of the assistant's turn */
    bool disable_thinking;      /* qwen3: enable_thinking false (the turn opens with an empty
                                   think block); other formats: no effect */
} tm_chat_params;
/* tm_chat_apply with params p (what an OpenAI request's chat_template_kwargs
 * give): the same statuses; p NULL is TM_ERR_ARG. */
tm_status tm_chat_render(const tm_model *m, const char *format, const tm_chat_message *msgs,
                         size_t n_msgs, const tm_chat_params *p, char *text, size_t cap,
                         size_t *len);
/* What of a generated reply goes back into the conversation as the
 * assistant's content, for format as tm_chat_apply takes it: reply[*start ..
 * *start + *n). Harmony keeps only the final channel's text (its template
 * drops the analysis); every format cuts the end-of-turn token written as
 * text (<|im_end|>, <|eot_id|>, </s>, <|end|>, <|return|>, <turn|>). The same status
 * as tm_chat_apply for format (len 0 asks only that). */
tm_status tm_chat_reply(const tm_model *m, const char *format, const char *reply, size_t len,
                        size_t *start, size_t *n);

/* ---- contexts ---- */

#define TM_AUTO                 (-1) /* a value the engine picks (see each field) */
#define TM_OFF                  (-2) /* a lane turned off */
#define TM_FETCH_COPY           1 /* moe_fetch: copy prompts' experts in RAM to VRAM, then compute */
#define TM_FETCH_PCIE           2   /* moe_fetch: the GPU reads them in place over PCIe */
#define TM_CACHE_UPDATE_BETWEEN 0   /* moe_cache_update: weak slots exchanged between requests */
#define TM_CACHE_UPDATE_FULL    1   /* moe_cache_update: also the policy admits after each step */
#define TM_MOE_PCIE_MAX         32  /* moe_pcie's N at most */
#define TM_MOE_AHEAD_MAX        16  /* moe_ahead's N at most */
#define TM_MOE_CACHE_CURVE_MAX  8.0 /* moe_cache_curve at most */
#define TM_MAX_GPUS             8   /* GPUs a context uses at most */
#define TM_SPLIT_LAYER          0   /* split_mode: each GPU runs a contiguous span of layers */
#define TM_SPLIT_NONE           1   /* split_mode: main_gpu's GPU alone */

/* A context's sizes and placement; the same options as the flags of
 * `tiermoe run` (docs/placement.md). Fill with tm_context_opts_init, then
 * set fields: later versions may add fields at the end. */
typedef struct tm_context_opts {
    int64_t n_ctx;        /* -c: positions of all sequences (0: min(4096, trained context)) */
    int32_t n_seq;        /* sequences, each with n_ctx / n_seq positions (0: 1) */
    int64_t n_batch;      /* -b: tokens of a prompt per step, rows of tm_eval_rows (0: 512) */
    int32_t n_threads;    /* -t (0: the physical cores) */
    bool kv_f32;          /* --kv-type f32: the KV cache in f32 (default f16) */
    int32_t n_gpu_layers; /* -ngl: the first N layers on the GPU (>= n_layer: all and the output
                             head); TM_AUTO: as many as fit. Default 0: the CPU (unlike the CLI,
                             an expert option does not imply TM_AUTO) */
    bool cpu_moe;         /* --cpu-moe: every layer's experts in RAM */
    int32_t n_cpu_moe;    /* --n-cpu-moe N: the experts of layers < N in RAM */
    const char *override_tensor; /* -ot PATTERN=CPU|CUDA0[,...] (NULL: none) */
    int64_t moe_cache_mib;       /* --moe-cache: VRAM MiB for experts in RAM (0: none, TM_AUTO) */
    const char *moe_cache_plan;  /* --moe-cache-plan FILE: the cache's experts (NULL: none) */
    const char *moe_learn;       /* --moe-learn FILE: observations to plan the cache from */
    int32_t moe_pcie;            /* --moe-pcie: TM_AUTO (default), TM_OFF or N */
    int32_t moe_fetch; /* --moe-fetch: TM_AUTO (default), TM_OFF, TM_FETCH_COPY, TM_FETCH_PCIE */
    int32_t moe_ahead; /* --moe-ahead: TM_AUTO (default), TM_OFF or N */
    int64_t ram_cache_mib; /* --ram-cache: RAM MiB for experts read from the file (0: none,
                              TM_AUTO) */
    bool expert_stats;     /* count each layer's expert selections (tm_expert_counts) */
    bool profile; /* --profile: time every part for tm_context_profile (on a GPU: events and a
                     sync per part, no CUDA graph: slower) */
    const char *moe_cache_weighting; /* --moe-cache-weighting: how a plan made at creation
                                        weighs layers: "flat" (NULL), "pressure",
                                        "smooth_pressure", "time", "balanced" */
    double moe_cache_curve;          /* --moe-cache-curve: its layer curve, 0 (1: the
                                        default) .. TM_MOE_CACHE_CURVE_MAX */
    int32_t moe_cache_update;        /* --moe-cache-update: TM_CACHE_UPDATE_BETWEEN (the
                                        default), TM_CACHE_UPDATE_FULL or TM_OFF (the planned
                                        experts stay) */
    const char *moe_cache_policy;    /* --moe-cache-policy: the policy of TM_CACHE_UPDATE_FULL:
                                        "adaptive" (NULL), "lru", "lfu", "static" */
    int32_t moe_cache_admit; /* --moe-cache-admit: uploads a layer a step at most (0: 1, TM_OFF:
                                no cap) */
    bool expert_trace_names; /* --expert-trace-names: a line on stderr per routed slot naming
                                its expert's tensors (counts as expert_stats does) */
    /* several GPUs (docs/flags.md, "Several GPUs"; what runs today is said there) */
    const char *devices;        /* -dev: the GPUs, in the order their spans of layers run,
                                   "CUDA0,CUDA1", or "none" (NULL: every GPU present) */
    int32_t split_mode;         /* --split-mode: TM_SPLIT_LAYER (default) or TM_SPLIT_NONE */
    const char *tensor_split;   /* --tensor-split "A,B": the spans' proportions, one a GPU
                                   of devices (NULL: each GPU's free memory) */
    int32_t main_gpu;           /* -mg: TM_SPLIT_NONE's GPU, an index into devices' list */
    const char *moe_cache_gpus; /* --moe-cache "A,B": each GPU's expert cache in MiB, in
                                   devices' order (NULL: moe_cache_mib; given, it replaces
                                   moe_cache_mib) */
} tm_context_opts;

void tm_context_opts_init(tm_context_opts *o);
/* Check o as far as that needs no model (what tm_context_create checks
 * first): the ranges, -ot's patterns and buffer names, the cache's weighting
 * and policy names. TM_ERR_ARG naming the field and its flag. The files
 * (moe_cache_plan, moe_learn) are read by tm_context_create. */
tm_status tm_context_opts_check(const tm_context_opts *o);
/* A context of m: KV caches, the placement, the tier. A placement that does
 * not fit is TM_ERR_DEVICE stating needed and free bytes; bad options
 * TM_ERR_ARG naming the option; a plan or learn file of another model
 * TM_ERR_FORMAT / TM_ERR_ARG naming the file and field. */
tm_status tm_context_create(tm_model *m, const tm_context_opts *o, tm_context **out);
void tm_context_free(tm_context *c);

typedef struct tm_context_info {
    int64_t n_ctx;        /* positions of one sequence */
    int32_t n_seq;        /* sequences */
    int64_t n_batch;      /* rows of a step */
    int32_t n_gpu_layers; /* layers on the GPU (resolved) */
    bool cache;           /* a VRAM expert cache exists (tm_cache_apply applies plans) */
} tm_context_info;
tm_status tm_context_describe(const tm_context *c, tm_context_info *out);
/* `tiermoe run --profile`'s report of where the time went since the context
 * was made, into text[0..cap), NUL-terminated, as tm_detokenize sizes it:
 * time by part, the CPU lane's thread time, the MoE step by layer class and
 * the VRAM cache's numbers, the SSD tier's (--ram-cache; its read rate over
 * the time spent in tm_eval and tm_eval_rows), and the synthetic routing of a
 * model made by `tiermoe mkmodel`. Lines end in a newline. TM_ERR_UNSUPPORTED
 * for a context made without profile. */
tm_status tm_context_profile(const tm_context *c, char *text, size_t cap, size_t *len);

/* ---- evaluation ---- */

/* Append tokens[0..n) (n >= 1) to sequence seq (0 .. n_seq - 1) and
 * evaluate them (in steps of n_batch): afterwards tm_logits(seq) is the
 * last token's. TM_ERR_ARG when a token is out of range or the sequence
 * would pass n_ctx (nothing is evaluated then). After another failure the
 * sequence is empty. */
tm_status tm_eval(tm_context *c, int32_t seq, const int32_t *tokens, int64_t n);
/* One step of n rows (1 .. n_batch): row i appends tokens[i] to sequence
 * seqs[i] (distinct sequences). The same tokens and, within the products'
 * rounding, the same logits as tm_eval of each sequence alone. On a
 * failure of the step every sequence in it is empty. */
tm_status tm_eval_rows(tm_context *c, int64_t n, const int32_t *seqs, const int32_t *tokens);
/* One prompt step of n rows (1 .. n_batch) of one or more sequences (serve's
 * waiting prompts together): row i appends tokens[i] to sequence seqs[i]; a
 * sequence's rows are consecutive in the step (one run a sequence, in
 * order; rows of a sequence elsewhere in the step are TM_ERR_ARG). Each row
 * sees its own sequence's positions up to its own (causal within its run):
 * the same tokens and, within the products' rounding, the same logits as
 * tm_eval of each run alone, in one step (with experts in RAM on a GPU, one
 * copy of each routed expert serves every run; a GPU runs this step's
 * attention a row at a time in f32, where one sequence's chunk of more than
 * 8 tokens rounds it to f16 on tensor cores). Afterwards tm_logits(seq) is
 * the last token's of each run (their rows are computed, no others); each
 * run's end is a prompt's end (a linear-attention layer's checkpoint, as
 * tm_eval of a prompt). A run that starts an empty sequence starts the expert
 * counts' per-sequence windows over, as tm_seq_prompt does. TM_ERR_ARG as
 * tm_eval (nothing is evaluated then); on a failure of the step every
 * sequence in it is empty. */
tm_status tm_eval_batch(tm_context *c, int64_t n, const int32_t *seqs, const int32_t *tokens);
/* The logits (n_vocab floats, owned by the context, valid until the next
 * eval, rewind or free) of sequence seq's last evaluated token.
 * TM_ERR_ARG when it has none (empty, or rewound since). Right after a step
 * they are read in place, in the step's output (no copy of n_vocab floats a
 * row); a later step copies out only those of sequences it does not
 * evaluate whose rows it overwrites. */
tm_status tm_logits(const tm_context *c, int32_t seq, const float **logits);
/* How many positions sequence seq holds. */
tm_status tm_seq_length(const tm_context *c, int32_t seq, int64_t *n);
/* Keep the first n_keep positions of sequence seq (0: forget it); *n_kept
 * (may be NULL) gets what was kept: n_keep at most the length, or 0 where
 * the model's state cannot go back (sliding rings past their window, a
 * linear-attention layer's state). Its logits are gone until the next eval. */
tm_status tm_seq_rewind(tm_context *c, int32_t seq, int64_t n_keep, int64_t *n_kept);

/* How many leading tokens of tokens[0..n) (n >= 1) sequence seq would keep
 * under tm_seq_prompt: the prefix shared with what it holds, never the last
 * token (its logits are needed), and 0 where the model's state cannot go back
 * to it (as tm_seq_rewind keeps 0). An id out of range counts as not shared. */
tm_status tm_seq_shared(const tm_context *c, int32_t seq, const int32_t *tokens, int64_t n,
                        int64_t *n_keep);
/* Make sequence seq hold exactly tokens[0..n) (1 .. n_ctx tokens): keep
 * tm_seq_shared's prefix, evaluate the rest as a prompt (one step per
 * n_batch); afterwards tm_logits(seq) is tokens[n - 1]'s. *n_eval (may be
 * NULL) gets the tokens evaluated. When nothing is kept, the expert counts'
 * per-sequence windows start over (a new sequence). TM_ERR_ARG as tm_eval
 * (nothing is evaluated then); after another failure the sequence is empty. */
tm_status tm_seq_prompt(tm_context *c, int32_t seq, const int32_t *tokens, int64_t n,
                        int64_t *n_eval);
/* The tokens sequence seq holds, in order: *tokens[0 .. *n) (owned by the
 * context, valid until seq is next evaluated, rewound or the context freed;
 * *tokens may be NULL when *n is 0). It reads only seq's part of the context:
 * another thread may call it while the context's thread evaluates other
 * sequences (serve's slots do, sampling beside the worker's steps). */
tm_status tm_seq_tokens(const tm_context *c, int32_t seq, const int32_t **tokens, int64_t *n);

/* ---- sampling ---- */

/* In llama.cpp's order: repetition penalty, top-k, top-p, min-p, temperature. */
typedef struct tm_sampler_params {
    float temp;            /* <= 0: greedy */
    int32_t top_k;         /* <= 0: off */
    float top_p;           /* >= 1: off */
    float min_p;           /* <= 0: off */
    float repeat_penalty;  /* 1: off */
    int32_t repeat_last_n; /* tokens of history the penalty looks at */
    uint64_t seed;         /* the same seed and logits give the same tokens */
} tm_sampler_params;

/* The CLI's defaults (temp 0.8, top-k 40, top-p 0.95, min-p 0.05, no penalty). */
void tm_sampler_params_init(tm_sampler_params *p);
/* A sampler for m's vocabulary; TM_ERR_ARG naming a bad parameter. */
tm_status tm_sampler_create(const tm_model *m, const tm_sampler_params *p, tm_sampler **out);
void tm_sampler_free(tm_sampler *s);
/* The next token of sequence seq from its logits (tm_logits) and its tokens
 * (the penalty's history). The token is not appended: tm_eval it. */
tm_status tm_sample(tm_sampler *s, const tm_context *c, int32_t seq, int32_t *token);

/* The next token from logits[0..n_vocab) of the sampler's model, with
 * history[0..n_history) (history may be NULL when n_history is 0) as the
 * penalty's history: what tm_sample does with a sequence's logits and tokens,
 * for logits the caller holds (a copy, or tm_logits' row read while another
 * thread prepares the next step). Touches only s. */
tm_status tm_sampler_sample(tm_sampler *s, const float *logits, const int32_t *history,
                            size_t n_history, int32_t *token);

/* ---- experts: statistics and the VRAM cache ---- */

/* How often each expert of layer was selected since the context was made
 * or the counts reset: counts[0..n_expert). TM_ERR_UNSUPPORTED when the
 * context was made without expert_stats (or expert_trace_names). */
tm_status tm_expert_counts(const tm_context *c, uint32_t layer, uint64_t *counts, size_t cap);
tm_status tm_expert_counts_reset(tm_context *c);
/* The counts' summary that `tiermoe run --expert-trace-stats` prints at the
 * end (per_layer: with the per-layer table), into text[0..cap) as
 * tm_context_profile. TM_ERR_UNSUPPORTED as tm_expert_counts. */
tm_status tm_expert_stats_summary(const tm_context *c, bool per_layer, char *text, size_t cap,
                                  size_t *len);
/* Write the counts to path as a learn file (docs/trace-format.md; a path
 * ending in .csv: CSV), as --expert-trace-output does: through a temporary
 * file renamed into place. TM_ERR_UNSUPPORTED as tm_expert_counts; TM_ERR_IO
 * naming the path. */
tm_status tm_expert_stats_write(const tm_context *c, const char *path);
/* The counts as the learn file's JSON (docs/trace-format.md; what
 * tm_expert_stats_write writes to a .json path, without its final newline)
 * into text[0..cap), NUL-terminated, as tm_context_profile. GET
 * /moe-layer-perf answers it. TM_ERR_UNSUPPORTED as tm_expert_counts. */
tm_status tm_expert_stats_json(const tm_context *c, char *text, size_t cap, size_t *len);
/* The experts in layer's VRAM cache slots, slot by slot (-1: an empty
 * slot), into experts[0..cap); *n_slots: the layer's slots (0: the layer
 * has no cache slots: its experts are all in VRAM, or all in RAM with no
 * cache). */
tm_status tm_cache_experts(const tm_context *c, uint32_t layer, int32_t *experts, size_t cap,
                           size_t *n_slots);
/* Apply a plan (the JSON of docs/plan-format.md, len bytes, for this
 * model) inside the cache's fixed slots, as POST /moe-hot-cache does: per
 * layer the plan's first n_slots experts; residents the plan lists stay in
 * their slots, newcomers take the others'. *n_changed (may be NULL): slots
 * rewritten. A bad plan is TM_ERR_FORMAT / TM_ERR_ARG naming the field,
 * checked first; then a context without a cache (CPU only, or no experts in
 * RAM) is TM_ERR_UNSUPPORTED. A failed upload puts the replaced experts
 * back. Between evaluations only. */
tm_status tm_cache_apply(tm_context *c, const char *plan_json, size_t len, int32_t *n_changed);
/* A plan (docs/plan-format.md) for this context's VRAM cache, into
 * plan_json[0..cap), NUL-terminated, as tm_context_profile: per layer with
 * cache slots its most selected experts (ties: the lower id), as many as it
 * has slots, from the live counts (learn_json NULL) or from a learn file's
 * JSON (learn_len bytes, of this model), as POST /moe-hot-cache makes them
 * for tm_cache_apply. weighting (NULL: "flat"; "pressure", "smooth_pressure",
 * "time", "balanced") is recorded in the plan: with every layer's slots fixed
 * it ranks nothing. TM_ERR_ARG naming a bad weighting; a bad learn file
 * TM_ERR_FORMAT / TM_ERR_ARG naming the field; then TM_ERR_UNSUPPORTED for the
 * live counts of a context without expert_stats, or a context without a
 * cache. */
tm_status tm_cache_plan(const tm_context *c, const char *learn_json, size_t learn_len,
                        const char *weighting, char *plan_json, size_t cap, size_t *len);
/* Between requests: let the VRAM cache exchange up to a share of each cached
 * layer's weakest experts for the ones routed more since (the cache policy's
 * scores), uploaded in the background and used once there; what `tiermoe
 * serve` does after each request. TM_OK doing nothing when the context has no
 * cache or was made with moe_cache_update TM_OFF. Between evaluations only. */
tm_status tm_cache_update(tm_context *c);

/* ---- counters of the tiers (GET /metrics) ---- */

/* Where a layer's routed experts are: its class. */
#define TM_LAYER_VRAM    0 /* every expert in VRAM */
#define TM_LAYER_RAM     1 /* every expert in RAM */
#define TM_LAYER_CACHED  2 /* in RAM, some in VRAM cache slots */
#define TM_LAYER_CLASSES 3

/* The layers of a class since the context was made. Slots are routed
 * (token, expert) pairs, by the lane that computed them: hot (the GPU from
 * VRAM), pcie (the GPU reading RAM), cold (the CPU), fetch (a prompt's experts
 * in RAM computed by the GPU), fallback (the CPU after a failed copy). Times
 * in ns: hot, pcie, gpu_wait, merge, fetch, copy and copy_wait are measured
 * only with profile. */
typedef struct tm_tier_counters {
    uint32_t layers; /* of the class */
    uint64_t steps;  /* their MoE steps */
    uint64_t hot_slots, pcie_slots, cold_slots, fetch_slots, fallback_slots;
    uint64_t hot_bytes, pcie_bytes, cold_bytes, fetch_bytes; /* expert bytes the lanes read */
    uint64_t upload_bytes;                                   /* uploaded into the VRAM cache */
    uint64_t hot_ns, pcie_ns, cold_ns;
    uint64_t wait_ns;     /* the host waiting for the GPU's hand-off */
    uint64_t gpu_wait_ns; /* the GPU waiting for the CPU lane */
    uint64_t merge_ns, fetch_ns, copy_ns, copy_wait_ns;
    uint64_t fetch_experts; /* prompts: experts in RAM the GPU computed */
    uint64_t admits;        /* experts uploaded into the VRAM cache after a step */
    uint64_t exchanges;     /* experts exchanged by the updater between requests */
} tm_tier_counters;

/* The SSD tier's (ram_cache_mib: experts read from the file into RAM). */
typedef struct tm_ssd_counters {
    uint64_t routed;      /* distinct experts layer steps asked the RAM cache for */
    uint64_t hits;        /* of those, resident */
    uint64_t faults;      /* experts read because a step needed them */
    uint64_t prefetched;  /* experts read ahead */
    uint64_t bytes_read;  /* from the file */
    uint64_t wait_ns;     /* the CPU lane waiting for reads */
    int32_t max_resident; /* experts resident in one layer, at most */
} tm_ssd_counters;

typedef struct tm_counters {
    tm_tier_counters tier[TM_LAYER_CLASSES]; /* by class (TM_LAYER_*) */
    uint64_t cache_bytes;                    /* VRAM the expert cache holds */
    bool has_ssd;                            /* an SSD tier: ssd is filled (else zero) */
    tm_ssd_counters ssd;
} tm_counters;
/* The tiers' counters (what GET /metrics shows). Between evaluations, or
 * from another thread under the caller's lock around the context's steps. */
tm_status tm_context_counters(const tm_context *c, tm_counters *out);

/* One GPU of a context (docs/executor.md, "What --profile and the counters
 * say per GPU"): the tiers'
 * counters of the layers whose routed experts it serves (tm_layer_gpu), every
 * class together (its lanes' slots, bytes and times; fetch_*, upload_bytes,
 * admits and exchanges are counted by class only and stay 0 here), its share
 * of the VRAM cache, and the activations copied into it from another GPU at
 * the boundaries of the spans of layers (peer_ns measured only with profile,
 * whose steps run without a CUDA graph). */
typedef struct tm_gpu_counters {
    int32_t device;        /* its CUDA device number (CUDAn) */
    tm_tier_counters tier; /* layers: those it serves */
    uint32_t cache_layers; /* its layers with VRAM cache slots */
    uint64_t cache_slots;  /* their slots */
    uint64_t cache_bytes;  /* the VRAM those slots take */
    uint64_t peer_copies, peer_bytes, peer_ns;
} tm_gpu_counters;
/* The context's GPUs, in the order their spans of layers run (devices'):
 * out[0 .. *n) their counters, *n how many (0 without a GPU; sized as the
 * contract above says). Between evaluations, as tm_context_counters. */
tm_status tm_context_gpus(const tm_context *c, tm_gpu_counters *out, size_t cap, size_t *n);
/* The GPU (an index into tm_context_gpus' list) whose lanes compute layer's
 * routed experts and whose VRAM holds them or their cache slots: the GPU of
 * its experts, else of the layer; -1 when neither is on a GPU or the layer
 * has no routed experts. TM_ERR_ARG for a layer out of range. */
tm_status tm_layer_gpu(const tm_context *c, uint32_t layer, int32_t *gpu);

#ifdef __cplusplus
}
#endif
#endif
