"""The runtime under the asynchronous engine (issue 4): its C++ unit tests (channels,
communicator, worker groups, tensor-parallel plan, timeline, placement, send policy; the TP CPU model against
the plain CPU model with the real 0.5B model), pre-sharded checkpoints against load-time
sharding, placement errors, and no leak or hang over many short generations in a row (300 in CI, 1000 recorded) mixing
max-tokens, EOS and cancellation (resident memory and thread count flat).

ThreadSanitizer runs of the same C++ tests: tools/run_tsan.sh.
"""

import json
import os
import subprocess

import numpy as np
import pytest

from swiftspec import Engine, InvalidRequestError
from swiftspec import swiftspec_core as core
from swiftspec.convert.tp_shard import plan, shard_checkpoint
from swiftspec.paths import binary

DRAFT = "qwen2.5-coder-0.5b-instruct"
TARGET = "qwen2.5-coder-1.5b-instruct"
SMALL = "smollm2-135m-instruct"


def _run_cpp_tests(filters, env_extra=None, timeout=900):
    env = dict(os.environ, **(env_extra or {}))
    proc = subprocess.run(
        [str(binary("swiftspec-cpp-tests")), *filters], capture_output=True, text=True, env=env, timeout=timeout
    )
    print(proc.stdout[-4000:])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 failed" in proc.stdout
    return proc.stdout


def test_cpp_runtime_units():
    out = _run_cpp_tests(
        [
            "async_channel",
            "async_allreduce",
            "async_worker_group",
            "async_tp_plan",
            "async_timeline",
            "async_placement",
            "async_send_policy",
            "forward_batch",
        ]
    )
    assert out.count("[  OK  ]") == 10


def test_cpp_tp_model_against_cpu_model(checkpoint_dir):
    """TP 1 bit-identical to the plain CPU model; TP 2 and 3 close to it, same argmax, layer-0 K/V
    identical, and every tree row identical to decoding its path alone (batch invariance)."""
    _run_cpp_tests(
        ["tp1_model_bit_identical", "tp_model_close_to_tp1"],
        {"SWIFTSPEC_TEST_DRAFT": str(checkpoint_dir(DRAFT, "bfloat16"))},
    )


def test_presharded_checkpoint_equals_load_time_sharding(checkpoint_dir, tmp_path):
    src = checkpoint_dir(DRAFT, "bfloat16")
    config = json.loads((src / "config.json").read_text())
    target_config = json.loads((checkpoint_dir(TARGET, "bfloat16") / "config.json").read_text())
    for tp in range(1, 9):  # the converter's plan is the runtime's, for any degree
        assert plan(config, tp) == json.loads(core.tp_plan(str(src), tp))
        assert plan(target_config, tp) == json.loads(core.tp_plan(str(checkpoint_dir(TARGET, "bfloat16")), tp))
    out = shard_checkpoint(src, tmp_path / "tp2", 2, progress=False)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format_version"] == 2 and manifest["tp_degree"] == 2
    assert manifest["files"] == [
        "model-tp-shared.safetensors",
        "model-tp0-of-2.safetensors",
        "model-tp1-of-2.safetensors",
    ]
    opts = core.ModelOptions()
    opts.max_context, opts.max_tree = 128, 16
    group = json.dumps({"tp": 2, "threads_per_rank": 1})
    a = core.load_group_model(str(out), group, opts)
    b = core.load_group_model(str(src), group, opts)
    ids = [151644, 8948, 198, 2610, 525, 1207, 16948, 11, 3465, 553, 54364, 14817, 13]
    la, lb = a.forward(ids, logits="all"), b.forward(ids, logits="all")
    assert la.shape == (len(ids), config["vocab_size"])
    assert np.array_equal(la.view(np.uint32), lb.view(np.uint32))
    # A sharded folder is loaded at its own degree only.
    with pytest.raises(InvalidRequestError, match="sharded for TP degree 2, not 3"):
        core.load_group_model(str(out), json.dumps({"tp": 3}), opts)


def test_placement_errors_name_the_field(checkpoint_dir):
    ckpt = checkpoint_dir(SMALL, "bfloat16")
    with pytest.raises(InvalidRequestError, match="placement.target: unknown field 'core'"):
        Engine(ckpt, ckpt, placement={"target": {"core": [1]}})
    with pytest.raises(InvalidRequestError, match="core 4096 does not exist"):
        Engine(ckpt, ckpt, placement={"draft": {"cores": [4096]}})
    with pytest.raises(InvalidRequestError, match="placement.target.tp must be >= 1"):
        Engine(ckpt, ckpt, placement='{"target": {"tp": 0}}')
    with pytest.raises(InvalidRequestError, match="neither 'auto', a JSON object, nor an existing .json file"):
        Engine(ckpt, ckpt, placement="nowhere.json")
    # SM partitions (green contexts) are CUDA settings: checked in form everywhere, refused on the cpu backend.
    one_gpu = {"draft": {"sm_partition": [0, 16]}, "target": {"sm_partition": [16, 0]}}
    with pytest.raises(
        InvalidRequestError,
        match=r"placement.target.sm_partition \[16, 0\] applies to the cuda "
        r"backend only",
    ):
        Engine(ckpt, ckpt, placement=one_gpu)
    with pytest.raises(
        InvalidRequestError,
        match=r"draft.sm_partition \[0, 24\] and target.sm_partition \[16, 0\] "
        r"overlap on GPU 0",
    ):
        Engine(ckpt, ckpt, placement={"draft": {"sm_partition": [0, 24]}, "target": {"sm_partition": [16, 0]}})
    with pytest.raises(InvalidRequestError, match="placement.draft.sm_partition must be"):
        Engine(ckpt, ckpt, placement={"draft": {"sm_partition": [0, -8]}})
    with pytest.raises(InvalidRequestError, match="placement.draft.devices applies to the cuda backend only"):
        Engine(ckpt, ckpt, placement={"draft": {"devices": [0]}})
    with pytest.raises(InvalidRequestError, match="placement.target.stream_priority applies to the cuda backend"):
        Engine(ckpt, ckpt, placement={"target": {"stream_priority": -5}})
    # The GEMM engine is a CUDA setting, named per group; its value is checked in form everywhere.
    with pytest.raises(InvalidRequestError, match="placement.draft.gemm_engine applies to the cuda backend only"):
        Engine(ckpt, ckpt, placement={"draft": {"gemm_engine": "mma"}})
    with pytest.raises(InvalidRequestError, match='placement.target.gemm_engine must be "wgmma" or "mma", got "fast"'):
        Engine(ckpt, ckpt, placement={"target": {"gemm_engine": "fast"}})
    opts = core.ModelOptions()
    opts.max_context, opts.max_tree, opts.gemm_engine = 64, 8, "mma"
    with pytest.raises(
        InvalidRequestError, match=r"gemm_engine 'mma' \(ModelOptions.gemm_engine\) applies to the cuda"
    ):
        core.load_model(str(ckpt), "cpu", opts)
    # The decode megakernel is a CUDA setting too: a JSON boolean per group, refused on the cpu backend.
    with pytest.raises(InvalidRequestError, match="placement.draft.megakernel applies to the cuda backend only"):
        Engine(ckpt, ckpt, placement={"draft": {"megakernel": True}})
    with pytest.raises(InvalidRequestError, match="placement.draft.megakernel must be true or false"):
        Engine(ckpt, ckpt, placement={"draft": {"megakernel": "yes"}})
    opts = core.ModelOptions()
    assert opts.megakernel is False
    opts.max_context, opts.max_tree, opts.megakernel = 64, 8, True
    with pytest.raises(InvalidRequestError, match=r"megakernel \(ModelOptions.megakernel\) applies to the cuda"):
        core.load_model(str(ckpt), "cpu", opts)
    # A tensor-parallel target on the cuda backend needs a CUDA build (this suite runs on CPU builds).
    with pytest.raises(InvalidRequestError, match="tensor parallelism needs a build with the CUDA backend"):
        Engine(ckpt, ckpt, backend="cuda", placement={"target": {"tp": 2}})
    from swiftspec.placement import normalize

    assert normalize(one_gpu)["target"]["sm_partition"] == [16, 0]
    assert normalize({"draft": {"gemm_engine": "mma"}})["draft"]["gemm_engine"] == "mma"
    assert "gemm_engine" not in normalize({"draft": {}})["draft"]
    assert normalize({"draft": {"megakernel": True}})["draft"]["megakernel"] is True
    assert "megakernel" not in normalize({"draft": {"megakernel": False}})["draft"]
    with pytest.raises(InvalidRequestError, match="placement.target.megakernel must be true or false"):
        normalize({"target": {"megakernel": 1}})
    opts = core.ModelOptions()
    opts.max_context, opts.max_tree, opts.sm_first, opts.sm_count = 64, 8, 0, 16
    with pytest.raises(
        InvalidRequestError,
        match=r"sm_partition \[0, 16\] \(ModelOptions.sm_first / sm_count\) "
        "applies to the cuda backend only",
    ):
        core.load_model(str(ckpt), "cpu", opts)
    e = Engine(ckpt, ckpt, placement="auto", max_context=256, max_tree=32)
    n = os.cpu_count()
    assert e.placement["draft"]["cores"][0][0] == 0 and e.placement["target"]["tp"] == 1
    if n == 2:
        assert e.placement == {
            "draft": {"cores": [[0]], "threads_per_rank": 0, "tp": 1},
            "target": {"cores": [[1]], "threads_per_rank": 0, "tp": 1},
        }


def _rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def _threads(settle_s=1.0):
    """Threads of this process, once exited threads have left /proc (a joined thread can stay
    listed for a moment after pthread_join returns)."""
    import time

    deadline = time.monotonic() + settle_s
    n = len(os.listdir("/proc/self/task"))
    while n > _threads.baseline and time.monotonic() < deadline:
        time.sleep(0.005)
        n = len(os.listdir("/proc/self/task"))
    return n


_threads.baseline = 1 << 30


# Requests of the soak test. CI runs 300 (about 80 s on a 2-core machine); the issue-4 check of
# 1000 in a row is the same test with SWIFTSPEC_SOAK_REQUESTS=1000 (command and result in
# benchmarks/README.md).
SOAK_REQUESTS = int(os.environ.get("SWIFTSPEC_SOAK_REQUESTS", "300"))


def test_many_short_generations_no_leak(checkpoint_dir):
    """SOAK_REQUESTS (>= 200) async requests in a row (SmolLM2-135M as target and draft),
    cycling through the ways a request ends: max tokens, a stop token, cancellation from the
    callback at the first token, cancellation later, and an exception in the callback. Every
    request's tokens are checked against target-only decoding, and resident memory and the
    process's thread count return to their level after the first 100 (warm-up)."""
    assert SOAK_REQUESTS >= 200, "SWIFTSPEC_SOAK_REQUESTS must be >= 200 (100 warm-up + 100 measured)"
    ckpt = checkpoint_dir(SMALL, "bfloat16")
    engine = Engine(ckpt, ckpt, placement="auto", max_context=256, max_tree=32)
    eng = engine._engine
    prompts = [engine.encode_prompt(q) for q in ("def add(a, b):", "The sky is", "import numpy as", "Hello")]
    refs = [eng.generate(p, max_new_tokens=4, mode="target")["tokens"] for p in prompts]
    kw = dict(tree_budget=6, max_depth=3, branching=2)

    class Boom(Exception):
        pass

    def one(i):
        p, ref = prompts[i % 4], refs[i % 4]
        kind = i % 5
        if kind == 0:  # max tokens
            out = core.generate_async(eng, p, max_new_tokens=4, **kw)
            assert out["tokens"] == ref and out["stats"]["finish_reason"] == "length"
        elif kind == 1:  # a stop token (EOS) in the middle
            out = core.generate_async(eng, p, max_new_tokens=4, stop_token_ids=[ref[2]], **kw)
            assert out["tokens"] == ref[: ref.index(ref[2]) + 1] and out["stats"]["finish_reason"] == "stop"
        elif kind == 2:  # cancelled at the first token
            out = core.generate_async(eng, p, max_new_tokens=4, on_tokens=lambda t: False, **kw)
            assert out["tokens"] == ref[:1] and out["stats"]["finish_reason"] == "cancelled"
        elif kind == 3:  # cancelled after two tokens
            seen = []

            def cb(t):
                seen.extend(t)
                return len(seen) < 2

            out = core.generate_async(eng, p, max_new_tokens=4, on_tokens=cb, **kw)
            assert out["tokens"] == ref[: len(seen)] and len(seen) >= 2
        else:  # the callback raises: the request fails, the engine does not

            def cb(t):
                raise Boom()

            with pytest.raises(Boom):
                core.generate_async(eng, p, max_new_tokens=4, on_tokens=cb, **kw)

    for i in range(100):
        one(i)
    threads0 = _threads.baseline = _threads()
    rss_warm = _rss_kib()
    for i in range(100, SOAK_REQUESTS):
        one(i)
        if i % 50 == 0:
            assert _threads() == threads0, f"request {i} left threads behind"
    assert _threads() == threads0
    rss_end = _rss_kib()
    growth = rss_end - rss_warm
    print(
        f"RSS after warm-up {rss_warm} KiB, after {SOAK_REQUESTS} requests {rss_end} KiB (+{growth} KiB), "
        f"threads {threads0}"
    )
    assert growth < 4096, f"resident memory grew by {growth} KiB over {SOAK_REQUESTS - 100} requests"
