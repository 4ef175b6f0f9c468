#!/usr/bin/env bash
# gpu-smoke.sh: check a gpu-exporter release binary against real GPUs. Read-only: it never
# changes GPU settings (no nvidia-smi -pm/-pl/-mig/-r, no application clocks).
#
# Usage: scripts/gpu-smoke.sh path/to/gpu-exporter
#
# What it does:
#   1. runs the binary with --backend nvml -c 1000 on 127.0.0.1:$PORT (default 19400);
#   2. waits (up to $READY_TIMEOUT s, default 60) for /ready to answer 200;
#   3. scrapes /metrics twice, $GAP seconds apart (default 3, so GPM deltas exist);
#   4. runs `promtool check metrics` on the second body: the lint findings that come with
#      dcgm-exporter's names (camelCase label names such as modelName/UUID, DCGM counters
#      without _total, DCGM_FI_DEV_PCIE_REPLAY_COUNTER naming its type) are filtered out;
#      any other finding or a parse error fails;
#   5. compares each value nvidia-smi also reports, per GPU, within these tolerances:
#        utilization.gpu  ±15 percentage points (both are short averages taken moments apart)
#        memory.used      ±max(64 MiB, 2 %)
#        memory.free      ±max(64 MiB, 2 %)
#        power.draw       ±max(20 W, 15 %)
#        temperature.gpu  ±3 °C
#        clocks.sm        ±max(100 MHz, 10 %)
#        clocks.mem       ±max(100 MHz, 10 %)
#      and prints a table. MIG-enabled GPUs export per-instance series only (-d f): their
#      utilisation and memory rows are "n/a", power/temperature/clocks are compared on the
#      instances' copies of the GPU's value;
#   6. checks what the driver quirks of docs/nvml.md would break: every `device` label is
#      nvidia<gpu>; DCGM_FI_DEV_MEMORY_TEMP, where present, is a whole number of °C from 1 to 200
#      (a mislabelled value reads as ~0); every GPU_I_PROFILE is DCGM's `<n>g.<m>gb` (no +me);
#      no PCIe/NVLink GPM byte series carries GPU_I_ID;
#   7. lists the default CSV's metrics missing from the body (informational: some GPUs lack
#      ECC, NVLink or GPM).
#
# Environment: BACKEND (default nvml; `sim` only to dry-run this script without a GPU), PORT, READY_TIMEOUT, GAP, PROMTOOL (default: promtool on PATH; if absent the
# promtool step is skipped, unless REQUIRE_PROMTOOL=1), NVIDIA_SMI (default nvidia-smi),
# OUT (if set, every output is written there as well), EXTRA_ARGS (more exporter flags).
# Exit status: 0 all checks passed, 1 a check failed, 2 usage or setup error.

set -euo pipefail

BIN=${1:-}
if [[ -z "$BIN" || ! -x "$BIN" ]]; then
    echo "usage: $0 path/to/gpu-exporter (an executable release binary)" >&2
    exit 2
fi
PORT=${PORT:-19400}
READY_TIMEOUT=${READY_TIMEOUT:-60}
GAP=${GAP:-3}
NVIDIA_SMI=${NVIDIA_SMI:-nvidia-smi}
PROMTOOL=${PROMTOOL:-$(command -v promtool || true)}
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CSV=${CSV:-$SCRIPT_DIR/../metrics-config/default-counters.csv}
WORK=$(mktemp -d)
OUT=${OUT:-}
BASE="http://127.0.0.1:$PORT"
failures=0

fail() {
    echo "FAIL: $*"
    failures=$((failures + 1))
}

save() {
    if [[ -n "$OUT" ]]; then
        mkdir -p "$OUT"
        cp "$WORK/$1" "$OUT/$1"
    fi
}

command -v curl >/dev/null || { echo "curl is required" >&2; exit 2; }
command -v "$NVIDIA_SMI" >/dev/null || { echo "$NVIDIA_SMI not found" >&2; exit 2; }

# 1. Start the exporter.
# shellcheck disable=SC2086 # EXTRA_ARGS is a word list on purpose
"$BIN" --backend "${BACKEND:-nvml}" -c 1000 -a "127.0.0.1:$PORT" ${EXTRA_ARGS:-} >"$WORK/exporter.log" 2>&1 &
PID=$!
cleanup() {
    kill "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
    save exporter.log || true
    rm -rf "$WORK"
}
trap cleanup EXIT

# 2. Wait for /ready.
ready=0
for _ in $(seq 1 "$((READY_TIMEOUT * 4))"); do
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "the exporter exited early:" >&2
        cat "$WORK/exporter.log" >&2
        exit 1
    fi
    code=$(curl -s -o "$WORK/ready.txt" -w '%{http_code}' "$BASE/ready" || true)
    if [[ "$code" == 200 ]]; then
        ready=1
        break
    fi
    sleep 0.25
done
if [[ "$ready" != 1 ]]; then
    echo "not ready after ${READY_TIMEOUT}s: $(cat "$WORK/ready.txt" 2>/dev/null)" >&2
    exit 1
fi
health=$(curl -s -o /dev/null -w '%{http_code}' "$BASE/health")
[[ "$health" == 200 ]] || fail "/health answered $health"

# 3. Scrape twice; nvidia-smi between them, so both read the same moment as closely as we can.
curl -sf "$BASE/metrics" >"$WORK/metrics-1.txt" || fail "first scrape failed"
sleep "$GAP"
"$NVIDIA_SMI" --query-gpu=index,uuid,mig.mode.current,utilization.gpu,memory.used,memory.free,power.draw,temperature.gpu,clocks.sm,clocks.mem \
    --format=csv,noheader,nounits >"$WORK/nvidia-smi.csv"
curl -sf "$BASE/metrics" >"$WORK/metrics-2.txt" || fail "second scrape failed"
save metrics-1.txt
save metrics-2.txt
save nvidia-smi.csv
BODY="$WORK/metrics-2.txt"

# 4. promtool.
if [[ -n "$PROMTOOL" && -x "$PROMTOOL" ]]; then
    set +e
    "$PROMTOOL" check metrics <"$BODY" >"$WORK/promtool.txt" 2>&1
    prc=$?
    set -e
    save promtool.txt
    grep -vE "^DCGM_[A-Z0-9_]+ (label names should be written in 'snake_case' not 'camelCase'|counter metrics should have \"_total\" suffix|metric name should not include type 'counter')$" \
        "$WORK/promtool.txt" >"$WORK/promtool-unexpected.txt" || true
    if [[ "$prc" != 0 && "$prc" != 3 ]]; then
        fail "promtool could not parse the body (exit $prc): $(head -3 "$WORK/promtool.txt")"
    elif [[ -s "$WORK/promtool-unexpected.txt" ]]; then
        fail "promtool findings beyond dcgm-exporter's naming:"
        cat "$WORK/promtool-unexpected.txt"
    else
        echo "promtool: OK ($(wc -l <"$WORK/promtool.txt") inherent DCGM-naming findings filtered)"
    fi
elif [[ "${REQUIRE_PROMTOOL:-0}" == 1 ]]; then
    fail "promtool not found (set PROMTOOL)"
else
    echo "promtool: SKIPPED (not found; set PROMTOOL=/path/to/promtool)"
fi

# 5. Compare with nvidia-smi.
# trim S: S without leading and trailing blanks.
trim() {
    local s=$1
    s=${s#"${s%%[![:space:]]*}"}
    s=${s%"${s##*[![:space:]]}"}
    printf '%s' "$s"
}
# value NAME UUID [any]: the value of series NAME for GPU UUID: the GPU-level series, or with
# "any" also a MIG instance's copy (parent-scope fields repeat the GPU's value on instances).
value() {
    local lines
    lines=$(grep -E "^$1\{" "$BODY" | grep -F "UUID=\"$2\"" || true)
    if [[ "${3:-}" != any ]]; then
        lines=$(grep -v 'GPU_I_ID=' <<<"$lines" || true)
    fi
    head -1 <<<"$lines" | awk '{print $NF}'
}
# within A B ABS PCT: |A-B| <= max(ABS, PCT% of B).
within() {
    awk -v a="$1" -v b="$2" -v abs="$3" -v pct="$4" 'BEGIN {
        d = a - b; if (d < 0) d = -d;
        tol = b * pct / 100; if (tol < 0) tol = -tol; if (tol < abs) tol = abs;
        exit !(d <= tol) }'
}
{
    printf '%-4s %-16s %-30s %12s %12s %10s %s\n' gpu check metric exporter nvidia-smi tolerance result
    while IFS=',' read -r idx uuid mig util used free power temp sm mem; do
        idx=$(trim "$idx") uuid=$(trim "$uuid") mig=$(trim "$mig")
        for row in \
            "utilization.gpu DCGM_FI_DEV_GPU_UTIL $util 15 0 gpu" \
            "memory.used DCGM_FI_DEV_FB_USED $used 64 2 gpu" \
            "memory.free DCGM_FI_DEV_FB_FREE $free 64 2 gpu" \
            "power.draw DCGM_FI_DEV_POWER_USAGE $power 20 15 parent" \
            "temperature.gpu DCGM_FI_DEV_GPU_TEMP $temp 3 0 parent" \
            "clocks.sm DCGM_FI_DEV_SM_CLOCK $sm 100 10 parent" \
            "clocks.mem DCGM_FI_DEV_MEM_CLOCK $mem 100 10 parent"; do
            read -r check metric smi abs pct scope <<<"$row"
            smi=$(trim "$smi")
            if [[ "$mig" == "Enabled" ]]; then
                got=$(value "$metric" "$uuid" any)
            else
                got=$(value "$metric" "$uuid")
            fi
            tol="±${abs}/${pct}%"
            if [[ "$mig" == "Enabled" && "$scope" == gpu ]]; then
                result="n/a (MIG: per instance)"
            elif [[ ! "$smi" =~ ^[0-9.]+$ ]]; then
                result="n/a (nvidia-smi: $smi)"
            elif [[ -z "$got" ]]; then
                result="MISSING"
            elif within "$got" "$smi" "$abs" "$pct"; then
                result="ok"
            else
                result="OUT OF TOLERANCE"
            fi
            printf '%-4s %-16s %-30s %12s %12s %10s %s\n' "$idx" "$check" "$metric" "${got:--}" "$smi" "$tol" "$result"
        done
    done <"$WORK/nvidia-smi.csv"
} >"$WORK/table.txt"
save table.txt
cat "$WORK/table.txt"
bad=$(grep -cE 'MISSING|OUT OF TOLERANCE' "$WORK/table.txt" || true)
[[ "$bad" == 0 ]] || fail "$bad comparisons with nvidia-smi failed"

# 6. What the driver quirks would break (docs/nvml.md, "Driver quirks").
bad_device=$(grep -E '^DCGM_[A-Z0-9_]+\{' "$BODY" | grep -vE '(^|[{,])gpu="([0-9]+)".*,device="nvidia\2"' | head -3 || true)
[[ -z "$bad_device" ]] || fail "device label is not nvidia<gpu>: $bad_device"
bad_temp=$(grep -E '^DCGM_FI_DEV_MEMORY_TEMP\{' "$BODY" | awk '$NF !~ /^[0-9]+$/ || $NF < 1 || $NF > 200' | head -3 || true)
[[ -z "$bad_temp" ]] || fail "memory temperature not a plausible whole °C: $bad_temp"
bad_profile=$(grep -oE 'GPU_I_PROFILE="[^"]*"' "$BODY" | sort -u | grep -vE '^GPU_I_PROFILE="[0-9]+g\.[0-9]+gb"$' || true)
[[ -z "$bad_profile" ]] || fail "GPU_I_PROFILE not named as DCGM names it: $bad_profile"
bad_gpm=$(grep -E '^DCGM_FI_PROF_(PCIE|NVLINK)_(TX|RX)_BYTES\{[^}]*GPU_I_ID=' "$BODY" | head -3 || true)
[[ -z "$bad_gpm" ]] || fail "GPU-level GPM bytes repeated on MIG instances: $bad_gpm"
echo "quirk checks: $([[ -z "$bad_device$bad_temp$bad_profile$bad_gpm" ]] && echo OK || echo FAILED)"

# 7. Default metrics missing from the body (informational).
if [[ -f "$CSV" ]]; then
    : >"$WORK/missing.txt"
    while IFS=',' read -r name typ _; do
        name=$(trim "$name") typ=$(trim "$typ")
        [[ -z "$name" || "$name" == \#* || "$typ" == label ]] && continue
        grep -qE "^$name\{" "$BODY" || echo "$name" >>"$WORK/missing.txt"
    done <"$CSV"
    save missing.txt
    if [[ -s "$WORK/missing.txt" ]]; then
        echo "default metrics absent on this hardware: $(tr '\n' ' ' <"$WORK/missing.txt")"
    else
        echo "every default metric is present"
    fi
fi
grep -E '^gpu_exporter_(gpus|sample_duration_seconds|field_errors_total)' "$BODY" || true

if [[ "$failures" != 0 ]]; then
    echo "gpu-smoke: $failures check(s) failed"
    exit 1
fi
echo "gpu-smoke: all checks passed"
