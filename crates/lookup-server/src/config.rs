//! [`ServerConfig`]: the settings of a [`LookupServer`](crate::LookupServer) and their
//! defaults.

use mooncake_master::KeyLayout;

use crate::Error;

/// Default of [`ServerConfig::max_concurrency`]: requests answered at once.
pub const DEFAULT_MAX_CONCURRENCY: usize = 256;

/// Block hashes the default [`ServerConfig::max_frame_bytes`] carries in one
/// `msgpack-hex` request: 262,144 tokens at block size 16 (8.4 M at 512).
pub const DEFAULT_MAX_FRAME_HASHES: usize = 16_384;

/// Default of [`ServerConfig::max_frame_bytes`], 1,081,349 bytes: a `msgpack-hex`
/// array (its header at most 5 bytes) of [`DEFAULT_MAX_FRAME_HASHES`] 32-byte hashes (vLLM's
/// sha256 block hashes), each a 2-byte string header and 64 hex digits. The same
/// frame holds 33,792 such hashes in `tagged-blob`. The decoder's own limits
/// ([`lookup_core::wire::MAX_HASHES`] hashes of [`lookup_core::wire::MAX_HASH_LEN`]
/// bytes, 33.9 MB) are reached
/// only with a larger `max_frame_bytes`.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 5 + DEFAULT_MAX_FRAME_HASHES * (2 + 2 * 32);

/// Default of [`ServerConfig::max_pending_bytes`]: 8 MiB.
pub const DEFAULT_MAX_PENDING_BYTES: usize = 8 << 20;

/// Default of [`ServerConfig::recv_hwm`]: complete messages ZeroMQ queues per peer.
pub const DEFAULT_RECV_HWM: u32 = 4;

/// Settings of a [`LookupServer`](crate::LookupServer).
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Block size `B` in tokens: the lookup alignment (`spec/wire.md`, "What the
    /// server computes"; vLLM default 16, the Mooncake traces 512). Must be positive.
    pub block_size: u32,
    /// How block hashes become store keys.
    pub layout: KeyLayout,
    /// Requests answered at once (at least 1). At the limit the server stops reading
    /// its socket until one finishes; ZeroMQ queues the rest.
    pub max_concurrency: usize,
    /// Allow a TCP bind to an address that is not loopback (`127.0.0.0/8`, `::1`,
    /// `localhost`). Off by default: the channel has no authentication.
    pub allow_remote: bool,
    /// Largest frame accepted, in bytes (ZeroMQ `ZMQ_MAXMSGSIZE`): a peer sending a
    /// bigger one is disconnected before the frame is buffered (a client whose prompt
    /// needs more loses its connection: raise it for such prompts).
    pub max_frame_bytes: usize,
    /// Bytes held for requests read and not yet answered, across all peers, at most:
    /// their frames as received plus the store keys built from them (at least 1). At
    /// the cap the server stops reading its socket until replies go out (as at
    /// `max_concurrency`); the request that crossed it is kept, so the bytes held
    /// reach at most the cap plus one request. Requests the index answers at once (the
    /// in-memory one) are never held.
    pub max_pending_bytes: usize,
    /// Complete messages ZeroMQ queues per peer before the server reads them
    /// (`ZMQ_RCVHWM`, at least 1). A peer that sends more waits, in its own socket and
    /// TCP, until the server reads: so ZeroMQ holds at most `recv_hwm + 1` messages
    /// of up to `max_frame_bytes` per frame for each peer. ZeroMQ's own default is
    /// 1,000.
    pub recv_hwm: u32,
    /// Take over an ipc path that a running server still listens on (what vLLM's
    /// worker does when it binds). Off by default: binding then fails with
    /// [`Error::EndpointInUse`] instead of silently cutting the running server off.
    pub take_over: bool,
}

impl ServerConfig {
    /// Block size `block_size` tokens, `layout`, and the defaults for the rest.
    #[must_use]
    pub fn new(block_size: u32, layout: KeyLayout) -> Self {
        Self {
            block_size,
            layout,
            max_concurrency: DEFAULT_MAX_CONCURRENCY,
            allow_remote: false,
            max_frame_bytes: DEFAULT_MAX_FRAME_BYTES,
            max_pending_bytes: DEFAULT_MAX_PENDING_BYTES,
            recv_hwm: DEFAULT_RECV_HWM,
            take_over: false,
        }
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`Error::InvalidServerConfig`] for a block size of 0, or a `max_concurrency`,
    /// `max_frame_bytes`, `max_pending_bytes` or `recv_hwm` of 0, or a `recv_hwm`
    /// above `i32::MAX` (ZeroMQ's type).
    pub fn validate(&self) -> Result<(), Error> {
        let bad = |key, why: &str| {
            Err(Error::InvalidServerConfig {
                key,
                why: why.to_owned(),
            })
        };
        if self.block_size == 0 {
            return bad("block_size", "must be at least 1 token");
        }
        if self.max_concurrency == 0 {
            return bad("max_concurrency", "must be at least 1");
        }
        if self.max_frame_bytes == 0 {
            return bad("max_frame_bytes", "must be at least 1 byte");
        }
        if self.max_pending_bytes == 0 {
            return bad("max_pending_bytes", "must be at least 1 byte");
        }
        if self.recv_hwm == 0 || i32::try_from(self.recv_hwm).is_err() {
            return bad("recv_hwm", "must be 1 to 2147483647 messages");
        }
        Ok(())
    }
}

impl Default for ServerConfig {
    /// Block size 16 tokens (vLLM's default) and [`KeyLayout::default`].
    fn default() -> Self {
        Self::new(16, KeyLayout::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_settings_are_refused() {
        let mut config = ServerConfig::default();
        config.validate().unwrap();
        config.block_size = 0;
        assert!(matches!(
            config.validate(),
            Err(Error::InvalidServerConfig {
                key: "block_size",
                ..
            })
        ));
        let config = ServerConfig {
            max_concurrency: 0,
            ..ServerConfig::default()
        };
        assert!(matches!(
            config.validate(),
            Err(Error::InvalidServerConfig {
                key: "max_concurrency",
                ..
            })
        ));
        let config = ServerConfig {
            max_pending_bytes: 0,
            ..ServerConfig::default()
        };
        assert!(matches!(
            config.validate(),
            Err(Error::InvalidServerConfig {
                key: "max_pending_bytes",
                ..
            })
        ));
        for recv_hwm in [0, 1 << 31] {
            let config = ServerConfig {
                recv_hwm,
                ..ServerConfig::default()
            };
            assert!(matches!(
                config.validate(),
                Err(Error::InvalidServerConfig {
                    key: "recv_hwm",
                    ..
                })
            ));
        }
    }

    #[test]
    fn the_default_frame_holds_16384_sha256_hashes_in_msgpack_hex() {
        let hashes: Vec<Vec<u8>> = (0..DEFAULT_MAX_FRAME_HASHES)
            .map(|i| u64::try_from(i).unwrap().to_be_bytes().repeat(4))
            .collect();
        let hashes = lookup_core::BlockHashes::from_hashes(&hashes).unwrap();
        use lookup_core::wire;
        let frames = wire::encode_lookup(wire::Format::MsgpackHex, 1 << 20, 16, &hashes);
        // Frame 0: num_tokens; frame 1: the array, with a 3-byte array16 header.
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[1].len(), DEFAULT_MAX_FRAME_BYTES - 2);
        assert_eq!(DEFAULT_MAX_FRAME_BYTES, 1_081_349);
    }
}
