#!/usr/bin/env bash
# Socket activation by hand, the way deploy/conduit.socket does it under systemd:
# systemd-socket-activate owns the listening socket and starts `conduit serve` on the
# first connection, handing the socket over as fd 3 (LISTEN_FDS=1). The client that
# connected first waits in the backlog and is answered once the daemon is up.
#
#   examples/socket-activation.sh [STATE_DIR]
#
# Needs `systemd-socket-activate` (Debian: package systemd) and `conduit` on PATH.
set -euo pipefail

conduit=${CONDUIT:-conduit}
state_dir=${1:-$(mktemp -d)}
run_dir=$(mktemp -d /tmp/conduit-activation-XXXXXX)
socket=$run_dir/conduit.sock

CONDUIT_STATE_DIR=$state_dir systemd-socket-activate --listen="$socket" \
    -E CONDUIT_STATE_DIR -E PATH -E HOME \
    "$(command -v "$conduit")" serve &
activator=$!
trap 'kill -TERM "$activator" 2>/dev/null; wait "$activator" 2>/dev/null; rm -rf "$run_dir"' EXIT

# The socket exists before any daemon runs: that is the point.
for _ in $(seq 100); do [[ -S $socket ]] && break; sleep 0.05; done

# This first connection starts the daemon.
echo 'const xs = [1, 2, 3]; xs.map((x) => x * 2)' |
    "$conduit" exec --socket "$socket" --lang typescript -
"$conduit" call --socket "$socket" ping
