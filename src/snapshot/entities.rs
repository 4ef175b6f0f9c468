//! Step 1, which entities: the GPUs and MIG instances that `-d/--devices` selects, the NVLinks of
//! the GPUs it selects them for, and every GPU for the health family (health is about the
//! hardware, whatever `-d` says). Each comes with its label prefix (identity, hostname and
//! label-type fields), escaped here once per sample and shared by every copy of its series.

use super::model::{BuildOptions, DeviceOutcome, Names};
use crate::catalog::{Catalog, Field};
use crate::gpu::{LinkSample, MigInstance};
use crate::render::push_label;

/// A GPU, a MIG instance of one, or an NVLink of one.
pub(super) struct Entity<'a> {
    pub(super) outcome: &'a DeviceOutcome,
    pub(super) instance: Option<&'a MigInstance>,
    /// For a link entity: its link (then `instance` is `None`).
    pub(super) link: Option<&'a LinkSample>,
    /// Escaped label prefix: identity, hostname and label-type fields.
    pub(super) prefix: String,
}

/// The exported entities, by the families they appear in.
pub(super) struct Entities<'a> {
    /// GPUs and MIG instances, each GPU's instances after it.
    pub(super) devices: Vec<Entity<'a>>,
    /// NVLinks; none unless the catalog has a link field.
    pub(super) links: Vec<Entity<'a>>,
    /// Every GPU as a whole; none unless the catalog has the health field.
    pub(super) health: Vec<Entity<'a>>,
}

/// The entities of `outcomes` that `opts` exports, each with its prefix.
pub(super) fn select<'a>(
    catalog: &Catalog,
    outcomes: &'a [DeviceOutcome],
    opts: &BuildOptions,
) -> Entities<'a> {
    let selection = &opts.selection;
    let mut devices = Vec::new();
    for outcome in outcomes {
        let d = &outcome.device;
        if selection.gpu_selected(d) {
            devices.push(device(catalog, outcome, None, opts));
        }
        for inst in &d.instances {
            if selection.instance_selected(d, inst) {
                devices.push(device(catalog, outcome, Some(inst), opts));
            }
        }
    }

    let mut links = Vec::new();
    if catalog.metrics.iter().any(|m| m.field.is_link()) {
        for outcome in outcomes {
            if !selection.links_selected(&outcome.device) {
                continue;
            }
            if let Ok(sample) = &outcome.sample {
                for l in &sample.links {
                    links.push(link(catalog, outcome, l, opts));
                }
            }
        }
    }

    // As dcgm-exporter reports health: for GPUs, not MIG instances.
    let health = if catalog
        .metrics
        .iter()
        .any(|m| m.field == Field::ExpGpuHealthStatus)
    {
        outcomes
            .iter()
            .map(|o| device(catalog, o, None, opts))
            .collect()
    } else {
        Vec::new()
    };
    Entities {
        devices,
        links,
        health,
    }
}

/// A GPU or MIG `instance`, labelled `gpu, UUID, pci_bus_id, device, modelName,
/// [GPU_I_PROFILE, GPU_I_ID], hostname`, then the label-type fields.
fn device<'a>(
    catalog: &Catalog,
    outcome: &'a DeviceOutcome,
    instance: Option<&'a MigInstance>,
    opts: &BuildOptions,
) -> Entity<'a> {
    let id = &outcome.device.identity;
    let mut prefix = String::with_capacity(256);
    push_label(&mut prefix, "gpu", &id.index.to_string());
    push_label(&mut prefix, Names::of(opts).uuid, &id.uuid);
    push_label(&mut prefix, "pci_bus_id", &id.pci_bus_id);
    // dcgm-exporter writes `nvidia<DCGM GPU index>`, not the minor number of /dev/nvidiaN.
    push_label(&mut prefix, "device", &format!("nvidia{}", id.index));
    if opts.replace_blanks_in_model_name {
        push_label(&mut prefix, "modelName", &id.model.replace(' ', "-"));
    } else {
        push_label(&mut prefix, "modelName", &id.model);
    }
    if let Some(inst) = instance {
        push_label(&mut prefix, "GPU_I_PROFILE", &inst.profile);
        push_label(&mut prefix, "GPU_I_ID", &inst.gi_id.to_string());
    }
    if !opts.hostname.is_empty() {
        push_label(&mut prefix, &opts.hostname_label, &opts.hostname);
    }
    push_label_fields(&mut prefix, catalog, outcome, |_| true);
    Entity {
        outcome,
        instance,
        link: None,
        prefix,
    }
}

/// A GPU's NVLink as dcgm-exporter renders link entities: `nvlink` (the link index + 1, as
/// dcgm-exporter numbers a GPU's links from 1), then the parent GPU as `gpu`, `gpu_uuid`,
/// `pci_bus_id`, `device`, `model_name` (these names, and a lowercase `hostname`, whatever the
/// GPU series use), then the system-wide label-type fields (driver version).
fn link<'a>(
    catalog: &Catalog,
    outcome: &'a DeviceOutcome,
    link: &'a LinkSample,
    opts: &BuildOptions,
) -> Entity<'a> {
    let id = &outcome.device.identity;
    let mut prefix = String::with_capacity(256);
    push_label(
        &mut prefix,
        "nvlink",
        &(u64::from(link.link) + 1).to_string(),
    );
    push_label(&mut prefix, "gpu", &id.index.to_string());
    push_label(&mut prefix, "gpu_uuid", &id.uuid);
    push_label(&mut prefix, "pci_bus_id", &id.pci_bus_id);
    push_label(&mut prefix, "device", &format!("nvidia{}", id.index));
    push_label(&mut prefix, "model_name", &id.model);
    if !opts.hostname.is_empty() {
        push_label(&mut prefix, "hostname", &opts.hostname);
    }
    push_label_fields(&mut prefix, catalog, outcome, Field::is_system);
    Entity {
        outcome,
        instance: None,
        link: Some(link),
        prefix,
    }
}

fn push_label_fields(
    prefix: &mut String,
    catalog: &Catalog,
    outcome: &DeviceOutcome,
    which: impl Fn(Field) -> bool,
) {
    for spec in catalog.labels.iter().filter(|s| which(s.field)) {
        if let Some((_, v)) = outcome.labels.iter().find(|(f, _)| *f == spec.field) {
            push_label(prefix, &spec.name, &v.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::catalog;
    use crate::catalog::Field;
    use crate::gpu::{FieldError, Value};
    use crate::pods::{Attribution, EntityKey};
    use crate::snapshot::testkit::*;
    use crate::snapshot::{build, DeviceSelection, POD_INFO};
    #[test]
    fn flex_exports_instances_for_mig_gpus_with_instance_and_parent_fields() {
        let outcomes = [
            outcome(
                device(0, "A100", &[(2, "3g.40gb"), (9, "1g.10gb")]),
                50,
                1000,
            ),
            outcome(device(1, "A100", &[]), 41, 7),
        ];
        let s = build(&cat(), &outcomes, &Attribution::default(), &opts());
        let fb = lines(&s, "DCGM_FI_DEV_FB_USED");
        assert_eq!(fb.len(), 3);
        assert!(
            fb[0].contains("GPU_I_PROFILE=\"3g.40gb\",GPU_I_ID=\"2\",hostname")
                && fb[0].ends_with(" 1002")
        );
        assert!(fb[1].contains("GPU_I_ID=\"9\"") && fb[1].ends_with(" 1009"));
        assert!(
            fb[2].contains("gpu=\"1\"") && !fb[2].contains("GPU_I_ID") && fb[2].ends_with(" 7")
        );
        // Temperature is the parent's, on each instance.
        let temp = lines(&s, "DCGM_FI_DEV_GPU_TEMP");
        assert_eq!(temp.iter().filter(|l| l.ends_with(" 50")).count(), 2);
    }

    #[test]
    fn label_order_matches_dcgm_exporter_and_model_names_are_escaped() {
        let s = build(
            &cat(),
            &[outcome(device(0, "A \"quoted\" GPU", &[]), 40, 100)],
            &Attribution::default(),
            &opts(),
        );
        assert_eq!(
            lines(&s, "DCGM_FI_DEV_GPU_TEMP"),
            vec![
                r#"DCGM_FI_DEV_GPU_TEMP{gpu="0",UUID="GPU-0",pci_bus_id="00000000:00:00.0",device="nvidia0",modelName="A \"quoted\" GPU",hostname="n1",DCGM_FI_DRIVER_VERSION="570.1"} 40"#
            ]
        );
        // A failed read is absent and counted; the others stay.
        assert!(lines(&s, "DCGM_FI_DEV_GPU_UTIL").is_empty());
        assert_eq!(
            s.field_errors,
            vec![(Field::GpuUtil, FieldError::NoPermission)]
        );
    }

    #[test]
    fn the_device_label_names_the_gpu_index_not_the_minor_number() {
        let mut d = device(1, "G", &[(3, "1g.10gb")]);
        d.identity.minor = 7;
        let s = build(
            &cat(),
            &[outcome(d, 40, 100)],
            &Attribution::default(),
            &opts(),
        );
        let temps = lines(&s, "DCGM_FI_DEV_GPU_TEMP");
        assert_eq!(temps.len(), 1);
        assert!(
            temps[0].contains(r#"gpu="1""#) && temps[0].contains(r#"device="nvidia1""#),
            "{temps:?}"
        );
    }

    #[test]
    fn old_namespace_renames_uuid_and_pod_labels_only() {
        let mut holders = std::collections::BTreeMap::new();
        holders.insert(
            EntityKey {
                gpu: 1,
                gi_id: None,
            },
            vec![holder("solo", None)],
        );
        holders.insert(
            EntityKey {
                gpu: 0,
                gi_id: None,
            },
            vec![holder("a", Some("0")), holder("b", Some("1"))],
        );
        let att = Attribution {
            holders,
            ..Default::default()
        };
        let outcomes = [
            outcome(device(0, "H100", &[]), 50, 1),
            outcome(device(1, "H100", &[]), 51, 2),
        ];
        let mut o = opts();
        o.old_namespace = true;
        let s = build(&cat(), &outcomes, &att, &o);
        let temp = lines(&s, "DCGM_FI_DEV_GPU_TEMP");
        assert_eq!(
            temp[1],
            r#"DCGM_FI_DEV_GPU_TEMP{gpu="1",uuid="GPU-1",pci_bus_id="00000000:01:00.0",device="nvidia1",modelName="H100",hostname="n1",DCGM_FI_DRIVER_VERSION="570.1",container_name="c",pod_name="solo",pod_namespace="ns"} 51"#
        );
        assert!(!temp[0].contains("UUID=") && temp[0].contains(r#"uuid="GPU-0""#));
        let info = lines(&s, POD_INFO);
        assert!(
            info[0].contains(
                r#"uuid="GPU-0",pod_name="a",pod_namespace="ns",container_name="c",vgpu="0""#
            ),
            "{}",
            info[0]
        );
        o.virtual_gpus = true;
        let temp = lines(&build(&cat(), &outcomes, &att, &o), "DCGM_FI_DEV_GPU_TEMP");
        assert!(
            temp[0].ends_with(r#"container_name="c",pod_name="a",pod_namespace="ns",vgpu="0"} 50"#),
            "{}",
            temp[0]
        );
    }

    #[test]
    fn links_render_as_dcgm_exporter_link_entities() {
        let cat = catalog::parse(
            "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL, counter, r\nDCGM_FI_DRIVER_VERSION, label, d\nDCGM_FI_DEV_SERIAL, label, s\n",
            "t.csv",
        )
        .unwrap()
        .0;
        let mut a = outcome(device(0, "H100 SXM", &[]), 50, 1);
        a.labels.push((Field::Serial, Value::Text("123".into())));
        let outcomes = [
            with_links(a, &[(0, 0), (3, 7)]),
            with_links(outcome(device(1, "H100 SXM", &[]), 51, 2), &[(0, 1)]),
        ];
        let mut holders = std::collections::BTreeMap::new();
        holders.insert(
            EntityKey {
                gpu: 1,
                gi_id: None,
            },
            vec![holder("solo", None)],
        );
        let att = Attribution {
            holders,
            ..Default::default()
        };
        let mut o = opts();
        // The GPU series' options do not change the link labels' names.
        o.hostname_label = "Hostname".into();
        o.replace_blanks_in_model_name = true;
        let s = build(&cat, &outcomes, &att, &o);
        let links = lines(&s, "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL");
        assert_eq!(
            links,
            vec![
                r#"DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL{nvlink="1",gpu="0",gpu_uuid="GPU-0",pci_bus_id="00000000:00:00.0",device="nvidia0",model_name="H100 SXM",hostname="n1",DCGM_FI_DRIVER_VERSION="570.1"} 0"#,
                r#"DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL{nvlink="4",gpu="0",gpu_uuid="GPU-0",pci_bus_id="00000000:00:00.0",device="nvidia0",model_name="H100 SXM",hostname="n1",DCGM_FI_DRIVER_VERSION="570.1"} 7"#,
                r#"DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL{nvlink="1",gpu="1",gpu_uuid="GPU-1",pci_bus_id="00000000:01:00.0",device="nvidia1",model_name="H100 SXM",hostname="n1",DCGM_FI_DRIVER_VERSION="570.1",container="c",namespace="ns",pod="solo"} 1"#,
            ]
        );
        // GPU series keep theirs, and no link field leaks onto them.
        let temp = lines(&s, "DCGM_FI_DEV_GPU_TEMP");
        assert!(temp[0].contains(r#"modelName="H100-SXM",Hostname="n1",DCGM_FI_DEV_SERIAL="123""#));
        // 2 GPU temperatures, 3 links, 1 pod-info series.
        assert_eq!(s.series, 2 + 3 + 1);
        // -o renames the pod labels on links too (gpu_uuid stays).
        o.old_namespace = true;
        let links = lines(
            &build(&cat, &outcomes, &att, &o),
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL",
        );
        assert!(
            links[2].ends_with(r#"gpu_uuid="GPU-1",pci_bus_id="00000000:01:00.0",device="nvidia1",model_name="H100 SXM",hostname="n1",DCGM_FI_DRIVER_VERSION="570.1",container_name="c",pod_name="solo",pod_namespace="ns"} 1"#),
            "{}",
            links[2]
        );
        // Links follow -d: g:ids picks their GPUs, i: none.
        o.selection = DeviceSelection::Gpus(Some(vec![1]));
        let links = lines(
            &build(&cat, &outcomes, &att, &o),
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL",
        );
        assert_eq!(links.len(), 1);
        assert!(links[0].contains(r#"gpu="1""#));
        o.selection = DeviceSelection::Instances(None);
        assert!(lines(
            &build(&cat, &outcomes, &att, &o),
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL"
        )
        .is_empty());
    }

    #[test]
    fn links_carry_their_gpus_jobs_and_dra_claims_and_old_names_apply_to_dra_copies() {
        let cat = catalog::parse(
            "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL, counter, r\n",
            "t.csv",
        )
        .unwrap()
        .0;
        let outcomes = [with_links(
            outcome(device(0, "H100", &[]), 50, 1),
            &[(2, 5)],
        )];
        let mut holders = std::collections::BTreeMap::new();
        holders.insert(key(0, None), vec![dra_holder("p", "claim", "gpu-0")]);
        let mut jobs = std::collections::BTreeMap::new();
        jobs.insert(key(0, None), vec!["42".to_owned()]);
        let att = Attribution {
            holders,
            jobs,
            ..Default::default()
        };
        let link = &lines(
            &build(&cat, &outcomes, &att, &opts()),
            "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL",
        )[0];
        assert!(
            link.ends_with(r#"hostname="n1",container="c",dra_claim_name="claim",dra_claim_namespace="ns",dra_device_name="gpu-0",dra_driver_name="gpu.nvidia.com",dra_pool_name="n1",hpc_job="42",namespace="ns",pod="p"} 5"#),
            "{link}"
        );
        let mut o = opts();
        o.old_namespace = true;
        let temp = &lines(&build(&cat, &outcomes, &att, &o), "DCGM_FI_DEV_GPU_TEMP")[0];
        assert!(
            temp.ends_with(r#"container_name="c",dra_claim_name="claim",dra_claim_namespace="ns",dra_device_name="gpu-0",dra_driver_name="gpu.nvidia.com",dra_pool_name="n1",hpc_job="42",pod_name="p",pod_namespace="ns"} 50"#),
            "{temp}"
        );
    }
}
