"""Weight converters: GGUF file or Hugging Face folder -> swiftspec checkpoint folder.

The folder format is docs/checkpoint_format.md. One module per job:

* ``gguf_file``          open a GGUF, read metadata with errors naming file and field
* ``gguf_names``         GGUF -> HF tensor names; Llama Q/K row un-permutation
* ``gguf_config``        config.json from GGUF metadata
* ``tokenizer_from_gguf`` tokenizer.json / tokenizer_config.json / end-of-generation ids
* ``gguf_to_checkpoint`` :func:`convert_gguf`
* ``hf_to_checkpoint``   :func:`convert_hf`
* ``safetensors_reader`` reading (possibly sharded, bf16/f16/f32) HF safetensors with numpy
* ``layout``             the tensor names and shapes a checkpoint must have
* ``dtypes``             float32 <-> bfloat16 bit conversion (round to nearest even)
* ``int4``               int4 (AWQ-style W4A16) round-to-nearest quantization, packing, dequantization
* ``int4_checkpoint``    :func:`quantize_checkpoint`: a float checkpoint folder -> an int4 one
* ``gguf_int4``          GGUF block quants -> int4 groups (the GGUF's 4-bit values kept, or an error search)
* ``hf_quant_config``    the checked settings of an AutoAWQ / GPTQ quantized HF folder
* ``awq_gemm_layout``    AutoAWQ's GEMM packing -> 4-bit values, zero points, scales
* ``gptq_layout``        GPTQ's packing (``checkpoint_format`` gptq / gptq_v2) -> the same
* ``hf_quantized``       a quantized HF folder's projections checked and re-packed into int4 (lossless)
* ``writer``             the folder writer (weights through ``safetensors``, manifest last)
* ``manifest``           manifest.json creation and validation

Tensor-parallel sharding (``--tp N``, ``tp_shard``) and int4 weights (``--dtype int4``) are
format versions 2 and 3; both write through :class:`writer.CheckpointWriter`.
"""

from .dtypes import SUPPORTED_DTYPES
from .gguf_to_checkpoint import convert_gguf
from .hf_to_checkpoint import convert_hf
from .manifest import read_manifest

__all__ = ["SUPPORTED_DTYPES", "convert_gguf", "convert_hf", "read_manifest"]
