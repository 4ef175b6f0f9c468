//! The accounting vocabulary: who is charged ([`Consumer`], [`Account`]) and what one sample
//! says about one GPU ([`GpuTick`]). Plain data, shared by the input builder, the ledger and
//! the metrics.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::pods::PodRef;

/// Who is charged on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Consumer {
    /// A container: one that holds an allocation of the GPU (or MIG instance), or one that runs
    /// processes on it without holding it (`holder: false`: use outside its allocation).
    Container {
        /// Namespace, pod, container.
        pod: PodRef,
        /// Whether it holds the entity (kubelet pod-resources).
        holder: bool,
    },
    /// Processes that belong to no pod (host processes, other runtimes) or could not be traced
    /// to one.
    OutsidePods,
    /// Capacity no pod holds.
    Unallocated,
}

impl Consumer {
    /// The `consumer` label value.
    pub fn as_str(&self) -> &'static str {
        match self {
            Consumer::Container { holder: true, .. } => "holder",
            Consumer::Container { holder: false, .. } => "not_holder",
            Consumer::OutsidePods => "outside_pods",
            Consumer::Unallocated => "unallocated",
        }
    }
}

/// One account of a GPU: a consumer, on the whole GPU or on one of its MIG instances.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Account {
    /// The MIG GPU instance (`GPU_I_ID`); `None` for the whole GPU.
    pub gi_id: Option<u32>,
    /// Who.
    pub consumer: Consumer,
}

impl Account {
    /// The unallocated capacity of the whole GPU (`None`) or of a MIG instance.
    pub fn unallocated(gi_id: Option<u32>) -> Self {
        Self {
            gi_id,
            consumer: Consumer::Unallocated,
        }
    }

    /// A container's account.
    pub fn container(gi_id: Option<u32>, pod: PodRef, holder: bool) -> Self {
        Self {
            gi_id,
            consumer: Consumer::Container { pod, holder },
        }
    }
}

/// Each account's share of a GPU, as a sample's input hands it (the same list, by pointer,
/// while the pods and devices stay).
pub type Shares = Arc<[(Account, f64)]>;

/// One sample's view of one physical GPU: the input of the [`Ledger`].
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GpuTick {
    /// The physical GPU's UUID.
    pub uuid: String,
    /// Its index (`gpu` label).
    pub index: u32,
    /// Its own energy counter now, millijoules (`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`);
    /// `None` when it could not be read.
    pub energy_mj: Option<u64>,
    /// The share of the GPU each holder holds, in [0, 1]; the ledger gives what is left to
    /// the whole GPU's unallocated account. Shared: it changes only with the pods, and the
    /// ledger reuses its lookups while it is the same list.
    pub allocated: Shares,
    /// Measured activity, as a share of the whole GPU in [0, 1] (an SM utilisation of 40 % on
    /// the whole GPU is 0.4; a MIG instance holding 3/7 of the GPU, 50 % active, is 3/14).
    pub busy: Vec<(Account, f64)>,
    /// The accounts that ran at least one process; `None` when processes were not read (then
    /// no waste is counted).
    pub running: Option<BTreeSet<Account>>,
}
