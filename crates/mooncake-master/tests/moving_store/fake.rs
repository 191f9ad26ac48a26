//! A fake master over a store that moves, on loopback and tokio's clock (paused in
//! the tests): keys put, read leases granted by every `true` answer (as the real
//! master does), evictions that respect the lease, wipes, restarts behind the same
//! address (every connection closed, the store emptied, a new lease), connections
//! dropped, and a stuck mode that stops reading.
//!
//! It answers `BatchExistKey`, `RemoveAll` and `GetReplicaList` (with its lease) with
//! the crate's own server-side codec; `delay` holds every answer that long.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mooncake_master::TypeLiteral;
use mooncake_master::codec::{
    self, FunctionId, REQUEST_HEADER_LEN, ReplicaDescriptor, ReplicaList, RequestHeader,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The store behind the fake master: each key with the end of its read lease.
#[derive(Debug)]
pub(crate) struct Store {
    pub(crate) keys: HashMap<String, Instant>,
    pub(crate) lease: Duration,
    pub(crate) delay: Duration,
}

pub(crate) struct FakeMaster {
    pub(crate) addr: String,
    pub(crate) store: Mutex<Store>,
    /// Ends every connection of the current incarnation.
    conns: Mutex<CancellationToken>,
    /// Stop reading requests (a hung master: the client's writes pile up).
    pub(crate) stuck: AtomicBool,
    pub(crate) connections: AtomicUsize,
    pub(crate) exist_calls: AtomicUsize,
}

impl FakeMaster {
    pub(crate) async fn start(lease: Duration) -> Arc<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let master = Arc::new(Self {
            addr: listener.local_addr().unwrap().to_string(),
            store: Mutex::new(Store {
                keys: HashMap::new(),
                lease,
                delay: Duration::ZERO,
            }),
            conns: Mutex::new(CancellationToken::new()),
            stuck: AtomicBool::new(false),
            connections: AtomicUsize::new(0),
            exist_calls: AtomicUsize::new(0),
        });
        let served = master.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                served.connections.fetch_add(1, Ordering::SeqCst);
                let stop = served.conns.lock().unwrap().clone();
                let master = served.clone();
                tokio::spawn(async move {
                    tokio::select! {
                        () = stop.cancelled() => {}
                        () = master.serve(stream) => {}
                    }
                });
            }
        });
        master
    }

    pub(crate) fn put<S: AsRef<str>>(&self, keys: &[S]) {
        let now = Instant::now();
        let mut store = self.store.lock().unwrap();
        for key in keys {
            store.keys.entry(key.as_ref().to_owned()).or_insert(now);
        }
    }

    /// Evicts `key` if its lease ended (the master never evicts a leased object).
    pub(crate) fn evict(&self, key: &str) -> bool {
        let now = Instant::now();
        let mut store = self.store.lock().unwrap();
        match store.keys.get(key) {
            Some(until) if *until <= now => {
                store.keys.remove(key);
                true
            }
            _ => false,
        }
    }

    /// Another client's `RemoveAll(force)`: every key goes, leased or not.
    pub(crate) fn wipe(&self) -> Vec<String> {
        self.store
            .lock()
            .unwrap()
            .keys
            .drain()
            .map(|(k, _)| k)
            .collect()
    }

    /// Closes every connection (as a killed master's kernel does) and keeps the store.
    pub(crate) fn drop_connections(&self) {
        let mut conns = self.conns.lock().unwrap();
        conns.cancel();
        *conns = CancellationToken::new();
    }

    /// A restart behind the same address: every connection closed, the store empty,
    /// the lease `lease` from now on. Returns the keys lost.
    pub(crate) fn restart(&self, lease: Duration) -> Vec<String> {
        self.drop_connections();
        let mut store = self.store.lock().unwrap();
        store.lease = lease;
        store.keys.drain().map(|(k, _)| k).collect()
    }

    pub(crate) fn set_delay(&self, delay: Duration) {
        self.store.lock().unwrap().delay = delay;
    }

    fn exists(&self, keys: &[String]) -> Vec<codec::ExistResult> {
        let now = Instant::now();
        let mut store = self.store.lock().unwrap();
        let lease = store.lease;
        keys.iter()
            .map(|k| match store.keys.get_mut(k) {
                Some(until) => {
                    *until = (*until).max(now + lease);
                    Ok(true)
                }
                None => Ok(false),
            })
            .collect()
    }

    async fn serve(self: Arc<Self>, mut stream: TcpStream) {
        let lit = TypeLiteral::Include;
        loop {
            while self.stuck.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let mut head = [0u8; REQUEST_HEADER_LEN];
            if stream.read_exact(&mut head).await.is_err() {
                return;
            }
            let header = RequestHeader::decode(&head).unwrap();
            let mut body = vec![0; header.body_length as usize];
            if stream.read_exact(&mut body).await.is_err() {
                return;
            }
            let seq = header.seq_num;
            let delay = self.store.lock().unwrap().delay;
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let mut out = Vec::new();
            match header.function_id {
                FunctionId::BATCH_EXIST_KEY => {
                    self.exist_calls.fetch_add(1, Ordering::SeqCst);
                    let args = codec::decode_batch_exist_key_args(&body).unwrap();
                    let answers = self.exists(&args.keys);
                    codec::encode_batch_exist_key_reply(&mut out, seq, &answers, lit);
                }
                FunctionId::REMOVE_ALL => {
                    let removed = self.wipe().len() as i64;
                    codec::encode_remove_all_reply(&mut out, seq, removed, lit);
                }
                FunctionId::GET_REPLICA_LIST => {
                    let args = codec::decode_exist_key_args(&body).unwrap();
                    let present = self.exists(std::slice::from_ref(&args.keys))[0] == Ok(true);
                    let lease_ttl_ms = self.store.lock().unwrap().lease.as_millis() as u64;
                    let result = if present {
                        Ok(ReplicaList {
                            replicas: Vec::<ReplicaDescriptor>::new(),
                            lease_ttl_ms,
                            object_checksum: None,
                        })
                    } else {
                        Err(mooncake_master::StoreErrorCode::OBJECT_NOT_FOUND)
                    };
                    codec::encode_get_replica_list_reply(&mut out, seq, &result, lit);
                }
                other => panic!("unexpected function {other}"),
            }
            if stream.write_all(&out).await.is_err() {
                return;
            }
        }
    }
}
