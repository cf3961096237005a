#!/usr/bin/env bash
# Creates (or refreshes) .venv-docs/ at the repository root from requirements/docs-lock.txt: the
# documentation generator (mkdocs, Material, mkdocstrings-python, mkdocs-jupyter). It does not install
# tff_mf: mkdocstrings-python reads the library's source statically (griffe), so no TensorFlow here.
# Idempotent: a venv whose stamp matches the lock file and the interpreter is kept.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv-docs"
lock="requirements/docs-lock.txt"
# The interpreter: $DOCS_PYTHON if set, else python3.11 (the lock's pins are for 3.11: mkdocs-jupyter
# 0.27 needs 3.12, 0.26 is the newest for 3.11).
python="${DOCS_PYTHON:-python3.11}"
if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
  echo "[bootstrap-docs] $python is not a Python 3.11: set DOCS_PYTHON=/path/to/python3.11" >&2
  exit 1
fi
stamp_want="$(sha256sum < "$lock" | cut -d' ' -f1) $("$python" -V 2>&1)"
stamp_file="$venv/.tff_mf_docs_stamp"
if [[ -x "$venv/bin/mkdocs" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp_want" ]]; then
  exit 0
fi
echo "[bootstrap-docs] creating $venv from $lock with $(command -v "$python") ($("$python" -V 2>&1))" >&2
rm -rf "$venv"
"$python" -m venv "$venv"
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$venv/bin/pip" install --quiet -r "$lock"
echo "$stamp_want" > "$stamp_file"
