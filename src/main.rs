//! gpu-exporter binary: parse flags, build the pipeline, serve until SIGTERM/SIGINT.

use std::io::Write as _;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use gpu_exporter::config::{Args, Backend, Config, PodMetadataSource};
use gpu_exporter::exporter_metrics::ExporterMetrics;
use gpu_exporter::gpu::dcgm::source::{DcgmMode, DcgmOptions, DcgmSource};
use gpu_exporter::gpu::dcgm::DcgmLibrary;
use gpu_exporter::gpu::GpuSource;
use gpu_exporter::hpc::{HpcJobs, HpcWatcher};
use gpu_exporter::http::{self, AppState};
use gpu_exporter::kubeapi::client::KubeClient;
use gpu_exporter::kubeapi::pods::{PodWatchOptions, PodWatcher};
use gpu_exporter::pods::cri::CriClient;
use gpu_exporter::pods::cri_refresher::{CriOptions, CriRefresher};
use gpu_exporter::pods::directory::{LabelOptions, PodDirectory};
use gpu_exporter::pods::kubelet::KubeletPodResources;
use gpu_exporter::pods::mapping::MappingOptions;
use gpu_exporter::pods::procfs::ProcRoot;
use gpu_exporter::pods::refresher::{Refresher, RefresherOptions};
use gpu_exporter::pods::Attribution;
use gpu_exporter::reload::{CatalogReloader, Hangup};
use gpu_exporter::sampler::{Sampler, SamplerOptions};
use gpu_exporter::shutdown_signal;
use gpu_exporter::supervise::Essential;
use gpu_exporter::web::WebSecurity;

#[path = "main/startup.rs"]
mod startup;
use startup::{init_logging, list_devices, nvml_source, sim_source};

/// How often the metrics CSV is checked for changes (SIGHUP reloads at once).
const CSV_POLL: Duration = Duration::from_secs(5);
/// The HPC job mapping directory is read every sampling interval, within these bounds.
const HPC_POLL_MIN: Duration = Duration::from_secs(1);
const HPC_POLL_MAX: Duration = Duration::from_secs(5);

fn main() -> std::process::ExitCode {
    // SIGHUP's default action ends the process. Catch it before anything else can take time
    // (flag parsing, file reads): until the reloader listens, a SIGHUP is queued on `hup`.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(8)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "gpu-exporter: starting the async runtime: {e}"
            );
            return std::process::ExitCode::FAILURE;
        }
    };
    let hup = {
        let _entered = runtime.enter();
        gpu_exporter::reload::hangup_signal()
    };
    let args = match gpu_exporter::config::goflags::parse(
        std::env::args_os(),
        &gpu_exporter::config::goflags::process_env,
    ) {
        Ok(a) => a,
        Err(gpu_exporter::config::goflags::CliError::Clap(e)) => e.exit(),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "gpu-exporter: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let log_write_errors = init_logging(args.log_format, args.debug);
    let ran = runtime.block_on(run(args, hup, log_write_errors));
    // A blocking task still inside a driver or library call (NVML, DCGM) does not hold the
    // exit: give them a second, then go.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match ran {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            // Never `eprintln!`: it panics when stderr is a closed pipe.
            let _ = writeln!(std::io::stderr(), "gpu-exporter: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args, hup: Hangup, log_write_errors: Arc<AtomicU64>) -> Result<()> {
    let mut config = Config::resolve(args).context("invalid configuration")?;
    for notice in &config.notices {
        tracing::warn!("{notice}");
    }
    if let Some(cm) = config.configmap.clone() {
        // dcgm-exporter reads it once at startup and exits when it cannot: it is configuration.
        let timeout = Duration::from_millis(config.args.kube_api_timeout);
        let client = KubeClient::connect(timeout)
            .await
            .with_context(|| format!("--configmap-data {cm}"))?;
        let csv = gpu_exporter::kubeapi::configmap::read_csv(&client, &cm, timeout)
            .await
            .context("--configmap-data")?;
        let origin = format!(
            "configmap {cm} key {}",
            gpu_exporter::kubeapi::configmap::KEY
        );
        let (catalog, skipped) =
            gpu_exporter::catalog::parse(&csv, &origin).context("--configmap-data")?;
        tracing::info!(
            configmap = %cm,
            server = %client.url,
            metrics = catalog.metrics.len(),
            "metrics CSV from the ConfigMap (read at startup; it wins over --collectors; a change takes a restart)"
        );
        config.use_catalog(catalog, skipped, origin);
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
            // `--list-devices` lists and exits before anything binds the port: run by exec
            // inside a running exporter's container, it must not start a second exporter.
            if config.args.list_devices {
                return list_devices(&source);
            }
            // NVML plus DCGM for the profiling fields NVML cannot read, as dcgm-exporter: with
            // -r the hostengine there, without it DCGM embedded in the exporter. Without DCGM's
            // library (the image without it) NVML alone serves.
            let opts = match config.args.remote_hostengine_info.clone() {
                Some(address) => DcgmOptions::new(&address, config.interval),
                None => {
                    let mut opts = DcgmOptions::embedded(config.interval);
                    // dcgm-exporter's --enable-dcgm-log: the embedded hostengine logs to stdout.
                    if config.args.enable_dcgm_log {
                        opts.embedded_log = Some(
                            config
                                .args
                                .dcgm_log_level
                                .as_deref()
                                .and_then(gpu_exporter::gpu::dcgm::log_severity)
                                .unwrap_or(0),
                        );
                    }
                    opts
                }
            };
            match DcgmLibrary::load(&opts.library) {
                Ok(lib) => {
                    tracing::info!(library = %opts.library, "reading the DCGM_FI_PROF_* fields NVML cannot read (GPUs before Hopper) from {}", opts.mode);
                    let flag = match opts.mode {
                        DcgmMode::Remote(_) => "-r / --remote-hostengine-info",
                        DcgmMode::Embedded => "the embedded DCGM hostengine",
                    };
                    let source = DcgmSource::start(source, lib, opts).context(flag)?;
                    return serve(
                        config_with_supported(&mut config, &source)?,
                        Arc::new(source),
                        hup,
                        log_write_errors,
                    )
                    .await;
                }
                Err(e) => match &opts.mode {
                    DcgmMode::Remote(address) => tracing::warn!(
                        "-r / --remote-hostengine-info / DCGM_REMOTE_HOSTENGINE_INFO {address}: {e}; serving NVML only: the DCGM_FI_PROF_* series of GPUs before Hopper stay absent"
                    ),
                    // Most images lack DCGM: not a warning.
                    DcgmMode::Embedded => tracing::info!(
                        "no DCGM library ({e}); serving NVML only: the DCGM_FI_PROF_* series of GPUs before Hopper stay absent (the image variant with DCGM, or -r, serves them)"
                    ),
                },
            }
            serve(
                config_with_supported(&mut config, &source)?,
                Arc::new(source),
                hup,
                log_write_errors,
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
            if config.args.list_devices {
                return list_devices(&source);
            }
            serve(
                config_with_supported(&mut config, &source)?,
                Arc::new(source),
                hup,
                log_write_errors,
            )
            .await
        }
        None => {
            let source = sim_source(&config)?;
            if config.args.list_devices {
                return list_devices(&source);
            }
            serve(
                config_with_supported(&mut config, &source)?,
                Arc::new(source),
                hup,
                log_write_errors,
            )
            .await
        }
    }
}

/// Pod UIDs and labels from the Kubernetes API server (no runtime socket, or
/// `--pod-metadata-source api`).
async fn start_pod_watch<S: GpuSource>(
    config: &Config,
    metrics: &ExporterMetrics,
    essential: &mut Essential,
    shutdown: &CancellationToken,
    sampler: Sampler<S>,
) -> Result<Sampler<S>> {
    let timeout = Duration::from_millis(config.args.kube_api_timeout);
    let client = match KubeClient::connect(timeout).await {
        Ok(c) => c,
        // Asked for by name: configuration, fatal.
        Err(e) if config.args.pod_metadata_source == PodMetadataSource::Api => {
            return Err(e).context("--pod-metadata-source api");
        }
        // Chosen because no runtime socket is mounted: the exporter runs without pod UIDs and
        // labels, and says why.
        Err(e) => {
            tracing::warn!(
                error = %gpu_exporter::error_chain(&e),
                socket = %config.runtime_socket_path().display(),
                "pod UIDs and labels are off: no container runtime socket, and no Kubernetes API configuration"
            );
            metrics.kube_api.enable();
            metrics.kube_api.record_failure(e.reason());
            return Ok(sampler);
        }
    };
    let node = config.args.node_name.clone().filter(|n| !n.is_empty());
    if node.is_none() {
        tracing::warn!("NODE_NAME is not set: watching the pods of every node for their labels and UIDs (set NODE_NAME from spec.nodeName to watch this node's only)");
    }
    tracing::info!(
        server = %client.url,
        node = node.as_deref().unwrap_or("(all)"),
        socket = %config.runtime_socket_path().display(),
        pod_uid = config.args.kubernetes_enable_pod_uid,
        pod_labels = config.args.kubernetes_enable_pod_labels,
        "pod UIDs and labels from the Kubernetes API server (list and watch of this node's pods; no container runtime socket is used)"
    );
    let (dir_tx, dir_rx) = watch::channel(Arc::new(PodDirectory::default()));
    let watcher = PodWatcher::new(
        client,
        dir_tx,
        Arc::clone(&metrics.kube_api),
        PodWatchOptions {
            node,
            timeout,
            ttl: Duration::from_millis(config.args.kube_api_ttl),
            labels: LabelOptions {
                enabled: config.args.kubernetes_enable_pod_labels,
                allowlist: config.label_allowlist.clone(),
            },
        },
    );
    // Nothing to wake: the watch follows the pods as they change.
    let sampler = sampler
        .with_directory(dir_rx, Arc::new(tokio::sync::Notify::new()))
        .with_first_answer("kube_api", watcher.answered(), timeout);
    essential.spawn("Kubernetes API pod watch", watcher.run(shutdown.clone()));
    Ok(sampler)
}

fn config_with_supported(config: &mut Config, source: &impl GpuSource) -> Result<Config> {
    for m in config.retain_supported(|f| source.supports(f)) {
        tracing::warn!(
            "{}:{}: skipping {}: the {} backend cannot read it",
            config.catalog_origin,
            m.line,
            m.name,
            source.name()
        );
    }
    if config.catalog.metrics.is_empty() {
        return Err(gpu_exporter::catalog::CatalogError::NoneSupported {
            origin: config.catalog_origin.clone(),
            backend: source.name().to_owned(),
        })
        .context("--collectors");
    }
    Ok(config.clone())
}

async fn serve<S: GpuSource>(
    config: Config,
    source: Arc<S>,
    hup: Hangup,
    log_write_errors: Arc<AtomicU64>,
) -> Result<()> {
    // A selection that matches none of the GPUs found is a mistake: refuse it, as dcgm-exporter
    // does. (If NVML is not up yet, the sampler says so on /ready once it finds the GPUs.)
    if let Ok(devices) = source.devices() {
        if let Some(why) = config.selection.selects_nothing(&devices) {
            anyhow::bail!("{why}");
        }
    }
    let shutdown = CancellationToken::new();
    let metrics = ExporterMetrics::new(log_write_errors, |r| source.register_metrics(r));
    let mut essential = Essential::new();
    let web = match &config.args.web_config_file {
        Some(p) => Some(Arc::new(
            WebSecurity::load(
                p,
                gpu_exporter::web::DEFAULT_RECHECK,
                Arc::clone(&metrics.web),
            )
            .context("--web-config-file")?,
        )),
        None => None,
    };
    let (catalog_tx, catalog_rx) = watch::channel(Arc::new(config.catalog.clone()));
    let (reload_tx, reload_rx) = tokio::sync::mpsc::channel(1);
    essential.spawn(
        "SIGHUP listener",
        gpu_exporter::reload::forward_sighup(hup, reload_tx),
    );
    match &config.catalog_path {
        Some(path) => {
            let initial = gpu_exporter::catalog::read(path).unwrap_or_default();
            let s = Arc::clone(&source);
            let reloader = CatalogReloader::new(
                path.clone(),
                initial.as_bytes(),
                move |f| s.supports(f),
                source.name(),
            );
            essential.spawn(
                "metrics CSV reloader",
                reloader.run(
                    catalog_tx,
                    reload_rx,
                    CSV_POLL,
                    Arc::clone(&metrics.reload),
                    shutdown.clone(),
                ),
            );
        }
        None => {
            let configmap = config.configmap.clone();
            essential.spawn("SIGHUP handler", async move {
                let mut rx = reload_rx;
                while rx.recv().await.is_some() {
                    match &configmap {
                        Some(cm) => tracing::warn!("SIGHUP: the metrics CSV was read from ConfigMap {cm} at startup and is not reloaded; restart the exporter to apply a change"),
                        None => tracing::warn!("SIGHUP: the metrics CSV is the built-in copy; pass --collectors FILE to reload one"),
                    }
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
        build: config.build_options(),
    };
    let mut sampler = Sampler::new(source, catalog_rx, pods_rx, opts, metrics.sampler());
    if config.args.enable_exporter_metrics {
        sampler = sampler.with_exporter_metrics();
    }
    // The devices found, for the pod refresher (kubelet device ids) and the HPC watcher (which
    // mapping files to read).
    let (inventory_tx, inventory_rx) = watch::channel(Arc::new(Vec::new()));
    if config.args.kubernetes || config.args.hpc_job_mapping_dir.is_some() {
        sampler = sampler.with_inventory(inventory_tx);
    }
    if config.args.kubernetes {
        let inventory_rx = inventory_rx.clone();
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
                enable_dra: config.args.kubernetes_enable_dra,
            },
        };
        tracing::info!(
            socket = %socket.display(),
            refresh_ms = config.args.pod_resources_refresh,
            ttl_ms = config.args.pod_resources_ttl,
            dra = config.args.kubernetes_enable_dra,
            "pod attribution from the kubelet pod-resources API"
        );
        let refresher = Refresher::new(
            kubelet,
            inventory_rx,
            pods_tx,
            Arc::clone(&metrics.pod_resources),
            refresher_opts,
        );
        sampler = sampler.with_first_answer("kubelet", refresher.answered(), timeout);
        essential.spawn(
            "kubelet pod-resources refresher",
            refresher.run(shutdown.clone()),
        );
    }
    match config.pod_metadata(config.runtime_socket_path().exists()) {
        Some(PodMetadataSource::Cri) | Some(PodMetadataSource::Auto) => {
            let endpoint = &config.args.container_runtime_endpoint;
            let runtime = CriClient::new(endpoint, Duration::from_millis(config.args.cri_timeout))
                .context("--container-runtime-endpoint")?;
            let (dir_tx, dir_rx) = watch::channel(Arc::new(PodDirectory::default()));
            let cri = CriRefresher::new(
                runtime,
                dir_tx,
                Arc::clone(&metrics.cri),
                CriOptions {
                    refresh: Duration::from_millis(config.args.cri_refresh),
                    ttl: Duration::from_millis(config.args.cri_ttl),
                    labels: LabelOptions {
                        enabled: config.args.kubernetes_enable_pod_labels,
                        allowlist: config.label_allowlist.clone(),
                    },
                },
            );
            tracing::info!(
                endpoint = %endpoint,
                refresh_ms = config.args.cri_refresh,
                ttl_ms = config.args.cri_ttl,
                pod_uid = config.args.kubernetes_enable_pod_uid,
                pod_labels = config.args.kubernetes_enable_pod_labels,
                "pod metadata from the container runtime (CRI)"
            );
            sampler = sampler
                .with_directory(dir_rx, cri.waker())
                .with_first_answer(
                    "cri",
                    cri.answered(),
                    Duration::from_millis(config.args.cri_timeout),
                );
            essential.spawn("container runtime refresher", cri.run(shutdown.clone()));
        }
        Some(PodMetadataSource::Api) => {
            sampler =
                start_pod_watch(&config, &metrics, &mut essential, &shutdown, sampler).await?;
        }
        None => {}
    }
    if config.args.kubernetes && !config.args.no_accounting {
        // Accounts kept this long after they last grew (a pod long gone).
        const RETENTION: Duration = Duration::from_secs(15 * 60);
        let build = config.build_options();
        metrics
            .accounting
            .enable(gpu_exporter::accounting::AccountingOptions {
                idle_mw: config
                    .args
                    .accounting_idle_power_watts
                    .map(|w| u64::from(w) * 1000),
                processes: config.process_usage,
                retention: RETENTION,
                hostname: (build.hostname_label, build.hostname),
                publish_every: Duration::from_millis(config.args.accounting_publish_interval),
            });
        tracing::info!(
            idle_power_watts = ?config.args.accounting_idle_power_watts,
            per_process = config.process_usage,
            publish_interval_ms = config.args.accounting_publish_interval,
            "accounting: energy and GPU time per container (gpu_exporter_container_*_total)"
        );
    }
    if config.process_usage {
        let root = ProcRoot::new(&config.args.path_procfs);
        if !root.root().is_dir() {
            tracing::warn!(
                path = %root.root().display(),
                "--path.procfs is not a directory; GPU processes will not be attributed to containers until it is (mount the host's /proc there)"
            );
        }
        tracing::info!(
            procfs = %root.root().display(),
            virtual_gpus = config.args.kubernetes_virtual_gpus,
            container_labels = config.container_labels,
            "per-process GPU usage per container"
        );
        sampler = sampler.with_process_usage(root);
    }
    if let Some(dir) = &config.args.hpc_job_mapping_dir {
        let (hpc_tx, hpc_rx) = watch::channel(Arc::new(HpcJobs::default()));
        sampler = sampler.with_hpc_jobs(hpc_rx);
        let every = config.interval.clamp(HPC_POLL_MIN, HPC_POLL_MAX);
        tracing::info!(
            dir = %dir.display(),
            poll_ms = every.as_millis() as u64,
            "HPC job labels from --hpc-job-mapping-dir"
        );
        let watcher = HpcWatcher::new(
            dir.clone(),
            Arc::clone(&metrics.hpc_jobs),
            inventory_rx.clone(),
        );
        // Reading a local directory has no call timeout: one poll period bounds the wait.
        sampler = sampler.with_first_answer("hpc", watcher.answered(), every);
        essential.spawn(
            "HPC job mapping watcher",
            watcher.run(hpc_tx, every, shutdown.clone()),
        );
    }
    essential.spawn("sampler", sampler.run(pub_tx, shutdown.clone()));

    let limits = http_limits(&config)?;
    let listener = if config.args.web_systemd_socket {
        http::listen::from_systemd()?
    } else {
        http::listen::bind(config.listen_on)
            .with_context(|| format!("--address {}", config.args.address))?
    };
    tracing::info!(
        tls = web.as_ref().is_some_and(|w| w.tls_enabled()),
        address = %listener.local_addr().map_or_else(|_| config.listen.to_string(), |a| a.to_string()),
        metrics = config.catalog.metrics.len(),
        interval_ms = config.interval.as_millis() as u64,
        collectors = %config.catalog_origin,
        max_connections = limits.max_connections,
        max_active_connections = limits.max_active_connections,
        "gpu-exporter listening"
    );
    let router = http::app_with(
        AppState {
            published: pub_rx,
            interval: config.interval,
            metrics: Arc::clone(&metrics.http),
        },
        http::HttpOptions {
            max_concurrent_scrapes: config.args.max_concurrent_scrapes as usize,
            health_require_gpus: config.args.health_require_gpus,
        },
    );
    let stop = shutdown.clone();
    essential.spawn("SIGTERM listener", async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        stop.cancel();
        // Shutting down is not a death: stay until the process ends.
        std::future::pending::<()>().await;
    });
    let stopped = shutdown.clone();
    let serving = http::serve_with(listener, router, limits, web, metrics.http, async move {
        stopped.cancelled().await;
    });
    // An essential task that stops while the exporter runs (a panic, an unexpected return)
    // ends the process with an error, so that Kubernetes restarts it: serving stale samples
    // or ignoring SIGTERM for good would be worse.
    let watchdog = async {
        loop {
            let died = essential.first_stopped().await;
            if !shutdown.is_cancelled() {
                return died;
            }
        }
    };
    tokio::select! {
        served = serving => served.context("serving HTTP")?,
        died = watchdog => {
            shutdown.cancel();
            return Err(anyhow::Error::new(died))
                .context("an essential task stopped; exiting so that the exporter is restarted");
        }
    }
    shutdown.cancel();
    Ok(())
}

/// The HTTP limits from the flags, the soft file descriptor limit raised towards the hard one
/// first (as Go programs do). An explicit limit the descriptor limit cannot hold is a startup
/// error.
fn http_limits(config: &Config) -> Result<http::Limits> {
    let flags = http::limits::LimitFlags {
        max_connections: config.args.http_max_connections,
        max_active_connections: config.args.http_max_active_connections,
        read_timeout: config.args.web_read_timeout,
        write_timeout: config.args.web_write_timeout,
    };
    match http::limits::raise_fd_limit_for(flags.wanted_connections()) {
        Ok((before, after)) if before != after => tracing::info!(
            before = ?before,
            after = ?after,
            "raised the soft file descriptor limit"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!("cannot raise the soft file descriptor limit: {e}"),
    }
    Ok(http::Limits::from_flags(&flags, http::limits::fd_limit())?)
}
