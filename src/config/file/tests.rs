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

use crate::fsread::tests::fifo;

#[test]
fn the_file_is_read_through_the_bounded_reader() {
    let dir = tempfile::tempdir().unwrap();
    let good = "version: 2\nmetrics:\n  file: /etc/x.csv\n";
    // Over the cap: refused without being read whole, even when it is valid YAML.
    let big = dir.path().join("big.yaml");
    let padding = format!("# {}\n", "x".repeat(1000)).repeat(1100);
    std::fs::write(&big, format!("{good}{padding}")).unwrap();
    assert_eq!(
        load(&big).unwrap_err().to_string(),
        format!(
            "config file {}: larger than 1048576 bytes; refused",
            big.display()
        )
    );
    // A FIFO is refused at once, without waiting for a writer; a device is never read.
    let pipe = dir.path().join("pipe.yaml");
    fifo(&pipe);
    assert_eq!(
        load(&pipe).unwrap_err().to_string(),
        format!(
            "config file {}: is a FIFO (named pipe), not a regular file; refused",
            pipe.display()
        )
    );
    assert_eq!(
        load(std::path::Path::new("/dev/zero"))
            .unwrap_err()
            .to_string(),
        "config file /dev/zero: is a character device, not a regular file; refused"
    );
    let gone = dir.path().join("gone.yaml");
    assert_eq!(
        load(&gone).unwrap_err().to_string(),
        format!("config file {}: no such file", gone.display())
    );
    let latin1 = dir.path().join("latin1.yaml");
    std::fs::write(&latin1, b"version: 2\nmetrics:\n  file: /etc/\xe9.csv\n").unwrap();
    assert_eq!(
        load(&latin1).unwrap_err().to_string(),
        format!("config file {}:3: not UTF-8 text", latin1.display())
    );
    // A UTF-8 byte-order mark is ignored, as in the metrics CSV.
    let bom = dir.path().join("bom.yaml");
    std::fs::write(&bom, format!("\u{feff}{good}")).unwrap();
    assert_eq!(
        load(&bom).unwrap().metrics,
        Some(MetricSource::File("/etc/x.csv".into()))
    );
}

#[test]
fn inline_fields_cannot_smuggle_csv_rows() {
    let fields = |name: &str, ty: &str| {
        format!(
            "version: 2\nmetrics:\n  fields:\n    - {{name: DCGM_FI_DEV_GPU_TEMP, prometheusType: gauge, help: t}}\n    - {{name: {name}, prometheusType: {ty}, help: h}}\n"
        )
    };
    for (name, ty, key, says) in [
        (
            r#""DCGM_FI_DEV_POWER_USAGE\nDCGM_FI_DEV_GPU_TEMP""#,
            "gauge",
            "metrics.fields[1].name",
            "contains a line break",
        ),
        (
            r#""DCGM_FI_DEV_POWER_USAGE, gauge, \"rewritten help\"\r""#,
            "gauge",
            "metrics.fields[1].name",
            "contains a comma",
        ),
        (
            "DCGM_FI_DEV_POWER_USAGE",
            r#""gauge\nDCGM_FI_DEV_SM_CLOCK""#,
            "metrics.fields[1].prometheusType",
            "contains a line break",
        ),
        (
            "DCGM_FI_DEV_POWER_USAGE",
            r#"'"gauge"'"#,
            "metrics.fields[1].prometheusType",
            "contains a double quote",
        ),
        (
            "DCGM_FI_DEV_POWER_USAGE",
            r#""gauge\tx""#,
            "metrics.fields[1].prometheusType",
            "contains the control character '\\t'",
        ),
        (
            r##""#DCGM_FI_DEV_POWER_USAGE""##,
            "gauge",
            "metrics.fields[1].name",
            "cannot start with '#'",
        ),
    ] {
        let e = err(&fields(name, ty));
        assert!(
            e.starts_with(&format!("c.yaml: {key}: ")) && e.contains(says),
            "{name} {ty}: {e}"
        );
    }
    // A line break in a help text stays inside its row.
    let s = parse(
        "version: 2\nmetrics:\n  fields:\n    - {name: DCGM_FI_DEV_GPU_TEMP, prometheusType: gauge, help: \"a\\r\\nDCGM_FI_DEV_POWER_USAGE, gauge, b\"}\n",
        "c.yaml",
    )
    .unwrap();
    let Some(MetricSource::Inline(csv)) = s.metrics else {
        panic!("{s:?}")
    };
    assert_eq!(csv.lines().count(), 1, "{csv:?}");
}

#[test]
fn deep_nesting_is_refused_before_it_is_parsed() {
    let flow = format!(
        "version: 2\nmetrics:\n  fields: {}{}\n",
        "[".repeat(200),
        "]".repeat(200)
    );
    assert_eq!(
        err(&flow),
        "c.yaml:3: nested more than 64 levels deep; refused"
    );
    let dashes = format!("version: 2\ncollections:\n  {}x\n", "- ".repeat(200));
    assert_eq!(
        err(&dashes),
        "c.yaml:3: nested more than 64 levels deep; refused"
    );
    // What the 1 MiB cap allows is refused at once (yaml_serde took 42 s of CPU for 100,000
    // levels).
    let huge = format!("version: 2\nmetrics: {}", "[".repeat((1 << 20) - 20));
    assert_eq!(
        err(&huge),
        "c.yaml:2: nested more than 64 levels deep; refused"
    );
}

#[test]
fn overflowing_numbers_say_too_large() {
    for (n, says) in [
        ("4294967296", "4294967296: too large (at most 4294967295)"),
        ("99999999999999999999", "too large (at most 4294967295)"),
        ("18446744073709551615", "18446744073709551615: too large"),
        ("-1", "-1: must be greater than 0"),
        ("1.5", "1.5: must be a whole number"),
    ] {
        let e = err(&format!(
            "version: 2\nserver:\n  maxConcurrentScrapes: {n}\n"
        ));
        assert!(
            e.starts_with("c.yaml: server.maxConcurrentScrapes: ") && e.contains(says),
            "{n}: {e}"
        );
    }
    let s = parse(
        "version: 2\nserver:\n  maxConcurrentScrapes: 4294967295\n",
        "c.yaml",
    )
    .unwrap();
    assert_eq!(s.max_concurrent_scrapes, Some(u32::MAX));
    // DCGM's sample counts (no effect here) are Go int64s.
    let e = err(
        "version: 2\nsources:\n  dcgm:\n    watch:\n      maxKeepSamples: 9223372036854775808\n",
    );
    assert_eq!(
        e,
        "c.yaml: sources.dcgm.watch.maxKeepSamples: 9223372036854775808: too large (at most 9223372036854775807)"
    );
    let e = err("version: 1\ncollection:\n  retention:\n    maxSamples: 99999999999999999999\n");
    assert!(
        e.starts_with("c.yaml: collection.retention.maxSamples: ") && e.contains("too large"),
        "{e}"
    );
    assert!(parse(
        "version: 2\nsources:\n  dcgm:\n    watch:\n      maxKeepSamples: -9223372036854775808\n",
        "c.yaml"
    )
    .is_ok());
}
