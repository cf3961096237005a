#!/usr/bin/env bash
# Creates (or refreshes) the virtual environment .venv/ at the repository root
# from the pinned lock files and installs tff-mf (with its `tff-mf` console
# script) into it. Idempotent: a venv whose stamp matches the lock files is kept.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv"
# The interpreter: $PYTHON if set, else the first python3.11 on PATH, else python3.
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null 2>&1 || python=python3
if ! command -v "$python" >/dev/null 2>&1; then
  echo "[bootstrap] no Python found: install Python 3.11 or set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
  echo "[bootstrap] tff-mf needs Python 3.11, $(command -v "$python") is $("$python" -V 2>&1); set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
stamp_want="$(cat requirements/bootstrap.txt requirements/lock.txt requirements/lock-nodeps.txt setup.cfg pyproject.toml | sha256sum | cut -d' ' -f1)"
stamp_file="$venv/.tff_mf_stamp"
if [[ -x "$venv/bin/python" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp_want" ]]; then
  # Environment is current; make sure the editable install of the project is too.
  # The editable install must resolve tff_mf to this checkout from any directory (the
  # harness packages training/ and stackoverflow/ are not installed; they run from here).
  if (cd / && "$venv/bin/python" -c 'import os, sys, tff_mf.cli
sys.exit(os.path.dirname(os.path.dirname(os.path.abspath(tff_mf.__file__))) != sys.argv[1])' \
      "$root") >/dev/null 2>&1 && "$venv/bin/python" -c 'import training, stackoverflow' \
      >/dev/null 2>&1; then
    exit 0
  fi
  echo "[bootstrap] refreshing the editable install of tff-mf" >&2
  "$venv/bin/pip" install --quiet --no-deps --no-build-isolation -e .
  exit 0
fi
echo "[bootstrap] creating $venv from requirements/lock.txt with $(command -v "$python") ($("$python" -V 2>&1))" >&2
# A HOME that cannot be written (read-only, missing, not a directory): pip's cache and the
# wheel builds that write under HOME use a private temporary directory, for this step only.
if [[ ! -d "${HOME:-}" || ! -w "${HOME:-}" ]]; then
  build_home="$(mktemp -d)"
  trap 'rm -rf "$build_home"' EXIT
  echo "[bootstrap] HOME=${HOME:-(unset)} is not writable: pip builds under $build_home" >&2
  export HOME="$build_home" PIP_CACHE_DIR="$build_home/pip-cache"
fi
rm -rf "$venv"
"$python" -m venv "$venv"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# The lock files go in with the pinned uv of requirements/bootstrap.txt (parallel downloads,
# about 3x faster than pip from an empty cache), given pip's own index settings and the
# platform's certificate store; where uv cannot be installed or fails, pip installs the
# same pins.
install_with_pip() {
  "$venv/bin/pip" install --quiet -r requirements/lock.txt
  "$venv/bin/pip" install --quiet --no-deps -r requirements/lock-nodeps.txt
}
install_with_uv() {
  "$venv/bin/pip" install --quiet -r requirements/bootstrap.txt >/dev/null 2>&1 || return 1
  local uv=("$venv/bin/uv" pip install --quiet --system-certs --python "$venv/bin/python")
  # pip's index settings (config files, then PIP_* variables, which take precedence), read
  # from `pip config list` (values are Python literals), as uv flags one per line.
  local flags
  mapfile -t flags < <("$venv/bin/python" - "$venv/bin/pip" <<'PYEOF'
import ast, subprocess, sys
listed = subprocess.run([sys.argv[1], "config", "list"], capture_output=True, text=True).stdout
found = {}
for line in listed.splitlines():
    key, _, value = line.partition("=")
    section, _, name = key.rpartition(".")
    if name not in ("index-url", "extra-index-url", "find-links"):
        continue
    try:
        value = ast.literal_eval(value)
    except (ValueError, SyntaxError):
        continue
    rank = 1 if section == ":env:" else 0
    if name not in found or rank >= found[name][0]:
        found[name] = (rank, str(value))
for name, (_, value) in found.items():
    items = value.split()
    for item in items[:1] if name == "index-url" else items:
        print(f"--{name}")
        print(item)
PYEOF
)
  uv+=("${flags[@]}")
  "${uv[@]}" -r requirements/lock.txt && "${uv[@]}" --no-deps -r requirements/lock-nodeps.txt
}
if ! install_with_uv; then
  echo "[bootstrap] uv could not install the lock files: installing them with pip" >&2
  install_with_pip
fi
"$venv/bin/pip" install --quiet --no-deps --no-build-isolation -e .
echo "$stamp_want" > "$stamp_file"
echo "[bootstrap] ready: $venv/bin/tff-mf" >&2
