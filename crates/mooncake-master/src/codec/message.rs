//! The calls and replies of the existence RPC (`spec/mooncake-master-rpc.md`, "The
//! call") and of `RemoveAll` ("Removing everything"): encoders and decoders for both
//! sides.

use super::pack::{PackReader, PackType, PackWriter, TypeLiteral};
use super::{
    CodecError, FunctionId, REPLY_HEADER_LEN, REQUEST_HEADER_LEN, ReplyHeader, RequestHeader, types,
};
use crate::StoreErrorCode;

/// One key's answer in a `BatchExistKey` reply: `Ok(true)` when a complete, readable
/// replica exists, `Ok(false)` when not, `Err` with the master's `ErrorCode` otherwise.
pub type ExistResult = Result<bool, StoreErrorCode>;

/// `err_code` of a reply whose arguments the master could not read as the function's
/// parameter types (seen for the one-argument `BatchExistKey` sent to 0.3.13, and the
/// reverse on older masters).
pub const ERR_INVALID_ARGUMENTS: u8 = 4;
/// `err_code` of a reply to a function id the master does not register.
pub const ERR_FUNCTION_NOT_REGISTERED: u8 = 11;
/// `err_code` whose body carries a 16-bit coro_rpc error code next to the message.
pub const ERR_EXTENDED: u8 = 255;

/// An RPC-level failure: the reply's `err_code` was not 0 (`spec/mooncake-master-rpc.md`,
/// "Transport").
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RpcError {
    /// coro_rpc's error code: the header's `err_code`, or for 255 the 16-bit code in
    /// the body.
    pub code: u16,
    /// The master's message, e.g. `"invalid rpc arg"`.
    pub message: String,
}

/// Appends a request frame (header and body) built by `body`, patching the header's
/// body length once the body is written.
fn frame(
    out: &mut Vec<u8>,
    seq_num: u32,
    function_id: FunctionId,
    body: impl FnOnce(&mut Vec<u8>),
) -> Result<(), CodecError> {
    let start = out.len();
    out.extend_from_slice(&[0; REQUEST_HEADER_LEN]);
    body(out);
    let body_len = out.len() - start - REQUEST_HEADER_LEN;
    let Ok(body_length) = u32::try_from(body_len) else {
        out.truncate(start);
        return Err(CodecError::BodyTooLarge { bytes: body_len });
    };
    let header = RequestHeader {
        seq_num,
        function_id,
        body_length,
        attach_length: 0,
    };
    out[start..start + REQUEST_HEADER_LEN].copy_from_slice(&header.encode());
    Ok(())
}

/// Appends a `BatchExistKey` request frame: `keys` (strings of any length) and, when
/// `tenant_id` is `Some` (normally `"default"`), the tenant: the ≥ 0.3.12 signature
/// `tuple<vector<string>, string>`. `None` sends the ≤ 0.3.11 signature, the bare
/// `vector<string>`. Length prefixes take the width the largest of `keys.len()`, the
/// key lengths and the tenant's length needs.
///
/// # Errors
/// [`CodecError::BodyTooLarge`] when the body would exceed 4 GiB (nothing appended).
pub fn encode_batch_exist_key<K: AsRef<str>>(
    out: &mut Vec<u8>,
    seq_num: u32,
    keys: &[K],
    tenant_id: Option<&str>,
    literal: TypeLiteral,
) -> Result<(), CodecError> {
    let longest_key = keys.iter().map(|k| k.as_ref().len()).max().unwrap_or(0);
    let max_len = keys
        .len()
        .max(longest_key)
        .max(tenant_id.map_or(0, str::len));
    let ty = if tenant_id.is_some() {
        types::BATCH_EXIST_ARGS
    } else {
        types::BATCH_EXIST_ARGS_LEGACY
    };
    frame(out, seq_num, FunctionId::BATCH_EXIST_KEY, |out| {
        let mut w = PackWriter::begin(out, ty, literal, max_len);
        w.len(keys.len());
        for key in keys {
            w.str(key.as_ref());
        }
        if let Some(tenant_id) = tenant_id {
            w.str(tenant_id);
        }
    })
}

/// Appends an `ExistKey` request frame: `(key, tenant_id)` when `tenant_id` is `Some`
/// (≥ 0.3.12), the bare `key` otherwise.
///
/// # Errors
/// [`CodecError::BodyTooLarge`] when the body would exceed 4 GiB (nothing appended).
pub fn encode_exist_key(
    out: &mut Vec<u8>,
    seq_num: u32,
    key: &str,
    tenant_id: Option<&str>,
    literal: TypeLiteral,
) -> Result<(), CodecError> {
    encode_key_call(out, seq_num, FunctionId::EXIST_KEY, key, tenant_id, literal)
}

/// Appends a request frame for `function` with `ExistKey`'s arguments: `(key,
/// tenant_id)`, or the bare `key` when `tenant_id` is `None` (`GetReplicaList` takes the
/// same).
pub(super) fn encode_key_call(
    out: &mut Vec<u8>,
    seq_num: u32,
    function: FunctionId,
    key: &str,
    tenant_id: Option<&str>,
    literal: TypeLiteral,
) -> Result<(), CodecError> {
    let max_len = key.len().max(tenant_id.map_or(0, str::len));
    let ty = if tenant_id.is_some() {
        types::EXIST_ARGS
    } else {
        types::STRING
    };
    frame(out, seq_num, function, |out| {
        let mut w = PackWriter::begin(out, ty, literal, max_len);
        w.str(key);
        if let Some(tenant_id) = tenant_id {
            w.str(tenant_id);
        }
    })
}

/// Appends a `ServiceReady` request frame. The function takes no arguments: the body
/// is empty.
pub fn encode_service_ready(out: &mut Vec<u8>, seq_num: u32) {
    out.extend_from_slice(
        &RequestHeader {
            seq_num,
            function_id: FunctionId::SERVICE_READY,
            body_length: 0,
            attach_length: 0,
        }
        .encode(),
    );
}

/// Appends a `RemoveAll` request frame: `(force, tenant_id)` when `tenant_id` is
/// `Some` (≥ 0.3.12), the bare `force` otherwise. `force` removes objects that hold a
/// read lease too (what vLLM's reset asks for); without it they stay. The master
/// removes every object of the tenant, whichever client wrote it.
///
/// # Errors
/// [`CodecError::BodyTooLarge`] for a tenant over 4 GiB (nothing appended).
pub fn encode_remove_all(
    out: &mut Vec<u8>,
    seq_num: u32,
    force: bool,
    tenant_id: Option<&str>,
    literal: TypeLiteral,
) -> Result<(), CodecError> {
    let ty = if tenant_id.is_some() {
        types::REMOVE_ALL_ARGS
    } else {
        types::BOOL
    };
    frame(out, seq_num, FunctionId::REMOVE_ALL, |out| {
        let mut w = PackWriter::begin(out, ty, literal, tenant_id.map_or(0, str::len));
        w.bool(force);
        if let Some(tenant_id) = tenant_id {
            w.str(tenant_id);
        }
    })
}

/// Appends a request frame with any function id and an already encoded `body` (for
/// functions not modelled here, and for probing how a master handles bad calls).
///
/// # Errors
/// [`CodecError::BodyTooLarge`] when `body` exceeds 4 GiB (nothing appended).
pub fn encode_raw(
    out: &mut Vec<u8>,
    seq_num: u32,
    function_id: FunctionId,
    body: &[u8],
) -> Result<(), CodecError> {
    frame(out, seq_num, function_id, |out| out.extend_from_slice(body))
}

/// Smallest encoding of one `expected<bool, ErrorCode>`: has_value byte and bool.
const MIN_EXPECTED_BOOL_BYTES: usize = 2;

fn read_expected_bool(r: &mut PackReader<'_>) -> Result<ExistResult, CodecError> {
    if r.bool()? {
        Ok(Ok(r.bool()?))
    } else {
        Ok(Err(StoreErrorCode(r.i32()?)))
    }
}

/// Decodes the body of a successful (`err_code` 0) `BatchExistKey` reply,
/// `vector<expected<bool, ErrorCode>>`: one answer per key asked, in order.
///
/// # Errors
/// [`CodecError`] for a body of another type, malformed, truncated, or with bytes
/// after the vector.
pub fn decode_batch_exist_key_reply(body: &[u8]) -> Result<Vec<ExistResult>, CodecError> {
    let mut r = PackReader::open(body, Some(types::BATCH_EXIST_REPLY))?;
    let count = r.count(MIN_EXPECTED_BOOL_BYTES)?;
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        out.push(read_expected_bool(&mut r)?);
    }
    r.finish()?;
    Ok(out)
}

/// Decodes the body of a successful `ExistKey` reply, `expected<bool, ErrorCode>`.
///
/// # Errors
/// [`CodecError`] for a body of another type, malformed, truncated or too long.
pub fn decode_exist_key_reply(body: &[u8]) -> Result<ExistResult, CodecError> {
    let mut r = PackReader::open(body, Some(types::EXIST_REPLY))?;
    let out = read_expected_bool(&mut r)?;
    r.finish()?;
    Ok(out)
}

/// Decodes the body of a successful `ServiceReady` reply, `expected<string,
/// ErrorCode>`: the master's version string (`"2.0.0"` from 0.3.13.post1) when ready.
///
/// # Errors
/// [`CodecError`] for a body of another type, malformed, truncated or too long.
pub fn decode_service_ready_reply(
    body: &[u8],
) -> Result<Result<String, StoreErrorCode>, CodecError> {
    let mut r = PackReader::open(body, Some(types::SERVICE_READY_REPLY))?;
    let out = if r.bool()? {
        Ok(r.string_lossy()?)
    } else {
        Err(StoreErrorCode(r.i32()?))
    };
    r.finish()?;
    Ok(out)
}

/// Decodes the body of a successful `RemoveAll` reply, `long`: the number of objects
/// removed (0 also when the master refused the tenant id: the RPC has no error
/// result).
///
/// # Errors
/// [`CodecError`] for a body of another type, malformed, truncated or too long.
pub fn decode_remove_all_reply(body: &[u8]) -> Result<i64, CodecError> {
    let mut r = PackReader::open(body, Some(types::INT64))?;
    let removed = r.i64()?;
    r.finish()?;
    Ok(removed)
}

/// Decodes the body of a reply whose `err_code` is not 0: a struct_pack string
/// message, or for `err_code` 255 a `(u16 code, string)` pair. The pair's type hash
/// is not checked (its literal was never captured).
///
/// # Errors
/// [`CodecError`] for a malformed or truncated body.
pub fn decode_error_reply(err_code: u8, body: &[u8]) -> Result<RpcError, CodecError> {
    if err_code == ERR_EXTENDED {
        let mut r = PackReader::open(body, None)?;
        let code = r.u16()?;
        let message = r.string_lossy()?;
        r.finish()?;
        Ok(RpcError { code, message })
    } else {
        let mut r = PackReader::open(body, Some(types::STRING))?;
        let message = r.string_lossy()?;
        r.finish()?;
        Ok(RpcError {
            code: u16::from(err_code),
            message,
        })
    }
}

// ---------------------------------------------------------------------------------
// Server side: what a master reads and writes (fake masters in tests).
// ---------------------------------------------------------------------------------

/// The arguments of an existence call as a master reads them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExistArgs<T> {
    /// The keys (`BatchExistKey`) or key (`ExistKey`); invalid UTF-8 replaced.
    pub keys: T,
    /// The tenant, `None` for the pre-0.3.12 signature.
    pub tenant_id: Option<String>,
}

/// Reads a `BatchExistKey` request body in either signature (told apart by the type
/// hash): `tuple<vector<string>, string>` or the bare `vector<string>`.
///
/// # Errors
/// [`CodecError::TypeHashMismatch`] for a body of neither type; other [`CodecError`]s
/// for malformed or truncated bodies.
pub fn decode_batch_exist_key_args(body: &[u8]) -> Result<ExistArgs<Vec<String>>, CodecError> {
    let with_tenant = hash_matches(body, types::BATCH_EXIST_ARGS);
    let ty = if with_tenant {
        types::BATCH_EXIST_ARGS
    } else {
        types::BATCH_EXIST_ARGS_LEGACY
    };
    let mut r = PackReader::open(body, Some(ty))?;
    // Every string takes at least its length prefix: one byte or more.
    let count = r.count(1)?;
    let mut keys = Vec::with_capacity(count);
    for _ in 0..count {
        keys.push(r.string_lossy()?);
    }
    let tenant_id = if with_tenant {
        Some(r.string_lossy()?)
    } else {
        None
    };
    r.finish()?;
    Ok(ExistArgs { keys, tenant_id })
}

/// Reads an `ExistKey` request body in either signature: `tuple<string, string>` or
/// the bare `string`.
///
/// # Errors
/// [`CodecError::TypeHashMismatch`] for a body of neither type; other [`CodecError`]s
/// for malformed or truncated bodies.
pub fn decode_exist_key_args(body: &[u8]) -> Result<ExistArgs<String>, CodecError> {
    let with_tenant = hash_matches(body, types::EXIST_ARGS);
    let ty = if with_tenant {
        types::EXIST_ARGS
    } else {
        types::STRING
    };
    let mut r = PackReader::open(body, Some(ty))?;
    let key = r.string_lossy()?;
    let tenant_id = if with_tenant {
        Some(r.string_lossy()?)
    } else {
        None
    };
    r.finish()?;
    Ok(ExistArgs {
        keys: key,
        tenant_id,
    })
}

/// The arguments of a `RemoveAll` call as a master reads them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoveAllArgs {
    /// Remove objects holding a read lease too.
    pub force: bool,
    /// The tenant, `None` for the pre-0.3.12 signature.
    pub tenant_id: Option<String>,
}

/// Reads a `RemoveAll` request body in either signature: `tuple<bool, string>` or the
/// bare `bool`.
///
/// # Errors
/// [`CodecError::TypeHashMismatch`] for a body of neither type; other [`CodecError`]s
/// for malformed or truncated bodies.
pub fn decode_remove_all_args(body: &[u8]) -> Result<RemoveAllArgs, CodecError> {
    let with_tenant = hash_matches(body, types::REMOVE_ALL_ARGS);
    let ty = if with_tenant {
        types::REMOVE_ALL_ARGS
    } else {
        types::BOOL
    };
    let mut r = PackReader::open(body, Some(ty))?;
    let force = r.bool()?;
    let tenant_id = if with_tenant {
        Some(r.string_lossy()?)
    } else {
        None
    };
    r.finish()?;
    Ok(RemoveAllArgs { force, tenant_id })
}

fn hash_matches(body: &[u8], ty: PackType) -> bool {
    body.get(..4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .is_some_and(|b| (u32::from_le_bytes(b) ^ ty.hash) & !1 == 0)
}

/// Appends a reply frame with `err_code` and the body built by `body`.
pub(super) fn reply_frame(
    out: &mut Vec<u8>,
    seq_num: u32,
    err_code: u8,
    body: impl FnOnce(&mut Vec<u8>),
) {
    let start = out.len();
    out.extend_from_slice(&[0; REPLY_HEADER_LEN]);
    body(out);
    // Reply bodies built here are a few bytes per key; a fake master never nears 4 GiB.
    let body_length = u32::try_from(out.len() - start - REPLY_HEADER_LEN).unwrap_or(u32::MAX);
    let header = ReplyHeader {
        err_code,
        msg_type: 0,
        seq_num,
        body_length,
        attach_length: 0,
    };
    out[start..start + REPLY_HEADER_LEN].copy_from_slice(&header.encode());
}

fn write_expected_bool(w: &mut PackWriter<'_>, result: ExistResult) {
    match result {
        Ok(found) => {
            w.bool(true);
            w.bool(found);
        }
        Err(code) => {
            w.bool(false);
            w.i32(code.0);
        }
    }
}

/// Appends a successful `BatchExistKey` reply frame with one answer per key.
pub fn encode_batch_exist_key_reply(
    out: &mut Vec<u8>,
    seq_num: u32,
    results: &[ExistResult],
    literal: TypeLiteral,
) {
    reply_frame(out, seq_num, 0, |out| {
        let mut w = PackWriter::begin(out, types::BATCH_EXIST_REPLY, literal, results.len());
        w.len(results.len());
        for &result in results {
            write_expected_bool(&mut w, result);
        }
    });
}

/// Appends a successful `ExistKey` reply frame.
pub fn encode_exist_key_reply(
    out: &mut Vec<u8>,
    seq_num: u32,
    result: ExistResult,
    literal: TypeLiteral,
) {
    reply_frame(out, seq_num, 0, |out| {
        let mut w = PackWriter::begin(out, types::EXIST_REPLY, literal, 0);
        write_expected_bool(&mut w, result);
    });
}

/// Appends a successful `ServiceReady` reply frame: the version string, or an error.
pub fn encode_service_ready_reply(
    out: &mut Vec<u8>,
    seq_num: u32,
    result: Result<&str, StoreErrorCode>,
    literal: TypeLiteral,
) {
    reply_frame(out, seq_num, 0, |out| {
        let max_len = result.map_or(0, str::len);
        let mut w = PackWriter::begin(out, types::SERVICE_READY_REPLY, literal, max_len);
        match result {
            Ok(version) => {
                w.bool(true);
                w.str(version);
            }
            Err(code) => {
                w.bool(false);
                w.i32(code.0);
            }
        }
    });
}

/// Appends a successful `RemoveAll` reply frame: the number of objects removed.
pub fn encode_remove_all_reply(
    out: &mut Vec<u8>,
    seq_num: u32,
    removed: i64,
    literal: TypeLiteral,
) {
    reply_frame(out, seq_num, 0, |out| {
        let mut w = PackWriter::begin(out, types::INT64, literal, 0);
        w.i64(removed);
    });
}

/// Appends an RPC-level error reply frame as coro_rpc writes it: codes up to 254 in
/// the header with a string body; larger ones as `err_code` 255 with a `(u16 code,
/// string)` body.
pub fn encode_error_reply(
    out: &mut Vec<u8>,
    seq_num: u32,
    code: u16,
    message: &str,
    literal: TypeLiteral,
) {
    match u8::try_from(code) {
        Ok(err_code) if err_code != ERR_EXTENDED => {
            reply_frame(out, seq_num, err_code, |out| {
                let mut w = PackWriter::begin(out, types::STRING, literal, message.len());
                w.str(message);
            });
        }
        _ => reply_frame(out, seq_num, ERR_EXTENDED, |out| {
            let mut w = PackWriter::begin(out, types::ERROR_PAIR, literal, message.len());
            w.u16(code);
            w.str(message);
        }),
    }
}
