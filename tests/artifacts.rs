//! The shipped artifacts, tested like code: Grafana dashboards (`dashboards/*.json`), alert rules
//! (`alerts/*.yml`) and Kubernetes manifests (`deploy/`).
//!
//! Every metric a dashboard or rule queries must be one the exporter can serve (a numeric row of
//! `metrics-config/default-counters.csv`, or a self-metric); dashboards must be importable
//! anywhere (`${datasource}`, stable uids, current schema); the manifests must agree with the
//! binary (port, metrics CSV) and keep the deployment rules (selector, read-only hostPath, ...).
//! The process-usage overlay (`overlays/process-usage/`) must mount only what it documents,
//! read-only, and set only the binary's own variables to values it accepts.
//! `promtool`, `kubectl kustomize` and the end-to-end run live in `scripts/ci-artifacts.sh`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use clap::Parser;

use serde::Deserialize;
use serde_json::Value as Json;
use yaml_serde::Value as Yaml;

use gpu_exporter::catalog;
use gpu_exporter::exporter_metrics::ExporterMetrics as SelfMetrics;

/// The dashboard schema version of Grafana 11.6, the one the pinned grafana-foundation-sdk build
/// (scripts/gen-dashboards.py) writes; older ones are migrated on import, which rewrites panels
/// users then see as "changed".
const MIN_SCHEMA_VERSION: u64 = 41;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    let p = root().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

fn files(dir: &str, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root().join(dir))
        .unwrap_or_else(|e| panic!("listing {dir}: {e}"))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no *.{ext} in {dir}");
    v
}

/// Every name a query may use: CSV metrics, self-metrics, the pod-info family, Prometheus' `up`.
fn known_metrics() -> BTreeSet<String> {
    let (cat, skipped) = catalog::load(&root().join("metrics-config/default-counters.csv"))
        .expect("metrics-config/default-counters.csv parses");
    assert!(
        skipped.is_empty(),
        "the shipped CSV names fields we skip: {skipped:?}"
    );
    let mut known: BTreeSet<String> = cat.metrics.iter().map(|m| m.name.clone()).collect();
    // The newest naming generation (dcgm-exporter 4.10's default set), which queries also read.
    let newest = "metrics-config/dcgm-exporter-4.10-default-counters.csv";
    let (cat, _) = catalog::load(&root().join(newest)).unwrap_or_else(|e| panic!("{newest}: {e}"));
    known.extend(cat.metrics.iter().map(|m| m.name.clone()));
    // The self-metrics of every mode: the kubelet's, DRA's, the container runtime's, per-process
    // attribution's and HPC jobs' families are only emitted when those run.
    let all_modes = SelfMetrics::default();
    all_modes.cri.enable();
    all_modes.kube_api.enable();
    all_modes.processes.enable();
    all_modes.pod_resources.enable();
    all_modes.pod_resources.enable_dra();
    all_modes.hpc_jobs.enable();
    all_modes.web.enable(Some(0.0));
    all_modes.attribution.add_source("kubelet");
    // Accounting's families show once the ledger has an account of each kind.
    all_modes
        .accounting
        .enable(gpu_exporter::accounting::AccountingOptions {
            idle_mw: Some(0),
            processes: true,
            retention: std::time::Duration::from_secs(3600),
            hostname: ("hostname".into(), "node-a".into()),
            publish_every: std::time::Duration::ZERO,
        });
    let holder = gpu_exporter::accounting::Account::container(
        None,
        gpu_exporter::pods::PodRef {
            namespace: "ns".into(),
            pod: "p".into(),
            container: "c".into(),
        },
        true,
    );
    for (at, energy) in [(0, 0), (1, 1000)] {
        all_modes.accounting.record(
            std::time::Duration::from_secs(at),
            &[gpu_exporter::accounting::GpuTick {
                uuid: "GPU-0".into(),
                index: 0,
                energy_mj: Some(energy),
                allocated: vec![(holder.clone(), 0.5)].into(),
                busy: vec![(holder.clone(), 0.5)],
                running: Some(Default::default()),
            }],
        );
    }
    known.extend(
        all_modes
            .text()
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.split(' ').next())
            .map(str::to_owned),
    );
    known.insert(gpu_exporter::snapshot::POD_INFO.to_owned());
    known.extend(
        gpu_exporter::snapshot::CONTAINER_FAMILIES
            .iter()
            .map(|s| (*s).to_owned()),
    );
    known.insert("up".to_owned());
    known
}

const KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "offset",
    "bool",
    "inf",
    "nan",
    // Aggregation operators, which may be followed by `by (...)` before their parentheses.
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
];

/// Metric names in a PromQL expression: identifiers outside label matchers (`{...}`), ranges
/// (`[...]`), strings and grouping lists, that are not function names or keywords. A Grafana
/// `label_values(metric{...}, label)` query yields its metric only.
fn metric_names(expr: &str) -> Vec<String> {
    let expr = expr.trim();
    let expr = match expr
        .strip_prefix("label_values(")
        .and_then(|s| s.strip_suffix(')'))
    {
        Some(inner) => match top_level_comma(inner) {
            Some(i) => &inner[..i],
            None => inner,
        },
        None => expr,
    };
    let b = expr.as_bytes();
    let mut names = Vec::new();
    let (mut i, mut braces, mut brackets) = (0, 0usize, 0usize);
    let mut grouping_parens: Option<usize> = None;
    let mut paren_depth = 0usize;
    let mut last_word = String::new();
    while i < b.len() {
        let c = b[i] as char;
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while i < b.len() && b[i] as char != c {
                    if b[i] == b'\\' {
                        i += 1;
                    }
                    i += 1;
                }
            }
            '{' => braces += 1,
            '}' => braces = braces.saturating_sub(1),
            '[' => brackets += 1,
            ']' => brackets = brackets.saturating_sub(1),
            '(' => {
                paren_depth += 1;
                if matches!(
                    last_word.as_str(),
                    "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                ) {
                    grouping_parens = Some(paren_depth);
                }
                last_word.clear();
            }
            ')' => {
                if grouping_parens == Some(paren_depth) {
                    grouping_parens = None;
                }
                paren_depth = paren_depth.saturating_sub(1);
            }
            '$' => {
                // A Grafana variable such as $__rate_interval: skip the name.
                i += 1;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                    i += 1;
                }
                continue;
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b':')
                {
                    i += 1;
                }
                let word = &expr[start..i];
                if braces > 0 && word == "__name__" {
                    // `{__name__=~"A|B"}`: the names the alternatives spell out.
                    let rest = expr[i..].trim_start();
                    let value = rest
                        .strip_prefix("=~")
                        .or_else(|| rest.strip_prefix('='))
                        .map(str::trim_start)
                        .and_then(|v| v.strip_prefix('"'))
                        .and_then(|v| v.split_once('"'))
                        .map(|(v, _)| v)
                        .unwrap_or_else(|| panic!("unsupported __name__ matcher in {expr}"));
                    names.extend(value.split('|').map(str::to_owned));
                }
                let next = expr[i..].trim_start().chars().next();
                let is_call = next == Some('(');
                if braces == 0
                    && brackets == 0
                    && grouping_parens.is_none()
                    && !is_call
                    && !KEYWORDS.contains(&word.to_ascii_lowercase().as_str())
                {
                    names.push(word.to_owned());
                }
                last_word = word.to_owned();
                continue;
            }
            c if c.is_ascii_digit() => {
                // A number (1e9, 0.95, 1000000): not a name.
                while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'.') {
                    i += 1;
                }
                continue;
            }
            _ => {}
        }
        if !c.is_whitespace() && c != '(' {
            last_word.clear();
        }
        i += 1;
    }
    names
}

fn top_level_comma(s: &str) -> Option<usize> {
    let mut depth = 0i32;
    let mut last = None;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '{' | '[' => depth += 1,
            ')' | '}' | ']' => depth -= 1,
            ',' if depth == 0 => last = Some(i),
            _ => {}
        }
    }
    last
}

#[test]
fn metric_name_extraction_handles_promql_shapes() {
    assert_eq!(
        metric_names(
            r#"max without (GPU_I_ID, pod) (rate(DCGM_FI_DEV_X{a="b", c=~"$x"}[$__rate_interval])) * 60 > 8 or on (UUID) group_left () up == 0"#
        ),
        ["DCGM_FI_DEV_X", "up"]
    );
    assert_eq!(
        metric_names(r#"label_values(DCGM_FI_DEV_FB_USED{hostname=~"$hostname"}, namespace)"#),
        ["DCGM_FI_DEV_FB_USED"]
    );
    assert_eq!(
        metric_names(r#"label_values({__name__=~"DCGM_A|DCGM_B", hostname=~"$hostname"}, pod)"#),
        ["DCGM_A", "DCGM_B"]
    );
    assert_eq!(
        metric_names("sum(A_B) / 3.6e9 + count(x) or vector(0)"),
        ["A_B", "x"]
    );
}

/// Dashboards: (file, parsed JSON).
fn dashboards() -> Vec<(PathBuf, Json)> {
    files("dashboards", "json")
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("read dashboard");
            let j: Json = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{}: not JSON: {e}", p.display()));
            (p, j)
        })
        .collect()
}

/// Every panel, rows' nested panels included.
fn panels(d: &Json) -> Vec<&Json> {
    let mut out = Vec::new();
    for p in d["panels"].as_array().expect("panels array") {
        out.push(p);
        if let Some(inner) = p["panels"].as_array() {
            out.extend(inner.iter());
        }
    }
    out
}

/// Every PromQL expression in a dashboard (panel targets and variable queries), with where.
fn dashboard_queries(d: &Json) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in panels(d) {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("panel {:?} has a target without expr", p["title"]));
            out.push((format!("panel {:?}", p["title"]), expr.to_owned()));
        }
    }
    for v in d["templating"]["list"].as_array().expect("templating.list") {
        if v["type"] == "query" {
            let q = v["query"]["query"]
                .as_str()
                .or_else(|| v["query"].as_str())
                .expect("variable query");
            out.push((format!("variable {:?}", v["name"]), q.to_owned()));
        }
    }
    out
}

/// The rule files in alerts/ (not their promtool tests): alert rules, then recording rules.
fn rule_files() -> Vec<(PathBuf, Yaml)> {
    files("alerts", "yml")
        .into_iter()
        .filter(|p| !p.to_string_lossy().ends_with(".test.yml"))
        .map(|p| {
            let y: Yaml = yaml_serde::from_str(&std::fs::read_to_string(&p).expect("read rules"))
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p, y)
        })
        .collect()
}

fn is_recording_file(p: &std::path::Path) -> bool {
    p.to_string_lossy().ends_with(".recording.yml")
}

fn alert_rules() -> Vec<(PathBuf, Yaml)> {
    rule_files()
        .into_iter()
        .filter(|(p, _)| !is_recording_file(p))
        .collect()
}

fn recording_rules() -> Vec<(PathBuf, Yaml)> {
    let v: Vec<_> = rule_files()
        .into_iter()
        .filter(|(p, _)| is_recording_file(p))
        .collect();
    assert!(!v.is_empty(), "no alerts/*.recording.yml");
    v
}

/// The series the recording rules write.
fn recorded_metrics() -> BTreeSet<String> {
    recording_rules()
        .iter()
        .flat_map(|(_, doc)| rules(doc).into_iter())
        .map(|r| r["record"].as_str().expect("record").to_owned())
        .collect()
}

fn rules(doc: &Yaml) -> Vec<&Yaml> {
    doc["groups"]
        .as_sequence()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules").iter())
        .collect()
}

#[test]
fn every_metric_used_by_dashboards_and_alerts_exists() {
    let mut known = known_metrics();
    known.extend(recorded_metrics());
    let mut unknown = BTreeMap::new();
    let mut used = BTreeSet::new();
    for (path, d) in dashboards() {
        for (at, expr) in dashboard_queries(&d) {
            for name in metric_names(&expr) {
                used.insert(name.clone());
                if !known.contains(&name) {
                    unknown.insert(format!("{}: {at}: {name}", path.display()), expr.clone());
                }
            }
        }
    }
    for (path, doc) in rule_files() {
        for r in rules(&doc) {
            let expr = r["expr"].as_str().expect("expr");
            let rule = r["alert"].as_str().or_else(|| r["record"].as_str());
            for name in metric_names(expr) {
                used.insert(name.clone());
                if !known.contains(&name) {
                    unknown.insert(
                        format!("{}: rule {rule:?}: {name}", path.display()),
                        expr.to_owned(),
                    );
                }
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "metrics the exporter does not serve: {unknown:#?}"
    );
    // The extraction found the metrics (a broken extractor would pass the check above vacuously).
    for must in [
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_EXP_GPU_HEALTH_STATUS",
        "gpu_exporter_gpus",
        "up",
    ] {
        assert!(used.contains(must), "{must} not found in any query");
    }
}

/// docs/metric-names.md's rename table: (classic name, newest name) of every renamed metric.
fn renamed_metrics() -> Vec<(String, String)> {
    let doc = read("docs/metric-names.md");
    let mut out = Vec::new();
    for line in doc.lines() {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // | `classic` | id | `newest` | id | unit | since |
        if cells.len() < 7 {
            continue;
        }
        let name = |c: &str| {
            c.strip_prefix('`')
                .and_then(|c| c.strip_suffix('`'))
                .filter(|n| n.starts_with("DCGM_FI_"))
                .map(str::to_owned)
        };
        if let (Some(classic), Some(newest)) = (name(cells[1]), name(cells[3])) {
            out.push((classic, newest));
        }
    }
    assert!(
        out.len() >= 20,
        "docs/metric-names.md: rename table not found ({} rows)",
        out.len()
    );
    out
}

/// Every PromQL expression the shipped artifacts run: (where, expr).
fn shipped_queries() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (path, d) in dashboards() {
        for (at, expr) in dashboard_queries(&d) {
            out.push((format!("{}: {at}", path.display()), expr));
        }
    }
    for (path, doc) in rule_files() {
        for r in rules(&doc) {
            let rule = r["alert"].as_str().or_else(|| r["record"].as_str());
            let expr = r["expr"].as_str().expect("expr").to_owned();
            out.push((format!("{}: rule {rule:?}", path.display()), expr));
        }
    }
    out
}

#[test]
fn panels_reading_profiling_fields_say_what_older_gpus_need() {
    // DCGM_FI_PROF_* series exist through NVML only on Hopper and newer (GPM); older GPUs need a
    // DCGM hostengine. A panel reading one (directly, or through the utilization recording rules,
    // which take MIG instances' graphics engine activity) says so, so that a blank panel on an
    // A100 node is explained where it is seen.
    let mut silent = Vec::new();
    let mut checked = 0;
    for (path, d) in dashboards() {
        for p in panels(&d) {
            let exprs: Vec<&str> = p["targets"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|t| t["expr"].as_str())
                .collect();
            let reads_prof = exprs.iter().any(|e| {
                metric_names(e)
                    .iter()
                    .any(|n| n.starts_with("DCGM_FI_PROF_"))
                    || e.contains("dcgm_gpu_utilization_percent")
                    || e.contains("dcgm_idle_allocated_gpus")
            });
            if !reads_prof {
                continue;
            }
            checked += 1;
            let desc = p["description"].as_str().unwrap_or_default();
            if !(desc.contains("Hopper") && desc.contains("nvidia-dcgm:5555")) {
                silent.push(format!("{}: panel {:?}", path.display(), p["title"]));
            }
        }
    }
    assert!(
        silent.is_empty(),
        "panels reading DCGM_FI_PROF_* without saying what GPUs before Hopper need: {silent:#?}"
    );
    assert!(
        checked >= 10,
        "only {checked} panels read profiling fields: is the check broken?"
    );
}

#[test]
fn dashboards_and_rules_read_both_naming_generations() {
    // A node may run dcgm-exporter 4.9+'s names (docs/metric-names.md): wherever a query reads a
    // renamed metric by its classic name it must also read the newest one (converted to the
    // classic unit: the e2e and the promtool tests check the values), and wherever it names the
    // driver-version label it must name both spellings.
    let renamed = renamed_metrics();
    let mut missing = Vec::new();
    let mut pairs_seen = 0;
    for (at, expr) in shipped_queries() {
        let names: BTreeSet<String> = metric_names(&expr).into_iter().collect();
        for (classic, newest) in &renamed {
            match (names.contains(classic), names.contains(newest)) {
                (true, false) => missing.push(format!("{at}: {classic} without {newest}")),
                (false, true) => missing.push(format!("{at}: {newest} without {classic}")),
                (true, true) => pairs_seen += 1,
                (false, false) => {}
            }
        }
        if expr.contains("DCGM_FI_DRIVER_VERSION") != expr.contains("DCGM_FI_SYSTEM_DRIVER_VERSION")
        {
            missing.push(format!(
                "{at}: names one driver-version label but not the other"
            ));
        }
    }
    for (path, d) in dashboards() {
        for p in panels(&d) {
            let hidden = p["transformations"].to_string();
            if hidden.contains("DCGM_FI_DRIVER_VERSION")
                != hidden.contains("DCGM_FI_SYSTEM_DRIVER_VERSION")
            {
                missing.push(format!(
                    "{}: panel {:?} hides one driver-version label column but not the other",
                    path.display(),
                    p["title"]
                ));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "one naming generation only: {missing:#?}"
    );
    assert!(
        pairs_seen >= 40,
        "only {pairs_seen} classic/newest pairs found: is the extraction broken?"
    );
}

#[test]
fn dashboards_are_portable_and_have_stable_unique_uids() {
    let mut uids = BTreeMap::new();
    for (path, d) in dashboards() {
        let name = path.display().to_string();
        let uid = d["uid"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: no uid"));
        assert!(
            uid.starts_with("gpu-exporter-") && uid.len() <= 40,
            "{name}: uid {uid:?} is not a stable gpu-exporter-* uid (Grafana limit 40)"
        );
        if let Some(other) = uids.insert(uid.to_owned(), name.clone()) {
            panic!("{name} and {other} share uid {uid}");
        }
        let schema = d["schemaVersion"].as_u64().expect("schemaVersion");
        assert!(
            schema >= MIN_SCHEMA_VERSION,
            "{name}: schemaVersion {schema} < {MIN_SCHEMA_VERSION}"
        );
        assert!(
            d["id"].is_null(),
            "{name}: a numeric id pins the dashboard to one Grafana"
        );
        let vars = d["templating"]["list"].as_array().expect("variables");
        let ds = vars
            .iter()
            .find(|v| v["name"] == "datasource")
            .unwrap_or_else(|| panic!("{name}: no datasource variable"));
        assert_eq!(ds["type"], "datasource", "{name}");
        assert_eq!(ds["query"], "prometheus", "{name}");
        let names: BTreeSet<&str> = vars.iter().filter_map(|v| v["name"].as_str()).collect();
        assert!(names.contains("hostname"), "{name}: no hostname variable");
        for v in vars.iter().filter(|v| v["type"] == "query") {
            assert_eq!(
                v["datasource"]["uid"], "${datasource}",
                "{name}: variable {:?}",
                v["name"]
            );
        }
        let mut ids = BTreeSet::new();
        for p in panels(&d) {
            let title = &p["title"];
            assert!(
                ids.insert(p["id"].as_u64().expect("panel id")),
                "{name}: duplicate panel id"
            );
            if p["type"] == "row" {
                continue;
            }
            assert_eq!(
                p["datasource"]["uid"], "${datasource}",
                "{name}: panel {title}"
            );
            let targets = p["targets"].as_array().expect("targets");
            assert!(!targets.is_empty(), "{name}: panel {title} has no query");
            for t in targets {
                assert_eq!(
                    t["datasource"]["uid"], "${datasource}",
                    "{name}: panel {title}"
                );
            }
        }
    }
    // The three dashboards the README promises, with the variables each needs.
    let by_uid: BTreeMap<String, Json> = dashboards()
        .into_iter()
        .map(|(_, d)| (d["uid"].as_str().unwrap().to_owned(), d))
        .collect();
    for (uid, needs) in [
        ("gpu-exporter-cluster", &["hostname"][..]),
        ("gpu-exporter-node", &["hostname", "gpu"][..]),
        (
            "gpu-exporter-workloads",
            &["hostname", "namespace", "pod"][..],
        ),
    ] {
        let d = by_uid
            .get(uid)
            .unwrap_or_else(|| panic!("no dashboard {uid}"));
        let vars: Vec<&str> = d["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v["name"].as_str())
            .collect();
        for n in needs {
            assert!(vars.contains(n), "{uid}: no ${n} variable");
            let used = dashboard_queries(d)
                .iter()
                .any(|(_, e)| e.contains(&format!("${n}")));
            assert!(used, "{uid}: ${n} is defined but no query uses it");
        }
    }
}

#[test]
fn dashboards_filter_by_cluster_and_fall_back_from_recorded_series() {
    let recorded = recorded_metrics();
    let mut uses_recorded = 0;
    for (path, d) in dashboards() {
        let name = path.display().to_string();
        let vars = d["templating"]["list"].as_array().expect("variables");
        let var = |n: &str| vars.iter().find(|v| v["name"] == n);
        // "All" must be the regex `.*`, which also matches series without a cluster label.
        let cluster = var("cluster").unwrap_or_else(|| panic!("{name}: no cluster variable"));
        assert_eq!(cluster["includeAll"], true, "{name}: cluster variable");
        assert_eq!(cluster["allValue"], ".*", "{name}: cluster variable");
        for v in vars
            .iter()
            .filter(|v| v["type"] == "query" && v["name"] != "cluster")
        {
            let q = v["query"]["query"].as_str().expect("variable query");
            if !q.contains('{') {
                continue; // reads no series (the per_node switch: a function of $hostname only)
            }
            assert!(
                q.contains(r#"cluster=~"$cluster""#),
                "{name}: variable {:?} ignores the cluster: {q}",
                v["name"]
            );
        }
        for p in panels(&d).into_iter().filter(|p| p["type"] != "row") {
            for t in p["targets"].as_array().expect("targets") {
                let expr = t["expr"].as_str().expect("expr");
                assert!(
                    expr.contains(r#"cluster=~"$cluster""#),
                    "{name}: panel {} ignores the cluster: {expr}",
                    p["title"]
                );
                let names = metric_names(expr);
                if !names.iter().any(|n| recorded.contains(n)) {
                    assert!(
                        !expr.contains("$raw"),
                        "{name}: panel {}: $raw without a recorded series",
                        p["title"]
                    );
                    continue;
                }
                uses_recorded += 1;
                // `<recorded> or <raw>`: the raw side reads DCGM series, guarded by $raw.
                assert!(
                    var("raw").is_some_and(|v| v["hide"] == 2),
                    "{name}: panel {} reads recorded series but the dashboard has no hidden $raw",
                    p["title"]
                );
                let (rec, raw) = expr
                    .split_once("\nor\n")
                    .unwrap_or_else(|| panic!("{name}: panel {}: no fallback: {expr}", p["title"]));
                assert!(
                    metric_names(rec).iter().all(|n| recorded.contains(n)),
                    "{name}: panel {}: the recorded side reads raw series: {rec}",
                    p["title"]
                );
                let raw_names = metric_names(raw);
                assert!(
                    raw_names.iter().any(|n| n.starts_with("DCGM_"))
                        && raw_names.iter().all(|n| !recorded.contains(n)),
                    "{name}: panel {}: the fallback does not read the raw series: {raw}",
                    p["title"]
                );
                for sel in raw.match_indices("DCGM_") {
                    if raw[..sel.0].ends_with('"') {
                        continue; // a label value (health_error_code!="DCGM_FR_OK"), not a metric
                    }
                    let tail = &raw[sel.0..];
                    let end = tail.find('}').unwrap_or(tail.len());
                    assert!(
                        tail[..end].contains(r#"gpu=~"$raw""#),
                        "{name}: panel {}: a raw selector without gpu=~\"$raw\" costs as much \
                         with the recording rules as without: {}",
                        p["title"],
                        &tail[..end]
                    );
                }
            }
        }
    }
    assert!(
        uses_recorded >= 10,
        "only {uses_recorded} queries read recorded series"
    );
}

#[test]
fn recording_rules_are_named_tested_and_used() {
    let tests = read("alerts/gpu-exporter.recording.test.yml");
    let dashboard_exprs: Vec<String> = dashboards()
        .iter()
        .flat_map(|(_, d)| dashboard_queries(d).into_iter().map(|(_, e)| e))
        .collect();
    for (path, doc) in alert_rules() {
        for r in rules(&doc) {
            assert!(
                r["alert"].is_string(),
                "{}: a recording rule among the alerts",
                path.display()
            );
        }
    }
    let mut seen: BTreeSet<String> = BTreeSet::new();
    for (path, doc) in recording_rules() {
        for r in rules(&doc) {
            let name = r["record"].as_str().unwrap_or_else(|| {
                panic!("{}: an alert among the recording rules", path.display())
            });
            let parts: Vec<&str> = name.split(':').collect();
            assert!(
                parts.len() == 3 && parts.iter().all(|p| !p.is_empty()),
                "{name}: not level:metric:operation"
            );
            let expr = r["expr"].as_str().expect("expr");
            if parts[0] == "hostname" || parts[0].starts_with("hostname_") {
                // Per-node series (and per node and namespace, per container) keep the cluster, so
                // one store can hold many clusters: they aggregate by the cluster and the labels
                // their level names, or combine other series of their level.
                let by = format!("by (cluster, {})", parts[0].replace('_', ", "));
                let level = format!("{}:", parts[0]);
                assert!(
                    expr.contains(&by) || metric_names(expr).iter().all(|n| n.starts_with(&level)),
                    "{name}: a {} rule must aggregate {by}: {expr}",
                    parts[0]
                );
            }
            if !seen.insert(name.to_owned()) {
                continue; // one name, several label sets (health, le)
            }
            assert!(
                tests.contains(&format!("expr: {name}")),
                "{name}: no promql_expr_test in alerts/gpu-exporter.recording.test.yml"
            );
            let used = dashboard_exprs
                .iter()
                .any(|e| metric_names(e).iter().any(|n| n == name))
                || rule_files().iter().any(|(_, doc)| {
                    rules(doc).iter().any(|o| {
                        o["expr"]
                            .as_str()
                            .is_some_and(|e| metric_names(e).iter().any(|n| n == name))
                    })
                });
            // Or recorded for users' own queries (the accounting levels: a bill is a query over a
            // month, not a panel), which docs/accounting.md must then name.
            let documented = read("docs/accounting.md").contains(name);
            assert!(
                used || documented,
                "{name}: recorded but read by no dashboard or rule, nor named in docs/accounting.md"
            );
        }
    }
    assert!(seen.len() >= 10, "{} recorded series", seen.len());
}

#[test]
fn alert_rules_carry_severity_and_runbook_annotations() {
    let mut names = BTreeSet::new();
    for (path, doc) in alert_rules() {
        for r in rules(&doc) {
            let alert = r["alert"]
                .as_str()
                .unwrap_or_else(|| panic!("{}: recording rule or unnamed", path.display()));
            assert!(names.insert(alert.to_owned()), "duplicate alert {alert}");
            let sev = r["labels"]["severity"].as_str().unwrap_or("");
            assert!(
                ["critical", "warning", "info"].contains(&sev),
                "{alert}: severity {sev:?}"
            );
            for key in ["summary", "description", "runbook"] {
                let text = r["annotations"][key].as_str().unwrap_or("");
                assert!(
                    text.len() > 20,
                    "{alert}: annotation {key} missing or too short"
                );
            }
        }
    }
    let tests = read("alerts/gpu-exporter.rules.test.yml");
    for alert in &names {
        // Firing and not-firing cases both name the alert (promtool checks what they assert).
        let cases = tests.matches(&format!("alertname: {alert}\n")).count();
        assert!(
            cases >= 2,
            "{alert}: {cases} promtool test case(s), want firing and not firing"
        );
    }
}

/// Every YAML document under deploy/.
fn manifests() -> Vec<(PathBuf, Yaml)> {
    let mut out = Vec::new();
    for p in files("deploy", "yaml") {
        let text = std::fs::read_to_string(&p).expect("read manifest");
        for doc in yaml_serde::Deserializer::from_str(&text) {
            let v = Yaml::deserialize(doc).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            if !v.is_null() {
                out.push((p.clone(), v));
            }
        }
    }
    out
}

/// The binary's defaults (flags unset; the test environment sets none of their variables).
fn default_args() -> Result<gpu_exporter::config::Args, clap::Error> {
    gpu_exporter::config::Args::try_parse_from(["gpu-exporter"])
}

fn kind<'a>(all: &'a [(PathBuf, Yaml)], k: &str) -> &'a Yaml {
    let found: Vec<&Yaml> = all
        .iter()
        .filter(|(_, v)| v["kind"] == k)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(found.len(), 1, "want exactly one {k} in deploy/");
    found[0]
}

#[test]
fn kustomization_lists_every_manifest() {
    let k: Yaml = yaml_serde::from_str(&read("deploy/kustomization.yaml")).expect("kustomization");
    let listed: BTreeSet<String> = k["resources"]
        .as_sequence()
        .expect("resources")
        .iter()
        .map(|r| r.as_str().expect("resource path").to_owned())
        .collect();
    let present: BTreeSet<String> = files("deploy", "yaml")
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .filter(|n| n != "kustomization.yaml")
        .collect();
    assert_eq!(
        listed, present,
        "deploy/kustomization.yaml resources vs files"
    );
}

#[test]
fn daemonset_matches_the_binary_and_the_deployment_rules() {
    let all = manifests();
    let ds = kind(&all, "DaemonSet");
    let sel = ds["spec"]["selector"]["matchLabels"]
        .as_mapping()
        .expect("matchLabels");
    assert_eq!(
        sel.len(),
        1,
        "selector must be only app.kubernetes.io/name: {sel:?}"
    );
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
        "gpu-exporter"
    );
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    assert!(
        pod["nodeSelector"]
            .as_mapping()
            .is_some_and(|m| !m.is_empty()),
        "GPU node selector"
    );
    assert!(
        pod["tolerations"]
            .as_sequence()
            .is_some_and(|t| !t.is_empty()),
        "tolerations"
    );
    let c = &pod["containers"][0];

    // Port: the binary's default --address is :9400.
    let default_addr = default_args().expect("default args").address;
    let port: u64 = default_addr.rsplit(':').next().unwrap().parse().unwrap();
    assert_eq!(c["ports"][0]["containerPort"].as_u64(), Some(port));
    assert_eq!(c["ports"][0]["name"], "metrics");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/ready");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/health");

    let env: BTreeMap<String, &Yaml> = c["env"]
        .as_sequence()
        .expect("env")
        .iter()
        .map(|e| (e["name"].as_str().unwrap().to_owned(), e))
        .collect();
    assert_eq!(
        env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    assert_eq!(
        env["DCGM_EXPORTER_LISTEN"]["value"].as_str(),
        Some(default_addr.as_str())
    );
    // Every variable is one the binary reads (a typo would be silently ignored), except the two
    // the NVIDIA container runtime reads; DRA attribution is on (it needs nothing more).
    let cmd = <gpu_exporter::config::Args as clap::CommandFactory>::command();
    let known: BTreeSet<String> = cmd
        .get_arguments()
        .filter_map(|a| a.get_env())
        .map(|e| e.to_string_lossy().into_owned())
        .chain([
            "NVIDIA_VISIBLE_DEVICES".into(),
            "NVIDIA_DRIVER_CAPABILITIES".into(),
        ])
        .collect();
    for name in env.keys() {
        assert!(
            known.contains(name),
            "the DaemonSet sets {name}, which nothing reads"
        );
    }
    assert_eq!(env["KUBERNETES_ENABLE_DRA"]["value"].as_str(), Some("true"));

    let sc = &c["securityContext"];
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["capabilities"]["drop"][0], "ALL");
    assert!(
        sc["capabilities"]["add"].is_null(),
        "no capability is added"
    );
    assert_ne!(sc["privileged"], true);

    // Small requests/limits: the exporter's footprint target is < 16 MiB RSS.
    assert_eq!(c["resources"]["requests"]["memory"], "32Mi");
    assert_eq!(c["resources"]["limits"]["memory"], "64Mi");

    // The kubelet socket directory, read-only, at the path the default flag expects.
    let socket_dir = default_args()
        .unwrap()
        .pod_resources_kubelet_socket
        .parent()
        .unwrap()
        .to_path_buf();
    let vol = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["hostPath"]["path"].as_str() == socket_dir.to_str())
        .expect("pod-resources hostPath volume");
    let mount = c["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["name"] == vol["name"])
        .expect("pod-resources mount");
    assert_eq!(
        mount["readOnly"], true,
        "the pod-resources hostPath must be read-only"
    );
    assert_eq!(mount["mountPath"].as_str(), socket_dir.to_str());
    for v in pod["volumes"].as_sequence().unwrap() {
        if !v["hostPath"].is_null() {
            assert_eq!(
                v["name"], vol["name"],
                "only the pod-resources hostPath is mounted"
            );
        }
    }

    // The metrics CSV comes from the generated ConfigMap, at the path --collectors names.
    let cfg_mount = c["volumeMounts"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "metrics-config")
        .expect("metrics-config mount");
    let args: Vec<&str> = c["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    let expected = format!(
        "--collectors={}/default-counters.csv",
        cfg_mount["mountPath"].as_str().unwrap()
    );
    assert!(
        args.contains(&expected.as_str()),
        "args {args:?} lack {expected}"
    );
    let k: Yaml = yaml_serde::from_str(&read("deploy/kustomization.yaml")).unwrap();
    let gen = &k["configMapGenerator"][0];
    let cm_name = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "metrics-config")
        .unwrap()["configMap"]["name"]
        .clone();
    assert_eq!(
        gen["name"], cm_name,
        "the volume names the generated ConfigMap"
    );
    assert_eq!(gen["files"][0], "default-counters.csv");
}

#[test]
fn configmap_csv_equals_the_shipped_metrics_csv() {
    assert_eq!(
        read("deploy/default-counters.csv"),
        read("metrics-config/default-counters.csv"),
        "deploy/default-counters.csv must be a copy of metrics-config/default-counters.csv \
         (cp metrics-config/default-counters.csv deploy/)"
    );
}

#[test]
fn service_and_servicemonitor_point_at_the_metrics_port() {
    let all = manifests();
    let svc = kind(&all, "Service");
    assert_eq!(
        svc["spec"]["selector"]["app.kubernetes.io/name"],
        "gpu-exporter"
    );
    assert_eq!(svc["spec"]["ports"][0]["port"].as_u64(), Some(9400));
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "metrics");
    let sm = kind(&all, "ServiceMonitor");
    assert_eq!(
        sm["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"],
        "gpu-exporter"
    );
    assert_eq!(
        sm["spec"]["endpoints"][0]["port"],
        svc["spec"]["ports"][0]["name"]
    );
    assert_eq!(sm["spec"]["endpoints"][0]["path"], "/metrics");
    assert_eq!(sm["spec"]["endpoints"][0]["honorLabels"], true);
    // The job label Prometheus Operator derives (the Service name) is the one the rules select.
    assert_eq!(svc["metadata"]["name"], "gpu-exporter");
    assert!(read("alerts/gpu-exporter.rules.yml").contains(r#"up{job="gpu-exporter"}"#));
    let sa = kind(&all, "ServiceAccount");
    assert_eq!(sa["automountServiceAccountToken"], false);
}

#[test]
fn prometheusrule_is_generated_from_the_alert_rules() {
    let all = manifests();
    let pr = kind(&all, "PrometheusRule");
    let groups_of = |name: &str| -> Vec<Yaml> {
        let (_, doc) = rule_files()
            .into_iter()
            .find(|(p, _)| p.ends_with(name))
            .unwrap_or_else(|| panic!("alerts/{name}"));
        doc["groups"].as_sequence().expect("groups").clone()
    };
    let mut want = groups_of("gpu-exporter.rules.yml");
    want.extend(groups_of("gpu-exporter.recording.yml"));
    assert!(
        pr["spec"]["groups"].as_sequence() == Some(&want),
        "deploy/prometheusrule.yaml is out of date: run scripts/gen-prometheusrule.sh"
    );
}

#[test]
fn process_usage_overlay_mounts_proc_and_the_runtime_socket_read_only_for_the_binary() {
    use clap::CommandFactory;
    let k: Yaml = yaml_serde::from_str(&read("overlays/process-usage/kustomization.yaml"))
        .expect("overlay kustomization");
    assert_eq!(k["bases"][0], "../../deploy");
    assert_eq!(k["patchesStrategicMerge"][0], "daemonset-patch.yaml");
    let patch: Yaml = yaml_serde::from_str(&read("overlays/process-usage/daemonset-patch.yaml"))
        .expect("overlay patch");
    let all = manifests();
    let ds = kind(&all, "DaemonSet");
    assert_eq!(patch["kind"], "DaemonSet");
    assert_eq!(patch["metadata"]["name"], ds["metadata"]["name"]);
    let pod = &patch["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    assert_eq!(
        c["name"],
        ds["spec"]["template"]["spec"]["containers"][0]["name"]
    );

    // Every variable is one of the binary's, and together they parse.
    let cmd = gpu_exporter::config::Args::command();
    let mut argv = vec!["gpu-exporter".to_owned()];
    for e in c["env"].as_sequence().expect("env") {
        let name = e["name"].as_str().unwrap();
        let value = e["value"].as_str().expect("plain values");
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_env().is_some_and(|v| v == name))
            .unwrap_or_else(|| panic!("{name} is not one of the binary's variables"));
        let long = arg.get_long().expect("long flag");
        if value == "true" {
            argv.push(format!("--{long}"));
        } else {
            argv.push(format!("--{long}={value}"));
        }
    }
    argv.push("-k".into()); // the base DaemonSet sets DCGM_EXPORTER_KUBERNETES
    let args = gpu_exporter::config::Args::try_parse_from(&argv)
        .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    assert!(args.kubernetes_process_usage && args.kubernetes_enable_pod_uid);
    let cfg = gpu_exporter::config::Config::resolve(args.clone()).expect("resolves");
    assert!(cfg.process_usage && cfg.cri);

    // Exactly two hostPaths, both mounted read-only where the flags point.
    let volumes = pod["volumes"].as_sequence().expect("volumes");
    assert_eq!(volumes.len(), 2);
    let mount_of = |vol: &str| -> String {
        let m = c["volumeMounts"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|m| m["name"] == vol)
            .unwrap_or_else(|| panic!("mount of {vol}"));
        assert_eq!(m["readOnly"], true, "{vol} must be read-only");
        m["mountPath"].as_str().unwrap().to_owned()
    };
    let host = |vol: &str| -> String {
        let v = volumes.iter().find(|v| v["name"] == vol).unwrap();
        assert_eq!(v["hostPath"]["type"], "Directory");
        v["hostPath"]["path"].as_str().unwrap().to_owned()
    };
    assert_eq!(host("host-proc"), "/proc");
    assert_eq!(PathBuf::from(mount_of("host-proc")), args.path_procfs);
    let socket = args
        .container_runtime_endpoint
        .strip_prefix("unix://")
        .expect("unix endpoint");
    let dir = PathBuf::from(socket).parent().unwrap().to_path_buf();
    assert_eq!(PathBuf::from(mount_of("container-runtime")), dir);
    assert_eq!(PathBuf::from(host("container-runtime")), dir);
}
