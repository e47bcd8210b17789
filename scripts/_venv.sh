# Shared by scripts/traintop and scripts/test: make .venv and install this checkout into it.
# Re-installs only when pyproject.toml changes (the install is editable, code changes need none).

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TRAINTOP_VENV:-$REPO/.venv}"

pick_python() {
    for py in "${PYTHON:-}" python3.11 python3.12 python3.13 python3.10 python3; do
        [ -n "$py" ] || continue
        command -v "$py" >/dev/null 2>&1 || continue
        if "$py" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else 1)' 2>/dev/null; then
            echo "$py"; return 0
        fi
    done
    echo "traintop: needs Python 3.10 or newer (set PYTHON=/path/to/python3)" >&2
    return 1
}

venv_stamp() {  # what the install was made for: pyproject.toml as it is now
    sha256sum < "$REPO/pyproject.toml" | cut -c1-16
}

ensure_venv() {  # $1: "runtime" or "test" (a test install also serves runtime)
    # runtime: every command docs/COMMANDS.md lists, the ones over many hosts too (the cluster extra)
    local extras="[cluster]" want
    [ "$1" = "test" ] && extras="[test]"
    want="$(venv_stamp)"
    if [ -x "$VENV/bin/python" ]; then
        grep -qxF -- "$want" "$VENV/.traintop-$1" 2>/dev/null && return 0
        [ "$1" = "runtime" ] && grep -qxF -- "$want" "$VENV/.traintop-test" 2>/dev/null && return 0
    else
        local py; py="$(pick_python)" || return 1
        echo "traintop: creating $VENV with $py" >&2
        "$py" -m venv "$VENV" || { echo "traintop: could not create a virtual environment (install python3-venv)" >&2; return 1; }
    fi
    echo "traintop: installing traintop$extras into $VENV (first run only, about a minute)" >&2
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
    # pip and the build backend talk a lot (notices about editable installs, index locations):
    # keep it, and show it only when the install fails.
    quiet pip-install "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e "$REPO$extras" \
        || { echo "traintop: installing dependencies failed (pip's output above)" >&2; return 1; }
    echo "$want" > "$VENV/.traintop-$1"
}

quiet() {  # quiet NAME CMD...: run CMD with its output kept aside; print it only if CMD fails
    local name="$1" log rc; shift
    log="$(mktemp "${TMPDIR:-/tmp}/traintop-$name.XXXXXX")" || { "$@"; return; }
    "$@" >"$log" 2>&1
    rc=$?
    [ $rc -ne 0 ] && cat "$log" >&2
    rm -f "$log"
    return $rc
}
