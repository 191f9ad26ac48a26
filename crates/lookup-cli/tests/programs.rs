//! The two programs run as their users run them (`CARGO_BIN_EXE_*`: cargo builds them
//! with the tests, with the crate's default `prometheus` feature), against our server,
//! servers that misbehave, and the real Mooncake master.

#[path = "programs/lookup.rs"]
mod lookup;
#[path = "programs/server.rs"]
mod server;
