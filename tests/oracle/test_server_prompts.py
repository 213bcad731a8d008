#!/usr/bin/env python3
"""`tiermoe serve --parallel 3 -b 16`: prompts waiting together go through in
shared prompt steps (tm_eval_batch: every waiting prompt's next chunk in one
step of up to -b rows), on mkmodel's tiny preset and on tiny-qwen3next (linear
attention: each slot's recurrent state goes on across the shared steps, and
each step's end is its checkpoint). The tiny preset's greedy answers hardly
depend on more than a prompt's last tokens (150 tokens with the 61st changed,
or cut to 100, gave the same 12 tokens, as did tiny-qwen3next's), so the first
model is the tiny preset with --locality 0.9 (routing follows an average over
the last 64 tokens), whose answers do change with that token.

Against independent paths:
- 3 requests sent at once, prompts of 150 to 330 tokens (10 to 21 chunks of
  the batch each, so they wait together for many steps): each greedy answer
  equals the same request sent alone to a --parallel 1 server (a prompt step of
  one prompt's chunk, the path test_server_openai checks against `tiermoe run
  -p`);
- /metrics: the prompt steps' rows are the prompts' tokens, there were fewer
  steps than the prompts' chunks added up, and the steps held 1.5 prompts or
  more on average (one prompt a step held 1).
"""
import os
import sys
import threading

try:
    import openai
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("openai or prometheus_client not installed: skipping")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_common import TIERMOE, TMP, check, failures, finish, run  # noqa: E402
from server_harness import Server, make_model  # noqa: E402

MODEL = "serve_prompts"  # the model files' base name
BATCH = 16
WORDS = ["river", "stone", "bridge", "valley", "people", "built", "great", "light", "morning", "north"]


def prompt(n_words, seed):
    return " ".join(WORDS[(seed * 7 + i * (seed + 3)) % len(WORDS)] for i in range(n_words))


PROMPTS = [prompt(150, 1), prompt(230, 2), prompt(320, 3)]
N_TOK = [12, 9, 14]


def metrics(srv):
    status, body = srv.request("GET", "/metrics")
    return {smp.name: smp.value for fam in text_string_to_metric_families(body) for smp in fam.samples}


def ask(srv, i, model):
    cl = openai.OpenAI(base_url=srv.base + "/v1", api_key="x", max_retries=0, timeout=300)
    r = cl.completions.create(model=model, prompt=PROMPTS[i], max_tokens=N_TOK[i], temperature=0,
                              extra_body={"cache_prompt": False, "ignore_eos": True})
    return r.choices[0].text, r.usage.prompt_tokens


def scenario(model, name):
    """Each prompt alone on --parallel 1, then all together on --parallel 3."""
    alone = []
    srv = Server(model, "--parallel", "1", "-b", str(BATCH), "-c", "2048", "--alias", name)
    try:
        for i in range(len(PROMPTS)):
            alone.append(ask(srv, i, name))
        check(srv.stop() == 0, "serve --parallel 1 did not exit 0")
    finally:
        srv.stop()

    srv = Server(model, "--parallel", "3", "-b", str(BATCH), "-c", "4096", "--alias", name)
    try:
        m0 = metrics(srv)
        got = [None] * len(PROMPTS)
        go = threading.Barrier(len(PROMPTS))

        def client(i):
            go.wait()
            got[i] = ask(srv, i, name)
        ts = [threading.Thread(target=client, args=(i,)) for i in range(len(PROMPTS))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        m1 = metrics(srv)
        n_failed = len(failures)
        for i, (a, b) in enumerate(zip(alone, got)):
            check(a == b, f"{name}: request {i} ({a[1]} prompt tokens) sent with the others: {b!r}, "
                  f"alone {a!r}")
        steps = m1["tiermoe_prompt_steps_total"] - m0["tiermoe_prompt_steps_total"]
        rows = m1["tiermoe_prompt_rows_total"] - m0["tiermoe_prompt_rows_total"]
        held = m1["tiermoe_prompt_step_prompts_total"] - m0["tiermoe_prompt_step_prompts_total"]
        n_prompt = [n for _, n in alone]
        chunks = sum((n + BATCH - 1) // BATCH for n in n_prompt)
        check(min(n_prompt) > 8 * BATCH, f"prompts of {n_prompt} tokens: not many chunks of -b {BATCH}")
        check(rows == sum(n_prompt), f"{name}: prompt steps' rows {rows}, the prompts' tokens {sum(n_prompt)}")
        check(steps < chunks and held > 1.5 * steps,
              f"{name}: {steps:.0f} prompt steps holding {held:.0f} prompts for prompts of {n_prompt} tokens "
              f"({chunks} chunks of {BATCH}): not shared")
        if len(failures) == n_failed:
            print(f"  {name}: 3 prompts of {n_prompt} tokens sent together: the answers equal alone's; "
                  f"{steps:.0f} prompt steps of -b {BATCH} ({rows / steps:.1f} rows, {held / steps:.2f} prompts "
                  f"a step) where one prompt a step takes {chunks}")
        check(srv.stop() == 0, "serve did not exit 0")
    finally:
        srv.stop()


def main():
    # routing that follows an average over the last 64 tokens' keys: the answers depend
    # on the prompt's middle (the plain tiny preset's hardly depend on more than its end)
    model, tok = make_model(MODEL + ".gguf", "--locality", "0.9", "--locality-span", "64")
    scenario(model, "tiny-locality")
    hybrid = os.path.join(TMP, MODEL + "_hybrid.gguf")  # linear attention: a state a slot
    run([TIERMOE, "mkmodel", "--preset", "tiny-qwen3next", "--vocab", tok, "-q", "-o", hybrid])
    scenario(hybrid, "tiny-qwen3next")
    return finish("serve: waiting prompts share prompt steps, with the answers of each alone")


if __name__ == "__main__":
    sys.exit(main())
