#!/usr/bin/env bash
# One entry point for users and CI: creates .venv on first use (and whenever
# pyproject.toml changes), then runs a gpfl command or the test suite.
#
#   ./gpfl.sh launch [options]   the main job: a local federation of real Flower processes
#   ./gpfl.sh test [pytest args] ruff, mypy, import-linter and the whole test suite (~25 min on 2 cores)
#   ./gpfl.sh experiment NAME [options]   one of the papers' experiments (python -m experiments)
#   ./gpfl.sh report [--full] [options]   every experiment, two at a time (--quick unless --full; 86 min from a clean clone on 2 cores), then docs/RESULTS.md
#   ./gpfl.sh <any gpfl subcommand>
set -euo pipefail
cd "$(dirname "$0")"

PYTHON=${PYTHON:-python3}
VENV=${GPFL_VENV:-.venv}

# pip, quiet; a pip config may name local index folders that are absent,
# and pip warns once per package about each: not worth showing.
pipq() {
    "$VENV/bin/python" -m pip install -q "$@" 2>&1 \
        | { grep -v "is ignored: it is neither a file nor a directory" || true; } >&2
}

setup() {
    local stamp="$VENV/.gpfl-installed"
    local want
    want=$(sha256sum pyproject.toml | cut -d' ' -f1)
    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
        return
    fi
    echo "gpfl: setting up $VENV (first run, or pyproject.toml changed)" >&2
    [[ -x "$VENV/bin/python" ]] || "$PYTHON" -m venv "$VENV"
    pipq --upgrade pip
    # torch first and pinned: where a local CPU wheel is configured (pip's
    # find-links) this takes it; on a GPU machine PyPI's default build is CUDA.
    # Installing it before the project stops pip from choosing a newer,
    # multi-GB build to satisfy `torch>=2.2`. GPFL_TORCH overrides the spec.
    pipq "${GPFL_TORCH:-torch==2.13.0}"
    pipq -e ".[dev]"
    echo "$want" > "$stamp"
}

cmd=${1:-help}
[[ $# -gt 0 ]] && shift
case "$cmd" in
    setup)
        setup
        ;;
    test)
        setup
        export PATH="$PWD/$VENV/bin:$PATH"
        echo "== ruff" && ruff check .
        echo "== mypy" && mypy settings mechanisms strategies client server deploy tasks experiments
        echo "== import-linter" && lint-imports --no-cache --no-logo
        # Two workers, one test file each at a time: the real-process tests mostly wait on
        # Flower's 3 s polling, so a second worker overlaps them with the CPU-bound ones.
        # GPFL_TEST_WORKERS=0 runs everything in this process (for debugging).
        echo "== pytest" && python -m pytest -n "${GPFL_TEST_WORKERS:-2}" --dist loadfile "$@"
        ;;
    experiment|experiments)
        setup
        export PATH="$PWD/$VENV/bin:$PATH"
        exec python -m experiments "$@"
        ;;
    report)
        setup
        export PATH="$PWD/$VENV/bin:$PATH"
        profile=(--quick)
        rest=()
        for arg in "$@"; do
            if [[ "$arg" == "--full" ]]; then profile=(); else rest+=("$arg"); fi
        done
        # The report is written from whatever finished, then a failed experiment fails the command.
        status=0
        # Two experiments at a time (one process each; scale alone): --jobs N overrides it.
        python -m experiments all --jobs 2 "${profile[@]}" "${rest[@]}" || status=$?
        python -m experiments report
        exit "$status"
        ;;
    help|-h|--help)
        sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
        ;;
    *)
        setup
        export PATH="$PWD/$VENV/bin:$PATH"
        exec gpfl "$cmd" "$@"
        ;;
esac
