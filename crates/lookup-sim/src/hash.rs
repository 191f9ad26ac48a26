//! SplitMix64's finaliser: the one stable 64-bit mix behind prefix routing, the
//! reruns' independent draws and the store's stand-in hashes. Its own module so the
//! store and the runner use it without depending on the engine model.

/// A stable 64-bit mix (SplitMix64's finaliser) for prefix routing and seeds.
#[must_use]
pub(crate) fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}
