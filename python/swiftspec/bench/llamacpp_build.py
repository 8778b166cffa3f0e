"""Builds llama.cpp, the peer of ``swiftspec bench --peers llamacpp``, once per machine and backend.

The source is the llama.cpp tree that the ``llama-cpp-python`` sdist vendors (``vendor/llama.cpp``),
pinned by version (:data:`LLAMA_CPP_PYTHON_VERSION`) and, for the downloaded archive, by sha256
(:data:`SDIST_SHA256`). Where the sdist comes from, first that applies:

1. the ``sdist`` argument, else the environment variable ``SWIFTSPEC_LLAMACPP_SDIST``: the
   ``.tar.gz`` (checked against :data:`SDIST_SHA256`) or the folder it unpacks to (its ``PKG-INFO``
   must name version 0.3.36; a copy holding only ``PKG-INFO`` and ``vendor/llama.cpp`` will do,
   e.g. :func:`pack_source`'s 7 MB archive unpacked). This is how a machine without network access
   builds (the GPU machine);
2. ``<cache>/llamacpp/llama_cpp_python-0.3.36.tar.gz``, kept from an earlier download;
3. ``pip download --no-deps --no-binary llama-cpp-python llama-cpp-python==0.3.36`` into that
   place (pip's configuration applies: index, proxy, certificates).

The build (CMake; Ninja when installed, else Make) makes the static executables
:data:`TARGETS` with the CPU backend (``-march=native``) or, for ``backend="cuda"``, with
``-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90`` too, and keeps them in
``<cache>/llamacpp/<version>-<backend>-<key>/bin/`` next to ``build.json`` (the CMake options,
the compilers, the build time) and ``build.log``. ``<key>`` hashes the CMake options, the compiler
versions and, since the CPU code is built for this processor, the CPU model and flags: another
machine or toolchain sharing the cache builds its own. The build tree is deleted afterwards, and a
failed or interrupted build leaves no folder a later call would take for a finished one. Two
processes asking for the same build wait for one another (a file lock). ``<cache>`` is
:func:`swiftspec.paths.cache_dir` (``$SWIFTSPEC_CACHE``, default ``~/.cache/swiftspec``).

The CPU build (the three programs and their libraries) takes minutes on 2 idle cores, several times
that while other builds share them; the CUDA build takes minutes on the GPU machine's 16 cores
(README.md, "Measure", for the times measured).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from swiftspec.errors import SwiftspecError

#: The llama-cpp-python release whose vendored llama.cpp is built.
LLAMA_CPP_PYTHON_VERSION = "0.3.36"
#: sha256 of its sdist on PyPI (llama_cpp_python-0.3.36.tar.gz, 76589250 bytes).
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
SDIST_NAME = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
#: The environment variable naming a local sdist (archive or unpacked folder).
SDIST_ENV = "SWIFTSPEC_LLAMACPP_SDIST"
#: The executables built: llama-bench (prefill / decode at depth), llama-speculative-simple
#: (draft-model speculation) and llama-completion (plain generation of a prompt).
TARGETS = ("llama-bench", "llama-speculative-simple", "llama-completion")
BACKENDS = ("cpu", "cuda")
#: CMake options of every build (no tests, server, web UI, HTTPS or ccache; static executables).
COMMON_CMAKE_ARGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_EXAMPLES=ON",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_CCACHE=OFF",
    "-DGGML_NATIVE=ON",
)
#: Added for ``backend="cuda"`` (Hopper: the H100 / H200 of the GPU machine).
CUDA_CMAKE_ARGS = ("-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90")
_SRC_IN_SDIST = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp"


class LlamaCppBuildError(SwiftspecError, RuntimeError):
    """llama.cpp cannot be built here: a tool is missing, the sdist cannot be had, or the build
    failed (the message names which, and where the log is)."""


@dataclass(frozen=True)
class LlamaCppBuild:
    """A finished build: ``bin_dir`` holds :data:`TARGETS`; ``info`` is its build.json."""

    root: Path
    backend: str
    info: dict

    @property
    def bin_dir(self) -> Path:
        return self.root / "bin"

    def binary(self, name: str) -> Path:
        """Path of the executable ``name`` (one of :data:`TARGETS`). Raises LlamaCppBuildError if
        it is not there."""
        path = self.bin_dir / name
        if not path.is_file():
            raise LlamaCppBuildError(f"{path} is missing from the llama.cpp build in {self.root}")
        return path


def _cache_root(cache: Path | str | None) -> Path:
    from swiftspec.paths import cache_dir

    return (Path(cache) if cache is not None else cache_dir()) / "llamacpp"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(4 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _first_line(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
    return (lines[-1] if "nvcc" in cmd[0] else lines[0]) if out.returncode == 0 and lines else None


def _cpu_identity() -> str:
    """CPU model and flags (the CPU backend is compiled with -march=native for them)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    model = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
    flags = re.search(r"^(?:flags|Features)\s*:\s*(.*)$", text, re.M)
    return f"{model.group(1) if model else platform.machine()} | {flags.group(1) if flags else ''}"


def _tools(backend: str) -> dict:
    """The build tools, or LlamaCppBuildError naming the missing one and how to get it."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise LlamaCppBuildError(
            "building llama.cpp needs cmake, which is not on PATH: pip install cmake "
            "(pip install '.[test]' installs it)"
        )
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cc is None or cxx is None:
        raise LlamaCppBuildError(
            "building llama.cpp needs a C and a C++ compiler (cc and c++ on PATH, or CC / CXX); "
            f"found C: {cc}, C++: {cxx} (e.g. apt-get install build-essential)"
        )
    tools = {"cmake": cmake, "cc": cc, "cxx": cxx, "ninja": shutil.which("ninja")}
    if backend == "cuda":
        nvcc = (
            os.environ.get("CUDACXX")
            or shutil.which("nvcc")
            or ("/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else None)
        )
        if nvcc is None:
            raise LlamaCppBuildError(
                "building llama.cpp with CUDA needs nvcc (on PATH, in /usr/local/cuda/bin or named by CUDACXX)"
            )
        tools["nvcc"] = nvcc
    return tools


def _cmake_args(backend: str) -> list[str]:
    return list(COMMON_CMAKE_ARGS) + (list(CUDA_CMAKE_ARGS) if backend == "cuda" else [])


def build_key(backend: str, tools: dict | None = None) -> str:
    """``<version>-<backend>-<12 hex digits>``: the build's folder name under ``<cache>/llamacpp``.
    The digits hash the CMake options, the compilers' versions and this CPU's model and flags."""
    tools = tools or _tools(backend)
    ident = {
        "version": LLAMA_CPP_PYTHON_VERSION,
        "backend": backend,
        "cmake_args": _cmake_args(backend),
        "cc": _first_line([tools["cc"], "--version"]),
        "cxx": _first_line([tools["cxx"], "--version"]),
        "nvcc": _first_line([tools["nvcc"], "--version"]) if "nvcc" in tools else None,
        "cpu": _cpu_identity(),
        "machine": platform.machine(),
    }
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:12]
    return f"{LLAMA_CPP_PYTHON_VERSION}-{backend}-{digest}"


def _folder_version(folder: Path) -> str | None:
    try:
        text = (folder / "PKG-INFO").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    m = re.search(r"^Version:\s*(\S+)", text, re.M)
    return m.group(1) if m else None


def _check_sdist(path: Path, where: str) -> Path:
    """``path`` (an archive or an unpacked sdist folder) checked; returns it. Raises LlamaCppBuildError."""
    if path.is_dir():
        version = _folder_version(path)
        if version != LLAMA_CPP_PYTHON_VERSION:
            raise LlamaCppBuildError(
                f"{where} {path}: not the unpacked llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist "
                f"(its PKG-INFO names version {version!r})"
            )
        if not (path / "vendor" / "llama.cpp" / "CMakeLists.txt").is_file():
            raise LlamaCppBuildError(f"{where} {path}: has no vendor/llama.cpp/CMakeLists.txt (the llama.cpp source)")
        return path
    if not path.is_file():
        raise LlamaCppBuildError(f"{where} {path}: no such file or folder")
    digest = _sha256(path)
    if digest != SDIST_SHA256:
        raise LlamaCppBuildError(
            f"{where} {path}: sha256 {digest}, but the llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} "
            f"sdist has {SDIST_SHA256}"
        )
    return path


def find_sdist(sdist: str | Path | None = None, cache: Path | str | None = None, progress: bool = True) -> Path:
    """The llama-cpp-python sdist to build from (archive or unpacked folder), downloading it into
    ``<cache>/llamacpp/`` when neither ``sdist`` nor ``$SWIFTSPEC_LLAMACPP_SDIST`` names one and no
    earlier download is there (module docstring).

    Raises:
        LlamaCppBuildError: the named sdist does not exist, is another version or fails its sha256;
            pip cannot download it (no network: the message says how to give a local copy).
    """
    if sdist is not None:
        return _check_sdist(Path(sdist).expanduser(), "sdist")
    if os.environ.get(SDIST_ENV):
        return _check_sdist(Path(os.environ[SDIST_ENV]).expanduser(), f"${SDIST_ENV}")
    root = _cache_root(cache)
    kept = root / SDIST_NAME
    if kept.is_file():
        if _sha256(kept) == SDIST_SHA256:
            return kept
        kept.unlink()  # a damaged copy: fetch it again
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".download-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            "llama-cpp-python",
            "--disable-pip-version-check",
            "--no-input",
            "-d",
            tmp,
            f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
        ]
        if progress:
            print(
                f"[llamacpp] downloading the llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist (77 MB) with pip",
                file=sys.stderr,
                flush=True,
            )
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        got = Path(tmp) / SDIST_NAME
        if proc.returncode != 0 or not got.is_file():
            tail = "\n".join(proc.stdout.strip().splitlines()[-6:])
            raise LlamaCppBuildError(
                f"could not download the llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist with pip (exit code "
                f"{proc.returncode}; no network?): download it where there is one (pip download --no-deps --no-binary "
                f"llama-cpp-python llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}) and name the file in ${SDIST_ENV}. "
                f"pip said:\n{tail}"
            )
        _check_sdist(got, "the downloaded sdist")
        os.replace(got, kept)
    return kept


def _unpack_source(sdist: Path, dest: Path) -> Path:
    """The llama.cpp source tree of ``sdist`` (a folder: itself; an archive: unpacked into ``dest``)."""
    if sdist.is_dir():
        return sdist / "vendor" / "llama.cpp"
    prefix = _SRC_IN_SDIST + "/"
    with tarfile.open(sdist, "r:gz") as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        if not members:
            raise LlamaCppBuildError(f"{sdist} holds no {_SRC_IN_SDIST}/")
        tar.extractall(dest, members=members, filter="data")
    return dest / _SRC_IN_SDIST


#: Parts of llama.cpp's tree a build of :data:`TARGETS` does not read (model vocabularies for its
#: tests, documentation, the web UI, other GPU backends, mobile examples): left out of
#: :func:`pack_source`'s archive.
_NOT_BUILT = (
    "models",
    "docs",
    "tests",
    "media",
    "gguf-py",
    "benches",
    "tools/ui",
    "skills",
    "ggml/src/ggml-sycl",
    "ggml/src/ggml-vulkan",
    "ggml/src/ggml-opencl",
    "examples/llama.android",
    "examples/llama.swiftui",
)


def pack_source(dest: str | Path, sdist: str | Path | None = None, cache: Path | str | None = None) -> Path:
    """Writes ``dest`` (a .tar.gz, about 7 MB): the sdist's ``PKG-INFO`` and the part of its
    ``vendor/llama.cpp`` that the build reads, under ``llama_cpp_python-0.3.36/``. Unpacked, the
    folder is an sdist that :func:`ensure_llamacpp` builds from (``$SWIFTSPEC_LLAMACPP_SDIST``):
    small enough to carry to a machine without network access, where the 77 MB sdist is not.

    Raises:
        LlamaCppBuildError: the sdist cannot be had (:func:`find_sdist`) or ``dest`` cannot be written.
    """
    source = find_sdist(sdist, cache, progress=False)
    top = f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}"
    skip = tuple(f"{_SRC_IN_SDIST}/{part}" for part in _NOT_BUILT) + (f"{_SRC_IN_SDIST}/.git",)

    def wanted(name: str) -> bool:
        return name == f"{top}/PKG-INFO" or (
            name.startswith(_SRC_IN_SDIST + "/") and not any(name == s or name.startswith(s + "/") for s in skip)
        )

    dest = Path(dest)
    try:
        with tarfile.open(dest, "w:gz") as out:
            if source.is_dir():
                for path in sorted(source.rglob("*")):
                    name = f"{top}/{path.relative_to(source).as_posix()}"
                    if path.is_file() and wanted(name):
                        out.add(path, arcname=name, recursive=False)
            else:
                with tarfile.open(source, "r:gz") as tar:
                    for member in tar:
                        if member.isfile() and wanted(member.name):
                            out.addfile(member, tar.extractfile(member))
    except OSError as exc:
        raise LlamaCppBuildError(f"cannot write {dest}: {exc}") from None
    return dest


@contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _run_logged(cmd: list[str], log, cwd: Path | None = None, env: dict | None = None) -> int:
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=cwd, env=env)
    log.write(f"[exit code {proc.returncode}]\n")
    log.flush()
    return proc.returncode


def _tail(path: Path, n: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def cached_build(backend: str = "cpu", cache: Path | str | None = None) -> LlamaCppBuild | None:
    """The finished build for ``backend`` on this machine, or None (nothing is built or downloaded).
    Raises LlamaCppBuildError for an unknown backend or a missing build tool."""
    if backend not in BACKENDS:
        raise LlamaCppBuildError(f"llama.cpp backend must be cpu or cuda, got {backend!r}")
    root = _cache_root(cache) / build_key(backend)
    info_path = root / "build.json"
    if not info_path.is_file() or not all((root / "bin" / t).is_file() for t in TARGETS):
        return None
    return LlamaCppBuild(root, backend, json.loads(info_path.read_text()))


def ensure_llamacpp(
    backend: str = "cpu",
    sdist: str | Path | None = None,
    cache: Path | str | None = None,
    jobs: int | None = None,
    progress: bool = True,
) -> LlamaCppBuild:
    """The llama.cpp build for ``backend`` ("cpu" or "cuda"), built first if this machine has none
    (module docstring: the source, the options, the cache).

    Args:
        backend: "cpu" (the CPU backend only) or "cuda" (with the CUDA backend, sm_90).
        sdist: a local llama-cpp-python 0.3.36 sdist (archive or unpacked folder); default
            ``$SWIFTSPEC_LLAMACPP_SDIST``, else the cached or downloaded one (:func:`find_sdist`).
        cache: the cache root (default :func:`swiftspec.paths.cache_dir`).
        jobs: parallel compile jobs (default: the CPUs this process may use).
        progress: say on stderr what is being done (a build takes minutes).

    Returns:
        The :class:`LlamaCppBuild` (``bin_dir`` holds :data:`TARGETS`; ``info["build_seconds"]``
        is how long it took to configure and compile).

    Raises:
        LlamaCppBuildError: an unknown backend; cmake, a C/C++ compiler or (cuda) nvcc missing; the
            sdist cannot be had (:func:`find_sdist`); configuring or compiling failed (the message
            quotes the end of the log and names the file keeping all of it).
    """
    if backend not in BACKENDS:
        raise LlamaCppBuildError(f"llama.cpp backend must be cpu or cuda, got {backend!r}")
    tools = _tools(backend)
    key = build_key(backend, tools)
    root = _cache_root(cache)
    final = root / key
    with _locked(root / f".{key}.lock"):
        done = cached_build(backend, cache)
        if done is not None:
            return done
        source_archive = find_sdist(sdist, cache, progress)
        jobs = jobs or len(os.sched_getaffinity(0))
        work = root / f".{key}.{os.getpid()}.build"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        failed_log = root / f"{key}.failed.log"
        try:
            if progress:
                print(
                    f"[llamacpp] building llama.cpp {LLAMA_CPP_PYTHON_VERSION} ({backend}) into {final} with {jobs} "
                    f"jobs; minutes (log: {work / 'build.log'})",
                    file=sys.stderr,
                    flush=True,
                )
            t0 = time.perf_counter()
            src = _unpack_source(source_archive, work / "src")
            build_dir = work / "build"
            args = _cmake_args(backend)
            configure = [
                tools["cmake"],
                "-S",
                str(src),
                "-B",
                str(build_dir),
                f"-DCMAKE_C_COMPILER={tools['cc']}",
                f"-DCMAKE_CXX_COMPILER={tools['cxx']}",
                *args,
            ]
            if tools["ninja"]:
                configure += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={tools['ninja']}"]
            if "nvcc" in tools:
                configure.append(f"-DCMAKE_CUDA_COMPILER={tools['nvcc']}")
            env = {k: v for k, v in os.environ.items() if k not in ("CMAKE_ARGS", "MAKEFLAGS")}
            with open(work / "build.log", "w") as log:
                if _run_logged(configure, log, env=env) != 0:
                    raise LlamaCppBuildError("configuring llama.cpp failed")
                build = [tools["cmake"], "--build", str(build_dir), "-j", str(jobs), "--target", *TARGETS]
                if _run_logged(build, log, env=env) != 0:
                    raise LlamaCppBuildError("compiling llama.cpp failed")
            seconds = time.perf_counter() - t0
            out = work / "out"
            (out / "bin").mkdir(parents=True)
            for t in TARGETS:
                built = build_dir / "bin" / t
                if not built.is_file():
                    raise LlamaCppBuildError(f"the llama.cpp build made no {built}")
                shutil.copy2(built, out / "bin" / t)
            shutil.copy2(work / "build.log", out / "build.log")
            info = {
                "llama_cpp_python": LLAMA_CPP_PYTHON_VERSION,
                "backend": backend,
                "key": key,
                "cmake_args": args,
                "generator": "Ninja" if tools["ninja"] else "Unix Makefiles",
                "jobs": jobs,
                "compilers": {k: _first_line([tools[k], "--version"]) for k in ("cc", "cxx", "nvcc") if k in tools},
                "ggml_commit": _ggml_commit(work / "build.log"),
                "source": str(source_archive),
                "build_seconds": round(seconds, 1),
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            }
            (out / "build.json").write_text(json.dumps(info, indent=1) + "\n")
            if final.exists():
                shutil.rmtree(final)
            os.replace(out, final)
            failed_log.unlink(missing_ok=True)
        except LlamaCppBuildError as exc:
            if (work / "build.log").is_file():
                shutil.copy2(work / "build.log", failed_log)
                raise LlamaCppBuildError(
                    f"{exc} (backend {backend}); the end of the log:\n{_tail(failed_log)}\nwhole log: {failed_log}"
                ) from None
            raise
        finally:
            shutil.rmtree(work, ignore_errors=True)
        if progress:
            print(f"[llamacpp] built in {seconds / 60:.1f} min: {final / 'bin'}", file=sys.stderr, flush=True)
        return LlamaCppBuild(final, backend, info)


def _ggml_commit(log_path: Path) -> str | None:
    m = re.search(r"ggml commit:\s*(\S+)", log_path.read_text(errors="replace"))
    return m.group(1) if m else None
