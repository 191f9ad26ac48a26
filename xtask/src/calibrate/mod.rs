//! `cargo xtask calibrate`: measures on this machine what a lookup costs through each
//! server a deployment can run, and writes the calibration file that `cargo xtask
//! simulate --calibration FILE` reads (`crates/lookup-sim/calibration.json` is the built-in one).
//!
//! One real `mooncake_master` (from `scripts/mooncake/install.sh`'s `.venv`) on free
//! loopback ports, with the Python store client (`mooncake_peers::writer_script`) holding
//! the keys of 262,144 blocks (keys disappear when the client that put them closes).
//! Every timed lookup asks keys no lookup just asked: a window over the stored blocks
//! that moves with each lookup, or absent blocks never asked before.
//! Then, for lookups of several sizes, all keys present or all absent, `--samples`
//! timed lookups each (after a warm-up), one at a time:
//!
//! - `master`: the master's `BatchExistKey`, asked by this project's `MasterClient`
//!   in one call (no lookup server in front: the direct transport);
//! - `lookup-server-memory`: our `LookupServer` with its in-memory index, over ipc,
//!   asked by our `LookupClient` (sync probe);
//! - `lookup-server-mooncake`: our `LookupServer` with the Mooncake index (calls of
//!   1,024 keys, early stop), the same way;
//! - `vllm-python`: `scripts/mooncake/vllm_lookup_server.py`, a pyzmq REP server that
//!   builds every key in Python and asks `batch_is_exist` once, as vLLM's worker does.
//!
//! The samples of a point are taken in rounds interleaved with the other points', so a
//! burst of load elsewhere on the machine spreads over every point instead of
//! skewing one. Each profile's median times are fitted (least squares on relative
//! errors, costs >= 0) to `fixed + calls × per_call + present × present_key + absent
//! × absent_key`; the jitter is the p90 − p50 spread of the smallest lookup.

mod fit;
mod measure;

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};

use crate::replay::peers;
use crate::simulate::calibration::{Calibration, Point, Profile};

pub use self::fit::nonnegative_least_squares;

/// Flags of `cargo xtask calibrate`.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Where to write the calibration. Default: `target/calibration.json` in the
    /// workspace (copy it over `crates/lookup-sim/calibration.json` to make it the default).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// Timed lookups per size and presence.
    #[arg(long, default_value_t = 200)]
    pub samples: usize,
    /// Lookup sizes (keys; vLLM blocks of 16 tokens, one namespace), comma-separated,
    /// at most 262,144.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "16,64,256,1024,2048,4096"
    )]
    pub keys: Vec<u32>,
    /// The `mooncake_master` to start. Default: `$MOONCAKE_MASTER_BIN`, else
    /// `.venv/bin/mooncake_master` (from `scripts/mooncake/install.sh`).
    #[arg(long, value_name = "PATH")]
    pub master_bin: Option<PathBuf>,
    /// The Python with the `mooncake` package and pyzmq. Default: `$MOONCAKE_PYTHON`,
    /// else `.venv/bin/python`.
    #[arg(long, value_name = "PATH")]
    pub python: Option<PathBuf>,
}

/// Blocks whose keys are stored (present lookups ask a prefix of them).
pub const STORED_BLOCKS: u32 = 1 << 18;

/// One measured profile before the fit: its points (keys, present, calls, times µs).
#[derive(Debug)]
pub struct Measured {
    /// Its name.
    pub name: &'static str,
    /// What was measured.
    pub what: &'static str,
    /// Keys per store call of the server (0: one call).
    pub chunk_keys: u32,
    /// Whether a store call is part of each lookup besides the fixed cost (false: the
    /// intercept is the fixed cost; true for `master`: the intercept is the call).
    pub intercept_is_call: bool,
    /// Whether the calls vary (chunked): then they are a feature of their own.
    pub fit_calls: bool,
    /// The cost of a store call (µs) when measured elsewhere (the `master` profile's):
    /// taken off each point, and the rest fitted.
    pub known_per_call: Option<f64>,
    /// (keys, present, calls, sorted times in µs).
    pub points: Vec<(u32, bool, u32, Vec<f64>)>,
}

fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// Fits a measured profile.
///
/// # Errors
/// Too few distinct points to fit.
pub fn fit(m: &Measured) -> anyhow::Result<Profile> {
    let row = |&(keys, present, calls, _): &(u32, bool, u32, Vec<f64>)| {
        let (p, a) = if present {
            (f64::from(keys), 0.0)
        } else {
            (0.0, f64::from(keys))
        };
        let mut r = vec![1.0];
        if m.fit_calls {
            r.push(f64::from(calls));
        }
        r.extend([p, a]);
        r
    };
    let rows: Vec<Vec<f64>> = m.points.iter().map(row).collect();
    let known = m.known_per_call.unwrap_or(0.0);
    let y: Vec<f64> = m
        .points
        .iter()
        .map(|p| (quantile(&p.3, 0.5) - f64::from(p.2) * known).max(1e-3))
        .collect();
    // Relative errors: a 20 µs lookup weighs as much as a 20 ms one.
    let scaled: Vec<Vec<f64>> = rows
        .iter()
        .zip(&y)
        .map(|(r, &yi)| r.iter().map(|v| v / yi.max(1e-9)).collect())
        .collect();
    let ones = vec![1.0; y.len()];
    let Some(x) = nonnegative_least_squares(&scaled, &ones) else {
        bail!("{}: too few distinct lookup sizes to fit", m.name);
    };
    let (fixed, per_call, present, absent) = match (m.fit_calls, m.intercept_is_call) {
        (true, _) => (x[0], x[1], x[2], x[3]),
        (false, true) => (0.0, x[0], x[1], x[2]),
        (false, false) => (x[0], known, x[1], x[2]),
    };
    let smallest = m
        .points
        .iter()
        .min_by_key(|p| p.0)
        .context("no points measured")?;
    let points = m
        .points
        .iter()
        .zip(&rows)
        .map(|(p, r)| Point {
            keys: p.0,
            present: p.1,
            calls: p.2,
            samples: p.3.len() as u32,
            p50_us: quantile(&p.3, 0.5),
            p90_us: quantile(&p.3, 0.9),
            fitted_us: r.iter().zip(&x).map(|(a, b)| a * b).sum::<f64>() + f64::from(p.2) * known,
        })
        .collect();
    Ok(Profile {
        name: m.name.to_owned(),
        what: m.what.to_owned(),
        fixed_us: fixed,
        per_call_us: per_call,
        present_key_us: present,
        absent_key_us: absent,
        chunk_keys: m.chunk_keys,
        jitter_us: (quantile(&smallest.3, 0.9) - quantile(&smallest.3, 0.5)).max(0.0),
        points,
    })
}

/// "YYYY-MM-DD HH:MM" (UTC) of `secs` since the epoch (the civil-from-days algorithm).
#[must_use]
pub fn utc_date(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let (h, m) = ((secs % 86_400) / 3_600, (secs % 3_600) / 60);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!("{y:04}-{mo:02}-{d:02} {h:02}:{m:02}")
}

/// CPU model, cores and kernel of this machine.
fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZeroUsize::get);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map_or_else(|_| "?".to_owned(), |k| k.trim().to_owned());
    format!("{cpu}, {cores} cores, Linux {kernel}")
}

/// The profiles as a table: the fitted costs, and each point's p50 beside the fit.
#[must_use]
pub fn table(c: &Calibration) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<24} {:>10} {:>12} {:>14} {:>13} {:>10} {:>9}",
        "profile",
        "fixed us",
        "per call us",
        "present key us",
        "absent key us",
        "jitter us",
        "chunk"
    );
    for p in &c.profiles {
        let _ = writeln!(
            out,
            "{:<24} {:>10.1} {:>12.1} {:>14.3} {:>13.3} {:>10.1} {:>9}",
            p.name,
            p.fixed_us,
            p.per_call_us,
            p.present_key_us,
            p.absent_key_us,
            p.jitter_us,
            if p.chunk_keys == 0 {
                "one call".to_owned()
            } else {
                p.chunk_keys.to_string()
            }
        );
    }
    out.push('\n');
    let _ = writeln!(
        out,
        "{:<24} {:>6} {:>8} {:>6} {:>10} {:>10} {:>10} {:>7}",
        "profile", "keys", "present", "calls", "p50 us", "p90 us", "fit us", "fit err"
    );
    for p in &c.profiles {
        for q in &p.points {
            let _ = writeln!(
                out,
                "{:<24} {:>6} {:>8} {:>6} {:>10.1} {:>10.1} {:>10.1} {:>6.1}%",
                p.name,
                q.keys,
                if q.present { "yes" } else { "no" },
                q.calls,
                q.p50_us,
                q.p90_us,
                q.fitted_us,
                (q.fitted_us - q.p50_us) / q.p50_us.max(1e-9) * 100.0
            );
        }
    }
    out
}

/// `cargo xtask calibrate`: measures, fits, prints and writes the calibration.
///
/// # Errors
/// The master, the Python store client or the Python server cannot be started (naming
/// `scripts/mooncake/install.sh`), a lookup answers wrongly or fails, or the file
/// cannot be written.
pub fn run(args: &Args) -> anyhow::Result<()> {
    if args.samples == 0 {
        bail!("--samples must be at least 1");
    }
    if let Some(k) = args.keys.iter().find(|&&k| k == 0 || k > STORED_BLOCKS) {
        bail!("--keys: {k} is not between 1 and {STORED_BLOCKS}");
    }
    let load = crate::bench::report::load_average().map(|l| l[0]);
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let master_bin = args
        .master_bin
        .clone()
        .unwrap_or_else(peers::default_master_bin);
    let python = args.python.clone().unwrap_or_else(peers::default_python);
    let mut measured = measure::all(&master_bin, &python, &args.keys, args.samples)?;
    // The master's own call cost is measured directly; the chunked server pays it per
    // call on top of its own work.
    let master = fit(&measured[0])?;
    for m in measured
        .iter_mut()
        .filter(|m| m.chunk_keys > 0 && !m.intercept_is_call)
    {
        m.fit_calls = false;
        m.known_per_call = Some(master.per_call_us);
    }
    let profiles = measured
        .iter()
        .map(fit)
        .collect::<anyhow::Result<Vec<_>>>()?;
    let calibration = Calibration {
        machine: machine(),
        date: utc_date(secs),
        load_average: load,
        command: format!(
            "cargo xtask calibrate --samples {} --keys {}",
            args.samples,
            args.keys
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ),
        default_profile: "vllm-python".to_owned(),
        profiles,
    };
    println!(
        "calibration on {} at {} UTC (load average {})",
        calibration.machine,
        calibration.date,
        load.map_or_else(|| "?".to_owned(), |l| format!("{l:.2}"))
    );
    println!();
    print!("{}", table(&calibration));
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| peers::workspace_root().join("target/calibration.json"));
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(&calibration).context("encoding JSON")?;
    std::fs::write(&out, text + "\n").with_context(|| format!("writing {}", out.display()))?;
    println!();
    println!(
        "calibration: {} (cargo xtask simulate --calibration {})",
        out.display(),
        out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_fits() {
        assert_eq!(utc_date(0), "1970-01-01 00:00");
        assert_eq!(utc_date(951_782_400 + 3_600 + 120), "2000-02-29 01:02");
        assert_eq!(utc_date(1_798_761_599), "2026-12-31 23:59");
        // A chunked server: 100 µs + 80 per call + 0.5 per present, 0.25 per absent key.
        let t = |calls: u32, p: u32, a: u32| {
            100.0 + 80.0 * f64::from(calls) + 0.5 * f64::from(p) + 0.25 * f64::from(a)
        };
        let m = Measured {
            name: "x",
            what: "y",
            chunk_keys: 1024,
            intercept_is_call: false,
            fit_calls: true,
            known_per_call: None,
            points: vec![
                (16, true, 1, vec![t(1, 16, 0); 3]),
                (2048, true, 2, vec![t(2, 2048, 0); 3]),
                (4096, true, 4, vec![t(4, 4096, 0); 3]),
                (16, false, 1, vec![t(1, 0, 16); 3]),
                (1024, false, 1, vec![t(1, 0, 1024); 3]),
            ],
        };
        let p = fit(&m).unwrap();
        for (got, want) in [
            (p.fixed_us, 100.0),
            (p.per_call_us, 80.0),
            (p.present_key_us, 0.5),
            (p.absent_key_us, 0.25),
        ] {
            assert!((got - want).abs() < 1e-6, "{p:?}");
        }
        assert_eq!(p.jitter_us, 0.0);
        assert_eq!(p.points[1].p50_us, t(2, 2048, 0));
        // With the call's cost known, the rest is fitted.
        let known = Measured {
            fit_calls: false,
            known_per_call: Some(80.0),
            ..m
        };
        let p = fit(&known).unwrap();
        assert_eq!(p.per_call_us, 80.0);
        assert!((p.fixed_us - 100.0).abs() < 1e-6, "{p:?}");
        assert!(
            (p.points[2].fitted_us - t(4, 4096, 0)).abs() < 1e-6,
            "{p:?}"
        );
    }
}
