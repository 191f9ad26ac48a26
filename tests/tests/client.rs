//! The client end to end, against the reference server, an in-test server and the
//! independent Python peer, one module a former file.

#[path = "client/e2e.rs"]
mod e2e;
#[path = "client/python.rs"]
mod python;
#[path = "client/stress.rs"]
mod stress;
