//! Tests of flag parsing and resolution.

use super::*;
use clap::Parser;

fn args(extra: &[&str]) -> Args {
    let mut v = vec!["gpu-exporter"];
    v.extend_from_slice(extra);
    Args::try_parse_from(v).unwrap()
}

fn go(extra: &[&str]) -> Args {
    let argv = std::iter::once("gpu-exporter")
        .chain(extra.iter().copied())
        .map(std::ffi::OsString::from);
    goflags::parse(argv, &|_| None).unwrap()
}

#[test]
fn container_labels_need_a_socket_outside_kubernetes_and_are_ignored_with_k() {
    // dcgm-exporter's startup error.
    let e = Config::resolve(go(&["--container-labels"])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "--container-labels requires --container-runtime-socket or DCGM_CONTAINER_RUNTIME_SOCKET"
    );
    // (By environment variable, the error names DCGM_EXPORTER_CONTAINER_LABELS: tests/flags.rs.)
    assert_eq!(e.arg(), Some("container_labels"));
    // With a socket: the runtime client and per-process reading run, and the copies are on.
    let c = Config::resolve(go(&[
        "--container-labels=true",
        "--container-runtime-socket=/run/containerd/containerd.sock",
    ]))
    .unwrap();
    assert!(c.container_labels && c.cri && c.process_usage);
    assert!(c.build_options().container_labels);
    assert_eq!(
        c.args.container_runtime_endpoint,
        "/run/containerd/containerd.sock"
    );
    assert!(
        c.notices.iter().all(|n| !n.contains("container-labels")),
        "{:?}",
        c.notices
    );
    // With -k: ignored, one notice, no socket needed, nothing turned on.
    let c = Config::resolve(go(&["-k", "--container-labels"])).unwrap();
    assert!(!c.container_labels && !c.cri && !c.process_usage);
    assert!(!c.build_options().container_labels);
    let said: Vec<&String> = c
        .notices
        .iter()
        .filter(|n| n.contains("--container-labels"))
        .collect();
    assert_eq!(said.len(), 1, "{:?}", c.notices);
    assert!(
        said[0].contains("ignored in Kubernetes mode"),
        "{}",
        said[0]
    );
    // Off: nothing.
    let c = Config::resolve(go(&["--container-labels=false"])).unwrap();
    assert!(!c.container_labels && !c.cri);
}

#[test]
fn an_empty_remote_hostengine_address_means_none_with_a_notice() {
    // `-r ""` (or DCGM_REMOTE_HOSTENGINE_INFO="") names no hostengine: DCGM refuses it with
    // DCGM_ST_BADPARAM, so retrying it would be a loop for ever. NVML alone, and one notice.
    for flag in [&["-r", ""][..], &["--remote-hostengine-info= "][..]] {
        let c = Config::resolve(go(flag)).unwrap();
        assert_eq!(c.args.remote_hostengine_info, None, "{flag:?}");
        let said: Vec<&String> = c
            .notices
            .iter()
            .filter(|n| n.contains("DCGM_REMOTE_HOSTENGINE_INFO is empty"))
            .collect();
        assert_eq!(said.len(), 1, "{flag:?}: {:?}", c.notices);
    }
    let c = Config::resolve(go(&["-r", "nvidia-dcgm:5555"])).unwrap();
    assert_eq!(
        c.args.remote_hostengine_info.as_deref(),
        Some("nvidia-dcgm:5555")
    );
    assert!(c.notices.iter().all(|n| !n.contains("is empty")));
}

#[test]
fn container_runtime_socket_maps_onto_the_endpoint() {
    let c = Config::resolve(go(&["--container-runtime-socket", "/run/crio/crio.sock"])).unwrap();
    assert_eq!(c.args.container_runtime_endpoint, "/run/crio/crio.sock");
    let e = Config::resolve(go(&[
        "--container-runtime-socket=/a.sock",
        "--container-runtime-endpoint=unix:///b.sock",
    ]))
    .unwrap_err();
    assert!(e.to_string().contains("name different sockets"), "{e}");
    let c = Config::resolve(go(&[
        "--container-runtime-socket=/a.sock",
        "--container-runtime-endpoint=unix:///a.sock",
    ]))
    .unwrap();
    assert_eq!(c.args.container_runtime_endpoint, "unix:///a.sock");
}

#[test]
fn no_hostname_drops_the_label_value_only() {
    let mut a = go(&["-n"]);
    a.node_name = Some("node-7".into());
    let c = Config::resolve(a).unwrap();
    assert_eq!(c.hostname, "node-7");
    assert_eq!(c.build_options().hostname, "");
    let mut a = go(&["--no-hostname=false"]);
    a.node_name = Some("node-7".into());
    assert_eq!(
        Config::resolve(a).unwrap().build_options().hostname,
        "node-7"
    );
}

#[test]
fn any_address_and_explicit_addresses() {
    use crate::http::listen::ListenOn;
    assert_eq!(
        Config::resolve(go(&[])).unwrap().listen_on,
        ListenOn::AnyAddress(9400)
    );
    assert_eq!(
        Config::resolve(go(&["-a", "0.0.0.0:9400"]))
            .unwrap()
            .listen_on,
        ListenOn::Address("0.0.0.0:9400".parse().unwrap())
    );
    assert_eq!(
        Config::resolve(go(&["-a", "[::1]:1"])).unwrap().listen_on,
        ListenOn::Address("[::1]:1".parse().unwrap())
    );
}

#[test]
fn zero_web_timeouts_keep_the_defaults_and_say_so() {
    let c = Config::resolve(go(&["--web-read-timeout=0", "--web-write-timeout=0s"])).unwrap();
    assert_eq!(c.args.web_read_timeout, None);
    assert_eq!(c.args.web_write_timeout, None);
    assert_eq!(c.notices.len(), 2, "{:?}", c.notices);
    let c = Config::resolve(go(&["--web-write-timeout=1m30s"])).unwrap();
    assert_eq!(c.args.web_write_timeout, Some(Duration::from_secs(90)));
}

#[test]
fn inert_flags_warn_once_each_whatever_their_value() {
    let c = Config::resolve(go(&[
        "--enable-pprof=false",
        "-p",
        "g",
        "--dump-retention=1",
    ]))
    .unwrap();
    assert_eq!(c.notices.len(), 3, "{:?}", c.notices);
    assert!(
        c.notices[0].starts_with("-p/--cpu-devices (DCGM_EXPORTER_CPU_DEVICES_STR) has no effect")
    );
    assert!(Config::resolve(go(&[])).unwrap().notices.is_empty());
}

#[test]
fn dcgm_notices_do_not_say_there_is_no_dcgm() {
    // Issue 35 item 13: the exporter has a DCGM source (-r) with field watches; the notices of
    // the flags and config-file keys it ignores said there was no DCGM library or watch.
    let c = Config::resolve(go(&[
        "-p",
        "g",
        "--fake-gpus",
        "--watch-max-keep-age=10m",
        "--watch-max-keep-samples=5",
        "--enable-dcgm-log",
        "--disable-startup-validate",
    ]))
    .unwrap();
    // --enable-dcgm-log sets the embedded hostengine's log (no -r here): no notice.
    assert_eq!(c.notices.len(), 5, "{:?}", c.notices);
    assert!(!c.notices.iter().any(|n| n.contains("--enable-dcgm-log")));
    let file = super::file::parse(
        "version: 2\nsources:\n  dcgm:\n    watch:\n      maxKeepAge: 10m\n",
        "c.yaml",
    )
    .unwrap();
    assert_eq!(file.notices.len(), 1, "{:?}", file.notices);
    for n in c.notices.iter().chain(&file.notices) {
        let l = n.to_lowercase();
        for false_claim in [
            "no dcgm library",
            "no libdcgm",
            "no dcgm field watches",
            "no dcgm watches",
            "there is no dcgm",
            "come from dcgm",
            "no dcgm fake gpus",
        ] {
            assert!(!l.contains(false_claim), "{n}");
        }
    }
    let watch = c
        .notices
        .iter()
        .find(|n| n.contains("--watch-max-keep-age"));
    assert!(watch.is_some_and(|n| n.contains("-r")), "{:?}", c.notices);
    assert!(
        file.notices[0].contains("keep the last 2 samples"),
        "{:?}",
        file.notices
    );
}

#[test]
fn log_colour_needs_a_terminal_and_no_no_color() {
    use std::ffi::OsStr;
    assert!(log_colour(true, None));
    assert!(log_colour(true, Some(OsStr::new(""))));
    assert!(!log_colour(true, Some(OsStr::new("1"))));
    assert!(!log_colour(false, None));
    assert!(!log_colour(false, Some(OsStr::new(""))));
}

#[test]
fn addresses_parse_as_go_does() {
    assert_eq!(
        parse_address(":9400").unwrap(),
        "0.0.0.0:9400".parse().unwrap()
    );
    assert_eq!(
        parse_address("127.0.0.1:0").unwrap(),
        "127.0.0.1:0".parse().unwrap()
    );
    assert_eq!(
        parse_address("[::]:9400").unwrap(),
        "[::]:9400".parse().unwrap()
    );
    assert_eq!(
        parse_address("localhost:1").unwrap(),
        "127.0.0.1:1".parse().unwrap()
    );
    assert_eq!(
        parse_address("9400").unwrap_err().to_string(),
        "--address \"9400\": expected :PORT, HOST:PORT or [IPv6]:PORT"
    );
    for bad in [
        "::1:9400",
        "[::1:9400",
        "[::1]]:1",
        "x[:1",
        ":",
        "127.0.0.1:x",
    ] {
        assert!(
            matches!(parse_address(bad), Err(ConfigError::Address(_))),
            "{bad}"
        );
    }
}

#[test]
fn addresses_take_names_zones_and_say_when_a_port_is_too_large() {
    // A name is resolved, as Go's net.Listen resolves it (the first IPv4 address); name
    // lookups in the hosts file ignore case, so this is not the literal "localhost".
    assert_eq!(
        parse_address("LOCALHOST:1").unwrap(),
        "127.0.0.1:1".parse().unwrap()
    );
    // An IPv6 zone, by interface name or index.
    let lo = parse_address("[fe80::1%lo]:9400").unwrap();
    let std::net::SocketAddr::V6(v6) = lo else {
        panic!("{lo}")
    };
    assert_eq!(v6.ip(), &"fe80::1".parse::<std::net::Ipv6Addr>().unwrap());
    assert_eq!(v6.port(), 9400);
    assert!(v6.scope_id() > 0, "{v6:?}");
    let by_index = parse_address(&format!("[fe80::1%{}]:9400", v6.scope_id())).unwrap();
    assert_eq!(by_index, lo);
    let e = parse_address("[fe80::1%nosuchif0]:9400")
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("--address \"[fe80::1%nosuchif0]:9400\": IPv6 zone \"nosuchif0\": no such network interface"),
        "{e}"
    );
    // Overflowing numbers say so.
    for (s, says) in [
        (":99999", "port 99999 is too large (at most 65535)"),
        ("127.0.0.1:65536", "port 65536 is too large (at most 65535)"),
        (
            ":99999999999999999999999",
            "port 99999999999999999999999 is too large (at most 65535)",
        ),
        (
            "[fe80::1%99999999999]:1",
            "IPv6 zone 99999999999 is too large (at most 4294967295)",
        ),
    ] {
        let e = parse_address(s).unwrap_err().to_string();
        assert_eq!(e, format!("--address {s:?}: {says}"));
    }
    let e = parse_devices("g:0,99999999999").unwrap_err().to_string();
    assert!(
        e.ends_with("\"99999999999\" is too large for a device id (at most 4294967295)"),
        "{e}"
    );
    // The flag through Config::resolve, with the name resolved.
    let c = Config::resolve(go(&["--backend", "sim", "--a=LOCALHOST:0"])).unwrap();
    assert_eq!(
        c.listen_on,
        crate::http::listen::ListenOn::Address("127.0.0.1:0".parse().unwrap())
    );
}

#[test]
fn device_selections_parse() {
    assert_eq!(parse_devices("f").unwrap(), DeviceSelection::Flex);
    assert_eq!(parse_devices("g").unwrap(), DeviceSelection::Gpus(None));
    assert_eq!(
        parse_devices("g:0,2-4").unwrap(),
        DeviceSelection::Gpus(Some(vec![0, 2, 3, 4]))
    );
    assert_eq!(
        parse_devices("i:3").unwrap(),
        DeviceSelection::Instances(Some(vec![3]))
    );
    assert!(parse_devices("x")
        .unwrap_err()
        .to_string()
        .contains("unknown device type"));
    assert!(parse_devices("g:4-2")
        .unwrap_err()
        .to_string()
        .contains("backwards"));
    assert!(parse_devices("g:a")
        .unwrap_err()
        .to_string()
        .contains("not a device id"));
    assert!(parse_devices("f:1").is_err());
}

#[test]
fn defaults_match_dcgm_exporter() {
    let a = args(&[]);
    assert_eq!(a.address, ":9400");
    assert_eq!(a.collect_interval, 30000);
    assert_eq!(a.devices, "f");
    assert_eq!(a.kubernetes_gpu_id_type, GpuIdType::Uid);
    assert_eq!(a.backend, Backend::Nvml);
    assert_eq!(a.hostname_label, "hostname");
    assert_eq!(a.switch_devices, "f");
    assert!(!a.use_old_namespace);
}

#[test]
fn old_namespace_and_switch_devices_flags() {
    assert!(args(&["-o"]).use_old_namespace);
    assert!(args(&["--use-old-namespace"]).use_old_namespace);
    let c = Config::resolve(args(&["-s", "g:0,1"])).unwrap();
    assert_eq!(c.notices.len(), 1);
    assert!(c.notices[0].contains("NSCQ"), "{}", c.notices[0]);
    assert!(Config::resolve(args(&["-s", "f"]))
        .unwrap()
        .notices
        .is_empty());
    let e = Config::resolve(args(&["-s", "x:1"])).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("--switch-devices \"x:1\": unknown device type"),
        "{e}"
    );
}

#[test]
fn builtin_csv_is_used_without_collectors_and_node_name_wins() {
    let mut a = args(&["--backend", "sim"]);
    a.node_name = Some("node-7".into());
    let c = Config::resolve(a).unwrap();
    if !std::path::Path::new(DCGM_DEFAULT_COLLECTORS).exists() {
        assert_eq!(c.catalog_origin, "built-in default-counters.csv");
    }
    assert!(!c.catalog.metrics.is_empty());
    assert_eq!(c.hostname, "node-7");
}

#[test]
fn configmap_data_is_namespace_colon_name_and_inert_flags_are_noticed() {
    let c = Config::resolve(args(&["-m", "default:metrics"])).unwrap();
    let cm = c.configmap.expect("a ConfigMap");
    assert_eq!(
        (cm.namespace.as_str(), cm.name.as_str()),
        ("default", "metrics")
    );
    assert_eq!(
        Config::resolve(args(&["-m", "none"])).unwrap().configmap,
        None
    );
    assert_eq!(Config::resolve(args(&[])).unwrap().configmap, None);
    let e = Config::resolve(args(&["-m", "default/metrics"])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "--configmap-data / -m \"default/metrics\": expected NAMESPACE:NAME (one colon)"
    );
    let c = Config::resolve(args(&["--backend", "sim", "-r", "localhost:5555"])).unwrap();
    assert_eq!(c.notices.len(), 1);
}

#[test]
fn pod_metadata_comes_from_the_api_server_when_no_runtime_socket_is_there() {
    use crate::config::PodMetadataSource::{Api, Cri};
    let c = Config::resolve(args(&["-k", "--kubernetes-enable-pod-labels"])).unwrap();
    assert_eq!(c.pod_metadata(true), Some(Cri));
    assert_eq!(c.pod_metadata(false), Some(Api));
    let c = Config::resolve(args(&[
        "-k",
        "--kubernetes-enable-pod-uid",
        "--pod-metadata-source",
        "cri",
    ]))
    .unwrap();
    assert_eq!(c.pod_metadata(false), Some(Cri));
    let c = Config::resolve(args(&[
        "-k",
        "--kubernetes-enable-pod-uid",
        "--pod-metadata-source",
        "api",
    ]))
    .unwrap();
    assert_eq!(c.pod_metadata(true), Some(Api));
    // Per-process usage needs the runtime's container ids: the API cannot give them.
    let c = Config::resolve(args(&[
        "-k",
        "--kubernetes-process-usage",
        "--kubernetes-enable-pod-uid",
    ]))
    .unwrap();
    assert_eq!(c.pod_metadata(false), Some(Cri));
    // Nothing asked for, or not in Kubernetes mode: neither.
    assert_eq!(
        Config::resolve(args(&["-k"])).unwrap().pod_metadata(false),
        None
    );
    let c = Config::resolve(args(&["--kubernetes-enable-pod-labels"])).unwrap();
    assert_eq!(c.pod_metadata(false), None);
    let c = Config::resolve(args(&[
        "-k",
        "--container-runtime-endpoint",
        "unix:///run/k3s/containerd/containerd.sock",
    ]))
    .unwrap();
    assert_eq!(
        c.runtime_socket_path(),
        PathBuf::from("/run/k3s/containerd/containerd.sock")
    );
}

#[test]
fn dra_and_hpc_flags_use_dcgm_exporters_names() {
    let a = args(&[]);
    assert!(!a.kubernetes_enable_dra);
    assert_eq!(a.hpc_job_mapping_dir, None);
    let a = args(&[
        "--kubernetes-enable-dra",
        "--hpc-job-mapping-dir",
        "/run/hpc-jobs",
    ]);
    assert!(a.kubernetes_enable_dra);
    assert_eq!(a.hpc_job_mapping_dir, Some(PathBuf::from("/run/hpc-jobs")));
    // DRA without -k is accepted but noticed; with -k it is not.
    let c = Config::resolve(args(&["--kubernetes-enable-dra"])).unwrap();
    assert_eq!(c.notices.len(), 1);
    assert!(c.notices[0].starts_with("--kubernetes-enable-dra has no effect"));
    let c = Config::resolve(args(&["-k", "--kubernetes-enable-dra"])).unwrap();
    assert!(c.notices.is_empty());
}

#[test]
fn pod_resources_flags_default_and_validate() {
    let a = args(&[]);
    assert_eq!(
        (
            a.pod_resources_refresh,
            a.pod_resources_ttl,
            a.pod_resources_timeout
        ),
        (10_000, 30_000, 5_000)
    );
    let e = Config::resolve(args(&["--pod-resources-ttl", "5000"])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "--pod-resources-ttl 5000: must be at least --pod-resources-refresh (10000 ms)"
    );
    assert!(Config::resolve(args(&[
        "--pod-resources-refresh",
        "1000",
        "--pod-resources-ttl",
        "1000"
    ]))
    .is_ok());
}

#[test]
fn attribution_flags_use_dcgm_exporters_names_and_need_kubernetes_mode() {
    let c = Config::resolve(args(&[
        "-k",
        "--kubernetes-enable-pod-labels",
        "--kubernetes-pod-label-allowlist-regex",
        "^app$,team",
    ]))
    .unwrap();
    assert_eq!(c.label_allowlist.len(), 2);
    assert!(c.cri && !c.process_usage);
    assert!(c.notices.is_empty(), "{:?}", c.notices);
    assert_eq!(c.args.path_procfs, PathBuf::from("/proc"));
    assert_eq!(
        c.args.container_runtime_endpoint,
        "unix:///run/containerd/containerd.sock"
    );

    // Virtual GPUs imply per-process usage, which needs the runtime.
    let c = Config::resolve(args(&["-k", "--kubernetes-virtual-gpus"])).unwrap();
    assert!(c.process_usage && c.cri);
    // Holders only: no runtime client.
    let c = Config::resolve(args(&["-k"])).unwrap();
    assert!(!c.process_usage && !c.cri);
    // Without -k they do nothing, and say so.
    let c = Config::resolve(args(&[
        "--kubernetes-enable-pod-uid",
        "--kubernetes-process-usage",
    ]))
    .unwrap();
    assert!(!c.cri && !c.process_usage);
    assert_eq!(c.notices.len(), 2, "{:?}", c.notices);
    let c = Config::resolve(args(&["-k", "--kubernetes-pod-label-allowlist-regex", "x"])).unwrap();
    assert!(c.notices[0].contains("--kubernetes-enable-pod-labels"));

    let e = Config::resolve(args(&[
        "-k",
        "--kubernetes-enable-pod-labels",
        "--kubernetes-pod-label-allowlist-regex",
        "ok,(unclosed",
    ]))
    .unwrap_err();
    assert_eq!(
        e.to_string(),
        "--kubernetes-pod-label-allowlist-regex \"(unclosed\": not a valid regex"
    );
    let e = Config::resolve(args(&["--cri-refresh", "40000"])).unwrap_err();
    assert_eq!(
        e.to_string(),
        "--cri-ttl 30000: must be at least --cri-refresh (40000 ms)"
    );
}

#[test]
fn bad_csv_error_names_the_flag_and_file_line() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.csv");
    std::fs::write(
        &p,
        "DCGM_FI_DEV_GPU_UTIL, gauge, ok\nDCGM_FI_NOPE, gauge, x\n",
    )
    .unwrap();
    let e = Config::resolve(args(&["-f", p.to_str().unwrap()])).unwrap_err();
    let chain = format!("{e}: {}", std::error::Error::source(&e).unwrap());
    assert!(
        chain.contains("bad.csv:2: unknown field \"DCGM_FI_NOPE\""),
        "{chain}"
    );
}

#[test]
fn dcgm_log_flags_have_a_notice_only_where_they_do_nothing() {
    let with_r = Config::resolve(go(&["--enable-dcgm-log", "-r", "nvidia-dcgm:5555"])).unwrap();
    assert!(
        with_r
            .notices
            .iter()
            .any(|n| n.contains("--enable-dcgm-log") && n.contains("-r")),
        "{:?}",
        with_r.notices
    );
    let bad = Config::resolve(go(&["--enable-dcgm-log", "--dcgm-log-level", "warn"])).unwrap();
    assert!(
        bad.notices
            .iter()
            .any(|n| n.contains("\"warn\"") && n.contains("NONE, FATAL")),
        "{:?}",
        bad.notices
    );
    let good = Config::resolve(go(&["--enable-dcgm-log", "--dcgm-log-level", "VERB"])).unwrap();
    assert!(good.notices.is_empty(), "{:?}", good.notices);
}
