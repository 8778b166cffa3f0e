"""Loaders that cannot be crashed (issue 28): the inputs a fuzzing campaign found crashing, hanging
or exhausting memory are each refused with one line naming the file and the field.

Inputs that crashed the interpreter, hung or grew without bound run in a child process with a
time limit (and, outside sanitizer runs, an address-space limit), so a regression fails its test
instead of the whole run or the machine.
"""

from __future__ import annotations

import json
import os
import re
import resource
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file
from tiny_checkpoint import (
    TINY_CONFIG,
    TINY_MANIFEST,
    TINY_TP_MANIFEST,
    TINY_TP_PLAN,
    tiny_tensors,
    write_tiny_gguf,
)

import swiftspec
from swiftspec import CheckpointError
from swiftspec import swiftspec_core as core
from swiftspec.tokenizer import Tokenizer

DEPTH = core.JSON_LIMITS["max_depth"]
#: The issue's nesting: 100,000 arrays, which overflowed the stack in json::dump().
DEEP = "[" * 100_000 + "]" * 100_000
UNDER_ASAN = "asan" in os.environ.get("LD_PRELOAD", "")
CHILD_CACHE: Path = Path("/nonexistent")


@pytest.fixture(autouse=True)
def _child_cache(tmp_path_factory):
    global CHILD_CACHE
    CHILD_CACHE = tmp_path_factory.getbasetemp() / "child-cache"


def write_tokenizer(folder: Path) -> None:
    """A 64-token word-level tokenizers file (Engine and Tokenizer need one)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = Tokenizer(WordLevel({f"w{i}": i for i in range(64)}, unk_token="w0"))
    tok.pre_tokenizer = Whitespace()
    tok.save(str(folder / "tokenizer.json"))


def write_checkpoint(
    folder: Path,
    cfg=TINY_CONFIG,
    manifest=TINY_MANIFEST,
    config_text: str | None = None,
    manifest_text: str | None = None,
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tiny_tensors(norm_mean=0.0), str(folder / "model.safetensors"))
    (folder / "config.json").write_text(config_text if config_text is not None else json.dumps(cfg))
    (folder / "manifest.json").write_text(manifest_text if manifest_text is not None else json.dumps(manifest))
    write_tokenizer(folder)
    return folder


# The child reports its own peak resident size (VmHWM) at exit: getrusage's ru_maxrss survives
# fork and exec on Linux, so a child of this test process (many GB once the real models were
# loaded in it) would report the parent's size.
PEAK_REPORT = """
import atexit as _atexit, os as _os, re as _re
def _report_peak():
    with open("/proc/self/status") as status, open(_os.environ["SWIFTSPEC_TEST_PEAK_FILE"], "w") as out:
        out.write(_re.search(r"VmHWM:\\s*(\\d+) kB", status.read()).group(1))
_atexit.register(_report_peak)
"""


def isolated(code: str, timeout: float = 60) -> tuple[subprocess.CompletedProcess, float, float]:
    """Runs ``code`` in a fresh interpreter; returns the process, its seconds and its peak RSS in
    MB (NaN when the child died before reporting it). Outside ASan runs its address space is
    capped at 8 GB, so an unbounded reader fails fast."""

    def limit():
        if not UNDER_ASAN:  # ASan reserves terabytes of address space
            resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))

    peak_file = CHILD_CACHE.parent / f"peak-{os.getpid()}-{time.monotonic_ns()}"
    start = time.monotonic()
    # A cache of its own: a folder the engine does not take as a checkpoint is converted into it.
    env = {**os.environ, "SWIFTSPEC_CACHE": str(CHILD_CACHE), "SWIFTSPEC_TEST_PEAK_FILE": str(peak_file)}
    proc = subprocess.run(
        [sys.executable, "-"],
        input=PEAK_REPORT + textwrap.dedent(code),
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limit,
        env=env,
    )  # (stdin: code beyond an argument's 128 KB)
    elapsed = time.monotonic() - start
    try:
        peak_mb = int(peak_file.read_text()) / 1024
        peak_file.unlink()
    except (OSError, ValueError):
        peak_mb = float("nan")
    return proc, elapsed, peak_mb


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    """The CheckpointError the child printed as its last line ("CheckpointError: <message>")."""
    assert proc.returncode == 0, f"child died with {proc.returncode}: {proc.stderr[-2000:]}"
    lines = proc.stdout.strip().splitlines()
    assert lines and lines[-1].startswith("CheckpointError: "), proc.stdout + proc.stderr
    return lines[-1][len("CheckpointError: ") :]


CATCH = """
import swiftspec
import swiftspec.swiftspec_core as core
from swiftspec import CheckpointError
try:
    {call}
    print("LOADED")
except CheckpointError as e:
    assert "\\n" not in str(e)
    print("CheckpointError:", e)
"""


# ---------------------------------------------------------------- 1, 4, 5: config.json


@pytest.mark.parametrize("field", ["vocab_size", "rope_theta", "eos_token_id"])
def test_1_config_value_nested_100000_deep_is_refused_naming_the_field(field):
    """Item 1: segfault (exit 139) in the error message's json::dump()."""
    text = json.dumps({**TINY_CONFIG, field: "X"}).replace('"X"', DEEP)
    proc, _, _ = isolated(CATCH.format(call=f"core.parse_model_config({text!r}, 'x/config.json')"))
    assert one_line_error(proc) == (
        f"x/config.json: malformed JSON: field '{field}': arrays and objects nested deeper than {DEPTH} levels"
    )


def test_1_nesting_up_to_the_limit_is_read_and_one_more_is_refused():
    cfg = {**TINY_CONFIG}
    ok = json.dumps({**cfg, "extra": "X"}).replace('"X"', "[" * (DEPTH - 1) + "]" * (DEPTH - 1))
    assert core.parse_model_config(ok, "c")["vocab_size"] == 64  # the object + 63 arrays: 64 levels
    bad = json.dumps({**cfg, "extra": "X"}).replace('"X"', "[" * DEPTH + "]" * DEPTH)
    with pytest.raises(
        CheckpointError,
        match=rf"^c: malformed JSON: field 'extra': arrays and objects nested deeper "
        rf"than {DEPTH} levels$",
    ):
        core.parse_model_config(bad, "c")


@pytest.mark.parametrize("file", ["config.json", "manifest.json", "model.safetensors"])
@pytest.mark.parametrize("number", ["1e99999", "9" * 400, "-1e400"])
def test_4_numbers_past_the_double_range_are_refused_naming_file_and_field(tmp_path, file, number):
    """Item 4: a raw RuntimeError [json.exception.out_of_range.406] from any of the three."""
    ckpt = write_checkpoint(tmp_path / "ckpt")
    if file == "config.json":
        field = "rope_theta"
        (ckpt / file).write_text(json.dumps(TINY_CONFIG).replace("10000.0", number))
    elif file == "manifest.json":
        field = "format_version"
        (ckpt / file).write_text(
            json.dumps(TINY_MANIFEST).replace('"format_version": 1', f'"format_version": {number}')
        )
    else:
        field = "__metadata__.x"
        raw = (ckpt / file).read_bytes()
        (n,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + n])
        text = json.dumps({**header, "__metadata__": {"x": "N"}}).replace('"N"', number).encode()
        (ckpt / file).write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])
    with pytest.raises(CheckpointError) as info:
        core.load_model(str(ckpt))
    message = str(info.value)
    assert message.startswith(str(ckpt / file) + ": ") and "\n" not in message
    assert f"field '{field}': number overflow parsing '{number[:170]}" in message
    assert len(message) < len(str(ckpt)) + 300  # a 400-digit number is quoted cut short


def test_5_tokenizer_reads_a_1500_deep_config_without_recursion_error(tmp_path):
    """Item 5: Python's json module raised RecursionError (the reader caught OSError / ValueError)."""
    ckpt = write_checkpoint(tmp_path / "ckpt")
    (ckpt / "config.json").write_text(
        json.dumps({**TINY_CONFIG, "vocab_size": "X"}).replace('"X"', "[" * 1500 + "]" * 1500)
    )
    with pytest.raises(CheckpointError) as info:
        Tokenizer.from_checkpoint(ckpt)
    assert str(info.value) == (
        f"{ckpt / 'config.json'}: malformed JSON: field 'vocab_size': arrays and objects "
        f"nested deeper than {DEPTH} levels"
    )


@pytest.mark.parametrize("name", ["tokenizer_config.json", "generation_config.json"])
def test_5_every_json_the_tokenizer_reads_has_the_limit(tmp_path, name):
    ckpt = write_checkpoint(tmp_path / "ckpt")
    (ckpt / name).write_text('{"eos_token": ' + "[" * 1500 + "]" * 1500 + "}")
    with pytest.raises(CheckpointError, match=re.escape(f"{ckpt / name}: malformed JSON: field 'eos_token': arrays")):
        Tokenizer.from_checkpoint(ckpt)


def test_python_readers_refuse_bytes_that_are_not_utf8_and_nesting_past_a_syntax_error(tmp_path):
    """The Python readers' other ways out of json.loads: bytes that are not UTF-8 (the runtime's
    reason quotes them: escaped, not a UnicodeDecodeError), and nesting deeper than the interpreter
    recurses behind a syntax error the runtime stops at first (NaN, which json.loads takes)."""
    from swiftspec.convert.config_check import read_checkpoint_config
    from swiftspec.convert.safetensors_reader import SafetensorsFile

    problem, is_limit = core.json_text_problem(b'{"a": "\xe2\x82')
    assert "ill-formed UTF-8" in problem and "\\xe2\\x82" in problem and not is_limit
    ckpt = write_checkpoint(tmp_path / "ckpt")
    header = b'{"x": "\xff"}'
    (ckpt / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(
        CheckpointError, match=re.escape(f"{ckpt / 'model.safetensors'}: safetensors header is not valid JSON: ")
    ):
        SafetensorsFile(ckpt / "model.safetensors")
    (ckpt / "config.json").write_bytes(b'{"model_type": "\xff"}')
    with pytest.raises(CheckpointError, match=re.escape(f"{ckpt / 'config.json'} cannot be read as JSON: ")):
        read_checkpoint_config(ckpt)
    (ckpt / "config.json").write_text('{"x": NaN, "y": ' + "[" * 5000 + "]" * 5000 + "}")
    with pytest.raises(CheckpointError) as info:
        read_checkpoint_config(ckpt)
    assert str(info.value) == (
        f"{ckpt / 'config.json'}: malformed JSON: arrays and objects nested deeper than {DEPTH} levels"
    )


# ---------------------------------------------------------------- 2, 3: manifest.json


def test_2_tp_manifest_nested_100000_deep_is_refused_through_engine(tmp_path):
    """Item 2: segfault in cpp/backend/cpu/tp_weights.cpp's dump() of tensor_parallel."""
    manifest = {**TINY_TP_MANIFEST, "tensor_parallel": {**TINY_TP_PLAN, "q_heads": "X"}, "files": []}
    ckpt = write_checkpoint(tmp_path / "tp2", manifest_text=json.dumps(manifest).replace('"X"', DEEP))
    proc, _, _ = isolated(CATCH.format(call=f"swiftspec.Engine({str(ckpt)!r}, placement={{'target': {{'tp': 2}}}})"))
    assert one_line_error(proc) == (
        f"{ckpt / 'manifest.json'}: malformed JSON: field 'tensor_parallel.q_heads': "
        f"arrays and objects nested deeper than {DEPTH} levels"
    )


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"format": 5}, "field 'format' must be a string, got 5"),
        ({"format": [1, 2]}, "field 'format' must be a string, got an array of 2 items"),
        ({"dtype": None}, 'field \'dtype\' must be "float32" or "bfloat16", got ""'),
        ({"dtype": 5}, "field 'dtype' must be a string, got 5"),
        ({"dtype": {"a": 1}}, "field 'dtype' must be a string, got an object of 1 key"),
        ({"dtype": "x" * 500}, 'field \'dtype\' must be "float32" or "bfloat16", got "' + "x" * 80 + '"...'),
    ],
)
def test_3_manifest_fields_of_another_type_are_named(tmp_path, edit, message):
    """Item 3: raw RuntimeError [json.exception.type_error.302] from manifest.value("format", "")."""
    ckpt = write_checkpoint(tmp_path / "ckpt", manifest={**TINY_MANIFEST, **edit})
    with pytest.raises(CheckpointError) as info:
        core.load_model(str(ckpt))
    assert str(info.value) == f"{ckpt / 'manifest.json'}: {message}"


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"format": 5}, "field 'format' must be a string, got 5"),
        ({"dtype": None}, 'field \'dtype\' must be "float32" or "bfloat16", got ""'),
    ],
)
def test_3_tp_manifest_fields_of_another_type_are_named(tmp_path, edit, message):
    manifest = {**TINY_TP_MANIFEST, "files": [], **edit}
    ckpt = write_checkpoint(tmp_path / "tp2", manifest=manifest)
    with pytest.raises(CheckpointError) as info:
        swiftspec.Engine(str(ckpt), placement={"target": {"tp": 2}})
    assert str(info.value) == f"{ckpt / 'manifest.json'}: {message}"


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"q_heads": [[0, 1.5], [2, 3]]}, "tensor_parallel field 'q_heads' must hold 32-bit integers, got 1.5"),
        ({"q_heads": [[0, 1e300], [2, 3]]}, "tensor_parallel field 'q_heads' must hold 32-bit integers, got 1e+300"),
        ({"tp_degree": 2**32 + 2}, "tensor_parallel field 'tp_degree' must hold 32-bit integers, got 4294967298"),
        ({"ffn_bounds": {"a": 1}}, "tensor_parallel field 'ffn_bounds' must be a list, got an object of 1 key"),
    ],
)
def test_tp_plan_numbers_are_read_without_conversions(tmp_path, edit, message):
    """get_to() read 1.5 as 1 and 2^32 + 2 as 2, and converting 1e300 to int is undefined."""
    manifest = {**TINY_TP_MANIFEST, "tensor_parallel": {**TINY_TP_PLAN, **edit}, "files": []}
    ckpt = write_checkpoint(tmp_path / "tp2", manifest=manifest)
    with pytest.raises(CheckpointError) as info:
        swiftspec.Engine(str(ckpt), placement={"target": {"tp": 2}})
    assert str(info.value) == f"{ckpt / 'manifest.json'}: {message}"


@pytest.mark.parametrize("name, quoted", [("model.sa\nfetensors", '"model.sa\\nfetensors"'), ("", '""'), (".", '"."')])
def test_a_manifest_file_name_with_a_control_character_is_refused_on_one_line(tmp_path, name, quoted):
    """Found by the 2026-12-07 campaign (manifest, fuzz/seeds/manifest/regress-files-newline.json):
    a newline in a 'files' entry went raw into the path every later message names (two lines)."""
    ckpt = write_checkpoint(tmp_path / "ckpt", manifest={**TINY_MANIFEST, "files": [name]})
    with pytest.raises(CheckpointError) as info:
        core.load_model(str(ckpt))
    assert str(info.value) == f"{ckpt / 'manifest.json'}: file name {quoted} must be a plain name inside the folder"


@pytest.mark.parametrize(
    "header, message",
    [
        (
            {"a\nb": {"dtype": "F32", "shape": [1], "data_offsets": [0, 5]}},
            "tensor 'a?b': byte size 5 does not match shape [1] x F32 = 4 bytes",
        ),
        ({"a": {"dtype": "F\n32", "shape": [1], "data_offsets": [0, 5]}}, "tensor 'a': unsupported dtype 'F?32'"),
    ],
)
def test_control_characters_of_a_safetensors_header_are_not_quoted_raw(tmp_path, header, message):
    """Tensor names and dtypes come from the file: a JSON "\\n" in one split the message in two
    (fuzz/seeds/safetensors/regress-name-newline.safetensors, regress-dtype-newline.safetensors)."""
    ckpt = write_checkpoint(tmp_path / "ckpt")
    text = json.dumps(header).encode()
    (ckpt / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + bytes(5))
    with pytest.raises(CheckpointError) as info:
        core.load_model(str(ckpt))
    assert str(info.value) == f"{ckpt / 'model.safetensors'}: {message}"


def test_a_tensor_name_with_a_control_character_is_quoted_on_one_line_by_the_checkpoint(tmp_path):
    ckpt = write_checkpoint(tmp_path / "ckpt")
    save_file(
        {**tiny_tensors(norm_mean=0.0), "model.layers.5.a\nb": np.zeros(1, np.float32)}, str(ckpt / "model.safetensors")
    )
    with pytest.raises(CheckpointError) as info:
        core.load_model(str(ckpt))
    assert str(info.value) == (
        f"{ckpt}: tensor 'model.layers.5.a?b' belongs to layer 5, but config.json says num_hidden_layers = 2 "
        "(the config does not match the weights)"
    )


# ---------------------------------------------------------------- 6: GGUF


def test_6_gguf_array_item_type_changed_to_array_is_refused_in_bounded_memory(tmp_path):
    """Item 6: the gguf reader grew ~160 MB/s until the machine's memory was gone (24 GB)."""
    good = write_tiny_gguf(tmp_path / "good.gguf")
    assert core.check_gguf_file(str(tmp_path / "good.gguf")) == {
        "version": 3,
        "tensor_count": 2,
        "kv_count": 13,
        "big_endian": False,
    }
    key = b"tokenizer.ggml.tokens"
    at = good.index(key) + len(key) + 4  # past the key and its value type (ARRAY): the item type
    assert struct.unpack_from("<I", good, at)[0] == 8  # STRING
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(good[:at] + struct.pack("<I", 9) + good[at + 4 :])  # ARRAY
    proc, elapsed, peak_mb = isolated(
        CATCH.format(call=f"from swiftspec.convert.gguf_file import GGUFModelFile; GGUFModelFile({str(bad)!r})"),
        timeout=120,
    )
    message = one_line_error(proc)
    assert re.fullmatch(
        re.escape(f"{bad} cannot be parsed as GGUF: metadata key tokenizer.ggml.tokens at byte ")
        + r"\d+: array of \d+ (items of \d+ bytes?|strings|arrays) needs more than the \d+ bytes left in the file",
        message,
    ), message
    assert elapsed < 60 and peak_mb < 1024


def test_a_gguf_merge_naming_a_token_the_vocabulary_lacks_is_refused_naming_it(tmp_path):
    """Found by fuzz/run.sh (py_gguf, fuzz/seeds/gguf/regress-merge-out-of-vocab.gguf): the tokenizers
    library raised a bare Exception "Token `e` out of vocabulary" out of convert_gguf."""
    from swiftspec.convert import convert_gguf

    path = tmp_path / "no-e.gguf"
    write_tiny_gguf(path, ("h", "`", "he", "<|endoftext|>"), eos_token_id=3)
    with pytest.raises(CheckpointError) as info:
        convert_gguf(path, tmp_path / "out", "float32", progress=False)
    assert str(info.value) == (
        f"{path}: tokenizer.ggml.merges entry 0 ('h e') needs the token 'e', which tokenizer.ggml.tokens does not hold"
    )
    # The seed (fuzz/seeds/gguf), through the converter's tokenizer step as fuzz/py_fuzz.py runs it.
    from swiftspec.convert.gguf_file import GGUFModelFile
    from swiftspec.convert.tokenizer_from_gguf import build_tokenizer, read_tokenizer_info

    seeds = Path(__file__).parent.parent / "fuzz" / "seeds" / "gguf"
    tiny = GGUFModelFile(seeds / "tiny.gguf")
    assert build_tokenizer(tiny, read_tokenizer_info(tiny)).get_vocab_size() == 4
    seed = GGUFModelFile(seeds / "regress-merge-out-of-vocab.gguf")
    with pytest.raises(CheckpointError, match=r"tokenizer.ggml.merges entry 0 \('h e'\) needs the token 'e'"):
        build_tokenizer(seed, read_tokenizer_info(seed))


def test_a_gguf_token_embedding_with_no_dimensions_is_refused_naming_it(tmp_path):
    """Found by the 2026-12-07 campaign (py_gguf, fuzz/seeds/gguf/regress-embd-no-dims.gguf): a
    token_embd.weight of 0 dimensions (a scalar, which the reader takes) was an IndexError out of
    build_config's shape[-1]."""
    from swiftspec.convert import convert_gguf

    seed = Path(__file__).parent.parent / "fuzz" / "seeds" / "gguf" / "regress-embd-no-dims.gguf"
    path = tmp_path / "scalar-embd.gguf"
    path.write_bytes(seed.read_bytes())
    with pytest.raises(CheckpointError) as info:
        convert_gguf(path, tmp_path / "out", "float32", progress=False)
    assert str(info.value) == (
        f"{path}: tensor 'token_embd.weight' has 0 dimensions [], expected 2 (embedding_length, vocabulary size)"
    )


def test_6_every_truncation_of_a_gguf_is_refused_by_the_check_or_the_reader(tmp_path):
    """Each prefix of the tiny file: the check refuses it, or the reader gets a file whose structure
    lies inside it (the converter's errors name the file either way)."""
    from swiftspec.convert.gguf_file import GGUFModelFile

    good = write_tiny_gguf(tmp_path / "good.gguf")
    end = core.check_gguf_file(str(tmp_path / "good.gguf"))
    path = tmp_path / "cut.gguf"
    refused = 0
    for n in range(0, len(good), 7):
        path.write_bytes(good[:n])
        try:
            GGUFModelFile(path)
        except CheckpointError as exc:
            assert str(path) in str(exc) and "\n" not in str(exc)
            refused += 1
    assert refused == len(range(0, len(good), 7))  # even the longest prefix lacks tensor data
    assert end["tensor_count"] == 2


# ---------------------------------------------------------------- 7: FIFOs, /dev/zero


def load(ckpt: Path, name: str) -> str:
    """The call that reads ``name``: swiftspec.Engine, except for manifest.json, without which
    Engine takes the folder for a Hugging Face one and converts it (the runtime's loader reads it)."""
    return f"core.load_model({str(ckpt)!r})" if name == "manifest.json" else f"swiftspec.Engine({str(ckpt)!r})"


@pytest.mark.parametrize("name", ["model.safetensors", "config.json", "manifest.json", "tokenizer.json"])
def test_7_a_fifo_in_place_of_a_checkpoint_file_is_refused_at_once(tmp_path, name):
    """Item 7: open() of a FIFO blocked Engine for ever (the regular-file check came after it)."""
    ckpt = write_checkpoint(tmp_path / "ckpt")
    (ckpt / name).unlink()
    os.mkfifo(ckpt / name)
    proc, elapsed, _ = isolated(CATCH.format(call=load(ckpt, name)), timeout=60)
    message = one_line_error(proc)
    assert message.startswith(str(ckpt / name)) and ("FIFO" in message or "not a regular file" in message), message
    assert elapsed < 30


@pytest.mark.parametrize(
    "name", ["config.json", "manifest.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"]
)
def test_7_a_file_symlinked_to_dev_zero_is_refused_without_reading_it(tmp_path, name):
    """Item 7: a JSON file symlinked to /dev/zero was read until memory ran out."""
    ckpt = write_checkpoint(tmp_path / "ckpt")
    if (ckpt / name).exists():
        (ckpt / name).unlink()
    (ckpt / name).symlink_to("/dev/zero")
    proc, elapsed, peak_mb = isolated(CATCH.format(call=load(ckpt, name)), timeout=60)
    message = one_line_error(proc)
    assert message.startswith(str(ckpt / name)) and ("character device" in message or "not a regular file" in message)
    assert elapsed < 30 and peak_mb < 1024


def test_7_json_files_over_the_size_cap_are_refused_before_reading(tmp_path):
    ckpt = write_checkpoint(tmp_path / "ckpt")
    cap = core.JSON_LIMITS["max_small_json_bytes"]
    with open(ckpt / "config.json", "r+b") as f:
        f.truncate(cap + 1)  # sparse: no byte is written
    with pytest.raises(CheckpointError) as info:
        core.load_model(str(ckpt))
    assert str(info.value) == (
        f"{ckpt / 'config.json'}: config file is {cap + 1} bytes, more than the {cap} bytes such a file may have"
    )


def test_7_a_safetensors_header_over_100_mb_is_refused(tmp_path):
    ckpt = write_checkpoint(tmp_path / "ckpt")
    n = core.JSON_LIMITS["max_safetensors_header_bytes"] + 1
    with open(ckpt / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", n))
        f.truncate(8 + n)
    with pytest.raises(CheckpointError) as info:
        core.load_model(str(ckpt))
    assert str(info.value) == (
        f"{ckpt / 'model.safetensors'}: corrupt header: header length {n} exceeds the "
        f"{n - 1} bytes the safetensors format allows"
    )


# ---------------------------------------------------------------- 8: sizes before allocation


@pytest.mark.parametrize(
    "edit, message",
    [
        (
            {"head_dim": 1073741824},
            "config.json: fields 'num_attention_heads' (4) times 'head_dim' (1073741824) exceed 2147483647",
        ),
        (
            {"head_dim": 1 << 20},
            ": tensor 'model.layers.0.self_attn.q_proj.weight' has shape [32, 32], expected [4194304, 32] from config.json "
            "(num_attention_heads * head_dim, hidden_size)",
        ),
        (
            {"num_hidden_layers": 2_000_000},
            ": missing tensor 'model.layers.1999999.input_layernorm.weight' (config.json says num_hidden_layers = 2000000)",
        ),
        (
            {"num_hidden_layers": 2**31 - 1},
            ": missing tensor 'model.layers.2147483646.input_layernorm.weight' (config.json says num_hidden_layers = "
            "2147483647)",
        ),
        (
            {"intermediate_size": 1 << 28},
            ": tensor 'model.layers.0.mlp.gate_proj.weight' has shape [64, 32], expected [268435456, 32] from config.json "
            "(intermediate_size, hidden_size)",
        ),
        (
            {"vocab_size": 1 << 30},
            ": tensor 'model.embed_tokens.weight' has shape [64, 32], expected [1073741824, 32] from config.json "
            "(vocab_size, hidden_size)",
        ),
    ],
)
def test_8_sizes_the_tensors_do_not_have_are_refused_before_any_allocation(tmp_path, edit, message):
    """Item 8: head_dim 2^30 spent 10.7 s and 2.1 GB (the RoPE table) before the shape error;
    num_hidden_layers 2,000,000 spent 924 MB before "missing tensor"; 2^31 - 1 was refused as "not
    enough memory ... max_context"."""
    ckpt = write_checkpoint(tmp_path / "ckpt", cfg={**TINY_CONFIG, **edit})
    proc, elapsed, peak_mb = isolated(CATCH.format(call=f"swiftspec.Engine({str(ckpt)!r})"))
    got = one_line_error(proc)
    assert got.endswith(message) and got.startswith(str(ckpt)), got
    assert elapsed < 30 and peak_mb < 1024


def test_8_tp_folder_sizes_are_checked_before_its_layers_are_made(tmp_path):
    ckpt = write_checkpoint(
        tmp_path / "tp2", cfg={**TINY_CONFIG, "num_hidden_layers": 2_000_000}, manifest=TINY_TP_MANIFEST
    )
    shared = {k: v for k, v in tiny_tensors(norm_mean=0.0).items() if "proj" not in k}
    save_file(shared, str(ckpt / "model-tp-shared.safetensors"))
    for r in range(2):
        rank = {k: v[: v.shape[0] // 2] for k, v in tiny_tensors(norm_mean=0.0).items() if "proj" in k}
        save_file(rank, str(ckpt / f"model-tp{r}-of-2.safetensors"))
    proc, elapsed, peak_mb = isolated(
        CATCH.format(call=f"swiftspec.Engine({str(ckpt)!r}, placement={{'target': {{'tp': 2}}}})")
    )
    assert one_line_error(proc) == (
        f"{ckpt / 'model-tp-shared.safetensors'}: missing tensor "
        "'model.layers.1999999.input_layernorm.weight' (config.json says "
        "num_hidden_layers = 2000000)"
    )
    assert elapsed < 30 and peak_mb < 1024


# ---------------------------------------------------------------- 9: rope_scaling
# The two inputs; the other rope_scaling fields are in tests/test_bad_input.py
# (test_invalid_rope_scaling_is_refused_naming_the_field).

LLAMA3_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}


@pytest.mark.parametrize(
    "edit, message",
    [
        ({"factor": 0}, "field 'rope_scaling.factor' must be >= 1, got 0"),
        (
            {"low_freq_factor": 4.0, "high_freq_factor": 4.0},
            "field 'rope_scaling.high_freq_factor' must be greater than low_freq_factor (4), got 4",
        ),
    ],
)
def test_9_llama3_rope_scaling_with_factor_0_or_equal_freq_factors_is_refused(tmp_path, edit, message):
    """Item 9: both loaded without error (HF divides by high_freq_factor - low_freq_factor)."""
    ckpt = write_checkpoint(tmp_path / "ckpt", cfg={**TINY_CONFIG, "rope_scaling": {**LLAMA3_SCALING, **edit}})
    with pytest.raises(CheckpointError) as info:
        swiftspec.Engine(str(ckpt))
    assert str(info.value) == f"{ckpt / 'config.json'}: {message}"


def test_the_tiny_checkpoint_of_these_tests_loads(tmp_path):
    """The folders above differ from a loadable one only by their edit."""
    ckpt = write_checkpoint(tmp_path / "ckpt")
    with swiftspec.Engine(str(ckpt)) as engine:
        result = engine.generate("w1 w2", max_new_tokens=2)
    assert len(result.token_ids) == 2
