"""The VRAM expert cache through the package. Against libtiermoe.so (no GPU): a plan
is checked against the model, then refused for want of a cache (the C status).
Against the library over the host mock of the CUDA backend (TM_PY_MOCKGPU=1,
TIERMOE_LIB: libtiermoe_mockgpu_shared.so; TM_MOCK_CLI: the CLI linked the same
way): the cache holds each layer's first planned experts after apply_plan, as
after loading the plan with the context (moe_cache_plan), and greedy tokens equal
those before the plan and those of `tiermoe run --moe-cache-plan` on the mock."""
import json
import os
import pathlib

import pytest
from conftest import cli

import tiermoe

MOCK = os.environ.get("TM_PY_MOCKGPU") == "1"
PLAN = [[15, 14, 13, 12, 11, 10, 9, 8], [8, 9, 10, 11, 12, 13, 14, 15], [7, 15, 6, 14, 5, 13, 4, 12]]
# every layer on the (mock) GPU, the experts in RAM, 1 MiB of VRAM cache computed alone
CACHED = {"n_gpu_layers": "all", "cpu_moe": True, "moe_cache": 1, "moe_pcie": "off", "moe_fetch": "off",
          "moe_ahead": "off"}
CACHED_FLAGS = ["-ngl", "all", "--cpu-moe", "--moe-cache", "1", "--moe-pcie", "off", "--moe-fetch", "off",
                "--moe-ahead", "off"]
PROMPT = [1, 2, 3, 500, 42]


def expert_bytes(path):
    """Each layer's bytes of one expert (gate + up + down), from the file by the gguf
    package: a plan the context loads (moe_cache_plan) must state them."""
    gguf = pytest.importorskip("gguf")
    out = {}
    for t in gguf.GGUFReader(path).tensors:
        parts = t.name.split(".")
        if parts[0] == "blk" and parts[2] in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
            out[int(parts[1])] = out.get(int(parts[1]), 0) + int(t.n_bytes)
    return out


def plan(model, experts, sizes=None):
    """A plan file's dict (docs/plan-format.md) for model listing experts per layer;
    sizes: each layer's expert bytes x n_expert (1 a layer if None: tm_cache_apply
    does not check them)."""
    i = model.info
    eb = [sizes[l] // i.n_expert if sizes else 1 for l in range(i.n_layer)]
    used = sum(len(e) * eb[l] for l, e in enumerate(experts))
    return {"format": "tiermoe-moe-plan", "version": 1,
            "model": {"arch": i.arch, "n_layer": i.n_layer, "n_expert": i.n_expert,
                      "n_expert_used": i.n_expert_used},
            "weighting": "flat", "layer_curve": 1.0, "budget_bytes": used, "used_bytes": used,
            "layers": [{"layer": l, "expert_bytes": eb[l], "experts": e} for l, e in enumerate(experts)]}


def test_plan_checked_then_refused(plain_model, tmp):
    if MOCK:
        pytest.skip("the mock GPU has a cache")
    with plain_model.context() as ctx:
        assert not ctx.info.cache
        assert [len(e) for e in ctx.cache_experts()] == [0, 0, 0]
        bad = plan(plain_model, [[99], [], []])
        with pytest.raises(tiermoe.TiermoeError) as e:
            ctx.apply_plan(bad)
        assert e.value.status in (tiermoe.Status.FORMAT, tiermoe.Status.ARG)
        assert "layers[0].experts[0]" in e.value.message
        path = os.path.join(tmp, "py-plan.json")
        with open(path, "w") as f:
            json.dump(plan(plain_model, PLAN), f)
        for p in (plan(plain_model, PLAN), json.dumps(plan(plain_model, PLAN)), pathlib.Path(path)):
            with pytest.raises(tiermoe.TiermoeError) as e:
                ctx.apply_plan(p)
            assert e.value.status == tiermoe.Status.UNSUPPORTED and "no VRAM expert cache" in e.value.message


def holds_plan(ctx, experts):
    for l, slots in enumerate(ctx.cache_experts()):
        assert 1 <= len(slots) <= len(experts[l]), (l, slots)
        assert sorted(slots.tolist()) == sorted(experts[l][:len(slots)]), (l, slots)


@pytest.mark.skipif(not MOCK, reason="needs the library over the mock GPU (TM_PY_MOCKGPU=1)")
def test_plan_applied_on_mock_gpu(plain_model, plain_path, tmp):
    path = os.path.join(tmp, "py-plan-mock.json")
    with open(path, "w") as f:
        json.dump(plan(plain_model, PLAN, expert_bytes(plain_path)), f)
    with plain_model.context(n_ctx=128, **CACHED) as ctx:
        assert ctx.info.cache and ctx.info.n_gpu_layers == plain_model.info.n_layer
        before = list(ctx.generate(PROMPT, 8, tokens=True, temp=0))
        assert ctx.apply_plan(plan(plain_model, PLAN)) > 0
        holds_plan(ctx, PLAN)
        assert ctx.apply_plan(pathlib.Path(path)) == 0  # already there
        ctx.rewind(0)
        after = list(ctx.generate(PROMPT, 8, tokens=True, temp=0))
    assert after == before
    with plain_model.context(n_ctx=128, moe_cache_plan=path, **CACHED) as ctx:
        holds_plan(ctx, PLAN)
        loaded = list(ctx.generate(PROMPT, 8, tokens=True, temp=0))
    out, _ = cli("run", "-m", plain_path, "--tokens", ",".join(map(str, PROMPT)), "-n", 8, "--temp", "0",
                 "-c", 128, *CACHED_FLAGS, "--moe-cache-plan", path, exe=os.environ["TM_MOCK_CLI"])
    assert [int(x) for x in out.partition("|")[2].split()] == loaded == before
