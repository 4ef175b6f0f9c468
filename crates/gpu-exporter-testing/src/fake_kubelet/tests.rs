//! Tests of the fake kubelet's assignments.

use super::*;
use gpu_exporter::pods::dra::NVIDIA_GPU_DRIVER;
use gpu_exporter::pods::mapping::GPU_RESOURCE;
use std::path::Path;

#[test]
fn assignments_group_into_pods_and_containers() {
    let text = r#"
[[assignment]]
namespace = "ml"
pod = "p"
container = "a"
devices = ["GPU-1"]

[[assignment]]
namespace = "ml"
pod = "q"
container = "b"
resource = "nvidia.com/mig-1g.10gb"
devices = ["MIG-2", "MIG-3"]

[[assignment]]
namespace = "ml"
pod = "p"
container = "c"
devices = ["GPU-4::1"]
"#;
    let a = Assignments::parse(text, "a.toml").unwrap();
    let pods = &a.reply.pod_resources;
    assert_eq!(pods.len(), 2);
    assert_eq!(pods[0].name, "p");
    assert_eq!(pods[0].containers.len(), 2);
    assert_eq!(pods[0].containers[1].devices[0].device_ids, ["GPU-4::1"]);
    assert_eq!(pods[0].containers[0].devices[0].resource_name, GPU_RESOURCE);
    assert_eq!(
        pods[1].containers[0].devices[0].resource_name,
        "nvidia.com/mig-1g.10gb"
    );
}

#[test]
fn errors_name_file_and_line() {
    let missing = "[[assignment]]\nnamespace = \"ml\"\npod = \"p\"\ndevices = [\"GPU-1\"]\n";
    let e = Assignments::parse(missing, "a.toml")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("a.toml:1: "), "{e}");
    assert!(e.contains("container"), "{e}");

    let unknown = "\n\n[[assignment]]\nnamespace = \"ml\"\npod = \"p\"\ncontainer = \"c\"\ndevice = [\"x\"]\ndevices = [\"x\"]\n";
    let e = Assignments::parse(unknown, "b.toml")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("b.toml:7: "), "{e}");
    assert!(e.contains("unknown field"), "{e}");

    let empty =
        "[[assignment]]\nnamespace = \"ml\"\npod = \"p\"\ncontainer = \"c\"\ndevices = []\n";
    let e = Assignments::parse(empty, "c.toml").unwrap_err().to_string();
    assert!(e.starts_with("c.toml:1: "), "{e}");

    let syntax = "[[assignment]]\nnamespace = \"ml\npod = \"p\"\n";
    let e = Assignments::parse(syntax, "d.toml")
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("d.toml:2: "), "{e}");

    let e = Assignments::load(Path::new("/nonexistent/x.toml"))
        .unwrap_err()
        .to_string();
    assert_eq!(e, "/nonexistent/x.toml: cannot read");
}
const NODE: &str = r#"
cgroup_driver = "cgroupfs"
runtime = "crio"

[[assignment]]
namespace = "infer"
pod = "embed-a"
container = "server"
devices = ["GPU-1::0"]
labels = { app = "embed", "app.kubernetes.io/part-of" = "search" }
pids = [101, 102]
weight = 2.0

[[assignment]]
namespace = "infer"
pod = "embed-b"
container = "server"
pod_uid = "0b8f5a3e-1111-2222-3333-444455556666"
container_id = "ABCDEF0123456789abcdef0123456789abcdef0123456789abcdef0123456789"
devices = ["GPU-1::1", "GPU-2"]
pids = [201]
"#;

#[test]
fn a_node_file_describes_runtime_processes_and_proc_tree() {
    let a = Assignments::parse(NODE, "n.toml").unwrap();
    assert_eq!(
        a.layout,
        CgroupLayout {
            driver: CgroupDriver::Cgroupfs,
            version: 2,
            runtime: Runtime::Crio
        }
    );
    let snap = a.runtime_snapshot();
    assert_eq!(snap.sandboxes.len(), 2);
    assert_eq!(snap.containers.len(), 2);
    let a_box = &snap.sandboxes[0];
    assert_eq!(a_box.labels["app"], "embed");
    assert_eq!(a_box.labels["io.kubernetes.pod.name"], "embed-a");
    let b = &snap.sandboxes[1];
    assert_eq!(
        b.metadata.as_ref().unwrap().uid,
        "0b8f5a3e-1111-2222-3333-444455556666"
    );
    assert_eq!(
        snap.containers[1].id,
        "abcdef0123456789abcdef0123456789abcdef0123456789abcdef0123456789"
    );
    // Derived ids are stable and well-formed.
    let again = Assignments::parse(NODE, "n.toml").unwrap();
    assert_eq!(again.runtime_snapshot(), snap);
    assert_eq!(snap.containers[0].id.len(), 64);
    assert_eq!(a.pods[0].uid.len(), 36);

    let procs = a.processes();
    let got: Vec<(u32, &str, f64)> = procs
        .iter()
        .map(|p| (p.pid, p.device_id.as_str(), p.weight))
        .collect();
    assert_eq!(
        got,
        [
            (101, "GPU-1::0", 2.0),
            (102, "GPU-1::0", 2.0),
            (201, "GPU-1::1", 1.0),
            (201, "GPU-2", 1.0)
        ]
    );

    // The proc tree parses back to the pods and containers the runtime lists.
    let dir = tempfile::tempdir().unwrap();
    let written = a.write_proc_tree(dir.path(), &[]).unwrap();
    assert_eq!(written, [101, 102, 201]);
    let root = gpu_exporter::pods::procfs::ProcRoot::new(dir.path());
    for (pid, pod, container) in [(101, 0, 0), (201, 1, 0)] {
        assert_eq!(
            root.owner(pid).unwrap(),
            gpu_exporter::pods::cgroup::CgroupOwner::Pod {
                uid: a.pods[pod].uid.clone(),
                container_id: Some(a.pods[pod].containers[container].id.clone()),
            }
        );
    }
    // Rewriting without 102 removes its directory.
    let fewer = Assignments::parse(&NODE.replace("[101, 102]", "[101]"), "n.toml").unwrap();
    fewer.write_proc_tree(dir.path(), &written).unwrap();
    assert!(!dir.path().join("102").exists());
    assert!(dir.path().join("101/cgroup").exists());
}

#[test]
fn every_layout_round_trips_through_the_parser() {
    let uid = "0b8f5a3e-1111-2222-3333-444455556666";
    let cid = "ab".repeat(32);
    for driver in [CgroupDriver::Systemd, CgroupDriver::Cgroupfs] {
        for version in [1, 2] {
            for runtime in [Runtime::Containerd, Runtime::Crio, Runtime::Docker] {
                let layout = CgroupLayout {
                    driver,
                    version,
                    runtime,
                };
                let text = cgroup_file(layout, uid, &cid);
                assert_eq!(
                    gpu_exporter::pods::cgroup::parse(&text),
                    Ok(gpu_exporter::pods::cgroup::CgroupOwner::Pod {
                        uid: uid.into(),
                        container_id: Some(cid.clone())
                    }),
                    "{layout:?}: {text}"
                );
            }
        }
    }
}

#[test]
fn node_file_errors_name_the_line() {
    let cases = [
        ("cgroup_version = 3\n", "n.toml:1: cgroup_version 3: must be 1 or 2"),
        ("[[assignment]]\nnamespace = \"a\"\npod = \"p\"\ncontainer = \"c\"\ndevices = [\"x\"]\nweight = 0\n", "n.toml:1: assignment a/p/c: weight must be a positive number"),
        ("[[assignment]]\nnamespace = \"a\"\npod = \"p\"\ncontainer = \"c\"\ndevices = [\"x\"]\ncontainer_id = \"xyz\"\n", "n.toml:1: assignment a/p/c: container_id must be 64 hex digits"),
        ("[[assignment]]\nnamespace = \"a\"\npod = \"p\"\ncontainer = \"c\"\ndevices = [\"x\"]\npids = [1]\n\n[[assignment]]\nnamespace = \"a\"\npod = \"q\"\ncontainer = \"c\"\ndevices = [\"y\"]\npids = [1]\n", "n.toml:8: assignment a/q/c: pid 1 is already a process of another container"),
        ("runtime = \"rkt\"\n", "n.toml:1: "),
    ];
    for (text, want) in cases {
        let e = Assignments::parse(text, "n.toml").unwrap_err().to_string();
        assert!(e.starts_with(want), "{e} (want {want})");
    }
}

#[test]
fn dra_assignments_become_dynamic_resources_grouped_by_claim() {
    let text = r#"
[[assignment]]
namespace = "ml"
pod = "p"
container = "a"
claim = "gpus"
pool = "node-a"
devices = ["gpu-0"]

[[assignment]]
namespace = "ml"
pod = "p"
container = "a"
devices = ["GPU-1"]

[[assignment]]
namespace = "ml"
pod = "p"
container = "a"
claim = "gpus"
pool = "node-a"
devices = ["gpu-1-mig-3g40gb-9-4"]

[[assignment]]
namespace = "ml"
pod = "p"
container = "b"
claim = "shared"
claim_namespace = "infra"
driver = "dra.example.com"
devices = ["nic-0"]
"#;
    let a = Assignments::parse(text, "dra.toml").unwrap();
    let pod = &a.reply.pod_resources[0];
    let c = &pod.containers[0];
    assert_eq!(c.devices[0].device_ids, ["GPU-1"]);
    assert_eq!(c.dynamic_resources.len(), 1);
    let claim = &c.dynamic_resources[0];
    assert_eq!(
        (claim.claim_name.as_str(), claim.claim_namespace.as_str()),
        ("gpus", "ml")
    );
    let devices: Vec<(&str, &str, &str)> = claim
        .claim_resources
        .iter()
        .map(|r| {
            (
                r.driver_name.as_str(),
                r.pool_name.as_str(),
                r.device_name.as_str(),
            )
        })
        .collect();
    assert_eq!(
        devices,
        [
            (NVIDIA_GPU_DRIVER, "node-a", "gpu-0"),
            (NVIDIA_GPU_DRIVER, "node-a", "gpu-1-mig-3g40gb-9-4")
        ]
    );
    // One CDI id per device, as the driver forms them, with the same claim uid.
    let cdi: Vec<&str> = claim
        .claim_resources
        .iter()
        .flat_map(|r| r.cdi_devices.iter().map(|d| d.name.as_str()))
        .collect();
    assert_eq!(cdi.len(), 2);
    let uid = cdi[0]
        .strip_prefix("k8s.gpu.nvidia.com/claim=")
        .and_then(|r| r.strip_suffix("-gpu-0"))
        .unwrap();
    assert_eq!(uid.len(), 36, "{uid}");
    assert_eq!(
        cdi[1],
        format!("k8s.gpu.nvidia.com/claim={uid}-gpu-1-mig-3g40gb-9-4")
    );
    let other = &pod.containers[1].dynamic_resources[0];
    assert_eq!(other.claim_namespace, "infra");
    assert_eq!(other.claim_resources[0].driver_name, "dra.example.com");
    assert_eq!(other.claim_resources[0].pool_name, DEFAULT_POOL);
}

#[test]
fn dra_fields_are_checked() {
    let both = "[[assignment]]\nnamespace = \"ml\"\npod = \"p\"\ncontainer = \"c\"\nresource = \"nvidia.com/gpu\"\nclaim = \"x\"\ndevices = [\"gpu-0\"]\n";
    let e = Assignments::parse(both, "a.toml").unwrap_err().to_string();
    assert!(e.starts_with("a.toml:1: ") && e.contains("not both"), "{e}");
    let pool = "\n[[assignment]]\nnamespace = \"ml\"\npod = \"p\"\ncontainer = \"c\"\npool = \"n\"\ndevices = [\"GPU-0\"]\n";
    let e = Assignments::parse(pool, "b.toml").unwrap_err().to_string();
    assert!(
        e.starts_with("b.toml:2: ") && e.contains("`pool` needs `claim`"),
        "{e}"
    );
    let empty = "[[assignment]]\nnamespace = \"ml\"\npod = \"p\"\ncontainer = \"c\"\nclaim = \" \"\ndevices = [\"gpu-0\"]\n";
    let e = Assignments::parse(empty, "c.toml").unwrap_err().to_string();
    assert!(e.contains("empty claim"), "{e}");
}

#[test]
fn host_processes_run_outside_pods_under_a_systemd_unit() {
    let text = r#"
[[assignment]]
namespace = "ml"
pod = "p"
container = "c"
devices = ["GPU-a"]
pids = [10]

[[host_process]]
pid = 7001
device = "GPU-b"
unit = "nvidia-persistenced"

[[host_process]]
pid = 7002
device = "GPU-a"
weight = 2.0
"#;
    let a = Assignments::parse(text, "t.toml").unwrap();
    assert_eq!(a.host_processes.len(), 2);
    let cg = a.cgroup_files();
    assert_eq!(cg[&7001], "0::/system.slice/nvidia-persistenced.service\n");
    assert_eq!(cg[&7002], "0::/system.slice/host-7002.service\n");
    let procs = a.processes();
    assert!(procs
        .iter()
        .any(|p| p.pid == 7002 && p.device_id == "GPU-a" && p.weight == 2.0));
    // No pod or container for them.
    assert_eq!(a.reply.pod_resources.len(), 1);
    // A PID of a container cannot also be a host process; bad weights and units are refused.
    for (bad, says) in [
        (
            "[[host_process]]\npid = 10\ndevice = \"GPU-a\"\n",
            "already a process",
        ),
        (
            "[[host_process]]\npid = 11\ndevice = \"GPU-a\"\nweight = 0.0\n",
            "weight",
        ),
        (
            "[[host_process]]\npid = 11\ndevice = \"GPU-a\"\nunit = \"a/b\"\n",
            "not a unit name",
        ),
    ] {
        let e = Assignments::parse(&format!("{text}\n{bad}"), "t.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains(says) && e.starts_with("t.toml:"), "{e}");
    }
}
