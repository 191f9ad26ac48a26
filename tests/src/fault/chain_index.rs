//! [`ChainIndex`]: a `BlockIndex` that answers the workload from the hashes alone (no
//! memory per key) and can hang on chosen chains.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use lookup_server::{BlockIndex, IndexFuture, LookupServer, ServerConfig};
use lookup_tokio::Endpoint;
use tokio::sync::watch;

use super::*;

/// A `BlockIndex` that answers the workload from the keys alone: a key exists when
/// its hash is one of the stored leading blocks of its chain. Calls about the chains
/// of requests in the hang set wait until [`release`](Self::release).
pub struct ChainIndex {
    calls: AtomicU64,
    hung_calls: AtomicU64,
    hang: Mutex<HashSet<u64>>,
    released: watch::Sender<bool>,
}

impl Default for ChainIndex {
    fn default() -> Self {
        Self::new()
    }
}

impl ChainIndex {
    /// An index that hangs on no chain.
    pub fn new() -> Self {
        Self {
            calls: AtomicU64::new(0),
            hung_calls: AtomicU64::new(0),
            hang: Mutex::new(HashSet::new()),
            released: watch::channel(false).0,
        }
    }

    /// Calls about request `id`'s chain hang until [`release`](Self::release).
    pub fn hang_on(&self, id: u64) {
        self.hang.lock().expect("lock").insert(id);
    }

    /// Lets every hung call (and later ones) answer.
    pub fn release(&self) {
        self.released.send_replace(true);
    }

    /// Existence calls so far.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// Calls that hit the hang set so far.
    pub fn hung_calls(&self) -> u64 {
        self.hung_calls.load(Ordering::SeqCst)
    }
}

impl BlockIndex for ChainIndex {
    fn exists<'a>(&'a self, keys: &'a [String]) -> IndexFuture<'a, Vec<bool>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let hashes: Vec<Option<Vec<u8>>> = keys
            .iter()
            .map(|k| k.rsplit_once('@').and_then(|(_, hex)| unhex(hex)))
            .collect();
        let hangs = {
            let hang = self.hang.lock().expect("lock");
            !hang.is_empty()
                && hashes
                    .iter()
                    .flatten()
                    .filter_map(|h| parse_hash(h))
                    .any(|(id, _)| hang.contains(&id))
        };
        let mut released = self.released.subscribe();
        Box::pin(async move {
            if hangs {
                self.hung_calls.fetch_add(1, Ordering::SeqCst);
                while !*released.borrow_and_update() {
                    if released.changed().await.is_err() {
                        break;
                    }
                }
            }
            Ok(hashes
                .iter()
                .map(|h| h.as_deref().is_some_and(hash_present))
                .collect())
        })
    }

    fn clear(&self) -> IndexFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
}

/// Binds a reference `LookupServer` over the workload at `endpoint`.
pub fn chain_server(endpoint: &Endpoint, index: Arc<ChainIndex>) -> LookupServer {
    LookupServer::bind(endpoint, ServerConfig::new(B, layout()), index).expect("bind the server")
}
