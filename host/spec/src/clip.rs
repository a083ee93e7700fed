//! Fitting a JSON result into a character budget while keeping it valid JSON.
//!
//! One knob `k` caps every string at `k` characters, every array at `k` items and every object
//! at `k` keys; a binary search finds the largest `k` that fits. Small values are never cut
//! before large ones, and each cut leaves a marker saying how much went:
//! `"abc…[+120 chars]"`, `[1, 2, "…[+98 items]"]`, `{"a": 1, "…": "+7 keys"}`.

use serde::Serialize;
use serde_json::{Map, Value};

/// What clipping did to a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Clipped {
    /// The result's size in characters before clipping.
    pub original_chars: usize,
    /// Its size after.
    pub returned_chars: usize,
}

/// The key that stands for an object's dropped keys.
pub const DROPPED_KEYS: &str = "…";

/// Returns `value` unchanged if its JSON fits in `max_chars`, else a clipped copy that fits.
pub fn clip(value: Value, max_chars: usize) -> (Value, Option<Clipped>) {
    let original_chars = json_chars(&value);
    if original_chars <= max_chars {
        return (value, None);
    }
    let fits = |k: usize| {
        let clipped = shrink(&value, k);
        (json_chars(&clipped) <= max_chars).then_some(clipped)
    };
    let Some(mut best) = fits(0) else {
        // Not even the skeleton fits: say so in a string, cut to the budget.
        let note = format!("…[clipped: the result was {original_chars} characters]");
        let note = Value::String(note.chars().take(max_chars.saturating_sub(2)).collect());
        return finish(note, original_chars);
    };
    // Invariant: `lo` fits, `hi` does not (at `widest`, nothing is cut).
    let (mut lo, mut hi) = (0, widest(&value));
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        match fits(mid) {
            Some(clipped) => (lo, best) = (mid, clipped),
            None => hi = mid,
        }
    }
    finish(best, original_chars)
}

fn finish(value: Value, original_chars: usize) -> (Value, Option<Clipped>) {
    let returned_chars = json_chars(&value);
    let report = Clipped {
        original_chars,
        returned_chars,
    };
    (value, Some(report))
}

/// Characters in `value`'s compact JSON, counted as it is written, without building it.
pub fn json_chars(value: &Value) -> usize {
    struct CharCount(usize);
    impl std::io::Write for CharCount {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            // Every UTF-8 byte but a continuation byte (0b10xx_xxxx) starts a character.
            self.0 += buf.iter().filter(|&&b| (b as i8) >= -0x40).count();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = CharCount(0);
    // Writing a `Value` cannot fail: its keys are strings and the sink never errors.
    serde_json::to_writer(&mut count, value).map_or(usize::MAX, |()| count.0)
}

/// About the memory `value` holds, parsed: each value is a `Value` of its own, so an array
/// of small numbers takes 36 times its JSON (a `Value` is 72 bytes with `preserve_order`).
pub fn held_bytes(value: &Value) -> usize {
    // A key is a `String`, and the map indexes and hashes it.
    const ENTRY: usize = size_of::<String>() + 16;
    size_of::<Value>()
        + match value {
            Value::Null | Value::Bool(_) | Value::Number(_) => 0,
            Value::String(s) => s.len(),
            Value::Array(items) => items.iter().map(held_bytes).sum(),
            Value::Object(map) => (map.iter())
                .map(|(k, v)| ENTRY + k.len() + held_bytes(v))
                .sum(),
        }
}

/// Bytes of `value`'s compact JSON, counted as it is written, without building it.
pub fn json_bytes(value: &impl serde::Serialize) -> u64 {
    struct ByteCount(u64);
    impl std::io::Write for ByteCount {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = ByteCount(0);
    serde_json::to_writer(&mut count, value).map_or(u64::MAX, |()| count.0)
}

/// JSON texts with more values than this are not parsed: an 8 MiB text of `[0,0,…]` held
/// hundreds of MiB as values, counted by no budget.
pub const MAX_PARSED_VALUES: usize = 1_000_000;

/// How many values JSON `text` holds, if it is JSON: one, and one more for each comma and
/// each non-empty array or object, outside strings. A linear scan, far cheaper than parsing.
pub fn json_values(text: &str) -> usize {
    let (mut values, mut in_string, mut escaped) = (1usize, false, false);
    // The last byte outside strings that is not white space.
    let mut last = 0u8;
    for byte in text.bytes() {
        match (in_string, byte) {
            (true, _) if escaped => escaped = false,
            (true, b'\\') => escaped = true,
            (true, b'"') => in_string = false,
            (true, _) => {}
            (false, b' ' | b'\t' | b'\n' | b'\r') => continue,
            (false, b'"') => in_string = true,
            (false, b',' | b'[' | b'{') => values += 1,
            // `[]` and `{}` hold nothing: their opening counted one too many.
            (false, b']') if last == b'[' => values -= 1,
            (false, b'}') if last == b'{' => values -= 1,
            (false, _) => {}
        }
        last = byte;
    }
    values
}

/// Levels of arrays and objects a stored call's arguments or caller data may nest: the store
/// wraps them a few levels deeper, and reads back at most 128 (serde_json's limit).
pub const MAX_STORED_DEPTH: usize = 64;

/// Levels of arrays and objects in `value`: 0 for a scalar, 1 for `[]` or `{"a": 1}`.
pub fn json_depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut pending = vec![(value, 0)];
    while let Some((value, depth)) = pending.pop() {
        let children: Box<dyn Iterator<Item = &Value>> = match value {
            Value::Array(items) => Box::new(items.iter()),
            Value::Object(map) => Box::new(map.values()),
            _ => continue,
        };
        deepest = deepest.max(depth + 1);
        pending.extend(children.map(|child| (child, depth + 1)));
    }
    deepest
}

/// The largest string length, array length or key count anywhere in `value`.
fn widest(value: &Value) -> usize {
    match value {
        Value::String(s) => s.chars().count(),
        Value::Array(items) => items.iter().map(widest).fold(items.len(), usize::max),
        Value::Object(map) => map.values().map(widest).fold(map.len(), usize::max),
        _ => 0,
    }
}

fn shrink(value: &Value, k: usize) -> Value {
    match value {
        Value::String(s) => {
            let len = s.chars().count();
            if len <= k {
                value.clone()
            } else {
                let kept: String = s.chars().take(k).collect();
                Value::String(format!("{kept}…[+{} chars]", len - k))
            }
        }
        Value::Array(items) => {
            let mut kept: Vec<Value> = items.iter().take(k).map(|v| shrink(v, k)).collect();
            if items.len() > k {
                kept.push(Value::String(format!("…[+{} items]", items.len() - k)));
            }
            Value::Array(kept)
        }
        Value::Object(map) => {
            let mut kept: Map<String, Value> = map
                .iter()
                .take(k)
                .map(|(key, v)| (key.clone(), shrink(v, k)))
                .collect();
            if map.len() > k {
                let note = format!("+{} keys", map.len() - k);
                kept.insert(DROPPED_KEYS.into(), Value::String(note));
            }
            Value::Object(kept)
        }
        _ => value.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_result_within_budget_is_untouched() {
        let v = json!({"a": [1, 2, 3], "b": "text"});
        assert_eq!(clip(v.clone(), 1000), (v, None));
    }

    #[test]
    fn clipped_results_fit_and_stay_valid_json() {
        let cases = [
            json!("x".repeat(10_000)),
            json!((0..5000).collect::<Vec<_>>()),
            json!({"rows": (0..2000).map(|i| json!({"id": i, "name": format!("row {i}")})).collect::<Vec<_>>()}),
            json!({"small": 1, "big": "é".repeat(50_000), "list": vec![vec![vec!["deep"; 100]; 30]; 5]}),
        ];
        for budget in [64, 100, 1000, 4096] {
            for v in &cases {
                let (out, report) = clip(v.clone(), budget);
                let text = serde_json::to_string(&out).unwrap();
                assert!(text.chars().count() <= budget, "{budget}: {text}");
                let report = report.expect("over budget, so clipped");
                assert_eq!(report.original_chars, json_chars(v));
                assert_eq!(report.returned_chars, text.chars().count());
                assert!(text.contains('…'), "a marker says what was cut: {text}");
                let _: Value = serde_json::from_str(&text).unwrap();
            }
        }
    }

    #[test]
    fn small_values_survive_while_large_ones_are_cut() {
        let v = json!({"id": 7, "status": "ok", "body": "y".repeat(100_000)});
        let (out, _) = clip(v, 2000);
        assert_eq!(out["id"], 7);
        assert_eq!(out["status"], "ok");
        let body = out["body"].as_str().unwrap();
        assert!(
            body.starts_with("yyyy") && body.ends_with(" chars]"),
            "{body}"
        );
        assert!(
            body.len() > 1500,
            "the budget is used, not wasted: {}",
            body.len()
        );
    }

    #[test]
    fn markers_count_what_was_dropped() {
        let (out, _) = clip(json!((0..100).collect::<Vec<_>>()), 64);
        let items = out.as_array().unwrap();
        let kept = items.len() - 1;
        assert_eq!(
            items.last().unwrap(),
            &json!(format!("…[+{} items]", 100 - kept))
        );
        let wide: Map<String, Value> = (0..50).map(|i| (format!("k{i}"), json!(i))).collect();
        let (out, _) = clip(Value::Object(wide), 100);
        let note = out[DROPPED_KEYS].as_str().unwrap();
        let kept = out.as_object().unwrap().len() - 1;
        assert_eq!(note, format!("+{} keys", 50 - kept));
    }

    #[test]
    fn depth_counts_levels_of_arrays_and_objects() {
        assert_eq!(json_depth(&json!(1)), 0);
        assert_eq!(json_depth(&json!([])), 1);
        assert_eq!(json_depth(&json!({"a": [1, {"b": []}], "c": 2})), 4);
        let mut deep = json!(null);
        for _ in 0..1000 {
            deep = json!([deep]);
        }
        assert_eq!(json_depth(&deep), 1000);
    }

    #[test]
    fn values_are_counted_outside_strings() {
        assert_eq!(json_values("1"), 1);
        assert_eq!(json_values("[0,0,0]"), 4);
        assert_eq!(json_values(r#"{"a,[{": "x\\", "b": [1]}"#), 4);
        assert_eq!(json_values(r#""\",[,{""#), 1);
        assert_eq!(json_values("[{}, { }, []]"), 4);
        assert_eq!(json_values("[]"), 1);
    }
}
