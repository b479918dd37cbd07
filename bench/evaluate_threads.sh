#!/usr/bin/env bash
# The evaluate stage with eval.threads 1 and 0 (all cores), interleaved, in a workspace whose
# pipeline outputs are checked out (e.g. a clone of a real-text experiment after `dvc checkout`):
#
#   bash bench/evaluate_threads.sh WORKSPACE [REPEATS]      # PYTHON=... picks the interpreter
#
# Prints, per run, the thread setting, the stage's own time (its summary line) and the md5 of
# metrics/eval.json (equal md5s: the thread count changed no figure). Edits WORKSPACE's params.yaml
# (eval.threads) and leaves it at the last setting, 0.
set -euo pipefail
WORK=${1:?usage: bash bench/evaluate_threads.sh WORKSPACE [REPEATS]}
REPEATS=${2:-3}
PYTHON=${PYTHON:-python}
cd "$WORK"
grep -q "^  threads: [0-9]" params.yaml || { echo "no eval threads line in $WORK/params.yaml" >&2; exit 2; }
lscpu | grep "Model name"; uptime
for _ in $(seq "$REPEATS"); do
    for t in 1 0; do
        sed -i "s/^  threads: [0-9]*/  threads: $t/" params.yaml
        line=$("$PYTHON" -m stages.evaluate 2>&1 | grep "^evaluate:")
        echo "eval.threads=$t ${line##*, } md5 $(md5sum metrics/eval.json | cut -c1-12)"
    done
done
uptime
