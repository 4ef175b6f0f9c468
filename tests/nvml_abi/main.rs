//! The real NVML path, end to end, without a GPU: the release-shaped `gpu-exporter` binary runs
//! with `--backend nvml` against a stand-in `libnvidia-ml.so.1` written in C
//! (`nvml_standin.c`, built here with the system C compiler), so `real.rs`, `ffi.rs`,
//! nvml-wrapper's symbol loading and every struct crossing the C ABI are exercised. The tests
//! compare what `/metrics` serves with the values the stand-in holds, and reproduce the driver
//! quirks DCGM works around (see docs/nvml.md, "Driver quirks").

// Not every test uses every helper.
#![allow(dead_code)]

#[path = "../common/cstandin.rs"]
mod cstandin;
#[path = "../common/fake_kubelet_bin.rs"]
mod fake_kubelet_bin;
mod harness;
mod node;
mod processes;
mod runbook;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use harness::{Exporter, Node, Scrape, Series, StandIn};
use node::{GPU0, GPU1};

/// The shipped default CSV.
fn default_csv() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("metrics-config/default-counters.csv")
}

/// The metric rows (not label rows) of a dcgm-exporter CSV, in order.
fn csv_metrics(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| {
            let cols: Vec<&str> = l.split(',').map(str::trim).collect();
            (cols.get(1) != Some(&"label")).then(|| cols[0].to_owned())
        })
        .collect()
}

/// The default CSV plus `extra` rows, written next to the stand-in's files.
fn csv_with(dir: &Path, extra: &str) -> PathBuf {
    let path = dir.join("counters.csv");
    let mut text = std::fs::read_to_string(default_csv()).unwrap();
    text.push_str(extra);
    std::fs::write(&path, text).unwrap();
    path
}

fn arg(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Series sorted for comparison: (labels rendered, value).
fn sorted(series: impl IntoIterator<Item = Series>) -> Vec<(String, f64)> {
    let mut v: Vec<(String, f64)> = series
        .into_iter()
        .map(|s| (format!("{:?}", s.labels), s.value))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// Waits until the exporter has published a sample with GPM values (the second tick on).
fn settled(exp: &Exporter) -> Scrape {
    exp.wait_for("three samples with profiling values", |s| {
        s.samples() >= 3 && s.named("DCGM_FI_PROF_GR_ENGINE_ACTIVE").count() > 0
    })
}

fn field_errors(s: &Scrape, field: &str, reason: &str) -> f64 {
    s.value(
        "gpu_exporter_field_errors_total",
        &[("field", field), ("reason", reason)],
    )
    .unwrap_or(0.0)
}

#[test]
fn every_default_csv_series_matches_what_the_driver_holds() {
    let standin = StandIn::new(node::standard());
    let csv = default_csv();
    let exp = Exporter::start(&standin, &["-f", arg(&csv)]);
    let s = settled(&exp);
    let node = &standin.node;
    let metrics = csv_metrics(&csv);
    assert!(metrics.len() > 30, "{metrics:?}");
    for metric in &metrics {
        let got: Vec<Series> = s.named(metric).cloned().collect();
        match metric.as_str() {
            "DCGM_FI_DEV_XID_ERRORS" | "DCGM_EXP_XID_ERRORS_COUNT" => {
                // No XID yet: 0 on every entity, with dcgm-exporter's labels.
                let mut want = Vec::new();
                for e in node::entities(node) {
                    let mut l = node::labels(node, e);
                    if metric == "DCGM_FI_DEV_XID_ERRORS" {
                        l.insert("err_code".into(), "0".into());
                        l.insert("err_msg".into(), "No Error".into());
                    } else {
                        l.insert("window_size_in_ms".into(), "300000".into());
                    }
                    want.push(Series {
                        name: metric.clone(),
                        labels: l,
                        value: 0.0,
                    });
                }
                assert_eq!(sorted(got), sorted(want), "{metric}");
            }
            "DCGM_EXP_CLOCK_EVENTS_COUNT" => {
                // Both GPUs report "GPU idle" (bit 0x1) every sample: one series per entity,
                // counting the samples so far.
                let want: Vec<String> = node::entities(node)
                    .into_iter()
                    .map(|e| {
                        let mut l = node::labels(node, e);
                        l.insert("clock_event".into(), "gpu_idle".into());
                        l.insert("window_size_in_ms".into(), "300000".into());
                        format!("{l:?}")
                    })
                    .collect();
                let mut have: Vec<String> = got.iter().map(|s| format!("{:?}", s.labels)).collect();
                have.sort();
                let mut want = want;
                want.sort();
                assert_eq!(have, want, "{metric}");
                assert!(got.iter().all(|s| s.value >= 1.0), "{got:#?}");
            }
            "DCGM_EXP_GPU_HEALTH_STATUS" => {
                // Health is per physical GPU; every watch passes.
                let mut want = Vec::new();
                for gpu in 0..2 {
                    for watch in [
                        "PCIE", "NVLINK", "PMU", "MCU", "MEM", "SM", "INFOROM", "THERMAL", "POWER",
                        "DRIVER", "ALL",
                    ] {
                        let mut l = node::labels(node, node::Entity { gpu, slot: None });
                        l.insert("health_error_code".into(), "DCGM_FR_OK".into());
                        l.insert("health_watch".into(), watch.into());
                        want.push(Series {
                            name: metric.clone(),
                            labels: l,
                            value: 0.0,
                        });
                    }
                }
                assert_eq!(sorted(got), sorted(want), "{metric}");
            }
            _ => {
                let want = node::expected_series(node, metric);
                assert!(!want.is_empty(), "{metric}: the node gives it no value");
                assert_eq!(sorted(got), sorted(want), "{metric}");
            }
        }
    }
    // Nothing else of DCGM's is served, and nothing failed.
    for series in &s.series {
        if series.name.starts_with("DCGM_") {
            assert!(metrics.contains(&series.name), "unexpected {series:?}");
        }
        if series.name == "gpu_exporter_field_errors_total" {
            assert_eq!(series.value, 0.0, "{series:?}\n{}", exp.logs());
        }
    }
    assert_eq!(
        s.value("gpu_exporter_gpus", &[("state", "healthy")]),
        Some(2.0)
    );
    assert_eq!(
        s.value("gpu_exporter_build_info", &[]).map(|_| ()),
        Some(()),
        "{}",
        s.text
    );
}

#[test]
fn memory_temperature_and_instant_power_read_the_uint_whatever_the_value_type_says() {
    // NVIDIA bug 4300930 (r545): NVML_FI_DEV_MEMORY_TEMP and POWER_INSTANT are labelled DOUBLE
    // but stored in uiVal. DCGM ignores valueType for them and rejects temperatures over 200.
    let mut n = node::standard();
    n.insert("gpu.0.field.82".into(), "ui_as_double:71".into());
    n.insert("gpu.0.field.186".into(), "ui_as_double:350123".into());
    n.insert("gpu.1.field.82".into(), "ui_as_double:4000".into());
    let standin = StandIn::new(n);
    let dir = tempfile::tempdir().unwrap();
    let csv = csv_with(
        dir.path(),
        "DCGM_FI_DEV_POWER_USAGE_INSTANT, gauge, Instantaneous power (in W).\n",
    );
    let exp = Exporter::start(&standin, &["-f", arg(&csv)]);
    let s = exp.wait_for("a sample", |s| s.samples() >= 2);
    assert_eq!(
        s.value("DCGM_FI_DEV_MEMORY_TEMP", &[("gpu", "0")]),
        Some(71.0),
        "{}",
        s.text
    );
    assert_eq!(
        s.value("DCGM_FI_DEV_POWER_USAGE_INSTANT", &[("gpu", "0")]),
        Some(350.123)
    );
    // 4000 °C is not a temperature: absent, and counted as an invalid reading.
    assert_eq!(s.named("DCGM_FI_DEV_MEMORY_TEMP").count(), 1, "{}", s.text);
    assert!(
        field_errors(&s, "DCGM_FI_DEV_MEMORY_TEMP", "invalid") >= 1.0,
        "{}",
        s.text
    );
    // The instant power of GPU 1 is a normal UNSIGNED_INT: 350.124 W on both its instances.
    assert_eq!(
        s.named("DCGM_FI_DEV_POWER_USAGE_INSTANT")
            .filter(|x| x.label("gpu") == "1")
            .map(|x| x.value)
            .collect::<Vec<_>>(),
        [350.123, 350.123]
    );
}

#[test]
fn ecc_entries_nvml_did_not_fill_are_absent_not_zero() {
    // GPU 0 has ECC disabled: NVML leaves the entries for ids 1..31 untouched (bug 2009232).
    // GPU 1's driver fills the ECC entries but not their valueType (bug 2032468).
    let mut n = node::standard();
    n.insert("gpu.0.ecc".into(), "0".into());
    for (id, v) in [(3, 0), (4, 0), (5, 8), (6, 0)] {
        n.insert(format!("gpu.1.field.{id}"), format!("no_type:{v}"));
    }
    let standin = StandIn::new(n);
    let dir = tempfile::tempdir().unwrap();
    let csv = csv_with(dir.path(), "DCGM_FI_DEV_ECC_CURRENT, gauge, ECC mode.\n");
    let exp = Exporter::start(&standin, &["-f", arg(&csv)]);
    let s = exp.wait_for("a sample", |s| s.samples() >= 2);
    // The ECC mode itself is read with nvmlDeviceGetEccMode when its entry is not filled.
    assert_eq!(
        s.value("DCGM_FI_DEV_ECC_CURRENT", &[("gpu", "0")]),
        Some(0.0),
        "{}",
        s.text
    );
    for x in s
        .named("DCGM_FI_DEV_ECC_CURRENT")
        .filter(|x| x.label("gpu") == "1")
    {
        assert_eq!(x.value, 1.0, "{x:?}");
    }
    for metric in [
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "DCGM_FI_DEV_RETIRED_SBE",
        "DCGM_FI_DEV_RETIRED_DBE",
        "DCGM_FI_DEV_RETIRED_PENDING",
    ] {
        let gpus: Vec<&str> = s.named(metric).map(|x| x.label("gpu")).collect();
        assert_eq!(gpus, ["1", "1"], "{metric}: GPU 0 has ECC off\n{}", s.text);
    }
    // Row remapping (ids 142-145) is not ECC-gated.
    assert_eq!(
        s.value("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", &[("gpu", "0")]),
        Some(2.0)
    );
    for x in s.named("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL") {
        assert_eq!(x.value, 8.0, "{x:?}");
    }
    for x in s.named("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL") {
        assert_eq!(x.value, 0.0, "{x:?}");
    }
    // Unfilled entries are "not supported", not failures.
    assert_eq!(
        field_errors(&s, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "failed"),
        0.0
    );
    assert_eq!(
        field_errors(&s, "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "invalid"),
        0.0
    );
}

/// Waits until the exporter's event thread has registered GPUs `gpus` ("0,1") on a set.
fn wait_registered(standin: &StandIn, gpus: &str) -> BTreeMap<String, String> {
    standin.wait_status(&format!("an event set with GPUs {gpus}"), |st| {
        st.iter()
            .any(|(k, v)| k.starts_with("set.") && k.ends_with(".gpus") && v == gpus)
    });
    standin.status()
}

fn xid_count(s: &Scrape, gpu: &str, xid: &str) -> f64 {
    s.named("DCGM_EXP_XID_ERRORS_COUNT")
        .filter(|x| x.label("gpu") == gpu && x.label("xid") == xid)
        .map(|x| x.value)
        .fold(0.0, f64::max)
}

#[test]
fn an_xid_on_another_gpu_right_after_a_gpu_is_lost_is_still_reported() {
    let mut standin = StandIn::new(node::standard());
    let exp = Exporter::start(&standin, &["-f", arg(&default_csv())]);
    wait_registered(&standin, "0,1");
    // GPU 0 falls off the bus (XID 79); the event wait then fails with GPU_IS_LOST a few
    // times, as a driver may; then GPU 1 raises XID 13.
    standin.update(|n| {
        n.insert("gpu.0.lost".into(), "1".into());
        n.insert("xid.1".into(), "0 79".into());
        n.insert("xid.2".into(), "1 13".into());
        n.insert("events.fail_next".into(), "15 3".into());
    });
    let s = exp.wait_for("XID 13 on GPU 1 and XID 79 on GPU 0", |s| {
        xid_count(s, "1", "13") >= 1.0 && xid_count(s, "0", "79") >= 1.0
    });
    // GPU 0's health fails; GPU 1 keeps reporting.
    assert_eq!(
        s.value(
            "DCGM_EXP_GPU_HEALTH_STATUS",
            &[("gpu", "0"), ("health_watch", "ALL")]
        ),
        Some(20.0)
    );
    assert_eq!(
        s.named("DCGM_FI_DEV_GPU_TEMP")
            .filter(|x| x.label("gpu") == "1")
            .count(),
        2
    );
    assert_eq!(
        s.named("DCGM_FI_DEV_GPU_TEMP")
            .filter(|x| x.label("gpu") == "0")
            .count(),
        0
    );
    assert!(standin.counter("wait_errors") >= 3);
}

#[test]
fn the_event_thread_registers_again_when_its_event_set_breaks() {
    let mut standin = StandIn::new(node::standard());
    let exp = Exporter::start(&standin, &["-f", arg(&default_csv())]);
    wait_registered(&standin, "0,1");
    let before = standin.counter("sets_created");
    // From now on every wait on the existing set fails (NVML_ERROR_UNKNOWN: the set is in an
    // undefined state and must be freed, per nvml.h); a new set works.
    standin.update(|n| {
        n.insert("events.fail_old_sets".into(), "999".into());
    });
    standin.wait_status("a new event set with both GPUs", |st| {
        let created: u64 = st
            .get("sets_created")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        created > before
            && st.get(&format!("set.{created}.gpus")).map(String::as_str) == Some("0,1")
    });
    standin.update(|n| {
        n.insert("xid.1".into(), "1 31".into());
    });
    exp.wait_for("XID 31 on GPU 1", |s| xid_count(s, "1", "31") >= 1.0);
}

#[test]
fn an_unknown_xid_is_reported_as_999_not_as_no_error() {
    let mut standin = StandIn::new(node::standard());
    let exp = Exporter::start(&standin, &["-f", arg(&default_csv())]);
    wait_registered(&standin, "0,1");
    // nvml.h: "eventData is set as 999 for unknown Xid error".
    standin.update(|n| {
        n.insert("xid.1".into(), "0 999".into());
    });
    let s = exp.wait_for("XID 999 on GPU 0", |s| xid_count(s, "0", "999") >= 1.0);
    let last = s
        .named("DCGM_FI_DEV_XID_ERRORS")
        .find(|x| x.label("gpu") == "0")
        .cloned()
        .unwrap();
    assert_eq!(last.value, 999.0, "{last:?}");
    assert_eq!(last.label("err_code"), "999");
    assert_eq!(last.label("err_msg"), "Unknown Error");
}

fn profiles(s: &Scrape) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = s
        .named("DCGM_FI_DEV_FB_USED")
        .filter(|x| x.label("gpu") == "1")
        .map(|x| {
            (
                x.label("GPU_I_ID").to_owned(),
                x.label("GPU_I_PROFILE").to_owned(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn mig_profile_names_follow_dcgm_not_nvml() {
    // DCGM names a GPU instance `{sliceCount}g.{ceil(memorySizeMB / 1024)}gb`: no "+me"
    // suffix, and its own rounding (an H100 NVL 1g.12gb profile with 11008 MiB is "1g.11gb").
    let mut n = node::standard();
    n.insert("gpu.1.mig.2.profile".into(), "7".into()); // MIG 1g.10gb+me
    n.insert("gpu.1.profile.2.name".into(), "MIG 1g.12gb".into());
    n.insert("gpu.1.profile.2.slices".into(), "1".into());
    n.insert("gpu.1.profile.2.mem_mb".into(), "11008".into());
    let want = vec![
        ("2".to_owned(), "1g.11gb".to_owned()),
        ("9".to_owned(), "1g.10gb".to_owned()),
    ];
    let run = |n: &Node| {
        let standin = StandIn::new(n.clone());
        let exp = Exporter::start(&standin, &["-f", arg(&default_csv())]);
        let s = exp.wait_for("a sample", |s| s.samples() >= 1);
        assert_eq!(profiles(&s), want, "{}", s.text);
        drop(exp);
        let calls = |f: &str| standin.counter(&format!("calls.{f}"));
        (
            calls("nvmlDeviceGetGpuInstanceProfileInfoByIdV"),
            calls("nvmlDeviceGetGpuInstanceProfileInfoV"),
            calls("nvmlDeviceGetAttributes_v2"),
        )
    };
    // R580 and later: the profile by id.
    let (by_id, scan, attributes) = run(&n);
    assert!(
        by_id >= 2 && scan == 0 && attributes == 0,
        "{by_id} {scan} {attributes}"
    );
    // Older drivers: the profiles scanned for the id.
    n.insert("no_by_id_v".into(), "1".into());
    let (_, scan, attributes) = run(&n);
    assert!(scan >= 2 && attributes == 0, "{scan} {attributes}");
    // Without the privilege the GPU instance path needs, the MIG devices' attributes give the
    // same names.
    n.insert("gpu.1.gi_denied".into(), "1".into());
    let (_, _, attributes) = run(&n);
    assert!(attributes >= 2, "{attributes}");
}

#[test]
fn gpu_level_gpm_metrics_are_not_repeated_on_mig_instances() {
    let standin = StandIn::new(node::standard());
    let exp = Exporter::start(&standin, &["-f", arg(&default_csv())]);
    let s = settled(&exp);
    for metric in ["DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"] {
        let gpus: Vec<&str> = s.named(metric).map(|x| x.label("gpu")).collect();
        assert_eq!(gpus, ["0"], "{metric}\n{}", s.text);
    }
    // Per-instance profiling metrics stay per instance.
    let mut sm: Vec<(String, f64)> = s
        .named("DCGM_FI_PROF_GR_ENGINE_ACTIVE")
        .filter(|x| x.label("gpu") == "1")
        .map(|x| (x.label("GPU_I_ID").to_owned(), x.value))
        .collect();
    sm.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(sm, [("2".to_owned(), 0.6), ("9".to_owned(), 0.2)]);
    drop(exp);

    // Exported as a whole GPU, the MIG GPU has its GPU-level PCIe rate.
    let exp = Exporter::start(&standin, &["-f", arg(&default_csv()), "-d", "g"]);
    let s = exp.wait_for("PCIe rates of both GPUs", |s| {
        s.named("DCGM_FI_PROF_PCIE_TX_BYTES").count() == 2
    });
    assert_eq!(
        s.value("DCGM_FI_PROF_PCIE_TX_BYTES", &[("gpu", "1")]),
        Some(100.5 * 1_048_576.0)
    );
}

#[test]
fn the_device_label_is_nvidia_and_the_gpu_index_not_the_minor_number() {
    let mut n = node::standard();
    n.insert("gpu.0.minor".into(), "3".into());
    n.insert("gpu.1.minor".into(), "1".into());
    let standin = StandIn::new(n);
    let exp = Exporter::start(&standin, &["-f", arg(&default_csv())]);
    let s = exp.wait_for("a sample", |s| s.samples() >= 1);
    for x in s.named("DCGM_FI_DEV_GPU_TEMP") {
        assert_eq!(
            x.label("device"),
            format!("nvidia{}", x.label("gpu")),
            "{x:?}"
        );
    }
    assert_eq!(s.named("DCGM_FI_DEV_GPU_TEMP").count(), 3);
}

#[test]
fn the_vgpu_licence_status_comes_through_the_real_path_and_is_absent_on_bare_metal() {
    let mut n = node::standard();
    // GPU 0 is a licensed vGPU guest (state 2: licensed), GPU 1 bare metal (no licensing).
    n.insert("gpu.0.grid.supported".into(), "1".into());
    n.insert("gpu.0.grid.vgpu_state".into(), "2".into());
    let standin = StandIn::new(n);
    let dir = tempfile::tempdir().unwrap();
    let csv = csv_with(
        dir.path(),
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS, gauge, vGPU License status\n",
    );
    let exp = Exporter::start(&standin, &["-f", arg(&csv)]);
    let s = exp.wait_for("a sample", |s| s.samples() >= 1);
    let status: Vec<(&str, f64)> = s
        .named("DCGM_FI_DEV_VGPU_LICENSE_STATUS")
        .map(|x| (x.label("gpu"), x.value))
        .collect();
    assert_eq!(status, [("0", 1.0)], "{}", s.text);
    assert_eq!(
        field_errors(&s, "DCGM_FI_DEV_VGPU_LICENSE_STATUS", "not_supported"),
        0.0
    );
}

#[test]
fn the_brand_is_spelled_as_dcgm_spells_it() {
    let mut n = node::standard();
    n.insert("gpu.1.brand".into(), "10".into()); // NVML_BRAND_NVIDIA_VWS
    let standin = StandIn::new(n);
    let dir = tempfile::tempdir().unwrap();
    let csv = csv_with(dir.path(), "DCGM_FI_DEV_BRAND, label, Brand.\n");
    let exp = Exporter::start(&standin, &["-f", arg(&csv)]);
    let s = exp.wait_for("a sample", |s| s.samples() >= 1);
    let brands: BTreeMap<&str, &str> = s
        .named("DCGM_FI_DEV_GPU_TEMP")
        .map(|x| (x.label("gpu"), x.label("DCGM_FI_DEV_BRAND")))
        .collect();
    assert_eq!(
        brands,
        BTreeMap::from([("0", "NVIDIA"), ("1", "NVIDIA RTX Virtual Workstation")]),
        "{}",
        s.text
    );
}

#[test]
fn a_mig_reconfiguration_is_noticed_on_the_next_tick() {
    let mut standin = StandIn::new(node::standard());
    let exp = Exporter::start(&standin, &["-f", arg(&default_csv())]);
    let s = exp.wait_for("both instances", |s| profiles(s).len() == 2);
    assert_eq!(
        profiles(&s),
        [
            ("2".to_owned(), "3g.40gb".to_owned()),
            ("9".to_owned(), "1g.10gb".to_owned())
        ]
    );
    // GI 2 is destroyed and GI 5 (a 1g.10gb) created in its slot: every MIG handle handed out
    // before is invalid now (nvml.h: the handle "would remain invalid and must be requested
    // again"). Re-discovery is due only in 60 s; the invalid handle must trigger it now.
    standin.update(|n| {
        n.insert("gpu.1.mig.gen".into(), "1".into());
        n.insert("gpu.1.mig.0.gi".into(), "5".into());
        n.insert("gpu.1.mig.0.profile".into(), "0".into());
        n.insert(
            "gpu.1.mig.0.uuid".into(),
            "MIG-0e0b4bd3-cccc-5f0d-8a77-cccccccccccc".into(),
        );
    });
    let s = exp.wait_for("the new instance layout", |s| {
        profiles(s)
            == [
                ("5".to_owned(), "1g.10gb".to_owned()),
                ("9".to_owned(), "1g.10gb".to_owned()),
            ]
    });
    // GI 5 reports the memory of slot 0 (3000 MiB used), under its own labels.
    assert_eq!(
        s.value("DCGM_FI_DEV_FB_USED", &[("gpu", "1"), ("GPU_I_ID", "5")]),
        Some(3000.0)
    );
}

#[test]
fn a_lost_gpu_fails_its_health_and_the_other_keeps_reporting() {
    let mut standin = StandIn::new(node::standard());
    let exp = Exporter::start(&standin, &["-f", arg(&default_csv())]);
    exp.wait_for("a sample", |s| s.samples() >= 1);
    standin.update(|n| {
        n.insert("gpu.0.lost".into(), "1".into());
    });
    let s = exp.wait_for("GPU 0 lost", |s| {
        s.value("gpu_exporter_gpus", &[("state", "lost")]) == Some(1.0)
    });
    assert_eq!(
        s.value(
            "DCGM_EXP_GPU_HEALTH_STATUS",
            &[
                ("gpu", "0"),
                ("health_watch", "ALL"),
                ("health_error_code", "DCGM_FR_FALLEN_OFF_BUS")
            ]
        ),
        Some(20.0)
    );
    assert_eq!(
        s.named("DCGM_FI_DEV_GPU_TEMP")
            .filter(|x| x.label("gpu") == "0")
            .count(),
        0
    );
    assert_eq!(
        s.named("DCGM_FI_DEV_GPU_TEMP")
            .filter(|x| x.label("gpu") == "1")
            .count(),
        2
    );
    // It comes back after a reset (at the next re-discovery; its identity never changed, so
    // its series return as soon as its calls answer again).
    standin.update(|n| {
        n.remove("gpu.0.lost");
    });
    exp.wait_for("GPU 0 back", |s| {
        s.value("DCGM_FI_DEV_GPU_TEMP", &[("gpu", "0")]) == Some(45.0)
    });
}

#[test]
fn without_the_kernel_driver_ready_fails_and_recovers_when_it_loads() {
    let mut n = node::standard();
    n.insert("init_error".into(), "9".into()); // NVML_ERROR_DRIVER_NOT_LOADED
    let mut standin = StandIn::new(n);
    let exp = Exporter::start(&standin, &["-f", arg(&default_csv())]);
    exp.wait_for("a sample", |s| s.samples() >= 1);
    let (code, body) = exp.get("/ready");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("kernel driver is not loaded"), "{body}");
    assert_eq!(exp.get("/health").0, 200);
    standin.update(|n| {
        n.remove("init_error");
    });
    // Initialisation is retried with backoff (1 s, 2 s, ...).
    exp.wait_for("GPU series", |s| {
        s.named("DCGM_FI_DEV_GPU_TEMP").count() == 3
    });
    assert_eq!(exp.get("/ready").0, 200);
    let uuids: Vec<String> = exp
        .scrape()
        .named("DCGM_FI_DEV_GPU_TEMP")
        .map(|x| x.label("UUID").to_owned())
        .collect();
    assert!(uuids.contains(&GPU0.to_owned()) && uuids.contains(&GPU1.to_owned()));
}

/// C calls per tick, measured on the stand-in between two status snapshots taken right after
/// GPU 0's field-values call (the first call of each tick; the stand-in writes its status at
/// every field-values call), so they span whole ticks: at least `ticks` of them.
fn calls_per_tick(standin: &StandIn, ticks: u64) -> BTreeMap<String, u64> {
    let fv = |st: &BTreeMap<String, String>| -> u64 {
        st.get("calls.nvmlDeviceGetFieldValues")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let deadline = std::time::Instant::now() + harness::PATIENCE;
    let snapshot = |ok: &dyn Fn(u64) -> bool| loop {
        let st = standin.status();
        if fv(&st) % 2 == 1 && ok(fv(&st)) {
            return st;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no tick boundary seen"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    };
    let a = snapshot(&|_| true);
    let b = snapshot(&|n| n >= fv(&a) + 2 * ticks);
    let n = (fv(&b) - fv(&a)) / 2;
    b.iter()
        .filter_map(|(k, v)| {
            // The event thread's waits are not part of a tick.
            let name = k
                .strip_prefix("calls.")
                .filter(|n| !n.starts_with("nvmlEventSet"))?;
            let before: u64 = a.get(k).and_then(|x| x.parse().ok()).unwrap_or(0);
            let d = v.parse::<u64>().ok()? - before;
            assert_eq!(d % n, 0, "{name}: {d} calls in {n} ticks");
            (d > 0).then(|| (name.to_owned(), d / n))
        })
        .collect()
}

#[test]
fn the_real_path_makes_the_documented_calls_per_tick() {
    let standin = StandIn::new(node::standard());
    let exp = Exporter::start(&standin, &["-f", arg(&default_csv())]);
    settled(&exp);
    let got = calls_per_tick(&standin, 5);
    // GPU 0, a whole H100: the field-values batch, 2 clocks, temperature, power, utilisation,
    // encoder, decoder, memory, clock event reasons, and a GPM sample and computation; each
    // GPM sample is a buffer nvml-wrapper allocates (and frees the one it replaces): 14.
    // GPU 1 in MIG mode with 2 instances: the batch, 2 clocks, temperature, power, clock event
    // reasons, memory (GPU and each instance: 3), a GPM sample of the GPU (PCIe bytes) and of
    // each GPU instance, with their computations, allocations and frees (12): 21.
    let want: BTreeMap<String, u64> = [
        ("nvmlDeviceGetFieldValues", 2),
        ("nvmlDeviceGetClockInfo", 4),
        ("nvmlDeviceGetTemperature", 2),
        ("nvmlDeviceGetPowerUsage", 2),
        ("nvmlDeviceGetUtilizationRates", 1),
        ("nvmlDeviceGetEncoderUtilization", 1),
        ("nvmlDeviceGetDecoderUtilization", 1),
        ("nvmlDeviceGetMemoryInfo_v2", 4),
        ("nvmlDeviceGetCurrentClocksEventReasons", 2),
        ("nvmlGpmSampleGet", 2),
        ("nvmlGpmMigSampleGet", 2),
        ("nvmlGpmMetricsGet", 4),
        ("nvmlGpmSampleAlloc", 4),
        ("nvmlGpmSampleFree", 4),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    .collect();
    assert_eq!(got, want);
    assert_eq!(got.values().sum::<u64>(), 14 + 21);
}

#[test]
fn per_link_nvlink_series_come_through_the_real_path() {
    let mut n = node::standard();
    // GPU 0 has 4 NVLinks; links 0 and 2 are up.
    n.insert("gpu.0.field.91".into(), "u:4".into());
    for (link, active, crc_flit, replay) in
        [(0, 1, 5, 10), (1, 0, 0, 0), (2, 1, 0, 3), (3, 0, 0, 0)]
    {
        n.insert(format!("gpu.0.nvlink.{link}.active"), active.to_string());
        n.insert(
            format!("gpu.0.nvlink.{link}.crc_flit"),
            crc_flit.to_string(),
        );
        n.insert(format!("gpu.0.nvlink.{link}.replay"), replay.to_string());
        n.insert(format!("gpu.0.field.138.{link}"), "u:100".into());
        n.insert(format!("gpu.0.field.139.{link}"), "u:200".into());
    }
    let standin = StandIn::new(n);
    let dir = tempfile::tempdir().unwrap();
    let csv = csv_with(
        dir.path(),
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_PER_LINK_TOTAL, counter, Flit CRC errors per link.\n\
         DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL, counter, Replays per link.\n\
         DCGM_FI_DEV_NVLINK_THROUGHPUT_PER_LINK, gauge, Throughput per link (MB/s).\n",
    );
    let exp = Exporter::start(&standin, &["-f", arg(&csv)]);
    let s = exp.wait_for("per-link series", |s| {
        s.named("DCGM_FI_DEV_NVLINK_THROUGHPUT_PER_LINK").count() == 2
    });
    let per_link = |metric: &str| -> Vec<(String, String, String, f64)> {
        let mut v: Vec<_> = s
            .named(metric)
            .map(|x| {
                (
                    x.label("gpu").to_owned(),
                    x.label("nvlink").to_owned(),
                    x.label("device").to_owned(),
                    x.value,
                )
            })
            .collect();
        v.sort_by(|a, b| a.1.cmp(&b.1));
        v
    };
    let row = |link: &str, v: f64| ("0".to_owned(), link.to_owned(), "nvidia0".to_owned(), v);
    // Links are numbered from 1, as dcgm-exporter numbers them; inactive links are not exported.
    assert_eq!(
        per_link("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_PER_LINK_TOTAL"),
        [row("1", 5.0), row("3", 0.0)],
        "{}",
        s.text
    );
    assert_eq!(
        per_link("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL"),
        [row("1", 10.0), row("3", 3.0)]
    );
    // The counters stand still: a rate of 0.
    assert_eq!(
        per_link("DCGM_FI_DEV_NVLINK_THROUGHPUT_PER_LINK"),
        [row("1", 0.0), row("3", 0.0)]
    );
    assert!(standin.counter("calls.nvmlDeviceGetNvLinkErrorCounter") >= 4);
}

#[test]
fn a_gpu_without_gpm_has_no_profiling_series_and_the_exporter_says_why_once() {
    // GPU 0 plays an A100 (no GPM); GPU 1 stays an H100 (GPM). Through the real NVML path the
    // profiling fields are absent on GPU 0 only, not counted as read errors, and reported once in
    // the log (with the fix) and in gpu_exporter_fields_unavailable.
    let mut n = node::standard();
    n.insert("gpu.0.gpm".into(), "0".into());
    n.insert("gpu.0.name".into(), "NVIDIA A100-SXM4-80GB".into());
    let standin = StandIn::new(n);
    let exp = Exporter::start(&standin, &["-f", arg(&default_csv())]);
    let s = settled(&exp);
    let prof: Vec<&Series> = s
        .series
        .iter()
        .filter(|x| x.name.starts_with("DCGM_FI_PROF_"))
        .collect();
    assert!(!prof.is_empty());
    assert!(
        prof.iter().all(|x| x.label("gpu") == "1"),
        "profiling series on the GPU without GPM: {prof:#?}"
    );
    for field in [
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
    ] {
        assert_eq!(
            s.value(
                "gpu_exporter_fields_unavailable",
                &[("field", field), ("reason", "needs_dcgm_profiling")]
            ),
            Some(1.0),
            "{field}"
        );
        assert_eq!(field_errors(&s, field, "not_supported"), 0.0, "{field}");
    }
    let logs = exp.logs();
    assert_eq!(
        logs.matches("gpu_exporter_fields_unavailable").count(),
        1,
        "{logs}"
    );
    assert_eq!(logs.matches("nvidia-dcgm:5555").count(), 1, "{logs}");
    assert!(logs.contains("NVIDIA A100-SXM4-80GB"), "{logs}");
}
