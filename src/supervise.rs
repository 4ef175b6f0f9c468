//! Essential tasks: the long-running tasks without which the exporter serves stale or wrong
//! data (the sampler, the signal listeners, the reloaders, the pod refreshers). If one of them
//! panics or returns before shutdown, the process must exit non-zero so that Kubernetes restarts
//! it, instead of answering `/metrics` with 503 (or ignoring SIGTERM) for good.

use std::collections::HashMap;
use std::future::Future;

use tokio::task::{Id, JoinSet};

/// Why an essential task stopped.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TaskDied {
    /// It panicked.
    #[error("the {task} task panicked: {message}")]
    Panicked {
        /// The task's name.
        task: &'static str,
        /// The panic message.
        message: String,
    },
    /// It returned while the exporter was still running.
    #[error("the {task} task ended unexpectedly")]
    Ended {
        /// The task's name.
        task: &'static str,
    },
    /// It was cancelled from outside (the runtime shutting down).
    #[error("the {task} task was cancelled")]
    Cancelled {
        /// The task's name.
        task: &'static str,
    },
}

/// The set of essential tasks.
#[derive(Debug, Default)]
pub struct Essential {
    set: JoinSet<()>,
    names: HashMap<Id, &'static str>,
}

impl Essential {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Spawns `task` on the current runtime as an essential task called `name`.
    pub fn spawn(&mut self, name: &'static str, task: impl Future<Output = ()> + Send + 'static) {
        let handle = self.set.spawn(task);
        self.names.insert(handle.id(), name);
    }

    /// Tasks still running.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// Whether no task is running.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Waits for the first task to stop and says which and why. Never resolves while every task
    /// runs (or when there is none).
    pub async fn first_stopped(&mut self) -> TaskDied {
        let Some(joined) = self.set.join_next_with_id().await else {
            return std::future::pending().await;
        };
        let name = |id: Id| self.names.get(&id).copied().unwrap_or("unnamed");
        match joined {
            Ok((id, ())) => TaskDied::Ended { task: name(id) },
            Err(e) if e.is_panic() => {
                let task = name(e.id());
                let payload = e.into_panic();
                let message = payload
                    .downcast_ref::<&str>()
                    .map(|s| (*s).to_owned())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(no message)".to_owned());
                TaskDied::Panicked { task, message }
            }
            Err(e) => TaskDied::Cancelled { task: name(e.id()) },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_panicking_task_is_named_with_its_message() {
        let mut e = Essential::new();
        e.spawn("forever", std::future::pending());
        e.spawn("sampler", async { panic!("failed printing to stderr") });
        let died = tokio::time::timeout(Duration::from_secs(10), e.first_stopped())
            .await
            .expect("the panic is seen");
        assert_eq!(
            died.to_string(),
            "the sampler task panicked: failed printing to stderr"
        );
        assert_eq!(e.len(), 1);
    }

    #[tokio::test]
    async fn a_task_that_returns_is_reported_as_ended() {
        let mut e = Essential::new();
        e.spawn("forever", std::future::pending());
        let n = 7;
        e.spawn("reloader", async move {
            let _ = format!("{n}");
        });
        let died = tokio::time::timeout(Duration::from_secs(10), e.first_stopped())
            .await
            .expect("the end is seen");
        assert_eq!(died, TaskDied::Ended { task: "reloader" });
    }

    #[tokio::test]
    async fn running_tasks_are_not_reported() {
        let mut e = Essential::new();
        e.spawn("forever", std::future::pending());
        let r = tokio::time::timeout(Duration::from_millis(50), e.first_stopped()).await;
        assert!(r.is_err(), "{r:?}");
        let mut empty = Essential::new();
        assert!(empty.is_empty());
        let r = tokio::time::timeout(Duration::from_millis(10), empty.first_stopped()).await;
        assert!(r.is_err());
    }
}
