//! What runbooks run inside a running exporter's container (`kubectl exec ... -- dcgm-exporter
//! --list-devices`): the listing comes from the real NVML path (the stand-in) and the command
//! exits without touching the exporter's port.

use std::net::TcpListener;
use std::process::Command;

use crate::harness::{library_dir, StandIn};
use crate::node::{self, GPU0, GPU1, MIG_A, MIG_B};

#[test]
fn list_devices_lists_the_nvml_gpus_and_exits_without_binding_the_port() {
    let nvml = StandIn::new(node::standard());
    // The running exporter's port: held, as it is inside its container.
    let held = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = held.local_addr().expect("address").port();
    let out = Command::new(env!("CARGO_BIN_EXE_gpu-exporter"))
        .args([
            "--backend",
            "nvml",
            "-a",
            &format!("127.0.0.1:{port}"),
            "--list-devices",
        ])
        .env("LD_LIBRARY_PATH", library_dir())
        .env("NVML_STANDIN_CONFIG", nvml.config_path())
        .env("NVML_STANDIN_STATUS", nvml.status_path())
        .env_remove("DCGM_EXPORTER_COLLECTORS")
        .env_remove("DCGM_EXPORTER_INTERVAL")
        .output()
        .expect("run gpu-exporter --list-devices");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{:?}\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(
        lines[0].starts_with("GPU 0\t") && lines[0].contains(GPU0),
        "{stdout}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("GPU 1\t") && l.contains(GPU1)),
        "{stdout}"
    );
    // The MIG instances of GPU 1, by GPU instance id.
    for (gi, uuid) in [(2, MIG_A), (9, MIG_B)] {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("  MIG GPU_I_ID {gi}\t{uuid}"))),
            "GI {gi}: {stdout}"
        );
    }
    // Nothing tried the port: no "address in use", no listening line.
    assert!(
        !stderr.contains("in use") && !stderr.contains("listening"),
        "{stderr}"
    );
    drop(held);
}
