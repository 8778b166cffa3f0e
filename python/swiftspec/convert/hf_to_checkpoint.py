"""Hugging Face model folder (config.json + safetensors, maybe sharded) -> swiftspec checkpoint."""

from __future__ import annotations

import copy
import hashlib
from pathlib import Path

from tqdm.auto import tqdm

from .._json_file import check_limits, limit, read_json, read_text
from ..errors import CheckpointError
from .config_check import check_config, check_positive_int
from .dtypes import check_dtype
from .hf_quant_config import QuantConfig, read_quant_config
from .hf_quantized import add_projection, check_quantized_tensors, quantized_tensor_names, storage_group_size
from .int4 import DEFAULT_GROUP_SIZE, check_group_size
from .layout import check_tensor_set
from .manifest import make_manifest
from .safetensors_reader import SafetensorsFile
from .writer import CheckpointWriter, check_not_source

#: HF model_type values the runtime implements
SUPPORTED_MODEL_TYPES = ("llama", "qwen2")

_REQUIRED_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "rms_norm_eps",
    "max_position_embeddings",
)
# Buffers some checkpoints carry that the runtime recomputes.
_IGNORED_SUFFIXES = (".rotary_emb.inv_freq",)


def _read_json(path: Path) -> dict:
    try:
        value = read_json(path, "JSON file")
    except FileNotFoundError:
        raise CheckpointError(f"{path} does not exist") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return value


def weight_files(hf_dir: Path) -> list[Path]:
    """The safetensors files of an HF folder: the shards named by ``model.safetensors.index.json``,
    else ``model.safetensors``, else every ``*.safetensors``. Raises :class:`CheckpointError` if none."""
    index = hf_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: field 'weight_map' is missing or empty")
        for tensor, shard in weight_map.items():
            if not isinstance(shard, str) or not shard or "/" in shard or "\\" in shard or shard in (".", ".."):
                raise CheckpointError(
                    f"{index}: weight_map[{tensor!r}] is {shard!r}, expected the file name of a shard in the folder"
                )
        files = [hf_dir / f for f in sorted(set(weight_map.values()))]
    elif (hf_dir / "model.safetensors").exists():
        files = [hf_dir / "model.safetensors"]
    else:
        files = sorted(hf_dir.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{hf_dir} holds no *.safetensors weights (PyTorch .bin files are not supported)")
    for f in files:
        if not f.is_file():
            raise CheckpointError(f"weight shard {f} is missing")
    return files


def _rope(config: dict, path: Path) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from either the classic keys or transformers 5's ``rope_parameters``."""
    params = config.get("rope_parameters")
    scaling = config.get("rope_scaling")
    theta = config.get("rope_theta")
    if isinstance(params, dict):
        theta = params.get("rope_theta", theta)
        rest = {k: v for k, v in params.items() if k != "rope_theta"}
        if rest.get("rope_type", "default") != "default":
            scaling = rest
    if theta is None:
        theta = 10000.0
    if not isinstance(theta, (int, float)) or isinstance(theta, bool):
        raise CheckpointError(f"{path}: rope_theta is {theta!r}, expected a number")
    return float(theta), scaling


def check_model_type(hf_config: dict, path: Path) -> str:
    """Return config.json's ``model_type`` if supported, else raise :class:`CheckpointError` naming it."""
    model_type = hf_config.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise CheckpointError(
            f"{path}: model_type is {model_type!r}, which swiftspec cannot convert; "
            f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
        )
    return model_type


def build_config(
    hf_config: dict, tensor_names: set[str], dtype: str, path: Path, generation_config: dict | None
) -> dict:
    """The checkpoint's config.json from an HF config.json dict (keys kept, swiftspec keys added).

    Fills ``head_dim`` (hidden/heads), ``num_key_value_heads`` (heads), ``rope_theta`` /
    ``rope_scaling`` (also from ``rope_parameters``), ``tie_word_embeddings`` (absent ->
    true iff there is no ``lm_head.weight``), merges eos ids of config and generation_config,
    sets ``torch_dtype``, and adds the "swiftspec" object. Raises :class:`CheckpointError` for an
    unsupported ``model_type`` or a missing key, naming ``path`` and the key.
    """
    model_type = check_model_type(hf_config, path)
    for key in _REQUIRED_KEYS:
        if not isinstance(hf_config.get(key), (int, float)) or isinstance(hf_config.get(key), bool):
            raise CheckpointError(f"{path}: required key {key!r} is {hf_config.get(key)!r}, expected a number")
    config = copy.deepcopy(hf_config)
    heads = check_positive_int(config["num_attention_heads"], "num_attention_heads", str(path))
    config.setdefault("num_key_value_heads", heads)
    if config.get("head_dim") is None:
        config["head_dim"] = config["hidden_size"] // heads
    config["rope_theta"], config["rope_scaling"] = _rope(hf_config, path)
    config.pop("rope_parameters", None)
    if config.get("tie_word_embeddings") is None:
        config["tie_word_embeddings"] = "lm_head.weight" not in tensor_names
    eos: list[int] = []
    for source in (hf_config, generation_config or {}):
        value = source.get("eos_token_id")
        eos.extend(value if isinstance(value, list) else [] if value is None else [value])
    eos = list(dict.fromkeys(eos))
    if eos:
        config["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    config["torch_dtype"] = dtype
    if "dtype" in config:
        config["dtype"] = dtype
    bias = True if model_type == "qwen2" else bool(config.get("attention_bias", False))
    config["swiftspec"] = {"rope_style": "neox", "attention_bias": bias}
    check_config(config, str(path))
    return config


def _source_sha256(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            while chunk := fh.read(4 << 20):
                h.update(chunk)
    return h.hexdigest()


def convert_hf(
    hf_dir: str | Path,
    out_dir: str | Path,
    dtype: str = "bfloat16",
    *,
    progress: bool = True,
    overwrite: bool = False,
    group_size: int | None = None,
) -> Path:
    """Convert a Hugging Face model folder into a swiftspec checkpoint folder.

    ``hf_dir`` holds config.json (model_type ``llama`` or ``qwen2``), weights as
    ``model.safetensors`` or shards listed in ``model.safetensors.index.json`` (F32/F16/BF16),
    and tokenizer.json (required), tokenizer_config.json, chat_template.jinja,
    generation_config.json (optional). Tensor names are already HF names; ``lm_head.weight`` is
    dropped when embeddings are tied, rotary ``inv_freq`` buffers are dropped; every tensor is
    stored as ``dtype`` (bfloat16 from float32 rounds to nearest even; bf16 -> bf16 is exact;
    ``"int4"``: the linear projections quantized round-to-nearest in groups of ``group_size``
    (default 128), :mod:`.int4`, the rest bfloat16).

    A folder quantized with AutoAWQ (GEMM) or GPTQ (``desc_act`` false), :mod:`.hf_quant_config`,
    is read as it is: with ``dtype="int4"`` its 4-bit values, zero points and fp16 scales are
    re-packed into the int4 format, losslessly, in the folder's own group size (``group_size`` must
    be None or equal; for one group per row, -1, it picks the storage group), :mod:`.hf_quantized`;
    with ``"float32"`` the projections are the dequantized ``(q - z) * s`` (exact), with
    ``"bfloat16"`` those rounded to bfloat16. Its settings and every projection tensor's name, shape
    and dtype are checked before the output folder is created.
    The chat template from chat_template.jinja is folded into tokenizer_config.json. The
    manifest's source sha256 is the sha256 of the weight files' bytes concatenated in shard-name
    order. Returns ``out_dir`` as a Path.

    Raises :class:`CheckpointError` naming the file and key/tensor for a missing folder or file,
    unsupported model_type, malformed safetensors, unexpected/missing/mis-shaped tensors, and
    for int4 a group size that is not a multiple of 8 or does not divide a projection's input; for
    a quantized folder, unsupported settings (naming the field: bits, desc_act, version, ...),
    missing, mis-shaped or mistyped quantized tensors, values the int4 format cannot hold.
    """
    check_dtype(dtype)
    int4 = dtype == "int4"
    hf_dir = Path(hf_dir)
    if not hf_dir.is_dir():
        raise CheckpointError(f"HF model folder {hf_dir} does not exist or is not a folder")
    check_not_source(hf_dir, out_dir)
    config_path = hf_dir / "config.json"
    hf_config = _read_json(config_path)
    check_model_type(hf_config, config_path)
    quant = read_quant_config(hf_dir, hf_config)
    if not (hf_dir / "tokenizer.json").is_file():
        raise CheckpointError(f"{hf_dir / 'tokenizer.json'} does not exist; swiftspec needs the fast-tokenizer file")
    gen_path = hf_dir / "generation_config.json"
    generation_config = _read_json(gen_path) if gen_path.exists() else None

    files = [SafetensorsFile(f) for f in weight_files(hf_dir)]
    where: dict[str, SafetensorsFile] = {}
    for f in files:
        for name in f.entries:
            if name.endswith(_IGNORED_SUFFIXES):
                continue
            if name in where:
                raise CheckpointError(f"tensor {name!r} appears in both {where[name].path} and {f.path}")
            where[name] = f
    config = build_config(hf_config, set(where), "bfloat16" if int4 else dtype, config_path, generation_config)
    if quant is not None:
        config.pop("quantization_config", None)  # the folder written is the project's layout, not the source's
        if int4:
            group_size = storage_group_size(quant, config, group_size)
    if group_size is None:
        group_size = DEFAULT_GROUP_SIZE
    if int4:
        check_group_size(group_size, config, str(config_path))
    if config["tie_word_embeddings"]:
        where.pop("lm_head.weight", None)
    projections = check_quantized_tensors(where, config, quant, str(hf_dir)) if quant is not None else {}
    quantized = where  # every tensor, the projections' quantized ones included
    if projections:  # the float tensors, with each projection counted as its float weight
        where = {n: f for n, f in where.items() if n not in quantized_tensor_names(projections)}
        shapes = {**{n: f.shape(n) for n, f in where.items()}, **{p + ".weight": nk for p, nk in projections.items()}}
    else:
        shapes = {n: f.shape(n) for n, f in where.items()}
    check_tensor_set(shapes, config, str(hf_dir))

    writer = CheckpointWriter(out_dir, dtype, overwrite=overwrite, group_size=group_size)
    items = sorted([*where, *projections])
    for name in tqdm(items, desc=f"convert {hf_dir.name}", unit="tensor", disable=not progress):
        if name in projections:
            assert quant is not None  # (projections come from a quantized folder's config)
            add_projection(writer, quantized, name, projections[name][1], quant)
        else:
            writer.add(name, where[name].float32(name))
    weights = writer.write_weights()
    writer.release()

    writer.write_json("config.json", config)
    gen = dict(generation_config or {})
    if "eos_token_id" in config:
        gen["eos_token_id"] = config["eos_token_id"]
    writer.write_json("generation_config.json", gen)
    tokenizer_json = hf_dir / "tokenizer.json"
    writer.write_text(
        "tokenizer.json",
        check_limits(read_text(tokenizer_json, "tokenizer file", limit("max_tokenizer_json_bytes")), tokenizer_json),
    )
    tok_config_path = hf_dir / "tokenizer_config.json"
    tok_config = _read_json(tok_config_path) if tok_config_path.exists() else {}
    template_path = hf_dir / "chat_template.jinja"
    if "chat_template" not in tok_config and template_path.exists():
        tok_config["chat_template"] = template_path.read_text(encoding="utf-8")
    writer.write_json("tokenizer_config.json", tok_config)
    special_map = hf_dir / "special_tokens_map.json"
    if special_map.exists():
        writer.write_json("special_tokens_map.json", _read_json(special_map))
    sha = _source_sha256([f.path for f in files])
    origin = _quantized_origin(quant) if quant is not None else None
    manifest = make_manifest(
        dtype,
        [weights],
        "hf",
        str(hf_dir.resolve()),
        sha,
        group_size=group_size if int4 else None,
        quantization=origin if int4 else None,
    )
    if origin is not None and not int4:
        manifest["dequantized_from"] = origin
    return writer.finish(manifest)


def _quantized_origin(quant: QuantConfig) -> dict:
    """What the manifest records of a quantized source folder's settings."""
    return {
        "method": quant.method,
        "symmetric": quant.symmetric,
        "source_layout": quant.layout,
        "source_group_size": quant.group_size or -1,
        "source_quantization_config": quant.raw,
    }
