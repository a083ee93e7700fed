//! A pack whose second tool breaks the naming rule: installing it must fail as a whole.

use serde::Deserialize;
use toolhost_sdk::{Context, JsonSchema, Tool, ToolError, export_tools};

#[derive(Deserialize, JsonSchema)]
struct NoArgs {}

fn ok(_: NoArgs, _: &Context) -> Result<bool, ToolError> {
    Ok(true)
}

export_tools!(
    Tool::new("fine_tool", "A valid tool in an invalid pack.", ok),
    Tool::new(
        "bad name!",
        "Spaces and punctuation are not allowed in names.",
        ok
    ),
);
