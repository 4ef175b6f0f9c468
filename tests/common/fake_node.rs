//! The `fake-kubelet` binary as a child process: it serves pod-resources and CRI on real unix
//! sockets from an assignments file and writes the node's /proc tree; a reload (SIGHUP) is
//! waited for by its log line.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The longest wait for one log line.
const DEADLINE: Duration = Duration::from_secs(20);

/// `fake-kubelet` serving `assignments` on a pod-resources and a CRI socket, with its proc tree.
pub struct FakeNode {
    child: Child,
    log: mpsc::Receiver<String>,
}

impl FakeNode {
    pub fn start(kubelet: &Path, cri: &Path, proc_root: &Path, assignments: &Path) -> Self {
        let mut child = Command::new(super::fake_kubelet_bin::fake_kubelet_bin())
            .arg("--socket")
            .arg(kubelet)
            .arg("--cri-socket")
            .arg(cri)
            .arg("--proc-root")
            .arg(proc_root)
            .arg("--assignments")
            .arg(assignments)
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn fake-kubelet");
        let mut out = BufReader::new(child.stdout.take().expect("stdout"));
        loop {
            let mut line = String::new();
            assert!(
                out.read_line(&mut line).expect("fake-kubelet stdout") > 0,
                "fake-kubelet exited before serving"
            );
            if line.starts_with("fake-kubelet: serving") {
                break;
            }
        }
        let (tx, log) = mpsc::channel();
        let err = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self { child, log }
    }

    /// Reloads the assignments now (SIGHUP) and waits until it says so.
    pub fn reload(&self) {
        let pid = self.child.id().to_string();
        assert!(Command::new("kill")
            .args(["-HUP", &pid])
            .status()
            .expect("kill")
            .success());
        let until = Instant::now() + DEADLINE;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            let line = self
                .log
                .recv_timeout(left)
                .expect("fake-kubelet never logged the reload");
            if line.contains("assignments reloaded") {
                return;
            }
        }
    }
}

impl Drop for FakeNode {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
