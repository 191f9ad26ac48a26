//! Reading a request's block hashes out of Python: vLLM's `list[BlockHash]` (each
//! `bytes`; other buffers such as `bytearray` are converted), copied once into a
//! buffer the request's `BlockHashes` then holds.

use bytes::BytesMut;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

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
