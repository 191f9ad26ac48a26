//! One TCP connection to the master and the call path over it
//! (`spec/mooncake-master-rpc.md`, "Transport"): connect, the reader and writer
//! tasks, replies matched to waiting calls by sequence number, a broken connection
//! failing every waiting call and replaced in the background with backoff.
//!
//! Each connection is an epoch ([`Epoch`]): what a batcher learned on one (its presence
//! cache, the lease) ends with it. The writer's queue (the outbox) holds at most
//! [`MasterConfig::max_queued_bytes`](super::MasterConfig::max_queued_bytes); a call
//! that ends before its frame was written takes the frame out again, so a stuck
//! connection holds only the frames of calls still waiting.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::{Notify, oneshot};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::stats::{Counters, bump};
use super::streak::Streak;
use super::{Inner, MasterClient, lock};
use crate::MasterError;
use crate::addr::Endpoint;
use crate::codec::{
    self, CodecError, ERR_FUNCTION_NOT_REGISTERED, ERR_INVALID_ARGUMENTS, FunctionId,
    REPLY_HEADER_LEN, ReplyHeader,
};

/// A reply as framed by the reader task, before the function's decoder sees it.
#[derive(Debug)]
pub(super) struct RawReply {
    header: ReplyHeader,
    body: Vec<u8>,
}

type Waiter = oneshot::Sender<Result<RawReply, MasterError>>;

#[derive(Default)]
pub(super) struct Pending {
    /// Why the connection broke, once it has: no new call may wait on it.
    closed: Option<String>,
    waiters: HashMap<u32, Waiter>,
    /// Frames not yet handed to the socket, by sequence number.
    outbox: HashMap<u32, Vec<u8>>,
    /// Sequence numbers in call order; some may name calls that ended unwritten.
    /// Never more than twice the outbox plus [`ORDER_SLACK`]: a writer stuck on its
    /// socket must not make it grow per call.
    order: VecDeque<u32>,
    /// Bytes in `outbox`.
    queued_bytes: usize,
    /// Calls registered on this connection so far: the next call's ticket.
    pub(super) tickets: u64,
    /// Rule 17's count of timeouts in a row on this connection.
    pub(super) streak: Streak,
}

/// Entries of ended calls `order` may hold beyond twice the outbox before they are
/// swept.
const ORDER_SLACK: usize = 64;

impl Pending {
    /// Queues `frame` of call `seq` for the writer and registers its waiter; returns
    /// the call's ticket (its rank among the connection's calls).
    fn enqueue(&mut self, seq: u32, frame: Vec<u8>, waiter: Waiter) -> u64 {
        self.waiters.insert(seq, waiter);
        self.queued_bytes += frame.len();
        self.outbox.insert(seq, frame);
        self.order.push_back(seq);
        let ticket = self.tickets;
        self.tickets += 1;
        ticket
    }

    /// Call `seq` ended (answered, timed out, dropped): its waiter and any unwritten
    /// frame go, and `order` is swept once it holds mostly ended calls.
    fn end(&mut self, seq: u32) {
        self.waiters.remove(&seq);
        if let Some(frame) = self.outbox.remove(&seq) {
            self.queued_bytes -= frame.len();
        }
        if self.outbox.is_empty() {
            self.order.clear();
        } else if self.order.len() > 2 * self.outbox.len() + ORDER_SLACK {
            let outbox = &self.outbox;
            self.order.retain(|seq| outbox.contains_key(seq));
        }
    }

    /// Takes queued frames, in call order, up to about `limit` bytes (at least one
    /// frame), skipping those whose call ended; `None` when none waits.
    fn take_frames(&mut self, limit: usize) -> Option<Vec<u8>> {
        let mut out: Option<Vec<u8>> = None;
        while let Some(seq) = self.order.pop_front() {
            let Some(frame) = self.outbox.remove(&seq) else {
                continue;
            };
            self.queued_bytes -= frame.len();
            match &mut out {
                None => out = Some(frame),
                Some(out) => out.extend_from_slice(&frame),
            }
            if out.as_ref().is_some_and(|o| o.len() >= limit) {
                break;
            }
        }
        if self.outbox.is_empty() {
            // Sequence numbers of calls that ended before being written.
            self.order.clear();
        }
        out
    }
}

/// One TCP connection: the writer task's queue, the calls waiting for replies, and
/// what this master accepts.
pub(super) struct Conn {
    pub(super) id: u64,
    /// The master this connection reached.
    pub(super) addr: Endpoint,
    /// Wakes the writer task when a frame is queued.
    wake_writer: Notify,
    /// Most bytes the outbox holds; a call that would exceed it fails fast.
    max_queued_bytes: usize,
    pub(super) pending: Mutex<Pending>,
    /// The signatures this connection uses: the pre-0.3.12 ones (no `tenant_id`) when
    /// set. Starts as the client's last connection settled ([`Inner::legacy_hint`]),
    /// and flips when the master refuses a call with `err_code` 4 and takes it in the
    /// other form (a reconnect may reach an upgraded or older master).
    legacy_signatures: AtomicBool,
    pub(super) shutdown: CancellationToken,
}

/// The client's connection and where the next connect goes, under one lock so that
/// a leader change and a reconnect never disagree.
pub(super) struct State {
    pub(super) link: Link,
    /// Where the next connect goes: the fixed address, or the leader etcd names;
    /// `None` while no leader is elected.
    pub(super) target: Option<Endpoint>,
    /// Version of the view `target` came from; 0 for a fixed address. Never decreases.
    pub(super) version: i64,
}

pub(super) enum Link {
    Up(Arc<Conn>),
    Down {
        /// Earliest time a call may start the next connect attempt.
        retry_at: Instant,
        /// Wait after the next failed attempt.
        backoff: Duration,
        /// An attempt is running.
        connecting: bool,
        last_error: String,
    },
}

impl MasterClient {
    /// Calls a function that gained a `tenant_id` argument in 0.3.12: first in the
    /// signature this connection uses; on `err_code` 4 (the master's "invalid rpc arg")
    /// once more in the other signature, which the connection (and the client's next
    /// connections) then keep when it works. So only the first call a client makes to
    /// an older master is sent twice, and the refused attempt asked the master nothing.
    /// `encode(out, seq, legacy)` appends the frame.
    pub(super) async fn call_with_fallback(
        &self,
        function: FunctionId,
        encode: impl Fn(&mut Vec<u8>, u32, bool) -> Result<(), CodecError>,
    ) -> Result<Vec<u8>, MasterError> {
        let conn = self.conn()?;
        let legacy = conn.legacy_signatures.load(Ordering::Relaxed);
        let mut reply = self
            .encoded_roundtrip(&conn, function, legacy, &encode)
            .await?;
        if reply.header.err_code == ERR_INVALID_ARGUMENTS {
            let retry = self
                .encoded_roundtrip(&conn, function, !legacy, &encode)
                .await?;
            if retry.header.err_code == 0
                && conn.legacy_signatures.swap(!legacy, Ordering::Relaxed) == legacy
            {
                self.inner.legacy_hint.store(!legacy, Ordering::Relaxed);
                bump(&self.inner.counters.signature_fallbacks, 1);
                if legacy {
                    tracing::info!(addr = %conn.addr, "master takes tenant_id: using the 0.3.12 signatures on this connection");
                } else {
                    tracing::info!(addr = %conn.addr, "master takes no tenant_id: using the pre-0.3.12 signatures on this connection");
                }
            }
            reply = retry;
        }
        check(function, reply)
    }

    async fn encoded_roundtrip(
        &self,
        conn: &Arc<Conn>,
        function: FunctionId,
        legacy: bool,
        encode: &impl Fn(&mut Vec<u8>, u32, bool) -> Result<(), CodecError>,
    ) -> Result<RawReply, MasterError> {
        let seq = self.next_seq();
        let mut frame = Vec::new();
        encode(&mut frame, seq, legacy).map_err(MasterError::Encode)?;
        self.roundtrip(conn, function, seq, frame).await
    }

    pub(super) fn next_seq(&self) -> u32 {
        self.inner.next_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// The live connection, or a fast failure that may start a reconnect attempt
    /// (never while no leader is known).
    pub(super) fn conn(&self) -> Result<Arc<Conn>, MasterError> {
        let inner = &self.inner;
        let mut state = lock(&inner.state);
        let State { link, target, .. } = &mut *state;
        match link {
            Link::Up(conn) => Ok(conn.clone()),
            Link::Down {
                retry_at,
                connecting,
                last_error,
                ..
            } => {
                if target.is_some() && !*connecting && Instant::now() >= *retry_at {
                    *connecting = true;
                    spawn_reconnect(inner.clone());
                }
                bump(&inner.counters.failed_fast, 1);
                let err = MasterError::Unavailable {
                    addr: target
                        .as_ref()
                        .map_or_else(|| inner.addr_text.clone(), ToString::to_string),
                    last_error: last_error.clone(),
                };
                drop(state);
                inner.trouble(false);
                Err(err)
            }
        }
    }

    pub(super) async fn roundtrip(
        &self,
        conn: &Arc<Conn>,
        function: FunctionId,
        seq: u32,
        frame: Vec<u8>,
    ) -> Result<RawReply, MasterError> {
        let lost = |reason: &str| {
            self.inner.trouble(true);
            MasterError::ConnectionLost {
                addr: conn.addr.to_string(),
                reason: reason.to_owned(),
            }
        };
        let (tx, rx) = oneshot::channel();
        let ticket = {
            let mut pending = lock(&conn.pending);
            if let Some(reason) = &pending.closed {
                return Err(lost(reason));
            }
            let queued = pending.queued_bytes;
            if queued > 0 && queued + frame.len() > conn.max_queued_bytes {
                // The socket does not take what it is given (a stuck master): fail
                // fast rather than queue without bound.
                drop(pending);
                bump(&self.inner.counters.queue_full, 1);
                self.inner.trouble(false);
                return Err(MasterError::Unavailable {
                    addr: conn.addr.to_string(),
                    last_error: format!(
                        "{queued} bytes of requests wait for the connection (limit {})",
                        conn.max_queued_bytes
                    ),
                });
            }
            pending.enqueue(seq, frame, tx)
        };
        conn.wake_writer.notify_one();
        // Removes the slot and any unwritten frame however this call ends (reply,
        // timeout, or the caller dropping the future), so a late reply finds no one
        // and is counted, and a stuck connection keeps no frame nobody waits for.
        let _slot = SlotGuard { conn, seq };
        bump(&self.inner.counters.requests, 1);
        match tokio::time::timeout(self.inner.config.call_timeout, rx).await {
            Ok(Ok(reply)) => reply,
            Ok(Err(_)) => Err(lost("connection closed")),
            Err(_) => {
                // Rule 17's count first: whoever reads `timeouts` sees its outcome.
                self.timed_out(conn, ticket);
                bump(&self.inner.counters.timeouts, 1);
                self.inner.trouble(true);
                Err(MasterError::Timeout {
                    function,
                    after: self.inner.config.call_timeout,
                })
            }
        }
    }
}

struct SlotGuard<'a> {
    conn: &'a Conn,
    seq: u32,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        lock(&self.conn.pending).end(self.seq);
    }
}

impl Conn {
    /// Bytes queued for the writer now.
    pub(super) fn queued_bytes(&self) -> usize {
        lock(&self.pending).queued_bytes
    }

    /// Takes queued frames, in call order, up to about `limit` bytes (at least one
    /// frame), skipping those whose call ended; `None` when none waits.
    fn take_frames(&self, limit: usize) -> Option<Vec<u8>> {
        lock(&self.pending).take_frames(limit)
    }
}

/// The reply's body when `err_code` is 0, the typed RPC failure otherwise.
pub(super) fn check(function: FunctionId, reply: RawReply) -> Result<Vec<u8>, MasterError> {
    let err_code = reply.header.err_code;
    if err_code == 0 {
        return Ok(reply.body);
    }
    let (code, message) = match codec::decode_error_reply(err_code, &reply.body) {
        Ok(e) => (e.code, e.message),
        Err(e) => (u16::from(err_code), format!("(undecodable message: {e})")),
    };
    Err(match err_code {
        ERR_INVALID_ARGUMENTS => MasterError::InvalidArguments { function, message },
        ERR_FUNCTION_NOT_REGISTERED => MasterError::FunctionNotRegistered { function, message },
        _ => MasterError::Rpc {
            function,
            code,
            message,
        },
    })
}

/// Connects to `target` and starts the connection's reader and writer tasks.
pub(super) async fn open(inner: &Arc<Inner>, target: &Endpoint) -> Result<Arc<Conn>, MasterError> {
    let connect_error = |source: std::io::Error| {
        bump(&inner.counters.connect_failures, 1);
        MasterError::Connect {
            addr: target.to_string(),
            source: Arc::new(source),
        }
    };
    let stream = match tokio::time::timeout(
        inner.config.connect_timeout,
        TcpStream::connect((target.host().trim_matches(['[', ']']), target.port())),
    )
    .await
    {
        Ok(Ok(stream)) => stream,
        Ok(Err(e)) => return Err(connect_error(e)),
        Err(_) => {
            return Err(connect_error(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no connection within {:?}", inner.config.connect_timeout),
            )));
        }
    };
    // Small requests must leave at once (Nagle would hold them for the previous
    // reply's ACK); closing with a request unanswered must not linger.
    stream.set_nodelay(true).map_err(connect_error)?;
    stream.set_zero_linger().map_err(connect_error)?;
    let (read, write) = stream.into_split();
    let conn = Arc::new(Conn {
        id: inner.next_conn_id.fetch_add(1, Ordering::Relaxed),
        addr: target.clone(),
        wake_writer: Notify::new(),
        max_queued_bytes: inner.config.max_queued_bytes,
        pending: Mutex::new(Pending::default()),
        legacy_signatures: AtomicBool::new(inner.legacy_hint.load(Ordering::Relaxed)),
        shutdown: CancellationToken::new(),
    });
    bump(&inner.counters.connects, 1);
    tracing::debug!(addr = %target, conn = conn.id, "connected to the Mooncake master");
    let weak = Arc::downgrade(inner);
    tokio::spawn(read_loop(
        weak.clone(),
        inner.counters.clone(),
        conn.clone(),
        read,
        inner.config.max_reply_bytes,
    ));
    tokio::spawn(write_loop(weak, conn.clone(), write));
    Ok(conn)
}

/// Starts one reconnect attempt to the current target; on failure the next waits for
/// the doubled backoff. Only with `Link::Down { connecting: true }`, set by the caller.
pub(super) fn spawn_reconnect(inner: Arc<Inner>) {
    tokio::spawn(reconnect(inner));
}

async fn reconnect(inner: Arc<Inner>) {
    let target = lock(&inner.state).target.clone();
    let result = match &target {
        Some(target) => open(&inner, target).await,
        None => Err(MasterError::Unavailable {
            addr: inner.addr_text.clone(),
            last_error: "no leader elected".to_owned(),
        }),
    };
    let mut state = lock(&inner.state);
    let State {
        link,
        target: now_target,
        ..
    } = &mut *state;
    let Link::Down {
        retry_at,
        backoff,
        connecting,
        last_error,
    } = link
    else {
        // Only this task connects while `connecting` is set; nothing else brings the
        // link up.
        if let Ok(conn) = result {
            conn.shutdown.cancel();
        }
        return;
    };
    if *now_target != target {
        // The leader moved while this attempt ran: try the new one at once.
        if let Ok(conn) = &result {
            conn.shutdown.cancel();
        }
        *retry_at = Instant::now();
        *backoff = inner.config.backoff_min;
        if now_target.is_some() {
            spawn_reconnect(inner.clone());
        } else {
            *connecting = false;
        }
        return;
    }
    match result {
        Ok(conn) => {
            tracing::info!(addr = %conn.addr, conn = conn.id, "connected to the Mooncake master again");
            *link = Link::Up(conn);
        }
        Err(e) => {
            *connecting = false;
            *retry_at = Instant::now() + *backoff;
            *backoff = (*backoff * 2).min(inner.config.backoff_max);
            *last_error = e.to_string();
            drop(state);
            inner.trouble(true);
        }
    }
}

/// Marks `conn` broken: fails its waiting calls, and if it is still the client's
/// connection, replaces it by a pending reconnect (started at once when a target is
/// known).
pub(super) fn fail(weak: &Weak<Inner>, conn: &Conn, reason: String) {
    conn.shutdown.cancel();
    let waiters = {
        let mut pending = lock(&conn.pending);
        if pending.closed.is_some() {
            return;
        }
        pending.closed = Some(reason.clone());
        pending.outbox.clear();
        pending.order.clear();
        pending.queued_bytes = 0;
        std::mem::take(&mut pending.waiters)
    };
    let Some(inner) = weak.upgrade() else { return };
    tracing::warn!(addr = %conn.addr, conn = conn.id, %reason, "connection to the Mooncake master lost");
    bump(&inner.counters.connections_lost, 1);
    for (_, waiter) in waiters {
        let _ = waiter.send(Err(MasterError::ConnectionLost {
            addr: conn.addr.to_string(),
            reason: reason.clone(),
        }));
    }
    let mut state = lock(&inner.state);
    if matches!(&state.link, Link::Up(current) if current.id == conn.id) {
        let reconnecting = state.target.is_some();
        state.link = Link::Down {
            retry_at: Instant::now(),
            backoff: inner.config.backoff_min,
            connecting: reconnecting,
            last_error: reason,
        };
        if reconnecting {
            spawn_reconnect(inner.clone());
        }
    }
    drop(state);
    inner.trouble(true);
}

async fn read_loop(
    weak: Weak<Inner>,
    counters: Arc<Counters>,
    conn: Arc<Conn>,
    mut read: OwnedReadHalf,
    max_reply_bytes: u32,
) {
    let reason = tokio::select! {
        () = conn.shutdown.cancelled() => return,
        reason = read_replies(&counters, &conn, &mut read, max_reply_bytes) => reason,
    };
    fail(&weak, &conn, reason);
}

/// Reads replies until the stream fails; returns why it stopped.
async fn read_replies(
    counters: &Counters,
    conn: &Conn,
    read: &mut OwnedReadHalf,
    max_reply_bytes: u32,
) -> String {
    let mut head = [0u8; REPLY_HEADER_LEN];
    loop {
        if let Err(e) = read.read_exact(&mut head).await {
            return if e.kind() == std::io::ErrorKind::UnexpectedEof {
                "closed by the master".to_owned()
            } else {
                format!("read failed: {e}")
            };
        }
        let header = match ReplyHeader::decode(&head) {
            Ok(header) => header,
            Err(e) => return format!("protocol violation: {e}"),
        };
        if header.payload_len() > u64::from(max_reply_bytes) {
            return format!(
                "protocol violation: a reply of {} bytes (limit {max_reply_bytes})",
                header.payload_len()
            );
        }
        let mut body = vec![0; header.body_length as usize];
        if let Err(e) = read.read_exact(&mut body).await {
            return format!("read failed inside a reply: {e}");
        }
        if header.attach_length > 0 {
            // No existence call has an attachment; read past it to stay in step.
            let mut attachment = vec![0; header.attach_length as usize];
            if let Err(e) = read.read_exact(&mut attachment).await {
                return format!("read failed inside a reply: {e}");
            }
        }
        let waiter = {
            let mut pending = lock(&conn.pending);
            let waiter = pending.waiters.remove(&header.seq_num);
            if waiter.is_some() {
                // An answer in time: the timeouts on this connection are not in a
                // row (rule 17).
                pending.streak.answered();
            }
            waiter
        };
        let delivered = waiter.is_some_and(|w| w.send(Ok(RawReply { header, body })).is_ok());
        bump(
            if delivered {
                &counters.replies
            } else {
                &counters.late_replies
            },
            1,
        );
    }
}

async fn write_loop(weak: Weak<Inner>, conn: Arc<Conn>, mut write: OwnedWriteHalf) {
    let reason = tokio::select! {
        () = conn.shutdown.cancelled() => return,
        reason = write_frames(&conn, &mut write) => reason,
    };
    fail(&weak, &conn, reason);
}

/// Writes queued frames, coalescing those already waiting into one write.
async fn write_frames(conn: &Conn, write: &mut OwnedWriteHalf) -> String {
    const COALESCE_BYTES: usize = 256 << 10;
    loop {
        let Some(frames) = conn.take_frames(COALESCE_BYTES) else {
            conn.wake_writer.notified().await;
            continue;
        };
        if let Err(e) = write.write_all(&frames).await {
            return format!("write failed: {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer stuck on its socket never takes frames; calls keep ending (timed out)
    /// while one call stays queued. The order of calls must not grow per call.
    #[test]
    fn a_stuck_writer_keeps_the_call_order_bounded() {
        let mut pending = Pending::default();
        let (tx, _rx) = oneshot::channel();
        pending.enqueue(0, vec![0; 8], tx);
        for seq in 1..10_000u32 {
            let (tx, _rx) = oneshot::channel();
            pending.enqueue(seq, vec![0; 8], tx);
            pending.end(seq);
        }
        assert_eq!(pending.outbox.len(), 1);
        assert_eq!(pending.queued_bytes, 8);
        assert!(
            pending.order.len() <= 2 + ORDER_SLACK,
            "{} sequence numbers kept for 1 queued frame",
            pending.order.len()
        );
        assert_eq!(pending.tickets, 10_000);
        assert_eq!(pending.take_frames(1 << 20), Some(vec![0; 8]));
        assert!(pending.order.is_empty());
    }
}
