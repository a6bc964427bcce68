#!/usr/bin/env bash
# deploy/smoke.sh — the compose deployment, end to end, then nothing left behind.
#
# Builds what it needs (with podman and no registry: a local Debian bookworm
# base image tagged docker.io/library/python:3.11-slim), starts a SuperLink and
# three SuperNodes in containers (deploy/compose.yml), runs the synthetic task
# to the end through the one-shot `submit` service, checks summary.json (the
# hypotheses near the task's optima) and that every SuperNode container had its
# own IP address and took part, then removes every container, network and
# volume it made (also on failure, Ctrl-C or SIGTERM). Exits non-zero on any
# failure. Docker where an engine answers, podman (+ podman-compose) otherwise.
#
#   deploy/smoke.sh                 plain gRPC
#   deploy/smoke.sh --tls           with deploy/compose.tls.yml (throw-away CA)
#   deploy/smoke.sh --auth          TLS + SuperNode authentication (compose.auth.yml)
#   deploy/smoke.sh --setup         only install tools and build the images
#
# Environment: GPFL_SMOKE_ROUNDS (default 8), GPFL_SMOKE_SEED (default 1), GPFL_SMOKE_TIMEOUT (run, s, default 600),
# GPFL_SMOKE_TOL (distance to an optimum, default 1.0), GPFL_SMOKE_CHECK=result|rounds
# (rounds: only check that the run was accepted and rounds happened),
# GPFL_SMOKE_KEEP=1 (leave the deployment up for inspection; you remove it).
# Images stay cached (tagged) between runs; everything else is removed.
set -Eeuo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
START=$(date +%s)

TLS=0; AUTH=0; SETUP_ONLY=0
for arg in "$@"; do
    case "$arg" in
        --tls) TLS=1 ;;
        --auth) TLS=1; AUTH=1 ;;
        --setup) SETUP_ONLY=1 ;;
        -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "smoke: unknown argument $arg" >&2; exit 2 ;;
    esac
done

ROUNDS=${GPFL_SMOKE_ROUNDS:-8}
SEED=${GPFL_SMOKE_SEED:-1}
RUN_TIMEOUT=${GPFL_SMOKE_TIMEOUT:-600}
TOL=${GPFL_SMOKE_TOL:-1.0}
CHECK=${GPFL_SMOKE_CHECK:-result}
IMAGE=${GPFL_IMAGE:-localhost/gpfl:latest}
BASE_IMAGE=docker.io/library/python:3.11-slim
PROJECT=gpfl-smoke-$$
SUPERNODES=(supernode-0 supernode-1 supernode-2)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpfl-smoke.XXXXXX")
export GPFL_IMAGE=$IMAGE GPFL_PROJECT=$PROJECT

log() { printf '[smoke %4ss] %s\n' "$(( $(date +%s) - START ))" "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }
as_root() { if [[ $(id -u) -eq 0 ]]; then "$@"; else sudo -n "$@"; fi; }

# ---------------------------------------------------------------- the engine
ENGINE=""
if command -v docker >/dev/null 2>&1 && timeout 10 docker info >/dev/null 2>&1 </dev/null; then
    ENGINE=docker
    COMPOSE=(docker compose)
else
    ENGINE=podman
fi

ensure_podman() {
    local missing=()
    command -v podman >/dev/null 2>&1 || missing+=(podman)
    command -v runc >/dev/null 2>&1 || missing+=(runc)
    command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
    # Container names resolve (superlink:9092) through aardvark-dns (netavark)
    # or the dnsname CNI plugin (Debian 12's podman uses CNI by default).
    if [[ ! -x /usr/lib/cni/dnsname && ! -x /usr/lib/podman/aardvark-dns \
          && ! -x /usr/libexec/podman/aardvark-dns ]]; then
        missing+=(golang-github-containernetworking-plugin-dnsname)
    fi
    if ((${#missing[@]})); then
        log "installing ${missing[*]} (apt-get)"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null >/dev/null
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            "${missing[@]}" uidmap slirp4netns fuse-overlayfs </dev/null >/dev/null
    fi
    if [[ ! -e /etc/containers/containers.conf ]]; then
        # This sandbox cannot set podman's default rlimits, and crun fails on
        # its mixed cgroup setup: runc with modest limits works.
        log "writing /etc/containers/containers.conf (runc, ulimits)"
        as_root mkdir -p /etc/containers
        printf '%s\n' '[containers]' \
            'default_ulimits = ["nofile=16384:16384", "nproc=16384:16384"]' '' \
            '[engine]' 'runtime = "runc"' | as_root tee /etc/containers/containers.conf >/dev/null
    fi
    local tools=${XDG_CACHE_HOME:-$HOME/.cache}/gpfl-deploy/tools
    if command -v podman-compose >/dev/null 2>&1; then
        COMPOSE=(podman-compose)
    else
        if [[ ! -x "$tools/bin/podman-compose" ]]; then
            log "installing podman-compose (pip, into $tools)"
            python3 -m venv "$tools"
            "$tools/bin/pip" install -q podman-compose </dev/null 2>&1 \
                | { grep -v "is neither a file nor a directory" || true; } >&2
        fi
        COMPOSE=("$tools/bin/podman-compose")
    fi
    COMPOSE+=(--in-pod=false)
}

debian_mirror() {
    local m=""
    if [[ -r /etc/apt/sources.list.d/debian.sources ]]; then
        m=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources)
    fi
    if [[ -z "$m" && -r /etc/apt/sources.list ]]; then
        m=$(awk '/^deb / && $2 ~ /debian\/?$/ {print $2; exit}' /etc/apt/sources.list)
    fi
    echo "${m:-http://deb.debian.org/debian}"
}

build_base_podman() {
    if podman image exists "$BASE_IMAGE"; then
        return
    fi
    if ! podman image exists docker.io/library/debian:bookworm; then
        local rootfs="$WORK/rootfs" mirror
        mirror=$(debian_mirror)
        log "building the Debian bookworm base from $mirror (debootstrap, about a minute)"
        as_root debootstrap --variant=minbase bookworm "$rootfs" "$mirror" </dev/null >"$WORK/debootstrap.log" 2>&1 \
            || { tail -20 "$WORK/debootstrap.log" >&2; die "debootstrap failed"; }
        as_root chroot "$rootfs" apt-get clean
        as_root rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/doc/* \
            "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/* "$rootfs"/var/cache/apt/*.bin
        as_root tar -C "$rootfs" -c . | podman import --change 'CMD ["/bin/bash"]' - \
            localhost/debian:bookworm >/dev/null 2>>"$WORK/debootstrap.log"
        podman tag localhost/debian:bookworm docker.io/library/debian:bookworm
        as_root rm -rf "$rootfs"
    fi
    log "building $BASE_IMAGE (Debian's Python 3.11 in a venv)"
    podman build --pull=never --network host -t "$BASE_IMAGE" \
        -f "$HERE/base/python.Containerfile" "$HERE/base" </dev/null >"$WORK/base.log" 2>&1 \
        || { tail -30 "$WORK/base.log" >&2; die "base image build failed"; }
}

pip_find_links() {
    # The host's pip find-links folder (a local CPU torch wheel), if any.
    local fl=${PIP_FIND_LINKS:-}
    [[ -z "$fl" ]] && fl=$(python3 -m pip config get global.find-links 2>/dev/null || true)
    [[ -n "$fl" && -d "$fl" ]] && echo "$fl"
    return 0
}

build_image() {
    log "building $IMAGE ($ENGINE)"
    local t0=$SECONDS previous
    previous=$($ENGINE image inspect -f '{{.Id}}' "$IMAGE" 2>/dev/null || true)
    if [[ $ENGINE == podman ]]; then
        build_base_podman
        local args=(--pull=never --network host -t "$IMAGE" -f "$HERE/Dockerfile")
        local extra="" wheels
        # HTTPS here goes through a proxy whose CA the container lacks: the
        # host's bundle is mounted for the build only, never copied in.
        local bundle=${PIP_CERT:-/etc/ssl/certs/ca-certificates.crt}
        if [[ -r "$bundle" ]]; then
            args+=(-v "$bundle:/run/host-ca.pem:ro" --build-arg PIP_CERT=/run/host-ca.pem)
        fi
        wheels=$(pip_find_links)
        if [[ -n "$wheels" ]] && compgen -G "$wheels/torch-*+cpu-*.whl" >/dev/null; then
            # A local CPU torch wheel: take it, no torch download at all.
            args+=(-v "$wheels:/run/wheels:ro" --build-arg TORCH_INDEX_URL=
                   --build-arg "TORCH_SPEC=torch==$(basename "$(ls "$wheels"/torch-*+cpu-*.whl | head -1)" | cut -d- -f2)")
            extra+=" --find-links /run/wheels"
        fi
        args+=(--build-arg "PIP_EXTRA=${extra# }")
        podman build "${args[@]}" "$ROOT" </dev/null >"$WORK/build.log" 2>&1 \
            || { tail -40 "$WORK/build.log" >&2; die "image build failed"; }
    else
        docker build -t "$IMAGE" -f "$HERE/Dockerfile" "$ROOT" </dev/null >"$WORK/build.log" 2>&1 \
            || { tail -40 "$WORK/build.log" >&2; die "image build failed"; }
    fi
    # The image this build replaced (now untagged): removed unless something uses it.
    local now
    now=$($ENGINE image inspect -f '{{.Id}}' "$IMAGE")
    if [[ -n "$previous" && "$previous" != "$now" ]]; then
        $ENGINE rmi "$previous" >/dev/null 2>&1 || true
    fi
    log "image ready in $(( SECONDS - t0 )) s"
}

# ---------------------------------------------------------------- teardown
FILES=(-f "$HERE/compose.yml")
# The smoke test's devices opt in to seeded noise (as the experiments' virtual devices do), so
# that a CI run is reproducible: the run's seed never reaches the noise, a device's own
# noise-seed does. A real device leaves both unset.
{
    echo "services:"
    for s in "${SUPERNODES[@]}"; do
        printf '  %s:\n    environment:\n      GPFL_NODE_CONFIG_EXTRA: "allow-seeded-noise=true noise-seed=%s"\n' \
            "$s" "$SEED"
    done
} >"$WORK/compose.seeded.yml"
FILES+=(-f "$WORK/compose.seeded.yml")
compose() { "${COMPOSE[@]}" -p "$PROJECT" --profile tools "${FILES[@]}" "$@"; }

ids_of() {  # what this project made, by compose label
    local kind=$1
    case "$kind" in
        container) $ENGINE ps -aq --filter "label=com.docker.compose.project=$PROJECT" ;;
        volume) $ENGINE volume ls -q --filter "label=com.docker.compose.project=$PROJECT" ;;
        network) $ENGINE network ls -q --filter "label=com.docker.compose.project=$PROJECT" ;;
    esac 2>/dev/null || true
}

UP=0
RUN_PID=""
PAUSED=""  # a container paused by the start-up deadline check
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    set +e
    [[ -n "$PAUSED" ]] && $ENGINE unpause "$PAUSED" >/dev/null 2>&1
    if [[ -n "$RUN_PID" ]]; then  # the submit step, interrupted
        kill -TERM "$RUN_PID" 2>/dev/null
        wait "$RUN_PID" 2>/dev/null
    fi
    if (( UP )); then
        if [[ "${GPFL_SMOKE_KEEP:-0}" == 1 ]]; then
            log "GPFL_SMOKE_KEEP=1: left project $PROJECT up; remove it with:"
            log "  ${COMPOSE[*]} -p $PROJECT ${FILES[*]} down -v"
        else
            log "tearing down project $PROJECT"
            compose down -v -t 5 </dev/null >"$WORK/down.log" 2>&1
            # Whatever `down` missed (a one-shot container, a failed start).
            local c v n
            c=$(ids_of container); [[ -n "$c" ]] && $ENGINE rm -f $c >/dev/null 2>&1
            v=$(ids_of volume);    [[ -n "$v" ]] && $ENGINE volume rm -f $v >/dev/null 2>&1
            n=$(ids_of network);   [[ -n "$n" ]] && $ENGINE network rm $n >/dev/null 2>&1
            if [[ $ENGINE == podman ]]; then
                podman pod rm -f "pod_$PROJECT" >/dev/null 2>&1
            fi
            local left
            left="$(ids_of container)$(ids_of volume)$(ids_of network)"
            if [[ -n "$left" ]]; then
                log "could not remove: $left"
                (( rc == 0 )) && rc=1
            fi
        fi
    fi
    if [[ -d "$WORK" ]]; then
        as_root rm -rf "$WORK" 2>/dev/null || rm -rf "$WORK"
    fi
    log "$( (( rc == 0 )) && echo PASS || echo "FAILED (exit $rc)") in $(( $(date +%s) - START )) s"
    exit "$rc"
}
trap cleanup EXIT
trap 'log "interrupted"; exit 130' INT
trap 'log "terminated"; exit 143' TERM

# ---------------------------------------------------------------- build
[[ $ENGINE == podman ]] && ensure_podman
log "engine: $ENGINE; compose: ${COMPOSE[*]}"
build_image
(( SETUP_ONLY )) && exit 0

# ---------------------------------------------------------------- certificates
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
export GPFL_FLEET_PORT=${GPFL_FLEET_PORT:-$(free_port)}
export GPFL_CONTROL_PORT=${GPFL_CONTROL_PORT:-$(free_port)}

if (( TLS )); then
    export GPFL_CERTS="$WORK/certs"
    log "making a throw-away CA, the SuperLink certificate (SAN superlink) and SuperNode keys"
    $ENGINE run --rm --network none --user 0 -v "$WORK:/work" --entrypoint gpfl "$IMAGE" \
        certs --out /work/certs --san superlink --supernodes 3 </dev/null >/dev/null
    # Readable by the containers' user (uid 10001) only; private keys stay 0600.
    as_root chown -R 10001:10001 "$GPFL_CERTS"
    FILES+=(-f "$HERE/compose.tls.yml")
    (( AUTH )) && FILES+=(-f "$HERE/compose.auth.yml")
fi

# ---------------------------------------------------------------- up
UP=1
log "starting the SuperLink and its ServerApp"
compose up -d superlink serverapp </dev/null >"$WORK/up.log" 2>&1 || { cat "$WORK/up.log" >&2; die "compose up failed"; }

container_of() {  # the container of a service of this project
    $ENGINE ps -aq --filter "label=com.docker.compose.project=$PROJECT" \
        --filter "label=com.docker.compose.service=$1" | head -1
}

wait_log() {  # wait_log SERVICE PATTERN SECONDS
    local c deadline=$(( SECONDS + $3 ))
    while (( SECONDS < deadline )); do
        c=$(container_of "$1")
        if [[ -n "$c" ]] && $ENGINE logs "$c" 2>&1 | grep -q -- "$2"; then
            return 0
        fi
        sleep 1
    done
    [[ -n "${c:-}" ]] && $ENGINE logs "$c" 2>&1 | tail -30 >&2
    die "$1: no '$2' in its log after $3 s"
}
wait_log superlink "Starting Flower SuperLink\|Flower Deployment Runtime\|Uvicorn running" 90
sleep 2

if (( AUTH )); then
    log "registering the three SuperNode public keys"
    ok=0
    for _ in $(seq 20); do
        if compose run --rm register </dev/null >"$WORK/register.log" 2>&1; then ok=1; break; fi
        sleep 2
    done
    (( ok )) || { cat "$WORK/register.log" >&2; die "registration failed"; }
fi

log "starting ${#SUPERNODES[@]} SuperNodes"
compose up -d --no-deps "${SUPERNODES[@]}" </dev/null >>"$WORK/up.log" 2>&1 \
    || { cat "$WORK/up.log" >&2; die "compose up (SuperNodes) failed"; }
for s in "${SUPERNODES[@]}"; do
    wait_log "$s" "SuperNode ID" 90
done

# Every SuperNode container has its own address on the compose network.
declare -A IPS=()
for s in "${SUPERNODES[@]}" superlink; do
    c=$(container_of "$s")
    ip=$($ENGINE inspect -f '{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}' "$c" | xargs)
    [[ -n "$ip" ]] || die "$s has no IP address"
    IPS[$s]=$ip
    log "$s: $ip"
done
uniq=$(printf '%s\n' "${IPS[@]}" | sort -u | wc -l)
(( uniq == ${#IPS[@]} )) || die "containers share IP addresses: ${IPS[*]}"

# ---------------------------------------------------------------- run
OUT=/data/results/smoke
# Ten local epochs and noise as large as the update (nu = 1) so that 3 clients
# get near the optima in a few rounds; the run's seed and the devices' noise seeds (above)
# keep CI reproducible.
CONFIG="task=\"synthetic\" num-hypotheses=2 num-rounds=$ROUNDS clients-per-round=3"
CONFIG+=" local-epochs=10 mechanism=\"laplace\" noise-multiplier=1.0 seed=$SEED"
CONFIG+=" eval-every=1 patience=$ROUNDS out-dir=\"$OUT\""
log "submitting the gpfl app: $CONFIG"
set +e
# In the background + wait: a signal is handled at once, not after the run.
timeout "$RUN_TIMEOUT" "${COMPOSE[@]}" -p "$PROJECT" --profile tools "${FILES[@]}" run --rm --no-deps submit \
    --run-config "$CONFIG" </dev/null >"$WORK/run.log" 2>&1 &
RUN_PID=$!
wait "$RUN_PID"
rc=$?
RUN_PID=""
set -e
grep -E "\[gpfl\]|ROUND|SUMMARY|ERROR|Traceback" "$WORK/run.log" | sed 's/^/    /' | tail -40 >&2 || true
(( rc == 124 )) && die "the run did not finish within $RUN_TIMEOUT s"
(( rc == 0 )) || { tail -40 "$WORK/run.log" >&2; die "gpfl submit exited with $rc"; }
grep -q "Successfully started run" "$WORK/run.log" || die "the run was not accepted"
grep -q "Traceback\|ServerApp raised an exception" "$WORK/run.log" && die "the ServerApp failed"
grep -q "gpfl submit: run [0-9]* ended: complete" "$WORK/run.log" || die "submit did not report the run complete"

# A run whose ServerApp never starts (the serverapp container paused) is stopped by `submit`
# at its start-up deadline, with one line and exit 1, instead of waiting for ever.
log "pausing the ServerApp: a second run must be stopped at its start-up deadline"
PAUSED=$(container_of serverapp)
$ENGINE pause "$PAUSED" >/dev/null
set +e
timeout 300 "${COMPOSE[@]}" -p "$PROJECT" --profile tools "${FILES[@]}" run --rm --no-deps submit \
    --startup-timeout 15 --run-config "num-rounds=1 out-dir=\"/data/results/stalled\"" \
    </dev/null >"$WORK/stalled.log" 2>&1
rc=$?
set -e
$ENGINE unpause "$PAUSED" >/dev/null
PAUSED=""
(( rc == 1 )) || { tail -20 "$WORK/stalled.log" >&2; die "a run without its ServerApp: submit exited with $rc, expected 1"; }
grep -q "gpfl submit: failed: the ServerApp did not start within 15 s" "$WORK/stalled.log" \
    || { tail -20 "$WORK/stalled.log" >&2; die "submit did not say why it stopped the run"; }
grep -q "stopped with flwr stop" "$WORK/stalled.log" || die "submit did not stop the run"
log "the run without its ServerApp was stopped: $(grep "gpfl submit: failed" "$WORK/stalled.log" | cut -c1-90)..."

# ---------------------------------------------------------------- checks
for s in "${SUPERNODES[@]}"; do
    n=$($ENGINE logs "$(container_of "$s")" 2>&1 | grep -c "Sent successfully" || true)
    log "$s sent $n replies"
    (( n > 0 )) || die "$s never took part"
done

# The number of releases a device's ledger holds (its `releases:` total, whatever their kind).
ledger_releases() {
    $ENGINE exec "$(container_of "$1")" gpfl ledger "$2" 2>/dev/null \
        | sed -n 's/^releases: \([0-9]*\).*/\1/p' | grep . || echo 0
}

# Each device's ledger lives in its own volume and outlives its container.
for i in 0 1 2; do
    n=$(ledger_releases "supernode-$i" "/data/ledger/client-$i.json")
    log "supernode-$i: its ledger (volume ledger-$i) holds $n releases"
    (( n == ROUNDS )) || die "supernode-$i's ledger has $n releases, expected $ROUNDS"
done
log "re-creating supernode-0: its spend must survive"
old_c=$(container_of supernode-0)
$ENGINE rm -f "$old_c" >/dev/null
compose up -d --no-deps supernode-0 </dev/null >>"$WORK/up.log" 2>&1 || die "could not re-create supernode-0"
n=$(ledger_releases supernode-0 /data/ledger/client-0.json)
[[ "$(container_of supernode-0)" != "$old_c" ]] || die "supernode-0 was not re-created"
(( n == ROUNDS )) || die "re-created supernode-0 sees $n releases in its ledger, expected $ROUNDS"
log "the new supernode-0 container sees the same $n releases"

if [[ $CHECK == rounds ]]; then
    grep -q "ROUND 1\]\|\[gpfl\] round 1" "$WORK/run.log" || die "no round happened"
    log "rounds happened (GPFL_SMOKE_CHECK=rounds: summary.json not checked)"
else
    $ENGINE exec "$(container_of serverapp)" cat "$OUT/summary.json" >"$WORK/summary.json" \
        || die "no $OUT/summary.json in the results volume"
    python3 - "$WORK/summary.json" "$TOL" "$ROUNDS" <<'EOF' || die "result check failed"
import json, math, sys
s = json.load(open(sys.argv[1]))
tol, rounds = float(sys.argv[2]), int(sys.argv[3])
optima = (s.get("task_info") or {}).get("optima") or [[5.0, 6.0], [4.0, -4.5]]
hyps = s["hypotheses"]
done = s.get("rounds_completed")
print(f"    rounds completed: {done}; hypotheses: {hyps}", file=sys.stderr)
assert done and done >= 1, f"no round completed ({done})"
assert len(hyps) == len(optima), f"{len(hyps)} hypotheses for {len(optima)} optima"
for o in optima:
    d = min(math.dist(o, h) for h in hyps)
    print(f"    optimum {o}: nearest hypothesis at distance {d:.3f}", file=sys.stderr)
    assert d <= tol, f"no hypothesis within {tol} of optimum {o}"
EOF
    log "hypotheses within $TOL of the optima"
fi
log "all checks passed"
