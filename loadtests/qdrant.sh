#!/usr/bin/env bash
# Load test of the Qdrant route: for a query mix and an upsert mix, the same k6 load goes straight
# to a real Qdrant (../shared/tools/qdrant) and through Lethe's /qdrant route, in one run. Prints
# p50, p99 and throughput of each, the ratios, and the CPU Lethe spent per request.
#
#   loadtests/qdrant.sh              RATE=500 DURATION=20s BODY_BYTES=2048 MIXES="query upsert"
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-500}
DURATION=${DURATION:-20s}
BODY_BYTES=${BODY_BYTES:-2048}
MIXES=${MIXES:-query upsert}
. loadtests/common.sh

qdrant_port=$(port); data_port=$(port); control_port=$(port)
mkdir -p "$work/qdrant"
(cd "$work/qdrant" && QDRANT__SERVICE__HOST=127.0.0.1 QDRANT__SERVICE__HTTP_PORT=$qdrant_port \
  QDRANT__SERVICE__GRPC_PORT=$(port) QDRANT__STORAGE__STORAGE_PATH="$work/qdrant/storage" \
  QDRANT__STORAGE__SNAPSHOTS_PATH="$work/qdrant/snapshots" QDRANT__TELEMETRY_DISABLED=true \
  exec "$OLDPWD/../shared/tools/qdrant/qdrant" >"$work/qdrant/server.log" 2>&1) & pids+=($!)
cat > "$work/lethe.toml" <<TOML
[data_plane]
listen = "127.0.0.1:$data_port"
max_concurrency = 4096
[control_plane]
listen = "127.0.0.1:$control_port"
[state]
url = "sqlite://$work/state.db"
[[routes]]
name = "qdrant"
prefix = "/qdrant"
upstream = "http://127.0.0.1:$qdrant_port"
adapter = "qdrant"
TOML
export LETHE_CONFIG="$work/lethe.toml" LETHE_LOG=warn
unset LETHE_STATE_URL LETHE_DATA_LISTEN LETHE_CONTROL_LISTEN LETHE_UPSTREAM_QDRANT
$lethe serve & lethe_pid=$!; pids+=($lethe_pid)
wait_http "http://127.0.0.1:$qdrant_port/readyz"
wait_http "http://127.0.0.1:$control_port/readyz"

dpo=$($lethe token --role compliance --tenant acme)
admin=$($lethe token --role admin --tenant acme)
agent=$($lethe token --role agent --tenant acme --subject load-user)
control() { curl -sf -X "$1" "http://127.0.0.1:$control_port$2" -H "authorization: Bearer $dpo" -H 'content-type: application/json' -d "$3" >/dev/null; }
control PUT /v1/retention-rules '{"rules":[{"purpose":"personalization","category":"preference","max_age":"30d"}]}'
control POST /v1/consents '{"subject":"load-user","purpose":"personalization","category":"preference","actions":["store","retrieve"],"source":"loadtest","policy_version":1}'
collection=loadtest
curl -sf -X PUT "http://127.0.0.1:$data_port/qdrant/collections/$collection" -H "authorization: Bearer $admin" \
  -H 'content-type: application/json' -d '{"vectors":{"size":16,"distance":"Cosine"}}' >/dev/null
# Seed 200 stamped points through Lethe, so that both paths query the same realistic data.
"$venv/bin/k6" run -q --no-summary -e BASE="http://127.0.0.1:$data_port/qdrant" -e COLLECTION="$collection" \
  -e MIX=upsert -e TOKEN="$agent" -e RATE=100 -e DURATION=2s loadtests/qdrant.js >/dev/null

results="$work/results.jsonl"
run() { # name base mix [token]
  local name=$1 base=$2 mix=$3 token=${4:-}
  local before; before=$(ticks)
  "$venv/bin/k6" run -q --summary-export "$work/$name.json" -e BASE="$base" -e COLLECTION="$collection" \
    -e MIX="$mix" -e RATE="$RATE" -e DURATION="$DURATION" -e BODY_BYTES="$BODY_BYTES" -e TOKEN="$token" \
    loadtests/qdrant.js >/dev/null
  record "$name" "$before" >> "$results"
}
for mix in $MIXES; do
  run "qdrant-direct-$mix" "http://127.0.0.1:$qdrant_port" "$mix"
  run "qdrant-lethe-$mix" "http://127.0.0.1:$data_port/qdrant" "$mix" "$agent"
done

python3 - "$results" "$RATE" "$DURATION" "$BODY_BYTES" <<'PY'
import json, sys
rows = {r["name"]: r for r in map(json.loads, open(sys.argv[1]))}
print(f"\nLoad: {sys.argv[2]} requests/s for {sys.argv[3]}, ~{sys.argv[4]} B bodies, k6 constant arrival rate\n")
print(f"{'run':22} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} {'failed':>7} {'Lethe CPU/req':>14}")
for r in rows.values():
    cpu = f"{r['cpu_s'] / r['count'] * 1e6:.0f} us" if "lethe" in r["name"] and r["count"] else "-"
    print(f"{r['name']:22} {r['p50']:8.3f} {r['p99']:8.3f} {r['rps']:8.1f} {r['failed']:7.2%} {cpu:>14}")
print()
for mix in ("query", "upsert"):
    if f"qdrant-direct-{mix}" not in rows:
        continue
    d, l = rows[f"qdrant-direct-{mix}"], rows[f"qdrant-lethe-{mix}"]
    print(f"qdrant {mix:6}: through Lethe / direct  p50 x{l['p50'] / d['p50']:.2f}  p99 x{l['p99'] / d['p99']:.2f}"
          f"  added p50 {l['p50'] - d['p50']:+.3f} ms  added p99 {l['p99'] - d['p99']:+.3f} ms  throughput x{l['rps'] / d['rps']:.2f}")
PY
