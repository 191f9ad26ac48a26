//! What a run writes besides its stdout report: the header and plot titles, the
//! `--requests-out` lines, the `--timeseries` samples, the `--json` document, and
//! where the plots go by default.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, bail};
use serde::Serialize;

use crate::engine::{ModeResult, RequestRecord, Sample, SimParams};
use crate::mode::Mode;
use crate::sweep;

/// The workspace's `target/simulate/ttft_cdf.png` (this crate sits at
/// `crates/lookup-sim`).
pub(crate) fn default_plot_path() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest
        .ancestors()
        .nth(2)
        .unwrap_or(manifest)
        .join("target/simulate/ttft_cdf.png")
}

/// `path` with `suffix` before its extension (`a/b.png` + `_sweep` = `a/b_sweep.png`).
pub(crate) fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let stem = path
        .file_stem()
        .map_or_else(String::new, |s| s.to_string_lossy().into_owned());
    let ext = path
        .extension()
        .map_or_else(String::new, |e| format!(".{}", e.to_string_lossy()));
    path.with_file_name(format!("{stem}{suffix}{ext}"))
}

/// One line of `--requests-out`.
#[derive(Serialize)]
struct RequestLine<'a> {
    mode: Mode,
    #[serde(flatten)]
    record: &'a RequestRecord,
}

/// The `--requests-out` file, written from the simulation threads.
pub(crate) struct RequestsOut {
    path: PathBuf,
    out: Mutex<std::io::BufWriter<std::fs::File>>,
    failed: AtomicBool,
}

impl RequestsOut {
    /// Creates `path`.
    pub(crate) fn create(path: &Path) -> anyhow::Result<Self> {
        let file =
            std::fs::File::create(path).with_context(|| format!("writing {}", path.display()))?;
        Ok(Self {
            path: path.to_owned(),
            out: Mutex::new(std::io::BufWriter::new(file)),
            failed: AtomicBool::new(false),
        })
    }

    /// Writes one finished request of `mode`.
    pub(crate) fn write(&self, mode: Mode, record: &RequestRecord) {
        let line = RequestLine { mode, record };
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        if serde_json::to_writer(&mut *out, &line).is_err() || out.write_all(b"\n").is_err() {
            self.failed.store(true, Ordering::Relaxed);
        }
    }

    /// Flushes the file.
    pub(crate) fn finish(self) -> anyhow::Result<()> {
        let mut out = self.out.into_inner().unwrap_or_else(|e| e.into_inner());
        if self.failed.load(Ordering::Relaxed) || out.flush().is_err() {
            bail!("writing {}", self.path.display());
        }
        Ok(())
    }
}

/// The run's header: trace, engines, server model, lookup settings.
pub(crate) fn header(source: &str, requests: u64, p: &SimParams, calibration: &str) -> String {
    let s = &p.server;
    format!(
        "trace: {source}, {requests} requests, rate scale {}\n\
         {} engines ({:?}): budget {} tokens, {} seqs, {} GPU KV blocks of 16 tokens each; store {} blocks of 512; arrivals {:?}\n\
         lookup server ({calibration}): {:.3} ms + {:.1} µs/call + {:.2} µs/present key + {:.2} µs/absent key, \
         jitter {:.3} ms, concurrency {}; keys: block size {}, {} namespace(s), {}\n\
         lookups: prefetch limit {}, TTL {} s, timeout {} s, wait budget {}, on preemption {} (wait {} s)",
        p.rate_scale,
        p.engine.engines,
        p.engine.router,
        p.engine.max_num_batched_tokens,
        p.engine.max_num_seqs,
        p.engine.gpu_kv_blocks,
        p.store.capacity_blocks,
        p.engine.arrivals,
        s.fixed_s * 1e3,
        s.per_call_s * 1e6,
        s.present_key_s * 1e6,
        s.absent_key_s * 1e6,
        s.jitter_s * 1e3,
        s.concurrency,
        s.block_size,
        s.namespaces,
        if s.chunk_keys == 0 {
            "one store call per lookup".to_owned()
        } else {
            format!("calls of {} keys with early stop", s.chunk_keys)
        },
        p.lookup.prefetch_limit,
        p.lookup.prefetch_ttl_s,
        p.lookup.timeout_s,
        p.lookup.wait_budget,
        p.lookup.on_preemption,
        p.lookup.preempted_wait_s,
    )
}

/// The short form of the settings, for plot titles (a trace file by its name).
pub(crate) fn title(source: &str, p: &SimParams) -> String {
    let s = &p.server;
    let source = source.rsplit('/').next().unwrap_or(source);
    format!(
        "{source}: {} engines, rate x{}, server {:.2} ms + {:.2}/{:.2} us per key, block size {} x {} namespace(s), concurrency {}; prefetch {} TTL {} s, wait {}",
        p.engine.engines,
        p.rate_scale,
        s.fixed_s * 1e3 + s.per_call_s * 1e3,
        s.present_key_s * 1e6,
        s.absent_key_s * 1e6,
        s.block_size,
        s.namespaces,
        s.concurrency,
        p.lookup.prefetch_limit,
        p.lookup.prefetch_ttl_s,
        sweep::budget_label(&p.lookup.wait_budget),
    )
}

/// Makes the folder of an output file (`--json`, `--timeseries`, `--write-trace`)
/// before the run, as `--plot`'s is made, so that a run is not lost to a missing
/// folder after it has taken its minutes.
///
/// # Errors
/// The folder cannot be made (a file in the way, no permission), named.
pub(crate) fn prepare_output(path: &Path) -> anyhow::Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() && !dir.is_dir() => std::fs::create_dir_all(dir)
            .with_context(|| format!("creating {} for {}", dir.display(), path.display())),
        _ => Ok(()),
    }
}

/// `--timeseries`: every engine's samples of each mode's first run, one JSON line each.
pub(crate) fn write_timeseries(path: &Path, results: &[ModeResult]) -> anyhow::Result<()> {
    #[derive(Serialize)]
    struct Line<'a> {
        mode: Mode,
        #[serde(flatten)]
        sample: &'a Sample,
    }
    let file =
        std::fs::File::create(path).with_context(|| format!("writing {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    for r in results {
        for sample in &r.timeseries {
            serde_json::to_writer(
                &mut out,
                &Line {
                    mode: r.mode,
                    sample,
                },
            )
            .context("encoding a sample")?;
            out.write_all(b"\n")
                .with_context(|| format!("writing {}", path.display()))?;
        }
    }
    out.flush()
        .with_context(|| format!("writing {}", path.display()))
}

/// `--json`: `doc`, pretty-printed, and a line on `out` saying where.
pub(crate) fn write_json(
    path: &Path,
    doc: &impl Serialize,
    out: &mut dyn std::io::Write,
) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(doc).context("encoding JSON")?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    writeln!(out, "JSON: {}", path.display())?;
    Ok(())
}
