//! Tenants and what belongs to each beside its tools: configuration values and secrets, API
//! keys, and its policy (cached in memory; the host's default for a tenant without one).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use toolhost_sandbox::places::Places;
use toolhost_spec::access::Role;
use toolhost_spec::digest::{hex, sha256_hex};
use toolhost_spec::policy::TenantPolicy;
use toolhost_spec::spec::is_valid_config_key;
use toolhost_store::{Change, ConfigValue, KeyRecord, Store, StoreError, now_ms};

use crate::config::{MAX_CONFIG_KEYS, MAX_CONFIG_VALUE_BYTES};
use crate::error::ManageError;
use crate::registry::is_valid_tenant;

/// A freshly created API key: `secret` is shown once and never stored.
#[derive(Debug, Clone, Serialize)]
pub struct NewKey {
    /// The key itself, for the `Authorization: Bearer` header.
    pub secret: String,
    /// What is stored of it.
    #[serde(flatten)]
    pub record: KeyRecord,
}

pub(crate) struct Tenants {
    store: Arc<dyn Store>,
    /// Tenants' policies as last read or set; `default_policy` for tenants without one.
    policies: Mutex<HashMap<String, Arc<TenantPolicy>>>,
    default_policy: Arc<TenantPolicy>,
    /// Keys by sha256 as last read, unknown ones too (`None`), at most [`KEYS_CACHED`].
    keys: quick_cache::sync::Cache<String, Option<KeyRecord>>,
    /// Bumped whenever what memory holds is forgotten or replaced: a read that began before
    /// is not cached (it could put back a revoked key or an old policy).
    forgotten: AtomicU64,
    /// Configuration writes at once, one per tenant: a write counts the tenant's keys and
    /// then writes, so a tenant's concurrent writes would all pass one count.
    config_writes: Places,
}

/// Keys remembered; past it, the least used are read from the store again.
const KEYS_CACHED: usize = 10_000;

impl Tenants {
    pub fn new(store: Arc<dyn Store>, default_policy: TenantPolicy) -> Self {
        Tenants {
            store,
            policies: Mutex::default(),
            default_policy: Arc::new(default_policy),
            keys: quick_cache::sync::Cache::new(KEYS_CACHED),
            forgotten: AtomicU64::new(0),
            config_writes: Places::new(4, 1),
        }
    }

    pub async fn set_config(
        &self,
        tenant: &str,
        key: &str,
        value: &str,
        secret: bool,
    ) -> Result<(), ManageError> {
        if !is_valid_config_key(key) {
            return Err(ManageError::ConfigKey(key.chars().take(129).collect()));
        }
        if value.len() > MAX_CONFIG_VALUE_BYTES {
            return Err(ManageError::ConfigValue(value.len()));
        }
        let _writing = self.config_writes.take(tenant).await;
        let keys = self.store.config_keys(tenant).await?;
        if keys.len() >= MAX_CONFIG_KEYS && !keys.iter().any(|k| k == key) {
            return Err(ManageError::TooManyConfigKeys(key.to_owned()));
        }
        let value = ConfigValue {
            value: value.to_owned(),
            secret,
        };
        Ok(self.store.config_set(tenant, key, &value).await?)
    }

    pub async fn remove_config(&self, tenant: &str, key: &str) -> Result<bool, ManageError> {
        // No such key can have been set, and a database would refuse some (a NUL) outright.
        if !is_valid_config_key(key) {
            return Ok(false);
        }
        Ok(self.store.config_delete(tenant, key).await?)
    }

    pub async fn config(&self, tenant: &str) -> Result<Vec<(String, Option<String>)>, ManageError> {
        let mut shown = Vec::new();
        for key in self.store.config_keys(tenant).await? {
            let value = match self.store.config_get(tenant, &key).await {
                Ok(value) => value.filter(|v| !v.secret).map(|v| v.value),
                // A secret is never shown: one this host cannot open lists like any other.
                Err(StoreError::Sealed { .. }) => None,
                Err(error) => return Err(error.into()),
            };
            shown.push((key, value));
        }
        Ok(shown)
    }

    pub async fn create(&self, tenant: &str) -> Result<bool, ManageError> {
        check_tenant(tenant)?;
        Ok(self.store.tenant_create(tenant, now_ms()).await?)
    }

    pub async fn all(&self) -> Result<Vec<String>, ManageError> {
        Ok(self.store.tenants().await?)
    }

    pub async fn create_key(&self, tenant: &str, role: Role) -> Result<NewKey, ManageError> {
        if !self.store.tenants().await?.iter().any(|t| t == tenant) {
            return Err(ManageError::NoTenant(tenant.chars().take(128).collect()));
        }
        // A revoke names a key by its id: ids are unique among all tenants' keys, so that one
        // tenant's revoke never takes another's key.
        let taken: HashSet<String> = self.store.keys().await?.into_iter().map(|k| k.id).collect();
        let random = unused_key_bytes(&taken, || {
            let mut random = [0u8; 20];
            getrandom::fill(&mut random).map_err(|e| ManageError::Random(e.to_string()))?;
            Ok(random)
        })?;
        let id = hex(&random[..4]);
        let secret = format!("thk_{id}_{}", hex(&random[4..]));
        let record = KeyRecord {
            id,
            tenant: tenant.to_owned(),
            created_at_ms: now_ms(),
            role,
        };
        let hash = sha256_hex(secret.as_bytes());
        self.store.key_put(&hash, &record).await?;
        self.forget_keys();
        Ok(NewKey { secret, record })
    }

    pub async fn keys(&self, tenant: Option<&str>) -> Result<Vec<KeyRecord>, ManageError> {
        let keys = self.store.keys().await?;
        Ok(keys
            .into_iter()
            .filter(|k| tenant.is_none_or(|t| k.tenant == t))
            .collect())
    }

    pub async fn revoke_key(&self, id: &str) -> Result<bool, ManageError> {
        let revoked = self.store.key_revoke(id).await?;
        self.forget_keys();
        Ok(revoked)
    }

    /// The key's record, from memory after its first use: a request's key costs no store
    /// read. Another node's revocation clears the memory through [`Tenants::forget`].
    pub async fn authenticate(&self, key: &str) -> Result<Option<KeyRecord>, StoreError> {
        let hash = sha256_hex(key.as_bytes());
        if let Some(record) = self.keys.get(&hash) {
            return Ok(record);
        }
        let before = self.forgotten.load(Ordering::Acquire);
        let record = self.store.key_get(&hash).await?;
        if self.forgotten.load(Ordering::Acquire) == before {
            self.keys.insert(hash, record.clone());
        }
        Ok(record)
    }

    pub async fn policy(&self, tenant: &str) -> Arc<TenantPolicy> {
        if let Some(policy) = self.cached_policy(tenant) {
            return policy;
        }
        let before = self.forgotten.load(Ordering::Acquire);
        let policy = match self.store.policy(tenant).await {
            Ok(Some(policy)) => Arc::new(policy),
            Ok(None) => self.default_policy.clone(),
            Err(error) => {
                // Fail closed: a tenant whose policy cannot be read can call nothing, until
                // it can be read (not kept: the next call reads again).
                tracing::error!(tenant, %error, "policy unreadable; denying every call");
                return Arc::new(TenantPolicy {
                    deny: vec!["*".into()],
                    ..TenantPolicy::default()
                });
            }
        };
        let mut policies = self.lock_policies();
        if self.forgotten.load(Ordering::Acquire) == before {
            policies.insert(tenant.to_owned(), policy.clone());
        }
        policy
    }

    fn forget_keys(&self) {
        self.forgotten.fetch_add(1, Ordering::AcqRel);
        self.keys.clear();
    }

    fn cached_policy(&self, tenant: &str) -> Option<Arc<TenantPolicy>> {
        self.lock_policies().get(tenant).cloned()
    }

    fn lock_policies(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<TenantPolicy>>> {
        self.policies.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Drops what memory holds of what another node changed: read again at next use.
    pub fn forget(&self, change: &Change) {
        match change {
            Change::Policy { tenant } => {
                self.forgotten.fetch_add(1, Ordering::AcqRel);
                self.lock_policies().remove(tenant);
            }
            Change::Keys => self.forget_keys(),
            Change::Resync => {
                self.forget_keys();
                self.lock_policies().clear();
            }
            Change::Tools { .. }
            | Change::Config { .. }
            | Change::HeldCalls
            | Change::Calls
            | Change::CallEnded => {}
        }
    }

    pub async fn set_policy(&self, tenant: &str, policy: TenantPolicy) -> Result<(), ManageError> {
        check_tenant(tenant)?;
        policy.validate()?;
        self.store.put_policy(tenant, &policy).await?;
        self.forgotten.fetch_add(1, Ordering::AcqRel);
        self.lock_policies()
            .insert(tenant.to_owned(), Arc::new(policy));
        Ok(())
    }
}

fn check_tenant(tenant: &str) -> Result<(), ManageError> {
    match is_valid_tenant(tenant) {
        true => Ok(()),
        false => Err(ManageError::Tenant(tenant.chars().take(128).collect())),
    }
}

/// A new key's random bytes, the first four its id, drawn again while `taken` has that id.
fn unused_key_bytes(
    taken: &HashSet<String>,
    mut draw: impl FnMut() -> Result<[u8; 20], ManageError>,
) -> Result<[u8; 20], ManageError> {
    loop {
        let random = draw()?;
        if !taken.contains(&hex(&random[..4])) {
            return Ok(random);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_keys_id_is_none_of_the_taken_ones() {
        let taken = HashSet::from(["01020304".to_owned()]);
        let mut taken_first = [0u8; 20];
        taken_first[..4].copy_from_slice(&[1, 2, 3, 4]);
        let mut draws = [taken_first, [1; 20]].into_iter();
        let random = unused_key_bytes(&taken, || Ok(draws.next().unwrap())).unwrap();
        assert_eq!(random, [1; 20], "the taken id was drawn again");
    }
}
