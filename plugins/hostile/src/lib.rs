//! Deliberately hostile tools. Each one attacks a limit or an isolation boundary; the host's
//! tests check that each ends in its own outcome while the host keeps serving.

use std::hint::black_box;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use toolhost_sdk::{Context, Tool, ToolError, export_tools};

#[derive(Deserialize, JsonSchema)]
struct NoArgs {}

type Out = Result<Value, ToolError>;

/// Never returns: must end at the epoch deadline (its fuel is set far beyond the timeout).
fn spin(_: NoArgs, _: &Context) -> Out {
    let mut n = 0u64;
    loop {
        n = black_box(n.wrapping_add(1));
    }
}

/// Same loop with little fuel: must end out of fuel long before its timeout.
fn burn(args: NoArgs, ctx: &Context) -> Out {
    spin(args, ctx)
}

/// Allocates and touches memory until something stops it.
fn memory_bomb(_: NoArgs, _: &Context) -> Out {
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        hoard.push(vec![0xAB; 1 << 20]);
        black_box(&hoard);
    }
}

#[allow(unconditional_recursion)] // the point of this tool
fn depth(n: u64) -> u64 {
    black_box(n) + depth(black_box(n + 1))
}

/// Unbounded recursion: overflows the stack.
fn recurse(_: NoArgs, _: &Context) -> Out {
    Ok(json!(depth(0)))
}

fn panic(_: NoArgs, _: &Context) -> Out {
    panic!("the hostile plugin panicked on purpose")
}

/// About 4 MB of JSON, far past any result budget.
fn huge_output(_: NoArgs, _: &Context) -> Out {
    let rows: Vec<Value> = (0..100_000)
        .map(|i| json!({"id": i, "text": "lorem ipsum dolor sit amet"}))
        .collect();
    Ok(json!({"rows": rows, "note": "everything above is filler"}))
}

/// Tries every way to touch the host's files; reports what happened to each.
fn open_file(_: NoArgs, _: &Context) -> Out {
    let outcome = |r: std::io::Result<String>| match r {
        Ok(text) => json!({"ok": true, "content": text}),
        Err(e) => json!({"ok": false, "error": e.to_string()}),
    };
    Ok(json!({
        "read_etc_passwd": outcome(std::fs::read_to_string("/etc/passwd")),
        "read_relative": outcome(std::fs::read_to_string("Cargo.toml")),
        "list_root": outcome(std::fs::read_dir("/").map(|d| format!("{} entries", d.count()))),
        "create_tmp": outcome(std::fs::write("/tmp/toolhost-escape", "x").map(|_| String::new())),
    }))
}

/// Reports whatever environment, arguments and working directory it can see.
fn read_env(_: NoArgs, _: &Context) -> Out {
    Ok(json!({
        "vars": std::env::vars().collect::<Vec<_>>(),
        "args": std::env::args().collect::<Vec<_>>(),
        "home": std::env::var("HOME").ok(),
        "cwd": std::env::current_dir().ok().map(|p| p.display().to_string()),
    }))
}

/// Tries to open a socket to the host.
fn connect(_: NoArgs, _: &Context) -> Out {
    Ok(match std::net::TcpStream::connect("127.0.0.1:22") {
        Ok(_) => json!({"ok": true}),
        Err(e) => json!({"ok": false, "error": e.to_string()}),
    })
}

/// Writes 4 MiB to stdout and stderr, then answers normally.
fn stdout_flood(_: NoArgs, _: &Context) -> Out {
    let line = "x".repeat(1023);
    for _ in 0..4096 {
        println!("{line}");
        eprintln!("{line}");
    }
    Ok(json!("done"))
}

/// Blocks in a host call (a WASI sleep), where no epoch check can reach it.
fn sleep(_: NoArgs, _: &Context) -> Out {
    std::thread::sleep(std::time::Duration::from_secs(3600));
    Ok(json!("woke up"))
}

fn tool<F>(name: &str, description: &str, f: F) -> Tool
where
    F: Fn(NoArgs, &Context) -> Out + 'static,
{
    Tool::new(name, description, f).group("hostile")
}

export_tools!(
    tool("spin", "Loops forever.", spin)
        .timeout_ms(300)
        .fuel(100_000_000_000),
    tool("burn", "Loops forever on little fuel.", burn).fuel(1_000_000),
    tool("memory_bomb", "Allocates until stopped.", memory_bomb).memory_bytes(32 << 20),
    tool("recurse", "Recurses without end.", recurse),
    tool("panic", "Panics.", panic),
    tool("huge_output", "Returns about 4 MB of JSON.", huge_output),
    Tool::raw(
        "not_json",
        "Returns text that is not JSON.",
        json!({"type": "object"}),
        |_, _| Ok("this is not JSON".to_owned()),
    ),
    tool(
        "open_file",
        "Tries to read and write host files.",
        open_file
    ),
    tool(
        "read_env",
        "Reports its environment and arguments.",
        read_env
    ),
    tool("connect", "Tries to open a TCP connection.", connect),
    tool("stdout_flood", "Floods stdout and stderr.", stdout_flood),
    tool("sleep", "Sleeps for an hour.", sleep).timeout_ms(300),
);
