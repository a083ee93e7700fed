//! End to end: what persists, per tenant: versions, the result cache, KV, config and secrets.

use std::sync::Arc;

use crate::plugins::{plugin, variant};
use serde_json::{Value, json};
use toolhost::{
    CallError, CallOutcome, Caller, Host, HostConfig, InstallError, ManageError, Source, ToolError,
    ToolSpec,
};

fn persistent(dir: &std::path::Path) -> HostConfig {
    HostConfig {
        data_dir: Some(dir.to_owned()),
        ..crate::plugins::config()
    }
}

async fn call(host: &Host, tenant: &str, tool: &str, args: Value) -> CallOutcome {
    host.call(&Caller::tenant(tenant), tool, args).await
}

fn version_of(host: &Host, tenant: &str, tool: &str) -> (u32, String) {
    match host.describe(tenant, tool).expect("installed").source {
        Source::Wasm {
            version, component, ..
        } => (version, component),
        other => panic!("not a Wasm tool: {other:?}"),
    }
}

#[tokio::test]
async fn reinstalling_makes_versions_and_rollback_restores_one() {
    let dir = tempfile::tempdir().unwrap();
    let (v1_sha, v2_sha);
    {
        let host = Host::open(persistent(dir.path())).await.unwrap();
        host.install("acme", plugin("unit_convert")).await.unwrap();
        v1_sha = version_of(&host, "acme", "convert_units").1;
        host.install("acme", variant("unit_convert", "v2"))
            .await
            .unwrap();
        let (version, sha) = version_of(&host, "acme", "convert_units");
        assert_eq!(version, 2);
        assert_ne!(sha, v1_sha);
        v2_sha = sha;

        let entry = host.versions("acme", "convert_units").await.unwrap();
        let numbers: Vec<u32> = entry.versions.iter().map(|v| v.version).collect();
        assert_eq!((numbers, entry.current), (vec![1, 2], 2));

        assert_eq!(
            host.rollback("acme", "convert_units", None).await.unwrap(),
            1
        );
        assert_eq!(
            version_of(&host, "acme", "convert_units"),
            (1, v1_sha.clone())
        );
        let out = call(
            &host,
            "acme",
            "convert_units",
            json!({"value": 1, "from": "km", "to": "m"}),
        )
        .await;
        assert_eq!(out.result.unwrap()["value"], json!(1000.0));

        assert!(matches!(
            host.rollback("acme", "convert_units", None).await,
            Err(ManageError::NoEarlierVersion(_))
        ));
        assert!(matches!(
            host.rollback("acme", "convert_units", Some(9)).await,
            Err(ManageError::NoSuchVersion { version: 9, .. })
        ));
    }
    // The rollback survives a restart; the next install is version 3.
    let host = Host::open(persistent(dir.path())).await.unwrap();
    assert_eq!(version_of(&host, "acme", "convert_units"), (1, v1_sha));
    assert_eq!(
        host.rollback("acme", "convert_units", Some(2))
            .await
            .unwrap(),
        2
    );
    assert_eq!(version_of(&host, "acme", "convert_units"), (2, v2_sha));
    host.install("acme", variant("unit_convert", "v3"))
        .await
        .unwrap();
    assert_eq!(version_of(&host, "acme", "convert_units").0, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_in_flight_finish_on_the_version_they_started_with() {
    let host = Arc::new(Host::open(crate::plugins::config()).await.unwrap());
    host.install("acme", plugin("probe")).await.unwrap();
    let started = crate::plugins::next_call_started(&host);
    let running = {
        let host = host.clone();
        tokio::spawn(async move { call(&host, "acme", "busy", json!({"ms": 400})).await })
    };
    started.await.unwrap();
    host.install("acme", variant("probe", "v2")).await.unwrap();
    assert!(host.remove("acme", "busy").await.unwrap());
    let out = running.await.unwrap();
    assert_eq!(out.result, Ok(json!("done")), "{:?}", out.result);
    let gone = call(&host, "acme", "busy", json!({"ms": 1})).await;
    assert_eq!(gone.code(), "not_found");
}

#[tokio::test]
async fn the_result_cache_answers_without_running_the_tool() {
    let dir = tempfile::tempdir().unwrap();
    {
        let host = Host::open(persistent(dir.path())).await.unwrap();
        host.install("acme", plugin("probe")).await.unwrap();
        let first = call(&host, "acme", "count_cached", json!({"key": "a"})).await;
        assert_eq!(
            (first.result.clone(), first.cache_hit),
            (Ok(json!(1)), false)
        );
        assert!(first.fuel_used.is_some());
        let second = call(&host, "acme", "count_cached", json!({"key": "a"})).await;
        assert_eq!((second.result, second.cache_hit), (Ok(json!(1)), true));
        assert_eq!(second.fuel_used, None, "the tool did not run");
        let other_key = call(&host, "acme", "count_cached", json!({"key": "b"})).await;
        assert_eq!(
            (other_key.result, other_key.cache_hit),
            (Ok(json!(1)), false)
        );
        // Without a cache policy the tool runs every time.
        call(&host, "acme", "count", json!({"key": "a"})).await;
        assert_eq!(
            call(&host, "acme", "count", json!({"key": "a"}))
                .await
                .result,
            Ok(json!(2))
        );
    }
    let host = Host::open(persistent(dir.path())).await.unwrap();
    let after_restart = call(&host, "acme", "count_cached", json!({"key": "a"})).await;
    assert!(after_restart.cache_hit, "cached results persist");
    // Another tenant never sees acme's cached result.
    host.install("globex", plugin("probe")).await.unwrap();
    let globex = call(&host, "globex", "count_cached", json!({"key": "a"})).await;
    assert_eq!((globex.result, globex.cache_hit), (Ok(json!(1)), false));
    // A new version does not answer with the old version's results.
    host.install("acme", variant("probe", "v2")).await.unwrap();
    let new_version = call(&host, "acme", "count_cached", json!({"key": "a"})).await;
    assert_eq!(
        (new_version.result, new_version.cache_hit),
        (Ok(json!(2)), false)
    );
    // Removed and installed again from other bytes, the tool is at version 1 again, as the
    // first one was: it still never answers with the first one's results.
    assert!(host.remove("acme", "count_cached").await.unwrap());
    host.install("acme", variant("probe", "v3")).await.unwrap();
    assert_eq!(version_of(&host, "acme", "count_cached").0, 1);
    let reinstalled = call(&host, "acme", "count_cached", json!({"key": "a"})).await;
    assert!(!reinstalled.cache_hit, "{:?}", reinstalled.result);
}

#[tokio::test]
async fn kv_persists_per_tenant_and_tool_with_quotas() {
    let dir = tempfile::tempdir().unwrap();
    {
        let host = Host::open(persistent(dir.path())).await.unwrap();
        for tenant in ["acme", "globex"] {
            host.install(tenant, plugin("probe")).await.unwrap();
        }
        for expected in 1..=3 {
            let out = call(&host, "acme", "count", json!({"key": "visits"})).await;
            assert_eq!(out.result, Ok(json!(expected)));
        }
        let out = call(&host, "globex", "count", json!({"key": "visits"})).await;
        assert_eq!(out.result, Ok(json!(1)), "globex has its own KV");
        let flood = call(&host, "acme", "kv_flood", json!({}))
            .await
            .result
            .unwrap();
        assert_eq!(flood["stored"], 1000);
        assert!(
            flood["error"].as_str().unwrap().contains("1000 keys"),
            "{flood}"
        );
        // The tenant's data quota spans its tools' keys and values.
        let policy = serde_json::from_value(json!({"data_quota_bytes": 2000})).unwrap();
        host.set_policy("globex", policy).await.unwrap();
        let flood = call(&host, "globex", "kv_flood", json!({}))
            .await
            .result
            .unwrap();
        // Each entry costs its key (`globex\0kv_flood\0k7`), its value and 64 bytes: about
        // 83, not the 20 of its key and value alone.
        let stored = flood["stored"].as_u64().unwrap();
        assert!((15..25).contains(&stored), "{flood}");
        assert!(
            flood["error"]
                .as_str()
                .unwrap()
                .contains("data_quota_bytes"),
            "{flood}"
        );
    }
    let host = Host::open(persistent(dir.path())).await.unwrap();
    let out = call(&host, "acme", "count", json!({"key": "visits"})).await;
    assert_eq!(out.result, Ok(json!(4)), "KV survives a restart");
    let held = host.store().data_bytes("globex").await.unwrap();
    assert!(
        (1900..=2000).contains(&held),
        "the count survives too: {held}"
    );
}

/// Blobs that no kept version refers to are collected as the host opens: a removed tool's
/// component and its artifacts go; a kept tool's stay, and so does the runtime a JS tool runs
/// on, even when the host opens without one.
#[tokio::test]
async fn components_of_removed_tools_are_collected_as_the_host_opens() {
    let dir = tempfile::tempdir().unwrap();
    let with_js = || HostConfig {
        js_runtime: Some(crate::plugins::js_runtime()),
        ..persistent(dir.path())
    };
    let (stats, convert) = (plugin("text_stats"), plugin("unit_convert"));
    let sha = |bytes: &[u8]| toolhost::digest::sha256_hex(bytes);
    let runtime = sha(&crate::plugins::js_runtime());
    let source = "export const spec = { name: 'js_echo', description: 'Echoes.', \
                  parameters: { type: 'object' } };\n\
                  export default function (args) { return args; }\n";
    {
        let host = Host::open(with_js()).await.unwrap();
        host.install("acme", stats.clone()).await.unwrap();
        host.install("acme", convert.clone()).await.unwrap();
        host.install_js("acme", source).await.unwrap();
        for tool in ["text_stats", "word_frequency"] {
            assert!(host.remove("acme", tool).await.unwrap());
        }
        let kept = host.store().blob(&sha(&stats)).await.unwrap();
        assert!(kept.is_some(), "collected only as a host opens");
    }
    {
        let host = Host::open(persistent(dir.path())).await.unwrap();
        let store = host.store();
        assert!(
            store.blob(&sha(&stats)).await.unwrap().is_none(),
            "collected"
        );
        assert!(store.blob(&sha(&convert)).await.unwrap().is_some());
        assert!(
            store.blob(&runtime).await.unwrap().is_some(),
            "a JS tool runs on it"
        );
    }
    let artifacts = artifacts(dir.path());
    let of = |component: &[u8]| {
        let prefix = format!("{}:", sha(component));
        artifacts
            .iter()
            .any(|(key, _)| key.starts_with(prefix.as_bytes()))
    };
    assert!(!of(&stats) && of(&convert), "artifacts go with their blob");
    let host = Host::open(with_js()).await.unwrap();
    let echoed = call(&host, "acme", "js_echo", json!({"a": 1})).await;
    assert_eq!(echoed.result, Ok(json!({"a": 1})));
}

/// Rewriting one KV key over and over does not grow the data directory: it once grew by
/// 842 MiB in 2 s over 1 MiB of live data. A store file within 4x of what it held before the
/// rewrites (1 MiB of KV, the probe's component and its compiled artifact) passes.
#[tokio::test]
async fn rewriting_a_kv_key_does_not_grow_the_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let host = Host::open(persistent(dir.path())).await.unwrap();
    host.install("acme", plugin("probe")).await.unwrap();
    let file = dir.path().join(toolhost_store::STORE_FILE);
    let rewrite = async |times: u32| {
        let out = call(&host, "acme", "kv_rewrite", json!({"times": times})).await;
        assert_eq!(out.result, Ok(json!({"rewrites": times})));
        std::fs::metadata(&file).unwrap().len()
    };
    let live = rewrite(0).await;
    let after = rewrite(2_000).await;
    assert!(
        after <= 4 * live,
        "{after} bytes after 2 000 rewrites of one key, {live} before"
    );
}

#[tokio::test]
async fn secrets_reach_only_declaring_tools_and_never_their_logs_or_errors() {
    let host = Host::open(crate::plugins::config()).await.unwrap();
    for tenant in ["acme", "globex"] {
        host.install(tenant, plugin("probe")).await.unwrap();
    }
    host.set_config("acme", "API_TOKEN", "tok-8c1f2e", true)
        .await
        .unwrap();
    host.set_config("acme", "REGION", "eu-north", false)
        .await
        .unwrap();

    let out = call(&host, "acme", "secret_leak", json!({})).await;
    assert_eq!(
        out.result,
        Err(CallError::Tool(ToolError::Failed(
            "upstream rejected token [redacted] in eu-north".into()
        )))
    );
    assert_eq!(out.log.lines[0].message, "token=[redacted] region=eu-north");
    assert_eq!(out.log.stderr.trim(), "stderr token=[redacted]");
    assert_eq!(out.log.stdout.trim(), "stdout token=[redacted]");

    let listed = host.config("acme").await.unwrap();
    assert_eq!(
        listed,
        vec![
            ("API_TOKEN".into(), None),
            ("REGION".into(), Some("eu-north".into()))
        ]
    );
    let undeclared = call(&host, "acme", "config_undeclared", json!({}))
        .await
        .result
        .unwrap();
    assert_eq!(undeclared["ok"], false);
    assert!(
        undeclared["error"].as_str().unwrap().contains("not among"),
        "{undeclared}"
    );

    let globex = call(&host, "globex", "secret_leak", json!({})).await;
    let message = globex.result.unwrap_err().to_string();
    assert!(
        !message.contains("tok-8c1f2e") && message.contains("token  in"),
        "{message}"
    );
    assert!(matches!(
        host.set_config("acme", "bad key", "v", false).await,
        Err(ManageError::ConfigKey(_))
    ));
}

#[tokio::test]
async fn one_tenant_cannot_reach_anothers_tools_through_any_api() {
    let host = Host::open(crate::plugins::config()).await.unwrap();
    host.install("acme", plugin("probe")).await.unwrap();
    let (version, sha) = version_of(&host, "acme", "count");
    assert!(host.list("globex").is_empty());
    assert!(host.describe("globex", "count").is_none());
    assert_eq!(
        call(&host, "globex", "count", json!({"key": "k"}))
            .await
            .code(),
        "not_found"
    );
    assert!(matches!(
        host.versions("globex", "count").await,
        Err(ManageError::NotFound(_))
    ));
    assert!(matches!(
        host.rollback("globex", "count", Some(1)).await,
        Err(ManageError::NotFound(_))
    ));
    assert!(!host.remove("globex", "count").await.unwrap());
    // globex installing the same component makes globex's own tool; acme's is untouched.
    host.install("globex", variant("probe", "globex"))
        .await
        .unwrap();
    assert_eq!(version_of(&host, "acme", "count"), (version, sha));
    assert_eq!(version_of(&host, "globex", "count").0, 1);
    assert!(host.remove("globex", "count").await.unwrap());
    assert!(host.describe("acme", "count").is_some());
    assert!(host.config("globex").await.unwrap().is_empty());
}

#[tokio::test]
async fn names_that_differ_only_in_case_are_refused() {
    let host = Host::open(crate::plugins::config()).await.unwrap();
    let schema = json!({"type": "object"});
    host.natives()
        .register(
            ToolSpec::new("Text_Stats", "Native.", schema),
            |_, _, _| async { Ok(Value::Null) },
        )
        .unwrap();
    let refused = host.install("acme", plugin("text_stats")).await;
    assert!(
        matches!(&refused, Err(InstallError::CaseConflict { name, existing }) if name == "text_stats" && existing == "Text_Stats"),
        "{refused:?}"
    );
    assert!(
        host.list("acme")
            .iter()
            .all(|t| t.spec.name != "text_stats")
    );
}

#[tokio::test]
async fn loaded_components_stay_under_the_cap() {
    let host = Host::open(HostConfig {
        max_loaded_components: 1,
        ..crate::plugins::config()
    })
    .await
    .unwrap();
    host.install("acme", plugin("unit_convert")).await.unwrap();
    host.install("acme", plugin("json_query")).await.unwrap();
    for _ in 0..3 {
        let a = call(
            &host,
            "acme",
            "convert_units",
            json!({"value": 1, "from": "m", "to": "cm"}),
        )
        .await;
        assert!(a.result.is_ok());
        let b = call(
            &host,
            "acme",
            "json_query",
            json!({"document": "[1]", "path": "$[0]"}),
        )
        .await;
        assert!(b.result.is_ok());
        assert_eq!(host.loaded_components(), 1);
    }
}

#[tokio::test]
async fn a_data_directory_that_cannot_be_used_gets_a_clear_error() {
    let file = tempfile::NamedTempFile::new().unwrap();
    let error = Host::open(persistent(&file.path().join("data")))
        .await
        .err()
        .expect("not a directory");
    let message = error.to_string();
    assert!(
        message.contains("cannot open the data directory"),
        "{message}"
    );
    assert!(
        message.contains(&file.path().display().to_string()),
        "{message}"
    );

    let dir = tempfile::tempdir().unwrap();
    let _first = Host::open(persistent(dir.path())).await.unwrap();
    let second = Host::open(persistent(dir.path()))
        .await
        .err()
        .expect("locked");
    assert!(
        second
            .to_string()
            .contains("in use by another toolhost process"),
        "{second}"
    );
}

const ARTIFACTS: redb::TableDefinition<&[u8], &[u8]> =
    redb::TableDefinition::new("sealed_artifacts");

/// The stored artifacts of the closed store in `dir`, read as a tamperer would.
fn artifacts(dir: &std::path::Path) -> Vec<(Vec<u8>, Vec<u8>)> {
    use redb::{ReadableDatabase, ReadableTable};
    let db = redb::Database::open(dir.join(toolhost_store::STORE_FILE)).unwrap();
    let tx = db.begin_read().unwrap();
    let table = tx.open_table(ARTIFACTS).unwrap();
    let entries = table.iter().unwrap().map(Result::unwrap);
    entries
        .map(|(k, v)| (k.value().to_vec(), v.value().to_vec()))
        .collect()
}

const TOOLS: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("tools");

/// Commits what `edit` does to one table of the closed store in `dir`.
fn tamper(
    dir: &std::path::Path,
    table: redb::TableDefinition<&[u8], &[u8]>,
    edit: impl FnOnce(&mut redb::Table<&[u8], &[u8]>),
) {
    let db = redb::Database::open(dir.join(toolhost_store::STORE_FILE)).unwrap();
    let tx = db.begin_write().unwrap();
    edit(&mut tx.open_table(table).unwrap());
    tx.commit().unwrap();
}

/// Commits what `edit` does to the JSON of `tenant`'s record of `tool` in the closed store.
pub fn tamper_tool_record(
    dir: &std::path::Path,
    tenant: &str,
    tool: &str,
    edit: impl FnOnce(&mut Value),
) {
    tamper(dir, TOOLS, |table| {
        use redb::ReadableTable;
        let key = format!("{tenant}\0{tool}").into_bytes();
        let mut entry: Value =
            serde_json::from_slice(table.get(&key[..]).unwrap().unwrap().value()).unwrap();
        edit(&mut entry);
        table
            .insert(&key[..], &serde_json::to_vec(&entry).unwrap()[..])
            .unwrap();
    });
}

#[tokio::test]
async fn a_stored_schema_that_no_longer_compiles_fails_its_calls_only() {
    let dir = tempfile::tempdir().unwrap();
    {
        let host = Host::open(persistent(dir.path())).await.unwrap();
        host.install("acme", plugin("unit_convert")).await.unwrap();
        host.install("globex", plugin("unit_convert"))
            .await
            .unwrap();
    }
    // As if a newer host read a schema that its JSON Schema rules now refuse.
    tamper_tool_record(dir.path(), "acme", "convert_units", |entry| {
        entry["versions"][0]["spec"]["parameters"] = json!({"type": "no-such-type"});
    });
    let host = Host::open(persistent(dir.path())).await.unwrap();
    let listed: Vec<String> = host.list("acme").into_iter().map(|t| t.spec.name).collect();
    assert!(listed.contains(&"convert_units".to_owned()), "{listed:?}");
    let args = json!({"value": 3, "from": "ft", "to": "in"});
    let out = call(&host, "acme", "convert_units", args.clone()).await;
    match out.result {
        Err(CallError::Internal { message }) => {
            assert!(message.contains("parameters"), "names the field: {message}")
        }
        other => panic!("expected an internal error, got {other:?}"),
    }
    let out = call(&host, "globex", "convert_units", args).await;
    assert_eq!(out.result.unwrap()["value"], json!(36.0));
}

/// A tool record that no longer reads (here: its current version is not one it keeps) is
/// skipped at open, alone, and while it is there no blob is collected: what it refers to is
/// unknown.
#[tokio::test]
async fn an_unreadable_tool_record_is_skipped_and_keeps_every_blob() {
    let dir = tempfile::tempdir().unwrap();
    let (stats, convert) = (plugin("text_stats"), plugin("unit_convert"));
    {
        let host = Host::open(persistent(dir.path())).await.unwrap();
        host.install("acme", stats.clone()).await.unwrap();
        host.install("acme", convert).await.unwrap();
        host.install("acme", plugin("json_query")).await.unwrap();
        for tool in ["text_stats", "word_frequency"] {
            assert!(host.remove("acme", tool).await.unwrap());
        }
    }
    tamper_tool_record(dir.path(), "acme", "convert_units", |entry| {
        entry["current"] = json!(99);
    });
    let host = Host::open(persistent(dir.path())).await.unwrap();
    assert!(host.describe("acme", "convert_units").is_none());
    let listed: Vec<String> = host.list("acme").into_iter().map(|t| t.spec.name).collect();
    assert_eq!(listed, ["json_query"]);
    let removed = toolhost::digest::sha256_hex(&stats);
    assert!(
        host.store().blob(&removed).await.unwrap().is_some(),
        "not collected while a record is unreadable"
    );
}

#[tokio::test]
async fn a_damaged_artifact_is_recompiled_never_trusted() {
    let dir = tempfile::tempdir().unwrap();
    {
        let host = Host::open(persistent(dir.path())).await.unwrap();
        host.install("acme", plugin("unit_convert")).await.unwrap();
    }
    let (key, mut damaged) = artifacts(dir.path()).remove(0);
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0xff;
    tamper(dir.path(), ARTIFACTS, |table| {
        table.insert(&key[..], &damaged[..]).unwrap();
    });
    {
        let host = Host::open(persistent(dir.path())).await.unwrap();
        let out = call(
            &host,
            "acme",
            "convert_units",
            json!({"value": 3, "from": "ft", "to": "in"}),
        )
        .await;
        assert_eq!(out.result.unwrap()["value"], json!(36.0));
    }
    let (_, rewritten) = artifacts(dir.path()).remove(0);
    assert_ne!(rewritten, damaged, "rewritten");
    let host = Host::open(persistent(dir.path())).await.unwrap();
    let out = call(
        &host,
        "acme",
        "convert_units",
        json!({"value": 1, "from": "ft", "to": "in"}),
    )
    .await;
    assert_eq!(out.result.unwrap()["value"], json!(12.0));
    let metrics = host.metrics().render();
    assert!(
        metrics.contains("toolhost_component_loads_total{source=\"artifact\"} 1\n"),
        "valid again, loaded without compiling: {metrics}"
    );
}

#[test]
fn the_cli_lists_versions_rolls_back_and_keeps_secrets_secret() {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let data = tempfile::tempdir().unwrap();
    let files = tempfile::tempdir().unwrap();
    let run = |args: &[&str], stdin: Option<&str>| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_toolhost"))
            .env("TOOLHOST_ARTIFACT_DIR", crate::plugins::artifact_dir())
            .arg("--data-dir")
            .arg(data.path())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut input = child.stdin.take().unwrap();
        input
            .write_all(stdin.unwrap_or_default().as_bytes())
            .unwrap();
        drop(input);
        let out = child.wait_with_output().unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    for (i, tag) in ["v1", "v2"].into_iter().enumerate() {
        let path = files.path().join(format!("{i}.wasm"));
        std::fs::write(&path, variant("probe", tag)).unwrap();
        assert_eq!(run(&["install", path.to_str().unwrap()], None).0, Some(0));
    }
    let (code, stdout, _) = run(&["versions", "count"], None);
    assert_eq!(code, Some(0));
    let marks: Vec<&str> = stdout.lines().map(|l| &l[..5]).collect();
    assert_eq!(marks, ["*   2", "    1"], "{stdout}");
    assert_eq!(
        run(&["rollback", "count"], None).1,
        "count is now at version 1\n"
    );
    let (code, _, stderr) = run(&["rollback", "count"], None);
    assert_eq!(code, Some(2));
    assert!(stderr.contains("no earlier version"), "{stderr}");

    assert_eq!(
        run(
            &["config", "set", "API_TOKEN", "--secret"],
            Some("tok-from-stdin\n")
        )
        .0,
        Some(0)
    );
    assert_eq!(run(&["config", "set", "REGION", "eu"], None).0, Some(0));
    assert_eq!(
        run(&["config", "list"], None).1,
        "API_TOKEN = (secret)\nREGION = eu\n"
    );
    let (code, _, stderr) = run(&["call", "secret_leak", "{}"], None);
    assert_eq!(code, Some(1));
    assert_eq!(
        stderr,
        "error[tool_error]: tool error: upstream rejected token [redacted] in eu\n"
    );
}

#[tokio::test]
async fn a_read_only_data_directory_gets_a_clear_error_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    {
        let host = Host::open(persistent(dir.path())).await.unwrap();
        host.install("acme", plugin("unit_convert")).await.unwrap();
    }
    // Root ignores permission bits, not the immutable flag. Cleared again even on panic.
    struct Immutable<'a>(&'a std::path::Path);
    impl Drop for Immutable<'_> {
        fn drop(&mut self) {
            let _ = std::process::Command::new("chattr")
                .arg("-R")
                .arg("-i")
                .arg(self.0)
                .status();
        }
    }
    let guard = Immutable(dir.path());
    let set = std::process::Command::new("chattr")
        .arg("-R")
        .arg("+i")
        .arg(dir.path())
        .status();
    assert!(
        set.is_ok_and(|s| s.success()),
        "chattr +i failed: this test needs a filesystem with immutable files (ext4 here)"
    );
    let refused = Host::open(persistent(dir.path())).await;
    drop(guard);
    let message = refused
        .err()
        .expect("a read-only directory is refused")
        .to_string();
    assert!(
        message.contains("cannot open the data directory"),
        "{message}"
    );

    let host = Host::open(persistent(dir.path())).await.unwrap();
    let out = call(
        &host,
        "acme",
        "convert_units",
        json!({"value": 2, "from": "h", "to": "min"}),
    )
    .await;
    assert_eq!(
        out.result.unwrap()["value"],
        json!(120.0),
        "nothing was lost"
    );
}

#[tokio::test]
async fn an_invalid_cache_key_path_is_rejected_naming_the_field() {
    let host = Host::open(crate::plugins::config()).await.unwrap();
    let mut spec = ToolSpec::new("lookup", "Looks up.", json!({"type": "object"}));
    spec.cache = Some(toolhost::CachePolicy {
        ttl_ms: 1000,
        key_path: "$.items[*].id".into(),
    });
    let error = host
        .natives()
        .register(spec, |_, _, _| async { Ok(Value::Null) })
        .expect_err("wildcards cannot key a cache");
    assert!(
        error
            .to_string()
            .starts_with("tool `lookup`: cache.key_path: "),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_installs_of_one_tool_each_get_their_own_version() {
    let host = Arc::new(Host::open(crate::plugins::config()).await.unwrap());
    host.install("acme", plugin("unit_convert")).await.unwrap(); // compiled once
    let installs: Vec<_> = (0..8)
        .map(|i| {
            let host = host.clone();
            tokio::spawn(async move {
                host.install("acme", variant("unit_convert", &format!("c{i}")))
                    .await
            })
        })
        .collect();
    for install in installs {
        install.await.unwrap().unwrap();
    }
    let versions: Vec<u32> = host
        .versions("acme", "convert_units")
        .await
        .unwrap()
        .versions
        .iter()
        .map(|v| v.version)
        .collect();
    assert_eq!(versions, (1..=9).collect::<Vec<_>>());
}

/// `Store` is a safe trait that any app may implement, and an artifact is native code: the
/// host loads only artifacts it sealed itself, for that very component. Here the store hands
/// back another component's genuine artifact, which wasmtime would load.
#[tokio::test]
async fn a_store_cannot_hand_the_host_code_to_run() {
    let dir = tempfile::tempdir().unwrap();
    let (convert, stats) = (plugin("unit_convert"), plugin("text_stats"));
    {
        let host = Host::open(persistent(dir.path())).await.unwrap();
        host.install("acme", convert.clone()).await.unwrap();
        host.install("acme", stats.clone()).await.unwrap();
    }
    let key_of = |component: &[u8]| {
        let sha = toolhost::digest::sha256_hex(component);
        let stored = artifacts(dir.path());
        let found = stored
            .into_iter()
            .find(|(key, _)| key.starts_with(sha.as_bytes()));
        found.unwrap()
    };
    let (convert_key, _) = key_of(&convert);
    let (_, stats_artifact) = key_of(&stats);
    tamper(dir.path(), ARTIFACTS, |table| {
        table.insert(&convert_key[..], &stats_artifact[..]).unwrap();
    });
    let host = Host::open(persistent(dir.path())).await.unwrap();
    let args = json!({"value": 3, "from": "ft", "to": "in"});
    let out = call(&host, "acme", "convert_units", args).await;
    assert_eq!(
        out.result.unwrap()["value"],
        json!(36.0),
        "its own code, compiled again"
    );
    let metrics = host.metrics().render();
    assert!(
        metrics.contains("toolhost_component_loads_total{source=\"compiled\"} 1\n"),
        "{metrics}"
    );
}

/// With the operator's secrets key, a secret is sealed at rest: the data directory's files do
/// not hold it, a host without the key cannot read it (and says so), and one with the key can.
#[tokio::test]
async fn secrets_are_sealed_at_rest_with_the_operators_key() {
    let dir = tempfile::tempdir().unwrap();
    let key = toolhost::SecretsKey::new([42; 32]);
    let open = async |key: Option<toolhost::SecretsKey>| {
        Host::open(HostConfig {
            secrets_key: key,
            ..persistent(dir.path())
        })
        .await
        .unwrap()
    };
    async fn leak(host: &Host) -> Result<Value, toolhost::CallError> {
        call(host, "acme", "secret_leak", json!({})).await.result
    }
    {
        let host = open(Some(key.clone())).await;
        host.install("acme", plugin("probe")).await.unwrap();
        host.set_config("acme", "API_TOKEN", "tok-7f3a9c21", true)
            .await
            .unwrap();
        host.set_config("acme", "REGION", "eu", false)
            .await
            .unwrap();
        let read = leak(&host).await.unwrap_err().to_string();
        assert!(
            read.contains("[redacted] in eu"),
            "the tool read it: {read}"
        );
    }
    let mut files = vec![dir.path().to_owned()];
    let mut found = false;
    while let Some(path) = files.pop() {
        if path.is_dir() {
            files.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else if std::fs::read(&path)
            .unwrap()
            .windows(12)
            .any(|w| w == b"tok-7f3a9c21")
        {
            found = true;
        }
    }
    assert!(!found, "the secret is in the data directory's files");
    {
        let host = open(None).await;
        let listed = host.config("acme").await.unwrap();
        assert!(listed.contains(&("API_TOKEN".into(), None)), "{listed:?}");
        let unread = leak(&host).await.unwrap_err().to_string();
        assert!(
            !unread.contains("in eu"),
            "without the key it cannot be read: {unread}"
        );
    }
    let host = open(Some(key)).await;
    let read = leak(&host).await.unwrap_err().to_string();
    assert!(read.contains("[redacted] in eu"), "{read}");
}

/// What the CLI writes is its owner's alone: the data directory's folders 0700, files 0600.
#[test]
fn the_clis_data_directory_is_readable_by_its_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_toolhost"))
        .arg("--data-dir")
        .arg(&data)
        .args(["tenant", "create", "acme"])
        .status()
        .unwrap();
    assert!(status.success());
    let mut paths = vec![data];
    while let Some(path) = paths.pop() {
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        if path.is_dir() {
            assert_eq!(mode, 0o700, "{}", path.display());
            paths.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        } else {
            assert_eq!(mode, 0o600, "{}", path.display());
        }
    }
}
