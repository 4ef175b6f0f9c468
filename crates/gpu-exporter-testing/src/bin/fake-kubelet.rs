//! fake-kubelet: serves the kubelet pod-resources v1 API on a unix socket from a file of
//! pod-to-device assignments (device-plugin ids, or DRA claims with the DRA driver's device
//! names), so gpu-exporter's Kubernetes mode can be run without a cluster. With `--cri-socket` it
//! also serves the container runtime's CRI (the pods and containers of the same file), and with
//! `--proc-root` it writes `<dir>/<pid>/cgroup` for every PID the file lists: together a fake node
//! for per-process attribution.
//!
//! ```text
//! fake-kubelet --socket /tmp/kubelet.sock --assignments tests/fixtures/pods/h100-seed1.toml \
//!     [--cri-socket /tmp/cri.sock --proc-root /tmp/proc]
//! gpu-exporter --backend sim -k --pod-resources-kubelet-socket /tmp/kubelet.sock \
//!     [--container-runtime-endpoint unix:///tmp/cri.sock --path.procfs /tmp/proc \
//!      --sim-processes tests/fixtures/pods/h100-seed1.toml --kubernetes-process-usage]
//! ```
//!
//! The file is read again when it changes (checked every second) or on SIGHUP; a file that no
//! longer parses is reported and the previous assignments stay in force. The format is
//! documented in `gpu_exporter_testing::fake_kubelet` and docs/pods.md. Once every socket is bound and the
//! proc tree written, one line `fake-kubelet: serving N pods on PATH` goes to stdout (scripts and
//! tests wait for it), after one line each for the CRI socket and the proc tree.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use clap::Parser;
use tokio::sync::watch;

use gpu_exporter::pods::directory::RuntimeSnapshot;
use gpu_exporter::pods::proto::ListPodResourcesResponse;
use gpu_exporter::shutdown_signal;
use gpu_exporter_testing::fake_cri;
use gpu_exporter_testing::fake_kubelet::{self as fake, Assignments};

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "fake-kubelet",
    about = "A fake kubelet pod-resources server for gpu-exporter"
)]
struct Args {
    /// Unix socket to serve on (a stale socket there is replaced).
    #[arg(long)]
    socket: PathBuf,
    /// Assignments file (TOML).
    #[arg(long)]
    assignments: PathBuf,
    /// Also serve the container runtime's CRI (ListPodSandbox, ListContainers) on this socket.
    #[arg(long)]
    cri_socket: Option<PathBuf>,
    /// Also write `<dir>/<pid>/cgroup` for every PID of the assignments (a fake host /proc).
    #[arg(long)]
    proc_root: Option<PathBuf>,
}

/// What the reload loop keeps current.
struct Outputs {
    pods: watch::Sender<ListPodResourcesResponse>,
    runtime: watch::Sender<RuntimeSnapshot>,
    proc_root: Option<PathBuf>,
    pids: Vec<u32>,
}

impl Outputs {
    fn apply(&mut self, a: &Assignments) -> Result<()> {
        if let Some(dir) = &self.proc_root {
            self.pids = a
                .write_proc_tree(dir, &self.pids)
                .map_err(|e| anyhow::anyhow!(gpu_exporter::error_chain(&e)))?;
        }
        self.runtime.send_replace(a.runtime_snapshot());
        self.pods.send_replace(a.reply.clone());
        Ok(())
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GPU_EXPORTER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let args = Args::parse();
    let first = Assignments::load(&args.assignments).context("--assignments")?;
    let pods = first.reply.pod_resources.len();
    let (tx, rx) = watch::channel(ListPodResourcesResponse::default());
    let (rt_tx, rt_rx) = watch::channel(RuntimeSnapshot::default());
    if let Some(dir) = &args.proc_root {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("--proc-root {}: cannot create", dir.display()))?;
    }
    let mut outputs = Outputs {
        pods: tx,
        runtime: rt_tx,
        proc_root: args.proc_root.clone(),
        pids: Vec::new(),
    };
    outputs.apply(&first).context("--proc-root")?;
    if let Some(dir) = &args.proc_root {
        println!(
            "fake-kubelet: proc tree of {} processes in {}",
            outputs.pids.len(),
            dir.display()
        );
    }

    let stop = tokio_util::sync::CancellationToken::new();
    let cri_task = match &args.cri_socket {
        Some(path) => {
            remove_stale_socket(path, "--cri-socket")?;
            let listener = tokio::net::UnixListener::bind(path)
                .with_context(|| format!("--cri-socket {}: cannot bind", path.display()))?;
            println!(
                "fake-kubelet: CRI serving {} containers on {}",
                rt_rx.borrow().containers.len(),
                path.display()
            );
            let stopped = stop.clone();
            Some(tokio::spawn(fake_cri::serve(listener, rt_rx, async move {
                stopped.cancelled().await;
            })))
        }
        None => None,
    };

    remove_stale_socket(&args.socket, "--socket")?;
    let listener = tokio::net::UnixListener::bind(&args.socket)
        .with_context(|| format!("--socket {}: cannot bind", args.socket.display()))?;
    println!(
        "fake-kubelet: serving {pods} pods on {}",
        args.socket.display()
    );
    std::io::stdout().flush().context("stdout")?;

    tokio::spawn(reload_loop(args.assignments.clone(), outputs));
    let served = fake::serve(listener, rx, shutdown_signal()).await;
    stop.cancel();
    if let Some(t) = cri_task {
        let _ = t.await;
    }
    let _ = std::fs::remove_file(&args.socket);
    if let Some(p) = &args.cri_socket {
        let _ = std::fs::remove_file(p);
    }
    served.context("serving")
}

fn remove_stale_socket(path: &Path, flag: &str) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path)
            .with_context(|| format!("{flag} {}: cannot remove the stale socket", path.display())),
        Ok(_) => anyhow::bail!(
            "{flag} {}: exists and is not a socket; refusing to replace it",
            path.display()
        ),
        Err(_) => Ok(()),
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Reloads on SIGHUP or when the file's modification time changes.
async fn reload_loop(path: PathBuf, mut outputs: Outputs) {
    let mut hup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!("cannot watch SIGHUP ({e}); reloading on file changes only");
            None
        }
    };
    let mut seen = modified(&path);
    let mut poll = tokio::time::interval(Duration::from_secs(1));
    loop {
        let forced = tokio::select! {
            _ = poll.tick() => false,
            Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => true,
        };
        let now = modified(&path);
        if !forced && now == seen {
            continue;
        }
        seen = now;
        match Assignments::load(&path) {
            Ok(a) => match outputs.apply(&a) {
                Ok(()) => tracing::info!(
                    pods = a.reply.pod_resources.len(),
                    file = %path.display(),
                    "assignments reloaded"
                ),
                Err(e) => {
                    tracing::error!(error = %e, "assignments reloaded, but the proc tree could not be written")
                }
            },
            Err(e) => tracing::error!(
                error = %gpu_exporter::error_chain(&e),
                "assignments not reloaded; the previous ones stay in force"
            ),
        }
    }
}
