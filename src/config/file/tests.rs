//! Tests of the `--config-file` format.

use super::*;

fn err(text: &str) -> String {
    parse(text, "c.yaml").unwrap_err().to_string()
}

#[test]
fn version_2_applies_file_interval_scrapes_and_exporter_metrics() {
    let s = parse(
        "version: 2\nmetrics:\n  file: /etc/x.csv\n  enableExporterMetrics: true\n\
         collections:\n  - name: scrape\n    every: 15s\n    metrics:\n      include: [\"*\"]\n\
         \x20 - name: fast\n    every: 5s\n    metrics:\n      include: [DCGM_FI_DEV_GPU_TEMP]\n\
         sources:\n  dcgm:\n    watch:\n      maxKeepAge: 10m\n      maxKeepSamples: 0\n\
         server:\n  maxConcurrentScrapes: 16\n",
        "c.yaml",
    )
    .unwrap();
    assert_eq!(s.metrics, Some(MetricSource::File("/etc/x.csv".into())));
    assert_eq!(s.enable_exporter_metrics, Some(true));
    assert_eq!(s.interval_ms, Some(15_000));
    assert_eq!(s.max_concurrent_scrapes, Some(16));
    assert_eq!(s.notices.len(), 2, "{:?}", s.notices);
    assert!(s.notices[1].contains("collections[1] (\"fast\", every 5s) has no effect"));
}

#[test]
fn version_1_applies_interval_and_inline_fields() {
    let s = parse(
        "version: 1\nmetrics:\n  fields:\n    - name: DCGM_FI_DEV_GPU_TEMP\n      prometheusType: gauge\n      help: GPU temperature (in C), \"core\".\n\
         collection:\n  interval: 1m30s\n  watchGroups:\n    - name: g\n      interval: 5s\n      fields: [DCGM_FI_DEV_GPU_TEMP]\n",
        "c.yaml",
    )
    .unwrap();
    assert_eq!(
        s.metrics,
        Some(MetricSource::Inline(
            "DCGM_FI_DEV_GPU_TEMP, gauge, \"GPU temperature (in C), \"\"core\"\".\"\n".into()
        ))
    );
    assert_eq!(s.interval_ms, Some(90_000));
    assert_eq!(s.notices.len(), 1);
}

#[test]
fn errors_name_the_file_and_key() {
    assert_eq!(err("version: 3\n"), "c.yaml: version: must be 1 or 2");
    assert_eq!(
        err("metrics: {file: x}\n"),
        "c.yaml: version: must be 1 or 2"
    );
    assert_eq!(
        err("version: 1\ncollection:\n  interval: 10\n"),
        "c.yaml: collection.interval: \"10\" has no unit (use ns, us, ms, s, m or h)"
    );
    assert_eq!(
        err("version: 2\ncollections:\n  - name: a\n    every: 0s\n    metrics: {include: [\"*\"]}\n"),
        "c.yaml: collections[0].every: must be greater than 0"
    );
    assert_eq!(
        err("version: 2\nserver:\n  maxConcurrentScrapes: 0\n"),
        "c.yaml: server.maxConcurrentScrapes: 0: must be greater than 0"
    );
    assert_eq!(
        err("version: 2\nmetrics:\n  file: a.csv\n  fields: [{name: DCGM_FI_DEV_GPU_TEMP, prometheusType: gauge, help: t}]\n"),
        "c.yaml: metrics: must specify exactly one of file or fields"
    );
    assert_eq!(
        err("version: 1\nmetrics:\n  fields:\n    - {name: X, prometheusType: gauge, help: \" \"}\n"),
        "c.yaml: metrics.fields[0].help: required"
    );
    // Unknown keys are errors, with the key and line (v2 keys in a v1 file too).
    let e = err("version: 1\ncollections: []\n");
    assert!(
        e.starts_with("c.yaml: ")
            && e.contains("unknown field `collections`")
            && e.contains("line 2"),
        "{e}"
    );
    let e = err("version: 2\nmetrics:\n  fiel: a.csv\n");
    assert!(
        e.contains("metrics") && e.contains("unknown field `fiel`") && e.contains("line 3"),
        "{e}"
    );
    let e = err("version: 2\nmetrics: {file: a}\nmetrics: {file: b}\n");
    assert!(e.contains("duplicate"), "{e}");
}
