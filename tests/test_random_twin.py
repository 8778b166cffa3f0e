"""tools/random_twin.py (issue 32's GPU fallback check without the real weights): a twin keeps its
checkpoint's config, manifest, tensor names and shapes, draws new bfloat16 weights from its seed,
loads and runs, and a layout it cannot use is refused with one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tiny_checkpoint import TINY_CONFIG, TINY_MANIFEST, tiny_tensors

from swiftspec.convert.safetensors_reader import SafetensorsFile
from swiftspec.convert.writer import CheckpointWriter

TOOL = Path(__file__).resolve().parent.parent / "tools" / "random_twin.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *map(str, args)], capture_output=True, text=True, timeout=120)


def _checkpoint(folder: Path, dtype: str) -> Path:
    w = CheckpointWriter(folder, dtype)
    for name, value in tiny_tensors().items():
        w.add(name, value)
    w.write_weights()
    w.write_json("config.json", TINY_CONFIG)
    return w.finish({**TINY_MANIFEST, "dtype": dtype})


def _weights(folder: Path) -> dict[str, np.ndarray]:
    st = SafetensorsFile(folder / "model.safetensors")
    return {name: st.float32(name) for name in st.entries}


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    root = tmp_path_factory.mktemp("twin")
    src = _checkpoint(root / "bf16", "bfloat16")
    r = _run("layout", src, root / "layout")
    assert r.returncode == 0, r.stderr
    for name, seed in (("a", 1), ("a2", 1), ("b", 2)):
        r = _run("make", root / "layout", root / name, "--seed", seed)
        assert r.returncode == 0, r.stderr
    return root


def test_layout_keeps_config_manifest_and_shapes(twins):
    layout = json.loads((twins / "layout" / "tensors.json").read_text())
    original = tiny_tensors()
    assert {k: tuple(v["shape"]) for k, v in layout.items()} == {k: v.shape for k, v in original.items()}
    assert {v["dtype"] for v in layout.values()} == {"BF16"}
    assert json.loads((twins / "a" / "config.json").read_text()) == TINY_CONFIG
    assert json.loads((twins / "a" / "manifest.json").read_text())["dtype"] == "bfloat16"


def test_twin_weights_are_new_and_follow_the_seed(twins):
    src, a, a2, b = (_weights(twins / n) for n in ("bf16", "a", "a2", "b"))
    assert a.keys() == src.keys()
    for name, x in a.items():
        assert x.shape == src[name].shape
        if name.endswith("norm.weight"):
            assert np.all(x == 1.0), name
            continue
        assert 0.015 < float(x.std()) < 0.025, (name, float(x.std()))
        assert not np.allclose(x, src[name]), name
        assert np.array_equal(x, a2[name]), name
        assert not np.array_equal(x, b[name]), name


def test_twin_loads_and_runs(twins):
    import swiftspec.swiftspec_core as core

    model = core.load_model(str(twins / "a"))
    logits = model.forward([1, 5, 7], logits="all")
    assert logits.shape == (3, TINY_CONFIG["vocab_size"]) and np.isfinite(logits).all()


def test_float32_layout_is_refused_with_one_line(tmp_path):
    src = _checkpoint(tmp_path / "f32", "float32")
    assert _run("layout", src, tmp_path / "layout").returncode == 0
    r = _run("make", tmp_path / "layout", tmp_path / "out")
    assert r.returncode == 2
    assert r.stderr.strip().count("\n") == 0
    assert "not all BF16" in r.stderr


def test_missing_checkpoint_is_refused_with_one_line(tmp_path):
    r = _run("layout", tmp_path / "nothing", tmp_path / "layout")
    assert r.returncode == 2
    assert r.stderr.startswith("error: random_twin layout:")
    assert r.stderr.strip().count("\n") == 0
