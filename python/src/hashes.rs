//! Reading a request's block hashes out of Python: vLLM's `list[BlockHash]` (each
//! `bytes`, read through CPython's object layout as `b"".join` reads them, or through
//! the stable ABI in an `abi3` build; other buffers such as `bytearray` are
//! converted), copied once into a buffer the request's `BlockHashes` then holds: a
//! slice of a `HashArena` chunk shared with the requests read before and after it.

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

/// Bytes an arena reserves at a time when it runs out: 32 prompts of 64 blocks of
/// 32-byte hashes.
const CHUNK: usize = 64 * 1024;

/// Bytes of block hashes a request may have: the most a lookup on the wire carries
/// (`lookup_core::wire::MAX_HASHES` hashes of at most `MAX_HASH_LEN` bytes, 16 MiB; a
/// prompt of 1 Mi tokens at vLLM's block size of 16 has 2 MiB). More is refused, not
/// copied.
const MAX_BYTES: usize = lookup_core::wire::MAX_HASHES * lookup_core::wire::MAX_HASH_LEN;

/// Filled chunks an arena keeps a handle on, to reuse one in place once every request
/// in it has ended: enough for the chunks of 2,048 live requests of 64 blocks. The
/// oldest handle goes past it (its chunk then freed when its last request ends). Once
/// a burst has drained, these and the current chunk stay allocated: 65 chunks, each
/// [`CHUNK`] bytes (4.06 MiB) unless a prompt of more than 2,048 blocks made one its
/// size.
const SPENT_KEPT: usize = 64;

/// Where requests' block hashes are copied: chunks of [`CHUNK`] bytes, each request
/// taking the slice of its hashes. A request's hashes are never freed on their own:
/// dropping a slice releases a reference to its chunk. A chunk whose requests have
/// all ended is reused in place, the current one or one of the [`SPENT_KEPT`] filled
/// before it, and a new one is allocated only when none is free (hashes of more than
/// 32 bytes, or a sequence without a length, may outgrow the room made for them: the
/// copy then reserves its own, as `BytesMut` does). A heap allocation
/// and free of a few KiB per request cost the scheduler's thread more than the rest
/// of a ready poll (the free's consolidation, the heap's trim and the page faults of
/// the memory given back and taken again); a chunk reused is neither allocated nor
/// faulted in again. A chunk stays allocated while any request in it lives.
#[derive(Default)]
pub(crate) struct HashArena {
    buf: BytesMut,
    /// Handles on the chunks filled before `buf` (each empty: its requests hold the
    /// bytes), oldest first.
    spent: VecDeque<BytesMut>,
    /// Chunks allocated so far (reuses not counted).
    chunks_allocated: u64,
}

impl HashArena {
    /// The block hashes of `block_hashes` (as [`read_hashes`]), copied into the
    /// arena: their length in bytes (each hash's) and their bytes.
    ///
    /// # Errors
    /// As [`read_hashes`]; no bytes are then written (the arena may have moved to
    /// another chunk).
    pub(crate) fn read(
        &mut self,
        req_id: &str,
        block_hashes: &Bound<'_, PyAny>,
    ) -> PyResult<(u16, Bytes)> {
        // vLLM's hashes are 32 bytes (a prompt's hashes of another length still fit:
        // `read_hashes` reserves what it needs).
        let need = block_hashes.len().unwrap_or(0).saturating_mul(32);
        // More than a request may take is refused by the read: no chunk made for it.
        if need <= MAX_BYTES {
            self.make_room(need);
        }
        let hash_len = read_hashes(req_id, block_hashes, &mut self.buf)?;
        Ok((hash_len, self.take()))
    }

    /// Room for `need` bytes after what the current chunk holds: the current chunk's,
    /// else a free chunk's (the current one, or the oldest free of the spent ones),
    /// else a new chunk of at least [`CHUNK`] bytes; the chunk left goes to the spent
    /// ones.
    fn make_room(&mut self, need: usize) {
        // Every byte written was taken: a handle put aside holds none.
        debug_assert!(self.buf.is_empty());
        if self.buf.try_reclaim(need) {
            return;
        }
        let size = need.max(CHUNK);
        // The arena's first chunk replaces an empty handle of no chunk.
        let had_chunk = self.chunks_allocated > 0;
        let reused = self
            .spent
            .iter_mut()
            .position(|chunk| chunk.try_reclaim(size))
            .and_then(|i| self.spent.remove(i));
        let next = reused.unwrap_or_else(|| {
            self.chunks_allocated += 1;
            BytesMut::with_capacity(size)
        });
        let left = std::mem::replace(&mut self.buf, next);
        if had_chunk {
            self.spent.push_back(left);
            if self.spent.len() > SPENT_KEPT {
                self.spent.pop_front();
            }
        }
    }

    /// The bytes written since the last call, as a slice of the current chunk.
    fn take(&mut self) -> Bytes {
        let len = self.buf.len();
        self.buf.split_to(len).freeze()
    }

    /// Chunks allocated so far; a chunk reused is not counted again.
    #[cfg(test)]
    fn chunks_allocated(&self) -> u64 {
        self.chunks_allocated
    }
}

/// Appends the block hashes of `block_hashes` to `out` and returns their length in
/// bytes (each hash's).
///
/// # Errors
/// `ValueError` naming `req_id` when an item is not bytes-like, the lengths differ,
/// or a hash is longer than 65,535 bytes; `out` is then as it was.
pub(crate) fn read_hashes(
    req_id: &str,
    block_hashes: &Bound<'_, PyAny>,
    out: &mut BytesMut,
) -> PyResult<u16> {
    let start = out.len();
    let got = concat_any(req_id, block_hashes, out)
        .and_then(|len| u16::try_from(len).map_err(|_| too_long(req_id)));
    if got.is_err() {
        out.truncate(start);
    }
    got
}

/// [`read_hashes`] before its length check; may leave part of a bad sequence in
/// `out`.
fn concat_any(
    req_id: &str,
    block_hashes: &Bound<'_, PyAny>,
    out: &mut BytesMut,
) -> PyResult<usize> {
    let start = out.len();
    if let Ok(list) = block_hashes.cast_exact::<PyList>() {
        match concat_list(req_id, list, out) {
            Some(got) => return got,
            // Not all `bytes`: read again below.
            None => out.truncate(start),
        }
    }
    let count = block_hashes.len().unwrap_or(1);
    let mut hash_len = 0;
    for (i, item) in block_hashes.try_iter()?.enumerate() {
        let item = item?;
        let owned;
        let bytes: &[u8] = if let Ok(b) = item.cast::<PyBytes>() {
            b.as_bytes()
        } else {
            owned = item.extract::<Vec<u8>>()?;
            &owned
        };
        push_hash(req_id, out, i, count, &mut hash_len, bytes)?;
        // A sequence without a length (a generator) is checked as it goes.
        if out.len() - start > MAX_BYTES {
            return Err(too_many(req_id, out.len() - start));
        }
    }
    Ok(hash_len)
}

/// Appends hash `i` of a prompt's `count` to `out`: the first sets `hash_len` and
/// reserves room for all of them ([`reserve_for`]); each other must be as long.
///
/// # Errors
/// As [`reserve_for`]; `ValueError` naming `req_id` for a hash of another length.
// Always inlined: with `#[inline]` alone the direct read measured slower
// (a deferred prefetch 1.12-1.24x `b"".join` against 0.94-1.03x, alternated 3 times).
#[inline(always)]
fn push_hash(
    req_id: &str,
    out: &mut BytesMut,
    i: usize,
    count: usize,
    hash_len: &mut usize,
    bytes: &[u8],
) -> PyResult<()> {
    if i == 0 {
        *hash_len = bytes.len();
        reserve_for(req_id, out, *hash_len, count)?;
    } else if bytes.len() != *hash_len {
        return Err(different_lengths(req_id));
    }
    out.extend_from_slice(bytes);
    Ok(())
}

/// [`concat_any`] of a `list` whose items are all exactly `bytes` (vLLM's
/// `list[BlockHash]`): one pass, no iterator object, at most one allocation, each item
/// read through CPython's object layout (the list's item array, the bytes' size and
/// buffer) as `b"".join` reads it: no call into the interpreter and no reference
/// count touched per item. `None` at the first item of another type (the general path
/// then reads the list again).
#[cfg(not(any(Py_LIMITED_API, PyPy, GraalPy)))]
#[allow(unsafe_code)]
fn concat_list(
    req_id: &str,
    list: &Bound<'_, PyList>,
    out: &mut BytesMut,
) -> Option<PyResult<usize>> {
    use pyo3::ffi;

    let list = list.as_ptr();
    // SAFETY: the GIL is held (`list` is a `Bound`; the module does not declare itself
    // free-threaded, so a free-threaded interpreter runs it under the GIL too) and no
    // Python code runs until this function returns (no call into the interpreter, no
    // reference released), so the list is neither resized nor mutated meanwhile and
    // its items, borrowed from it, stay alive. `PyList_GET_SIZE` and
    // `PyList_GET_ITEM` read an exact list (checked by the caller's `cast_exact`)
    // within its size; an item whose type is exactly `bytes` is a `PyBytesObject`,
    // whose `ob_sval` holds `Py_SIZE` bytes.
    unsafe {
        let n = usize::try_from(ffi::PyList_GET_SIZE(list)).unwrap_or(0);
        let bytes_type = std::ptr::addr_of_mut!(ffi::PyBytes_Type);
        let mut hash_len = 0;
        for i in 0..n {
            let item = ffi::PyList_GET_ITEM(list, i as ffi::Py_ssize_t);
            if ffi::Py_TYPE(item) != bytes_type {
                return None;
            }
            let len = usize::try_from(ffi::Py_SIZE(item)).unwrap_or(0);
            let data = (*item.cast::<ffi::PyBytesObject>())
                .ob_sval
                .as_ptr()
                .cast::<u8>();
            let bytes = std::slice::from_raw_parts(data, len);
            if let Err(error) = push_hash(req_id, out, i, n, &mut hash_len, bytes) {
                return Some(Err(error));
            }
        }
        Some(Ok(hash_len))
    }
}

/// [`concat_any`] of a `list` whose items are all exactly `bytes`, through the stable
/// ABI (the `abi3` feature, or an interpreter whose objects are not CPython's): one
/// pass, no iterator object, no per-item type-flag call, at most one allocation.
/// `None` at the first item of another type (the general path then reads the list
/// again).
#[cfg(any(Py_LIMITED_API, PyPy, GraalPy))]
fn concat_list(
    req_id: &str,
    list: &Bound<'_, PyList>,
    out: &mut BytesMut,
) -> Option<PyResult<usize>> {
    let mut hash_len = 0;
    let count = list.len();
    for (i, item) in list.iter().enumerate() {
        let bytes = item.cast_exact::<PyBytes>().ok()?.as_bytes();
        if let Err(error) = push_hash(req_id, out, i, count, &mut hash_len, bytes) {
            return Some(Err(error));
        }
    }
    Some(Ok(hash_len))
}

/// Reserves room in `out` for `count` hashes of `hash_len` bytes.
///
/// # Errors
/// `ValueError` naming `req_id`, before anything is reserved, when a hash is longer
/// than the 65,535 bytes a `BlockHashes` takes or the hashes exceed [`MAX_BYTES`]: a
/// list repeating one huge `bytes` object costs Python 8 bytes an item, and must not
/// make the client reserve (or abort on) their total.
fn reserve_for(req_id: &str, out: &mut BytesMut, hash_len: usize, count: usize) -> PyResult<()> {
    if hash_len > usize::from(u16::MAX) {
        return Err(too_long(req_id));
    }
    let total = hash_len.saturating_mul(count);
    if total > MAX_BYTES {
        return Err(too_many(req_id, total));
    }
    out.reserve(total);
    Ok(())
}

fn too_long(req_id: &str) -> PyErr {
    PyValueError::new_err(format!("request {req_id}: hash too long"))
}

fn too_many(req_id: &str, total: usize) -> PyErr {
    PyValueError::new_err(format!(
        "request {req_id}: {total} bytes of block hashes, over the {MAX_BYTES} a request's hashes may take"
    ))
}

fn different_lengths(req_id: &str) -> PyErr {
    PyValueError::new_err(format!(
        "request {req_id}: block hashes of different lengths"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2 KiB of `tag`: one request's 64 hashes of 32 bytes.
    fn hashes(tag: u8) -> Vec<u8> {
        vec![tag; 2048]
    }

    impl HashArena {
        /// Copies `data` as `read` copies a request's hashes.
        fn write(&mut self, data: &[u8]) -> Bytes {
            self.make_room(data.len());
            self.buf.extend_from_slice(data);
            self.take()
        }
    }

    /// The addresses of a chunk, given the first slice written into it.
    fn chunk_of(first: &Bytes) -> std::ops::Range<usize> {
        let start = first.as_ptr() as usize;
        start..start + CHUNK
    }

    #[test]
    fn a_chunk_whose_requests_ended_is_reused_in_place() {
        let mut arena = HashArena::default();
        // 32 requests fill the first chunk; the 33rd starts a second.
        let first: Vec<Bytes> = (0..32).map(|i| arena.write(&hashes(i))).collect();
        let a = chunk_of(&first[0]);
        let second: Vec<Bytes> = (32..64).map(|i| arena.write(&hashes(i))).collect();
        assert_eq!(arena.chunks_allocated(), 2);
        assert!(!a.contains(&(second[0].as_ptr() as usize)));
        // One request of the first chunk still lives: a third chunk.
        let kept = first[5].clone();
        drop(first);
        let third = arena.write(&hashes(64));
        assert_eq!(arena.chunks_allocated(), 3);
        assert!(!a.contains(&(third.as_ptr() as usize)));
        // Once it ends, the first chunk is the one the fourth fill takes.
        assert_eq!(kept.as_ref(), hashes(5).as_slice());
        drop(kept);
        let rest: Vec<Bytes> = (65..96).map(|i| arena.write(&hashes(i))).collect();
        let reused = arena.write(&hashes(96));
        assert_eq!(arena.chunks_allocated(), 3);
        assert_eq!(reused.as_ptr() as usize, a.start);
        // Every live request's bytes are its own.
        for (i, slice) in (32..64).zip(&second).chain((65..96).zip(&rest)) {
            assert_eq!(slice.as_ref(), hashes(i).as_slice(), "request {i}");
        }
        assert_eq!(third.as_ref(), hashes(64).as_slice());
        assert_eq!(reused.as_ref(), hashes(96).as_slice());
    }

    #[test]
    fn the_current_chunk_is_reused_when_its_requests_ended() {
        let mut arena = HashArena::default();
        let full: Vec<Bytes> = (0..32).map(|i| arena.write(&hashes(i))).collect();
        let start = full[0].as_ptr() as usize;
        drop(full);
        // Full, and every request in it ended: the next one starts it again.
        let next = arena.write(&hashes(99));
        assert_eq!(next.as_ptr() as usize, start);
        assert_eq!(arena.chunks_allocated(), 1);
        assert!(arena.spent.is_empty());
        assert_eq!(next.as_ref(), hashes(99).as_slice());
    }

    #[test]
    fn the_oldest_free_chunk_is_reused_first() {
        let mut arena = HashArena::default();
        let fill = |arena: &mut HashArena, tag: u8| -> Vec<Bytes> {
            (0..32).map(|_| arena.write(&hashes(tag))).collect()
        };
        let a = fill(&mut arena, 1);
        let b = fill(&mut arena, 2);
        let c = fill(&mut arena, 3);
        let (a_at, b_at) = (chunk_of(&a[0]), chunk_of(&b[0]));
        assert_eq!(arena.chunks_allocated(), 3);
        // Both spent chunks free: the older one, then the other.
        drop(b);
        drop(a);
        let next = arena.write(&hashes(4));
        assert_eq!(next.as_ptr() as usize, a_at.start);
        let rest: Vec<Bytes> = (0..31).map(|_| arena.write(&hashes(5))).collect();
        let after = arena.write(&hashes(6));
        assert_eq!(after.as_ptr() as usize, b_at.start);
        assert_eq!(arena.chunks_allocated(), 3);
        assert_eq!(c[31].as_ref(), hashes(3).as_slice());
        assert_eq!(rest[30].as_ref(), hashes(5).as_slice());
    }

    #[test]
    fn spent_chunks_kept_are_bounded() {
        let mut arena = HashArena::default();
        let chunks = SPENT_KEPT + 5;
        let live: Vec<Bytes> = (0..chunks * 32)
            .map(|i| arena.write(&hashes((i % 251) as u8)))
            .collect();
        assert_eq!(arena.chunks_allocated(), chunks as u64);
        assert_eq!(arena.spent.len(), SPENT_KEPT);
        // A prompt longer than a chunk gets a chunk of its size.
        let long = arena.write(&vec![7; CHUNK + 32]);
        assert_eq!(long.len(), CHUNK + 32);
        assert_eq!(arena.chunks_allocated(), chunks as u64 + 1);
        assert_eq!(live[0].as_ref(), hashes(0).as_slice());
    }
}
