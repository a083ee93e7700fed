//! OpenAI's strict mode: the rewrite of a parameter schema into the subset strict tools
//! accept, which is also the install-time check for tools marked `strict`.

use serde_json::{Map, Value, json};

/// Keywords OpenAI's strict mode does not accept.
const UNSUPPORTED_IN_STRICT: &[&str] = &[
    "allOf",
    "oneOf",
    "not",
    "if",
    "then",
    "else",
    "dependentRequired",
    "dependentSchemas",
    "patternProperties",
    "unevaluatedProperties",
    "unevaluatedItems",
    "propertyNames",
    "minProperties",
    "maxProperties",
    "contains",
    "minContains",
    "maxContains",
    "uniqueItems",
];
/// Schemas nested deeper than this cannot be strict (OpenAI's limit).
pub const MAX_STRICT_DEPTH: usize = 10;
const MAX_STRICT_PROPERTIES: usize = 5000;

/// `schema` rewritten to meet OpenAI's strict rules: every object closed
/// (`additionalProperties: false`), every property required, an optional property made
/// nullable instead. The error names the rule that cannot be met and where.
pub fn openai_strict(schema: &Value) -> Result<Value, String> {
    let mut out = schema.clone();
    let mut properties = 0;
    make_strict(&mut out, "#", 0, &mut properties)?;
    Ok(out)
}

fn make_strict(
    schema: &mut Value,
    at: &str,
    depth: usize,
    properties: &mut usize,
) -> Result<(), String> {
    let Some(map) = schema.as_object_mut() else {
        return Ok(()); // `true`/`false` schemas and values inside `enum`
    };
    if let Some(keyword) = UNSUPPORTED_IN_STRICT.iter().find(|k| map.contains_key(**k)) {
        return Err(format!(
            "strict mode does not support `{keyword}` (at {at})"
        ));
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
        *properties += props.len();
        if *properties > MAX_STRICT_PROPERTIES {
            return Err(format!(
                "strict mode allows {MAX_STRICT_PROPERTIES} properties in all"
            ));
        }
        for (name, sub) in props.iter_mut() {
            make_strict(
                sub,
                &format!("{at}/properties/{name}"),
                depth + 1,
                properties,
            )?;
            if !required.contains(name) {
                make_nullable(sub);
            }
        }
        let all: Vec<Value> = props.keys().cloned().map(Value::String).collect();
        map.insert("required".into(), Value::Array(all));
    }
    for keyword in ["items", "additionalItems"] {
        if let Some(sub) = map.get_mut(keyword) {
            make_strict(sub, &format!("{at}/{keyword}"), depth, properties)?;
        }
    }
    for keyword in ["anyOf", "prefixItems"] {
        if let Some(Value::Array(subs)) = map.get_mut(keyword) {
            for (i, sub) in subs.iter_mut().enumerate() {
                make_strict(sub, &format!("{at}/{keyword}/{i}"), depth, properties)?;
            }
        }
    }
    for keyword in ["$defs", "definitions"] {
        if let Some(Value::Object(defs)) = map.get_mut(keyword) {
            for (name, sub) in defs.iter_mut() {
                make_strict(sub, &format!("{at}/{keyword}/{name}"), depth, properties)?;
            }
        }
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
