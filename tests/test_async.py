"""Asynchronous disaggregated engine (issue 4) with the real Qwen2.5-Coder pair (1.5B target,
0.5B draft, bf16) on real MT-Bench and HumanEval prompts, draft on core 0 and target on core 1:

* parallel tree generation outputs exactly the target-only greedy tokens, with the target on
  1 and on 2 tensor-parallel ranks (the TP-2 reference is target-only decoding with the same
  TP-2 target: TP changes the reduction order, see tensor_parallel.h);
* the same request gives the same tokens 10 times in a row (timing never changes the output);
* limits and cancellation through the Python API (max tokens, EOS, stop strings, on_text
  returning False) end the request where target-only decoding would, and leave the engine ready;
* the per-round timeline covers every verification and exports as Chrome trace JSON.

The full prompt sets are tools/check_lossless.py --mode async; leaks and ThreadSanitizer are
tests/test_async_runtime.py and tools/run_tsan.sh.
"""

import json

import pytest

from swiftspec import Engine, InvalidRequestError
from swiftspec.datasets import prompt_messages

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"
DTYPE = "bfloat16"
NEW_TOKENS = 16
TREE = dict(tree_budget=16, max_depth=6, branching=2)
PLACEMENT_TP1 = {"draft": {"tp": 1, "cores": [0]}, "target": {"tp": 1, "cores": [1]}}
PLACEMENT_TP2 = {"draft": {"tp": 1, "cores": [0]}, "target": {"tp": 2, "cores": [[1], [1]]}}


def _engine(checkpoint_dir, placement):
    return Engine(
        checkpoint_dir(TARGET, DTYPE), checkpoint_dir(DRAFT, DTYPE), placement=placement, max_context=1024, max_tree=64
    )


@pytest.fixture(scope="module")
def engine_tp1(checkpoint_dir):
    return _engine(checkpoint_dir, PLACEMENT_TP1)


@pytest.fixture(scope="module")
def messages(mtbench, humaneval):
    # Real prompts, the shorter ones of each set (CPU prefill time dominates short requests).
    return {
        "mtbench0": prompt_messages("mtbench", mtbench[0]),
        "mtbench76": prompt_messages("mtbench", mtbench[76]),
        "humaneval23": prompt_messages("humaneval", humaneval[23]),
        "humaneval45": prompt_messages("humaneval", humaneval[45]),
    }


@pytest.fixture(scope="module")
def reference_tp1(checkpoint_dir, messages):
    """Target-only greedy results (GenerationResult) of every prompt, from a plain target-only
    engine on all cores: the CPU kernels give every output the same arithmetic whatever the thread
    count (batch-invariant, one thread per output), so this is what the 1-core target of
    `engine_tp1` would produce, in half the time (test_reference_is_thread_count_independent)."""
    plain = Engine(checkpoint_dir(TARGET, DTYPE), max_context=1024)
    return {k: plain.generate(m, max_new_tokens=NEW_TOKENS, mode="target") for k, m in messages.items()}


def test_reference_is_thread_count_independent(engine_tp1, messages, reference_tp1):
    """The placed 1-core target decodes exactly what the all-core reference engine decoded."""
    out = engine_tp1.generate(messages["mtbench76"], max_new_tokens=6, mode="target")
    assert out.token_ids == reference_tp1["mtbench76"].token_ids[:6]


def _first_difference(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


@pytest.mark.parametrize("key", ["mtbench0", "humaneval23", "humaneval45"])
def test_async_equals_target_only_tp1(engine_tp1, messages, reference_tp1, key):
    out = engine_tp1.generate(messages[key], max_new_tokens=NEW_TOKENS, mode="async", **TREE)
    ref = reference_tp1[key].token_ids
    assert out.token_ids == ref, f"first difference at new token {_first_difference(out.token_ids, ref)}"
    st = out.stats
    assert st["verification_steps"] < len(ref) and st["acceptance_length"] > 1.0
    assert st["draft_steps"] >= 1 and st["target_time"] > 0 and st["draft_time"] > 0
    s = out.timeline.summary()
    assert s["rounds"] == st["verification_steps"]
    assert 0 < s["target_verify"] <= s["decode_span"] + 1e-9
    print(
        f"{key}: acceptance {st['acceptance_length']:.2f}, {st['verification_steps']} rounds, "
        f"target busy {s['target_utilization']:.0%} of the decode span"
    )


def test_async_equals_target_only_tp2_target(checkpoint_dir, messages):
    engine = _engine(checkpoint_dir, PLACEMENT_TP2)
    assert engine.placement["target"]["tp"] == 2
    for key in ("mtbench76",):
        ref = engine.generate(messages[key], max_new_tokens=12, mode="target").token_ids
        out = engine.generate(messages[key], max_new_tokens=12, mode="async", **TREE)
        assert out.token_ids == ref, f"{key}: first difference at {_first_difference(out.token_ids, ref)}"
        assert out.stats["verification_steps"] < len(ref)


def test_async_same_tokens_ten_times(engine_tp1, messages, reference_tp1):
    ref = reference_tp1["mtbench76"].token_ids[:8]
    runs = [engine_tp1.generate(messages["mtbench76"], max_new_tokens=8, mode="async", **TREE) for _ in range(10)]
    assert all(r.token_ids == ref for r in runs)
    # The trees differed with timing (or not): the output did not.
    print("verification steps per run:", [r.stats["verification_steps"] for r in runs])


def test_async_limits_and_cancellation(engine_tp1, messages, reference_tp1):
    key = "mtbench0"
    full = reference_tp1[key]
    ref = full.token_ids
    out = engine_tp1.generate(messages[key], max_new_tokens=5, mode="async", **TREE)
    assert out.token_ids == ref[:5] and out.finish_reason == "length"
    # Cancel from on_text after the first piece of text: the tokens are a prefix of the reference.
    pieces = []

    def on_text(delta):
        pieces.append(delta)
        return len(pieces) < 2

    out = engine_tp1.generate(messages[key], max_new_tokens=NEW_TOKENS, mode="async", on_text=on_text, **TREE)
    assert out.finish_reason == "cancelled"
    assert 1 <= len(out.token_ids) < NEW_TOKENS and out.token_ids == ref[: len(out.token_ids)]
    # A stop string cuts the text before its first occurrence, as target-only decoding would.
    stop = full.text[len(full.text) // 2 :][:4]
    b = engine_tp1.generate(messages[key], max_new_tokens=NEW_TOKENS, mode="async", stop=stop, **TREE)
    assert b.text == full.text[: full.text.index(stop)] and b.finish_reason == "stop"
    # EOS: a prompt whose answer is one word ends with the end-of-turn token, as target-only.
    short = [{"role": "user", "content": "Answer with one word: what colour is the sky on a clear day?"}]
    t = engine_tp1.generate(short, max_new_tokens=32, mode="target")
    s = engine_tp1.generate(short, max_new_tokens=32, mode="async", **TREE)
    assert t.finish_reason == "stop" and len(t.token_ids) < 32
    assert s.token_ids == t.token_ids and s.finish_reason == "stop"
    # The engine is ready for the next request.
    again = engine_tp1.generate(messages[key], max_new_tokens=8, mode="async", **TREE)
    assert again.token_ids == ref[:8]


def test_async_stream_closed_early(engine_tp1, messages, reference_tp1):
    it = engine_tp1.stream(messages["humaneval23"], max_new_tokens=NEW_TOKENS, mode="async", **TREE)
    first = next(it)
    assert first
    it.close()  # cancels the request; the worker groups stop and the engine stays usable
    out = engine_tp1.generate(messages["humaneval23"], max_new_tokens=8, mode="async", **TREE)
    assert out.token_ids == reference_tp1["humaneval23"].token_ids[:8]


def test_async_timeline_chrome_trace(engine_tp1, messages, tmp_path):
    out = engine_tp1.generate(messages["humaneval45"], max_new_tokens=12, mode="async", **TREE)
    path = tmp_path / "trace.json"
    out.timeline.save_chrome_trace(str(path))
    trace = json.loads(path.read_text())
    events = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    names = {(e["cat"], e["name"]) for e in events}
    assert {
        ("target", "prefill"),
        ("target", "verify"),
        ("draft", "prefill"),
        ("draft", "grow"),
        ("draft", "select_send"),
        ("draft", "reroot"),
    } <= names
    verifies = [e for e in events if e["name"] == "verify"]
    assert len(verifies) == out.stats["verification_steps"]
    assert all(e["dur"] >= 0 and "nodes" in e["args"] and "accepted" in e["args"] for e in verifies)
    # Every verified round's accepted count matches the tokens emitted: sum(accepted + 1) + first token.
    assert sum(e["args"]["accepted"] + 1 for e in verifies) + 1 >= len(out.token_ids)
    threads = {e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    assert {"target", "draft", "host"} <= threads
    assert trace["otherData"]["rounds"] == len(verifies)


def test_async_report_has_the_serial_keys_and_matches_its_timeline(engine_tp1, messages):
    """The low-level async call reports what serial speculation reports, with the same keys: per
    verification the subtree's nodes and the tokens accepted (equal to the timeline's verify events),
    the draft's forward-pass rows, the expansion threshold in effect (before: the async report lacked
    verified_per_step, draft_batch_rows, min_expand_prob and rejection_sampling_nodes)."""
    from swiftspec import swiftspec_core as core

    ids = engine_tp1.encode_prompt(messages["humaneval45"])
    out = core.generate_async(engine_tp1._engine, ids, max_new_tokens=12, min_expand_prob=0.125, **TREE)
    serial = core.spec.generate_serial(engine_tp1._target, engine_tp1._draft, ids, max_new_tokens=4, **TREE)
    rep, st = out["report"], out["stats"]
    assert set(rep) == set(serial["report"])
    assert rep["growth"] == "top_k" and rep["verification"] == "greedy"
    assert rep["min_expand_prob"] == 0.125 and rep["rejection_sampling_nodes"] == 0
    verifies = [e for e in out["timeline"].events() if e["name"] == "verify"]
    assert rep["verified_per_step"] == [e["args"]["nodes"] for e in verifies]
    assert rep["accepted_per_step"] == [e["args"]["accepted"] for e in verifies]
    assert len(verifies) == st["verification_steps"] >= 1
    assert sum(rep["verified_per_step"]) == rep["verified_nodes"]
    assert all(0 <= a <= v for a, v in zip(rep["accepted_per_step"], rep["verified_per_step"]))
    assert len(rep["draft_batch_rows"]) >= st["draft_steps"] >= 1
    assert sum(rep["draft_batch_rows"]) >= rep["drafted_nodes"] >= 1
    # The Python binding's default threshold is 0 (grow until the budget), reported as such.
    assert core.generate_async(engine_tp1._engine, ids, max_new_tokens=2, **TREE)["report"]["min_expand_prob"] == 0.0


def test_async_bad_requests(engine_tp1, messages):
    with pytest.raises(InvalidRequestError, match="min_send_nodes must be >= 1"):
        engine_tp1.generate(messages["mtbench0"], max_new_tokens=4, mode="async", async_options={"min_send_nodes": 0})
    with pytest.raises(InvalidRequestError, match="growth_depth must be >= 0"):
        engine_tp1.generate(messages["mtbench0"], max_new_tokens=4, mode="async", async_options={"growth_depth": -1})
    with pytest.raises(InvalidRequestError, match="tree_budget 64 needs 65 tree slots"):
        engine_tp1.generate(messages["mtbench0"], max_new_tokens=4, mode="async", tree_budget=64)
    out = engine_tp1.generate(messages["mtbench0"], max_new_tokens=4, mode="async")
    assert len(out.token_ids) == 4
