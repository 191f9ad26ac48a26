//! Reading a request's block hashes out of Python: vLLM's `list[BlockHash]` (each
//! `bytes`; other buffers such as `bytearray` are converted), copied once into a
//! buffer the request's `BlockHashes` then holds: a slice of a `HashArena` chunk
//! shared with the requests read before and after it.

use bytes::{Bytes, BytesMut};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

/// Bytes an arena reserves at a time when it runs out: 32 prompts of 64 blocks of
/// 32-byte hashes.
const CHUNK: usize = 64 * 1024;

/// Where requests' block hashes are copied: chunks of [`CHUNK`] bytes, each request
/// taking the slice of its hashes. A request's hashes are never freed on their own:
/// dropping a slice releases a reference to its chunk, and a chunk is freed (or
/// reused in place, when the arena's own is the last reference) once every request
/// in it has ended. A heap allocation and free of a few KiB per request cost the
/// scheduler's thread more than the rest of a ready poll (the free's consolidation
/// and the heap's trim and page faults); a chunk's cost is spread over its requests.
/// A chunk stays allocated while any request in it lives: at most one chunk per
/// live request, whatever the order requests end in.
#[derive(Default)]
pub(crate) struct HashArena {
    buf: BytesMut,
}

impl HashArena {
    /// The block hashes of `block_hashes` (as [`read_hashes`]), copied into the
    /// arena: their length in bytes (each hash's) and their bytes.
    ///
    /// # Errors
    /// As [`read_hashes`]; the arena is then as it was.
    pub(crate) fn read(
        &mut self,
        req_id: &str,
        block_hashes: &Bound<'_, PyAny>,
    ) -> PyResult<(u16, Bytes)> {
        // vLLM's hashes are 32 bytes (a prompt's hashes of another length still fit:
        // `read_hashes` reserves what it needs).
        let need = block_hashes.len().unwrap_or(0) * 32;
        if self.buf.capacity() - self.buf.len() < need {
            self.buf.reserve(need.max(CHUNK));
        }
        let hash_len = read_hashes(req_id, block_hashes, &mut self.buf)?;
        let len = self.buf.len();
        Ok((hash_len, self.buf.split_to(len).freeze()))
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
    let got = concat_any(req_id, block_hashes, out).and_then(|len| {
        u16::try_from(len)
            .map_err(|_| PyValueError::new_err(format!("request {req_id}: hash too long")))
    });
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
    let mut hash_len = None;
    for item in block_hashes.try_iter()? {
        let item = item?;
        let owned;
        let bytes: &[u8] = if let Ok(b) = item.cast::<PyBytes>() {
            b.as_bytes()
        } else {
            owned = item.extract::<Vec<u8>>()?;
            &owned
        };
        let len = *hash_len.get_or_insert(bytes.len());
        if bytes.len() != len {
            return Err(different_lengths(req_id));
        }
        if out.len() == start {
            out.reserve(len * block_hashes.len().unwrap_or(1));
        }
        out.extend_from_slice(bytes);
    }
    Ok(hash_len.unwrap_or(0))
}

/// [`concat_any`] of a `list` whose items are all exactly `bytes` (vLLM's
/// `list[BlockHash]`): one pass, no iterator object, no per-item type-flag call, at
/// most one allocation. `None` at the first item of another type (the general path
/// then reads the list again).
fn concat_list(
    req_id: &str,
    list: &Bound<'_, PyList>,
    out: &mut BytesMut,
) -> Option<PyResult<usize>> {
    let mut hash_len = 0;
    for (i, item) in list.iter().enumerate() {
        let bytes = item.cast_exact::<PyBytes>().ok()?.as_bytes();
        if i == 0 {
            hash_len = bytes.len();
            out.reserve(hash_len * list.len());
        } else if bytes.len() != hash_len {
            return Some(Err(different_lengths(req_id)));
        }
        out.extend_from_slice(bytes);
    }
    Some(Ok(hash_len))
}

fn different_lengths(req_id: &str) -> PyErr {
    PyValueError::new_err(format!(
        "request {req_id}: block hashes of different lengths"
    ))
}
