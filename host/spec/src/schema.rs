//! Compiling a tool's parameter schema and checking call arguments against it.
//!
//! A tenant's schema is hostile input: it is bounded in size and depth, and no `$ref` is ever
//! resolved outside the schema itself (no network, no files).

use std::fmt;

pub mod cost;

use serde::Serialize;
use serde_json::{Map, Value};

/// The largest parameter schema, as JSON text.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// The deepest nesting of a parameter schema.
pub const MAX_SCHEMA_DEPTH: usize = 64;
/// A call with more failures than this reports the first ones; the rest add nothing.
const MAX_REPORTED_ERRORS: usize = 20;

/// The subschemas a failing call's error report may visit (a few milliseconds).
const MAX_REPORT_VISITS: u64 = 100_000;

/// Bytes of strings times the patterns they may meet, past which a check is not run inline
/// on an async worker: a regular-expression match can cost microseconds per byte whatever
/// the pattern's size (`a[ab]{1000}c` takes 6 µs a byte here), so 4 KiB is a few ms at worst.
pub const MAX_INLINE_MATCH_BYTES: u64 = 4 * 1024;

/// The parts of a value (values and property names) times the subschemas and `enum` items
/// each may meet, past which a check is not run inline on an async worker: a schema within
/// every install bound (10 000 subschemas, or an `enum` of thousands) met by a megabyte of
/// small values is billions of steps. 100 000 is a few ms at worst.
pub const MAX_INLINE_STEPS: u64 = 100_000;

/// A compiled parameter schema.
pub struct ArgsValidator {
    validator: jsonschema::Validator,
    cost: cost::Cost,
}

impl fmt::Debug for ArgsValidator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ArgsValidator")
    }
}

/// One reason the arguments failed, at one place in them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArgError {
    /// JSON Pointer into the arguments (`""` is the arguments object itself); for a missing
    /// property, where it belongs.
    pub path: String,
    /// What is wrong there.
    pub message: String,
}

/// A violation's message names the value at fault, which may be as large as the arguments:
/// at most this many characters of it are kept.
pub const MAX_ARG_ERROR_CHARS: usize = 512;

fn clipped_message(mut message: String) -> String {
    if let Some((cut, _)) = message.char_indices().nth(MAX_ARG_ERROR_CHARS) {
        message.truncate(cut);
        message.push('…');
    }
    message
}

/// Where a violation is: a missing property is at its own place, not its object's, so a
/// form can mark the field to fill in.
fn fault_path(error: &jsonschema::ValidationError<'_>) -> String {
    let path = error.instance_path().to_string();
    match error.kind() {
        jsonschema::error::ValidationErrorKind::Required {
            property: Value::String(name),
        } => format!("{path}/{}", name.replace('~', "~0").replace('/', "~1")),
        _ => path,
    }
}

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "at {}: {}", self.path, self.message)
        }
    }
}

/// Refuses every external reference: a schema may only `$ref` into itself.
struct NoExternalRefs;

impl jsonschema::Retrieve for NoExternalRefs {
    fn retrieve(
        &self,
        uri: &jsonschema::Uri<String>,
    ) -> Result<Value, Box<dyn std::error::Error + Send + Sync>> {
        Err(format!("external $ref `{uri}` is not allowed; inline it or use $defs").into())
    }
}

/// Compiles `parameters`; the error is the rule it broke, for a [`crate::spec::SpecError`].
pub fn compile(parameters: &Value, strict: bool) -> Result<ArgsValidator, String> {
    let size = serde_json::to_string(parameters).map_or(usize::MAX, |s| s.len());
    if size > MAX_SCHEMA_BYTES {
        return Err(format!(
            "must be at most {MAX_SCHEMA_BYTES} bytes of JSON, got {size}"
        ));
    }
    if depth(parameters) > MAX_SCHEMA_DEPTH {
        return Err(format!("must nest at most {MAX_SCHEMA_DEPTH} levels deep"));
    }
    let cost = cost::check(parameters)?;
    let top = parameters
        .as_object()
        .ok_or("must be a JSON Schema object")?;
    if top.get("type") != Some(&Value::String("object".into())) {
        return Err(r#"the top level must be {"type": "object", ...}"#.into());
    }
    let mut schema = parameters.clone();
    if strict {
        close_objects(&mut schema);
    }
    let validator = jsonschema::options()
        .with_retriever(NoExternalRefs)
        // Linear-time matching: a backtracking engine lets one `pattern` take a worker for
        // minutes. Look-around and backreferences are refused at install.
        .with_pattern_options(jsonschema::PatternOptions::regex())
        .should_validate_formats(true)
        .build(&schema)
        .map_err(|e| format!("not a valid JSON Schema: {e}"))?;
    Ok(ArgsValidator { validator, cost })
}

impl ArgsValidator {
    /// Whether checking `value` costs little enough to run where the call is: its parts,
    /// times the subschemas and `enum` items one part may meet, stay within
    /// [`MAX_INLINE_STEPS`]; and it meets no pattern, or its strings and property names,
    /// times the patterns one value may meet, stay within [`MAX_INLINE_MATCH_BYTES`], and no
    /// two recursions meet at one value (a failing report would match again at each level).
    /// Otherwise the caller runs [`Self::validate`] where it can stop waiting for it.
    pub fn checks_inline(&self, value: &Value) -> bool {
        let per_part = (self.cost.visits.saturating_add(self.cost.comparisons)).max(1);
        parts_within(value, MAX_INLINE_STEPS / per_part).is_some()
            && (self.cost.patterns == 0
                || self.cost.recursions < 2 && {
                    let budget = MAX_INLINE_MATCH_BYTES / self.cost.patterns;
                    string_bytes_within(value, budget).is_some()
                })
    }

    /// Every failing place in `args`, up to a bound.
    pub fn validate(&self, args: &Value) -> Result<(), Vec<ArgError>> {
        // The common case allocates no error reports.
        if self.validator.is_valid(args) {
            return Ok(());
        }
        // The validator's report follows every branch of every recursion again, without
        // the verdicts it remembered: past a bound, the call is refused without it.
        let depth = depth(args);
        if self.cost.report_visits(depth) > MAX_REPORT_VISITS {
            return Err(vec![ArgError {
                path: String::new(),
                message: format!(
                    "the arguments do not match the parameters schema; where is not reported, because this schema's recursive $refs make a report on a value nested {depth} deep too costly"
                ),
            }]);
        }
        let errors: Vec<ArgError> = self
            .validator
            .iter_errors(args)
            .take(MAX_REPORTED_ERRORS)
            .map(|e| ArgError {
                path: fault_path(&e),
                message: clipped_message(e.to_string()),
            })
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

/// The bytes of the strings and names in `value`, if at most `budget`.
fn string_bytes_within(value: &Value, budget: u64) -> Option<u64> {
    let left = match value {
        Value::String(text) => budget.checked_sub(text.len() as u64)?,
        Value::Array(items) => items.iter().try_fold(budget, |left, item| {
            left.checked_sub(string_bytes_within(item, left)?)
        })?,
        Value::Object(map) => map.iter().try_fold(budget, |left, (name, item)| {
            let left = left.checked_sub(name.len() as u64)?;
            left.checked_sub(string_bytes_within(item, left)?)
        })?,
        _ => budget,
    };
    Some(budget - left)
}

/// The values and property names in `value`, if at most `budget`.
fn parts_within(value: &Value, budget: u64) -> Option<u64> {
    let left = budget.checked_sub(1)?;
    let left = match value {
        Value::Array(items) => items.iter().try_fold(left, |left, item| {
            left.checked_sub(parts_within(item, left)?)
        })?,
        Value::Object(map) => map.iter().try_fold(left, |left, (_, item)| {
            let left = left.checked_sub(1)?;
            left.checked_sub(parts_within(item, left)?)
        })?,
        _ => left,
    };
    Some(budget - left)
}

fn depth(value: &Value) -> usize {
    match value {
        Value::Array(items) => 1 + items.iter().map(depth).max().unwrap_or(0),
        Value::Object(map) => 1 + map.values().map(depth).max().unwrap_or(0),
        _ => 0,
    }
}

/// Strict mode: every object schema that declares `properties` and says nothing about
/// others gets `additionalProperties: false`. Walks schema keywords only, so a property that
/// happens to be named `properties` is not mistaken for the keyword.
fn close_objects(schema: &mut Value) {
    let Some(map) = schema.as_object_mut() else {
        return;
    };
    if map.contains_key("properties") && !map.contains_key("additionalProperties") {
        map.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (keyword, sub) in map.iter_mut() {
        match keyword.as_str() {
            "properties" | "patternProperties" | "$defs" | "definitions" | "dependentSchemas" => {
                sub.as_object_mut()
                    .map(Map::values_mut)
                    .into_iter()
                    .flatten()
                    .for_each(close_objects);
            }
            "allOf" | "anyOf" | "oneOf" | "prefixItems" => {
                sub.as_array_mut()
                    .into_iter()
                    .flatten()
                    .for_each(close_objects);
            }
            "items"
            | "additionalProperties"
            | "not"
            | "if"
            | "then"
            | "else"
            | "contains"
            | "propertyNames"
            | "unevaluatedProperties"
            | "unevaluatedItems" => close_objects(sub),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn paths(v: &ArgsValidator, args: Value) -> Vec<String> {
        v.validate(&args)
            .unwrap_err()
            .into_iter()
            .map(|e| e.path)
            .collect()
    }

    #[test]
    fn a_large_value_at_fault_is_clipped_in_the_message() {
        let v = compile(
            &json!({"type": "object", "properties": {"n": {"type": "integer"}}}),
            false,
        )
        .unwrap();
        let errors = v.validate(&json!({"n": "é".repeat(100_000)})).unwrap_err();
        let message = &errors[0].message;
        assert_eq!(
            message.chars().count(),
            MAX_ARG_ERROR_CHARS + 1,
            "{message}"
        );
        assert!(message.ends_with('…'));
    }

    #[test]
    fn a_missing_property_is_at_its_own_place() {
        let schema = json!({"type": "object", "required": ["text", "a/b"], "properties": {
            "inner": {"type": "object", "required": ["n"]}}});
        let v = compile(&schema, false).unwrap();
        let mut found = paths(&v, json!({"inner": {}}));
        found.sort();
        assert_eq!(found, ["/a~1b", "/inner/n", "/text"]);
    }

    #[test]
    fn errors_name_each_failing_path() {
        let v = compile(
            &json!({"type": "object", "required": ["n"], "properties": {
                "n": {"type": "integer", "maximum": 3},
                "tags": {"type": "array", "items": {"type": "string"}}
            }}),
            false,
        )
        .unwrap();
        assert!(v.validate(&json!({"n": 2})).is_ok());
        let mut got = paths(&v, json!({"n": 5, "tags": ["a", 7]}));
        got.sort();
        assert_eq!(got, vec!["/n", "/tags/1"]);
        let missing = v.validate(&json!({})).unwrap_err();
        assert!(missing[0].message.contains("\"n\""), "{missing:?}");
    }

    #[test]
    fn strict_rejects_undeclared_properties_at_every_level() {
        let schema = json!({"type": "object", "properties": {
            "inner": {"type": "object", "properties": {"a": {"type": "string"}}},
            "properties": {"type": "string"}
        }});
        let loose = compile(&schema, false).unwrap();
        assert!(loose.validate(&json!({"x": 1, "inner": {"y": 2}})).is_ok());
        let strict = compile(&schema, true).unwrap();
        let mut got = paths(&strict, json!({"x": 1, "inner": {"y": 2}}));
        got.sort();
        assert_eq!(got, vec!["", "/inner"]);
        // a property literally named "properties" stays an ordinary property
        assert!(strict.validate(&json!({"properties": "ok"})).is_ok());
    }

    #[test]
    fn external_refs_are_refused_without_a_connection() {
        // Port 9 on loopback: if anything tried to fetch, it would fail differently.
        for r in ["http://127.0.0.1:9/s.json", "file:///etc/passwd"] {
            let err = compile(
                &json!({"type": "object", "properties": {"a": {"$ref": r}}}),
                false,
            )
            .unwrap_err();
            assert!(err.contains("not allowed"), "{r}: {err}");
        }
        let local = json!({"type": "object", "$defs": {"n": {"type": "integer"}},
                           "properties": {"a": {"$ref": "#/$defs/n"}}});
        let v = compile(&local, false).unwrap();
        assert_eq!(paths(&v, json!({"a": "x"})), vec!["/a"]);
    }

    /// Two branches that recur into the same value: a report on 20 levels took 27 s, on 40
    /// it would take days. Validity alone is remembered per recursion, and stays fast.
    #[test]
    fn a_deep_value_in_a_branching_recursive_schema_is_refused_at_once() {
        let schema = json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}},
        "$defs": {"n": {"anyOf": [
            {"type": "array", "items": {"$ref": "#/$defs/n"}},
            {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/n"}}
        ]}}});
        let v = compile(&schema, false).unwrap();
        let nested = |depth: usize, leaf: Value| (0..depth).fold(leaf, |inner, _| json!([inner]));
        let errors = v
            .validate(&json!({"a": nested(15, json!("x"))}))
            .unwrap_err();
        assert_eq!(errors.len(), 1);
        assert!(
            errors[0].message.contains("nested 16 deep"),
            "{}",
            errors[0]
        );
        assert!(v.validate(&json!({"a": nested(60, json!([]))})).is_ok());
        // Shallow values are still reported where they fail.
        assert_eq!(paths(&v, json!({"a": "x"})), vec!["/a"]);
    }

    #[test]
    fn oversized_and_deep_schemas_are_rejected() {
        let big = json!({"type": "object", "description": "x".repeat(MAX_SCHEMA_BYTES)});
        assert!(compile(&big, false).unwrap_err().contains("bytes"));
        let mut deep = json!({"type": "object"});
        for _ in 0..MAX_SCHEMA_DEPTH {
            deep = json!({"type": "object", "properties": {"a": deep}});
        }
        assert!(compile(&deep, false).unwrap_err().contains("levels"));
    }

    #[test]
    fn checks_with_many_bytes_to_match_against_patterns_are_not_inline() {
        let plain = compile(&json!({"type": "object"}), false).unwrap();
        let long = json!({"text": "ab".repeat(100_000)});
        assert!(plain.checks_inline(&long));
        let patterned = json!({"type": "object", "properties": {
            "text": {"type": "string", "pattern": "a[ab]{1000}c"},
            "tags": {"type": "array", "items": {"pattern": "^[a-z]+$"}}}});
        let patterned = compile(&patterned, false).unwrap();
        assert!(patterned.checks_inline(&json!({"text": "abc", "tags": ["x", "y"]})));
        assert!(!patterned.checks_inline(&long));
        // Two patterns: half of the bytes each, names counted.
        let half = MAX_INLINE_MATCH_BYTES as usize / 2;
        let tags = |n: usize| json!({"tags": ["a".repeat(n - "tags".len())]});
        assert!(patterned.checks_inline(&tags(half)));
        assert!(!patterned.checks_inline(&tags(half + 1)));
        // Two recursions meeting at one value: never inline, however short.
        let branch = json!({"type": "array", "items": {"$ref": "#/$defs/n"}});
        let recursive = json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}},
            "$defs": {"n": {"anyOf": [branch, branch, {"type": "string", "pattern": "^x$"}]}}});
        let recursive = compile(&recursive, false).unwrap();
        assert!(!recursive.checks_inline(&json!({"a": [["x"]]})));
    }

    #[test]
    fn many_values_against_a_large_enum_or_many_subschemas_are_not_checked_inline() {
        let numbers: Vec<u32> = (0..5_000).collect();
        let schema = json!({"type": "object", "properties": {
            "a": {"type": "array", "items": {"enum": numbers}}}});
        let enumerated = compile(&schema, false).unwrap();
        let floats = |n: usize| json!({"a": vec![0.5; n]});
        assert!(enumerated.checks_inline(&floats(10)));
        // 5 000 comparisons each: a thousand values are millions of steps.
        assert!(!enumerated.checks_inline(&floats(1_000)));
        let branches = vec![json!(false); 4_000];
        let schema = json!({"type": "object", "properties": {
            "a": {"type": "array", "items": {"anyOf": branches}}}});
        let branching = compile(&schema, false).unwrap();
        assert!(branching.checks_inline(&floats(5)));
        assert!(!branching.checks_inline(&floats(1_000)));
        // A plain schema takes a large value where the call is.
        let plain = compile(&json!({"type": "object"}), false).unwrap();
        assert!(plain.checks_inline(&floats(10_000)));
    }

    #[test]
    fn patterns_are_matched_in_linear_time_and_backtracking_ones_are_refused() {
        let schema = |pattern: &str| json!({"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}});
        let v = compile(&schema("^(a+)+$"), false).unwrap();
        let hostile = format!("{}!", "a".repeat(5000));
        assert_eq!(paths(&v, json!({"s": hostile})), vec!["/s"]);
        for backtracking in [r"^(?=(a+)+$)a*$", r"^(a+)\1$"] {
            let err = compile(&schema(backtracking), false).unwrap_err();
            assert!(
                err.contains("not a valid JSON Schema"),
                "{backtracking}: {err}"
            );
        }
    }

    #[test]
    fn top_level_must_be_an_object_schema() {
        assert!(compile(&json!({"type": "array"}), false).is_err());
        assert!(compile(&json!(true), false).is_err());
        assert!(compile(&json!({"properties": {}}), false).is_err());
    }
}
