//! A tool's definition: what the agent sees and the limits it runs under.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::keypath::KeyPath;
use crate::schema::{self, ArgsValidator};

/// The longest tool name, in characters.
pub const MAX_NAME_CHARS: usize = 64;
/// The longest description, in characters.
pub const MAX_DESCRIPTION_CHARS: usize = 4096;

/// A tool as declared by its author (a component's `list-tools`, or the embedding app for a
/// native tool). [`ToolSpec::validate`] is the only gate: nothing runs on an unvalidated spec.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    /// `^[a-zA-Z0-9_-]{1,64}$`
    pub name: String,
    /// 1 to 4096 characters.
    pub description: String,
    /// A JSON Schema whose top level is `{"type": "object", ...}`.
    pub parameters: Value,
    /// Reject properties the schema does not declare.
    #[serde(default)]
    pub strict: bool,
    /// A group name, for listing tools by group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Callable by the host application, never listed to an agent.
    #[serde(default)]
    pub private: bool,
    /// Per-call limits: see [`Limits`].
    #[serde(default)]
    pub limits: Limits,
    /// Reuse results: see [`CachePolicy`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<CachePolicy>,
    /// Keys of the tenant's configuration this tool may read with `config-get`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config: Vec<String>,
    /// Every call waits for the embedding app to approve it (see `Host::approve`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub needs_approval: bool,
    /// Running a call twice has the same effect as once, so a timed-out call may be retried.
    #[serde(default, skip_serializing_if = "is_false")]
    pub idempotent: bool,
    /// Retries of a call that timed out: 0 to 5, only for an idempotent tool.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub retry_count_on_stall: u32,
    /// A JSON Schema (`"type": "object"` at the top) that every result must meet: MCP lists it
    /// as the tool's `outputSchema`, and a result that does not meet it is `invalid_output`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<Value>,
}

/// A spec's compiled schemas, which calls are checked against.
pub struct Schemas {
    /// The arguments'.
    pub args: ArgsValidator,
    /// The results', for a tool that declares an `output_schema`.
    pub output: Option<ArgsValidator>,
}

impl std::fmt::Debug for Schemas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schemas")
            .field("output", &self.output.is_some())
            .finish_non_exhaustive()
    }
}

fn is_false(value: &bool) -> bool {
    !value
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}

/// The most times a stalled idempotent call may be run again (`retry_count_on_stall`).
pub const MAX_RETRY_COUNT_ON_STALL: u32 = 5;

/// A call whose arguments hold the same value at `key_path` as an earlier call within `ttl_ms`
/// gets that call's result without running the tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CachePolicy {
    /// How long a result may be reused, in milliseconds ([`CACHE_TTL_MS`]).
    pub ttl_ms: u64,
    /// A JSONPath into the arguments without wildcards: `$`, `$.city`, `$.query.terms[0]`.
    pub key_path: String,
}

/// `cache.ttl_ms`.
pub const CACHE_TTL_MS: LimitRule = LimitRule {
    field: "cache.ttl_ms",
    default: 0,
    min: 1,
    max: 30 * 24 * 3600 * 1000,
};
/// The most config keys a tool may declare.
pub const MAX_CONFIG_KEYS: usize = 32;

/// `^[A-Za-z0-9_.-]{1,128}$`
pub fn is_valid_config_key(key: &str) -> bool {
    (1..=128).contains(&key.len())
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b))
}

/// Per-call limits. Each has a default and a hard cap; a spec over a cap is rejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Wall-clock deadline of one call, in milliseconds ([`TIMEOUT_MS`]).
    pub timeout_ms: u64,
    /// Fuel, about one unit per Wasm instruction ([`FUEL`]).
    pub fuel: u64,
    /// The guest's linear memory cap, in bytes ([`MEMORY_BYTES`]).
    pub memory_bytes: u64,
    /// Results longer than this are clipped ([`MAX_RESULT_CHARS`]).
    pub max_result_chars: u64,
}

/// One limit's default and allowed range, in one table so docs and checks cannot disagree.
pub struct LimitRule {
    /// The field's path in a spec, as errors name it.
    pub field: &'static str,
    /// Its value when the spec leaves it out.
    pub default: u64,
    /// The least it may be.
    pub min: u64,
    /// The most it may be.
    pub max: u64,
}

/// `limits.timeout_ms`.
pub const TIMEOUT_MS: LimitRule = LimitRule {
    field: "limits.timeout_ms",
    default: 30_000,
    min: 1,
    max: 120_000,
};
/// About one unit per Wasm instruction: the default is a few seconds of pure compute.
pub const FUEL: LimitRule = LimitRule {
    field: "limits.fuel",
    default: 10_000_000_000,
    min: 1,
    max: 200_000_000_000,
};
/// `limits.memory_bytes`.
pub const MEMORY_BYTES: LimitRule = LimitRule {
    field: "limits.memory_bytes",
    default: 64 << 20,
    min: 1 << 20,
    max: 512 << 20,
};
/// The floor leaves room for the clip marker itself.
pub const MAX_RESULT_CHARS: LimitRule = LimitRule {
    field: "limits.max_result_chars",
    default: 16_384,
    min: 64,
    max: 1 << 20,
};

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout_ms: TIMEOUT_MS.default,
            fuel: FUEL.default,
            memory_bytes: MEMORY_BYTES.default,
            max_result_chars: MAX_RESULT_CHARS.default,
        }
    }
}

impl Limits {
    /// [`Limits::timeout_ms`] as a duration.
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }

    fn check(&self, tool: &str) -> Result<(), SpecError> {
        for (rule, value) in [
            (TIMEOUT_MS, self.timeout_ms),
            (FUEL, self.fuel),
            (MEMORY_BYTES, self.memory_bytes),
            (MAX_RESULT_CHARS, self.max_result_chars),
        ] {
            if !(rule.min..=rule.max).contains(&value) {
                return Err(SpecError::new(
                    tool,
                    rule.field,
                    format!("must be {} to {}, got {value}", rule.min, rule.max),
                ));
            }
        }
        Ok(())
    }
}

/// A spec that breaks a rule: names the tool, the field and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("tool `{tool}`: {field}: {rule}")]
pub struct SpecError {
    /// The tool's name (cut to 65 characters).
    pub tool: String,
    /// The field at fault, such as `limits.fuel`.
    pub field: String,
    /// What it must be.
    pub rule: String,
}

impl SpecError {
    /// An error about `field` of `tool`.
    pub fn new(tool: &str, field: &str, rule: impl Into<String>) -> Self {
        // A hostile name must not flood an error message.
        let tool: String = tool.chars().take(MAX_NAME_CHARS + 1).collect();
        SpecError {
            tool,
            field: field.to_owned(),
            rule: rule.into(),
        }
    }
}

/// The progressive-disclosure bridges an agent may be shown (served by `toolhost-server`).
pub const TOOL_SEARCH: &str = "tool_search";
/// The bridge that describes one tool.
pub const TOOL_DESCRIBE: &str = "tool_describe";
/// The bridge that calls a tool by name.
pub const TOOL_CALL: &str = "tool_call";
/// Names no tenant tool may take: a call by one of them reaches the bridge, so a tenant tool
/// under it would be listed but never called.
pub const RESERVED_NAMES: [&str; 3] = [TOOL_SEARCH, TOOL_DESCRIBE, TOOL_CALL];

/// `^[a-zA-Z0-9_-]{1,64}$`, without a regex engine.
pub fn is_valid_name(name: &str) -> bool {
    (1..=MAX_NAME_CHARS).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl ToolSpec {
    /// A spec with the default flags and limits.
    pub fn new(name: impl Into<String>, description: impl Into<String>, parameters: Value) -> Self {
        ToolSpec {
            name: name.into(),
            description: description.into(),
            parameters,
            strict: false,
            group: None,
            private: false,
            limits: Limits::default(),
            cache: None,
            config: Vec::new(),
            needs_approval: false,
            idempotent: false,
            retry_count_on_stall: 0,
            output_schema: None,
        }
    }

    /// Checks every rule and compiles the schemas, which calls then validate against.
    pub fn validate(&self) -> Result<Schemas, SpecError> {
        self.check_fields()?;
        self.compile_schemas()
    }

    /// Every rule but the schemas': cheap, for a spec read back from the store, whose schemas
    /// are compiled on its first call.
    pub fn check_fields(&self) -> Result<(), SpecError> {
        let name = &self.name;
        if !is_valid_name(name) {
            return Err(SpecError::new(
                name,
                "name",
                "must match ^[a-zA-Z0-9_-]{1,64}$",
            ));
        }
        let description_chars = self.description.chars().count();
        if !(1..=MAX_DESCRIPTION_CHARS).contains(&description_chars) {
            return Err(SpecError::new(
                name,
                "description",
                format!("must be 1 to {MAX_DESCRIPTION_CHARS} characters, got {description_chars}"),
            ));
        }
        if let Some(group) = &self.group
            && !is_valid_name(group)
        {
            return Err(SpecError::new(
                name,
                "group",
                "must match ^[a-zA-Z0-9_-]{1,64}$",
            ));
        }
        self.limits.check(name)?;
        if let Some(cache) = &self.cache {
            if !(CACHE_TTL_MS.min..=CACHE_TTL_MS.max).contains(&cache.ttl_ms) {
                let rule = format!(
                    "must be {} to {}, got {}",
                    CACHE_TTL_MS.min, CACHE_TTL_MS.max, cache.ttl_ms
                );
                return Err(SpecError::new(name, CACHE_TTL_MS.field, rule));
            }
            KeyPath::parse(&cache.key_path)
                .map_err(|rule| SpecError::new(name, "cache.key_path", rule))?;
        }
        if self.config.len() > MAX_CONFIG_KEYS {
            return Err(SpecError::new(
                name,
                "config",
                format!("at most {MAX_CONFIG_KEYS} keys"),
            ));
        }
        if let Some(bad) = self.config.iter().find(|k| !is_valid_config_key(k)) {
            let rule = format!(
                "key `{}` must match ^[A-Za-z0-9_.-]{{1,128}}$",
                bad.chars().take(129).collect::<String>()
            );
            return Err(SpecError::new(name, "config", rule));
        }
        if self.retry_count_on_stall > MAX_RETRY_COUNT_ON_STALL {
            let rule = format!(
                "must be 0 to {MAX_RETRY_COUNT_ON_STALL}, got {}",
                self.retry_count_on_stall
            );
            return Err(SpecError::new(name, "retry_count_on_stall", rule));
        }
        if self.retry_count_on_stall > 0 && !self.idempotent {
            return Err(SpecError::new(
                name,
                "retry_count_on_stall",
                "only an idempotent tool may be retried (set idempotent)",
            ));
        }
        Ok(())
    }

    /// Compiles the parameters' and the output's schemas, checking a strict spec's too.
    pub fn compile_schemas(&self) -> Result<Schemas, SpecError> {
        let name = &self.name;
        let args = schema::compile(&self.parameters, self.strict)
            .map_err(|rule| SpecError::new(name, "parameters", rule))?;
        if self.strict {
            crate::strict::openai_strict(&self.parameters)
                .map_err(|rule| SpecError::new(name, "parameters", format!("strict: {rule}")))?;
        }
        let output = match &self.output_schema {
            None => None,
            Some(output) => Some(
                schema::compile(output, false)
                    .map_err(|rule| SpecError::new(name, "output_schema", rule))?,
            ),
        };
        Ok(Schemas { args, output })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec() -> ToolSpec {
        ToolSpec::new("echo", "Echoes.", json!({"type": "object"}))
    }

    fn field_of(spec: &ToolSpec) -> String {
        spec.validate().expect_err("spec should be rejected").field
    }

    #[test]
    fn a_plain_spec_is_valid() {
        assert!(spec().validate().is_ok());
    }

    #[test]
    fn names_follow_the_pattern() {
        for good in ["a", "A-z_09", &"x".repeat(64)] {
            assert!(is_valid_name(good), "{good}");
        }
        for bad in [
            "",
            "has space",
            "dot.ted",
            "ünï",
            &"x".repeat(65),
            "semi;colon",
        ] {
            let mut s = spec();
            s.name = bad.to_owned();
            assert_eq!(field_of(&s), "name", "{bad}");
        }
    }

    #[test]
    fn description_is_bounded_in_characters() {
        let mut s = spec();
        s.description = "é".repeat(4096); // 8192 bytes, 4096 characters: allowed
        assert!(s.validate().is_ok());
        s.description.push('é');
        assert_eq!(field_of(&s), "description");
        s.description.clear();
        assert_eq!(field_of(&s), "description");
    }

    #[test]
    fn limits_are_capped_and_named() {
        let mut s = spec();
        s.limits.timeout_ms = 120_001;
        let err = s.validate().unwrap_err();
        assert_eq!(err.field, "limits.timeout_ms");
        assert!(err.rule.contains("120000"), "{err}");
        let mut s = spec();
        s.limits.memory_bytes = 0;
        assert_eq!(field_of(&s), "limits.memory_bytes");
        let mut s = spec();
        s.limits.max_result_chars = 10;
        assert_eq!(field_of(&s), "limits.max_result_chars");
    }

    #[test]
    fn parameters_must_be_an_object_schema() {
        let mut s = spec();
        s.parameters = json!({"type": "string"});
        assert_eq!(field_of(&s), "parameters");
        s.parameters = json!({"type": "object", "properties": {"n": {"type": "nonsense"}}});
        assert_eq!(field_of(&s), "parameters");
    }

    #[test]
    fn cache_and_config_are_checked() {
        let mut s = spec();
        s.cache = Some(CachePolicy {
            ttl_ms: 1000,
            key_path: "$.city".into(),
        });
        assert!(s.validate().is_ok());
        s.cache = Some(CachePolicy {
            ttl_ms: 1000,
            key_path: "$.items[*]".into(),
        });
        assert_eq!(field_of(&s), "cache.key_path");
        s.cache = Some(CachePolicy {
            ttl_ms: 0,
            key_path: "$".into(),
        });
        assert_eq!(field_of(&s), "cache.ttl_ms");
        let mut s = spec();
        s.config = vec!["API_TOKEN".into(), "bad key".into()];
        assert_eq!(field_of(&s), "config");
    }

    #[test]
    fn a_strict_tool_must_meet_openais_strict_rules() {
        let mut s = spec();
        s.strict = true;
        s.parameters = json!({"type": "object", "properties": {"a": {"not": {"type": "string"}}}});
        let error = s.validate().unwrap_err();
        assert_eq!(error.field, "parameters");
        assert!(
            error
                .rule
                .starts_with("strict: strict mode does not support `not`"),
            "{error}"
        );
    }

    #[test]
    fn stall_retries_are_capped_and_need_idempotence() {
        let mut s = spec();
        s.retry_count_on_stall = 2;
        assert_eq!(field_of(&s), "retry_count_on_stall");
        s.idempotent = true;
        assert!(s.validate().is_ok());
        s.retry_count_on_stall = MAX_RETRY_COUNT_ON_STALL + 1;
        assert_eq!(field_of(&s), "retry_count_on_stall");
    }

    #[test]
    fn group_follows_the_name_pattern() {
        let mut s = spec();
        s.group = Some("no spaces".into());
        assert_eq!(field_of(&s), "group");
    }

    #[test]
    fn limits_default_when_absent_from_json() {
        let s: ToolSpec = serde_json::from_value(json!({
            "name": "t", "description": "d", "parameters": {"type": "object"},
            "limits": {"timeout_ms": 5}
        }))
        .unwrap();
        assert_eq!(s.limits.timeout_ms, 5);
        assert_eq!(s.limits.max_result_chars, MAX_RESULT_CHARS.default);
    }
}
