"""Writes the fuzz targets' seed corpora, fuzz/seeds/<target>/ (committed; run again after a
format change): tiny valid files of each kind, and the inputs of issue 28's findings as regression
entries (the campaign starts from them, so a regression is found in its first second).

    python3 fuzz/make_seeds.py
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import numpy as np

# The tiny checkpoint's config.json and manifest.json tables and the tiny GGUF, shared with the tests.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from tiny_checkpoint import TINY_CONFIG, TINY_MANIFEST, TINY_TP_MANIFEST, TINY_TP_PLAN, write_tiny_gguf  # noqa: E402

SEEDS = Path(__file__).resolve().parent / "seeds"


def nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


def configs() -> dict[str, str]:
    qwen = {
        **TINY_CONFIG,
        "model_type": "qwen2",
        "eos_token_id": [2, 3],
        "attention_bias": True,
        "swiftspec": {"rope_style": "neox", "attention_bias": True},
    }
    llama3 = {
        **TINY_CONFIG,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    }
    hf5 = {k: v for k, v in TINY_CONFIG.items() if k != "rope_theta"}
    hf5["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0}
    text = json.dumps(TINY_CONFIG)
    return {
        "tiny-llama.json": text,
        "tiny-qwen2.json": json.dumps(qwen),
        "llama3-scaling.json": json.dumps(llama3),
        "rope-parameters.json": json.dumps(hf5),
        # issue 28 item 1 (100,000 deep crashed; 1,000 takes the same path) and item 4
        "regress-deep-vocab.json": text.replace('"vocab_size": 64', '"vocab_size": ' + nested(1000)),
        "regress-overflow.json": text.replace('"rope_theta": 10000.0', '"rope_theta": 1e99999'),
        "regress-400-digits.json": text.replace('"vocab_size": 64', '"vocab_size": ' + "9" * 400),
        # item 8: sizes the tensors do not have
        "regress-head-dim.json": json.dumps({**TINY_CONFIG, "head_dim": 1073741824}),
        "regress-layers.json": json.dumps({**TINY_CONFIG, "num_hidden_layers": 2147483647}),
        # item 9
        "regress-llama3-factor0.json": json.dumps({**llama3, "rope_scaling": {**llama3["rope_scaling"], "factor": 0}}),
    }


def manifests() -> dict[str, str]:
    v1 = TINY_MANIFEST
    v3 = {**v1, "format_version": 3, "dtype": "int4", "quantization": {"bits": 4, "group_size": 32}}
    tp = TINY_TP_PLAN
    v2 = TINY_TP_MANIFEST
    return {
        "v1.json": json.dumps(v1),
        "v3-int4.json": json.dumps(v3),
        "v2-tp.json": json.dumps(v2),
        "plan.json": json.dumps(tp),
        # issue 28 items 2, 3, 4
        "regress-deep-plan.json": json.dumps({**tp, "q_heads": "X"}).replace('"X"', nested(1000)),
        "regress-format-5.json": json.dumps({**v1, "format": 5}),
        "regress-dtype-null.json": json.dumps({**v1, "dtype": None}),
        "regress-overflow.json": json.dumps(v1).replace('"format_version": 1', '"format_version": 1e99999'),
        # found by the 2026-12-07 campaign: a newline in a file name split the error message
        "regress-files-newline.json": json.dumps({**v1, "files": ["model.sa\nfetensors"]}),
    }


def safetensors_files() -> dict[str, bytes]:
    from safetensors.numpy import save

    rng = np.random.default_rng(0)
    small = {
        "a": rng.standard_normal((4, 8)).astype(np.float32),
        "b": np.arange(6, dtype=np.int8).reshape(2, 3),
        "c": np.zeros((0, 3), np.float16),
        "d": np.array(3.0, np.float32),
    }
    out = {"small.safetensors": save(small, metadata={"format": "pt"})}
    header = b'{"a": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}}'
    out["bf16.safetensors"] = struct.pack("<Q", len(header)) + header + bytes(8)
    deep = b'{"__metadata__": {"x": ' + nested(1000).encode() + b"}}"
    out["regress-deep-header.safetensors"] = struct.pack("<Q", len(deep)) + deep
    big = b'{"a": {"dtype": "F32", "shape": [1e99999], "data_offsets": [0, 4]}}'
    out["regress-overflow.safetensors"] = struct.pack("<Q", len(big)) + big + bytes(4)
    # a control character in a tensor name or a dtype was quoted raw: a message of two lines
    name = b'{"a\\nb": {"dtype": "F32", "shape": [1], "data_offsets": [0, 5]}}'
    out["regress-name-newline.safetensors"] = struct.pack("<Q", len(name)) + name + bytes(5)
    dtype = b'{"a": {"dtype": "F\\n32", "shape": [1], "data_offsets": [0, 4]}}'
    out["regress-dtype-newline.safetensors"] = struct.pack("<Q", len(dtype)) + dtype + bytes(4)
    return out


def gguf_files(tmp: Path) -> dict[str, bytes]:
    def write(path: Path, tokens: list[str], embd: np.ndarray | None = None) -> bytes:
        if embd is None:
            embd = np.random.default_rng(0).standard_normal((len(tokens), 8)).astype(np.float32)
        return write_tiny_gguf(path, tokens, token_types=[1] * len(tokens), embd=embd, eos_token_id=len(tokens) - 1)

    tokens = ["h", "e", "he", "<|endoftext|>"]
    tiny = write(tmp / "tiny.gguf", tokens)
    # issue 28 item 6: tokenizer.ggml.tokens' item type STRING (8) changed to ARRAY (9)
    key = b"tokenizer.ggml.tokens"
    at = tiny.index(key) + len(key) + 4  # past the key and the value type ARRAY: the item type
    assert struct.unpack_from("<I", tiny, at)[0] == 8
    regress = tiny[:at] + struct.pack("<I", 9) + tiny[at + 4 :]
    # found by fuzz/run.sh (py_gguf): a merge naming a token the vocabulary lacks was a bare
    # Exception from the tokenizers library
    no_e = write(tmp / "no-e.gguf", ["h", "`", "he", "<|endoftext|>"])
    # found by the 2026-12-07 campaign (py_gguf): token_embd.weight with no dimensions (a scalar)
    # was an IndexError out of build_config (its shape[-1])
    scalar = write(tmp / "scalar-embd.gguf", tokens, np.array(0.5, np.float32))
    return {
        "tiny.gguf": tiny,
        "regress-string-to-array.gguf": regress,
        "regress-merge-out-of-vocab.gguf": no_e,
        "regress-embd-no-dims.gguf": scalar,
    }


def main() -> int:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        corpora = {
            "config": {k: v.encode() for k, v in configs().items()},
            "manifest": {k: v.encode() for k, v in manifests().items()},
            "safetensors": safetensors_files(),
            "gguf": gguf_files(Path(tmp)),
        }
    for target, files in corpora.items():
        folder = SEEDS / target
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (folder / name).write_bytes(data)
        print(f"{folder}: {len(files)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
