//! dcgm-exporter flags that mean nothing without DCGM: accepted, one warning line each.

use super::Args;

/// dcgm-exporter flags that mean nothing here: (Args field, why). Each one given (by flag,
/// environment or a non-default value) is reported once.
const INERT: &[(&str, &str)] = &[
    (
        "cpu_devices",
        "gpu-exporter has no CPU entities (they come from DCGM)",
    ),
    (
        "fake_gpus",
        "there are no DCGM fake GPUs; --backend sim runs a simulated fleet",
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
        "there are no DCGM field watches; NVML is read each interval",
    ),
    (
        "watch_max_keep_samples",
        "there are no DCGM field watches; NVML is read each interval",
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
