//! What a guest may reach beyond its sandbox: nothing without a grant; a granted directory of
//! its tenant's files and nothing outside it; granted HTTP destinations and no others.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde_json::{Value, json};
use toolhost::egress::EgressConfig;
use toolhost::{CallOutcome, Caller, Host, HostConfig, TenantPolicy};

struct Fixture {
    host: Host,
    _dir: tempfile::TempDir,
}

async fn fixture(egress: EgressConfig) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let host = Host::open(HostConfig {
        data_dir: Some(dir.path().join("data")),
        egress,
        ..crate::plugins::config()
    })
    .await
    .unwrap();
    for tenant in ["acme", "globex"] {
        host.install(tenant, crate::plugins::plugin("probe"))
            .await
            .unwrap();
    }
    Fixture { host, _dir: dir }
}

async fn grant(host: &Host, tenant: &str, grants: Value) {
    let policy: TenantPolicy = serde_json::from_value(json!({ "grants": grants })).unwrap();
    host.set_policy(tenant, policy).await.unwrap();
}

async fn call(host: &Host, tenant: &str, tool: &str, args: Value) -> CallOutcome {
    host.call(&Caller::tenant(tenant), tool, args).await
}

/// The probe's `{"ok": …}` or `{"error": …}` as a Result.
async fn probe(host: &Host, tenant: &str, tool: &str, args: Value) -> Result<Value, String> {
    let out = call(host, tenant, tool, args).await;
    let value = out.result.unwrap_or_else(|e| panic!("{tool} failed: {e}"));
    match value.get("error") {
        Some(error) => Err(error.as_str().unwrap().to_owned()),
        None => Ok(value.get("ok").cloned().unwrap_or(value)),
    }
}

fn files(host: &Host, tenant: &str) -> PathBuf {
    host.tenant_files(tenant).unwrap()
}

#[tokio::test]
async fn without_a_grant_the_guest_sees_no_filesystem_and_no_network() {
    let f = fixture(EgressConfig::default()).await;
    for path in ["/", ".", "/etc/passwd", "/data"] {
        assert!(
            probe(&f.host, "acme", "fs_list", json!({ "path": path }))
                .await
                .is_err()
        );
        assert!(
            probe(&f.host, "acme", "fs_read", json!({ "path": path }))
                .await
                .is_err()
        );
    }
    let out = call(
        &f.host,
        "acme",
        "http_get",
        json!({"url": "http://127.0.0.1:9/"}),
    )
    .await;
    let error = out.result.unwrap()["error"].as_str().unwrap().to_owned();
    assert!(error.contains("denied by the host"), "{error}");
    assert!(
        out.log
            .lines
            .iter()
            .any(|l| l.message.contains("not in this tool's network grant"))
    );
}

#[tokio::test]
async fn a_granted_directory_is_reachable_and_nothing_outside_it() {
    let f = fixture(EgressConfig::default()).await;
    grant(
        &f.host,
        "acme",
        json!({
            "fs_*": {"filesystem": [{"dir": "reports", "guest": "/data", "write": true}]},
            "fs_read": {"filesystem": [{"dir": "shared", "guest": "/shared"}]}
        }),
    )
    .await;
    let written = probe(
        &f.host,
        "acme",
        "fs_write",
        json!({"path": "/data/a.txt", "text": "hello"}),
    )
    .await;
    assert_eq!(written, Ok(json!(5)));
    let root = files(&f.host, "acme");
    assert_eq!(
        std::fs::read_to_string(root.join("reports/a.txt")).unwrap(),
        "hello"
    );
    assert_eq!(
        probe(&f.host, "acme", "fs_read", json!({"path": "/data/a.txt"})).await,
        Ok(json!("hello"))
    );
    assert_eq!(
        probe(&f.host, "acme", "fs_list", json!({"path": "/data"})).await,
        Ok(json!(["a.txt"]))
    );

    // Outside the grant: a secret next to the tenant root, and the host's own files.
    std::fs::write(root.join("secret.txt"), "top secret").unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("x.txt"), "outside").unwrap();
    std::os::unix::fs::symlink(outside.path().join("x.txt"), root.join("reports/link.txt"))
        .unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("reports/linkdir")).unwrap();
    std::os::unix::fs::symlink("../secret.txt", root.join("reports/up.txt")).unwrap();
    for path in [
        "/data/../secret.txt",
        "/data/../../../../etc/passwd",
        "/secret.txt",
        "/etc/passwd",
        "/data/link.txt",
        "/data/linkdir/x.txt",
        "/data/up.txt",
    ] {
        let read = probe(&f.host, "acme", "fs_read", json!({ "path": path })).await;
        assert!(read.is_err(), "{path} was readable: {read:?}");
    }
    for path in ["/data/../escape.txt", "/data/linkdir/new.txt", "/tmp/x.txt"] {
        let write = probe(
            &f.host,
            "acme",
            "fs_write",
            json!({"path": path, "text": "x"}),
        )
        .await;
        assert!(write.is_err(), "{path} was writable");
    }
    assert!(!outside.path().join("new.txt").exists());
    assert!(!root.join("escape.txt").exists());

    // Read-only means read-only.
    std::fs::create_dir_all(root.join("shared")).unwrap();
    std::fs::write(root.join("shared/s.txt"), "shared").unwrap();
    assert_eq!(
        probe(&f.host, "acme", "fs_read", json!({"path": "/shared/s.txt"})).await,
        Ok(json!("shared"))
    );
    grant(
        &f.host,
        "acme",
        json!({"fs_write": {"filesystem": [{"dir": "shared", "guest": "/shared"}]}}),
    )
    .await;
    let write = probe(
        &f.host,
        "acme",
        "fs_write",
        json!({"path": "/shared/s.txt", "text": "changed"}),
    )
    .await;
    assert!(write.is_err());
    assert_eq!(
        std::fs::read_to_string(root.join("shared/s.txt")).unwrap(),
        "shared"
    );
}

#[tokio::test]
async fn each_tenant_sees_its_own_files() {
    let f = fixture(EgressConfig::default()).await;
    let same = json!({"fs_*": {"filesystem": [{"dir": "d", "guest": "/d", "write": true}]}});
    grant(&f.host, "acme", same.clone()).await;
    grant(&f.host, "globex", same).await;
    probe(
        &f.host,
        "acme",
        "fs_write",
        json!({"path": "/d/acme.txt", "text": "a"}),
    )
    .await
    .unwrap();
    assert_eq!(
        probe(&f.host, "globex", "fs_list", json!({"path": "/d"})).await,
        Ok(json!([]))
    );
    assert_ne!(files(&f.host, "acme"), files(&f.host, "globex"));
}

/// Each open file is a descriptor of the host's, which every call and connection share.
#[tokio::test]
async fn a_call_holds_a_bounded_number_of_files_open() {
    let f = fixture(EgressConfig::default()).await;
    let rw = json!({"fs_*": {"filesystem": [{"dir": "d", "guest": "/d", "write": true}]}});
    grant(&f.host, "acme", rw).await;
    let write = json!({"path": "/d/f", "text": "x"});
    probe(&f.host, "acme", "fs_write", write).await.unwrap();
    let hold = |count: usize| json!({"path": "/d/f", "count": count});
    let out = call(&f.host, "acme", "fs_hold_open", hold(10_000)).await;
    let held = out.result.unwrap();
    assert_eq!(held["opened"], toolhost::sandbox::MAX_OPEN_FILES, "{held}");
    assert!(held["error"].is_string(), "{held}");
    let why = out.log.lines.iter().map(|l| &l.message);
    assert!(
        why.clone().any(|m| m.contains("at most 256 files open")),
        "{:?}",
        why.collect::<Vec<_>>()
    );
    // Closed with the call: the next has them all again.
    let again = call(&f.host, "acme", "fs_hold_open", hold(200)).await;
    assert_eq!(again.result.unwrap(), json!({"opened": 200}));
}

/// Empty files cost no bytes, but each takes an inode, and a disk out of inodes refuses
/// every tenant's writes: a tenant keeps at most `MAX_FILE_ENTRIES` files and directories.
#[tokio::test]
async fn a_tenant_keeps_a_bounded_number_of_files() {
    let f = fixture(EgressConfig::default()).await;
    let rw = json!({"fs_*": {"filesystem": [{"dir": "d", "guest": "/d", "write": true}]}});
    grant(&f.host, "acme", rw.clone()).await;
    let most = toolhost::sandbox::MAX_FILE_ENTRIES as usize;
    let make = |count: usize, kind: &str| json!({"dir": "/d", "count": count, "kind": kind});
    let out = call(&f.host, "acme", "fs_make_many", make(most + 10, "file")).await;
    let made = out.result.unwrap();
    // The granted directory `d`, which the host made, is one of them.
    assert_eq!(made["made"], most - 1, "{made}");
    assert!(made["error"].as_str().unwrap().contains("Quota"), "{made}");
    assert!(
        out.log.lines.iter().any(|l| l.message.contains("its most")),
        "the call's log says why"
    );
    let refused = call(&f.host, "acme", "fs_make_many", make(1, "dir")).await;
    assert_eq!(refused.result.unwrap()["made"], 0);
    // Removing one makes room for one.
    let one = std::fs::read_dir(files(&f.host, "acme").join("d"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .file_name();
    let path = format!("/d/{}", one.to_string_lossy());
    assert_eq!(
        probe(&f.host, "acme", "fs_remove", json!({ "path": path })).await,
        Ok(json!(null))
    );
    let again = call(&f.host, "acme", "fs_make_many", make(2, "dir")).await;
    assert_eq!(again.result.unwrap()["made"], 1);
    // Another tenant counts its own.
    grant(&f.host, "globex", rw).await;
    let other = call(&f.host, "globex", "fs_make_many", make(10, "file")).await;
    assert_eq!(other.result.unwrap()["made"], 10);
}

#[tokio::test]
async fn every_write_is_charged_to_the_tenants_files_quota() {
    let f = fixture(EgressConfig::default()).await;
    let policy: TenantPolicy = serde_json::from_value(json!({
        "files_quota_bytes": 1000,
        "grants": {"fs_*": {"filesystem": [{"dir": "d", "guest": "/d", "write": true}]}}
    }))
    .unwrap();
    f.host.set_policy("acme", policy).await.unwrap();
    let root = files(&f.host, "acme");
    let write = |path: &str, len: usize| json!({"path": path, "text": "x".repeat(len)});
    let size = |name: &str| std::fs::metadata(root.join("d").join(name)).map_or(0, |m| m.len());

    // The case: one call writes 900 KB under a quota of 1,000 bytes.
    let out = call(&f.host, "acme", "fs_write", write("/d/big", 900_000)).await;
    // wasi-libc reports a refused stream write as EIO; the call's log says why.
    assert!(out.result.unwrap()["error"].is_string());
    assert!(
        out.log
            .lines
            .iter()
            .any(|l| l.message.contains("files_quota_bytes")),
        "the call's log names the quota"
    );
    assert_eq!(size("big"), 0, "nothing past the quota reached the disk");

    // Within the quota, each way of writing is charged: write, append, set-size.
    assert_eq!(
        probe(&f.host, "acme", "fs_write", write("/d/a", 600)).await,
        Ok(json!(600))
    );
    assert!(
        probe(&f.host, "acme", "fs_append", write("/d/a", 500))
            .await
            .is_err()
    );
    assert_eq!(
        probe(&f.host, "acme", "fs_append", write("/d/a", 300)).await,
        Ok(json!(null))
    );
    let grow = json!({"path": "/d/sparse", "len": 1_000_000});
    let refused = probe(&f.host, "acme", "fs_set_len", grow)
        .await
        .unwrap_err();
    assert!(refused.contains("space"), "{refused}");
    assert_eq!(size("a"), 900);
    assert_eq!(size("sparse"), 0);

    // Rewriting a file in place, truncating it or removing it gives its bytes back.
    for _ in 0..5 {
        assert_eq!(
            probe(&f.host, "acme", "fs_write", write("/d/a", 950)).await,
            Ok(json!(950))
        );
    }
    let shrink = json!({"path": "/d/a", "len": 100});
    assert_eq!(
        probe(&f.host, "acme", "fs_set_len", shrink).await,
        Ok(json!(null))
    );
    assert_eq!(
        probe(&f.host, "acme", "fs_write", write("/d/b", 850)).await,
        Ok(json!(850))
    );
    assert!(
        probe(&f.host, "acme", "fs_write", write("/d/c", 100))
            .await
            .is_err()
    );
    assert_eq!(
        probe(&f.host, "acme", "fs_remove", json!({"path": "/d/b"})).await,
        Ok(json!(null))
    );
    assert_eq!(
        probe(&f.host, "acme", "fs_write", write("/d/c", 800)).await,
        Ok(json!(800))
    );

    // Bytes freed outside the sandbox are found by the recount after a refusal.
    assert!(
        probe(&f.host, "acme", "fs_write", write("/d/d", 200))
            .await
            .is_err()
    );
    std::fs::remove_file(root.join("d/c")).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(
        probe(&f.host, "acme", "fs_write", write("/d/d", 200)).await,
        Ok(json!(200))
    );

    // Another tenant has its own quota, and reading never needs one.
    grant(
        &f.host,
        "globex",
        json!({"fs_*": {"filesystem": [{"dir": "d", "guest": "/d", "write": true}]}}),
    )
    .await;
    let other = write("/d/big", 900_000);
    assert_eq!(
        probe(&f.host, "globex", "fs_write", other).await,
        Ok(json!(900_000))
    );
    assert_eq!(
        probe(&f.host, "acme", "fs_read", json!({"path": "/d/d"})).await,
        Ok(json!("x".repeat(200)))
    );
}

async fn hello_server() -> SocketAddr {
    let app = axum::Router::new().fallback(|| async { "hello from loopback" });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    addr
}

/// Each connection is a descriptor of the host's: a call holds a bounded number at once.
#[tokio::test]
async fn a_call_holds_a_bounded_number_of_connections_open() {
    let slow = axum::Router::new().fallback(|| async {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        "late"
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, slow).await.unwrap() });
    let f = fixture(EgressConfig::default()).await;
    let network = json!([format!("http://127.0.0.1:{port}")]);
    grant(&f.host, "acme", json!({"http_hold": {"network": network}})).await;
    let hold = json!({"url": format!("http://127.0.0.1:{port}/"), "count": 40});
    let out = call(&f.host, "acme", "http_hold", hold).await;
    let held = out.result.unwrap();
    let limit = toolhost::sandbox::MAX_CONNECTIONS;
    assert_eq!(held["answered"], limit, "{held}");
    let errors = held["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 40 - limit, "{held}");
    assert!(
        errors
            .iter()
            .all(|e| e == "ErrorCode::ConnectionLimitReached"),
        "{held}"
    );
    let why = out
        .log
        .lines
        .iter()
        .map(|l| l.message.as_str())
        .collect::<Vec<_>>();
    assert!(
        why.iter()
            .any(|m| m.contains("at most 32 connections open")),
        "{why:?}"
    );
}

#[tokio::test]
async fn outbound_http_reaches_granted_destinations_only() {
    let addr = hello_server().await;
    let port = addr.port();
    let f = fixture(EgressConfig::default()).await;
    let get = |url: String| {
        let host = &f.host;
        async move {
            let out = call(host, "acme", "http_get", json!({ "url": url })).await;
            out.result.unwrap()
        }
    };

    // An IP literal in the grant is an explicit grant of that address.
    grant(
        &f.host,
        "acme",
        json!({"http_get": {"network": [format!("http://127.0.0.1:{port}")]}}),
    )
    .await;
    let ok = get(format!("http://127.0.0.1:{port}/x")).await;
    assert_eq!(ok, json!({"status": 200, "body": "hello from loopback"}));
    // Another port, another scheme, another host: denied before any connection.
    for url in [
        format!("http://127.0.0.1:{}/", port.wrapping_add(1)),
        format!("https://127.0.0.1:{port}/"),
        "http://example.com/".to_owned(),
    ] {
        let denied = get(url.clone()).await;
        assert!(
            denied["error"]
                .as_str()
                .unwrap()
                .contains("not in this tool's network grant"),
            "{url}: {denied}"
        );
    }

    // A name that resolves to loopback is refused after resolution, even when granted...
    grant(
        &f.host,
        "acme",
        json!({"http_get": {"network": [format!("http://localhost:{port}"), "*.example.com"]}}),
    )
    .await;
    let rebinding = get(format!("http://localhost:{port}/")).await;
    assert!(
        rebinding["error"]
            .as_str()
            .unwrap()
            .contains("non-public address"),
        "{rebinding}"
    );
    // ...unless the operator allows that address.
    let open = fixture(EgressConfig {
        allow_private: vec!["127.0.0.0/8".parse().unwrap(), "::1".parse().unwrap()],
        ..Default::default()
    })
    .await;
    grant(
        &open.host,
        "acme",
        json!({"http_get": {"network": [format!("http://localhost:{port}")]}}),
    )
    .await;
    let out = call(
        &open.host,
        "acme",
        "http_get",
        json!({"url": format!("http://localhost:{port}/")}),
    )
    .await;
    assert_eq!(out.result.unwrap()["status"], 200);
}

/// A tool may plant a symlink inside its writable grant. A second grant whose path runs
/// through it (here a nested one) once led the host to another tenant's files: grants are now
/// opened beneath the tenant's root without following any symlink.
#[tokio::test]
async fn a_symlink_planted_in_a_grant_leads_nowhere() {
    let f = fixture(EgressConfig::default()).await;
    let grants = json!({"*": {"filesystem": [
        {"dir": "data", "guest": "/data", "write": true},
        {"dir": "data/sub", "guest": "/sub"}
    ]}});
    grant(&f.host, "acme", grants).await;
    grant(
        &f.host,
        "globex",
        json!({"*": {"filesystem": [{"dir": "d", "guest": "/d", "write": true}]}}),
    )
    .await;
    probe(
        &f.host,
        "globex",
        "fs_write",
        json!({"path": "/d/secret.txt", "text": "globex only"}),
    )
    .await
    .unwrap();
    // What a tool with the writable grant can do: `data/sub` becomes a link to globex's files.
    let acme = files(&f.host, "acme");
    std::fs::create_dir_all(acme.join("data")).unwrap();
    std::os::unix::fs::symlink(files(&f.host, "globex").join("d"), acme.join("data/sub")).unwrap();
    for (tool, args) in [
        ("fs_read", json!({"path": "/sub/secret.txt"})),
        ("fs_list", json!({"path": "/sub"})),
        ("fs_write", json!({"path": "/sub/planted.txt", "text": "x"})),
    ] {
        let out = call(&f.host, "acme", tool, args).await;
        let shown = format!("{:?}", out.result);
        assert!(
            !shown.contains("globex only") && !shown.contains("secret.txt"),
            "{tool}: {shown}"
        );
        assert_eq!(out.code(), "internal", "{tool}: {shown}");
        assert!(
            shown.contains("cannot open the granted directory data/sub"),
            "{shown}"
        );
    }
    assert!(!files(&f.host, "globex").join("d/planted.txt").exists());
}

/// A granted directory is opened once, before the guest runs, and the guest reaches it
/// through that handle: swapping the directory for a link to another tenant's files while
/// the call runs (a rename, then a symlink under the old name) changes nothing it can see.
#[tokio::test]
async fn a_grant_swapped_for_a_link_during_a_call_still_reaches_only_its_own_files() {
    let f = fixture(EgressConfig::default()).await;
    grant(
        &f.host,
        "acme",
        json!({"*": {"filesystem": [{"dir": "data", "guest": "/data"}]}}),
    )
    .await;
    let (acme, globex) = (files(&f.host, "acme"), files(&f.host, "globex"));
    for (root, text) in [(&acme, "acme's own"), (&globex, "globex only")] {
        std::fs::create_dir_all(root.join("data")).unwrap();
        std::fs::write(root.join("data/note.txt"), text).unwrap();
    }
    let started = crate::plugins::next_call_started(&f.host);
    let args = json!({"path": "/data/note.txt", "ms": 1500});
    let running = call(&f.host, "acme", "fs_read_later", args);
    let swap = async {
        started.await.unwrap();
        // Past the grant's opening (it precedes the guest), well inside the guest's 1.5 s.
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        std::fs::rename(acme.join("data"), acme.join("moved")).unwrap();
        std::os::unix::fs::symlink(globex.join("data"), acme.join("data")).unwrap();
    };
    let (out, ()) = tokio::join!(running, swap);
    let shown = format!("{:?}", out.result);
    assert!(!shown.contains("globex only"), "{shown}");
    assert_eq!(out.result.unwrap()["ok"], "acme's own");
    // The next call opens its grant anew and refuses the link.
    let out = call(
        &f.host,
        "acme",
        "fs_read",
        json!({"path": "/data/note.txt"}),
    )
    .await;
    let shown = format!("{:?}", out.result);
    assert!(!shown.contains("globex only"), "{shown}");
    assert_eq!(out.code(), "internal", "{shown}");
}

/// A hard link needs both of its paths inside the guest's grants: one to a file outside them
/// (the host's, another tenant's, or a read-only grant's into a writable one) is refused,
/// while a link within one writable grant works.
#[tokio::test]
async fn hard_links_cannot_reach_outside_a_grant() {
    let f = fixture(EgressConfig::default()).await;
    grant(
        &f.host,
        "acme",
        json!({"*": {"filesystem": [
            {"dir": "data", "guest": "/data", "write": true},
            {"dir": "docs", "guest": "/docs"}
        ]}}),
    )
    .await;
    let acme = files(&f.host, "acme");
    for dir in ["data", "docs"] {
        std::fs::create_dir_all(acme.join(dir)).unwrap();
    }
    std::fs::write(acme.join("data/mine.txt"), "mine").unwrap();
    std::fs::write(acme.join("docs/manual.txt"), "read only").unwrap();
    let link =
        |from: &str, to: &str| probe(&f.host, "acme", "fs_link", json!({"from": from, "to": to}));
    for from in [
        "/etc/passwd",
        "/data/../../globex/d/secret.txt",
        "/docs/manual.txt",
    ] {
        assert!(link(from, "/data/link.txt").await.is_err(), "{from}");
        assert!(!acme.join("data/link.txt").exists(), "{from}");
    }
    link("/data/mine.txt", "/data/also-mine.txt").await.unwrap();
    assert_eq!(
        std::fs::read_to_string(acme.join("data/also-mine.txt")).unwrap(),
        "mine"
    );
}
