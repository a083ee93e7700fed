//! Stored-source JavaScript tools: source text run on the host's shared QuickJS runtime,
//! under the same limits, helpers and outcomes as any Wasm tool.

use std::sync::Arc;

use serde_json::{Value, json};
use toolhost::{CallError, CallOutcome, Caller, Host, HostConfig, InstallError, ToolError};

async fn host_in(data_dir: Option<std::path::PathBuf>) -> Arc<Host> {
    Arc::new(
        Host::open(HostConfig {
            data_dir,
            js_runtime: Some(crate::plugins::js_runtime()),
            ..crate::plugins::config()
        })
        .await
        .unwrap(),
    )
}

fn example() -> String {
    std::fs::read_to_string(crate::plugins::root().join("plugins/js-source/word_count.js")).unwrap()
}

/// A module with `name` whose handler body is `body`, with the given limits.
fn tool(name: &str, limits: Value, body: &str) -> String {
    format!(
        "export const spec = {{ name: {name:?}, description: 'A test tool.', \
         parameters: {{ type: 'object' }}, limits: {limits} }};\n\
         export default function (args, ctx) {{\n{body}\n}}\n"
    )
}

async fn call(host: &Host, name: &str, args: Value) -> CallOutcome {
    host.call(&Caller::tenant("acme"), name, args).await
}

/// Both word-count examples, JS source and JS component, must answer exactly this.
async fn assert_counts_the_cat_and_the_hat(host: &Host, tool: &str) {
    let out = call(host, tool, json!({"text": "the cat and the hat"})).await;
    assert_eq!(
        out.result,
        Ok(json!({"words": 5, "distinct": 4, "most_frequent": {"word": "the", "count": 2}})),
        "{tool}"
    );
    assert_eq!(out.log.lines[0].message, "counted 5 words for acme");
}

#[tokio::test]
async fn the_example_installs_and_answers_at_once() {
    let host = host_in(None).await;
    let spec = host.install_js("acme", &example()).await.unwrap();
    assert_eq!(spec.name, "js_word_count");
    assert_counts_the_cat_and_the_hat(&host, "js_word_count").await;
    // The schema from `spec` is enforced before any JS runs.
    let bad = call(&host, "js_word_count", json!({"txt": 1})).await;
    assert_eq!(bad.code(), "invalid_args");
    assert!(matches!(
        host.describe("acme", "js_word_count").unwrap().source,
        toolhost::Source::Js { version: 1, .. }
    ));
}

/// On a shared store a node on another runtime collects this host's runtime while no tool
/// names it; the host puts it back from its own copy when it next needs it.
#[tokio::test]
async fn a_runtime_collected_from_the_store_is_put_back_when_needed() {
    let host = host_in(None).await;
    let runtime = toolhost::digest::sha256_hex(&crate::plugins::js_runtime());
    assert_eq!(host.store().collect_blobs(0, &|_| false).await.unwrap(), 1);
    assert_eq!(host.store().blob(&runtime).await.unwrap(), None);
    host.install_js("acme", &example()).await.unwrap();
    assert_counts_the_cat_and_the_hat(&host, "js_word_count").await;
    assert!(host.store().blob(&runtime).await.unwrap().is_some());
    // Loaded, it is not read from the store again: an install puts it back all the same, for
    // the other nodes that will run the tool it names.
    let all_but_the_runtime = |sha: &str| sha != runtime;
    let collected = host.store().collect_blobs(0, &all_but_the_runtime).await;
    assert_eq!(collected.unwrap(), 1);
    let another = tool("another", json!({}), "return 1;");
    host.install_js("acme", &another).await.unwrap();
    assert!(host.store().blob(&runtime).await.unwrap().is_some());
}

/// A tool's `output_schema` holds for every answer: MCP lists it as `outputSchema`, and an
/// answer that does not meet it is `invalid_output`, never passed on to the agent.
#[tokio::test]
async fn every_answer_meets_the_tools_output_schema() {
    let host = host_in(None).await;
    host.install_js("acme", &example()).await.unwrap();
    let listed = host.export("acme", toolhost::export::Format::Mcp);
    assert_eq!(listed[0]["outputSchema"]["required"][0], "words");
    let wrong = r#"export const spec = { name: "js_wrong", description: "Says it counts.",
        parameters: { type: "object" },
        output_schema: { type: "object", required: ["words"], properties: { words: { type: "integer" } } } };
    export default function (args) { return args.right ? { words: 3 } : { words: "three" }; }"#;
    host.install_js("acme", wrong).await.unwrap();
    assert!(
        call(&host, "js_wrong", json!({"right": true}))
            .await
            .result
            .is_ok()
    );
    let out = call(&host, "js_wrong", json!({})).await;
    assert_eq!(out.code(), "invalid_output");
    let message = out.result.unwrap_err().to_string();
    assert!(message.contains("output_schema"), "{message}");
    // An output schema that is not an object's is refused at install, naming the field.
    let not_an_object = wrong.replace("js_wrong", "js_list").replace(
        r#"output_schema: { type: "object","#,
        r#"output_schema: { type: "array","#,
    );
    let error = host.install_js("acme", &not_an_object).await.unwrap_err();
    assert!(error.to_string().contains("output_schema"), "{error}");
}

#[tokio::test]
async fn helpers_context_and_nested_calls_work_from_js() {
    let host = host_in(None).await;
    host.set_config("acme", "REGION", "eu-west", false)
        .await
        .unwrap();
    let counter = r#"export const spec = { name: "js_counter", description: "Counts.",
        parameters: { type: "object" }, config: ["REGION"] };
    export default async function (args, ctx) {
        const n = Number(toolhost.kv.get("n") ?? "0") + 1;
        toolhost.kv.set("n", String(n));
        toolhost.log("warn", "counted");
        return { n, region: toolhost.config.get("REGION"), tool: ctx.tool, data: ctx.data };
    }"#;
    host.install_js("acme", counter).await.unwrap();
    let caller = Caller::tenant("acme").with_data(json!({"user": 7}));
    for n in 1..=2 {
        let out = host.call(&caller, "js_counter", json!({})).await;
        assert_eq!(
            out.result,
            Ok(json!({"n": n, "region": "eu-west", "tool": "js_counter", "data": {"user": 7}}))
        );
        assert_eq!(out.log.lines[0].level, toolhost::Level::Warn);
    }
    let caller_tool = tool(
        "js_caller",
        json!({}),
        "const inner = toolhost.callTool('js_counter', {});\n\
         let missing;\n\
         try { toolhost.callTool('nope', {}); } catch (e) { missing = e.message; }\n\
         return { inner, missing };",
    );
    host.install_js("acme", &caller_tool).await.unwrap();
    let out = call(&host, "js_caller", json!({})).await.result.unwrap();
    assert_eq!(out["inner"]["n"], 3);
    assert!(
        out["missing"].as_str().unwrap().starts_with("not_found: "),
        "{out}"
    );
}

#[tokio::test]
async fn a_syntax_error_is_refused_at_upload_with_line_and_column() {
    let host = host_in(None).await;
    let broken = "export const spec = { name: 'broken', description: 'x', parameters: { type: 'object' } };\n\
                  export default function (args) {\n  return args.;\n}\n";
    let error = host.install_js("acme", broken).await.unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, InstallError::JsSource(_)), "{message}");
    assert!(message.contains("SyntaxError"), "{message}");
    assert!(message.contains("line 3, column"), "{message}");
    assert!(host.describe("acme", "broken").is_none());

    let no_spec = "export default () => 1;";
    let message = host
        .install_js("acme", no_spec)
        .await
        .unwrap_err()
        .to_string();
    assert!(message.contains("`spec`"), "{message}");
    let bad_name = tool("no spaces", json!({}), "return 1;");
    let error = host.install_js("acme", &bad_name).await.unwrap_err();
    assert!(
        matches!(&error, InstallError::Spec(e) if e.field == "name"),
        "{error}"
    );
    let top_level_throw = "throw new TypeError('at load');";
    let message = host
        .install_js("acme", top_level_throw)
        .await
        .unwrap_err()
        .to_string();
    assert!(message.contains("TypeError: at load"), "{message}");
}

#[tokio::test]
async fn an_exception_is_a_tool_error_with_message_and_stack() {
    let host = host_in(None).await;
    let thrower = tool(
        "thrower",
        json!({}),
        "function deeper() { throw new RangeError('too far: ' + args.n); }\n\
         deeper();",
    );
    host.install_js("acme", &thrower).await.unwrap();
    let out = call(&host, "thrower", json!({"n": 3})).await;
    let Err(CallError::Tool(ToolError::Failed(message))) = &out.result else {
        panic!("expected a tool error, got {:?}", out.result);
    };
    assert!(message.starts_with("RangeError: too far: 3"), "{message}");
    assert!(
        message.contains("deeper"),
        "the stack names the function: {message}"
    );
    assert!(message.contains("tool.js:"), "{message}");
}

#[tokio::test]
async fn an_endless_loop_times_out_and_a_memory_bomb_hits_the_memory_limit() {
    let host = host_in(None).await;
    let spin = tool("spin", json!({"timeout_ms": 300}), "while (true) {}");
    let bomb = tool(
        "bomb",
        json!({"memory_bytes": 16 << 20}),
        "const hoard = []; while (true) hoard.push(new Array(100000).fill(hoard.length));",
    );
    host.install_js("acme", &spin).await.unwrap();
    host.install_js("acme", &bomb).await.unwrap();
    let started = std::time::Instant::now();
    let out = call(&host, "spin", json!({})).await;
    assert_eq!(out.result, Err(CallError::Timeout { limit_ms: 300 }));
    // Generous: the point is that it ends, at the deadline and not never.
    assert!(started.elapsed() < std::time::Duration::from_secs(15));
    let out = call(&host, "bomb", json!({})).await;
    assert_eq!(
        out.result,
        Err(CallError::MemoryLimit {
            limit_bytes: 16 << 20
        })
    );
    // The host serves the next call as usual.
    host.install_js("acme", &example()).await.unwrap();
    assert!(
        call(&host, "js_word_count", json!({"text": "ok"}))
            .await
            .result
            .is_ok()
    );
}

#[tokio::test]
async fn js_tools_survive_a_restart_and_keep_their_runtime() {
    let dir = tempfile::tempdir().unwrap();
    {
        let host = host_in(Some(dir.path().to_owned())).await;
        host.install_js("acme", &example()).await.unwrap();
    }
    // Opened without a runtime: installed tools still run on the one they were installed on,
    // which their version names.
    let without_runtime = || {
        Host::open(HostConfig {
            data_dir: Some(dir.path().to_owned()),
            ..crate::plugins::config()
        })
    };
    let host = without_runtime().await.unwrap();
    let out = call(&host, "js_word_count", json!({"text": "a b a"})).await;
    assert_eq!(out.result.unwrap()["words"], 3);
    let refused = host.install_js("acme", &example()).await.unwrap_err();
    assert!(matches!(refused, InstallError::NoJsRuntime));
    drop(host);
    // A version from before versions named their runtime: its source names it.
    crate::store::tamper_tool_record(dir.path(), "acme", "js_word_count", |entry| {
        let version = entry["versions"][0].as_object_mut().unwrap();
        version
            .remove("runtime")
            .expect("the version names its runtime");
    });
    let host = without_runtime().await.unwrap();
    let out = call(&host, "js_word_count", json!({"text": "a b a"})).await;
    assert_eq!(out.result.unwrap()["words"], 3);
}

// ---- the other path: a component built by the JS SDK ----

/// One test, so the ~12 MB component compiles once per run; later steps reuse its artifact.
#[tokio::test]
async fn a_component_built_by_the_js_sdk_installs_runs_and_restarts_from_its_artifact() {
    let component = crate::plugins::js_component();
    let dir = tempfile::tempdir().unwrap();
    let config = || HostConfig {
        data_dir: Some(dir.path().to_owned()),
        ..crate::plugins::config()
    };
    {
        let host = Host::open(config()).await.unwrap();
        let specs = host.install("acme", component).await.unwrap();
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["js_component_word_count", "js_component_fail"]);
        // `outputSchema` in the SDK is the tool's `output_schema`; every answer is checked.
        let output = specs[0]
            .output_schema
            .as_ref()
            .expect("it declares its output");
        assert_eq!(output["required"][0], "words");
        assert_eq!(specs[1].output_schema, None);
        assert_counts_the_cat_and_the_hat(&host, "js_component_word_count").await;
        let out = call(&host, "js_component_fail", json!({"why": "testing"})).await;
        let Err(CallError::Tool(ToolError::Failed(message))) = &out.result else {
            panic!("expected a tool error, got {:?}", out.result);
        };
        assert!(
            message.starts_with("Error: failed on purpose: testing"),
            "{message}"
        );
        assert!(message.contains("handler@"), "with the stack: {message}");
        let out = call(
            &host,
            "js_component_word_count",
            json!({"text": "x".repeat(100_001)}),
        )
        .await;
        assert!(
            matches!(&out.result, Err(CallError::Tool(ToolError::InvalidArgs(m))) if m.contains("100 000")),
            "{:?}",
            out.result
        );
        assert_eq!(
            call(&host, "js_component_word_count", json!({}))
                .await
                .code(),
            "invalid_args"
        );
    }
    // After a restart the stored artifact is loaded, not recompiled.
    let host = Host::open(config()).await.unwrap();
    let out = call(&host, "js_component_word_count", json!({"text": "a b a"})).await;
    assert_eq!(out.result.unwrap()["words"], 3);
    let loads = host.metrics().render();
    assert!(
        loads.contains("toolhost_component_loads_total{source=\"artifact\"} 1\n")
            && loads.contains("toolhost_component_loads_total{source=\"compiled\"} 0\n"),
        "{loads}"
    );
}

/// OpenAI's strict mode makes every property required and a model leaves an optional one out
/// by sending `null`: every strict example tool, called with exactly what such a model sends
/// for its exported schema, succeeds, and a tool sees a null optional argument as absent.
#[tokio::test]
async fn strict_tools_take_what_a_strict_mode_model_sends() {
    let host = host_in(None).await;
    host.install("acme", crate::plugins::plugin("unit_convert"))
        .await
        .unwrap();
    let weather = "export const spec = { name: 'weather', description: 'A test tool.', strict: true, \
                   parameters: { type: 'object', required: ['city'], properties: { \
                     city: { type: 'string' }, units: { enum: ['metric', 'imperial'] } } } };\n\
                   export default function (args) { return { keys: Object.keys(args) }; }\n";
    host.install_js("acme", weather).await.unwrap();
    let exported = host.export("acme", toolhost::export::Format::OpenAi);
    let strict = |name: &str| {
        exported
            .iter()
            .find(|t| t["function"]["name"] == name)
            .map(|t| t["function"]["parameters"].clone())
            .unwrap()
    };
    // The export: every property required, the optional one nullable.
    let schema = strict("weather");
    assert_eq!(schema["required"], json!(["city", "units"]));
    let units = &schema["properties"]["units"];
    assert!(units.to_string().contains("\"null\""), "nullable: {units}");
    let out = call(&host, "weather", json!({"city": "Oslo", "units": null})).await;
    assert_eq!(
        out.result,
        Ok(json!({"keys": ["city"]})),
        "{:?}",
        out.result
    );

    let schema = strict("convert_units");
    assert_eq!(schema["required"], json!(["value", "from", "to"]));
    let out = call(
        &host,
        "convert_units",
        json!({"value": 3, "from": "ft", "to": "in"}),
    )
    .await;
    assert_eq!(out.result.unwrap()["value"], json!(36.0));
}
