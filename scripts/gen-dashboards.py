#!/usr/bin/env python3
"""Generates the Grafana dashboards in dashboards/ (checked in; CI re-runs this and diffs).

    python3 scripts/gen-dashboards.py            # rewrite dashboards/*.json
    python3 scripts/gen-dashboards.py --check    # exit 1 if a checked-in file is out of date
    python3 scripts/gen-dashboards.py --requirement   # print the pip requirement of the pinned SDK

Built with Grafana's own grafana-foundation-sdk (PyPI), so panels, queries and variables follow
Grafana's dashboard schema by construction. The SDK is pinned exactly (SDK_VERSION below: the build
for Grafana 11.6, dashboard schemaVersion 41); a different version would change the output, so the
script refuses to run with any other. Install it with

    python3 -m pip install "$(python3 scripts/gen-dashboards.py --requirement)"

(scripts/ci-artifacts.sh does). To move to a newer Grafana, change SDK_VERSION, regenerate, and
review the diff of dashboards/.

Layout of this file: small helpers (a query, one helper per panel type, a Board that places panels
left to right on Grafana's 24-column grid), then one function per dashboard with one call per
panel. To add a panel, add one `board.add(...)` line where it should appear.

Conventions (tests/artifacts.rs checks them):
- every panel and target uses the `${datasource}` variable; uids are fixed; schemaVersion is current;
- variables: cluster (on every dashboard; "All" = `.*` also matches series without the label),
  hostname (the exporter's `hostname` label = the Kubernetes node name), gpu, namespace, pod;
  every query filters on `cluster=~"$cluster"` and aggregations keep `cluster`;
- cluster-dashboard panels that have a recording rule (alerts/gpu-exporter.recording.yml) are
  `recorded_or_raw(recorded, raw)`: the raw side's selectors carry `gpu=~"$raw"` (see below);
- GPU-wide fields (power, temperature, clocks, PCIe, ECC...) are repeated on every MIG instance series
  of a GPU, so cluster sums take `max by (cluster, hostname, UUID)` first to count each GPU once;
- utilization of MIG instances comes from DCGM_FI_PROF_GR_ENGINE_ACTIVE (NVML has no per-instance
  GPU_UTIL), scaled to percent where it is shown next to DCGM_FI_DEV_GPU_UTIL;
- both naming generations (docs/metric-names.md): every DCGM series that dcgm-exporter 4.9/4.10
  renamed is read through `m()`, which accepts the classic name or the newest one converted to the
  classic unit (NEWEST below), so one dashboard serves nodes of either kind, and a node whose CSV
  lists both is counted once.
"""

import importlib.metadata
import json
import pathlib
import sys

SDK = "grafana-foundation-sdk"
SDK_VERSION = "1769699379!11.6.0"  # <build timestamp>!<Grafana version>: the 2026-01-29 build for Grafana 11.6
REQUIREMENT = f"{SDK}=={SDK_VERSION}"


def _require_sdk():
    try:
        have = importlib.metadata.version(SDK)
    except importlib.metadata.PackageNotFoundError:
        have = None
    if have != SDK_VERSION:
        sys.exit(f"gen-dashboards.py needs {REQUIREMENT} (found {have or 'none'}): "
                 f"python3 -m pip install '{REQUIREMENT}'")


if __name__ == "__main__" and "--requirement" in sys.argv[1:]:
    print(REQUIREMENT)
    sys.exit(0)
_require_sdk()

# pylint: disable=wrong-import-position
from grafana_foundation_sdk.builders import bargauge, heatmap, piechart, prometheus, stat, table, timeseries  # noqa: E402
from grafana_foundation_sdk.builders import common as common_b  # noqa: E402
from grafana_foundation_sdk.builders import dashboard as dash  # noqa: E402
from grafana_foundation_sdk.cog.encoder import JSONEncoder  # noqa: E402
from grafana_foundation_sdk.models import common  # noqa: E402
from grafana_foundation_sdk.models import dashboard as model  # noqa: E402
from grafana_foundation_sdk.models import heatmap as heatmap_m  # noqa: E402
from grafana_foundation_sdk.models import piechart as piechart_m  # noqa: E402
from grafana_foundation_sdk.models import prometheus as prometheus_m  # noqa: E402

OUT = pathlib.Path(__file__).resolve().parent.parent / "dashboards"
DS = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
REF_IDS = "ABCDEFGHIJ"


# --- queries -------------------------------------------------------------------------------------

def q(expr, legend="", instant=False, table=False, fmt=None):
    """One PromQL target. Range query unless `instant`; `table` returns one row per series; `fmt`
    another result format (HEATMAP: cumulative `le` buckets, de-accumulated by Grafana)."""
    t = prometheus.Dataquery().datasource(DS).expr(expr).legend_format(legend or "__auto")
    t = t.instant() if instant else t.range()
    if table:
        fmt = prometheus_m.PromQueryFormat.TABLE
    if fmt:
        t = t.format(fmt)
    return t


# --- naming generations (docs/metric-names.md, "The rename table") -------------------------------
#
# classic name -> (newest name, PromQL that turns the newest value into the classic unit). The
# driver-version label is renamed too, so the two sides of `or` match ignoring both spellings.

# What panels reading DCGM_FI_PROF_* fields need on GPUs older than Hopper (docs/nvml.md).
PROF_NEEDS = (" DCGM_FI_PROF_* fields come from NVML GPM on Hopper and newer GPUs; on older ones (A100, L40S, "
              "A10, T4, V100) only from DCGM's profiling module, through a DCGM hostengine (e.g. the GPU "
              "Operator's nvidia-dcgm:5555 service): without one they are absent there "
              "(gpu_exporter_fields_unavailable lists them).")
MIG_UTIL_NEEDS = (" A MIG instance's utilization is its graphics engine activity (DCGM_FI_PROF_GR_ENGINE_ACTIVE): "
                  "on MIG GPUs older than Hopper it needs DCGM's profiling module, through a DCGM hostengine "
                  "(e.g. the GPU Operator's nvidia-dcgm:5555 service); without one those instances are left out.")

NEWEST = {
    "DCGM_FI_DEV_SM_CLOCK": ("DCGM_FI_DEV_SM_CLOCK_HERTZ", "/ 1000000"),
    "DCGM_FI_DEV_MEM_CLOCK": ("DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", "/ 1000000"),
    "DCGM_FI_DEV_MEMORY_TEMP": ("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", ""),
    "DCGM_FI_DEV_GPU_TEMP": ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", ""),
    "DCGM_FI_DEV_POWER_USAGE": ("DCGM_FI_DEV_BOARD_POWER_WATTS", ""),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", "* 1000"),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("DCGM_FI_DEV_PCIE_REPLAY_TOTAL", ""),
    "DCGM_FI_DEV_GPU_UTIL": ("DCGM_FI_DEV_GPU_UTIL_RATIO", "* 100"),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("DCGM_FI_DEV_MEMORY_UTIL_RATIO", "* 100"),
    "DCGM_FI_DEV_ENC_UTIL": ("DCGM_FI_DEV_ENC_UTIL_RATIO", "* 100"),
    "DCGM_FI_DEV_DEC_UTIL": ("DCGM_FI_DEV_DEC_UTIL_RATIO", "* 100"),
    "DCGM_FI_DEV_XID_ERRORS": ("DCGM_FI_DEV_XID_ERROR", ""),
    "DCGM_FI_DEV_FB_FREE": ("DCGM_FI_DEV_FB_FREE_BYTES", "/ 1048576"),
    "DCGM_FI_DEV_FB_USED": ("DCGM_FI_DEV_FB_USED_BYTES", "/ 1048576"),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ("DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND", "/ 1024000"),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", ""),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL", ""),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("DCGM_FI_DEV_ROW_REMAP_FAILED", ""),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", ""),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("DCGM_FI_PROF_TENSOR_UTIL_RATIO", ""),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("DCGM_FI_PROF_DRAM_UTIL_RATIO", ""),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND", ""),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND", ""),
}
DRIVER_LABELS = "DCGM_FI_DRIVER_VERSION, DCGM_FI_SYSTEM_DRIVER_VERSION"


def m(name, sel, wrap="{}"):
    """The series `name{sel}` (inside `wrap`, e.g. "rate({}[5m])"), in the classic unit, from
    either naming generation: `(classic or ignoring(driver labels) newest converted)`."""
    classic = wrap.format(f"{name}{{{sel}}}")
    if name not in NEWEST:
        return classic
    newest, convert = NEWEST[name]
    newest = wrap.format(f"{newest}{{{sel}}}") + (f" {convert}" if convert else "")
    return f"({classic} or ignoring({DRIVER_LABELS}) {newest})"


def names(*classic):
    """A selector of `classic` series by name, for label_values(): both generations' names."""
    return "|".join(n for c in classic for n in (c, *NEWEST.get(c, ())[:1]))


C = 'cluster=~"$cluster"'  # every query filters on it
EMPTY = '""'
CH = C + ', hostname=~"$hostname"'


def gpu_series(sel=""):
    """A selector of series every GPU has, whatever its CSV: the variables read it. gpu-exporter's
    default CSV has the health status; dcgm-exporter's default sets (either generation), which
    GPU Operator ConfigMaps carry, have the framebuffer."""
    return (f'{{__name__=~"DCGM_EXP_GPU_HEALTH_STATUS|{names("DCGM_FI_DEV_FB_USED")}"'
            + (f", {sel}" if sel else "") + "}")


# --- panels: one helper per panel type, sharing `_common` ---------------------------------------

def _reduce_last():
    return common_b.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)


def _common(p, title, targets, desc="", unit=None, minv=None, maxv=None, thresholds=None):
    """Title, description, data source, targets (refIds A, B, ...) and the standard field config.
    `thresholds`: [(value, color), ...] above a green base."""
    p = p.title(title).description(desc).datasource(DS)
    for ref, t in zip(REF_IDS, targets, strict=False):
        p = p.with_target(t.ref_id(ref))
    if len(targets) > len(REF_IDS):
        raise ValueError(f"panel {title!r}: more than {len(REF_IDS)} queries")
    if unit:
        p = p.unit(unit)
    if minv is not None:
        p = p.min(minv)
    if maxv is not None:
        p = p.max(maxv)
    if thresholds:
        steps = [model.Threshold(color="green", value=None)] + [model.Threshold(color=c, value=v) for v, c in thresholds]
        p = p.thresholds(dash.ThresholdsConfig().mode(model.ThresholdsMode.ABSOLUTE).steps(steps))
    return p


def timeseries_panel(title, targets, threshold_lines=False, **kw):
    p = _common(timeseries.Panel(), title, targets, **kw)
    if threshold_lines:
        p = p.thresholds_style(common_b.GraphThresholdsStyleConfig().mode(common.GraphThresholdsStyleMode.LINE))
    return p


def stat_panel(title, targets, **kw):
    return (_common(stat.Panel(), title, targets, **kw)
            .reduce_options(_reduce_last())
            .color_mode(common.BigValueColorMode.VALUE)
            .graph_mode(common.BigValueGraphMode.AREA)
            .text_mode(common.BigValueTextMode.AUTO))


def bargauge_panel(title, targets, display=common.BarGaugeDisplayMode.GRADIENT, **kw):
    return (_common(bargauge.Panel(), title, targets, **kw)
            .display_mode(display)
            .orientation(common.VizOrientation.HORIZONTAL)
            .reduce_options(_reduce_last()))


def piechart_panel(title, targets, **kw):
    legend = (piechart.PieChartLegendOptions().display_mode(common.LegendDisplayMode.TABLE)
              .placement(common.LegendPlacement.RIGHT).values([piechart_m.PieChartLegendValues.VALUE])
              .show_legend(True))
    return (_common(piechart.Panel(), title, targets, **kw)
            .pie_type(piechart_m.PieChartType.DONUT)
            .reduce_options(_reduce_last())
            .legend(legend))


def heatmap_panel(title, targets, scheme="Oranges", **kw):
    """A heatmap of pre-bucketed data: cumulative counts per `le` bound (a query in HEATMAP format),
    each cell drawn below its bound."""
    return (_common(heatmap.Panel(), title, targets, **kw)
            .calculate(False)
            .rows_frame(heatmap.RowsHeatmapOptions().layout(common.HeatmapCellLayout.LE))
            .color(heatmap.HeatmapColorOptions().mode(heatmap_m.HeatmapColorMode.SCHEME).scheme(scheme).steps(64))
            .y_axis(heatmap.YAxisConfig().unit(kw.get("unit") or "short"))
            .cell_gap(1)
            .mode(common.TooltipDisplayMode.SINGLE)
            .show_y_histogram())


def table_panel(title, targets, hide=(), rename=None, merge=False, **kw):
    """A table of instant queries. `Time` is always hidden; `hide` names more columns to hide;
    `merge` joins several queries' rows on their labels; `rename` maps column names."""
    p = _common(table.Panel(), title, targets, **kw)
    if merge:
        p = p.with_transformation(model.DataTransformerConfig(id_val="merge", options={}))
    organize = {"excludeByName": {name: True for name in ("Time", *hide)}}
    if rename:
        organize["renameByName"] = dict(rename)
    return p.with_transformation(model.DataTransformerConfig(id_val="organize", options=organize))


# --- dashboards ----------------------------------------------------------------------------------

class Board:
    """A dashboard being built: rows and panels are placed left to right on the 24-column grid,
    wrapping to a new line when a panel does not fit; ids are assigned in order. Every board has
    the `datasource` and `cluster` variables."""

    def __init__(self, uid, title, desc, tags, min_interval=None):
        self.uid, self.title, self.desc, self.tags = uid, title, desc, tags
        self.min_interval = min_interval  # every panel's minimum query step (Grafana's "Min interval")
        self.items = []  # (builder, is_row)
        self.variables = [dash.DatasourceVariable("datasource").label("Data source").type("prometheus")
                          .regex("")]
        self.x = self.y = self.line_h = 0
        self.next_id = 1
        self.variable("cluster", "Cluster", f"label_values({gpu_series()}, cluster)",
                      desc="The `cluster` label your central store or scrape config adds; "
                           "\"All\" also matches series without it (a single-cluster Prometheus).")

    def _newline(self):
        if self.x:
            self.x, self.y, self.line_h = 0, self.y + self.line_h, 0

    def row(self, title):
        self._newline()
        r = dash.Row(title).collapsed(False).id(self.next_id).grid_pos(model.GridPos(h=1, w=24, x=0, y=self.y))
        self.items.append((r, True))
        self.next_id += 1
        self.y += 1

    def add(self, w, h, panel):
        if self.x + w > 24:
            self._newline()
        if self.min_interval:
            panel = panel.interval(self.min_interval)
        self.items.append((panel.id(self.next_id).grid_pos(model.GridPos(h=h, w=w, x=self.x, y=self.y)), False))
        self.next_id += 1
        self.x += w
        self.line_h = max(self.line_h, h)

    def variable(self, name, label, query, multi=True, include_all=True, sort=model.VariableSort.ALPHABETICAL_ASC,
                 desc=None, regex="", hidden=False):
        """A query variable. With `include_all`, "All" is the regex `.*`, which also matches a
        label the series do not have."""
        v = (dash.QueryVariable(name).label(label).datasource(DS)
             .query({"query": query, "refId": f"{name}-var"})
             .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(sort)
             .multi(multi).include_all(include_all).regex(regex))
        if include_all:
            v = v.all_value(".*")
        if desc:
            v = v.description(desc)
        if hidden:
            v = v.hide(model.VariableHide.HIDE_VARIABLE)
        self.variables.append(v)

    def build(self):
        annotations = (dash.AnnotationQuery().name("Annotations & Alerts").built_in(1).type("dashboard")
                       .datasource(model.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
                       .enable(True).hide(True).icon_color("rgba(0, 211, 255, 1)"))
        links = (dash.DashboardLink("GPU dashboards").type(model.DashboardLinkType.DASHBOARDS)
                 .tags(["gpu-exporter"]).as_dropdown(True).include_vars(True).keep_time(True))
        b = (dash.Dashboard(self.title).uid(self.uid).description(self.desc)
             .tags(["gpu", "nvidia", "gpu-exporter"] + self.tags)
             .editable().tooltip(model.DashboardCursorSync.CROSSHAIR).version(1).refresh("30s")
             .time("now-6h", "now").timezone("browser").fiscal_year_start_month(0).live_now(False)
             .annotation(annotations).link(links).variables(self.variables))
        for item, is_row in self.items:
            b = b.with_row(item) if is_row else b.with_panel(item)
        return b.build()


# --- recorded series with a fallback (docs/fleet.md) ---------------------------------------------
#
# Panels of the cluster dashboard read the per-node series of alerts/gpu-exporter.recording.yml
# and fall back to the raw series where those rules are not loaded: each such query is
# `<recorded> or <raw>`. PromQL evaluates both sides of `or`, so the raw side must cost nothing
# while the recorded side has data: its selectors carry `gpu=~"$raw"`, and the hidden variable
# `raw` is `none` (no GPU has that index: the raw side selects nothing) when the recorded series
# exist in the selected clusters, and `.+` (every GPU) when they do not.

def raw_switch(probe):
    """The `raw` variable's query: `none` when the recorded series `probe` exists in the selected
    clusters, `.+` when not."""
    return ('query_result(label_replace(count(' + probe + '{cluster=~"$cluster"}), "raw", "none", "", "") '
            'or on () label_replace(vector(1), "raw", ".+", "", ""))')


def raw_variable(board, rules):
    board.variable("raw", "Raw series", raw_switch(rules), multi=False, include_all=False, regex='/raw="([^"]+)"/',
                   hidden=True, desc="none when the gpu-exporter recording rules are loaded (panels read them), "
                                      ".+ when not (panels read the raw series).")


# The heatmap reads eleven series per node; with every node selected it reads the per-cluster sum
# instead, and the per-node series only for a selection. Both sides of that `or` are evaluated too,
# so the hidden variable `per_node` is `none` (no node has that name: the per-node side selects
# nothing) when $hostname is "All" (its `.*`), and `.+` when some nodes are picked. The cluster
# series carry no hostname label, which `.*` matches and a node's name does not.
PER_NODE_SWITCH = ('query_result(label_replace(label_replace(label_replace(vector(1), "per_node", ".+", "", ""), '
                   '"h", "$hostname", "", ""), "per_node", "none", "h", "\\\\.\\\\*"))')


def recorded_or_raw(recorded, raw):
    """The recorded query, or the raw one when the recording rules are absent (see above)."""
    return f"{recorded}\nor\n{raw}"


def cluster():
    H = 'cluster=~"$cluster", hostname=~"$hostname"'  # recorded series and raw-only panels
    R = f'{H}, gpu=~"$raw"'  # the raw side of a recorded query
    # Utilization in percent: whole GPUs' GPU_UTIL, MIG instances' graphics engine activity.
    mig, held = ', GPU_I_ID!=""', ', pod!=""'
    util = f'{m("DCGM_FI_DEV_GPU_UTIL", R)} or 100 * {m("DCGM_FI_PROF_GR_ENGINE_ACTIVE", R + mig)}'
    # The worst of every watch (ALL is not a summary: it carries only DCGM_HEALTH_WATCH_ALL's
    # incidents, as dcgm-exporter's does), as the hostname:dcgm_gpus_by_health:count rules take it.
    health_all = f'max by (cluster, hostname, UUID) (DCGM_EXP_GPU_HEALTH_STATUS{{{R}}})'
    avg30 = "avg_over_time({}[30m])"
    idle_whole = f'{m("DCGM_FI_DEV_GPU_UTIL", R + held, avg30)} < 10'
    idle_mig = m("DCGM_FI_PROF_GR_ENGINE_ACTIVE", R + held + mig, avg30)
    idle_raw = f'({idle_whole}) or ({idle_mig} < 0.1)'
    idle_rec = f'pod_gpu:dcgm_gpu_utilization_percent:avg_over_time_30m{{{H}'
    buckets = range(0, 101, 10)
    # Without the rules: one sum per bucket (summed before the `or`, which then joins 11 series).
    util_buckets_raw = "\nor ".join(
        f'label_replace(sum(({util}) <= bool {le}), "le", "{le}", "", "")' for le in buckets)

    fb_used, fb_free = m("DCGM_FI_DEV_FB_USED", R), m("DCGM_FI_DEV_FB_FREE", R)

    def rec(metric, extra=""):
        return f"{metric}{{{H}{extra}}}"

    # A minimum step of 1 minute: the recorded series change every evaluation (15-60 s), a fleet
    # overview needs no finer grain, and at 8,000 GPUs a 15 s step makes each per-node panel read 4x
    # the points for nothing (BENCHMARKS.md, "Fleet").
    b = Board("gpu-exporter-cluster", "GPU cluster overview",
              "Fleet-wide GPU utilization, health, power, temperature and memory (gpu-exporter). Reads the "
              "recording rules of alerts/gpu-exporter.recording.yml where they are loaded.", ["cluster"],
              min_interval="1m")
    b.variable("hostname", "Node", f'label_values({gpu_series(C)}, hostname)')
    raw_variable(b, "hostname:dcgm_gpus:count")
    b.variable("per_node", "Per-node series", PER_NODE_SWITCH, multi=False, include_all=False,
               regex='/per_node="([^"]+)"/', hidden=True,
               desc="none when every node is selected (the heatmap reads the per-cluster recorded series), "
                    ".+ when some are (it reads the per-node ones).")

    b.row("Fleet")
    b.add(4, 4, stat_panel("GPUs", [q(recorded_or_raw(
        f'sum({rec("hostname:dcgm_gpus:count")})',
        f'count(count by (cluster, hostname, UUID) (DCGM_EXP_GPU_HEALTH_STATUS{{{R}, health_watch="ALL"}}))'))],
        desc="GPUs seen by the exporters (lost GPUs included)."))
    b.add(4, 4, stat_panel("Nodes", [q(recorded_or_raw(
        f'count({rec("hostname:dcgm_gpus:count")})',
        f'count(count by (cluster, hostname) (DCGM_EXP_GPU_HEALTH_STATUS{{{R}, health_watch="ALL"}}))'))]))
    b.add(4, 4, stat_panel("Average utilization", [q(recorded_or_raw(
        f'sum({rec("hostname:dcgm_gpu_utilization_percent:sum")}) / '
        f'sum({rec("hostname:dcgm_gpu_utilization_percent:count")})',
        f'avg({util})'))],
        unit="percent", minv=0, maxv=100,
        desc="Whole GPUs: DCGM_FI_DEV_GPU_UTIL. MIG instances: graphics engine activity." + MIG_UTIL_NEEDS))
    b.add(4, 4, stat_panel("Power draw", [q(recorded_or_raw(
        f'sum({rec("hostname:dcgm_power_usage_watts:sum")})',
        f'sum(max by (cluster, hostname, UUID) ({m("DCGM_FI_DEV_POWER_USAGE", R)}))'))],
        unit="watt", desc="Each GPU counted once (MIG instance series repeat their GPU's power)."))
    b.add(4, 4, stat_panel("Framebuffer used", [q(recorded_or_raw(
        f'sum({rec("hostname:dcgm_fb_used_mib:sum")}) / sum({rec("hostname:dcgm_fb_total_mib:sum")})',
        f'sum({fb_used}) / sum({fb_used} + {fb_free})'))],
        unit="percentunit", minv=0, maxv=1, thresholds=[(0.8, "orange"), (0.95, "red")]))
    b.add(4, 4, stat_panel("Idle allocated GPUs", [q(recorded_or_raw(
        f'sum({rec("hostname:dcgm_idle_allocated_gpus:count")})', f'count({idle_raw})') + "\nor\nvector(0)")],
        thresholds=[(1, "orange")],
        desc="GPUs and MIG instances held by a pod whose utilization averaged under 10 % over 30 minutes "
             "(the GPUUnderutilized alert fires after an hour of this)." + MIG_UTIL_NEEDS))
    b.add(6, 8, piechart_panel("GPUs by health state", [
        q(recorded_or_raw(f'sum({rec("hostname:dcgm_gpus_by_health:count", f", health={state!r}")})'.replace("'", '"'),
                          f'count({health_all} == {value})'), state)
        for state, value in [("pass", 0), ("warn", 10), ("fail", 20)]],
        desc="Worst DCGM-style health watch per GPU: 0 pass, 10 warn, 20 fail."))
    b.add(10, 8, table_panel("Failing and warning health checks", [q(recorded_or_raw(
        rec("gpu_watch:dcgm_health_status_not_passing:max"),
        f'max by (cluster, hostname, gpu, UUID, health_watch, health_error_code) '
        f'(DCGM_EXP_GPU_HEALTH_STATUS{{{R}, health_watch!="ALL", health_error_code!="DCGM_FR_OK"}} > 0)'), instant=True, table=True)],
        hide=("__name__",), desc="Every non-passing watch: 10 = warn, 20 = fail."))
    b.add(8, 8, table_panel("GPUs by exporter state", [
        q('sum by (state) (gpu_exporter_gpus{cluster=~"$cluster"})', instant=True, table=True)],
        desc="From the exporters' self-metrics: healthy, unhealthy, lost (fell off the bus), "
             "unreadable (NVML errors)."))

    b.row("Utilization")
    node_buckets = rec("hostname:dcgm_gpu_utilization_percent:bucket", ', hostname=~"$per_node"')
    b.add(12, 9, heatmap_panel("GPU utilization across the cluster", [q(recorded_or_raw(
        f'sum by (le) ({rec("cluster:dcgm_gpu_utilization_percent:bucket")}) or sum by (le) ({node_buckets})',
        util_buckets_raw),
        "{{le}}", fmt=prometheus_m.PromQueryFormat.HEATMAP)],
        unit="percent",
        desc="How many GPUs (and MIG instances) ran at each utilization level over time, in 10 % buckets "
             "(a cell at 30 % counts those over 20 % and up to 30 %; 0 % is exactly idle)." + MIG_UTIL_NEEDS))
    b.add(12, 9, timeseries_panel("Average utilization per node", [q(recorded_or_raw(
        rec("hostname:dcgm_gpu_utilization_percent:avg"),
        f'avg by (cluster, hostname) ({util})'), "{{hostname}}")],
        unit="percent", minv=0, maxv=100,
        desc="Whole GPUs: DCGM_FI_DEV_GPU_UTIL. MIG instances: graphics engine activity." + MIG_UTIL_NEEDS))
    b.add(24, 7, table_panel("Idle GPUs held by pods", [
        q(recorded_or_raw(f'{idle_rec}, GPU_I_ID=""}} < 10',
                          idle_whole), instant=True, table=True),
        q(recorded_or_raw(f'{idle_rec}, GPU_I_ID!=""}} < 10',
                          f'100 * {idle_mig} < 10'),
          instant=True, table=True)],
        merge=True, hide=("__name__", "instance", "job", "pci_bus_id", "device", "DCGM_FI_DRIVER_VERSION",
                          "DCGM_FI_SYSTEM_DRIVER_VERSION"),
        unit="percent", desc="Allocated GPUs and MIG instances averaging under 10 % over 30 minutes." + MIG_UTIL_NEEDS))

    b.row("Power, temperature and memory")
    b.add(12, 8, timeseries_panel("Power draw per node", [q(recorded_or_raw(
        f'sum by (cluster, hostname) ({rec("hostname:dcgm_power_usage_watts:sum")})',
        f'sum by (cluster, hostname) (max by (cluster, hostname, UUID) ({m("DCGM_FI_DEV_POWER_USAGE", R)}))'),
        "{{hostname}}")], unit="watt"))
    b.add(12, 8, timeseries_panel("Total power draw", [q(recorded_or_raw(
        f'sum({rec("hostname:dcgm_power_usage_watts:sum")})',
        f'sum(max by (cluster, hostname, UUID) ({m("DCGM_FI_DEV_POWER_USAGE", R)}))'), "total")], unit="watt"))
    b.add(12, 8, timeseries_panel("Hottest GPU per node", [q(recorded_or_raw(
        f'max by (cluster, hostname) ({rec("hostname:dcgm_gpu_temp_celsius:max")})',
        f'max by (cluster, hostname) ({m("DCGM_FI_DEV_GPU_TEMP", R)})'), "{{hostname}}")],
        unit="celsius", thresholds=[(80, "orange"), (85, "red")], threshold_lines=True))
    b.add(12, 8, bargauge_panel("Hottest GPUs", [q(recorded_or_raw(
        f'topk(10, {rec("gpu:dcgm_gpu_temp_celsius:max")})',
        f'topk(10, max by (cluster, hostname, gpu, UUID) ({m("DCGM_FI_DEV_GPU_TEMP", R)}))'),
        "{{hostname}} GPU {{gpu}}", instant=True)],
        unit="celsius", minv=20, maxv=100, thresholds=[(80, "orange"), (85, "red")]))
    b.add(12, 8, timeseries_panel("Framebuffer used per node", [q(recorded_or_raw(
        rec("hostname:dcgm_fb_used:ratio"),
        f'sum by (cluster, hostname) ({fb_used}) / sum by (cluster, hostname) ({fb_used} + {fb_free})'),
        "{{hostname}}")],
        unit="percentunit", minv=0, maxv=1))
    b.add(12, 8, bargauge_panel("Fullest GPUs and MIG instances", [q(recorded_or_raw(
        f'topk(10, {rec("gpu:dcgm_fb_used:ratio")})',
        f'topk(10, {fb_used} / ({fb_used} + {fb_free}))'),
        "{{hostname}} GPU {{gpu}} {{GPU_I_PROFILE}}", instant=True)],
        unit="percentunit", minv=0, maxv=1, thresholds=[(0.8, "orange"), (0.95, "red")]))
    return b.build()


def node():
    F = 'cluster=~"$cluster", hostname=~"$hostname", gpu=~"$gpu"'
    by_gpu = "GPU {{gpu}} {{GPU_I_PROFILE}} {{GPU_I_ID}}"
    b = Board("gpu-exporter-node", "GPU node detail",
              "One node's GPUs: utilization, memory, clocks, power, temperature and throttling, PCIe and "
              "NVLink, ECC, retired/remapped memory, XIDs and health (gpu-exporter).", ["node"])
    b.variable("hostname", "Node", f'label_values({gpu_series(C)}, hostname)',
               multi=False, include_all=False)
    b.variable("gpu", "GPU", f'label_values({gpu_series(CH)}, gpu)',
               sort=model.VariableSort.NUMERICAL_ASC)

    b.row("Utilization and memory")
    b.add(8, 8, timeseries_panel("GPU utilization", [q(m("DCGM_FI_DEV_GPU_UTIL", F), "GPU {{gpu}}")],
                                 unit="percent", minv=0, maxv=100,
                                 desc="Not available on MIG-enabled GPUs: see graphics engine activity." + MIG_UTIL_NEEDS))
    b.add(8, 8, timeseries_panel("Graphics engine active", [q(m("DCGM_FI_PROF_GR_ENGINE_ACTIVE", F), by_gpu)],
                                 unit="percentunit", minv=0, maxv=1, desc="Per GPU or MIG instance." + PROF_NEEDS))
    b.add(8, 8, timeseries_panel("Tensor and DRAM activity", [
        q(m("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", F), "tensor GPU {{gpu}} {{GPU_I_ID}}"),
        q(m("DCGM_FI_PROF_DRAM_ACTIVE", F), "dram GPU {{gpu}} {{GPU_I_ID}}")],
        unit="percentunit", minv=0, maxv=1, desc="Per GPU or MIG instance." + PROF_NEEDS))
    b.add(8, 8, timeseries_panel("Framebuffer used", [q(m("DCGM_FI_DEV_FB_USED", F), by_gpu)], unit="mbytes",
                                 desc="MiB, per GPU or MIG instance."))
    b.add(8, 8, timeseries_panel("Framebuffer used %", [
        q(f'{m("DCGM_FI_DEV_FB_USED", F)} / ({m("DCGM_FI_DEV_FB_USED", F)} + {m("DCGM_FI_DEV_FB_FREE", F)})', by_gpu)],
        unit="percentunit", minv=0, maxv=1, thresholds=[(0.95, "red")]))
    b.add(8, 8, timeseries_panel("Memory copy, encoder and decoder utilization", [
        q(f'max by (gpu) ({m("DCGM_FI_DEV_MEM_COPY_UTIL", F)})', "copy GPU {{gpu}}"),
        q(f'max by (gpu) ({m("DCGM_FI_DEV_ENC_UTIL", F)})', "enc GPU {{gpu}}"),
        q(f'max by (gpu) ({m("DCGM_FI_DEV_DEC_UTIL", F)})', "dec GPU {{gpu}}")],
        unit="percent", minv=0, maxv=100))

    b.row("Clocks, power and temperature")
    b.add(8, 8, timeseries_panel("SM clock", [
        q(f'max by (gpu) ({m("DCGM_FI_DEV_SM_CLOCK", F)}) * 1000000', "GPU {{gpu}}")], unit="hertz"))
    b.add(8, 8, timeseries_panel("Memory clock", [
        q(f'max by (gpu) ({m("DCGM_FI_DEV_MEM_CLOCK", F)}) * 1000000', "GPU {{gpu}}")], unit="hertz"))
    b.add(8, 8, timeseries_panel("Power draw", [
        q(f'max by (gpu) ({m("DCGM_FI_DEV_POWER_USAGE", F)})', "GPU {{gpu}}")], unit="watt"))
    b.add(8, 8, stat_panel("Energy used in the time range", [
        q(f'sum(max by (gpu) ({m("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", F, "increase({}[$__range])")})) / 3600000000',
          "energy", instant=True)],
        unit="kwatth", desc="DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION is in mJ (DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL, "
                            "in J, is scaled to mJ); 1 kWh = 3.6e9 mJ."))
    b.add(8, 8, timeseries_panel("Temperature", [
        q(f'max by (gpu) ({m("DCGM_FI_DEV_GPU_TEMP", F)})', "GPU {{gpu}}"),
        q(f'max by (gpu) ({m("DCGM_FI_DEV_MEMORY_TEMP", F)})', "memory GPU {{gpu}}")],
        unit="celsius", thresholds=[(85, "red")]))
    b.add(8, 8, timeseries_panel("Throttling (share of time)", [
        q(f'max by (gpu) ({m("DCGM_FI_DEV_THERMAL_VIOLATION", F, "rate({}[$__rate_interval])")}) / 1e9', "thermal GPU {{gpu}}"),
        q(f'max by (gpu) ({m("DCGM_FI_DEV_POWER_VIOLATION", F, "rate({}[$__rate_interval])")}) / 1e9', "power GPU {{gpu}}")],
        unit="percentunit", minv=0, maxv=1,
        desc="Fraction of time clocks were held down for thermal or power reasons (violation counters, ns)."))
    b.add(24, 7, timeseries_panel("Clock events in the window", [
        q(f'max by (gpu, clock_event) (DCGM_EXP_CLOCK_EVENTS_COUNT{{{F}, clock_event!=""}})', "GPU {{gpu}} {{clock_event}}")],
        desc="Samples with each clock-event (throttle) reason within the exporter's window. A GPU without "
             "events has one zero series without a clock_event label (as dcgm-exporter serves it); "
             "the panel leaves it out."))

    b.row("Interconnect")
    b.add(8, 8, timeseries_panel("PCIe bandwidth", [
        q(f'max by (gpu) ({m("DCGM_FI_PROF_PCIE_TX_BYTES", F)})', "TX GPU {{gpu}}"),
        q(f'-max by (gpu) ({m("DCGM_FI_PROF_PCIE_RX_BYTES", F)})', "RX GPU {{gpu}}")],
        unit="Bps", desc="TX up, RX down." + PROF_NEEDS))
    b.add(8, 8, timeseries_panel("PCIe replays", [
        q(f'max by (gpu) ({m("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", F, "increase({}[$__rate_interval])")})', "GPU {{gpu}}")],
        desc="PCIe packet retries; a steady rise means a bad link (GPUPCIeReplaysRising)."))
    b.add(8, 8, timeseries_panel("NVLink bandwidth", [
        q(f'max by (gpu) ({m("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", F)})', "GPU {{gpu}}")],
        unit="MBs", desc="TX+RX over all links, MB/s. Absent on GPUs without NVLink."))
    b.add(24, 7, timeseries_panel("NVLink errors", [
        q(f'max by (gpu) ({m(f"DCGM_FI_DEV_NVLINK_{counter}_COUNT_TOTAL", F, "increase({}[$__rate_interval])")})',
          f"{name} GPU {{{{gpu}}}}")
        for counter, name in [("CRC_FLIT_ERROR", "CRC flit"), ("CRC_DATA_ERROR", "CRC data"),
                              ("REPLAY_ERROR", "replay"), ("RECOVERY_ERROR", "recovery")]]))

    b.row("Errors")
    ecc = [("SBE_VOL", "SBE volatile"), ("DBE_VOL", "DBE volatile"), ("SBE_AGG", "SBE aggregate"),
           ("DBE_AGG", "DBE aggregate")]
    b.add(12, 8, table_panel("ECC errors", [
        q(f'max by (gpu) ({m(f"DCGM_FI_DEV_ECC_{field}_TOTAL", F)})', name, instant=True, table=True) for field, name in ecc],
        merge=True, rename={f"Value #{ref}": name for ref, (_, name) in zip(REF_IDS, ecc)},
        desc="Volatile counts reset when the driver reloads; aggregate counts persist."))
    remap = [("RETIRED_SBE", "retired SBE"), ("RETIRED_DBE", "retired DBE"), ("RETIRED_PENDING", "retire pending"),
             ("CORRECTABLE_REMAPPED_ROWS", "remapped (corr.)"), ("UNCORRECTABLE_REMAPPED_ROWS", "remapped (uncorr.)"),
             ("ROW_REMAP_FAILURE", "remap failed")]
    b.add(12, 8, table_panel("Retired pages and remapped rows", [
        q(f'max by (gpu) ({m("DCGM_FI_DEV_" + field, F)})', instant=True, table=True) for field, _ in remap],
        merge=True, rename={f"Value #{ref}": name for ref, (_, name) in zip(REF_IDS, remap)},
        desc="Page retirement (before Ampere) and row remapping (Ampere and newer)."))
    b.add(12, 8, timeseries_panel("Last XID", [
        q(f'max by (gpu, err_code, err_msg) ({m("DCGM_FI_DEV_XID_ERRORS", F)})', "GPU {{gpu}}: {{err_msg}}")],
        desc="The last XID within the exporter's window (0 = none)."))
    b.add(12, 8, table_panel("XIDs in the window", [
        q(f'max by (gpu, xid) (DCGM_EXP_XID_ERRORS_COUNT{{{F}}})', instant=True, table=True)],
        desc="Count of each XID within window_size_in_ms; a row without xid means none."))
    b.add(24, 8, table_panel("Health checks", [
        q(f'max by (gpu, health_watch, health_error_code) (DCGM_EXP_GPU_HEALTH_STATUS{{{F}, health_watch!="ALL"}})',
          instant=True, table=True)],
        desc="0 pass, 10 warn, 20 fail."))
    return b.build()


def workloads():
    NS = 'cluster=~"$cluster", hostname=~"$hostname", namespace=~"$namespace"'  # the per-namespace row
    POD = NS + ', pod=~"$pod"'  # the per-pod rows
    W = POD + ', pod!=""'
    mig = ', GPU_I_ID!=""'
    # The raw sides of recorded queries (the `raw` switch, as on the cluster dashboard).
    raw_ns, raw_pod = NS + ', pod!="", gpu=~"$raw"', W + ', gpu=~"$raw"'
    holder = "{{namespace}}/{{pod}}/{{container}}"
    # Pods are known from the device series they hold alone and from their own usage on shared GPUs.
    pod_series = names("DCGM_FI_DEV_FB_USED") + "|gpu_exporter_container_fb_used_bytes"

    def rec(level, metric, sel):
        return f"{level}:{metric}{{{sel}}}"

    def rec_avg(level, by, sel):
        """Average utilization from the recorded sum and count."""
        return (f'sum by ({by}) ({rec(level, "dcgm_gpu_utilization_percent:sum", sel)}) / '
                f'sum by ({by}) ({rec(level, "dcgm_gpu_utilization_percent:count", sel)})')

    def raw_util(sel):
        return f'{m("DCGM_FI_DEV_GPU_UTIL", sel)} or 100 * {m("DCGM_FI_PROF_GR_ENGINE_ACTIVE", sel + mig)}'

    # Reads the recording rules' gpu-exporter.workloads group where it is loaded, with a minimum
    # step of a minute, their resolution (as the cluster dashboard).
    b = Board("gpu-exporter-workloads", "GPU workloads",
              "GPU memory and utilization per namespace, pod and container; MIG slices and shared GPUs "
              "(gpu-exporter with -k).", ["workloads", "kubernetes"], min_interval="1m")
    b.variable("hostname", "Node", f'label_values({gpu_series(C)}, hostname)')
    b.variable("namespace", "Namespace",
               f'label_values({{__name__=~"{pod_series}", cluster=~"$cluster", hostname=~"$hostname"}}, namespace)')
    b.variable("pod", "Pod",
               f'label_values({{__name__=~"{pod_series}", cluster=~"$cluster", hostname=~"$hostname", '
               f'namespace=~"$namespace"}}, pod)')
    raw_variable(b, "hostname_namespace:dcgm_gpus_held:count")

    NS_DESC = " Every pod of the selected namespaces and nodes (the pod selection applies to the rows below)."
    b.row("Per namespace")
    b.add(8, 8, timeseries_panel("GPU memory per namespace", [q(recorded_or_raw(
        f'sum by (namespace) ({rec("hostname_namespace", "dcgm_fb_used_mib:sum", NS)})',
        f'sum by (namespace) ({m("DCGM_FI_DEV_FB_USED", raw_ns)})'), "{{namespace}}")],
        unit="mbytes", desc="Framebuffer used by the GPUs and MIG instances pods hold, MiB." + NS_DESC))
    b.add(8, 8, timeseries_panel("GPU utilization per namespace", [q(recorded_or_raw(
        rec_avg("hostname_namespace", "namespace", NS), f'avg by (namespace) ({raw_util(raw_ns)})'),
        "{{namespace}}")],
        unit="percent", minv=0, maxv=100,
        desc="Average over the GPUs and MIG instances pods hold, each once." + NS_DESC + MIG_UTIL_NEEDS))
    b.add(8, 8, bargauge_panel("GPUs and MIG slices held per namespace", [q(recorded_or_raw(
        f'sum by (namespace) ({rec("hostname_namespace", "dcgm_gpus_held:count", NS)})',
        f'count by (namespace) (count by (namespace, hostname, UUID, GPU_I_ID) '
        f'({m("DCGM_FI_DEV_FB_USED", raw_ns)}))'), "{{namespace}}", instant=True)],
        display=common.BarGaugeDisplayMode.BASIC, desc="Now." + NS_DESC))

    b.row("Per pod and container")
    b.add(12, 8, timeseries_panel("GPU memory per pod", [q(recorded_or_raw(
        f'sum by (namespace, pod, container) '
        f'({rec("hostname_namespace_pod_container", "dcgm_fb_used_mib:sum", POD)})',
        f'sum by (namespace, pod, container) ({m("DCGM_FI_DEV_FB_USED", raw_pod)})'), holder)],
        unit="mbytes", desc="At thousands of pods, pick a namespace: each pod is a line."))
    b.add(12, 8, timeseries_panel("GPU utilization per pod", [q(recorded_or_raw(
        rec_avg("hostname_namespace_pod_container", "namespace, pod, container", POD),
        f'avg by (namespace, pod, container) ({raw_util(raw_pod)})'), holder)],
        unit="percent", minv=0, maxv=100,
        desc="Whole GPUs: DCGM_FI_DEV_GPU_UTIL; MIG slices: graphics engine activity." + MIG_UTIL_NEEDS))
    b.add(12, 8, table_panel("MIG slices per pod", [
        q(f'count by (namespace, pod, container, hostname, gpu, GPU_I_PROFILE, GPU_I_ID) '
          f'({m("DCGM_FI_DEV_FB_USED", W + mig)})', instant=True, table=True)],
        hide=("Value",), desc="Which MIG instance each pod holds."))
    b.add(12, 8, table_panel("Pods sharing GPUs", [
        q('gpu_exporter_gpu_pod_info{cluster=~"$cluster", namespace=~"$namespace", pod=~"$pod"}', instant=True, table=True)],
        hide=("Value", "__name__", "job"),
        desc="Time-sliced / MPS GPUs held by several pods: their series carry no pod labels; "
             "gpu_exporter_gpu_pod_info lists the holders."))

    b.row("DRA claims and HPC jobs")
    b.add(12, 8, table_panel("GPUs and MIG instances allocated through DRA claims", [
        q('max by (cluster, hostname, gpu, GPU_I_PROFILE, GPU_I_ID, dra_claim_namespace, dra_claim_name, '
          f'dra_device_name, namespace, pod, container) ({m("DCGM_FI_DEV_FB_USED", W + ", dra_claim_name!=" + EMPTY)})',
          instant=True, table=True)],
        rename={"Value": "Framebuffer used (MiB)"},
        desc="Resource claims of NVIDIA's DRA driver (gpu.nvidia.com) and the device each was given "
             "(needs --kubernetes-enable-dra, docs/pods.md)."))
    hpc = f'{CH}, hpc_job!=""'
    b.add(12, 8, timeseries_panel("GPU utilization per HPC job", [
        q(f'avg by (cluster, hpc_job) ({m("DCGM_FI_DEV_GPU_UTIL", hpc)} or '
          f'100 * {m("DCGM_FI_PROF_GR_ENGINE_ACTIVE", hpc + mig)})', "{{hpc_job}}")],
        unit="percent", minv=0, maxv=100,
        desc="Average over the GPUs and MIG instances each job runs on, from the exporter's "
             "--hpc-job-mapping-dir files (not filtered by namespace or pod)." + MIG_UTIL_NEEDS))

    b.row("GPU use per pod on shared GPUs")
    shared = "{{namespace}}/{{pod}}/{{container}} on {{hostname}} GPU {{gpu}}"
    by_container = "sum by (cluster, namespace, pod, container, hostname, gpu, GPU_I_ID)"
    b.add(12, 8, timeseries_panel("GPU use per pod on shared GPUs", [
        q(f'{by_container} (gpu_exporter_container_sm_utilization_percent{{{POD}}})', shared)],
        unit="percent", minv=0,
        desc="Each container's own SM utilization, from NVML's per-process samples (needs -k with "
             "--kubernetes-process-usage or --kubernetes-virtual-gpus, docs/pods.md). On a time-sliced or "
             "MPS GPU the containers' values add up to the device's utilization (within a point per "
             "container); no join with the device series. Not available per MIG instance (NVML has no "
             "per-process utilization there)."))
    b.add(12, 8, timeseries_panel("GPU memory per pod on shared GPUs", [
        q(f'{by_container} (gpu_exporter_container_fb_used_bytes{{{POD}}})', shared)],
        unit="bytes",
        desc="Each container's own framebuffer use (its processes' used memory), on whole GPUs and MIG "
             "instances; the containers of one GPU add up to its used framebuffer."))
    b.add(24, 8, timeseries_panel("Utilization of shared GPUs, per holder", [
        q('max by (cluster, namespace, pod, container, UUID) ('
          'gpu_exporter_gpu_pod_info{cluster=~"$cluster", namespace=~"$namespace", pod=~"$pod"} '
          '* on (cluster, UUID) group_left () max by (cluster, UUID) ('
          f'{m("DCGM_FI_DEV_GPU_UTIL", CH)}))',
          "{{namespace}}/{{pod}} on {{UUID}}")],
        unit="percent", minv=0, maxv=100,
        desc="The whole GPU's utilization, shown for each pod holding it (the same value for every "
             "holder); each pod's own share is in \"GPU use per pod on shared GPUs\"."))
    return b.build()


def usage():
    """GPU usage and cost: the accounting counters (docs/accounting.md), which integrate every sample
    and add up to the GPUs' own energy. Raw counters only: a node serves a handful per GPU."""
    H = 'cluster=~"$cluster", hostname=~"$hostname"'
    NS = H + ', namespace=~"$namespace"'
    POD = NS + ', pod=~"$pod"'
    E, A = "gpu_exporter_container_energy_joules_total", "gpu_exporter_container_allocated_gpu_seconds_total"
    B, I = "gpu_exporter_container_sm_busy_gpu_seconds_total", "gpu_exporter_container_idle_allocated_gpu_seconds_total"
    containers = ', consumer=~"holder|not_holder"'
    b = Board("gpu-exporter-usage", "GPU usage and cost",
              "Who used how much: energy and GPU-hours per namespace and pod, idle allocations and work "
              "outside allocations, exact on shared GPUs (gpu-exporter with -k; docs/accounting.md).",
              ["accounting", "kubernetes"])
    b.variable("hostname", "Node", f'label_values({E}{{cluster=~"$cluster"}}, hostname)')
    b.variable("namespace", "Namespace",
               f'label_values({E}{{cluster=~"$cluster", hostname=~"$hostname", namespace!=""}}, namespace)')
    b.variable("pod", "Pod",
               f'label_values({E}{{cluster=~"$cluster", hostname=~"$hostname", namespace=~"$namespace", '
               f'pod!=""}}, pod)')
    b.variables.append(dash.TextBoxVariable("price").label("Price per kWh").default_value("0.15")
                       .description("Your price of a kWh, in your currency: cost = energy x price."))
    RANGE = " over the dashboard's time range"

    b.row("Energy and cost")
    b.add(6, 6, stat_panel("Containers' energy (kWh)", [
        q(f'sum(increase({E}{{{NS}{containers}}}[$__range])) / 3.6e6', instant=True)],
        unit="kwatth", desc="Energy charged to the selected namespaces' containers" + RANGE + ": the static "
                            "part (idle power) by allocation, the rest by measured activity."))
    b.add(6, 6, stat_panel("Containers' cost", [
        q(f'sum(increase({E}{{{NS}{containers}}}[$__range])) / 3.6e6 * $price', instant=True)],
        desc="Energy x the price per kWh (the dashboard's price variable)" + RANGE + "."))
    b.add(12, 6, piechart_panel("Energy by consumer", [
        q(f'sum by (consumer) (increase({E}{{{H}}}[$__range])) / 3.6e6', "{{consumer}}", instant=True)],
        unit="kwatth",
        desc="Every consumer of the selected nodes' GPUs" + RANGE + ": holders, containers without an "
             "allocation (not_holder), processes outside pods and the capacity nobody holds; together "
             "the GPUs' own energy counters."))
    b.add(12, 8, timeseries_panel("Power per namespace", [
        q(f'sum by (namespace) (rate({E}{{{NS}{containers}}}[$__rate_interval]))', "{{namespace}}")],
        unit="watt", minv=0, desc="Energy charged per second to each namespace's containers."))
    b.add(12, 8, table_panel("Energy and cost per namespace", [
        q(f'sum by (namespace) (increase({E}{{{NS}{containers}}}[$__range])) / 3.6e6', table=True, instant=True),
        q(f'sum by (namespace) (increase({E}{{{NS}{containers}}}[$__range])) / 3.6e6 * $price',
          table=True, instant=True)],
        merge=True, rename={"Value #A": "kWh", "Value #B": "cost"},
        desc="Per namespace" + RANGE + "; the cost at the price variable."))

    b.row("Allocated and used GPU time")
    b.add(12, 8, timeseries_panel("GPUs allocated and busy per namespace", [
        q(f'sum by (namespace) (rate({A}{{{NS}, consumer="holder"}}[$__rate_interval]))', "{{namespace}} allocated"),
        q(f'sum by (namespace) (rate({B}{{{NS}{containers}}}[$__rate_interval]))', "{{namespace}} busy")],
        minv=0, desc="GPUs held (a whole GPU is 1; a replica or MIG slice its share) and GPUs' worth of "
                     "measured activity (SM busy time; MIG instances' engine activity)."))
    b.add(12, 8, bargauge_panel("GPU-hours allocated and busy per namespace", [
        q(f'sum by (namespace) (increase({A}{{{NS}, consumer="holder"}}[$__range])) / 3600',
          "{{namespace}} allocated", instant=True),
        q(f'sum by (namespace) (increase({B}{{{NS}{containers}}}[$__range])) / 3600',
          "{{namespace}} busy", instant=True)],
        desc="GPU-hours held and busy" + RANGE + "."))

    b.row("Waste and misuse")
    b.add(12, 8, table_panel("Idle allocations by pod", [
        q(f'topk(20, sum by (namespace, pod, container, hostname, gpu, GPU_I_ID) '
          f'(increase({I}{{{POD}}}[$__range])) / 3600 > 0)', table=True, instant=True)],
        rename={"Value": "GPU-hours held, nothing running"},
        desc="GPU-hours in which the pod held a GPU or MIG instance and ran no process on it" + RANGE +
             " (needs --kubernetes-process-usage)."))
    b.add(12, 8, timeseries_panel("Waste per namespace", [
        q(f'sum by (namespace) (rate({I}{{{NS}}}[$__rate_interval])) / '
          f'sum by (namespace) (rate({A}{{{NS}, consumer="holder"}}[$__rate_interval]))', "{{namespace}}")],
        unit="percentunit", minv=0, maxv=1,
        desc="The share of held GPU time in which nothing ran (needs --kubernetes-process-usage)."))
    b.add(12, 8, timeseries_panel("Use outside allocations", [
        q(f'sum by (hostname, gpu, GPU_I_ID, consumer, namespace, pod) '
          f'(rate({B}{{{H}, consumer=~"not_holder|outside_pods"}}[$__rate_interval]))',
          "{{hostname}} GPU {{gpu}} {{consumer}} {{namespace}}/{{pod}}")],
        minv=0, desc="Activity of processes outside any pod, and of containers on GPUs they do not hold "
                     "(GPUWorkOutsideAllocation warns about it)."))
    b.add(12, 8, timeseries_panel("Idle power per GPU", [
        q(f'gpu_exporter_gpu_idle_power_watts{{{H}}}', "{{hostname}} GPU {{gpu}} ({{source}})")],
        unit="watt", minv=0, desc="The idle power each GPU's energy split uses for its static part: the "
                                  "--accounting-idle-power-watts flag, or measured (the lowest power over an "
                                  "interval without processes)."))
    return b.build()


DASHBOARDS = {"gpu-cluster.json": cluster, "gpu-node.json": node, "gpu-workloads.json": workloads,
              "gpu-usage.json": usage}


def render(d):
    return json.dumps(d, cls=JSONEncoder, indent=2, ensure_ascii=False) + "\n"


def main():
    check = "--check" in sys.argv[1:]
    stale = []
    for name, build in DASHBOARDS.items():
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
