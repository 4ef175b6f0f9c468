//! [`Config::resolve`]: from the [`Args`] to the [`Config`]: the `--config-file` applied, the
//! metrics CSV and scenario read, flags checked against each other, and a notice for each flag
//! that has no effect.

use std::path::PathBuf;
use std::time::Duration;

use super::values::{parse_address, parse_devices};
use super::{
    file, inert, Args, Backend, Config, ConfigError, BUILTIN_COUNTERS, DCGM_DEFAULT_COLLECTORS,
};
use crate::catalog::{self, Catalog, CatalogError, Skipped};
use crate::gpu::sim::scenario;
use crate::kubeapi::configmap::ConfigMapRef;
use crate::snapshot::DeviceSelection;

impl Config {
    /// Resolves `args`, reading the CSV and scenario files.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the flag at fault.
    pub fn resolve(args: Args) -> Result<Config, ConfigError> {
        let explicit = args.explicit.clone();
        Self::resolve_args(args).map_err(|e| match e.arg().and_then(|id| explicit.env_var(id)) {
            Some(var) => ConfigError::FromEnv {
                var: var.to_owned(),
                source: Box::new(e),
            },
            None => e,
        })
    }

    fn resolve_args(mut args: Args) -> Result<Config, ConfigError> {
        let mut notices = Vec::new();
        let inline_csv = match args.config_file.clone() {
            Some(path) => file::apply(&mut args, &path, &mut notices).map_err(ConfigError::File)?,
            None => None,
        };
        if let Some(socket) = args
            .container_runtime_socket
            .clone()
            .filter(|s| !s.is_empty())
        {
            if !args.explicit.contains("container_runtime_endpoint") {
                args.container_runtime_endpoint = socket;
            } else if grpc_path(&socket) != grpc_path(&args.container_runtime_endpoint) {
                return Err(ConfigError::RuntimeSocket {
                    socket,
                    endpoint: args.container_runtime_endpoint.clone(),
                });
            }
        }
        if args
            .remote_hostengine_info
            .as_deref()
            .is_some_and(|a| a.trim().is_empty())
        {
            // An empty value (a templated `DCGM_REMOTE_HOSTENGINE_INFO=""`) names no hostengine:
            // DCGM would refuse it (DCGM_ST_BADPARAM) at every retry.
            args.remote_hostengine_info = None;
            notices.push("--remote-hostengine-info / DCGM_REMOTE_HOSTENGINE_INFO is empty: no remote DCGM hostengine is read; as without -r, DCGM runs embedded where its library is present, and NVML alone serves otherwise".to_owned());
        }
        for (value, flag) in [
            (&mut args.web_read_timeout, "--web-read-timeout"),
            (&mut args.web_write_timeout, "--web-write-timeout"),
        ] {
            if value.is_some_and(|d| d.is_zero()) {
                *value = None;
                notices.push(format!("{flag} 0 (no deadline) is not supported: every phase of a connection has a deadline here; using the default"));
            }
        }
        notices.extend(inert::notices(&args));
        let configmap = match args.configmap_data.as_deref() {
            None | Some("none") => None,
            Some(v) => {
                Some(
                    ConfigMapRef::parse(v).map_err(|reason| ConfigError::ConfigMapData {
                        value: v.to_owned(),
                        reason,
                    })?,
                )
            }
        };
        if args.pod_resources_ttl < args.pod_resources_refresh {
            return Err(ConfigError::PodResourcesTtl {
                ttl: args.pod_resources_ttl,
                refresh: args.pod_resources_refresh,
            });
        }
        if args.cri_ttl < args.cri_refresh {
            return Err(ConfigError::CriTtl {
                ttl: args.cri_ttl,
                refresh: args.cri_refresh,
            });
        }
        let label_allowlist = args
            .kubernetes_pod_label_allowlist_regex
            .iter()
            .filter(|p| !p.trim().is_empty())
            .map(|p| {
                regex::Regex::new(p.trim()).map_err(|cause| ConfigError::AllowlistRegex {
                    pattern: p.clone(),
                    cause,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let (catalog, skipped, catalog_origin, catalog_path) = match inline_csv {
            Some((csv, path)) => {
                let origin = format!("{} metrics.fields", path.display());
                let (c, s) = catalog::parse(&csv, &origin).map_err(|e| match e {
                    CatalogError::Invalid { line, defect, .. } => {
                        ConfigError::File(file::FileError::Invalid {
                            path: path.display().to_string(),
                            key: format!("metrics.fields[{}]", line.saturating_sub(1)),
                            reason: defect.to_string(),
                        })
                    }
                    other => ConfigError::Catalog(other),
                })?;
                (c, s, origin, None)
            }
            None => {
                let (c, s, origin) = load_catalog(args.collectors.as_deref())?;
                let path = match &args.collectors {
                    Some(p) => Some(p.clone()),
                    None => Some(PathBuf::from(DCGM_DEFAULT_COLLECTORS)).filter(|p| p.exists()),
                };
                (c, s, origin, path)
            }
        };
        let listen = parse_address(&args.address)?;
        let listen_on = if args.address.starts_with(':') {
            crate::listen_on::ListenOn::AnyAddress(listen.port())
        } else {
            crate::listen_on::ListenOn::Address(listen)
        };
        let selection = parse_devices(&args.devices)?;
        let switches = parse_devices(&args.switch_devices).map_err(|e| match e {
            ConfigError::Devices { value, reason } => ConfigError::SwitchDevices { value, reason },
            other => other,
        })?;
        let scenario = match &args.sim_scenario {
            Some(p) => Some((
                scenario::load(p).map_err(ConfigError::Scenario)?,
                p.display().to_string(),
            )),
            None => None,
        };
        let hostname = match args.node_name.as_deref().filter(|n| !n.is_empty()) {
            Some(n) => n.to_owned(),
            None => system_hostname(),
        };
        if args.remote_hostengine_info.is_some() && args.backend == Backend::Sim {
            notices.push("--remote-hostengine-info / DCGM_REMOTE_HOSTENGINE_INFO has no effect with --backend sim: the simulated fleet reads no DCGM hostengine".to_owned());
        }
        if let Some(level) = args
            .dcgm_log_level
            .as_deref()
            .filter(|l| crate::gpu::dcgm::log_severity(l).is_none())
        {
            notices.push(format!("--dcgm-log-level {level:?} is not one of NONE, FATAL, ERROR, WARN, INFO, DEBUG, VERB: the embedded DCGM hostengine logs at NONE"));
        }
        if (args.enable_dcgm_log || args.dcgm_log_level.is_some())
            && args.remote_hostengine_info.is_some()
        {
            notices.push("--enable-dcgm-log / --dcgm-log-level have no effect with -r: they set the embedded DCGM hostengine's log, and the hostengine of -r logs on its own (nv-hostengine --log-level)".to_owned());
        }
        if switches != DeviceSelection::Flex {
            notices.push(format!(
                "--switch-devices {:?} has no effect: gpu-exporter exports no NVSwitch entities (they need NVIDIA's NSCQ library); GPU NVLink series follow --devices",
                args.switch_devices
            ));
        }
        if args.kubernetes_enable_dra && !args.kubernetes {
            notices.push("--kubernetes-enable-dra has no effect without -k/--kubernetes: DRA allocations are read from the kubelet's pod-resources API".to_owned());
        }
        if args.disable_startup_validate {
            notices.push(
                "--disable-startup-validate has no effect: startup never requires libdcgm.so.4 (a missing library, hostengine or embedded start leaves the DCGM_FI_PROF_* series it would serve absent, and NVML serves the rest)"
                    .to_owned(),
            );
        }
        // dcgm-exporter's --container-labels: outside Kubernetes mode only, and only with a
        // runtime socket to ask.
        let container_labels = args.container_labels && !args.kubernetes;
        if args.container_labels && args.kubernetes {
            notices.push("--container-labels (DCGM_EXPORTER_CONTAINER_LABELS) is ignored in Kubernetes mode (-k): pod, namespace and container labels come from the kubelet".to_owned());
        }
        if container_labels
            && args
                .container_runtime_socket
                .as_deref()
                .is_none_or(|s| s.trim().is_empty())
        {
            return Err(ConfigError::ContainerLabelsSocket);
        }
        let wants_process_usage = args.kubernetes_process_usage || args.kubernetes_virtual_gpus;
        let process_usage = (args.kubernetes && wants_process_usage) || container_labels;
        let cri = (args.kubernetes
            && (process_usage
                || args.kubernetes_enable_pod_uid
                || args.kubernetes_enable_pod_labels))
            || container_labels;
        if !args.kubernetes {
            for (on, flag) in [
                (
                    args.kubernetes_enable_pod_uid,
                    "--kubernetes-enable-pod-uid",
                ),
                (
                    args.kubernetes_enable_pod_labels,
                    "--kubernetes-enable-pod-labels",
                ),
                (args.kubernetes_process_usage, "--kubernetes-process-usage"),
                (args.kubernetes_virtual_gpus, "--kubernetes-virtual-gpus"),
            ] {
                if on {
                    notices.push(format!(
                        "{flag} has no effect without -k/--kubernetes (DCGM_EXPORTER_KUBERNETES)"
                    ));
                }
            }
        }
        if !label_allowlist.is_empty() && !args.kubernetes_enable_pod_labels {
            notices.push("--kubernetes-pod-label-allowlist-regex has no effect without --kubernetes-enable-pod-labels".to_owned());
        }
        Ok(Config {
            configmap,
            label_allowlist,
            process_usage,
            cri,
            container_labels,
            catalog,
            catalog_origin,
            catalog_path,
            skipped,
            listen,
            listen_on,
            interval: Duration::from_millis(args.collect_interval),
            hostname,
            selection,
            scenario,
            notices,
            args,
        })
    }
}

/// The socket path of a CRI endpoint (`unix:///x` or `/x`).
fn grpc_path(endpoint: &str) -> &str {
    endpoint.strip_prefix("unix://").unwrap_or(endpoint)
}

fn load_catalog(
    path: Option<&std::path::Path>,
) -> Result<(Catalog, Vec<Skipped>, String), ConfigError> {
    match path {
        Some(p) => {
            let (c, s) = catalog::load(p).map_err(ConfigError::Catalog)?;
            Ok((c, s, p.display().to_string()))
        }
        None if std::path::Path::new(DCGM_DEFAULT_COLLECTORS).exists() => {
            let p = std::path::Path::new(DCGM_DEFAULT_COLLECTORS);
            let (c, s) = catalog::load(p).map_err(ConfigError::Catalog)?;
            Ok((c, s, DCGM_DEFAULT_COLLECTORS.to_owned()))
        }
        None => {
            let origin = "built-in default-counters.csv";
            let (c, s) = catalog::parse(BUILTIN_COUNTERS, origin).map_err(ConfigError::Catalog)?;
            Ok((c, s, origin.to_owned()))
        }
    }
}

fn system_hostname() -> String {
    ["/proc/sys/kernel/hostname", "/etc/hostname"]
        .iter()
        .find_map(|p| {
            let cap = crate::fsread::Cap(4096);
            crate::fsread::read_text(
                std::path::Path::new(p),
                cap,
                crate::fsread::Symlinks::Follow,
            )
            .ok()
        })
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}
