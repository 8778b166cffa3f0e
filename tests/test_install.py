"""What one `pip install .` gives: the design card's `import swiftspec_core` (the same module
object as `swiftspec.swiftspec_core`, with a docstring saying what it is), and the server's
packages with the CLI and the Python API. Each import check runs in a fresh interpreter, so no
module imported by another test decides the outcome."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _fresh_python(code: str) -> dict:
    """Runs ``code`` in a new interpreter (the installed swiftspec, as every test sees it) and
    returns the JSON object it prints."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd="/")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("first", ["swiftspec_core", "swiftspec.swiftspec_core"])
def test_import_swiftspec_core_is_the_extension_module(first):
    """`import swiftspec_core` works (whichever name is imported first) and is the very module
    `swiftspec.swiftspec_core`: the same object in sys.modules, with the runtime's classes."""
    other = "swiftspec.swiftspec_core" if first == "swiftspec_core" else "swiftspec_core"
    got = _fresh_python(f"""
import importlib, importlib.machinery, importlib.util, json, sys
alias_file = importlib.util.find_spec("swiftspec_core").origin  # (before the import replaces it)
a = importlib.import_module({first!r})
b = importlib.import_module({other!r})
import swiftspec, swiftspec_core
print(json.dumps({{
    "same": a is b and sys.modules["swiftspec_core"] is sys.modules["swiftspec.swiftspec_core"] is swiftspec.swiftspec_core,
    "extension": swiftspec_core.__file__.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)),
    "alias_file": alias_file,
    "package_dir": swiftspec.__path__[0],
    "names": [n for n in ("Engine", "Model", "ModelOptions", "load_model", "spec") if hasattr(swiftspec_core, n)],
    "doc": swiftspec_core.__doc__,
}}))
""")
    assert got["same"] is True and got["extension"] is True
    assert got["names"] == ["Engine", "Model", "ModelOptions", "load_model", "spec"]
    # installed at the top level beside the package (by the wheel, not found in the source tree)
    assert Path(got["alias_file"]).parent == Path(got["package_dir"]).parent
    assert Path(got["alias_file"]).name == "swiftspec_core.py"
    doc = got["doc"]
    assert doc.startswith("swiftspec_core: the C++ runtime of swiftspec, as a compiled (nanobind) extension module.")
    assert "`import swiftspec_core` and `from swiftspec import swiftspec_core` give this same module" in doc
    assert "swiftspec.Engine" in doc


def test_one_install_gives_the_server():
    """Starlette and uvicorn are pinned base dependencies (so `pip install .` gives `swiftspec
    serve` and nothing is built twice); the `serve` extra is kept, empty, so `pip install
    '.[serve]'` still works; and they are installed here."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    base = {d.split("==")[0]: d for d in project["dependencies"]}
    assert base["starlette"] == "starlette==1.7.0" and base["uvicorn"] == "uvicorn==0.54.0"
    assert base["huggingface-hub"] == "huggingface-hub==2.4.0"
    assert project["optional-dependencies"]["serve"] == []
    extras = project["optional-dependencies"]["test"]
    assert not any(d.startswith(("starlette", "uvicorn")) for d in extras)  # one pin, in the base
    got = _fresh_python("""
import json
from importlib import metadata
from swiftspec.serve import missing_modules
from swiftspec.serve.app import create_app
print(json.dumps({"missing": missing_modules(),
                  "versions": [metadata.version(m) for m in ("starlette", "uvicorn", "huggingface_hub")]}))
""")
    assert got == {"missing": [], "versions": ["1.7.0", "0.54.0", "2.4.0"]}
