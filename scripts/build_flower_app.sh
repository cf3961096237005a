#!/usr/bin/env bash
# Builds what the Flower App (examples/flower_app) needs to find tff-mf, which is on no package
# registry: tff-mf's wheel, dist/tff_mf-<version>-py3-none-any.whl (.venv-flower's pip), and
# examples/flower_app/uv.toml (written here, not tracked), whose find-links points uv at it:
# `flwr run` installs the App's dependencies with `uv sync` into a fresh environment per run.
#
# --wheelhouse: also fills dist/wheelhouse/ with the wheels of requirements/flower-lock.txt for
# CPython 3.11-3.13 on Linux x86_64 (uv resolves for every Python the App allows), so that
# `flwr run` needs no registry: start it with UV_OFFLINE=1 UV_NO_INDEX=1
# UV_FIND_LINKS=$PWD/dist/wheelhouse (examples/flower_app/README.md). Kept while the lock is
# unchanged.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
python="$(cd .venv-flower && pwd -P)/bin/python"
export PIP_DISABLE_PIP_VERSION_CHECK=1
mkdir -p dist
rm -f dist/tff_mf-*.whl
"$python" -m pip wheel --quiet --no-deps --wheel-dir dist . 2>&1 | { grep -v "^WARNING: Location" || true; } >&2
wheel="$(ls dist/tff_mf-*.whl)"
"$python" - "$root/dist" examples/flower_app/uv.toml <<'PY'
import json, sys
with open(sys.argv[2], "w", encoding="utf-8") as f:
  f.write("# Written by `make flower-app` (not tracked): uv, which `flwr run` installs the App's\n"
          "# dependencies with, finds tff-mf's wheel here (tff-mf is on no package registry).\n"
          f"find-links = [{json.dumps(sys.argv[1])}]\n")
PY
echo "[flower-app] built $wheel; examples/flower_app/uv.toml points uv at $root/dist" >&2
if [[ "${1:-}" == "--wheelhouse" ]]; then
  house="dist/wheelhouse"
  lock="requirements/flower-lock.txt"
  stamp="$(sha256sum "$lock" | cut -d' ' -f1)"
  if [[ ! -f "$house/.stamp" || "$(cat "$house/.stamp")" != "$stamp" ]]; then
    rm -rf "$house"
    for version in 3.11 3.12 3.13; do
      platforms=()
      for p in manylinux_2_{5,17,24,27,28,31,34}_x86_64 manylinux1_x86_64 manylinux2014_x86_64 linux_x86_64; do
        platforms+=(--platform "$p")
      done
      "$python" -m pip download --quiet --no-deps --only-binary=:all: --python-version "$version" \
        "${platforms[@]}" -r "$lock" -d "$house" 2>&1 | { grep -v "^WARNING: Location" || true; } >&2
    done
    echo "$stamp" > "$house/.stamp"
  fi
  cp "$wheel" "$house/"
  echo "[flower-app] $house holds the Flower lock's wheels and tff-mf's" >&2
fi
