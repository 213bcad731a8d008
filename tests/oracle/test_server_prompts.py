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
- /metrics: the prompt steps' rows are the prompts' tokens, there were no more
  steps than the prompts' chunks added up (fewer at -b 16), and the steps held
  8 prompts more than there were steps (one prompt a step holds as many; 2.0 to
  2.5 a step seen, 1.4 once when the clients' requests came in late on a
  loaded machine);
- the same on the CLI over the host mock of the CUDA backend (tiermoe_mockgpu)
  with every layer on the "GPU" and the experts in RAM (--cpu-moe: the prompts'
  experts fetched), both models, at -b 8 (see main). Seen failing there with the
  GPU's pick of the runs' last rows (exec_rows_pick) one row early.
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
from oracle_common import TIERMOE, TMP, TOOLS, check, failures, finish, run  # noqa: E402
from server_harness import Server, make_model  # noqa: E402

MODEL = "serve_prompts"  # the model files' base name
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


def scenario(model, name, *flags, binary=TIERMOE, batch=16):
    """Each prompt alone on --parallel 1, then all together on --parallel 3."""
    alone = []
    srv = Server(model, "--parallel", "1", "-b", str(batch), "-c", "2048", "--alias", name, *flags,
                 binary=binary)
    try:
        for i in range(len(PROMPTS)):
            alone.append(ask(srv, i, name))
        check(srv.stop() == 0, "serve --parallel 1 did not exit 0")
    finally:
        srv.stop()

    srv = Server(model, "--parallel", "3", "-b", str(batch), "-c", "4096", "--alias", name, *flags,
                 binary=binary)
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
        chunks = sum((n + batch - 1) // batch for n in n_prompt)
        check(min(n_prompt) > 8 * batch, f"prompts of {n_prompt} tokens: not many chunks of -b {batch}")
        check(rows == sum(n_prompt), f"{name}: prompt steps' rows {rows}, the prompts' tokens {sum(n_prompt)}")
        check(steps <= chunks and held >= steps + 8,
              f"{name}: {steps:.0f} prompt steps holding {held:.0f} prompts for prompts of {n_prompt} tokens "
              f"({chunks} chunks of {batch}): not shared")
        if len(failures) == n_failed:
            print(f"  {name}: 3 prompts of {n_prompt} tokens sent together: the answers equal alone's; "
                  f"{steps:.0f} prompt steps of -b {batch} ({rows / steps:.1f} rows, {held / steps:.2f} prompts "
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
    mock = os.path.join(TOOLS, "tiermoe_mockgpu")  # the CLI over the host mock of the CUDA backend
    if os.path.exists(mock):  # every layer on the "GPU", its experts in RAM: the prompts' fetch
        # -b 8: a one-sequence chunk of more than 8 rows takes the tensor-core attention
        # (Q and P rounded to f16), which a step of several sequences does not (a row at a
        # time, f32): at -b 16 two of the 3 answers parted at a near tie; at -b 8 both sides
        # run the f32 kernels and the answers are the same
        scenario(model, "tiny-locality-mockgpu", "-ngl", "all", "--cpu-moe", binary=mock, batch=8)
        scenario(hybrid, "tiny-qwen3next-mockgpu", "-ngl", "all", "--cpu-moe", binary=mock, batch=8)
    else:
        print(f"  {mock} not built: the mock GPU's case left out")
    return finish("serve: waiting prompts share prompt steps, with the answers of each alone")


if __name__ == "__main__":
    sys.exit(main())
