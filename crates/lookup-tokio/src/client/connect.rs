//! How a [`LookupClient`] comes to be: the strict and lazy connects (tonic's
//! `connect` / `connect_lazy`), each on the current runtime or a given one, the I/O
//! task they spawn for the chosen transport, and the wait for the server's first
//! answer (`spec/behaviour.md` rule 17; RELIABILITY.md, "Dead and hung servers").

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use lookup_core::{Dispatcher, Lookups};
use mooncake_master::{Coalescer, MasterClient};
use tokio::runtime::Handle;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::observer::ClientObserver;
use super::{ClientBuilder, ClientConfig, LookupClient, warn_if_prefetch_inactive};
use crate::clock;
use crate::io::direct::DirectWire;
use crate::io::zmq::{ZmqWire, open_dealer};
use crate::io::{IoConfig, IoLinks, IoTask, Link, ToIoBatch, TransportStats, Wire};
use crate::warn::WarnLimiter;
use crate::{Error, Transport};
use lookup_core::WireEvent;

impl LookupClient {
    /// Strict connect (tonic's `connect`): [`connect_lazy`](Self::connect_lazy), then
    /// waits at most [`ClientConfig::connect_timeout`] (1 s by default) for the server
    /// to answer: the ZeroMQ handshake with the lookup server completes, or with
    /// [`Transport::Direct`] the master connects. For a router or a CLI, which wants
    /// to know now; a scheduler that must start before its store uses
    /// [`connect_lazy`](Self::connect_lazy).
    ///
    /// # Errors
    /// As [`connect_lazy`](Self::connect_lazy); [`Error::Unreachable`] with the reason
    /// when the server does not answer within the bound (no socket file, a stale one,
    /// a refused port, no ZeroMQ greeting, the master's connect error, or the bound
    /// itself).
    pub async fn connect(config: ClientConfig) -> Result<Self, Error> {
        let bound = config.connect_timeout;
        let target = config.transport.target();
        let client = Self::connect_lazy(config)?;
        let mut link = client.link.clone();
        match wait_up(&mut link, bound).await {
            Ok(()) => Ok(client),
            Err(why) => Err(Error::Unreachable { target, why }),
        }
    }

    /// As [`connect`](Self::connect) (strict), the I/O task on `runtime`, blocking the
    /// calling thread for at most [`ClientConfig::connect_timeout`]: for schedulers
    /// that do not run inside tokio. Never call it on a thread of `runtime` itself.
    ///
    /// # Errors
    /// As [`connect`](Self::connect), except [`Error::NoRuntime`].
    pub fn connect_with_handle(config: ClientConfig, runtime: &Handle) -> Result<Self, Error> {
        let bound = config.connect_timeout;
        let target = config.transport.target();
        let client = Self::connect_lazy_with_handle(config, runtime)?;
        let mut link = client.link.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        runtime.spawn(async move {
            let _ = tx.send(wait_up(&mut link, bound).await);
        });
        // The task's own bound answers first; this one only guards a runtime that
        // does not run it.
        match rx.recv_timeout(bound.saturating_add(Duration::from_millis(100))) {
            Ok(Ok(())) => Ok(client),
            Ok(Err(why)) => Err(Error::Unreachable { target, why }),
            Err(_) => Err(Error::Unreachable {
                target,
                why: format!("no answer within {bound:?} (is the runtime running?)"),
            }),
        }
    }

    /// Lazy connect (tonic's `connect_lazy`): connects to the server of
    /// [`Transport::Zmq`] (or, with [`Transport::Direct`], to the master) and spawns
    /// the I/O task on the current tokio runtime, without waiting. The socket connects
    /// in the background: a server that is not up yet is not an error, which is what
    /// a scheduler that starts before its store wants. The client watches the
    /// connection ([`ClientStats::endpoint_unreachable`](super::ClientStats::endpoint_unreachable)): while nothing listens at
    /// the endpoint (a missing ipc socket file, a refused tcp port), once the server
    /// closed the connection (its process died), or once it is found stopped after a
    /// lookup timed out, lookups fail at once as unavailable, warned about once naming
    /// the endpoint and the cause, and they go out again as soon as ZeroMQ connects
    /// again. The direct transport connects to the master in the background too:
    /// lookups wait for the first attempt, and fail open while the master cannot be
    /// reached.
    ///
    /// A `lookup_prefetch_ttl_s` that is not below the store's read lease is logged
    /// as a warning, once (a cached result could then outlive the lease that keeps its
    /// blocks in the store): with the direct transport against
    /// [`DirectConfig::lease_ttl`](crate::DirectConfig::lease_ttl) when the master
    /// connects, or against the lease the master reports at the first hit
    /// ([`master_lease`](Self::master_lease)) when only that one is exceeded; with
    /// ZeroMQ against [`ZmqConfig::store_lease_ttl`](crate::ZmqConfig::store_lease_ttl)
    /// when set.
    ///
    /// # Errors
    /// [`Error::NoRuntime`] outside a tokio runtime (use
    /// [`connect_lazy_with_handle`](Self::connect_lazy_with_handle));
    /// [`Error::Core`] for an invalid `config.core`; [`Error::Zmq`] when the socket
    /// cannot be created or the endpoint is refused by ZeroMQ;
    /// [`Error::InvalidClientConfig`] for a direct transport setting that cannot work
    /// ([`DirectConfig::validate`](crate::DirectConfig::validate)).
    pub fn connect_lazy(config: ClientConfig) -> Result<Self, Error> {
        let handle = Handle::try_current().map_err(|_| Error::NoRuntime)?;
        Self::connect_lazy_with_handle(config, &handle)
    }

    /// As [`connect_lazy`](Self::connect_lazy), spawning the I/O task on `runtime`, for
    /// schedulers that do not run inside tokio. Keep the runtime alive as long as the
    /// client (a current-thread runtime must be driven by another thread).
    ///
    /// # Errors
    /// As [`connect_lazy`](Self::connect_lazy), except [`Error::NoRuntime`].
    #[tracing::instrument(level = "debug", skip_all, fields(endpoint = %config.transport.target()))]
    pub fn connect_lazy_with_handle(config: ClientConfig, runtime: &Handle) -> Result<Self, Error> {
        // The socket registers with the runtime's reactor, and the task's timer with
        // its clock: enter it first.
        let _entered = runtime.enter();
        warn_if_prefetch_inactive(&config.core);
        let mut core = Lookups::with_observer(
            config.core.clone(),
            ClientObserver::new(clock::now(), config.transport.target(), &config.label()),
        )?;
        core.set_event_capacity(config.event_capacity);
        let timeout = config.core.timeout();
        let mut master = None;
        let batch = Arc::new(OnceLock::new());
        let spawned = match &config.transport {
            Transport::Zmq(zmq) => {
                let context = tmq::Context::new();
                zmq.check_lease(config.core.lookup_prefetch_ttl);
                let socket = open_dealer(&context, &zmq.endpoint.url())?;
                let wire = ZmqWire::new(
                    zmq.endpoint.clone(),
                    zmq.format,
                    config.core.block_size,
                    timeout,
                    context,
                    socket,
                );
                spawn(wire, &config, runtime)
            }
            Transport::Direct(direct) => {
                direct.validate()?;
                let cell = Arc::new(OnceLock::new());
                let result_ttl = config.core.lookup_prefetch_ttl;
                let wire = DirectWire::new(
                    (**direct).clone(),
                    config.core.block_size,
                    result_ttl,
                    Arc::clone(&cell),
                    Arc::clone(&batch),
                );
                master = Some(cell);
                spawn(wire, &config, runtime)
            }
        };
        Ok(Self::assemble(
            core, spawned, &config, runtime, master, batch,
        ))
    }

    /// A builder of the configuration, then of the client:
    /// `LookupClient::builder().zmq("tcp://127.0.0.1:5555").lookup_async(true).connect_lazy()`
    /// ([`ClientBuilder`]).
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// A client whose I/O task drives `wire` (tests: a seeded fake wire on virtual
    /// time).
    #[cfg(test)]
    pub(crate) fn with_wire<W: Wire>(
        config: ClientConfig,
        wire: W,
        runtime: &Handle,
    ) -> Result<Self, Error> {
        let _entered = runtime.enter();
        let mut core = Lookups::with_observer(
            config.core.clone(),
            ClientObserver::new(clock::now(), config.transport.target(), &config.label()),
        )?;
        core.set_event_capacity(config.event_capacity);
        let spawned = spawn(wire, &config, runtime);
        Ok(Self::assemble(
            core,
            spawned,
            &config,
            runtime,
            None,
            Arc::default(),
        ))
    }

    fn assemble(
        core: Lookups<ClientObserver>,
        spawned: Spawned,
        config: &ClientConfig,
        runtime: &Handle,
        master: Option<Arc<OnceLock<MasterClient>>>,
        batch: Arc<OnceLock<Coalescer>>,
    ) -> Self {
        let Spawned {
            commands,
            wire_events,
            cancel,
            task,
            transport,
            link,
        } = spawned;
        let (announce, announced) = tokio::sync::mpsc::unbounded_channel();
        Self {
            core,
            commands,
            wire_events,
            cancel,
            task,
            runtime: runtime.clone(),
            transport,
            progressed: false,
            wait_limit: config.core.timeout().saturating_add(config.wait_margin),
            probe_budget: config.probe_budget,
            waits_gave_up: 0,
            warn: WarnLimiter::default(),
            master,
            batch,
            announced,
            announce,
            handles_made: AtomicBool::new(false),
            link,
        }
    }
}

/// The handle's ends of a spawned I/O task.
struct Spawned {
    commands: UnboundedSender<ToIoBatch>,
    wire_events: UnboundedReceiver<WireEvent>,
    cancel: CancellationToken,
    task: JoinHandle<()>,
    transport: Arc<TransportStats>,
    link: watch::Receiver<Link>,
}

/// Waits at most `bound` for the I/O task to find the server up: `Err` names why not.
async fn wait_up(link: &mut watch::Receiver<Link>, bound: Duration) -> Result<(), String> {
    let known = link.wait_for(|l| *l != Link::Unknown);
    match tokio::time::timeout(bound, known).await {
        Ok(Ok(state)) => match &*state {
            Link::Down(why) => Err(why.clone()),
            Link::Up | Link::Unknown => Ok(()),
        },
        Ok(Err(_)) => Err("the client's I/O task ended".to_owned()),
        Err(_) => Err(format!("no answer within {bound:?}")),
    }
}

/// The I/O task's settings for `config`'s transport: its reopen backoff and count, the
/// lookup timeout, the master client's own call timeout, the pending age and the
/// metrics label. Direct: the master client reconnects by itself when a connection
/// breaks, and replaces a hung one after call timeouts in a row (rule 17, counted per
/// call by the client, whichever deadline fires first), so the dispatcher counts none
/// of its own.
fn io_config(config: &ClientConfig) -> IoConfig {
    let (backoff, reopen_after_timeouts, call_timeout) = match &config.transport {
        Transport::Zmq(zmq) => (zmq.reopen_backoff, zmq.reopen_after_timeouts, None),
        Transport::Direct(direct) => (
            direct.connect_backoff,
            0,
            Some(direct.master_config.call_timeout),
        ),
    };
    IoConfig {
        backoff,
        reopen_after_timeouts,
        timeout: config.core.timeout(),
        call_timeout,
        max_pending_age: config.core.max_pending_age,
        label: config.label(),
    }
}

/// Spawns the I/O task driving `wire` on `runtime`.
fn spawn<W: Wire>(wire: W, config: &ClientConfig, runtime: &Handle) -> Spawned {
    let io = io_config(config);
    let (commands, command_rx) = tokio::sync::mpsc::unbounded_channel();
    let (event_tx, wire_events) = tokio::sync::mpsc::unbounded_channel();
    let cancel = CancellationToken::new();
    let transport = Arc::new(TransportStats::default());
    let (link_tx, link) = watch::channel(Link::Unknown);
    let task = IoTask::new(
        wire,
        Dispatcher::new(&config.core),
        &io,
        IoLinks {
            commands: command_rx,
            events: event_tx,
            cancel: cancel.clone(),
            stats: Arc::clone(&transport),
            link: link_tx,
        },
    );
    Spawned {
        commands,
        wire_events,
        cancel,
        task: runtime.spawn(task.run()),
        transport,
        link,
    }
}
