//! `-r` and the embedded hostengine end to end, the way a user runs them: the release-shaped
//! `gpu-exporter` binary with `--backend nvml -r host:5555` (or without `-r`: DCGM embedded, as
//! dcgm-exporter's default and the GPU Operator's) loads the NVML stand-in (tests/nvml_abi, playing two A100s:
//! GPU 0 whole, GPU 1 in MIG mode with GPU instances 2 and 9, no GPM) and this directory's DCGM
//! stand-in through the real `dlopen` paths. The DCGM stand-in numbers the GPUs the other way
//! round from NVML and gives its GPU instance entities ids unrelated to the GI ids, so a value
//! lands on the right series only when the mapping goes by UUID and (GPU, GPU instance).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::harness::{self, Exporter, Scrape, StandIn};
use crate::node::{self, GPU0, GPU1};

/// The five profiling rows of the default and dcp CSVs, with their DCGM field ids.
const PROF: [(&str, u16); 5] = [
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 1001),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 1004),
    ("DCGM_FI_PROF_DRAM_ACTIVE", 1005),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", 1009),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", 1010),
];

/// DCGM's entity of NVML GPU 0 (whole) and GPU 1 (MIG), and of GPU 1's GI 2 and GI 9.
const DCGM_GPU_OF_GPU0: u32 = 1;
const DCGM_GPU_OF_GPU1: u32 = 0;
const DCGM_ENTITY_OF_GI2: u32 = 8;
const DCGM_ENTITY_OF_GI9: u32 = 7;

/// Two A100s as the NVML stand-in plays them: the standard node without GPM.
fn a100_node() -> harness::Node {
    let mut n = node::standard();
    for gpu in 0..2 {
        n.insert(format!("gpu.{gpu}.gpm"), "0".into());
        n.insert(format!("gpu.{gpu}.name"), "NVIDIA A100-SXM4-80GB".into());
    }
    n
}

/// The value the hostengine holds for `field` on a target: distinct per entity and field.
fn value(target: &str, field: u16) -> f64 {
    let base = match target {
        "gpu0" => 0.5,
        "gpu1" => 0.25,
        "gi2" => 0.125,
        _ => 0.0625,
    };
    match field {
        1009 | 1010 => (f64::from(field) - 1000.0) * 1_000_000.0 + base * 1024.0,
        _ => base + f64::from(field - 1000) / 1024.0,
    }
}

/// The DCGM stand-in's "hostengine": a key = value file, replaced atomically.
struct Hostengine {
    dir: tempfile::TempDir,
    conf: BTreeMap<String, String>,
}

impl Hostengine {
    fn a100s() -> Self {
        let mut conf = BTreeMap::new();
        let mut put = |k: &str, v: String| {
            conf.insert(k.to_owned(), v);
        };
        put("hostengine", "up".into());
        put("gpus", "2".into());
        put(&format!("uuid.{DCGM_GPU_OF_GPU0}"), GPU0.into());
        put(&format!("uuid.{DCGM_GPU_OF_GPU1}"), GPU1.into());
        put(
            "mig.0",
            format!("{DCGM_GPU_OF_GPU1} {DCGM_ENTITY_OF_GI9} 9"),
        );
        put(
            "mig.1",
            format!("{DCGM_GPU_OF_GPU1} {DCGM_ENTITY_OF_GI2} 2"),
        );
        // A100-like metric groups: one pass for the activity ratios, another major for PCIe.
        put("metricgroup.0", "1 0 1001 1002 1003 1004 1005".into());
        put("metricgroup.1", "1 1 1006 1007 1008".into());
        put("metricgroup.2", "2 0 1009 1010 1011 1012".into());
        for (_, f) in PROF {
            put(
                &format!("value.1.{DCGM_GPU_OF_GPU0}.{f}"),
                value("gpu0", f).to_string(),
            );
            put(
                &format!("value.1.{DCGM_GPU_OF_GPU1}.{f}"),
                value("gpu1", f).to_string(),
            );
            put(
                &format!("value.4.{DCGM_ENTITY_OF_GI2}.{f}"),
                value("gi2", f).to_string(),
            );
            put(
                &format!("value.4.{DCGM_ENTITY_OF_GI9}.{f}"),
                value("gi9", f).to_string(),
            );
        }
        let h = Self {
            dir: tempfile::tempdir().expect("tempdir"),
            conf,
        };
        h.write();
        h
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("hostengine.conf")
    }

    fn write(&self) {
        let text: String = self
            .conf
            .iter()
            .map(|(k, v)| format!("{k} = {v}\n"))
            .collect();
        let tmp = self.dir.path().join("hostengine.conf.tmp");
        std::fs::write(&tmp, text).expect("write the DCGM stand-in configuration");
        std::fs::rename(&tmp, self.path()).expect("install it");
    }

    fn set(&mut self, k: &str, v: &str) {
        self.conf.insert(k.to_owned(), v.to_owned());
        self.write();
    }

    fn unset(&mut self, k: &str) {
        self.conf.remove(k);
        self.write();
    }

    fn counter(&self, call: &str) -> u64 {
        std::fs::read_to_string(self.dir.path().join("calls"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once(" = "))
            .find(|(k, _)| *k == call)
            .and_then(|(_, v)| v.trim().parse().ok())
            .unwrap_or(0)
    }

    /// The environment that makes the exporter load both stand-ins.
    fn env(&self) -> Vec<(&'static str, OsString)> {
        let dcgm = super::library().parent().expect("the library's directory");
        let mut path = OsString::from(harness::library_dir());
        path.push(":");
        path.push(dcgm);
        vec![
            ("LD_LIBRARY_PATH", path),
            ("DCGM_STANDIN_CONFIG", self.path().into()),
            ("DCGM_STANDIN_STATUS", self.dir.path().join("calls").into()),
        ]
    }
}

fn csv(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("metrics-config")
        .join(name)
}

fn start(nvml: &StandIn, he: &Hostengine, csv: &Path) -> Exporter {
    Exporter::start_with_env(
        nvml,
        &[
            "-f",
            csv.to_str().expect("utf-8 path"),
            "-r",
            "127.0.0.1:5555",
        ],
        &he.env(),
    )
}

/// The profiling series, as (metric, gpu, GPU_I_ID) -> value.
fn prof(s: &Scrape) -> BTreeMap<(String, String, String), f64> {
    s.series
        .iter()
        .filter(|x| x.name.starts_with("DCGM_FI_PROF_"))
        .map(|x| {
            (
                (
                    x.name.clone(),
                    x.label("gpu").to_owned(),
                    x.label("GPU_I_ID").to_owned(),
                ),
                x.value,
            )
        })
        .collect()
}

/// What the exporter must serve for `metrics` when the hostengine holds [`value`]: whole-GPU
/// values for GPU 0, per GPU instance activity ratios on the MIG GPU, and no PCIe bytes there
/// (a GPU-level field, not repeated on instances, as with NVML GPM).
fn expected(metrics: &[(&str, u16)]) -> BTreeMap<(String, String, String), f64> {
    let mut out = BTreeMap::new();
    for (name, f) in metrics {
        let mut put = |gpu: &str, gi: &str, target: &str| {
            out.insert(
                ((*name).to_owned(), gpu.to_owned(), gi.to_owned()),
                value(target, *f),
            );
        };
        put("0", "", "gpu0");
        if !matches!(f, 1009 | 1010) {
            put("1", "2", "gi2");
            put("1", "9", "gi9");
        }
    }
    out
}

/// The `gpu` labels of `metric`'s series, sorted and deduplicated.
fn gpus_with(s: &Scrape, metric: &str) -> Vec<String> {
    let mut v: Vec<String> = s.named(metric).map(|x| x.label("gpu").to_owned()).collect();
    v.sort();
    v.dedup();
    v
}

fn has_all_prof(s: &Scrape, want: &BTreeMap<(String, String, String), f64>) -> bool {
    &prof(s) == want
}

#[test]
fn dash_r_serves_the_profiling_fields_of_the_default_and_dcp_csvs_on_a100s_whole_and_mig() {
    for file in ["default-counters.csv", "upstream/dcp-metrics-included.csv"] {
        let nvml = StandIn::new(a100_node());
        let he = Hostengine::a100s();
        let exp = start(&nvml, &he, &csv(file));
        let want = expected(&PROF);
        let s = exp.wait_for(&format!("{file}: every profiling series, exact"), |s| {
            has_all_prof(s, &want)
        });
        assert_eq!(s.value("gpu_exporter_dcgm_connected", &[]), Some(1.0));
        assert!(s.value("gpu_exporter_dcgm_reads_total", &[]) >= Some(1.0));
        assert_eq!(
            s.value("gpu_exporter_dcgm_mode", &[("mode", "remote")]),
            Some(1.0)
        );
        assert_eq!(
            he.counter("dcgmStartEmbedded_v2"),
            0,
            "{file}: embedded with -r"
        );
        // DCGM serves them: no "needs DCGM" gap, no field errors, nothing refused.
        assert_eq!(
            s.named("gpu_exporter_fields_unavailable").count(),
            0,
            "{file}"
        );
        assert_eq!(
            s.named("gpu_exporter_dcgm_fields_refused").count(),
            0,
            "{file}"
        );
        for (name, _) in PROF {
            assert_eq!(
                s.value(
                    "gpu_exporter_field_errors_total",
                    &[("field", name), ("reason", "failed")]
                )
                .unwrap_or(0.0),
                0.0,
                "{file} {name}"
            );
        }
        // The MIG series carry the MIG labels of NVML's instances (by GI id, not DCGM entity).
        let gi9 = s
            .named("DCGM_FI_PROF_GR_ENGINE_ACTIVE")
            .find(|x| x.label("GPU_I_ID") == "9")
            .expect("GI 9");
        assert_eq!(gi9.label("UUID"), GPU1, "{gi9:?}");
        // NVML still serves the rest.
        assert_eq!(gpus_with(&s, "DCGM_FI_DEV_GPU_TEMP"), ["0", "1"], "{file}");
        // One watch for everything: the entity group and the field group are created once.
        assert_eq!(he.counter("dcgmWatchFields"), 1, "{file}");
        assert_eq!(he.counter("dcgmGroupCreate"), 1, "{file}");
    }
}

#[test]
fn a_hostengine_that_is_down_restarts_or_goes_away_removes_only_the_dcgm_series_and_comes_back() {
    let nvml = StandIn::new(a100_node());
    let mut he = Hostengine::a100s();
    he.set("hostengine", "down");
    let exp = start(&nvml, &he, &csv("default-counters.csv"));
    let want = expected(&PROF);

    // Down at startup: the exporter serves NVML's series, no profiling series, and says why.
    let s = exp.wait_for("failed connections while NVML series are served", |s| {
        s.samples() >= 2
            && s.value("gpu_exporter_dcgm_errors_total", &[("reason", "connect")]) >= Some(2.0)
    });
    assert_eq!(s.value("gpu_exporter_dcgm_connected", &[]), Some(0.0));
    assert!(prof(&s).is_empty(), "{:?}", prof(&s));
    assert_eq!(gpus_with(&s, "DCGM_FI_DEV_GPU_TEMP"), ["0", "1"]);

    // Up: it connects by itself and serves them.
    he.set("hostengine", "up");
    exp.wait_for("the profiling series after the hostengine came up", |s| {
        has_all_prof(s, &want)
    });

    // Restarted (a new epoch, watches gone, a new value): the old connection is lost; the
    // exporter reconnects, watches again and serves the new value.
    he.set("epoch", "1");
    he.set(&format!("value.1.{DCGM_GPU_OF_GPU0}.1001"), "0.875");
    let s = exp.wait_for("the value after the restart", |s| {
        s.value(
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            &[("gpu", "0"), ("GPU_I_ID", "")],
        ) == Some(0.875)
    });
    assert!(s.value("gpu_exporter_dcgm_reconnects_total", &[]) >= Some(1.0));
    assert!(
        s.value(
            "gpu_exporter_dcgm_errors_total",
            &[("reason", "connection_lost")]
        ) >= Some(1.0)
    );
    assert!(he.counter("dcgmWatchFields") >= 2);

    // Gone: the profiling series go, the rest stays.
    he.set("hostengine", "down");
    let s = exp.wait_for("no profiling series once the hostengine is gone", |s| {
        prof(s).is_empty() && s.value("gpu_exporter_dcgm_connected", &[]) == Some(0.0)
    });
    assert_eq!(gpus_with(&s, "DCGM_FI_DEV_GPU_TEMP"), ["0", "1"]);
    assert!(s.named("DCGM_FI_DEV_FB_USED").count() > 0);
}

#[test]
fn fields_the_hostengine_refuses_remove_only_their_series_and_say_why() {
    let nvml = StandIn::new(a100_node());
    let mut he = Hostengine::a100s();
    // DRAM activity: dcgmWatchFields says DCGM_ST_PROFILING_NOT_SUPPORTED for any field group
    // holding it. Tensor activity: in a metric group of the same major as graphics activity's,
    // so it cannot be watched with it (multi-pass).
    he.set("refusewatch.1005", "-36");
    he.set("metricgroup.0", "1 0 1001 1002 1003 1005");
    he.set("metricgroup.1", "1 1 1004 1006 1007 1008");
    let exp = start(&nvml, &he, &csv("default-counters.csv"));
    let served: Vec<(&str, u16)> = PROF
        .iter()
        .copied()
        .filter(|(_, f)| !matches!(f, 1004 | 1005))
        .collect();
    let want = expected(&served);
    let s = exp.wait_for("the profiling series the hostengine serves, only", |s| {
        has_all_prof(s, &want) && s.named("gpu_exporter_dcgm_fields_refused").count() == 2
    });
    assert_eq!(
        s.value(
            "gpu_exporter_dcgm_fields_refused",
            &[
                ("field", "DCGM_FI_PROF_DRAM_ACTIVE"),
                ("reason", "not_supported")
            ]
        ),
        Some(1.0)
    );
    assert_eq!(
        s.value(
            "gpu_exporter_dcgm_fields_refused",
            &[
                ("field", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
                ("reason", "multi_pass")
            ]
        ),
        Some(1.0)
    );
    assert!(s.value("gpu_exporter_dcgm_errors_total", &[("reason", "watch")]) >= Some(1.0));
    assert_eq!(gpus_with(&s, "DCGM_FI_DEV_GPU_TEMP"), ["0", "1"]);
}

#[test]
fn without_dcgms_library_dash_r_serves_nvml_only_and_says_why() {
    // An image without libdcgm.so.4 under the GPU Operator's standalone DCGM (which sets
    // DCGM_REMOTE_HOSTENGINE_INFO): the exporter still starts, serves what NVML reads, names the
    // missing library, and reports the profiling fields as needing DCGM.
    let nvml = StandIn::new(a100_node());
    let exp = Exporter::start(
        &nvml,
        &[
            "-f",
            csv("default-counters.csv").to_str().expect("utf-8 path"),
            "-r",
            "127.0.0.1:5555",
        ],
    );
    let s = exp.wait_for("NVML series and the profiling gap", |s| {
        s.samples() >= 1
            && s.value(
                "gpu_exporter_fields_unavailable",
                &[
                    ("field", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
                    ("reason", "needs_dcgm_profiling"),
                ],
            ) == Some(2.0)
    });
    assert!(prof(&s).is_empty(), "{:?}", prof(&s));
    assert_eq!(gpus_with(&s, "DCGM_FI_DEV_GPU_TEMP"), ["0", "1"]);
    let logs = exp.logs();
    assert!(logs.contains("libdcgm.so.4"), "{logs}");
    assert!(logs.contains("serving NVML only"), "{logs}");
}

#[test]
fn sim_dcgm_makes_simulated_a100s_serve_the_profiling_fields() {
    // The simulated fleet (a later --backend overrides the harness's `nvml`), without and with
    // its simulated DCGM hostengine.
    let nvml = StandIn::new(a100_node());
    let args = ["--backend", "sim", "--sim-profile", "4xA100-80GB-MIG"];
    let without = Exporter::start(&nvml, &args);
    let s = without.wait_for("a sample", |s| s.samples() >= 1);
    assert!(prof(&s).is_empty(), "{:?}", prof(&s));
    assert!(s.named("gpu_exporter_fields_unavailable").count() > 0);
    drop(without);
    let with = Exporter::start(&nvml, &[&args[..], &["--sim-dcgm"]].concat());
    let s = with.wait_for("a sample", |s| s.samples() >= 1);
    let p = prof(&s);
    // Whole GPUs and MIG instances.
    assert!(p.keys().any(|(_, _, gi)| gi.is_empty()), "{p:?}");
    assert!(p.keys().any(|(_, _, gi)| !gi.is_empty()), "{p:?}");
    assert_eq!(s.named("gpu_exporter_fields_unavailable").count(), 0);
}

#[test]
fn a_csv_reload_that_drops_a_profiling_field_unwatches_it() {
    let nvml = StandIn::new(a100_node());
    let he = Hostengine::a100s();
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("counters.csv");
    let full = std::fs::read_to_string(csv("default-counters.csv")).expect("the default CSV");
    std::fs::write(&path, &full).expect("write the CSV");
    let exp = start(&nvml, &he, &path);
    exp.wait_for("every profiling series", |s| {
        has_all_prof(s, &expected(&PROF))
    });
    // Without the DRAM row (the exporter re-reads the file when it changes).
    let reduced: String = full
        .lines()
        .filter(|l| !l.starts_with("DCGM_FI_PROF_DRAM_ACTIVE"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(reduced.len(), full.len());
    std::fs::write(&path, reduced).expect("rewrite the CSV");
    let kept: Vec<(&str, u16)> = PROF.iter().copied().filter(|(_, f)| *f != 1005).collect();
    exp.wait_for("the profiling series without DRAM", |s| {
        has_all_prof(s, &expected(&kept))
    });
    // The old watch is dropped and one without the field takes its place.
    exp.wait_for(
        "the hostengine's counters: one unwatch, a second watch",
        |_| he.counter("dcgmUnwatchFields") >= 1 && he.counter("dcgmWatchFields") >= 2,
    );
}

#[test]
fn a_failed_watch_destroys_what_it_made_so_the_profiling_series_come_back_when_the_fault_clears() {
    // Issue 35 item 1: a field group the hostengine cannot make (its table full: -24) after the
    // entity group was made. Each interval retries; none may leave its entity group behind
    // (64 of them fill DCGM's table for good).
    let nvml = StandIn::new(a100_node());
    let mut he = Hostengine::a100s();
    for (call, other) in [
        ("dcgmFieldGroupCreate", "dcgmGroupCreate"),
        ("dcgmGroupCreate", "dcgmFieldGroupCreate"),
    ] {
        he.set(&format!("fail.{call}"), "-24");
        let exp = start(&nvml, &he, &csv("default-counters.csv"));
        let before = he.counter(call);
        let s = exp.wait_for(&format!("{call} failing at several intervals"), |s| {
            he.counter(call) >= before + 5
                && s.value("gpu_exporter_dcgm_errors_total", &[("reason", "watch")]) >= Some(5.0)
        });
        assert!(prof(&s).is_empty(), "{call}: {:?}", prof(&s));
        assert_eq!(s.value("gpu_exporter_dcgm_connected", &[]), Some(1.0));
        // Connected but watching nothing: said by its own gauge.
        assert_eq!(s.value("gpu_exporter_dcgm_fields_watched", &[]), Some(0.0));
        assert_eq!(gpus_with(&s, "DCGM_FI_DEV_GPU_TEMP"), ["0", "1"]);
        // The log names the status, not "an unknown DCGM status".
        let logs = exp.logs();
        assert!(
            logs.contains(&format!("{call} returned DCGM_ST_MAX_LIMIT (-24)")),
            "{logs}"
        );
        // The fault clears: the series come back, and the hostengine holds exactly the one
        // entity group and the one field group of the watch in place.
        he.unset(&format!("fail.{call}"));
        let s = exp.wait_for(&format!("{call}: the profiling series back"), |s| {
            has_all_prof(s, &expected(&PROF))
        });
        assert_eq!(s.value("gpu_exporter_dcgm_fields_watched", &[]), Some(5.0));
        assert_eq!(
            he.counter("live.groups"),
            1,
            "{call}: entity groups left behind"
        );
        assert_eq!(
            he.counter("live.field_groups"),
            1,
            "{call}: field groups left behind"
        );
        assert!(he.counter(other) >= 1);
    }
}

#[test]
fn a_dcgm_that_never_answers_neither_delays_serving_nor_holds_sigterm() {
    // Issue 35 item 2: dcgmInit or dcgmConnect_v2 blocking for a minute (a slow hostengine, a
    // library that ignores its connect timeout). The exporter serves NVML's series at once and
    // SIGTERM ends it without waiting for DCGM.
    for call in ["dcgmInit", "dcgmConnect_v2"] {
        let nvml = StandIn::new(a100_node());
        let mut he = Hostengine::a100s();
        he.set(&format!("delay.{call}"), "60000");
        let mut exp = start(&nvml, &he, &csv("default-counters.csv"));
        let (code, _) = exp.get("/health");
        assert_eq!(code, 200, "{call}");
        let s = exp.wait_for(&format!("{call} blocked: NVML's series"), |s| {
            s.samples() >= 2 && gpus_with(s, "DCGM_FI_DEV_GPU_TEMP") == ["0", "1"]
        });
        assert_eq!(s.value("gpu_exporter_dcgm_connected", &[]), Some(0.0));
        assert!(he.counter(call) >= 1, "{call} was never called");
        // Two seconds is the aim (docs/reliability.md); the bound here leaves a loaded CI
        // machine room while staying far below the minute DCGM holds on.
        let (took, status) = exp
            .terminate(Duration::from_secs(15))
            .unwrap_or_else(|| panic!("{call}: SIGTERM waited for DCGM\n{}", exp.logs()));
        assert!(status.success(), "{call}: {status:?}\n{}", exp.logs());
        eprintln!("{call} blocked for 60 s: SIGTERM ended the exporter in {took:?}");
    }
}

#[test]
fn a_csv_reload_without_any_profiling_row_unwatches_them_all_and_clears_the_refusals() {
    // Issue 35 item 3: the reader must see that no profiling field is wanted any more.
    let nvml = StandIn::new(a100_node());
    let mut he = Hostengine::a100s();
    he.set("refusewatch.1005", "-36");
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("counters.csv");
    let full = std::fs::read_to_string(csv("default-counters.csv")).expect("the default CSV");
    std::fs::write(&path, &full).expect("write the CSV");
    let exp = start(&nvml, &he, &path);
    exp.wait_for("profiling series and one refusal", |s| {
        !prof(s).is_empty() && s.named("gpu_exporter_dcgm_fields_refused").count() == 1
    });
    let none: String = full
        .lines()
        .filter(|l| !l.trim_start().starts_with("DCGM_FI_PROF_"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(full.contains("DCGM_FI_PROF_") && !none.contains("DCGM_FI_PROF_"));
    std::fs::write(&path, none).expect("rewrite the CSV");
    let s = exp.wait_for("no profiling field watched, no refusal left", |s| {
        prof(s).is_empty()
            && s.named("gpu_exporter_dcgm_fields_refused").count() == 0
            && s.value("gpu_exporter_dcgm_fields_watched", &[]) == Some(0.0)
    });
    assert_eq!(gpus_with(&s, "DCGM_FI_DEV_GPU_TEMP"), ["0", "1"]);
    exp.wait_for("the hostengine's groups destroyed", |_| {
        he.counter("dcgmUnwatchFields") >= 1
            && he.counter("live.groups") == 0
            && he.counter("live.field_groups") == 0
    });
}

/// The exporter as dcgm-exporter runs by default and under the GPU Operator's embedded mode: no
/// `-r`, DCGM's library on the loader's path.
fn start_embedded(nvml: &StandIn, he: &Hostengine, csv: &Path) -> Exporter {
    Exporter::start_with_env(nvml, &["-f", csv.to_str().expect("utf-8 path")], &he.env())
}

#[test]
fn without_dash_r_dcgms_library_runs_embedded_and_serves_the_profiling_fields_on_a100s() {
    for file in ["default-counters.csv", "upstream/dcp-metrics-included.csv"] {
        let nvml = StandIn::new(a100_node());
        let mut he = Hostengine::a100s();
        // No hostengine to connect to: only the embedded one can serve.
        he.set("hostengine", "down");
        let mut exp = start_embedded(&nvml, &he, &csv(file));
        let want = expected(&PROF);
        let s = exp.wait_for(&format!("{file}: every profiling series, embedded"), |s| {
            has_all_prof(s, &want)
        });
        assert_eq!(
            s.value("gpu_exporter_dcgm_mode", &[("mode", "embedded")]),
            Some(1.0),
            "{file}"
        );
        assert_eq!(s.value("gpu_exporter_dcgm_connected", &[]), Some(1.0));
        assert_eq!(s.named("gpu_exporter_fields_unavailable").count(), 0);
        assert_eq!(gpus_with(&s, "DCGM_FI_DEV_GPU_TEMP"), ["0", "1"], "{file}");
        assert_eq!(he.counter("dcgmStartEmbedded_v2"), 1, "{file}");
        assert_eq!(he.counter("dcgmConnect_v2"), 0, "{file}: connected instead");
        assert_eq!(he.counter("embedded.running"), 1, "{file}");
        // No --enable-dcgm-log: no log file.
        assert_eq!(he.counter("embedded.log_stdout"), 0, "{file}");
        // SIGTERM stops the embedded hostengine (dcgmStopEmbedded) before the process ends.
        let (_, status) = exp
            .terminate(Duration::from_secs(15))
            .unwrap_or_else(|| panic!("{file}: SIGTERM did not end the exporter"));
        assert!(status.success(), "{file}: {status:?}\n{}", exp.logs());
        assert_eq!(he.counter("dcgmStopEmbedded"), 1, "{file}\n{}", exp.logs());
        assert_eq!(he.counter("embedded.running"), 0, "{file}");
    }
}

#[test]
fn an_embedded_dcgm_that_cannot_start_leaves_nvml_serving_says_why_and_retries() {
    let nvml = StandIn::new(a100_node());
    let mut he = Hostengine::a100s();
    he.set("fail.dcgmStartEmbedded_v2", "-3");
    let exp = start_embedded(&nvml, &he, &csv("default-counters.csv"));
    let s = exp.wait_for("NVML's series while the embedded start fails", |s| {
        s.samples() >= 2
            && s.value(
                "gpu_exporter_dcgm_errors_total",
                &[("reason", "start_embedded")],
            ) >= Some(2.0)
    });
    assert!(prof(&s).is_empty(), "{:?}", prof(&s));
    assert_eq!(s.value("gpu_exporter_dcgm_connected", &[]), Some(0.0));
    assert_eq!(
        s.value("gpu_exporter_dcgm_mode", &[("mode", "embedded")]),
        Some(1.0)
    );
    assert_eq!(gpus_with(&s, "DCGM_FI_DEV_GPU_TEMP"), ["0", "1"]);
    assert!(s.named("DCGM_FI_DEV_FB_USED").count() > 0);
    let logs = exp.logs();
    assert!(
        logs.contains("cannot start DCGM's embedded hostengine")
            && logs.contains("dcgmStartEmbedded_v2 returned DCGM_ST_GENERIC_ERROR (-3)"),
        "{logs}"
    );
    // The fault clears (a driver that was not ready yet): it starts and serves by itself.
    he.unset("fail.dcgmStartEmbedded_v2");
    exp.wait_for(
        "the profiling series once the embedded start succeeds",
        |s| {
            has_all_prof(s, &expected(&PROF))
                && s.value("gpu_exporter_dcgm_connected", &[]) == Some(1.0)
        },
    );
}

#[test]
fn without_dash_r_and_without_dcgms_library_nvml_serves_alone_with_an_info_line() {
    // The standard image (no libdcgm.so.4) with no -r: NVML serves, no DCGM self-metric appears,
    // and the log says so at info level, not as a warning.
    let nvml = StandIn::new(a100_node());
    let exp = Exporter::start(
        &nvml,
        &[
            "-f",
            csv("default-counters.csv").to_str().expect("utf-8 path"),
        ],
    );
    let s = exp.wait_for("NVML series and the profiling gap", |s| {
        s.samples() >= 1
            && s.value(
                "gpu_exporter_fields_unavailable",
                &[
                    ("field", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
                    ("reason", "needs_dcgm_profiling"),
                ],
            ) == Some(2.0)
    });
    assert!(prof(&s).is_empty(), "{:?}", prof(&s));
    assert_eq!(s.named("gpu_exporter_dcgm_mode").count(), 0);
    assert_eq!(gpus_with(&s, "DCGM_FI_DEV_GPU_TEMP"), ["0", "1"]);
    let logs = exp.logs();
    let line = logs
        .lines()
        .find(|l| l.contains("no DCGM library"))
        .unwrap_or_else(|| panic!("no line about DCGM's library in\n{logs}"));
    assert!(line.contains("INFO") && !line.contains("WARN"), "{line}");
    assert!(line.contains("libdcgm.so.4"), "{line}");
}

#[test]
fn enable_dcgm_log_makes_the_embedded_hostengine_log_to_stdout_at_the_level_given() {
    // dcgm-exporter's --enable-dcgm-log / --dcgm-log-level (its __DCGM_DBG_FILE=- and
    // __DCGM_DBG_LVL): here dcgmStartEmbedded_v2's log file "-" and severity.
    for (args, severity) in [
        (&["--enable-dcgm-log", "--dcgm-log-level", "WARN"][..], 3),
        (&["--enable-dcgm-log"][..], 0),
    ] {
        let nvml = StandIn::new(a100_node());
        let he = Hostengine::a100s();
        let csv = csv("default-counters.csv");
        let all: Vec<&str> = ["-f", csv.to_str().expect("utf-8 path")]
            .into_iter()
            .chain(args.iter().copied())
            .collect();
        let exp = Exporter::start_with_env(&nvml, &all, &he.env());
        exp.wait_for(&format!("{args:?}: the profiling series"), |s| {
            has_all_prof(s, &expected(&PROF))
        });
        assert_eq!(he.counter("embedded.log_stdout"), 1, "{args:?}");
        assert_eq!(he.counter("embedded.severity"), severity, "{args:?}");
    }
}
