//! Against a real Mooncake master and the real Python store client: the master
//! client, the Mooncake index behind the server, the master's read lease, the other
//! releases' masters, the trace replay, and two latency
//! measurements (ignored by default).

#[path = "mooncake/index_latency.rs"]
mod index_latency;
#[path = "mooncake/index_master.rs"]
mod index_master;
#[path = "mooncake/lease.rs"]
mod lease;
#[path = "mooncake/master.rs"]
mod master;
#[path = "mooncake/master_latency.rs"]
mod master_latency;
#[path = "mooncake/releases.rs"]
mod releases;
#[path = "mooncake/replay.rs"]
mod replay;
