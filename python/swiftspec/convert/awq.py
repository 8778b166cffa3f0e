"""AWQ's activation-aware per-channel scale search (Lin et al., "AWQ: Activation-aware Weight
Quantization for LLM Compression and Acceleration", MLSys 2024, sections 3.2-3.3), in numpy float32.

A few input channels of each projection see much larger activations than the rest; the weights
that multiply them matter most. AWQ scales those weight columns up by ``s`` before
round-to-nearest quantization (so they lose less relative precision) and divides the
activations by ``s``, folding ``1/s`` into the operator that produces them, so the float model
computes the same function. Per projection group, ``s = mean|x|^alpha`` per input channel
(normalised by ``sqrt(max(s) * min(s))``), with ``alpha`` picked on the grid 0, 0.05, ..., 1 to
minimise the output error ``||X W^T - X W_hat^T||^2`` over calibration tokens, where
``W_hat = dequantize(quantize_rtn(W * s)) / s``. ``alpha = 0`` is ``s = 1``: plain RTN, so the
chosen scales are never worse than RTN on the calibration tokens.

Groups and where their ``1/s`` goes (per decoder layer):

* q/k/v_proj (input: ``input_layernorm`` output) -> ``input_layernorm.weight``;
* o_proj (input: attention output) -> the rows (and bias) of ``v_proj``, only when
  ``num_attention_heads == num_key_value_heads`` (with GQA one v row feeds several heads, so a
  per-head-channel scale cannot be folded; o_proj stays RTN, as in the paper's implementation);
* gate/up_proj (input: ``post_attention_layernorm`` output) -> ``post_attention_layernorm.weight``;
* down_proj (input: ``act(gate) * up``) -> the rows of ``up_proj``.

Per layer the order is o_proj, q/k/v, gate/up, down_proj: v_proj is searched (with q/k) after
o_proj's ``1/s`` is in its rows, and up_proj (with gate) before down_proj's ``1/s`` goes into its
rows. Scaling rows commutes with RTN's per-row groups (up to the fp16 rounding of the group scales),
so up's quantization is the same either way, but searching gate/up on the unscaled rows weights
up's output errors as they are, not by down's ``1/s``; on the 0.5B it measured better than folding
down's scale first (benchmarks/README.md, 2026-12-07). The calibration inputs of every
layer come from the **float** model (:func:`layer_inputs` on the unscaled weights), not from the
scaled-and-quantized earlier layers: simpler, one forward pass, and the search only needs the
activations' per-channel magnitudes and a sample of tokens, which int4 rounding of earlier layers
barely changes.

Quantization itself stays :func:`.int4.quantize_rtn` on the scaled weights this module returns,
so the storage format and the CPU/CUDA kernels are unchanged. The folds are exact in real
arithmetic; in float32 they hold to rounding (the norms are then stored bfloat16 like the rest).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterator, Mapping, MutableMapping, Sequence

import numpy as np

from ..errors import CheckpointError
from .int4 import dequantize, quantize_rtn

#: The alpha grid of the search (section 3.3: a grid search over [0, 1]).
ALPHA_GRID = tuple(round(0.05 * i, 2) for i in range(21))
#: Calibration tokens used for the output error of each alpha (mean |x| uses them all).
ERROR_TOKENS = 512


def _rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    var = np.mean(np.square(x, dtype=np.float32), axis=-1, keepdims=True)
    return (x / np.sqrt(var + np.float32(eps))) * w


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (np.float32(1.0) + np.exp(-x))


def rope_inv_freq(config: Mapping) -> np.ndarray:
    """float64 [head_dim / 2] inverse frequencies of ``config`` (``rope_theta``; ``rope_scaling``
    None, ``default``, ``linear`` or ``llama3``). Raises :class:`CheckpointError` for another
    rope_scaling type."""
    hd = int(config["head_dim"])
    inv = 1.0 / (float(config.get("rope_theta", 10000.0)) ** (np.arange(0, hd, 2, dtype=np.float64) / hd))
    rs = config.get("rope_scaling")
    kind = (rs or {}).get("rope_type", (rs or {}).get("type", "default"))
    if kind == "default":
        return inv
    assert isinstance(rs, Mapping)
    if kind == "linear":
        return inv / float(rs["factor"])
    if kind == "llama3":
        factor, low, high = float(rs["factor"]), float(rs["low_freq_factor"]), float(rs["high_freq_factor"])
        old = float(rs["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv
        smooth = np.clip((old / wavelen - low) / (high - low), 0.0, 1.0)
        return np.where(wavelen > old / low, inv / factor, (1 - smooth) * inv / factor + smooth * inv)
    raise CheckpointError(f"--awq: rope_scaling type {kind!r} is not supported by the calibration forward")


def _rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """NeoX-style rotation (rotate_half) of x [heads, T, head_dim]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _linear(x: np.ndarray, t: Mapping[str, np.ndarray], prefix: str) -> np.ndarray:
    y = x @ t[prefix + ".weight"].T
    bias = t.get(prefix + ".bias")
    return y + bias if bias is not None else y


def _attention(x: np.ndarray, t: Mapping[str, np.ndarray], p: str, config: Mapping) -> np.ndarray:
    """The attention output before o_proj, float32 [T, heads * head_dim], of one sequence's
    normed hidden states x [T, hidden] (causal, positions 0..T-1)."""
    n, hd = x.shape[0], int(config["head_dim"])
    nh, nkv = int(config["num_attention_heads"]), int(config["num_key_value_heads"])
    q = _linear(x, t, p + "self_attn.q_proj").reshape(n, nh, hd).transpose(1, 0, 2)
    k = _linear(x, t, p + "self_attn.k_proj").reshape(n, nkv, hd).transpose(1, 0, 2)
    v = _linear(x, t, p + "self_attn.v_proj").reshape(n, nkv, hd).transpose(1, 0, 2)
    ang = np.arange(n, dtype=np.float64)[:, None] * rope_inv_freq(config)[None, :]
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    q, k = _rope(q, cos, sin), _rope(k, cos, sin)
    rep = nh // nkv
    k, v = np.repeat(k, rep, axis=0), np.repeat(v, rep, axis=0)
    scores = (q @ k.transpose(0, 2, 1)) / np.float32(math.sqrt(hd))
    scores = np.where(np.tril(np.ones((n, n), dtype=bool))[None], scores, np.float32(-np.inf))
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs = scores / scores.sum(axis=-1, keepdims=True)
    return (probs @ v).transpose(1, 0, 2).reshape(n, nh * hd).astype(np.float32)


def _check_config(config: Mapping) -> None:
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"--awq: hidden_act {act!r} is not supported by the calibration forward (silu only)")
    style = (config.get("swiftspec") or {}).get("rope_style", "neox")
    if style != "neox":
        raise CheckpointError(f"--awq: rope_style {style!r} is not supported by the calibration forward (neox only)")
    if int(config["num_attention_heads"]) % int(config["num_key_value_heads"]):
        raise CheckpointError("--awq: num_attention_heads is not a multiple of num_key_value_heads")


def layer_inputs(
    tensors: Mapping[str, np.ndarray], config: Mapping, sequences: Sequence[Sequence[int]]
) -> Iterator[tuple[int, dict[str, np.ndarray]]]:
    """Run the Llama/Qwen2 decoder ``config`` with float32 weights ``tensors`` (HF names; q/k/v
    biases used when present) over the token id ``sequences`` (each its own causal sequence from
    position 0), one layer at a time, yielding ``(layer, inputs)`` per layer with the inputs of its
    projection groups, float32 [T, features], T the total tokens of all sequences:
    ``"qkv"`` (input_layernorm output, [T, hidden]), ``"o"`` (attention output before o_proj,
    [T, heads * head_dim]), ``"gate_up"`` (post_attention_layernorm output, [T, hidden]) and
    ``"down"`` (``silu(gate) * up``, [T, intermediate]). The layer's residual update is computed
    before the yield, so the consumer may change that layer's tensors in place. Memory: the
    hidden states and one layer's inputs (a few thousand tokens x intermediate_size floats) plus
    one sequence's attention scores.
    """
    _check_config(config)
    eps = float(config["rms_norm_eps"])
    embed = tensors["model.embed_tokens.weight"]
    hidden = [np.asarray(embed[np.asarray(ids, dtype=np.int64)], dtype=np.float32) for ids in sequences]
    for layer in range(int(config["num_hidden_layers"])):
        p = f"model.layers.{layer}."
        got: dict[str, list[np.ndarray]] = {"qkv": [], "o": [], "gate_up": [], "down": []}
        for i, h in enumerate(hidden):
            x = _rms_norm(h, tensors[p + "input_layernorm.weight"], eps)
            a = _attention(x, tensors, p, config)
            h = h + _linear(a, tensors, p + "self_attn.o_proj")
            x2 = _rms_norm(h, tensors[p + "post_attention_layernorm.weight"], eps)
            d = _silu(_linear(x2, tensors, p + "mlp.gate_proj")) * _linear(x2, tensors, p + "mlp.up_proj")
            hidden[i] = h + _linear(d, tensors, p + "mlp.down_proj")
            for key, val in (("qkv", x), ("o", a), ("gate_up", x2), ("down", d)):
                got[key].append(val.astype(np.float32, copy=False))
        yield layer, {k: np.concatenate(v, axis=0) for k, v in got.items()}


def forward_logits(tensors: Mapping[str, np.ndarray], config: Mapping, ids: Sequence[int]) -> np.ndarray:
    """float32 logits [len(ids), vocab] of one sequence through the float decoder (numpy; for tests
    and checks: the same layers as :func:`layer_inputs`, then the final norm and the LM head,
    ``lm_head.weight`` or the tied embedding)."""
    _check_config(config)
    eps = float(config["rms_norm_eps"])
    h = np.asarray(tensors["model.embed_tokens.weight"][np.asarray(ids, dtype=np.int64)], dtype=np.float32)
    for layer in range(int(config["num_hidden_layers"])):
        p = f"model.layers.{layer}."
        x = _rms_norm(h, tensors[p + "input_layernorm.weight"], eps)
        h = h + _linear(_attention(x, tensors, p, config), tensors, p + "self_attn.o_proj")
        x2 = _rms_norm(h, tensors[p + "post_attention_layernorm.weight"], eps)
        d = _silu(_linear(x2, tensors, p + "mlp.gate_proj")) * _linear(x2, tensors, p + "mlp.up_proj")
        h = h + _linear(d, tensors, p + "mlp.down_proj")
    h = _rms_norm(h, tensors["model.norm.weight"], eps)
    head = tensors.get("lm_head.weight", tensors["model.embed_tokens.weight"])
    return (h @ head.T).astype(np.float32)


def scale_of(mean_abs: np.ndarray, alpha: float) -> np.ndarray:
    """float32 [K] per-channel scale ``mean_abs^alpha / sqrt(max * min)`` (zero means clipped to
    1e-8 of the largest first); all ones for ``alpha == 0``."""
    if alpha == 0:
        return np.ones(mean_abs.shape, dtype=np.float32)
    m = np.maximum(mean_abs.astype(np.float64), max(float(mean_abs.max()), 1e-30) * 1e-8)
    s = m**alpha
    s = s / math.sqrt(float(s.max()) * float(s.min()))
    return s.astype(np.float32)


def quantized_output_error(weights: Sequence[np.ndarray], s: np.ndarray, x: np.ndarray, group_size: int) -> float:
    """``sum_W ||x W^T - x W_hat^T||^2`` (float64 sum) with ``W_hat = dequantize(quantize_rtn(W * s)) / s``,
    for float32 weights [N, K], scale s [K] and inputs x [T, K]."""
    err = 0.0
    for w in weights:
        ws = w * s
        w_hat = dequantize(*quantize_rtn(ws, group_size), group_size) / s
        diff = x @ (w - w_hat).T
        err += float(np.square(diff, dtype=np.float64).sum())
    return err


def search_scale(
    weights: Sequence[np.ndarray],
    x: np.ndarray,
    group_size: int,
    grid: Sequence[float] = ALPHA_GRID,
    error_tokens: int = ERROR_TOKENS,
) -> tuple[float, np.ndarray, dict[float, float]]:
    """The AWQ search for one projection group (section 3.3).

    ``weights``: the group's float32 weights [N_i, K] sharing the input ``x`` float32 [T, K]
    (calibration tokens). ``mean|x|`` per channel is over all T tokens; the output error of each
    ``alpha`` in ``grid`` over an evenly spaced subsample of at most ``error_tokens`` tokens.
    Returns ``(alpha, s, errors)``: the alpha of least error (the first on ties, so 0 — RTN —
    when nothing beats it), its scale s float32 [K] and the error of every alpha. Raises
    :class:`CheckpointError` if the inputs are not finite.
    """
    x = np.asarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        raise CheckpointError("--awq: the calibration activations hold a non-finite value")
    mean_abs = np.abs(x).mean(axis=0)
    if x.shape[0] > error_tokens:
        x = x[np.linspace(0, x.shape[0] - 1, error_tokens).astype(np.int64)]
    errors = {float(a): quantized_output_error(weights, scale_of(mean_abs, a), x, group_size) for a in grid}
    best = min(errors, key=lambda a: (errors[a], a))
    return best, scale_of(mean_abs, best), errors


def awq_scale(
    tensors: MutableMapping[str, np.ndarray],
    config: Mapping,
    sequences: Sequence[Sequence[int]],
    group_size: int,
    *,
    grid: Sequence[float] = ALPHA_GRID,
    error_tokens: int = ERROR_TOKENS,
    progress: bool = False,
) -> dict[str, float]:
    """Apply AWQ's searched scales to the float32 weights ``tensors`` (HF names, modified in place:
    projections' columns times ``s``, the producing norms / v_proj / up_proj rows divided by it),
    calibrated on the token id ``sequences`` through the float model (module docstring).
    Quantize the result with :func:`.int4.quantize_rtn` in ``group_size``.

    Returns the chosen alpha per group, keyed ``"model.layers.L.qkv"`` / ``.o`` / ``.gate_up`` /
    ``.down`` (``.o`` absent under GQA). Raises :class:`CheckpointError` for an unsupported
    config (activation, rope) or non-finite activations.
    """
    if not sequences or not any(len(s) for s in sequences):
        raise CheckpointError("--awq: no calibration tokens")
    heads_equal = int(config["num_attention_heads"]) == int(config["num_key_value_heads"])
    alphas: dict[str, float] = {}
    layers = int(config["num_hidden_layers"])
    for layer, inputs in layer_inputs(tensors, config, sequences):
        p = f"model.layers.{layer}."
        a, s, _ = _fold_o(tensors, p, inputs["o"], group_size, grid, error_tokens, heads_equal)
        if a is not None:
            alphas[p + "o"] = a
        qkv = [p + f"self_attn.{n}_proj.weight" for n in "qkv"]
        alphas[p + "qkv"] = _fold_into_norm(
            tensors, qkv, p + "input_layernorm.weight", inputs["qkv"], group_size, grid, error_tokens
        )
        up = p + "mlp.up_proj.weight"
        alphas[p + "gate_up"] = _fold_into_norm(
            tensors,
            [p + "mlp.gate_proj.weight", up],
            p + "post_attention_layernorm.weight",
            inputs["gate_up"],
            group_size,
            grid,
            error_tokens,
        )
        down = p + "mlp.down_proj.weight"
        a, s, _ = search_scale([tensors[down]], inputs["down"], group_size, grid, error_tokens)
        tensors[down] = tensors[down] * s
        tensors[up] = tensors[up] / s[:, None]
        alphas[p + "down"] = a
        if progress:
            print(
                f"awq layer {layer + 1}/{layers}: "
                + ", ".join(f"{k.rsplit('.', 1)[1]} {alphas[k]:.2f}" for k in alphas if k.startswith(p)),
                flush=True,
            )
    return alphas


def _fold_into_norm(tensors, names, norm, x, group_size, grid, error_tokens) -> float:
    """The search for projections ``names`` that share the input ``x`` of RMSNorm ``norm``: their
    columns times ``s``, the norm's weight divided by it; returns the chosen alpha."""
    a, s, _ = search_scale([tensors[n] for n in names], x, group_size, grid, error_tokens)
    for n in names:
        tensors[n] = tensors[n] * s
    tensors[norm] = tensors[norm] / s
    return a


def _fold_o(tensors, p, x, group_size, grid, error_tokens, heads_equal):
    """o_proj's search and fold into v_proj's rows (and bias); (None, None, None) under GQA."""
    if not heads_equal:
        return None, None, None
    o, v = p + "self_attn.o_proj.weight", p + "self_attn.v_proj"
    a, s, errors = search_scale([tensors[o]], x, group_size, grid, error_tokens)
    tensors[o] = tensors[o] * s
    tensors[v + ".weight"] = tensors[v + ".weight"] / s[:, None]
    if v + ".bias" in tensors:
        tensors[v + ".bias"] = tensors[v + ".bias"] / s
    return a, s, errors


#: ``--calibration``'s default: 16 MT-Bench and 16 HumanEval prompts.
DEFAULT_CALIBRATION = "mtbench:16,humaneval:16"
#: Tokens kept of each calibration prompt (its first ones).
CALIBRATION_TOKENS = 256


def parse_calibration(text: str) -> list[tuple[str, int]]:
    """``"mtbench:16,humaneval:16"`` -> ``[("mtbench", 16), ("humaneval", 16)]``. Raises
    :class:`CheckpointError` naming ``--calibration`` for another dataset or a count that is not a
    positive integer."""
    out = []
    for item in str(text).split(","):
        name, _, count = item.strip().partition(":")
        if name not in ("mtbench", "humaneval") or not count.isdigit() or int(count) < 1:
            raise CheckpointError(
                f"--calibration: {item.strip()!r} is not DATASET:N with DATASET mtbench or humaneval and N >= 1"
            )
        out.append((name, int(count)))
    return out


def calibration_sequences(
    checkpoint: str | Path, spec: str = DEFAULT_CALIBRATION, max_tokens: int = CALIBRATION_TOKENS
) -> list[list[int]]:
    """Token id sequences of the calibration prompts ``spec`` (:func:`parse_calibration`): the
    **last** N records of each prompt set (``swiftspec.datasets``; the first ones are the held-out
    prompts tools/check_int4_quality.py and the benchmarks use), rendered as one user message with
    the chat template of the checkpoint folder's tokenizer, each cut to its first ``max_tokens``.
    Raises :class:`CheckpointError` for a bad spec or N beyond the set's size; fetching errors of
    the prompt sets propagate."""
    from ..datasets import load_humaneval, load_mtbench, prompt_messages
    from ..tokenizer import Tokenizer

    parts = parse_calibration(spec)
    tok = Tokenizer.from_checkpoint(Path(checkpoint))
    out = []
    for name, count in parts:
        records = load_mtbench(progress=False) if name == "mtbench" else load_humaneval(progress=False)
        if count > len(records):
            raise CheckpointError(f"--calibration: {name} has {len(records)} prompts, asked for {count}")
        for rec in records[len(records) - count :]:
            out.append(list(tok.encode_chat(prompt_messages(name, rec)))[:max_tokens])
    return out
