//! [`Served`]: the part every in-test ZeroMQ server shares (the scriptable
//! [`FakeServer`](crate::client::FakeServer) and the fault-injecting
//! [`FaultServer`](crate::fault::FaultServer)): a ROUTER bound at an endpoint, the task
//! serving it, and how it stops.

use std::future::Future;

use lookup_tokio::Endpoint;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A bound ROUTER served by a task until [`stop`](Self::stop) or drop (which cancels
/// the task without waiting for it).
pub struct Served {
    endpoint: Endpoint,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
    what: &'static str,
}

impl Served {
    /// Binds a ROUTER at `endpoint` (linger 0; a stale ipc file is removed first) and
    /// spawns `serve(socket, cancel)` on the current tokio runtime. `what` names the
    /// server in panics.
    ///
    /// # Panics
    /// When the endpoint cannot be bound, or outside a tokio runtime.
    pub fn bind<F, Fut>(endpoint: &Endpoint, what: &'static str, serve: F) -> Self
    where
        F: FnOnce(tmq::router::Router, CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        if let Some(path) = endpoint.ipc_path() {
            let _ = std::fs::remove_file(path);
        }
        let socket = tmq::router(&tmq::Context::new())
            .set_linger(0)
            .bind(&endpoint.url())
            .unwrap_or_else(|e| panic!("bind the {what} at {endpoint}: {e}"));
        let cancel = CancellationToken::new();
        let task = tokio::spawn(serve(socket, cancel.clone()));
        Self {
            endpoint: endpoint.clone(),
            cancel,
            task: Some(task),
            what,
        }
    }

    /// Where the server listens.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Stops serving, waits for the task (so the socket is closed) and removes the
    /// ipc file.
    ///
    /// # Panics
    /// When the serving task panicked.
    pub async fn stop(mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            task.await
                .unwrap_or_else(|e| panic!("{} task: {e}", self.what));
        }
        if let Some(path) = self.endpoint.ipc_path() {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}
