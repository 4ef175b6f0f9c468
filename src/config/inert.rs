//! dcgm-exporter flags that mean nothing here (they set up DCGM's embedded hostengine, its watches
//! or its entities, which gpu-exporter's DCGM source, remote (`-r`) or embedded, does not use): accepted, one warning
//! line each.

use super::Args;

/// dcgm-exporter flags that mean nothing here: (Args field, why). Each one given (by flag,
/// environment or a non-default value) is reported once.
/// Why DCGM watch retention settings have no effect; shared with the config file's notices.
pub(super) const DCGM_WATCHES_FIXED: &str = "DCGM's field watches, made only for the DCGM_FI_PROF_* fields NVML cannot read (-r, or DCGM embedded), sample once per interval and keep the last 2 samples, all the exporter reads; every other field is read from NVML each interval";

const INERT: &[(&str, &str)] = &[
    (
        "cpu_devices",
        "gpu-exporter exports no CPU entities (its DCGM source, -r or embedded, reads GPU profiling fields only)",
    ),
    (
        "fake_gpus",
        "GPUs come from NVML, so DCGM's fake GPUs are never exported (DCGM, -r or embedded, only adds profiling fields to NVML's GPUs); --backend sim runs a simulated fleet",
    ),
    (
        "dump_enabled",
        "gpu-exporter writes no debug dumps; use --debug logs and /metrics",
    ),
    ("dump_directory", "gpu-exporter writes no debug dumps"),
    ("dump_retention", "gpu-exporter writes no debug dumps"),
    ("dump_compression", "gpu-exporter writes no debug dumps"),
    (
        "watch_max_keep_age",
        DCGM_WATCHES_FIXED,
    ),
    (
        "watch_max_keep_samples",
        DCGM_WATCHES_FIXED,
    ),
    (
        "enable_gpu_bind_unbind_watch",
        "GPUs are rediscovered through NVML every minute",
    ),
    (
        "gpu_bind_unbind_poll_interval",
        "GPUs are rediscovered through NVML every minute",
    ),
    ("enable_pprof", "there is no Go runtime to profile"),
];

/// One line for each inert flag given.
pub(super) fn notices(args: &Args) -> Vec<String> {
    let given = |id: &str| {
        args.explicit.contains(id)
            || match id {
                "cpu_devices" => args.cpu_devices.is_some(),
                "fake_gpus" => args.fake_gpus,
                "dump_enabled" => args.dump_enabled,
                "dump_directory" => args.dump_directory.is_some(),
                "dump_retention" => args.dump_retention.is_some(),
                "dump_compression" => args.dump_compression.is_some(),
                "watch_max_keep_age" => args.watch_max_keep_age.is_some(),
                "watch_max_keep_samples" => args.watch_max_keep_samples.is_some(),
                "enable_gpu_bind_unbind_watch" => args.enable_gpu_bind_unbind_watch,
                "gpu_bind_unbind_poll_interval" => args.gpu_bind_unbind_poll_interval.is_some(),
                "enable_pprof" => args.enable_pprof,
                _ => false,
            }
    };
    let cmd = <Args as clap::CommandFactory>::command();
    INERT
        .iter()
        .filter(|(id, _)| given(id))
        .map(|(id, why)| {
            let arg = cmd.get_arguments().find(|a| a.get_id() == *id);
            let mut name = String::new();
            if let Some(s) = arg.and_then(clap::Arg::get_short) {
                name.push_str(&format!("-{s}/"));
            }
            name.push_str(&format!("--{}", id.replace('_', "-")));
            if let Some(e) = arg.and_then(clap::Arg::get_env) {
                name.push_str(&format!(" ({})", e.to_string_lossy()));
            }
            format!("{name} has no effect: {why}")
        })
        .collect()
}
