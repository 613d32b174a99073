#!/usr/bin/env bash
# Load test of the provider route: the same k6 load of chat completions goes straight to a fast
# OpenAI-compatible stand-in and through Lethe, in one run, whole answers and streams. Prints p50
# and p99 of each, the added latency of a whole answer and the added time to the first byte of a
# stream, and the CPU Lethe spent per request.
#
#   loadtests/openai.sh              RATE=200 DURATION=20s
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-200}
DURATION=${DURATION:-20s}
. loadtests/common.sh

provider_port=$(port); data_port=$(port); control_port=$(port)
target/release/examples/fast_upstream "$provider_port" load-user & pids+=($!)
cat > "$work/lethe.toml" <<TOML
[data_plane]
listen = "127.0.0.1:$data_port"
max_concurrency = 4096
[control_plane]
listen = "127.0.0.1:$control_port"
[state]
url = "sqlite://$work/state.db"
[[routes]]
name = "openai"
prefix = "/openai"
upstream = "http://127.0.0.1:$provider_port"
adapter = "openai"
credential = { header = "authorization", value = { value = "Bearer sk-load" } }
TOML
export LETHE_CONFIG="$work/lethe.toml" LETHE_LOG=warn
unset LETHE_STATE_URL LETHE_DATA_LISTEN LETHE_CONTROL_LISTEN
$lethe serve & lethe_pid=$!; pids+=($lethe_pid)
wait_http "http://127.0.0.1:$control_port/readyz"

dpo=$($lethe token --role compliance --tenant acme)
agent=$($lethe token --role agent --tenant acme --subject load-user)
curl -sf -X POST "http://127.0.0.1:$control_port/v1/consents" -H "authorization: Bearer $dpo" -H 'content-type: application/json' \
  -d '{"subject":"load-user","purpose":"support","category":"conversation","actions":["send_to_provider"],"source":"loadtest","policy_version":1}' >/dev/null

results="$work/results.jsonl"
run() { # name base mix [token]
  local name=$1 base=$2 mix=$3 token=${4:-}
  local before; before=$(ticks)
  "$venv/bin/k6" run -q --summary-export "$work/$name.json" -e BASE="$base" -e MIX="$mix" -e RATE="$RATE" \
    -e DURATION="$DURATION" -e TOKEN="$token" loadtests/openai.js >/dev/null
  record "$name" "$before" >> "$results"
}
for mix in chat stream; do
  run "direct-$mix" "http://127.0.0.1:$provider_port" $mix
  run "lethe-$mix" "http://127.0.0.1:$data_port/openai" $mix "$agent"
done

python3 - "$results" "$RATE" "$DURATION" <<'PY'
import json, sys
rows = {r["name"]: r for r in map(json.loads, open(sys.argv[1]))}
print(f"\nLoad: {sys.argv[2]} chat completions/s for {sys.argv[3]}, ~2 KB prompts, k6 constant arrival rate\n")
print(f"{'run':14} {'p50 ms':>8} {'p99 ms':>8} {'TTFB p50':>9} {'TTFB p99':>9} {'req/s':>7} {'failed':>7} {'Lethe CPU/req':>14}")
for r in rows.values():
    cpu = f"{r['cpu_s'] / r['count'] * 1e6:.0f} us" if r["name"].startswith("lethe") and r["count"] else "-"
    print(f"{r['name']:14} {r['p50']:8.3f} {r['p99']:8.3f} {r['ttfb50']:9.3f} {r['ttfb99']:9.3f} {r['rps']:7.1f} {r['failed']:7.2%} {cpu:>14}")
d, l = rows["direct-chat"], rows["lethe-chat"]
print(f"\nwhole answer: added p50 {l['p50'] - d['p50']:+.3f} ms, added p99 {l['p99'] - d['p99']:+.3f} ms (p99 x{l['p99'] / d['p99']:.2f})")
d, l = rows["direct-stream"], rows["lethe-stream"]
print(f"stream: added time to first byte p50 {l['ttfb50'] - d['ttfb50']:+.3f} ms, p99 {l['ttfb99'] - d['ttfb99']:+.3f} ms;"
      f" whole stream p50 {d['p50']:.1f} -> {l['p50']:.1f} ms")
PY
