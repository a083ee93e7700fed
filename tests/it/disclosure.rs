//! Progressive disclosure: bridges instead of schemas, ranked search, and `tool_call` through
//! the same pipeline as a direct call.

use std::sync::Arc;

use crate::plugins::plugin;
use serde_json::{Value, json};
use toolhost::{CallError, Caller, Host, HostConfig, ToolSpec};
use toolhost_search::encoder::SentenceEncoder;
use toolhost_server::bridges::{
    Disclosure, DisclosureConfig, Mode, TOOL_CALL, TOOL_DESCRIBE, TOOL_SEARCH,
};

async fn host() -> Arc<Host> {
    let host = Arc::new(Host::open(crate::plugins::config()).await.unwrap());
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
    let host = Arc::new(Host::open(crate::plugins::config()).await.unwrap());
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
    assert!(host.remove("acme", "word_frequency").await.unwrap());
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

/// The contextual search model, which `scripts/test` fetches and names in
/// TOOLHOST_SEARCH_MODEL. Without it a bare `cargo test` skips these tests, saying so, and CI
/// fails them.
fn search_model() -> Option<Arc<SentenceEncoder>> {
    let dir = crate::plugins::search_model()?;
    let encoder = SentenceEncoder::load(&dir).expect("TOOLHOST_SEARCH_MODEL loads");
    Some(Arc::new(encoder))
}

#[test]
fn the_contextual_encoder_agrees_with_a_reference_implementation() {
    let Some(encoder) = search_model() else {
        return;
    };
    // The reference: the same weights run in numpy (float32, exact GELU) on the same texts.
    // The encoder's int8 products move each figure by up to 0.007.
    let home = encoder.encode("how much is my apartment worth");
    let value = encoder.encode("estimate the market value of a property");
    let disk = encoder.encode("check disk storage usage");
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    assert_eq!(home.len(), encoder.dimensions());
    assert!((dot(&home, &home) - 1.0).abs() < 1e-4);
    for (got, want) in [
        (dot(&home, &value), 0.397_20),
        (dot(&home, &disk), 0.115_49),
        (home[0], 0.087_31),
        (home[1], 0.006_95),
        (home[2], -0.015_24),
        (home[3], 0.053_12),
    ] {
        assert!(
            (got - want).abs() < 0.01,
            "{got} against the reference {want}"
        );
    }
}

/// Queries from the evaluation set that the static ranking misses (`cargo bench --bench
/// search` lists them), with the tool each asks for.
const PHRASE_QUERIES: [(&str, &str); 5] = [
    ("what is Apple trading at right now", "stocks_quote"),
    ("when do Arsenal play next", "sports_fixtures"),
    ("show my salary slip for March", "hr_payslip"),
    (
        "shut down the staging VM to save money",
        "cloud_stop_instance",
    ),
    (
        "how much is my apartment worth",
        "realestate_estimate_value",
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_search_model_tool_search_finds_what_the_static_ranking_misses() {
    let Some(encoder) = search_model() else {
        return;
    };
    let set: Value = serde_json::from_str(include_str!(
        "../../host/search/benches/data/search-eval.json"
    ))
    .unwrap();
    let host = Arc::new(Host::open(crate::plugins::config()).await.unwrap());
    // The queries' domains and those of the static ranking's wrong answers: 100 tools, so
    // that a debug build encodes them in seconds.
    let domains = [
        "stocks",
        "sports",
        "hr",
        "cloud",
        "realestate",
        "analytics",
        "music",
        "recruiting",
        "currency",
        "files",
    ];
    for tool in set["tools"].as_array().unwrap() {
        let name = tool["name"].as_str().unwrap();
        if !domains.iter().any(|d| name.starts_with(&format!("{d}_"))) {
            continue;
        }
        let spec = ToolSpec::new(
            name,
            tool["description"].as_str().unwrap(),
            tool["parameters"].clone(),
        );
        host.natives()
            .register(spec, |_, _, _| async { Ok(Value::Null) })
            .unwrap();
    }
    let found = |disclosure: Disclosure| async move {
        let mut found = 0;
        for (query, expected) in PHRASE_QUERIES {
            let hits = disclosure
                .call(
                    &Caller::tenant("acme"),
                    TOOL_SEARCH,
                    json!({"query": query}),
                )
                .await
                .unwrap();
            let hits = hits["results"].as_array().unwrap();
            found += usize::from(hits.iter().any(|h| h["name"] == expected));
        }
        found
    };
    let config = DisclosureConfig {
        enabled: Mode::On,
        ..DisclosureConfig::default()
    };
    let with_model = DisclosureConfig {
        search_model: Some(encoder),
        ..config.clone()
    };
    let without = found(Disclosure::new(host.clone(), config)).await;
    assert!(
        without < 3,
        "static ranking found {without}: pick queries it misses"
    );
    assert_eq!(
        found(Disclosure::new(host, with_model)).await,
        PHRASE_QUERIES.len()
    );
}

/// Tool vectors are kept in the store beside the catalog: after a restart, only the query is encoded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_reuses_the_stored_search_vectors() {
    let Some(first_encoder) = search_model() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let open = async || {
        Arc::new(
            Host::open(HostConfig {
                data_dir: Some(dir.path().to_owned()),
                ..crate::plugins::config()
            })
            .await
            .unwrap(),
        )
    };
    let search = |host: Arc<Host>, encoder: Arc<SentenceEncoder>| async move {
        let config = DisclosureConfig {
            enabled: Mode::On,
            search_model: Some(encoder),
            ..DisclosureConfig::default()
        };
        let found = Disclosure::new(host, config)
            .call(
                &Caller::tenant("acme"),
                TOOL_SEARCH,
                json!({"query": "how many kilometres is 3 miles"}),
            )
            .await
            .unwrap();
        found["results"][0]["name"].clone()
    };

    let host = open().await;
    host.install("acme", plugin("unit_convert")).await.unwrap();
    let tools = host.list("acme").len() as u64;
    assert_eq!(search(host, first_encoder.clone()).await, "convert_units");
    assert_eq!(
        first_encoder.encoded(),
        tools + 1,
        "each tool, then the query"
    );

    let restarted_encoder = search_model().unwrap();
    assert_eq!(
        search(open().await, restarted_encoder.clone()).await,
        "convert_units"
    );
    assert_eq!(restarted_encoder.encoded(), 1, "only the query");
}

/// Each changed description leaves a stored vector behind: collecting removes those of texts
/// no tool has now, and nothing a tool needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_search_vectors_of_replaced_texts_are_collected() {
    let Some(encoder) = search_model() else {
        return;
    };
    let host = Arc::new(Host::open(crate::plugins::config()).await.unwrap());
    let weather = |description: &str| {
        let spec = json!({"name": "weather", "description": description,
                          "parameters": {"type": "object"}});
        let def = json!({"spec": spec, "request": {"method": "get", "url": "http://127.0.0.1:9/"}});
        serde_json::from_value(def).unwrap()
    };
    host.install_http("acme", weather("Reports the weather."))
        .await
        .unwrap();
    host.install_http("globex", weather("Forecasts rain."))
        .await
        .unwrap();
    let with = |encoder: Arc<SentenceEncoder>| {
        let config = DisclosureConfig {
            enabled: Mode::On,
            search_model: Some(encoder),
            ..DisclosureConfig::default()
        };
        Disclosure::new(host.clone(), config)
    };
    let search = async |disclosure: &Disclosure, tenant: &str| {
        let query = json!({"query": "weather"});
        (disclosure
            .call(&Caller::tenant(tenant), TOOL_SEARCH, query)
            .await)
            .unwrap();
    };
    let disclosure = with(encoder);
    search(&disclosure, "acme").await;
    search(&disclosure, "globex").await;
    host.install_http("acme", weather("Tells the temperature outside."))
        .await
        .unwrap();
    search(&disclosure, "acme").await;
    assert_eq!(disclosure.collect_vectors().await.unwrap(), 1);
    assert_eq!(disclosure.collect_vectors().await.unwrap(), 0);
    // What is left is what the tools need: searching again encodes only the queries.
    let fresh = search_model().unwrap();
    let again = with(fresh.clone());
    search(&again, "acme").await;
    search(&again, "globex").await;
    assert_eq!(fresh.encoded(), 2, "only the queries");
}

/// The bridges check their arguments against the schemas they list, as any tool does.
#[tokio::test]
async fn the_bridges_enforce_their_own_input_schemas() {
    let host = host().await;
    let disclosure = Disclosure::new(host.clone(), DisclosureConfig::default());
    let caller = Caller::tenant("acme");
    for (bridge, args, at) in [
        (TOOL_SEARCH, json!({"query": 5}), "/query"),
        (
            TOOL_SEARCH,
            json!({"query": "units", "limit": 10_000}),
            "/limit",
        ),
        (TOOL_SEARCH, json!({}), "/query"),
        (TOOL_SEARCH, json!({"query": "q".repeat(1001)}), "/query"),
        (TOOL_DESCRIBE, json!({"name": ["text_stats"]}), "/name"),
        (
            TOOL_CALL,
            json!({"name": "text_stats", "arguments": "text"}),
            "/arguments",
        ),
    ] {
        match disclosure.call(&caller, bridge, args.clone()).await {
            Err(CallError::InvalidArgs { errors }) => {
                assert_eq!(errors[0].path, at, "{bridge} {args}: {errors:?}");
            }
            other => panic!("{bridge} {args}: {other:?}"),
        }
    }
    let found = disclosure
        .call(&caller, TOOL_SEARCH, json!({"query": "units", "limit": 2}))
        .await
        .unwrap();
    assert!(found["results"].as_array().unwrap().len() <= 2);
}
