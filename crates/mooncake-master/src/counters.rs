//! Live counters behind a `Copy` stats snapshot, declared once: `counters!` defines
//! the `<Owner>Counters` struct (one relaxed `AtomicU64` per field of the same name in
//! `<Owner>Stats`) and its snapshot, and [`bump`] adds to one of them (DESIGN.md,
//! "Names"). This crate's master client and batcher use it, and so do lookup-server's
//! server and Mooncake index (both already depend on this crate), so the
//! atomics-to-snapshot code is written here only.

use std::sync::atomic::{AtomicU64, Ordering};

/// Adds `n` to `counter` and returns the new count (relaxed: each counter is a count
/// on its own, read as a snapshot; wraps at `u64::MAX`).
pub fn bump(counter: &AtomicU64, n: u64) -> u64 {
    counter.fetch_add(n, Ordering::Relaxed).wrapping_add(n)
}

/// Defines a counters struct of one `AtomicU64` per listed field, with `Default` and
/// `Debug`, and its snapshot into the stats struct of the same field names:
///
/// ```
/// #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
/// pub struct Stats {
///     pub lookups: u64,
///     pub errors: u64,
///     pub lease_reads: u64,
/// }
/// mooncake_master::counters! {
///     /// The atomics behind `Stats`.
///     pub(crate) struct Counters => Stats { lookups, errors }
/// }
/// let counters = Counters::default();
/// mooncake_master::counters::bump(&counters.lookups, 2);
/// assert_eq!(counters.snapshot(), Stats { lookups: 2, errors: 0, lease_reads: 0 });
/// // Fields that are not counters are given; the counters overwrite theirs.
/// let stats = counters.snapshot_onto(Stats { lease_reads: 1, ..Stats::default() });
/// assert_eq!(stats, Stats { lookups: 2, errors: 0, lease_reads: 1 });
/// ```
///
/// The fields and the two methods have the struct's visibility. Each field is read on
/// its own (relaxed), so a snapshot taken while tasks bump is not one instant.
#[macro_export]
macro_rules! counters {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident => $stats:ident { $($field:ident),+ $(,)? }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Default)]
        $vis struct $name {
            $($vis $field: ::std::sync::atomic::AtomicU64,)+
        }

        impl $name {
            /// `stats` with each counter's field set to its count now, the others kept.
            #[allow(dead_code)]
            $vis fn snapshot_onto(&self, mut stats: $stats) -> $stats {
                $(stats.$field = self.$field.load(::std::sync::atomic::Ordering::Relaxed);)+
                stats
            }

            /// The counts now, the stats' other fields at their defaults.
            #[allow(dead_code)]
            $vis fn snapshot(&self) -> $stats {
                self.snapshot_onto(<$stats as ::core::default::Default>::default())
            }
        }
    };
}
