//! Tools that exercise the host's helpers (KV, config, secrets, the result cache) for the tests.

use serde::Deserialize;
use serde_json::{Value, json};
use toolhost_sdk::{Context, JsonSchema, Tool, ToolError, config, export_tools, kv, log};

#[derive(Deserialize, JsonSchema)]
struct Key {
    key: String,
}

#[derive(Deserialize, JsonSchema)]
struct NoArgs {}

#[derive(Deserialize, JsonSchema)]
struct Busy {
    ms: u64,
}

/// Increments a counter kept in KV and returns its new value.
fn count(args: Key, _: &Context) -> Result<u64, ToolError> {
    let current = kv::get(&args.key)
        .map_err(ToolError::failed)?
        .map_or(0, |bytes| {
            String::from_utf8_lossy(&bytes).parse().unwrap_or(0)
        });
    let next = current + 1;
    kv::set(&args.key, next.to_string().as_bytes()).map_err(ToolError::failed)?;
    Ok(next)
}

/// Reads a secret and a setting, then tries every way to leak the secret.
fn secret_leak(_: NoArgs, _: &Context) -> Result<Value, ToolError> {
    let token = config::get("API_TOKEN")
        .map_err(ToolError::failed)?
        .unwrap_or_default();
    let region = config::get("REGION")
        .map_err(ToolError::failed)?
        .unwrap_or_default();
    log::info(&format!("token={token} region={region}"));
    eprintln!("stderr token={token}");
    println!("stdout token={token}");
    Err(ToolError::failed(format!(
        "upstream rejected token {token} in {region}"
    )))
}

fn config_undeclared(_: NoArgs, _: &Context) -> Result<Value, ToolError> {
    Ok(match config::get("NOT_DECLARED") {
        Ok(value) => json!({"ok": true, "value": value}),
        Err(error) => json!({"ok": false, "error": error}),
    })
}

/// Stores keys until the host refuses one.
fn kv_flood(_: NoArgs, _: &Context) -> Result<Value, ToolError> {
    for i in 0..10_000 {
        if let Err(error) = kv::set(&format!("k{i}"), b"v") {
            return Ok(json!({"stored": i, "error": error}));
        }
    }
    Ok(json!({"stored": 10_000}))
}

/// Runs for `ms` of wall-clock time, then answers.
fn busy(args: Busy, _: &Context) -> Result<&'static str, ToolError> {
    let start = std::time::Instant::now();
    while start.elapsed().as_millis() < u128::from(args.ms) {
        std::hint::black_box(0);
    }
    Ok("done")
}

export_tools!(
    Tool::new("count", "Increments a counter.", count),
    Tool::new(
        "count_cached",
        "Increments a counter; results cached by key.",
        count
    )
    .cache(60_000, "$.key"),
    Tool::new("secret_leak", "Tries to leak a secret.", secret_leak)
        .config(&["API_TOKEN", "REGION"]),
    Tool::new(
        "config_undeclared",
        "Reads an undeclared key.",
        config_undeclared
    )
    .config(&["REGION"]),
    Tool::new("kv_flood", "Fills KV until refused.", kv_flood),
    Tool::new("busy", "Busy for some milliseconds.", busy),
);
