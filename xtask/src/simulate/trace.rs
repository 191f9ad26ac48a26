//! Mooncake trace input: one JSON object per line (`timestamp` ms, `input_length`,
//! `output_length`, `hash_ids`), as published in kvcache-ai/Mooncake
//! `FAST25-release/traces/`.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Tokens covered by one trace hash id (the Mooncake traces' block size).
pub const TRACE_BLOCK_TOKENS: u32 = 512;

/// One request of a trace.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
pub struct TraceRequest {
    /// Arrival time, milliseconds from the start of the trace.
    pub timestamp: u64,
    /// Prompt length (tokens), at least 1.
    pub input_length: u32,
    /// Tokens to generate, at least 1 (the first one ends the prefill).
    pub output_length: u32,
    /// One id per 512-token prompt block, chained: equal ids at equal positions are a
    /// reusable prefix. The last id may cover a partial block; at most
    /// `ceil(input_length / 512)` ids.
    pub hash_ids: Vec<u64>,
}

impl TraceRequest {
    /// Number of full 512-token prompt blocks that carry a hash id: the blocks a prefix
    /// cache can hold and the lookup asks about (vLLM hashes full blocks only).
    #[must_use]
    pub fn full_blocks(&self) -> usize {
        (self.input_length / TRACE_BLOCK_TOKENS).min(self.hash_ids.len() as u32) as usize
    }
}

/// Why a trace could not be read. Every variant names the 1-based line.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    /// I/O error reading the file (caller's environment).
    #[error("cannot read trace {path}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The line is not a JSON object with the four fields of the expected types
    /// (bad input).
    #[error("line {line}, column {column}: not a trace record ({why})")]
    Json {
        /// 1-based line number.
        line: usize,
        /// 1-based column where parsing failed (0 when unknown).
        column: usize,
        /// The parser's message.
        why: String,
    },
    /// The record parses but makes no sense (bad input).
    #[error("line {line}: {why}")]
    Invalid {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        why: String,
    },
}

/// Reads a JSONL trace from `path` (see [`parse_jsonl`]).
///
/// # Errors
/// [`TraceError::Io`] when the file cannot be opened or read; the errors of
/// [`parse_jsonl`] otherwise.
pub fn load(path: &Path) -> Result<Vec<TraceRequest>, TraceError> {
    let io = |source| TraceError::Io {
        path: path.display().to_string(),
        source,
    };
    let file = File::open(path).map_err(io)?;
    parse_jsonl(BufReader::new(file)).map_err(|e| match e {
        TraceError::Io { source, .. } => io(source),
        other => other,
    })
}

/// Parses a JSONL trace. Blank lines are skipped; unknown fields are ignored (later
/// trace releases may add some).
///
/// # Errors
/// The first bad line, by 1-based number: [`TraceError::Json`] when it does not parse
/// as a record; [`TraceError::Invalid`] when `input_length` or `output_length` is 0,
/// when there are more `hash_ids` than `ceil(input_length / 512)`, or when
/// `timestamp` is below the previous line's (arrivals must be in order).
/// [`TraceError::Io`] (with an empty path) when the reader fails.
pub fn parse_jsonl<R: BufRead>(reader: R) -> Result<Vec<TraceRequest>, TraceError> {
    let mut out = Vec::new();
    let mut last_timestamp = 0;
    for (i, line) in reader.lines().enumerate() {
        let line_no = i + 1;
        let text = line.map_err(|source| TraceError::Io {
            path: String::new(),
            source,
        })?;
        if text.trim().is_empty() {
            continue;
        }
        let req: TraceRequest = serde_json::from_str(&text).map_err(|e| {
            // serde_json appends its own position within the line: drop it.
            let full = e.to_string();
            let suffix = format!(" at line {} column {}", e.line(), e.column());
            TraceError::Json {
                line: line_no,
                column: e.column(),
                why: full.strip_suffix(&suffix).unwrap_or(&full).to_string(),
            }
        })?;
        let invalid = |why: String| TraceError::Invalid { line: line_no, why };
        if req.input_length == 0 {
            return Err(invalid("input_length is 0".into()));
        }
        if req.output_length == 0 {
            return Err(invalid("output_length is 0".into()));
        }
        let max_ids = req.input_length.div_ceil(TRACE_BLOCK_TOKENS) as usize;
        if req.hash_ids.len() > max_ids {
            return Err(invalid(format!(
                "{} hash_ids for {} input tokens (at most {max_ids} blocks of {TRACE_BLOCK_TOKENS})",
                req.hash_ids.len(),
                req.input_length
            )));
        }
        if req.timestamp < last_timestamp {
            return Err(invalid(format!(
                "timestamp {} is before the previous request's {last_timestamp}",
                req.timestamp
            )));
        }
        last_timestamp = req.timestamp;
        out.push(req);
    }
    Ok(out)
}
