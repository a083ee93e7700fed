//! One suite, both engines: every test here runs against a fresh `RedbStore` and a fresh
//! `PgStore` (a new database on `TOOLHOST_TEST_DATABASE_URL`, which `scripts/test` starts).

use std::sync::Arc;

use serde_json::json;
use toolhost_spec::access::Role;
use toolhost_spec::call::Caller;
use toolhost_spec::policy::TenantPolicy;
use toolhost_spec::spec::ToolSpec;
use toolhost_store::{
    Change, ConfigValue, DurableCall, DurableState, ENTRY_OVERHEAD_BYTES, HeldCall, KeyRecord,
    MAX_ENDED_BYTES, MAX_ENDED_KEPT, PgOptions, PgStore, RedbStore, SecretsKey, SourceKind, Store,
    StoreError, ToolEntry, now_ms,
};

/// A fresh, empty database on the test server, and its URL.
async fn fresh_database() -> String {
    let server = std::env::var("TOOLHOST_TEST_DATABASE_URL").expect(
        "TOOLHOST_TEST_DATABASE_URL names the PostgreSQL these tests use: run scripts/test, \
         which starts a private one, or start one with `scripts/postgres start DIR PORT`",
    );
    let mut name = [0u8; 6];
    getrandom::fill(&mut name).unwrap();
    let name: String = name.iter().map(|b| format!("{b:02x}")).collect();
    let name = format!("conformance_{name}");
    let admin = sqlx::PgPool::connect(&server).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&admin)
        .await
        .unwrap();
    admin.close().await;
    let mut url = url::Url::parse(&server).unwrap();
    url.set_path(&name);
    url.to_string()
}

async fn postgres(key: Option<SecretsKey>) -> Arc<dyn Store> {
    let store = PgStore::connect(&PgOptions::new(&fresh_database().await))
        .await
        .unwrap();
    Arc::new(store.with_secrets_key(key))
}

fn redb(key: Option<SecretsKey>) -> Arc<dyn Store> {
    Arc::new(RedbStore::temporary().unwrap().with_secrets_key(key))
}

/// Each test, once against each engine.
macro_rules! conformance {
    ($($test:ident),* $(,)?) => {
        mod on_redb {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                super::$test(super::redb(Some(super::key()))).await;
            })*
        }
        mod on_postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                super::$test(super::postgres(Some(super::key())).await).await;
            })*
        }
    };
}

conformance!(
    tool_entries_are_kept_by_tenant,
    tenants_with_the_same_code_read_back_one_copy_of_its_spec,
    blobs_are_collected_only_when_nothing_refers_to_them,
    cached_results_expire,
    cached_results_stay_within_the_data_quota_dropping_expired_ones_first,
    rewriting_an_expired_result_over_the_quota_counts_its_bytes_once,
    kv_and_config_are_scoped_by_tenant,
    data_is_counted_the_same_way,
    the_data_quota_holds_under_concurrent_writers,
    a_tools_key_limit_holds_under_concurrent_writers,
    tenants_keys_and_policies_round_trip,
    a_held_call_is_removed_once,
    search_vectors_round_trip,
    search_vectors_of_no_tool_are_removed,
    a_durable_call_goes_to_one_claimer,
    a_stalled_durable_call_runs_again_only_while_it_has_retries,
    ended_durable_calls_are_purged,
    a_tenant_keeps_its_newest_ended_durable_calls_as_they_end,
    a_tenant_keeps_at_most_its_bytes_of_ended_durable_calls,
    a_tenant_running_fewer_durable_calls_is_served_first,
    an_unreadable_durable_call_holds_up_no_other,
    an_mcp_session_taken_up_since_is_not_forgotten_as_idle,
    a_blob_is_touched_only_if_stored,
);

fn key() -> SecretsKey {
    SecretsKey::new([9; 32])
}

fn entry(tenant: &str, name: &str, sha: &str) -> ToolEntry {
    let mut entry = ToolEntry {
        tenant: tenant.into(),
        name: name.into(),
        current: 0,
        versions: vec![],
    };
    let spec = ToolSpec::new(name, "d", json!({"type": "object"}));
    entry.push((SourceKind::Wasm, None), spec, sha.into(), 10, 1);
    entry
}

async fn tool_entries_are_kept_by_tenant(store: Arc<dyn Store>) {
    let (a, ab) = (entry("a", "t", "sha1"), entry("ab", "t", "sha2"));
    store
        .put_tool_entries(&[a.clone(), ab.clone()])
        .await
        .unwrap();
    assert_eq!(store.tool_entries_of("a").await.unwrap(), vec![a.clone()]);
    assert_eq!(store.tool_entries().await.unwrap().entries.len(), 2);
    let mut newer = a.clone();
    newer.push(
        (SourceKind::Js, Some("runtime".into())),
        a.current().spec.clone(),
        "sha3".into(),
        5,
        2,
    );
    store.put_tool_entries(&[newer.clone()]).await.unwrap();
    assert_eq!(store.tool_entries_of("a").await.unwrap(), vec![newer]);
    assert!(store.remove_tool_entry("a", "t").await.unwrap());
    assert!(!store.remove_tool_entry("a", "t").await.unwrap());
    assert_eq!(store.tool_entries().await.unwrap().entries, vec![ab]);
}

/// Every engine keeps what is live; when it collects the rest differs (see the tests after
/// this one), so that is not asserted here.
async fn tenants_with_the_same_code_read_back_one_copy_of_its_spec(store: Arc<dyn Store>) {
    let mut other_spec = entry("c", "t", "sha1");
    let mut edited = (*other_spec.current().spec).clone();
    edited.description = "another description".into();
    other_spec.versions[0].spec = edited.into();
    let written = [
        entry("a", "t", "sha1"),
        entry("b", "t", "sha1"),
        other_spec,
        entry("d", "t", "sha2"),
    ];
    store.put_tool_entries(&written).await.unwrap();
    let read = store.tool_entries().await.unwrap().entries;
    assert_eq!(read, written, "sharing changes no spec");
    let spec = |tenant: &str| {
        let entry = read.iter().find(|e| e.tenant == tenant).unwrap();
        entry.current().spec.clone()
    };
    assert!(
        Arc::ptr_eq(&spec("a"), &spec("b")),
        "same code and spec: one copy"
    );
    assert!(
        !Arc::ptr_eq(&spec("a"), &spec("c")),
        "same code, another spec: its own"
    );
    assert!(
        !Arc::ptr_eq(&spec("a"), &spec("d")),
        "an equal spec of other code: its own"
    );
}

async fn blobs_are_collected_only_when_nothing_refers_to_them(store: Arc<dyn Store>) {
    store.put_blob("live", b"1").await.unwrap();
    store.put_blob("dead", b"2").await.unwrap();
    store.put_blob("dead", b"2").await.unwrap();
    assert_eq!(
        store.blob("dead").await.unwrap().as_deref(),
        Some(&b"2"[..])
    );
    assert!(store.has_blob("dead").await.unwrap());
    assert!(!store.has_blob("never").await.unwrap());
    store
        .put_tool_entries(&[entry("a", "t", "referenced")])
        .await
        .unwrap();
    store.put_blob("referenced", b"3").await.unwrap();
    let live = |sha: &str| sha == "live" || sha == "referenced";
    assert!(store.collect_blobs(0, &live).await.unwrap() <= 1);
    assert_eq!(
        store.blob("live").await.unwrap().as_deref(),
        Some(&b"1"[..])
    );
    assert!(store.blob("referenced").await.unwrap().is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redb_collects_a_dead_blob_at_once() {
    let store = redb(None);
    store.put_blob("dead", b"2").await.unwrap();
    assert_eq!(store.collect_blobs(0, &|_| false).await.unwrap(), 1);
    assert_eq!(store.blob("dead").await.unwrap(), None);
}

/// Makes the blobs that `condition` (SQL) selects two hours old: past the grace in which
/// another node may still be installing them.
async fn settle_blobs(pool: &sqlx::PgPool, condition: &str) {
    let two_hours_ago = (now_ms() - 2 * 3_600_000) as i64;
    sqlx::query(&format!(
        "UPDATE blobs SET created_at_ms = $1 WHERE {condition}"
    ))
    .bind(two_hours_ago)
    .execute(pool)
    .await
    .unwrap();
}

/// Another node may have stored a blob and not yet the entry that refers to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_collects_a_dead_blob_only_once_it_is_an_hour_old() {
    let url = fresh_database().await;
    let store = PgStore::connect(&PgOptions::new(&url)).await.unwrap();
    store.put_blob("dead", b"2").await.unwrap();
    store.put_blob("young", b"3").await.unwrap();
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    settle_blobs(&pool, "sha = 'dead'").await;
    assert_eq!(store.collect_blobs(0, &|_| false).await.unwrap(), 1);
    assert_eq!(store.blob("dead").await.unwrap(), None);
    assert!(store.blob("young").await.unwrap().is_some());
}

/// A record keeps the blobs it names, its JS runtime among them, also once it is not a tool
/// entry any more; one that names none readably keeps them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_keeps_every_blob_a_record_may_name() {
    let url = fresh_database().await;
    let store = PgStore::connect(&PgOptions::new(&url)).await.unwrap();
    let mut js = entry("a", "js", "wasm");
    let spec = js.current().spec.clone();
    js.push(
        (SourceKind::Js, Some("runtime".into())),
        spec,
        "source".into(),
        5,
        2,
    );
    store
        .put_tool_entries(&[entry("a", "t", "named"), js])
        .await
        .unwrap();
    for sha in ["named", "dead", "source", "runtime"] {
        store.put_blob(sha, b"1").await.unwrap();
    }
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    settle_blobs(&pool, "true").await;
    let tamper = |entry: &'static str| {
        sqlx::query("UPDATE tools SET entry = $1 WHERE name = 't'")
            .bind(entry)
            .execute(&pool)
    };
    tamper("not JSON").await.unwrap();
    assert_eq!(store.collect_blobs(1, &|_| false).await.unwrap(), 0);
    assert!(
        store.blob("dead").await.unwrap().is_some(),
        "none collected"
    );
    // Its current version is not among its versions: not an entry, but it names its blob.
    tamper(r#"{"tenant": "a", "name": "t", "current": 9, "versions": [{"component": "named"}]}"#)
        .await
        .unwrap();
    assert_eq!(store.tool_entries().await.unwrap().unreadable, 1);
    assert_eq!(store.collect_blobs(1, &|_| false).await.unwrap(), 1);
    assert_eq!(store.blob("dead").await.unwrap(), None);
    for named in ["named", "source", "runtime"] {
        assert!(store.blob(named).await.unwrap().is_some(), "{named}");
    }
}

async fn cached_results_expire(store: Arc<dyn Store>) {
    let quota = u64::MAX;
    let store = &store;
    assert_eq!(store.cache_purge(500).await.unwrap(), 0, "a fresh store");
    store
        .cache_put("t", b"k", 1_000, &json!({"a": 1}), quota)
        .await
        .unwrap();
    store
        .cache_put("t", b"old", 10, &json!(1), quota)
        .await
        .unwrap();
    let got = store.cache_get("t", b"k", 999).await.unwrap();
    assert_eq!(got, Some(json!({"a": 1})));
    assert_eq!(
        store.cache_get("u", b"k", 999).await.unwrap(),
        None,
        "per tenant"
    );
    assert_eq!(store.cache_purge(500).await.unwrap(), 1);
    assert_eq!(
        store.cache_purge(500).await.unwrap(),
        0,
        "nothing left to purge"
    );
    assert_eq!(store.cache_get("t", b"k", 1_000).await.unwrap(), None);
    assert_eq!(
        store.data_bytes("t").await.unwrap(),
        0,
        "an expired read frees its bytes"
    );
}

async fn cached_results_stay_within_the_data_quota_dropping_expired_ones_first(
    store: Arc<dyn Store>,
) {
    let value = json!("x".repeat(1000));
    // Room for two results of 1 002 bytes of JSON, each with its key, expiry and overhead.
    let (quota, later) = (2_300, now_ms() + 60_000);
    store
        .cache_put("t", b"a", 100, &value, quota)
        .await
        .unwrap();
    store
        .cache_put("t", b"b", later, &value, quota)
        .await
        .unwrap();
    // `a` has expired by now: it makes room for `c`.
    store
        .cache_put("t", b"c", later, &value, quota)
        .await
        .unwrap();
    let refused = store.cache_put("t", b"d", later, &value, quota).await;
    assert!(
        matches!(refused, Err(StoreError::Quota { .. })),
        "{refused:?}"
    );
    assert!(store.data_bytes("t").await.unwrap() <= quota);
    store
        .cache_put("u", b"d", later, &value, quota)
        .await
        .unwrap();
}

async fn kv_and_config_are_scoped_by_tenant(store: Arc<dyn Store>) {
    store
        .kv_set("a", "tool", "k", b"1", (usize::MAX, u64::MAX))
        .await
        .unwrap();
    store
        .kv_set("a", "tool", "k2", b"2", (usize::MAX, u64::MAX))
        .await
        .unwrap();
    store
        .kv_set("ab", "tool", "k", b"3", (usize::MAX, u64::MAX))
        .await
        .unwrap();
    assert_eq!(store.kv_get("b", "tool", "k").await.unwrap(), None);
    assert_eq!(
        store.kv_get("a", "tool", "k2").await.unwrap(),
        Some(b"2".to_vec())
    );
    assert_eq!(store.kv_count("a", "tool").await.unwrap(), 2);
    assert_eq!(
        store.kv_count("a", "too").await.unwrap(),
        0,
        "prefixes do not bleed"
    );
    assert!(store.kv_delete("a", "tool", "k").await.unwrap());
    assert!(!store.kv_delete("a", "tool", "k").await.unwrap());
    let secret = ConfigValue {
        value: "s3cret".into(),
        secret: true,
    };
    store.config_set("a", "TOKEN", &secret).await.unwrap();
    assert_eq!(store.config_get("a", "TOKEN").await.unwrap(), Some(secret));
    assert_eq!(store.config_get("b", "TOKEN").await.unwrap(), None);
    assert_eq!(store.config_keys("a").await.unwrap(), ["TOKEN"]);
    assert!(store.config_keys("").await.unwrap().is_empty());
    assert!(store.config_delete("a", "TOKEN").await.unwrap());
    assert_eq!(store.config_get("a", "TOKEN").await.unwrap(), None);
}

/// Both engines charge a tenant the same bytes, so a quota means the same on either.
async fn data_is_counted_the_same_way(store: Arc<dyn Store>) {
    store
        .kv_set("t", "tool", "k", b"value", (usize::MAX, u64::MAX))
        .await
        .unwrap();
    let kv = ("t\0tool\0k".len() + 5 + ENTRY_OVERHEAD_BYTES) as u64;
    assert_eq!(store.data_bytes("t").await.unwrap(), kv);
    store
        .kv_set("t", "tool", "k", b"v", (usize::MAX, u64::MAX))
        .await
        .unwrap();
    assert_eq!(
        store.data_bytes("t").await.unwrap(),
        kv - 4,
        "a smaller value frees bytes"
    );
    let later = now_ms() + 60_000;
    store
        .cache_put("t", b"key", later, &json!(12), u64::MAX)
        .await
        .unwrap();
    let cached = ("t\0key".len() + 8 + 2 + ENTRY_OVERHEAD_BYTES) as u64;
    assert_eq!(store.data_bytes("t").await.unwrap(), kv - 4 + cached);
    let refused = store
        .kv_set(
            "t",
            "tool",
            "k2",
            b"12345",
            (usize::MAX, kv - 4 + cached + 5),
        )
        .await;
    assert!(
        matches!(refused, Err(StoreError::Quota { .. })),
        "{refused:?}"
    );
}

/// `count` writers at once, each of its own key `key00`, `key01`, … of tenant `t`'s `tool`.
async fn concurrent_kv_sets(
    store: &Arc<dyn Store>,
    count: usize,
    value: &'static [u8],
    limits: (usize, u64),
) -> Vec<Result<(), StoreError>> {
    let writers: Vec<_> = (0..count)
        .map(|i| {
            let store = store.clone();
            let key = format!("key{i:02}");
            tokio::spawn(async move { store.kv_set("t", "tool", &key, value, limits).await })
        })
        .collect();
    let mut written = Vec::new();
    for writer in writers {
        written.push(writer.await.unwrap());
    }
    written
}

async fn the_data_quota_holds_under_concurrent_writers(store: Arc<dyn Store>) {
    let quota = 2_000;
    let written = concurrent_kv_sets(&store, 40, &[7; 100], (usize::MAX, quota)).await;
    let stored = written.iter().filter(|w| w.is_ok()).count() as u64;
    let used = store.data_bytes("t").await.unwrap();
    assert!(used <= quota, "{used} bytes against a quota of {quota}");
    let entry = "t\0tool\0key00".len() + 100 + ENTRY_OVERHEAD_BYTES;
    assert_eq!(used, stored * entry as u64);
    assert_eq!(store.kv_count("t", "tool").await.unwrap() as u64, stored);
}

async fn a_tools_key_limit_holds_under_concurrent_writers(store: Arc<dyn Store>) {
    let max_keys = 5;
    let limits = (max_keys, u64::MAX);
    let written = concurrent_kv_sets(&store, 20, b"v", limits).await;
    for refused in written.iter().filter_map(|w| w.as_ref().err()) {
        assert!(
            matches!(refused, StoreError::KvKeys { limit: 5 }),
            "{refused}"
        );
    }
    let held = |i: usize| written[i].is_ok();
    assert_eq!((0..20).filter(|&i| held(i)).count(), max_keys);
    assert_eq!(store.kv_count("t", "tool").await.unwrap(), max_keys);
    // A key held already may be written again, a new one not; another tool has its own.
    let (kept, refused) = ((0..20).find(|&i| held(i)), (0..20).find(|&i| !held(i)));
    let again = format!("key{:02}", kept.unwrap());
    store
        .kv_set("t", "tool", &again, b"w", limits)
        .await
        .unwrap();
    let new = format!("key{:02}", refused.unwrap());
    let refused = store.kv_set("t", "tool", &new, b"w", limits).await;
    assert!(
        matches!(refused, Err(StoreError::KvKeys { .. })),
        "{refused:?}"
    );
    store.kv_set("t", "other", "k", b"v", limits).await.unwrap();
}

async fn tenants_keys_and_policies_round_trip(store: Arc<dyn Store>) {
    assert!(store.tenant_create("acme", 1).await.unwrap());
    assert!(!store.tenant_create("acme", 2).await.unwrap());
    store.tenant_create("globex", 3).await.unwrap();
    assert_eq!(store.tenants().await.unwrap(), ["acme", "globex"]);
    let record = KeyRecord {
        id: "k1".into(),
        tenant: "acme".into(),
        created_at_ms: 5,
        role: Role::Admin,
    };
    store.key_put("hash1", &record).await.unwrap();
    assert_eq!(store.key_get("hash1").await.unwrap(), Some(record.clone()));
    assert_eq!(store.keys().await.unwrap(), vec![record]);
    assert!(store.key_revoke("k1").await.unwrap());
    assert!(!store.key_revoke("k1").await.unwrap());
    assert_eq!(store.key_get("hash1").await.unwrap(), None);
    let policy: TenantPolicy = serde_json::from_value(json!({"deny": ["x"]})).unwrap();
    assert_eq!(store.policy("acme").await.unwrap(), None);
    store.put_policy("acme", &policy).await.unwrap();
    assert_eq!(store.policy("acme").await.unwrap(), Some(policy));
}

async fn a_held_call_is_removed_once(store: Arc<dyn Store>) {
    let held = HeldCall {
        caller: Caller::tenant("acme"),
        tool: "t".into(),
        args: json!({"a": 1}),
        held_at_ms: 7,
    };
    store.held_call_put("c1", &held).await.unwrap();
    assert_eq!(store.held_calls().await.unwrap(), vec![("c1".into(), held)]);
    let removals: Vec<_> = (0..8)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.held_call_remove("c1").await.unwrap() })
        })
        .collect();
    let mut removed = 0;
    for removal in removals {
        removed += usize::from(removal.await.unwrap());
    }
    assert_eq!(removed, 1, "exactly one remover runs the call");
}

async fn search_vectors_round_trip(store: Arc<dyn Store>) {
    assert_eq!(store.search_vector("m:1").await.unwrap(), None);
    store.put_search_vector("m:1", &[1, 2, 3]).await.unwrap();
    assert_eq!(
        store.search_vector("m:1").await.unwrap(),
        Some(vec![1, 2, 3])
    );
}

async fn search_vectors_of_no_tool_are_removed(store: Arc<dyn Store>) {
    for key in ["m1/a", "m1/b", "m1/c", "m2/a", "m10/a"] {
        store.put_search_vector(key, &[1]).await.unwrap();
    }
    let keep = ["m1/a".to_owned(), "m1/c".to_owned()].into();
    assert_eq!(store.retain_search_vectors("m1/", &keep).await.unwrap(), 1);
    assert_eq!(store.search_vector("m1/b").await.unwrap(), None);
    for key in ["m1/a", "m1/c", "m2/a", "m10/a"] {
        assert!(store.search_vector(key).await.unwrap().is_some(), "{key}");
    }
    assert_eq!(store.retain_search_vectors("m1/", &keep).await.unwrap(), 0);
}

/// PostgreSQL only: what one node writes, another hears of.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_hears_of_another_nodes_changes_but_not_its_own() {
    let url = fresh_database().await;
    let a = PgStore::connect(&PgOptions::new(&url)).await.unwrap();
    let b = PgStore::connect(&PgOptions::new(&url)).await.unwrap();
    let (mut heard_by_a, mut heard_by_b) = (a.changes().unwrap(), b.changes().unwrap());
    // Give both listeners time to LISTEN before anything is sent.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    a.put_policy("acme", &TenantPolicy::default())
        .await
        .unwrap();
    a.put_tool_entries(&[entry("acme", "t", "sha")])
        .await
        .unwrap();
    a.key_revoke("nobody").await.unwrap();
    let wait = std::time::Duration::from_secs(5);
    let first = tokio::time::timeout(wait, heard_by_b.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        first,
        Change::Policy {
            tenant: "acme".into()
        }
    );
    let second = tokio::time::timeout(wait, heard_by_b.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        second,
        Change::Tools {
            tenant: "acme".into()
        }
    );
    // A revocation that removed nothing changed nothing, so it is not announced.
    b.put_policy("globex", &TenantPolicy::default())
        .await
        .unwrap();
    let third = tokio::time::timeout(wait, heard_by_a.recv())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        third,
        Change::Policy {
            tenant: "globex".into()
        },
        "a hears b's change, not its own"
    );
}

/// PostgreSQL only: nodes starting on the same database apply each migration once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_starting_together_migrate_once() {
    let url = fresh_database().await;
    let nodes: Vec<_> = (0..3)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { PgStore::connect(&PgOptions::new(&url)).await.map(drop) })
        })
        .collect();
    for node in nodes {
        node.await.unwrap().unwrap();
    }
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(&pool)
        .await
        .unwrap();
    let migrations = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"));
    assert_eq!(applied, migrations.unwrap().count() as i64, "each once");
}

fn durable(id: &str, retries_left: u32, created_at_ms: u64) -> DurableCall {
    DurableCall {
        id: id.into(),
        caller: Caller::tenant("acme"),
        tool: "t".into(),
        args: json!({"n": 1}),
        retries_left,
        attempts: 0,
        created_at_ms,
        state: DurableState::Queued,
    }
}

async fn a_blob_is_touched_only_if_stored(store: Arc<dyn Store>) {
    assert!(!store.touch_blob("absent").await.unwrap());
    assert!(!store.has_blob("absent").await.unwrap());
    store.put_blob("present", b"bytes").await.unwrap();
    assert!(store.touch_blob("present").await.unwrap());
    assert!(store.has_blob("present").await.unwrap());
}

/// Node a opened a session at 10, node b took it up at 20: a's idle close (it kept it at 10)
/// leaves it for b; b's removes it. (redb is one node: it keeps no sessions.)
async fn an_mcp_session_taken_up_since_is_not_forgotten_as_idle(store: Arc<dyn Store>) {
    let now = now_ms();
    store.put_mcp_session("s", "acme", "{}", now).await.unwrap();
    store
        .put_mcp_session("s", "acme", "{}", now + 10)
        .await
        .unwrap();
    store
        .remove_mcp_session_untouched_since("s", now)
        .await
        .unwrap();
    let kept = store.mcp_session("s").await.unwrap();
    let shared = store.changes().is_some();
    assert_eq!(kept.is_some(), shared, "kept for the node that took it up");
    store
        .remove_mcp_session_untouched_since("s", now + 10)
        .await
        .unwrap();
    assert_eq!(store.mcp_session("s").await.unwrap(), None);
}

/// A record too deep to read back (written, since writing has no depth limit) is passed
/// over: it heads the queue (oldest, its tenant running nothing), yet another's call runs.
async fn an_unreadable_durable_call_holds_up_no_other(store: Arc<dyn Store>) {
    let mut deep = durable("deep", 0, 1);
    deep.caller.tenant = "mallory".into();
    for _ in 0..130 {
        deep.caller.data = json!([deep.caller.data]);
    }
    store.durable_put(&deep).await.unwrap();
    store.durable_put(&durable("fine", 0, 2)).await.unwrap();
    for attempt in 0..3 {
        let claimed = store.durable_claim("n", 1_000, 60_000).await.unwrap();
        let expected = (attempt == 0).then_some("fine");
        assert_eq!(claimed.as_ref().map(|c| c.id.as_str()), expected);
    }
}

async fn a_durable_call_goes_to_one_claimer(store: Arc<dyn Store>) {
    store.durable_put(&durable("c1", 0, 1)).await.unwrap();
    assert_eq!(store.durable_unfinished("acme").await.unwrap(), 1);
    let claims: Vec<_> = (0..8)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move {
                let node = format!("node{i}");
                store
                    .durable_claim(&node, 1_000, 60_000)
                    .await
                    .unwrap()
                    .map(|_| node)
            })
        })
        .collect();
    let mut winners = Vec::new();
    for claim in claims {
        winners.extend(claim.await.unwrap());
    }
    assert_eq!(winners.len(), 1, "{winners:?}");
    let winner = &winners[0];
    assert!(
        !store
            .durable_renew("c1", "someone-else", 90_000)
            .await
            .unwrap()
    );
    assert!(store.durable_renew("c1", winner, 90_000).await.unwrap());
    assert!(
        !store
            .durable_finish("c1", "someone-else", &json!(1))
            .await
            .unwrap()
    );
    assert!(
        store
            .durable_finish("c1", winner, &json!({"ok": true}))
            .await
            .unwrap()
    );
    assert!(
        !store.durable_finish("c1", winner, &json!(2)).await.unwrap(),
        "once"
    );
    let ended = store.durable_get("c1").await.unwrap().unwrap();
    assert!(
        matches!(&ended.state, DurableState::Done { outcome, .. } if outcome == &json!({"ok": true})),
        "{ended:?}"
    );
    assert_eq!(ended.attempts, 1);
    assert_eq!(store.durable_unfinished("acme").await.unwrap(), 0);
    assert_eq!(store.durable_claim("n", 2_000, 60_000).await.unwrap(), None);
}

/// In real time: PostgreSQL keeps leases in the database's clock, whatever the node says.
async fn a_stalled_durable_call_runs_again_only_while_it_has_retries(store: Arc<dyn Store>) {
    const LEASE: u64 = 300;
    let pause = || tokio::time::sleep(std::time::Duration::from_millis(LEASE + 200));
    let claim = |node: &'static str| {
        let store = store.clone();
        async move {
            let now = now_ms();
            store.durable_claim(node, now, now + LEASE).await.unwrap()
        }
    };
    store
        .durable_put(&durable("idempotent", 1, 1))
        .await
        .unwrap();
    store.durable_put(&durable("once", 0, 2)).await.unwrap();
    let first = claim("a").await.unwrap();
    let second = claim("a").await.unwrap();
    assert_eq!(
        (first.id.as_str(), second.id.as_str()),
        ("idempotent", "once")
    );
    assert_eq!(claim("b").await, None, "leases hold");
    // Node a stops renewing: both leases run out.
    pause().await;
    let again = claim("b").await.unwrap();
    assert_eq!(again.id, "idempotent");
    assert_eq!((again.attempts, again.retries_left), (2, 0));
    assert_eq!(claim("b").await, None);
    let lost = store.durable_get("once").await.unwrap().unwrap();
    assert!(
        matches!(&lost.state, DurableState::Lost { node, .. } if node == "a"),
        "{lost:?}"
    );
    assert!(
        !store
            .durable_finish("idempotent", "a", &json!(1))
            .await
            .unwrap(),
        "a lost it"
    );
    assert!(
        store
            .durable_finish("idempotent", "b", &json!(2))
            .await
            .unwrap()
    );
    // Stalled again past its retries, a call ends lost too.
    store.durable_put(&durable("twice", 0, 3)).await.unwrap();
    claim("b").await.unwrap();
    pause().await;
    assert_eq!(claim("c").await, None);
    let lost = store.durable_get("twice").await.unwrap().unwrap();
    assert_eq!(lost.state.status(), "lost");
}

async fn ended_durable_calls_are_purged(store: Arc<dyn Store>) {
    store.durable_put(&durable("ended", 0, 1)).await.unwrap();
    store.durable_put(&durable("waiting", 0, 2)).await.unwrap();
    store.durable_claim("a", 10, 20).await.unwrap().unwrap();
    assert!(store.durable_finish("ended", "a", &json!(1)).await.unwrap());
    assert_eq!(store.durable_purge(now_ms() + 1).await.unwrap(), 1);
    assert_eq!(store.durable_get("ended").await.unwrap(), None);
    assert!(store.durable_get("waiting").await.unwrap().is_some());
}

/// Queues `call`, claims it (the only one waiting) on node `a`, and finishes it with `outcome`.
async fn run_to_its_end(store: &Arc<dyn Store>, call: DurableCall, outcome: serde_json::Value) {
    store.durable_put(&call).await.unwrap();
    let claimed = store.durable_claim("a", 10, u64::MAX).await.unwrap();
    assert_eq!(claimed.map(|c| c.id), Some(call.id.clone()));
    assert!(store.durable_finish(&call.id, "a", &outcome).await.unwrap());
}

/// Without a purge: a tenant whose calls end fast must not pile up their outcomes until the
/// next one.
async fn a_tenant_keeps_its_newest_ended_durable_calls_as_they_end(store: Arc<dyn Store>) {
    let calls = MAX_ENDED_KEPT + 5;
    let id = |n: usize| format!("c{n:05}");
    for n in 0..calls {
        run_to_its_end(&store, durable(&id(n), 0, n as u64), json!(n)).await;
    }
    let mut kept = 0;
    for n in 0..calls {
        kept += usize::from(store.durable_get(&id(n)).await.unwrap().is_some());
    }
    assert_eq!(kept, MAX_ENDED_KEPT);
    assert!(store.durable_get(&id(calls - 1)).await.unwrap().is_some());
}

/// A tenant's ended calls hold at most MAX_ENDED_BYTES as stored (outcomes of megabytes
/// would otherwise keep a gigabyte per tenant for a day): its oldest go, no other tenant's.
async fn a_tenant_keeps_at_most_its_bytes_of_ended_durable_calls(store: Arc<dyn Store>) {
    let mut other = durable("g", 0, 0);
    other.caller = Caller::tenant("globex");
    run_to_its_end(&store, other, json!("small")).await;
    // Random, so that PostgreSQL's compression cannot shrink it: 1 MiB of hex each.
    let mut noise = vec![0u8; 512 << 10];
    let calls = (MAX_ENDED_BYTES >> 20) as usize + 6;
    let id = |n: usize| format!("c{n:03}");
    for n in 0..calls {
        getrandom::fill(&mut noise).unwrap();
        let outcome = json!(toolhost_spec::digest::hex(&noise));
        run_to_its_end(&store, durable(&id(n), 0, n as u64), outcome).await;
    }
    let mut kept = Vec::new();
    for n in 0..calls {
        if store.durable_get(&id(n)).await.unwrap().is_some() {
            kept.push(n);
        }
    }
    // The newest, as many as fit: the first six or so are gone.
    assert!((calls - 8..calls).contains(&kept.len()), "{kept:?}");
    assert_eq!(kept, (calls - kept.len()..calls).collect::<Vec<_>>());
    assert!(
        store.durable_get("g").await.unwrap().is_some(),
        "globex's stays"
    );
}

/// PostgreSQL only: a tenant's entries are locked against every node for one install, and
/// only that tenant's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_entries_are_locked_across_nodes_for_one_change() {
    let url = fresh_database().await;
    let a = PgStore::connect(&PgOptions::new(&url)).await.unwrap();
    let b = PgStore::connect(&PgOptions::new(&url)).await.unwrap();
    let held = a.lock_entries("acme").await.unwrap();
    let wait = std::time::Duration::from_millis(300);
    let blocked = tokio::time::timeout(wait, b.lock_entries("acme")).await;
    assert!(blocked.is_err(), "b waits while a holds acme's entries");
    let other = tokio::time::timeout(wait, b.lock_entries("globex")).await;
    assert!(other.is_ok(), "another tenant's entries are not held");
    drop(other);
    drop(held);
    let taken = tokio::time::timeout(std::time::Duration::from_secs(5), b.lock_entries("acme"));
    assert!(taken.await.is_ok(), "released when a's lock is dropped");
}

/// PostgreSQL only: a database counted before entries cost their overhead is counted again
/// as it migrates, by the rule the store charges by.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_counted_without_the_entry_overhead_is_counted_again() {
    let url = fresh_database().await;
    let store = PgStore::connect(&PgOptions::new(&url)).await.unwrap();
    store
        .kv_set("t", "tool", "k", b"value", (usize::MAX, u64::MAX))
        .await
        .unwrap();
    let later = now_ms() + 60_000;
    store
        .cache_put("t", b"key", later, &json!(12), u64::MAX)
        .await
        .unwrap();
    let counted = store.data_bytes("t").await.unwrap();
    // As the older version left it: no overhead counted, and migration 4 not applied.
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let overhead = 2 * ENTRY_OVERHEAD_BYTES as i64;
    sqlx::query("UPDATE usage SET bytes = bytes - $1")
        .bind(overhead)
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = 4")
        .execute(&pool)
        .await
        .unwrap();
    drop(store);
    let store = PgStore::connect(&PgOptions::new(&url)).await.unwrap();
    assert_eq!(store.data_bytes("t").await.unwrap(), counted);
}

/// PostgreSQL only: every write of a tenant's entries moves its revision on, whoever makes it
/// (a node's re-sync reads again only those tenants), and no other tenant's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_tool_revision_moves_with_every_write_of_its_entries() {
    let url = fresh_database().await;
    let store = PgStore::connect(&PgOptions::new(&url)).await.unwrap();
    assert!(store.tool_revisions().await.unwrap().is_empty());
    let (a, b) = (entry("a", "t", "sha1"), entry("b", "t", "sha2"));
    store.put_tool_entries(&[a.clone(), b]).await.unwrap();
    let mut before = store.tool_revisions().await.unwrap();
    assert_eq!(before.len(), 2);
    let mut moved = async || {
        let after = store.tool_revisions().await.unwrap();
        let mut moved: Vec<String> = (after.iter())
            .filter(|&(tenant, revision)| before.get(tenant) != Some(revision))
            .map(|(tenant, _)| tenant.clone())
            .collect();
        moved.sort();
        before = after;
        moved
    };
    store.put_tool_entries(&[a]).await.unwrap();
    assert_eq!(moved().await, ["a"]);
    assert!(store.remove_tool_entry("b", "t").await.unwrap());
    assert_eq!(moved().await, ["b"], "a removal moves it too");
    // A write that sends no notice (another version's node, an operator's SQL) moves it too.
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    sqlx::query("DELETE FROM tools WHERE tenant = 'a'")
        .execute(&pool)
        .await
        .unwrap();
    assert_eq!(moved().await, ["a"]);
}

/// A write that replaces an expired result, when the quota makes it purge expired ones first,
/// gives the old result's bytes back once, not twice.
async fn rewriting_an_expired_result_over_the_quota_counts_its_bytes_once(store: Arc<dyn Store>) {
    let (value, larger) = (json!("x".repeat(1000)), json!("x".repeat(1005)));
    let later = now_ms() + 60_000;
    store
        .cache_put("t", b"k", 100, &value, u64::MAX)
        .await
        .unwrap();
    store
        .cache_put("t", b"b", later, &value, u64::MAX)
        .await
        .unwrap();
    let one = store.data_bytes("t").await.unwrap() / 2;
    // Growing `k` by 5 bytes passes a quota 2 over what is held: the expired results are
    // purged (`k` with them), and then `k` is a whole new result, which does not fit.
    let refused = store
        .cache_put("t", b"k", later, &larger, 2 * one + 2)
        .await;
    assert!(
        matches!(refused, Err(StoreError::Quota { .. })),
        "{refused:?}"
    );
    assert_eq!(
        store.data_bytes("t").await.unwrap(),
        one,
        "`b` alone, counted once"
    );
}

/// One tenant's queue of old calls does not hold every worker while another's call waits.
async fn a_tenant_running_fewer_durable_calls_is_served_first(store: Arc<dyn Store>) {
    for (i, id) in ["a1", "a2", "a3"].into_iter().enumerate() {
        store
            .durable_put(&durable(id, 0, i as u64 + 1))
            .await
            .unwrap();
    }
    let mut newer = durable("g1", 0, 10);
    newer.caller = Caller::tenant("globex");
    store.durable_put(&newer).await.unwrap();
    let now = now_ms();
    let claim = async || {
        store
            .durable_claim("n", now, now + 60_000)
            .await
            .unwrap()
            .unwrap()
            .id
    };
    assert_eq!(claim().await, "a1", "the oldest, when no tenant runs any");
    assert_eq!(claim().await, "g1", "globex runs none, acme one");
    assert_eq!(claim().await, "a2");
}
