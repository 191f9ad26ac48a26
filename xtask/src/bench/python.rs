//! The Python design of vLLM's async lookup (`bench/python/vllm_async_lookup.py`):
//! running it and reading the one JSON line it prints.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail, ensure};
use serde::Deserialize;

use super::ours::ProbeCosts;
use super::payload::Payload;
use super::stats::CallCost;

/// One run of the Python script, as it prints it (see the script's docstring).
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct PythonRun {
    /// `batch` (throughput) or `probe` (caller cost).
    pub mode: String,
    /// Lookups measured.
    pub count: u64,
    /// Wall-clock time of the measured lookups (seconds).
    pub elapsed_s: f64,
    /// `count / elapsed_s`.
    pub lookups_per_s: f64,
    /// Answers that differed from the expected hit tokens.
    pub wrong: u64,
    /// Median time of an empty timed region (ns), included in every call time.
    pub timer_ns: u64,
    /// Probe mode: call costs by kind (`submit`, `pending`, `ready`, `all`); empty in
    /// batch mode.
    #[serde(default)]
    pub calls: BTreeMap<String, CallCost>,
}

impl PythonRun {
    /// Reads the script's stdout: its last non-empty line must be the JSON object.
    ///
    /// # Errors
    /// When there is no such line, it is not the expected JSON, the throughput is not
    /// a positive number, or any answer was wrong.
    pub fn parse(stdout: &str) -> anyhow::Result<Self> {
        let line = stdout
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .context("the Python script printed nothing")?;
        let run: Self = serde_json::from_str(line)
            .with_context(|| format!("cannot read the Python script's output {line:?}"))?;
        ensure!(
            run.lookups_per_s.is_finite() && run.lookups_per_s > 0.0,
            "the Python script reported {} lookups per second",
            run.lookups_per_s
        );
        ensure!(
            run.wrong == 0,
            "{} of {} Python lookups answered a wrong hit",
            run.wrong,
            run.count
        );
        Ok(run)
    }

    /// The call costs in the shape of ours (`cached` stays empty: the Python design
    /// consumes a result at its first read).
    #[must_use]
    pub fn probe_costs(&self) -> ProbeCosts {
        let get = |kind: &str| self.calls.get(kind).copied().filter(|c| c.n > 0);
        ProbeCosts {
            submit: get("submit"),
            pending: get("pending"),
            ready: get("ready"),
            cached: None,
            all: get("all"),
            timer_ns: self.timer_ns,
        }
    }
}

/// The Python interpreter and the script.
#[derive(Clone, Debug)]
pub(crate) struct Python {
    pub(crate) interpreter: PathBuf,
    pub(crate) script: PathBuf,
}

/// A run of the script: its mode and counts.
pub(crate) enum PythonMode {
    /// `--mode batch --batch B`.
    Batch { batch: usize },
    /// `--mode probe --arrivals-per-step A --step-us S`.
    Probe {
        arrivals_per_step: usize,
        step_us: u64,
    },
}

impl Python {
    /// Checks that the interpreter starts and has pyzmq; returns pyzmq's version.
    ///
    /// # Errors
    /// With what to install when the interpreter or pyzmq is missing, or the script is
    /// not found.
    pub(crate) fn check(&self) -> anyhow::Result<String> {
        let python = self.interpreter.display();
        ensure!(
            self.script.is_file(),
            "the Python design {} is missing",
            self.script.display()
        );
        let out = Command::new(&self.interpreter)
            .args(["-c", "import zmq; print(zmq.__version__)"])
            .output()
            .with_context(|| {
                format!("cannot start {python}: install Python 3, pass --python-bin PATH, or pass --no-python to skip the Python rows")
            })?;
        if !out.status.success() {
            bail!(
                "pyzmq is not installed for {python} (`import zmq` failed: {}): install it with \
                 `{python} -m pip install pyzmq==27.3.0` (`cargo xtask test` installs it too), \
                 or pass --no-python to skip the Python rows",
                String::from_utf8_lossy(&out.stderr)
                    .trim()
                    .lines()
                    .last()
                    .unwrap_or("")
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    /// Runs the script against `url` with `payload`: `warmup` lookups unmeasured, then
    /// `count`.
    ///
    /// # Errors
    /// When the script cannot start, fails, or prints something unreadable or wrong.
    pub(crate) fn run(
        &self,
        url: &str,
        payload: &Payload,
        mode: &PythonMode,
        warmup: usize,
        count: usize,
    ) -> anyhow::Result<PythonRun> {
        let mut cmd = Command::new(&self.interpreter);
        cmd.arg(&self.script)
            .args(["--endpoint", url])
            .args(["--count", &count.to_string()])
            .args(["--warmup", &warmup.to_string()])
            .args(["--hashes", &payload.block_hashes.len().to_string()])
            .args(["--hash-len", &payload.block_hashes.hash_len().to_string()])
            .args(["--block-size", &payload.block_size.to_string()])
            .args(["--expect-hit", &payload.hit_tokens.to_string()]);
        match mode {
            PythonMode::Batch { batch } => {
                cmd.args(["--mode", "batch", "--batch", &batch.to_string()]);
            }
            PythonMode::Probe {
                arrivals_per_step,
                step_us,
            } => {
                cmd.args(["--mode", "probe"])
                    .args(["--arrivals-per-step", &arrivals_per_step.to_string()])
                    .args(["--step-us", &step_us.to_string()]);
            }
        }
        let shown = format!("{cmd:?}");
        let out = cmd
            .output()
            .with_context(|| format!("cannot start {shown}"))?;
        if !out.status.success() {
            bail!(
                "{shown} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        PythonRun::parse(&String::from_utf8_lossy(&out.stdout))
            .with_context(|| format!("from {shown}"))
    }
}

/// `bench/python/vllm_async_lookup.py` in the workspace `root`.
pub(crate) fn script_path(root: &Path) -> PathBuf {
    root.join("bench/python/vllm_async_lookup.py")
}
