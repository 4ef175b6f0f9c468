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
