//! The text log has no ANSI colour escapes when stderr is not a terminal (a container's log, a
//! pipe), whatever the environment says: `kubectl logs` would show them raw.

use std::process::Command;

fn run(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpu-exporter"));
    cmd.args(args)
        .env_remove("NO_COLOR")
        .env_remove("GPU_EXPORTER_LOG")
        .env_remove("DCGM_EXPORTER_LOG_FORMAT")
        .env("TERM", "xterm-256color");
    for (k, v) in env {
        cmd.env(k, v);
    }
    // `output()` pipes stderr: it is not a terminal.
    let out = cmd.output().expect("run gpu-exporter");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn piped_stderr_gets_plain_text_log_lines() {
    // A warning (an inert DCGM flag) and a normal exit: --list-devices prints and stops.
    let (ok, stderr) = run(
        &[
            "--backend",
            "sim",
            "--list-devices",
            "--remote-hostengine-info",
            "localhost:5555",
        ],
        &[],
    );
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("WARN") && stderr.contains("--remote-hostengine-info"),
        "expected the warning in the log: {stderr:?}"
    );
    assert!(!stderr.contains('\u{1b}'), "ANSI escape in {stderr:?}");
}

#[test]
fn a_startup_error_is_logged_without_escapes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let csv = dir.path().join("bad.csv");
    std::fs::write(&csv, "DCGM_FI_DEV_NOT_A_FIELD, gauge, x\n").expect("write csv");
    let (ok, stderr) = run(
        &["--backend", "sim", "-f", csv.to_str().expect("utf-8 path")],
        &[("NO_COLOR", "")],
    );
    assert!(!ok, "a bad CSV must stop startup");
    assert!(
        stderr.contains("ERROR") && stderr.contains("bad.csv:1: unknown field"),
        "{stderr:?}"
    );
    assert!(!stderr.contains('\u{1b}'), "ANSI escape in {stderr:?}");
}

#[test]
fn a_connection_limit_past_the_descriptor_limit_stops_startup_with_what_to_change() {
    // The limit is set with bash's ulimit (soft and hard), so the exporter cannot raise it.
    let mut child = Command::new("bash")
        .args([
            "-c",
            "ulimit -n 256 && exec \"$0\" --backend sim --address 127.0.0.1:0 --http-max-connections 1000",
            env!("CARGO_BIN_EXE_gpu-exporter"),
        ])
        .env("NO_COLOR", "")
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("run gpu-exporter under bash");
    // Bounded wait for the exit; a server that starts anyway is killed and the test fails.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    let status = status.unwrap_or_else(|| panic!("started despite the descriptor limit: {stderr}"));
    assert!(!status.success(), "{stderr}");
    assert!(
        stderr.contains("--http-max-connections: 1000 connections need 1128 file descriptors")
            && stderr.contains("RLIMIT_NOFILE) is 256")
            && stderr.contains("at most 128"),
        "{stderr}"
    );
}
