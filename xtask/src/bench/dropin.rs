//! `cargo xtask bench --python`: the Python package's drop-in
//! (`mooncake_lookup.LookupKeyClient`, release wheel) against vLLM 0.33.0's own
//! `LookupKeyClient`, both called from Python in one run against the same
//! `lookup-server`. `scripts/python/bench.sh` builds and installs the wheel and runs
//! `bench/python/drop_in_vs_vllm.py` (its docstring says what each figure times); this
//! module reads its JSON, takes medians over the repetitions and judges the goals:
//! the drop-in's ready poll at least 5 times cheaper than vLLM's client, and its
//! non-blocking submit at most twice the copy of the hashes by CPython in the same
//! loop (p50s; each the median of the per-repetition ratios, a repetition's submit read
//! against the floor measured in that repetition).

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{Context, bail, ensure};
use serde::{Deserialize, Serialize};

use super::stats::{median, min_max, paired_ratio, paired_ratios};

/// The ready poll's goal: vLLM's cost over the drop-in's, at least this.
pub const CALL_GOAL: f64 = 5.0;

/// The submit's goal: the drop-in's cost over the hash-copy floor of the same
/// repetition, at most this.
pub const SUBMIT_FLOOR_GOAL: f64 = 2.0;

/// One client's figures in one repetition (the script's row).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct ClientRow {
    /// Blocking lookups per second, one after the other (N=1).
    pub n1_lookups_per_s: f64,
    /// Lookups per second in batches that arrive together and are all in flight.
    pub prefetch_lookups_per_s: f64,
    /// The first non-blocking call of a request, p50 (ns).
    pub submit_p50_ns: u64,
    /// The first non-blocking call of a request, p99 (ns).
    pub submit_p99_ns: u64,
    /// The non-blocking call that returns the result, p50 (ns).
    pub ready_p50_ns: u64,
    /// The non-blocking call that returns the result, p99 (ns).
    pub ready_p99_ns: u64,
    /// Answers that were not the stored hit.
    pub wrong: u64,
}

/// The floors one repetition measured before its clients, in their loop shape.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize, Serialize)]
pub struct Floors {
    /// The drop-in's cheapest native method, p50 (ns).
    pub floor_native_call_ns: u64,
    /// CPython's `b"".join` of the 64 hashes, p50 (ns): the least a submit spends on
    /// reading them.
    pub floor_hash_copy_ns: u64,
}

/// One repetition: both clients, and the floors measured with them.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct Rep {
    /// vLLM's `LookupKeyClient`.
    pub vllm: ClientRow,
    /// `mooncake_lookup.LookupKeyClient`.
    pub drop_in: ClientRow,
    /// The repetition's floors (absent from the script's older output).
    #[serde(default)]
    pub floors: Option<Floors>,
}

/// The script's output: its settings as it printed them, and every repetition.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
pub struct DropInRun {
    /// Counts, batch, step, timer cost (ns), Python and vLLM versions.
    pub settings: serde_json::Value,
    /// Every repetition, in order.
    pub reps: Vec<Rep>,
}

impl DropInRun {
    /// Reads the script's stdout: its last non-empty line must be the JSON object.
    ///
    /// # Errors
    /// When there is no such line, it is not the expected JSON, it has no repetition,
    /// or any answer was wrong.
    pub fn parse(stdout: &str) -> anyhow::Result<Self> {
        let line = stdout
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .context("the drop-in bench printed nothing")?;
        let run: Self = serde_json::from_str(line)
            .with_context(|| format!("cannot read the drop-in bench's output {line:?}"))?;
        ensure!(!run.reps.is_empty(), "the drop-in bench ran no repetition");
        let wrong: u64 = run
            .reps
            .iter()
            .map(|r| r.vllm.wrong + r.drop_in.wrong)
            .sum();
        ensure!(wrong == 0, "{wrong} lookups answered a wrong hit");
        Ok(run)
    }

    fn column(&self, pick: fn(&ClientRow) -> f64) -> (Vec<f64>, Vec<f64>) {
        let theirs = self.reps.iter().map(|r| pick(&r.vllm)).collect();
        let ours = self.reps.iter().map(|r| pick(&r.drop_in)).collect();
        (theirs, ours)
    }

    /// vLLM's submit p50 over the drop-in's (median of per-repetition ratios).
    #[must_use]
    pub fn submit_ratio(&self) -> Option<f64> {
        let (theirs, ours) = self.column(|c| c.submit_p50_ns as f64);
        paired_ratio(&theirs, &ours)
    }

    /// The drop-in's submit p50 over the hash-copy floor of the same repetition
    /// (median over the repetitions that measured floors; `None` when none did).
    #[must_use]
    pub fn submit_over_copy_floor(&self) -> Option<f64> {
        median(&self.submit_over_copy_floors())
    }

    /// [`submit_over_copy_floor`](Self::submit_over_copy_floor)'s per-repetition
    /// ratios, in repetition order.
    #[must_use]
    pub fn submit_over_copy_floors(&self) -> Vec<f64> {
        let (ours, floors): (Vec<f64>, Vec<f64>) = self
            .reps
            .iter()
            // A repetition with no submit timed (p50 0) or no floor has no ratio.
            .filter(|r| r.drop_in.submit_p50_ns > 0)
            .filter_map(|r| {
                let floor = r.floors?.floor_hash_copy_ns as f64;
                Some((r.drop_in.submit_p50_ns as f64, floor))
            })
            .unzip();
        paired_ratios(&ours, &floors)
    }

    /// vLLM's ready-poll p50 over the drop-in's (median of per-repetition ratios).
    #[must_use]
    pub fn ready_ratio(&self) -> Option<f64> {
        median(&self.ready_ratios())
    }

    /// [`ready_ratio`](Self::ready_ratio)'s per-repetition ratios, in repetition order.
    #[must_use]
    pub fn ready_ratios(&self) -> Vec<f64> {
        let (theirs, ours) = self.column(|c| c.ready_p50_ns as f64);
        paired_ratios(&theirs, &ours)
    }

    /// The table: one line per figure, vLLM's median, the drop-in's, their ratio
    /// (throughput: drop-in over vLLM; call costs: vLLM over drop-in), then the goals.
    #[must_use]
    pub fn table(&self) -> String {
        type Pick = fn(&ClientRow) -> f64;
        let rows: [(&str, Pick, bool, f64); 6] = [
            (
                "lookups/s, N=1 (blocking)",
                |c| c.n1_lookups_per_s,
                true,
                1.0,
            ),
            (
                "lookups/s, prefetch in flight",
                |c| c.prefetch_lookups_per_s,
                true,
                1.0,
            ),
            ("submit p50 (us)", |c| c.submit_p50_ns as f64, false, 1e3),
            ("submit p99 (us)", |c| c.submit_p99_ns as f64, false, 1e3),
            ("ready poll p50 (us)", |c| c.ready_p50_ns as f64, false, 1e3),
            ("ready poll p99 (us)", |c| c.ready_p99_ns as f64, false, 1e3),
        ];
        let mut w = String::new();
        let _ = writeln!(
            w,
            "\nPython: mooncake_lookup.LookupKeyClient (release wheel) vs vLLM 0.33.0's \
             LookupKeyClient, same lookup-server, {} repetitions (medians)\n   settings: {}",
            self.reps.len(),
            self.settings
        );
        let _ = writeln!(
            w,
            "   {:<32} {:>14} {:>14} {:>8}",
            "", "vLLM's client", "drop-in", "ratio*"
        );
        for (name, pick, higher_is_better, unit) in rows {
            let (theirs, ours) = self.column(pick);
            let ratio = if higher_is_better {
                paired_ratio(&ours, &theirs)
            } else {
                paired_ratio(&theirs, &ours)
            };
            let show =
                |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{:.2}", v / unit));
            let _ = writeln!(
                w,
                "   {:<32} {:>14} {:>14} {:>7}",
                name,
                show(median(&theirs)),
                show(median(&ours)),
                ratio.map_or_else(|| "-".into(), |r| format!("{r:.1}x"))
            );
        }
        let _ = writeln!(
            w,
            "   * median over the repetitions of the per-repetition ratio, the drop-in's \
             advantage (throughput: drop-in / vLLM; call times: vLLM / drop-in)\n\nGoals"
        );
        let (ready, submit) = (self.ready_ratios(), self.submit_over_copy_floors());
        for (name, ratios, met) in [
            (
                "ready poll >= 5x cheaper than vLLM's (p50)",
                &ready,
                median(&ready).map(|v| v >= CALL_GOAL),
            ),
            (
                "submit <= 2x the hash copy of its repetition (p50)",
                &submit,
                median(&submit).map(|v| v <= SUBMIT_FLOOR_GOAL),
            ),
        ] {
            let verdict = match met {
                None => "[n/a]",
                Some(true) => "[met]",
                Some(false) => "[not met]",
            };
            // The median of the per-repetition ratios, and their range.
            let value = match (median(ratios), min_max(ratios)) {
                (Some(v), Some((lo, hi))) => format!("{v:.1}x [{lo:.1}-{hi:.1}]"),
                _ => "-".into(),
            };
            let _ = writeln!(w, "   {verdict:<9} {name:<54} {value:>8}");
        }
        if let Some(floors) = self.floors() {
            w.push_str(&floors);
        }
        w
    }

    /// The floors the script measured in the loop shape of the call costs (the
    /// medians over the repetitions, `floor_native_call_ns` and `floor_hash_copy_ns`
    /// in its settings), beside the call costs the goals allow (a ready poll of vLLM's
    /// median p50 over [`CALL_GOAL`], a submit of [`SUBMIT_FLOOR_GOAL`] copy floors),
    /// all in µs with the timer included; `None` when the script printed no floors.
    #[must_use]
    pub fn floors(&self) -> Option<String> {
        let read = |key: &str| self.settings.get(key).and_then(serde_json::Value::as_f64);
        let call = read("floor_native_call_ns")?;
        let copy = read("floor_hash_copy_ns")?;
        let (theirs, _) = self.column(|c| c.ready_p50_ns as f64);
        let ready = median(&theirs).map(|v| v / CALL_GOAL);
        let us = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{:.2}", v / 1e3));
        Some(format!(
            "\nFloors (p50, same loop shape, medians over the repetitions, us): a native \
             call {:.2}, the copy of the hashes by CPython's b\"\".join {:.2}; the goals \
             allow a submit of {} and a ready poll of {}\n",
            call / 1e3,
            copy / 1e3,
            us(Some(copy * SUBMIT_FLOOR_GOAL)),
            us(ready),
        ))
    }
}

/// Runs `scripts/python/bench.sh` under `root` with `reps` repetitions (and a tenth of
/// the counts when `quick`); its progress goes to stderr.
///
/// # Errors
/// When bash or the script cannot start or fails (its message names the missing
/// step), or its output is unreadable or has a wrong answer.
pub fn run(root: &Path, reps: usize, quick: bool) -> anyhow::Result<DropInRun> {
    let script = root.join("scripts/python/bench.sh");
    ensure!(script.is_file(), "{} is missing", script.display());
    let mut cmd = Command::new("bash");
    cmd.arg(&script).args(["--reps", &reps.to_string()]);
    if quick {
        cmd.args(["--count", "300", "--probe-count", "200", "--warmup", "20"]);
    }
    let shown = format!("{cmd:?}");
    let out = cmd
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("cannot start {shown}: is bash installed?"))?;
    if !out.status.success() {
        bail!(
            "{shown} failed ({}); it needs python3 with venv and pip, network access for \
             the first download of vLLM's wheel, and a Rust toolchain for the wheel",
            out.status
        );
    }
    DropInRun::parse(&String::from_utf8_lossy(&out.stdout)).with_context(|| format!("from {shown}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(submit: u64, ready: u64, n1: f64) -> ClientRow {
        ClientRow {
            n1_lookups_per_s: n1,
            prefetch_lookups_per_s: n1 * 2.0,
            submit_p50_ns: submit,
            submit_p99_ns: submit * 3,
            ready_p50_ns: ready,
            ready_p99_ns: ready * 3,
            wrong: 0,
        }
    }

    fn line(reps: &[(ClientRow, ClientRow)]) -> String {
        with_floors(reps, &[])
    }

    /// Repetition i gets `copy_floors[i]` as its hash-copy floor (none past the end).
    fn with_floors(reps: &[(ClientRow, ClientRow)], copy_floors: &[u64]) -> String {
        let reps: Vec<Rep> = reps
            .iter()
            .enumerate()
            .map(|(i, (v, d))| Rep {
                vllm: v.clone(),
                drop_in: d.clone(),
                floors: copy_floors.get(i).map(|&copy| Floors {
                    floor_native_call_ns: 80,
                    floor_hash_copy_ns: copy,
                }),
            })
            .collect();
        serde_json::to_string(&DropInRun {
            settings: serde_json::json!({"reps": reps.len()}),
            reps,
        })
        .unwrap()
    }

    #[test]
    fn ratios_are_medians_of_per_repetition_ratios_and_goals_are_judged() {
        let out = format!(
            "progress\n{}\n",
            line(&[
                (row(8_000, 1_600, 5_000.0), row(1_000, 200, 9_000.0)),
                (row(9_000, 1_500, 5_000.0), row(3_000, 500, 9_000.0)),
                (row(7_000, 2_000, 5_000.0), row(1_000, 250, 9_000.0)),
            ])
        );
        let run = DropInRun::parse(&out).unwrap();
        assert_eq!(run.submit_ratio(), Some(7.0));
        assert_eq!(run.ready_ratio(), Some(8.0));
        assert_eq!(run.submit_over_copy_floor(), None, "no floors measured");
        let table = run.table();
        assert!(table.contains("[met]     ready poll"), "{table}");
        // Per repetition 8, 3 and 8: the median and the range.
        assert_eq!(run.ready_ratios(), vec![8.0, 3.0, 8.0]);
        assert!(table.contains("8.0x [3.0-8.0]"), "{table}");
        assert!(table.contains("[n/a]     submit <= 2x"), "{table}");
        assert!(table.contains("lookups/s, N=1 (blocking)"), "{table}");
        assert!(table.contains("1.8x"), "{table}");
    }

    #[test]
    fn a_wrong_answer_or_no_repetition_is_an_error() {
        let mut bad = row(1, 1, 1.0);
        bad.wrong = 2;
        let err = DropInRun::parse(&line(&[(row(1, 1, 1.0), bad)])).unwrap_err();
        assert_eq!(err.to_string(), "2 lookups answered a wrong hit");
        let err = DropInRun::parse(&line(&[])).unwrap_err();
        assert_eq!(err.to_string(), "the drop-in bench ran no repetition");
        assert!(DropInRun::parse("").is_err());
    }

    #[test]
    fn floors_are_shown_beside_what_the_goals_allow() {
        let reps = [
            (row(2_400, 1_300, 1.0), row(1_600, 500, 1.0)),
            (row(2_600, 1_400, 1.0), row(1_500, 480, 1.0)),
        ];
        let mut run = DropInRun::parse(&line(&reps)).unwrap();
        assert_eq!(run.floors(), None);
        assert!(!run.table().contains("Floors"));
        run.settings = serde_json::json!({"floor_native_call_ns": 77, "floor_hash_copy_ns": 392});
        let floors = run.floors().unwrap();
        assert_eq!(
            floors,
            "\nFloors (p50, same loop shape, medians over the repetitions, us): a native call \
             0.08, the copy of the hashes by CPython's b\"\".join 0.39; the goals allow a \
             submit of 0.78 and a ready poll of 0.27\n"
        );
        assert!(run.table().ends_with(&floors));
    }

    #[test]
    fn each_submit_is_read_against_its_own_repetitions_floor() {
        // Submits 1,000 / 1,800 / 900 ns against floors 600 / 800 / 400: 1.67, 2.25 and
        // 2.25 floors; the median 2.25 is above the goal although the submits' median
        // (1,000) is below twice the floors' median (600).
        let reps = [
            (row(4_000, 1_000, 1.0), row(1_000, 100, 1.0)),
            (row(4_000, 1_000, 1.0), row(1_800, 300, 1.0)),
            (row(4_000, 1_000, 1.0), row(900, 250, 1.0)),
        ];
        let run = DropInRun::parse(&with_floors(&reps, &[600, 800, 400])).unwrap();
        assert_eq!(run.submit_over_copy_floor(), Some(2.25));
        assert_eq!(run.ready_ratio(), Some(4.0));
        let table = run.table();
        assert!(table.contains("4.0x [3.3-10.0]"), "{table}");
        assert!(table.contains("[not met] submit <= 2x"), "{table}");
        assert!(table.contains("[not met] ready poll"), "{table}");
        // A repetition without floors is left out, not read against another's.
        let run = DropInRun::parse(&with_floors(&reps, &[600, 500])).unwrap();
        assert_eq!(
            run.submit_over_copy_floor(),
            Some((1_000.0 / 600.0 + 1_800.0 / 500.0) / 2.0)
        );
        let run = DropInRun::parse(&with_floors(&reps[..1], &[500])).unwrap();
        assert_eq!(run.submit_over_copy_floor(), Some(2.0));
        assert!(
            run.table().contains("[met]     submit <= 2x"),
            "{}",
            run.table()
        );
        // No submit timed (the script's p50 of nothing is 0): no ratio, not a met goal.
        let none = [(row(4_000, 1_000, 1.0), row(0, 100, 1.0))];
        let run = DropInRun::parse(&with_floors(&none, &[500])).unwrap();
        assert_eq!(run.submit_over_copy_floor(), None);
        assert!(
            run.table().contains("[n/a]     submit <= 2x"),
            "{}",
            run.table()
        );
    }
}
