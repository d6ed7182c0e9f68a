#!/usr/bin/env bash
# install-deps.sh — installs what building and testing need, only what is missing.
# Called by `make test` and `make demo`; safe to run again (it checks first).
#   Debian/Ubuntu packages: gcc make pkg-config, Criterion, jansson, Oniguruma, utf8proc,
#                           OpenBLAS, libmicrohttpd (apt-get; sudo when not root)
#   Python (notebook tests): numpy matplotlib nbclient nbformat ipykernel (pip)
# Usage: tools/install-deps.sh [--no-python]
set -euo pipefail
want_python=1
[[ "${1:-}" == "--no-python" ]] && want_python=0

# pkg-config module -> Debian package
declare -A PKG=([criterion]=libcriterion-dev [jansson]=libjansson-dev [oniguruma]=libonig-dev
                [libutf8proc]=libutf8proc-dev [openblas]=libopenblas-dev [libmicrohttpd]=libmicrohttpd-dev)
missing=()
command -v pkg-config >/dev/null || missing+=(pkg-config)
command -v gcc >/dev/null || missing+=(gcc)
command -v make >/dev/null || missing+=(make)
for mod in "${!PKG[@]}"; do
    if ! command -v pkg-config >/dev/null || ! pkg-config --exists "$mod"; then missing+=("${PKG[$mod]}"); fi
done

if ((${#missing[@]})); then
    echo "install-deps: installing ${missing[*]}"
    if [[ $(id -u) -eq 0 ]]; then SUDO=(); elif command -v sudo >/dev/null; then SUDO=(sudo); else
        echo "install-deps: error: need root or sudo to install: ${missing[*]}" >&2; exit 1; fi
    if ! command -v apt-get >/dev/null; then
        echo "install-deps: error: no apt-get; install these yourself: ${missing[*]}" >&2; exit 1; fi
    export DEBIAN_FRONTEND=noninteractive
    "${SUDO[@]}" apt-get update -qq
    "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ((want_python)); then
    pymiss=()
    for m in numpy matplotlib nbclient nbformat ipykernel; do
        python3 -c "import $m" 2>/dev/null || pymiss+=("$m")
    done
    if ((${#pymiss[@]})); then
        echo "install-deps: pip installing ${pymiss[*]}"
        python3 -m pip install -q "${pymiss[@]}" 2>/dev/null ||
            python3 -m pip install -q --break-system-packages "${pymiss[@]}"
    fi
fi
echo "install-deps: all dependencies present"
