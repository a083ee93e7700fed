//! End to end: plugins built from source, installed and called through the library and the CLI.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::plugins::{plugin, plugins_dir};
use serde_json::{Value, json};
use toolhost::sandbox::LoadError;
use toolhost::{
    CallError, CallOutcome, Caller, Host, HostConfig, InstallError, Limits, SandboxConfig,
    ToolError, ToolSpec,
};

async fn host_with(plugins: &[&str]) -> Host {
    let host = Host::open(crate::plugins::config()).await.unwrap();
    for name in plugins {
        host.install("acme", plugin(name)).await.unwrap();
    }
    host
}

async fn call(host: &Host, tool: &str, args: Value) -> CallOutcome {
    host.call(&Caller::tenant("acme"), tool, args).await
}

fn error(outcome: &CallOutcome) -> &CallError {
    outcome
        .result
        .as_ref()
        .err()
        .unwrap_or_else(|| panic!("expected an error, got {:?}", outcome.result))
}

// ---- the happy path ----

#[tokio::test]
async fn a_pack_installs_lists_calls_and_removes() {
    let host = Host::open(crate::plugins::config()).await.unwrap();
    let specs = host.install("acme", plugin("text_stats")).await.unwrap();
    let names: Vec<_> = specs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["text_stats", "word_frequency"]);

    let listed: Vec<_> = host.list("acme").into_iter().map(|t| t.spec.name).collect();
    assert_eq!(listed, ["text_stats", "word_frequency"]);
    let spec = host.describe("acme", "text_stats").unwrap().spec;
    assert_eq!(spec.group.as_deref(), Some("text"));
    assert_eq!(spec.parameters["properties"]["text"]["type"], "string");

    let out = call(
        &host,
        "text_stats",
        json!({"text": "One two. Three!\nFour"}),
    )
    .await;
    let stats = out.result.unwrap();
    assert_eq!(
        (
            stats["words"].as_u64(),
            stats["lines"].as_u64(),
            stats["sentences"].as_u64()
        ),
        (Some(4), Some(2), Some(3))
    );
    assert!(out.fuel_used.unwrap() > 0);

    let out = call(
        &host,
        "word_frequency",
        json!({"text": "a b a c a b", "top": 2}),
    )
    .await;
    assert_eq!(
        out.result.unwrap(),
        json!([{"word": "a", "count": 3}, {"word": "b", "count": 2}])
    );

    assert!(host.remove("acme", "text_stats").await.unwrap());
    let gone = call(&host, "text_stats", json!({"text": "x"})).await;
    assert_eq!(error(&gone).code(), "not_found");
    assert!(!host.remove("acme", "text_stats").await.unwrap());
    // the other tool of the pack is unaffected
    assert!(
        call(&host, "word_frequency", json!({"text": "x"}))
            .await
            .result
            .is_ok()
    );
}

#[tokio::test]
async fn the_example_tools_answer() {
    let host = host_with(&["json_query", "unit_convert"]).await;
    let doc = json!({"users": [{"email": "a@x"}, {"email": "b@x"}]}).to_string();
    let out = call(
        &host,
        "json_query",
        json!({"document": doc, "path": "$.users[*].email"}),
    )
    .await;
    assert_eq!(
        out.result.unwrap(),
        json!({"count": 2, "matches": ["a@x", "b@x"]})
    );
    let doc = json!({"a": {"b": [1, 2, {"c": 3}]}, "d": {"c": 4}, "e f": 5}).to_string();
    for (path, matches) in [
        ("$.a.b[0]", json!([1])),
        ("$.a.b[-1].c", json!([3])),
        ("$..c", json!([3, 4])),
        ("$.a.b[*]", json!([1, 2, {"c": 3}])),
        ("$['e f']", json!([5])),
        ("$.missing", json!([])),
    ] {
        let out = call(&host, "json_query", json!({"document": doc, "path": path})).await;
        assert_eq!(out.result.unwrap()["matches"], matches, "{path}");
    }
    for path in ["a.b", "$.a[x]"] {
        let out = call(&host, "json_query", json!({"document": doc, "path": path})).await;
        assert_eq!(out.result.unwrap_err().code(), "tool_error", "{path}");
    }

    let out = call(
        &host,
        "convert_units",
        json!({"value": 212, "from": "degF", "to": "degC"}),
    )
    .await;
    assert_eq!(out.result.unwrap()["value"], json!(100.0));
    let out = call(
        &host,
        "convert_units",
        json!({"value": 1, "from": "mi", "to": "km"}),
    )
    .await;
    assert_eq!(out.result.unwrap()["value"], json!(1.609344));
}

#[tokio::test]
async fn installed_tools_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = HostConfig {
        data_dir: Some(dir.path().to_owned()),
        ..crate::plugins::config()
    };
    {
        let host = Host::open(config.clone()).await.unwrap();
        host.install("acme", plugin("unit_convert")).await.unwrap();
    }
    let host = Host::open(config).await.unwrap();
    assert_eq!(host.list("acme").len(), 1);
    let out = call(
        &host,
        "convert_units",
        json!({"value": 2, "from": "kg", "to": "g"}),
    )
    .await;
    assert_eq!(out.result.unwrap()["value"], json!(2000.0));
}

// ---- arguments and the tool's own errors ----

#[tokio::test]
async fn arguments_are_validated_before_anything_runs() {
    let host = host_with(&["text_stats"]).await;
    let out = call(
        &host,
        "word_frequency",
        json!({"text": 5, "top": 0, "extra": true}),
    )
    .await;
    let CallError::InvalidArgs { errors } = error(&out) else {
        panic!("{out:?}")
    };
    let mut paths: Vec<_> = errors.iter().map(|e| e.path.as_str()).collect();
    paths.sort();
    assert_eq!(paths, ["", "/text", "/top"], "{errors:?}");
    assert!(out.fuel_used.is_none(), "nothing ran");
}

#[tokio::test]
async fn a_tools_own_error_is_reported_as_such() {
    let host = host_with(&["unit_convert", "json_query"]).await;
    let out = call(
        &host,
        "convert_units",
        json!({"value": 1, "from": "kg", "to": "m"}),
    )
    .await;
    assert_eq!(
        error(&out),
        &CallError::Tool(ToolError::InvalidArgs(
            "cannot convert mass (`kg`) to length (`m`)".into()
        ))
    );
    let out = call(
        &host,
        "json_query",
        json!({"document": "{}", "path": "no-dollar"}),
    )
    .await;
    assert_eq!(error(&out).code(), "tool_error");
}

// ---- hostile plugins: each limit ends in its own outcome ----

#[tokio::test]
async fn an_endless_loop_times_out() {
    let host = host_with(&["hostile"]).await;
    let started = Instant::now();
    let out = call(&host, "spin", json!({})).await;
    assert_eq!(error(&out), &CallError::Timeout { limit_ms: 300 });
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_guest_blocked_in_a_host_call_times_out() {
    let host = host_with(&["hostile"]).await;
    let out = call(&host, "sleep", json!({})).await;
    assert_eq!(error(&out), &CallError::Timeout { limit_ms: 300 });
}

#[tokio::test]
async fn a_loop_on_little_fuel_runs_out_of_fuel() {
    let host = host_with(&["hostile"]).await;
    let out = call(&host, "burn", json!({})).await;
    assert_eq!(error(&out), &CallError::OutOfFuel { limit: 1_000_000 });
    assert_eq!(out.fuel_used, Some(1_000_000));
}

#[tokio::test]
async fn a_memory_bomb_hits_the_memory_limit() {
    let host = host_with(&["hostile"]).await;
    let out = call(&host, "memory_bomb", json!({})).await;
    assert_eq!(
        error(&out),
        &CallError::MemoryLimit {
            limit_bytes: 32 << 20
        }
    );
}

#[tokio::test]
async fn unbounded_recursion_traps() {
    let host = host_with(&["hostile"]).await;
    let out = call(&host, "recurse", json!({})).await;
    let CallError::Trap { message } = error(&out) else {
        panic!("{out:?}")
    };
    assert!(
        message.contains("stack") || message.contains("out of bounds"),
        "{message}"
    );
}

#[tokio::test]
async fn a_panic_traps_with_the_guests_message() {
    let host = host_with(&["hostile"]).await;
    let out = call(&host, "panic", json!({})).await;
    let CallError::Trap { message } = error(&out) else {
        panic!("{out:?}")
    };
    assert!(
        message.contains("the hostile plugin panicked on purpose"),
        "{message}"
    );
}

#[tokio::test]
async fn huge_output_is_clipped_to_valid_json() {
    let host = host_with(&["hostile"]).await;
    let out = call(&host, "huge_output", json!({})).await;
    let clipped = out.clipped.expect("clipped");
    assert!(clipped.original_chars > 1_000_000, "{clipped:?}");
    let value = out.result.unwrap();
    let text = serde_json::to_string(&value).unwrap();
    assert!(text.chars().count() <= Limits::default().max_result_chars as usize);
    assert_eq!(text.chars().count(), clipped.returned_chars);
    assert_eq!(
        value["note"], "everything above is filler",
        "small fields survive"
    );
    let rows = value["rows"].as_array().unwrap();
    assert!(
        rows.last().unwrap().as_str().unwrap().ends_with(" items]"),
        "{rows:?}"
    );
}

#[tokio::test]
async fn output_that_is_not_json_is_invalid_output() {
    let host = host_with(&["hostile"]).await;
    let out = call(&host, "not_json", json!({})).await;
    let CallError::InvalidOutput { reason } = error(&out) else {
        panic!("{out:?}")
    };
    assert!(reason.contains("this is not JSON"), "{reason}");
}

#[tokio::test]
async fn a_guest_sees_no_files_env_args_or_network() {
    let host = host_with(&["hostile"]).await;
    let files = call(&host, "open_file", json!({})).await.result.unwrap();
    for (attempt, outcome) in files.as_object().unwrap() {
        assert_eq!(outcome["ok"], false, "{attempt}: {outcome}");
    }
    assert!(!Path::new("/tmp/toolhost-escape").exists());

    let env = call(&host, "read_env", json!({})).await.result.unwrap();
    assert_eq!(env["vars"], json!([]));
    assert_eq!(env["args"], json!([]));
    assert_eq!(env["home"], Value::Null);

    let net = call(&host, "connect", json!({})).await.result.unwrap();
    assert_eq!(net["ok"], false, "{net}");
}

#[tokio::test]
async fn guest_output_is_captured_with_a_cap() {
    let host = host_with(&["hostile"]).await;
    let out = call(&host, "stdout_flood", json!({})).await;
    assert_eq!(out.result, Ok(json!("done")));
    let cap = toolhost::helpers::MAX_LOG_BYTES;
    assert_eq!((out.log.stdout.len(), out.log.stderr.len()), (cap, cap));
    assert_eq!(out.log.dropped_bytes, 2 * (4096 * 1024 - cap as u64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn good_calls_and_timers_run_while_hostile_guests_spin() {
    let host = std::sync::Arc::new(host_with(&["hostile", "text_stats"]).await);
    // More endless guests than worker threads: only epoch yields let anything else run.
    let hostile: Vec<_> = ["spin", "spin", "spin", "spin", "sleep", "memory_bomb"]
        .into_iter()
        .map(|tool| {
            let host = host.clone();
            tokio::spawn(async move {
                let out = call(&host, tool, json!({})).await;
                (tool, out, Instant::now())
            })
        })
        .collect();
    // Timers and sockets are polled by the same workers the guests run on.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let timer_fired = Instant::now();
    let mut first_good_answer = None;
    for i in 0..20 {
        let out = call(&host, "text_stats", json!({"text": format!("call {i}")})).await;
        assert_eq!(out.result.unwrap()["words"], 2);
        first_good_answer.get_or_insert_with(Instant::now);
    }
    for task in hostile {
        let (tool, out, ended) = task.await.unwrap();
        let expected = if tool == "memory_bomb" {
            "memory_limit"
        } else {
            "timeout"
        };
        assert_eq!(out.code(), expected, "{tool}");
        if tool == "spin" {
            assert!(
                timer_fired < ended,
                "a 20 ms timer waited for spinning guests"
            );
            assert!(
                first_good_answer.unwrap() < ended,
                "a good call waited for spinning guests"
            );
        }
    }
}

// ---- bad components ----

#[tokio::test]
async fn bad_components_get_clear_errors() {
    let host = Host::open(HostConfig {
        sandbox: SandboxConfig {
            max_component_bytes: 1 << 20,
            ..SandboxConfig::default()
        },
        ..crate::plugins::config()
    })
    .await
    .unwrap();
    let install = |bytes: Vec<u8>| host.install("acme", bytes);
    assert!(matches!(
        install(b"garbage".to_vec()).await,
        Err(InstallError::Load(LoadError::NotWasm))
    ));
    let core_module = b"\0asm\x01\0\0\0".to_vec();
    assert!(matches!(
        install(core_module).await,
        Err(InstallError::Load(LoadError::CoreModule))
    ));
    let mut truncated = plugin("text_stats");
    truncated.truncate(truncated.len() / 2);
    assert!(matches!(
        install(truncated).await,
        Err(InstallError::Load(LoadError::Compile(_)))
    ));
    let oversized = vec![0; (1 << 20) + 1];
    assert!(matches!(
        install(oversized).await,
        Err(InstallError::Load(LoadError::TooLarge { .. }))
    ));
    assert!(
        install(plugin("text_stats")).await.is_ok(),
        "the host still installs"
    );
    assert!(host.list("acme").iter().all(|t| t.spec.name != "garbage"));
}

/// Every call starts from a clean instance, however its pooled slot was recycled: memset of
/// the pages the last call dirtied (small calls), or madvise (large ones). Calls alternate
/// between the two, and none sees a count or a byte an earlier call left.
#[tokio::test]
async fn a_recycled_instance_shows_nothing_of_earlier_calls() {
    let host = host_with(&["probe"]).await;
    for round in 0..24 {
        let kib = if round % 2 == 0 { 16 } else { 4096 };
        let out = call(&host, "residue", json!({ "kib": kib })).await;
        let left = out.result.unwrap();
        assert_eq!(
            left,
            json!({"earlier_calls": 0, "dirty_bytes": 0}),
            "round {round}"
        );
    }
}

/// A component built against `toolhost:plugin@0.1.0` (bare wit-bindgen, before output
/// schemas) installs and runs beside current ones: its log, its KV and its nested call are
/// served by the same host code.
#[tokio::test]
async fn a_component_built_against_plugin_0_1_0_keeps_working() {
    let host = host_with(&["text_stats", "legacy_v0_1"]).await;
    let spec = host.describe("acme", "legacy_echo").unwrap().spec;
    assert_eq!(
        (spec.group.as_deref(), spec.limits.timeout_ms),
        (Some("legacy"), 5_000)
    );
    assert_eq!(spec.output_schema, None);
    for calls in 1..=2 {
        let out = call(&host, "legacy_echo", json!({"text": "one two three"})).await;
        let lines = &out.log.lines;
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert_eq!(lines[0].message, "acme called legacy_echo");
        let answer = out.result.unwrap();
        assert_eq!(answer["args"]["text"], "one two three");
        assert_eq!(answer["calls"], calls, "its KV persists");
        assert_eq!(answer["stats"]["words"], 3, "its nested call ran");
    }
}

/// A component's `output-schema` (0.2.0) is the tool's `output_schema`, and a result that
/// does not meet it is `invalid_output`.
#[tokio::test]
async fn a_components_output_schema_holds_for_every_result() {
    let host = host_with(&["text_stats", "probe"]).await;
    let stats = host.describe("acme", "text_stats").unwrap().spec;
    let declared = stats.output_schema.expect("text_stats declares its output");
    assert_eq!(declared["properties"]["words"]["type"], "integer");
    assert!(
        call(&host, "text_stats", json!({"text": "a b"}))
            .await
            .result
            .is_ok()
    );
    let shaped = call(&host, "shaped", json!({"key": "7"})).await;
    assert_eq!(shaped.result.unwrap(), json!({"n": 7}));
    let wrong = call(&host, "shaped", json!({"key": "seven"})).await;
    assert_eq!(error(&wrong).code(), "invalid_output");
}

#[tokio::test]
async fn one_invalid_tool_refuses_the_whole_component() {
    let host = Host::open(crate::plugins::config()).await.unwrap();
    let refused = host.install("acme", plugin("bad_spec")).await;
    let Err(InstallError::Spec(error)) = refused else {
        panic!("{refused:?}")
    };
    assert_eq!(
        (error.tool.as_str(), error.field.as_str()),
        ("bad name!", "name")
    );
    assert!(
        host.list("acme").is_empty(),
        "not even the valid tool of the pack"
    );
}

#[tokio::test]
async fn tenants_do_not_see_each_others_tools() {
    let host = host_with(&["unit_convert"]).await;
    let other = Caller::tenant("globex");
    assert!(host.list("globex").is_empty());
    assert!(host.describe("globex", "convert_units").is_none());
    let out = host
        .call(
            &other,
            "convert_units",
            json!({"value": 1, "from": "m", "to": "cm"}),
        )
        .await;
    assert_eq!(
        error(&out),
        &CallError::NotFound {
            name: "convert_units".into()
        }
    );
    assert!(!host.remove("globex", "convert_units").await.unwrap());
    assert_eq!(host.list("acme").len(), 1);
}

// ---- native tools ----

#[tokio::test]
async fn native_tools_run_under_the_same_pipeline() {
    let host = Host::open(crate::plugins::config()).await.unwrap();
    let schema =
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]});
    let natives = host.natives();
    natives
        .register(
            ToolSpec::new("double", "Doubles n.", schema.clone()),
            |args, helpers, ctx| async move {
                helpers.log(toolhost::Level::Info, &format!("tenant {}", ctx.tenant));
                Ok(json!(args["n"].as_i64().unwrap() * 2))
            },
        )
        .unwrap();
    natives
        .register(
            ToolSpec::new("explode", "Panics.", schema.clone()),
            |_, _, _| async move { panic!("native boom") },
        )
        .unwrap();
    let mut slow = ToolSpec::new("slow", "Sleeps.", schema.clone());
    slow.limits.timeout_ms = 50;
    natives
        .register(slow, |_, _, _| async move {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(Value::Null)
        })
        .unwrap();

    let out = call(&host, "double", json!({"n": 21})).await;
    assert_eq!(out.result, Ok(json!(42)));
    assert_eq!(out.log.lines[0].message, "tenant acme");
    assert_eq!(
        error(&call(&host, "double", json!({"n": "x"})).await).code(),
        "invalid_args"
    );
    let boom = call(&host, "explode", json!({"n": 1})).await;
    assert!(matches!(error(&boom), CallError::Trap { message } if message.contains("native boom")));
    assert_eq!(
        error(&call(&host, "slow", json!({"n": 1})).await),
        &CallError::Timeout { limit_ms: 50 }
    );

    // Natives are visible to every tenant, and a tenant's component cannot take their names.
    assert!(host.list("anyone").iter().any(|t| t.spec.name == "double"));
    natives
        .register(
            ToolSpec::new("text_stats", "Native.", schema),
            |_, _, _| async { Ok(Value::Null) },
        )
        .unwrap();
    let taken = host.install("acme", plugin("text_stats")).await;
    assert!(matches!(taken, Err(InstallError::NativeName(name)) if name == "text_stats"));
}

// ---- the CLI, exactly as the README shows it ----

#[test]
fn the_cli_installs_calls_and_removes() {
    let data = tempfile::tempdir().unwrap();
    let toolhost = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_toolhost"))
            .env("TOOLHOST_ARTIFACT_DIR", crate::plugins::artifact_dir())
            .arg("--data-dir")
            .arg(data.path())
            .args(args)
            .output()
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    let wasm = plugins_dir().join("text_stats.wasm");
    let (code, stdout, _) = toolhost(&["install", wasm.to_str().unwrap()]);
    assert_eq!(code, Some(0));
    assert_eq!(stdout, "installed text_stats\ninstalled word_frequency\n");

    let (code, stdout, _) = toolhost(&["call", "text_stats", r#"{"text": "hello agent world"}"#]);
    assert_eq!(code, Some(0));
    let result: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(result["words"], 3);

    let (code, stdout, _) = toolhost(&["list"]);
    assert_eq!(code, Some(0));
    assert!(stdout.starts_with("text_stats "), "{stdout}");

    let (code, stdout, _) = toolhost(&["describe", "word_frequency"]);
    assert_eq!(code, Some(0));
    let info: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(info["source"]["kind"], "wasm");

    let (code, _, stderr) = toolhost(&["call", "text_stats", r#"{"txt": 1}"#]);
    assert_eq!(code, Some(1));
    assert!(stderr.starts_with("error[invalid_args]: "), "{stderr}");

    let (code, _, stderr) = toolhost(&["call", "text_stats", "not json"]);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("args are not JSON"), "{stderr}");

    let (code, stdout, _) = toolhost(&["remove", "text_stats"]);
    assert_eq!((code, stdout.as_str()), (Some(0), "removed text_stats\n"));
    let (code, _, stderr) = toolhost(&["call", "text_stats", "{}"]);
    assert_eq!(code, Some(1));
    assert!(stderr.starts_with("error[not_found]"), "{stderr}");
}

// ---- OpenAI strict mode, end to end ----

/// Keywords of OpenAI's documented strict subset, listed here apart from the host's own list
/// so that a change there cannot pass unseen.
const OPENAI_STRICT_KEYWORDS: &[&str] = &[
    "type",
    "description",
    "title",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "enum",
    "const",
    "anyOf",
    "$ref",
    "$defs",
    "definitions",
    "pattern",
    "format",
    "multipleOf",
    "maximum",
    "exclusiveMaximum",
    "minimum",
    "exclusiveMinimum",
    "minItems",
    "maxItems",
];

/// Checks `schema` (at `at`) against OpenAI's strict rules: known keywords and formats only,
/// every object closed with every property required, a type on every schema.
fn assert_openai_strict(schema: &Value, at: &str) {
    let map = schema
        .as_object()
        .unwrap_or_else(|| panic!("{at}: not a schema"));
    for keyword in map.keys() {
        assert!(
            OPENAI_STRICT_KEYWORDS.contains(&keyword.as_str()),
            "{at}: `{keyword}` is not in strict mode's subset"
        );
    }
    if let Some(format) = map.get("format") {
        let known = [
            "date-time",
            "time",
            "date",
            "duration",
            "email",
            "hostname",
            "ipv4",
            "ipv6",
            "uuid",
        ];
        assert!(
            known.contains(&format.as_str().unwrap()),
            "{at}: format {format}"
        );
    }
    assert!(
        ["type", "enum", "const", "anyOf", "$ref"]
            .iter()
            .any(|k| map.contains_key(*k)),
        "{at}: untyped"
    );
    if let Some(properties) = map.get("properties").and_then(Value::as_object) {
        assert_eq!(map["additionalProperties"], false, "{at}: open object");
        let mut required: Vec<&str> = map["required"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_str().unwrap())
            .collect();
        let mut names: Vec<&str> = properties.keys().map(String::as_str).collect();
        required.sort_unstable();
        names.sort_unstable();
        assert_eq!(required, names, "{at}: every property is required");
        for (name, sub) in properties {
            assert_openai_strict(sub, &format!("{at}/properties/{name}"));
        }
    }
    if let Some(items) = map.get("items") {
        assert_openai_strict(items, &format!("{at}/items"));
    }
    for (i, sub) in map
        .get("anyOf")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        assert_openai_strict(sub, &format!("{at}/anyOf/{i}"));
    }
}

/// A host with every example tool of every kind for `acme`: the Rust components, the JS
/// component and the stored JS tool.
async fn every_example_installed() -> Host {
    let host = Host::open(HostConfig {
        js_runtime: Some(crate::plugins::js_runtime()),
        ..crate::plugins::config()
    })
    .await
    .unwrap();
    for name in ["text_stats", "json_query", "unit_convert"] {
        host.install("acme", plugin(name)).await.unwrap();
    }
    host.install("acme", crate::plugins::js_component())
        .await
        .unwrap();
    let source =
        std::fs::read_to_string(crate::plugins::root().join("plugins/js-source/word_count.js"))
            .unwrap();
    host.install_js("acme", &source).await.unwrap();
    host
}

/// The Anthropic export of every example tool (all strict) is exactly what the official
/// Anthropic SDK would send for that schema: its own `transform_schema` leaves each one as it
/// is, so nothing in it is outside the subset the SDK knows. A non-strict tool's root
/// combinators go to its description, which the Messages API refuses at the top.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_example_tools_anthropic_export_is_what_the_official_sdk_sends() {
    let host = every_example_installed().await;
    let loose = r#"export const spec = { name: "js_either", description: "Takes a or b.",
        parameters: { type: "object", properties: { a: { type: "string", minLength: 2 },
            b: { type: "integer", minimum: 1 } }, anyOf: [{ required: ["a"] }, { required: ["b"] }] } };
    export default function (args) { return args; }"#;
    host.install_js("acme", loose).await.unwrap();
    let exported = host.export("acme", toolhost::export::Format::Anthropic);
    let (strict, not): (Vec<&Value>, Vec<&Value>) =
        exported.iter().partition(|tool| tool["strict"] == true);
    assert_eq!(strict.len(), 7, "every example tool is strict");
    assert_eq!(not.len(), 1);
    let schemas: Vec<&Value> = strict.iter().map(|tool| &tool["input_schema"]).collect();
    let mut sdk = Command::new("python3")
        .arg(crate::plugins::root().join("tests/export/anthropic_transform.py"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 (scripts/test installs tests/export/requirements.txt)");
    serde_json::to_writer(sdk.stdin.take().unwrap(), &schemas).unwrap();
    let out = sdk.wait_with_output().unwrap();
    assert!(out.status.success(), "the Anthropic SDK failed");
    let transformed: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    for (tool, by_sdk) in strict.iter().zip(&transformed) {
        assert_eq!(&tool["input_schema"], by_sdk, "{}", tool["name"]);
    }
    let either = not[0];
    assert!(either.get("strict").is_none());
    let schema = &either["input_schema"];
    assert!(schema.get("anyOf").is_none(), "{schema}");
    assert!(schema["description"].as_str().unwrap().contains("anyOf"));
    assert_eq!(
        schema["properties"]["a"]["minLength"], 2,
        "the rest as it was"
    );
    // The host still holds every call to the whole schema.
    let neither = call(&host, "js_either", json!({})).await;
    assert_eq!(error(&neither).code(), "invalid_args");
}

/// Arguments as a strict-mode model sends them: every property present, the ones it leaves
/// out as `null`.
fn as_a_strict_model_sends(schema: &Value, given: &Value) -> Value {
    let mut args = given.as_object().unwrap().clone();
    for name in schema["properties"].as_object().unwrap().keys() {
        args.entry(name.clone()).or_insert(Value::Null);
    }
    Value::Object(args)
}

/// Every example tool exports a schema within OpenAI's strict subset, and a call made as a
/// strict-mode model makes it (every optional argument `null`) validates against that schema
/// and succeeds, with the tool seeing the nulls as arguments left out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_example_tool_round_trips_through_openai_strict_mode() {
    let host = every_example_installed().await;
    // What each example is asked, with its optional arguments left out.
    let text = "The cat and the hat. The end.";
    let asked = [
        ("text_stats", json!({"text": text})),
        ("word_frequency", json!({"text": text})),
        (
            "json_query",
            json!({"document": r#"{"a": [1, 2]}"#, "path": "$.a[1]"}),
        ),
        (
            "convert_units",
            json!({"value": 5, "from": "km", "to": "mi"}),
        ),
        ("js_word_count", json!({"text": text})),
        ("js_component_word_count", json!({"text": text})),
        ("js_component_fail", json!({})),
    ];
    let exported = host.export("acme", toolhost::export::Format::OpenAi);
    let mut names: Vec<&str> = exported
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    names.sort_unstable();
    let mut expected: Vec<&str> = asked.iter().map(|(name, _)| *name).collect();
    expected.sort_unstable();
    assert_eq!(names, expected, "every example tool is asked something");
    for tool in &exported {
        let function = &tool["function"];
        let name = function["name"].as_str().unwrap();
        assert_eq!(function["strict"], true, "{name} is strict");
        let schema = &function["parameters"];
        assert_openai_strict(schema, &format!("{name}: #"));
        let given = &asked.iter().find(|(n, _)| *n == name).unwrap().1;
        let args = as_a_strict_model_sends(schema, given);
        let validator = toolhost::schema::compile(schema, true).unwrap();
        assert_eq!(validator.validate(&args), Ok(()), "{name}: {args}");
        let out = call(&host, name, args.clone()).await;
        if name == "js_component_fail" {
            // It always fails, saying why; `why: null` reached it as left out.
            let error = out.result.unwrap_err().to_string();
            assert!(error.contains("failed on purpose: no reason"), "{error}");
            continue;
        }
        assert!(out.result.is_ok(), "{name} with {args}: {:?}", out.result);
    }
    // A null for an optional argument is that argument left out: the tool's default applies.
    let out = call(
        &host,
        "word_frequency",
        json!({"text": "b a b c", "top": null}),
    )
    .await;
    assert_eq!(out.result.unwrap().as_array().unwrap().len(), 3);
}
