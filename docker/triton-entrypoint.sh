#!/usr/bin/env bash
# The Triton container's entry point (docker-compose.yml and deploy/k8s/triton.yaml):
#   1. the health endpoint `python3 -m serving.health --serve` in the background (HAProxy's
#      check: Triton ready AND every python-backend stub alive), with --restart-after when
#      $AVATAR_HEALTH_RESTART_AFTER is set (compose: a dead stub ends the container, whose
#      restart policy heals it; Kubernetes uses the liveness probe instead);
#   2. the command (tritonserver ...), with Triton's restricted-protocol flags added when
#      an API key is configured ($AVATAR_API_KEY or the file $AVATAR_API_KEY_FILE names;
#      the groups it guards are $AVATAR_RESTRICTED, default inference,model-repository:
#      health stays open for probes);
#   3. a drain on SIGTERM when $AVATAR_DRAIN_SECONDS is set: tritonserver 2.51 fails the
#      turns in flight at once when it gets SIGTERM (measured: a BLS turn's next stage is
#      refused with "Server not ready"), so this script first creates $AVATAR_DRAIN_FILE
#      (serving.health then answers 503 "draining": HAProxy sends no new turns, readiness
#      turns false), waits $AVATAR_DRAIN_SECONDS for the turns in flight, then passes the
#      signal on. Without it, tritonserver replaces this script (exec).
# Triton takes the key only as a flag, so it shows in `ps` inside this container (nowhere
# else: the compose secret / Kubernetes Secret is a file, not an argument of anything).
set -euo pipefail

key="${AVATAR_API_KEY:-}"
if [[ -z "$key" && -n "${AVATAR_API_KEY_FILE:-}" ]]; then
  key="$(tr -d ' \r\n' < "$AVATAR_API_KEY_FILE")"
fi
access=()
if [[ -n "$key" ]]; then
  groups="${AVATAR_RESTRICTED:-inference,model-repository}"
  access+=("--grpc-restricted-protocol=${groups}:avatar-api-key=${key}"
           "--http-restricted-api=${groups}:avatar-api-key=${key}")
fi

health=(python3 -m serving.health --serve "${AVATAR_HEALTH_PORT:-8003}")
if [[ -n "${AVATAR_HEALTH_RESTART_AFTER:-}" ]]; then
  health+=(--restart-after "$AVATAR_HEALTH_RESTART_AFTER")
fi
drain_file="${AVATAR_DRAIN_FILE:-}"
[[ -n "$drain_file" ]] && rm -f "$drain_file"  # left by a previous run of this container
"${health[@]}" &

if [[ -z "${AVATAR_DRAIN_SECONDS:-}" || -z "$drain_file" ]]; then
  exec "$@" "${access[@]}"
fi
"$@" "${access[@]}" &
server=$!
drain() {
  echo "triton-entrypoint: draining for ${AVATAR_DRAIN_SECONDS} s, then stopping" >&2
  touch "$drain_file"
  sleep "$AVATAR_DRAIN_SECONDS"
  kill -TERM "$server" 2>/dev/null || true
}
trap drain TERM INT
# a `wait` that the trap interrupts returns 143 while the server still runs: wait again
# until it has exited, then once more for its own status (bash keeps it)
while kill -0 "$server" 2>/dev/null; do
  wait "$server" || true
done
code=0
wait "$server" || code=$?
exit "$code"
