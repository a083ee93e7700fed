//! Progressive disclosure: bridges instead of schemas, ranked search, and `tool_call` through
//! the same pipeline as a direct call.

#[path = "support/plugins.rs"]
#[allow(dead_code)] // not every test file uses every helper
mod plugins;

use std::sync::Arc;

use plugins::plugin;
use serde_json::{Value, json};
use toolhost::disclosure::{
    Disclosure, DisclosureConfig, Mode, TOOL_CALL, TOOL_DESCRIBE, TOOL_SEARCH,
};
use toolhost::{CallError, Caller, Host, HostConfig, ToolSpec};

async fn host() -> Arc<Host> {
    let host = Arc::new(Host::open(HostConfig::default()).unwrap());
    for name in ["text_stats", "json_query", "unit_convert"] {
        host.install("acme", plugin(name)).await.unwrap();
    }
    let mut private = ToolSpec::new(
        "internal_audit",
        "Audits units and text internally.",
        json!({"type": "object"}),
    );
    private.private = true;
    host.natives()
        .register(private, |_, _, _| async { Ok(Value::Null) })
        .unwrap();
    host
}

fn names(specs: &[ToolSpec]) -> Vec<&str> {
    specs.iter().map(|s| s.name.as_str()).collect()
}

#[tokio::test]
async fn when_on_the_agent_sees_bridges_and_eager_tools_only() {
    let host = host().await;
    let on = DisclosureConfig {
        enabled: Mode::On,
        eager_tools: vec!["json_query".into()],
        ..DisclosureConfig::default()
    };
    let listing = Disclosure::new(host.clone(), on).listing("acme");
    assert_eq!(
        names(&listing),
        ["json_query", TOOL_SEARCH, TOOL_DESCRIBE, TOOL_CALL]
    );

    let off = Disclosure::new(
        host.clone(),
        DisclosureConfig {
            enabled: Mode::Off,
            ..DisclosureConfig::default()
        },
    );
    assert_eq!(
        off.listing("acme").len(),
        4,
        "all visible tools, no bridges"
    );

    let auto_small = Disclosure::new(host.clone(), DisclosureConfig::default());
    assert!(
        names(&auto_small.listing("acme")).contains(&"text_stats"),
        "a small catalog is listed in full"
    );
    let auto_tight = DisclosureConfig {
        listing_max_tokens: 100,
        ..DisclosureConfig::default()
    };
    let listing = Disclosure::new(host.clone(), auto_tight).listing("acme");
    assert_eq!(
        names(&listing),
        [TOOL_SEARCH, TOOL_DESCRIBE, TOOL_CALL],
        "auto switches on past the threshold"
    );

    let no_bridge = DisclosureConfig {
        enabled: Mode::On,
        call_bridge: false,
        ..DisclosureConfig::default()
    };
    assert_eq!(
        names(&Disclosure::new(host.clone(), no_bridge).listing("acme")),
        [TOOL_SEARCH, TOOL_DESCRIBE]
    );
}

#[tokio::test]
async fn search_finds_tools_with_inline_schemas_and_describe_shows_one() {
    let host = host().await;
    let config = DisclosureConfig {
        enabled: Mode::On,
        search_inline_schema_max: 1,
        ..DisclosureConfig::default()
    };
    let disclosure = Disclosure::new(host, config);
    let acme = Caller::tenant("acme");
    let found = disclosure
        .call(
            &acme,
            TOOL_SEARCH,
            json!({"query": "convert 3 miles to kilometers", "limit": 3}),
        )
        .await
        .unwrap();
    let results = found["results"].as_array().unwrap();
    assert_eq!(results[0]["name"], "convert_units", "{found}");
    assert_eq!(
        results[0]["parameters"]["required"],
        json!(["value", "from", "to"])
    );
    assert!(
        results
            .iter()
            .skip(1)
            .all(|r| r.get("parameters").is_none()),
        "only the top hit inlines its schema"
    );
    assert!(
        results.iter().all(|r| r["name"] != "internal_audit"),
        "private tools are never found"
    );

    let found = disclosure
        .call(
            &acme,
            TOOL_SEARCH,
            json!({"query": "count words in this text"}),
        )
        .await
        .unwrap();
    assert_eq!(found["results"][0]["name"], "text_stats");

    let described = disclosure
        .call(&acme, TOOL_DESCRIBE, json!({"name": "json_query"}))
        .await
        .unwrap();
    assert_eq!(
        described["parameters"]["properties"]["path"]["type"],
        "string"
    );
    let hidden = disclosure
        .call(&acme, TOOL_DESCRIBE, json!({"name": "internal_audit"}))
        .await;
    assert_eq!(hidden.unwrap_err().code(), "not_found");
    let other_tenant = disclosure
        .call(
            &Caller::tenant("globex"),
            TOOL_DESCRIBE,
            json!({"name": "json_query"}),
        )
        .await;
    assert_eq!(other_tenant.unwrap_err().code(), "not_found");
}

#[tokio::test]
async fn tool_call_runs_the_real_pipeline() {
    let host = host().await;
    let disclosure = Disclosure::new(
        host,
        DisclosureConfig {
            enabled: Mode::On,
            ..DisclosureConfig::default()
        },
    );
    let acme = Caller::tenant("acme");
    let converted = disclosure
        .call(
            &acme,
            TOOL_CALL,
            json!({"name": "convert_units", "arguments": {"value": 2, "from": "km", "to": "m"}}),
        )
        .await
        .unwrap();
    assert_eq!(converted["value"], json!(2000.0));
    let invalid = disclosure
        .call(
            &acme,
            TOOL_CALL,
            json!({"name": "convert_units", "arguments": {"value": "two"}}),
        )
        .await
        .unwrap_err();
    let CallError::InvalidArgs { errors } = invalid else {
        panic!("{invalid:?}")
    };
    assert!(errors.iter().any(|e| e.path == "/value"), "{errors:?}");
    let tool_error = disclosure
        .call(
            &acme,
            TOOL_CALL,
            json!({"name": "convert_units", "arguments": {"value": 1, "from": "kg", "to": "m"}}),
        )
        .await
        .unwrap_err();
    assert_eq!(tool_error.code(), "tool_error");
    let private = disclosure
        .call(
            &acme,
            TOOL_CALL,
            json!({"name": "internal_audit", "arguments": {}}),
        )
        .await;
    assert_eq!(private.unwrap_err().code(), "not_found");
    let recursive = disclosure
        .call(
            &acme,
            TOOL_CALL,
            json!({"name": TOOL_SEARCH, "arguments": {"query": "x"}}),
        )
        .await;
    assert_eq!(recursive.unwrap_err().code(), "invalid_args");
}

#[tokio::test]
async fn search_sees_tools_installed_or_registered_after_the_index_was_built() {
    let host = Arc::new(Host::open(HostConfig::default()).unwrap());
    host.install("acme", plugin("unit_convert")).await.unwrap();
    let disclosure = Disclosure::new(
        host.clone(),
        DisclosureConfig {
            enabled: Mode::On,
            ..DisclosureConfig::default()
        },
    );
    let acme = Caller::tenant("acme");
    let search = |query: &'static str| disclosure.call(&acme, TOOL_SEARCH, json!({"query": query}));
    assert!(
        search("word frequency").await.unwrap()["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["name"] != "word_frequency")
    );
    host.install("acme", plugin("text_stats")).await.unwrap();
    assert_eq!(
        search("word frequency").await.unwrap()["results"][0]["name"],
        "word_frequency"
    );
    let spec = ToolSpec::new(
        "send_invoice",
        "Sends an invoice to a customer.",
        json!({"type": "object"}),
    );
    host.natives()
        .register(spec, |_, _, _| async { Ok(Value::Null) })
        .unwrap();
    assert_eq!(
        search("invoice a customer").await.unwrap()["results"][0]["name"],
        "send_invoice"
    );
    assert!(host.remove("acme", "word_frequency").unwrap());
    let after = search("word frequency").await.unwrap();
    assert!(
        after["results"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["name"] != "word_frequency"),
        "{after}"
    );
}
