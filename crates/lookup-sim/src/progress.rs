//! Progress on stderr: one bar per stage of a run (the modes and their reruns, each
//! step of the recommendation's search, the sweep), counting the requests simulated
//! with an estimate of the time left, and naming the runs under way (`sync rerun 3`).
//! Nothing is drawn when stderr is not a terminal or with `--quiet`; what goes to
//! stdout is the same either way.

use std::io::IsTerminal as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Whether and where a run's progress is drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Progress {
    shown: bool,
}

impl Progress {
    /// Drawn on stderr unless `quiet` or stderr is not a terminal.
    #[must_use]
    pub fn new(quiet: bool) -> Self {
        Self {
            shown: !quiet && std::io::stderr().is_terminal(),
        }
    }

    /// Never drawn (tests, library callers).
    #[must_use]
    pub const fn hidden() -> Self {
        Self { shown: false }
    }

    /// Whether anything is drawn.
    #[must_use]
    pub const fn shown(&self) -> bool {
        self.shown
    }

    /// A stage of `runs.len()` runs named by `runs` (`sync rerun 3`), each of
    /// `requests` requests: a bar over the `requests * runs.len()` requests simulated.
    #[must_use]
    pub fn stage(&self, name: &str, runs: Vec<String>, requests: u64) -> Stage {
        let total = requests.saturating_mul(runs.len() as u64);
        let bar = if self.shown {
            ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr())
        } else {
            ProgressBar::hidden()
        };
        if let Ok(style) = ProgressStyle::with_template(
            "{prefix} [{bar:20}] {percent:>3}% ({eta} left) {wide_msg}",
        ) {
            bar.set_style(style.progress_chars("=> "));
        }
        bar.set_prefix(name.to_owned());
        let stage = Stage {
            done: runs.iter().map(|_| AtomicU64::new(0)).collect(),
            finished: AtomicUsize::new(0),
            message: Mutex::new(()),
            requests,
            runs,
            bar,
        };
        stage.redraw();
        stage
    }
}

/// One stage's bar ([`Progress::stage`]).
#[derive(Debug)]
pub struct Stage {
    bar: ProgressBar,
    runs: Vec<String>,
    requests: u64,
    done: Vec<AtomicU64>,
    finished: AtomicUsize,
    message: Mutex<()>,
}

impl Stage {
    /// Run `run` finished a request (called from the simulation threads).
    pub fn on_request(&self, run: usize) {
        self.bar.inc(1);
        let Some(done) = self.done.get(run) else {
            return;
        };
        let n = done.fetch_add(1, Ordering::Relaxed) + 1;
        if n == self.requests {
            self.finished.fetch_add(1, Ordering::Relaxed);
        }
        // The message changes only when a run starts or ends.
        if n == 1 || n == self.requests {
            self.redraw();
        }
    }

    fn redraw(&self) {
        if self.bar.is_hidden() {
            return;
        }
        let _one = self.message.lock().unwrap_or_else(|e| e.into_inner());
        let running: Vec<&str> = self
            .runs
            .iter()
            .zip(&self.done)
            .filter(|(_, d)| (1..self.requests).contains(&d.load(Ordering::Relaxed)))
            .map(|(r, _)| r.as_str())
            .collect();
        let mut msg = format!(
            "run {}/{}",
            self.finished.load(Ordering::Relaxed),
            self.runs.len()
        );
        if !running.is_empty() {
            msg.push_str(": ");
            msg.push_str(&running.join(", "));
        }
        self.bar.set_message(msg);
    }

    /// Clears the bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}

impl Drop for Stage {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// Says on stderr (when drawn) what is about to happen, for steps without a bar.
pub fn note(progress: &Progress, text: &str) {
    if progress.shown {
        eprintln!("{text}");
    }
}
