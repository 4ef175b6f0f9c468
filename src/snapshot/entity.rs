//! The exported entities: GPUs, MIG instances and NVLinks, each with its escaped label prefix, its
//! copies and who holds and uses it, and where its readings are found (a MIG instance reads its
//! own fields and its parent GPU's).

use super::copies::{with_container_copies, Ctx, Variant};
use super::labels::{identity_labels, push_label_fields};
use super::model::DeviceOutcome;
use crate::catalog::field::MigScope;
use crate::catalog::Field;
use crate::gpu::{LinkSample, MigInstance, Reading};
use crate::pods::usage::EntityUsage;
use crate::pods::{EntityKey, Holder};
use crate::render::push_label;

pub(super) struct Entity<'a> {
    pub(super) outcome: &'a DeviceOutcome,
    pub(super) instance: Option<&'a MigInstance>,
    /// For a link entity: its link (then `instance` is `None`).
    pub(super) link: Option<&'a LinkSample>,
    /// Escaped label prefix: identity, hostname and label-type fields.
    pub(super) prefix: String,
    /// Attribute sets, one per exported copy of each series.
    pub(super) variants: Vec<Variant>,
    /// With `--kubernetes-virtual-gpus` on an entity shared through the device plugin: the
    /// device-level copies (no pod attributes; one per HPC job) that dcgm-exporter keeps next
    /// to the per-pod copies of the per-process fields. Empty otherwise.
    pub(super) device_variants: Vec<Variant>,
    /// Who holds the entity.
    pub(super) holders: &'a [Holder],
    /// Who runs processes on it, when known.
    pub(super) usage: Option<&'a EntityUsage>,
}

impl Entity<'_> {
    pub(super) fn reading(&self, field: Field) -> Option<&Reading> {
        let sample = self.outcome.sample.as_ref().ok()?;
        let find = |rs: &'_ [(Field, Reading)]| -> Option<usize> {
            rs.iter().position(|(f, _)| *f == field)
        };
        if let Some(link) = self.link {
            return find(&link.readings).map(|i| &link.readings[i].1);
        }
        match (self.instance, field.mig_scope()) {
            (None, _) | (Some(_), MigScope::Parent) => {
                find(&sample.readings).map(|i| &sample.readings[i].1)
            }
            (Some(inst), MigScope::Instance) => {
                let is = sample.instances.iter().find(|s| s.gi_id == inst.gi_id)?;
                find(&is.readings).map(|i| &is.readings[i].1)
            }
            (Some(_), MigScope::Unsupported | MigScope::Gpu | MigScope::Link) => None,
        }
    }
}

pub(super) fn entity<'a>(
    ctx: &Ctx<'a>,
    outcome: &'a DeviceOutcome,
    instance: Option<&'a MigInstance>,
) -> Entity<'a> {
    let key = EntityKey {
        gpu: outcome.device.identity.index,
        gi_id: instance.map(|i| i.gi_id),
    };
    let holders = ctx.attribution.holders_of(key);
    let usage = ctx.workload.usage.get(&key);
    let mut prefix = identity_labels(outcome, instance, ctx.opts);
    push_label_fields(&mut prefix, ctx.catalog, outcome, |_| true);
    let jobs = ctx.attribution.jobs_of(key);
    let mut variants = ctx.variants(&prefix, holders, instance, jobs, usage);
    if ctx.opts.container_labels {
        if let Some(u) = usage {
            variants = with_container_copies(&prefix, variants, u, ctx.names);
        }
    }
    // dcgm-exporter 4.8.2+ (#594): "original device-level metric" kept next to the per-pod
    // copies of GPU_UTIL and FB_USED when pods share the device (DRA holders take another path).
    let shared =
        ctx.opts.virtual_gpus && !holders.is_empty() && holders.iter().all(|h| h.dra.is_none());
    let device_variants = if shared {
        ctx.variants(&prefix, &[], instance, jobs, None)
    } else {
        Vec::new()
    };
    Entity {
        outcome,
        instance,
        link: None,
        prefix,
        variants,
        device_variants,
        holders,
        usage,
    }
}

/// A GPU's NVLink as dcgm-exporter renders link entities: `nvlink` (the link index + 1, as
/// dcgm-exporter numbers a GPU's links from 1), then the parent GPU as `gpu`, `gpu_uuid`,
/// `pci_bus_id`, `device`, `model_name` (these names, and a lowercase `hostname`, whatever the
/// GPU series use), then the system-wide label-type fields (driver version), then the pod
/// labels (with `pod_uid` and the pod's labels) of the pods holding the whole GPU and its HPC
/// jobs. Links carry no per-process values.
pub(super) fn link_entity<'a>(
    ctx: &Ctx<'a>,
    outcome: &'a DeviceOutcome,
    link: &'a LinkSample,
) -> Entity<'a> {
    let opts = ctx.opts;
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
    push_label_fields(&mut prefix, ctx.catalog, outcome, Field::is_system);
    let gpu = EntityKey {
        gpu: id.index,
        gi_id: None,
    };
    let holders = ctx.attribution.holders_of(gpu);
    // As dcgm-exporter, links carry their GPU's job labels (its `<gpu>` file).
    let variants = ctx.variants(&prefix, holders, None, ctx.attribution.jobs_of(gpu), None);
    Entity {
        outcome,
        instance: None,
        link: Some(link),
        prefix,
        variants,
        device_variants: Vec::new(),
        // Shared GPUs are joined through the GPU's own pod-info series.
        holders: &[],
        usage: None,
    }
}

#[cfg(test)]
mod tests {
    use crate::catalog;
    use crate::catalog::Field;
    use crate::gpu::Value;
    use crate::pods::{Attribution, EntityKey};
    use crate::snapshot::testkit::*;
    use crate::snapshot::{build, DeviceSelection};

    #[test]
    fn gpu_level_gpm_readings_stay_on_the_gpu_and_parent_readings_repeat_on_instances() {
        let (cat, _) = catalog::parse(
            "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_PROF_PCIE_TX_BYTES, gauge, p\n",
            "t.csv",
        )
        .unwrap();
        let mut o = outcome(device(0, "G", &[(1, "1g.10gb"), (2, "1g.10gb")]), 40, 100);
        if let Ok(s) = o.sample.as_mut() {
            s.readings
                .push((Field::ProfPcieTxBytes, Ok(Value::Float(1_048_576.0))));
        }
        let flex = build(
            &cat,
            std::slice::from_ref(&o),
            &Attribution::default(),
            &opts(),
        );
        assert_eq!(lines(&flex, "DCGM_FI_DEV_GPU_TEMP").len(), 2);
        assert!(lines(&flex, "DCGM_FI_PROF_PCIE_TX_BYTES").is_empty());
        let mut whole = opts();
        whole.selection = DeviceSelection::Gpus(None);
        let whole = build(&cat, &[o], &Attribution::default(), &whole);
        assert_eq!(lines(&whole, "DCGM_FI_PROF_PCIE_TX_BYTES").len(), 1);
    }

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
