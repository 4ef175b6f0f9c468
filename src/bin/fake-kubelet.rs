//! fake-kubelet: serves the kubelet pod-resources v1 API on a unix socket from a file of
//! pod-to-device assignments (device-plugin ids, or DRA claims with the DRA driver's device
//! names), so gpu-exporter's Kubernetes mode can be run without a cluster.
//!
//! ```text
//! fake-kubelet --socket /tmp/kubelet.sock --assignments tests/fixtures/pods/h100-seed1.toml
//! gpu-exporter --backend sim -k --pod-resources-kubelet-socket /tmp/kubelet.sock
//! ```
//!
//! The file is read again when it changes (checked every second) or on SIGHUP; a file that no
//! longer parses is reported and the previous assignments stay in force. The format is
//! documented in `gpu_exporter::pods::fake` and docs/pods.md. Once the socket is bound, one line
//! `fake-kubelet: serving N pods on PATH` goes to stdout (scripts and tests wait for it).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use clap::Parser;
use tokio::sync::watch;

use gpu_exporter::pods::fake::{self, Assignments};
use gpu_exporter::pods::proto::ListPodResourcesResponse;

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
    let (tx, rx) = watch::channel(first.reply);

    remove_stale_socket(&args.socket)?;
    let listener = tokio::net::UnixListener::bind(&args.socket)
        .with_context(|| format!("--socket {}: cannot bind", args.socket.display()))?;
    println!(
        "fake-kubelet: serving {pods} pods on {}",
        args.socket.display()
    );
    std::io::stdout().flush().context("stdout")?;

    tokio::spawn(reload_loop(args.assignments.clone(), tx));
    let served = fake::serve(listener, rx, shutdown_signal()).await;
    let _ = std::fs::remove_file(&args.socket);
    served.context("serving")
}

fn remove_stale_socket(path: &Path) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path).with_context(|| {
            format!(
                "--socket {}: cannot remove the stale socket",
                path.display()
            )
        }),
        Ok(_) => anyhow::bail!(
            "--socket {}: exists and is not a socket; refusing to replace it",
            path.display()
        ),
        Err(_) => Ok(()),
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// Reloads on SIGHUP or when the file's modification time changes.
async fn reload_loop(path: PathBuf, tx: watch::Sender<ListPodResourcesResponse>) {
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
            Ok(a) => {
                tracing::info!(
                    pods = a.reply.pod_resources.len(),
                    file = %path.display(),
                    "assignments reloaded"
                );
                tx.send_replace(a.reply);
            }
            Err(e) => tracing::error!(
                error = %gpu_exporter::error_chain(&e),
                "assignments not reloaded; the previous ones stay in force"
            ),
        }
    }
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        () = term => {},
    }
}
