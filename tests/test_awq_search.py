"""AWQ's activation-aware scale search (swiftspec.convert.awq, issue 31) on tiny random models.

The folds keep the float model's function (logits through the module's numpy forward, to fp32
rounding); with outlier input channels the search picks alpha > 0 and beats round-to-nearest on
the calibration tokens; alpha 0 is RTN bit for bit; ``--awq`` is refused where it does not apply.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_checkpoint import tiny_tensors, write_tiny_gguf

from swiftspec import CheckpointError
from swiftspec.convert.awq import (
    awq_scale,
    forward_logits,
    layer_inputs,
    parse_calibration,
    quantized_output_error,
    scale_of,
    search_scale,
)
from swiftspec.convert.int4 import dequantize, quantize_rtn

CONVERT = Path(__file__).resolve().parents[1] / "tools" / "convert_weights.py"

LLAMA = {  # multi-head attention: o_proj's scale folds into v_proj
    "model_type": "llama",
    "vocab_size": 64,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 128,
    "tie_word_embeddings": True,
}
QWEN2 = {  # GQA (o_proj stays RTN), q/k/v biases, untied LM head, Qwen's rope_theta
    **LLAMA,
    "model_type": "qwen2",
    "num_key_value_heads": 2,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "swiftspec": {"rope_style": "neox", "attention_bias": True},
}


def _tensors(cfg: dict) -> dict[str, np.ndarray]:
    t = tiny_tensors(cfg)
    rng = np.random.default_rng(5)
    if cfg["model_type"] == "qwen2":
        hd = cfg["head_dim"]
        for layer in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{layer}.self_attn."
            t[p + "q_proj.bias"] = rng.normal(0, 0.1, cfg["num_attention_heads"] * hd).astype(np.float32)
            for n in "kv":
                t[p + f"{n}_proj.bias"] = rng.normal(0, 0.1, cfg["num_key_value_heads"] * hd).astype(np.float32)
        t["lm_head.weight"] = rng.normal(0, 0.1, (cfg["vocab_size"], cfg["hidden_size"])).astype(np.float32)
    return t


def _sequences(seed: int = 1) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 64, n).tolist() for n in (40, 25, 33)]


@pytest.mark.parametrize("cfg", [LLAMA, QWEN2], ids=["llama-mha", "qwen2-gqa-bias"])
@pytest.mark.parametrize("grid", [(0.5,), None], ids=["alpha-0.5", "searched"])
def test_scaled_model_computes_the_same_logits(cfg, grid):
    """The scaled float model's logits equal the original's to fp32 rounding (max error relative to
    the largest logit < 1e-5), with every group scaled (alpha 0.5) or searched; the scaling is real:
    the norms and projections changed, and o_proj only under multi-head attention."""
    t = _tensors(cfg)
    seqs = _sequences()
    scaled = dict(t)
    kwargs = {} if grid is None else {"grid": grid}
    alphas = awq_scale(scaled, cfg, seqs, 32, **kwargs)
    groups = {"qkv", "down", "gate_up"} | ({"o"} if cfg["num_attention_heads"] == cfg["num_key_value_heads"] else set())
    assert set(alphas) == {f"model.layers.{i}.{g}" for i in range(2) for g in groups}
    if grid is not None:
        assert set(alphas.values()) == {0.5}
        for name in ("input_layernorm.weight", "post_attention_layernorm.weight", "mlp.up_proj.weight"):
            assert not np.array_equal(scaled["model.layers.0." + name], t["model.layers.0." + name])
        o_changed = not np.array_equal(
            scaled["model.layers.1.self_attn.o_proj.weight"], t["model.layers.1.self_attn.o_proj.weight"]
        )
        assert o_changed == (cfg["num_attention_heads"] == cfg["num_key_value_heads"])
    for ids in seqs:
        ref = forward_logits(t, cfg, ids)
        out = forward_logits(scaled, cfg, ids)
        assert np.abs(out - ref).max() / np.abs(ref).max() < 1e-5


def test_layer_inputs_shapes_and_values():
    """layer_inputs yields per layer the four groups' inputs over all tokens, and its layer-0
    q/k/v input is the RMS-normed embedding."""
    t = _tensors(QWEN2)
    seqs = _sequences()
    got = list(layer_inputs(t, QWEN2, seqs))
    assert [layer for layer, _ in got] == [0, 1]
    total = sum(map(len, seqs))
    shapes = {k: v.shape for k, v in got[0][1].items()}
    assert shapes == {"qkv": (total, 64), "o": (total, 64), "gate_up": (total, 64), "down": (total, 128)}
    e = t["model.embed_tokens.weight"][np.array(seqs[0])]
    normed = e / np.sqrt(np.mean(e * e, axis=1, keepdims=True) + 1e-6) * t["model.layers.0.input_layernorm.weight"]
    np.testing.assert_allclose(got[0][1]["qkv"][: len(seqs[0])], normed, rtol=1e-5, atol=1e-6)


def test_search_beats_rtn_with_outlier_channels():
    """Four input channels 30x larger than the rest: the search picks alpha > 0 and its output
    error on the calibration tokens is strictly below RTN's (alpha 0), which it computes as the
    plain RTN error."""
    rng = np.random.default_rng(0)
    w = rng.normal(0, 1, (64, 128)).astype(np.float32)
    x = rng.normal(0, 1, (400, 128)).astype(np.float32)
    x[:, [3, 40, 77, 100]] *= 30
    alpha, s, errors = search_scale([w], x, 32)
    assert alpha > 0
    assert errors[alpha] < 0.5 * errors[0.0]
    rtn = dequantize(*quantize_rtn(w, 32), 32)
    assert errors[0.0] == pytest.approx(float(np.square(x @ (w - rtn).T, dtype=np.float64).sum()), rel=1e-12)
    assert quantized_output_error([w], s, x, 32) == errors[alpha]
    assert s[[3, 40, 77, 100]].min() > np.delete(s, [3, 40, 77, 100]).max()  # the salient channels scaled up


def test_alpha_zero_is_rtn_bit_for_bit():
    """scale_of(.., 0) is all ones; awq_scale with the grid (0,) leaves every tensor bit-identical,
    so quantize_rtn of the result is RTN's, byte for byte."""
    assert np.array_equal(scale_of(np.array([0.0, 1e-3, 5.0], np.float32), 0.0), np.ones(3, np.float32))
    t = _tensors(LLAMA)
    scaled = dict(t)
    alphas = awq_scale(scaled, LLAMA, _sequences(), 32, grid=(0.0,))
    assert set(alphas.values()) == {0.0}
    for name, w in t.items():
        assert scaled[name].dtype == np.float32 and np.array_equal(scaled[name], w), name
    w = t["model.layers.1.mlp.down_proj.weight"]
    for a, b in zip(quantize_rtn(scaled["model.layers.1.mlp.down_proj.weight"], 32), quantize_rtn(w, 32)):
        assert a.tobytes() == b.tobytes()


def test_parse_calibration():
    assert parse_calibration("mtbench:16, humaneval:4") == [("mtbench", 16), ("humaneval", 4)]
    for bad in ("wiki:3", "mtbench", "mtbench:0", "humaneval:x"):
        with pytest.raises(CheckpointError, match="--calibration"):
            parse_calibration(bad)


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(CONVERT), *map(str, args), "--quiet"], capture_output=True, text=True, timeout=120
    )


def test_awq_option_refused_where_it_does_not_apply(tmp_path):
    """--awq with a GGUF file, without --dtype int4, or with an AWQ-quantized HF folder; --calibration
    without --awq: exit 2, one line naming the option, no output folder."""
    write_tiny_gguf(tmp_path / "tiny.gguf")
    proc = _cli(tmp_path / "tiny.gguf", "--out", tmp_path / "a", "--dtype", "int4", "--awq")
    assert proc.returncode == 2 and "error: --awq applies to a float swiftspec or HF folder" in proc.stderr
    proc = _cli(tmp_path / "tiny.gguf", "--out", tmp_path / "b", "--awq")
    assert proc.returncode == 2 and "error: --awq applies to --dtype int4 only" in proc.stderr
    hf = tmp_path / "hf-awq"
    hf.mkdir()
    (hf / "config.json").write_text(
        json.dumps({"model_type": "llama", "quantization_config": {"quant_method": "awq", "bits": 4}})
    )
    proc = _cli(hf, "--out", tmp_path / "c", "--dtype", "int4", "--awq")
    assert proc.returncode == 2 and "error: --awq:" in proc.stderr and "already quantized" in proc.stderr
    proc = _cli(tmp_path / "tiny.gguf", "--out", tmp_path / "d", "--dtype", "int4", "--calibration", "mtbench:2")
    assert proc.returncode == 2 and "error: --calibration mtbench:2 applies to --awq only" in proc.stderr
    assert not any((tmp_path / n).exists() for n in "abcd")


def test_quantize_checkpoint_with_awq_writes_the_scaled_folder(tmp_path, monkeypatch):
    """quantize_checkpoint(..., awq_calibration=...) on a tiny bf16 Qwen2-like folder (calibration
    tokens patched in: the tiny folder has no chat template): the manifest says awq_search with the
    calibration, token count and one alpha per group (no o_proj under GQA); the stored norms are the
    bf16 of the scaled ones awq_scale computes, every projection its RTN; and the CPU backend runs it."""
    from safetensors import safe_open

    import swiftspec.convert.awq as awq
    from swiftspec.convert.dtypes import bfloat16_bits_to_float32, float32_to_bfloat16_bits
    from swiftspec.convert.int4_checkpoint import quantize_checkpoint
    from swiftspec.convert.manifest import make_manifest
    from swiftspec.convert.safetensors_reader import SafetensorsFile
    from swiftspec.convert.writer import CheckpointWriter

    t = _tensors(QWEN2)
    src = tmp_path / "bf16"
    w = CheckpointWriter(src, "bfloat16")
    for name, value in t.items():
        w.add(name, value)
    w.write_weights()
    w.write_json("config.json", QWEN2)
    (src / "tokenizer.json").write_text("{}")
    w.finish(make_manifest("bfloat16", ["model.safetensors"], "hf", "tiny", None))
    seqs = _sequences(3)
    monkeypatch.setattr(awq, "calibration_sequences", lambda folder, spec: seqs)
    out = quantize_checkpoint(src, tmp_path / "awq", 32, progress=False, awq_calibration="mtbench:3")
    quant = json.loads((out / "manifest.json").read_text())["quantization"]
    assert quant["method"] == "awq_search" and quant["group_size"] == 32
    assert quant["awq"]["calibration"] == "mtbench:3" and quant["awq"]["tokens"] == sum(map(len, seqs))
    assert set(quant["awq"]["alphas"]) == {
        f"model.layers.{i}.{g}" for i in range(2) for g in ("qkv", "gate_up", "down")
    }
    bf16 = {n: bfloat16_bits_to_float32(float32_to_bfloat16_bits(v)) for n, v in t.items()}  # what the folder holds
    assert awq.awq_scale(bf16, QWEN2, seqs, 32) == quant["awq"]["alphas"]
    with safe_open(str(out / "model.safetensors"), "np") as f:
        norm = SafetensorsFile(out / "model.safetensors").float32("model.layers.1.post_attention_layernorm.weight")
        scaled = bf16["model.layers.1.post_attention_layernorm.weight"]
        assert np.array_equal(norm, bfloat16_bits_to_float32(float32_to_bfloat16_bits(scaled)))
        q = quantize_rtn(bf16["model.layers.0.mlp.up_proj.weight"], 32)
        assert all(
            np.array_equal(f.get_tensor("model.layers.0.mlp.up_proj." + k), v)
            for k, v in zip(("qweight", "scales", "zeros"), q)
        )
    from swiftspec import swiftspec_core as core

    model = core.load_model(str(out), "cpu", core.ModelOptions())
    logits = np.asarray(model.forward(seqs[0], logits="all"))
    ref = forward_logits(t, QWEN2, seqs[0])
    assert logits.shape == ref.shape and np.isfinite(logits).all()
