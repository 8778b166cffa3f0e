"""atheris (libFuzzer for Python) over the GGUF converter: the `gguf` package's reader behind the
runtime's bounds check (swiftspec_core.check_gguf_file), then every step convert_gguf takes before
it writes: the architecture, the tokenizer metadata, the config, the tokenizer, the tensor set and
each tensor's dequantization. The only accepted failure is CheckpointError with a one-line
message; anything else (a KeyError, a RecursionError, a hang past -timeout, memory past
-rss_limit_mb) is a finding.

    python3 fuzz/py_fuzz.py -max_total_time=60 build/fuzz/corpus/py_gguf fuzz/seeds/gguf

(fuzz/run.sh runs it with the settings of the campaign.)
"""

from __future__ import annotations

import os
import sys

import atheris

with atheris.instrument_imports(include=["swiftspec", "gguf"]):
    import gguf  # noqa: F401  (instrumented: the reader's branches guide the mutations)

    from swiftspec.convert.gguf_config import build_config, check_architecture
    from swiftspec.convert.gguf_file import GGUFModelFile
    from swiftspec.convert.gguf_names import hf_tensor_name
    from swiftspec.convert.gguf_to_checkpoint import hf_tensor
    from swiftspec.convert.layout import check_tensor_set
    from swiftspec.convert.tokenizer_from_gguf import build_tokenizer, read_tokenizer_info
    from swiftspec.errors import CheckpointError

PATH = os.path.join(os.environ.get("SWIFTSPEC_FUZZ_TMP", "/dev/shm"), f"swiftspec-fuzz-{os.getpid()}.gguf")


def convert(path: str) -> None:
    g = GGUFModelFile(path)
    check_architecture(g)
    info = read_tokenizer_info(g)
    config = build_config(g, info, "float32")
    build_tokenizer(g, info)
    for name in g.tensors:
        hf_tensor_name(name)
    shapes = {hf_tensor_name(n): tuple(int(d) for d in reversed(t.shape)) for n, t in g.tensors.items()}
    check_tensor_set(shapes, config, str(g.path))
    for name in g.tensors:
        hf_tensor(g, name, config)


def test_one_input(data: bytes) -> None:
    with open(PATH, "wb") as f:
        f.write(data)
    try:
        convert(PATH)
    except CheckpointError as exc:
        if "\n" in str(exc) or not str(exc):
            raise AssertionError(f"error message is empty or spans lines: {exc!r}") from None


def main() -> None:
    try:
        atheris.Setup(sys.argv, test_one_input)
        atheris.Fuzz()
    finally:
        if os.path.exists(PATH):
            os.unlink(PATH)


if __name__ == "__main__":
    main()
