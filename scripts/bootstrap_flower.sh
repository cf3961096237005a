#!/usr/bin/env bash
# Creates (or refreshes) .venv-flower/ at the repository root from requirements/flower-lock.txt:
# the Flower layer's environment (flwr, numpy 2, the core's dependencies; no TensorFlow).
# The repository root goes on the venv's path (a .pth file), so tff_mf is this checkout.
# Idempotent: a venv whose stamp matches the lock file is kept.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
venv="$root/.venv-flower"
lock="requirements/flower-lock.txt"
# Ray (Flower's simulation engine) starts its workers through a shell command line that does
# not quote the interpreter's path, so a checkout whose path has a space (or a tab) gets the
# venv in a space-free directory, and .venv-flower is a link to it (`make test-flower` runs the
# interpreter by its resolved path).
case "$root" in
  *" "* | *$'\t'*)
    base="${XDG_CACHE_HOME:-$HOME/.cache}"
    case "$base" in *" "* | *$'\t'*) base="/tmp/tff-mf-$(id -u)" ;; esac
    target="$base/tff-mf/venv-flower-$(printf '%s' "$root" | sha256sum | cut -c1-16)"
    mkdir -p "$(dirname "$target")"
    if [[ ! -L "$venv" || "$(readlink "$venv")" != "$target" ]]; then
      rm -rf "$venv"
      ln -s "$target" "$venv"
    fi
    venv="$target"
    ;;
esac
# The interpreter: $FLOWER_PYTHON if set, else the newest Python 3.13, 3.12 or 3.11 that runs:
# on PATH, or installed by pyenv (whose shims run only the versions a directory selects).
python="${FLOWER_PYTHON:-}"
if [[ -z "$python" ]]; then
  for version in 3.13 3.12 3.11; do
    for candidate in "python$version" "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$version".*/bin/"python$version"; do
      if "$candidate" -V >/dev/null 2>&1; then
        python="$candidate"
        break 2
      fi
    done
  done
fi
if [[ -z "$python" ]] || ! "$python" -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] <= (3, 13))' 2>/dev/null; then
  echo "[bootstrap-flower] no Python 3.11-3.13 found: set FLOWER_PYTHON=/path/to/python3.13" >&2
  exit 1
fi
stamp_want="$(cat "$lock" | sha256sum | cut -d' ' -f1) $("$python" -V 2>&1)"
stamp_file="$venv/.tff_mf_flower_stamp"
pth="tff_mf_checkout.pth"
if [[ -x "$venv/bin/python" && -f "$stamp_file" && "$(cat "$stamp_file")" == "$stamp_want" ]]; then
  "$venv/bin/python" -c 'import site, sys; open(site.getsitepackages()[0] + "/" + sys.argv[1], "w").write(sys.argv[2] + "\n")' "$pth" "$root"
  exit 0
fi
echo "[bootstrap-flower] creating $venv from $lock with $(command -v "$python") ($("$python" -V 2>&1))" >&2
rm -rf "$venv"
"$python" -m venv "$venv"
export PIP_DISABLE_PIP_VERSION_CHECK=1
"$venv/bin/pip" install --quiet -r "$lock"
"$venv/bin/python" -c 'import site, sys; open(site.getsitepackages()[0] + "/" + sys.argv[1], "w").write(sys.argv[2] + "\n")' "$pth" "$root"
echo "$stamp_want" > "$stamp_file"
