#!/usr/bin/env bash
# Entry point of the gpfl image: one image, every Flower role.
#
#   superlink [args]  flower-superlink with the security flags below
#   supernode [args]  gpfl supernode (a device: Flower's SuperNode served by the gpfl client
#                     installed in this image; runs of other apps refused, the FAB never run),
#                     with the security flags below
#   serverapp [args]  gpfl serverapp: the SuperLink's ServerApp, one process a run (warm before
#                     it claims the run; one line when the SuperLink refuses it)
#   superexec [args]  flower-superexec (Flower's own executor; not used by gpfl)
#   submit [args]     gpfl submit /app <connection> [args]: flwr run --stream, followed within
#                     deadlines (a run that does not start or progress is stopped, one line says
#                     why; the exit status is the run's)
#   register KEY...   flwr supernode register KEY <connection>, for each public key
#   anything else     executed as given
#
# Security comes from the environment, so that compose overrides only add
# variables and mounts (a compose override replaces `command` wholesale):
#   GPFL_TLS_DIR            folder with ca.crt (and, for the SuperLink, server.pem, server.key);
#                           unset: --insecure
#   GPFL_SUPERNODE_AUTH=1   SuperLink: --enable-supernode-auth (needs TLS)
#   GPFL_AUTH_KEY           SuperNode: its private key (--auth-supernode-private-key)
#   GPFL_NODE_CONFIG_EXTRA  SuperNode: appended to its --node-config (e.g. device="cuda")
#   GPFL_SUPERLINK          serverapp/submit/register: the SuperLink's control and runtime API
#                           (default superlink:8000)
set -euo pipefail

role=${1:---help}
[[ $# -gt 0 ]] && shift

tls_dir=${GPFL_TLS_DIR:-}

need() {
    if [[ ! -r "$1" ]]; then
        echo "gpfl-entrypoint: cannot read $1 (mounted? readable by uid $(id -u)?)" >&2
        exit 2
    fi
}

connection() {
    # A Flower connection named `deploy` in $FLWR_HOME/config.toml.
    local home=${FLWR_HOME:-$HOME/.flwr}
    mkdir -p "$home"
    {
        echo "[superlink.deploy]"
        echo "address = \"${GPFL_SUPERLINK:-superlink:8000}\""
        if [[ -n "$tls_dir" ]]; then
            need "$tls_dir/ca.crt"
            echo "root-certificates = \"$tls_dir/ca.crt\""
        else
            echo "insecure = true"
        fi
    } > "$home/config.toml"
}

case "$role" in
    superlink)
        args=()
        if [[ -n "$tls_dir" ]]; then
            need "$tls_dir/ca.crt"; need "$tls_dir/server.pem"; need "$tls_dir/server.key"
            args+=(--ssl-ca-certfile "$tls_dir/ca.crt" --ssl-certfile "$tls_dir/server.pem"
                   --ssl-keyfile "$tls_dir/server.key")
        else
            args+=(--insecure)
        fi
        [[ "${GPFL_SUPERNODE_AUTH:-0}" == 1 ]] && args+=(--enable-supernode-auth)
        exec flower-superlink "${args[@]}" "$@"
        ;;
    supernode)
        args=()
        if [[ -n "$tls_dir" ]]; then
            need "$tls_dir/ca.crt"
            args+=(--root-certificates "$tls_dir/ca.crt")
        else
            args+=(--insecure)
        fi
        if [[ -n "${GPFL_AUTH_KEY:-}" ]]; then
            need "$GPFL_AUTH_KEY"
            args+=(--auth-supernode-private-key "$GPFL_AUTH_KEY")
        fi
        rest=()
        while [[ $# -gt 0 ]]; do
            if [[ "$1" == --node-config && $# -gt 1 ]]; then
                rest+=("$1" "$2${GPFL_NODE_CONFIG_EXTRA:+ $GPFL_NODE_CONFIG_EXTRA}")
                shift 2
            else
                rest+=("$1")
                shift
            fi
        done
        exec gpfl supernode "${args[@]}" "${rest[@]}"
        ;;
    serverapp)
        args=(--superlink "${GPFL_SUPERLINK:-superlink:8000}")
        if [[ -n "$tls_dir" ]]; then
            need "$tls_dir/ca.crt"
            args+=(--root-certificates "$tls_dir/ca.crt")
        fi
        exec gpfl serverapp "${args[@]}" "$@"
        ;;
    superexec)
        exec flower-superexec "$@"
        ;;
    submit)
        connection
        exec gpfl submit /app deploy "$@"
        ;;
    register)
        connection
        for key in "$@"; do
            need "$key"
            flwr supernode register "$key" deploy
        done
        ;;
    -h|--help|help)
        sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'
        ;;
    *)
        exec "$role" "$@"
        ;;
esac
