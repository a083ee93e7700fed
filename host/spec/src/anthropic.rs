//! Anthropic's `input_schema`: what the Messages API takes for every tool, and the narrower
//! subset of its strict tool use (`"strict": true`) for a tool marked `strict`.
//!
//! The rules are those of Anthropic's structured-outputs guide, as its official SDKs apply
//! them (`transform_schema`): every object closed, one type per schema (`anyOf` otherwise),
//! string formats from [`ANTHROPIC_STRICT_FORMATS`], `minItems` of 0 or 1, and no other
//! constraint. A constraint outside the subset moves into the schema's `description`
//! (`{"minimum":1}`), as those SDKs move it: the model can still read it, and the host checks
//! every call against the tool's full schema whatever the export says. The test
//! `e2e::every_example_tools_anthropic_export_is_what_the_official_sdk_sends` holds this to
//! the SDK's own transform.

use serde_json::{Map, Value, json};

use crate::strict::{DROPPED_ANNOTATIONS, OTHER_JSON_SCHEMA_FORMATS, STRICT_FORMATS};

/// The string formats Anthropic's strict tool use knows.
pub const ANTHROPIC_STRICT_FORMATS: &[&str] = &[
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "uri",
    "ipv4",
    "ipv6",
    "uuid",
];
/// The Messages API refuses these at the top of any `input_schema`.
const ROOT_COMBINATORS: &[&str] = &["anyOf", "oneOf", "allOf"];

/// The tool's `input_schema`: its parameters within the strict subset if `strict`, and in
/// every case without a combinator at the top (moved into the description).
pub fn input_schema(parameters: &Value, strict: bool) -> Value {
    let mut schema = match strict {
        true => strict_schema(parameters),
        false => parameters.clone(),
    };
    if let Some(map) = schema.as_object_mut() {
        let moved: Map<String, Value> = ROOT_COMBINATORS
            .iter()
            .filter_map(|keyword| map.remove_entry(*keyword))
            .collect();
        describe(map, moved);
    }
    schema
}

/// `schema` within the strict subset; the part outside it is in its description.
fn strict_schema(schema: &Value) -> Value {
    let Some(given) = schema.as_object() else {
        return schema.clone(); // `true`/`false` schemas
    };
    let mut rest = given.clone();
    rest.retain(|keyword, _| !DROPPED_ANNOTATIONS.contains(&keyword.as_str()));
    let mut out = Map::new();
    // `definitions` is the older name of `$defs`, the only one the subset has.
    for keyword in ["$defs", "definitions"] {
        if let Some(Value::Object(defs)) = rest.remove(keyword) {
            let all = out.entry("$defs").or_insert_with(|| json!({}));
            for (name, def) in defs {
                all[name] = strict_schema(&def);
            }
        }
    }
    if let Some(Value::String(reference)) = rest.remove("$ref") {
        let reference = reference.replacen("#/definitions/", "#/$defs/", 1);
        out.insert("$ref".into(), Value::String(reference));
        return Value::Object(out);
    }
    for keyword in ["description", "title"] {
        if let Some(text) = rest.remove(keyword) {
            out.insert(keyword.into(), text);
        }
    }
    let literal = |value: &Value| !value.is_object() && !value.is_array();
    if let Some(Value::Array(values)) = rest.get("enum")
        && !values.is_empty()
        && values.iter().all(literal)
    {
        out.insert("enum".into(), rest.remove("enum").unwrap());
    }
    if rest.get("const").is_some_and(literal) {
        out.insert("const".into(), rest.remove("const").unwrap());
    }
    let has_literals = out.contains_key("enum") || out.contains_key("const");
    // A literal says its type: a `type` beside it is redundant.
    let kind = rest.remove("type").filter(|_| !has_literals);
    if let Some(Value::Array(variants)) = rest.remove("anyOf").or_else(|| rest.remove("oneOf")) {
        out.insert("anyOf".into(), variants.iter().map(strict_schema).collect());
    } else if let Some(Value::Array(parts)) = rest.remove("allOf") {
        out.insert("allOf".into(), parts.iter().map(strict_schema).collect());
    } else if let Some(Value::Array(kinds)) = &kind {
        // One type per schema: `["string", "null"]` becomes an `anyOf` of the two.
        let variants = kinds.iter().map(|kind| match kind.as_str() {
            Some("null") => json!({"type": "null"}),
            _ => {
                let mut variant = rest.clone();
                variant.insert("type".into(), kind.clone());
                strict_schema(&Value::Object(variant))
            }
        });
        out.insert("anyOf".into(), variants.collect());
        return Value::Object(out);
    } else if let Some(kind) = kind.clone() {
        out.insert("type".into(), kind);
    }
    match kind.as_ref().and_then(Value::as_str) {
        Some("object") => {
            let properties = match rest.remove("properties") {
                Some(Value::Object(properties)) => properties
                    .iter()
                    .map(|(name, schema)| (name.clone(), strict_schema(schema)))
                    .collect(),
                _ => Map::new(),
            };
            out.insert("properties".into(), Value::Object(properties));
            rest.remove("additionalProperties");
            out.insert("additionalProperties".into(), Value::Bool(false));
            if let Some(required) = rest.remove("required") {
                out.insert("required".into(), required);
            }
        }
        Some("array") => {
            if let Some(items) = rest.remove("items") {
                out.insert("items".into(), strict_schema(&items));
            }
            if let Some(min) = rest.remove("minItems") {
                match min.as_u64() {
                    Some(0 | 1) => out.insert("minItems".into(), min),
                    _ => rest.insert("minItems".into(), min),
                };
            }
        }
        _ => {}
    }
    if let Some(Value::String(format)) = rest.remove("format") {
        let is_json_schema_format = STRICT_FORMATS.contains(&format.as_str())
            || OTHER_JSON_SCHEMA_FORMATS.contains(&format.as_str());
        if kind == Some(json!("string")) && ANTHROPIC_STRICT_FORMATS.contains(&format.as_str()) {
            out.insert("format".into(), Value::String(format));
        } else if is_json_schema_format {
            rest.insert("format".into(), Value::String(format));
        } // else an annotation of some generator (schemars' `double`): it constrains nothing
    }
    describe(&mut out, rest);
    Value::Object(out)
}

/// Appends `keywords` to `schema`'s description as JSON, for the model to read.
fn describe(schema: &mut Map<String, Value>, keywords: Map<String, Value>) {
    if keywords.is_empty() {
        return;
    }
    let moved = Value::Object(keywords).to_string();
    let description = match schema.get("description").and_then(Value::as_str) {
        Some(text) => format!("{text}\n\n{moved}"),
        None => moved,
    };
    schema.insert("description".into(), Value::String(description));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_strict_schema_is_closed_with_one_type_each_and_its_constraints_described() {
        let given = json!({"type": "object", "required": ["n"], "properties": {
            "n": {"type": "integer", "minimum": 1, "description": "How many."},
            "unit": {"type": ["string", "null"], "enum": ["c", "f", null]},
            "name": {"type": ["string", "null"], "format": "email"},
            "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3},
            "at": {"$ref": "#/definitions/Point"},
            "ratio": {"type": "number", "format": "double", "default": 1.0}
        }, "definitions": {"Point": {"type": "object", "properties": {"x": {"type": "number"}}}}});
        let out = input_schema(&given, true);
        assert_eq!(out["additionalProperties"], false);
        assert_eq!(out["required"], json!(["n"]), "optional stays optional");
        let p = &out["properties"];
        assert_eq!(
            p["n"],
            json!({"type": "integer", "description": "How many.\n\n{\"minimum\":1}"})
        );
        assert_eq!(p["unit"], json!({"enum": ["c", "f", null]}));
        assert_eq!(
            p["name"],
            json!({"anyOf": [{"type": "string", "format": "email"}, {"type": "null"}]})
        );
        assert_eq!(
            p["tags"],
            json!({"type": "array", "items": {"type": "string"}, "minItems": 1,
                   "description": "{\"maxItems\":3}"})
        );
        assert_eq!(p["at"], json!({"$ref": "#/$defs/Point"}));
        assert_eq!(p["ratio"], json!({"type": "number"}), "annotations dropped");
        assert_eq!(out["$defs"]["Point"]["additionalProperties"], false);
        assert!(out.get("definitions").is_none());
    }

    #[test]
    fn a_format_the_subset_lacks_is_described_and_a_foreign_one_dropped() {
        let given = json!({"type": "object", "properties": {
            "page": {"type": "string", "format": "uri-reference"},
            "id": {"type": "string", "format": "uuid"},
            "n": {"type": "integer", "format": "uint"}
        }});
        let p = &input_schema(&given, true)["properties"];
        assert_eq!(p["page"]["description"], "{\"format\":\"uri-reference\"}");
        assert_eq!(p["id"]["format"], "uuid");
        assert_eq!(p["n"], json!({"type": "integer"}));
    }

    #[test]
    fn every_tool_loses_its_root_combinators_to_the_description() {
        let given = json!({"type": "object", "description": "Either.",
            "properties": {"a": {"type": "string"}, "b": {"type": "string"}},
            "anyOf": [{"required": ["a"]}, {"required": ["b"]}]});
        let out = input_schema(&given, false);
        assert!(out.get("anyOf").is_none());
        assert_eq!(
            out["description"],
            "Either.\n\n{\"anyOf\":[{\"required\":[\"a\"]},{\"required\":[\"b\"]}]}"
        );
        assert_eq!(out["properties"], given["properties"], "the rest as it was");
        let plain =
            json!({"type": "object", "properties": {"a": {"type": "string", "minLength": 2}}});
        assert_eq!(
            input_schema(&plain, false),
            plain,
            "not strict: nothing else changes"
        );
    }
}
