"""Hugging Face model ids (``org/name``, ``org/name@revision``) as models: resolved through
``huggingface_hub`` (its cache, ``HF_HUB_OFFLINE``, revisions), then converted like a local folder.

This machine cannot reach the hub, so the tests write what a download leaves behind: a hub cache
(``models--org--name/`` with ``blobs/``, ``snapshots/<commit>/`` of links to the blobs and
``refs/<branch or tag>``) holding tiny random Llama and Qwen2 models (config.json, safetensors,
a byte-level tokenizer). ``huggingface_hub.snapshot_download`` itself finds them (nothing of it is
replaced), offline or after failing to reach a hub that is not there. The hub's answers for an id
or a revision it does not have come from a stand-in hub on 127.0.0.1 that answers as the hub does
(HTTP 404 with its X-Error-Code header).

What is checked: the id gives the same greedy tokens as HF transformers on the same files (a
Llama with its own LM head, a Qwen2 with q/k/v biases and tied embeddings), ``@tag`` and
``@commit`` pick their own snapshot, ``--target`` / ``--draft`` take ids end to end, and each
error (an unknown id, no network, offline without the model, a repository without weights, an
unknown revision) is one line naming the id.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from swiftspec.errors import CheckpointError, FetchError
from swiftspec.models import HUB_FILES, fetch_hub_model, parse_hub_id

VOCAB = 258  # 256 byte tokens, <|im_start|>, <|im_end|>
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"
)
COMMITS = {"main": "1" * 40, "v1": "2" * 40}  # two revisions: the default branch and a tag


# ------------------------------------------------------------------------ a hub-layout cache
def _tokenizer_files() -> dict[str, bytes]:
    """A byte-level BPE tokenizer (every byte one token, no merges) and its config."""
    import tempfile

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    with tempfile.TemporaryDirectory() as tmp:
        tok.save(f"{tmp}/tokenizer.json")
        data = Path(f"{tmp}/tokenizer.json").read_bytes()
    config = {"eos_token": "<|im_end|>", "chat_template": CHAT_TEMPLATE}
    return {"tokenizer.json": data, "tokenizer_config.json": json.dumps(config).encode()}


def _model_files(arch: str, seed: int) -> dict[str, bytes]:
    """config.json and model.safetensors of a tiny random model: 2 layers, hidden 32, 4 query heads
    and 2 KV heads of 8. Llama: its own LM head; Qwen2: q/k/v biases, tied embeddings."""
    from safetensors.numpy import save

    hidden, inter, layers, heads, kv, hd = 32, 64, 2, 4, 2, 8
    shapes = {"model.embed_tokens.weight": (VOCAB, hidden), "model.norm.weight": (hidden,)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (hidden,),
                p + "post_attention_layernorm.weight": (hidden,),
                p + "self_attn.q_proj.weight": (heads * hd, hidden),
                p + "self_attn.k_proj.weight": (kv * hd, hidden),
                p + "self_attn.v_proj.weight": (kv * hd, hidden),
                p + "self_attn.o_proj.weight": (hidden, heads * hd),
                p + "mlp.gate_proj.weight": (inter, hidden),
                p + "mlp.up_proj.weight": (inter, hidden),
                p + "mlp.down_proj.weight": (hidden, inter),
            }
        )
        if arch == "qwen2":
            shapes.update(
                {
                    p + "self_attn.q_proj.bias": (heads * hd,),
                    p + "self_attn.k_proj.bias": (kv * hd,),
                    p + "self_attn.v_proj.bias": (kv * hd,),
                }
            )
    if arch == "llama":
        shapes["lm_head.weight"] = (VOCAB, hidden)
    rng = np.random.default_rng(seed)
    tensors = {
        name: (
            1.0 + 0.1 * rng.standard_normal(shape) if name.endswith("norm.weight") else 0.5 * rng.standard_normal(shape)
        ).astype(np.float32)
        for name, shape in shapes.items()
    }
    config = {
        "architectures": ["LlamaForCausalLM" if arch == "llama" else "Qwen2ForCausalLM"],
        "model_type": arch,
        "vocab_size": VOCAB,
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hd,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": 256,
        "tie_word_embeddings": arch == "qwen2",
        "bos_token_id": 256,
        "eos_token_id": 257,
        "torch_dtype": "float32",
    }
    return {"config.json": json.dumps(config).encode(), "model.safetensors": save(tensors)}


def write_hub_repo(cache: Path, repo: str, revisions: dict[str, dict[str, bytes]]) -> dict[str, Path]:
    """Writes ``repo`` into the hub cache ``cache`` as huggingface_hub lays out a download: each
    file once in ``blobs/`` (named by its sha256), each revision a ``snapshots/<commit>/`` of
    relative links to them, each ref name in ``refs/``. ``revisions`` maps a ref name to its
    files. Returns each ref's snapshot folder."""
    root = cache / f"models--{repo.replace('/', '--')}"
    folders = {}
    for ref, files in revisions.items():
        commit = COMMITS[ref]
        snapshot = root / "snapshots" / commit
        snapshot.mkdir(parents=True)
        for name, data in files.items():
            blob = root / "blobs" / hashlib.sha256(data).hexdigest()
            blob.parent.mkdir(exist_ok=True)
            blob.write_bytes(data)
            (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
        (root / "refs").mkdir(exist_ok=True)
        (root / "refs" / ref).write_text(commit)  # (no newline, as the hub's client writes it)
        folders[ref] = snapshot
    return folders


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A hub cache holding ``tiny/llama`` (main, and the tag v1 with other weights), ``tiny/qwen2``
    (main) and ``tiny/no-weights`` (config, tokenizer and a GGUF file: no safetensors); the engine's
    own cache in tmp_path; huggingface_hub pointed at the hub cache, offline (it reads these
    settings from the environment when it is imported, so they are set in both places)."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    tok = _tokenizer_files()
    snapshots = {
        "tiny/llama": write_hub_repo(
            cache,
            "tiny/llama",
            {"main": {**_model_files("llama", 0), **tok}, "v1": {**_model_files("llama", 1), **tok}},
        ),
        "tiny/qwen2": write_hub_repo(cache, "tiny/qwen2", {"main": {**_model_files("qwen2", 2), **tok}}),
        "tiny/no-weights": write_hub_repo(
            cache, "tiny/no-weights", {"main": {"config.json": _model_files("llama", 3)["config.json"], **tok}}
        ),
    }
    (tmp_path / "swiftspec").mkdir()
    for name, value in {
        "HF_HUB_CACHE": str(cache),
        "HF_HUB_OFFLINE": "1",
        "SWIFTSPEC_CACHE": str(tmp_path / "swiftspec"),
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return snapshots


def _hf_greedy(folder: Path, prompt_ids: list[int], n: int) -> list[int]:
    """HF transformers' greedy continuation of ``prompt_ids`` with the model in ``folder``: at most
    ``n`` tokens, up to and with the end-of-sequence token (as swiftspec reports them)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]), max_new_tokens=n, do_sample=False, eos_token_id=257, pad_token_id=257
        )
    return out[0, len(prompt_ids) :].tolist()


PROMPT = list(b"def fib(n):")


# ----------------------------------------------------------------------------- resolution
@pytest.mark.parametrize(
    "model, expected",
    [
        ("Qwen/Qwen2.5-Coder-7B-Instruct", ("Qwen/Qwen2.5-Coder-7B-Instruct", None)),
        ("org/name@v1.0", ("org/name", "v1.0")),
        ("org/name@" + "a" * 40, ("org/name", "a" * 40)),
        ("org/name.gguf", None),  # a GGUF file that is not there: a missing file
        ("org/sub/name", None),
        ("/abs/path", None),
        ("name", None),
        ("./org/name", None),
        ("org/name@", None),
    ],
)
def test_what_is_taken_for_a_hub_id(model, expected):
    assert parse_hub_id(model) == expected


def test_a_local_folder_of_the_same_name_comes_first(tmp_path, monkeypatch):
    (tmp_path / "org" / "name").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert parse_hub_id("org/name") is None and parse_hub_id("org/other") == ("org/other", None)
    assert parse_hub_id(Path("org/other")) is None  # a Path is always a path


@pytest.mark.parametrize("repo", ["tiny/llama", "tiny/qwen2"])
def test_a_hub_id_decodes_as_hf_transformers_does(hub, repo):
    """From the hub cache, offline: converted once into swiftspec's cache (named by the repository
    and its commit), then the same greedy tokens as HF transformers on the snapshot's files."""
    from swiftspec.engine import Engine

    assert fetch_hub_model(repo) == hub[repo]["main"]
    with Engine(repo, dtype="float32", max_context=256) as engine:
        got = engine.generate(PROMPT, max_new_tokens=12, stop=None).token_ids
        ckpt = engine.target_dir
    assert ckpt.parent == Path(os.environ["SWIFTSPEC_CACHE"]) / "checkpoints"
    assert ckpt.name.startswith(f"{repo.replace('/', '--')}-{COMMITS['main'][:12]}-") and ckpt.name.endswith("-float32")
    want = _hf_greedy(hub[repo]["main"], PROMPT, 12)
    assert got == want and len(want) == 12  # (no end-of-sequence token came early: 12 tokens compared)
    # converted once: a second engine reuses the checkpoint
    mtime = (ckpt / "manifest.json").stat().st_mtime_ns
    with Engine(repo, dtype="float32", max_context=256) as again:
        assert again.target_dir == ckpt and (ckpt / "manifest.json").stat().st_mtime_ns == mtime


def test_a_revision_picks_its_own_snapshot(hub):
    """``@v1`` (a tag, through refs/v1) and ``@<commit>`` give the v1 snapshot, whose weights
    differ from main's: another checkpoint, other tokens, HF transformers' on those files."""
    from swiftspec.engine import Engine

    v1 = hub["tiny/llama"]["v1"]
    assert fetch_hub_model("tiny/llama@v1") == v1 == fetch_hub_model(f"tiny/llama@{COMMITS['v1']}")
    with Engine("tiny/llama@v1", dtype="float32", max_context=256) as engine:
        got = engine.generate(PROMPT, max_new_tokens=12, stop=None).token_ids
        assert COMMITS["v1"][:12] in engine.target_dir.name
    want = _hf_greedy(v1, PROMPT, 12)
    assert got == want and len(want) == 12
    assert want != _hf_greedy(hub["tiny/llama"]["main"], PROMPT, 12)  # (so the revision is what decided)


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "swiftspec.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )


def test_cli_takes_hub_ids_as_target_and_draft(hub):
    """`swiftspec generate --target <id> --draft <id>@v1`, offline from the hub cache: speculative
    greedy decoding gives the target's own tokens (as --target alone does)."""
    args = [
        "generate",
        "--target",
        "tiny/llama",
        "--max-new-tokens",
        "12",
        "--max-context",
        "256",
        "--dtype",
        "float32",
        "--raw",
        "--json",
        "def fib(n):",
    ]
    alone = _cli(*args)
    assert alone.returncode == 0, alone.stderr
    spec = _cli(*args, "--draft", "tiny/llama@v1")
    assert spec.returncode == 0, spec.stderr
    assert "loading target tiny/llama and draft tiny/llama@v1" in spec.stderr
    ids = json.loads(alone.stdout)["token_ids"]
    assert json.loads(spec.stdout)["token_ids"] == ids and json.loads(spec.stdout)["stats"]["draft_steps"] > 0
    from tokenizers import Tokenizer

    main = hub["tiny/llama"]["main"]
    prompt = Tokenizer.from_file(str(main / "tokenizer.json")).encode("def fib(n):").ids
    assert ids == _hf_greedy(main, prompt, 12)


# --------------------------------------------------------------------------------- errors
def test_a_repository_without_weights_is_one_line_naming_it(hub):
    with pytest.raises(CheckpointError) as exc:
        fetch_hub_model("tiny/no-weights")
    assert str(exc.value) == (
        f"tiny/no-weights: the Hugging Face repository 'tiny/no-weights' (commit {COMMITS['main']}) has no "
        "*.safetensors weights, which swiftspec converts (for a repository of GGUF files, download one .gguf file "
        "and give its path; PyTorch .bin weights are not read)"
    )


def test_offline_without_the_model_is_one_line_naming_it(hub):
    cache = os.environ["HF_HUB_CACHE"]
    for model, where in [("tiny/absent", "tiny/absent"), ("tiny/llama@v2", "revision 'v2' of 'tiny/llama'")]:
        with pytest.raises(FetchError) as exc:
            fetch_hub_model(model)
        assert str(exc.value) == (
            f"{model}: no such local file or folder, and {where} is not in the Hugging Face "
            f"cache ({cache}), and HF_HUB_OFFLINE is set, so the hub was not asked: unset it to "
            "download the model, or give a local folder"
        )


@contextlib.contextmanager
def _stand_in_hub():
    """An HTTP server on 127.0.0.1 answering as the hub does for what it does not have: 404 with
    X-Error-Code RevisionNotFound for a revision of tiny/llama, RepoNotFound for anything else."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            code = "RevisionNotFound" if self.path.startswith("/api/models/tiny/llama/revision/") else "RepoNotFound"
            body = json.dumps({"error": code}).encode()
            self.send_response(404)
            self.send_header("X-Error-Code", code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_HEAD = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_cli_errors_are_one_line_naming_the_id(hub, tmp_path):
    """Through `swiftspec generate` (a fresh process: huggingface_hub reads HF_HUB_OFFLINE and
    HF_ENDPOINT from the environment): exit status 2 and one line naming the id, for an id the hub
    does not have, a revision it does not have, no network (nothing listens at HF_ENDPOINT),
    offline without the model, and a repository without weights."""
    with socket_closed_port() as dead, _stand_in_hub() as hub_url:
        cases = [
            (
                "tiny/absent",
                {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": hub_url},
                "tiny/absent: no such local file or folder, and the Hugging Face hub has no model 'tiny/absent' (or it is "
                "private: log in with hf auth login, or set HF_TOKEN)",
            ),
            (
                "tiny/llama@v9",
                {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": hub_url},
                "tiny/llama@v9: the Hugging Face model 'tiny/llama' has no revision 'v9' (give a branch, a tag or a commit "
                "hash)",
            ),
            (
                "tiny/absent",
                {"HF_HUB_OFFLINE": "0", "HF_ENDPOINT": dead},
                f"tiny/absent: no such local file or folder, and tiny/absent is not in the Hugging Face cache "
                f"({os.environ['HF_HUB_CACHE']}), and the hub cannot be reached (ConnectError: [Errno 111] Connection "
                "refused): connect to the network (or set HF_ENDPOINT to a mirror), or download the model elsewhere and "
                "give its folder",
            ),
            (
                "tiny/absent",
                {},
                "tiny/absent: no such local file or folder, and tiny/absent is not in the Hugging Face "
                f"cache ({os.environ['HF_HUB_CACHE']}), and HF_HUB_OFFLINE is set, so the hub was not asked",
            ),
            (
                "tiny/no-weights",
                {},
                "tiny/no-weights: the Hugging Face repository 'tiny/no-weights' (commit "
                f"{COMMITS['main']}) has no *.safetensors weights",
            ),
        ]
        for model, env, message in cases:
            done = _cli("generate", "--target", model, "--max-new-tokens", "1", "hi", env=env)
            lines = done.stderr.splitlines()
            assert done.returncode == 2 and lines[-1].startswith(f"swiftspec generate: error: {message}"), done.stderr
            assert "Traceback" not in done.stderr and not any(line.startswith("  ") for line in lines), done.stderr


@contextlib.contextmanager
def socket_closed_port():
    """The URL of a loopback port nothing listens on (bound, then closed: connections are refused)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield f"http://127.0.0.1:{port}"


def test_only_what_the_conversion_reads_is_downloaded():
    """The patterns handed to the hub: config, generation config, safetensors and their index, the
    tokenizer files and the chat template; not PyTorch .bin, GGUF or ONNX weights."""
    from huggingface_hub.utils import filter_repo_objects

    repo = [
        "config.json",
        "generation_config.json",
        "model-00001-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
        "pytorch_model.bin",
        "model.gguf",
        "onnx/model.onnx",
        "README.md",
        ".gitattributes",
    ]
    assert list(filter_repo_objects(repo, allow_patterns=list(HUB_FILES))) == repo[:8]
