//! One semaphore per tenant, made on its first use: the server's per-tenant bounds (bytes of
//! request and response bodies, requests in flight) are each a [`TenantSemaphores`].

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

/// `bytes` holding `room` of their tenant's until the last copy of them drops.
pub(crate) fn charged(bytes: Bytes, room: OwnedSemaphorePermit) -> Bytes {
    Bytes::from_owner(Charged { bytes, _room: room })
}

struct Charged {
    bytes: Bytes,
    _room: OwnedSemaphorePermit,
}

impl AsRef<[u8]> for Charged {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}
