#!/usr/bin/env python3
"""Oracle test for the built-in chat templates: our renderer (tok_chat) against
jinja2 rendering the models' own Jinja templates the way HF's
apply_chat_template does (sandboxed environment, trim_blocks, lstrip_blocks).

Templates: Qwen3's (tests/data/vocab/qwen3, committed), Llama 3's (from
../shared/vocab/llama3 when present, and Llama 3 Instruct's form), Mistral
Instruct v0.1 / Mixtral's, a plain ChatML one and Qwen2's (default system
prompt). gpt-oss harmony is checked against the published format written out
by hand (its template is large and not shipped in a package); Gemma 4 against
goldens its own template rendered (tests/data/chat/gemma4.json,
scripts/make_gemma4_chat_goldens.py). Also checked:
template recognition, the clear error for an unknown template, and the reply
content kept for the history."""
import json
import lzma
import os
import subprocess
import sys

try:
    import jinja2  # noqa: F401  (the oracle; rendered through oracle_common)
except ImportError:
    print("skipped: jinja2 not installed")
    sys.exit(77)

TOOLS = os.environ.get("TM_TOOLS_DIR", "build/tests")
DATA = os.environ.get("TM_TEST_DATA", os.path.join(os.path.dirname(__file__), "..", "data"))
TMP = os.environ.get("TM_TEST_TMP", "/tmp/tm_chat_oracle")
REPO = os.path.abspath(os.path.join(DATA, "..", ".."))
SHARED_VOCAB = os.environ.get("TM_SHARED_VOCAB", os.path.join(REPO, "..", "shared", "vocab"))
os.makedirs(TMP, exist_ok=True)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_common import jinja_chat_render  # noqa: E402

LLAMA3_INSTRUCT = ("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
                   "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + "
                   "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
                   "{{ content }}{% endfor %}{% if add_generation_prompt %}"
                   "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
MISTRAL_V1 = ("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
              "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
              "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
              "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
              "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}")
CHATML = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
          "'\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
QWEN2 = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
         "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
         "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
         "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

U, A, S = "user", "assistant", "system"
CONVS = {
    "one user turn": [(U, "Hello")],
    "system + user": [(S, "You are terse."), (U, "Hi there")],
    "multi-turn": [(U, "What is 2+2?"), (A, "4"), (U, "And 3+3?")],
    "system multi-turn": [(S, "Be brief."), (U, "Name a color."), (A, "Blue."), (U, "Another?")],
    "unicode and spaces": [(U, "  日本語 😀 café\n\n"), (A, "\n ok \t"), (U, "\tnext ")],
    "empty content": [(U, "")],
    "thinking in history": [(U, "Q1"), (A, "<think>\nlet me think\n</think>\n\nA1"), (U, "Q2")],
    "thinking after last user": [(U, "Q1"), (A, "<think>\nr\n</think>\n\nA1")],
    "assistant last no think": [(U, "Q1"), (A, "plain answer")],
    "system in the middle": [(U, "a"), (S, "new rules"), (U, "b")],
    "tool response user": [(U, "Q"), (A, "calling"), (U, "<tool_response>42</tool_response>")],
}

passed = failed = 0


def check(ok, msg, detail=""):
    global passed, failed
    print(("PASS " if ok else "FAIL ") + msg)
    if not ok and detail:
        print(detail)
    passed += ok
    failed += not ok


def ours(cases):
    path = os.path.join(TMP, "cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cases, f, ensure_ascii=False)
    out = subprocess.run([os.path.join(TOOLS, "tok_chat"), path], check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def compare_family(name, template, want_format, conv_names, gens=(True, False), extra=None, ours_extra=None,
                   skip=lambda conv, gen: False):
    extra = extra or {}
    ours_extra = ours_extra or {}
    cases, expect, labels = [], [], []
    for cn in conv_names:
        for gen in gens:
            if skip(cn, gen):
                continue
            msgs = CONVS[cn]
            expect.append(jinja_chat_render(template, msgs, gen, extra))
            cases.append({"template": template, "messages": [{"role": r, "content": c} for r, c in msgs],
                          "add_generation_prompt": gen, **ours_extra})
            labels.append(f"{cn}, add_generation_prompt={gen}")
    got = ours(cases)
    n_ok = 0
    for lab, g, e in zip(labels, got, expect):
        ok = g.get("format") == want_format and g.get("text") == e
        n_ok += ok
        if not ok:
            check(False, f"{name}: {lab}", f"  format {g.get('format')}\n  ours  {g.get('text')!r}\n  jinja {e!r}")
    check(n_ok == len(cases), f"{name}: recognised as {want_format}; {n_ok}/{len(cases)} renders == jinja2")


ALL = list(CONVS)
GENERIC = ["one user turn", "system + user", "multi-turn", "system multi-turn", "unicode and spaces", "empty content"]
ALTERNATING = ["one user turn", "multi-turn", "unicode and spaces", "empty content"]

# Qwen3: the real template, with and without enable_thinking=false
with lzma.open(os.path.join(DATA, "vocab", "qwen3", "tokenizer_config.json.xz")) as f:
    qwen3 = json.load(f)["chat_template"]
compare_family("qwen3", qwen3, "qwen3", ALL)
compare_family("qwen3 enable_thinking=false", qwen3, "qwen3", ALL, extra={"enable_thinking": False},
               ours_extra={"enable_thinking": False})

# Llama 3: Instruct form; the shared base-model template always ends with the assistant header
compare_family("llama3 instruct", LLAMA3_INSTRUCT, "llama3", GENERIC, extra={"bos_token": "<|begin_of_text|>"},
               ours_extra={"bos": "<|begin_of_text|>"})
cfg = os.path.join(SHARED_VOCAB, "llama3", "tokenizer_config.json")
if os.path.exists(cfg):
    compare_family("llama3 (shared)", json.load(open(cfg))["chat_template"], "llama3", GENERIC, gens=(True,),
                   extra={"bos_token": "<|begin_of_text|>"}, ours_extra={"bos": "<|begin_of_text|>"})
else:
    print(f"skip llama3 (shared): {cfg} not present")

# Mistral v0.1 / Mixtral: only alternating user/assistant (the template rejects the rest)
compare_family("mistral", MISTRAL_V1, "mistral", ALTERNATING, gens=(True,), extra={"bos_token": "<s>", "eos_token": "</s>"},
               ours_extra={"bos": "<s>"})
sysm = ours([{"template": MISTRAL_V1, "messages": [{"role": S, "content": "Be brief."}, {"role": U, "content": "Hi"}],
              "add_generation_prompt": True}])[0]["text"]
check(sysm == "[INST] Be brief.\n\nHi [/INST]", f"mistral: system text leads the first user turn: {sysm!r}")

compare_family("chatml", CHATML, "chatml", GENERIC)
compare_family("qwen2 (default system)", QWEN2, "chatml", GENERIC)

# gpt-oss harmony, written out from the published format
harmony_t = "{# gpt-oss #}<|start|>{{ x }}<|channel|>"
h = ours([{"template": harmony_t, "messages": [{"role": S, "content": "Be brief."}, {"role": U, "content": "Hi"},
                                               {"role": A, "content": "Hello!"}, {"role": U, "content": "Bye"}],
           "add_generation_prompt": True, "date": "2025-08-05", "reasoning_effort": "high"}])[0]
want = ("<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        "Knowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: high\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every message.<|end|>"
        "<|start|>developer<|message|># Instructions\n\nBe brief.\n\n<|end|>"
        "<|start|>user<|message|>Hi<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Hello!<|end|>"
        "<|start|>user<|message|>Bye<|end|><|start|>assistant")
check(h["format"] == "harmony" and h["text"] == want, "harmony: system, developer, turns, generation prompt",
      f"  ours {h.get('text')!r}\n  want {want!r}")
h2 = ours([{"template": harmony_t, "messages": [{"role": U, "content": "Hi"}], "add_generation_prompt": True,
            "date": "2025-01-02"}])[0]["text"]
check(h2.endswith("Reasoning: medium\n\n# Valid channels: analysis, commentary, final. Channel must be included for "
                  "every message.<|end|><|start|>user<|message|>Hi<|end|><|start|>assistant"),
      "harmony: no developer block without a system message, reasoning defaults to medium")

# Gemma 4: goldens rendered by jinja2 from Google's template (scripts/make_gemma4_chat_goldens.py);
# recognised by its <|turn> marker
with open(os.path.join(DATA, "chat", "gemma4.json"), encoding="utf-8") as f:
    g4 = json.load(f)
g4_cases = [{"template": "{{ bos_token }}{{ '<|turn>' + role }}", "messages": c["messages"],
             "add_generation_prompt": c["add_generation_prompt"], "bos": g4["bos_token"]} for c in g4["cases"]]
n_ok = 0
for c, g in zip(g4["cases"], ours(g4_cases)):
    ok = g.get("format") == "gemma4" and g.get("text") == c["text"]
    n_ok += ok
    if not ok:
        check(False, f"gemma4: {c['name']}, add_generation_prompt={c['add_generation_prompt']}",
              f"  format {g.get('format')}\n  ours  {g.get('text')!r}\n  jinja {c['text']!r}")
check(n_ok == len(g4_cases), f"gemma4: recognised; {n_ok}/{len(g4_cases)} renders == the template's goldens")

# unknown template: a clear error naming the way out
u = ours([{"template": "{{ messages[0]['content'] }}", "messages": [{"role": U, "content": "x"}],
           "add_generation_prompt": True}])[0]
check(u["format"] == "unknown" and "--chat-template" in u.get("error", "") and "-p" in u.get("error", ""),
      f"unknown template: {u.get('error')!r}")

print(f"{passed} passed, {failed} failed")
sys.exit(1 if failed else 0)
