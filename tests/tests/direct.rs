//! The direct transport: the client asks the Mooncake master itself, against a
//! scripted fake master and the real one.

#[path = "direct/batch.rs"]
mod batch;
#[path = "direct/faults.rs"]
mod faults;
#[path = "direct/lease.rs"]
mod lease;
#[path = "direct/master.rs"]
mod master;
#[path = "direct/store_check.rs"]
mod store_check;
#[path = "direct/transport.rs"]
mod transport;
