//! The Mooncake releases other than the pinned one whose masters the tests run
//! (`spec/mooncake-master-rpc.md`, "Master releases"): each unpacked by
//! `scripts/mooncake/install.sh` under `.venv/releases/<version>/`, from the wheel users
//! install it from. A release knows how its master is started (0.3.10 has no
//! `-metrics_host`) and which Python client writes into it (0.3.10 takes only its own;
//! 0.3.14's own needs libcuda, and the pinned client writes into it fine).

use std::path::PathBuf;

use super::{INSTALL_HINT, workspace_root};

/// The pinned release (`.venv`, what every other test runs).
pub const PINNED: &str = "0.3.13.post1";

/// The other releases `install.sh` fetches: `$MOONCAKE_RELEASES` (space-separated)
/// if set, else 0.3.10 and 0.3.14.
#[must_use]
pub fn other_versions() -> Vec<String> {
    std::env::var("MOONCAKE_RELEASES").map_or_else(
        |_| vec!["0.3.10".to_owned(), "0.3.14".to_owned()],
        |list| list.split_whitespace().map(str::to_owned).collect(),
    )
}

/// One installed release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    /// Its version, e.g. `0.3.10`.
    pub version: String,
    /// Its `mooncake_master`.
    pub master_bin: PathBuf,
    /// The folder to put on `PYTHONPATH` for its own Python client, when the pinned
    /// one cannot write into its master; `None` for the pinned client.
    pub python_path: Option<PathBuf>,
    /// Whether its master takes `-metrics_host` (0.3.10 does not: its admin port binds
    /// every interface).
    pub metrics_host: bool,
}

impl Release {
    /// The release `version` as `install.sh` unpacked it.
    ///
    /// # Errors
    /// When its master is not there: a message naming the install script.
    pub fn find(version: &str) -> Result<Self, String> {
        let dir = std::env::var_os("MOONCAKE_VENV")
            .map_or_else(|| workspace_root().join(".venv"), PathBuf::from)
            .join("releases")
            .join(version);
        let master_bin = dir.join("mooncake/mooncake_master");
        if !master_bin.is_file() {
            return Err(format!(
                "the Mooncake {version} master not found at {}: {INSTALL_HINT}, which also \
                 fetches the releases of MOONCAKE_RELEASES (default 0.3.10 0.3.14)",
                master_bin.display()
            ));
        }
        let old = version_below(version, (0, 3, 12));
        Ok(Self {
            version: version.to_owned(),
            master_bin,
            python_path: old.then_some(dir),
            metrics_host: !version_below(version, (0, 3, 11)),
        })
    }

    /// [`find`](Self::find) for a test.
    ///
    /// # Panics
    /// When the release is not installed, naming the install script.
    #[must_use]
    pub fn get(version: &str) -> Self {
        Self::find(version).unwrap_or_else(|e| panic!("{e}"))
    }
}

/// Whether `version` (`major.minor.patch[.postN]`) is below `than`.
fn version_below(version: &str, than: (u32, u32, u32)) -> bool {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let mut next = || parts.next().unwrap_or(0);
    (next(), next(), next()) < than
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_compare_by_number() {
        assert!(version_below("0.3.10", (0, 3, 12)));
        assert!(version_below("0.3.10", (0, 3, 11)));
        assert!(!version_below("0.3.14", (0, 3, 12)));
        assert!(!version_below("0.3.13.post1", (0, 3, 12)));
        assert!(!version_below("0.3.12", (0, 3, 12)));
    }
}
