#!/usr/bin/env python3
"""`tiermoe serve --parallel 4` on a hybrid model (mkmodel's tiny-qwen3next with
Qwen3's vocabulary): linear attention's state per slot, and the rewind rule
through the server's prefix reuse (docs/qwen3next.md).

Against independent paths (the same request sent alone, from scratch):
- 4 clients at once, prompts of different lengths: each greedy answer equals
  the answer to the same request alone (each slot's conv and delta-rule states
  are its own);
- a prompt that continues a slot's prompt but not its reply keeps exactly the
  prompt's checkpoint (timings.cache_n), and a continuation of a request and
  its reply keeps what the slot holds (or the checkpoint, where the text
  re-tokenizes otherwise at the join), each with the answer of the same
  request from scratch;
- a prompt that shares only the first part of a slot's prompt (less than the
  checkpoint) keeps nothing there (cache_n 0: a recurrent state cannot be cut
  back), with the answer from scratch.
"""
import os
import sys
import threading

try:
    import openai
except ImportError:
    print("openai not installed: skipping")
    sys.exit(77)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_common import TIERMOE, TMP, check, failures, finish, run  # noqa: E402
from server_harness import Server, unpack_vocab  # noqa: E402

FRESH = {"cache_prompt": False}
MODEL = "serve_hybrid"
PROMPTS = ["The quick brown fox", "Once upon a time in a land far away, there lived", "1, 2, 3,",
           "A long time ago the people of the valley built a great stone bridge and"]


def main():
    os.makedirs(TMP, exist_ok=True)
    tok = unpack_vocab()
    unpack_vocab("tokenizer_config.json")
    model = os.path.join(TMP, MODEL + ".gguf")
    run([TIERMOE, "mkmodel", "--preset", "tiny-qwen3next", "--vocab", tok, "-q", "-o", model])
    srv = Server(model, "--parallel", "4", "-c", "2048", "--max-tokens", "200")
    try:
        c = openai.OpenAI(base_url=srv.base + "/v1", api_key="x", max_retries=0, timeout=300)
        n_tok = [24, 40, 16, 32]
        alone = [c.completions.create(model=MODEL, prompt=p, max_tokens=n, temperature=0,
                                      extra_body=FRESH).choices[0].text for p, n in zip(PROMPTS, n_tok)]
        check(len(set(alone)) == len(alone), f"the answers are not distinct: {alone}")

        got = [None] * len(PROMPTS)

        def client(i):
            cl = openai.OpenAI(base_url=srv.base + "/v1", api_key="x", max_retries=0, timeout=300)
            got[i] = cl.completions.create(model=MODEL, prompt=PROMPTS[i], max_tokens=n_tok[i],
                                           temperature=0, extra_body=FRESH).choices[0].text
        ts = [threading.Thread(target=client, args=(i,)) for i in range(len(PROMPTS))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        n_failed = len(failures)
        for i, (a, b) in enumerate(zip(alone, got)):
            check(a == b, f"request {i} with 4 clients: {b!r}, alone {a!r}")
        if len(failures) == n_failed:
            print("  4 clients on 4 slots: every answer equals alone's")

        # a prompt that continues a slot's prompt but not its reply: the prompt's checkpoint
        first = c.completions.create(model=MODEL, prompt=PROMPTS[3], max_tokens=12, temperature=0)
        cont = PROMPTS[3] + " so on and on"
        r = c.completions.create(model=MODEL, prompt=cont, max_tokens=16, temperature=0)
        ref = c.completions.create(model=MODEL, prompt=cont, max_tokens=16, temperature=0, extra_body=FRESH)
        cache_n = r.model_extra["timings"]["cache_n"]
        check(cache_n == first.usage.prompt_tokens,
              f"a prompt continuing a slot's prompt kept {cache_n} tokens, not its checkpoint "
              f"({first.usage.prompt_tokens})")
        check(r.choices[0].text == ref.choices[0].text,
              f"from the checkpoint {r.choices[0].text!r}, from scratch {ref.choices[0].text!r}")
        print(f"  a prompt continuing a slot's prompt (not its reply) kept the checkpoint's {cache_n} "
              "tokens; same answer as from scratch")

        # a continuation of a request and its reply: all the slot holds
        first = c.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=12, temperature=0)
        cont = PROMPTS[1] + first.choices[0].text + " and then"
        r = c.completions.create(model=MODEL, prompt=cont, max_tokens=16, temperature=0)
        ref = c.completions.create(model=MODEL, prompt=cont, max_tokens=16, temperature=0, extra_body=FRESH)
        cache_n = r.model_extra["timings"]["cache_n"]
        held = first.usage.prompt_tokens + first.usage.completion_tokens
        check(r.choices[0].text == ref.choices[0].text,
              f"continuation {r.choices[0].text!r}, from scratch {ref.choices[0].text!r}")
        check(cache_n == first.usage.prompt_tokens or held - 2 <= cache_n <= held,
              f"continuation kept {cache_n} tokens: neither the prompt's checkpoint "
              f"({first.usage.prompt_tokens}) nor what the slot held ({held})")
        print(f"  a continuation kept {cache_n} of the slot's {held} tokens (prompt "
              f"{first.usage.prompt_tokens}); same answer as from scratch")

        # a prompt sharing less than the checkpoint: nothing kept
        p2 = PROMPTS[3]
        c.completions.create(model=MODEL, prompt=p2, max_tokens=4, temperature=0)
        short = p2.split(" the ")[0] + " the river was wide"
        r = c.completions.create(model=MODEL, prompt=short, max_tokens=12, temperature=0)
        ref = c.completions.create(model=MODEL, prompt=short, max_tokens=12, temperature=0, extra_body=FRESH)
        check(r.model_extra["timings"]["cache_n"] == 0,
              f"a prompt sharing less than the checkpoint kept {r.model_extra['timings']['cache_n']} tokens")
        check(r.choices[0].text == ref.choices[0].text,
              f"after a cut before the checkpoint: {r.choices[0].text!r}, from scratch {ref.choices[0].text!r}")
        print("  a prompt sharing less than a slot's checkpoint kept nothing; same answer as from scratch")
        check(srv.stop() == 0, "serve did not exit 0")
    finally:
        srv.stop()
    return finish("serve --parallel 4 on qwen3next: per-slot states, the rewind rule through prefix reuse")


if __name__ == "__main__":
    sys.exit(main())
