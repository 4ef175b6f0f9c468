//! Accounting on shared GPUs (issue 37): who used how much energy and GPU time, as counters
//! that add up exactly to each GPU's own energy counter, and the waste of idle allocations.
//!
//! The pipeline step, after attribution and per-process usage: each fresh sample becomes one
//! [`GpuTick`] per physical GPU ([`input::ticks`], pure), the [`Ledger`] advances its running
//! totals by them (pure; time is an argument), and [`AccountingMetrics`] renders the totals as
//! the `gpu_exporter_container_*_total` families into the pre-rendered body: nothing is
//! computed on the scrape path. The model and its precision: docs/accounting.md.

pub mod input;
pub mod ledger;
mod metrics;
pub mod types;

pub use ledger::{GpuAccounts, IdleSource, Ledger, Totals};
pub use metrics::{AccountingMetrics, AccountingOptions};
pub use types::{Account, Consumer, GpuTick};

#[cfg(test)]
mod proptests;
