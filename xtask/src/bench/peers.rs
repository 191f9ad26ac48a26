//! The benchmark's peers: our `LookupServer` and a bare tmq REP server, each on a
//! thread of its own with a current-thread runtime (so a server never competes with
//! the client for a runtime), the bare tmq REQ loop, and an index that takes a fixed
//! time per call.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use bytes::Bytes;
use lookup_server::{
    BlockIndex, DelayedIndex, Endpoint, InMemoryIndex, IndexError, IndexFuture, LookupServer,
    ServerConfig,
};
use tmq::request_reply::RequestReceiver;
use tmq::{Message, Multipart};
use tokio::sync::oneshot;

use super::payload::Payload;

/// How long the bare REQ loop waits for one reply before it fails the run, so that a
/// dead server ends the benchmark with an error instead of a hang.
pub(crate) const REPLY_TIMEOUT: Duration = Duration::from_secs(10);

/// A server running on its own thread until [`stop`](Self::stop) (or drop).
pub(crate) struct ServerThread {
    /// Where clients connect.
    pub(crate) endpoint: Endpoint,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

/// A current-thread runtime with timers and I/O.
pub(crate) fn current_thread_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot build a tokio runtime")
}

impl ServerThread {
    /// Starts our [`LookupServer`] on `endpoint` over `index`.
    ///
    /// # Errors
    /// When the thread cannot start or the server cannot bind.
    pub(crate) fn lookup_server(
        name: &str,
        endpoint: Endpoint,
        config: ServerConfig,
        index: Arc<dyn BlockIndex>,
    ) -> anyhow::Result<Self> {
        Self::spawn(name, move |ready, stop| async move {
            match LookupServer::bind(&endpoint, config, index) {
                Ok(server) => {
                    let _ = ready.send(Ok(server.local_endpoint().clone()));
                    let _ = stop.await;
                    server.shutdown().await;
                }
                Err(e) => {
                    let _ = ready.send(Err(anyhow::Error::new(e).context("cannot bind")));
                }
            }
        })
    }

    /// Starts a bare tmq REP server on `endpoint` that answers every request with
    /// `reply` without decoding it: the transport floor of the reference loop.
    ///
    /// # Errors
    /// When the thread cannot start or the socket cannot bind.
    pub(crate) fn bare_rep(name: &str, endpoint: Endpoint, reply: Bytes) -> anyhow::Result<Self> {
        Self::spawn(name, move |ready, stop| async move {
            let context = tmq::Context::new();
            match tmq::reply(&context).set_linger(0).bind(&endpoint.url()) {
                Ok(socket) => {
                    let _ = ready.send(Ok(endpoint));
                    serve_rep(socket, reply, stop).await;
                }
                Err(e) => {
                    let _ = ready.send(Err(anyhow::Error::new(e).context("cannot bind")));
                }
            }
        })
    }

    fn spawn<F, Fut>(name: &str, serve: F) -> anyhow::Result<Self>
    where
        F: FnOnce(std::sync::mpsc::Sender<anyhow::Result<Endpoint>>, oneshot::Receiver<()>) -> Fut
            + Send
            + 'static,
        Fut: Future<Output = ()>,
    {
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = oneshot::channel();
        let thread = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || match current_thread_runtime() {
                Ok(runtime) => runtime.block_on(serve(ready_tx, stop_rx)),
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                }
            })
            .with_context(|| format!("cannot start the {name} thread"))?;
        let endpoint = ready_rx
            .recv()
            .with_context(|| format!("the {name} thread ended before it was ready"))?
            .with_context(|| name.to_owned())?;
        Ok(Self {
            endpoint,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// Stops the server and waits for its thread.
    ///
    /// # Errors
    /// When the server thread panicked.
    pub(crate) fn stop(mut self) -> anyhow::Result<()> {
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                bail!("a server thread panicked");
            }
        }
        Ok(())
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        // Dropping the sender wakes the server, which closes its socket.
        self.stop.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

async fn serve_rep(mut receiver: RequestReceiver, reply: Bytes, mut stop: oneshot::Receiver<()>) {
    loop {
        let sender = tokio::select! {
            _ = &mut stop => return,
            got = receiver.recv() => match got {
                Ok((_request, sender)) => sender,
                Err(e) => {
                    eprintln!("bare REP server: receive failed: {e}");
                    return;
                }
            },
        };
        receiver = match sender
            .send(Multipart::from(vec![Message::from(&reply[..])]))
            .await
        {
            Ok(receiver) => receiver,
            Err(e) => {
                eprintln!("bare REP server: send failed: {e}");
                return;
            }
        };
    }
}

/// The reference loop: a bare tmq REQ socket sends the payload's frames and waits for
/// each reply, `warmup` times unmeasured, then `count` times. Returns lookups per
/// second.
///
/// # Errors
/// When the socket fails, a reply takes longer than [`REPLY_TIMEOUT`], or a reply
/// differs from the payload's.
pub(crate) async fn bare_req_loop(
    url: &str,
    payload: &Payload,
    warmup: usize,
    count: usize,
) -> anyhow::Result<f64> {
    let context = tmq::Context::new();
    let mut sender = tmq::request(&context).set_linger(0).connect(url)?;
    let mut wrong = 0_usize;
    let mut start = Instant::now();
    for i in 0..warmup + count {
        if i == warmup {
            start = Instant::now();
        }
        let message: Multipart = payload
            .frames
            .iter()
            .map(|f| Message::from(&f[..]))
            .collect();
        let receiver = sender.send(message).await?;
        let (reply, next) = tokio::time::timeout(REPLY_TIMEOUT, receiver.recv())
            .await
            .with_context(|| format!("no reply from {url} within {REPLY_TIMEOUT:?}"))??;
        if reply.len() != 1
            || reply
                .iter()
                .next()
                .is_none_or(|f| f[..] != payload.reply[..])
        {
            wrong += 1;
        }
        sender = next;
    }
    let elapsed = start.elapsed();
    ensure!(
        wrong == 0,
        "{wrong} of {} bare replies differ from the payload's",
        warmup + count
    );
    Ok(per_second(count, elapsed))
}

/// `count / elapsed` (lookups per second).
pub(crate) fn per_second(count: usize, elapsed: Duration) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let count = count as f64;
    count / elapsed.as_secs_f64()
}

/// How the slow index waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DelayKind {
    /// A blocking-pool thread sleeps the latency (`std::thread::sleep`: a Linux
    /// high-resolution timer, tens of microseconds late), so calls wait concurrently
    /// and close to the asked time.
    Precise,
    /// `lookup_server::DelayedIndex`: a tokio timer, which ticks in whole milliseconds,
    /// so a 1 ms latency waits 1-2 ms.
    Tokio,
}

/// An in-memory index behind a fixed latency per call, which it measures.
pub(crate) struct SlowIndex {
    inner: Arc<InMemoryIndex>,
    tokio: DelayedIndex<Arc<InMemoryIndex>>,
    kind: DelayKind,
    latency: Duration,
    calls: AtomicU64,
    waited_ns: AtomicU64,
}

impl SlowIndex {
    pub(crate) fn new(inner: InMemoryIndex, latency: Duration, kind: DelayKind) -> Self {
        let inner = Arc::new(inner);
        Self {
            tokio: DelayedIndex::new(Arc::clone(&inner), latency),
            inner,
            kind,
            latency,
            calls: AtomicU64::new(0),
            waited_ns: AtomicU64::new(0),
        }
    }

    /// Mean time of an existence call so far (seconds); `None` before the first.
    pub(crate) fn mean_call_s(&self) -> Option<f64> {
        let calls = self.calls.load(Ordering::Relaxed);
        #[allow(clippy::cast_precision_loss)]
        (calls > 0).then(|| self.waited_ns.load(Ordering::Relaxed) as f64 / calls as f64 / 1e9)
    }
}

impl BlockIndex for SlowIndex {
    fn exists<'a>(&'a self, keys: &'a [String]) -> IndexFuture<'a, Vec<bool>> {
        Box::pin(async move {
            let start = Instant::now();
            let flags = match self.kind {
                DelayKind::Precise => {
                    let latency = self.latency;
                    tokio::task::spawn_blocking(move || std::thread::sleep(latency))
                        .await
                        .map_err(|e| IndexError::Unavailable(format!("delay thread: {e}")))?;
                    self.inner.exists(keys).await
                }
                DelayKind::Tokio => self.tokio.exists(keys).await,
            };
            let took = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.calls.fetch_add(1, Ordering::Relaxed);
            self.waited_ns.fetch_add(took, Ordering::Relaxed);
            flags
        })
    }

    fn clear(&self) -> IndexFuture<'_, ()> {
        self.inner.clear()
    }
}
