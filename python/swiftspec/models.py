"""Resolving what a user names as a model into a checkpoint folder.

A model can be named by a reference name (``swiftspec.fetch.REFERENCE_MODELS``),
a converted checkpoint folder, a GGUF file, a Hugging Face model folder
(config.json + safetensors), or a Hugging Face model id (``org/name``, or
``org/name@revision`` for a branch, tag or commit hash), which ``huggingface_hub``
fetches into its own cache (``HF_HUB_CACHE``, ``HF_HUB_OFFLINE``, ``HF_TOKEN`` and
``HF_ENDPOINT`` apply as everywhere else) and which is then converted as a folder.
GGUF files, HF folders and hub snapshots are converted once into the cache and
reused while the source is unchanged.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

from swiftspec.errors import CheckpointError, FetchError
from swiftspec.paths import build_folder_atomically, cache_dir

# "org/name" or "org/name@revision": the form vLLM, SGLang and llama.cpp's -hf take. The hub's
# own rules (96 characters, no "--" or "..") are checked by huggingface_hub, which names them.
_HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[^\s@]+))?")

#: The files of a hub repository that are downloaded: what the HF folder conversion reads
#: (``swiftspec.convert.convert_hf``). Other weights (PyTorch .bin, GGUF, ONNX) are left on the hub.
HUB_FILES = (
    "config.json",
    "generation_config.json",
    "*.safetensors",
    "model.safetensors.index.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def parse_hub_id(model) -> tuple[str, str | None] | None:
    """``(repo_id, revision)`` when ``model`` names a Hugging Face model rather than a local path,
    else None: a string ``org/name`` or ``org/name@revision`` (revision None: the default branch)
    that is no existing file or folder and does not end in ``.gguf`` (a GGUF file that is not
    there is a missing file, not a model id). A local folder of that name is used as a folder."""
    if not isinstance(model, str):
        return None
    m = _HUB_ID.fullmatch(model)
    if m is None or model.lower().endswith(".gguf") or Path(model).exists():
        return None
    return m["repo"], m["revision"]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def fetch_hub_model(model: str) -> Path:
    """The local folder (a snapshot in the Hugging Face cache) of hub model id ``model``
    (``org/name[@revision]``), downloading what :data:`HUB_FILES` names if it is not cached.

    Raises (each one line naming ``model``):
        CheckpointError: the hub has no such model (or it is private or gated), no such revision,
            the id is not a valid hub id, or the repository has no config.json or no
            ``*.safetensors`` weights.
        FetchError: the model is not in the cache and the hub cannot be asked (``HF_HUB_OFFLINE``
            is set, or the network is down), the cached download is incomplete, or the hub
            answered with another error.
    """
    repo, revision = parse_hub_id(model) or (None, None)
    if repo is None:
        raise CheckpointError(f"{model}: not a Hugging Face model id (expected org/name or org/name@revision)")
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub import errors as hf

    where = f"revision {revision!r} of {repo!r}" if revision else repo
    try:
        folder = Path(snapshot_download(repo, revision=revision, allow_patterns=list(HUB_FILES)))
    except hf.GatedRepoError:
        raise CheckpointError(
            f"{model}: the Hugging Face model {repo!r} is gated: accept its terms on its hub page, "
            "then log in (hf auth login, or set HF_TOKEN)"
        ) from None
    except hf.RepositoryNotFoundError:
        raise CheckpointError(
            f"{model}: no such local file or folder, and the Hugging Face hub has no model "
            f"{repo!r} (or it is private: log in with hf auth login, or set HF_TOKEN)"
        ) from None
    except hf.RevisionNotFoundError:
        raise CheckpointError(
            f"{model}: the Hugging Face model {repo!r} has no revision {revision!r} (give a branch, "
            "a tag or a commit hash)"
        ) from None
    except hf.IncompleteSnapshotError as exc:
        raise FetchError(
            f"{model}: the Hugging Face cache holds an incomplete download of {where} and the hub "
            f"cannot be reached to finish it ({_first_line(exc.__cause__ or exc)})"
        ) from None
    except hf.LocalEntryNotFoundError as exc:
        missing = (
            f"{model}: no such local file or folder, and {where} is not in the Hugging Face cache "
            f"({constants.HF_HUB_CACHE})"
        )
        if constants.HF_HUB_OFFLINE:
            raise FetchError(
                f"{missing}, and HF_HUB_OFFLINE is set, so the hub was not asked: unset it to download "
                "the model, or give a local folder"
            ) from None
        raise FetchError(
            f"{missing}, and the hub cannot be reached ({_first_line(exc.__cause__ or exc)}): connect to "
            "the network (or set HF_ENDPOINT to a mirror), or download the model elsewhere and give its "
            "folder"
        ) from None
    except hf.HFValidationError as exc:
        raise CheckpointError(f"{model}: not a valid Hugging Face model id ({_first_line(exc)})") from None
    except hf.HfHubHTTPError as exc:
        raise FetchError(f"{model}: the Hugging Face hub refused the download ({_first_line(exc)})") from None
    except Exception as exc:  # the HTTP client's own errors (a proxy, TLS): still one line naming the model
        raise FetchError(f"{model}: downloading from the Hugging Face hub failed ({_first_line(exc)})") from None
    held = sorted(p.name for p in folder.iterdir())
    if not any(name.endswith(".safetensors") for name in held):
        raise CheckpointError(
            f"{model}: the Hugging Face repository {repo!r} (commit {folder.name}) has no "
            "*.safetensors weights, which swiftspec converts (for a repository of GGUF files, download "
            "one .gguf file and give its path; PyTorch .bin weights are not read)"
        )
    if "config.json" not in held:
        raise CheckpointError(
            f"{model}: the Hugging Face repository {repo!r} (commit {folder.name}) has no "
            "config.json, so it is not a transformers model swiftspec can convert"
        )
    return folder


def _source_key(path: Path) -> str:
    """A cache key that changes when the source file or folder changes."""
    h = hashlib.sha256(str(path.resolve()).encode())
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    for f in files:
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def _convert_into_cache(source: Path, dtype: str, convert, name: str | None = None) -> Path:
    """``convert(source, folder, dtype=dtype)`` into ``<cache>/checkpoints/<name>-<key>-<dtype>``
    (``name``: the source's stem by default) unless that folder is complete already."""
    final = cache_dir() / "checkpoints" / f"{name or source.stem}-{_source_key(source)}-{dtype}"
    if (final / "manifest.json").is_file():
        return final
    return build_folder_atomically(final, lambda tmp: convert(source, tmp, dtype=dtype))


def _swiftspec_config(folder: Path) -> bool:
    """Whether ``folder/config.json`` holds the "swiftspec" object that the converter adds."""
    from ._json_file import read_json

    try:
        config = read_json(folder / "config.json", "config file")
    except (OSError, CheckpointError):
        return False
    return isinstance(config, dict) and isinstance(config.get("swiftspec"), dict)


def resolve_checkpoint(model: str | os.PathLike, dtype: str = "bfloat16") -> Path:
    """The checkpoint folder for ``model``, fetching or converting it if needed.

    Args:
        model: a reference model name, a checkpoint folder (has manifest.json),
            a ``.gguf`` file, an HF folder (config.json + *.safetensors), or a
            Hugging Face model id, ``org/name`` or ``org/name@revision``
            (:func:`fetch_hub_model`; a local path of that name comes first).
        dtype: "bfloat16", "float32" or "int4", for conversions.

    Raises:
        CheckpointError: the path does not exist or is none of the above; a hub id
            the hub does not have (or without safetensors weights), naming it.
        FetchError: a reference model or a hub model could not be downloaded.
    """
    from swiftspec.fetch import REFERENCE_MODELS, ensure_checkpoint

    if isinstance(model, str) and model in REFERENCE_MODELS:
        return ensure_checkpoint(model, dtype=dtype)
    hub = parse_hub_id(model)
    if hub is not None:
        from swiftspec.convert import convert_hf

        snapshot = fetch_hub_model(str(model))
        try:  # (named by the repository and its commit: another revision is another checkpoint)
            name = f"{hub[0].replace('/', '--')}-{snapshot.name[:12]}"
            return _convert_into_cache(snapshot, dtype, convert_hf, name=name)
        except CheckpointError as exc:
            raise CheckpointError(f"{model}: {exc}") from None
    path = Path(model).expanduser()
    if not path.exists():
        known = ", ".join(sorted(REFERENCE_MODELS))
        raise CheckpointError(f"{path}: no such file or folder (and not a reference model name: {known})")
    if path.is_dir():
        if (path / "manifest.json").is_file():
            return path
        if (path / "config.json").is_file() and any(path.glob("*.safetensors")):
            from swiftspec.convert import convert_hf

            try:
                return _convert_into_cache(path, dtype, convert_hf)
            except CheckpointError as exc:
                if _swiftspec_config(path):  # an interrupted conversion, not an HF folder
                    raise CheckpointError(
                        f"{path} looks like an incomplete swiftspec checkpoint: its config.json is one the converter "
                        "writes, but manifest.json, written last, is missing (the conversion was interrupted or "
                        f"failed; convert it again). Read as a Hugging Face folder it fails: {exc}"
                    ) from None
                raise
        raise CheckpointError(
            f"{path}: not a model folder (expected a swiftspec checkpoint with manifest.json, "
            "or a Hugging Face folder with config.json and *.safetensors)"
        )
    if path.suffix.lower() == ".gguf":
        from swiftspec.convert import convert_gguf

        return _convert_into_cache(path, dtype, convert_gguf)
    raise CheckpointError(f"{path}: unsupported model file (expected a .gguf file or a checkpoint folder)")
