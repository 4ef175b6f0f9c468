//! The exporter binary against what production throws at it (issue 26): a closed stderr, a
//! SIGHUP during startup, FIFOs, devices, links and oversized files where configuration is
//! read, an empty metrics CSV, a device selection that matches nothing.
//!
//! Each test runs the real binary (`--backend sim`) as a child process and talks to it over
//! HTTP on 127.0.0.1. Waiting is on conditions with bounded deadlines: polling another
//! process's state needs a short pause between looks, never a sleep standing in for an event.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, ChildStderr, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::process::{kill_process, Pid, Signal};

const DEADLINE: Duration = Duration::from_secs(30);
/// The pause between two looks at another process's state.
const POLL: Duration = Duration::from_millis(25);

struct Exporter {
    child: Child,
    addr: SocketAddr,
    /// The log lines after the listening line (while the log is kept).
    log: Arc<Mutex<Vec<String>>>,
}

/// What happens to the exporter's log after its listening line.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Log {
    /// Read and kept in [`Exporter::log`].
    Keep,
    /// The read end of the pipe is closed (a log shipper that exited).
    Close,
}

impl Drop for Exporter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn exporter_command(args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_gpu-exporter"));
    cmd.args([
        "--backend",
        "sim",
        "-a",
        "127.0.0.1:0",
        "--log-format",
        "json",
    ])
    .args(args)
    .env_remove("GPU_EXPORTER_LOG")
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    cmd
}

/// Reads log lines until `pred` matches one (or the log ends); returns the lines read.
fn read_log_until(
    stderr: &mut BufReader<ChildStderr>,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> (Option<serde_json::Value>, Vec<String>) {
    let mut lines = Vec::new();
    let mut line = String::new();
    loop {
        line.clear();
        match stderr.read_line(&mut line) {
            Ok(0) | Err(_) => return (None, lines),
            Ok(_) => {}
        }
        lines.push(line.trim_end().to_owned());
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
            if pred(&v) {
                return (Some(v), lines);
            }
        }
    }
}

fn message(v: &serde_json::Value) -> &str {
    v["fields"]["message"].as_str().unwrap_or("")
}

impl Exporter {
    fn start(args: &[&str], log: Log) -> Exporter {
        let mut child = exporter_command(args).spawn().expect("start gpu-exporter");
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let (listening, lines) =
            read_log_until(&mut stderr, |v| message(v) == "gpu-exporter listening");
        let listening = listening.unwrap_or_else(|| panic!("no listening line: {lines:#?}"));
        let addr = listening["fields"]["address"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        let kept = Arc::new(Mutex::new(Vec::new()));
        match log {
            Log::Close => drop(stderr),
            Log::Keep => {
                let kept = Arc::clone(&kept);
                std::thread::spawn(move || {
                    for line in stderr.lines() {
                        let Ok(line) = line else { break };
                        kept.lock().unwrap().push(line);
                    }
                });
            }
        }
        let e = Exporter {
            child,
            addr,
            log: kept,
        };
        e.wait_until("the first sample", || e.scrape().0 == 200);
        e
    }

    /// Whether a kept log line contains `needle`.
    fn logged(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    fn pid(&self) -> Pid {
        Pid::from_child(&self.child)
    }

    fn scrape_path(&self, path: &str) -> (u16, String) {
        let Ok(mut s) = TcpStream::connect_timeout(&self.addr, Duration::from_secs(5)) else {
            return (0, String::new());
        };
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        if s.write_all(req.as_bytes()).is_err() {
            return (0, String::new());
        }
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        (status, body)
    }

    fn scrape(&self) -> (u16, String) {
        self.scrape_path("/metrics")
    }

    /// Waits until `cond` holds, failing after [`DEADLINE`] or if the exporter exits.
    fn wait_until(&self, what: &str, mut cond: impl FnMut() -> bool) {
        let started = Instant::now();
        while !cond() {
            assert!(
                started.elapsed() < DEADLINE,
                "{what}: not within {DEADLINE:?}"
            );
            // SAFETY-free check that the child still runs: /proc/<pid> exists until it is reaped.
            assert!(
                Path::new(&format!("/proc/{}", self.child.id())).exists(),
                "{what}: the exporter exited"
            );
            std::thread::sleep(POLL);
        }
    }

    /// Sends `signal` and waits for the exit.
    fn stop_with(&mut self, signal: Signal) -> ExitStatus {
        kill_process(self.pid(), signal).expect("signal");
        wait_exit(&mut self.child).expect("the exporter did not exit within the deadline")
    }
}

fn wait_exit(child: &mut Child) -> Option<ExitStatus> {
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if started.elapsed() > DEADLINE {
            return None;
        }
        std::thread::sleep(POLL);
    }
}

fn value(body: &str, series: &str) -> Option<f64> {
    body.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

/// Item 1: a log shipper that restarts closes the read end of the exporter's stderr. Logging
/// must not kill sampling, and SIGTERM must still end the process.
#[test]
fn a_closed_stderr_neither_stops_sampling_nor_blocks_shutdown() {
    // The reader exits after the listening line: every later log write fails with EPIPE.
    let mut e = Exporter::start(&["-c", "100", "--debug"], Log::Close);
    // Something to log: SIGHUP makes the reloader warn (the built-in CSV cannot be reloaded).
    kill_process(e.pid(), Signal::HUP).unwrap();
    let first = value(&e.scrape().1, "gpu_exporter_samples_total").unwrap_or(0.0);
    // Fresh samples keep coming: the sample count grows by several ticks, each scrape a 200.
    let mut lost = None;
    e.wait_until("fresh samples after stderr closed", || {
        let (status, body) = e.scrape();
        assert_eq!(status, 200, "{body}");
        lost = value(&body, "gpu_exporter_log_write_errors_total");
        value(&body, "gpu_exporter_samples_total").is_some_and(|n| n >= first + 5.0)
            && lost.is_some()
    });
    assert!(lost.unwrap() >= 1.0, "the lost log lines are counted");
    assert_eq!(e.scrape_path("/ready").0, 200);
    let status = e.stop_with(Signal::TERM);
    assert!(status.success(), "SIGTERM must end it cleanly: {status:?}");
}

/// Item 9: a SIGHUP during startup, before the reloader exists, must not end the process.
#[test]
fn a_sighup_during_startup_does_not_kill_the_process() {
    // A CSV that repeats its row 3,000 times: startup logs one warning per repeat, far more
    // than the pipe holds. This test reads only the first line, so the exporter is held in
    // its startup (blocked on the full pipe, before it listens) when the SIGHUP arrives.
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("repeats.csv");
    let row = "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\n";
    std::fs::write(&csv, row.repeat(3000)).unwrap();
    let mut child = exporter_command(&["-f", csv.to_str().unwrap()])
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    stderr.read_line(&mut first).unwrap();
    kill_process(Pid::from_child(&child), Signal::HUP).unwrap();
    let (listening, lines) =
        read_log_until(&mut stderr, |v| message(v) == "gpu-exporter listening");
    let status = child.try_wait().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        listening.is_some(),
        "killed by a SIGHUP during startup ({status:?}); log: {first}{:#?}",
        &lines[lines.len().saturating_sub(3)..]
    );
}

fn mkfifo(path: &Path) {
    rustix::fs::mknodat(
        rustix::fs::CWD,
        path,
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o600),
        0,
    )
    .expect("mkfifo");
}

/// Runs the exporter to its exit (it must exit within the deadline); returns the status and log.
fn run_to_exit(args: &[&str]) -> (ExitStatus, String) {
    let mut child = exporter_command(args).spawn().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let status = wait_exit(&mut child);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    let log = reader.join().unwrap();
    (
        status.unwrap_or_else(|| panic!("still running after {DEADLINE:?}; log: {log}")),
        log,
    )
}

const GOOD_CSV: &str =
    "# a comment\nDCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\nDCGM_FI_DEV_GPU_TEMP, gauge, Temperature (in C).\n";

/// Items 6, 7, 9 at startup: each bad metrics CSV stops startup with an error naming the file
/// (and line), without waiting on a FIFO or reading /dev/zero for ever.
#[test]
fn bad_metrics_csvs_stop_startup_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let fifo = d.join("fifo.csv");
    mkfifo(&fifo);
    let empty = d.join("empty.csv");
    std::fs::write(&empty, "").unwrap();
    let comments = d.join("comments.csv");
    std::fs::write(
        &comments,
        "# Format\n# DCGM FIELD, Prometheus metric type, help message\n\n",
    )
    .unwrap();
    let latin1 = d.join("latin1.csv");
    std::fs::write(
        &latin1,
        b"DCGM_FI_DEV_GPU_UTIL, gauge, ok\nDCGM_FI_DEV_GPU_TEMP, gauge, temp\xe9rature\n",
    )
    .unwrap();
    let huge = d.join("huge.csv");
    let row = "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\n";
    std::fs::write(&huge, row.repeat((1 << 20) / row.len() + 1)).unwrap();
    let cases: [(&Path, String); 6] = [
        (
            &fifo,
            format!(
                "metrics CSV {}: is a FIFO (named pipe), not a regular file; refused",
                fifo.display()
            ),
        ),
        (
            Path::new("/dev/zero"),
            "metrics CSV /dev/zero: is a character device, not a regular file; refused".to_owned(),
        ),
        (&empty, format!("{}: lists no metric", empty.display())),
        (
            &comments,
            format!("{}: lists no metric", comments.display()),
        ),
        (
            &latin1,
            format!("metrics CSV {}:2: not UTF-8 text", latin1.display()),
        ),
        (
            &huge,
            format!(
                "metrics CSV {}: larger than 1048576 bytes; refused",
                huge.display()
            ),
        ),
    ];
    for (path, want) in cases {
        let (status, log) = run_to_exit(&["-f", path.to_str().unwrap()]);
        assert!(!status.success(), "{}: started: {log}", path.display());
        assert!(
            log.contains(&want),
            "{}: want {want:?} in {log}",
            path.display()
        );
    }
}

/// Item 9: a UTF-8 byte-order mark (Windows editors) is accepted.
#[test]
fn a_csv_with_a_byte_order_mark_loads() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("bom.csv");
    std::fs::write(&csv, format!("\u{feff}{GOOD_CSV}")).unwrap();
    let e = Exporter::start(&["-f", csv.to_str().unwrap(), "-c", "100"], Log::Keep);
    let body = e.scrape().1;
    assert!(body.contains("\nDCGM_FI_DEV_GPU_UTIL{"), "{body}");
    assert!(body.contains("\nDCGM_FI_DEV_GPU_TEMP{"), "{body}");
}

/// Items 6, 7: the metrics CSV is a ConfigMap mount (links through `..data`). Each bad new
/// version (a FIFO, /dev/zero, an empty file) is rejected on SIGHUP with the previous catalog
/// still serving, and SIGTERM still ends the process.
#[test]
fn bad_csv_reloads_are_rejected_and_sigterm_still_ends_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // counters.csv -> ..data/counters.csv; ..data -> ..v1 (what the kubelet writes).
    let version = |name: &str| {
        let v = d.join(name);
        std::fs::create_dir(&v).unwrap();
        v.join("counters.csv")
    };
    std::fs::write(version("..v1"), GOOD_CSV).unwrap();
    std::os::unix::fs::symlink("..v1", d.join("..data")).unwrap();
    std::os::unix::fs::symlink("..data/counters.csv", d.join("counters.csv")).unwrap();
    let swap_to = |name: &str| {
        let tmp = d.join("..data_tmp");
        std::os::unix::fs::symlink(name, &tmp).unwrap();
        std::fs::rename(&tmp, d.join("..data")).unwrap();
    };
    mkfifo(&version("..fifo"));
    std::os::unix::fs::symlink("/dev/zero", version("..zero")).unwrap();
    std::fs::write(version("..empty"), "").unwrap();

    let csv = d.join("counters.csv");
    let mut e = Exporter::start(&["-f", csv.to_str().unwrap(), "-c", "100"], Log::Keep);
    let rss_before = rss_kib(e.child.id());
    let mut rejected = 0.0;
    for (name, why) in [
        (
            "..fifo",
            "is a FIFO (named pipe), not a regular file; refused",
        ),
        (
            "..zero",
            "is a character device, not a regular file; refused",
        ),
        ("..empty", "lists no metric"),
    ] {
        swap_to(name);
        kill_process(e.pid(), Signal::HUP).unwrap();
        rejected += 1.0;
        e.wait_until(&format!("{name} rejected"), || {
            let body = e.scrape().1;
            value(
                &body,
                "gpu_exporter_config_reloads_total{result=\"failure\"}",
            ) == Some(rejected)
                && e.logged(why)
        });
        let body = e.scrape().1;
        assert_eq!(
            value(&body, "gpu_exporter_config_last_reload_success"),
            Some(0.0)
        );
        assert!(
            body.contains("\nDCGM_FI_DEV_GPU_TEMP{"),
            "the previous catalog serves: {body}"
        );
        assert!(
            e.logged(&csv.display().to_string()),
            "the log names the file"
        );
    }
    // Reading /dev/zero would have grown memory by gigabytes; the cap holds it to 1 MiB.
    let grown = rss_kib(e.child.id()).saturating_sub(rss_before);
    assert!(grown < 16 * 1024, "RSS grew by {grown} KiB");
    // A good version again is accepted.
    std::fs::write(version("..v2"), "DCGM_FI_DEV_GPU_UTIL, gauge, u\n").unwrap();
    swap_to("..v2");
    kill_process(e.pid(), Signal::HUP).unwrap();
    e.wait_until("the good version", || {
        let body = e.scrape().1;
        value(&body, "gpu_exporter_config_last_reload_success") == Some(1.0)
            && !body.contains("\nDCGM_FI_DEV_GPU_TEMP{")
    });
    let status = e.stop_with(Signal::TERM);
    assert!(status.success(), "{status:?}");
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// Item 7: a device selection that matches none of the GPUs found stops startup with a clear
/// error (dcgm-exporter refuses it too), instead of serving no GPU series with /ready 200.
#[test]
fn a_device_selection_that_matches_nothing_stops_startup() {
    for (args, want) in [
        (
            &["-d", "g:99"][..],
            "-d/--devices \"g:99\" selects none of the 8 GPUs (indices 0, 1, 2, 3, 4, 5, 6, 7) and 0 MIG instances found",
        ),
        (
            &["-d", "i"][..],
            "-d/--devices \"i\" selects none of the 8 GPUs (indices 0, 1, 2, 3, 4, 5, 6, 7) and 0 MIG instances found",
        ),
    ] {
        let (status, log) = run_to_exit(args);
        assert!(!status.success(), "{args:?} started: {log}");
        assert!(log.contains(want), "{args:?}: want {want:?} in {log}");
    }
    // A selection that matches something still starts.
    let e = Exporter::start(&["-d", "g:1", "-c", "100"], Log::Keep);
    assert!(e.scrape().1.contains("gpu=\"1\""));
}

/// Item 5: a link in the HPC job mapping directory is not followed (its target's lines never
/// become labels), a FIFO is not opened, and files for GPUs that do not exist are not read.
#[test]
fn the_hpc_directory_publishes_only_regular_files_of_existing_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("tls.key");
    std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkq\n").unwrap();
    let hpc = dir.path().join("hpc");
    std::fs::create_dir(&hpc).unwrap();
    std::os::unix::fs::symlink(&key, hpc.join("0")).unwrap();
    mkfifo(&hpc.join("1"));
    std::fs::write(hpc.join("2"), "job-2\n").unwrap();
    for ghost in 8..208 {
        std::fs::write(hpc.join(ghost.to_string()), "ghost\n").unwrap();
    }
    let e = Exporter::start(
        &["--hpc-job-mapping-dir", hpc.to_str().unwrap(), "-c", "100"],
        Log::Keep,
    );
    let mut body = String::new();
    e.wait_until("the first scan", || {
        body = e.scrape().1;
        body.contains("hpc_job=\"job-2\"")
    });
    assert!(
        !body.contains("PRIVATE KEY") && !body.contains("MIIEvQ"),
        "{body}"
    );
    assert!(!body.contains("ghost"));
    for (series, want) in [
        (
            "gpu_exporter_hpc_job_file_errors_total{reason=\"symlink\"}",
            1.0,
        ),
        (
            "gpu_exporter_hpc_job_file_errors_total{reason=\"not_regular\"}",
            1.0,
        ),
        (
            "gpu_exporter_hpc_job_files_ignored{reason=\"no_such_gpu\"}",
            200.0,
        ),
        ("gpu_exporter_hpc_job_files{state=\"ok\"}", 1.0),
    ] {
        assert_eq!(value(&body, series), Some(want), "{series}");
    }
    assert!(e.logged("/hpc/0: is a symbolic link; not followed"));
}
