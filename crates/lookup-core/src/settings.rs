//! Each setting of the lookup lifecycle defined once ([`SETTINGS`]): its
//! `kv_connector_extra_config` key, unit, where vLLM reads it, its check, its one-line
//! meaning, and how it is read from and written to a [`Config`]. The default is
//! [`Config::new`]'s, read through the same accessor, so it is written in one place.
//!
//! Built from this table, or checked against it by a test that fails when one of them
//! lacks a setting: [`Config::validate`] (it runs every [`Check`]), the reader of
//! `kv_connector_extra_config` (`lookup_tokio::KvConnectorExtraConfig`, which parses
//! each key by its [`Unit`] and writes it with [`Setting::set`]), the client
//! builder's methods, the `lookup doctor` flags (`--{key}` with `-` for `_`), the
//! configuration table of `docs/configuration.md` and the table of
//! `spec/behaviour.md`, "Configuration".

use std::fmt;
use std::time::Duration;

use crate::config::OnPreemption;
use crate::{Config, Error};

/// How a setting's value is written (in `kv_connector_extra_config`, JSON).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// `true` or `false`.
    Switch,
    /// A non-negative integer (a count).
    Count,
    /// Float seconds, finite and `>= 0` (keys ending `_s`); read into a [`Duration`]
    /// ([`duration_from_secs`](crate::duration_from_secs)).
    Seconds,
    /// One of the names of [`OnPreemption`] (`discard`, `keep`, `wait`, `keep_wait`).
    Preemption,
}

/// What a setting's value must satisfy beyond its [`Unit`]: checked by
/// [`Config::validate`] for a [`Config`] however it was built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Check {
    /// Any value of the unit.
    Any,
    /// A count of at least 1.
    AtLeastOne,
    /// Seconds above zero.
    Positive,
    /// Seconds above zero when read from the key (`kv_connector_extra_config`, a
    /// flag); a [`Config`] built in code may hold zero (`lookup_timeout_s`: each RPC
    /// then fails as it is released).
    PositiveWhenRead,
}

/// Who defines a setting and where vLLM 0.33 reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// vLLM 0.33's MooncakeStoreConnector reads it, in these files.
    Vllm(&'static str),
    /// vLLM's follow-up to #45659 (prefetch at arrival), not in 0.33.
    VllmFollowUp,
    /// This project's (**ours** in `spec/behaviour.md`).
    Ours,
}

impl fmt::Display for Source {
    /// The "vLLM 0.33 reads it in" cell of `docs/configuration.md`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Vllm(files) => f.write_str(files),
            Self::VllmFollowUp => f.write_str("vLLM's follow-up to #45659"),
            Self::Ours => f.write_str("— (ours)"),
        }
    }
}

/// One setting's value, as its [`Unit`] says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Value {
    /// [`Unit::Switch`].
    Switch(bool),
    /// [`Unit::Count`].
    Count(u32),
    /// [`Unit::Seconds`].
    Seconds(Duration),
    /// [`Unit::Preemption`].
    Preemption(OnPreemption),
}

impl fmt::Display for Value {
    /// As the tables write a default: `true`, `65,536`, `2.0` (seconds), `` `keep_wait` ``.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Switch(on) => write!(f, "{on}"),
            Self::Count(n) => {
                let digits = n.to_string();
                let mut out = String::new();
                for (i, c) in digits.chars().enumerate() {
                    if i > 0 && (digits.len() - i) % 3 == 0 {
                        out.push(',');
                    }
                    out.push(c);
                }
                f.write_str(&out)
            }
            Self::Seconds(d) => write!(f, "{:.1}", d.as_secs_f64()),
            Self::Preemption(p) => write!(f, "`{}`", p.as_key()),
        }
    }
}

/// Reads a setting's field.
type Getter = fn(&Config) -> Value;
/// Writes a setting's field; false when the value is not of its unit.
type Putter = fn(&mut Config, Value) -> bool;

/// One setting of the lookup lifecycle (`spec/behaviour.md`, "Configuration").
#[derive(Clone, Copy)]
pub struct Setting {
    /// The `kv_connector_extra_config` key (vLLM's name; `_s` for seconds).
    pub key: &'static str,
    /// How its value is written.
    pub unit: Unit,
    /// What its value must satisfy.
    pub check: Check,
    /// Who defines it.
    pub source: Source,
    /// What it does, in one line (the tables' "meaning").
    pub doc: &'static str,
    get: Getter,
    put: Putter,
}

impl fmt::Debug for Setting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Setting")
            .field("key", &self.key)
            .field("unit", &self.unit)
            .field("check", &self.check)
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

impl Setting {
    /// Its value in `config`.
    #[must_use]
    pub fn get(&self, config: &Config) -> Value {
        (self.get)(config)
    }

    /// Its default: its value in [`Config::new`] (any block size).
    #[must_use]
    pub fn default_value(&self) -> Value {
        self.get(&Config::new(1))
    }

    /// Writes `value` into `config` (unchecked: [`Config::validate`] checks).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the key when `value` is not of its [`Unit`].
    pub fn set(&self, config: &mut Config, value: Value) -> Result<(), Error> {
        if (self.put)(config, value) {
            Ok(())
        } else {
            Err(Error::InvalidConfig {
                key: self.key,
                why: format!("{value:?} is not a value of unit {:?}", self.unit),
            })
        }
    }

    /// Checks its value in `config` against its [`Check`].
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] naming the key and what is wrong.
    pub fn validate(&self, config: &Config) -> Result<(), Error> {
        if self.check == Check::PositiveWhenRead {
            return Ok(());
        }
        self.check_value(self.get(config))
            .map_err(|why| Error::InvalidConfig { key: self.key, why })
    }

    /// Checks `value` against its [`Check`].
    ///
    /// # Errors
    /// What is wrong, for the caller to name the key: a count of 0 where at least 1
    /// is needed, zero seconds where they must be positive.
    pub fn check_value(&self, value: Value) -> Result<(), String> {
        match (self.check, value) {
            (Check::AtLeastOne, Value::Count(0)) => Err("must be at least 1".to_owned()),
            (Check::Positive | Check::PositiveWhenRead, Value::Seconds(d)) if d.is_zero() => {
                Err("0 is not a positive number of seconds".to_owned())
            }
            _ => Ok(()),
        }
    }

    /// Reads a value written as text (a command-line flag's) by its [`Unit`] and
    /// checks it: `true`/`false`, a count, float seconds, a preemption policy's name.
    ///
    /// # Errors
    /// What is wrong, for the caller to name the setting.
    pub fn parse_text(&self, text: &str) -> Result<Value, String> {
        let value = match self.unit {
            Unit::Switch => Value::Switch(
                text.parse()
                    .map_err(|_| format!("{text:?} is not true or false"))?,
            ),
            Unit::Count => Value::Count(
                text.parse()
                    .map_err(|_| format!("{text:?} is not an integer >= 0"))?,
            ),
            Unit::Seconds => {
                let secs: f64 = text
                    .parse()
                    .map_err(|_| format!("{text:?} is not a number of seconds"))?;
                Value::Seconds(crate::duration_from_secs(secs)?)
            }
            Unit::Preemption => {
                Value::Preemption(OnPreemption::from_key(text).map_err(|e| e.to_string())?)
            }
        };
        self.check_value(value)?;
        Ok(value)
    }

    /// Its `lookup doctor` flag: `--` and the key with `-` for `_`.
    #[must_use]
    pub fn flag(&self) -> String {
        format!("--{}", self.key.replace('_', "-"))
    }
}

/// The setting named `key`, if any.
#[must_use]
pub fn setting(key: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.key == key)
}

macro_rules! switch {
    ($field:ident) => {
        (
            |c: &Config| Value::Switch(c.$field),
            |c: &mut Config, v: Value| match v {
                Value::Switch(x) => {
                    c.$field = x;
                    true
                }
                _ => false,
            },
        )
    };
}
macro_rules! count {
    ($field:ident) => {
        (
            |c: &Config| Value::Count(c.$field),
            |c: &mut Config, v: Value| match v {
                Value::Count(x) => {
                    c.$field = x;
                    true
                }
                _ => false,
            },
        )
    };
}
macro_rules! seconds {
    ($field:ident) => {
        (
            |c: &Config| Value::Seconds(c.$field),
            |c: &mut Config, v: Value| match v {
                Value::Seconds(x) => {
                    c.$field = x;
                    true
                }
                _ => false,
            },
        )
    };
}

/// Builds one [`Setting`] from its accessor pair.
const fn define(
    key: &'static str,
    unit: Unit,
    check: Check,
    source: Source,
    doc: &'static str,
    (get, put): (Getter, Putter),
) -> Setting {
    Setting {
        key,
        unit,
        check,
        source,
        doc,
        get,
        put,
    }
}

/// Every setting of [`Config`] but `block_size` (vLLM's `--block-size`, not a key of
/// `kv_connector_extra_config`), in the order of `docs/configuration.md`.
pub static SETTINGS: [Setting; 13] = [
    define(
        "enable_lookup",
        Unit::Switch,
        Check::Any,
        Source::Vllm("`scheduler.py`"),
        "false: every probe answers 0, no RPC ever",
        switch!(enable_lookup),
    ),
    define(
        "lookup_async",
        Unit::Switch,
        Check::Any,
        Source::Vllm("`scheduler.py`"),
        "false: the probe waits for the answer (sync mode)",
        switch!(lookup_async),
    ),
    define(
        "load_async",
        Unit::Switch,
        Check::Any,
        Source::Vllm("`scheduler.py`, `worker.py`"),
        "copied into `Ready.load_async` when external tokens > 0",
        switch!(load_async),
    ),
    define(
        "lookup_prefetch_limit",
        Unit::Count,
        Check::Any,
        Source::VllmFollowUp,
        "most arrival-time lookups in flight; 0 = no prefetch (rules 1-3)",
        count!(lookup_prefetch_limit),
    ),
    define(
        "lookup_prefetch_ttl_s",
        Unit::Seconds,
        Check::Any,
        Source::VllmFollowUp,
        "a completed result older than this (from its reply) is looked up again (rule 6)",
        seconds!(lookup_prefetch_ttl),
    ),
    define(
        "lookup_timeout_s",
        Unit::Seconds,
        Check::PositiveWhenRead,
        Source::Ours,
        "an RPC unanswered this long after it was sent fails open, 0 hits as unavailable (rule 17)",
        seconds!(lookup_timeout),
    ),
    define(
        "lookup_priority",
        Unit::Switch,
        Check::Any,
        Source::Ours,
        "lookups a probe waits for go before queued prefetches (rule 15)",
        switch!(lookup_priority),
    ),
    define(
        "lookup_share",
        Unit::Switch,
        Check::Any,
        Source::Ours,
        "identical `(num_tokens, chain)` lookups in flight share one RPC (rule 16)",
        switch!(lookup_share),
    ),
    define(
        "max_in_flight",
        Unit::Count,
        Check::AtLeastOne,
        Source::Ours,
        "lookup RPCs on the wire at once (1 = vLLM's REQ socket)",
        count!(max_in_flight),
    ),
    define(
        "max_queued",
        Unit::Count,
        Check::AtLeastOne,
        Source::Ours,
        "RPCs waiting for the wire before new prefetches are refused",
        count!(max_queued),
    ),
    define(
        "max_pending_age_s",
        Unit::Seconds,
        Check::Positive,
        Source::Ours,
        "a lookup queued this long ends unsent, 0 hits as unavailable (rule 17)",
        seconds!(max_pending_age),
    ),
    define(
        "lookup_on_preemption",
        Unit::Preemption,
        Check::Any,
        Source::Ours,
        "what a preemption does to the request's lookup (rule 8): `discard`, `keep`, `wait` or `keep_wait`",
        (
            |c: &Config| Value::Preemption(c.lookup_on_preemption),
            |c: &mut Config, v: Value| match v {
                Value::Preemption(x) => {
                    c.lookup_on_preemption = x;
                    true
                }
                _ => false,
            },
        ),
    ),
    define(
        "lookup_preempted_wait_s",
        Unit::Seconds,
        Check::Any,
        Source::Ours,
        "with `wait` or `keep_wait`: how long a preempted request's probe waits before answering `Pending` (rule 8)",
        seconds!(lookup_preempted_wait),
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    /// Each setting reads and writes its own field: a value other than the default
    /// written through [`Setting::set`] is read back by [`Setting::get`], and no other
    /// setting moves.
    #[test]
    fn each_setting_owns_one_field() {
        for s in &SETTINGS {
            let mut c = Config::new(16);
            let other = match s.default_value() {
                Value::Switch(on) => Value::Switch(!on),
                Value::Count(n) => Value::Count(n + 7),
                Value::Seconds(d) => Value::Seconds(d + Duration::from_millis(1_500)),
                Value::Preemption(_) => Value::Preemption(OnPreemption::Discard),
            };
            s.set(&mut c, other).unwrap();
            assert_eq!(s.get(&c), other, "{}", s.key);
            for t in SETTINGS.iter().filter(|t| t.key != s.key) {
                assert_eq!(t.get(&c), t.default_value(), "{} moved {}", s.key, t.key);
            }
            assert!(s.set(&mut c, Value::Count(1)).is_err() || s.unit == Unit::Count);
        }
    }

    #[test]
    fn defaults_render_as_the_tables_write_them() {
        let shown: Vec<String> = SETTINGS
            .iter()
            .map(|s| format!("{}={}", s.key, s.default_value()))
            .collect();
        assert_eq!(
            shown,
            [
                "enable_lookup=true",
                "lookup_async=false",
                "load_async=true",
                "lookup_prefetch_limit=0",
                "lookup_prefetch_ttl_s=2.0",
                "lookup_timeout_s=5.0",
                "lookup_priority=true",
                "lookup_share=true",
                "max_in_flight=1",
                "max_queued=65,536",
                "max_pending_age_s=5.0",
                "lookup_on_preemption=`discard`",
                "lookup_preempted_wait_s=5.0",
            ]
        );
    }

    #[test]
    fn checks_name_the_key() {
        let mut c = Config::new(16);
        c.max_queued = 0;
        assert_eq!(
            c.validate().unwrap_err().to_string(),
            Error::InvalidConfig {
                key: "max_queued",
                why: "must be at least 1".into()
            }
            .to_string()
        );
        let mut c = Config::new(16);
        c.max_pending_age = Duration::ZERO;
        assert!(matches!(
            c.validate(),
            Err(Error::InvalidConfig {
                key: "max_pending_age_s",
                ..
            })
        ));
        // A zero timeout is a Config's to hold, not the key's to give.
        c.max_pending_age = Duration::from_secs(1);
        c.lookup_timeout = Duration::ZERO;
        assert!(c.validate().is_ok());
        assert_eq!(setting("max_in_flight").unwrap().flag(), "--max-in-flight");
        let timeout = setting("lookup_timeout_s").unwrap();
        assert_eq!(
            timeout.parse_text("0.25"),
            Ok(Value::Seconds(Duration::from_millis(250)))
        );
        assert_eq!(
            timeout.parse_text("0"),
            Err("0 is not a positive number of seconds".to_owned())
        );
        assert_eq!(
            setting("lookup_on_preemption").unwrap().parse_text("keep"),
            Ok(Value::Preemption(OnPreemption::Keep))
        );
        assert!(setting("block_size").is_none());
    }
}
