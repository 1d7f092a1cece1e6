# Prepended to every documented shell block the docs test runs (scripts/doccheck/commands.py).
# __dc_server N KIND TARGET CMD: start CMD in its own process group with its log in
# $DC_LOGS/server-N.log and wait until it is ready (KIND http: GET 127.0.0.1:TARGET (PORT/PATH)
# answers 2xx; KIND log: the log prints TARGET), failing if it exits first or is not ready in
# $DC_READY_TIMEOUT s. __dc_foreground: the same, after stopping the previous foreground
# server. Every server still running is stopped (SIGTERM, then its exit awaited) on exit.
set -eo pipefail
__dc_groups=()
__dc_fg=""
__dc_stop() {
    local pid=$1
    kill -TERM -- "-$pid" 2>/dev/null || return 0
    local deadline=$((SECONDS + 30))
    while kill -0 -- "-$pid" 2>/dev/null; do
        if ((SECONDS > deadline)); then kill -KILL -- "-$pid" 2>/dev/null; break; fi
        sleep 0.1
    done
}
__dc_cleanup() {
    local rc=$?
    for pid in "${__dc_groups[@]}"; do __dc_stop "$pid"; done
    exit "$rc"
}
trap __dc_cleanup EXIT
trap "exit 143" TERM INT
__dc_ready() {
    if [ "$1" = http ]; then
        curl -sf -o /dev/null "http://127.0.0.1:$2" 2>/dev/null
    else
        grep -qF -- "$2" "$3" 2>/dev/null
    fi
}
__dc_server() {
    local n=$1 kind=$2 target=$3 cmd=$4 log="$DC_LOGS/server-$1.log"
    setsid bash -c "$cmd" >"$log" 2>&1 </dev/null &
    local pid=$!
    __dc_groups+=("$pid")
    echo "$pid" >>"$DC_LOGS/groups"
    __dc_last=$pid
    local deadline=$((SECONDS + ${DC_READY_TIMEOUT:-90}))
    until __dc_ready "$kind" "$target" "$log"; do
        if ! kill -0 "$pid" 2>/dev/null; then
            echo "docs test: server exited before it was ready: $cmd" >&2
            cat "$log" >&2
            return 1
        fi
        if ((SECONDS > deadline)); then
            echo "docs test: server not ready in ${DC_READY_TIMEOUT:-90} s: $cmd" >&2
            cat "$log" >&2
            return 1
        fi
        sleep 0.2
    done
}
__dc_foreground() {
    if [ -n "$__dc_fg" ]; then __dc_stop "$__dc_fg"; fi
    __dc_server "$@"
    __dc_fg=$__dc_last
}
