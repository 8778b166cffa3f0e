"""Where a benchmark ran: machine, CPU, memory, GPUs, software versions and the git commit.

Every recorded number carries this block (benchmarks/README.md: date, machine, commit, command).
Nothing here fails: a fact that cannot be read is reported as None.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import socket
import subprocess
import sys
from pathlib import Path


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def cpu_info() -> dict:
    """CPU model, logical CPUs usable by this process, physical cores, and a few ISA flags
    that matter for the CPU backend (avx2, avx512f, avx512_bf16, amx_bf16)."""
    text = _read("/proc/cpuinfo") or ""
    model = None
    flags: set[str] = set()
    cores = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "model name" and model is None:
            model = value
        elif key == "flags" and not flags:
            flags = set(value.split())
        elif key == "core id":
            cores.add(value)
    if model is None:
        model = platform.processor() or None
    usable: int | None
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = os.cpu_count()
    return {
        "model": model,
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable,
        "physical_cores": len(cores) or None,
        "flags": sorted(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "fma") if f in flags),
    }


def memory_gib() -> float | None:
    """Total RAM in GiB (from /proc/meminfo), or None."""
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            return round(int(line.split()[1]) / 1024**2, 2)
    return None


def gpu_info() -> list[dict]:
    """The GPUs ``nvidia-smi`` lists (name, memory MiB, driver, compute capability); [] if none."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version,compute_cap", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4:
            gpus.append(
                {
                    "name": parts[0],
                    "memory_mib": _int_or_none(parts[1]),
                    "driver": parts[2],
                    "compute_capability": parts[3],
                }
            )
    return gpus


def _int_or_none(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None


def repo_root() -> Path | None:
    """The git work tree this package comes from, or None: the tree holding it (editable
    installs, a source checkout on sys.path), else the local folder pip installed it from when
    that is a git work tree (pip records it in the distribution's direct_url.json, PEP 610)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        if (parent / ".git").exists():
            return parent
    try:
        from importlib.metadata import PackageNotFoundError, distribution

        text = distribution("swiftspec").read_text("direct_url.json")
    except (PackageNotFoundError, OSError):
        return None
    try:
        url = json.loads(text or "{}").get("url", "")
    except ValueError:
        return None
    if url.startswith("file://"):
        from urllib.parse import unquote, urlparse

        source = Path(unquote(urlparse(url).path))
        if (source / ".git").exists():
            return source
    return None


def _git(root: Path, *args: str, strip: bool = True) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=20, check=True
        ).stdout
        return out.strip() if strip else out
    except (OSError, subprocess.SubprocessError):
        return None


def commit_info(root: Path | None = None) -> dict:
    """``{"sha", "short", "branch", "dirty", "dirty_files"}`` of the work tree this package runs
    from (or of ``root``, e.g. the checkout holding a script of ``tools/``). ``dirty`` counts
    modified tracked files (untracked files are ignored: they are other people's work in progress
    more often than not); all None outside a git checkout. The
    environment variable SWIFTSPEC_COMMIT, if set, gives the sha instead (a copy on a GPU machine
    has no .git of its own; tools/gpu_e2e.sh sets it), the rest then None."""
    env_sha = os.environ.get("SWIFTSPEC_COMMIT") or None
    root = root or repo_root()
    if root is None or env_sha:
        return {
            "sha": env_sha,
            "short": env_sha[:10] if env_sha else None,
            "branch": None,
            "dirty": None,
            "dirty_files": [],
        }
    sha = _git(root, "rev-parse", "HEAD")
    status = _git(root, "status", "--porcelain", "--untracked-files=no", strip=False)
    files = [line[3:] for line in (status or "").splitlines() if line.strip()]
    return {
        "sha": sha,
        "short": sha[:10] if sha else None,
        "branch": _git(root, "rev-parse", "--abbrev-ref", "HEAD"),
        "dirty": bool(files) if status is not None else None,
        "dirty_files": files[:50],
    }


def commit_label(root: Path | None = None) -> str:
    """One-line commit of a record: the short sha, " (dirty)" when tracked files are modified,
    "unknown" outside a checkout without SWIFTSPEC_COMMIT (see :func:`commit_info`)."""
    info = commit_info(root)
    if not info["short"]:
        return "unknown"
    return info["short"] + (" (dirty)" if info["dirty"] else "")


def software_versions() -> dict:
    """Versions of Python and the packages whose speed we measure (None if not installed)."""
    from importlib import metadata

    versions: dict[str, str | None] = {"python": platform.python_version()}
    for pkg in ("swiftspec", "numpy", "torch", "transformers", "accelerate"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return versions


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages (other jobs on the machine make timings noisier)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def machine_info() -> dict:
    """The ``machine`` block of a benchmark JSON (see :mod:`swiftspec.bench.schema`)."""
    return {
        "hostname": socket.gethostname(),
        "os": f"{platform.system()} {platform.release()}",
        "cpu": cpu_info(),
        "memory_gib": memory_gib(),
        "gpus": gpu_info(),
        "software": software_versions(),
        "load_average_start": load_average(),
        "busy_processes_start": busy_processes(),
    }


def now_utc() -> str:
    """The current time, ISO 8601 UTC to the second (e.g. 2026-11-29T09:12:03Z)."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def command_line(argv: list[str] | None = None) -> str:
    """The command as typed (shell-quoted), for the record."""
    argv = list(sys.argv if argv is None else argv)
    if argv and argv[0].endswith(("/swiftspec", "swiftspec")):
        argv[0] = "swiftspec"
    return " ".join(shlex.quote(a) for a in argv)


def busy_processes(interval_s: float = 1.0, min_cpu_percent: float = 20.0) -> list[dict]:
    """Other processes using at least ``min_cpu_percent`` of one core over ``interval_s``
    seconds (from /proc; [] where unavailable): ``{"pid", "cpu_percent", "command"}``, busiest
    first. Recorded next to timings so a noisy machine is visible in the record."""
    import time

    def sample() -> dict[int, int]:
        ticks = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                fields = stat[stat.rindex(")") + 2 :].split()
                ticks[int(entry.name)] = int(fields[11]) + int(fields[12])  # utime + stime
            except (OSError, ValueError, IndexError):
                continue
        return ticks

    try:
        hz = os.sysconf("SC_CLK_TCK")
        before = sample()
        time.sleep(interval_s)
        after = sample()
    except (OSError, ValueError, AttributeError):
        return []
    me = os.getpid()
    busy = []
    for pid, t in after.items():
        if pid == me or pid not in before:
            continue
        pct = 100.0 * (t - before[pid]) / hz / interval_s
        if pct >= min_cpu_percent:
            try:
                cmd = (
                    (Path("/proc") / str(pid) / "cmdline")
                    .read_bytes()
                    .replace(b"\0", b" ")
                    .decode(errors="replace")
                    .strip()
                )
            except OSError:
                cmd = "?"
            busy.append({"pid": pid, "cpu_percent": round(pct, 1), "command": cmd[:160]})
    return sorted(busy, key=lambda p: -p["cpu_percent"])
