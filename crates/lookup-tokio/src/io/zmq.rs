//! The ZeroMQ transport: a DEALER socket to a lookup server (`spec/wire.md`,
//! "Transport"). Each RPC goes out as `[rpc_id u64 BE, "", frames...]`, so that an
//! unmodified REP peer echoes the id and replies are matched by it (NOTES.md).

use std::future::Future;
use std::io::ErrorKind;
use std::pin::Pin;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use lookup_core::timer::Backoff;
use lookup_core::wire::{self, Format};
use lookup_core::{Outgoing, Reply, RpcBody, RpcId};
use tracing::Span;

use super::{SendError, Wire, WireInput};
use crate::Endpoint;
use crate::warn::WarnLimiter;

/// A reachability check of the endpoint: `Err` names what is missing.
type Check = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// Whether something listens at `endpoint`, in the time a connect takes (a missing
/// ipc socket file or a refused tcp port answers at once). ZeroMQ itself never says:
/// it queues messages for a peer that may come, so without this check a typo in the
/// path reads as a silent server and costs `lookup_timeout_s` per lookup. A check
/// that cannot tell in 1 s counts as reachable.
async fn reachable(endpoint: Endpoint) -> Result<(), String> {
    match &endpoint {
        Endpoint::Ipc(path) => match tokio::net::UnixStream::connect(path).await {
            Ok(_) => Ok(()),
            Err(e) if e.kind() == ErrorKind::NotFound => {
                Err(format!("no socket file at {}", path.display()))
            }
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => {
                Err(format!("nothing listens on {}", path.display()))
            }
            Err(e) => Err(format!("{}: {e}", path.display())),
        },
        Endpoint::Tcp(addr) => {
            let connect = tokio::net::TcpStream::connect(addr.as_str());
            match tokio::time::timeout(Duration::from_secs(1), connect).await {
                Ok(Ok(_)) | Err(_) => Ok(()),
                Ok(Err(e)) if e.kind() == ErrorKind::ConnectionRefused => {
                    Err(format!("connection refused at tcp port {addr}"))
                }
                Ok(Err(e)) => Err(format!("tcp {addr}: {e}")),
            }
        }
    }
}

/// Bytes of the RPC-id envelope frame: the core's `RpcId`, u64 big-endian.
const RPC_ID_BYTES: usize = 8;

/// Largest reply frame the client accepts (bytes): a lookup reply is 4 + 8k bytes,
/// so 64 KiB leaves room for 8,191 tail-key boundaries. ZeroMQ hangs up on a peer
/// that announces more, before reserving any memory for it.
pub(crate) const MAX_REPLY_BYTES: i64 = 64 * 1024;

/// Opens a DEALER socket connected to `url`, with linger 0 so that dropping it with
/// unanswered requests never blocks (NOTES.md, STYLE.md rule 10), and
/// [`MAX_REPLY_BYTES`] so that a hostile peer's length claim is never allocated.
pub(crate) fn open_dealer(context: &tmq::Context, url: &str) -> tmq::Result<tmq::dealer::Dealer> {
    tmq::dealer(context)
        .set_linger(0)
        .set_maxmsgsize(MAX_REPLY_BYTES)
        .connect(url)
}

/// The DEALER socket and what encoding needs.
pub(crate) struct ZmqWire {
    url: String,
    format: Format,
    block_size: u32,
    /// Bound on one write: a DEALER queues the message in its pipe even when no peer
    /// is connected, so a write completes at once unless the high-water mark is hit.
    send_timeout: Duration,
    context: tmq::Context,
    socket: Option<tmq::dealer::Dealer>,
    endpoint: Endpoint,
    /// The reachability check under way, if any: one at each open, and again after
    /// a wait (100 ms doubling to 1 s) while nothing listens.
    check: Option<Check>,
    unreachable: bool,
    recheck: Backoff,
}

impl ZmqWire {
    /// A wire owning `socket` (opened by the caller with [`open_dealer`], so that a bad
    /// endpoint is an error of `connect`).
    pub(crate) fn new(
        endpoint: Endpoint,
        format: Format,
        block_size: u32,
        send_timeout: Duration,
        context: tmq::Context,
        socket: tmq::dealer::Dealer,
    ) -> Self {
        Self {
            url: endpoint.url(),
            format,
            block_size,
            send_timeout,
            context,
            socket: Some(socket),
            check: Some(Box::pin(reachable(endpoint.clone()))),
            endpoint,
            unreachable: false,
            recheck: Backoff::new(Duration::from_millis(100), Duration::from_secs(1)),
        }
    }

    /// A check ended: what to report, and the next check while nothing listens.
    fn checked(&mut self, result: Result<(), String>) -> Option<WireInput<Vec<Bytes>>> {
        match result {
            Ok(()) => {
                self.check = None;
                self.recheck.reset();
                std::mem::take(&mut self.unreachable).then_some(WireInput::Reachable)
            }
            Err(why) => {
                let delay = self.recheck.next_delay();
                let endpoint = self.endpoint.clone();
                self.check = Some(Box::pin(async move {
                    tokio::time::sleep(delay).await;
                    reachable(endpoint).await
                }));
                let first = !std::mem::replace(&mut self.unreachable, true);
                first.then_some(WireInput::Unreachable(why))
            }
        }
    }
}

impl Wire for ZmqWire {
    type Payload = Vec<Bytes>;

    fn name(&self) -> &str {
        &self.url
    }

    fn connecting(&self) -> bool {
        false
    }

    fn reopens_for_reset(&self) -> bool {
        true
    }

    async fn send(&mut self, out: Outgoing, _span: &Span) -> Result<(), SendError> {
        let frames = match &out.body {
            RpcBody::Lookup {
                num_tokens,
                block_hashes,
            } => wire::encode_lookup(self.format, *num_tokens, self.block_size, block_hashes),
            RpcBody::Reset => wire::encode_reset(self.format)
                .map_err(|error| SendError::NotSent(format!("reset: {error}")))?,
        };
        if self.unreachable {
            // Check again now (a connect to a missing file or a refused port fails
            // at once), so that lookups fail fast while nothing listens and go out
            // again the moment a server binds.
            if reachable(self.endpoint.clone()).await.is_err() {
                return Err(SendError::NotConnected);
            }
            self.unreachable = false;
            self.check = None;
            self.recheck.reset();
            tracing::info!(endpoint = %self.endpoint, "lookup endpoint reachable again");
        }
        let Some(socket) = self.socket.as_mut() else {
            return Err(SendError::NotConnected);
        };
        let mut message: Vec<tmq::Message> = Vec::with_capacity(frames.len() + 2);
        message.push(tmq::Message::from(&out.rpc_id.0.to_be_bytes()[..]));
        message.push(tmq::Message::new());
        message.extend(frames.iter().map(|f| tmq::Message::from(&f[..])));
        match tokio::time::timeout(self.send_timeout, socket.send(message)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(SendError::Failed(error.to_string())),
            Err(_elapsed) => Err(SendError::Failed(format!(
                "blocked for {:?}",
                self.send_timeout
            ))),
        }
    }

    async fn next(&mut self) -> WireInput<Vec<Bytes>> {
        loop {
            let check = async {
                match self.check.as_mut() {
                    Some(check) => check.await,
                    None => std::future::pending().await,
                }
            };
            let socket = async {
                match self.socket.as_mut() {
                    Some(socket) => socket.next().await,
                    None => std::future::pending().await,
                }
            };
            // Both are cancel-safe: the check stays stored until it completes, and a
            // DEALER reads a whole multipart in one poll.
            tokio::select! {
                biased;
                message = socket => return parse(message),
                result = check => {
                    if let Some(input) = self.checked(result) {
                        return input;
                    }
                }
            }
        }
    }

    fn decode(
        &mut self,
        frames: Vec<Bytes>,
        is_reset: bool,
        span: &Span,
        warn: &mut WarnLimiter,
        now: Instant,
    ) -> Reply {
        if is_reset {
            return match wire::decode_reset_reply(&frames) {
                Ok(ok) => Reply::Reset { ok },
                Err(error) => {
                    warn.warn(
                        "malformed",
                        now,
                        format_args!("malformed reset reply from {}: {error}", self.url),
                    );
                    Reply::Malformed
                }
            };
        }
        match wire::decode_lookup_reply(self.format, &frames) {
            Ok(decoded) => {
                span.record("hit_tokens", decoded.hit_tokens);
                Reply::Lookup {
                    hit_tokens: decoded.hit_tokens,
                }
            }
            Err(error) => {
                warn.warn(
                    "malformed",
                    now,
                    format_args!("malformed lookup reply from {}: {error}", self.url),
                );
                Reply::Malformed
            }
        }
    }

    fn close(&mut self) {
        // Linger 0: dropping the socket discards unsent and unanswered messages at once.
        drop(self.socket.take());
    }

    fn open(&mut self) -> Result<(), String> {
        let socket = open_dealer(&self.context, &self.url).map_err(|e| e.to_string())?;
        self.socket = Some(socket);
        if self.check.is_none() {
            self.check = Some(Box::pin(reachable(self.endpoint.clone())));
        }
        Ok(())
    }
}

/// One message from the socket: `[rpc_id, "", frames...]`.
fn parse(message: Option<tmq::Result<tmq::Multipart>>) -> WireInput<Vec<Bytes>> {
    let message = match message {
        Some(Ok(message)) => message,
        Some(Err(error)) => return WireInput::Broken(format!("receive failed: {error}")),
        None => return WireInput::Broken("the socket's stream ended".into()),
    };
    let mut parts = message.into_iter();
    let (Some(id), Some(delimiter)) = (parts.next(), parts.next()) else {
        return WireInput::BadEnvelope;
    };
    let (Ok(id), true) = (
        <[u8; RPC_ID_BYTES]>::try_from(&id[..]),
        delimiter.is_empty(),
    ) else {
        return WireInput::BadEnvelope;
    };
    WireInput::Reply {
        rpc_id: RpcId(u64::from_be_bytes(id)),
        payload: parts.map(|m| Bytes::copy_from_slice(&m)).collect(),
    }
}
