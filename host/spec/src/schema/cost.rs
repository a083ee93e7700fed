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

/// What applying a schema can cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cost {
    /// Subschemas one value may visit, with every local `$ref` expanded once.
    pub visits: u64,
    /// Regular-expression matches one value may undergo (`pattern`, and each name under
    /// `patternProperties`), counted as `visits` is. A match costs up to microseconds per
    /// byte of the string matched, whatever the pattern's size: see
    /// [`crate::schema::ArgsValidator::checks_inline`].
    pub patterns: u64,
    /// `$ref`s that recur through the arguments (`items: {"$ref": "#"}`). Two or more can
    /// meet at one value (`anyOf: [{"items": {"$ref": "#"}}, {"items": {"$ref": "#"}}]`),
    /// and then a failing value's error report visits that many times more subschemas at
    /// each level of the arguments: see [`Cost::report_visits`].
    pub recursions: u64,
    /// Items of `enum`s (and `const`s) one value may be compared with, counted as `visits`
    /// is. Each is a comparison, not a subschema (a number checked against an `enum` of
    /// 10 000 is compared with each), so they bound where a check runs, not which schemas
    /// are taken.
    pub comparisons: u64,
}

impl Cost {
    /// An upper bound on the subschemas the error report of a value nested `depth` deep
    /// visits. Checking validity is not bounded by this: the validator remembers each
    /// recursion's verdict; its error report does not.
    pub fn report_visits(&self, depth: usize) -> u64 {
        if self.recursions < 2 {
            return self.visits;
        }
        let depth = u32::try_from(depth).unwrap_or(u32::MAX);
        (self.recursions.checked_pow(depth))
            .and_then(|paths| paths.checked_mul(self.visits))
            .unwrap_or(u64::MAX)
    }
}

/// The cost of `root`, or the rule it breaks.
pub fn check(root: &Value) -> Result<Cost, String> {
    refuse_other_resources(root, true)?;
    let mut walk = Walk {
        root,
        memo: HashMap::new(),
        expanding: Vec::new(),
        descents: 0,
        recursions: 0,
    };
    let Tally {
        visits,
        patterns,
        comparisons,
    } = walk.schema(root)?;
    Ok(Cost {
        visits,
        patterns,
        recursions: walk.recursions,
        comparisons,
    })
}

/// Keywords that make a schema resolve `$ref`s where this walk cannot follow them: a
/// subschema's `$id` moves the base of the `$ref`s below it, anchors name places without a
/// JSON Pointer, and dynamic references pick their target at validation time. Allowed, they
/// would hide a schema's cost from [`check`].
const RESOLVED_ELSEWHERE: &[&str] = &[
    "$id",
    "id",
    "$anchor",
    "$dynamicAnchor",
    "$recursiveAnchor",
    "$dynamicRef",
    "$recursiveRef",
];

/// Keywords whose value is a map from names (not keywords) to schemas.
const NAMED_SCHEMAS: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
];

/// Keywords whose value is data or names, not schemas.
const DATA: &[&str] = &[
    "const",
    "enum",
    "default",
    "examples",
    "required",
    "dependentRequired",
    "$vocabulary",
];

fn refuse_other_resources(schema: &Value, root: bool) -> Result<(), String> {
    let Some(map) = schema.as_object() else {
        return Ok(());
    };
    for (keyword, sub) in map {
        let allowed_at_root = keyword == "$id" || keyword == "id";
        if RESOLVED_ELSEWHERE.contains(&keyword.as_str()) && !(root && allowed_at_root) {
            return Err(format!(
                "`{keyword}` is not allowed below the top level: refer to subschemas with `$ref` and a JSON Pointer such as `#/$defs/name`"
            ));
        }
        if DATA.contains(&keyword.as_str()) {
            continue;
        }
        let named = NAMED_SCHEMAS.contains(&keyword.as_str());
        match sub {
            Value::Object(names) if named => {
                for schema in names.values() {
                    refuse_other_resources(schema, false)?;
                }
            }
            Value::Array(schemas) => {
                for schema in schemas {
                    refuse_other_resources(schema, false)?;
                }
            }
            schema => refuse_other_resources(schema, false)?,
        }
    }
    Ok(())
}

/// The JSON Pointer a `$ref` names: `#` or `#/...`, with nothing percent-encoded, so that
/// this walk reaches the subschema the validator does.
fn local_pointer(reference: &str) -> Result<&str, String> {
    match reference.strip_prefix('#') {
        Some(pointer)
            if (pointer.is_empty() || pointer.starts_with('/')) && !pointer.contains('%') =>
        {
            Ok(pointer)
        }
        _ => Err(format!(
            "`$ref: {reference}` is not allowed: refer within this schema with `#` or a JSON Pointer such as `#/$defs/name`, without percent-encoding"
        )),
    }
}

/// Subschemas visited, patterns matched and items compared, as [`Cost`] counts them.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    visits: u64,
    patterns: u64,
    comparisons: u64,
}

impl Tally {
    fn plus(self, other: Tally) -> Tally {
        Tally {
            visits: self.visits.saturating_add(other.visits),
            patterns: self.patterns.saturating_add(other.patterns),
            comparisons: self.comparisons.saturating_add(other.comparisons),
        }
    }

    fn times(self, n: u64) -> Tally {
        Tally {
            visits: self.visits.saturating_mul(n),
            patterns: self.patterns.saturating_mul(n),
            comparisons: self.comparisons.saturating_mul(n),
        }
    }
}

/// One visit of a leaf: a schema that is not an object, or a `$ref` that recurs.
const LEAF: Tally = Tally {
    visits: 1,
    patterns: 0,
    comparisons: 0,
};

struct Walk<'a> {
    root: &'a Value,
    /// The cost of each `$ref` target, by JSON Pointer, once expanded, and the recursions
    /// its expansion met.
    memo: HashMap<String, (Tally, u64)>,
    /// The `$ref` targets being expanded, each with how deep into the arguments it began.
    expanding: Vec<(String, u32)>,
    /// How many keywords that step into the arguments (`properties`, `items`, ...) enclose
    /// the schema being walked.
    descents: u32,
    /// `$ref`s met that recur through the arguments, counting those inside each memoized
    /// target every time it is reached.
    recursions: u64,
}

impl Walk<'_> {
    fn schema(&mut self, schema: &Value) -> Result<Tally, String> {
        let Some(map) = schema.as_object() else {
            return Ok(LEAF);
        };
        let mut total = LEAF;
        for (keyword, sub) in map {
            let cost = match keyword.as_str() {
                "$ref" => self.reference(sub.as_str())?,
                "allOf" | "anyOf" | "oneOf" | "not" | "if" => self.all(sub)?.times(2),
                "then" | "else" => self.all(sub)?,
                "dependentSchemas" | "dependencies" => self.named(sub)?,
                "properties" => {
                    self.descents += 1;
                    let cost = self.named(sub);
                    self.descents -= 1;
                    cost?
                }
                // Each name is a pattern matched against every property name.
                "patternProperties" => {
                    let names = sub.as_object().map_or(0, |names| names.len() as u64);
                    self.descents += 1;
                    let cost = self.named(sub);
                    self.descents -= 1;
                    cost?.plus(Tally {
                        patterns: names,
                        ..Tally::default()
                    })
                }
                "pattern" => Tally {
                    patterns: 1,
                    ..Tally::default()
                },
                "enum" => Tally {
                    comparisons: sub.as_array().map_or(1, |items| items.len() as u64),
                    ..Tally::default()
                },
                "const" => Tally {
                    comparisons: 1,
                    ..Tally::default()
                },
                "prefixItems"
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
                // Everything else is a leaf (`type`, `minLength`, ...), or not evaluated
                // unless referenced (`$defs`).
                _ => Tally::default(),
            };
            total = total.plus(cost);
            if total.visits > MAX_SCHEMA_COST {
                return Err(format!(
                    "is too costly to check: with every $ref expanded, one value can be checked against more than {MAX_SCHEMA_COST} subschemas (nested anyOf/oneOf/allOf or $refs multiply); flatten it"
                ));
            }
        }
        Ok(total)
    }

    /// A subschema, or an array of them.
    fn all(&mut self, sub: &Value) -> Result<Tally, String> {
        match sub {
            Value::Array(schemas) => self.each(schemas),
            one => self.schema(one),
        }
    }

    /// A map from names to subschemas (`properties`); a name's array of names
    /// (`dependencies`) costs a visit.
    fn named(&mut self, sub: &Value) -> Result<Tally, String> {
        match sub {
            Value::Object(names) => self.each(names.values()),
            _ => Ok(Tally::default()),
        }
    }

    fn each<'v>(&mut self, schemas: impl IntoIterator<Item = &'v Value>) -> Result<Tally, String> {
        let mut total = Tally::default();
        for schema in schemas {
            total = total.plus(self.schema(schema)?);
        }
        Ok(total)
    }

    fn reference(&mut self, reference: Option<&str>) -> Result<Tally, String> {
        // Not a string: the validator refuses the schema.
        let Some(reference) = reference else {
            return Ok(LEAF);
        };
        let pointer = local_pointer(reference)?;
        if let Some(&(_, began)) = self.expanding.iter().find(|(p, _)| p == pointer) {
            return match began == self.descents {
                true => Err(format!(
                    "`$ref: #{pointer}` refers back to itself without stepping into the arguments: checking would never end"
                )),
                // Recursion through the arguments ends with them.
                false => {
                    self.recursions = self.recursions.saturating_add(1);
                    Ok(LEAF)
                }
            };
        }
        if let Some(&(cost, recursions)) = self.memo.get(pointer) {
            self.recursions = self.recursions.saturating_add(recursions);
            return Ok(cost);
        }
        let Some(target) = self.root.pointer(pointer) else {
            return Err(format!("`$ref: {reference}` names nothing in this schema"));
        };
        if self.expanding.len() >= MAX_REF_NESTING {
            return Err(format!("$refs may nest at most {MAX_REF_NESTING} deep"));
        }
        self.expanding.push((pointer.to_owned(), self.descents));
        let before = self.recursions;
        let cost = self.schema(target);
        self.expanding.pop();
        let cost = cost?;
        let recursions = self.recursions - before;
        self.memo.insert(pointer.to_owned(), (cost, recursions));
        Ok(cost)
    }
}

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
        assert!(check(&schema).unwrap().visits < 20);
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
        assert_eq!(check(&tree).unwrap().recursions, 1);
        let endless = json!({"type": "object", "allOf": [{"$ref": "#"}]});
        assert!(check(&endless).unwrap_err().contains("never end"));
    }

    #[test]
    fn recursions_that_meet_at_one_value_are_counted_through_memoized_refs() {
        let branching = json!({"type": "object", "$defs": {
            "n": {"anyOf": [{"$ref": "#/$defs/m"}, {"$ref": "#/$defs/m"}]},
            "m": {"type": "array", "items": {"$ref": "#/$defs/n"}}
        }, "properties": {"a": {"$ref": "#/$defs/n"}}});
        let cost = check(&branching).unwrap();
        assert_eq!(cost.recursions, 2);
        assert!(cost.report_visits(40) > MAX_SCHEMA_COST);
        assert_eq!(cost.report_visits(3), 8 * cost.visits);
    }

    #[test]
    fn patterns_are_counted_as_often_as_a_value_can_meet_them() {
        let word = json!({"type": "string", "pattern": "^[a-z]+$"});
        let schema = json!({"type": "object", "$defs": {"word": word},
            "properties": {"a": {"$ref": "#/$defs/word"}, "b": {"$ref": "#/$defs/word"},
                           "c": {"anyOf": [word, {"type": "integer"}]}},
            "patternProperties": {"^x-": {}, "^y-": {"pattern": "z"}}});
        // a and b once each, c's twice (checked, then reported), two names and one more.
        assert_eq!(check(&schema).unwrap().patterns, 1 + 1 + 2 + 2 + 1);
        let plain = json!({"type": "object", "properties": {"pattern": {"type": "string"}}});
        assert_eq!(check(&plain).unwrap().patterns, 0);
    }

    #[test]
    fn refs_the_walk_cannot_follow_are_refused() {
        let with = |a: Value| json!({"type": "object", "$defs": {"n": {"type": "integer"}}, "properties": {"a": a}});
        for reference in [
            "http://example.com/s.json",
            "#n",
            "#/$defs/n%20",
            "#/$defs/missing",
        ] {
            assert!(
                check(&with(json!({"$ref": reference}))).is_err(),
                "{reference}"
            );
        }
        let hidden = json!({"$id": "http://x/n", "$defs": {"k": {"type": "integer"}}});
        assert!(check(&with(hidden)).unwrap_err().contains("`$id`"));
        assert!(check(&with(json!({"$dynamicRef": "#n"}))).is_err());
        // Names and data that happen to be keywords are neither.
        let named = json!({"type": "object", "$id": "https://example.com/tool",
            "properties": {"$id": {"type": "string", "default": {"$anchor": "x"}}},
            "dependentRequired": {"id": ["$id"]}});
        assert!(check(&named).is_ok());
    }
}
