//! Wire codec tests: golden byte vectors written out by hand from `spec/wire.md`,
//! malformed inputs, and property tests (round trips, never panicking).

use bytes::Bytes;
use lookup_core::wire::{
    self, Format, LookupReply, MAX_HASH_LEN, MAX_HASHES, ServerRequest, TailKeyBoundary, WireError,
};
use lookup_core::{BlockHashes, Error};
use proptest::prelude::*;

#[path = "wire/golden.rs"]
mod golden;
#[path = "wire/malformed.rs"]
mod malformed;
#[path = "wire/properties.rs"]
mod properties;

// ---------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------

fn frames(parts: &[&[u8]]) -> Vec<Bytes> {
    parts.iter().map(|p| Bytes::copy_from_slice(p)).collect()
}

/// Three 32-byte hashes: 0x11 repeated, 0x22 repeated, 0x33 repeated.
fn three_hashes() -> BlockHashes {
    BlockHashes::from_hashes(&[[0x11u8; 32], [0x22; 32], [0x33; 32]]).unwrap()
}

/// The `msgpack-hex` frame 1 for [`three_hashes`], by hand: fixarray of 3 (`0x93`), then
/// three str8 (`0xd9`) of 64 (`0x40`) hex digits each.
fn three_hashes_msgpack() -> Vec<u8> {
    let mut v = vec![0x93];
    for digit in [b'1', b'2', b'3'] {
        v.extend_from_slice(&[0xd9, 0x40]);
        v.extend_from_slice(&[digit; 64]);
    }
    v
}

/// A str8 header for `hex` followed by its bytes.
fn str8(hex: &[u8]) -> Vec<u8> {
    let mut v = vec![0xd9, u8::try_from(hex.len()).unwrap()];
    v.extend_from_slice(hex);
    v
}

fn malformed(frames: &[Bytes]) -> (Format, WireError) {
    match wire::decode_request(frames) {
        ServerRequest::Malformed { format, error } => (format, error),
        other => panic!("expected Malformed, got {other:?}"),
    }
}

fn msgpack_malformed(array: &[u8]) -> WireError {
    let (format, error) = malformed(&frames(&[&[0, 0, 0, 48], array]));
    assert_eq!(format, Format::MsgpackHex);
    error
}

fn tagged_malformed(parts: &[&[u8]]) -> WireError {
    let (format, error) = malformed(&frames(parts));
    assert_eq!(format, Format::TaggedBlob);
    error
}
