//! What `main.rs` composes, built from the configuration: the log writer, the GPU sources
//! (NVML, the simulated fleet with its processes) and the `--list-devices` listing. The wiring
//! of the pipeline itself stays in `main.rs`.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use anyhow::{Context, Result};
use tracing_subscriber::EnvFilter;

use gpu_exporter::config::{Backend, Config, LogFormat};
use gpu_exporter::gpu::nvml::real::RealNvml;
use gpu_exporter::gpu::nvml::{NvmlSource, RetryPolicy};
use gpu_exporter::gpu::sim::assignments::Assignments;
use gpu_exporter::gpu::sim::scenario::Scenario;
use gpu_exporter::gpu::sim::{SimProcess, SimulatedSource};
use gpu_exporter::gpu::GpuSource;
use gpu_exporter::logsink::LogSink;
use gpu_exporter::pods::dra;
use gpu_exporter::pods::mapping::assigned_device;

/// Logs to stderr through a writer that never fails (a closed stderr loses log lines, counted
/// in the returned counter, and never panics the thread that logs).
pub fn init_logging(format: LogFormat, debug: bool) -> Arc<AtomicU64> {
    let default = if debug { "debug" } else { "info" };
    let filter =
        EnvFilter::try_from_env("GPU_EXPORTER_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    // Colour only for a person at a terminal: under Kubernetes stderr is a pipe, and `kubectl
    // logs` would show the escape codes raw.
    let colour = gpu_exporter::config::log_colour(
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let sink = LogSink::stderr();
    let failed = sink.failed();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .log_internal_errors(false)
        .with_writer(sink);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
    failed
}

pub fn nvml_source(config: &Config) -> Result<NvmlSource<RealNvml>> {
    let source = NvmlSource::real(RetryPolicy::default());
    if config.args.require_gpus {
        if let Some(e) = source.init_error() {
            anyhow::bail!("--require-gpus: {e}");
        }
        let gpus = source
            .devices()
            .map_err(|e| anyhow::anyhow!(gpu_exporter::error_chain(&e)))
            .context("--require-gpus")?;
        if gpus.is_empty() {
            anyhow::bail!("--require-gpus: NVML is up but lists no GPU");
        }
    } else if source.init_error().is_some() && config.args.backend == Backend::Nvml {
        tracing::warn!("NVML initialisation is retried in the background; /ready answers 503 until it succeeds (use --require-gpus to exit instead)");
    }
    Ok(source)
}

pub fn sim_source(config: &Config) -> Result<SimulatedSource> {
    let (scenario, origin) = config
        .scenario
        .clone()
        .unwrap_or_else(|| (Scenario::default(), String::from("-")));
    let profile = config
        .args
        .sim_profile
        .clone()
        .or_else(|| scenario.profile.clone())
        .unwrap_or_else(|| "8xH100-SXM".to_owned());
    // Without an explicit seed each simulated node gets its own (from its hostname), so a fleet
    // of simulated nodes has distinct GPU UUIDs.
    let seed = config
        .args
        .sim_seed
        .or(scenario.seed)
        .unwrap_or_else(|| seed_from(&config.hostname));
    let source = SimulatedSource::new(&profile, seed, config.interval, scenario, &origin)
        .context("--sim-profile / --sim-scenario")?
        .with_dcgm(config.args.sim_dcgm);
    match &config.args.sim_processes {
        None => Ok(source),
        Some(path) => {
            let processes = sim_processes(path, &source, config)
                .with_context(|| format!("--sim-processes {}", path.display()))?;
            tracing::info!(
                processes = processes.len(),
                file = %path.display(),
                "simulated processes"
            );
            source
                .with_processes(processes)
                .with_context(|| format!("--sim-processes {}", path.display()))
        }
    }
}

/// The PIDs of an assignments file (the fake kubelet serves the same files), placed on the simulated devices their
/// assignments name.
fn sim_processes(
    path: &std::path::Path,
    source: &SimulatedSource,
    config: &Config,
) -> Result<Vec<SimProcess>> {
    let devices = source.devices()?;
    let on = assigned_device(&devices, config.args.kubernetes_gpu_id_type);
    Ok(Assignments::load(path)?.sim_processes(on)?)
}

/// `--list-devices`: what the backend finds, for writing fake-kubelet assignment files: ids
/// for the device plugin, GKE's device names, and the names of NVIDIA's DRA driver.
pub fn list_devices(source: &impl GpuSource) -> Result<()> {
    let devices = source.devices().context("listing devices")?;
    for d in &devices {
        let id = &d.identity;
        println!(
            "GPU {}\t{}\tdevice-name nvidia{}\t{}\t{}\tdra {}",
            id.index,
            id.uuid,
            id.minor,
            id.pci_bus_id,
            id.model,
            dra::gpu_device_name(id.minor)
        );
        for i in &d.instances {
            println!(
                "  MIG GPU_I_ID {}\t{}\tdevice-name nvidia{}/gi{}\t{}\tdra {}",
                i.gi_id,
                i.uuid,
                id.minor,
                i.gi_id,
                i.profile,
                dra::mig_device_name(id.minor, i).unwrap_or_else(|| "(no placement)".into())
            );
        }
    }
    Ok(())
}

/// FNV-1a of the hostname.
fn seed_from(hostname: &str) -> u64 {
    hostname.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}
