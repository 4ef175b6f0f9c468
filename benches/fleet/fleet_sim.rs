//! fleet-sim: many simulated gpu-exporter nodes in one process, for the fleet benchmark and its CI
//! version (`benches/fleet/`, see its README).
//!
//! Each node is the exporter's own pipeline, composed as `main.rs` composes it: a
//! [`SimulatedSource`] (its own profile, seed and scenario), a [`Sampler`] publishing a rendered
//! body every interval, a pod-resources [`Refresher`] mapping a kubelet's `List` reply to pod
//! labels, and the exporter's HTTP server ([`http::serve_with`]) on its own loopback address
//! (127.1.0.1, 127.1.0.2, ...), so Prometheus scrapes N real targets with N distinct `instance`s.
//! What is shared is the process: one tokio runtime with two workers, as one exporter has.
//!
//! The only stand-in is the kubelet: each node's `List` reply is built in memory from its devices
//! (whole GPUs, MIG instances with mixed-strategy resource names, time-sliced replicas
//! `GPU-…::N`) instead of coming over a unix socket, so 1,000 nodes do not need 1,000 gRPC
//! servers. The reply goes through the same mapping code as the kubelet's.
//!
//! When every node listens it writes a Prometheus file_sd JSON file (one target per node with
//! `cluster` and `node` labels) and prints `fleet-sim: N nodes listening; targets in PATH`.
//! It exits after `--duration-s` (bounded runs), or on SIGTERM/SIGINT.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use gpu_exporter::config::{Args as ExporterArgs, Config};
use gpu_exporter::gpu::sim::scenario;
use gpu_exporter::gpu::sim::SimulatedSource;
use gpu_exporter::gpu::{Device, GpuSource};
use gpu_exporter::http::{self, AppState, HttpMetrics};
use gpu_exporter::pods::mapping::{attribution_from, MappingOptions};
use gpu_exporter::pods::proto::{
    ContainerDevices, ContainerResources, ListPodResourcesResponse, PodResources,
};
use gpu_exporter::pods::refresher::{PodResourcesMetrics, Refresher, RefresherOptions};
use gpu_exporter::pods::usage::ProcessMetrics;
use gpu_exporter::pods::{AttributionError, PodResolver};
use gpu_exporter::reload::ReloadMetrics;
use gpu_exporter::sampler::{
    AttributionMetrics, SampleMetrics, Sampler, SamplerMetrics, SamplerOptions,
};
use gpu_exporter::self_metrics::Registry;
use gpu_exporter::shutdown_signal;

/// Command line.
#[derive(Debug, Parser)]
#[command(
    name = "fleet-sim",
    about = "Many simulated gpu-exporter nodes in one process (fleet benchmark)"
)]
struct Args {
    /// Number of simulated nodes.
    #[arg(long, default_value_t = 1000)]
    nodes: u32,
    /// Sampling interval of every node, in milliseconds (15000 = the scrape interval).
    #[arg(long, default_value_t = 15_000)]
    interval_ms: u64,
    /// Address of the first node; node i listens on this address + i (keep it in 127.0.0.0/8).
    #[arg(long, default_value = "127.1.0.1")]
    first_address: Ipv4Addr,
    /// Port every node listens on; 0 picks a free port per node.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Number of clusters the nodes are split into (`cluster` target label fleet-a, fleet-b, ...).
    #[arg(long, default_value_t = 2)]
    clusters: u32,
    /// Prometheus file_sd JSON file to write once every node listens.
    #[arg(long)]
    targets: PathBuf,
    /// Exit after this many seconds (0: run until SIGTERM/SIGINT).
    #[arg(long, default_value_t = 0)]
    duration_s: u64,
    /// Metrics CSV (default: the exporter's built-in default-counters.csv).
    #[arg(long)]
    collectors: Option<PathBuf>,
}

/// What a node is: its simulated profile and who holds its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// 8xH100-SXM; GPUs 0-5 held by busy training pods, GPU 6 by an idle notebook, GPU 7 free.
    Whole,
    /// 8xH100-SXM time-sliced: every GPU shared by four pods (replicas `::0`..`::3`).
    Shared,
    /// 8xA100-80GB with seven 1g.10gb MIG instances per GPU, each held by a pod; GPU 7's are idle.
    Mig,
}

/// The mix, per ten nodes: seven whole-GPU nodes, two time-sliced, one MIG.
fn kind_of(i: u32) -> Kind {
    match i % 10 {
        7 | 8 => Kind::Shared,
        9 => Kind::Mig,
        _ => Kind::Whole,
    }
}

/// The faults of a fleet: nodes 4, 14, 24, ... of every hundred (1-based names node-0004, ...)
/// each get one, so every hardware alert has something to fire on at any fleet size >= 70.
fn fault(i: u32) -> Option<&'static str> {
    Some(match i % 100 {
        3 => "gpu = 3\naction = \"fall-off-bus\"",
        13 => "gpu = 2\naction = \"ecc-dbe\"\ncount = 2",
        23 => "gpu = 6\naction = \"xid\"\nxid = 119",
        33 => "gpu = 5\naction = \"thermal-throttle\"\ntemperature = 95\nduration = \"24h\"",
        43 => "gpu = 0\naction = \"pcie-replays\"\ncount = 5000",
        53 => "gpu = 1\naction = \"nvlink-errors\"\ncount = 5000",
        69 => "gpu = 3\naction = \"row-remap-failure\"",
        _ => return None,
    })
}

impl Kind {
    fn profile(self) -> &'static str {
        match self {
            Kind::Whole | Kind::Shared => "8xH100-SXM",
            Kind::Mig => "8xA100-80GB-7xMIG",
        }
    }

    /// Scenario: the utilization the pods drive (idle holders at 0 %) and, on one node in a
    /// hundred, a hardware fault 30 s (simulated) in, as scenario TOML.
    fn scenario(self, i: u32) -> String {
        let mut s = String::new();
        if let Some(fault) = fault(i) {
            let _ = writeln!(s, "[[event]]\nat = \"30s\"\n{fault}\n");
        }
        for gpu in 0..8u32 {
            let util = match (self, gpu) {
                (Kind::Whole, 7) => continue, // unallocated: the simulator's own pattern
                (Kind::Whole, 6) | (Kind::Mig, 7) => 0,
                // Busy holders: 40-95 %, spread over nodes and GPUs.
                _ => 40 + (i * 7 + gpu * 13) % 56,
            };
            let _ = writeln!(
                s,
                "[[event]]\nat = \"0s\"\ngpu = {gpu}\naction = \"utilization\"\npattern = \"constant\"\nvalue = {util}\n"
            );
        }
        s
    }

    /// The kubelet's `List` reply for this node's devices.
    fn pods(self, node: &str, devices: &[Device]) -> ListPodResourcesResponse {
        let mut pods = Vec::new();
        let mut add = |namespace: &str, pod: String, resource: &str, id: String| {
            pods.push(PodResources {
                name: pod,
                namespace: namespace.to_owned(),
                containers: vec![ContainerResources {
                    name: "main".to_owned(),
                    devices: vec![ContainerDevices {
                        resource_name: resource.to_owned(),
                        device_ids: vec![id],
                        topology: None,
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            });
        };
        for d in devices {
            let g = d.identity.index;
            let uuid = &d.identity.uuid;
            match self {
                Kind::Whole if g < 6 => {
                    add(
                        "ml",
                        format!("train-{node}-{g}"),
                        "nvidia.com/gpu",
                        uuid.clone(),
                    );
                }
                Kind::Whole if g == 6 => {
                    add(
                        "dev",
                        format!("notebook-{node}"),
                        "nvidia.com/gpu",
                        uuid.clone(),
                    );
                }
                Kind::Whole => {}
                Kind::Shared => {
                    for r in 0..4 {
                        add(
                            "infer",
                            format!("embed-{node}-{g}-{r}"),
                            "nvidia.com/gpu",
                            format!("{uuid}::{r}"),
                        );
                    }
                }
                Kind::Mig => {
                    for inst in &d.instances {
                        add(
                            "batch",
                            format!("etl-{node}-{g}-{}", inst.gi_id),
                            &format!("nvidia.com/mig-{}", inst.profile),
                            inst.uuid.clone(),
                        );
                    }
                }
            }
        }
        ListPodResourcesResponse {
            pod_resources: pods,
        }
    }
}

/// An in-memory kubelet: always answers `List` with the same reply.
#[derive(Debug)]
struct StaticKubelet {
    node: String,
    reply: ListPodResourcesResponse,
}

impl PodResolver for StaticKubelet {
    fn origin(&self) -> String {
        format!("in-memory kubelet of {}", self.node)
    }

    async fn list(&self) -> Result<ListPodResourcesResponse, AttributionError> {
        Ok(self.reply.clone())
    }
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("GPU_EXPORTER_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let args = Args::parse();
    anyhow::ensure!(args.nodes > 0, "--nodes must be at least 1");
    anyhow::ensure!(
        args.clusters > 0 && args.clusters <= 26,
        "--clusters must be 1..=26"
    );
    anyhow::ensure!(args.interval_ms > 0, "--interval-ms must be positive");
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(8)
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(run(args))
}

/// One node's exporter configuration, resolved the way the binary resolves its flags.
fn node_config(args: &Args, hostname: &str) -> Result<Config> {
    let mut argv = vec![
        "gpu-exporter".to_owned(),
        "--backend".to_owned(),
        "sim".to_owned(),
        "-c".to_owned(),
        args.interval_ms.to_string(),
        "--node-name".to_owned(),
        hostname.to_owned(),
    ];
    if let Some(c) = &args.collectors {
        argv.push("--collectors".to_owned());
        argv.push(c.display().to_string());
    }
    let parsed = ExporterArgs::try_parse_from(argv).context("exporter flags")?;
    Config::resolve(parsed).context("exporter configuration")
}

async fn run(args: Args) -> Result<()> {
    // Every node holds a listening socket and its scraper's connection.
    if let Err(e) = http::conn::raise_fd_limit() {
        eprintln!("fleet-sim: cannot raise the file descriptor limit: {e}");
    }
    let shutdown = CancellationToken::new();
    let interval = Duration::from_millis(args.interval_ms);
    let mut targets = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..args.nodes {
        let hostname = format!("node-{:04}", i + 1);
        let cluster = format!(
            "fleet-{}",
            char::from(b'a' + (i * args.clusters / args.nodes) as u8)
        );
        let kind = kind_of(i);
        let mut config = node_config(&args, &hostname)?;
        let seed = 1000 + u64::from(i);
        let sc = scenario::parse(&kind.scenario(i), &format!("{hostname} scenario"))
            .context("node scenario")?;
        let source = SimulatedSource::new(kind.profile(), seed, interval, sc, &hostname)
            .with_context(|| format!("{hostname}: simulated source"))?;
        config.retain_supported(|f| source.supports(f));
        let devices = source.devices().context("listing simulated devices")?;
        let reply = kind.pods(&hostname, &devices);

        let addr = u32::from(args.first_address)
            .checked_add(i)
            .map(Ipv4Addr::from)
            .filter(|a| a.is_loopback())
            .with_context(|| {
                format!(
                    "--first-address {} + {i} leaves 127.0.0.0/8",
                    args.first_address
                )
            })?;
        let on = http::listen::ListenOn::Address(SocketAddr::from((addr, args.port)));
        let listener = http::listen::bind(on)
            .with_context(|| format!("{hostname}: cannot listen on {addr}:{}", args.port))?;
        let local = listener.local_addr().context("local address")?;
        targets.push(format!(
            "{{\"targets\":[\"{local}\"],\"labels\":{{\"cluster\":\"{cluster}\",\"node\":\"{hostname}\"}}}}"
        ));

        // The families a node's exporter serves in this mode, in main.rs's order.
        let samples = Arc::new(SampleMetrics::default());
        let reload = Arc::new(ReloadMetrics::default());
        let http_metrics = Arc::new(HttpMetrics::default());
        let pod_resources = Arc::new(PodResourcesMetrics::default());
        let processes = Arc::new(ProcessMetrics::default());
        let attribution = Arc::new(AttributionMetrics::default());
        // Accounting is on with -k, as in main.rs (without per-process readings here).
        let accounting = Arc::new(gpu_exporter::accounting::AccountingMetrics::default());
        accounting.enable(gpu_exporter::accounting::AccountingOptions {
            idle_mw: None,
            processes: false,
            retention: Duration::from_secs(15 * 60),
            hostname: ("hostname".to_owned(), hostname.clone()),
            // --accounting-publish-interval's default.
            publish_every: Duration::from_secs(60),
        });
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Arc::clone(&samples)));
        registry.register_collector(Box::new(reload));
        registry.register_collector(Box::new(Arc::clone(&http_metrics)));
        registry.register_collector(Box::new(Arc::clone(&pod_resources)));
        registry.register_collector(Box::new(Arc::clone(&processes)));
        registry.register_collector(Box::new(Arc::clone(&attribution)));
        let metrics = SamplerMetrics {
            samples,
            attribution,
            processes,
            accounting,
            registry: Arc::new(registry),
        };
        let (catalog_tx, catalog_rx) = watch::channel(Arc::new(config.catalog.clone()));
        // The fleet has been running: the pods are known from the first sample on (a freshly
        // started exporter publishes a sample or two without pod labels until the kubelet
        // answers, which at 1,000 simultaneous starts would double the pod-held series).
        let known = attribution_from(&reply, &devices, &MappingOptions::default()).attribution;
        let (pods_tx, pods_rx) = watch::channel(Arc::new(known));
        let (inventory_tx, inventory_rx) = watch::channel(Arc::new(devices.clone()));
        let (pub_tx, pub_rx) = watch::channel(None);
        let opts = SamplerOptions {
            interval,
            rediscover_every: Duration::from_secs(60).max(interval),
            build: config.build_options(),
        };
        let sampler = Sampler::new(Arc::new(source), catalog_rx, pods_rx, opts, metrics)
            .with_inventory(inventory_tx);
        let refresher = Refresher::new(
            StaticKubelet {
                node: hostname.clone(),
                reply,
            },
            inventory_rx,
            pods_tx,
            pod_resources,
            RefresherOptions {
                refresh: Duration::from_secs(30),
                ..RefresherOptions::default()
            },
        );
        // Nodes start their sampling staggered over one interval, as a real fleet's do.
        let delay = interval * i / args.nodes;
        let stop = shutdown.clone();
        tasks.push(tokio::spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(delay) => {}
                () = stop.cancelled() => return,
            }
            tokio::spawn(refresher.run(stop.clone()));
            sampler.run(pub_tx, stop).await;
            // The catalog never changes here; its sender lives as long as the sampler.
            drop(catalog_tx);
        }));
        let router = http::router(AppState {
            published: pub_rx,
            interval,
            metrics: Arc::clone(&http_metrics),
        });
        let stop = shutdown.clone();
        tasks.push(tokio::spawn(async move {
            let served = http::serve_with(
                listener,
                router,
                http::Limits::default(),
                None,
                http_metrics,
                async move {
                    stop.cancelled().await;
                },
            )
            .await;
            if let Err(e) = served {
                eprintln!("fleet-sim: {hostname}: serving: {e}");
            }
        }));
    }
    let json = format!("[\n{}\n]\n", targets.join(",\n"));
    let tmp = args.targets.with_extension("tmp");
    std::fs::write(&tmp, json)
        .and_then(|()| std::fs::rename(&tmp, &args.targets))
        .with_context(|| format!("--targets {}", args.targets.display()))?;
    println!(
        "fleet-sim: {} nodes listening; targets in {}",
        args.nodes,
        args.targets.display()
    );
    std::io::stdout().flush().context("stdout")?;

    let stop = shutdown.clone();
    let limit = args.duration_s;
    tokio::spawn(async move {
        let timer = async {
            if limit == 0 {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(Duration::from_secs(limit)).await;
        };
        tokio::select! {
            () = timer => eprintln!("fleet-sim: --duration-s {limit} reached; stopping"),
            () = shutdown_signal() => eprintln!("fleet-sim: signal; stopping"),
        }
        stop.cancel();
    });
    for t in tasks {
        let _ = t.await;
    }
    Ok(())
}
