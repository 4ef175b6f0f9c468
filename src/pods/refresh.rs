//! The refresh policy the kubelet and container-runtime tasks share ([`super::refresher`],
//! [`super::cri_refresher`]): keep the last good answer until the TTL, back off after failures,
//! log each distinct problem once and the recovery once, and say once when the answer is dropped.
//! [`Policy`] keeps that state and says what to do; the tasks do the calling, the logging (in
//! their own words) and the publishing.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// The first retry delay after a failure.
const FIRST_RETRY: Duration = Duration::from_millis(500);

/// What one refresh did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefreshOutcome {
    /// A fresh reply was mapped and published.
    Fresh,
    /// The call failed; the last good reply (this old) is still in use.
    Kept {
        /// Age of the reply in use.
        age: Duration,
    },
    /// The call failed and no reply younger than the TTL is left: no pod labels.
    Dropped {
        /// The `reason` of the failure.
        reason: &'static str,
    },
}

/// What a failed call calls for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failed {
    /// [`RefreshOutcome::Kept`] while the last good answer is younger than the TTL, else
    /// [`RefreshOutcome::Dropped`] (the answer is gone: publish the empty one).
    pub outcome: RefreshOutcome,
    /// A problem other than the one last logged: warn, with the fix. Otherwise it is the same
    /// problem again (debug).
    pub new_problem: bool,
    /// The last good answer has just been dropped, and that was not said since the last success:
    /// say it.
    pub log_dropped: bool,
}

impl Failed {
    /// Whether the last good answer is still in use.
    pub fn kept(&self) -> bool {
        matches!(self.outcome, RefreshOutcome::Kept { .. })
    }
}

/// The state of one refreshed source: its last good answer (`T`) and when it came, the problem
/// last logged, and the failures in a row.
#[derive(Debug)]
pub struct Policy<T> {
    ttl: Duration,
    last_good: Option<(Instant, T)>,
    /// The reason of the problem last logged, until a success clears it.
    problem: Option<&'static str>,
    dropped_logged: bool,
    failures: u32,
}

impl<T> Policy<T> {
    /// No answer yet; answers are kept for `ttl` while calls fail.
    pub fn new(ttl: Duration) -> Self {
        Self {
            ttl,
            last_good: None,
            problem: None,
            dropped_logged: false,
            failures: 0,
        }
    }

    /// The last good answer, while it is in use.
    pub fn last_good(&self) -> Option<&T> {
        self.last_good.as_ref().map(|(_, answer)| answer)
    }

    /// A good `answer` at `now`. Returns the reason of the problem it ends, if one was logged
    /// (log the recovery).
    pub fn succeeded(&mut self, now: Instant, answer: T) -> Option<&'static str> {
        self.failures = 0;
        self.dropped_logged = false;
        self.last_good = Some((now, answer));
        self.problem.take()
    }

    /// A call failed at `now` for `reason`: what to log and whether the last answer stays.
    pub fn failed(&mut self, now: Instant, reason: &'static str) -> Failed {
        self.failures = self.failures.saturating_add(1);
        let kept = self
            .last_good
            .as_ref()
            .map(|(at, _)| now.duration_since(*at))
            .filter(|age| *age < self.ttl);
        let new_problem = self.problem != Some(reason);
        self.problem = Some(reason);
        if let Some(age) = kept {
            return Failed {
                outcome: RefreshOutcome::Kept { age },
                new_problem,
                log_dropped: false,
            };
        }
        let log_dropped = self.last_good.take().is_some() && !self.dropped_logged;
        if log_dropped {
            self.dropped_logged = true;
        }
        Failed {
            outcome: RefreshOutcome::Dropped { reason },
            new_problem,
            log_dropped,
        }
    }

    /// The delay before the next call: [`backoff`] after the failures in a row.
    pub fn next_delay(&self, refresh: Duration) -> Duration {
        backoff(self.failures, refresh)
    }
}

/// Logs a failed call as [`Policy::failed`] said: a new problem as a warning with the error's
/// fix (`warn`: a format with the hint, the refresh period and then `kept` or `not_kept`), the
/// same one again at debug (`again`), and the drop of the last answer once (`dropped`, with the
/// TTL). A macro so that the lines keep the task's module as their target.
macro_rules! log_failure {
    (
        $failed:expr, $error:expr, $refresh:expr, $ttl:expr,
        warn: $warn:literal,
        kept: $kept:literal,
        not_kept: $not_kept:literal,
        again: $again:literal,
        dropped: $dropped:literal $(,)?
    ) => {{
        let failed: &$crate::pods::refresh::Failed = &$failed;
        let error = &$error;
        if failed.new_problem {
            tracing::warn!(
                error = %$crate::error_chain(error),
                reason = error.reason(),
                $warn,
                error.hint(),
                $refresh,
                if failed.kept() { $kept } else { $not_kept },
            );
        } else {
            tracing::debug!(error = %$crate::error_chain(error), $again);
        }
        if failed.log_dropped {
            tracing::warn!(ttl = ?$ttl, $dropped);
        }
    }};
}
pub(crate) use log_failure;

/// The delay before the next call after `failures` consecutive failures: the refresh period
/// while calls succeed, else 0.5 s doubling up to the refresh period.
pub fn backoff(failures: u32, refresh: Duration) -> Duration {
    if failures == 0 {
        return refresh;
    }
    let shift = (failures - 1).min(16);
    FIRST_RETRY.saturating_mul(1 << shift).min(refresh)
}

/// Now, in seconds since the Unix epoch (for the last-success gauges).
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_kept_until_the_ttl_and_each_problem_is_told_once() {
        let t0 = Instant::now();
        let s = Duration::from_secs;
        let mut p = Policy::new(s(30));
        // No answer yet: a failure drops nothing, so there is no drop to tell.
        let f = p.failed(t0, "unavailable");
        assert_eq!(
            f.outcome,
            RefreshOutcome::Dropped {
                reason: "unavailable"
            }
        );
        assert!(f.new_problem && !f.log_dropped);
        assert_eq!(p.succeeded(t0 + s(1), 7), Some("unavailable"));
        assert_eq!(p.last_good(), Some(&7));
        // Within the TTL: kept; the same problem twice is told once, another one again.
        let f = p.failed(t0 + s(11), "timeout");
        assert_eq!(f.outcome, RefreshOutcome::Kept { age: s(10) });
        assert!(f.kept() && f.new_problem);
        assert!(!p.failed(t0 + s(12), "timeout").new_problem);
        assert!(p.failed(t0 + s(13), "unavailable").new_problem);
        // Past the TTL: dropped, said once.
        let f = p.failed(t0 + s(31), "unavailable");
        assert_eq!(
            f.outcome,
            RefreshOutcome::Dropped {
                reason: "unavailable"
            }
        );
        assert!(!f.new_problem && f.log_dropped);
        assert_eq!(p.last_good(), None);
        assert!(!p.failed(t0 + s(40), "unavailable").log_dropped);
        // Backoff grows with the failures in a row (five now: 0.5 s doubled four times) and
        // resets on success.
        assert_eq!(p.next_delay(s(10)), s(8));
        assert_eq!(p.succeeded(t0 + s(41), 8), Some("unavailable"));
        assert_eq!(p.next_delay(s(10)), s(10));
        p.failed(t0 + s(42), "timeout");
        assert_eq!(p.next_delay(s(10)), Duration::from_millis(500));
        p.failed(t0 + s(43), "timeout");
        assert_eq!(p.next_delay(s(10)), s(1));
    }
}
