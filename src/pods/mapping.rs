//! Pure mapping from a kubelet `List` reply to [`Attribution`]: which pods hold which GPUs and
//! MIG instances of this node.
//!
//! Only GPU resources count: `nvidia.com/gpu`, every `nvidia.com/mig-*` name, and the names given
//! with `--nvidia-resource-names`. Each device id is matched against the current device
//! inventory. The forms understood:
//!
//! | id | entity | `vgpu` |
//! |---|---|---|
//! | `GPU-<uuid>` | that GPU (`uid` mode) | – |
//! | `MIG-<uuid>` | the MIG instance with that UUID | – |
//! | `MIG-GPU-<uuid>/<gi>/<ci>` (drivers before R470) | instance `<gi>` of that GPU | – |
//! | `<any of the above>::<n>` (time-slicing / MPS replica) | as without the suffix | `n` |
//! | `nvidia<N>` (GKE, `device-name` mode) | the GPU with minor number `N` | – |
//! | `nvidia<N>/vgpu<K>` (GKE sharing, `device-name` mode) | the GPU with minor `N` | `K` |
//! | `nvidia<N>/gi<M>[/vgpu<K>]` (GKE MIG) | instance `M` of the GPU with minor `N` | `K` |
//!
//! As in dcgm-exporter, MIG ids are understood in both `--kubernetes-gpu-id-type` modes, while
//! whole-GPU ids follow the mode: `GPU-…` in `uid` mode, `nvidia<N>` in `device-name` mode.
//! Ids that match nothing are skipped and counted (a stale inventory, another vendor's plugin
//! reusing a listed resource name, or the wrong id-type mode).
//!
//! With `--kubernetes-enable-dra`, the devices of NVIDIA's DRA driver (`gpu.nvidia.com`) in each
//! container's `dynamic_resources` are attributed too, with the claim they came from (see
//! [`super::dra`] for how their names are resolved). Other drivers' devices are ignored; devices
//! that resolve to nothing are skipped and counted by reason.
//!
//! Unlike dcgm-exporter, where the pod listed last wins a shared GPU, the holders of every entity
//! are sorted and deduplicated, so the same reply always gives the same attribution.

use std::collections::BTreeMap;

use crate::gpu::sim::assignments::DeviceNaming;
use crate::gpu::Device;
use crate::pods::dra::{self, NVIDIA_GPU_DRIVER};
use crate::pods::proto::{
    AllocatableResourcesResponse, ContainerResources, ListPodResourcesResponse,
};
use crate::pods::{Attribution, DraClaim, EntityKey, GpuIdType, Holder, PodRef};

/// The resource name of whole GPUs (and of MIG devices with the `single` MIG strategy).
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The prefix of MIG resources with the `mixed` MIG strategy, e.g. `nvidia.com/mig-1g.10gb`.
pub const MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";

/// How device ids are read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappingOptions {
    /// Extra resource names that denote NVIDIA GPUs (`--nvidia-resource-names`).
    pub extra_resource_names: Vec<String>,
    /// `--kubernetes-gpu-id-type`.
    pub id_type: GpuIdType,
    /// `--kubernetes-enable-dra`: attribute devices of NVIDIA's DRA driver.
    pub enable_dra: bool,
}

impl Default for MappingOptions {
    fn default() -> Self {
        Self {
            extra_resource_names: Vec::new(),
            id_type: GpuIdType::Uid,
            enable_dra: false,
        }
    }
}

impl MappingOptions {
    /// Whether `name` is a GPU resource.
    pub fn is_gpu_resource(&self, name: &str) -> bool {
        name == GPU_RESOURCE
            || name.starts_with(MIG_RESOURCE_PREFIX)
            || self.extra_resource_names.iter().any(|n| n == name)
    }
}

/// The attribution plus what could not be placed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Mapped {
    /// Who holds what.
    pub attribution: Attribution,
    /// GPU device ids that matched no GPU or MIG instance of the inventory.
    pub unknown_devices: usize,
    /// The first few of them, for the log.
    pub unknown_examples: Vec<String>,
    /// Devices of NVIDIA's DRA driver that resolved to no GPU or MIG instance, by reason
    /// ([`dra::Unresolved::reason`]); only with `enable_dra`.
    pub dra_unresolved: BTreeMap<&'static str, usize>,
    /// The first few of them, for the log.
    pub dra_unresolved_examples: Vec<String>,
    /// Devices of NVIDIA's DRA driver seen while `enable_dra` is off (for a hint in the log).
    pub dra_ignored: usize,
}

const UNKNOWN_EXAMPLES: usize = 3;

/// Builds the attribution from a `List` reply and the current devices.
pub fn attribution_from(
    reply: &ListPodResourcesResponse,
    devices: &[Device],
    opts: &MappingOptions,
) -> Mapped {
    let mut holders: BTreeMap<EntityKey, Vec<Holder>> = BTreeMap::new();
    let mut mapped = Mapped::default();
    for pod in &reply.pod_resources {
        for container in &pod.containers {
            for dev in &container.devices {
                if !opts.is_gpu_resource(&dev.resource_name) {
                    continue;
                }
                for id in &dev.device_ids {
                    match resolve(id, devices, opts.id_type) {
                        Some((key, vgpu)) => holders.entry(key).or_default().push(Holder {
                            pod: PodRef {
                                namespace: pod.namespace.clone(),
                                pod: pod.name.clone(),
                                container: container.name.clone(),
                            },
                            vgpu,
                            dra: None,
                        }),
                        None => {
                            mapped.unknown_devices += 1;
                            if mapped.unknown_examples.len() < UNKNOWN_EXAMPLES {
                                mapped.unknown_examples.push(id.clone());
                            }
                        }
                    }
                }
            }
            let holder = |dra: DraClaim| Holder {
                pod: PodRef {
                    namespace: pod.namespace.clone(),
                    pod: pod.name.clone(),
                    container: container.name.clone(),
                },
                vgpu: None,
                dra: Some(dra),
            };
            for (key, claim) in dra_devices(container, devices, opts, &mut mapped) {
                holders.entry(key).or_default().push(holder(claim));
            }
        }
    }
    for list in holders.values_mut() {
        list.sort();
        list.dedup();
    }
    mapped.attribution = Attribution {
        holders,
        ..Default::default()
    };
    mapped
}

/// The devices of NVIDIA's DRA driver a container holds, resolved; counts the rest in `mapped`.
/// Keyed by (driver, pool, device) only: the kubelet (1.34) also lists the CDI ids of a
/// driver's earlier devices on each later one, so CDI ids are not used.
fn dra_devices(
    container: &ContainerResources,
    devices: &[Device],
    opts: &MappingOptions,
    mapped: &mut Mapped,
) -> Vec<(EntityKey, DraClaim)> {
    let mut out = Vec::new();
    for claim in &container.dynamic_resources {
        for res in &claim.claim_resources {
            if res.driver_name != NVIDIA_GPU_DRIVER {
                continue;
            }
            if !opts.enable_dra {
                mapped.dra_ignored += 1;
                continue;
            }
            match dra::resolve(&res.device_name, devices) {
                Ok(key) => out.push((
                    key,
                    DraClaim {
                        claim_name: claim.claim_name.clone(),
                        claim_namespace: claim.claim_namespace.clone(),
                        driver: res.driver_name.clone(),
                        pool: res.pool_name.clone(),
                        device: res.device_name.clone(),
                    },
                )),
                Err(why) => {
                    *mapped.dra_unresolved.entry(why.reason()).or_default() += 1;
                    if mapped.dra_unresolved_examples.len() < UNKNOWN_EXAMPLES {
                        mapped
                            .dra_unresolved_examples
                            .push(format!("{}/{}", res.pool_name, res.device_name));
                    }
                }
            }
        }
    }
    out
}

/// The replicas (`…::N` ids) the device plugins offer per local GPU or MIG instance, from
/// the kubelet's `GetAllocatableResources`: what a shared GPU is divided into, held or not.
/// Entities offered whole are left out.
pub fn replica_counts(
    reply: &AllocatableResourcesResponse,
    devices: &[Device],
    opts: &MappingOptions,
) -> BTreeMap<EntityKey, u32> {
    let mut ids: BTreeMap<EntityKey, std::collections::BTreeSet<String>> = BTreeMap::new();
    for dev in reply
        .devices
        .iter()
        .filter(|d| opts.is_gpu_resource(&d.resource_name))
    {
        for id in &dev.device_ids {
            if let Some((key, Some(replica))) = resolve(id, devices, opts.id_type) {
                ids.entry(key).or_default().insert(replica);
            }
        }
    }
    ids.into_iter()
        .map(|(k, r)| (k, u32::try_from(r.len()).unwrap_or(u32::MAX)))
        .collect()
}

/// Where a device of an assignments file (`--sim-processes`) is among `devices`: the GPU index
/// and MIG GPU instance a device-plugin id ([`resolve`]) or a DRA device name
/// ([`dra::resolve`]) stands for, for [`Assignments::sim_processes`].
///
/// [`Assignments::sim_processes`]: crate::gpu::sim::assignments::Assignments::sim_processes
pub fn assigned_device(
    devices: &[Device],
    id_type: GpuIdType,
) -> impl Fn(&str, DeviceNaming) -> Option<(u32, Option<u32>)> + '_ {
    move |id, naming| {
        let key = match naming {
            DeviceNaming::Plugin => resolve(id, devices, id_type).map(|(k, _)| k),
            DeviceNaming::Dra => dra::resolve(id, devices).ok(),
        }?;
        Some((key.gpu, key.gi_id))
    }
}

/// Resolves one device id to an entity and replica id.
pub fn resolve(
    id: &str,
    devices: &[Device],
    id_type: GpuIdType,
) -> Option<(EntityKey, Option<String>)> {
    let id = id.trim();
    if let Some(rest) = strip_prefix_ci(id, "nvidia") {
        return resolve_device_name(rest, devices, id_type);
    }
    let (base, vgpu) = match id.rsplit_once("::") {
        Some((base, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
            (base, Some(n.to_owned()))
        }
        _ => (id, None),
    };
    let key = if let Some(rest) = strip_prefix_ci(base, "MIG-GPU-") {
        legacy_mig(rest, devices)?
    } else if starts_with_ci(base, "MIG-") {
        devices.iter().find_map(|d| {
            d.instances
                .iter()
                .find(|i| i.uuid.eq_ignore_ascii_case(base))
                .map(|i| EntityKey {
                    gpu: d.identity.index,
                    gi_id: Some(i.gi_id),
                })
        })?
    } else if starts_with_ci(base, "GPU-") && id_type == GpuIdType::Uid {
        devices
            .iter()
            .find(|d| d.identity.uuid.eq_ignore_ascii_case(base))
            .map(|d| EntityKey {
                gpu: d.identity.index,
                gi_id: None,
            })?
    } else {
        return None;
    };
    Some((key, vgpu))
}

/// `<uuid>/<gi>/<ci>` after `MIG-GPU-`.
fn legacy_mig(rest: &str, devices: &[Device]) -> Option<EntityKey> {
    let mut parts = rest.split('/');
    let uuid = parts.next()?;
    let gi: u32 = parts.next()?.parse().ok()?;
    let _ci: u32 = parts.next()?.parse().ok()?;
    if parts.next().is_some() {
        return None;
    }
    let d = devices.iter().find(|d| {
        d.identity
            .uuid
            .get(4..)
            .is_some_and(|u| u.eq_ignore_ascii_case(uuid))
    })?;
    d.instances
        .iter()
        .any(|i| i.gi_id == gi)
        .then_some(EntityKey {
            gpu: d.identity.index,
            gi_id: Some(gi),
        })
}

/// GKE's names after `nvidia`: `<N>`, `<N>/vgpu<K>`, `<N>/gi<M>`, `<N>/gi<M>/vgpu<K>`.
fn resolve_device_name(
    rest: &str,
    devices: &[Device],
    id_type: GpuIdType,
) -> Option<(EntityKey, Option<String>)> {
    let mut parts = rest.split('/');
    let minor = number(parts.next()?)?;
    let mut gi = None;
    let mut vgpu = None;
    let mut next = parts.next();
    if let Some(p) = next.and_then(|p| p.strip_prefix("gi")) {
        gi = Some(number(p)?);
        next = parts.next();
    }
    if let Some(p) = next {
        let k = p.strip_prefix("vgpu")?;
        number(k)?;
        vgpu = Some(k.to_owned());
        next = parts.next();
    }
    if next.is_some() {
        return None;
    }
    let d = devices.iter().find(|d| d.identity.minor == minor)?;
    let key = match gi {
        Some(gi) => {
            d.instances.iter().find(|i| i.gi_id == gi)?;
            EntityKey {
                gpu: d.identity.index,
                gi_id: Some(gi),
            }
        }
        None if id_type == GpuIdType::DeviceName => EntityKey {
            gpu: d.identity.index,
            gi_id: None,
        },
        None => return None,
    };
    Some((key, vgpu))
}

fn number(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn starts_with_ci(s: &str, prefix: &str) -> bool {
    s.len() >= prefix.len() && s.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    starts_with_ci(s, prefix).then(|| &s[prefix.len()..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::{GpuIdentity, MigInstance, MigPlacement};
    use crate::pods::proto::{
        CdiDevice, ClaimResource, ContainerDevices, ContainerResources, DynamicResource,
        PodResources,
    };

    const G0: &str = "GPU-11111111-2222-3333-4444-555555555555";
    const G1: &str = "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee";
    const M1_GI3: &str = "MIG-99999999-8888-7777-6666-555555555555";
    const M1_GI5: &str = "MIG-12121212-3434-5656-7878-909090909090";

    /// GPU 0: whole GPU, minor 0. GPU 1: MIG with instances 3 and 5, minor 4 (index ≠ minor).
    fn inventory() -> Vec<Device> {
        let ident = |index, uuid: &str, minor| GpuIdentity {
            index,
            uuid: uuid.to_owned(),
            pci_bus_id: format!("00000000:{index:02X}:00.0"),
            minor,
            model: "NVIDIA A100-SXM4-80GB".to_owned(),
        };
        vec![
            Device {
                identity: ident(0, G0, 0),
                mig_enabled: false,
                instances: vec![],
            },
            Device {
                identity: ident(1, G1, 4),
                mig_enabled: true,
                instances: vec![
                    MigInstance {
                        gi_id: 3,
                        ci_id: 0,
                        profile: "3g.40gb".to_owned(),
                        uuid: M1_GI3.to_owned(),
                        placement: Some(MigPlacement {
                            profile_id: 9,
                            start: 4,
                            size: 4,
                        }),
                    },
                    MigInstance {
                        gi_id: 5,
                        ci_id: 0,
                        profile: "1g.10gb".to_owned(),
                        uuid: M1_GI5.to_owned(),
                        placement: Some(MigPlacement {
                            profile_id: 19,
                            start: 2,
                            size: 1,
                        }),
                    },
                ],
            },
        ]
    }

    fn key(gpu: u32, gi: Option<u32>) -> EntityKey {
        EntityKey { gpu, gi_id: gi }
    }

    fn uid(id: &str) -> Option<(EntityKey, Option<String>)> {
        resolve(id, &inventory(), GpuIdType::Uid)
    }

    fn dn(id: &str) -> Option<(EntityKey, Option<String>)> {
        resolve(id, &inventory(), GpuIdType::DeviceName)
    }

    #[test]
    fn whole_gpu_uuid() {
        assert_eq!(uid(G0), Some((key(0, None), None)));
        assert_eq!(uid(&G1.to_uppercase()), Some((key(1, None), None)));
        assert_eq!(uid("GPU-00000000-0000-0000-0000-000000000000"), None);
        // device-name mode does not read UUIDs of whole GPUs (as dcgm-exporter).
        assert_eq!(dn(G0), None);
    }

    #[test]
    fn mig_uuid_in_both_modes() {
        assert_eq!(uid(M1_GI3), Some((key(1, Some(3)), None)));
        assert_eq!(uid(M1_GI5), Some((key(1, Some(5)), None)));
        assert_eq!(dn(M1_GI5), Some((key(1, Some(5)), None)));
        assert_eq!(uid("MIG-00000000-0000-0000-0000-000000000000"), None);
    }

    #[test]
    fn legacy_mig_gpu_form() {
        let legacy = format!("MIG-{G1}/3/0");
        assert_eq!(uid(&legacy), Some((key(1, Some(3)), None)));
        assert_eq!(
            uid(&format!("MIG-{G1}/5/1::2")),
            Some((key(1, Some(5)), Some("2".into())))
        );
        // An instance the GPU does not have, a malformed tail, another GPU.
        assert_eq!(uid(&format!("MIG-{G1}/4/0")), None);
        assert_eq!(uid(&format!("MIG-{G1}/3")), None);
        assert_eq!(uid(&format!("MIG-{G1}/3/0/1")), None);
        assert_eq!(uid(&format!("MIG-{G1}/x/0")), None);
        assert_eq!(
            uid("MIG-GPU-00000000-0000-0000-0000-000000000000/3/0"),
            None
        );
    }

    #[test]
    fn replica_counts_are_the_replicas_offered_per_shared_entity_held_or_not() {
        let ids = |v: &[String]| ContainerDevices {
            resource_name: "nvidia.com/gpu".into(),
            device_ids: v.to_vec(),
            ..Default::default()
        };
        let reply = AllocatableResourcesResponse {
            devices: vec![
                // GPU 0 time-sliced four ways (one id listed twice), MIG instance 5 two ways,
                // MIG instance 3 whole, and an id of no local GPU.
                ids(&(0..4).map(|n| format!("{G0}::{n}")).collect::<Vec<_>>()),
                ids(&[
                    format!("{G0}::2"),
                    format!("{M1_GI5}::0"),
                    format!("{M1_GI5}::1"),
                ]),
                ids(&[
                    M1_GI3.to_owned(),
                    "GPU-00000000-0000-0000-0000-000000000000::0".into(),
                ]),
                ContainerDevices {
                    resource_name: "example.com/fpga".into(),
                    device_ids: vec![format!("{G1}::0")],
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let got = replica_counts(&reply, &inventory(), &MappingOptions::default());
        assert_eq!(
            got,
            BTreeMap::from([(key(0, None), 4), (key(1, Some(5)), 2)]),
            "whole entities and other resources are left out"
        );
    }

    #[test]
    fn replica_suffixes() {
        assert_eq!(
            uid(&format!("{G0}::3")),
            Some((key(0, None), Some("3".into())))
        );
        assert_eq!(
            uid(&format!("{M1_GI3}::7")),
            Some((key(1, Some(3)), Some("7".into())))
        );
        // Not a replica suffix: the whole id must match, and does not.
        assert_eq!(uid(&format!("{G0}::")), None);
        assert_eq!(uid(&format!("{G0}::x")), None);
    }

    #[test]
    fn gke_device_names() {
        // nvidia<N> names the minor number: GPU 1 is /dev/nvidia4.
        assert_eq!(dn("nvidia0"), Some((key(0, None), None)));
        assert_eq!(dn("nvidia4"), Some((key(1, None), None)));
        assert_eq!(dn("nvidia1"), None);
        assert_eq!(dn("nvidia0/vgpu2"), Some((key(0, None), Some("2".into()))));
        assert_eq!(dn("nvidia4/gi3"), Some((key(1, Some(3)), None)));
        assert_eq!(
            dn("nvidia4/gi5/vgpu1"),
            Some((key(1, Some(5)), Some("1".into())))
        );
        // GKE MIG names work in uid mode too; whole-GPU names do not.
        assert_eq!(uid("nvidia4/gi3"), Some((key(1, Some(3)), None)));
        assert_eq!(uid("nvidia0"), None);
        assert_eq!(uid("nvidia0/vgpu2"), None);
        for bad in [
            "nvidia",
            "nvidiaX",
            "nvidia4/gi",
            "nvidia4/gi9",
            "nvidia0/vgpu",
            "nvidia0/vgpux",
            "nvidia4/gi3/vgpu1/extra",
            "nvidia4/vgpu1/gi3",
            "nvidia-uvm",
        ] {
            assert_eq!(dn(bad), None, "{bad}");
        }
    }

    #[test]
    fn garbage_ids_resolve_to_nothing() {
        for bad in ["", "0", "gpu0", "GPU-", "MIG-", "::1", "amd.com/gpu-0"] {
            assert_eq!(uid(bad), None, "{bad}");
            assert_eq!(dn(bad), None, "{bad}");
        }
    }

    fn pod(ns: &str, name: &str, containers: &[(&str, &str, &[&str])]) -> PodResources {
        PodResources {
            name: name.to_owned(),
            namespace: ns.to_owned(),
            containers: containers
                .iter()
                .map(|(c, res, ids)| ContainerResources {
                    name: (*c).to_owned(),
                    devices: vec![ContainerDevices {
                        resource_name: (*res).to_owned(),
                        device_ids: ids.iter().map(|s| (*s).to_owned()).collect(),
                        topology: None,
                    }],
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        }
    }

    fn holder(ns: &str, pod: &str, c: &str, vgpu: Option<&str>) -> Holder {
        Holder {
            pod: PodRef {
                namespace: ns.into(),
                pod: pod.into(),
                container: c.into(),
            },
            vgpu: vgpu.map(Into::into),
            dra: None,
        }
    }

    #[test]
    fn reply_maps_whole_mig_and_shared_gpus_and_skips_the_rest() {
        let reply = ListPodResourcesResponse {
            pod_resources: vec![
                pod("ml", "trainer", &[("main", GPU_RESOURCE, &[G0])]),
                pod(
                    "ml",
                    "infer",
                    &[("srv", "nvidia.com/mig-3g.40gb", &[M1_GI3])],
                ),
                pod("web", "nginx", &[("nginx", "cpu", &["0", "1"])]),
                pod("ml", "other-vendor", &[("x", "amd.com/gpu", &[G0])]),
                pod(
                    "ml",
                    "stale",
                    &[("c", GPU_RESOURCE, &["GPU-gone", "MIG-gone"])],
                ),
                pod(
                    "ml",
                    "renamed",
                    &[("c", "nvidia.com/gpu.shared", &[M1_GI5])],
                ),
            ],
        };
        let m = attribution_from(&reply, &inventory(), &MappingOptions::default());
        assert_eq!(
            m.attribution.holders_of(key(0, None)),
            [holder("ml", "trainer", "main", None)]
        );
        assert_eq!(
            m.attribution.holders_of(key(1, Some(3))),
            [holder("ml", "infer", "srv", None)]
        );
        // gpu.shared is not a GPU resource unless named.
        assert!(m.attribution.holders_of(key(1, Some(5))).is_empty());
        assert_eq!(m.attribution.holders.len(), 2);
        assert_eq!(m.unknown_devices, 2);
        assert_eq!(m.unknown_examples, ["GPU-gone", "MIG-gone"]);

        let opts = MappingOptions {
            extra_resource_names: vec!["nvidia.com/gpu.shared".into()],
            id_type: GpuIdType::Uid,
            ..Default::default()
        };
        let m = attribution_from(&reply, &inventory(), &opts);
        assert_eq!(
            m.attribution.holders_of(key(1, Some(5))),
            [holder("ml", "renamed", "c", None)]
        );
    }

    #[test]
    fn shared_gpu_holders_are_sorted_and_deduplicated_whatever_the_reply_order() {
        let pods = vec![
            pod("b", "p2", &[("c", GPU_RESOURCE, &[&format!("{G0}::2")])]),
            pod("a", "p9", &[("c", GPU_RESOURCE, &[&format!("{G0}::0")])]),
            pod(
                "a",
                "p1",
                &[(
                    "z",
                    GPU_RESOURCE,
                    &[&format!("{G0}::1"), &format!("{G0}::1")],
                )],
            ),
            pod("a", "p1", &[("y", GPU_RESOURCE, &[&format!("{G0}::3")])]),
        ];
        let want = [
            holder("a", "p1", "y", Some("3")),
            holder("a", "p1", "z", Some("1")),
            holder("a", "p9", "c", Some("0")),
            holder("b", "p2", "c", Some("2")),
        ];
        let mut reply = ListPodResourcesResponse {
            pod_resources: pods,
        };
        let first = attribution_from(&reply, &inventory(), &MappingOptions::default());
        assert_eq!(first.attribution.holders_of(key(0, None)), want);
        reply.pod_resources.reverse();
        let second = attribution_from(&reply, &inventory(), &MappingOptions::default());
        assert_eq!(first, second);
    }

    #[test]
    fn device_name_mode_maps_gke_ids() {
        let reply = ListPodResourcesResponse {
            pod_resources: vec![
                pod("g", "a", &[("c", GPU_RESOURCE, &["nvidia0/vgpu0"])]),
                pod("g", "b", &[("c", GPU_RESOURCE, &["nvidia0/vgpu1"])]),
                pod("g", "m", &[("c", GPU_RESOURCE, &["nvidia4/gi5"])]),
            ],
        };
        let opts = MappingOptions {
            extra_resource_names: vec![],
            id_type: GpuIdType::DeviceName,
            ..Default::default()
        };
        let m = attribution_from(&reply, &inventory(), &opts);
        assert_eq!(
            m.attribution.holders_of(key(0, None)),
            [
                holder("g", "a", "c", Some("0")),
                holder("g", "b", "c", Some("1"))
            ]
        );
        assert_eq!(
            m.attribution.holders_of(key(1, Some(5))),
            [holder("g", "m", "c", None)]
        );
        assert_eq!(m.unknown_devices, 0);
    }

    #[test]
    fn empty_inventory_counts_every_gpu_id_as_unknown() {
        let reply = ListPodResourcesResponse {
            pod_resources: vec![pod("a", "p", &[("c", GPU_RESOURCE, &[G0, M1_GI3])])],
        };
        let m = attribution_from(&reply, &[], &MappingOptions::default());
        assert!(m.attribution.holders.is_empty());
        assert_eq!(m.unknown_devices, 2);
    }

    fn claim(name: &str, ns: &str, devices: &[(&str, &str)]) -> DynamicResource {
        let mut cdi = Vec::new();
        DynamicResource {
            claim_name: name.to_owned(),
            claim_namespace: ns.to_owned(),
            claim_resources: devices
                .iter()
                .map(|(driver, device)| {
                    // As the 1.34 kubelet does: each device also lists the CDI ids of the
                    // driver's earlier devices.
                    cdi.push(CdiDevice {
                        name: format!("k8s.gpu.nvidia.com/claim=0000-{device}"),
                    });
                    ClaimResource {
                        cdi_devices: cdi.clone(),
                        driver_name: (*driver).to_owned(),
                        pool_name: "node-a".to_owned(),
                        device_name: (*device).to_owned(),
                        share_id: None,
                    }
                })
                .collect(),
        }
    }

    fn dra_pod(
        ns: &str,
        name: &str,
        container: &str,
        claims: Vec<DynamicResource>,
    ) -> PodResources {
        PodResources {
            name: name.to_owned(),
            namespace: ns.to_owned(),
            containers: vec![ContainerResources {
                name: container.to_owned(),
                dynamic_resources: claims,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    fn dra_holder(ns: &str, pod: &str, c: &str, claim: &str, device: &str) -> Holder {
        Holder {
            dra: Some(DraClaim {
                claim_name: claim.into(),
                claim_namespace: ns.into(),
                driver: NVIDIA_GPU_DRIVER.into(),
                pool: "node-a".into(),
                device: device.into(),
            }),
            ..holder(ns, pod, c, None)
        }
    }

    fn dra_reply() -> ListPodResourcesResponse {
        ListPodResourcesResponse {
            pod_resources: vec![
                // A whole GPU (minor 0) and a MIG instance of GPU 1 (minor 4) in one claim.
                dra_pod(
                    "ml",
                    "trainer",
                    "main",
                    vec![claim(
                        "trainer-gpus",
                        "ml",
                        &[
                            (NVIDIA_GPU_DRIVER, "gpu-0"),
                            (NVIDIA_GPU_DRIVER, "gpu-4-mig-3g40gb-9-4"),
                        ],
                    )],
                ),
                // The legacy MIG name form; and another vendor's driver, ignored.
                dra_pod(
                    "ml",
                    "infer",
                    "srv",
                    vec![
                        claim(
                            "infer-mig",
                            "ml",
                            &[(NVIDIA_GPU_DRIVER, "gpu-4-mig-19-2-1")],
                        ),
                        claim("nic", "ml", &[("dra.example.com", "gpu-0")]),
                    ],
                ),
                // Unresolvable: passthrough, a GPU this node lacks, an instance it lacks.
                dra_pod(
                    "dev",
                    "odd",
                    "c",
                    vec![claim(
                        "odd",
                        "dev",
                        &[
                            (NVIDIA_GPU_DRIVER, "gpu-vfio-0"),
                            (NVIDIA_GPU_DRIVER, "gpu-7"),
                            (NVIDIA_GPU_DRIVER, "gpu-4-mig-1g10gb-19-6"),
                        ],
                    )],
                ),
            ],
        }
    }

    #[test]
    fn dra_devices_map_to_gpus_and_mig_instances_with_their_claims() {
        let opts = MappingOptions {
            enable_dra: true,
            ..Default::default()
        };
        let m = attribution_from(&dra_reply(), &inventory(), &opts);
        assert_eq!(
            m.attribution.holders_of(key(0, None)),
            [dra_holder("ml", "trainer", "main", "trainer-gpus", "gpu-0")]
        );
        assert_eq!(
            m.attribution.holders_of(key(1, Some(3))),
            [dra_holder(
                "ml",
                "trainer",
                "main",
                "trainer-gpus",
                "gpu-4-mig-3g40gb-9-4"
            )]
        );
        assert_eq!(
            m.attribution.holders_of(key(1, Some(5))),
            [dra_holder(
                "ml",
                "infer",
                "srv",
                "infer-mig",
                "gpu-4-mig-19-2-1"
            )]
        );
        assert_eq!(m.attribution.holders.len(), 3);
        // The other driver's device is not counted anywhere; the unresolvable ones are.
        assert_eq!(m.unknown_devices, 0);
        assert_eq!(
            m.dra_unresolved,
            BTreeMap::from([("no_match", 2), ("unrecognised_name", 1)])
        );
        assert_eq!(
            m.dra_unresolved_examples,
            [
                "node-a/gpu-vfio-0",
                "node-a/gpu-7",
                "node-a/gpu-4-mig-1g10gb-19-6"
            ]
        );
        assert_eq!(m.dra_ignored, 0);
    }

    #[test]
    fn without_the_flag_dra_devices_are_ignored_but_noticed() {
        let m = attribution_from(&dra_reply(), &inventory(), &MappingOptions::default());
        assert!(m.attribution.holders.is_empty());
        assert!(m.dra_unresolved.is_empty());
        assert_eq!(m.dra_ignored, 6);
    }

    #[test]
    fn device_plugin_and_dra_holders_of_one_entity_are_both_kept_sorted() {
        let mut reply = dra_reply();
        reply
            .pod_resources
            .push(pod("ml", "classic", &[("c", GPU_RESOURCE, &[G0])]));
        let opts = MappingOptions {
            enable_dra: true,
            ..Default::default()
        };
        let m = attribution_from(&reply, &inventory(), &opts);
        assert_eq!(
            m.attribution.holders_of(key(0, None)),
            [
                holder("ml", "classic", "c", None),
                dra_holder("ml", "trainer", "main", "trainer-gpus", "gpu-0"),
            ]
        );
    }
}
