//! The simulator's side of an assignments file: which PIDs run where.

use super::*;

const NODE: &str = r#"
[[assignment]]
namespace = "ml"
pod = "p"
container = "a"
devices = ["GPU-1", "GPU-2"]
pids = [10, 11]
weight = 2.0

[[assignment]]
namespace = "ml"
pod = "q"
container = "b"
claim = "q-gpus"
devices = ["gpu-3"]
pids = [20]

[[host_process]]
pid = 30
device = "GPU-1"
"#;

#[test]
fn processes_run_on_each_device_of_their_assignment_then_the_host_ones() {
    let a = Assignments::parse(NODE, "n.toml").unwrap();
    let processes = a.processes();
    let got: Vec<(u32, &str, DeviceNaming, f64)> = processes
        .iter()
        .map(|p| (p.pid, p.device_id.as_str(), p.naming, p.weight))
        .collect();
    assert_eq!(
        got,
        [
            (10, "GPU-1", DeviceNaming::Plugin, 2.0),
            (10, "GPU-2", DeviceNaming::Plugin, 2.0),
            (11, "GPU-1", DeviceNaming::Plugin, 2.0),
            (11, "GPU-2", DeviceNaming::Plugin, 2.0),
            (20, "gpu-3", DeviceNaming::Dra, 1.0),
            (30, "GPU-1", DeviceNaming::Plugin, 1.0),
        ]
    );
    assert_eq!(
        a.pods[1].containers[0].runs[0].allocation,
        Allocation::Dra {
            claim: "q-gpus".into(),
            claim_namespace: "ml".into(),
            driver: None,
            pool: DEFAULT_POOL.into(),
        }
    );
}

#[test]
fn sim_processes_are_placed_by_the_resolver_and_an_unknown_device_is_named() {
    let a = Assignments::parse(NODE, "n.toml").unwrap();
    let resolve = |id: &str, naming: DeviceNaming| match (id, naming) {
        ("GPU-1", DeviceNaming::Plugin) => Some((0, None)),
        ("GPU-2", DeviceNaming::Plugin) => Some((1, None)),
        ("gpu-3", DeviceNaming::Dra) => Some((3, Some(7))),
        _ => None,
    };
    let placed = a.sim_processes(resolve).unwrap();
    let got: Vec<(u32, u32, Option<u32>)> =
        placed.iter().map(|p| (p.pid, p.gpu, p.gi_id)).collect();
    assert_eq!(
        got,
        [
            (10, 0, None),
            (10, 1, None),
            (11, 0, None),
            (11, 1, None),
            (20, 3, Some(7)),
            (30, 0, None),
        ]
    );
    let only_gpu1 = |id: &str, _: DeviceNaming| (id == "GPU-1").then_some((0, None));
    let err = a.sim_processes(only_gpu1).unwrap_err();
    assert_eq!(
        err.to_string(),
        "pid 10: device \"GPU-2\" is none of the simulated fleet's GPUs or MIG instances (see --list-devices)"
    );
}
