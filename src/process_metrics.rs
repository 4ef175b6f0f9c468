//! The standard `process_*` series of the exporter itself (`--enable-exporter-metrics`), as the
//! Prometheus client libraries name them, read from `/proc/self` at each sample by the sampler,
//! on the blocking thread that reads the GPUs (never by a scrape, on the async workers).
//!
//! Parsing is pure ([`render`] over the text of the proc files) so it is tested on fixed
//! inputs; [`read`] does the I/O. A file that cannot be read drops its series, not the scrape.

use std::fmt::Write;

/// What the proc files say, as text.
#[derive(Debug, Default, Clone)]
pub struct ProcTexts {
    /// `/proc/self/stat`.
    pub stat: Option<String>,
    /// `/proc/stat` (for `btime`).
    pub system_stat: Option<String>,
    /// `/proc/self/limits`.
    pub limits: Option<String>,
    /// Entries in `/proc/self/fd`.
    pub open_fds: Option<u64>,
}

/// System constants the values are scaled by.
#[derive(Debug, Clone, Copy)]
pub struct Units {
    /// Clock ticks per second (`sysconf(_SC_CLK_TCK)`).
    pub ticks_per_second: u64,
    /// Bytes per page.
    pub page_size: u64,
}

impl Units {
    /// This system's.
    pub fn system() -> Units {
        Units {
            ticks_per_second: rustix::param::clock_ticks_per_second(),
            page_size: rustix::param::page_size() as u64,
        }
    }
}

/// Reads the proc files of this process.
pub fn read() -> ProcTexts {
    ProcTexts {
        stat: std::fs::read_to_string("/proc/self/stat").ok(),
        system_stat: std::fs::read_to_string("/proc/stat").ok(),
        limits: std::fs::read_to_string("/proc/self/limits").ok(),
        open_fds: std::fs::read_dir("/proc/self/fd")
            .ok()
            .map(|d| d.count() as u64),
    }
}

/// The fields of `/proc/PID/stat` after the command name (which may hold spaces and
/// parentheses): index 0 is field 3 (`state`).
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let after = &stat[stat.rfind(')')? + 1..];
    Some(after.split_whitespace().collect())
}

fn series(out: &mut String, name: &str, kind: &str, help: &str, value: f64) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    let _ = writeln!(out, "{name} {value}");
}

/// The exposition text of the `process_*` series the inputs allow.
pub fn render(p: &ProcTexts, u: Units) -> String {
    let mut out = String::with_capacity(1024);
    let fields = p.stat.as_deref().and_then(stat_fields);
    let field = |n: usize| -> Option<f64> {
        // Field n (1-based, as proc(5) numbers them) is index n - 3.
        fields.as_ref()?.get(n - 3)?.parse::<f64>().ok()
    };
    let ticks = u.ticks_per_second.max(1) as f64;
    if let (Some(utime), Some(stime)) = (field(14), field(15)) {
        series(
            &mut out,
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            (utime + stime) / ticks,
        );
    }
    if let Some(vsize) = field(23) {
        series(
            &mut out,
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            vsize,
        );
    }
    if let Some(rss) = field(24) {
        series(
            &mut out,
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            rss * u.page_size as f64,
        );
    }
    if let Some(n) = p.open_fds {
        series(
            &mut out,
            "process_open_fds",
            "gauge",
            "Number of open file descriptors.",
            n as f64,
        );
    }
    let max_fds = p.limits.as_deref().and_then(|l| {
        l.lines()
            .find(|l| l.starts_with("Max open files"))
            .and_then(|l| l["Max open files".len()..].split_whitespace().next())
            .and_then(|soft| soft.parse::<f64>().ok())
    });
    if let Some(n) = max_fds {
        series(
            &mut out,
            "process_max_fds",
            "gauge",
            "Maximum number of open file descriptors.",
            n,
        );
    }
    let boot = p.system_stat.as_deref().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("btime "))
            .and_then(|v| v.trim().parse::<f64>().ok())
    });
    if let (Some(boot), Some(start_ticks)) = (boot, field(22)) {
        series(
            &mut out,
            "process_start_time_seconds",
            "gauge",
            "Start time of the process since unix epoch in seconds.",
            boot + start_ticks / ticks,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (gpu exp (x)) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 4 0 12345 104857600 2560 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0";

    #[test]
    fn renders_the_standard_series_from_proc_text() {
        let p = ProcTexts {
            stat: Some(STAT.to_owned()),
            system_stat: Some("cpu  1 2 3\nbtime 1700000000\nprocesses 9\n".to_owned()),
            limits: Some("Limit                     Soft Limit           Hard Limit           Units\nMax open files            1024                 1048576              files\n".to_owned()),
            open_fds: Some(12),
        };
        let text = render(
            &p,
            Units {
                ticks_per_second: 100,
                page_size: 4096,
            },
        );
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name} ")))
                .unwrap_or_else(|| panic!("{name} missing in {text}"))
                .to_owned()
        };
        assert_eq!(value("process_cpu_seconds_total"), "3");
        assert_eq!(value("process_virtual_memory_bytes"), "104857600");
        assert_eq!(value("process_resident_memory_bytes"), "10485760");
        assert_eq!(value("process_open_fds"), "12");
        assert_eq!(value("process_max_fds"), "1024");
        assert_eq!(value("process_start_time_seconds"), "1700000123.45");
        assert!(text.contains("# TYPE process_cpu_seconds_total counter\n"));
    }

    #[test]
    fn unreadable_files_drop_their_series_only() {
        let text = render(
            &ProcTexts {
                open_fds: Some(3),
                ..ProcTexts::default()
            },
            Units::system(),
        );
        assert_eq!(
            text.lines()
                .filter(|l| !l.starts_with('#'))
                .collect::<Vec<_>>(),
            ["process_open_fds 3"]
        );
    }

    #[test]
    fn this_process_has_every_series() {
        let text = render(&read(), Units::system());
        for name in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_open_fds",
            "process_max_fds",
            "process_start_time_seconds",
        ] {
            assert!(
                text.contains(&format!("\n{name} ")),
                "{name} missing: {text}"
            );
        }
    }
}
