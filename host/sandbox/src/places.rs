//! Places for work that leaves the async workers and may outlast its caller's wait (a name
//! lookup whose server never answers, an argument check that matches megabytes against a
//! pattern): one tenant's such work holds only its own places, and the process's are bounded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The process's places, and each tenant's.
pub struct Places {
    all: Arc<Semaphore>,
    per_tenant: usize,
    /// One entry per tenant that ever took a place.
    by_tenant: Mutex<HashMap<String, Arc<Semaphore>>>,
}

/// One of a tenant's places and one of the process's, given back when dropped.
pub struct Place {
    _own: OwnedSemaphorePermit,
    _any: OwnedSemaphorePermit,
}

impl Places {
    /// `all` places in the process, `per_tenant` of them for each tenant.
    pub fn new(all: usize, per_tenant: usize) -> Self {
        Places {
            all: Arc::new(Semaphore::new(all)),
            per_tenant,
            by_tenant: Mutex::default(),
        }
    }

    /// Waits until `tenant` and the process each have a place free, and takes them.
    pub async fn take(&self, tenant: &str) -> Place {
        let own = self.of_tenant(tenant);
        let closed = "places are never closed";
        Place {
            _own: own.acquire_owned().await.expect(closed),
            _any: self.all.clone().acquire_owned().await.expect(closed),
        }
    }

    /// Takes a place for `tenant` if it and the process each have one free now.
    pub fn try_take(&self, tenant: &str) -> Option<Place> {
        Some(Place {
            _own: self.of_tenant(tenant).try_acquire_owned().ok()?,
            _any: self.all.clone().try_acquire_owned().ok()?,
        })
    }

    fn of_tenant(&self, tenant: &str) -> Arc<Semaphore> {
        let mut tenants = self.by_tenant.lock().unwrap_or_else(|p| p.into_inner());
        (tenants.entry(tenant.to_owned()))
            .or_insert_with(|| Arc::new(Semaphore::new(self.per_tenant)))
            .clone()
    }

    /// Runs `work` on one of tokio's blocking threads once `tenant` has a place; the place is
    /// held until `work` returns, whether or not its caller still waits.
    pub async fn run<T: Send + 'static>(
        &self,
        tenant: &str,
        work: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        let place = self.take(tenant).await;
        tokio::task::spawn_blocking(move || {
            let _place = place;
            work()
        })
        .await
        .unwrap_or_else(|panic| std::panic::resume_unwind(panic.into_panic()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_is_taken_at_once_or_not_at_all() {
        let places = Places::new(3, 2);
        let acme = [places.try_take("acme"), places.try_take("acme")];
        assert!(acme.iter().all(Option::is_some));
        assert!(places.try_take("acme").is_none(), "acme's two are held");
        let globex = places.try_take("globex");
        assert!(globex.is_some());
        assert!(
            places.try_take("initech").is_none(),
            "the process's three are held"
        );
        drop(acme);
        assert!(places.try_take("acme").is_some());
    }
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Duration;
    use tokio::time::timeout;

    /// Work that never ends holds a blocking thread past its caller: one tenant's such work
    /// fills its own places, not the process's threads.
    #[tokio::test]
    async fn a_tenants_stuck_work_holds_its_own_places_only() {
        let places = Places::new(3, 2);
        let answered = Arc::new(AtomicBool::new(false));
        let stuck = || {
            let answered = answered.clone();
            move || {
                while !answered.load(Ordering::Acquire) {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        };
        let gave_up = Duration::from_millis(20);
        for _ in 0..2 {
            assert!(timeout(gave_up, places.run("acme", stuck())).await.is_err());
        }
        // acme's callers gave up, but its places stay taken until the work returns.
        assert!(timeout(gave_up, places.run("acme", || 1)).await.is_err());
        assert_eq!(places.run("globex", || 2).await, 2);
        // The process's last place goes to stuck work of globex's; then no one's runs.
        assert!(
            timeout(gave_up, places.run("globex", stuck()))
                .await
                .is_err()
        );
        assert!(timeout(gave_up, places.run("initech", || 3)).await.is_err());
        answered.store(true, Ordering::Release);
        assert_eq!(places.run("acme", || 4).await, 4);
        assert_eq!(places.run("initech", || 5).await, 5);
    }
}
