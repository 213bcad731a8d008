#!/usr/bin/env python3
"""chat: talk to a model with the tiermoe Python package, one user turn a line of
stdin (Ctrl-D ends), the reply streamed as it is generated. Each turn renders the
whole conversation with the model's chat template; the context reuses the prefix
it already holds, so only the new turn is evaluated.

    python3 examples/chat.py MODEL.gguf [--cpu-moe] [-ngl N|auto|all] [-sys TEXT] [-n N] [--temp F]
"""
import argparse
import sys

import tiermoe


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model")
    ap.add_argument("-sys", "--system-prompt", default=None)
    ap.add_argument("-n", "--n-predict", type=int, default=512, help="tokens a reply at most")
    ap.add_argument("--temp", type=float, default=0.8)
    ap.add_argument("-s", "--seed", type=int, default=0)
    ap.add_argument("-c", "--ctx-size", type=int, default=4096)
    ap.add_argument("-ngl", "--n-gpu-layers", default="0", help="N, auto or all (as tiermoe run)")
    ap.add_argument("--cpu-moe", action="store_true", help="every layer's experts in RAM")
    ap.add_argument("--chat-template", default=None, help="chatml|qwen3|llama3|mistral|harmony")
    a = ap.parse_args()
    ngl = int(a.n_gpu_layers) if a.n_gpu_layers.lstrip("-").isdigit() else a.n_gpu_layers
    msgs = [{"role": "system", "content": a.system_prompt}] if a.system_prompt else []
    try:
        with tiermoe.Model(a.model, n_gpu_layers=ngl, cpu_moe=a.cpu_moe) as model, \
                model.context(n_ctx=a.ctx_size, seed=a.seed) as ctx:
            if sys.stdin.isatty():
                print(f"chat ({model.info.chat_format or a.chat_template} template): type a message and "
                      "press Enter; end with Ctrl-D", file=sys.stderr)
            for line in sys.stdin:
                line = line.rstrip("\r\n")
                if not line:
                    continue
                msgs.append({"role": "user", "content": line})
                reply = []
                for text in ctx.chat(msgs, a.n_predict, template=a.chat_template, temp=a.temp):
                    print(text, end="", flush=True)
                    reply.append(text)
                print()
                msgs.append({"role": "assistant", "content": "".join(reply)})
    except tiermoe.TiermoeError as e:
        print(f"chat: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
