//! Where the master is: a fixed `host:port`, or a high-availability cluster whose
//! leader is found in etcd (`spec/mooncake-master-rpc.md`, "High availability").
//!
//! The forms are the C++ client's: `127.0.0.1:50051`, or `etcd://h1:p1;h2:p2` with the
//! cluster id taken from a setting, else from `MC_STORE_CLUSTER_ID`, else
//! `mooncake_cluster`. Every part is checked when the address is built, so a typo
//! fails at start-up with the reason, never later as an unreachable master.

use std::fmt;
use std::str::FromStr;

use crate::MasterError;

/// The environment variable the C++ client reads the cluster id from.
pub const CLUSTER_ID_ENV: &str = "MC_STORE_CLUSTER_ID";
/// The cluster id when neither a setting nor [`CLUSTER_ID_ENV`] gives one.
pub const DEFAULT_CLUSTER_ID: &str = "mooncake_cluster";
/// The scheme of a high-availability address.
pub const ETCD_SCHEME: &str = "etcd://";

/// A TCP endpoint `host:port`: a host name, an IPv4 address or a bracketed IPv6
/// address (`[::1]:50051`), and a port from 1 to 65535.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    host: String,
    port: u16,
}

impl Endpoint {
    /// Parses `host:port`.
    ///
    /// # Errors
    /// [`MasterError::InvalidAddress`] for a missing or empty host, a missing, zero or
    /// out-of-range port, or a host with whitespace, `/`, `;`, `@` or an unbracketed
    /// `:`.
    pub fn parse(s: &str) -> Result<Self, MasterError> {
        let invalid = |why: &str| MasterError::InvalidAddress {
            addr: s.to_owned(),
            why: why.to_owned(),
        };
        let (host, port) = s
            .rsplit_once(':')
            .ok_or_else(|| invalid("expected host:port"))?;
        if host.is_empty() {
            return Err(invalid("empty host"));
        }
        let bare = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let bracketed = bare.len() != host.len();
        if bare.is_empty()
            || bare
                .chars()
                .any(|c| c.is_whitespace() || matches!(c, '/' | ';' | '@' | '[' | ']'))
            || (!bracketed && bare.contains(':'))
        {
            return Err(invalid(
                "the host must be a name, an IPv4 address or a bracketed IPv6 address",
            ));
        }
        let port: u16 = port
            .parse()
            .map_err(|_| invalid("the port must be a number from 1 to 65535"))?;
        if port == 0 {
            return Err(invalid("the port must be a number from 1 to 65535"));
        }
        Ok(Self {
            host: host.to_owned(),
            port,
        })
    }

    /// The host as given (IPv6 with its brackets).
    #[must_use]
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// A high-availability cluster: the etcd endpoints the masters elect their leader in,
/// and the cluster id that names the election.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdCluster {
    endpoints: Vec<Endpoint>,
    cluster_id: String,
}

impl EtcdCluster {
    /// The etcd endpoints, in the order given; at least one.
    #[must_use]
    pub fn endpoints(&self) -> &[Endpoint] {
        &self.endpoints
    }

    /// The cluster id (`-cluster_id` of the masters).
    #[must_use]
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// The etcd key holding the leader's address: `mooncake-store/<cluster_id>/master_view`,
    /// one trailing `/` of the id dropped, as the masters write it (Mooncake's
    /// `EtcdLeaderCoordinator::BuildMasterViewKey`).
    #[must_use]
    pub fn master_view_key(&self) -> String {
        let id = self
            .cluster_id
            .strip_suffix('/')
            .unwrap_or(&self.cluster_id);
        format!("mooncake-store/{id}/master_view")
    }
}

/// Where the master is: the address a [`MasterClient`](crate::MasterClient) is given.
///
/// ```
/// use mooncake_master::MasterAddr;
///
/// let fixed = MasterAddr::parse("127.0.0.1:50051", None)?;
/// assert!(matches!(fixed, MasterAddr::Fixed(_)));
///
/// let ha = MasterAddr::parse("etcd://10.0.0.1:2379;10.0.0.2:2379", Some("prod"))?;
/// let MasterAddr::Etcd(cluster) = &ha else { unreachable!() };
/// assert_eq!(cluster.endpoints().len(), 2);
/// assert_eq!(cluster.master_view_key(), "mooncake-store/prod/master_view");
/// assert_eq!(ha.to_string(), "etcd://10.0.0.1:2379;10.0.0.2:2379");
///
/// assert!(MasterAddr::parse("127.0.0.1", None).is_err());
/// # Ok::<(), mooncake_master::MasterError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MasterAddr {
    /// One master at a fixed `host:port` (a master without HA, or one chosen by hand).
    Fixed(Endpoint),
    /// A high-availability cluster: the client follows the leader elected in etcd.
    Etcd(EtcdCluster),
}

impl MasterAddr {
    /// Parses `host:port` or `etcd://h1:p1;h2:p2` (empty parts between `;` ignored).
    /// For `etcd://` the cluster id is `cluster_id` when given, else
    /// `$MC_STORE_CLUSTER_ID` when set and not empty, else `mooncake_cluster`, as the
    /// C++ client resolves it. `cluster_id` is ignored for a fixed address.
    ///
    /// # Errors
    /// [`MasterError::InvalidAddress`] for a malformed endpoint, another scheme
    /// (`redis://`, `k8s://`: not supported), an `etcd://` without endpoints, or an
    /// empty or whitespace-holding cluster id.
    pub fn parse(s: &str, cluster_id: Option<&str>) -> Result<Self, MasterError> {
        let invalid = |why: String| MasterError::InvalidAddress {
            addr: s.to_owned(),
            why,
        };
        let Some(list) = s.strip_prefix(ETCD_SCHEME) else {
            if let Some((scheme, _)) = s.split_once("://") {
                return Err(invalid(format!(
                    "unsupported scheme {scheme}:// (host:port or etcd://h1:p1;h2:p2)"
                )));
            }
            return Endpoint::parse(s).map(Self::Fixed);
        };
        let endpoints = list
            .split(';')
            .filter(|part| !part.is_empty())
            .map(Endpoint::parse)
            .collect::<Result<Vec<_>, _>>()?;
        if endpoints.is_empty() {
            return Err(invalid("etcd:// needs at least one host:port".to_owned()));
        }
        let cluster_id = resolve_cluster_id(cluster_id, std::env::var(CLUSTER_ID_ENV).ok());
        if cluster_id.is_empty() || cluster_id.chars().any(char::is_whitespace) {
            return Err(invalid(format!(
                "cluster id {cluster_id:?} must be non-empty without whitespace"
            )));
        }
        Ok(Self::Etcd(EtcdCluster {
            endpoints,
            cluster_id,
        }))
    }
}

/// The setting when given, else the environment's value when not empty, else
/// [`DEFAULT_CLUSTER_ID`] (Mooncake's `EtcdLeaderCoordinator::ResolveNamespace`).
fn resolve_cluster_id(setting: Option<&str>, env: Option<String>) -> String {
    match setting {
        Some(id) => id.to_owned(),
        None => env
            .filter(|id| !id.is_empty())
            .unwrap_or_else(|| DEFAULT_CLUSTER_ID.to_owned()),
    }
}

impl FromStr for MasterAddr {
    type Err = MasterError;

    /// As [`MasterAddr::parse`] without a cluster id setting.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s, None)
    }
}

impl fmt::Display for MasterAddr {
    /// The address in the form it was given (the cluster id is not part of it).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fixed(endpoint) => endpoint.fmt(f),
            Self::Etcd(cluster) => {
                f.write_str(ETCD_SCHEME)?;
                for (i, endpoint) in cluster.endpoints.iter().enumerate() {
                    if i > 0 {
                        f.write_str(";")?;
                    }
                    endpoint.fmt(f)?;
                }
                Ok(())
            }
        }
    }
}

/// The leader as etcd names it: its RPC address and the view version (the key's
/// `create_revision`), which grows with every election (`spec/mooncake-master-rpc.md`,
/// "High availability").
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MasterView {
    /// The leader's RPC endpoint (`-rpc_address:-rpc_port`).
    pub leader: Endpoint,
    /// The view version: etcd's `create_revision` of the key, positive.
    pub version: i64,
}

/// What [`MasterClient::subscribe_leader`](crate::MasterClient::subscribe_leader)
/// watches: the leader in use and how many times it changed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaderState {
    /// The leader in use; `None` for a fixed address.
    pub view: Option<MasterView>,
    /// Leader changes so far (as [`MasterStats::leader_changes`](crate::MasterStats::leader_changes)):
    /// a watcher that wakes once for two changes still sees both.
    pub changes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn why(s: &str) -> String {
        match MasterAddr::parse(s, Some("c")) {
            Err(MasterError::InvalidAddress { addr, why }) => {
                assert_eq!(addr, s);
                why
            }
            other => panic!("{s:?} parsed as {other:?}"),
        }
    }

    #[test]
    fn fixed_addresses() {
        let addr = MasterAddr::parse("127.0.0.1:50051", Some("ignored")).unwrap();
        let MasterAddr::Fixed(endpoint) = &addr else {
            panic!("{addr:?}")
        };
        assert_eq!((endpoint.host(), endpoint.port()), ("127.0.0.1", 50051));
        assert_eq!(addr.to_string(), "127.0.0.1:50051");
        let v6 = Endpoint::parse("[::1]:7").unwrap();
        assert_eq!(
            (v6.host(), v6.port(), v6.to_string()),
            ("[::1]", 7, "[::1]:7".to_owned())
        );
        assert_eq!(
            Endpoint::parse("master-0.svc:1").unwrap().host(),
            "master-0.svc"
        );
    }

    #[test]
    fn bad_endpoints_say_why() {
        assert_eq!(why("127.0.0.1"), "expected host:port");
        assert_eq!(why(":50051"), "empty host");
        assert_eq!(why("h:0"), "the port must be a number from 1 to 65535");
        assert_eq!(why("h:65536"), "the port must be a number from 1 to 65535");
        assert_eq!(why("h:x"), "the port must be a number from 1 to 65535");
        for bad in ["::1:5", "a b:1", "a/b:1", "[]:1", "u@h:1"] {
            assert_eq!(
                why(bad),
                "the host must be a name, an IPv4 address or a bracketed IPv6 address",
                "{bad}"
            );
        }
        assert_eq!(
            why("redis://h:1"),
            "unsupported scheme redis:// (host:port or etcd://h1:p1;h2:p2)"
        );
        assert_eq!(why("etcd://"), "etcd:// needs at least one host:port");
        assert_eq!(why("etcd://;;"), "etcd:// needs at least one host:port");
        // A bad endpoint inside the list names itself.
        match MasterAddr::parse("etcd://h:1;h2", None) {
            Err(MasterError::InvalidAddress { addr, why }) => {
                assert_eq!((addr.as_str(), why.as_str()), ("h2", "expected host:port"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn etcd_addresses_and_the_view_key() {
        let addr = MasterAddr::parse("etcd://127.0.0.1:2379;;h2:2380;", Some("team/")).unwrap();
        let MasterAddr::Etcd(cluster) = &addr else {
            panic!("{addr:?}")
        };
        let endpoints: Vec<String> = cluster
            .endpoints()
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(endpoints, ["127.0.0.1:2379", "h2:2380"]);
        assert_eq!(cluster.cluster_id(), "team/");
        assert_eq!(cluster.master_view_key(), "mooncake-store/team/master_view");
        assert_eq!(addr.to_string(), "etcd://127.0.0.1:2379;h2:2380");
    }

    #[test]
    fn cluster_id_comes_from_the_setting_then_the_environment() {
        let env = |v: &str| Some(v.to_owned());
        assert_eq!(resolve_cluster_id(Some("set"), env("env")), "set");
        assert_eq!(resolve_cluster_id(None, env("env")), "env");
        assert_eq!(resolve_cluster_id(None, env("")), DEFAULT_CLUSTER_ID);
        assert_eq!(resolve_cluster_id(None, None), "mooncake_cluster");
    }

    #[test]
    fn cluster_id_setting_must_be_usable() {
        for bad in ["", "a b"] {
            match MasterAddr::parse("etcd://h:1", Some(bad)) {
                Err(MasterError::InvalidAddress { why, .. }) => {
                    assert_eq!(
                        why,
                        format!("cluster id {bad:?} must be non-empty without whitespace")
                    );
                }
                other => panic!("{other:?}"),
            }
        }
    }
}
