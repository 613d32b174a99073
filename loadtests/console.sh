#!/usr/bin/env bash
# Page timings of the compliance console with many erasure requests (see loadtests/console.py).
#
#   loadtests/console.sh   REQUESTS=10000 N=200 [STATE=postgres://postgres@127.0.0.1:5432/postgres]
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtests/common.sh
LETHE="$lethe" "$venv/bin/python" loadtests/console.py
