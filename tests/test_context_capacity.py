"""The context a model gets (issue 27, "Context capacity" and "Bad input"): by default what it was
trained for (max_position_embeddings: 32768 for the reference pair), bounded by the memory free
for both models; an explicit context that does not fit is refused before loading with the numbers;
a prompt longer than the context names both lengths; loading the CPU KV cache for 32768 tokens
costs no more memory than for 1024 until a request writes it.

Low memory is simulated with the runtime's test hook SWIFTSPEC_TEST_FREE_BYTES (memory_plan.h),
which replaces the free byte count the plan measures (MemAvailable on the CPU)."""

import math
import os
import re
import subprocess
import sys

import pytest

import swiftspec
from swiftspec import InvalidRequestError
from swiftspec import swiftspec_core as core

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"
SMALL = "smollm2-135m-instruct"
HOOK = "SWIFTSPEC_TEST_FREE_BYTES"
GIB = 2**30
SHARE = 0.9  # memory_plan.h kDefaultContextMemoryShare: the part of the free memory a default plans for


def gib(n: int) -> str:
    """A byte count of at least 1 MiB as the runtime's messages show it (format_bytes, memory_plan.h)."""
    assert n >= 2**20
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 2**20:.0f} MiB"


@pytest.fixture(scope="module")
def pair(checkpoint_dir):
    """(target folder, draft folder, their MemoryNeed on the cpu backend with the Engine's options)."""
    t, d = checkpoint_dir(TARGET, "bfloat16"), checkpoint_dir(DRAFT, "bfloat16")
    options = core.ModelOptions()  # the Engine's defaults: max_tree 256, all cores
    return t, d, core.memory_need(str(t), "cpu", options), core.memory_need(str(d), "cpu", options)


def pair_bytes(pair, context: int) -> int:
    return pair[2].bytes(context) + pair[3].bytes(context)


def test_the_reference_models_get_the_context_they_were_trained_for(pair):
    """Before: 4096 tokens, although both were trained for 32768."""
    t, d = pair[0], pair[1]
    assert core.Checkpoint.open(str(t)).config["max_position_embeddings"] == 32768
    assert pair_bytes(pair, 32768) < SHARE * core.free_memory()["bytes"]  # (a CI machine has 24 GB)
    with swiftspec.Engine(t, d) as engine:
        assert engine.target_model.max_context == 32768 and engine.draft_model.max_context == 32768
        assert engine.context_length("serial") == engine.context_length("target") == 32768
        assert engine.context_note == ""
        assert len(engine.generate("def fib(n):", max_new_tokens=4, mode="serial").token_ids) == 4
    # what the CPU KV cache of the pair holds per token: fp32 K and V of every layer
    assert pair[2].kv_bytes_per_token == 2 * 28 * 2 * 128 * 4  # 1.5B: 28 layers, 2 KV heads of 128
    assert pair[3].kv_bytes_per_token == 2 * 24 * 2 * 64 * 4  # 0.5B: 24 layers, 2 KV heads of 64
    assert pair[2].kv_bytes(32768) == 32768 * 57344 + 256 * 57344  # + the 256 tree slots


def test_a_default_context_is_capped_to_what_the_free_memory_holds(pair, monkeypatch):
    """Both models' weights, KV caches and workspaces at 16384 tokens (and not at 32768) fit in
    the free memory the hook reports: both get 16384, and the note says why."""
    t, d = pair[0], pair[1]
    free = math.ceil(pair_bytes(pair, 16384) / SHARE) + 1
    assert pair_bytes(pair, 17408) > SHARE * free  # the next round value does not fit
    monkeypatch.setenv(HOOK, str(free))
    with swiftspec.Engine(t, d) as engine:
        assert engine.target_model.max_context == 16384 and engine.draft_model.max_context == 16384
        assert engine.context_note == (
            f"context 16384 tokens for {t.name} and {d.name}, not the 32768 they were trained for: that needs "
            f"{gib(pair_bytes(pair, 32768))} with their weights and workspaces, {gib(free)} free in RAM "
            f"({HOOK}, a test hook), of which a default context plans for 90%; give max_context to choose another"
        )
    # the target alone, at its own default, fits in the same memory at full length... (one model's plan)
    assert pair[2].bytes(32768) < SHARE * free
    with swiftspec.Engine(t) as alone:
        assert alone.target_model.max_context == 32768 and alone.context_note == ""


def test_the_cli_says_which_context_it_chose_and_why(pair):
    """The note goes to stderr as one line; the answer still comes."""
    t, d = pair[0], pair[1]
    free = math.ceil(pair_bytes(pair, 8192) / SHARE) + 1
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "swiftspec.cli",
            "generate",
            "--target",
            str(t),
            "--draft",
            str(d),
            "--max-new-tokens",
            "4",
            "--raw",
            "def add(a, b):",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, HOOK: str(free)},
    )
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
    notes = [line for line in proc.stderr.splitlines() if line.startswith("[swiftspec] context ")]
    assert len(notes) == 1 and notes[0].startswith(
        f"[swiftspec] context 8192 tokens for {t.name} and {d.name}, not the 32768 they were trained for"
    )


def test_an_explicit_context_that_does_not_fit_is_refused_with_the_numbers(pair, monkeypatch):
    """Refused before either model loads, with the KV bytes of each model, everything together,
    the free bytes and the largest context that fits; loading again afterwards works."""
    t, d, need_t, need_d = pair
    free = pair_bytes(pair, 8192)  # exactly what 8192 tokens need
    monkeypatch.setenv(HOOK, str(free))
    with pytest.raises(InvalidRequestError) as info:
        swiftspec.Engine(t, d, max_context=32768)
    assert str(info.value) == (
        f"max_context 32768 needs {gib(need_t.kv_bytes(32768))} of KV cache for {t.name} and "
        f"{gib(need_d.kv_bytes(32768))} for {d.name} ({gib(pair_bytes(pair, 32768))} with their weights and "
        f"workspaces), {gib(free)} free in RAM ({HOOK}, a test hook); at most 8192 fits"
    )
    # the C++ loader of one model refuses the same way (its own need only)
    options = core.ModelOptions()
    options.max_context = 32768
    monkeypatch.setenv(HOOK, str(need_t.bytes(20000)))
    with pytest.raises(
        InvalidRequestError,
        match=re.escape(
            f"max_context 32768 needs {gib(need_t.kv_bytes(32768))} of KV cache for {t.name} "
            f"({gib(need_t.bytes(32768))} with its weights and workspaces), {gib(need_t.bytes(20000))} free in RAM "
            f"({HOOK}, a test hook); at most 19456 fits"
        ),
    ):
        core.load_model(str(t), "cpu", options)
    # nothing was left half-allocated: the largest context said to fit loads and runs
    monkeypatch.setenv(HOOK, str(free))
    with swiftspec.Engine(t, d, max_context=8192) as engine:
        assert engine.target_model.max_context == 8192 and engine.draft_model.max_context == 8192
        assert len(engine.generate("def fib(n):", max_new_tokens=4, mode="serial").token_ids) == 4
    monkeypatch.delenv(HOOK)
    with swiftspec.Engine(t, d, max_context=32768) as engine:  # and with the real free memory, 32768 fits
        assert engine.target_model.max_context == 32768


def test_weights_that_do_not_fit_at_all_are_refused(pair, monkeypatch):
    t, d, need_t, _ = pair
    monkeypatch.setenv(HOOK, str(need_t.weight_bytes // 2))
    with pytest.raises(
        InvalidRequestError,
        match=re.escape("max_context 1024 needs") + ".*; not even 1 token fits: the weights and workspaces alone need ",
    ):
        swiftspec.Engine(t, max_context=1024)
    with pytest.raises(
        InvalidRequestError,
        match=re.escape(f"not enough memory for {t.name} and {d.name}: with a context of 256 tokens they need "),
    ):
        swiftspec.Engine(t, d)


def test_the_test_hook_takes_byte_counts_only(checkpoint_dir, monkeypatch):
    monkeypatch.setenv(HOOK, "12GB")
    with pytest.raises(
        InvalidRequestError,
        match=re.escape(f"{HOOK} (a test hook: the free memory to assume) must be a byte count, got '12GB'"),
    ):
        core.load_model(str(checkpoint_dir(SMALL, "bfloat16")))


@pytest.fixture(scope="module")
def small_engine(checkpoint_dir):
    with swiftspec.Engine(checkpoint_dir(SMALL, "bfloat16"), max_context=256) as engine:
        yield engine


@pytest.mark.parametrize(
    "prompt_len,max_new,message",
    [
        (
            300,
            4,
            "the prompt of 300 tokens is longer than the context of 256 tokens (max_context): shorten it, or load "
            "the models with a larger max_context",
        ),
        (
            256,
            1,
            "the prompt of 256 tokens fills the context of 256 tokens (max_context), leaving no room for new "
            "tokens: shorten it, or load the models with a larger max_context",
        ),
        (
            200,
            100,
            "the prompt of 200 tokens plus max_new_tokens 100 exceeds the context of 256 tokens (max_context): "
            "lower max_new_tokens to at most 56, or shorten the prompt",
        ),
    ],
)
def test_a_prompt_longer_than_the_context_names_both_lengths(small_engine, prompt_len, max_new, message):
    with pytest.raises(InvalidRequestError, match="^" + re.escape(message) + "$"):
        small_engine.generate([5] * prompt_len, max_new_tokens=max_new)
    assert len(small_engine.generate([5] * 200, max_new_tokens=56).token_ids) == 56  # exactly full: runs


def test_the_cli_names_both_lengths_of_a_prompt_too_long(checkpoint_dir):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "swiftspec.cli",
            "generate",
            "--target",
            str(checkpoint_dir(SMALL, "bfloat16")),
            "--max-context",
            "64",
            "--max-new-tokens",
            "8",
            "--raw",
            "word " * 100,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert re.search(
        r"error: the prompt of \d+ tokens is longer than the context of 64 tokens \(max_context\)", proc.stderr
    ), proc.stderr


# The child's peak resident size is VmHWM of /proc/self/status: getrusage's ru_maxrss survives
# exec on Linux, so a child forked from this (large) test process would report the parent's.
LOAD_AND_REPORT = """
import re, sys, time
import swiftspec
t0 = time.perf_counter()
engine = swiftspec.Engine(sys.argv[1], sys.argv[2], max_context=int(sys.argv[3]) or None)
with open("/proc/self/status") as f:
    peak_kib = int(re.search(r"VmHWM:\\s*(\\d+) kB", f.read()).group(1))
print(engine.target_model.max_context, time.perf_counter() - t0, peak_kib * 1024)
"""


def test_a_long_default_context_costs_no_memory_at_load(pair):
    """CI loads the real pair many times on a 24 GB machine: the CPU KV cache of 32768 tokens
    (2.5 GiB for the pair) must not be written at load. The peak resident size of a process that
    loads the pair at the default context stays within 64 MiB of one at 1024 tokens (before, a
    zero-filled vector made all of it resident, at 4096 tokens already 320 MiB)."""
    t, d = pair[0], pair[1]
    peaks = {}
    for context in (1024, 0):
        out = subprocess.run(
            [sys.executable, "-c", LOAD_AND_REPORT, str(t), str(d), str(context)],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        ).stdout.split()
        peaks[int(out[0])] = int(out[2])
    assert set(peaks) == {1024, 32768}
    assert peaks[32768] - peaks[1024] < 64 * 2**20, peaks
    assert peaks[32768] < pair[2].kv_bytes(32768) + pair[3].kv_bytes(32768)


def test_cpp_context_bands():
    """cpp/tests/test_context_bands.cpp: the CUDA step tuner's context bands (cuda/src/context_bands.h):
    the band of a committed length, the boundaries, and the synthetic step's length per band."""
    from swiftspec.paths import binary

    proc = subprocess.run(
        [str(binary("swiftspec-cpp-tests")), "context_band"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert proc.stdout.count("[  OK  ]") == 2 and "2 tests, 0 failed" in proc.stdout
