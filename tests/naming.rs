//! The two naming generations side by side: dcgm-exporter ≤ 4.8's default CSV (classic names and
//! units) and 4.10's (DCGM 4.7/4.8 names: Hz, J, 0-1, bytes, B/s) rendered from the same
//! simulated fleet give the same readings, each in the unit its name says; and one CSV can mix
//! both generations.

mod common;

use std::collections::BTreeMap;

use gpu_exporter::catalog::{self, Catalog};
use gpu_exporter::pods::Attribution;

/// Classic name, newest name, and how the newest value follows from the classic one.
const RENAMES: &[(&str, &str, Conv)] = &[
    (
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_SM_CLOCK_HERTZ",
        Conv::Mul(1e6),
    ),
    (
        "DCGM_FI_DEV_MEM_CLOCK",
        "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ",
        Conv::Mul(1e6),
    ),
    (
        "DCGM_FI_DEV_MEMORY_TEMP",
        "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS",
        Conv::Same,
    ),
    (
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_GPU_TEMP_CELSIUS",
        Conv::Same,
    ),
    (
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_BOARD_POWER_WATTS",
        Conv::Same,
    ),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL",
        Conv::MilliToWhole,
    ),
    (
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        "DCGM_FI_DEV_PCIE_REPLAY_TOTAL",
        Conv::Same,
    ),
    (
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_GPU_UTIL_RATIO",
        Conv::Mul(0.01),
    ),
    (
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "DCGM_FI_DEV_MEMORY_UTIL_RATIO",
        Conv::Mul(0.01),
    ),
    (
        "DCGM_FI_DEV_ENC_UTIL",
        "DCGM_FI_DEV_ENC_UTIL_RATIO",
        Conv::Mul(0.01),
    ),
    (
        "DCGM_FI_DEV_DEC_UTIL",
        "DCGM_FI_DEV_DEC_UTIL_RATIO",
        Conv::Mul(0.01),
    ),
    (
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_XID_ERROR",
        Conv::Same,
    ),
    (
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_FREE_BYTES",
        Conv::Mul(1_048_576.0),
    ),
    (
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_USED_BYTES",
        Conv::Mul(1_048_576.0),
    ),
    (
        "DCGM_FI_DEV_FB_RESERVED",
        "DCGM_FI_DEV_FB_RESERVED_BYTES",
        Conv::Mul(1_048_576.0),
    ),
    // DCGM: MB/s = KiB/s ÷ 1000, B/s = KiB/s × 1024.
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND",
        Conv::Mul(1_024_000.0),
    ),
    (
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL",
        Conv::Same,
    ),
    (
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL",
        Conv::Same,
    ),
    (
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "DCGM_FI_DEV_ROW_REMAP_FAILED",
        Conv::Same,
    ),
    (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO",
        Conv::Same,
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_TENSOR_UTIL_RATIO",
        Conv::Same,
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_DRAM_UTIL_RATIO",
        Conv::Same,
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND",
        Conv::Same,
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES_PER_SECOND",
        Conv::Same,
    ),
];

#[derive(Debug, Clone, Copy)]
enum Conv {
    Same,
    Mul(f64),
    /// mJ → whole J.
    MilliToWhole,
}

impl Conv {
    fn apply(self, classic: f64) -> f64 {
        match self {
            Conv::Same => classic,
            Conv::Mul(k) => classic * k,
            Conv::MilliToWhole => (classic / 1000.0).trunc(),
        }
    }
}

/// Series of `body` by name, then by label set (the driver-version label renamed to the
/// newest spelling, so both generations key alike).
fn series(body: &str) -> BTreeMap<String, BTreeMap<String, f64>> {
    let mut out: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let (head, value) = line.rsplit_once(' ').expect("value");
        let (name, labels) = head.split_once('{').unwrap_or((head, "}"));
        let labels = labels
            .trim_end_matches('}')
            .replace("DCGM_FI_DRIVER_VERSION=", "DCGM_FI_SYSTEM_DRIVER_VERSION=");
        out.entry(name.to_owned())
            .or_default()
            .insert(labels, value.parse().expect("numeric value"));
    }
    out
}

async fn render(catalog: Catalog, profile: &str) -> String {
    let source = common::sim(profile, None);
    let h = common::harness(source, catalog, common::build_options());
    h.pods_tx
        .send_replace(std::sync::Arc::new(Attribution::default()));
    let mut sampler = h.sampler;
    let mut last = None;
    for _ in 0..3 {
        last = Some(sampler.tick().await);
    }
    common::normalise(&last.expect("ticks").body)
}

fn assert_close(name: &str, labels: &str, want: f64, got: f64) {
    let tolerance = 1e-9 * want.abs().max(1.0);
    assert!(
        (want - got).abs() <= tolerance,
        "{name}{{{labels}}}: expected {want} (from the classic series), got {got}"
    );
}

#[tokio::test(start_paused = true)]
async fn every_renamed_series_carries_the_classic_reading_in_its_own_unit() {
    for profile in ["8xH100-SXM", "4xA100-80GB-MIG"] {
        let classic = series(
            &render(
                common::catalog_file("tests/fixtures/upstream/default-counters.csv"),
                profile,
            )
            .await,
        );
        let newest = series(
            &render(
                common::catalog_file("metrics-config/dcgm-exporter-4.10-default-counters.csv"),
                profile,
            )
            .await,
        );
        let mut compared = 0;
        for &(old, new, conv) in RENAMES {
            let empty = BTreeMap::new();
            let o = classic.get(old).unwrap_or(&empty);
            let n = newest.get(new).unwrap_or(&empty);
            assert_eq!(
                o.keys().collect::<Vec<_>>(),
                n.keys().collect::<Vec<_>>(),
                "{profile}: {old} and {new} have different series"
            );
            for (labels, &v) in o {
                assert_close(new, labels, conv.apply(v), n[labels]);
                compared += 1;
            }
            assert!(
                !newest.contains_key(old),
                "{profile}: classic {old} in the newest output"
            );
        }
        assert!(compared > 100, "{profile}: only {compared} series compared");
        // The new row: capacity = free + used + reserved, in bytes.
        let cap = &newest["DCGM_FI_DEV_FB_CAPACITY_BYTES"];
        for (labels, &total) in cap {
            let part = |n: &str| newest[n][labels];
            assert_close(
                "DCGM_FI_DEV_FB_CAPACITY_BYTES",
                labels,
                part("DCGM_FI_DEV_FB_FREE_BYTES")
                    + part("DCGM_FI_DEV_FB_USED_BYTES")
                    + part("DCGM_FI_DEV_FB_RESERVED_BYTES"),
                total,
            );
        }
        assert!(!cap.is_empty());
        // Utilization ratios are ratios.
        for v in newest["DCGM_FI_DEV_GPU_UTIL_RATIO"].values() {
            assert!((0.0..=1.0).contains(v), "{v}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn one_csv_may_mix_both_generations() {
    let text = "DCGM_FI_DEV_GPU_UTIL, gauge, pct\nDCGM_FI_DEV_GPU_UTIL_RATIO, gauge, ratio\nDCGM_FI_DEV_SM_CLOCK, gauge, MHz\nDCGM_FI_DEV_SM_CLOCK_HERTZ, gauge, Hz\nDCGM_FI_DEV_FB_USED, gauge, MiB\nDCGM_FI_DEV_FB_USED_BYTES, gauge, B\nDCGM_FI_DRIVER_VERSION, label, d\nDCGM_FI_SYSTEM_DRIVER_VERSION, label, d\n";
    let (cat, _) = catalog::parse(text, "mixed.csv").expect("mixed CSV");
    let body = render(cat, "8xH100-SXM").await;
    let s = series(&body);
    for (old, new, k) in [
        ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_UTIL_RATIO", 0.01),
        ("DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_SM_CLOCK_HERTZ", 1e6),
        (
            "DCGM_FI_DEV_FB_USED",
            "DCGM_FI_DEV_FB_USED_BYTES",
            1_048_576.0,
        ),
    ] {
        assert_eq!(s[old].len(), 8);
        for (labels, &v) in &s[old] {
            assert_close(new, labels, v * k, s[new][labels]);
        }
    }
    // Both label spellings, as the CSV asks.
    let line = common::series(&body, "DCGM_FI_DEV_GPU_UTIL")[0];
    assert!(
        line.contains(
            r#"DCGM_FI_DRIVER_VERSION="570.172.08",DCGM_FI_SYSTEM_DRIVER_VERSION="570.172.08""#
        ),
        "{line}"
    );
}

#[tokio::test(start_paused = true)]
async fn the_1x_compatibility_csv_renders_its_lowercase_names() {
    let body = render(
        common::catalog_file("tests/fixtures/upstream/1.x-compatibility-metrics.csv"),
        "8xH100-SXM",
    )
    .await;
    let s = series(&body);
    assert_eq!(s["dcgm_gpu_utilization"].len(), 8);
    assert_eq!(s["dcgm_sm_clock"].len(), 8);
    // Upstream's repeated row gives one family, not two.
    assert_eq!(
        body.matches("# TYPE dcgm_fi_prof_pcie_tx_bytes ").count(),
        1
    );
}
