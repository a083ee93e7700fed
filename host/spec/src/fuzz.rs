//! Every parser of a tenant's input, fed arbitrary input: none may panic, and what each
//! accepts must be usable. Schemas, policies and key paths arrive from tenants at install;
//! arguments from agents at every call.

use proptest::prelude::*;
use serde_json::{Map, Value, json};

use crate::keypath::KeyPath;
use crate::policy::{NetworkRule, TenantPolicy};
use crate::{schema, strict};

/// JSON built mostly from JSON Schema's and the policy's own words, so the parsers see
/// shapes they must take apart rather than noise they refuse at once.
fn json_value() -> impl Strategy<Value = Value> {
    const WORDS: &[&str] = &[
        "type",
        "object",
        "string",
        "integer",
        "array",
        "null",
        "properties",
        "items",
        "required",
        "anyOf",
        "oneOf",
        "allOf",
        "not",
        "$ref",
        "#",
        "#/$defs/a",
        "$defs",
        "a",
        "enum",
        "const",
        "pattern",
        "minLength",
        "format",
        "additionalProperties",
        "allow",
        "deny",
        "grants",
        "network",
        "filesystem",
        "dir",
        "guest",
        "write",
        "*",
        "max_concurrent",
        "calls_per_minute",
        "https://x.example:443",
        "^(a+)+$",
        "..",
    ];
    let word = proptest::sample::select(WORDS).prop_map(str::to_owned);
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        word.clone().prop_map(Value::String),
        ".{0,12}".prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 64, 6, move |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((word.clone(), inner), 0..6)
                .prop_map(|entries| Value::Object(entries.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn key_paths_parse_and_select_without_panicking(path in ".{0,40}", args in json_value()) {
        if let Ok(path) = KeyPath::parse(&path) {
            let _ = path.select(&args);
        }
    }

    #[test]
    fn any_schema_compiles_or_is_refused_and_then_checks_any_arguments(
        schema in json_value(),
        args in json_value(),
        strict in any::<bool>(),
    ) {
        let schema = json!({"type": "object", "properties": {"a": schema.clone(), "b": {"$defs": schema}}});
        let _ = schema::cost::check(&schema);
        if let Ok(validator) = schema::compile(&schema, strict) {
            let _ = validator.validate(&args);
        }
        if let Ok(rewritten) = strict::openai_strict(&schema) {
            let mut args = args;
            strict::nulls_as_absent(&schema, &mut args);
            prop_assert!(rewritten.is_object());
        }
    }

    #[test]
    fn any_policy_document_is_read_and_checked_without_panicking(document in json_value()) {
        if let Ok(policy) = serde_json::from_value::<TenantPolicy>(document)
            && policy.validate().is_ok()
        {
            let _ = policy.decide("some_tool", false);
            let _ = policy.grants_for("some_tool");
        }
    }

    #[test]
    fn network_rules_parse_and_match_without_panicking(
        rule in ".{0,40}",
        host in "[a-z0-9.:\\[\\]-]{0,30}",
        port in any::<u16>(),
    ) {
        if let Ok(rule) = rule.parse::<NetworkRule>() {
            let _ = rule.allows("https", &host, port);
            let _ = rule.ip();
        }
    }
}
