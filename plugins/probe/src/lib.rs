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

/// Returns its key, writing nothing.
fn echo(args: Key, _: &Context) -> Result<String, ToolError> {
    Ok(args.key)
}

/// Calls of this instance before this one: 0 in a fresh instance.
static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[derive(Deserialize, JsonSchema)]
struct Residue {
    kib: usize,
}

/// What an earlier call left in this instance's memory: its count in a static, and nonzero
/// bytes in `kib` KiB of zeroed heap (the allocator takes memory the instance never used as
/// zeroed already, so a slot recycled without its reset shows here). Then scribbles over
/// that much memory for the next call to find.
fn residue(args: Residue, _: &Context) -> Result<Value, ToolError> {
    let earlier_calls = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let fresh = vec![0u8; args.kib << 10];
    let dirty_bytes = fresh.iter().filter(|byte| **byte != 0).count();
    let scribbled = std::hint::black_box(vec![0xABu8; args.kib << 10]);
    std::mem::forget(scribbled);
    Ok(json!({ "earlier_calls": earlier_calls, "dirty_bytes": dirty_bytes }))
}

/// Answers `{"n": key}`, which its declared output (an integer `n`) holds only for a number.
fn shaped(args: Key, _: &Context) -> Result<Value, ToolError> {
    Ok(match args.key.parse::<i64>() {
        Ok(n) => json!({ "n": n }),
        Err(_) => json!({ "n": args.key }),
    })
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

#[derive(Deserialize, JsonSchema)]
struct Rewrites {
    times: u32,
}

/// Stores 1 MiB (16 values of 64 KiB), then overwrites one small key `times` times: the
/// write pattern that once grew the data directory by hundreds of MiB.
fn kv_rewrite(args: Rewrites, _: &Context) -> Result<Value, ToolError> {
    let big = vec![b'x'; 64 * 1024];
    for i in 0..16 {
        kv::set(&format!("big{i}"), &big).map_err(ToolError::failed)?;
    }
    for i in 0..args.times {
        kv::set("small", &u64::from(i).to_be_bytes()).map_err(ToolError::failed)?;
    }
    Ok(json!({"rewrites": args.times}))
}

#[derive(Deserialize, JsonSchema)]
struct PathArg {
    path: String,
}

#[derive(Deserialize, JsonSchema)]
struct WriteArgs {
    path: String,
    text: String,
}

#[derive(Deserialize, JsonSchema)]
struct UrlArg {
    url: String,
}

/// What a filesystem operation did: `{"ok": value}` or `{"error": message}`.
fn report<T: serde::Serialize>(result: std::io::Result<T>) -> Result<Value, ToolError> {
    Ok(match result {
        Ok(value) => json!({ "ok": value }),
        Err(error) => json!({ "error": error.to_string() }),
    })
}

fn fs_read(args: PathArg, _: &Context) -> Result<Value, ToolError> {
    report(std::fs::read_to_string(&args.path))
}

#[derive(Deserialize, JsonSchema)]
struct ReadLater {
    path: String,
    ms: u64,
}

/// Busy for `ms`, then reads the file: a window in which its directory can be swapped.
fn fs_read_later(args: ReadLater, _: &Context) -> Result<Value, ToolError> {
    let start = std::time::Instant::now();
    while start.elapsed().as_millis() < u128::from(args.ms) {
        std::hint::black_box(0);
    }
    report(std::fs::read_to_string(&args.path))
}

#[derive(Deserialize, JsonSchema)]
struct LinkArgs {
    from: String,
    to: String,
}

/// Makes `to` a hard link to `from`.
fn fs_link(args: LinkArgs, _: &Context) -> Result<Value, ToolError> {
    report(std::fs::hard_link(&args.from, &args.to))
}

fn fs_write(args: WriteArgs, _: &Context) -> Result<Value, ToolError> {
    report(std::fs::write(&args.path, args.text.as_bytes()).map(|()| args.text.len()))
}

/// Appends: the file's `append-via-stream`.
fn fs_append(args: WriteArgs, _: &Context) -> Result<Value, ToolError> {
    use std::io::Write;
    let file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(&args.path);
    report(file.and_then(|mut f| f.write_all(args.text.as_bytes())))
}

#[derive(Deserialize, JsonSchema)]
struct SetLenArgs {
    path: String,
    len: u64,
}

/// Grows or shrinks a file: its `set-size`.
fn fs_set_len(args: SetLenArgs, _: &Context) -> Result<Value, ToolError> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&args.path);
    report(file.and_then(|f| f.set_len(args.len)))
}

#[derive(Deserialize, JsonSchema)]
struct HoldOpen {
    path: String,
    count: usize,
}

/// Opens `path` `count` times and keeps every handle until it returns: how many it got, and
/// why the next failed.
fn fs_hold_open(args: HoldOpen, _: &Context) -> Result<Value, ToolError> {
    let mut held = Vec::new();
    for _ in 0..args.count {
        match std::fs::File::open(&args.path) {
            Ok(file) => held.push(file),
            Err(error) => return Ok(json!({"opened": held.len(), "error": error.to_string()})),
        }
    }
    Ok(json!({ "opened": held.len() }))
}

#[derive(Deserialize, JsonSchema)]
struct MakeMany {
    dir: String,
    count: usize,
    /// `file` or `dir`.
    kind: String,
}

/// Makes `count` empty files or directories in `dir`, named from the time so
/// each call's are new: how many it made, and why the next failed.
fn fs_make_many(args: MakeMany, _: &Context) -> Result<Value, ToolError> {
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| t.as_nanos());
    for made in 0..args.count {
        let path = format!("{}/{stamp}-{made}", args.dir);
        let result = match args.kind.as_str() {
            "dir" => std::fs::create_dir(&path),
            _ => std::fs::File::create_new(&path).map(drop),
        };
        if let Err(error) = result {
            return Ok(json!({"made": made, "error": error.to_string()}));
        }
    }
    Ok(json!({ "made": args.count }))
}

fn fs_remove(args: PathArg, _: &Context) -> Result<Value, ToolError> {
    report(std::fs::remove_file(&args.path))
}

fn fs_list(args: PathArg, _: &Context) -> Result<Value, ToolError> {
    report(std::fs::read_dir(&args.path).and_then(|entries| {
        let mut names = entries
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<std::io::Result<Vec<_>>>()?;
        names.sort();
        Ok(names)
    }))
}

#[derive(Deserialize, JsonSchema)]
struct HoldRequests {
    /// `http://host:port/path`.
    url: String,
    count: usize,
}

/// Sends `count` GETs at once, then waits for each: how many got a response, and the
/// errors of the rest.
fn http_hold(args: HoldRequests, _: &Context) -> Result<Value, ToolError> {
    use wasip2::http::{outgoing_handler, types};
    let rest = args.url.strip_prefix("http://").unwrap_or(&args.url);
    let (authority, path) = rest.find('/').map_or((rest, "/"), |at| rest.split_at(at));
    let mut pending = Vec::new();
    for _ in 0..args.count {
        let request = types::OutgoingRequest::new(types::Fields::new());
        let _ = request.set_scheme(Some(&types::Scheme::Http));
        let _ = request.set_authority(Some(authority));
        let _ = request.set_path_with_query(Some(path));
        let body = request
            .body()
            .map_err(|()| ToolError::failed("body taken"))?;
        let sent = outgoing_handler::handle(request, None);
        let _ = types::OutgoingBody::finish(body, None);
        pending.push(sent);
    }
    let (mut answered, mut errors) = (0, Vec::new());
    for sent in &pending {
        let answer = sent
            .as_ref()
            .map_err(|e| format!("{e:?}"))
            .and_then(|future| {
                future.subscribe().block();
                match future.get() {
                    Some(Ok(Ok(_response))) => Ok(()),
                    Some(Ok(Err(e))) => Err(format!("{e:?}")),
                    _ => Err("no answer".into()),
                }
            });
        match answer {
            Ok(()) => answered += 1,
            Err(error) => errors.push(error),
        }
    }
    Ok(json!({"answered": answered, "errors": errors}))
}

fn http_get(args: UrlArg, _: &Context) -> Result<Value, ToolError> {
    Ok(match toolhost_sdk::http::get(&args.url) {
        Ok(response) => json!({"status": response.status, "body": response.text()}),
        Err(error) => json!({ "error": error }),
    })
}

#[derive(Deserialize, JsonSchema)]
struct CallArgs {
    name: String,
    arguments: Value,
}

#[derive(Deserialize, JsonSchema)]
struct Depth {
    depth: u32,
}

fn call_tool(args: CallArgs, _: &Context) -> Result<Value, ToolError> {
    Ok(
        match toolhost_sdk::tools::call(&args.name, &args.arguments) {
            Ok(value) => json!({ "ok": value }),
            Err(error) => json!({ "error": error }),
        },
    )
}

/// Calls itself one level deeper until the host refuses; reports how deep it got.
fn recurse(args: Depth, _: &Context) -> Result<Value, ToolError> {
    match toolhost_sdk::tools::call("recurse", &json!({"depth": args.depth + 1})) {
        Ok(deeper) => Ok(deeper),
        Err(error) => Ok(json!({"deepest": args.depth, "error": error})),
    }
}

/// Runs for `ms` of wall-clock time, then answers.
fn busy(args: Busy, _: &Context) -> Result<&'static str, ToolError> {
    let start = std::time::Instant::now();
    while start.elapsed().as_millis() < u128::from(args.ms) {
        std::hint::black_box(0);
    }
    Ok("done")
}

#[derive(Deserialize, JsonSchema)]
struct Work {
    millions: u64,
}

/// A fixed amount of CPU work, however long it takes: `millions` million rounds of a hash.
fn work(args: Work, _: &Context) -> Result<u64, ToolError> {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for _ in 0..args.millions * 1_000_000 {
        x = std::hint::black_box(x.rotate_left(5) ^ x.wrapping_mul(0x100_0000_01b3));
    }
    Ok(x)
}

/// Sleeps `ms`, then answers: a call that takes time but no CPU.
fn nap(args: Busy, _: &Context) -> Result<&'static str, ToolError> {
    std::thread::sleep(std::time::Duration::from_millis(args.ms));
    Ok("rested")
}

#[derive(Deserialize, JsonSchema)]
struct HoldMemory {
    mib: usize,
    ms: u64,
}

/// Fills `mib` MiB of its memory, then holds it for `ms` (asleep): a large, idle instance.
fn hold_memory(args: HoldMemory, _: &Context) -> Result<usize, ToolError> {
    let held = vec![1u8; args.mib << 20];
    std::thread::sleep(std::time::Duration::from_millis(args.ms));
    Ok(std::hint::black_box(held).len())
}

export_tools!(
    Tool::new("count", "Increments a counter.", count),
    Tool::new(
        "residue",
        "Reports what earlier calls left behind.",
        residue
    ),
    Tool::new("shaped", "Answers {n: key}.", shaped).raw_output_schema(json!({
        "type": "object",
        "required": ["n"],
        "properties": { "n": { "type": "integer" } }
    })),
    Tool::new(
        "hold_memory",
        "Fills and holds memory for a while.",
        hold_memory
    )
    .memory_bytes(512 << 20)
    .timeout_ms(10_000),
    Tool::new(
        "count_cached",
        "Increments a counter; results cached by key.",
        count
    )
    .cache(60_000, "$.key"),
    Tool::new(
        "echo_cached",
        "Returns its key; results cached by key.",
        echo
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
    Tool::new(
        "kv_rewrite",
        "Stores 1 MiB, then rewrites a key.",
        kv_rewrite
    ),
    Tool::new("busy", "Busy for some milliseconds.", busy),
    Tool::new("nap", "Sleeps for some milliseconds.", nap),
    Tool::new(
        "nap_idempotent",
        "Sleeps for some milliseconds; safe to run twice.",
        nap
    )
    .idempotent(2),
    Tool::new("work", "Does a fixed amount of CPU work.", work).fuel(100_000_000_000),
    Tool::new("fs_read", "Reads a file as text.", fs_read),
    Tool::new("fs_write", "Writes text to a file.", fs_write),
    Tool::new("fs_link", "Hard-links a file.", fs_link),
    Tool::new("fs_append", "Appends text to a file.", fs_append),
    Tool::new("fs_set_len", "Sets a file's length.", fs_set_len),
    Tool::new("fs_remove", "Removes a file.", fs_remove),
    Tool::new(
        "fs_read_later",
        "Reads a file after some milliseconds.",
        fs_read_later
    ),
    Tool::new(
        "fs_hold_open",
        "Opens a file many times, keeping every handle.",
        fs_hold_open,
    ),
    Tool::new("fs_list", "Lists a directory.", fs_list),
    Tool::new(
        "fs_make_many",
        "Makes many empty files or directories.",
        fs_make_many,
    ),
    Tool::new("http_get", "Fetches a URL.", http_get),
    Tool::new(
        "http_hold",
        "Sends many GETs at once, then waits for each.",
        http_hold,
    ),
    Tool::new("call_tool", "Calls another tool.", call_tool),
    Tool::new("call_tool_short", "Calls another tool, briefly.", call_tool).timeout_ms(500),
    Tool::new(
        "call_tool_lean",
        "Calls another tool, on little fuel.",
        call_tool
    )
    .fuel(100_000_000),
    Tool::new("recurse", "Calls itself until refused.", recurse),
);
