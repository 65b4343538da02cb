#!/usr/bin/env bash
# The Dask scaling benchmark on a lent machine with no network (run from the repository root):
#
#     bash bench/device_scaling.sh            # $OUT: where scaling.json and scaling.log go
#
# Installs the wheels under .whl/ (everything the services and the Dask cluster need that the
# machine's Python 3.12 lacks or has too old: grpcio, grpcio-health-checking, protobuf, gmpy2,
# phe, cryptography, cffi, dask, distributed and their dependencies; numpy, pandas, pyarrow
# are the machine's) into $SITE, prints the machine and the versions, then runs
# bench/bench_scaling.py: one ERO audit with W = 16, 8, 4, 2, 1 Dask workers (largest first)
# and one with local process pools, skipping runs that would end after BUDGET_S seconds.
# Overrides: PYTHON (python3), MEMBERS (200000), WORKERS (16,8,4,2,1), BUDGET_S (480),
# SITE (/tmp/site), DATA (/tmp/ppre-bench-data), OUT (/tmp/ppre-scaling-out).
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c "import numpy, pandas, pyarrow" 2>/dev/null && [ -x /opt/torch/.venv/bin/python3 ]; then
    PYTHON=/opt/torch/.venv/bin/python3
fi
if [ "$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" != "3.12" ]; then
    echo "WARNING: $PYTHON is not Python 3.12; the binary wheels in .whl/ are for CPython 3.12"
fi
MEMBERS=${MEMBERS:-200000}
WORKERS=${WORKERS:-16,8,4,2,1}
BUDGET_S=${BUDGET_S:-480}
SITE=${SITE:-/tmp/site}
DATA=${DATA:-/tmp/ppre-bench-data}
OUT=${OUT:-/tmp/ppre-scaling-out}
mkdir -p "$OUT" "$DATA"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INDEX=1

t0=$(date +%s)
rm -rf "$SITE" && mkdir -p "$SITE"
if ! "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        .whl/*.whl; then
    # no pip there (or it failed): a wheel without .data/ (none of these has one) is just unpacked
    echo "pip install failed; unpacking the wheels instead"
    rm -rf "$SITE" && mkdir -p "$SITE"
    for w in .whl/*.whl; do "$PYTHON" -m zipfile -e "$w" "$SITE" || exit 1; done
fi
# byte-compile now, so that the first run's processes do not all compile the same modules at once
"$PYTHON" -m compileall -q -j 0 "$SITE" >/dev/null 2>&1
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
echo "wheels installed and compiled in $(( $(date +%s) - t0 )) s into $SITE ($(ls .whl/*.whl | wc -l) wheels)"

{
    echo "nproc: $(nproc)   $(grep -m1 'model name' /proc/cpuinfo)"
    free -g | head -2
    echo "python: $(command -v "$PYTHON") $("$PYTHON" -V 2>&1)"
    "$PYTHON" - <<'EOF'
import importlib, os
names = ["numpy", "pandas", "pyarrow", "grpc", "google.protobuf", "grpc_health", "cryptography", "gmpy2", "phe",
         "dask", "distributed", "tornado", "msgpack", "cloudpickle", "psutil", "yaml", "zict", "tblib"]
for name in names:
    try:
        m = importlib.import_module(name)
        print(f"  {name:16} {getattr(m, '__version__', '?'):12} {os.path.dirname(m.__file__)}")
    except Exception as exc:
        print(f"  {name:16} MISSING: {type(exc).__name__}: {exc}")
# everything the services and the workers import on the audit path
import proto.ppre_pb2, proto.ppre_pb2_grpc, common.execution.dask_executor, common.crypto.paillier, common.crypto.commutative  # noqa
import tester_service.server, client_service.server, ppre.cli  # noqa
print("  imports of the services: ok;", "cpus", os.cpu_count(), "affinity", len(os.sched_getaffinity(0)))
EOF
} 2>&1 | tee "$OUT/environment.txt"

"$PYTHON" bench/bench_scaling.py --members "$MEMBERS" --workers "$WORKERS" --budget-s "$BUDGET_S" \
    --data "$DATA" --json "$OUT/scaling.json" 2>&1 | tee "$OUT/scaling.log"
rc=${PIPESTATUS[0]}
echo "device_scaling.sh: rc $rc, $(( $(date +%s) - t0 )) s in all"
exit "$rc"
