//! gpu-exporter binary: parse flags, build the pipeline, serve until SIGTERM/SIGINT.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

use gpu_exporter::config::{Args, Backend, Config, LogFormat};
use gpu_exporter::gpu::nvml::real::RealNvml;
use gpu_exporter::gpu::nvml::{NvmlSource, RetryPolicy};
use gpu_exporter::gpu::scenario::Scenario;
use gpu_exporter::gpu::sim::SimulatedSource;
use gpu_exporter::gpu::GpuSource;
use gpu_exporter::http::{self, AppState};
use gpu_exporter::pods::kubelet::KubeletPodResources;
use gpu_exporter::pods::mapping::MappingOptions;
use gpu_exporter::pods::refresher::{Refresher, RefresherOptions};
use gpu_exporter::pods::Attribution;
use gpu_exporter::reload::CatalogReloader;
use gpu_exporter::sampler::{Sampler, SamplerOptions};
use gpu_exporter::self_metrics::SelfMetrics;
use gpu_exporter::snapshot::BuildOptions;
use gpu_exporter::web::WebSecurity;

/// How often the metrics CSV is checked for changes (SIGHUP reloads at once).
const CSV_POLL: Duration = Duration::from_secs(5);

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    init_logging(args.log_format, args.debug);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(8)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            tracing::error!("starting the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("gpu-exporter: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat, debug: bool) {
    let default = if debug { "debug" } else { "info" };
    let filter =
        EnvFilter::try_from_env("GPU_EXPORTER_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    // Colour only for a person at a terminal: under Kubernetes stderr is a pipe, and `kubectl
    // logs` would show the escape codes raw.
    let colour = gpu_exporter::config::log_colour(
        std::io::IsTerminal::is_terminal(&std::io::stderr()),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

async fn run(args: Args) -> Result<()> {
    let mut config = Config::resolve(args).context("invalid configuration")?;
    for notice in &config.notices {
        tracing::warn!("{notice}");
    }
    for s in &config.skipped {
        tracing::warn!("{}:{}: {s}", config.catalog_origin, s.line);
    }
    let nvml = match config.args.backend {
        Backend::Sim => None,
        Backend::Nvml | Backend::Auto => Some(nvml_source(&config)?),
    };
    match nvml {
        Some(source) if source.init_error().is_none() || config.args.backend == Backend::Nvml => {
            serve(
                config_with_supported(&mut config, &source),
                Arc::new(source),
            )
            .await
        }
        Some(source) => {
            tracing::warn!(
                "--backend auto: {}; using the simulated fleet",
                source
                    .init_error()
                    .map(|e| e.to_string())
                    .unwrap_or_default()
            );
            let source = sim_source(&config)?;
            serve(
                config_with_supported(&mut config, &source),
                Arc::new(source),
            )
            .await
        }
        None => {
            let source = sim_source(&config)?;
            if config.args.list_devices {
                return list_devices(&source);
            }
            serve(
                config_with_supported(&mut config, &source),
                Arc::new(source),
            )
            .await
        }
    }
}

fn nvml_source(config: &Config) -> Result<NvmlSource<RealNvml>> {
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

fn sim_source(config: &Config) -> Result<SimulatedSource> {
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
    SimulatedSource::new(&profile, seed, config.interval, scenario, &origin)
        .context("--sim-profile / --sim-scenario")
}

/// `--list-devices`: what the backend finds, for writing fake-kubelet assignment files.
fn list_devices(source: &impl GpuSource) -> Result<()> {
    let devices = source.devices().context("listing devices")?;
    for d in &devices {
        let id = &d.identity;
        println!(
            "GPU {}\t{}\tdevice-name nvidia{}\t{}\t{}",
            id.index, id.uuid, id.minor, id.pci_bus_id, id.model
        );
        for i in &d.instances {
            println!(
                "  MIG GPU_I_ID {}\t{}\tdevice-name nvidia{}/gi{}\t{}",
                i.gi_id, i.uuid, id.minor, i.gi_id, i.profile
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

fn config_with_supported(config: &mut Config, source: &impl GpuSource) -> Config {
    for m in config.retain_supported(|f| source.supports(f)) {
        tracing::warn!(
            "{}:{}: skipping {}: the {} backend cannot read it",
            config.catalog_origin,
            m.line,
            m.name,
            source.name()
        );
    }
    config.clone()
}

async fn serve<S: GpuSource>(config: Config, source: Arc<S>) -> Result<()> {
    let shutdown = CancellationToken::new();
    let metrics = Arc::new(SelfMetrics::default());
    let web = match &config.args.web_config_file {
        Some(p) => Some(Arc::new(
            WebSecurity::load(p, gpu_exporter::web::DEFAULT_RECHECK)
                .context("--web-config-file")?,
        )),
        None => None,
    };
    let (catalog_tx, catalog_rx) = watch::channel(Arc::new(config.catalog.clone()));
    let (reload_tx, reload_rx) = tokio::sync::mpsc::channel(1);
    spawn_sighup_forwarder(reload_tx);
    match &config.catalog_path {
        Some(path) => {
            let initial = std::fs::read(path).unwrap_or_default();
            let s = Arc::clone(&source);
            let reloader = CatalogReloader::new(path.clone(), &initial, move |f| s.supports(f));
            tokio::spawn(reloader.run(
                catalog_tx,
                reload_rx,
                CSV_POLL,
                Arc::clone(&metrics),
                shutdown.clone(),
            ));
        }
        None => {
            tokio::spawn(async move {
                let mut rx = reload_rx;
                while rx.recv().await.is_some() {
                    tracing::warn!("SIGHUP: the metrics CSV is the built-in copy; pass --collectors FILE to reload one");
                }
                drop(catalog_tx);
            });
        }
    }
    let (pods_tx, pods_rx) = watch::channel(Arc::new(Attribution::default()));
    let (pub_tx, pub_rx) = watch::channel(None);

    let opts = SamplerOptions {
        interval: config.interval,
        rediscover_every: Duration::from_secs(60).max(config.interval),
        build: BuildOptions {
            hostname_label: config.args.hostname_label.clone(),
            hostname: config.hostname.clone(),
            replace_blanks_in_model_name: config.args.replace_blanks_in_model_name,
            selection: config.selection.clone(),
            virtual_gpus: config.args.kubernetes_virtual_gpus,
            xid_window_ms: config.args.xid_count_window_size,
            clock_window_ms: config.args.clock_events_count_window_size,
            old_namespace: config.args.use_old_namespace,
        },
    };
    let mut sampler = Sampler::new(source, catalog_rx, pods_rx, opts, Arc::clone(&metrics));
    if config.args.kubernetes {
        let (inventory_tx, inventory_rx) = watch::channel(Arc::new(Vec::new()));
        sampler = sampler.with_inventory(inventory_tx);
        let socket = &config.args.pod_resources_kubelet_socket;
        let timeout = Duration::from_millis(config.args.pod_resources_timeout);
        let kubelet =
            KubeletPodResources::new(socket, timeout).context("--pod-resources-kubelet-socket")?;
        let refresher_opts = RefresherOptions {
            refresh: Duration::from_millis(config.args.pod_resources_refresh),
            ttl: Duration::from_millis(config.args.pod_resources_ttl),
            mapping: MappingOptions {
                extra_resource_names: config.args.nvidia_resource_names.clone(),
                id_type: config.args.kubernetes_gpu_id_type,
            },
        };
        tracing::info!(
            socket = %socket.display(),
            refresh_ms = config.args.pod_resources_refresh,
            ttl_ms = config.args.pod_resources_ttl,
            "pod attribution from the kubelet pod-resources API"
        );
        let refresher = Refresher::new(
            kubelet,
            inventory_rx,
            pods_tx,
            Arc::clone(&metrics),
            refresher_opts,
        );
        tokio::spawn(refresher.run(shutdown.clone()));
    }
    let sampler_task = tokio::spawn(sampler.run(pub_tx, shutdown.clone()));

    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| {
            format!(
                "--address {}: cannot listen on {}",
                config.args.address, config.listen
            )
        })?;
    tracing::info!(
        tls = web.as_ref().is_some_and(|w| w.tls_enabled()),
        address = %listener.local_addr().map_or_else(|_| config.listen.to_string(), |a| a.to_string()),
        metrics = config.catalog.metrics.len(),
        interval_ms = config.interval.as_millis() as u64,
        collectors = %config.catalog_origin,
        "gpu-exporter listening"
    );
    let router = http::router(AppState {
        published: pub_rx,
        interval: config.interval,
        metrics,
    });
    let stop = shutdown.clone();
    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        stop.cancel();
    });
    let stopped = shutdown.clone();
    http::serve_with(listener, router, http::Limits::default(), web, async move {
        stopped.cancelled().await;
    })
    .await
    .context("serving HTTP")?;
    shutdown.cancel();
    let _ = sampler_task.await;
    Ok(())
}

/// Forwards SIGHUP to the reloader (a full channel means a reload is already pending).
fn spawn_sighup_forwarder(tx: tokio::sync::mpsc::Sender<()>) {
    #[cfg(unix)]
    tokio::spawn(async move {
        let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        else {
            tracing::warn!("cannot listen for SIGHUP; the metrics CSV reloads only on file change");
            return;
        };
        while hup.recv().await.is_some() {
            let _ = tx.try_send(());
        }
    });
    #[cfg(not(unix))]
    drop(tx);
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
