//! Which fields a tick reads (the catalog's, and the inputs of derived series), and which of
//! them can never be read on which GPUs (`gpu_exporter_fields_unavailable`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use super::metrics::SampleMetrics;
use crate::catalog::{Catalog, Field};
use crate::gpu::{Device, FieldGap, GpuSource};

/// Fields read for health and clock-event series even if the CSV does not list them.
const HEALTH_INPUTS: &[Field] = &[
    Field::ClocksEventReasons,
    Field::PcieReplayCounter,
    Field::EccDbeVolTotal,
    Field::RetiredPending,
    Field::RowRemapFailure,
    Field::RowRemapPending,
    Field::NvlinkCrcFlitErrorCountTotal,
    Field::NvlinkCrcDataErrorCountTotal,
    Field::NvlinkReplayErrorCountTotal,
    Field::NvlinkRecoveryErrorCountTotal,
];

/// The fields a catalog needs read, including the inputs of derived series.
pub fn fields_to_read(catalog: &Catalog, supported: impl Fn(Field) -> bool) -> Vec<Field> {
    let mut fields: Vec<Field> = catalog
        .fields()
        .into_iter()
        .filter(|f| !f.is_exporter() && *f != Field::XidErrors)
        .collect();
    let derived = catalog.metrics.iter().any(|m| {
        matches!(
            m.field,
            Field::ExpGpuHealthStatus | Field::ExpClockEventsCount
        )
    });
    if derived {
        fields.extend(HEALTH_INPUTS.iter().copied().filter(|f| supported(*f)));
    }
    fields.sort();
    fields.dedup();
    fields
}

/// Which of `fields` `source` can never read on which of `devices` (GPU indexes), and why.
pub fn field_gaps<S: GpuSource + ?Sized>(
    source: &S,
    devices: &[Device],
    fields: &[Field],
) -> BTreeMap<(Field, FieldGap), Vec<u32>> {
    let mut out: BTreeMap<(Field, FieldGap), Vec<u32>> = BTreeMap::new();
    for d in devices {
        for &f in fields {
            if let Some(gap) = source.field_gap(d, f) {
                out.entry((f, gap)).or_default().push(d.identity.index);
            }
        }
    }
    out
}

/// The field gaps, worked out again after each discovery or catalog change; each reason is
/// logged once.
#[derive(Debug, Default)]
pub(super) struct FieldGapCheck {
    /// The catalog and device generation the gaps were last worked out for.
    checked: Option<(Arc<Catalog>, u64)>,
    /// Reasons already logged.
    logged: BTreeSet<FieldGap>,
}

impl FieldGapCheck {
    /// After a discovery or catalog change: works out which fields can never be read on which
    /// GPUs (`gpu_exporter_fields_unavailable`), and logs each reason once, with its fix.
    pub(super) fn check<S: GpuSource + ?Sized>(
        &mut self,
        source: &S,
        devices: &[Device],
        generation: u64,
        catalog: &Arc<Catalog>,
        fields: &[Field],
        metrics: &SampleMetrics,
    ) {
        let current = self
            .checked
            .as_ref()
            .is_some_and(|(c, g)| Arc::ptr_eq(c, catalog) && *g == generation);
        if current {
            return;
        }
        self.checked = Some((Arc::clone(catalog), generation));
        let gaps = field_gaps(source, devices, fields);
        let mut by_reason: BTreeMap<FieldGap, (Vec<&'static str>, BTreeSet<u32>)> = BTreeMap::new();
        for ((field, gap), gpus) in &gaps {
            let e = by_reason.entry(*gap).or_default();
            e.0.push(field.dcgm_name());
            e.1.extend(gpus.iter().copied());
        }
        for (gap, (names, indexes)) in &by_reason {
            if self.logged.insert(*gap) {
                let gpus: Vec<String> = indexes.iter().map(u32::to_string).collect();
                let models: BTreeSet<&str> = devices
                    .iter()
                    .filter(|d| indexes.contains(&d.identity.index))
                    .map(|d| d.identity.model.as_str())
                    .collect();
                tracing::warn!(
                    fields = %names.join(","),
                    gpus = %gpus.join(","),
                    models = %models.into_iter().collect::<Vec<_>>().join(","),
                    reason = gap.as_str(),
                    "fields not served on these GPUs (gpu_exporter_fields_unavailable): {}",
                    gap.explanation()
                );
            }
        }
        metrics.set_field_gaps(
            gaps.into_iter()
                .map(|(k, gpus)| (k, gpus.len() as u64))
                .collect(),
        );
    }
}
