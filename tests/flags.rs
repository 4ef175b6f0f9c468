//! dcgm-exporter's flags and environment variables, in Go's syntax, against the real binary
//! over real HTTP on loopback: every upstream flag and env form starts and serves; errors name
//! the flag, the environment variable or the file and key; `:PORT` answers on 127.0.0.1 and
//! [::1]; the probes work the kubelet's way with TLS, basic auth and mTLS on; systemd socket
//! activation serves on an inherited socket.

mod common;

use std::path::{Path, PathBuf};

use common::binary::{self, command, get, kubelet_https_get, run_to_exit, Exporter};

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// Series lines (no comments) named `metric`.
fn lines<'a>(body: &'a str, metric: &str) -> Vec<&'a str> {
    common::series(body, metric)
}

/// The dcgm-exporter flags that mean nothing here: each must log exactly one warning.
const INERT: [&str; 13] = [
    "--cpu-devices",
    "--fake-gpus",
    "--dump-enabled",
    "--dump-directory",
    "--dump-retention",
    "--dump-compression",
    "--watch-max-keep-age",
    "--watch-max-keep-samples",
    "--enable-gpu-bind-unbind-watch",
    "--gpu-bind-unbind-poll-interval",
    "--enable-pprof",
    "--disable-startup-validate",
    "--remote-hostengine-info",
];

#[test]
fn every_upstream_flag_in_go_syntax_starts_and_serves() {
    let dir = tempfile::tempdir().unwrap();
    let hpc = dir.path().join("hpc");
    std::fs::create_dir(&hpc).unwrap();
    let mut cmd = command();
    cmd.args(["-a", "127.0.0.1:0"])
        // Bools in every Go form.
        .args([
            "-n",
            "--kubernetes=false",
            "-k=false",
            "--use-old-namespace=false",
        ])
        .args(["-o=false", "--kubernetes-enable-pod-labels=false"])
        .args([
            "--kubernetes-enable-pod-uid=false",
            "--kubernetes-virtual-gpus=false",
        ])
        .args([
            "--kubernetes-enable-dra=false",
            "--replace-blanks-in-model-name=false",
        ])
        .args([
            "-rbmn=false",
            "--debug=false",
            "--enable-exporter-metrics=true",
        ])
        .args(["--health-require-gpus", "--web-systemd-socket=false"])
        // Implemented values.
        .args(["--web-read-timeout=10s", "--web-write-timeout", "1m30s"])
        .args([
            "--max-concurrent-scrapes=4",
            "-d",
            "f",
            "-s",
            "f",
            "-x",
            "300000",
        ])
        .args([
            "--clock-events-count-window-size=300000",
            "--kubernetes-gpu-id-type=uid",
        ])
        .args([
            "--container-runtime-socket",
            "/run/containerd/containerd.sock",
        ])
        .args(["--pod-resources-kubelet-socket=/var/lib/kubelet/pod-resources/kubelet.sock"])
        .args(["--nvidia-resource-names=nvidia.com/a100", "-m", "none"])
        .arg(format!("--hpc-job-mapping-dir={}", hpc.display()))
        // DCGM-only: accepted, one warning each.
        .args(["-p", "f", "--fake-gpus", "--dump-enabled=false"])
        .args([
            "--dump-directory=/tmp/dcgm-exporter-debug",
            "--dump-retention",
            "48",
        ])
        .args(["--dump-compression=true", "--watch-max-keep-age=10m"])
        .args([
            "--watch-max-keep-samples=0",
            "--enable-gpu-bind-unbind-watch=false",
        ])
        .args(["--gpu-bind-unbind-poll-interval=1s", "--enable-pprof=false"])
        .args([
            "--container-labels",
            "--disable-startup-validate",
            "-r",
            "localhost:5555",
        ])
        .args(["--enable-dcgm-log=false", "--dcgm-log-level=NONE"]);
    let mut e = Exporter::start(cmd);
    e.wait_ready();
    let (status, body) = get(e.loopback(), "/metrics");
    assert_eq!(status, 200);
    let temps = lines(&body, "DCGM_FI_DEV_GPU_TEMP");
    assert_eq!(temps.len(), 8, "{body}");
    assert!(
        temps.iter().all(|l| !l.contains("hostname=")),
        "-n: {temps:?}"
    );
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        assert_eq!(lines(&body, name).len(), 1, "{name} in {body}");
    }
    assert_eq!(get(e.loopback(), "/health").0, 200);
    for flag in INERT {
        assert_eq!(e.warnings_about(flag), 1, "{flag}: {}", e.log());
    }
    assert_eq!(e.warnings_about("--enable-dcgm-log"), 1, "{}", e.log());
    // --container-labels (with --container-runtime-socket, without -k) is implemented: no
    // "has no effect" warning.
    assert!(
        !e.log().contains("--container-labels has no effect"),
        "{}",
        e.log()
    );
}

#[test]
fn bool_env_values_are_go_parse_bool_and_empty_env_is_unset() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = command();
    cmd.args(["-a", "127.0.0.1:0"])
        .env("DCGM_EXPORTER_KUBERNETES", "1")
        .env(
            "DCGM_POD_RESOURCES_KUBELET_SOCKET",
            dir.path().join("absent.sock"),
        )
        .env("DCGM_EXPORTER_NO_HOSTNAME", "True")
        .env("DCGM_EXPORTER_ENABLE_EXPORTER_METRICS", "t")
        .env("DCGM_EXPORTER_USE_OLD_NAMESPACE", "FALSE")
        // Empty: unset (each would be an error as a value).
        .env("DCGM_EXPORTER_XID_COUNT_WINDOW_SIZE", "")
        .env("DCGM_EXPORTER_USE_FAKE_GPUS", "")
        .env("DCGM_EXPORTER_DEVICES_STR", "")
        .env("DCGM_EXPORTER_COLLECTORS", "")
        .env("DCGM_EXPORTER_WEB_READ_TIMEOUT", "")
        .env("DCGM_EXPORTER_CONFIG_FILE", "");
    let mut e = Exporter::start(cmd);
    e.wait_ready();
    assert!(
        e.log()
            .contains("pod attribution from the kubelet pod-resources API"),
        "DCGM_EXPORTER_KUBERNETES=1 must turn -k on: {}",
        e.log()
    );
    let body = get(e.loopback(), "/metrics").1;
    let temps = lines(&body, "DCGM_FI_DEV_GPU_TEMP");
    assert_eq!(temps.len(), 8, "{body}");
    assert!(temps.iter().all(|l| !l.contains("hostname=")), "{temps:?}");
    assert!(temps.iter().all(|l| l.contains("UUID=")), "{temps:?}");
    assert_eq!(lines(&body, "process_open_fds").len(), 1, "{body}");
    assert_eq!(e.warnings_about("--fake-gpus"), 0, "{}", e.log());
}

#[test]
fn errors_name_the_env_var_the_flag_or_the_file_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let fails = |setup: &dyn Fn(&mut std::process::Command), expect: &[&str]| {
        let mut cmd = command();
        cmd.args(["-a", "127.0.0.1:0"]);
        setup(&mut cmd);
        let (status, stderr) = run_to_exit(cmd);
        assert!(!status.success(), "started: {stderr}");
        for e in expect {
            assert!(stderr.contains(e), "expected {e:?} in {stderr}");
        }
    };
    fails(
        &|c| {
            c.env("DCGM_EXPORTER_KUBERNETES", "yes");
        },
        &["DCGM_EXPORTER_KUBERNETES=\"yes\"", "is not a boolean"],
    );
    fails(
        &|c| {
            c.env("DCGM_EXPORTER_WEB_WRITE_TIMEOUT", "30");
        },
        &["DCGM_EXPORTER_WEB_WRITE_TIMEOUT=\"30\"", "has no unit"],
    );
    fails(
        &|c| {
            c.env("DCGM_EXPORTER_INTERVAL", "fast");
        },
        &["DCGM_EXPORTER_INTERVAL=\"fast\""],
    );
    fails(
        &|c| {
            c.arg("--kubernetes=yes");
        },
        &["--kubernetes", "is not a boolean"],
    );
    fails(
        &|c| {
            c.arg("--web-read-timeout=1d");
        },
        &["--web-read-timeout", "unknown unit"],
    );
    fails(
        &|c| {
            c.args(["-m", "gpu-operator/metrics"]);
        },
        &["--configmap-data / -m \"gpu-operator/metrics\": expected NAMESPACE:NAME"],
    );
    // Values that parse but do not resolve name their variable too.
    fails(
        &|c| {
            c.env("DCGM_EXPORTER_CONFIGMAP_DATA", "gpu-operator");
        },
        &[
            "environment variable DCGM_EXPORTER_CONFIGMAP_DATA: --configmap-data / -m \"gpu-operator\":",
            "expected NAMESPACE:NAME",
        ],
    );
    fails(
        &|c| {
            c.env("DCGM_EXPORTER_DEVICES_STR", "x:1");
        },
        &["environment variable DCGM_EXPORTER_DEVICES_STR: --devices \"x:1\": unknown device type"],
    );
    // dcgm-exporter's --container-labels outside Kubernetes mode needs a runtime socket.
    fails(
        &|c| {
            c.arg("--container-labels");
        },
        &["--container-labels requires --container-runtime-socket or DCGM_CONTAINER_RUNTIME_SOCKET"],
    );
    fails(
        &|c| {
            c.env("DCGM_EXPORTER_CONTAINER_LABELS", "True");
        },
        &["environment variable DCGM_EXPORTER_CONTAINER_LABELS: --container-labels requires --container-runtime-socket"],
    );
    fails(
        &|c| {
            c.env("GPU_EXPORTER_POD_RESOURCES_TTL", "1000");
        },
        &["environment variable GPU_EXPORTER_POD_RESOURCES_TTL: --pod-resources-ttl 1000"],
    );
    let bad = write(
        dir.path(),
        "bad.yaml",
        "version: 2\ncollections:\n  - name: scrape\n    every: 30\n    metrics: {include: [\"*\"]}\n",
    );
    fails(
        &|c| {
            c.arg("--config-file").arg(&bad);
        },
        &[
            "--config-file",
            "bad.yaml: collections[0].every:",
            "has no unit",
        ],
    );
    let unknown = write(
        dir.path(),
        "unknown.yaml",
        "version: 1\nmetrics:\n  flie: x.csv\n",
    );
    fails(
        &|c| {
            c.env("DCGM_EXPORTER_CONFIG_FILE", &unknown);
        },
        &[
            "environment variable DCGM_EXPORTER_CONFIG_FILE: --config-file:",
            "unknown.yaml: metrics: unknown field `flie`",
            "line 3",
        ],
    );
    let fields = write(
        dir.path(),
        "fields.yaml",
        "version: 2\nmetrics:\n  fields:\n    - {name: DCGM_FI_DEV_GPU_TEMP, prometheusType: gauge, help: t}\n    - {name: DCGM_FI_NOPE, prometheusType: gauge, help: x}\n",
    );
    fails(
        &|c| {
            c.arg(format!("--config-file={}", fields.display()));
        },
        &["fields.yaml: metrics.fields[1]:", "DCGM_FI_NOPE"],
    );
    fails(
        &|c| {
            c.arg("--web-systemd-socket");
        },
        &["--web-systemd-socket: LISTEN_PID is not set"],
    );
    // A FIFO as the config file: refused at once (startup used to wait for a writer for ever).
    let fifo = dir.path().join("fifo.yaml");
    rustix::fs::mknodat(
        rustix::fs::CWD,
        &fifo,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .unwrap();
    fails(
        &|c| {
            c.arg("--config-file").arg(&fifo);
        },
        &[&format!(
            "--config-file: config file {}: is a FIFO (named pipe), not a regular file; refused",
            fifo.display()
        )],
    );
    // Numbers past their range say so.
    fails(
        &|c| {
            c.arg("--a=:99999");
        },
        &["--address \":99999\": port 99999 is too large (at most 65535)"],
    );
}

#[test]
fn go_flag_forms_start_and_serve() {
    // Short flags with two dashes, empty file flags (no file, as Go's ""), a host name.
    let mut cmd = command();
    cmd.args(["--c=1000", "--a", "LOCALHOST:0", "--config-file="])
        .args(["--web-config-file", ""]);
    let mut e = Exporter::start(cmd);
    assert_eq!(e.addr.ip(), std::net::Ipv4Addr::LOCALHOST, "{}", e.log());
    e.wait_ready();
    let (status, body) = get(e.addr, "/metrics");
    assert_eq!(status, 200);
    assert_eq!(lines(&body, "DCGM_FI_DEV_GPU_TEMP").len(), 8);
}

#[test]
fn the_config_file_applies_unless_a_flag_or_env_var_says_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let csv = write(
        dir.path(),
        "two.csv",
        "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_POWER_USAGE, gauge, p\n",
    );
    let config = write(
        dir.path(),
        "config.yaml",
        &format!(
            "version: 2\nmetrics:\n  file: {}\n  enableExporterMetrics: true\ncollections:\n  - name: scrape\n    every: 2s\n    metrics:\n      include: [\"*\"]\n  - name: fast\n    every: 500ms\n    metrics:\n      include: [DCGM_FI_DEV_GPU_TEMP]\nsources:\n  dcgm:\n    watch: {{maxKeepAge: 10m, maxKeepSamples: 0}}\nserver:\n  maxConcurrentScrapes: 8\n",
            csv.display()
        ),
    );
    // The file alone: its CSV, its exporter-metrics switch, its interval (-c is not given).
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_gpu-exporter"));
    cmd.env_clear()
        .args([
            "--backend",
            "sim",
            "--log-format",
            "json",
            "-a",
            "127.0.0.1:0",
        ])
        .arg("--config-file")
        .arg(&config);
    let mut e = Exporter::start(cmd);
    e.wait_ready();
    let body = get(e.loopback(), "/metrics").1;
    assert_eq!(lines(&body, "DCGM_FI_DEV_POWER_USAGE").len(), 8, "{body}");
    assert!(lines(&body, "DCGM_FI_DEV_SM_CLOCK").is_empty(), "{body}");
    assert_eq!(lines(&body, "process_cpu_seconds_total").len(), 1);
    assert!(e.log().contains("\"interval_ms\":2000"), "{}", e.log());
    assert_eq!(
        e.warnings_about("collections[1] (\"fast\", every 500ms) has no effect"),
        1
    );
    assert_eq!(e.warnings_about("sources.dcgm.watch has no effect"), 1);
    drop(e);

    // Explicit flag and env var win over the file.
    let mut cmd = command();
    cmd.args(["-a", "127.0.0.1:0", "--enable-exporter-metrics=false"])
        .env("DCGM_EXPORTER_CONFIG_FILE", &config)
        .env(
            "DCGM_EXPORTER_COLLECTORS",
            Path::new(env!("CARGO_MANIFEST_DIR")).join("metrics-config/default-counters.csv"),
        );
    let mut e = Exporter::start(cmd);
    e.wait_ready();
    let body = get(e.loopback(), "/metrics").1;
    assert!(
        lines(&body, "process_cpu_seconds_total").is_empty(),
        "{body}"
    );
    assert_eq!(lines(&body, "DCGM_FI_DEV_SM_CLOCK").len(), 8, "{body}");
    assert!(e.log().contains("\"interval_ms\":1000"), "{}", e.log());

    // Inline fields: exactly those.
    let inline = write(
        dir.path(),
        "inline.yaml",
        "version: 1\nmetrics:\n  fields:\n    - name: DCGM_FI_DEV_GPU_TEMP\n      prometheusType: gauge\n      help: GPU temperature (in C).\n",
    );
    let mut cmd = command();
    cmd.args(["-a", "127.0.0.1:0"])
        .arg(format!("--config-file={}", inline.display()));
    let mut e = Exporter::start(cmd);
    e.wait_ready();
    let body = get(e.loopback(), "/metrics").1;
    let dcgm: Vec<_> = body
        .lines()
        .filter(|l| l.starts_with("DCGM_FI_"))
        .map(|l| l.split('{').next().unwrap())
        .collect();
    assert_eq!(dcgm, ["DCGM_FI_DEV_GPU_TEMP"; 8], "{body}");
    assert!(body.contains("# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).\n"));
}

#[test]
fn any_address_answers_on_ipv4_and_ipv6_loopback() {
    let mut cmd = command();
    cmd.env("DCGM_EXPORTER_LISTEN", ":0");
    let mut e = Exporter::start(cmd);
    assert!(e.addr.ip().is_unspecified(), "{}", e.addr);
    e.wait_ready();
    let v4 = std::net::SocketAddr::from(([127, 0, 0, 1], e.port()));
    assert_eq!(get(v4, "/health").0, 200);
    assert_eq!(get(v4, "/metrics").0, 200);
    if std::net::TcpListener::bind("[::1]:0").is_ok() {
        assert!(
            e.addr.is_ipv6(),
            ":PORT must be the dual-stack [::] socket: {}",
            e.addr
        );
        let v6 = std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, e.port()));
        assert_eq!(get(v6, "/health").0, 200);
        let (status, body) = get(v6, "/metrics");
        assert_eq!(status, 200);
        assert_eq!(lines(&body, "DCGM_FI_DEV_GPU_TEMP").len(), 8);
    } else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI hosts have IPv6 on loopback"
        );
        eprintln!("no IPv6 loopback here; only IPv4 checked");
    }
    // An explicit address keeps its meaning: 127.0.0.1 only.
    let mut cmd = command();
    cmd.args(["-a", "127.0.0.1:0"]);
    let e = Exporter::start(cmd);
    assert_eq!(e.addr.ip(), std::net::Ipv4Addr::LOCALHOST);
}

/// A self-signed certificate for localhost and its key, written to `dir`.
fn tls_files(dir: &Path) -> (PathBuf, PathBuf) {
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .unwrap();
    let cert = params.self_signed(&key).unwrap();
    (
        write(dir, "tls.crt", &cert.pem()),
        write(dir, "tls.key", &key.serialize_pem()),
    )
}

#[test]
fn kubelet_probes_pass_with_tls_and_basic_auth_and_metrics_keeps_its_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let (crt, key) = tls_files(dir.path());
    let hash = bcrypt::hash("s3cret", 4).unwrap();
    let web = write(
        dir.path(),
        "web.yml",
        &format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\nbasic_auth_users:\n  prometheus: {hash}\n",
            crt.display(),
            key.display()
        ),
    );
    let mut cmd = command();
    cmd.args(["-a", "127.0.0.1:0", "--health-require-gpus"])
        .env("DCGM_EXPORTER_WEB_CONFIG_FILE", &web);
    let e = Exporter::start(cmd);
    let started = std::time::Instant::now();
    while kubelet_https_get(e.addr, "/ready").0 != 200 {
        assert!(started.elapsed() < binary::DEADLINE, "{}", e.log());
        // Polling another process's state.
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(
        kubelet_https_get(e.addr, "/health"),
        (200, "OK\n".to_owned())
    );
    assert_eq!(kubelet_https_get(e.addr, "/ready").0, 200);
    let (status, body) = kubelet_https_get(e.addr, "/metrics");
    assert_eq!(status, 401, "{body}");
    assert!(!body.contains("DCGM_FI_"), "{body}");
}

#[test]
fn kubelet_probes_pass_with_mtls_and_metrics_needs_a_client_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (crt, key) = tls_files(dir.path());
    let web = write(
        dir.path(),
        "web.yml",
        &format!(
            "tls_server_config:\n  cert_file: {}\n  key_file: {}\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {}\n",
            crt.display(),
            key.display(),
            crt.display()
        ),
    );
    let mut cmd = command();
    cmd.args(["-a", "127.0.0.1:0", "--web-config-file"])
        .arg(&web);
    let e = Exporter::start(cmd);
    let started = std::time::Instant::now();
    while kubelet_https_get(e.addr, "/ready").0 != 200 {
        assert!(started.elapsed() < binary::DEADLINE, "{}", e.log());
        // Polling another process's state.
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert_eq!(kubelet_https_get(e.addr, "/health").0, 200);
    let (status, body) = kubelet_https_get(e.addr, "/metrics");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("client certificate required"), "{body}");
}

/// The exporter started the way systemd's socket activation starts it: `socket` at fd 3,
/// `LISTEN_FDS=1`, `LISTEN_PID` the exporter's PID. bash moves the socket to fd 3 and execs the
/// exporter in its own process, so `$$` is the exporter's PID.
fn systemd_activated(socket: &impl std::os::fd::AsFd) -> std::process::Command {
    let fd = std::os::fd::AsRawFd::as_raw_fd(&socket.as_fd());
    rustix::io::fcntl_setfd(socket, rustix::io::FdFlags::empty()).unwrap();
    let mut cmd = std::process::Command::new("bash");
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .arg("-c")
        .arg(format!(
            "{} LISTEN_PID=$$ LISTEN_FDS=1 exec \"$0\" \"$@\"",
            if fd == 3 {
                String::new()
            } else {
                format!("exec 3<&{fd} {fd}<&-;")
            }
        ))
        .arg(env!("CARGO_BIN_EXE_gpu-exporter"))
        .args(["--backend", "sim", "-c", "1000", "--log-format", "json"])
        .args(["--web-systemd-socket", "-a", "127.0.0.1:1"]);
    cmd
}

#[test]
fn systemd_socket_activation_refuses_a_socket_that_is_not_listening() {
    // Bound but never listened on (a unit with Accept=yes, or a wrapper that forgot listen()):
    // it used to log "listening", then fail every accept, every 100 ms, for ever.
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    let loopback: std::net::SocketAddr = "127.0.0.1:0".parse().unwrap();
    socket.bind(&loopback.into()).unwrap();
    let at = socket.local_addr().unwrap().as_socket().unwrap();
    let (status, stderr) = run_to_exit(systemd_activated(&socket));
    assert!(!status.success(), "started: {stderr}");
    let want = format!(
        "--web-systemd-socket: fd 3 is a TCP socket on {at} that is not listening (SO_ACCEPTCONN is off)"
    );
    assert!(stderr.contains(&want), "expected {want:?} in {stderr}");
    // A UDP socket is refused by type.
    let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let (status, stderr) = run_to_exit(systemd_activated(&udp));
    assert!(!status.success(), "started: {stderr}");
    assert!(
        stderr.contains(
            "--web-systemd-socket: fd 3 is a datagram (UDP) socket, not a stream (TCP) socket"
        ),
        "{stderr}"
    );
}

#[test]
fn systemd_socket_activation_serves_on_the_inherited_socket() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut e = Exporter::start(systemd_activated(&listener));
    // Only the child needs it now.
    drop(listener);
    assert_eq!(e.addr, addr, "{}", e.log());
    e.wait_ready();
    let (status, body) = get(addr, "/metrics");
    assert_eq!(status, 200);
    assert_eq!(lines(&body, "DCGM_FI_DEV_GPU_TEMP").len(), 8);
}
