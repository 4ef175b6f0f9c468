//! The node the stand-in describes, and what dcgm-exporter's contract says gpu-exporter must
//! serve for it: an oracle written from the stand-in's values and DCGM's units, independent of
//! the exporter's own conversion code.

use std::collections::BTreeMap;

use crate::harness::{Node, Series};

/// GPU 0's UUID.
pub const GPU0: &str = "GPU-5c7a1f3e-0000-4a6b-9d1e-000000000000";
/// GPU 1's UUID (the MIG-enabled one).
pub const GPU1: &str = "GPU-5c7a1f3e-1111-4a6b-9d1e-111111111111";
/// The MIG device UUIDs of GPU 1's instances, by slot.
pub const MIG_A: &str = "MIG-0e0b4bd3-aaaa-5f0d-8a77-aaaaaaaaaaaa";
/// See [`MIG_A`].
pub const MIG_B: &str = "MIG-0e0b4bd3-bbbb-5f0d-8a77-bbbbbbbbbbbb";

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

fn put(n: &mut Node, k: &str, v: impl ToString) {
    n.insert(k.to_owned(), v.to_string());
}

fn h100(n: &mut Node, i: u32, uuid: &str, bus: u32) {
    let g = |k: &str| format!("gpu.{i}.{k}");
    put(n, &g("uuid"), uuid);
    put(n, &g("name"), "NVIDIA H100 80GB HBM3");
    put(n, &g("brand"), 14); // NVML_BRAND_NVIDIA
    put(n, &g("minor"), i);
    put(n, &g("pci_bus_id"), format!("00000000:{bus:02X}:00.0"));
    put(n, &g("serial"), format!("165232404{i:04}"));
    put(n, &g("vbios"), "96.00.99.00.01");
    put(n, &g("inforom_image"), "G520.0200.00.05");
    put(n, &g("inforom.oem"), "2.1");
    put(n, &g("inforom.ecc"), "7.16");
    put(n, &g("temp"), 45 + i);
    put(n, &g("power_mw"), 302_206 + i);
    put(n, &g("power_limit_mw"), 700_000);
    put(n, &g("enforced_limit_mw"), 700_000);
    put(n, &g("pstate"), 0);
    put(n, &g("pcie_gen"), 5);
    put(n, &g("pcie_width"), 16);
    put(n, &g("clock.sm"), 1980);
    put(n, &g("clock.mem"), 2619);
    put(n, &g("clock.video"), 1755);
    put(n, &g("util.gpu"), 75);
    put(n, &g("util.mem"), 30);
    put(n, &g("enc"), 0);
    put(n, &g("dec"), 3);
    put(n, &g("clocks_event_reasons"), 1); // GPU idle
    let (total, reserved, used) = (80 * GIB, GIB / 2, 10 * GIB + 12_345);
    put(n, &g("mem.total"), total);
    put(n, &g("mem.reserved"), reserved);
    put(n, &g("mem.used"), used);
    put(n, &g("mem.free"), total - reserved - used);
    // Field values, by NVML field id. MEMORY_TEMP comes back as an unsigned int, as drivers
    // without bug 4300930 report it.
    for (id, spec) in [
        (82, "ui:41".to_owned()),               // MEMORY_TEMP, °C
        (83, format!("u:{}", 987_654_321 + i)), // TOTAL_ENERGY_CONSUMPTION, mJ
        (94, "u:3".to_owned()),                 // PCIE_REPLAY_COUNTER
        (74, "u:1000".to_owned()),              // PERF_POLICY_POWER, ns
        (75, "u:2000".to_owned()),              // PERF_POLICY_THERMAL, ns
        (186, "ui:350123".to_owned()),          // POWER_INSTANT, mW
        (3, "u:0".to_owned()),                  // ECC_SBE_VOL_TOTAL
        (4, "u:0".to_owned()),                  // ECC_DBE_VOL_TOTAL
        (5, format!("u:{}", 7 + i)),            // ECC_SBE_AGG_TOTAL
        (6, "u:0".to_owned()),                  // ECC_DBE_AGG_TOTAL
        (29, "u:1".to_owned()),                 // RETIRED_SBE
        (30, "u:0".to_owned()),                 // RETIRED_DBE
        (31, "u:0".to_owned()),                 // RETIRED_PENDING
        (142, "u:2".to_owned()),                // REMAPPED_COR
        (143, "u:0".to_owned()),                // REMAPPED_UNC
        (144, "u:0".to_owned()),                // REMAPPED_PENDING
        (145, "u:0".to_owned()),                // REMAPPED_FAILURE
        (38, "u:0".to_owned()),                 // NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL
        (45, "u:0".to_owned()),                 // NVLINK_CRC_DATA_ERROR_COUNT_TOTAL
        (52, "u:0".to_owned()),                 // NVLINK_REPLAY_ERROR_COUNT_TOTAL
        (59, "u:0".to_owned()),                 // NVLINK_RECOVERY_ERROR_COUNT_TOTAL
    ] {
        put(n, &g(&format!("field.{id}")), spec);
    }
    // NVLINK_THROUGHPUT_DATA_TX / _RX, KiB, with scopeId UINT_MAX (all links).
    put(n, &g("field.138.4294967295"), "u:1000");
    put(n, &g("field.139.4294967295"), "u:2000");
    put(n, &g("gpm"), 1);
    for (metric, v) in [
        (1, 50.0),   // GRAPHICS_UTIL, %
        (2, 40.0),   // SM_UTIL
        (3, 20.0),   // SM_OCCUPANCY
        (5, 10.0),   // ANY_TENSOR_UTIL
        (10, 30.0),  // DRAM_BW_UTIL
        (20, 100.5), // PCIE_TX_PER_SEC, MiB/s
        (21, 200.25),
        (60, 0.0),
        (61, 0.0),
    ] {
        put(n, &g(&format!("gpm.{metric}")), v);
    }
}

/// The standard node: GPU 0 a whole H100; GPU 1 an H100 in MIG mode with two GPU instances
/// (GI 2, a 3g.40gb in slot 0; GI 9, a 1g.10gb in slot 2); driver 570.172.08.
pub fn standard() -> Node {
    let mut n = Node::new();
    put(&mut n, "driver_version", "570.172.08");
    put(&mut n, "nvml_version", "12.570.172.08");
    put(&mut n, "cuda_version", 12080);
    put(&mut n, "gpus", 2);
    h100(&mut n, 0, GPU0, 0x18);
    h100(&mut n, 1, GPU1, 0x2A);
    let g = |k: &str| format!("gpu.1.{k}");
    put(&mut n, &g("mig"), 1);
    put(&mut n, &g("mig.slots"), 7);
    put(&mut n, &g("mig.gen"), 0);
    // Profiles: index → id, NVML name, slices, memory (MiB), as an H100 80GB lists them.
    for (index, id, name, slices, mem_mb) in [
        (0, 19, "MIG 1g.10gb", 1, 9856),
        (2, 9, "MIG 3g.40gb", 3, 40448),
        (7, 15, "MIG 1g.10gb+me", 1, 9856),
    ] {
        put(&mut n, &g(&format!("profile.{index}.id")), id);
        put(&mut n, &g(&format!("profile.{index}.name")), name);
        put(&mut n, &g(&format!("profile.{index}.slices")), slices);
        put(&mut n, &g(&format!("profile.{index}.mem_mb")), mem_mb);
    }
    for (slot, gi, uuid, profile, used_mib, sm) in [
        (0, 2, MIG_A, 2, 3000u64, 60.0),
        (2, 9, MIG_B, 0, 1000u64, 20.0),
    ] {
        let s = |k: &str| format!("gpu.1.mig.{slot}.{k}");
        put(&mut n, &s("gi"), gi);
        put(&mut n, &s("ci"), 0);
        put(&mut n, &s("uuid"), uuid);
        put(&mut n, &s("profile"), profile);
        let total = 40_192 * MIB / if profile == 2 { 1 } else { 4 };
        put(&mut n, &s("mem.total"), total);
        put(&mut n, &s("mem.reserved"), 0);
        put(&mut n, &s("mem.used"), used_mib * MIB + 7);
        put(&mut n, &s("mem.free"), total - used_mib * MIB - 7);
        for (metric, v) in [(1, sm), (2, sm), (5, sm / 2.0), (10, sm / 4.0)] {
            put(&mut n, &s(&format!("gpm.{metric}")), v);
        }
    }
    n
}

/// A numeric value of the node: a plain number or a field spec (`u:`, `ui:`, `d:`, and the
/// quirk specs `ui_as_double:` and `no_type:`, whose number is what the driver meant). `None`
/// when absent or not a value (`untouched`, `err:`).
pub fn num(node: &Node, key: &str) -> Option<f64> {
    let v = node.get(key)?;
    let n = match v.split_once(':') {
        None => v.as_str(),
        Some(("u" | "ui" | "i" | "d" | "ui_as_double" | "no_type", n)) => n,
        Some(_) => return None,
    };
    n.parse().ok()
}

fn int(node: &Node, key: &str) -> u64 {
    num(node, key).unwrap_or_else(|| panic!("{key} is not in the node")) as u64
}

/// One exported entity: a whole GPU, or a MIG instance (its slot).
#[derive(Debug, Clone, Copy)]
pub struct Entity {
    /// GPU index.
    pub gpu: u32,
    /// MIG slot, for an instance.
    pub slot: Option<u32>,
}

/// The entities exported by default (`-d f`): MIG instances of MIG GPUs, whole GPUs otherwise,
/// instances in GPU instance id order.
pub fn entities(node: &Node) -> Vec<Entity> {
    let mut out = Vec::new();
    for gpu in 0..int(node, "gpus") as u32 {
        if num(node, &format!("gpu.{gpu}.mig")) == Some(1.0) {
            let mut slots: Vec<(u64, u32)> = (0..8)
                .filter_map(|s| {
                    num(node, &format!("gpu.{gpu}.mig.{s}.gi")).map(|gi| (gi as u64, s))
                })
                .collect();
            slots.sort_unstable();
            out.extend(
                slots
                    .into_iter()
                    .map(|(_, s)| Entity { gpu, slot: Some(s) }),
            );
        } else {
            out.push(Entity { gpu, slot: None });
        }
    }
    out
}

/// DCGM's name of a GPU instance profile: `{slices}g.{ceil(memory MiB / 1024)}gb`.
pub fn dcgm_profile(node: &Node, gpu: u32, slot: u32) -> String {
    let p = int(node, &format!("gpu.{gpu}.mig.{slot}.profile"));
    let slices = int(node, &format!("gpu.{gpu}.profile.{p}.slices"));
    let mem = int(node, &format!("gpu.{gpu}.profile.{p}.mem_mb"));
    format!("{slices}g.{}gb", mem.div_ceil(1024))
}

/// The identity labels of an entity (plus hostname and the driver version label).
pub fn labels(node: &Node, e: Entity) -> BTreeMap<String, String> {
    let g = |k: &str| node[&format!("gpu.{}.{k}", e.gpu)].clone();
    let mut l = BTreeMap::new();
    l.insert("gpu".into(), e.gpu.to_string());
    l.insert("UUID".into(), g("uuid"));
    l.insert("pci_bus_id".into(), g("pci_bus_id"));
    l.insert("device".into(), format!("nvidia{}", e.gpu));
    l.insert("modelName".into(), g("name"));
    l.insert("hostname".into(), "node-a".into());
    l.insert(
        "DCGM_FI_DRIVER_VERSION".into(),
        node["driver_version"].clone(),
    );
    if let Some(s) = e.slot {
        l.insert("GPU_I_PROFILE".into(), dcgm_profile(node, e.gpu, s));
        l.insert(
            "GPU_I_ID".into(),
            int(node, &format!("gpu.{}.mig.{s}.gi", e.gpu)).to_string(),
        );
    }
    l
}

/// The value dcgm-exporter's contract gives `metric` on `e`, or `None` when the series must be
/// absent. Panics on a metric this oracle does not know, so a new default-CSV row has to be
/// added here.
pub fn expected(node: &Node, metric: &str, e: Entity) -> Option<f64> {
    let gk = |k: &str| format!("gpu.{}.{k}", e.gpu);
    let g = |k: &str| num(node, &gk(k));
    let field = |id: u32| g(&format!("field.{id}"));
    // Per-instance readings come from the instance, GPU-wide ones from the GPU.
    let local = |k: &str| match e.slot {
        Some(s) => num(node, &gk(&format!("mig.{s}.{k}"))),
        None => g(k),
    };
    let whole_gpu = e.slot.is_none();
    let mib = |k: &str| local(&format!("mem.{k}")).map(|b| (b as u64 / MIB) as f64);
    let ratio = |m: u32| local(&format!("gpm.{m}")).map(|v| v / 100.0);
    let bytes = |m: u32| g(&format!("gpm.{m}")).map(|v| (v * MIB as f64).trunc());
    match metric {
        "DCGM_FI_DEV_SM_CLOCK" => g("clock.sm"),
        "DCGM_FI_DEV_MEM_CLOCK" => g("clock.mem"),
        "DCGM_FI_DEV_MEMORY_TEMP" => field(82).filter(|t| *t <= 200.0),
        "DCGM_FI_DEV_GPU_TEMP" => g("temp"),
        "DCGM_FI_DEV_POWER_USAGE" => g("power_mw").map(|mw| mw / 1000.0),
        "DCGM_FI_DEV_POWER_USAGE_INSTANT" => field(186).map(|mw| mw / 1000.0),
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" => field(83),
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER" => field(94),
        // Not defined in MIG mode.
        "DCGM_FI_DEV_GPU_UTIL" => g("util.gpu").filter(|_| whole_gpu),
        "DCGM_FI_DEV_MEM_COPY_UTIL" => g("util.mem").filter(|_| whole_gpu),
        "DCGM_FI_DEV_ENC_UTIL" => g("enc").filter(|_| whole_gpu),
        "DCGM_FI_DEV_DEC_UTIL" => g("dec").filter(|_| whole_gpu),
        "DCGM_FI_DEV_POWER_VIOLATION" => field(74),
        "DCGM_FI_DEV_THERMAL_VIOLATION" => field(75),
        "DCGM_FI_DEV_FB_FREE" => mib("free"),
        "DCGM_FI_DEV_FB_USED" => mib("used"),
        "DCGM_FI_DEV_FB_RESERVED" => mib("reserved"),
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL" => field(3),
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL" => field(4),
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL" => field(5),
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL" => field(6),
        "DCGM_FI_DEV_RETIRED_SBE" => field(29),
        "DCGM_FI_DEV_RETIRED_DBE" => field(30),
        "DCGM_FI_DEV_RETIRED_PENDING" => field(31),
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS" => field(143),
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS" => field(142),
        "DCGM_FI_DEV_ROW_REMAP_FAILURE" => field(145),
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL" => field(38),
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL" => field(45),
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL" => field(52),
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL" => field(59),
        // The counters stand still in the stand-in: a rate of 0.
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" => g("field.138.4294967295")
            .and(g("field.139.4294967295"))
            .map(|_| 0.0),
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE" => ratio(1),
        "DCGM_FI_PROF_SM_ACTIVE" => ratio(2),
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE" => ratio(5),
        "DCGM_FI_PROF_DRAM_ACTIVE" => ratio(10),
        // GPU-level GPM metrics: DCGM has no data for GPU-instance entities.
        "DCGM_FI_PROF_PCIE_TX_BYTES" => bytes(20).filter(|_| whole_gpu),
        "DCGM_FI_PROF_PCIE_RX_BYTES" => bytes(21).filter(|_| whole_gpu),
        other => panic!("the oracle does not know {other}: add it to node::expected"),
    }
}

/// Every series of `metric` the default selection must export for `node`.
pub fn expected_series(node: &Node, metric: &str) -> Vec<Series> {
    entities(node)
        .into_iter()
        .filter_map(|e| {
            expected(node, metric, e).map(|value| Series {
                name: metric.to_owned(),
                labels: labels(node, e),
                value,
            })
        })
        .collect()
}
