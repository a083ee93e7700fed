//! Tool specs in the shapes LLM APIs take: OpenAI function tools, Anthropic tools, MCP tools.

use std::str::FromStr;

use serde_json::{Value, json};

use crate::anthropic;
use crate::spec::ToolSpec;
use crate::strict::openai_strict;

/// The tool-spec shape of one LLM API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `{"type": "function", "function": {name, description, parameters, strict}}`
    OpenAi,
    /// `{name, description, input_schema}`
    Anthropic,
    /// `{name, description, inputSchema, _meta}` as in MCP's `tools/list`
    Mcp,
}

impl FromStr for Format {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "openai" => Ok(Format::OpenAi),
            "anthropic" => Ok(Format::Anthropic),
            "mcp" => Ok(Format::Mcp),
            other => Err(format!(
                "unknown format `{other}`: use openai, anthropic or mcp"
            )),
        }
    }
}

/// Where MCP has room for the group: a tool's `_meta`.
pub const MCP_GROUP_META: &str = "toolhost/group";

/// One tool in `format`. A strict tool's schema was checked at install, so conversion holds.
pub fn tool(spec: &ToolSpec, format: Format) -> Value {
    match format {
        Format::OpenAi => {
            let parameters = match spec.strict {
                true => openai_strict(&spec.parameters).unwrap_or_else(|_| spec.parameters.clone()),
                false => spec.parameters.clone(),
            };
            json!({"type": "function", "function": {
                "name": spec.name,
                "description": spec.description,
                "parameters": parameters,
                "strict": spec.strict,
            }})
        }
        Format::Anthropic => {
            let mut tool = json!({
                "name": spec.name,
                "description": spec.description,
                "input_schema": anthropic::input_schema(&spec.parameters, spec.strict),
            });
            if spec.strict {
                tool["strict"] = Value::Bool(true);
            }
            tool
        }
        Format::Mcp => {
            let mut tool = json!({
                "name": spec.name,
                "description": spec.description,
                "inputSchema": spec.parameters,
            });
            if let Some(output) = &spec.output_schema {
                tool["outputSchema"] = output.clone();
            }
            if let Some(group) = &spec.group {
                tool["_meta"] = json!({MCP_GROUP_META: group});
            }
            tool
        }
    }
}

/// `specs` in `format`, in order.
pub fn tools<'a>(specs: impl IntoIterator<Item = &'a ToolSpec>, format: Format) -> Vec<Value> {
    specs.into_iter().map(|spec| tool(spec, format)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strict::MAX_STRICT_DEPTH;

    fn spec(strict: bool) -> ToolSpec {
        let mut spec = ToolSpec::new(
            "weather",
            "Current weather.",
            json!({"type": "object", "required": ["city"], "properties": {
                "city": {"type": "string"},
                "units": {"enum": ["c", "f"]},
                "days": {"type": "integer"},
                "where": {"type": "object", "properties": {"lat": {"type": "number"}}}
            }}),
        );
        spec.strict = strict;
        spec.group = Some("weather".into());
        spec
    }

    #[test]
    fn each_format_has_its_shape() {
        let s = spec(false);
        let openai = tool(&s, Format::OpenAi);
        assert_eq!(openai["type"], "function");
        assert_eq!(openai["function"]["name"], "weather");
        assert_eq!(openai["function"]["parameters"], s.parameters);
        assert_eq!(openai["function"]["strict"], false);
        let anthropic = tool(&s, Format::Anthropic);
        assert_eq!(
            anthropic.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["name", "description", "input_schema"]
        );
        let mcp = tool(&s, Format::Mcp);
        assert_eq!(mcp["inputSchema"], s.parameters);
        assert_eq!(mcp["_meta"][MCP_GROUP_META], "weather");
    }

    #[test]
    fn strict_schemas_close_every_object_and_require_every_property() {
        let out = tool(&spec(true), Format::OpenAi);
        let p = &out["function"]["parameters"];
        assert_eq!(out["function"]["strict"], true);
        assert_eq!(p["additionalProperties"], false);
        assert_eq!(p["required"], json!(["city", "units", "days", "where"]));
        assert_eq!(
            p["properties"]["city"]["type"], "string",
            "required stays as is"
        );
        assert_eq!(p["properties"]["days"]["type"], json!(["integer", "null"]));
        assert_eq!(
            p["properties"]["units"]["anyOf"][0]["enum"],
            json!(["c", "f"])
        );
        let inner = &p["properties"]["where"];
        assert_eq!(inner["type"], json!(["object", "null"]));
        assert_eq!(inner["additionalProperties"], false);
        assert_eq!(inner["required"], json!(["lat"]));
        assert_eq!(
            inner["properties"]["lat"]["type"],
            json!(["number", "null"])
        );
    }

    #[test]
    fn annotations_and_unknown_formats_are_dropped_from_strict_schemas() {
        let schema = json!({"type": "object", "$schema": "https://json-schema.org/draft/2020-12/schema",
            "required": ["x", "when", "r"], "properties": {
            "x": {"type": "number", "format": "double", "default": 1.5, "examples": [2]},
            "when": {"type": "string", "format": "date"},
            "r": {"$ref": "#/$defs/unit", "description": "The unit."}},
            "$defs": {"unit": {"enum": ["m", "s"], "$comment": "SI"}}});
        let strict = openai_strict(&schema).unwrap();
        assert_eq!(
            strict,
            json!({"type": "object", "additionalProperties": false,
                "required": ["x", "when", "r"], "properties": {
                "x": {"type": "number"},
                "when": {"type": "string", "format": "date"},
                "r": {"$ref": "#/$defs/unit"}},
                "$defs": {"unit": {"enum": ["m", "s"]}}})
        );
    }

    #[test]
    fn what_strict_mode_cannot_express_is_named() {
        let cases = [
            (
                json!({"type": "object", "properties": {"a": {"allOf": [{"type": "string"}]}}}),
                "`allOf` (at #/properties/a)",
            ),
            (
                json!({"type": "object", "additionalProperties": {"type": "string"}}),
                "additionalProperties: false",
            ),
            (
                json!({"type": "object", "properties": {"t": {"type": "array", "uniqueItems": true}}}),
                "`uniqueItems`",
            ),
            (
                json!({"anyOf": [{"type": "object"}, {"type": "object"}]}),
                "a root of `\"type\": \"object\"`",
            ),
            (
                json!({"type": "object", "properties": {"any": {"description": "anything"}}}),
                "needs a `type` (or `enum`, `const`, `anyOf`) on every schema (at #/properties/any)",
            ),
            (
                json!({"type": "object", "properties": {"s": {"type": "string", "minLength": 1}}}),
                "`minLength` (at #/properties/s)",
            ),
            (
                json!({"type": "object", "properties": {"t": {"type": "array", "prefixItems": []}}}),
                "`prefixItems`",
            ),
            (
                json!({"type": "object", "properties": {"u": {"type": "string", "format": "uri"}}}),
                "`format: uri` (at #/properties/u)",
            ),
            (
                json!({"type": "object", "properties": {"r": {"$ref": "#/$defs/x", "minimum": 1}},
                       "$defs": {"x": {"type": "integer"}}}),
                "nothing beside `$ref`, here `minimum`",
            ),
            (
                json!({"type": "object", "properties": {"n": {"type": ["string", "integer"]}}}),
                "one type, or one and \"null\"",
            ),
        ];
        for (schema, expected) in cases {
            let error = openai_strict(&schema).unwrap_err();
            assert!(error.contains(expected), "{error}");
        }
        let mut deep = json!({"type": "object"});
        for _ in 0..MAX_STRICT_DEPTH {
            deep = json!({"type": "object", "properties": {"a": deep}});
        }
        assert!(openai_strict(&deep).unwrap_err().contains("levels"));
    }
}
