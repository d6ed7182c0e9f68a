#!/usr/bin/env bash
# install-deps.sh — installs what building, testing and the demo need, only what is missing.
# Called by `make test` and `make demo`; safe to run again (it checks first, installs nothing
# when everything is there, and never touches a package you already have).
#   Debian/Ubuntu packages: gcc make pkg-config git, Criterion, jansson, Oniguruma, utf8proc, xxHash,
#                           OpenBLAS, libmicrohttpd, OpenMPI (libopenmpi-dev + openmpi-bin: step08's
#                           ranks under mpirun) (apt-get; sudo when not root)
#   curl, python3 and the `openai` client (the server tests, always): openai has no Debian package,
#     so it is pip-installed (with --break-system-packages into the system's Python, pip from
#     python3-pip when missing).
#   Python (notebook tests): python3 and numpy matplotlib nbclient nbformat ipykernel.
#     When `python3` is the system's (or absent), they come from the distribution's packages
#     (python3-numpy ...): Debian 12 / Ubuntu 24.04 mark the system Python "externally managed",
#     so pip would refuse. When `python3` is your own (a venv, pyenv, conda), what is missing is
#     pip-installed into it.
# Usage: tools/install-deps.sh [--no-python]
set -euo pipefail
want_python=1
[[ "${1:-}" == "--no-python" ]] && want_python=0
say() { echo "install-deps: $*"; }

SUDO=()
apt_ready=0
apt_install() {  # apt_install PKG...: one apt-get install of what is asked, with sudo when not root
    if ! command -v apt-get >/dev/null; then
        say "error: no apt-get on this machine; install these yourself: $*" >&2
        exit 1
    fi
    if [[ $(id -u) -ne 0 ]]; then
        if command -v sudo >/dev/null; then SUDO=(sudo); else
            say "error: need root or sudo to install: $*" >&2
            exit 1
        fi
    fi
    export DEBIAN_FRONTEND=noninteractive
    if ((!apt_ready)); then
        "${SUDO[@]}" apt-get update -qq
        apt_ready=1
    fi
    # Ubuntu keeps Criterion and OpenBLAS in its "universe" component, on by default in an
    # installed system but not in a minimal root: add it when a package has no candidate.
    local p pol nocand=()
    for p in "$@"; do
        pol=$(apt-cache policy "$p" 2>/dev/null)
        if ! [[ $pol =~ Candidate:\ [^\(] ]]; then nocand+=("$p"); fi
    done
    if ((${#nocand[@]})) && grep -qs '^ID=ubuntu' /etc/os-release; then
        local codename mirror="" f
        codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
        for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
            if [ -z "$mirror" ] && [ -r "$f" ]; then
                mirror=$(awk '/^deb /{print $2; exit} /^URIs:/{print $2; exit}' "$f")
            fi
        done
        if [ -n "$codename" ] && [ -n "$mirror" ]; then
            say "no candidate for ${nocand[*]}: enabling Ubuntu's universe component ($mirror $codename universe)"
            echo "deb $mirror $codename universe" | "${SUDO[@]}" tee /etc/apt/sources.list.d/universe-for-llm-course.list >/dev/null
            "${SUDO[@]}" apt-get update -qq
        fi
    fi
    say "apt-get installing $*"
    "${SUDO[@]}" apt-get install -y -qq --no-install-recommends "$@" >/dev/null
}

# ---- C toolchain and libraries: pkg-config module -> Debian package
declare -A PKG=([criterion]=libcriterion-dev [jansson]=libjansson-dev [oniguruma]=libonig-dev
                [libutf8proc]=libutf8proc-dev [openblas]=libopenblas-dev [libmicrohttpd]=libmicrohttpd-dev
                [libxxhash]=libxxhash-dev [ompi-c]=libopenmpi-dev)
missing=()
command -v pkg-config >/dev/null || missing+=(pkg-config)
command -v gcc >/dev/null || missing+=(gcc libc6-dev)
command -v make >/dev/null || missing+=(make)
command -v git >/dev/null || missing+=(git)
command -v mpirun >/dev/null || missing+=(openmpi-bin)
command -v curl >/dev/null || missing+=(curl ca-certificates)
command -v python3 >/dev/null || missing+=(python3)
for mod in "${!PKG[@]}"; do
    if ! command -v pkg-config >/dev/null || ! pkg-config --exists "$mod"; then missing+=("${PKG[$mod]}"); fi
done
if ((${#missing[@]})); then apt_install "${missing[@]}"; fi

# ---- the server tests: the openai client (tests/server_client.py drives `llm serve` with it)
if ! python3 -c "import openai" 2>/dev/null; then
    if ! python3 -m pip --version >/dev/null 2>&1; then
        case "$(command -v python3)" in
        /usr/bin/python3 | /bin/python3) apt_install python3-pip ;;
        *) say "error: $(command -v python3) has no pip; install the openai package for it yourself" >&2; exit 1 ;;
        esac
    fi
    say "pip installing openai into $(command -v python3)"
    python3 -m pip install -q openai 2>/dev/null || python3 -m pip install -q --break-system-packages openai
    if ! python3 -c "import openai" 2>/dev/null; then
        say "error: python3 still cannot import openai" >&2
        exit 1
    fi
fi

# ---- Python for the notebook tests
if ((want_python)); then
    # module -> Debian/Ubuntu package
    declare -A PYPKG=([numpy]=python3-numpy [matplotlib]=python3-matplotlib [nbclient]=python3-nbclient
                      [nbformat]=python3-nbformat [ipykernel]=python3-ipykernel)
    py_missing() {  # prints the modules `python3` cannot import
        local m
        for m in numpy matplotlib nbclient nbformat ipykernel; do
            python3 -c "import $m" 2>/dev/null || echo "$m"
        done
    }
    system_python=0
    if ! command -v python3 >/dev/null; then
        apt_install python3
        system_python=1
    else
        case "$(command -v python3)" in /usr/bin/python3 | /bin/python3) system_python=1 ;; esac
    fi
    mapfile -t pymiss < <(py_missing)
    if ((${#pymiss[@]})) && ((system_python)); then
        debs=()
        for m in "${pymiss[@]}"; do debs+=("${PYPKG[$m]}"); done
        apt_install "${debs[@]}"
        mapfile -t pymiss < <(py_missing)
    fi
    if ((${#pymiss[@]})); then
        # a Python of the user's own (or a distribution without those packages): pip into it
        say "pip installing ${pymiss[*]} into $(command -v python3)"
        if ! python3 -m pip --version >/dev/null 2>&1; then
            say "error: $(command -v python3) has no pip; install ${pymiss[*]} for it yourself (or run with --no-python / NOTEBOOKS=0)" >&2
            exit 1
        fi
        python3 -m pip install -q "${pymiss[@]}" 2>/dev/null ||
            python3 -m pip install -q --break-system-packages "${pymiss[@]}"
        mapfile -t pymiss < <(py_missing)
        if ((${#pymiss[@]})); then
            say "error: python3 still cannot import ${pymiss[*]}" >&2
            exit 1
        fi
    fi
fi
say "all dependencies present"
