"""A float swiftspec checkpoint folder -> an int4 one (``tools/convert_weights.py CKPT --dtype int4``).

The linear projections are quantized round-to-nearest (:mod:`.int4`), optionally after AWQ's
activation-aware scaling (:mod:`.awq`, ``--awq``); every other tensor is
stored bfloat16 (exact from a bfloat16 folder). config.json, the tokenizer files and
generation_config.json are copied unchanged; the manifest keeps the folder's ``source`` (the
GGUF or HF model it was converted from) and adds ``quantized_from`` (this folder and its dtype).
"""

from __future__ import annotations

from pathlib import Path

from tqdm.auto import tqdm

from ..errors import CheckpointError
from .config_check import read_checkpoint_config
from .int4 import DEFAULT_GROUP_SIZE, check_group_size
from .layout import check_tensor_set
from .manifest import MANIFEST, make_manifest, read_manifest
from .safetensors_reader import SafetensorsFile
from .writer import CheckpointWriter, check_not_source


def quantize_checkpoint(
    src_dir: str | Path,
    out_dir: str | Path,
    group_size: int = DEFAULT_GROUP_SIZE,
    *,
    progress: bool = True,
    overwrite: bool = False,
    awq_calibration: str | None = None,
) -> Path:
    """Write an int4 copy (format version 3) of the TP-1 float checkpoint ``src_dir`` to ``out_dir``.

    Peak memory: the int4 folder (about a third of a bfloat16 one) plus one float32 tensor.
    Returns ``out_dir`` as a Path. Raises :class:`CheckpointError` naming the folder and problem:
    not a complete checkpoint, already int4, tensor-parallel (shard after quantizing is not
    supported either), a group size that does not divide a projection's input features, a
    missing or mis-shaped tensor, a non-empty ``out_dir``.

    ``awq_calibration`` (e.g. ``"mtbench:16,humaneval:16"``, :func:`.awq.calibration_sequences`):
    before quantizing, scale the projections by AWQ's activation-aware search (:mod:`.awq`),
    calibrated on those prompts through the folder's chat template. All float32 tensors are then
    held in memory at once (about 4 bytes per parameter). The manifest's ``quantization`` then
    says ``"method": "awq_search"`` and records the calibration and the chosen alphas.
    """
    src = Path(src_dir)
    check_not_source(src, out_dir)
    manifest = read_manifest(src)
    if manifest["dtype"] == "int4":
        raise CheckpointError(f"{src}: already an int4 checkpoint; quantize the bfloat16 or float32 folder")
    if manifest.get("tp_degree", 1) != 1:
        raise CheckpointError(
            f"{src}: a tensor-parallel folder (tp_degree {manifest['tp_degree']}); int4 needs the TP-1 folder"
        )
    config = read_checkpoint_config(src)
    check_group_size(group_size, config, str(src / "config.json"))
    files = [SafetensorsFile(src / f) for f in manifest["files"]]
    where = {name: f for f in files for name in f.entries}
    check_tensor_set({n: f.shape(n) for n, f in where.items()}, config, str(src))

    scaled: dict = {}
    awq_entry = None
    if awq_calibration is not None:
        from .awq import awq_scale, calibration_sequences

        sequences = calibration_sequences(src, awq_calibration)
        scaled = {name: where[name].float32(name) for name in where}
        alphas = awq_scale(scaled, config, sequences, group_size, progress=progress)
        awq_entry = {
            "method": "awq_search",
            "awq": {
                "calibration": awq_calibration,
                "sequences": len(sequences),
                "tokens": sum(len(s) for s in sequences),
                "alphas": alphas,
            },
        }
    writer = CheckpointWriter(out_dir, "int4", overwrite=overwrite, group_size=group_size)
    for name in tqdm(sorted(where), desc=f"int4 {src.name}", unit="tensor", disable=not progress):
        writer.add(name, scaled.pop(name) if name in scaled else where[name].float32(name))
    check_tensor_set(writer.shapes, config, str(src), group_size)
    weights = writer.write_weights()
    writer.release()
    for f in src.iterdir():
        if f.is_file() and f.name != MANIFEST and f.suffix != ".safetensors":
            writer.copy_in(f)
    source = manifest["source"]
    new_manifest = make_manifest(
        "int4",
        [weights],
        source["kind"],
        source["path"],
        source.get("sha256"),
        group_size=group_size,
        quantization=awq_entry,
    )
    new_manifest["quantized_from"] = {"path": str(src.resolve()), "dtype": manifest["dtype"]}
    return writer.finish(new_manifest)
