//! Shared pieces of the `direct_*` tests: a scriptable fake Mooncake master on
//! loopback (the master's existence RPC through `mooncake_master::codec`, the spec's
//! bytes), requests, and polling with a deadline.
//!
//! The fake answers `BatchExistKey` from a key set: keys in `errors` get
//! `OBJECT_NOT_FOUND`, others `true` when stored. Its [`Behaviour`] can also keep
//! silent, answer garbage, or hold replies until the test opens a gate.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lookup_core::{BlockHashes, Event, LookupOutcome, Request, RequestId};
use lookup_tokio::LookupClient;
use mooncake_master::codec::{self, ExistResult, FunctionId, REQUEST_HEADER_LEN, ReplicaList};
use mooncake_master::{StoreErrorCode, TypeLiteral};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Longest any test waits for something that should happen at once.
pub const LIMIT: Duration = Duration::from_secs(20);

/// How the fake answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Answers every call at once.
    Answer,
    /// Reads calls and never answers.
    Silent,
    /// Answers with a reply body that does not decode.
    Garbage,
    /// Answers only once [`FakeMaster::open_gate`] was called (calls received before
    /// stay unanswered until then).
    Gated,
}

/// A fake master on `127.0.0.1`.
pub struct FakeMaster {
    /// `host:port` to give the client as the master address.
    pub addr: String,
    present: Mutex<HashSet<String>>,
    errors: Mutex<HashSet<String>>,
    /// Key count of each `BatchExistKey` call received, in order.
    calls: Mutex<Vec<usize>>,
    /// Calls read and not answered yet.
    outstanding: AtomicUsize,
    /// The most calls ever read and not answered at once.
    max_outstanding: AtomicUsize,
    behaviour: Behaviour,
    gate: watch::Sender<bool>,
    /// What `GetReplicaList` reports as the read lease; `None` refuses the call as
    /// an unregistered function (`err_code` 11), as a master without it would.
    lease: Mutex<Option<Duration>>,
    /// `GetReplicaList` calls received.
    lease_calls: AtomicUsize,
}

impl FakeMaster {
    /// Listens on a free port.
    pub async fn start(behaviour: Behaviour) -> Arc<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        Self::serve_on(listener, behaviour)
    }

    /// Listens on `addr` (for a master that comes up after the client).
    pub async fn start_on(addr: &str, behaviour: Behaviour) -> Arc<Self> {
        let listener = TcpListener::bind(addr).await.expect("bind the given port");
        Self::serve_on(listener, behaviour)
    }

    fn serve_on(listener: TcpListener, behaviour: Behaviour) -> Arc<Self> {
        let addr = listener.local_addr().expect("local addr").to_string();
        let fake = Arc::new(Self {
            addr,
            present: Mutex::default(),
            errors: Mutex::default(),
            calls: Mutex::default(),
            outstanding: AtomicUsize::new(0),
            max_outstanding: AtomicUsize::new(0),
            behaviour,
            gate: watch::channel(false).0,
            lease: Mutex::new(None),
            lease_calls: AtomicUsize::new(0),
        });
        let served = Arc::clone(&fake);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(Arc::clone(&served).serve(stream));
            }
        });
        fake
    }

    /// Stores `keys`: they are answered `true` from now on.
    pub fn store<K: AsRef<str>>(&self, keys: &[K]) {
        let mut present = self.present.lock().unwrap();
        present.extend(keys.iter().map(|k| k.as_ref().to_owned()));
    }

    /// Makes `keys` answer `OBJECT_NOT_FOUND` from now on.
    pub fn fail<K: AsRef<str>>(&self, keys: &[K]) {
        let mut errors = self.errors.lock().unwrap();
        errors.extend(keys.iter().map(|k| k.as_ref().to_owned()));
    }

    /// Key counts of the `BatchExistKey` calls received, in order.
    pub fn calls(&self) -> Vec<usize> {
        self.calls.lock().unwrap().clone()
    }

    /// Calls received and not answered yet.
    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::SeqCst)
    }

    /// Most calls ever outstanding at once.
    pub fn max_outstanding(&self) -> usize {
        self.max_outstanding.load(Ordering::SeqCst)
    }

    /// Releases the replies a gated fake holds, and every later one.
    pub fn open_gate(&self) {
        self.gate.send_replace(true);
    }

    /// Makes `GetReplicaList` report `lease` as the master's read lease.
    pub fn report_lease(&self, lease: Duration) {
        *self.lease.lock().unwrap() = Some(lease);
    }

    /// `GetReplicaList` calls received so far.
    pub fn lease_calls(&self) -> usize {
        self.lease_calls.load(Ordering::SeqCst)
    }

    fn answer(&self, key: &str) -> ExistResult {
        if self.errors.lock().unwrap().contains(key) {
            Err(StoreErrorCode::OBJECT_NOT_FOUND)
        } else {
            Ok(self.present.lock().unwrap().contains(key))
        }
    }

    async fn serve(self: Arc<Self>, stream: TcpStream) {
        let (mut reader, writer) = stream.into_split();
        let writer = Arc::new(tokio::sync::Mutex::new(writer));
        loop {
            let mut head = [0u8; REQUEST_HEADER_LEN];
            if reader.read_exact(&mut head).await.is_err() {
                return;
            }
            let header = codec::RequestHeader::decode(&head).expect("request header");
            let mut body = vec![0; header.body_length as usize];
            if reader.read_exact(&mut body).await.is_err() {
                return;
            }
            if header.function_id == FunctionId::GET_REPLICA_LIST {
                self.lease_calls.fetch_add(1, Ordering::SeqCst);
                let mut out = Vec::new();
                let lease = *self.lease.lock().unwrap();
                match lease {
                    Some(lease) => codec::encode_get_replica_list_reply(
                        &mut out,
                        header.seq_num,
                        &Ok(ReplicaList {
                            replicas: Vec::new(),
                            lease_ttl_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
                            object_checksum: None,
                        }),
                        TypeLiteral::Include,
                    ),
                    None => codec::encode_error_reply(
                        &mut out,
                        header.seq_num,
                        11,
                        "the rpc function not registered",
                        TypeLiteral::Include,
                    ),
                }
                let _ = writer.lock().await.write_all(&out).await;
                continue;
            }
            assert_eq!(header.function_id, FunctionId::BATCH_EXIST_KEY);
            let keys = codec::decode_batch_exist_key_args(&body)
                .expect("BatchExistKey arguments")
                .keys;
            self.calls.lock().unwrap().push(keys.len());
            let now = self.outstanding.fetch_add(1, Ordering::SeqCst) + 1;
            self.max_outstanding.fetch_max(now, Ordering::SeqCst);
            let seq = header.seq_num;
            let mut out = Vec::new();
            match self.behaviour {
                Behaviour::Silent => continue,
                Behaviour::Garbage => {
                    // A reply header announcing a 3-byte body that is no struct_pack.
                    let reply = codec::ReplyHeader {
                        err_code: 0,
                        msg_type: 0,
                        seq_num: seq,
                        body_length: 3,
                        attach_length: 0,
                    };
                    out.extend_from_slice(&reply.encode());
                    out.extend_from_slice(&[1, 2, 3]);
                }
                Behaviour::Answer | Behaviour::Gated => {
                    let answers: Vec<ExistResult> = keys.iter().map(|k| self.answer(k)).collect();
                    codec::encode_batch_exist_key_reply(
                        &mut out,
                        seq,
                        &answers,
                        TypeLiteral::Include,
                    );
                }
            }
            let fake = Arc::clone(&self);
            let writer = Arc::clone(&writer);
            // Each reply on its own task, so a gated reply does not stop the reading
            // of the calls pipelined behind it.
            tokio::spawn(async move {
                if fake.behaviour == Behaviour::Gated {
                    let mut gate = fake.gate.subscribe();
                    let _ = gate.wait_for(|open| *open).await;
                }
                fake.outstanding.fetch_sub(1, Ordering::SeqCst);
                let _ = writer.lock().await.write_all(&out).await;
            });
        }
    }
}

/// A request with `num_tokens` tokens and 8-byte hashes from `ids`.
pub fn request(id: u64, num_tokens: u32, ids: &[u64]) -> Request {
    Request {
        request_id: RequestId(id),
        num_tokens,
        block_hashes: BlockHashes::from_u64s(ids),
        skip_reading_external_kv: false,
    }
}

/// Polls `check` every 5 ms until it holds; panics with `what` after [`LIMIT`].
pub async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !check() {
        assert!(Instant::now() < deadline, "not within {LIMIT:?}: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The outcomes of the lookup events queued in `client`, in order (other events
/// dropped).
pub fn lookup_outcomes(client: &mut LookupClient) -> Vec<LookupOutcome> {
    let mut out = Vec::new();
    while let Some(event) = client.poll_event() {
        if let Event::LookupDone { outcome, .. } = event {
            out.push(outcome);
        }
    }
    out
}
