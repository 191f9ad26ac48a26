//! [`ServerConfig`]: the settings of a [`LookupServer`](crate::LookupServer) and their
//! defaults.

use lookup_core::wire;
use mooncake_master::KeyLayout;

use crate::Error;

/// Default of [`ServerConfig::max_concurrency`]: requests answered at once.
pub const DEFAULT_MAX_CONCURRENCY: usize = 256;

/// Default of [`ServerConfig::max_frame_bytes`]: the largest well-formed request
/// frame, a `msgpack-hex` array of [`wire::MAX_HASHES`] hashes of
/// [`wire::MAX_HASH_LEN`] bytes (5-byte headers, two hex digits a byte), rounded up.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 5 + wire::MAX_HASHES * (5 + 2 * wire::MAX_HASH_LEN);

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
    /// bigger one is disconnected before the frame is buffered.
    pub max_frame_bytes: usize,
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
            take_over: false,
        }
    }

    /// Checks the settings.
    ///
    /// # Errors
    /// [`Error::InvalidServerConfig`] for a block size of 0, a `max_concurrency` of 0
    /// or a `max_frame_bytes` of 0.
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
    }
}
