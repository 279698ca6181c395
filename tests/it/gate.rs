//! A rendezvous between a test and the handlers it starts, keyed by the test's
//! tag (tests run in parallel in one process, so each has its own gate).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;

/// How long a test waits for a handler to reach its gate.
const PATIENCE: Duration = Duration::from_secs(20);

/// What handlers and their test share.
pub(crate) struct Gate {
    /// One permit per handler run that reached the gate.
    pub(crate) started: Semaphore,
    /// Permits let waiting handler runs go on.
    pub(crate) release: Semaphore,
    /// How many handler runs reached the gate.
    pub(crate) runs: AtomicU32,
    /// Backend pid of each run's connection, in order.
    pub(crate) pids: Mutex<Vec<i32>>,
}

/// The gate of test `tag`, created on first use.
pub(crate) fn gate(tag: &str) -> Arc<Gate> {
    static GATES: LazyLock<Mutex<HashMap<String, Arc<Gate>>>> = LazyLock::new(Default::default);
    GATES
        .lock()
        .unwrap()
        .entry(tag.to_owned())
        .or_insert_with(|| {
            Arc::new(Gate {
                started: Semaphore::new(0),
                release: Semaphore::new(0),
                runs: AtomicU32::new(0),
                pids: Mutex::new(Vec::new()),
            })
        })
        .clone()
}

impl Gate {
    /// A handler run reaches the gate and waits until the test lets it go.
    pub(crate) async fn hold(&self) -> Result<(), pgfifo::JobError> {
        self.started.add_permits(1);
        self.release
            .acquire()
            .await
            .map_err(pgfifo::JobError::permanent)?
            .forget();
        Ok(())
    }

    /// Waits until `n` more handler runs reached the gate.
    pub(crate) async fn wait_started(&self, n: u32) {
        tokio::time::timeout(PATIENCE, self.started.acquire_many(n))
            .await
            .expect("the handler did not start in time")
            .expect("semaphore closed")
            .forget();
    }

    /// How many handler runs reached the gate.
    pub(crate) fn runs(&self) -> u32 {
        self.runs.load(Ordering::SeqCst)
    }
}
