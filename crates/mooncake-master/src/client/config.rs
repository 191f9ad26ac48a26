//! How the client talks to the master: [`MasterConfig`], its defaults and the checks
//! [`MasterClient::connect`](super::MasterClient::connect) runs on it.

use std::time::Duration;

use crate::{MasterError, TypeLiteral};

/// [`MasterConfig::reopen_after_timeouts`]'s default: three call timeouts in a row
/// replace the connection (`spec/behaviour.md` rule 17).
pub const DEFAULT_REOPEN_AFTER_TIMEOUTS: u32 = 3;

/// How the client talks to the master. Build with `MasterConfig::default()` and set
/// fields.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MasterConfig {
    /// Longest wait for one reply, from handing the request to the connection. Default
    /// 1 s. The master answers 1,000 keys in ~0.3 ms on loopback; a call that takes
    /// a second is a master in trouble.
    pub call_timeout: Duration,
    /// Longest wait for the TCP connect. Default 1 s.
    pub connect_timeout: Duration,
    /// Call timeouts in a row after which the connection is replaced
    /// (`spec/behaviour.md` rule 17; counted per call, not per caller, with calls in
    /// flight together counted once: `client::streak`). Default
    /// [`DEFAULT_REOPEN_AFTER_TIMEOUTS`] (3); 0 never replaces it. Changed later with
    /// [`MasterClient::set_reopen_after_timeouts`](super::MasterClient::set_reopen_after_timeouts).
    pub reopen_after_timeouts: u32,
    /// Most keys per `BatchExistKey` call; longer lists are split. Default 1,024
    /// (1,000 keys cost the master ~0.3 ms; a chunk bounds the work and the read
    /// leases one call grants).
    pub chunk_keys: usize,
    /// `tenant_id` argument of `BatchExistKey`/`ExistKey` (masters ≥ 0.3.12). Default
    /// `"default"`, the tenant of every client unless tenant quotas are on.
    pub tenant_id: String,
    /// Whether requests carry struct_pack's type literal (the debug form the PyPI
    /// client sends). Default [`TypeLiteral::Omit`]: shorter, and accepted by debug
    /// and release masters alike.
    pub type_literal: TypeLiteral,
    /// First wait before a reconnect attempt after a failed one; doubled on each
    /// further failure. Default 20 ms.
    pub backoff_min: Duration,
    /// Longest wait between reconnect attempts. Default 1 s.
    pub backoff_max: Duration,
    /// Largest reply (body plus attachment) accepted, in bytes; a larger header breaks
    /// the connection as a protocol violation instead of allocating. Default 16 MiB
    /// (a 1,024-key answer is ~2 KiB).
    pub max_reply_bytes: u32,
    /// Most bytes of requests queued for the connection and not yet handed to the
    /// socket. A call that would exceed it fails at once as
    /// [`MasterError::Unavailable`] (a master that stopped reading must not make the
    /// client queue without bound); a call that ends before its request was written
    /// takes the request out of the queue. Default 8 MiB (~130 calls of 1,024 keys).
    /// A request larger than the limit is still sent when nothing else waits.
    pub max_queued_bytes: usize,
    /// Cluster id of an `etcd://` address given as a string to
    /// [`MasterClient::connect`](super::MasterClient::connect); `None` (the default)
    /// takes `$MC_STORE_CLUSTER_ID`, else `mooncake_cluster`
    /// ([`MasterAddr::parse`](crate::MasterAddr::parse)).
    pub cluster_id: Option<String>,
    /// Longest wait for one etcd read of the leader's view (connect, request and
    /// answer), per endpoint. Default 1 s.
    pub etcd_timeout: Duration,
    /// How often the leader's view is re-read while every call succeeds. Default 10 s:
    /// a failover breaks the connection, and a broken connection triggers a read at
    /// once, so this only bounds how long a silent change goes unnoticed.
    pub view_refresh: Duration,
    /// How often the view is re-read while calls fail or no connection is up (besides
    /// a read at once after each RPC error, at most one per 200 ms). Default 1 s.
    pub view_retry: Duration,
}

impl Default for MasterConfig {
    fn default() -> Self {
        Self {
            call_timeout: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(1),
            reopen_after_timeouts: DEFAULT_REOPEN_AFTER_TIMEOUTS,
            chunk_keys: 1024,
            tenant_id: "default".to_owned(),
            type_literal: TypeLiteral::Omit,
            backoff_min: Duration::from_millis(20),
            backoff_max: Duration::from_secs(1),
            max_reply_bytes: 16 << 20,
            max_queued_bytes: 8 << 20,
            cluster_id: None,
            etcd_timeout: Duration::from_secs(1),
            view_refresh: Duration::from_secs(10),
            view_retry: Duration::from_secs(1),
        }
    }
}

impl MasterConfig {
    /// Checks every setting, as [`MasterClient::connect`](crate::MasterClient::connect)
    /// does before connecting; callers that hold a `MasterConfig` inside their own
    /// settings (the direct transport's `DirectConfig`) call it rather than copy it.
    ///
    /// # Errors
    /// [`MasterError::InvalidConfig`] naming the field (`what`): `chunk_keys` or
    /// `max_queued_bytes` 0; a zero `call_timeout`, `connect_timeout`,
    /// `etcd_timeout`, `view_refresh` or `view_retry`; a `backoff_min` that is zero
    /// or above `backoff_max`.
    pub fn validate(&self) -> Result<(), MasterError> {
        let invalid = |what, why: &str| {
            Err(MasterError::InvalidConfig {
                what,
                why: why.to_owned(),
            })
        };
        if self.chunk_keys == 0 {
            return invalid("chunk_keys", "must be at least 1");
        }
        if self.call_timeout.is_zero() {
            return invalid("call_timeout", "must be positive");
        }
        if self.connect_timeout.is_zero() {
            return invalid("connect_timeout", "must be positive");
        }
        if self.max_queued_bytes == 0 {
            return invalid("max_queued_bytes", "must be at least 1");
        }
        if self.backoff_min.is_zero() || self.backoff_min > self.backoff_max {
            return invalid("backoff_min", "must be positive and at most backoff_max");
        }
        for (what, value) in [
            ("etcd_timeout", self.etcd_timeout),
            ("view_refresh", self.view_refresh),
            ("view_retry", self.view_retry),
        ] {
            if value.is_zero() {
                return invalid(what, "must be positive");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each check names its field, including the four a copy in the direct
    /// transport's settings used to miss.
    #[test]
    fn validate_names_each_bad_field() {
        assert!(MasterConfig::default().validate().is_ok());
        let named = |edit: fn(&mut MasterConfig)| {
            let mut config = MasterConfig::default();
            edit(&mut config);
            match config.validate() {
                Err(MasterError::InvalidConfig { what, .. }) => what,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(named(|c| c.chunk_keys = 0), "chunk_keys");
        assert_eq!(named(|c| c.max_queued_bytes = 0), "max_queued_bytes");
        assert_eq!(named(|c| c.etcd_timeout = Duration::ZERO), "etcd_timeout");
        assert_eq!(named(|c| c.view_refresh = Duration::ZERO), "view_refresh");
        assert_eq!(named(|c| c.view_retry = Duration::ZERO), "view_retry");
        assert_eq!(named(|c| c.backoff_min = c.backoff_max * 2), "backoff_min");
    }
}
