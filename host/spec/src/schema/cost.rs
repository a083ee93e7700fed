//! What a parameter schema can cost to apply: the number of subschemas one value of the
//! arguments can make the validator visit, with every local `$ref` expanded. A combinator
//! (`anyOf`, `oneOf`, `allOf`, `not`, `if`) counts its subschemas twice: a failing call is
//! checked once for validity and once more for its error report, at every level, so nesting
//! multiplies. Validation time and the size of a failing call's error report both grow with
//! it, and a 1 KB schema (`anyOf` nested 20 levels deep, or `$defs` that each refer to the
//! next twice) reaches 2^20: seconds and gigabytes per call. Such schemas are refused at install, where the tool's
//! author can see why, instead of costing the host at every call.

use std::collections::HashMap;

use serde_json::Value;

/// Subschemas one value may visit. The example tools cost under 100.
pub const MAX_SCHEMA_COST: u64 = 10_000;
/// How deep `$ref`s may expand inside one another.
const MAX_REF_NESTING: usize = 64;

/// The cost of `root`, or the rule it breaks.
pub fn check(root: &Value) -> Result<u64, String> {
    let mut walk = Walk {
        root,
        memo: HashMap::new(),
        expanding: Vec::new(),
        descents: 0,
    };
    walk.schema(root)
}

struct Walk<'a> {
    root: &'a Value,
    /// The cost of each `$ref` target, by JSON Pointer, once expanded.
    memo: HashMap<String, u64>,
    /// The `$ref` targets being expanded, each with how deep into the arguments it began.
    expanding: Vec<(String, u32)>,
    /// How many keywords that step into the arguments (`properties`, `items`, ...) enclose
    /// the schema being walked.
    descents: u32,
}

impl Walk<'_> {
    fn schema(&mut self, schema: &Value) -> Result<u64, String> {
        let Some(map) = schema.as_object() else {
            return Ok(1);
        };
        let mut total: u64 = 1;
        for (keyword, sub) in map {
            let cost = match keyword.as_str() {
                "$ref" | "$dynamicRef" | "$recursiveRef" => self.reference(sub.as_str())?,
                "allOf" | "anyOf" | "oneOf" | "not" | "if" => self.all(sub)?.saturating_mul(2),
                "dependentSchemas" | "then" | "else" => self.all(sub)?,
                "properties"
                | "patternProperties"
                | "prefixItems"
                | "items"
                | "additionalItems"
                | "additionalProperties"
                | "unevaluatedProperties"
                | "unevaluatedItems"
                | "contains"
                | "propertyNames" => {
                    self.descents += 1;
                    let cost = self.all(sub);
                    self.descents -= 1;
                    cost?
                }
                // Everything else is a leaf (`type`, `pattern`, ...), or not evaluated unless
                // referenced (`$defs`).
                _ => 0,
            };
            total = total.saturating_add(cost);
            if total > MAX_SCHEMA_COST {
                return Err(format!(
                    "is too costly to check: with every $ref expanded, one value can be checked against more than {MAX_SCHEMA_COST} subschemas (nested anyOf/oneOf/allOf or $refs multiply); flatten it"
                ));
            }
        }
        Ok(total)
    }

    /// A subschema, an array of them, or a map of them.
    fn all(&mut self, sub: &Value) -> Result<u64, String> {
        let mut total: u64 = 0;
        let schemas: Box<dyn Iterator<Item = &Value>> = match sub {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(map) if !is_schema(map) => Box::new(map.values()),
            one => Box::new(std::iter::once(one)),
        };
        for schema in schemas {
            total = total.saturating_add(self.schema(schema)?);
        }
        Ok(total)
    }

    fn reference(&mut self, reference: Option<&str>) -> Result<u64, String> {
        // Only local JSON Pointers can be followed here; anything else is resolved (within
        // the schema) by the validator, and counted once.
        let Some(pointer) = reference.and_then(|r| r.strip_prefix('#')) else {
            return Ok(1);
        };
        if let Some(&(_, began)) = self.expanding.iter().find(|(p, _)| p == pointer) {
            return match began == self.descents {
                true => Err(format!(
                    "`$ref: #{pointer}` refers back to itself without stepping into the arguments: checking would never end"
                )),
                // Recursion through the arguments ends with them.
                false => Ok(1),
            };
        }
        if let Some(&cost) = self.memo.get(pointer) {
            return Ok(cost);
        }
        let Some(target) = self.root.pointer(pointer) else {
            return Ok(1);
        };
        if self.expanding.len() >= MAX_REF_NESTING {
            return Err(format!("$refs may nest at most {MAX_REF_NESTING} deep"));
        }
        self.expanding.push((pointer.to_owned(), self.descents));
        let cost = self.schema(target);
        self.expanding.pop();
        let cost = cost?;
        self.memo.insert(pointer.to_owned(), cost);
        Ok(cost)
    }
}

/// Whether an object under `properties`-like keywords is itself a schema (`items: {...}`)
/// rather than a map of names to schemas (`properties: {...}`).
fn is_schema(map: &serde_json::Map<String, Value>) -> bool {
    map.is_empty() || map.keys().any(|k| SCHEMA_KEYWORDS.contains(&k.as_str()))
}

const SCHEMA_KEYWORDS: &[&str] = &[
    "type",
    "$ref",
    "enum",
    "const",
    "properties",
    "items",
    "allOf",
    "anyOf",
    "oneOf",
    "not",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "required",
    "additionalProperties",
    "prefixItems",
    "description",
    "title",
    "default",
    "minLength",
    "maxLength",
    "if",
];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `anyOf` nested `depth` levels deep: linear in size, exponential to check.
    fn nested_any_of(depth: usize) -> Value {
        let mut schema = json!({"type": "string", "minLength": 3});
        for _ in 0..depth {
            schema = json!({"anyOf": [{"type": "integer"}, schema]});
        }
        json!({"type": "object", "properties": {"a": schema}})
    }

    #[test]
    fn ordinary_schemas_cost_little() {
        let schema = json!({"type": "object", "required": ["text"], "properties": {
            "text": {"type": "string", "maxLength": 100},
            "units": {"enum": ["metric", "imperial"]},
            "tags": {"type": "array", "items": {"type": "string"}}
        }});
        assert!(check(&schema).unwrap() < 20);
    }

    #[test]
    fn nested_combinators_that_multiply_are_refused() {
        assert!(check(&nested_any_of(8)).is_ok());
        let too_costly = nested_any_of(20);
        assert!(serde_json::to_string(&too_costly).unwrap().len() < 1024);
        assert!(check(&too_costly).unwrap_err().contains("too costly"));
    }

    #[test]
    fn refs_that_double_at_each_step_are_refused() {
        let mut defs = serde_json::Map::new();
        for i in 0..30 {
            let next = format!("#/$defs/d{}", i + 1);
            defs.insert(
                format!("d{i}"),
                json!({"allOf": [{"$ref": next}, {"$ref": next}]}),
            );
        }
        defs.insert("d30".into(), json!({"type": "integer"}));
        let schema = json!({"type": "object", "$defs": defs,
                            "properties": {"n": {"$ref": "#/$defs/d0"}}});
        assert!(check(&schema).unwrap_err().contains("too costly"));
    }

    #[test]
    fn recursion_through_the_arguments_is_fine_and_without_it_is_refused() {
        let tree = json!({"type": "object", "properties": {
            "name": {"type": "string"},
            "children": {"type": "array", "items": {"$ref": "#"}}
        }});
        assert!(check(&tree).is_ok());
        let endless = json!({"type": "object", "allOf": [{"$ref": "#"}]});
        assert!(check(&endless).unwrap_err().contains("never end"));
    }
}
