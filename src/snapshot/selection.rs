//! Which entities are exported: dcgm-exporter's `-d/--devices` (`f`, `g[:ids]`, `i[:ids]`).

use crate::gpu::{Device, MigInstance};

/// Which entities are exported (`-d/--devices`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DeviceSelection {
    /// `f`: MIG instances for GPUs that have them, whole GPUs otherwise.
    #[default]
    Flex,
    /// `g[:ids]`: whole GPUs (all, or these indices).
    Gpus(Option<Vec<u32>>),
    /// `i[:ids]`: MIG instances (all, or these GPU instance ids).
    Instances(Option<Vec<u32>>),
}

impl DeviceSelection {
    pub(super) fn gpu_selected(&self, device: &Device) -> bool {
        match self {
            DeviceSelection::Flex => !device.mig_enabled || device.instances.is_empty(),
            DeviceSelection::Gpus(None) => true,
            DeviceSelection::Gpus(Some(ids)) => ids.contains(&device.identity.index),
            DeviceSelection::Instances(_) => false,
        }
    }

    /// Whether the NVLinks of `device` are exported, as dcgm-exporter decides it: with `f`, or
    /// when `g` selects the GPU; never with `i`.
    pub(super) fn links_selected(&self, device: &Device) -> bool {
        match self {
            DeviceSelection::Flex | DeviceSelection::Gpus(None) => true,
            DeviceSelection::Gpus(Some(ids)) => ids.contains(&device.identity.index),
            DeviceSelection::Instances(_) => false,
        }
    }

    pub(super) fn instance_selected(&self, device: &Device, inst: &MigInstance) -> bool {
        match self {
            DeviceSelection::Flex => device.mig_enabled,
            DeviceSelection::Gpus(_) => false,
            DeviceSelection::Instances(None) => true,
            DeviceSelection::Instances(Some(ids)) => ids.contains(&inst.gi_id),
        }
    }

    /// Whether any GPU or MIG instance of `devices` is selected. When none is (`-d g:99` on an
    /// 8-GPU node, `-d i` without MIG), no GPU series would be exported.
    pub fn selects_any(&self, devices: &[Device]) -> bool {
        devices.iter().any(|d| {
            self.gpu_selected(d) || d.instances.iter().any(|i| self.instance_selected(d, i))
        })
    }

    /// Why nothing of `devices` is selected, for the startup error and `/ready`; `None` when
    /// something is (or there is no device at all).
    pub fn selects_nothing(&self, devices: &[Device]) -> Option<String> {
        if devices.is_empty() || self.selects_any(devices) {
            return None;
        }
        let instances: usize = devices.iter().map(|d| d.instances.len()).sum();
        let indices: Vec<String> = devices
            .iter()
            .map(|d| d.identity.index.to_string())
            .collect();
        Some(format!(
            "-d/--devices \"{self}\" selects none of the {} GPUs (indices {}) and {instances} MIG instances found, so no GPU series would be exported",
            devices.len(),
            indices.join(", ")
        ))
    }
}

impl std::fmt::Display for DeviceSelection {
    /// As written on the command line: `f`, `g`, `g:0,2`, `i`, `i:9`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (kind, ids) = match self {
            DeviceSelection::Flex => return f.write_str("f"),
            DeviceSelection::Gpus(ids) => ("g", ids),
            DeviceSelection::Instances(ids) => ("i", ids),
        };
        f.write_str(kind)?;
        if let Some(ids) = ids {
            let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
            write!(f, ":{}", ids.join(","))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::Attribution;
    use crate::snapshot::build;
    use crate::snapshot::testkit::{cat, device, lines, opts, outcome};

    #[test]
    fn selections_pick_gpus_or_instances_by_id() {
        let outcomes = [
            outcome(
                device(0, "A100", &[(2, "3g.40gb"), (9, "1g.10gb")]),
                50,
                1000,
            ),
            outcome(device(1, "A100", &[]), 41, 7),
        ];
        let mut o = opts();
        o.selection = DeviceSelection::Instances(Some(vec![9]));
        let fb = lines(
            &build(&cat(), &outcomes, &Attribution::default(), &o),
            "DCGM_FI_DEV_FB_USED",
        );
        assert_eq!(fb.len(), 1);
        assert!(fb[0].contains("GPU_I_ID=\"9\""));
        o.selection = DeviceSelection::Gpus(Some(vec![0]));
        let fb = lines(
            &build(&cat(), &outcomes, &Attribution::default(), &o),
            "DCGM_FI_DEV_FB_USED",
        );
        assert_eq!(fb.len(), 1);
        assert!(
            fb[0].contains("gpu=\"0\"") && !fb[0].contains("GPU_I_ID") && fb[0].ends_with(" 1000")
        );
    }

    #[test]
    fn a_selection_that_matches_nothing_is_told_apart() {
        let mig = device(0, "A100", &[(2, "3g.40gb"), (9, "1g.10gb")]);
        let plain = device(1, "A100", &[]);
        let both = [mig.clone(), plain.clone()];
        for (sel, devices, selects) in [
            (DeviceSelection::Flex, &both[..], true),
            (DeviceSelection::Gpus(None), &both[..], true),
            (DeviceSelection::Gpus(Some(vec![1])), &both[..], true),
            (DeviceSelection::Gpus(Some(vec![99])), &both[..], false),
            (DeviceSelection::Instances(None), &both[..], true),
            (DeviceSelection::Instances(Some(vec![9])), &both[..], true),
            (DeviceSelection::Instances(Some(vec![5])), &both[..], false),
            // `-d i` on a node without MIG.
            (
                DeviceSelection::Instances(None),
                std::slice::from_ref(&plain),
                false,
            ),
        ] {
            assert_eq!(sel.selects_any(devices), selects, "{sel:?}");
            assert_eq!(sel.selects_nothing(devices).is_none(), selects, "{sel:?}");
        }
        assert_eq!(
            DeviceSelection::Gpus(Some(vec![99]))
                .selects_nothing(&both)
                .unwrap(),
            "-d/--devices \"g:99\" selects none of the 2 GPUs (indices 0, 1) and 2 MIG instances found, so no GPU series would be exported"
        );
        // No device at all is another matter (NVML not up yet, or no GPU): not this error.
        assert_eq!(
            DeviceSelection::Gpus(Some(vec![99])).selects_nothing(&[]),
            None
        );
        assert_eq!(
            DeviceSelection::Instances(Some(vec![1, 3])).to_string(),
            "i:1,3"
        );
    }
}
