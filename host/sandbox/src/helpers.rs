//! What a tool may ask of the host: the host side of the WIT `helpers` interface, shared by
//! Wasm and native tools so both get the same behaviour and the same caps.

use std::sync::{Arc, Mutex, MutexGuard};

use toolhost_spec::call::{CallLog, Level, LogLine};

use crate::redact::Redactor;
use toolhost_store::Store;

/// Each of: helper log lines (all together), stdout, stderr.
pub const MAX_LOG_BYTES: usize = 64 * 1024;
/// What a helper log line costs beside its text, counted against [`MAX_LOG_BYTES`]: its
/// record (and its JSON) is not free, so a flood of empty lines stops at the cap too.
pub const LOG_LINE_OVERHEAD_BYTES: usize = 32;
/// The longest KV key.
pub const MAX_KV_KEY_BYTES: usize = 256;
/// The largest KV value.
pub const MAX_KV_VALUE_BYTES: usize = 64 * 1024;
/// The most KV keys one tool of one tenant may hold.
pub const MAX_KV_KEYS: usize = 1000;

/// One call's handle on the host. Cheap to clone; every clone serves the same call.
#[derive(Clone, Default)]
pub struct Helpers {
    log: Arc<Mutex<LogBuffer>>,
    /// Absent outside a tool call (for example, while a component lists its tools).
    scope: Option<Arc<Scope>>,
}

/// What a call's helpers may reach: this tenant's and this tool's data only.
struct Scope {
    store: Arc<dyn Store>,
    tenant: String,
    tool: String,
    config_keys: Vec<String>,
    /// Bytes the tenant's data may hold in the store (its policy's `data_quota_bytes`).
    data_quota: u64,
}

/// A helper call the host refused or could not serve; the message is for the tool.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HelperError(pub String);

#[derive(Default)]
struct LogBuffer {
    lines: Vec<LogLine>,
    line_bytes: usize,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    dropped_bytes: u64,
    /// The secret values this call read, to redact from everything it reports: shared, so a
    /// long search runs outside this lock.
    secrets: Arc<Redactor>,
}

#[derive(Clone, Copy)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

impl Helpers {
    /// The helpers of one call of `tool` for `tenant`, whose data may hold `data_quota`
    /// bytes.
    pub fn for_call(
        store: Arc<dyn Store>,
        tenant: &str,
        tool: &str,
        config_keys: &[String],
        data_quota: u64,
    ) -> Self {
        let scope = Scope {
            store,
            tenant: tenant.to_owned(),
            tool: tool.to_owned(),
            config_keys: config_keys.to_vec(),
            data_quota,
        };
        Helpers {
            log: Arc::default(),
            scope: Some(Arc::new(scope)),
        }
    }

    fn scope(&self) -> Result<&Scope, HelperError> {
        self.scope
            .as_deref()
            .ok_or_else(|| HelperError("helpers are available only during a tool call".into()))
    }

    /// The tenant whose call these helpers serve; none outside a call.
    pub fn tenant(&self) -> Option<&str> {
        self.scope.as_deref().map(|scope| scope.tenant.as_str())
    }

    /// This tool's value for `key`, for this tenant.
    pub async fn kv_get(&self, key: &str) -> Result<Option<Vec<u8>>, HelperError> {
        let scope = self.scope()?;
        check_kv_key(key)?;
        scope
            .store
            .kv_get(&scope.tenant, &scope.tool, key)
            .await
            .map_err(storage)
    }

    /// Sets a KV value, within the key, value and count limits and the tenant's data quota.
    pub async fn kv_set(&self, key: &str, value: &[u8]) -> Result<(), HelperError> {
        let scope = self.scope()?;
        check_kv_key(key)?;
        if value.len() > MAX_KV_VALUE_BYTES {
            return Err(HelperError(format!(
                "kv: the value is {} bytes; the limit is {MAX_KV_VALUE_BYTES}",
                value.len()
            )));
        }
        scope
            .store
            .kv_set(
                &scope.tenant,
                &scope.tool,
                key,
                value,
                (MAX_KV_KEYS, scope.data_quota),
            )
            .await
            .map_err(storage)
    }

    /// Whether the key existed.
    pub async fn kv_delete(&self, key: &str) -> Result<bool, HelperError> {
        let scope = self.scope()?;
        check_kv_key(key)?;
        scope
            .store
            .kv_delete(&scope.tenant, &scope.tool, key)
            .await
            .map_err(storage)
    }

    /// The tenant's configuration value for `key`, if the tool declared that key.
    pub async fn config_get(&self, key: &str) -> Result<Option<String>, HelperError> {
        let scope = self.scope()?;
        if !scope.config_keys.iter().any(|k| k == key) {
            return Err(HelperError(format!(
                "config: `{}` is not among the keys this tool declared",
                key.chars().take(128).collect::<String>()
            )));
        }
        let value = scope
            .store
            .config_get(&scope.tenant, key)
            .await
            .map_err(storage)?;
        Ok(value.map(|v| {
            if v.secret {
                // Once per value: a guest reading its secret in a loop adds nothing.
                Arc::make_mut(&mut self.buffer().secrets).add(&v.value);
            }
            v.value
        }))
    }

    /// `text` with every secret this call read replaced.
    pub fn redact(&self, text: &str) -> String {
        let secrets = self.buffer().secrets.clone();
        secrets.redact(text)
    }

    /// Appends a line to the call's log; past the cap it is counted, not kept.
    pub fn log(&self, level: Level, message: &str) {
        let mut log = self.buffer();
        let cost = LOG_LINE_OVERHEAD_BYTES + message.len();
        if log.line_bytes + cost > MAX_LOG_BYTES {
            log.dropped_bytes += message.len() as u64;
            return;
        }
        log.line_bytes += cost;
        log.lines.push(LogLine {
            level,
            message: message.to_owned(),
        });
    }

    /// Appends the guest's output, keeping the first [`MAX_LOG_BYTES`] of each stream.
    pub(crate) fn write(&self, stream: Stream, bytes: &[u8]) {
        let mut log = self.buffer();
        let log = &mut *log;
        let sink = match stream {
            Stream::Stdout => &mut log.stdout,
            Stream::Stderr => &mut log.stderr,
        };
        let kept = bytes.len().min(MAX_LOG_BYTES - sink.len());
        sink.extend_from_slice(&bytes[..kept]);
        log.dropped_bytes += (bytes.len() - kept) as u64;
    }

    /// The log as it stands, secrets redacted.
    pub fn snapshot(&self) -> CallLog {
        let log = self.buffer();
        let clean = |text: &str| log.secrets.redact(text);
        CallLog {
            lines: log
                .lines
                .iter()
                .map(|line| LogLine {
                    level: line.level,
                    message: clean(&line.message),
                })
                .collect(),
            stdout: clean(&String::from_utf8_lossy(&log.stdout)),
            stderr: clean(&String::from_utf8_lossy(&log.stderr)),
            dropped_bytes: log.dropped_bytes,
        }
    }

    fn buffer(&self) -> MutexGuard<'_, LogBuffer> {
        // A panic while holding this lock cannot leave the buffer inconsistent.
        self.log
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn check_kv_key(key: &str) -> Result<(), HelperError> {
    if (1..=MAX_KV_KEY_BYTES).contains(&key.len()) {
        Ok(())
    } else {
        Err(HelperError(format!(
            "kv: a key is 1 to {MAX_KV_KEY_BYTES} bytes, got {}",
            key.len()
        )))
    }
}

fn storage(error: toolhost_store::StoreError) -> HelperError {
    use toolhost_store::StoreError::{KvKeys, Quota};
    if let Quota { .. } | KvKeys { .. } = error {
        return HelperError(format!("kv: {error}"));
    }
    tracing::error!(%error, "helper storage failure");
    HelperError("storage is unavailable; try again".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use toolhost_store::{ConfigValue, RedbStore};

    fn helpers(tool: &str) -> (Arc<dyn Store>, Helpers) {
        let store: Arc<dyn Store> = Arc::new(RedbStore::temporary().unwrap());
        let helpers = Helpers::for_call(
            store.clone(),
            "acme",
            tool,
            &["TOKEN".into(), "REGION".into()],
            100 << 20,
        );
        (store, helpers)
    }

    #[tokio::test]
    async fn kv_enforces_its_quotas() {
        let (_, h) = helpers("t");
        assert!(h.kv_set("", b"x").await.unwrap_err().0.contains("1 to 256"));
        assert!(h.kv_set(&"k".repeat(257), b"x").await.is_err());
        let big = vec![0; MAX_KV_VALUE_BYTES + 1];
        assert!(h.kv_set("k", &big).await.unwrap_err().0.contains("65536"));
        for i in 0..MAX_KV_KEYS {
            h.kv_set(&format!("k{i}"), b"v").await.unwrap();
        }
        assert!(
            h.kv_set("one-more", b"v")
                .await
                .unwrap_err()
                .0
                .contains("1000 keys")
        );
        h.kv_set("k0", b"overwrite is fine").await.unwrap();
        assert_eq!(
            h.kv_get("k0").await.unwrap().as_deref(),
            Some(&b"overwrite is fine"[..])
        );
        assert!(h.kv_delete("k0").await.unwrap());
        h.kv_set("one-more", b"v").await.unwrap();
    }

    #[tokio::test]
    async fn kv_writes_stop_at_the_tenants_data_quota_and_deletes_give_bytes_back() {
        let store: Arc<dyn Store> = Arc::new(RedbStore::temporary().unwrap());
        let quota = 3 * MAX_KV_VALUE_BYTES as u64;
        let one = Helpers::for_call(store.clone(), "acme", "one", &[], quota);
        let two = Helpers::for_call(store.clone(), "acme", "two", &[], quota);
        let other = Helpers::for_call(store.clone(), "globex", "one", &[], quota);
        let value = vec![7; MAX_KV_VALUE_BYTES];
        one.kv_set("a", &value).await.unwrap();
        one.kv_set("b", &value).await.unwrap();
        // The quota is the tenant's, across its tools.
        let refused = two.kv_set("c", &value).await.unwrap_err().0;
        assert!(refused.contains("data_quota_bytes"), "{refused}");
        // Overwriting in place adds nothing; another tenant has its own quota.
        one.kv_set("a", &value).await.unwrap();
        other.kv_set("c", &value).await.unwrap();
        assert!(two.kv_delete("c").await.is_ok_and(|existed| !existed));
        assert!(one.kv_delete("b").await.unwrap());
        two.kv_set("c", &value).await.unwrap();
        let held = store.data_bytes("acme").await.unwrap();
        let entry = MAX_KV_VALUE_BYTES + 1 + 3 + 4 + 2 + toolhost_store::ENTRY_OVERHEAD_BYTES;
        assert_eq!(held, 2 * entry as u64);
    }

    #[tokio::test]
    async fn config_reads_only_declared_keys_and_redacts_secrets() {
        let (store, h) = helpers("t");
        let set = async |k: &str, v: &str, secret| {
            store
                .config_set(
                    "acme",
                    k,
                    &ConfigValue {
                        value: v.into(),
                        secret,
                    },
                )
                .await
                .unwrap()
        };
        set("TOKEN", "hunter2", true).await;
        set("REGION", "eu-north", false).await;
        set("OTHER", "x", false).await;
        assert!(
            h.config_get("OTHER")
                .await
                .unwrap_err()
                .0
                .contains("not among")
        );
        assert_eq!(
            h.config_get("REGION").await.unwrap().as_deref(),
            Some("eu-north")
        );
        h.log(Level::Info, "token is hunter2 in eu-north");
        assert_eq!(
            h.snapshot().lines[0].message,
            "token is hunter2 in eu-north"
        );
        assert_eq!(
            h.config_get("TOKEN").await.unwrap().as_deref(),
            Some("hunter2")
        );
        h.write(Stream::Stderr, b"leak: hunter2");
        let log = h.snapshot();
        assert_eq!(log.lines[0].message, "token is [redacted] in eu-north");
        assert_eq!(log.stderr, "leak: [redacted]");
        assert_eq!(
            h.redact("error: hunter2 rejected"),
            "error: [redacted] rejected"
        );
        let forms = h.buffer().secrets.forms();
        for _ in 0..100 {
            h.config_get("TOKEN").await.unwrap();
        }
        assert_eq!(
            h.buffer().secrets.forms(),
            forms,
            "one read's forms, not 101"
        );
    }

    #[tokio::test]
    async fn outside_a_call_there_is_no_scope() {
        assert!(Helpers::default().kv_get("k").await.is_err());
        assert!(Helpers::default().config_get("TOKEN").await.is_err());
    }

    #[tokio::test]
    async fn output_is_capped_and_the_rest_counted() {
        let helpers = Helpers::default();
        helpers.write(Stream::Stdout, &vec![b'x'; MAX_LOG_BYTES - 10]);
        helpers.write(Stream::Stdout, &[b'y'; 25]);
        helpers.write(Stream::Stderr, b"err");
        let log = helpers.snapshot();
        assert_eq!(log.stdout.len(), MAX_LOG_BYTES);
        assert!(log.stdout.ends_with("yyyyyyyyyy"));
        assert_eq!(log.stderr, "err");
        assert_eq!(log.dropped_bytes, 15);
    }

    #[tokio::test]
    async fn log_lines_are_capped_in_total() {
        let helpers = Helpers::default();
        let line = "z".repeat(1000);
        for _ in 0..100 {
            helpers.log(Level::Info, &line);
        }
        let log = helpers.snapshot();
        assert_eq!(
            log.lines.len(),
            MAX_LOG_BYTES / (1000 + LOG_LINE_OVERHEAD_BYTES)
        );
        assert_eq!(log.dropped_bytes, (100 - log.lines.len() as u64) * 1000);
    }

    #[tokio::test]
    async fn empty_log_lines_stop_at_the_cap_too() {
        let helpers = Helpers::default();
        for _ in 0..100_000 {
            helpers.log(Level::Info, "");
        }
        let kept = helpers.snapshot().lines.len();
        assert_eq!(kept, MAX_LOG_BYTES / LOG_LINE_OVERHEAD_BYTES);
    }
}
