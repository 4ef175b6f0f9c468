//! What each of the socket clients here (the kubelet's pod-resources, the container runtime's
//! CRI) says of its own calls: whether the last one succeeded, when one last did, and the
//! failures by reason. Both render these three families, each under its own names, before
//! their own.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::self_metrics::{self, DescriptorEncoder, Num, Reason};

/// One client's calls.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClientHealth {
    /// Whether the client runs (its families are rendered only then).
    pub enabled: bool,
    /// Whether the last call succeeded.
    pub up: bool,
    /// Unix time of the last successful call (0: never).
    pub last_success_seconds: f64,
    /// Failed calls by reason.
    pub errors: BTreeMap<&'static str, u64>,
}

/// A client's three families: each a name and its help text, and every reason a failure can
/// have (all rendered, from 0).
#[derive(Debug)]
pub struct HealthFamilies {
    /// `..._up`: whether the last call succeeded.
    pub up: (&'static str, &'static str),
    /// `..._last_success_timestamp_seconds`.
    pub last_success: (&'static str, &'static str),
    /// `..._errors` (a counter, `_total` appended), by `reason`.
    pub errors: (&'static str, &'static str),
    /// Every `reason` value.
    pub reasons: &'static [&'static str],
}

impl ClientHealth {
    /// A call succeeded at `unix_seconds`.
    pub fn record_success(&mut self, unix_seconds: f64) {
        self.up = true;
        self.last_success_seconds = unix_seconds;
    }

    /// A call failed.
    pub fn record_failure(&mut self, reason: &'static str) {
        self.up = false;
        *self.errors.entry(reason).or_default() += 1;
    }

    /// Writes the three families (the caller writes nothing when the client is not enabled).
    ///
    /// # Errors
    /// Only the writer's.
    pub fn encode(&self, e: &mut DescriptorEncoder, f: &HealthFamilies) -> fmt::Result {
        self_metrics::gauge1(e, f.up.0, f.up.1, Num::Int(i64::from(self.up)))?;
        self_metrics::gauge1(
            e,
            f.last_success.0,
            f.last_success.1,
            Num::Float(self.last_success_seconds),
        )?;
        self_metrics::counter(
            e,
            f.errors.0,
            f.errors.1,
            f.reasons.iter().map(|&reason| {
                (
                    Reason { reason },
                    self.errors.get(reason).copied().unwrap_or(0),
                )
            }),
        )
    }
}

/// A client's state (its series): its [`ClientHealth`] and what else it records.
pub trait HasHealth: Clone {
    /// The calls' health.
    fn health(&mut self) -> &mut ClientHealth;
}

/// A client's series, updated by its task and read by the scrape: the state `S` behind a lock,
/// replaced piece by piece. Each client names its own (`CriMetrics`, `PodResourcesMetrics`,
/// `KubeApiMetrics`) and adds what it records besides its calls.
#[derive(Debug, Default)]
pub struct ClientMetrics<S> {
    inner: Mutex<S>,
}

impl<S: HasHealth> ClientMetrics<S> {
    /// The state, to update (a poisoned lock is taken over: the state is plain data).
    pub fn lock(&self) -> MutexGuard<'_, S> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Turns the families on.
    pub fn enable(&self) {
        self.lock().health().enabled = true;
    }

    /// Records a successful call at `unix_seconds`.
    pub fn record_success(&self, unix_seconds: f64) {
        self.lock().health().record_success(unix_seconds);
    }

    /// Records a failed call.
    pub fn record_failure(&self, reason: &'static str) {
        self.lock().health().record_failure(reason);
    }

    /// A copy of the current state.
    pub fn state(&self) -> S {
        self.lock().clone()
    }

    /// Writes the health families `f` if the client runs, and returns the state the rest is
    /// written from; `None` (nothing written) if it does not run.
    ///
    /// # Errors
    /// Only the writer's.
    pub fn encode_health(
        &self,
        e: &mut DescriptorEncoder,
        f: &HealthFamilies,
    ) -> Result<Option<S>, fmt::Error> {
        let mut s = self.state();
        let health = s.health();
        if !health.enabled {
            return Ok(None);
        }
        health.encode(e, f)?;
        Ok(Some(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_clears_up_and_keeps_the_last_success() {
        let mut h = ClientHealth::default();
        h.record_success(12.5);
        h.record_failure("timeout");
        h.record_failure("timeout");
        assert!(!h.up);
        assert_eq!(h.last_success_seconds, 12.5);
        assert_eq!(h.errors.get("timeout"), Some(&2));
        h.record_success(20.0);
        assert!(h.up);
        assert_eq!(h.errors.get("timeout"), Some(&2));
    }
}
