//! Fuzzing with exact answers: the decoders against reference decoders, and the
//! reference server over real sockets. The allocation test (`fuzz_alloc`, a global
//! allocator) keeps a binary of its own.

#[path = "fuzz/decoders.rs"]
mod decoders;
#[path = "fuzz/server.rs"]
mod server;
