//! A hostile-input flood over real ZeroMQ: DEALER peers that send a server garbage
//! messages, frames of exactly its `max_frame_bytes`, well-formed lookups as large as
//! that allows, and now and then a frame one byte over the limit (which gets the peer
//! disconnected; its socket reconnects by itself), as fast as the server takes them.
//! The peers never read the replies.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use futures::SinkExt;
use lookup_core::Endpoint;
use lookup_core::wire::{self, Format};
use tmq::{Message, Multipart};
use tokio::task::JoinHandle;

/// Messages each flooding peer queues in its own socket at most (its `ZMQ_SNDHWM`), so
/// that the flood's memory stays in the server, not in the test.
const PEER_SNDHWM: i32 = 4;

/// A running flood; [`stop`](Self::stop) ends it and closes its sockets.
pub struct Flood {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
    peers: Vec<JoinHandle<()>>,
}

/// A small xorshift generator: the flood's sizes and bytes, the same for a seed.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn bytes(&mut self, len: usize) -> Bytes {
        let mut v = Vec::with_capacity(len + 8);
        while v.len() < len {
            v.extend_from_slice(&self.next().to_le_bytes());
        }
        v.truncate(len);
        Bytes::from(v)
    }
}

impl Flood {
    /// Starts `peers` flooding peers against `endpoint`, a server whose
    /// `max_frame_bytes` is `max_frame_bytes`. Call inside a tokio runtime.
    ///
    /// # Panics
    /// When a socket cannot be created.
    #[must_use]
    pub fn start(endpoint: &Endpoint, max_frame_bytes: usize, peers: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let bytes = Arc::new(AtomicU64::new(0));
        let ctx = tmq::Context::new();
        let peers = (0..peers)
            .map(|peer| {
                let dealer = tmq::dealer(&ctx)
                    .set_linger(0)
                    .set_sndhwm(PEER_SNDHWM)
                    .connect(&endpoint.url())
                    .expect("connect a flooding DEALER");
                let (stop, sent, bytes) =
                    (Arc::clone(&stop), Arc::clone(&sent), Arc::clone(&bytes));
                let seed = 0x9e37_79b9_7f4a_7c15 ^ (peer as u64 + 1);
                tokio::spawn(flood(dealer, max_frame_bytes, seed, stop, sent, bytes))
            })
            .collect();
        Self {
            stop,
            sent,
            bytes,
            peers,
        }
    }

    /// Messages sent so far, and their bytes.
    #[must_use]
    pub fn sent(&self) -> (u64, u64) {
        (
            self.sent.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }

    /// Stops every peer and waits until their sockets are closed.
    pub async fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for peer in self.peers {
            peer.abort();
            let _ = peer.await;
        }
    }
}

/// One peer's messages, in a fixed rotation from its seed.
fn message(rng: &mut XorShift, max: usize, i: u64, maximal: &Bytes) -> Vec<Bytes> {
    let envelope = Bytes::copy_from_slice(&i.to_be_bytes());
    let mut frames = vec![envelope, Bytes::new()];
    match i % 8 {
        // A frame of exactly `max_frame_bytes` of garbage.
        0 | 4 => frames.push(maximal.clone()),
        // A well-formed tagged-blob lookup of as many 32-byte hashes as the frame
        // limit allows, none of them stored.
        2 => {
            let n = ((max.saturating_sub(16)) / 32).min(wire::MAX_HASHES);
            let hashes: Vec<Vec<u8>> = (0..n).map(|_| rng.bytes(32).to_vec()).collect();
            let hashes = lookup_core::BlockHashes::from_hashes(&hashes).expect("32-byte hashes");
            let tokens = u32::try_from(n * 16).unwrap_or(u32::MAX);
            let lookup = wire::encode_lookup(Format::TaggedBlob, tokens, 16, &hashes);
            if lookup.iter().all(|f| f.len() <= max) {
                frames.extend(lookup);
            } else {
                frames.push(rng.bytes(max));
            }
        }
        // One byte over the limit: the server hangs up at the frame header.
        7 if i % 64 == 7 => frames.push(rng.bytes(max + 1)),
        // Garbage: 1-4 frames of up to 64 KiB, sometimes with no delimiter at all.
        _ => {
            if rng.below(4) == 0 {
                frames.remove(1);
            }
            for _ in 0..=rng.below(4) {
                let len = usize::try_from(rng.below(64 * 1024)).expect("small");
                frames.push(rng.bytes(len.min(max)));
            }
        }
    }
    frames
}

async fn flood(
    mut dealer: tmq::dealer::Dealer,
    max: usize,
    seed: u64,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    bytes: Arc<AtomicU64>,
) {
    let mut rng = XorShift(seed);
    let maximal = rng.bytes(max);
    let mut i = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let frames = message(&mut rng, max, i, &maximal);
        let len: usize = frames.iter().map(Bytes::len).sum();
        let multipart: Multipart = frames.iter().map(|f| Message::from(f.as_ref())).collect();
        if dealer.send(multipart).await.is_err() {
            tokio::task::yield_now().await;
            continue;
        }
        sent.fetch_add(1, Ordering::Relaxed);
        bytes.fetch_add(len as u64, Ordering::Relaxed);
        i += 1;
    }
}
