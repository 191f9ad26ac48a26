//! The lookup settings as `lookup doctor` flags, made from their one definition
//! (`lookup_core::settings::SETTINGS`): one `--{key}` flag per setting (`_` as `-`),
//! its help the setting's meaning and default, its value read and checked by the
//! setting itself ([`Setting::parse_text`]). A setting added to the definition is a
//! flag here with no other change.

use clap::{Arg, ArgMatches, Args, Command, FromArgMatches};
use lookup_core::Config;
use lookup_core::settings::{SETTINGS, Setting, Unit, Value};

/// The settings the flags gave, over [`Config::new`]'s defaults (its block size is
/// not one of them: `--block-size`).
#[derive(Clone, Debug)]
pub(crate) struct SettingFlags {
    /// Every setting's value: a flag's, else the default.
    pub(crate) core: Config,
}

fn value_name(unit: Unit) -> &'static str {
    match unit {
        Unit::Switch => "BOOL",
        Unit::Count => "N",
        Unit::Seconds => "SECONDS",
        Unit::Preemption => "POLICY",
    }
}

/// The flag of `setting`, its id the setting's key.
fn flag(setting: &'static Setting) -> Arg {
    // clap without its `string` feature names flags with `&'static str`: 13 short
    // names, made once per run.
    let long: &'static str = Box::leak(setting.key.replace('_', "-").into_boxed_str());
    Arg::new(setting.key)
        .long(long)
        .value_name(value_name(setting.unit))
        .help(format!(
            "`{}`: {} [default: {}]",
            setting.key,
            setting.doc,
            setting.default_value()
        ))
        .value_parser(move |text: &str| setting.parse_text(text))
}

impl Args for SettingFlags {
    fn augment_args(cmd: Command) -> Command {
        SETTINGS.iter().fold(cmd, |cmd, s| cmd.arg(flag(s)))
    }

    fn augment_args_for_update(cmd: Command) -> Command {
        Self::augment_args(cmd)
    }
}

impl FromArgMatches for SettingFlags {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut flags = Self {
            core: Config::new(1),
        };
        flags.update_from_arg_matches(matches)?;
        Ok(flags)
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        for s in &SETTINGS {
            if let Some(value) = matches.get_one::<Value>(s.key) {
                s.set(&mut self.core, *value)
                    .map_err(|e| clap::Error::raw(clap::error::ErrorKind::InvalidValue, e))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        settings: SettingFlags,
    }

    /// Every setting is a flag, and its value lands in the core.
    #[test]
    fn every_setting_is_a_flag() {
        for s in &SETTINGS {
            let text = match s.default_value() {
                Value::Switch(on) => (!on).to_string(),
                Value::Count(n) => (n + 2).to_string(),
                Value::Seconds(d) => (d.as_secs_f64() + 0.5).to_string(),
                // Whichever policy is not the default.
                Value::Preemption(lookup_core::OnPreemption::Discard) => "keep".to_owned(),
                Value::Preemption(_) => "discard".to_owned(),
            };
            let flag = s.flag();
            let cli = Cli::try_parse_from(["lookup", flag.as_str(), text.as_str()])
                .unwrap_or_else(|e| panic!("{flag}: {e}"));
            assert_eq!(
                s.get(&cli.settings.core),
                s.parse_text(&text).unwrap(),
                "{flag}"
            );
            assert_ne!(s.get(&cli.settings.core), s.default_value(), "{flag}");
        }
        let defaults = Cli::try_parse_from(["lookup"]).unwrap();
        assert_eq!(defaults.settings.core, Config::new(1));
    }

    #[test]
    fn a_bad_value_is_refused_naming_the_flag() {
        let error = Cli::try_parse_from(["lookup", "--max-in-flight", "0"])
            .err()
            .unwrap()
            .to_string();
        assert!(
            error.contains("--max-in-flight") && error.contains("must be at least 1"),
            "{error}"
        );
    }
}
