//! One semaphore per tenant, made on its first use: the server's per-tenant bounds (requests
//! in flight, and with a bound over all tenants, bytes of request and response bodies).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Each tenant's semaphore of `permits`.
pub(crate) struct TenantSemaphores {
    permits: usize,
    by_tenant: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl TenantSemaphores {
    pub(crate) fn new(permits: usize) -> Self {
        TenantSemaphores {
            permits,
            by_tenant: Mutex::default(),
        }
    }

    /// The tenant's semaphore.
    pub(crate) fn of(&self, tenant: &str) -> Arc<Semaphore> {
        let mut tenants = self.by_tenant.lock().unwrap_or_else(|p| p.into_inner());
        // Every request passes here: no allocation for a tenant already known.
        if let Some(semaphore) = tenants.get(tenant) {
            return semaphore.clone();
        }
        let semaphore = Arc::new(Semaphore::new(self.permits));
        tenants.insert(tenant.to_owned(), semaphore.clone());
        semaphore
    }
}

/// Bytes held in memory: one tenant's at most `each` together, and all tenants' at most
/// `all`, so that many tenants, each within its own bound, cannot fill the host either.
pub(crate) struct ByteRoom {
    each: TenantSemaphores,
    all: Arc<Semaphore>,
    all_bytes: usize,
}

/// Which bound a request for bytes found full, and its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Full {
    /// The tenant's own.
    Tenant(usize),
    /// All tenants' together.
    Server(usize),
}

impl ByteRoom {
    pub(crate) fn new(each: usize, all: usize) -> Self {
        ByteRoom {
            // A tenant's bound past everyone's would let no large body through.
            each: TenantSemaphores::new(each.min(all)),
            all: Arc::new(Semaphore::new(all)),
            all_bytes: all,
        }
    }

    /// Most bytes one tenant may hold.
    pub(crate) fn each(&self) -> usize {
        self.each.permits
    }

    /// Where `tenant`'s bytes are taken from.
    pub(crate) fn of(&self, tenant: &str) -> TenantRoom {
        TenantRoom {
            tenant: self.each.of(tenant),
            all: self.all.clone(),
            bytes: (self.each.permits, self.all_bytes),
        }
    }

    /// Bytes free: the tenant's own, and all tenants'.
    #[cfg(test)]
    pub(crate) fn free(&self, tenant: &str) -> (usize, usize) {
        let tenant = self.each.of(tenant).available_permits();
        (tenant, self.all.available_permits())
    }
}

/// One tenant's bytes and everyone's.
#[derive(Clone)]
pub(crate) struct TenantRoom {
    tenant: Arc<Semaphore>,
    all: Arc<Semaphore>,
    /// The two bounds' bytes, to name them.
    bytes: (usize, usize),
}

impl TenantRoom {
    /// `bytes` of both bounds, if both have them free now.
    pub(crate) fn take(&self, bytes: u32) -> Result<Held, Full> {
        let tenant = self.tenant.clone().try_acquire_many_owned(bytes);
        let tenant = tenant.map_err(|_| Full::Tenant(self.bytes.0))?;
        let all = self.all.clone().try_acquire_many_owned(bytes);
        let all = all.map_err(|_| Full::Server(self.bytes.1))?;
        Ok(Held { tenant, all })
    }
}

/// Bytes taken from a tenant's bound and from all tenants', given back when dropped.
pub(crate) struct Held {
    tenant: OwnedSemaphorePermit,
    all: OwnedSemaphorePermit,
}

impl Held {
    pub(crate) fn merge(&mut self, other: Held) {
        self.tenant.merge(other.tenant);
        self.all.merge(other.all);
    }

    /// `bytes` of these, if they hold that many.
    pub(crate) fn split(&mut self, bytes: usize) -> Option<Held> {
        // Both always hold the same number.
        let tenant = self.tenant.split(bytes)?;
        let all = self.all.split(bytes).expect("as many as the tenant's");
        Some(Held { tenant, all })
    }
}

/// `bytes` holding `room` until the last copy of them drops.
pub(crate) fn charged(bytes: Bytes, room: Held) -> Bytes {
    Bytes::from_owner(Charged { bytes, _room: room })
}

struct Charged {
    bytes: Bytes,
    _room: Held,
}

impl AsRef<[u8]> for Charged {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}
