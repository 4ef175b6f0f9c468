#!/usr/bin/env python3
"""Generates the Grafana dashboards in dashboards/ (checked in; CI re-runs this and diffs).

    python3 scripts/gen-dashboards.py            # rewrite dashboards/*.json
    python3 scripts/gen-dashboards.py --check    # exit 1 if a checked-in file is out of date

Standard library only. Conventions (tests/artifacts.rs checks them):
- every panel and target uses the `${datasource}` variable; uids are fixed; schemaVersion is current;
- variables: hostname (the exporter's `hostname` label = the Kubernetes node name), gpu, namespace, pod;
- GPU-wide fields (power, temperature, clocks, PCIe, ECC...) are repeated on every MIG instance series
  of a GPU, so cluster sums take `max by (hostname, UUID)` first to count each GPU once;
- utilization of MIG instances comes from DCGM_FI_PROF_GR_ENGINE_ACTIVE (NVML has no per-instance
  GPU_UTIL), scaled to percent where it is shown next to DCGM_FI_DEV_GPU_UTIL.
"""

import json
import pathlib
import sys

SCHEMA_VERSION = 39  # Grafana 11.0
DS = {"type": "prometheus", "uid": "${datasource}"}
OUT = pathlib.Path(__file__).resolve().parent.parent / "dashboards"


class Layout:
    """Places panels left to right in a 24-column grid."""

    def __init__(self):
        self.x, self.y, self.row_h = 0, 0, 0
        self.next_id = 1

    def place(self, w, h):
        if self.x + w > 24:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        pos = {"h": h, "w": w, "x": self.x, "y": self.y}
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def row(self, title):
        if self.x:
            self.x, self.y, self.row_h = 0, self.y + self.row_h, 0
        panel = {"type": "row", "title": title, "collapsed": False, "panels": [],
                 "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}, "id": self.next_id}
        self.next_id += 1
        self.y += 1
        return panel


def target(expr, legend="", ref="A", instant=False, table=False):
    t = {"datasource": DS, "expr": expr, "refId": ref, "legendFormat": legend or "__auto", "range": not instant,
         "instant": instant}
    if table:
        t["format"] = "table"
    return t


def panel(layout, kind, title, targets, w=12, h=8, unit=None, desc="", minv=None, maxv=None, extra=None,
          thresholds=None, options=None):
    refs = "ABCDEFGHIJ"
    tgts = []
    for i, t in enumerate(targets):
        if isinstance(t, str):
            t = target(t)
        t = dict(t, refId=refs[i])
        tgts.append(t)
    defaults = {}
    if unit:
        defaults["unit"] = unit
    if minv is not None:
        defaults["min"] = minv
    if maxv is not None:
        defaults["max"] = maxv
    if thresholds:
        defaults["thresholds"] = {"mode": "absolute", "steps": [{"color": "green", "value": None}] + [
            {"color": c, "value": v} for v, c in thresholds]}
    p = {"type": kind, "title": title, "description": desc, "datasource": DS, "targets": tgts,
         "gridPos": layout.place(w, h), "id": layout.next_id,
         "fieldConfig": {"defaults": defaults, "overrides": []}, "options": options or {}}
    layout.next_id += 1
    if extra:
        p.update(extra)
    return p


def var_datasource():
    return {"name": "datasource", "label": "Data source", "type": "datasource", "query": "prometheus",
            "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": []}


def var_query(name, label, query, multi=True, include_all=True, all_value=".*"):
    v = {"name": name, "label": label, "type": "query", "datasource": DS,
         "query": {"query": query, "refId": f"{name}-var"}, "definition": query,
         "refresh": 2, "sort": 3 if name == "gpu" else 1, "multi": multi, "includeAll": include_all,
         "current": {}, "hide": 0, "regex": "", "options": []}
    if include_all:
        v["allValue"] = all_value
    return v


def dashboard(uid, title, desc, variables, panels, tags):
    return {
        "__inputs": [],
        "uid": uid,
        "title": title,
        "description": desc,
        "tags": ["gpu", "nvidia", "gpu-exporter"] + tags,
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "weekStart": "",
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
            "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts", "type": "dashboard"}]},
        "links": [{"title": "GPU dashboards", "type": "dashboards", "tags": ["gpu-exporter"], "asDropdown": True,
                   "includeVars": True, "keepTime": True}],
        "templating": {"list": variables},
        "panels": panels,
    }


HOST = 'hostname=~"$hostname"'


def cluster():
    L = Layout()
    H = HOST
    util = (f'DCGM_FI_DEV_GPU_UTIL{{{H}}} or 100 * DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{H}, GPU_I_ID!=""}}')
    stat = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}, "colorMode": "value",
            "graphMode": "area", "textMode": "auto"}
    panels = [
        L.row("Fleet"),
        panel(L, "stat", "GPUs", [f'count(count by (hostname, UUID) (DCGM_EXP_GPU_HEALTH_STATUS{{{H}}}))'],
              w=4, h=4, desc="GPUs seen by the exporters (lost GPUs included).", options=stat),
        panel(L, "stat", "Nodes", [f'count(count by (hostname) (DCGM_EXP_GPU_HEALTH_STATUS{{{H}}}))'],
              w=4, h=4, options=stat),
        panel(L, "stat", "Average utilization", [f'avg({util})'], w=4, h=4, unit="percent", minv=0, maxv=100,
              desc="Whole GPUs: DCGM_FI_DEV_GPU_UTIL. MIG instances: graphics engine activity.", options=stat),
        panel(L, "stat", "Power draw", [f'sum(max by (hostname, UUID) (DCGM_FI_DEV_POWER_USAGE{{{H}}}))'],
              w=4, h=4, unit="watt", options=stat,
              desc="Each GPU counted once (MIG instance series repeat their GPU's power)."),
        panel(L, "stat", "Framebuffer used",
              [f'sum(DCGM_FI_DEV_FB_USED{{{H}}}) / sum(DCGM_FI_DEV_FB_USED{{{H}}} + DCGM_FI_DEV_FB_FREE{{{H}}})'],
              w=4, h=4, unit="percentunit", minv=0, maxv=1, options=stat, thresholds=[(0.8, "orange"), (0.95, "red")]),
        panel(L, "stat", "Idle allocated GPUs",
              [f'count((avg_over_time(DCGM_FI_DEV_GPU_UTIL{{{H}, pod!=""}}[30m]) < 10) or '
               f'(avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{H}, pod!="", GPU_I_ID!=""}}[30m]) < 0.1)) or vector(0)'],
              w=4, h=4, options=stat, thresholds=[(1, "orange")],
              desc="GPUs and MIG instances held by a pod whose utilization averaged under 10 % over 30 minutes "
                   "(the GPUUnderutilized alert fires after an hour of this)."),
        panel(L, "piechart", "GPUs by health state", [
            target(f'count(max by (hostname, UUID) (DCGM_EXP_GPU_HEALTH_STATUS{{{H}, health_watch="ALL"}}) == 0)', "pass"),
            target(f'count(max by (hostname, UUID) (DCGM_EXP_GPU_HEALTH_STATUS{{{H}, health_watch="ALL"}}) == 10)', "warn"),
            target(f'count(max by (hostname, UUID) (DCGM_EXP_GPU_HEALTH_STATUS{{{H}, health_watch="ALL"}}) == 20)', "fail"),
        ], w=6, h=8, desc="Worst DCGM-style health watch per GPU: 0 pass, 10 warn, 20 fail.",
            options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                     "pieType": "donut", "legend": {"displayMode": "table", "placement": "right", "values": ["value"]}}),
        panel(L, "table", "Failing and warning health checks", [
            target(f'max by (hostname, gpu, UUID, health_watch, health_error_code) '
                   f'(DCGM_EXP_GPU_HEALTH_STATUS{{{H}, health_watch!="ALL"}}) > 0', instant=True, table=True)],
            w=10, h=8, desc="Every non-passing watch: 10 = warn, 20 = fail.",
            extra={"transformations": [{"id": "organize", "options": {"excludeByName": {"Time": True}}}]}),
        panel(L, "table", "GPUs by exporter state", [
            target('sum by (state) (gpu_exporter_gpus)', instant=True, table=True)],
            w=8, h=8, desc="From the exporters' self-metrics: healthy, unhealthy, lost (fell off the bus), "
                           "unreadable (NVML errors).",
            extra={"transformations": [{"id": "organize", "options": {"excludeByName": {"Time": True}}}]}),
        L.row("Utilization"),
        panel(L, "heatmap", "GPU utilization across the cluster", [target(util, "{{hostname}} {{gpu}} {{GPU_I_ID}}")],
              w=12, h=9, unit="percent",
              desc="How many GPUs (and MIG instances) ran at each utilization level over time.",
              options={"calculate": True, "calculation": {"yBuckets": {"mode": "size", "value": "10"}},
                       "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64},
                       "yAxis": {"unit": "percent", "min": 0, "max": 100}, "cellGap": 1,
                       "tooltip": {"show": True, "yHistogram": True}}),
        panel(L, "timeseries", "Average utilization per node", [
            target(f'avg by (hostname) ({util})', "{{hostname}}")], w=12, h=9, unit="percent", minv=0, maxv=100),
        panel(L, "table", "Idle GPUs held by pods", [
            target(f'avg_over_time(DCGM_FI_DEV_GPU_UTIL{{{H}, pod!=""}}[30m]) < 10', instant=True, table=True),
            target(f'100 * avg_over_time(DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{H}, pod!="", GPU_I_ID!=""}}[30m]) < 10',
                   instant=True, table=True)],
            w=24, h=7, unit="percent", desc="Allocated GPUs and MIG instances averaging under 10 % over 30 minutes.",
            extra={"transformations": [{"id": "merge", "options": {}}, {"id": "organize", "options": {
                "excludeByName": {"Time": True, "__name__": True, "instance": True, "job": True, "pci_bus_id": True,
                                  "device": True, "DCGM_FI_DRIVER_VERSION": True}}}]}),
        L.row("Power, temperature and memory"),
        panel(L, "timeseries", "Power draw per node", [
            target(f'sum by (hostname) (max by (hostname, UUID) (DCGM_FI_DEV_POWER_USAGE{{{H}}}))', "{{hostname}}")],
            w=12, h=8, unit="watt"),
        panel(L, "timeseries", "Total power draw", [
            target(f'sum(max by (hostname, UUID) (DCGM_FI_DEV_POWER_USAGE{{{H}}}))', "total")], w=12, h=8, unit="watt"),
        panel(L, "timeseries", "Hottest GPU per node", [
            target(f'max by (hostname) (DCGM_FI_DEV_GPU_TEMP{{{H}}})', "{{hostname}}")],
            w=12, h=8, unit="celsius", thresholds=[(80, "orange"), (85, "red")],
            extra={"fieldConfig": {"defaults": {"unit": "celsius", "custom": {"thresholdsStyle": {"mode": "line"}},
                                                "thresholds": {"mode": "absolute", "steps": [
                                                    {"color": "green", "value": None}, {"color": "orange", "value": 80},
                                                    {"color": "red", "value": 85}]}}, "overrides": []}}),
        panel(L, "bargauge", "Hottest GPUs", [
            target(f'topk(10, max by (hostname, gpu) (DCGM_FI_DEV_GPU_TEMP{{{H}}}))', "{{hostname}} GPU {{gpu}}",
                   instant=True)], w=12, h=8, unit="celsius", minv=20, maxv=100,
            thresholds=[(80, "orange"), (85, "red")],
            options={"displayMode": "gradient", "orientation": "horizontal",
                     "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}),
        panel(L, "timeseries", "Framebuffer used per node", [
            target(f'sum by (hostname) (DCGM_FI_DEV_FB_USED{{{H}}}) / '
                   f'sum by (hostname) (DCGM_FI_DEV_FB_USED{{{H}}} + DCGM_FI_DEV_FB_FREE{{{H}}})', "{{hostname}}")],
            w=12, h=8, unit="percentunit", minv=0, maxv=1),
        panel(L, "bargauge", "Fullest GPUs and MIG instances", [
            target(f'topk(10, DCGM_FI_DEV_FB_USED{{{H}}} / (DCGM_FI_DEV_FB_USED{{{H}}} + DCGM_FI_DEV_FB_FREE{{{H}}}))',
                   "{{hostname}} GPU {{gpu}} {{GPU_I_PROFILE}}", instant=True)],
            w=12, h=8, unit="percentunit", minv=0, maxv=1, thresholds=[(0.8, "orange"), (0.95, "red")],
            options={"displayMode": "gradient", "orientation": "horizontal",
                     "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}),
    ]
    variables = [var_datasource(),
                 var_query("hostname", "Node", "label_values(DCGM_EXP_GPU_HEALTH_STATUS, hostname)")]
    return dashboard("gpu-exporter-cluster", "GPU cluster overview",
                     "Fleet-wide GPU utilization, health, power, temperature and memory (gpu-exporter).",
                     variables, panels, ["cluster"])


def node():
    L = Layout()
    F = 'hostname=~"$hostname", gpu=~"$gpu"'
    ts = "timeseries"
    panels = [
        L.row("Utilization and memory"),
        panel(L, ts, "GPU utilization", [target(f'DCGM_FI_DEV_GPU_UTIL{{{F}}}', "GPU {{gpu}}")], w=8, unit="percent",
              minv=0, maxv=100, desc="Not available on MIG-enabled GPUs: see graphics engine activity."),
        panel(L, ts, "Graphics engine active", [
            target(f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{F}}}', "GPU {{gpu}} {{GPU_I_PROFILE}} {{GPU_I_ID}}")],
            w=8, unit="percentunit", minv=0, maxv=1, desc="Per GPU or MIG instance."),
        panel(L, ts, "Tensor and DRAM activity", [
            target(f'DCGM_FI_PROF_PIPE_TENSOR_ACTIVE{{{F}}}', "tensor GPU {{gpu}} {{GPU_I_ID}}"),
            target(f'DCGM_FI_PROF_DRAM_ACTIVE{{{F}}}', "dram GPU {{gpu}} {{GPU_I_ID}}")],
            w=8, unit="percentunit", minv=0, maxv=1),
        panel(L, ts, "Framebuffer used", [
            target(f'DCGM_FI_DEV_FB_USED{{{F}}}', "GPU {{gpu}} {{GPU_I_PROFILE}} {{GPU_I_ID}}")], w=8, unit="mbytes",
            desc="MiB, per GPU or MIG instance."),
        panel(L, ts, "Framebuffer used %", [
            target(f'DCGM_FI_DEV_FB_USED{{{F}}} / (DCGM_FI_DEV_FB_USED{{{F}}} + DCGM_FI_DEV_FB_FREE{{{F}}})',
                   "GPU {{gpu}} {{GPU_I_PROFILE}} {{GPU_I_ID}}")],
            w=8, unit="percentunit", minv=0, maxv=1, thresholds=[(0.95, "red")]),
        panel(L, ts, "Memory copy, encoder and decoder utilization", [
            target(f'max by (gpu) (DCGM_FI_DEV_MEM_COPY_UTIL{{{F}}})', "copy GPU {{gpu}}"),
            target(f'max by (gpu) (DCGM_FI_DEV_ENC_UTIL{{{F}}})', "enc GPU {{gpu}}"),
            target(f'max by (gpu) (DCGM_FI_DEV_DEC_UTIL{{{F}}})', "dec GPU {{gpu}}")],
            w=8, unit="percent", minv=0, maxv=100),
        L.row("Clocks, power and temperature"),
        panel(L, ts, "SM clock", [target(f'max by (gpu) (DCGM_FI_DEV_SM_CLOCK{{{F}}}) * 1000000', "GPU {{gpu}}")],
              w=8, unit="hertz"),
        panel(L, ts, "Memory clock", [target(f'max by (gpu) (DCGM_FI_DEV_MEM_CLOCK{{{F}}}) * 1000000', "GPU {{gpu}}")],
              w=8, unit="hertz"),
        panel(L, ts, "Power draw", [target(f'max by (gpu) (DCGM_FI_DEV_POWER_USAGE{{{F}}})', "GPU {{gpu}}")],
              w=8, unit="watt"),
        panel(L, "stat", "Energy used in the time range", [
            target(f'sum(max by (gpu) (increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{F}}}[$__range]))) / 3600000000',
                   "energy", instant=True)], w=8, unit="kwatth",
            desc="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION is in mJ; 1 kWh = 3.6e9 mJ.",
            options={"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}),
        panel(L, ts, "Temperature", [
            target(f'max by (gpu) (DCGM_FI_DEV_GPU_TEMP{{{F}}})', "GPU {{gpu}}"),
            target(f'max by (gpu) (DCGM_FI_DEV_MEMORY_TEMP{{{F}}})', "memory GPU {{gpu}}")],
            w=8, unit="celsius", thresholds=[(85, "red")]),
        panel(L, ts, "Throttling (share of time)", [
            target(f'max by (gpu) (rate(DCGM_FI_DEV_THERMAL_VIOLATION{{{F}}}[$__rate_interval])) / 1e9', "thermal GPU {{gpu}}"),
            target(f'max by (gpu) (rate(DCGM_FI_DEV_POWER_VIOLATION{{{F}}}[$__rate_interval])) / 1e9', "power GPU {{gpu}}")],
            w=8, unit="percentunit", minv=0, maxv=1,
            desc="Fraction of time clocks were held down for thermal or power reasons (violation counters, ns)."),
        panel(L, ts, "Clock events in the window", [
            target(f'max by (gpu, clock_event) (DCGM_EXP_CLOCK_EVENTS_COUNT{{{F}}})', "GPU {{gpu}} {{clock_event}}")],
            w=24, h=7, desc="Samples with each clock-event (throttle) reason within the exporter's window."),
        L.row("Interconnect"),
        panel(L, ts, "PCIe bandwidth", [
            target(f'max by (gpu) (DCGM_FI_PROF_PCIE_TX_BYTES{{{F}}})', "TX GPU {{gpu}}"),
            target(f'-max by (gpu) (DCGM_FI_PROF_PCIE_RX_BYTES{{{F}}})', "RX GPU {{gpu}}")],
            w=8, unit="Bps", desc="TX up, RX down."),
        panel(L, ts, "PCIe replays", [
            target(f'max by (gpu) (increase(DCGM_FI_DEV_PCIE_REPLAY_COUNTER{{{F}}}[$__rate_interval]))', "GPU {{gpu}}")],
            w=8, desc="PCIe packet retries; a steady rise means a bad link (GPUPCIeReplaysRising)."),
        panel(L, ts, "NVLink bandwidth", [
            target(f'max by (gpu) (DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL{{{F}}})', "GPU {{gpu}}")],
            w=8, unit="MBs", desc="TX+RX over all links, MB/s. Absent on GPUs without NVLink."),
        panel(L, ts, "NVLink errors", [
            target(f'max by (gpu) (increase(DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL{{{F}}}[$__rate_interval]))', "CRC flit GPU {{gpu}}"),
            target(f'max by (gpu) (increase(DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL{{{F}}}[$__rate_interval]))', "CRC data GPU {{gpu}}"),
            target(f'max by (gpu) (increase(DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL{{{F}}}[$__rate_interval]))', "replay GPU {{gpu}}"),
            target(f'max by (gpu) (increase(DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL{{{F}}}[$__rate_interval]))', "recovery GPU {{gpu}}")],
            w=24, h=7),
        L.row("Errors"),
        panel(L, "table", "ECC errors", [
            target(f'max by (gpu) (DCGM_FI_DEV_ECC_SBE_VOL_TOTAL{{{F}}})', "SBE volatile", instant=True, table=True),
            target(f'max by (gpu) (DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{{{F}}})', "DBE volatile", instant=True, table=True),
            target(f'max by (gpu) (DCGM_FI_DEV_ECC_SBE_AGG_TOTAL{{{F}}})', "SBE aggregate", instant=True, table=True),
            target(f'max by (gpu) (DCGM_FI_DEV_ECC_DBE_AGG_TOTAL{{{F}}})', "DBE aggregate", instant=True, table=True)],
            w=12, h=8, desc="Volatile counts reset when the driver reloads; aggregate counts persist.",
            extra={"transformations": [{"id": "merge", "options": {}},
                                       {"id": "organize", "options": {"excludeByName": {"Time": True},
                                                                      "renameByName": {"Value #A": "SBE volatile",
                                                                                       "Value #B": "DBE volatile",
                                                                                       "Value #C": "SBE aggregate",
                                                                                       "Value #D": "DBE aggregate"}}}]}),
        panel(L, "table", "Retired pages and remapped rows", [
            target(f'max by (gpu) (DCGM_FI_DEV_RETIRED_SBE{{{F}}})', instant=True, table=True),
            target(f'max by (gpu) (DCGM_FI_DEV_RETIRED_DBE{{{F}}})', instant=True, table=True),
            target(f'max by (gpu) (DCGM_FI_DEV_RETIRED_PENDING{{{F}}})', instant=True, table=True),
            target(f'max by (gpu) (DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS{{{F}}})', instant=True, table=True),
            target(f'max by (gpu) (DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS{{{F}}})', instant=True, table=True),
            target(f'max by (gpu) (DCGM_FI_DEV_ROW_REMAP_FAILURE{{{F}}})', instant=True, table=True)],
            w=12, h=8, desc="Page retirement (before Ampere) and row remapping (Ampere and newer).",
            extra={"transformations": [{"id": "merge", "options": {}},
                                       {"id": "organize", "options": {"excludeByName": {"Time": True},
                                                                      "renameByName": {"Value #A": "retired SBE",
                                                                                       "Value #B": "retired DBE",
                                                                                       "Value #C": "retire pending",
                                                                                       "Value #D": "remapped (corr.)",
                                                                                       "Value #E": "remapped (uncorr.)",
                                                                                       "Value #F": "remap failed"}}}]}),
        panel(L, ts, "Last XID", [
            target(f'max by (gpu, err_code, err_msg) (DCGM_FI_DEV_XID_ERRORS{{{F}}})', "GPU {{gpu}}: {{err_msg}}")],
            w=12, h=8, desc="The last XID within the exporter's window (0 = none)."),
        panel(L, "table", "XIDs in the window", [
            target(f'max by (gpu, xid) (DCGM_EXP_XID_ERRORS_COUNT{{{F}}})', instant=True, table=True)],
            w=12, h=8, desc="Count of each XID within window_size_in_ms; a row without xid means none.",
            extra={"transformations": [{"id": "organize", "options": {"excludeByName": {"Time": True}}}]}),
        panel(L, "table", "Health checks", [
            target(f'max by (gpu, health_watch, health_error_code) (DCGM_EXP_GPU_HEALTH_STATUS{{{F}, health_watch!="ALL"}})',
                   instant=True, table=True)],
            w=24, h=8, desc="0 pass, 10 warn, 20 fail.",
            extra={"transformations": [{"id": "organize", "options": {"excludeByName": {"Time": True}}}]}),
    ]
    variables = [var_datasource(),
                 var_query("hostname", "Node", "label_values(DCGM_EXP_GPU_HEALTH_STATUS, hostname)",
                           multi=False, include_all=False),
                 var_query("gpu", "GPU", 'label_values(DCGM_EXP_GPU_HEALTH_STATUS{hostname=~"$hostname"}, gpu)')]
    return dashboard("gpu-exporter-node", "GPU node detail",
                     "One node's GPUs: utilization, memory, clocks, power, temperature and throttling, PCIe and "
                     "NVLink, ECC, retired/remapped memory, XIDs and health (gpu-exporter).",
                     variables, panels, ["node"])


def workloads():
    L = Layout()
    W = 'hostname=~"$hostname", namespace=~"$namespace", pod=~"$pod", pod!=""'
    util = f'DCGM_FI_DEV_GPU_UTIL{{{W}}} or 100 * DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{W}, GPU_I_ID!=""}}'
    ts = "timeseries"
    panels = [
        L.row("Per namespace"),
        panel(L, ts, "GPU memory per namespace", [
            target(f'sum by (namespace) (DCGM_FI_DEV_FB_USED{{{W}}})', "{{namespace}}")], w=8, unit="mbytes"),
        panel(L, ts, "GPU utilization per namespace", [target(f'avg by (namespace) ({util})', "{{namespace}}")],
              w=8, unit="percent", minv=0, maxv=100),
        panel(L, "bargauge", "GPUs and MIG slices held per namespace", [
            target(f'count by (namespace) (count by (namespace, hostname, UUID, GPU_I_ID) (DCGM_FI_DEV_FB_USED{{{W}}}))',
                   "{{namespace}}", instant=True)], w=8,
            options={"displayMode": "basic", "orientation": "horizontal",
                     "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False}}),
        L.row("Per pod and container"),
        panel(L, ts, "GPU memory per pod", [
            target(f'sum by (namespace, pod, container) (DCGM_FI_DEV_FB_USED{{{W}}})',
                   "{{namespace}}/{{pod}}/{{container}}")], w=12, unit="mbytes"),
        panel(L, ts, "GPU utilization per pod", [
            target(f'avg by (namespace, pod, container) ({util})', "{{namespace}}/{{pod}}/{{container}}")],
            w=12, unit="percent", minv=0, maxv=100,
            desc="Whole GPUs: DCGM_FI_DEV_GPU_UTIL; MIG slices: graphics engine activity."),
        panel(L, "table", "MIG slices per pod", [
            target(f'count by (namespace, pod, container, hostname, gpu, GPU_I_PROFILE, GPU_I_ID) '
                   f'(DCGM_FI_DEV_FB_USED{{{W}, GPU_I_ID!=""}})', instant=True, table=True)],
            w=12, desc="Which MIG instance each pod holds.",
            extra={"transformations": [{"id": "organize", "options": {"excludeByName": {"Time": True, "Value": True}}}]}),
        panel(L, "table", "Pods sharing GPUs", [
            target('gpu_exporter_gpu_pod_info{namespace=~"$namespace", pod=~"$pod"}', instant=True, table=True)],
            w=12, desc="Time-sliced / MPS GPUs held by several pods: their series carry no pod labels; "
                       "gpu_exporter_gpu_pod_info lists the holders.",
            extra={"transformations": [{"id": "organize", "options": {"excludeByName": {
                "Time": True, "Value": True, "__name__": True, "job": True}}}]}),
        panel(L, ts, "Utilization of shared GPUs, per holder", [
            target('max by (namespace, pod, container, UUID) (gpu_exporter_gpu_pod_info{namespace=~"$namespace", pod=~"$pod"} '
                   '* on (UUID) group_left () max by (UUID) (DCGM_FI_DEV_GPU_UTIL))',
                   "{{namespace}}/{{pod}} on {{UUID}}")], w=24, unit="percent", minv=0, maxv=100,
            desc="The whole GPU's utilization, shown for each pod sharing it (NVML cannot split it per pod)."),
    ]
    variables = [var_datasource(),
                 var_query("hostname", "Node", "label_values(DCGM_EXP_GPU_HEALTH_STATUS, hostname)"),
                 var_query("namespace", "Namespace", 'label_values(DCGM_FI_DEV_FB_USED{hostname=~"$hostname"}, namespace)'),
                 var_query("pod", "Pod", 'label_values(DCGM_FI_DEV_FB_USED{hostname=~"$hostname", namespace=~"$namespace"}, pod)')]
    return dashboard("gpu-exporter-workloads", "GPU workloads",
                     "GPU memory and utilization per namespace, pod and container; MIG slices and shared GPUs "
                     "(gpu-exporter with -k).", variables, panels, ["workloads", "kubernetes"])


def render(d):
    return json.dumps(d, indent=2, ensure_ascii=False) + "\n"


def main():
    check = "--check" in sys.argv[1:]
    stale = []
    for name, build in [("gpu-cluster.json", cluster), ("gpu-node.json", node), ("gpu-workloads.json", workloads)]:
        path = OUT / name
        text = render(build())
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path))
        else:
            path.write_text(text)
    if stale:
        print("out of date (run python3 scripts/gen-dashboards.py): " + ", ".join(stale), file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
