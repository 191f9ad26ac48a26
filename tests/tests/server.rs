//! The reference server over real sockets: transports, the wire formats, concurrency.

#[path = "server/concurrency.rs"]
mod concurrency;
#[path = "server/transport.rs"]
mod transport;
#[path = "server/wire.rs"]
mod wire;
