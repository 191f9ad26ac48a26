//! The driver's one clock seam (CONTRIBUTING.md rule 1: the only clock read of the project is
//! in the driver). Every instant the client and its I/O task hand the core comes from
//! [`now`], which reads tokio's clock: under `tokio::time::pause` (tests on virtual
//! time) it jumps to the next timer instead of sleeping, and otherwise it is the
//! monotonic system clock.

use std::time::Instant;

/// The current instant of the runtime's clock, as the [`Instant`] the core takes.
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// A sleep until `at` on the same clock.
pub(crate) fn sleep_until(at: Instant) -> tokio::time::Sleep {
    tokio::time::sleep_until(at.into())
}
