#!/usr/bin/env bash
# The Redis route's cost against Redis itself (see loadtests/redis.py); Redis on 127.0.0.1:6379.
#
#   loadtests/redis.sh   [N=50000] [C=20] [PIPELINE=1]
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtests/common.sh
LETHE="$lethe" "$venv/bin/python" loadtests/redis.py
