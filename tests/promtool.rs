//! Every golden file passes `promtool check metrics`, an independent parser and linter. DCGM
//! series may carry only the findings inherent to dcgm-exporter's names (counters without
//! `_total`, `modelName`/`UUID`-style labels, `_COUNTER` in a name); the per-container series
//! (`gpu_exporter_container_*`) only the camelCase one, as they carry each GPU's dcgm-exporter
//! labels (`modelName`) for join-free queries; `gpu_exporter_gpu_pod_info` only the camelCase one
//! too, as it carries the pods' own Kubernetes labels (renamed `pod_label_<name>` on a collision,
//! as dcgm-exporter 4.8.3 does, so `modelName` becomes `pod_label_modelName`); other
//! `gpu_exporter_*` series none. promtool comes from Debian's `prometheus` package; `.ci/run` installs it. Outside
//! CI a machine without promtool skips this test with a message.

mod common;

use common::{promtool_available, promtool_check as check};

const INHERENT: &[&str] = &[
    "counter metrics should have \"_total\" suffix",
    "label names should be written in 'snake_case' not 'camelCase'",
    "metric name should not include type 'counter'",
];

#[test]
fn golden_files_pass_promtool_with_only_inherent_dcgm_findings() {
    if !promtool_available() {
        return;
    }
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden");
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).expect("golden dir") {
        let path = entry.expect("entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("prom") {
            continue;
        }
        let body = std::fs::read_to_string(&path).expect("read golden");
        let (_, findings) = check(&body);
        for f in &findings {
            let (metric, finding) = f.split_once(' ').unwrap_or((f, ""));
            let entity_labels = (metric.starts_with("gpu_exporter_container_")
                || metric == "gpu_exporter_gpu_pod_info")
                && finding == INHERENT[1];
            assert!(
                (metric.starts_with("DCGM_") && INHERENT.contains(&finding)) || entity_labels,
                "{}: unexpected promtool finding: {f}",
                path.display()
            );
        }
        checked += 1;
    }
    assert!(checked >= 5, "expected the golden files, found {checked}");
}

#[test]
fn promtool_rejects_what_it_should() {
    // Guard against a vacuous pass: promtool must flag a broken body and a bad self-metric name.
    if !promtool_available() {
        return;
    }
    let (ok, _) = check("# TYPE x gauge\nx{a=\"unterminated} 1\n");
    assert!(!ok, "promtool accepted a malformed body");
    let (_, findings) = check("# HELP gpu_exporter_things counter\n# TYPE gpu_exporter_things counter\ngpu_exporter_things 1\n");
    assert!(
        findings.iter().any(|f| f.contains("_total")),
        "{findings:?}"
    );
}

#[test]
fn the_accounting_counters_pass_promtool() {
    // Issue 37: the gpu_exporter_container_*_total families and the idle power gauge, as a node
    // serves them (a holder, work outside pods, a MIG instance nobody holds).
    if !promtool_available() {
        return;
    }
    use gpu_exporter::accounting::{Account, AccountingOptions, Consumer, GpuTick};
    let m = common::SelfMetrics::default();
    m.accounting.enable(AccountingOptions {
        idle_mw: Some(60_000),
        processes: true,
        retention: std::time::Duration::from_secs(3600),
        hostname: ("hostname".into(), "node-a".into()),
        publish_every: std::time::Duration::ZERO,
    });
    let holder = Account::container(
        Some(2),
        gpu_exporter::pods::PodRef {
            namespace: "ml".into(),
            pod: "trainer-0".into(),
            container: "main".into(),
        },
        true,
    );
    let outside = Account {
        gi_id: None,
        consumer: Consumer::OutsidePods,
    };
    for (s, mj) in [(0, 5_000_000u64), (1, 5_250_000), (2, 5_400_000)] {
        m.accounting.record(
            std::time::Duration::from_secs(s),
            &[GpuTick {
                uuid: "GPU-12fa293c-c901-8b39-0778-9daeeff635a7".into(),
                index: 0,
                energy_mj: Some(mj),
                allocated: vec![
                    (holder.clone(), 3.0 / 7.0),
                    (Account::unallocated(Some(9)), 1.0 / 7.0),
                ]
                .into(),
                busy: vec![(holder.clone(), 0.2), (outside.clone(), 0.1)],
                running: Some([outside.clone()].into_iter().collect()),
            }],
        );
    }
    let text = m.text();
    for family in [
        "gpu_exporter_container_energy_joules_total",
        "gpu_exporter_container_allocated_gpu_seconds_total",
        "gpu_exporter_container_sm_busy_gpu_seconds_total",
        "gpu_exporter_container_idle_allocated_gpu_seconds_total",
        "gpu_exporter_gpu_idle_power_watts",
    ] {
        assert!(
            text.contains(&format!("\n{family}{{")),
            "{family} missing:\n{text}"
        );
    }
    let (ok, findings) = check(&text);
    assert!(ok, "promtool rejected the body:\n{text}");
    assert!(findings.is_empty(), "{findings:?}\n{text}");
}
