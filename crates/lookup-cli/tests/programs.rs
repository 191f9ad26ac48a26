//! The two programs run as their users run them (`CARGO_BIN_EXE_*`: cargo builds them
//! with the tests, with the crate's default `prometheus` feature), against our server,
//! servers that misbehave, and the real Mooncake master (also a high-availability
//! cluster: a real etcd and two real masters; the masters of the other releases).

#[path = "programs/dcp.rs"]
mod dcp;
#[path = "programs/flood.rs"]
mod flood;
#[path = "programs/ha.rs"]
mod ha;
#[path = "programs/hash.rs"]
mod hash;
#[path = "programs/lookup.rs"]
mod lookup;
#[path = "programs/master.rs"]
mod master;
#[path = "programs/releases.rs"]
mod releases;
#[path = "programs/server.rs"]
mod server;
