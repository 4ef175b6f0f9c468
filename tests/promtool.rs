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
