#!/usr/bin/env bash
# Load test of the hot path: for a query mix and an add mix, the same k6 load goes straight to the
# upstream and through Lethe, in one run, first against a real Chroma server and then against a
# minimal fast stand-in (so Lethe's own overhead shows), and through a second Lethe with
# derivative lineage off (`fast-nolineage`), so that its cost shows too. Prints p50, p99 and
# throughput of each, the ratios, and the CPU Lethe spent per request.
#
#   loadtests/run.sh                 RATE=500 DURATION=20s BODY_BYTES=2048 UPSTREAMS="chroma fast nolineage" MIXES="query add"
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-500}
DURATION=${DURATION:-20s}
BODY_BYTES=${BODY_BYTES:-2048}
UPSTREAMS=${UPSTREAMS:-chroma fast nolineage}
MIXES=${MIXES:-query add}
. loadtests/common.sh

chroma_port=$(port); fast_port=$(port); data_port=$(port); control_port=$(port)
off_data_port=$(port); off_control_port=$(port)
"$venv/bin/chroma" run --path "$work/chroma" --port "$chroma_port" >/dev/null 2>&1 & pids+=($!)
target/release/examples/fast_upstream "$fast_port" load-user & pids+=($!)
cat > "$work/lethe.toml" <<TOML
[data_plane]
listen = "127.0.0.1:$data_port"
max_concurrency = 4096
[control_plane]
listen = "127.0.0.1:$control_port"
[state]
url = "sqlite://$work/state.db"
[[routes]]
name = "chroma"
prefix = "/chroma"
upstream = "http://127.0.0.1:$chroma_port"
adapter = "chroma"
[[routes]]
name = "fast"
prefix = "/fast"
upstream = "http://127.0.0.1:$fast_port"
adapter = "chroma"
TOML
# The same, with derivative lineage off, on a state store of its own.
sed -e "s/127.0.0.1:$data_port/127.0.0.1:$off_data_port/" -e "s/127.0.0.1:$control_port/127.0.0.1:$off_control_port/" \
    -e "s|$work/state.db|$work/state-off.db|" "$work/lethe.toml" > "$work/lethe-off.toml"
printf '[lineage]\nderivatives = false\n' >> "$work/lethe-off.toml"
# One token key for both (each would otherwise generate its own in its state store).
export LETHE_LOG=warn LETHE_JWT_SECRET=loadtest-secret-of-both-lethes
unset LETHE_STATE_URL LETHE_DATA_LISTEN LETHE_CONTROL_LISTEN
LETHE_CONFIG="$work/lethe.toml" $lethe serve & lethe_pid=$!; pids+=($lethe_pid)
LETHE_CONFIG="$work/lethe-off.toml" $lethe serve & off_pid=$!; pids+=($off_pid)
export LETHE_CONFIG="$work/lethe.toml"
wait_http "http://127.0.0.1:$chroma_port/api/v2/heartbeat"
wait_http "http://127.0.0.1:$control_port/readyz"
wait_http "http://127.0.0.1:$off_control_port/readyz"

dpo=$($lethe token --role compliance --tenant acme)
admin=$($lethe token --role admin --tenant acme)
agent=$($lethe token --role agent --tenant acme --subject load-user)
for cp in $control_port $off_control_port; do
  control() { curl -sf -X "$1" "http://127.0.0.1:$cp$2" -H "authorization: Bearer $dpo" -H 'content-type: application/json' -d "$3" >/dev/null; }
  control PUT /v1/retention-rules '{"rules":[{"purpose":"personalization","category":"preference","max_age":"30d"}]}'
  control POST /v1/consents '{"subject":"load-user","purpose":"personalization","category":"preference","actions":["store","retrieve"],"source":"loadtest","policy_version":1}'
done
collections="http://127.0.0.1:$data_port/chroma/api/v2/tenants/default_tenant/databases/default_database/collections"
collection=$(curl -sf -X POST "$collections" -H "authorization: Bearer $admin" -H 'content-type: application/json' \
  -d '{"name":"loadtest","get_or_create":true}' | python3 -c 'import json,sys; print(json.load(sys.stdin)["id"])')
# Seed 200 stamped records through Lethe, so that both paths query the same realistic data.
RATE=100 DURATION=2s "$venv/bin/k6" run -q --no-summary -e BASE="http://127.0.0.1:$data_port/chroma" -e COLLECTION="$collection" -e SALT=warm-up \
  -e MIX=add -e TOKEN="$agent" -e RATE=100 -e DURATION=2s loadtests/chroma.js >/dev/null

results="$work/results.jsonl"
run() { # name base mix [token] [pad] [measured pid]
  local name=$1 base=$2 mix=$3 token=${4:-} pad=${5:-} measured=${6:-$lethe_pid}
  local before; before=$(ticks "$measured")
  "$venv/bin/k6" run -q --summary-export "$work/$name.json" -e BASE="$base" -e COLLECTION="$collection" -e SALT="$name" \
    -e MIX="$mix" -e RATE="$RATE" -e DURATION="$DURATION" -e BODY_BYTES="$BODY_BYTES" -e TOKEN="$token" \
    ${pad:+-e PAD=1} loadtests/chroma.js >/dev/null
  record "$name" "$before" "$measured" >> "$results"
}
for mix in $MIXES; do
  for upstream in $UPSTREAMS; do
    case $upstream in
      chroma) run "chroma-direct-$mix" "http://127.0.0.1:$chroma_port" $mix
              run "chroma-lethe-$mix" "http://127.0.0.1:$data_port/chroma" $mix "$agent" ;;
      fast)   run "fast-direct-$mix" "http://127.0.0.1:$fast_port" $mix "" pad
              run "fast-lethe-$mix" "http://127.0.0.1:$data_port/fast" $mix "$agent" pad ;;
      nolineage) run "fast-nolineage-$mix" "http://127.0.0.1:$off_data_port/fast" $mix "$agent" pad "$off_pid" ;;
    esac
  done
done

python3 - "$results" "$RATE" "$DURATION" "$BODY_BYTES" <<'PY'
import json, sys
rows = {r["name"]: r for r in map(json.loads, open(sys.argv[1]))}
print(f"\nLoad: {sys.argv[2]} requests/s for {sys.argv[3]}, ~{sys.argv[4]} B bodies, k6 constant arrival rate\n")
print(f"{'run':22} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} {'failed':>7} {'Lethe CPU/req':>14}")
for r in rows.values():
    cpu = f"{r['cpu_s'] / r['count'] * 1e6:.0f} us" if "direct" not in r["name"] and r["count"] else "-"
    print(f"{r['name']:22} {r['p50']:8.3f} {r['p99']:8.3f} {r['rps']:8.1f} {r['failed']:7.2%} {cpu:>14}")
print()
for upstream in ("chroma", "fast"):
    for mix in ("query", "add"):
        if f"{upstream}-direct-{mix}" not in rows:
            continue
        d, l = rows[f"{upstream}-direct-{mix}"], rows[f"{upstream}-lethe-{mix}"]
        print(f"{upstream:6} {mix:5}: through Lethe / direct  p50 x{l['p50'] / d['p50']:.2f}  p99 x{l['p99'] / d['p99']:.2f}"
              f"  added p99 {l['p99'] - d['p99']:+.3f} ms  throughput x{l['rps'] / d['rps']:.2f}")
for mix in ("query", "add"):
    on, off = rows.get(f"fast-lethe-{mix}"), rows.get(f"fast-nolineage-{mix}")
    if on and off and on["count"] and off["count"]:
        cpu = lambda r: r["cpu_s"] / r["count"] * 1e6
        print(f"fast   {mix:5}: derivative lineage on / off  CPU/req {cpu(on):.0f} / {cpu(off):.0f} us"
              f" (x{cpu(on) / cpu(off):.2f})  p50 {on['p50']:.3f} / {off['p50']:.3f} ms  p99 {on['p99']:.3f} / {off['p99']:.3f} ms")
PY
