#!/usr/bin/env python3
"""Goldens for the gemma4 chat format: Gemma 4's own Jinja template rendered by
jinja2 the way HF's apply_chat_template does (tests/oracle/oracle_common.py's
jinja_chat_render), for plain conversations, into tests/data/chat/gemma4.json.

The template is Google's (google-gemma-4-31B-it's tokenizer_config), found in
llama.cpp's source tree as models/templates/google-gemma-4-31B-it.jinja (the
llama-cpp-python source package: pip download --no-deps --no-binary :all:
llama-cpp-python==0.3.36). It is not committed; its renders are.

  python scripts/make_gemma4_chat_goldens.py [TEMPLATE.jinja]
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "oracle"))
from oracle_common import jinja_chat_render  # noqa: E402

DEFAULT = "/work/lcp/llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/google-gemma-4-31B-it.jinja"
OUT = os.path.join(HERE, "..", "tests", "data", "chat", "gemma4.json")

U, A, S = "user", "assistant", "system"
CONVS = {
    "one user turn": [(U, "Hello")],
    "system + user": [(S, "You are terse."), (U, "Hi there")],
    "developer + user": [("developer", " Rules. "), (U, "Hi")],
    "multi-turn": [(U, "What is 2+2?"), (A, "4"), (U, "And 3+3?")],
    "system multi-turn": [(S, "Be brief."), (U, "Name a color."), (A, "Blue."), (U, "Another?")],
    "unicode and spaces": [(U, "  日本語 😀 café\n\n"), (A, "\n ok \t"), (U, "\tnext ")],
    "empty content": [(U, "")],
    "thought in history": [(U, "Q1"), (A, "<|channel>thought\nlet me think<channel|>A1"), (U, "Q2")],
    "two thoughts": [(U, "Q"), (A, " x <|channel>a<channel|> y <|channel>b<channel|> z ")],
    "assistant after assistant": [(U, "Q"), (A, "part one"), (A, "part two"), (U, "ok")],
    "system in the middle": [(U, "a"), (S, "new rules"), (U, "b")],
    "assistant last": [(U, "Q1"), (A, "plain answer")],
}


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT
    with open(path, encoding="utf-8") as f:
        template = f.read()
    cases = []
    for name, msgs in CONVS.items():
        for gen in (True, False):
            cases.append({"name": name, "add_generation_prompt": gen,
                          "messages": [{"role": r, "content": c} for r, c in msgs],
                          "text": jinja_chat_render(template, msgs, gen, {"bos_token": "<bos>"})})
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump({"template": os.path.basename(path), "bos_token": "<bos>", "cases": cases}, f,
                  ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"{len(cases)} renders -> {OUT}")


if __name__ == "__main__":
    main()
