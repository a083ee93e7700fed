//! Result caching: which part of the arguments identifies a result, and the key it makes.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// A JSONPath without wildcards, selecting at most one value: `$`, `$.a.b`, `$['a b'][0]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyPath(Vec<Step>);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Step {
    Key(String),
    Index(usize),
}

impl KeyPath {
    /// Parses `path`, or says what is wrong with it.
    pub fn parse(path: &str) -> Result<Self, String> {
        let mut rest = path.strip_prefix('$').ok_or("must start with `$`")?;
        let mut steps = Vec::new();
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix('.') {
                let end = after.find(['.', '[']).unwrap_or(after.len());
                let key = &after[..end];
                if key.is_empty() || key == "*" {
                    return Err(format!("expected a key after `.` in `{path}`"));
                }
                steps.push(Step::Key(key.to_owned()));
                rest = &after[end..];
            } else if let Some(after) = rest.strip_prefix('[') {
                let end = after
                    .find(']')
                    .ok_or_else(|| format!("unclosed `[` in `{path}`"))?;
                let inner = after[..end].trim();
                let quoted =
                    |q: char| inner.len() >= 2 && inner.starts_with(q) && inner.ends_with(q);
                steps.push(if quoted('\'') || quoted('"') {
                    Step::Key(inner[1..inner.len() - 1].to_owned())
                } else {
                    Step::Index(inner.parse().map_err(|_| {
                        format!("`[{inner}]` in `{path}` is neither an index nor a quoted key (no wildcards)")
                    })?)
                });
                rest = &after[end + 1..];
            } else {
                return Err(format!("unexpected `{rest}` in `{path}`"));
            }
        }
        Ok(KeyPath(steps))
    }

    /// The value at this path, `null` where it leads nowhere.
    pub fn select<'a>(&self, args: &'a Value) -> &'a Value {
        self.0
            .iter()
            .try_fold(args, |value, step| match step {
                Step::Key(key) => value.get(key),
                Step::Index(index) => value.get(index),
            })
            .unwrap_or(&Value::Null)
    }
}

/// The cache key of one call: tenant, tool, version, the content address of the code that
/// answers (so a tool removed and installed again under the same name and version number
/// never answers with its predecessor's results), and the selected value (with object keys
/// sorted, so `{"a":1,"b":2}` and `{"b":2,"a":1}` share a result).
pub fn key(tenant: &str, tool: &str, version: u32, content: &str, selected: &Value) -> [u8; 32] {
    let mut hash = Sha256::new();
    for part in [tenant, tool, &version.to_string(), content] {
        hash.update(part.as_bytes());
        hash.update([0]);
    }
    hash.update(canonical(selected).as_bytes());
    hash.finalize().into()
}

fn canonical(value: &Value) -> String {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_by_key(|(k, _)| *k);
            let body: Vec<String> = entries
                .into_iter()
                .map(|(k, v)| format!("{}:{}", Value::String(k.clone()), canonical(v)))
                .collect();
            format!("{{{}}}", body.join(","))
        }
        Value::Array(items) => format!(
            "[{}]",
            items.iter().map(canonical).collect::<Vec<_>>().join(",")
        ),
        scalar => scalar.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn paths_select_one_value() {
        let args = json!({"city": "Oslo", "q": {"terms": ["a", "b"], "x y": 1}});
        let at = |p: &str| KeyPath::parse(p).unwrap().select(&args).clone();
        assert_eq!(at("$"), args);
        assert_eq!(at("$.city"), json!("Oslo"));
        assert_eq!(at("$.q.terms[1]"), json!("b"));
        assert_eq!(at("$.q['x y']"), json!(1));
        assert_eq!(at("$.missing.deeper"), Value::Null);
        for bad in ["city", "$.", "$.a[*]", "$.*", "$[x]", "$.a[0"] {
            assert!(KeyPath::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn keys_ignore_object_order_but_not_scope() {
        let a = json!({"x": 1, "y": [1, {"b": 2, "a": 1}]});
        let b = json!({"y": [1, {"a": 1, "b": 2}], "x": 1});
        assert_eq!(key("t", "tool", 1, "c", &a), key("t", "tool", 1, "c", &b));
        assert_ne!(key("t", "tool", 1, "c", &a), key("u", "tool", 1, "c", &a));
        assert_ne!(key("t", "tool", 1, "c", &a), key("t", "tool", 2, "c", &a));
        assert_ne!(key("t", "tool", 1, "c", &a), key("t", "tool", 1, "d", &a));
        assert_ne!(
            key("t", "tool", 1, "c", &json!("1")),
            key("t", "tool", 1, "c", &json!(1))
        );
    }
}
