//! JSONPath queries over a JSON document: `$.store.book[0].title`, `$..author`, `$.a[*]`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use toolhost_sdk::{Context, Tool, ToolError, export_tools};

#[derive(Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The JSON document to query, as JSON text (so that strict-mode models can send any
    /// document).
    document: String,
    /// A JSONPath: `$` then any of `.key`, `['key']`, `[index]` (negative counts from the
    /// end), `[*]` or `.*` (every child), `..key` (that key at any depth).
    path: String,
}

#[derive(Serialize)]
struct Matches {
    count: usize,
    matches: Vec<Value>,
}

#[derive(Debug, PartialEq)]
enum Step {
    Key(String),
    Index(i64),
    Wildcard,
    Descendants(String),
}

fn parse(path: &str) -> Result<Vec<Step>, String> {
    let rest = path.strip_prefix('$').ok_or("a path starts with `$`")?;
    let chars: Vec<char> = rest.chars().collect();
    let mut steps = Vec::new();
    let mut i = 0;
    let ident = |i: &mut usize| {
        let start = *i;
        while *i < chars.len()
            && (chars[*i].is_alphanumeric() || chars[*i] == '_' || chars[*i] == '-')
        {
            *i += 1;
        }
        chars[start..*i].iter().collect::<String>()
    };
    while i < chars.len() {
        match chars[i] {
            '.' if chars.get(i + 1) == Some(&'.') => {
                i += 2;
                let key = ident(&mut i);
                if key.is_empty() {
                    return Err(format!("expected a key after `..` at column {}", i + 2));
                }
                steps.push(Step::Descendants(key));
            }
            '.' if chars.get(i + 1) == Some(&'*') => {
                i += 2;
                steps.push(Step::Wildcard);
            }
            '.' => {
                i += 1;
                let key = ident(&mut i);
                if key.is_empty() {
                    return Err(format!("expected a key after `.` at column {}", i + 2));
                }
                steps.push(Step::Key(key));
            }
            '[' => {
                let close = chars[i..]
                    .iter()
                    .position(|&c| c == ']')
                    .map(|p| i + p)
                    .ok_or(format!("unclosed `[` at column {}", i + 2))?;
                let inner: String = chars[i + 1..close].iter().collect();
                let inner = inner.trim();
                let quoted =
                    |q: char| inner.len() >= 2 && inner.starts_with(q) && inner.ends_with(q);
                steps.push(if inner == "*" {
                    Step::Wildcard
                } else if quoted('\'') || quoted('"') {
                    Step::Key(inner[1..inner.len() - 1].to_owned())
                } else {
                    Step::Index(inner.parse().map_err(|_| {
                        format!("`[{inner}]` is neither an index, a quoted key nor `*`")
                    })?)
                });
                i = close + 1;
            }
            c => return Err(format!("unexpected `{c}` at column {}", i + 2)),
        }
    }
    Ok(steps)
}

fn descendants<'a>(value: &'a Value, key: &str, out: &mut Vec<&'a Value>) {
    match value {
        Value::Object(map) => {
            if let Some(found) = map.get(key) {
                out.push(found);
            }
            map.values().for_each(|v| descendants(v, key, out));
        }
        Value::Array(items) => items.iter().for_each(|v| descendants(v, key, out)),
        _ => {}
    }
}

fn query<'a>(document: &'a Value, steps: &[Step]) -> Vec<&'a Value> {
    let mut current = vec![document];
    for step in steps {
        let mut next = Vec::new();
        for value in current {
            match (step, value) {
                (Step::Key(key), Value::Object(map)) => next.extend(map.get(key)),
                (Step::Index(index), Value::Array(items)) => {
                    let at = if *index < 0 {
                        items.len() as i64 + index
                    } else {
                        *index
                    };
                    next.extend(usize::try_from(at).ok().and_then(|at| items.get(at)));
                }
                (Step::Wildcard, Value::Object(map)) => next.extend(map.values()),
                (Step::Wildcard, Value::Array(items)) => next.extend(items.iter()),
                (Step::Descendants(key), value) => descendants(value, key, &mut next),
                _ => {}
            }
        }
        current = next;
    }
    current
}

fn json_query(args: Args, _ctx: &Context) -> Result<Matches, ToolError> {
    let steps = parse(&args.path).map_err(|e| ToolError::invalid_args(format!("path: {e}")))?;
    let document: Value = serde_json::from_str(&args.document)
        .map_err(|e| ToolError::invalid_args(format!("document: not JSON: {e}")))?;
    let matches: Vec<Value> = query(&document, &steps).into_iter().cloned().collect();
    Ok(Matches {
        count: matches.len(),
        matches,
    })
}

export_tools!(
    Tool::new(
        "json_query",
        "Selects values from a JSON document with a JSONPath expression such as `$.items[0].name`, `$..id` or `$.users[*].email`. Returns every match and their count.",
        json_query,
    )
    .strict()
);
