#!/usr/bin/env python3
"""POST /moe-hot-cache on a context with a VRAM expert cache, in CI: `tiermoe serve`
linked with the host mock of the CUDA backend (tests/mock: a stream thread runs the
kernels' contracts, the slots are real device-side copies in host memory).

- GET /moe-hot-cache lists each cached layer's slots (the lowest ids at load);
- a plan is applied inside the fixed capacity by the rule docs/server.md states,
  checked against a Python model of that rule: per layer the plan's first `slots`
  experts, residents the plan lists stay in their slots, newcomers take the slots of
  the others in slot order; the answer's added/removed equal the before/after diff;
- a plan made by `tiermoe plan` from the server's own /moe-layer-perf applies too;
- a learn file uploaded with a weighting ({"learn": ..., "weighting": ...}) puts each
  cached layer's most selected experts in its slots by the same rule; a bad weighting or
  learn file (not an object, another shape) is a 400 naming it;
- a bad plan (an expert out of range, another shape, not JSON) is a 400 naming the
  field and leaves the cache as it was;
- requests are served before and after, and the hot lane serves slots (/metrics).
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from oracle_common import TIERMOE, TMP, TOOLS, check, finish  # noqa: E402
from server_harness import Server, error_shape, make_model  # noqa: E402

# TM_SERVE_BINARY: another build's tiermoe (scripts/device.sh checks runs this test on a real GPU)
MOCK = os.environ.get("TM_SERVE_BINARY") or os.path.join(TOOLS, "tiermoe_mockgpu")


def slots(srv):
    status, body = srv.request("GET", "/moe-hot-cache")
    check(status == 200, f"GET /moe-hot-cache: {status} {body}")
    return {L["layer"]: L["experts"] for L in body["layers"]}


def plan_json(layers, n_expert=16, expert_bytes=110592):
    """A plan file (docs/plan-format.md) with these experts per layer."""
    used = sum(len(e) for e in layers) * expert_bytes
    return {"format": "tiermoe-moe-plan", "version": 1,
            "model": {"arch": "qwen3moe", "n_layer": len(layers), "n_expert": n_expert, "n_expert_used": 4},
            "weighting": "flat", "layer_curve": 1.0, "budget_bytes": used, "used_bytes": used,
            "layers": [{"layer": i, "expert_bytes": expert_bytes, "experts": e} for i, e in enumerate(layers)]}


def apply_rule(before, want):
    """The slots after an apply: want's first len(before) experts; residents it lists stay."""
    want = want[:len(before)]
    after = list(before)
    free = [k for k, e in enumerate(before) if e not in want]
    for e in [e for e in want if e not in before]:
        after[free.pop(0)] = e
    return after


def hot_slots(srv):
    status, text = srv.request("GET", "/metrics")
    for line in text.splitlines():
        if line.startswith('tiermoe_tier_slots_total{class="cached",lane="hot"}'):
            return float(line.split()[-1])
    return 0.0


def main():
    if not os.path.exists(MOCK):
        print(f"{MOCK} not built: skipping")
        return 77
    model, _ = make_model("cache.gguf")
    # every layer on the (mock) GPU but the experts, a 1 MiB cache (3 slots a layer); the output
    # head on the CPU keeps the mock fast; no updates, so only the applies change the slots
    srv = Server(model, "-ngl", "all", "--cpu-moe", "--moe-cache", "1", "--moe-cache-update", "off",
                 "-ot", r"output\.weight=CPU", "-c", "256", binary=MOCK)
    try:
        s0 = slots(srv)
        check(s0 == {0: [0, 1, 2], 1: [0, 1, 2], 2: [0, 1, 2]}, f"slots at load: {s0}")
        r = srv.request("POST", "/v1/completions", {"prompt": "Hello world", "max_tokens": 4, "temperature": 0})
        check(r[0] == 200, f"completion with a cache: {r}")
        hot0 = hot_slots(srv)
        check(hot0 > 0, "the hot lane served no slot")

        # a hand-made plan: layer 0 keeps expert 1, layer 1 lists more experts than slots, layer 2 none
        want = [[5, 1, 7], [15, 14, 13, 12], []]
        status, body = srv.request("POST", "/moe-hot-cache", plan_json(want))
        s1 = slots(srv)
        expect = {l: apply_rule(s0[l], want[l]) if want[l] else s0[l] for l in s0}
        check(status == 200 and body.get("applied") and s1 == expect, f"apply: {status} {body}\n {s1} != {expect}")
        for L in body.get("layers", []):
            l = L["layer"]
            check(sorted(L["added"]) == sorted(set(s1[l]) - set(s0[l])) and
                  sorted(L["removed"]) == sorted(set(s0[l]) - set(s1[l])),
                  f"layer {l}: added {L['added']} removed {L['removed']}, slots {s0[l]} -> {s1[l]}")
        check(body.get("changed") == sum(len(L["added"]) for L in body.get("layers", [])), f"changed {body}")
        print(f"  a plan applied: {s0} -> {s1}; the answer names what changed")

        # bad plans: 400 naming the field, the cache unchanged
        for bad, words in ((plan_json([[99], [], []]), ["layers[0].experts[0]", "99"]),
                           ({**plan_json([[1], [], []]), "model": {"arch": "qwen3moe", "n_layer": 2, "n_expert": 16,
                                                                    "n_expert_used": 4}}, ["n_layer"]),
                           ({"format": "tiermoe-moe-plan"}, ["version"])):
            status, body = srv.request("POST", "/moe-hot-cache", bad)
            msg = body["error"]["message"] if error_shape(body) else ""
            check(status == 400 and all(w in msg for w in words), f"bad plan: {status} {body}, want {words}")
        status, body = srv.request("POST", "/moe-hot-cache", raw=b"{not json")
        check(status == 400 and error_shape(body), f"not JSON: {status}")
        check(slots(srv) == s1, "a refused plan changed the cache")
        print("  bad plans: 400 naming the field; the cache kept serving as it was")

        # a plan of `tiermoe plan` from the server's own counters
        r = srv.request("POST", "/v1/completions", {"prompt": "The cache follows the counters", "max_tokens": 4,
                                                    "temperature": 0})
        check(r[0] == 200 and hot_slots(srv) > hot0, "no request served after the apply")
        status, perf = srv.request("GET", "/moe-layer-perf")
        # every routed slot counted once, hot (a cache slot held it) or cold, per expert too
        for L in perf["layers"]:
            check(L["hot_slots_total"] + L["cold_slots_total"] == L["expert_hits_total"] and
                  L["hot_slots_total"] == sum(L["hot_experts"]) and
                  L["cold_slots_total"] == sum(L["cold_experts"]) and
                  all(h + c == e for h, c, e in zip(L["hot_experts"], L["cold_experts"], L["experts"])),
                  f"layer {L['layer']}: hot/cold counts do not add up: {L}")
        check(sum(L["hot_slots_total"] for L in perf["layers"]) > 0, "no hot slot counted")
        learn, plan = os.path.join(TMP, "learn.json"), os.path.join(TMP, "plan.json")
        with open(learn, "w") as f:
            json.dump(perf, f)
        p = subprocess.run([TIERMOE, "plan", learn, "--budget", "1", "-m", model, "-o", plan], capture_output=True,
                           text=True)
        check(p.returncode == 0, f"tiermoe plan: {p.stderr}")
        with open(plan) as f:
            pj = json.load(f)
        status, body = srv.request("POST", "/moe-hot-cache", pj)
        s2 = slots(srv)
        for L in pj["layers"]:
            l = L["layer"]
            top = L["experts"][:len(s2[l])]
            check(set(top) <= set(s2[l]) and s2[l] == apply_rule(s1[l], L["experts"]) if top else s2[l] == s1[l],
                  f"layer {l}: planned {L['experts']}, slots {s1[l]} -> {s2[l]}")
        check(status == 200, f"tiermoe plan's plan: {status} {body}")
        print(f"  tiermoe plan from the served counters applied: {s2}")

        # an uploaded learn file with a weighting: per cached layer its `slots` most selected
        # experts (ties: the lower id), the residents among them kept in their slots
        learn_up = {"learn": json.loads(json.dumps(perf)), "weighting": "pressure"}
        for L in learn_up["learn"]["layers"]:  # another ranking than the cache holds now, all cold
            want = [(e * 7 + L["layer"]) % 5 for e in range(len(L["experts"]))]
            check(sum(want) <= L["expert_hits_total"], f"layer {L['layer']}: too few counts to rerank")
            want[want.index(max(want))] += L["expert_hits_total"] - sum(want)  # counts keep their sum
            L["experts"] = want
            L["cold_experts"], L["hot_experts"] = list(L["experts"]), [0] * len(L["experts"])
            L["cold_slots_total"] = L["expert_hits_total"]
            L["hot_slots_total"] = 0
        status, body = srv.request("POST", "/moe-hot-cache", learn_up)
        check(status == 200 and body.get("applied"), f"learn upload: {status} {body}")
        s3 = slots(srv)
        for L in learn_up["learn"]["layers"]:
            l = L["layer"]
            if l not in s2:
                continue
            top = sorted(range(len(L["experts"])), key=lambda e: (-L["experts"][e], e))[:len(s2[l])]
            check(s3[l] == apply_rule(s2[l], top), f"layer {l}: learn upload {top}: slots {s2[l]} -> {s3[l]}")
        check(s3 != s2, "the learn upload changed nothing")
        for bad, words in (({"learn": perf, "weighting": "sharpest"}, ["weighting", "balanced"]),
                           ({"learn": [1, 2]}, ["learn", "object"]),
                           ({"learn": dict(perf, layers=perf["layers"][:1])}, ["learn", "layers"]),
                           ({"learn": dict(perf, model=dict(perf["model"], n_expert=8))}, ["learn", "n_expert"])):
            status, body = srv.request("POST", "/moe-hot-cache", bad)
            msg = body.get("error", {}).get("message", "") if isinstance(body, dict) else ""
            check(status == 400 and all(w in msg for w in words), f"bad learn upload: {status} {body}, want {words}")
        check(slots(srv) == s3, "a refused learn upload changed the cache")
        print(f"  learn upload with a weighting applied: {s3}; bad uploads: 400 naming the field")
        r = srv.request("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                         "max_tokens": 3, "stream": False})
        check(r[0] == 200, f"chat after the applies: {r}")
    finally:
        rc = srv.stop()
    check(rc == 0, f"exit {rc}\n{srv.log()[-2000:]}")
    check("ERROR: AddressSanitizer" not in srv.log() and "runtime error" not in srv.log(),
          f"sanitizer report:\n{srv.log()[-3000:]}")
    return finish("POST /moe-hot-cache applies plans inside the VRAM cache (%s)" %
                  ("real GPU" if os.environ.get("TM_SERVE_BINARY") else "mock GPU"))


if __name__ == "__main__":
    sys.exit(main())
