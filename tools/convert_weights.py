#!/usr/bin/env python3
"""Convert a GGUF file or a Hugging Face model folder into a swiftspec checkpoint folder.

    python tools/convert_weights.py model.gguf --out ckpt/ [--dtype bfloat16|float32|int4]
    python tools/convert_weights.py hf_model_dir/ --out ckpt/ --dtype float32
    python tools/convert_weights.py ckpt/ --out ckpt-int4/ --dtype int4 [--group-size 128]
    python tools/convert_weights.py ckpt/ --out ckpt-awq/ --dtype int4 --awq [--calibration mtbench:16,humaneval:16]

The folder format is docs/checkpoint_format.md. ``--dtype int4`` stores the linear projections
(q/k/v/o, gate/up/down) as AWQ-style W4A16 groups: 4-bit values with one fp16 scale and one
4-bit zero point per ``--group-size`` input features (the storage format of AWQ, Lin et al.,
MLSys 2024); the embedding, norms, biases and LM head stay bfloat16 (``swiftspec.convert.int4``).
Its input may be a GGUF file, an HF folder, or a float swiftspec checkpoint folder (TP 1). From a
GGUF file (``--int4-method gguf``, the default; group size 32) each group keeps the GGUF's own
4-bit values (Q4_0, Q4_1, Q4_K) or is requantized from the GGUF's values by an error search,
whichever is closer to the GGUF, and the manifest records the error per GGUF type
(``swiftspec.convert.gguf_int4``); ``--int4-method rtn`` (group size 128) is plain round-to-nearest
from the dequantized values, as float folders and HF folders are quantized. ``--awq`` (float
swiftspec or HF folders only) first runs AWQ's activation-aware scale search
(``swiftspec.convert.awq``): per projection group, per-input-channel scales searched on the
calibration prompts of ``--calibration`` (default 16 MT-Bench + 16 HumanEval prompts, the last of
each set, first 256 tokens through the chat template) and folded into the preceding norm / v_proj /
up_proj, then the same round-to-nearest int4 (same format and kernels). An HF folder quantized with AutoAWQ (GEMM) or GPTQ (desc_act
false) keeps its own 4-bit values, zero points and scales (re-packed, lossless;
``swiftspec.convert.hf_quantized``).

Exit status 2 with a one-line message on bad input (missing file, not a GGUF, unsupported
architecture or tokenizer, non-empty --out, a group size that does not divide a projection's
input features, --tp with int4 ...).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from _cli import import_swiftspec, run

import_swiftspec()


def main() -> int:
    from swiftspec.convert import SUPPORTED_DTYPES, convert_gguf, convert_hf
    from swiftspec.convert.awq import DEFAULT_CALIBRATION, parse_calibration
    from swiftspec.convert.gguf_int4 import DEFAULT_GGUF_GROUP_SIZE
    from swiftspec.convert.gguf_to_checkpoint import INT4_METHODS
    from swiftspec.convert.int4 import DEFAULT_GROUP_SIZE, check_group_size
    from swiftspec.convert.writer import check_not_source, check_output_folder
    from swiftspec.errors import CheckpointError

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "input",
        type=Path,
        help="a .gguf file or a Hugging Face model folder (with --tp N or --dtype int4 "
        "also a float swiftspec checkpoint folder)",
    )
    p.add_argument("--out", type=Path, required=True, help="checkpoint folder to create (must be empty or new)")
    p.add_argument(
        "--dtype",
        choices=SUPPORTED_DTYPES,
        default="bfloat16",
        help="weight storage dtype (int4: 4-bit projections, the rest bfloat16)",
    )
    p.add_argument(
        "--group-size",
        type=int,
        default=None,
        metavar="G",
        help=f"int4 only: input features per scale and zero point, a multiple of 8 dividing every "
        f"projection's input features (default {DEFAULT_GGUF_GROUP_SIZE} from a GGUF file with "
        f"--int4-method gguf, else {DEFAULT_GROUP_SIZE})",
    )
    p.add_argument(
        "--int4-method",
        choices=INT4_METHODS,
        default=None,
        help="int4 from a GGUF file only: gguf (default) keeps the GGUF's 4-bit values or requantizes "
        "each group by an error search, whichever is closer to the GGUF; rtn quantizes the "
        "dequantized values round-to-nearest (the route of HF and float folders)",
    )
    p.add_argument(
        "--tp",
        type=int,
        default=1,
        metavar="N",
        help="tensor-parallel degree: N > 1 writes one padded shard per rank (docs/checkpoint_format.md); "
        "the input may then also be a TP-1 checkpoint folder",
    )
    p.add_argument(
        "--awq",
        action="store_true",
        help="int4 from a float swiftspec or HF folder only: before round-to-nearest, scale each projection "
        "group's input channels by AWQ's activation-aware search on calibration prompts (Lin et al., "
        "MLSys 2024), folding the inverse scales into the preceding norm / v_proj / up_proj; the int4 "
        "format is unchanged. Holds the model in float32 in memory",
    )
    p.add_argument(
        "--calibration",
        default=None,
        metavar="SET:N,...",
        help=f"with --awq: the calibration prompts, DATASET:N with DATASET mtbench or humaneval (the last N "
        f"of each set; default {DEFAULT_CALIBRATION})",
    )
    p.add_argument("--overwrite", action="store_true", help="allow writing into a non-empty --out folder")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    args = p.parse_args()

    if args.tp < 1:
        p.error(f"--tp {args.tp}: the tensor-parallel degree must be >= 1")
    int4 = args.dtype == "int4"
    if args.group_size is not None and not int4:
        raise CheckpointError(f"--group-size {args.group_size} applies to --dtype int4 only (got --dtype {args.dtype})")
    if int4 and args.tp > 1:
        raise CheckpointError(
            f"--tp {args.tp} with --dtype int4: tensor-parallel int4 folders are not supported yet; "
            "convert with --tp 1 (the runtime shards an int4 folder at load time: placement tp)"
        )
    if args.int4_method is not None and not int4:
        raise CheckpointError(
            f"--int4-method {args.int4_method} applies to --dtype int4 only (got --dtype {args.dtype})"
        )
    if not args.input.exists():
        raise CheckpointError(f"input {args.input} does not exist")
    from_gguf = args.input.is_file()
    if args.int4_method is not None and not from_gguf:
        raise CheckpointError(
            f"--int4-method {args.int4_method} applies to a GGUF file; {args.input} is a folder "
            "(float and HF folders are quantized round-to-nearest, AWQ / GPTQ folders re-packed)"
        )
    if args.calibration is not None and not args.awq:
        raise CheckpointError(f"--calibration {args.calibration} applies to --awq only")
    if args.awq:
        if not int4:
            raise CheckpointError(f"--awq applies to --dtype int4 only (got --dtype {args.dtype})")
        if from_gguf:
            raise CheckpointError(
                f"--awq applies to a float swiftspec or HF folder; {args.input} is a file (a GGUF file's "
                "values are already quantized: use --int4-method gguf, or convert a float HF folder)"
            )
        check_awq_input(args.input)
        parse_calibration(args.calibration or DEFAULT_CALIBRATION)
    method = args.int4_method or "gguf"
    default_group = DEFAULT_GGUF_GROUP_SIZE if from_gguf and method == "gguf" else DEFAULT_GROUP_SIZE
    group_size = check_group_size(default_group if args.group_size is None else args.group_size) if int4 else None
    check_not_source(args.input, args.out)
    check_output_folder(args.out, args.overwrite, "--overwrite")  # before any work (reading, hashing the input)
    kwargs = dict(dtype=args.dtype, progress=not args.quiet, overwrite=args.overwrite)
    if int4:
        kwargs["group_size"] = group_size
    if args.awq and not (args.input / "manifest.json").is_file():  # a float HF folder: via a float32 folder
        import tempfile

        from swiftspec.convert.int4_checkpoint import quantize_checkpoint

        args.out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=args.out.parent, prefix=".awq-float32-") as tmp:
            float32 = convert_hf(args.input, Path(tmp) / "float32", "float32", progress=not args.quiet)
            out = quantize_checkpoint(
                float32,
                args.out,
                group_size,
                progress=not args.quiet,
                overwrite=args.overwrite,
                awq_calibration=args.calibration or DEFAULT_CALIBRATION,
            )
    elif int4 and args.input.is_dir() and (args.input / "manifest.json").is_file():  # a float swiftspec folder
        from swiftspec.convert.int4_checkpoint import quantize_checkpoint

        awq = (args.calibration or DEFAULT_CALIBRATION) if args.awq else None
        out = quantize_checkpoint(
            args.input, args.out, group_size, progress=not args.quiet, overwrite=args.overwrite, awq_calibration=awq
        )
    elif args.tp > 1:  # pre-sharded, padded folder (swiftspec.convert.tp_shard; input may be a TP-1 folder)
        from swiftspec.convert.tp_shard import convert_sharded

        out = convert_sharded(args.input, args.out, args.tp, **kwargs)
    elif args.input.is_dir():  # (an AWQ / GPTQ folder has its own group size: --group-size only if equal)
        out = convert_hf(args.input, args.out, **{**kwargs, "group_size": args.group_size})
    else:
        if int4:
            kwargs["int4_method"] = method
        out = convert_gguf(args.input, args.out, **kwargs)
    print(out)
    return 0


def check_awq_input(folder: Path) -> None:
    """Raise CheckpointError naming --awq unless ``folder`` is a float swiftspec checkpoint folder (TP 1)
    or an HF folder without a quantization config."""
    import json

    from swiftspec.convert.hf_quant_config import _find
    from swiftspec.convert.manifest import read_manifest
    from swiftspec.errors import CheckpointError

    if (folder / "manifest.json").is_file():
        manifest = read_manifest(folder)
        if manifest["dtype"] == "int4":
            raise CheckpointError(f"--awq: {folder} is already an int4 checkpoint; give its bfloat16 or float32 folder")
        return
    config = folder / "config.json"
    try:
        hf_config = json.loads(config.read_text())
    except (OSError, ValueError):
        return  # convert_hf reports a missing or malformed config.json itself
    found = _find(folder, hf_config) if isinstance(hf_config, dict) else None
    if found is not None:
        raise CheckpointError(
            f"--awq: {folder} is already quantized (settings in {found[1]}); --awq needs float weights "
            "(convert it without --awq to keep its own 4-bit values)"
        )


if __name__ == "__main__":
    run(main)
