//! Step 4, which series: the catalog's families, each with one series per copy of each entity:
//! its reading (a MIG instance reads its own fields and its parent GPU's; a copy may carry its
//! holder's own use instead), the event-window fields with their per-series attributes
//! (`err_code`, `xid`, `clock_event`, `window_size_in_ms`) and their zero series, and the health
//! checks per GPU.

use std::sync::Arc;

use super::entities::Entity;
use super::labels::{Labelled, LabelledEntity, Labels};
use super::model::{BuildOptions, Snapshot};
use crate::catalog::field::MigScope;
use crate::catalog::{Catalog, Field, MetricSpec};
use crate::gpu::{FieldError, Reading, Value};
use crate::health;
use crate::render::{push_label, Family, Series};

/// The catalog's families, in its order, into `snap`.
pub(super) fn families(
    catalog: &Catalog,
    labels: &Labels<'_>,
    opts: &BuildOptions,
    snap: &mut Snapshot,
) {
    for spec in &catalog.metrics {
        let mut fam = Family {
            name: spec.name.clone(),
            help: spec.help.clone(),
            kind: spec.kind,
            series: Vec::with_capacity(labels.devices.len()),
        };
        match spec.field {
            Field::ExpGpuHealthStatus => health_series(&labels.health, opts, &mut fam),
            f if f.is_link() => {
                for e in &labels.links {
                    entity_series(spec, e, opts, &mut fam, &mut snap.field_errors);
                }
            }
            _ => {
                for e in &labels.devices {
                    entity_series(spec, e, opts, &mut fam, &mut snap.field_errors);
                }
            }
        }
        snap.push(fam);
    }
}

fn entity_series(
    spec: &MetricSpec,
    e: &LabelledEntity<'_>,
    opts: &BuildOptions,
    fam: &mut Family,
    errors: &mut Vec<(Field, FieldError)>,
) {
    let prefix = &e.entity.prefix;
    let mut push = |extras: &[(&'static str, String)], value: Value| {
        for variant in &e.variants {
            fam.series.push(Series {
                labels: series_labels(prefix, extras, variant),
                value: value.clone(),
            });
        }
    };
    let recent = &e.entity.outcome.recent;
    match spec.field {
        Field::XidErrors => {
            let xid = recent.last_xid.unwrap_or(0);
            push(
                &[
                    ("err_code", xid.to_string()),
                    ("err_msg", health::xid_message(xid).to_owned()),
                ],
                Value::Int(i64::try_from(xid).unwrap_or(i64::MAX)),
            );
        }
        Field::ExpXidErrorsCount => {
            let window = ("window_size_in_ms", opts.xid_window_ms.to_string());
            if recent.xid_counts.is_empty() {
                push(std::slice::from_ref(&window), Value::Int(0));
            }
            for &(xid, n) in &recent.xid_counts {
                push(
                    &[window.clone(), ("xid", xid.to_string())],
                    Value::Int(i64::try_from(n).unwrap_or(i64::MAX)),
                );
            }
        }
        Field::ExpClockEventsCount => {
            if e.entity.outcome.sample.is_err() {
                return;
            }
            let window = ("window_size_in_ms", opts.clock_window_ms.to_string());
            // As dcgm-exporter's expcollector: an entity without events gets one series, 0.
            if recent.clock_event_counts.is_empty() {
                push(std::slice::from_ref(&window), Value::Int(0));
            }
            for &(reason, n) in &recent.clock_event_counts {
                push(
                    &[("clock_event", reason.to_owned()), window.clone()],
                    Value::Int(i64::try_from(n).unwrap_or(i64::MAX)),
                );
            }
        }
        field => match reading(&e.entity, field) {
            Some(Ok(v @ (Value::Int(_) | Value::Float(_)))) => {
                if is_per_process(field) {
                    for d in &e.device_variants {
                        fam.series.push(Series {
                            labels: Arc::clone(&d.full),
                            value: v.clone(),
                        });
                    }
                }
                for variant in &e.variants {
                    fam.series.push(Series {
                        labels: Arc::clone(&variant.full),
                        value: value(variant, field, v),
                    });
                }
            }
            Some(Ok(Value::Text(_))) | None => {}
            Some(Err(FieldError::NotSupported)) => {}
            Some(Err(err)) => errors.push((field, *err)),
        },
    }
}

/// Where `e` finds its reading of `field`: a link in its link's readings, a GPU in its own, a MIG
/// instance in its own or its parent GPU's, as the field's scope says.
fn reading<'a>(e: &Entity<'a>, field: Field) -> Option<&'a Reading> {
    let sample = e.outcome.sample.as_ref().ok()?;
    let find =
        |rs: &'_ [(Field, Reading)]| -> Option<usize> { rs.iter().position(|(f, _)| *f == field) };
    if let Some(link) = e.link {
        return find(&link.readings).map(|i| &link.readings[i].1);
    }
    match (e.instance, field.mig_scope()) {
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

/// The fields whose per-pod copies carry each holder's own use with
/// `--kubernetes-virtual-gpus` (dcgm-exporter's `isPerProcessMetric`: GPU utilisation and
/// framebuffer used, here in either naming generation's unit).
fn is_per_process(field: Field) -> bool {
    matches!(
        field,
        Field::GpuUtil | Field::GpuUtilRatio | Field::FbUsed | Field::FbUsedBytes
    )
}

/// The value `copy` carries for `field`: the holder's own for the per-process fields (GPU
/// utilisation and framebuffer used, in either naming generation's unit) when known, else the
/// device's.
fn value(copy: &Labelled, field: Field, device: &Value) -> Value {
    let own = copy.own.and_then(|o| match field {
        Field::GpuUtil => o.sm.map(Value::Int),
        // The newest generation's ratio: 0-1.
        Field::GpuUtilRatio => o.sm.map(|p| Value::Float(p as f64 / 100.0)),
        Field::FbUsed => o.fb_mib.map(Value::Int),
        Field::FbUsedBytes => o.fb_bytes.map(Value::Int),
        _ => None,
    });
    own.unwrap_or_else(|| device.clone())
}

/// The label set of one series: the copy's shared one, or, with per-series `extras`, prefix +
/// the sorted merge of `extras` and the copy's attributes, then its pod labels.
fn series_labels(prefix: &str, extras: &[(&'static str, String)], copy: &Labelled) -> Arc<str> {
    if extras.is_empty() {
        return Arc::clone(&copy.full);
    }
    let mut s = String::with_capacity(copy.full.len() + 64);
    s.push_str(prefix);
    let mut attrs: Vec<&(&'static str, String)> = extras.iter().chain(&copy.attrs).collect();
    attrs.sort_by_key(|(k, _)| *k);
    for (k, v) in attrs {
        push_label(&mut s, k, v);
    }
    s.push_str(&copy.pod_labels);
    s.into()
}

/// Health series: one per physical GPU and watch, labelled as the whole GPU, with the label-type
/// fields.
fn health_series(gpus: &[Entity<'_>], opts: &BuildOptions, fam: &mut Family) {
    for gpu in gpus {
        for c in gpu.outcome.health(opts.xid_window_ms) {
            let mut s = gpu.prefix.clone();
            push_label(&mut s, "health_error_code", c.code);
            push_label(&mut s, "health_watch", c.watch);
            fam.series.push(Series {
                labels: s.into(),
                value: Value::Int(c.status as i64),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::catalog;
    use crate::catalog::Field;
    use crate::gpu::Value;
    use crate::health;
    use crate::pods::usage::EntityUsage;
    use crate::pods::Attribution;
    use crate::snapshot::testkit::*;
    use crate::snapshot::{build, build_with, DeviceSelection, CONTAINER_SM_UTIL};
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
    fn an_unreadable_gpu_keeps_only_health_and_xid_series() {
        let cat = catalog::parse(
            "DCGM_FI_DEV_GPU_TEMP, gauge, t\nDCGM_FI_DEV_XID_ERRORS, gauge, x\nDCGM_EXP_GPU_HEALTH_STATUS, gauge, h\nDCGM_FI_DRIVER_VERSION, label, d\n",
            "t.csv",
        )
        .unwrap()
        .0;
        let mut lost = outcome(device(0, "H100", &[]), 50, 1);
        lost.sample = Err("gpu_lost");
        lost.recent.last_xid = Some(79);
        let s = build(&cat, &[lost], &Attribution::default(), &opts());
        assert!(lines(&s, "DCGM_FI_DEV_GPU_TEMP").is_empty());
        let xid = lines(&s, "DCGM_FI_DEV_XID_ERRORS");
        assert_eq!(xid.len(), 1);
        assert!(xid[0].ends_with(r#"DCGM_FI_DRIVER_VERSION="570.1",err_code="79",err_msg="GPU has fallen off the bus"} 79"#), "{}", xid[0]);
        let health = lines(&s, "DCGM_EXP_GPU_HEALTH_STATUS");
        assert_eq!(health.len(), health::WATCHES.len());
        assert!(health
            .iter()
            .any(|l| l
                .contains(r#"health_error_code="DCGM_FR_FALLEN_OFF_BUS",health_watch="ALL"} 20"#)));
    }

    #[test]
    fn virtual_gpus_carry_each_holders_own_util_and_memory() {
        let mut w = workload(&[
            ("a", "uid-a", &[]),
            ("b", "uid-b", &[]),
            ("idle", "uid-i", &[]),
        ]);
        w.usage.insert(
            gpu0(),
            EntityUsage {
                containers: vec![usage("a", Some(130), 100, &w), usage("b", Some(12), 50, &w)],
                complete: true,
            },
        );
        let mut holders = std::collections::BTreeMap::new();
        holders.insert(
            gpu0(),
            vec![
                holder("a", Some("0")),
                holder("a", Some("3")),
                holder("b", Some("1")),
                holder("idle", Some("2")),
            ],
        );
        let att = Attribution {
            holders,
            ..Default::default()
        };
        let mut o = opts();
        o.virtual_gpus = true;
        let mut out = outcome(device(0, "H100", &[]), 50, 160);
        if let Ok(sample) = &mut out.sample {
            sample.readings.retain(|(f, _)| *f != Field::GpuUtil);
            sample.readings.push((Field::GpuUtil, Ok(Value::Int(99))));
        }
        let s = build_with(&cat(), std::slice::from_ref(&out), &att, &w, &o);
        let value = |l: &str| l.rsplit(' ').next().unwrap().to_owned();
        let util: Vec<String> = lines(&s, "DCGM_FI_DEV_GPU_UTIL")
            .iter()
            .map(|l| value(l))
            .collect();
        // As dcgm-exporter 4.8.2+: the device-level series first (no pod labels, the device's
        // value), then a (capped at 100), a's second replica 0, b, the idle holder 0.
        assert_eq!(util, ["99", "100", "0", "12", "0"]);
        let device_level = &lines(&s, "DCGM_FI_DEV_GPU_UTIL")[0];
        assert!(
            !device_level.contains("pod=") && !device_level.contains("vgpu="),
            "{device_level}"
        );
        let fb: Vec<String> = lines(&s, "DCGM_FI_DEV_FB_USED")
            .iter()
            .map(|l| value(l))
            .collect();
        assert_eq!(fb, ["160", "100", "0", "50", "0"]);
        // Other fields stay copies, without a device-level series.
        let temp: Vec<String> = lines(&s, "DCGM_FI_DEV_GPU_TEMP")
            .iter()
            .map(|l| value(l))
            .collect();
        assert_eq!(temp, ["50", "50", "50", "50"]);
        assert!(lines(&s, "DCGM_FI_DEV_GPU_TEMP")
            .iter()
            .all(|l| l.contains("pod=")));

        // An incomplete entity (a process not attributed) keeps the device's value everywhere.
        w.usage.get_mut(&gpu0()).unwrap().complete = false;
        let s = build_with(&cat(), std::slice::from_ref(&out), &att, &w, &o);
        let util: Vec<String> = lines(&s, "DCGM_FI_DEV_GPU_UTIL")
            .iter()
            .map(|l| value(l))
            .collect();
        assert_eq!(util, ["99", "99", "99", "99", "99"]);
        // No usage at all (per-process attribution off or failed): copies too.
        let s = build_with(&cat(), std::slice::from_ref(&out), &att, &workload(&[]), &o);
        let fb: Vec<String> = lines(&s, "DCGM_FI_DEV_FB_USED")
            .iter()
            .map(|l| value(l))
            .collect();
        assert_eq!(fb, ["160", "160", "160", "160", "160"]);
    }

    #[test]
    fn the_newest_generation_names_carry_own_use_in_their_units() {
        let mut w = workload(&[("a", "uid-a", &[]), ("b", "uid-b", &[])]);
        w.usage.insert(
            gpu0(),
            EntityUsage {
                containers: vec![usage("a", Some(30), 100, &w)],
                complete: true,
            },
        );
        let mut holders = std::collections::BTreeMap::new();
        holders.insert(gpu0(), vec![holder("a", Some("0")), holder("b", Some("1"))]);
        let att = Attribution {
            holders,
            ..Default::default()
        };
        let cat = catalog::parse(
            "DCGM_FI_DEV_GPU_UTIL_RATIO, gauge, u\nDCGM_FI_DEV_FB_USED_BYTES, gauge, f\n",
            "t.csv",
        )
        .unwrap()
        .0;
        let mut out = outcome(device(0, "H100", &[]), 50, 160);
        if let Ok(sample) = &mut out.sample {
            sample.readings = vec![
                (Field::GpuUtilRatio, Ok(Value::Float(0.99))),
                (Field::FbUsedBytes, Ok(Value::Int(160 << 20))),
            ];
        }
        let mut o = opts();
        o.virtual_gpus = true;
        let s = build_with(&cat, std::slice::from_ref(&out), &att, &w, &o);
        let value = |l: &String| l.rsplit(' ').next().unwrap().to_owned();
        let util: Vec<String> = lines(&s, "DCGM_FI_DEV_GPU_UTIL_RATIO")
            .iter()
            .map(value)
            .collect();
        assert_eq!(util, ["0.99", "0.3", "0"]);
        let fb: Vec<String> = lines(&s, "DCGM_FI_DEV_FB_USED_BYTES")
            .iter()
            .map(value)
            .collect();
        assert_eq!(
            fb,
            [
                (160 << 20).to_string(),
                (100 * 1_048_576 + 7).to_string(),
                "0".to_owned()
            ]
        );
    }

    #[test]
    fn dra_copies_carry_pod_uid_labels_and_in_virtual_mode_their_own_use() {
        let mut w = workload(&[("a", "uid-a", &[("team", "t")]), ("b", "uid-b", &[])]);
        w.usage.insert(
            gpu0(),
            EntityUsage {
                containers: vec![usage("a", Some(30), 100, &w), usage("b", Some(12), 50, &w)],
                complete: true,
            },
        );
        let mut holders = std::collections::BTreeMap::new();
        // A claim shared by a and b, and a second claim of a on the same GPU.
        holders.insert(
            gpu0(),
            vec![
                dra_holder("a", "shared", "gpu-0"),
                dra_holder("a", "second", "gpu-0"),
                dra_holder("b", "shared", "gpu-0"),
            ],
        );
        let att = Attribution {
            holders,
            ..Default::default()
        };
        let mut o = opts();
        o.pod_uid = true;
        let out = with_util(outcome(device(0, "H100", &[]), 50, 160), 99);
        let s = build_with(&cat(), std::slice::from_ref(&out), &att, &w, &o);
        let util = lines(&s, "DCGM_FI_DEV_GPU_UTIL");
        assert_eq!(util.len(), 3);
        assert!(
            util[0].ends_with(r#"container="c",dra_claim_name="shared",dra_claim_namespace="ns",dra_device_name="gpu-0",dra_driver_name="gpu.nvidia.com",dra_pool_name="n1",namespace="ns",pod="a",pod_uid="uid-a",team="t"} 99"#),
            "{}",
            util[0]
        );
        // Without --kubernetes-virtual-gpus the copies carry the device's values.
        assert!(util.iter().all(|l| l.ends_with(" 99")), "{util:#?}");
        let value = |l: &String| l.rsplit(' ').next().unwrap().to_owned();
        o.virtual_gpus = true;
        let s = build_with(&cat(), std::slice::from_ref(&out), &att, &w, &o);
        let util: Vec<String> = lines(&s, "DCGM_FI_DEV_GPU_UTIL")
            .iter()
            .map(value)
            .collect();
        // a's first claim, a's second claim (counted once), b. No `vgpu` on DRA copies.
        assert_eq!(util, ["30", "0", "12"]);
        let fb: Vec<String> = lines(&s, "DCGM_FI_DEV_FB_USED").iter().map(value).collect();
        assert_eq!(fb, ["100", "0", "50"]);
        assert!(lines(&s, "DCGM_FI_DEV_GPU_TEMP")
            .iter()
            .all(|l| l.ends_with(" 50") && !l.contains("vgpu")));
        // The per-container series: one per container, no claim, whatever the copies.
        let sm = lines(&s, CONTAINER_SM_UTIL);
        assert_eq!(sm.len(), 2);
        assert!(sm.iter().all(|l| !l.contains("dra_")), "{sm:#?}");
    }
}
