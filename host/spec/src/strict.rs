//! OpenAI's strict mode: the rewrite of a parameter schema into the subset strict tools
//! accept, which is also the install-time check for tools marked `strict`.
//!
//! The subset is OpenAI's documented one ("Supported schemas" in the Structured Outputs
//! guide): the keywords in [`STRICT_KEYWORDS`], the formats in [`STRICT_FORMATS`], a root that
//! is an object, every object closed and every property required. Anything else that
//! constrains a value is refused, naming the keyword and where; annotations that constrain
//! nothing ([`DROPPED_ANNOTATIONS`], and formats no JSON Schema validator knows, such as
//! schemars' `double` or `uint`) are dropped from the export.

use serde_json::{Map, Value, json};

/// Keywords strict mode accepts, as they are.
pub const STRICT_KEYWORDS: &[&str] = &[
    "type",
    "description",
    "title",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "anyOf",
    "$ref",
    "$defs",
    "definitions",
    "pattern",
    "format",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "minItems",
    "maxItems",
];
/// Annotations that constrain nothing: left out of a strict export.
pub const DROPPED_ANNOTATIONS: &[&str] = &[
    "default",
    "examples",
    "$comment",
    "$schema",
    "$id",
    "deprecated",
    "readOnly",
    "writeOnly",
];
/// The string formats strict mode knows.
pub const STRICT_FORMATS: &[&str] = &[
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uuid",
];
/// JSON Schema's other formats: they constrain a value (where a validator asserts them) and
/// strict mode cannot express them, so they are refused. Formats outside JSON Schema are
/// annotations and are dropped.
pub(crate) const OTHER_JSON_SCHEMA_FORMATS: &[&str] = &[
    "idn-email",
    "idn-hostname",
    "uri",
    "uri-reference",
    "iri",
    "iri-reference",
    "uri-template",
    "json-pointer",
    "relative-json-pointer",
    "regex",
];
/// Schemas nested deeper than this cannot be strict (OpenAI's limit).
pub const MAX_STRICT_DEPTH: usize = 10;
const MAX_STRICT_PROPERTIES: usize = 5000;
const MAX_STRICT_ENUM_VALUES: usize = 1000;
/// Characters of property names, enum values and consts together.
const MAX_STRICT_CHARS: usize = 120_000;

/// What a whole schema may hold, counted as it is walked.
#[derive(Default)]
struct Totals {
    properties: usize,
    enum_values: usize,
    chars: usize,
}

/// `schema` rewritten to meet OpenAI's strict rules: every object closed
/// (`additionalProperties: false`), every property required, an optional property made
/// nullable instead, annotations dropped. The error names the rule that cannot be met and
/// where.
pub fn openai_strict(schema: &Value) -> Result<Value, String> {
    if schema.get("type") != Some(&json!("object")) {
        return Err("strict mode needs a root of `\"type\": \"object\"` (at #)".into());
    }
    let mut out = schema.clone();
    make_strict(&mut out, "#", 0, &mut Totals::default())?;
    Ok(out)
}

fn make_strict(
    schema: &mut Value,
    at: &str,
    depth: usize,
    totals: &mut Totals,
) -> Result<(), String> {
    let Some(map) = schema.as_object_mut() else {
        return Ok(()); // `true`/`false` schemas
    };
    map.retain(|keyword, _| !DROPPED_ANNOTATIONS.contains(&keyword.as_str()));
    if let Some(Value::String(format)) = map.get("format") {
        if OTHER_JSON_SCHEMA_FORMATS.contains(&format.as_str()) {
            return Err(format!(
                "strict mode does not support `format: {format}` (at {at}); it supports {}",
                STRICT_FORMATS.join(", ")
            ));
        }
        if !STRICT_FORMATS.contains(&format.as_str()) {
            map.remove("format");
        }
    }
    if let Some(keyword) = map.keys().find(|k| !STRICT_KEYWORDS.contains(&k.as_str())) {
        return Err(format!(
            "strict mode does not support `{keyword}` (at {at})"
        ));
    }
    if map.contains_key("$ref") {
        // Strict mode allows nothing beside a `$ref`: its documentation goes.
        map.retain(|keyword, _| !matches!(keyword.as_str(), "description" | "title"));
        if let Some(keyword) = map.keys().find(|k| *k != "$ref") {
            return Err(format!(
                "strict mode allows nothing beside `$ref`, here `{keyword}` (at {at})"
            ));
        }
        return Ok(());
    }
    if !["type", "enum", "const", "anyOf"]
        .iter()
        .any(|k| map.contains_key(*k))
    {
        return Err(format!(
            "strict mode needs a `type` (or `enum`, `const`, `anyOf`) on every schema (at {at})"
        ));
    }
    if let Some(Value::Array(types)) = map.get("type")
        && types.iter().filter(|t| *t != "null").count() != 1
    {
        return Err(format!(
            "strict mode allows one type, or one and \"null\", in `type` (at {at}); use `anyOf`"
        ));
    }
    for value in map
        .get("enum")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        totals.enum_values += 1;
        totals.chars += value.as_str().map_or(0, str::len);
    }
    if let Some(Value::String(value)) = map.get("const") {
        totals.chars += value.len();
    }
    if map.contains_key("properties") || map.get("type") == Some(&json!("object")) {
        if depth >= MAX_STRICT_DEPTH {
            return Err(format!(
                "strict mode allows {MAX_STRICT_DEPTH} levels of objects (at {at})"
            ));
        }
        match map.get("additionalProperties") {
            None | Some(Value::Bool(false)) => {}
            Some(_) => {
                return Err(format!(
                    "strict mode needs `additionalProperties: false` (at {at})"
                ));
            }
        }
        map.insert("additionalProperties".into(), Value::Bool(false));
        let required: Vec<String> = map
            .get("required")
            .and_then(Value::as_array)
            .map(|r| {
                r.iter()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        let props = map
            .entry("properties")
            .or_insert_with(|| Value::Object(Map::new()));
        let Some(props) = props.as_object_mut() else {
            return Err(format!("`properties` must be an object (at {at})"));
        };
        totals.properties += props.len();
        totals.chars += props.keys().map(String::len).sum::<usize>();
        for (name, sub) in props.iter_mut() {
            make_strict(sub, &format!("{at}/properties/{name}"), depth + 1, totals)?;
            if !required.contains(name) {
                make_nullable(sub);
            }
        }
        let all: Vec<Value> = props.keys().cloned().map(Value::String).collect();
        map.insert("required".into(), Value::Array(all));
    }
    match map.get_mut("items") {
        Some(items @ Value::Object(_)) => {
            make_strict(items, &format!("{at}/items"), depth, totals)?
        }
        Some(_) => {
            return Err(format!(
                "strict mode needs `items` to be one schema (at {at})"
            ));
        }
        None => {}
    }
    if let Some(Value::Array(subs)) = map.get_mut("anyOf") {
        for (i, sub) in subs.iter_mut().enumerate() {
            make_strict(sub, &format!("{at}/anyOf/{i}"), depth, totals)?;
        }
    }
    for keyword in ["$defs", "definitions"] {
        if let Some(Value::Object(defs)) = map.get_mut(keyword) {
            for (name, sub) in defs.iter_mut() {
                make_strict(sub, &format!("{at}/{keyword}/{name}"), depth, totals)?;
            }
        }
    }
    if totals.properties > MAX_STRICT_PROPERTIES {
        return Err(format!(
            "strict mode allows {MAX_STRICT_PROPERTIES} properties in all"
        ));
    }
    if totals.enum_values > MAX_STRICT_ENUM_VALUES {
        return Err(format!(
            "strict mode allows {MAX_STRICT_ENUM_VALUES} enum values in all"
        ));
    }
    if totals.chars > MAX_STRICT_CHARS {
        return Err(format!(
            "strict mode allows {MAX_STRICT_CHARS} characters of property names, enum values and consts in all"
        ));
    }
    Ok(())
}

/// Undoes what strict mode asks of a model, before the arguments are checked against the
/// tool's own schema: strict mode makes every property required, and a model leaves an
/// optional one out by sending `null`. Such a `null` (for a property the tool's schema does
/// not require and that does not itself accept `null`) is removed, so the tool sees the
/// argument left out. Walks nested objects and array items.
pub fn nulls_as_absent(schema: &Value, args: &mut Value) {
    if let (Some(props), Some(given)) = (
        schema.get("properties").and_then(Value::as_object),
        args.as_object_mut(),
    ) {
        let required = schema.get("required").and_then(Value::as_array);
        let is_required = |name: &str| required.is_some_and(|r| r.iter().any(|n| n == name));
        for (name, sub) in props {
            match given.get_mut(name) {
                Some(Value::Null) if !is_required(name) && !accepts_null(sub) => {
                    given.remove(name);
                }
                Some(value) => nulls_as_absent(sub, value),
                None => {}
            }
        }
    }
    if let (Some(items), Some(elements)) = (schema.get("items"), args.as_array_mut()) {
        elements.iter_mut().for_each(|e| nulls_as_absent(items, e));
    }
}

fn accepts_null(schema: &Value) -> bool {
    let null = json!("null");
    match schema.get("type") {
        Some(Value::String(t)) => t == "null",
        Some(Value::Array(types)) => types.contains(&null),
        // Untyped: an `enum` or `const` may list null; anything else accepts it.
        _ => match (schema.get("enum"), schema.get("const")) {
            (Some(Value::Array(values)), _) => values.contains(&Value::Null),
            (_, Some(value)) => value.is_null(),
            _ => schema.get("anyOf").is_none(),
        },
    }
}

/// An optional property becomes required-but-nullable, as strict mode expresses optionality.
fn make_nullable(schema: &mut Value) {
    let null = json!("null");
    match schema.get_mut("type") {
        Some(Value::String(t)) => {
            if t != "null" {
                let t = Value::String(std::mem::take(t));
                schema["type"] = json!([t, "null"]);
            }
        }
        Some(Value::Array(types)) => {
            if !types.contains(&null) {
                types.push(null);
            }
        }
        _ => *schema = json!({"anyOf": [schema.take(), {"type": "null"}]}),
    }
    if let Some(Value::Array(values)) = schema.get_mut("enum")
        && !values.contains(&Value::Null)
    {
        values.push(Value::Null);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_strict_models_nulls_for_optional_arguments_mean_left_out() {
        let schema = json!({"type": "object", "required": ["city"], "properties": {
            "city": {"type": "string"},
            "units": {"enum": ["metric", "imperial"]},
            "note": {"type": ["string", "null"]},
            "stops": {"type": "array", "items": {"type": "object", "properties": {
                "at": {"type": "string"}, "wait": {"type": "integer"}}}}
        }});
        let mut args = json!({"city": null, "units": null, "note": null,
                              "stops": [{"at": "x", "wait": null}]});
        nulls_as_absent(&schema, &mut args);
        // A required null stays (and fails validation); a null the schema allows stays.
        assert_eq!(
            args,
            json!({"city": null, "note": null, "stops": [{"at": "x"}]})
        );
    }
}
