//! One family's series for each entity: a reading per copy (the holder's own use where a copy
//! carries it), the event-window fields with their per-series attributes (`err_code`, `xid`,
//! `clock_event`, `window_size_in_ms`) and their zero series, and the health checks per GPU.

use std::sync::Arc;

use super::copies::{is_per_process, series_labels};
use super::entity::Entity;
use super::labels::{identity_labels, push_label_fields};
use super::model::{BuildOptions, DeviceOutcome};
use crate::catalog::{Catalog, Field, MetricSpec};
use crate::gpu::{FieldError, Value};
use crate::health;
use crate::render::{push_label, Family, Series};

pub(super) fn entity_series(
    spec: &MetricSpec,
    e: &Entity<'_>,
    opts: &BuildOptions,
    fam: &mut Family,
    errors: &mut Vec<(Field, FieldError)>,
) {
    let mut push = |extras: &[(&'static str, String)], value: Value| {
        for variant in &e.variants {
            fam.series.push(Series {
                labels: series_labels(&e.prefix, extras, variant),
                value: value.clone(),
            });
        }
    };
    let recent = &e.outcome.recent;
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
            if e.outcome.sample.is_err() {
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
        field => match e.reading(field) {
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
                        value: variant.value(field, v),
                    });
                }
            }
            Some(Ok(Value::Text(_))) | None => {}
            Some(Err(FieldError::NotSupported)) => {}
            Some(Err(err)) => errors.push((field, *err)),
        },
    }
}

/// Health series: one per physical GPU and watch, labelled as the whole GPU (as dcgm-exporter
/// reports health for GPUs, not MIG instances), with the label-type fields.
pub(super) fn health_series(
    outcomes: &[DeviceOutcome],
    catalog: &Catalog,
    opts: &BuildOptions,
    fam: &mut Family,
) {
    for o in outcomes {
        let mut prefix = identity_labels(o, None, opts);
        push_label_fields(&mut prefix, catalog, o, |_| true);
        for c in o.health(opts.xid_window_ms) {
            let mut s = prefix.clone();
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
    use crate::health;
    use crate::pods::Attribution;
    use crate::snapshot::build;
    use crate::snapshot::testkit::*;

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
}
