//! The ZeroMQ transport: a DEALER socket to a lookup server (`spec/wire.md`,
//! "Transport"). Each RPC goes out as `[rpc_id u64 BE, "", frames...]`, so that an
//! unmodified REP peer echoes the id and replies are matched by it (a REP socket sends
//! back every frame before the empty delimiter; tmq's own REQ cannot outlive a timed-out
//! `recv`, a DEALER can). The socket's monitor and liveness checks ([`super::peer`])
//! tell when the server is gone, so that lookups fail at once rather than at their
//! timeouts.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use lookup_core::timer::Backoff;
use lookup_core::wire::{self, Format, WireError};
use lookup_core::{Outgoing, Reply, RpcBody, RpcId};
use tracing::Span;

use super::peer::{EndpointUnreachable, LIVENESS_BOUND, Monitor, PeerEvent, check_alive};
use super::{SendError, Wire, WireInput};
use crate::Endpoint;
use crate::warn::WarnLimiter;

/// A check of the endpoint under way: `Err` names what is missing.
type Check = Pin<Box<dyn Future<Output = Result<(), EndpointUnreachable>> + Send>>;

/// [`check_alive`] of `endpoint` with the client's bound, after `delay`.
fn alive_after(endpoint: Endpoint, delay: Duration) -> Check {
    Box::pin(async move {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        check_alive(&endpoint, LIVENESS_BOUND).await
    })
}

/// Bytes of the RPC-id envelope frame: the core's `RpcId`, u64 big-endian.
const RPC_ID_BYTES: usize = 8;

/// Largest reply frame the client accepts (bytes): a lookup reply is 4 + 8k bytes,
/// so 64 KiB leaves room for 8,191 tail-key boundaries. ZeroMQ hangs up on a peer
/// that announces more, before reserving any memory for it.
pub(crate) const MAX_REPLY_BYTES: i64 = 64 * 1024;

/// First wait before ZeroMQ connects again after a connect failed or the server
/// closed the connection (`ZMQ_RECONNECT_IVL`, ms); it doubles up to
/// [`RECONNECT_MAX_MS`]. libzmq's default is 100 ms, constant.
const RECONNECT_MS: i32 = 10;
/// Longest wait between ZeroMQ's connect attempts (`ZMQ_RECONNECT_IVL_MAX`, ms): a
/// restarted server is connected to at most this long after it binds.
pub(crate) const RECONNECT_MAX_MS: i32 = 100;

/// Opens a DEALER socket connected to `url`, with linger 0 so that dropping it with
/// unanswered requests never blocks (ZeroMQ's default linger, -1, hangs the process
/// there; CONTRIBUTING.md rule 10),
/// [`MAX_REPLY_BYTES`] so that a hostile peer's length claim is never allocated, a
/// reconnect every 10 ms doubling to [`RECONNECT_MAX_MS`], and its [`Monitor`]
/// started before the connect so that no connection event is missed.
pub(crate) fn open_dealer(
    context: &tmq::Context,
    url: &str,
) -> tmq::Result<(tmq::dealer::Dealer, Monitor)> {
    let socket = context.socket(zmq::DEALER)?;
    socket.set_linger(0)?;
    socket.set_maxmsgsize(MAX_REPLY_BYTES)?;
    socket.set_reconnect_ivl(RECONNECT_MS)?;
    socket.set_reconnect_ivl_max(RECONNECT_MAX_MS)?;
    let monitor = Monitor::start(context, &socket)?;
    socket.connect(url)?;
    let dealer = <tmq::dealer::Dealer as tmq::FromZmqSocket<_>>::from_zmq_socket(socket)?;
    Ok((dealer, monitor))
}

/// The DEALER socket, its monitor, and what encoding needs.
///
/// The server is *down* from the moment the monitor reports the connection closed,
/// or a check finds nothing alive at the endpoint (at each open, after a lookup timed
/// out, after a failed connect), until the monitor reports a handshake or a check
/// finds it alive again. While down, writes fail fast ([`SendError::NotConnected`]):
/// nothing waits for a timeout on a server that is known to be gone. While nothing
/// listens, each write first checks again with a connect (which fails at once), so
/// that the first lookup after a server binds goes out.
pub(crate) struct ZmqWire {
    url: String,
    format: Format,
    block_size: u32,
    /// Bound on one write: a DEALER queues the message in its pipe even when no peer
    /// is connected, so a write completes at once unless the high-water mark is hit.
    send_timeout: Duration,
    context: tmq::Context,
    socket: Option<Connection>,
    endpoint: Endpoint,
    /// The check under way, if any: one at each open, one after a lookup timed out,
    /// and again after a wait (100 ms doubling to 1 s) while the server is down.
    check: Option<Check>,
    down: Down,
    recheck: Backoff,
}

/// Whether the server is down, and how a write can tell that it is back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Down {
    /// Up, or not known to be down.
    No,
    /// Nothing listens (no socket file, a stale one, a refused port; a killed
    /// server): a connect fails at once, so each write checks again first, and the
    /// lookups go out the moment a server binds.
    NothingListens,
    /// Stopped, hung, partitioned or not ZeroMQ: a connect alone cannot tell; the
    /// liveness checks (and the monitor's handshake) bring it back.
    Silent,
}

impl Down {
    fn of(why: &EndpointUnreachable) -> Self {
        match why {
            EndpointUnreachable::NoSocketFile(_)
            | EndpointUnreachable::NothingListens(_)
            | EndpointUnreachable::Refused(_)
            | EndpointUnreachable::Closed(_) => Self::NothingListens,
            _ => Self::Silent,
        }
    }
}

impl ZmqWire {
    /// A wire owning `socket` and its monitor (opened by the caller with
    /// [`open_dealer`], so that a bad endpoint is an error of `connect`).
    pub(crate) fn new(
        endpoint: Endpoint,
        format: Format,
        block_size: u32,
        send_timeout: Duration,
        context: tmq::Context,
        socket: (tmq::dealer::Dealer, Monitor),
    ) -> Self {
        Self {
            url: endpoint.url(),
            format,
            block_size,
            send_timeout,
            context,
            socket: Some(Connection::from(socket)),
            check: Some(alive_after(endpoint.clone(), Duration::ZERO)),
            endpoint,
            down: Down::No,
            recheck: Backoff::new(Duration::from_millis(100), Duration::from_secs(1)),
        }
    }

    /// The server is down for `why`: reported once (the first of an outage), and
    /// checked again after the recheck backoff.
    fn went_down(&mut self, why: EndpointUnreachable) -> Option<WireInput<Vec<Bytes>>> {
        let delay = self.recheck.next_delay();
        self.check = Some(alive_after(self.endpoint.clone(), delay));
        let first = self.down == Down::No;
        if first || Down::of(&why) == Down::Silent {
            self.down = Down::of(&why);
        }
        first.then_some(WireInput::Unreachable(why))
    }

    /// The server is there and alive: reported when it was down.
    fn came_up(&mut self) -> Option<WireInput<Vec<Bytes>>> {
        self.check = None;
        self.recheck.reset();
        let was_down = std::mem::replace(&mut self.down, Down::No) != Down::No;
        was_down.then_some(WireInput::Reachable)
    }

    /// A check ended: what to report, and the next check while the server is down.
    fn checked(
        &mut self,
        result: Result<(), EndpointUnreachable>,
    ) -> Option<WireInput<Vec<Bytes>>> {
        match result {
            Ok(()) => self.came_up(),
            Err(why) => self.went_down(why),
        }
    }

    /// A monitor event: what to report.
    fn on_event(&mut self, event: PeerEvent) -> Option<WireInput<Vec<Bytes>>> {
        match event {
            PeerEvent::Up => self.came_up().or(Some(WireInput::Connected)),
            PeerEvent::Disconnected => {
                self.went_down(EndpointUnreachable::Closed(self.url.clone()))
            }
            PeerEvent::HandshakeFailed => {
                self.went_down(EndpointUnreachable::NotZeroMq(self.url.clone()))
            }
            PeerEvent::Retrying => {
                // A connect failed: name the reason with a check now, unless one is
                // under way or the outage is known.
                if self.down == Down::No && self.check.is_none() {
                    self.check = Some(alive_after(self.endpoint.clone(), Duration::ZERO));
                }
                None
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
        match self.down {
            Down::No => {}
            // Known stopped: fail fast; a liveness check or the monitor brings it back.
            Down::Silent => return Err(SendError::NotConnected),
            Down::NothingListens => {
                // A connect to a missing file or a refused port fails at once: check
                // again now, so that lookups fail fast while nothing listens and go
                // out the moment a server binds (ZeroMQ delivers them once it
                // reconnects, within its reconnect interval). The greeting too: a
                // listener of a process being killed still accepts for a moment.
                if check_alive(&self.endpoint, LIVENESS_BOUND).await.is_err() {
                    return Err(SendError::NotConnected);
                }
                self.down = Down::No;
                self.check = None;
                self.recheck.reset();
                tracing::info!(endpoint = %self.endpoint, "lookup server is back; lookups go out again");
            }
        }
        let Some(Connection { dealer: socket, .. }) = self.socket.as_mut() else {
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

    fn lookups_timed_out(&mut self) {
        // A timeout alone cannot tell a slow server from a stopped one: ask whether
        // it is alive (rule 17), so that a stopped server costs one timeout.
        if self.down == Down::No && self.check.is_none() {
            self.check = Some(alive_after(self.endpoint.clone(), Duration::ZERO));
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
            let (socket, monitor) = match self.socket.as_mut() {
                Some(Connection { dealer, monitor }) => (Some(dealer), Some(monitor)),
                None => (None, None),
            };
            let socket = async {
                match socket {
                    Some(socket) => socket.next().await,
                    None => std::future::pending().await,
                }
            };
            let event = async {
                match monitor {
                    Some(monitor) => monitor.next().await,
                    None => std::future::pending().await,
                }
            };
            // All are cancel-safe: the check stays stored until it completes, and a
            // DEALER (a PAIR) reads a whole multipart in one poll. Replies first: one
            // that arrived before the connection closed is still applied.
            let input = tokio::select! {
                biased;
                message = socket => return parse(message),
                event = event => self.on_event(event),
                result = check => self.checked(result),
            };
            if let Some(input) = input {
                return input;
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
            // `spec/wire.md`, "Store unavailable": the server is up, its store is
            // not; counted as a failure by the lifecycle, logged by the server.
            Err(WireError::StoreUnavailable) => {
                warn.warn(
                    "store_unavailable",
                    now,
                    format_args!("{} could not ask its store (error reply)", self.url),
                );
                Reply::StoreUnavailable
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
        // The connection it replaces (if any) is closed first, its monitor silenced.
        drop(self.socket.take());
        self.socket = Some(Connection::from(socket));
        if self.check.is_none() {
            self.check = Some(alive_after(self.endpoint.clone(), Duration::ZERO));
        }
        Ok(())
    }
}

/// A DEALER socket and the reading end of its monitor. Dropping it silences the
/// monitor before the socket closes: libzmq sends monitor events with a blocking send
/// from its I/O thread (`socket_base_t::monitor_event`), so events of a closing socket
/// (`DISCONNECTED`, `CLOSED`) sent to a monitor whose reader is gone would block that
/// thread for good, and with it every other socket of the context: a reopened
/// socket would then never connect.
struct Connection {
    dealer: tmq::dealer::Dealer,
    monitor: Monitor,
}

impl From<(tmq::dealer::Dealer, Monitor)> for Connection {
    fn from((dealer, monitor): (tmq::dealer::Dealer, Monitor)) -> Self {
        Self { dealer, monitor }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        use tmq::AsZmqSocket;
        self.monitor.silence(self.dealer.get_socket());
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
