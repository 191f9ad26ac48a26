//! Each lookup setting is defined once (`lookup_core::settings::SETTINGS`: key, unit,
//! default, check, meaning); the places that name the settings are checked against
//! that definition here and fail when one lacks a setting or disagrees:
//! - the configuration table of `docs/configuration.md` (key, where vLLM reads it,
//!   default, meaning);
//! - the table of `spec/behaviour.md`, "Configuration" (key, default);
//! - the client builder's typed methods.
//!
//! (The `kv_connector_extra_config` reader is checked in its own unit tests, the
//! `lookup doctor` flags in lookup-cli's.)

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use lookup_core::settings::{SETTINGS, Setting, Source, Value};
use lookup_tokio::{ClientBuilder, LookupClient, OnPreemption};

fn read(path: &str) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The rows of the markdown table whose header line starts with `header`: first cell
/// (backticks and a trailing `**(ours)**` removed) -> every cell.
fn table(text: &str, header: &str) -> BTreeMap<String, Vec<String>> {
    let start = text
        .find(header)
        .unwrap_or_else(|| panic!("no table headed {header:?}"));
    text[start..]
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .map(|line| {
            let cells: Vec<String> = line
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_owned())
                .collect();
            let key = cells[0]
                .trim_end_matches("**(ours)**")
                .trim()
                .trim_matches('`')
                .to_owned();
            (key, cells)
        })
        .collect()
}

/// Rows that are not lifecycle settings: the endpoint's key and vLLM's block size.
const NOT_SETTINGS: [&str; 3] = ["lookup_rpc_port", "(`--block-size`)", "block_size"];

fn check_rows(rows: &BTreeMap<String, Vec<String>>, file: &str) {
    for key in rows.keys() {
        assert!(
            NOT_SETTINGS.contains(&key.as_str()) || lookup_core::settings::setting(key).is_some(),
            "{file} has a row `{key}` that is not a setting"
        );
    }
    for s in &SETTINGS {
        assert!(
            rows.contains_key(s.key),
            "{file} lacks the setting `{}`",
            s.key
        );
    }
}

#[test]
fn the_configuration_table_is_the_settings() {
    let file = "docs/configuration.md";
    let rows = table(
        &read(file),
        "| vLLM key | vLLM 0.33 reads it in | default |",
    );
    check_rows(&rows, file);
    for s in &SETTINGS {
        let row = &rows[s.key];
        assert_eq!(row[1], s.source.to_string(), "{file}, `{}`: source", s.key);
        assert_eq!(
            row[2],
            s.default_value().to_string(),
            "{file}, `{}`: default",
            s.key
        );
        assert!(
            row[4].starts_with(s.doc),
            "{file}, `{}`: the meaning must start with the setting's doc {:?}, is {:?}",
            s.key,
            s.doc,
            row[4]
        );
    }
}

#[test]
fn the_spec_table_is_the_settings() {
    let file = "spec/behaviour.md";
    let rows = table(&read(file), "| key | default | meaning |");
    check_rows(&rows, file);
    for s in &SETTINGS {
        let row = &rows[s.key];
        assert_eq!(
            row[1],
            s.default_value().to_string(),
            "{file}, `{}`: default",
            s.key
        );
        assert_eq!(
            row[0].ends_with("**(ours)**"),
            s.source == Source::Ours,
            "{file}, `{}`: marked (ours) exactly when it is ours",
            s.key
        );
    }
}

/// The builder's typed method for `s`, given a value other than the default.
fn set_with_the_builder(builder: ClientBuilder, s: &Setting, value: Value) -> ClientBuilder {
    match (s.key, value) {
        ("enable_lookup", Value::Switch(v)) => builder.enable_lookup(v),
        ("lookup_async", Value::Switch(v)) => builder.lookup_async(v),
        ("load_async", Value::Switch(v)) => builder.load_async(v),
        ("lookup_prefetch_limit", Value::Count(v)) => builder.lookup_prefetch_limit(v),
        ("lookup_prefetch_ttl_s", Value::Seconds(v)) => builder.lookup_prefetch_ttl(v),
        ("lookup_timeout_s", Value::Seconds(v)) => builder.lookup_timeout(v),
        ("lookup_priority", Value::Switch(v)) => builder.lookup_priority(v),
        ("lookup_share", Value::Switch(v)) => builder.lookup_share(v),
        ("max_in_flight", Value::Count(v)) => builder.max_in_flight(v),
        ("max_queued", Value::Count(v)) => builder.max_queued(v),
        ("max_pending_age_s", Value::Seconds(v)) => builder.max_pending_age(v),
        ("lookup_on_preemption", Value::Preemption(v)) => builder.lookup_on_preemption(v),
        ("lookup_preempted_wait_s", Value::Seconds(v)) => builder.lookup_preempted_wait(v),
        (key, _) => panic!("the builder has no method for the setting `{key}`"),
    }
}

#[test]
fn the_builder_has_a_method_for_every_setting() {
    for s in &SETTINGS {
        let other = match s.default_value() {
            Value::Switch(on) => Value::Switch(!on),
            Value::Count(n) => Value::Count(n + 2),
            Value::Seconds(d) => Value::Seconds(d + Duration::from_millis(750)),
            Value::Preemption(_) => Value::Preemption(OnPreemption::Discard),
        };
        let builder = LookupClient::builder().zmq("tcp://127.0.0.1:5555");
        let config = set_with_the_builder(builder, s, other)
            .build()
            .unwrap_or_else(|e| panic!("{}: {e}", s.key));
        assert_eq!(s.get(&config.core), other, "{}", s.key);
    }
}
