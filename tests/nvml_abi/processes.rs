//! Per-process readings through the real NVML path: the stand-in lists processes
//! (`nvmlDeviceGetComputeRunningProcesses_v3`, `nvmlDeviceGetMPSComputeRunningProcesses_v3`) and
//! samples their utilisation (`nvmlDeviceGetProcessUtilization`); the `fake-kubelet` binary
//! serves who holds which GPU, the container runtime's CRI and a host `/proc` for the same PIDs;
//! the real `gpu-exporter` with `-k --kubernetes-process-usage` must serve, per container, what
//! the stand-in holds for that container's processes, on a whole GPU and on MIG instances.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use crate::harness::{Exporter, Node, Scrape, Series, StandIn};
use crate::node::{self, Entity, GPU0, MIG_A, MIG_B};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A pod of the fake node: who holds what, and which PIDs it runs.
struct Pod {
    namespace: &'static str,
    name: &'static str,
    container: &'static str,
    uid: &'static str,
    resource: Option<&'static str>,
    device: String,
    pids: &'static [u32],
    app: &'static str,
}

fn pods() -> Vec<Pod> {
    vec![
        // GPU 0, time-sliced by two pods; embed-b runs an MPS client and a process both
        // lists name.
        Pod {
            namespace: "infer",
            name: "embed-a",
            container: "server",
            uid: "0a5f3c1e-1111-4b2a-9c3d-aaaaaaaaaaaa",
            resource: None,
            device: format!("{GPU0}::0"),
            pids: &[5001],
            app: "embed",
        },
        Pod {
            namespace: "infer",
            name: "embed-b",
            container: "server",
            uid: "0a5f3c1e-2222-4b2a-9c3d-bbbbbbbbbbbb",
            resource: None,
            device: format!("{GPU0}::1"),
            pids: &[5002, 5003],
            app: "embed",
        },
        // GPU 1's MIG instances: GI 2 (slot 0) with two processes, GI 9 (slot 2) with one.
        Pod {
            namespace: "batch",
            name: "etl",
            container: "worker",
            uid: "0a5f3c1e-3333-4b2a-9c3d-cccccccccccc",
            resource: Some("nvidia.com/mig-3g.40gb"),
            device: MIG_A.to_owned(),
            pids: &[6001, 6002],
            app: "etl",
        },
        Pod {
            namespace: "dev",
            name: "shell",
            container: "shell",
            uid: "0a5f3c1e-4444-4b2a-9c3d-dddddddddddd",
            resource: Some("nvidia.com/mig-1g.10gb"),
            device: MIG_B.to_owned(),
            pids: &[6101],
            app: "shell",
        },
    ]
}

/// A host daemon on GPU 0, outside any pod.
const HOST_PID: u32 = 777;

fn assignments(pods: &[Pod]) -> String {
    let mut out = String::new();
    for p in pods {
        out.push_str(&format!(
            "[[assignment]]\nnamespace = \"{}\"\npod = \"{}\"\ncontainer = \"{}\"\npod_uid = \"{}\"\n",
            p.namespace, p.name, p.container, p.uid
        ));
        if let Some(r) = p.resource {
            out.push_str(&format!("resource = \"{r}\"\n"));
        }
        let pids: Vec<String> = p.pids.iter().map(u32::to_string).collect();
        out.push_str(&format!(
            "devices = [\"{}\"]\npids = [{}]\nlabels = {{ app = \"{}\" }}\n\n",
            p.device,
            pids.join(", "),
            p.app
        ));
    }
    out
}

/// The standard node plus processes: GPU 0 lists 5001 (compute), 5002 (MPS only), 5003 (in
/// both lists) and the host daemon; GPU 1's MIG devices list 6001, 6002 (GI 2) and 6101 (GI 9).
/// GPU 0 samples utilisation every 50 ms; it also keeps an old sample of 5001 at 99 % and ignores
/// lastSeenTimeStamp, so an exporter that did not filter on its own cursor would count it again
/// every tick. Each process list loses two races (INSUFFICIENT_SIZE on the fill call) first.
fn process_node() -> Node {
    let mut n = node::standard();
    let mut put = |k: &str, v: String| {
        n.insert(k.to_owned(), v);
    };
    put("gpu.0.proc.0", format!("5001 {} compute", 3 * GIB + 123));
    put("gpu.0.proc.1", format!("5002 {GIB} mps"));
    put("gpu.0.proc.2", format!("5003 {} both", 512 * MIB + 5));
    put("gpu.0.proc.3", format!("{HOST_PID} {} compute", 256 * MIB));
    put("gpu.0.putil.0", "5001 41 20 0 0".into());
    put("gpu.0.putil.1", "5002 17 8 5 0".into());
    put("gpu.0.putil.2", "5003 9 3 0 2".into());
    put("gpu.0.putil.3", format!("{HOST_PID} 0 0 0 0"));
    put("gpu.0.putil_old.0", "5001 1000 99 99 99 99".into());
    put("gpu.0.putil_unfiltered", "1".into());
    put("gpu.0.putil_period_us", "50000".into());
    put("gpu.0.putil_depth", "40".into());
    put("gpu.1.mig.0.proc.0", format!("6001 {} compute", 2 * GIB));
    put("gpu.1.mig.0.proc.1", format!("6002 {} compute", GIB + 1));
    put("gpu.1.mig.2.proc.0", format!("6101 {} compute", 300 * MIB));
    put("race.nvmlDeviceGetComputeRunningProcesses_v3", "2".into());
    put(
        "race.nvmlDeviceGetMPSComputeRunningProcesses_v3",
        "2".into(),
    );
    n
}

/// What the stand-in holds for `pid` on `e`: (bytes, [sm, mem, enc, dec]); one entry per PID,
/// whichever lists name it. Utilisation only on whole GPUs.
fn held(node: &Node, e: Entity, pid: u32) -> Option<(u64, Option<[u64; 4]>)> {
    let prefix = match e.slot {
        Some(s) => format!("gpu.{}.mig.{s}.proc.", e.gpu),
        None => format!("gpu.{}.proc.", e.gpu),
    };
    let bytes = node
        .iter()
        .filter(|(k, _)| k.starts_with(&prefix))
        .map(|(_, v)| v.split_whitespace().collect::<Vec<_>>())
        .find(|w| w[0] == pid.to_string())?[1]
        .parse()
        .unwrap();
    let util = e.slot.is_none().then(|| {
        let mut u = [0; 4];
        for v in node
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("gpu.{}.putil.", e.gpu)))
            .map(|(_, v)| v)
        {
            let w: Vec<u64> = v.split_whitespace().map(|x| x.parse().unwrap()).collect();
            if w[0] == u64::from(pid) {
                u.copy_from_slice(&w[1..5]);
            }
        }
        u
    });
    Some((bytes, util))
}

/// The per-container series the node must give: for each pod, on the entity its device is,
/// the sums over its processes of what the stand-in holds.
fn expected(node: &Node, pods: &[Pod]) -> Vec<Series> {
    let entity_of = |device: &str| {
        if device == MIG_A {
            Entity {
                gpu: 1,
                slot: Some(0),
            }
        } else if device == MIG_B {
            Entity {
                gpu: 1,
                slot: Some(2),
            }
        } else {
            Entity { gpu: 0, slot: None }
        }
    };
    let mut out = Vec::new();
    for p in pods {
        let e = entity_of(&p.device);
        let mut labels = node::labels(node, e);
        for (k, v) in [
            ("container", p.container),
            ("namespace", p.namespace),
            ("pod", p.name),
            ("pod_uid", p.uid),
            ("app", p.app),
        ] {
            labels.insert(k.into(), v.into());
        }
        let procs: Vec<(u64, Option<[u64; 4]>)> = p
            .pids
            .iter()
            .filter_map(|&pid| held(node, e, pid))
            .collect();
        assert_eq!(procs.len(), p.pids.len(), "{} runs what it says", p.name);
        let mut push = |name: &str, value: u64| {
            out.push(Series {
                name: name.into(),
                labels: labels.clone(),
                value: value as f64,
            });
        };
        push("gpu_exporter_container_processes", procs.len() as u64);
        push(
            "gpu_exporter_container_fb_used_bytes",
            procs.iter().map(|(b, _)| b).sum(),
        );
        if e.slot.is_none() {
            for (i, name) in [
                "gpu_exporter_container_sm_utilization_percent",
                "gpu_exporter_container_memory_utilization_percent",
                "gpu_exporter_container_encoder_utilization_percent",
                "gpu_exporter_container_decoder_utilization_percent",
            ]
            .into_iter()
            .enumerate()
            {
                push(name, procs.iter().map(|(_, u)| u.unwrap()[i]).sum());
            }
        }
    }
    out
}

fn container_series(s: &Scrape) -> Vec<Series> {
    let mut v: Vec<Series> = s
        .series
        .iter()
        // The per-process usage gauges; the accounting counters (`_total`) are tested apart.
        .filter(|x| x.name.starts_with("gpu_exporter_container_") && !x.name.ends_with("_total"))
        .cloned()
        .collect();
    v.sort_by(|a, b| {
        (&a.name, format!("{:?}", a.labels)).cmp(&(&b.name, format!("{:?}", b.labels)))
    });
    v
}

struct FakeKubelet(Child);

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts the `fake-kubelet` binary on `dir` (kubelet and CRI sockets, proc tree) and waits
/// until it serves.
fn fake_kubelet(dir: &Path, assignments: &Path) -> FakeKubelet {
    let mut child = Command::new(crate::fake_kubelet_bin::fake_kubelet_bin())
        .arg("--socket")
        .arg(dir.join("kubelet.sock"))
        .arg("--cri-socket")
        .arg(dir.join("cri.sock"))
        .arg("--proc-root")
        .arg(dir.join("proc"))
        .arg("--assignments")
        .arg(assignments)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn fake-kubelet");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let fk = FakeKubelet(child);
    let mut seen = Vec::new();
    loop {
        let mut l = String::new();
        assert!(
            out.read_line(&mut l).expect("read fake-kubelet") > 0,
            "fake-kubelet exited: {seen:?}"
        );
        if l.starts_with("fake-kubelet: serving") {
            return fk;
        }
        seen.push(l);
    }
}

#[test]
fn per_container_usage_is_what_the_driver_holds_for_each_containers_processes() {
    let dir = tempfile::tempdir().unwrap();
    let pods = pods();
    let file = dir.path().join("pods.toml");
    std::fs::write(&file, assignments(&pods)).unwrap();
    let _kubelet = fake_kubelet(dir.path(), &file);
    // The host daemon: a system service, outside any pod.
    let host = dir.path().join(format!("proc/{HOST_PID}"));
    std::fs::create_dir_all(&host).unwrap();
    std::fs::write(
        host.join("cgroup"),
        "0::/system.slice/nvidia-persistenced.service\n",
    )
    .unwrap();

    let standin = StandIn::new(process_node());
    let cri = format!("unix://{}", dir.path().join("cri.sock").display());
    let (kubelet_sock, proc_root) = (dir.path().join("kubelet.sock"), dir.path().join("proc"));
    let exp = Exporter::start(
        &standin,
        &[
            "-k",
            "--pod-resources-kubelet-socket",
            kubelet_sock.to_str().unwrap(),
            "--container-runtime-endpoint",
            &cri,
            "--path.procfs",
            proc_root.to_str().unwrap(),
            "--kubernetes-process-usage",
            "--kubernetes-enable-pod-uid",
            "--kubernetes-enable-pod-labels",
            "--kubernetes-virtual-gpus",
        ],
    );
    let node = &standin.node;
    let mut want = expected(node, &pods);
    want.sort_by(|a, b| {
        (&a.name, format!("{:?}", a.labels)).cmp(&(&b.name, format!("{:?}", b.labels)))
    });
    let s = exp.wait_for("per-container series as the stand-in holds them", |s| {
        container_series(s) == want
    });

    // Every process attributed, the host daemon recognised as outside pods, nothing failed
    // (the lost races were retried within the tick).
    assert_eq!(
        s.value("gpu_exporter_gpu_processes", &[("outcome", "attributed")]),
        Some(6.0),
        "{}",
        s.text
    );
    assert_eq!(
        s.value("gpu_exporter_gpu_processes", &[("outcome", "outside_pods")]),
        Some(1.0)
    );
    let errors: f64 = s
        .named("gpu_exporter_process_attribution_errors_total")
        .map(|x| x.value)
        .sum();
    assert_eq!(errors, 0.0, "{}", s.text);

    // --kubernetes-virtual-gpus: each holder's copy of GPU_UTIL and FB_USED is its own (FB in
    // MiB, each process floored), the whole GPU's and the MIG instance's alike.
    let own = |metric: &str, pod: &str| s.value(metric, &[("pod", pod)]);
    assert_eq!(own("DCGM_FI_DEV_GPU_UTIL", "embed-a"), Some(41.0));
    assert_eq!(own("DCGM_FI_DEV_GPU_UTIL", "embed-b"), Some(26.0));
    assert_eq!(own("DCGM_FI_DEV_FB_USED", "embed-a"), Some(3072.0));
    assert_eq!(own("DCGM_FI_DEV_FB_USED", "embed-b"), Some(1024.0 + 512.0));
    assert_eq!(own("DCGM_FI_DEV_FB_USED", "etl"), Some(2048.0 + 1024.0));
    assert_eq!(own("DCGM_FI_DEV_FB_USED", "shell"), Some(300.0));

    // The calls the exporter made: the _v3 lists (nvml-wrapper's symbols), utilisation with a
    // moving lastSeenTimeStamp on the whole GPU only (NVML has none on MIG), both races lost.
    let st = standin.status();
    let counter = |k: &str| st.get(k).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    assert!(counter("calls.nvmlDeviceGetComputeRunningProcesses_v3") > 0);
    assert!(counter("calls.nvmlDeviceGetMPSComputeRunningProcesses_v3") > 0);
    assert!(counter("putil.0.returned") > 0, "{st:#?}");
    let cursor = counter("putil.0.last_seen");
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64;
    assert!(
        cursor > 1_000 && cursor <= now_us,
        "the exporter's cursor is a sample timestamp it was given: {cursor}"
    );
    assert!(!st.contains_key("putil.1.last_seen"), "{st:#?}");
    assert_eq!(
        counter("race.nvmlDeviceGetComputeRunningProcesses_v3.left"),
        0
    );
    assert_eq!(
        counter("race.nvmlDeviceGetMPSComputeRunningProcesses_v3.left"),
        0
    );
}

#[test]
fn processes_come_off_the_series_when_they_exit_and_idle_ones_read_zero() {
    // The same node; then 5002 and 5003 exit and 5001 goes idle (no more samples): embed-b's
    // series go, embed-a reads 0 % (NOT_FOUND: no sample since the cursor) with its memory.
    let dir = tempfile::tempdir().unwrap();
    let pods = pods();
    let file = dir.path().join("pods.toml");
    std::fs::write(&file, assignments(&pods)).unwrap();
    let _kubelet = fake_kubelet(dir.path(), &file);
    let mut n = process_node();
    n.remove("gpu.0.proc.3");
    n.retain(|k, _| !k.starts_with("race."));
    let mut standin = StandIn::new(n);
    let cri = format!("unix://{}", dir.path().join("cri.sock").display());
    let (kubelet_sock, proc_root) = (dir.path().join("kubelet.sock"), dir.path().join("proc"));
    let exp = Exporter::start(
        &standin,
        &[
            "-k",
            "--pod-resources-kubelet-socket",
            kubelet_sock.to_str().unwrap(),
            "--container-runtime-endpoint",
            &cri,
            "--path.procfs",
            proc_root.to_str().unwrap(),
            "--kubernetes-process-usage",
        ],
    );
    let sm = |s: &Scrape, pod: &str| {
        s.value(
            "gpu_exporter_container_sm_utilization_percent",
            &[("pod", pod)],
        )
    };
    exp.wait_for("embed-a busy, embed-b present", |s| {
        sm(s, "embed-a") == Some(41.0) && sm(s, "embed-b") == Some(26.0)
    });
    standin.update(|n| {
        n.remove("gpu.0.proc.1");
        n.remove("gpu.0.proc.2");
        n.retain(|k, _| !k.starts_with("gpu.0.putil"));
    });
    let s = exp.wait_for("embed-b gone, embed-a idle", |s| {
        sm(s, "embed-b").is_none() && sm(s, "embed-a") == Some(0.0)
    });
    assert_eq!(
        s.value(
            "gpu_exporter_container_fb_used_bytes",
            &[("pod", "embed-a")]
        ),
        Some((3 * GIB + 123) as f64)
    );
    let mut gpu0: BTreeMap<String, f64> = BTreeMap::new();
    for x in s.named("gpu_exporter_container_processes") {
        if x.label("gpu") == "0" {
            gpu0.insert(x.label("pod").to_owned(), x.value);
        }
    }
    assert_eq!(gpu0, BTreeMap::from([("embed-a".to_owned(), 1.0)]));
}
