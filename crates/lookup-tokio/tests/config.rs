//! Configuration rules: vLLM's `kv_connector_extra_config` read with vLLM's key names
//! (float seconds into `Duration`s, unknown and mistyped keys named), the builder,
//! and the typed master address. Each error is checked by its exact text.

use std::time::Duration;

use lookup_tokio::{
    ClientConfig, Config, DirectConfig, Endpoint, Error, KeyLayout, KvConnectorExtraConfig,
    LookupClient, Transport, ZmqConfig,
};
use serde_json::json;

fn strict(extra: serde_json::Value) -> Result<KvConnectorExtraConfig, String> {
    KvConnectorExtraConfig::from_kv_connector_extra_config(&extra).map_err(|e| e.to_string())
}

fn lenient(extra: serde_json::Value) -> Result<KvConnectorExtraConfig, String> {
    KvConnectorExtraConfig::from_kv_connector_extra_config_lenient(&extra)
        .map_err(|e| e.to_string())
}

#[test]
fn an_empty_extra_config_gives_the_spec_defaults() {
    let keys = strict(json!({})).unwrap();
    assert_eq!(keys, KvConnectorExtraConfig::default());
    assert_eq!(keys.core(16), Config::new(16));
    assert_eq!(keys.lookup_prefetch_ttl, Duration::from_secs(2));
    assert_eq!(keys.lookup_timeout, Duration::from_secs(5));
    assert!(!keys.lookup_async);
    assert_eq!(keys.lookup_rpc_port, 0);
}

#[test]
fn every_key_is_read_with_vllms_name_and_float_seconds() {
    let keys = strict(json!({
        "enable_lookup": false,
        "lookup_async": true,
        "load_async": false,
        "lookup_prefetch_limit": 32,
        "lookup_prefetch_ttl_s": 0.25,
        "lookup_timeout_s": 1.5,
        "lookup_priority": false,
        "lookup_share": false,
        "max_in_flight": 4,
        "max_queued": 100,
        "lookup_rpc_port": 7,
    }))
    .unwrap();
    let core = keys.core(512);
    let mut expected = Config::new(512);
    expected.enable_lookup = false;
    expected.lookup_async = true;
    expected.load_async = false;
    expected.lookup_prefetch_limit = 32;
    expected.lookup_prefetch_ttl = Duration::from_millis(250);
    expected.lookup_timeout = Duration::from_millis(1500);
    expected.lookup_priority = false;
    expected.lookup_share = false;
    expected.max_in_flight = 4;
    expected.max_queued = 100;
    assert_eq!(core, expected);
    assert_eq!(keys.lookup_rpc_port, 7);
}

#[test]
fn integer_seconds_and_huge_seconds_are_read() {
    let keys = strict(json!({"lookup_prefetch_ttl_s": 3, "lookup_timeout_s": 1e20})).unwrap();
    assert_eq!(keys.lookup_prefetch_ttl, Duration::from_secs(3));
    assert_eq!(keys.lookup_timeout, Duration::MAX);
    let keys = strict(json!({"lookup_prefetch_ttl_s": 0.0})).unwrap();
    assert_eq!(keys.lookup_prefetch_ttl, Duration::ZERO);
}

#[test]
fn bad_seconds_are_errors_naming_the_key() {
    assert_eq!(
        strict(json!({"lookup_prefetch_ttl_s": -1.0})).unwrap_err(),
        "kv_connector_extra_config key `lookup_prefetch_ttl_s`: -1 is not a finite number of seconds >= 0"
    );
    assert_eq!(
        strict(json!({"lookup_timeout_s": -0.5})).unwrap_err(),
        "kv_connector_extra_config key `lookup_timeout_s`: -0.5 is not a finite number of seconds >= 0"
    );
    assert_eq!(
        strict(json!({"lookup_timeout_s": 0})).unwrap_err(),
        "kv_connector_extra_config key `lookup_timeout_s`: 0 is not a positive number of seconds"
    );
    assert_eq!(
        strict(json!({"lookup_timeout_s": "5"})).unwrap_err(),
        "kv_connector_extra_config key `lookup_timeout_s`: invalid type: string \"5\", expected f64"
    );
}

#[test]
fn a_mistyped_value_is_an_error_naming_the_key() {
    assert_eq!(
        strict(json!({"lookup_async": "true"})).unwrap_err(),
        "kv_connector_extra_config key `lookup_async`: invalid type: string \"true\", expected a boolean"
    );
    assert_eq!(
        strict(json!({"lookup_prefetch_limit": -1})).unwrap_err(),
        "kv_connector_extra_config key `lookup_prefetch_limit`: invalid value: integer `-1`, expected u32"
    );
    assert_eq!(
        lenient(json!({"max_in_flight": 1.5})).unwrap_err(),
        "kv_connector_extra_config key `max_in_flight`: invalid type: floating point `1.5`, expected u32"
    );
}

/// `max_pending_age_s` is read as float seconds into `Config::max_pending_age`
/// (default 5 s), and 0 is refused naming the key, by the reader and by
/// `Config::validate`.
#[test]
fn max_pending_age_s_is_read_and_must_be_positive() {
    assert_eq!(
        strict(json!({})).unwrap().max_pending_age,
        Duration::from_secs(5)
    );
    let keys = strict(json!({"max_pending_age_s": 0.25})).unwrap();
    assert_eq!(keys.max_pending_age, Duration::from_millis(250));
    assert_eq!(keys.core(16).max_pending_age, Duration::from_millis(250));
    assert_eq!(
        strict(json!({"max_pending_age_s": 0})).unwrap_err(),
        "kv_connector_extra_config key `max_pending_age_s`: 0 is not a positive number of seconds"
    );
    let mut core = Config::new(16);
    core.max_pending_age = Duration::ZERO;
    assert_eq!(
        core.validate().unwrap_err().to_string(),
        "invalid configuration `max_pending_age_s`: 0 is not a positive number of seconds"
    );
}

#[test]
fn an_unknown_key_is_an_error_unless_lenient() {
    let extra = json!({"lookup_asnyc": true, "lookup_prefetch_limit": 8});
    assert_eq!(
        strict(extra.clone()).unwrap_err(),
        "kv_connector_extra_config key `lookup_asnyc`: unknown key (known: enable_lookup, \
         lookup_async, load_async, lookup_prefetch_limit, lookup_prefetch_ttl_s, \
         lookup_timeout_s, lookup_priority, lookup_share, max_in_flight, max_queued, \
         max_pending_age_s, lookup_on_preemption, lookup_preempted_wait_s, lookup_rpc_port)"
    );
    let keys = lenient(extra).unwrap();
    assert_eq!(keys.lookup_prefetch_limit, 8);
    assert!(!keys.lookup_async);
}

#[test]
fn vllms_store_keys_are_accepted_and_ignored() {
    let keys = strict(json!({
        "cache_prefix": "tenant-a",
        "save_decode_cache": true,
        "store_tp_size": 2,
        "enable_store_tp_lcm": false,
        "prefill_tp_sizes": [2, 4],
        "enable_cross_layers_blocks": "False",
        "enable_group_semantics": "False",
        "custom_mem_pool": "",
        "mooncake_protocol": "tcp",
        "preferred_segment": null,
        "lookup_async": true,
    }))
    .unwrap();
    assert_eq!(
        keys,
        strict(json!({"lookup_async": true})).unwrap(),
        "store keys change nothing"
    );
}

#[test]
fn an_extra_config_that_is_not_an_object_is_an_error() {
    assert_eq!(
        strict(json!([1, 2])).unwrap_err(),
        "kv_connector_extra_config key `kv_connector_extra_config`: expected a JSON object, got [1,2]"
    );
}

fn built(builder: lookup_tokio::ClientBuilder) -> Result<ClientConfig, String> {
    builder.build().map_err(|e| e.to_string())
}

#[test]
fn the_builder_sets_every_field_it_names() {
    let config = built(
        LookupClient::builder()
            .zmq("tcp://127.0.0.1:5555")
            .block_size(512)
            .lookup_async(true)
            .lookup_prefetch_limit(32)
            .lookup_prefetch_ttl(Duration::from_millis(1500))
            .lookup_timeout(Duration::from_secs(2))
            .max_in_flight(4)
            .event_capacity(10)
            .wait_margin(Duration::from_millis(7))
            .probe_budget(Duration::from_millis(3)),
    )
    .unwrap();
    let mut expected = ClientConfig::zmq("tcp://127.0.0.1:5555".parse().unwrap(), 512);
    expected.core.lookup_async = true;
    expected.core.lookup_prefetch_limit = 32;
    expected.core.lookup_prefetch_ttl = Duration::from_millis(1500);
    expected.core.lookup_timeout = Duration::from_secs(2);
    expected.core.max_in_flight = 4;
    expected.event_capacity = 10;
    expected.wait_margin = Duration::from_millis(7);
    expected.probe_budget = Duration::from_millis(3);
    assert_eq!(config, expected);
}

#[test]
fn the_builder_defaults_are_the_spec_defaults_at_block_size_16() {
    let config = built(LookupClient::builder().zmq("ipc:///tmp/x")).unwrap();
    assert_eq!(
        config,
        ClientConfig::zmq(Endpoint::Ipc("/tmp/x".into()), 16)
    );
    assert_eq!(
        config.transport,
        Transport::Zmq(ZmqConfig::new(Endpoint::Ipc("/tmp/x".into())))
    );
    assert_eq!(config.event_capacity, 1024);
    assert_eq!(config.wait_margin, Duration::from_millis(100));
    assert_eq!(config.probe_budget, Duration::ZERO);
}

#[test]
fn the_builder_reads_the_extra_config_and_later_calls_override_it() {
    let extra = json!({"lookup_async": true, "lookup_prefetch_limit": 8});
    let config = built(
        LookupClient::builder()
            .zmq("tcp://127.0.0.1:5555")
            .kv_connector_extra_config(&extra)
            .lookup_prefetch_limit(2),
    )
    .unwrap();
    assert!(config.core.lookup_async);
    assert_eq!(config.core.lookup_prefetch_limit, 2);
    assert_eq!(
        built(
            LookupClient::builder()
                .zmq("tcp://127.0.0.1:5555")
                .kv_connector_extra_config(&json!({"lookup_asnyc": true}))
        )
        .unwrap_err()
        .split(" (known")
        .next(),
        Some("kv_connector_extra_config key `lookup_asnyc`: unknown key")
    );
    let config = built(
        LookupClient::builder()
            .zmq("tcp://127.0.0.1:5555")
            .kv_connector_extra_config_lenient(&json!({"lookup_asnyc": true})),
    )
    .unwrap();
    assert!(!config.core.lookup_async);
}

#[test]
fn the_builder_reports_the_first_bad_setting() {
    assert_eq!(
        built(LookupClient::builder()).unwrap_err(),
        "invalid client configuration `transport`: no transport: call zmq, direct or transport"
    );
    assert_eq!(
        built(LookupClient::builder().zmq("tcp://nowhere")).unwrap_err(),
        "invalid client configuration `endpoint`: bad endpoint `tcp://nowhere`: missing :PORT"
    );
    assert_eq!(
        built(LookupClient::builder().direct("not-a-host", KeyLayout::default())).unwrap_err(),
        "invalid client configuration `master`: invalid Mooncake master address not-a-host: expected host:port"
    );
    assert_eq!(
        built(
            LookupClient::builder()
                .direct("not-a-host", KeyLayout::default())
                .zmq("tcp://127.0.0.1:5555")
        )
        .unwrap_err(),
        "invalid client configuration `master`: invalid Mooncake master address not-a-host: expected host:port",
        "a later good transport does not hide an earlier mistake"
    );
    assert_eq!(
        built(
            LookupClient::builder()
                .zmq("tcp://127.0.0.1:5555")
                .block_size(0)
        )
        .unwrap_err(),
        "invalid configuration `block_size`: must be at least 1 token"
    );
    assert_eq!(
        built(
            LookupClient::builder()
                .zmq("tcp://127.0.0.1:5555")
                .max_in_flight(0)
        )
        .unwrap_err(),
        "invalid configuration `max_in_flight`: must be at least 1"
    );
}

#[test]
fn the_direct_transport_holds_its_own_settings() {
    let config = built(
        LookupClient::builder().direct("etcd://127.0.0.1:2379;127.0.0.1:2380", KeyLayout::new("m")),
    )
    .unwrap();
    let Transport::Direct(direct) = &config.transport else {
        panic!("expected the direct transport, got {:?}", config.transport);
    };
    assert_eq!(
        direct.master.to_string(),
        "etcd://127.0.0.1:2379;127.0.0.1:2380"
    );
    assert_eq!(direct.connect_backoff, Duration::from_millis(10));
    assert_eq!(direct.lease_ttl, Duration::from_secs(10));
    assert_eq!(
        config.transport.target(),
        "etcd://127.0.0.1:2379;127.0.0.1:2380"
    );
    let mut direct = DirectConfig::parse("127.0.0.1:50051", KeyLayout::default()).unwrap();
    direct.master_config.chunk_keys = 0;
    assert_eq!(
        built(LookupClient::builder().transport(direct)).unwrap_err(),
        "invalid client configuration `master_config.chunk_keys`: must be at least 1"
    );
}

#[test]
fn connect_outside_a_runtime_is_an_error() {
    let err =
        LookupClient::connect_lazy(ClientConfig::zmq("tcp://127.0.0.1:1".parse().unwrap(), 16))
            .expect_err("no runtime");
    assert!(matches!(err, Error::NoRuntime), "{err}");
}

/// With the direct transport the client builds the store keys: a key-changing setting
/// its layout does not carry is an error naming it (a silent miss otherwise); one the
/// layout carries, or any with ZeroMQ (the worker's), is accepted.
#[test]
fn a_store_key_setting_the_direct_layout_does_not_carry_is_refused() {
    let with = |layout: KeyLayout, extra: serde_json::Value| {
        built(
            LookupClient::builder()
                .direct("127.0.0.1:50051", layout)
                .kv_connector_extra_config(&extra),
        )
    };
    let plain = KeyLayout::new("m");
    let prefixed = KeyLayout::new("m").with_cache_prefix(Some("tenant-a".to_owned()));
    for (key, value) in [
        ("cache_prefix", json!("tenant-a")),
        ("store_tp_size", json!(4)),
        ("enable_store_tp_lcm", json!(true)),
        ("enable_cross_layers_blocks", json!(true)),
    ] {
        let error = with(plain.clone(), json!({ key: value })).unwrap_err();
        assert!(
            error.starts_with(&format!("kv_connector_extra_config key `{key}`")),
            "{error}"
        );
        assert!(error.contains("VllmSetup::direct_client_config"), "{error}");
        assert!(
            built(
                LookupClient::builder()
                    .zmq("ipc:///tmp/unused")
                    .kv_connector_extra_config(&json!({ key: value }))
            )
            .is_ok(),
            "{key} is the worker's with ZeroMQ"
        );
    }
    assert!(with(prefixed, json!({ "cache_prefix": "tenant-a" })).is_ok());
    assert!(with(plain, json!({ "enable_cross_layers_blocks": false })).is_ok());
}

/// Rule 8's keys: `lookup_on_preemption` by name, `lookup_preempted_wait_s` in
/// seconds; a name that is not one of the four is an error naming the key.
#[test]
fn the_preemption_keys_are_read_by_name() {
    let read = |extra: serde_json::Value| {
        KvConnectorExtraConfig::from_kv_connector_extra_config(&extra).map_err(|e| e.to_string())
    };
    let keys =
        read(json!({ "lookup_on_preemption": "wait", "lookup_preempted_wait_s": 0.25 })).unwrap();
    let core = keys.core(16);
    assert_eq!(core.lookup_on_preemption, lookup_tokio::OnPreemption::Wait);
    assert_eq!(core.lookup_preempted_wait, Duration::from_millis(250));
    let error = read(json!({ "lookup_on_preemption": "drop" })).unwrap_err();
    assert!(
        error.starts_with("kv_connector_extra_config key `lookup_on_preemption`"),
        "{error}"
    );
}
