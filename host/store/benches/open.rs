//! A restart with large blobs stored: `cargo bench -p toolhost-store --bench open`.
//!
//! A store holding 20 blobs of 12 MB (a ComponentizeJS component's size) is opened and its
//! blobs listed for collection, as `Host::open` does. The peer, in the same run: the same
//! store as a version before the list of blob shas left it, whose first open builds the list
//! by reading every blob, as every open did before. Run as root, the page cache is dropped
//! before each open (a restart after a reboot); otherwise the rows say they are warm.

use std::path::Path;
use std::time::{Duration, Instant};

use toolhost_store::{RedbStore, Store};

const BLOBS: usize = 20;
const BLOB_BYTES: usize = 12 << 20;
const ROUNDS: usize = 5;

/// Whether the kernel's page cache could be dropped.
fn drop_page_cache() -> bool {
    let synced = std::process::Command::new("sync")
        .status()
        .is_ok_and(|s| s.success());
    synced && std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok()
}

/// Opens the store and lists its blobs as collection at open does; the time both took.
async fn open_and_list(dir: &Path) -> (Duration, bool) {
    let cold = drop_page_cache();
    let start = Instant::now();
    let store = RedbStore::open(dir, 16 << 20).unwrap();
    let collected = store.collect_blobs(0, &|_| true).await.unwrap();
    let took = start.elapsed();
    assert_eq!(collected, 0, "every blob is live");
    (took, cold)
}

/// Removes the list of blob shas, as a store written before it was kept lacks it.
fn forget_blob_shas(dir: &Path) {
    let db = redb::Database::open(dir.join(toolhost_store::STORE_FILE)).unwrap();
    let tx = db.begin_write().unwrap();
    let table: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("blob_shas");
    assert!(tx.delete_table(table).unwrap(), "the store lists its blobs");
    tx.commit().unwrap();
}

fn main() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    runtime.block_on(async {
        let store = RedbStore::open(dir.path(), 16 << 20).unwrap();
        for i in 0..BLOBS {
            let mut blob = vec![0u8; BLOB_BYTES];
            blob[..8].copy_from_slice(&(i as u64).to_le_bytes());
            store
                .put_blob(&format!("blob-{i:02}"), &blob)
                .await
                .unwrap();
        }
    });
    let (mut listed, mut unlisted, mut cold) = (Vec::new(), Vec::new(), true);
    for _ in 0..ROUNDS {
        let (took, was_cold) = runtime.block_on(open_and_list(dir.path()));
        listed.push(took);
        forget_blob_shas(dir.path());
        let (took, was_cold_too) = runtime.block_on(open_and_list(dir.path()));
        unlisted.push(took);
        cold &= was_cold && was_cold_too;
    }
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_secs_f64() * 1e3
    };
    let cache = if cold {
        "page cache dropped"
    } else {
        "page cache warm (not root)"
    };
    println!(
        "open + list blobs, {BLOBS} blobs of {} MB, median of {ROUNDS}, {cache}",
        BLOB_BYTES >> 20
    );
    println!(
        "{:<58} {:>9.2} ms",
        "this version (the sha list)",
        median(listed)
    );
    println!(
        "{:<58} {:>9.2} ms",
        "peer: first open of a store without it (every blob read)",
        median(unlisted)
    );
}
