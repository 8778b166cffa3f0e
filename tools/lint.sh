#!/usr/bin/env bash
# The style checks (issue 30), run by CI before the tests (README "Run the tests"): ruff's lint and
# formatter on the Python code, clang-format on the C++ / CUDA code (.clang-format), mypy on
# python/swiftspec ([tool.mypy] in pyproject.toml), and no tracked file over 1 MiB. The tools are
# pinned in the test extra (pip install '.[test]'). Each prints what is wrong and the script stops
# at the first that fails; `tools/lint.sh --fix` applies ruff's and clang-format's fixes instead.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t cxx < <(git ls-files '*.cpp' '*.h' '*.cu' '*.cuh')
# Through the interpreter that installed them (console scripts may not be on PATH, e.g. pyenv shims).
PY=${PYTHON:-python3}
ruff() { "$PY" -m ruff "$@"; }
mypy() { "$PY" -m mypy "$@"; }
clang-format() { "$("$PY" -c 'import clang_format; print(clang_format.get_executable("clang-format"))')" "$@"; }
if [ "${1:-}" = "--fix" ]; then
  ruff check --fix .
  ruff format .
  clang-format -i "${cxx[@]}"
  exit 0
fi
echo "[lint] ruff check"; ruff check .
echo "[lint] ruff format --check"; ruff format --check .
echo "[lint] clang-format (${#cxx[@]} files)"; clang-format --dry-run -Werror "${cxx[@]}"
echo "[lint] mypy"; mypy
echo "[lint] large files"
big=$(git ls-files -z | xargs -0 -r du -b -- 2>/dev/null | awk '$1 > 1048576 {print $2 " (" $1 " bytes)"}')
if [ -n "$big" ]; then
  echo "tracked files over 1 MiB (keep raw outputs and models out of git):" >&2
  echo "$big" >&2
  exit 1
fi
echo "[lint] clean"
