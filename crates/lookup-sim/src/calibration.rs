//! Calibration files: what `cargo xtask calibrate` measured of real lookup servers on
//! a machine (fixed, per-call and per-key costs, present and absent keys), and what
//! `cargo xtask simulate --calibration FILE` reads. The simulator's defaults are the
//! built-in calibration `crates/lookup-sim/calibration.json`, which names its machine and date.

use std::path::Path;
use std::sync::LazyLock;

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};

use super::server::ServerParams;

/// The built-in calibration, committed beside this crate.
const BUILTIN: &str = include_str!("../calibration.json");

static PARSED: LazyLock<Calibration> = LazyLock::new(|| {
    serde_json::from_str(BUILTIN).expect("crates/lookup-sim/calibration.json is a calibration file")
});

/// A calibration file: where and when it was measured, and one cost profile per
/// server measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// The machine measured (CPU model, cores, kernel).
    pub machine: String,
    /// When (UTC, `YYYY-MM-DD HH:MM`).
    pub date: String,
    /// The 1-minute load average before the measurement (other work on the machine
    /// inflates the figures).
    pub load_average: Option<f64>,
    /// The command that wrote the file.
    pub command: String,
    /// The profile the simulator uses unless told otherwise (`--server-profile`).
    pub default_profile: String,
    /// One per server measured.
    pub profiles: Vec<Profile>,
}

/// The cost of lookups through one server, fitted from measured lookups of several
/// sizes, all keys present or all absent: `fixed + calls × per_call + present ×
/// present_key + absent × absent_key` (µs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    /// Its name (`--server-profile`).
    pub name: String,
    /// What was measured, in words.
    pub what: String,
    /// Fixed cost per lookup (µs).
    pub fixed_us: f64,
    /// Cost per store call (µs).
    pub per_call_us: f64,
    /// Cost per present key asked (µs).
    pub present_key_us: f64,
    /// Cost per absent key asked (µs).
    pub absent_key_us: f64,
    /// Keys per store call (0: one call with every key, no early stop).
    pub chunk_keys: u32,
    /// The spread of a lookup's time: p90 − p50 of the measured lookups, the bound of
    /// the model's uniform jitter (µs).
    pub jitter_us: f64,
    /// The measured lookups the fit was made from.
    pub points: Vec<Point>,
}

/// One measured lookup size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Keys asked per lookup.
    pub keys: u32,
    /// Whether they were all present (else all absent).
    pub present: bool,
    /// Store calls per lookup.
    pub calls: u32,
    /// Lookups timed.
    pub samples: u32,
    /// Median time per lookup (µs).
    pub p50_us: f64,
    /// 90th percentile (µs).
    pub p90_us: f64,
    /// The fitted model's time for this point (µs).
    pub fitted_us: f64,
}

impl Calibration {
    /// The built-in calibration (`crates/lookup-sim/calibration.json`).
    #[must_use]
    pub fn builtin() -> &'static Self {
        &PARSED
    }

    /// Reads a calibration file.
    ///
    /// # Errors
    /// The file cannot be read or is not a calibration (naming the file), or its
    /// default profile is not among its profiles.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading calibration {}", path.display()))?;
        let c: Self = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a calibration file", path.display()))?;
        c.profile(None)
            .with_context(|| format!("calibration {}", path.display()))?;
        Ok(c)
    }

    /// The profile named `name`, or the default one.
    ///
    /// # Errors
    /// No profile of that name (the message lists those there are).
    pub fn profile(&self, name: Option<&str>) -> anyhow::Result<&Profile> {
        let name = name.unwrap_or(&self.default_profile);
        match self.profiles.iter().find(|p| p.name == name) {
            Some(p) => Ok(p),
            None => bail!(
                "no server profile {name:?}; the calibration has {}",
                self.profiles
                    .iter()
                    .map(|p| p.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }

    /// The server model of the default profile, one namespace, block size 16, one
    /// lookup at a time.
    #[must_use]
    pub fn server_params(&self) -> ServerParams {
        let p = self
            .profile(None)
            .expect("a loaded calibration has its default profile");
        p.server_params()
    }
}

impl Profile {
    /// This profile as the server model: one namespace, block size 16, one lookup at a
    /// time (vLLM's REQ/REP pair).
    #[must_use]
    pub fn server_params(&self) -> ServerParams {
        ServerParams {
            fixed_s: self.fixed_us / 1e6,
            per_call_s: self.per_call_us / 1e6,
            present_key_s: self.present_key_us / 1e6,
            absent_key_s: self.absent_key_us / 1e6,
            block_size: 16,
            namespaces: 1,
            chunk_keys: self.chunk_keys,
            concurrency: 1,
            jitter_s: self.jitter_us / 1e6,
            shared: false,
        }
    }
}

/// The built-in calibration's costs (`crates/lookup-sim/calibration.json`): defined
/// here, beside the file it reads, so the server model does not depend on it.
impl Default for ServerParams {
    fn default() -> Self {
        Calibration::builtin().server_params()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_builtin_calibration_parses_and_is_the_default() {
        let c = Calibration::builtin();
        let p = c.profile(None).unwrap();
        assert_eq!(ServerParams::default(), p.server_params());
        assert!(
            c.profile(Some("nope"))
                .unwrap_err()
                .to_string()
                .starts_with("no server profile \"nope\"; the calibration has ")
        );
        for p in &c.profiles {
            for v in [p.fixed_us, p.per_call_us, p.present_key_us, p.absent_key_us] {
                assert!(v.is_finite() && v >= 0.0, "{}: {v}", p.name);
            }
        }
    }
}
