//! What every step of a run shares, from the flags ([`Setup`]): the settings, the
//! calibration's name, the modes, the trace and how many requests it gives, and where
//! progress goes.

use std::io::Write as _;

use anyhow::{Context, bail};

use crate::args::Args;
use crate::engine::SimParams;
use crate::mode::Mode;
use crate::progress::Progress;
use crate::trace::TraceSource;

/// A run's shared inputs.
pub(crate) struct Setup {
    pub(crate) params: SimParams,
    /// The calibration the server model came from (profile, date, machine).
    pub(crate) cal_name: String,
    /// The modes, duplicates in a row dropped.
    pub(crate) modes: Vec<Mode>,
    pub(crate) source: TraceSource,
    pub(crate) limit: Option<usize>,
    /// The source, with the limit.
    pub(crate) described: String,
    /// Requests each run replays.
    pub(crate) requests: u64,
    pub(crate) progress: Progress,
}

impl Setup {
    /// Checks the flags and counts the trace's requests.
    pub(crate) fn of(args: &Args) -> anyhow::Result<Self> {
        let params = args.params()?;
        let calibration = args.calibration()?;
        let profile = calibration.profile(args.server_profile.as_deref())?;
        let cal_name = format!(
            "{}, calibrated {} on {}",
            profile.name, calibration.date, calibration.machine
        );
        let mut modes = args.modes.clone();
        modes.dedup();
        if args.limit == Some(0) {
            bail!("--limit 0 leaves no request to replay");
        }
        if args.repeats == 0 {
            bail!("--repeats must be at least 1");
        }
        let source = args.source();
        let limit = args.limit;
        let described = match limit {
            Some(n) => format!("{} (first {n})", source.describe()),
            None => source.describe(),
        };
        let requests = match &source {
            TraceSource::Generated { requests, .. } => *requests,
            TraceSource::Memory(reqs) => reqs.len(),
            // A malformed line is reported by the run that reads it.
            TraceSource::File(_) => source.open(limit)?.count(),
        };
        let requests = limit.map_or(requests, |l| l.min(requests)) as u64;
        Ok(Self {
            params,
            cal_name,
            modes,
            source,
            limit,
            described,
            requests,
            progress: Progress::new(args.quiet),
        })
    }

    /// `--write-trace`: the requests replayed, as JSON lines.
    pub(crate) fn write_trace(&self, path: &std::path::Path) -> anyhow::Result<()> {
        let file =
            std::fs::File::create(path).with_context(|| format!("writing {}", path.display()))?;
        let mut out = std::io::BufWriter::new(file);
        for r in self.source.open(self.limit)? {
            serde_json::to_writer(&mut out, &r?).context("encoding a request")?;
            out.write_all(b"\n")
                .with_context(|| format!("writing {}", path.display()))?;
        }
        out.flush()
            .with_context(|| format!("writing {}", path.display()))
    }
}
