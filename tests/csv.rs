//! The metrics CSV: dcgm-exporter's own files load unchanged, every defect fixture fails with
//! file, line and reason, and the shipped CSV has the default fields the issue lists.

use std::path::Path;

use gpu_exporter::catalog::{self, Field, MetricType};

fn fixture(path: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(path)
}

#[test]
fn upstream_default_counters_load_unchanged() {
    for file in [
        "upstream/default-counters.csv",
        "upstream/dcp-metrics-included.csv",
    ] {
        let (cat, skipped) =
            catalog::load(&fixture(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        let names: Vec<&str> = cat.metrics.iter().map(|m| m.name.as_str()).collect();
        assert!(names.contains(&"DCGM_FI_DEV_GPU_UTIL"), "{file}");
        assert!(names.contains(&"DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"), "{file}");
        // Every row loads, DCGM_FI_DEV_VGPU_LICENSE_STATUS included (read through NVML).
        assert_eq!(cat.metrics.len(), 25, "{file}: {names:?}");
        assert!(names.contains(&"DCGM_FI_DEV_VGPU_LICENSE_STATUS"), "{file}");
        assert_eq!(cat.labels.len(), 1);
        assert_eq!(cat.labels[0].field, Field::DriverVersion);
        assert!(skipped.is_empty(), "{file}: {skipped:?}");
        let counter = cat
            .metrics
            .iter()
            .find(|m| m.name == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
            .expect("energy row");
        assert_eq!(counter.kind, MetricType::Counter);
    }
}

#[test]
fn each_defect_fixture_fails_with_file_line_and_reason() {
    let cases = [
        ("two-columns.csv", 2, "expected 3 fields"),
        ("four-columns.csv", 2, "expected 3 fields"),
        (
            "unknown-field.csv",
            2,
            "unknown field \"DCGM_FI_DEV_GPU_UTILIZATION\"",
        ),
        ("bad-type.csv", 1, "unknown metric type \"gague\""),
        (
            "duplicate.csv",
            3,
            "duplicate field \"DCGM_FI_DEV_GPU_UTIL\" with another type, first listed on line 1",
        ),
        ("bad-quote.csv", 1, "CSV syntax error"),
        ("text-as-gauge.csv", 1, "string field"),
    ];
    for (file, line, reason) in cases {
        let path = fixture(&format!("csv/{file}"));
        let err = catalog::load(&path).expect_err(file).to_string();
        let prefix = format!("{}:{line}: ", path.display());
        assert!(
            err.starts_with(&prefix),
            "{file}: {err:?} should start with {prefix:?}"
        );
        assert!(
            err.contains(reason),
            "{file}: {err:?} should mention {reason:?}"
        );
    }
}

#[test]
fn missing_file_error_names_the_path() {
    let err = catalog::load(Path::new("/nonexistent/metrics.csv")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "metrics CSV /nonexistent/metrics.csv: no such file"
    );
}

#[test]
fn a_file_saved_with_a_byte_order_mark_and_crlf_loads_with_its_lines() {
    // As a Windows editor saves it: BOM, CRLF, a quoted help with a comma, an indented comment.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("counters.csv");
    std::fs::write(
        &path,
        "\u{feff}# DCGM FIELD, Prometheus metric type, help message\r\n\r\n\
         DCGM_FI_DEV_GPU_UTIL, gauge, \"GPU utilization, in %\"\r\n  # clocks\r\n\
         DCGM_FI_DEV_SM_CLOCK,  gauge, SM clock frequency (in MHz).\r\n",
    )
    .unwrap();
    let (cat, skipped) = catalog::load(&path).unwrap();
    assert!(skipped.is_empty());
    let rows: Vec<(&str, &str, u64)> = cat
        .metrics
        .iter()
        .map(|m| (m.name.as_str(), m.help.as_str(), m.line))
        .collect();
    assert_eq!(
        rows,
        vec![
            ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization, in %", 3),
            ("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", 5),
        ]
    );
    // And a defect after the BOM still names file:line.
    std::fs::write(&path, "\u{feff}DCGM_FI_DEV_GPU_UTIL, gauge\r\n").unwrap();
    let err = catalog::load(&path).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!("{}:1: expected 3 fields", path.display())),
        "{err}"
    );
}

#[test]
fn shipped_csv_has_every_default_field() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("metrics-config/default-counters.csv");
    let (cat, skipped) = catalog::load(&path).expect("shipped CSV");
    assert!(skipped.is_empty(), "{skipped:?}");
    let want = [
        "GPU_UTIL",
        "MEM_COPY_UTIL",
        "ENC_UTIL",
        "DEC_UTIL",
        "FB_FREE",
        "FB_USED",
        "FB_RESERVED",
        "POWER_USAGE",
        "TOTAL_ENERGY_CONSUMPTION",
        "GPU_TEMP",
        "MEMORY_TEMP",
        "SM_CLOCK",
        "MEM_CLOCK",
        "NVLINK_BANDWIDTH_TOTAL",
        "PCIE_REPLAY_COUNTER",
        "ECC_SBE_VOL_TOTAL",
        "ECC_DBE_VOL_TOTAL",
        "ECC_SBE_AGG_TOTAL",
        "ECC_DBE_AGG_TOTAL",
        "RETIRED_SBE",
        "RETIRED_DBE",
        "RETIRED_PENDING",
        "CORRECTABLE_REMAPPED_ROWS",
        "UNCORRECTABLE_REMAPPED_ROWS",
        "ROW_REMAP_FAILURE",
        "XID_ERRORS",
        "POWER_VIOLATION",
        "THERMAL_VIOLATION",
    ];
    for w in want {
        let name = format!("DCGM_FI_DEV_{w}");
        assert!(cat.metrics.iter().any(|m| m.name == name), "missing {name}");
    }
    assert!(cat
        .labels
        .iter()
        .any(|m| m.name == "DCGM_FI_DRIVER_VERSION"));
}

#[test]
fn shipped_csv_is_the_builtin_default() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("metrics-config/default-counters.csv");
    assert_eq!(
        std::fs::read_to_string(path).expect("read"),
        gpu_exporter::config::BUILTIN_COUNTERS
    );
}

#[test]
fn readme_metrics_table_matches_the_shipped_csv() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let csv =
        std::fs::read_to_string(root.join("metrics-config/default-counters.csv")).expect("csv");
    let mut table = String::from("| Field | Type | Help |\n|---|---|---|\n");
    for line in csv
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let mut parts = line.splitn(3, ',').map(str::trim);
        let (f, t, h) = (
            parts.next().unwrap(),
            parts.next().unwrap(),
            parts.next().unwrap(),
        );
        table.push_str(&format!("| `{f}` | {t} | {h} |\n"));
    }
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README");
    let start = readme
        .find("<!-- metrics-table:begin -->\n")
        .expect("table start marker")
        + 29;
    let end = readme
        .find("<!-- metrics-table:end -->")
        .expect("table end marker");
    assert_eq!(
        &readme[start..end],
        table,
        "README metrics table is out of date with the CSV"
    );
}

#[test]
fn newest_upstream_default_set_loads_unchanged_with_its_own_fields() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("metrics-config/dcgm-exporter-4.10-default-counters.csv");
    let (cat, skipped) = catalog::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let field = |name: &str| {
        cat.metrics
            .iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("{name} missing"))
            .field
    };
    // The renamed rows resolve to the base-unit fields, not to the classic ones.
    assert_eq!(field("DCGM_FI_DEV_SM_CLOCK_HERTZ"), Field::SmClockHertz);
    assert_eq!(field("DCGM_FI_DEV_GPU_UTIL_RATIO"), Field::GpuUtilRatio);
    assert_eq!(
        field("DCGM_FI_DEV_MEMORY_UTIL_RATIO"),
        Field::MemoryUtilRatio
    );
    assert_eq!(field("DCGM_FI_DEV_FB_USED_BYTES"), Field::FbUsedBytes);
    assert_eq!(
        field("DCGM_FI_DEV_FB_CAPACITY_BYTES"),
        Field::FbCapacityBytes
    );
    assert_eq!(
        field("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL"),
        Field::GpuEnergyJoulesTotal
    );
    assert_eq!(
        field("DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND"),
        Field::NvlinkThroughputBytesPerSecond
    );
    // Same fields, new names.
    assert_eq!(field("DCGM_FI_DEV_GPU_TEMP_CELSIUS"), Field::GpuTemp);
    assert_eq!(field("DCGM_FI_DEV_XID_ERROR"), Field::XidErrors);
    assert_eq!(
        field("DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND"),
        Field::ProfPcieTxBytes
    );
    // The 4.8.x file's 25 rows, plus DCGM_FI_DEV_FB_CAPACITY_BYTES.
    assert_eq!(cat.metrics.len(), 26, "{:?}", cat.metrics);
    assert_eq!(cat.labels.len(), 1);
    assert_eq!(cat.labels[0].name, "DCGM_FI_SYSTEM_DRIVER_VERSION");
    assert_eq!(cat.labels[0].field, Field::DriverVersion);
    assert!(skipped.is_empty(), "{skipped:?}");
    // No classic name is left among the active rows.
    for m in &cat.metrics {
        assert!(
            ![
                "DCGM_FI_DEV_SM_CLOCK",
                "DCGM_FI_DEV_GPU_UTIL",
                "DCGM_FI_DEV_FB_USED"
            ]
            .contains(&m.name.as_str()),
            "{}",
            m.name
        );
    }
}

#[test]
fn upstream_1x_compatibility_csv_loads_with_its_lowercase_names() {
    let path = fixture("upstream/1.x-compatibility-metrics.csv");
    let (cat, skipped) = catalog::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<&str> = cat.metrics.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names[0], "dcgm_sm_clock");
    assert_eq!(cat.metrics[0].field, Field::SmClock);
    let util = cat
        .metrics
        .iter()
        .find(|m| m.name == "dcgm_gpu_utilization")
        .expect("dcgm_gpu_utilization");
    assert_eq!(util.field, Field::GpuUtil);
    assert_eq!(cat.metrics.len(), 20, "{names:?}");
    // Upstream lists dcgm_fi_prof_pcie_tx_bytes (and _rx_) twice: the repeats are skipped.
    assert_eq!(skipped.len(), 2, "{skipped:?}");
    assert!(skipped
        .iter()
        .all(|s| s.name.starts_with("dcgm_fi_prof_pcie_") && s.duplicate_of.is_some()));
    assert!(cat.labels.is_empty());
}

/// Every CSV under metrics-config/ is shipped (the image installs them all at
/// /etc/dcgm-exporter/): each must load with the catalog, serve at least one series, and skip
/// only what the file's own comments say it skips.
#[test]
fn every_shipped_csv_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("metrics-config");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("metrics-config/")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .collect();
    files.sort();
    let names: Vec<String> = files
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    // gpu-exporter's own files the image ships (scripts/image-rootfs.sh); dcgm-exporter's are
    // under upstream/ (`upstreams_own_csvs_load_and_skip_only_the_duplicate_rows`).
    for expected in [
        "dcgm-exporter-4.10-default-counters.csv",
        "default-counters.csv",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "{expected} missing: {names:?}"
        );
    }
    for path in &files {
        let (cat, skipped) =
            catalog::load(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            !cat.metrics.is_empty(),
            "{}: no metric rows",
            path.display()
        );
        let text = std::fs::read_to_string(path).expect("read");
        for s in &skipped {
            assert!(
                text.lines()
                    .any(|l| l.starts_with('#') && l.contains(&s.name)),
                "{}:{}: {} is skipped but the file's comments do not say so",
                path.display(),
                s.line,
                s.name
            );
        }
    }
}

/// dcgm-exporter's own files, as the image ships them at their upstream paths (byte for byte:
/// scripts/ci-artifacts.sh checks their git blob ids), load; the only rows skipped are the
/// duplicate PCIe rows of the 1.x names file (served once).
#[test]
fn upstreams_own_csvs_load_and_skip_only_the_duplicate_rows() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("metrics-config/upstream");
    for (name, want_skipped) in [
        ("default-counters.csv", &[][..]),
        ("dcp-metrics-included.csv", &[][..]),
        (
            "1.x-compatibility-metrics.csv",
            &["dcgm_fi_prof_pcie_tx_bytes", "dcgm_fi_prof_pcie_rx_bytes"][..],
        ),
    ] {
        let path = dir.join(name);
        let (cat, skipped) =
            catalog::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(!cat.metrics.is_empty(), "{name}: no metric rows");
        let names: Vec<&str> = skipped.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, want_skipped, "{name}: {skipped:?}");
    }
}

/// The file the GPU Operator selects has dcgm-exporter's active rows, in its order, with its
/// types and help texts (the fixture holds them as upstream has them).
#[test]
fn shipped_dcp_metrics_included_has_upstreams_active_rows() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rows = |p: &Path| -> Vec<(String, String, String)> {
        let (cat, skipped) = catalog::load(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let mut all: Vec<(u64, String, String, String)> = cat
            .metrics
            .iter()
            .chain(cat.labels.iter())
            .map(|m| {
                (
                    m.line,
                    m.name.clone(),
                    m.kind.as_str().to_owned(),
                    m.help.clone(),
                )
            })
            .chain(
                skipped
                    .iter()
                    .map(|s| (s.line, s.name.clone(), "skipped".into(), String::new())),
            )
            .collect();
        all.sort();
        all.into_iter().map(|(_, n, k, h)| (n, k, h)).collect()
    };
    let ours = rows(&root.join("metrics-config/upstream/dcp-metrics-included.csv"));
    let upstream = rows(&fixture("upstream/dcp-metrics-included.csv"));
    assert_eq!(ours, upstream);
    assert_eq!(ours.len(), 26, "{ours:?}");
}

/// The 1.x names file serves the same series as upstream's (the fixture is upstream's file).
#[test]
fn shipped_1x_compatibility_csv_matches_upstream() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let load = |p: &Path| {
        let (cat, skipped) = catalog::load(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let m: Vec<(String, String, String)> = cat
            .metrics
            .iter()
            .map(|m| (m.name.clone(), m.kind.as_str().to_owned(), m.help.clone()))
            .collect();
        let s: Vec<String> = skipped.iter().map(|s| s.name.clone()).collect();
        (m, s)
    };
    let ours = load(&root.join("metrics-config/upstream/1.x-compatibility-metrics.csv"));
    let upstream = load(&fixture("upstream/1.x-compatibility-metrics.csv"));
    assert_eq!(ours, upstream);
    assert_eq!(ours.0.len(), 20);
}
