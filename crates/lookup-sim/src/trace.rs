//! Mooncake trace input: one JSON object per line (`timestamp` ms, `input_length`,
//! `output_length`, `hash_ids`), as published in kvcache-ai/Mooncake
//! `FAST25-release/traces/`. Owns reading and checking the records and where a run's
//! requests come from ([`TraceSource`]: a file, memory, or the embedded generator);
//! the record itself is [`crate::request`]'s.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use crate::request::{TRACE_BLOCK_TOKENS, TraceRequest};

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

/// Reads a JSONL trace from `path` into memory (see [`parse_jsonl`]). Runs stream
/// it instead ([`TraceSource::open`]).
///
/// # Errors
/// [`TraceError::Io`] when the file cannot be opened or read; the errors of
/// [`parse_jsonl`] otherwise.
pub fn load(path: &Path) -> Result<Vec<TraceRequest>, TraceError> {
    open_file(path)?.collect()
}

fn open_file(path: &Path) -> Result<Records<BufReader<File>>, TraceError> {
    let file = File::open(path).map_err(|source| TraceError::Io {
        path: path.display().to_string(),
        source,
    })?;
    Ok(Records::new(
        BufReader::new(file),
        path.display().to_string(),
    ))
}

/// Parses a JSONL trace (see [`Records`]).
///
/// # Errors
/// The first bad line, as [`Records`] reports it.
pub fn parse_jsonl<R: BufRead>(reader: R) -> Result<Vec<TraceRequest>, TraceError> {
    Records::new(reader, String::new()).collect()
}

/// The records of a JSONL trace, one line at a time: what a run holds of a trace is
/// the line being read. Blank lines are skipped; unknown fields are ignored (later
/// trace releases may add some). After the first error the iterator ends.
///
/// Errors, by 1-based line number: [`TraceError::Json`] when a line does not parse as
/// a record; [`TraceError::Invalid`] when `input_length` or `output_length` is 0,
/// when there are more `hash_ids` than `ceil(input_length / 512)`, or when
/// `timestamp` is below the previous line's (arrivals must be in order).
/// [`TraceError::Io`] when the reader fails.
#[derive(Debug)]
pub struct Records<R> {
    reader: R,
    path: String,
    line: String,
    line_no: usize,
    last_timestamp: u64,
    failed: bool,
}

impl<R: BufRead> Records<R> {
    /// Records of `reader`; `path` names it in I/O errors (may be empty).
    pub fn new(reader: R, path: String) -> Self {
        Self {
            reader,
            path,
            line: String::new(),
            line_no: 0,
            last_timestamp: 0,
            failed: false,
        }
    }

    fn parse(&mut self) -> Result<TraceRequest, TraceError> {
        let line_no = self.line_no;
        let text = self.line.strip_suffix('\n').unwrap_or(&self.line);
        let text = text.strip_suffix('\r').unwrap_or(text);
        let req: TraceRequest = serde_json::from_str(text).map_err(|e| {
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
        if req.timestamp < self.last_timestamp {
            return Err(invalid(format!(
                "timestamp {} is before the previous request's {}",
                req.timestamp, self.last_timestamp
            )));
        }
        self.last_timestamp = req.timestamp;
        Ok(req)
    }
}

impl<R: BufRead> Iterator for Records<R> {
    type Item = Result<TraceRequest, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        loop {
            self.line.clear();
            self.line_no += 1;
            match self.reader.read_line(&mut self.line) {
                Ok(0) => return None,
                Ok(_) if self.line.trim().is_empty() => {}
                Ok(_) => {
                    let out = self.parse();
                    self.failed = out.is_err();
                    return Some(out);
                }
                Err(source) => {
                    self.failed = true;
                    return Some(Err(TraceError::Io {
                        path: self.path.clone(),
                        source,
                    }));
                }
            }
        }
    }
}

/// A trace's requests, one at a time.
pub type TraceIter = Box<dyn Iterator<Item = Result<TraceRequest, TraceError>> + Send>;

/// Where a run's requests come from. Every run opens its own pass
/// ([`open`](Self::open)), so runs on other threads never share a reader, and a
/// file or generated trace is never held whole in memory.
#[derive(Clone, Debug)]
pub enum TraceSource {
    /// A Mooncake-format JSONL file, streamed.
    File(PathBuf),
    /// The embedded generator ([`generator::Generator`](super::generator::Generator)),
    /// shaped like the conversation trace.
    Generated {
        /// Its seed.
        seed: u64,
        /// Requests generated.
        requests: usize,
    },
    /// Requests already in memory (tests, small slices).
    Memory(Arc<[TraceRequest]>),
}

impl TraceSource {
    /// A fresh pass over the requests, the first `limit` only when given.
    ///
    /// # Errors
    /// [`TraceError::Io`] when the file cannot be opened; the records' own errors come
    /// from the iterator, naming their line.
    pub fn open(&self, limit: Option<usize>) -> Result<TraceIter, TraceError> {
        let iter: TraceIter = match self {
            Self::File(path) => Box::new(open_file(path)?),
            Self::Generated { seed, requests } => {
                Box::new(super::generator::Generator::new(*seed, *requests).map(Ok))
            }
            Self::Memory(reqs) => {
                let reqs = Arc::clone(reqs);
                Box::new((0..reqs.len()).map(move |i| Ok(reqs[i].clone())))
            }
        };
        Ok(match limit {
            Some(n) => Box::new(iter.take(n)),
            None => iter,
        })
    }

    /// How the source is named in reports.
    #[must_use]
    pub fn describe(&self) -> String {
        match self {
            Self::File(path) => path.display().to_string(),
            Self::Generated { seed, requests } => {
                format!("generated (conversation-trace shape, seed {seed}, {requests} requests)")
            }
            Self::Memory(reqs) => format!("{} requests in memory", reqs.len()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::*;

    fn req(
        timestamp: u64,
        input_length: u32,
        output_length: u32,
        hash_ids: &[u64],
    ) -> TraceRequest {
        TraceRequest {
            timestamp,
            input_length,
            output_length,
            hash_ids: hash_ids.to_vec(),
        }
    }

    #[test]
    fn parser_reads_good_lines_skips_blank_ones_and_ignores_unknown_fields() {
        let text = concat!(
            "{\"timestamp\": 0, \"input_length\": 6758, \"output_length\": 500, \"hash_ids\": [0, 1]}\n",
            "\n",
            "{\"timestamp\": 3000, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [0, 2], \"extra\": 7}\n",
            "{\"timestamp\": 3000, \"input_length\": 1, \"output_length\": 2, \"hash_ids\": []}\n",
        );
        let got = parse_jsonl(Cursor::new(text)).unwrap();
        assert_eq!(
            got,
            vec![
                req(0, 6758, 500, &[0, 1]),
                req(3000, 600, 1, &[0, 2]),
                req(3000, 1, 2, &[]),
            ]
        );
        // Only full 512-token blocks are cacheable: 6758 tokens have 13, but 2 ids.
        assert_eq!(got[0].full_blocks(), 2);
        assert_eq!(got[1].full_blocks(), 1);
        assert_eq!(got[2].full_blocks(), 0);
    }

    fn bad(text: &str) -> (usize, String) {
        match parse_jsonl(Cursor::new(text)).unwrap_err() {
            TraceError::Json { line, why, .. } | TraceError::Invalid { line, why } => (line, why),
            other => panic!("unexpected error {other}"),
        }
    }

    #[test]
    fn parser_names_the_bad_line() {
        let good = "{\"timestamp\": 5, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [0, 2]}\n";
        // Not JSON at all, on line 3 (after a good line and a blank one).
        let (line, why) = bad(&format!("{good}\nnot json\n"));
        assert_eq!((line, why.as_str()), (3, "expected ident"));
        // A truncated record: the error names the line and the column.
        let err = parse_jsonl(Cursor::new(format!(
            "{good}{{\"timestamp\": 1, \"input_length\": 600\n"
        )))
        .unwrap_err()
        .to_string();
        assert_eq!(
            err,
            "line 2, column 36: not a trace record (EOF while parsing an object)"
        );
        // A missing field.
        let (line, why) = bad(&format!(
            "{good}{{\"timestamp\": 5, \"input_length\": 600, \"hash_ids\": []}}\n"
        ));
        assert_eq!(line, 2);
        assert!(why.contains("output_length"), "{why}");
        // A field of the wrong type.
        let (line, _) = bad(
            "{\"timestamp\": -1, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": []}",
        );
        assert_eq!(line, 1);
        // Nonsense values.
        let (line, why) = bad(&format!(
            "{good}{good}{{\"timestamp\": 9, \"input_length\": 0, \"output_length\": 1, \"hash_ids\": []}}\n"
        ));
        assert_eq!((line, why.as_str()), (3, "input_length is 0"));
        let (line, why) =
            bad("{\"timestamp\": 9, \"input_length\": 5, \"output_length\": 0, \"hash_ids\": []}");
        assert_eq!((line, why.as_str()), (1, "output_length is 0"));
        let (line, why) = bad(
            "{\"timestamp\": 9, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": [1, 2, 3]}",
        );
        assert_eq!(
            (line, why.as_str()),
            (
                1,
                "3 hash_ids for 600 input tokens (at most 2 blocks of 512)"
            )
        );
        let (line, why) = bad(&format!(
            "{good}{{\"timestamp\": 4, \"input_length\": 600, \"output_length\": 1, \"hash_ids\": []}}\n"
        ));
        assert_eq!(
            (line, why.as_str()),
            (2, "timestamp 4 is before the previous request's 5")
        );
    }
}
