//! Linked components held in memory, so that a call only instantiates. Bounded: past the cap
//! the least recently used is dropped, and loaded again from its stored artifact when needed.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::sandbox::Prepared;

pub(crate) struct Loaded {
    cap: usize,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// sha256 -> (component, last use)
    map: HashMap<String, (Prepared, u64)>,
    clock: u64,
}

impl Loaded {
    pub fn new(cap: usize) -> Self {
        Loaded {
            cap: cap.max(1),
            inner: Mutex::default(),
        }
    }

    pub fn get(&self, sha: &str) -> Option<Prepared> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.clock += 1;
        let now = inner.clock;
        inner.map.get_mut(sha).map(|(prepared, used)| {
            *used = now;
            prepared.clone()
        })
    }

    pub fn insert(&self, sha: &str, prepared: Prepared) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.clock += 1;
        let now = inner.clock;
        inner.map.insert(sha.to_owned(), (prepared, now));
        if inner.map.len() > self.cap {
            // A linear scan: the cap is hundreds, and eviction follows a compile or a load.
            let oldest = inner
                .map
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(sha, _)| sha.clone());
            if let Some(oldest) = oldest {
                inner.map.remove(&oldest);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map
            .len()
    }
}
