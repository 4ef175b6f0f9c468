#!/usr/bin/env bash
# Soak test: the exporter on the simulated 8-GPU fleet (loopback only) for a bounded time while
#  - a scenario makes GPU 3 fall off the bus and recover once a minute,
#  - the metrics CSV is rewritten (alternately with and without one row) and SIGHUP'd every 20 s,
#    and once a minute a broken CSV is SIGHUP'd (must be rejected, old config keeps serving),
#  - optionally a kubelet is restarted every 45 s (SOAK_KUBELET_CMD, see below),
#  - 4 workers scrape /metrics 10 times a second each, on fresh connections; every scrape must
#    answer 200 within 1 s, every body must parse (strict 0.0.4 parser in scripts/soak_scrape.py)
#    and every healthy GPU must have its series;
#  - meanwhile a connection flood from 127.0.0.2 (scripts/soak_flood.py) holds 300 silent
#    sockets, 100 slowloris clients and 50 half-sent TLS ClientHellos (malformed requests on this
#    plain port: a reconnect storm), renewing each as soon as the exporter closes it, and every
#    60 s opens 1,500 more silent sockets for 10 s, past the exporter's limit of 1,000
#    connections (--http-max-connections), so that it evicts (SOAK_FLOOD=0 turns the flood off);
#  - RSS (/proc/PID/status VmRSS) is sampled every 5 s and must not grow.
#
#   scripts/soak.sh [--duration SECONDS] [--bin PATH] [--out FILE]
#
# Defaults: 600 s, target/release/gpu-exporter (built if missing), summary JSON to stdout.
# SOAK_KUBELET_CMD: a command that serves a fake pod-resources API on $SOAK_KUBELET_SOCKET; when
# set, the exporter runs with -k against that socket and the command is restarted every 45 s.
set -euo pipefail
duration=600
bin=""
out=""
while [ $# -gt 0 ]; do
    case "$1" in
        --duration) duration="$2"; shift 2 ;;
        --bin) bin="$2"; shift 2 ;;
        --out) out="$2"; shift 2 ;;
        *) echo "usage: $0 [--duration SECONDS] [--bin PATH] [--out FILE]" >&2; exit 2 ;;
    esac
done
root="$(cd "$(dirname "$0")/.." && pwd)"
if [ -z "$bin" ]; then
    bin="$root/target/release/gpu-exporter"
    [ -x "$bin" ] || (cd "$root" && cargo build --release --bin gpu-exporter)
fi
work="$(mktemp -d)"
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

gpus=8
flaky=3
# The scenario: GPU 3 lost at 20 s past every minute, back at 40 s.
{
    echo 'profile = "8xH100-SXM"'
    echo 'seed = 7'
    for ((m = 0; m <= duration / 60 + 1; m++)); do
        printf '\n[[event]]\nat = "%ds"\ngpu = %d\naction = "fall-off-bus"\n' $((m * 60 + 20)) "$flaky"
        printf '\n[[event]]\nat = "%ds"\ngpu = %d\naction = "recover"\n' $((m * 60 + 40)) "$flaky"
    done
} > "$work/scenario.toml"
csv="$work/counters.csv"
cp "$root/metrics-config/default-counters.csv" "$csv"
grep -v '^DCGM_FI_DEV_MEM_CLOCK' "$root/metrics-config/default-counters.csv" > "$work/variant.csv"
printf 'DCGM_FI_DEV_GPU_TEMP, gauge, ok\nDCGM_FI_NOT_A_FIELD, gauge, broken\n' > "$work/broken.csv"

extra=()
if [ -n "${SOAK_KUBELET_CMD:-}" ]; then
    export SOAK_KUBELET_SOCKET="$work/kubelet.sock"
    bash -c "$SOAK_KUBELET_CMD" & kubelet_pid=$!
    pids+=("$kubelet_pid")
    extra=(-k --pod-resources-kubelet-socket "$SOAK_KUBELET_SOCKET")
fi
# On port 0: the exporter logs the port it got (one picked here could be taken before it binds).
"$bin" --backend sim --sim-scenario "$work/scenario.toml" -a "127.0.0.1:0" -c 1000 \
    -f "$csv" --http-max-connections 1000 "${extra[@]}" 2> "$work/exporter.log" &
exporter=$!
pids+=("$exporter")
port=
for _ in $(seq 1 100); do
    port="$(sed -n 's/.*gpu-exporter listening .*address=127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/exporter.log" | head -1)"
    [ -n "$port" ] && curl -fsS "http://127.0.0.1:$port/metrics" -o /dev/null 2>/dev/null && break
    sleep 0.2 # waiting for a separate process to start listening; not test synchronisation
done
[ -n "$port" ] || { echo "soak: the exporter logged no listening address:" >&2; cat "$work/exporter.log" >&2; exit 1; }

python3 "$root/scripts/soak_scrape.py" --url "http://127.0.0.1:$port/metrics" --duration "$duration" \
    --gpus "$gpus" --flaky-gpu "$flaky" > "$work/scrape.json" &
scraper=$!
pids+=("$scraper")
if [ "${SOAK_FLOOD:-1}" != 0 ]; then
    python3 "$root/scripts/soak_flood.py" --port "$port" --duration "$duration" > "$work/flood.json" &
    flood=$!
    pids+=("$flood")
else
    echo '{}' > "$work/flood.json"
fi

rss=()
reloads=0
broken=0
kubelet_restarts=0
start=$(date +%s)
while kill -0 "$scraper" 2>/dev/null; do
    sleep 5
    now=$(( $(date +%s) - start ))
    rss+=("$(awk '/VmRSS/ {print $2}' "/proc/$exporter/status")")
    if (( now % 20 < 5 )); then
        if (( (now / 20) % 2 )); then cp "$work/variant.csv" "$csv.tmp"; else cp "$root/metrics-config/default-counters.csv" "$csv.tmp"; fi
        mv "$csv.tmp" "$csv"; kill -HUP "$exporter"; reloads=$((reloads + 1))
    fi
    if (( now % 60 >= 30 && now % 60 < 35 )); then
        cp "$csv" "$work/good.csv"; cp "$work/broken.csv" "$csv"; kill -HUP "$exporter"; broken=$((broken + 1))
        sleep 1; cp "$work/good.csv" "$csv"; kill -HUP "$exporter"
    fi
    if [ -n "${SOAK_KUBELET_CMD:-}" ] && (( now % 45 < 5 )); then
        kill "$kubelet_pid" 2>/dev/null || true; wait "$kubelet_pid" 2>/dev/null || true
        bash -c "$SOAK_KUBELET_CMD" & kubelet_pid=$!; pids+=("$kubelet_pid"); kubelet_restarts=$((kubelet_restarts + 1))
    fi
done
scrape_rc=0
wait "$scraper" || scrape_rc=$?
[ -n "${flood:-}" ] && { wait "$flood" || true; }
alive=1; kill -0 "$exporter" 2>/dev/null || alive=0
final=$(curl -fsS "http://127.0.0.1:$port/metrics" || true)
reload_ok=$(grep -o 'gpu_exporter_config_reloads_total{result="success"} [0-9]*' <<<"$final" | awk '{print $2}')
reload_bad=$(grep -o 'gpu_exporter_config_reloads_total{result="failure"} [0-9]*' <<<"$final" | awk '{print $2}')
grep '^gpu_exporter_http_connections_closed_total{' <<<"$final" \
    | sed 's/.*reason="\([a-z_]*\)"} \([0-9]*\)/\1 \2/' > "$work/closed.txt" || true

# RSS: skip the first minute (warm-up), compare the mean of the first and last thirds.
python3 - "$work/scrape.json" "$work/flood.json" "$work/closed.txt" "$duration" "$reloads" "$broken" \
    "$kubelet_restarts" "$alive" "${reload_ok:-0}" "${reload_bad:-0}" "${rss[@]}" > "$work/summary.json" <<'PY'
import json, sys
scrape = json.load(open(sys.argv[1]))
flood = json.load(open(sys.argv[2]))
closed = {r: int(n) for r, n in (l.split() for l in open(sys.argv[3]) if l.strip())}
duration, reloads, broken, restarts, alive, ok, bad = map(int, sys.argv[4:11])
rss = [int(x) for x in sys.argv[11:] if x]
warm = rss[12:] if len(rss) > 24 else rss[len(rss) // 3:]
third = max(1, len(warm) // 3)
first, last = sum(warm[:third]) / third, sum(warm[-third:]) / third
growth = last - first
summary = dict(scrape, duration_s=duration, csv_reloads_sent=reloads, broken_csvs_sent=broken,
               reloads_success=ok, reloads_failure=bad, kubelet_restarts=restarts,
               exporter_alive=bool(alive), rss_kib_min=min(rss), rss_kib_max=max(rss),
               rss_kib_first_third=round(first), rss_kib_last_third=round(last),
               rss_growth_kib=round(growth), flood=flood, connections_closed=closed)
summary["rss_grew"] = growth > max(4096, 0.2 * first)
summary["pass"] = (scrape["error_count"] == 0 and alive == 1 and not summary["rss_grew"]
                   and scrape["flaky_absent"] > 0 and scrape["flaky_present"] > 0
                   and bad >= broken and ok > 0
                   and (not flood or (flood["closed_by_server"] > 0 and closed.get("evicted", 0) > 0)))
print(json.dumps(summary, indent=1))
PY
cat "$work/summary.json"
[ -n "$out" ] && cp "$work/summary.json" "$out"
grep -c 'metrics CSV reload rejected' "$work/exporter.log" | sed 's/^/rejected reloads logged: /'
python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["pass"] else 1)' "$work/summary.json"
