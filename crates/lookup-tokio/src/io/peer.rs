//! Whether the lookup server behind a ZeroMQ endpoint is there and alive: the checks
//! the client runs ([`check_reachable`], [`check_alive`]), the reasons they give
//! ([`EndpointUnreachable`]), and the connection events of the DEALER socket's
//! monitor ([`Monitor`]: libzmq publishes them on an inproc PAIR socket; a SIGKILLed
//! peer shows up as DISCONNECTED about 1.4 ms after the kill). ZeroMQ itself
//! never fails a message queued for a peer that is gone: these are the only signals
//! (`spec/wire.md`, "Transport"; RELIABILITY.md, "Dead and hung servers").

use std::io::ErrorKind;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use std::os::fd::{AsRawFd, RawFd};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncReadExt, Interest};

use crate::Endpoint;

/// Bound of [`check_alive`] (connect plus the server's first greeting byte) as the
/// client runs it: after a lookup timed out, and while the server is down. 500 ms:
/// a live libzmq answers a connect at once from its I/O thread, whatever its
/// application thread does, so only a stopped, hung or unreachable process misses it.
pub const LIVENESS_BOUND: Duration = Duration::from_millis(500);

/// Why nothing (alive) answers at an endpoint, as [`check_reachable`],
/// [`check_alive`] and the socket monitor find it. Each reads as a dead or stopped
/// server, never as a slow one.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointUnreachable {
    /// `ipc://PATH`: no file at the path (a typo, or the server has not bound yet).
    #[error("no socket file at {}", .0.display())]
    NoSocketFile(PathBuf),
    /// `ipc://PATH`: the file is there but nothing accepts on it (a stale socket left
    /// by a server that died).
    #[error("nothing listens on {} (a stale socket file: the server is dead)", .0.display())]
    NothingListens(PathBuf),
    /// `tcp://HOST:PORT`: the connection was refused (nothing listens on the port).
    #[error("connection refused at tcp port {0} (nothing listens: the server is dead)")]
    Refused(String),
    /// The server closed the connection the client had (its process ended or it
    /// closed its socket), as the socket monitor reports it.
    #[error("the server at {0} closed the connection (its process ended or closed its socket)")]
    Closed(String),
    /// The connection was accepted but no ZeroMQ greeting came within `bound`: the
    /// server process is stopped (SIGSTOP) or hung.
    #[error(
        "the server at {endpoint} accepted a connection but sent no ZeroMQ greeting within \
         {bound:?} (the process is stopped or hung)"
    )]
    Silent {
        /// The ipc path or the tcp `host:port`.
        endpoint: String,
        /// How long the check waited.
        bound: Duration,
    },
    /// A tcp connect got no answer within `bound` (the host is down or partitioned
    /// away).
    #[error(
        "tcp connect to {endpoint} unanswered within {bound:?} (the host is down or \
         partitioned away)"
    )]
    NoAnswer {
        /// The tcp `host:port` (or ipc path).
        endpoint: String,
        /// How long the check waited.
        bound: Duration,
    },
    /// Something answered that is not a ZeroMQ server (its first byte is not a ZMTP
    /// greeting, or the ZeroMQ handshake failed).
    #[error("{0} does not answer as a ZeroMQ server")]
    NotZeroMq(String),
    /// Another error of the connect, with the endpoint's path or address.
    #[error("{endpoint}: {error}")]
    Other {
        /// The ipc path or the tcp `host:port`.
        endpoint: String,
        /// The operating system's error.
        error: String,
    },
}

impl EndpointUnreachable {
    /// The warning kind of this cause (a `kind` field of the WARN and the `kind`
    /// label of `lookup_client_warnings_total`).
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::NoSocketFile(_) | Self::NothingListens(_) | Self::Refused(_) => {
                "peer_unreachable"
            }
            Self::Closed(_) => "peer_closed",
            Self::Silent { .. } => "peer_hung",
            Self::NoAnswer { .. } => "peer_no_answer",
            Self::NotZeroMq(_) => "peer_not_zeromq",
            Self::Other { .. } => "peer_error",
        }
    }
}

/// Whether something listens at `endpoint`, in the time a connect takes (a missing
/// ipc socket file or a refused tcp port answers at once; `spec/wire.md`,
/// "Transport"). ZeroMQ itself never says: it queues messages for a peer that may
/// come, so without this check a typo in the path reads as a silent server and costs
/// `lookup_timeout_s` per lookup. A tcp connect that cannot tell within 1 s counts as
/// reachable. The probe connection is closed at once; a REP or ROUTER server ignores
/// it. [`check_alive`] also tells a stopped server.
///
/// # Errors
/// [`EndpointUnreachable`], naming the path or the port.
pub async fn check_reachable(endpoint: &Endpoint) -> Result<(), EndpointUnreachable> {
    match endpoint {
        Endpoint::Ipc(path) => tokio::net::UnixStream::connect(path)
            .await
            .map(drop)
            .map_err(|e| ipc_error(path, &e)),
        Endpoint::Tcp(addr) => {
            let connect = tokio::net::TcpStream::connect(addr.as_str());
            match tokio::time::timeout(Duration::from_secs(1), connect).await {
                Ok(Ok(_)) | Err(_) => Ok(()),
                Ok(Err(e)) => Err(tcp_error(addr, &e)),
            }
        }
    }
}

/// Whether a live ZeroMQ server answers at `endpoint` within `bound`: a connect, then
/// the first byte of the ZMTP greeting (`0xFF`), which libzmq sends from its I/O
/// thread as soon as it accepts, before reading anything. A stopped (SIGSTOP) or hung
/// process, whose kernel still accepts into the listen backlog, sends nothing; a
/// partitioned host does not even answer the connect. The check's connection is
/// closed at once (the server counts a failed handshake, nothing else).
///
/// # Errors
/// [`EndpointUnreachable`]: the reasons of [`check_reachable`], and
/// [`Silent`](EndpointUnreachable::Silent), [`NoAnswer`](EndpointUnreachable::NoAnswer),
/// [`NotZeroMq`](EndpointUnreachable::NotZeroMq).
pub async fn check_alive(endpoint: &Endpoint, bound: Duration) -> Result<(), EndpointUnreachable> {
    let deadline = tokio::time::Instant::now() + bound;
    let no_answer = || EndpointUnreachable::NoAnswer {
        endpoint: endpoint.to_string(),
        bound,
    };
    match endpoint {
        Endpoint::Ipc(path) => {
            let stream = tokio::time::timeout_at(deadline, tokio::net::UnixStream::connect(path))
                .await
                .map_err(|_| no_answer())?
                .map_err(|e| ipc_error(path, &e))?;
            greeting(stream, deadline, endpoint, bound).await
        }
        Endpoint::Tcp(addr) => {
            let connect = tokio::net::TcpStream::connect(addr.as_str());
            let stream = tokio::time::timeout_at(deadline, connect)
                .await
                .map_err(|_| no_answer())?
                .map_err(|e| tcp_error(addr, &e))?;
            greeting(stream, deadline, endpoint, bound).await
        }
    }
}

/// Reads the first greeting byte by `deadline`.
async fn greeting<S: AsyncRead + Unpin>(
    mut stream: S,
    deadline: tokio::time::Instant,
    endpoint: &Endpoint,
    bound: Duration,
) -> Result<(), EndpointUnreachable> {
    let mut first = [0_u8; 1];
    match tokio::time::timeout_at(deadline, stream.read(&mut first)).await {
        Ok(Ok(1)) if first[0] == 0xFF => Ok(()),
        Ok(Ok(0)) => Err(EndpointUnreachable::Closed(endpoint.to_string())),
        Ok(Ok(_)) => Err(EndpointUnreachable::NotZeroMq(endpoint.to_string())),
        Ok(Err(e)) if e.kind() == ErrorKind::ConnectionReset => {
            Err(EndpointUnreachable::Closed(endpoint.to_string()))
        }
        Ok(Err(e)) => Err(EndpointUnreachable::Other {
            endpoint: endpoint.to_string(),
            error: e.to_string(),
        }),
        Err(_) => Err(EndpointUnreachable::Silent {
            endpoint: endpoint.to_string(),
            bound,
        }),
    }
}

fn ipc_error(path: &std::path::Path, e: &std::io::Error) -> EndpointUnreachable {
    match e.kind() {
        ErrorKind::NotFound => EndpointUnreachable::NoSocketFile(path.to_owned()),
        ErrorKind::ConnectionRefused => EndpointUnreachable::NothingListens(path.to_owned()),
        _ => EndpointUnreachable::Other {
            endpoint: path.display().to_string(),
            error: e.to_string(),
        },
    }
}

fn tcp_error(addr: &str, e: &std::io::Error) -> EndpointUnreachable {
    if e.kind() == ErrorKind::ConnectionRefused {
        EndpointUnreachable::Refused(addr.to_owned())
    } else {
        EndpointUnreachable::Other {
            endpoint: format!("tcp {addr}"),
            error: e.to_string(),
        }
    }
}

/// A connection event of the DEALER socket, as its monitor reports it (libzmq's
/// `ZMQ_EVENT_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PeerEvent {
    /// The ZeroMQ handshake with the server completed: it is there and alive.
    Up,
    /// The server closed the connection (`DISCONNECTED`).
    Disconnected,
    /// A connect attempt failed and is retried (`CONNECT_RETRIED`, `CLOSED`).
    Retrying,
    /// The handshake failed on the protocol or on authentication: what answered is
    /// not a (compatible) ZeroMQ server. A handshake cut short by the peer closing
    /// (libzmq's `HANDSHAKE_FAILED_NO_DETAIL`: a server that is stopping accepted the
    /// reconnect from its listen backlog) is [`Disconnected`](Self::Disconnected).
    HandshakeFailed,
}

impl PeerEvent {
    /// The event this client acts on for libzmq's event number `id`, if any.
    fn of(id: u16) -> Option<Self> {
        match id {
            EVENT_HANDSHAKE_SUCCEEDED => Some(Self::Up),
            EVENT_DISCONNECTED | EVENT_HANDSHAKE_FAILED_NO_DETAIL => Some(Self::Disconnected),
            EVENT_CONNECT_RETRIED | EVENT_CLOSED => Some(Self::Retrying),
            EVENT_HANDSHAKE_FAILED_PROTOCOL | EVENT_HANDSHAKE_FAILED_AUTH => {
                Some(Self::HandshakeFailed)
            }
            _ => None,
        }
    }
}

/// libzmq's event numbers (`zmq.h`, stable since 4.3).
const EVENT_CLOSED: u16 = 0x0080;
const EVENT_CONNECT_RETRIED: u16 = 0x0004;
const EVENT_DISCONNECTED: u16 = 0x0200;
const EVENT_HANDSHAKE_FAILED_NO_DETAIL: u16 = 0x0800;
const EVENT_HANDSHAKE_SUCCEEDED: u16 = 0x1000;
const EVENT_HANDSHAKE_FAILED_PROTOCOL: u16 = 0x2000;
const EVENT_HANDSHAKE_FAILED_AUTH: u16 = 0x4000;
const EVENTS: u16 = EVENT_CLOSED
    | EVENT_CONNECT_RETRIED
    | EVENT_DISCONNECTED
    | EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | EVENT_HANDSHAKE_SUCCEEDED
    | EVENT_HANDSHAKE_FAILED_PROTOCOL
    | EVENT_HANDSHAKE_FAILED_AUTH;

/// Monitors of this process get distinct inproc names.
static MONITORS: AtomicU64 = AtomicU64::new(0);

/// The reading end of a socket's monitor: a PAIR on the socket's context, connected
/// to the monitor's inproc address before the socket connects, so no event is lost.
///
/// Read through its `ZMQ_FD` registered with tokio, not through tmq: a libzmq socket
/// is asked for its events (`ZMQ_EVENTS`, one `poll(2)` of its mailbox) only when that
/// descriptor has signalled, so the I/O task's turns cost no system call for a
/// monitor that has nothing to say, which is almost always.
pub(crate) struct Monitor {
    pair: AsyncFd<PairFd>,
}

/// The monitor's PAIR socket as a descriptor tokio watches (its `ZMQ_FD`, readable
/// when libzmq has commands for the socket, such as a message arriving).
struct PairFd {
    socket: zmq::Socket,
    fd: RawFd,
}

impl AsRawFd for PairFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

/// What one read of the monitor found.
enum Read {
    /// An event this client acts on.
    Event(PeerEvent),
    /// An event it does not act on, or a message that is not an event.
    Skipped,
    /// Nothing queued.
    Empty,
    /// The monitor's socket failed: it never reports again.
    Ended,
}

impl Monitor {
    /// Starts monitoring `socket` (not connected yet) for the events [`PeerEvent`]
    /// names. Needs a tokio runtime with I/O enabled (the descriptor is registered
    /// with it).
    pub(crate) fn start(context: &tmq::Context, socket: &zmq::Socket) -> tmq::Result<Self> {
        let n = MONITORS.fetch_add(1, Ordering::Relaxed);
        let address = format!("inproc://lookup-tokio-monitor-{}-{n}", std::process::id());
        socket.monitor(&address, i32::from(EVENTS))?;
        let pair = context.socket(zmq::PAIR)?;
        pair.set_linger(0)?;
        pair.connect(&address)?;
        // Ask for the socket's events once, with nothing queued yet (the socket
        // connects after this returns): libzmq signals `ZMQ_FD` for a message only
        // once its reader has found the pipe empty, which tmq's reads did on each poll.
        pair.get_events()?;
        let fd = pair.get_fd()?;
        // tokio 1.54 deprecates the safe constructors for lack of I/O safety, in favour
        // of an `unsafe` one, and this workspace forbids `unsafe`. The contract holds:
        // the descriptor is libzmq's for `socket`, which `PairFd` owns, so it stays open
        // and the same until the AsyncFd (deregistered first on drop) lets it go. tmq
        // registers its sockets the same way.
        #[allow(deprecated)]
        let pair = AsyncFd::with_interest(PairFd { socket: pair, fd }, Interest::READABLE)?;
        Ok(Self { pair })
    }

    /// Stops monitoring `socket` (the socket this monitor was started on) before it
    /// closes: its monitor is replaced by one that reports no event (libzmq stops the
    /// old one without a last event), so that nothing is ever sent, blocking, to a
    /// reader that is gone. Call it while this reader is still alive.
    pub(crate) fn silence(&self, socket: &zmq::Socket) {
        let n = MONITORS.fetch_add(1, Ordering::Relaxed);
        let address = format!("inproc://lookup-tokio-silenced-{}-{n}", std::process::id());
        if let Err(error) = socket.monitor(&address, 0) {
            tracing::debug!(%error, "could not silence the socket monitor");
        }
    }

    /// The next event this client acts on; other events are skipped. Cancel-safe (an
    /// event's two frames are read in one poll). Pending forever once the monitor
    /// ended.
    pub(crate) async fn next(&mut self) -> PeerEvent {
        loop {
            let Ok(mut ready) = self.pair.readable_mut().await else {
                return std::future::pending().await;
            };
            loop {
                match read(&ready.get_inner().socket) {
                    Read::Event(event) => return event,
                    Read::Skipped => continue,
                    Read::Empty => {}
                    Read::Ended => return std::future::pending().await,
                }
                ready.clear_ready();
                // `ZMQ_FD` signals when libzmq's mailbox goes from empty to not, and
                // the reads above may have taken a signal meant for a message that
                // came meanwhile: ask once before waiting again (zmq_getsockopt(3),
                // ZMQ_FD).
                match ready.get_inner().socket.get_events() {
                    Ok(events) if events.contains(zmq::POLLIN) => {}
                    Ok(_) => break,
                    Err(_) => return std::future::pending().await,
                }
            }
        }
    }
}

/// Reads one message from the monitor's socket without waiting.
fn read(socket: &zmq::Socket) -> Read {
    let message = match socket.recv_multipart(zmq::DONTWAIT) {
        Ok(message) => message,
        Err(zmq::Error::EAGAIN) => return Read::Empty,
        Err(zmq::Error::EINTR) => return Read::Skipped,
        Err(_) => return Read::Ended,
    };
    let Some(event) = message.first().and_then(|header| header.get(..2)) else {
        return Read::Skipped;
    };
    match PeerEvent::of(u16::from_ne_bytes([event[0], event[1]])) {
        Some(event) => Read::Event(event),
        None => Read::Skipped,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A handshake cut short by a stopping server reads as a closed connection (a
    /// write checks the endpoint again and finds the next server at once), never as
    /// "not ZeroMQ" (which only a liveness check or the next handshake lifts).
    #[test]
    fn libzmq_events_map_to_what_the_client_does() {
        assert_eq!(
            PeerEvent::of(EVENT_HANDSHAKE_SUCCEEDED),
            Some(PeerEvent::Up)
        );
        assert_eq!(
            PeerEvent::of(EVENT_DISCONNECTED),
            Some(PeerEvent::Disconnected)
        );
        assert_eq!(
            PeerEvent::of(EVENT_HANDSHAKE_FAILED_NO_DETAIL),
            Some(PeerEvent::Disconnected)
        );
        assert_eq!(
            PeerEvent::of(EVENT_HANDSHAKE_FAILED_PROTOCOL),
            Some(PeerEvent::HandshakeFailed)
        );
        assert_eq!(
            PeerEvent::of(EVENT_HANDSHAKE_FAILED_AUTH),
            Some(PeerEvent::HandshakeFailed)
        );
        assert_eq!(
            PeerEvent::of(EVENT_CONNECT_RETRIED),
            Some(PeerEvent::Retrying)
        );
        assert_eq!(PeerEvent::of(EVENT_CLOSED), Some(PeerEvent::Retrying));
        // CONNECTED (0x0001) and CONNECT_DELAYED (0x0002) change nothing.
        assert_eq!(PeerEvent::of(0x0001), None);
        assert_eq!(PeerEvent::of(0x0002), None);
    }
}
