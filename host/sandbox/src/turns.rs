//! CPU turns, shared fairly between tenants. A guest runs its first epoch tick freely, so a
//! short call never waits here. From then on it needs a turn for each tick it goes on
//! running: there is one turn per core, and when guests wait for one, turns go round the
//! tenants that wait, one guest of each in turn, whatever number of guests each has running.
//!
//! A turn is renewed at its holder's next tick. A holder that does not tick within the lease
//! (blocked in a host call, or in one long instruction such as a `memory.fill`) loses it to a
//! waiter when the epoch ticker calls [`Turns::expire`]; so turns never stay with a guest that
//! is not using the CPU for long.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// The turns of one engine.
pub struct Turns {
    state: Mutex<State>,
    /// Turns in all: guests past their first tick that run at once.
    count: usize,
    /// How long a turn lasts without its holder ticking.
    lease: Duration,
}

#[derive(Default)]
struct State {
    /// Guests holding a turn, with when they took it.
    held: HashMap<u64, Instant>,
    /// Guests waiting for a turn, by tenant, oldest first.
    waiting: HashMap<Arc<str>, VecDeque<(u64, oneshot::Sender<()>)>>,
    /// Tenants with waiting guests, in the order they get their next turn.
    order: VecDeque<Arc<str>>,
    next_guest: u64,
}

impl Turns {
    /// `count` turns (one per core), each lasting `lease` without a tick.
    pub fn new(count: usize, lease: Duration) -> Arc<Self> {
        Arc::new(Turns {
            state: Mutex::default(),
            count: count.max(1),
            lease,
        })
    }

    /// A new guest of `tenant`, holding no turn.
    pub fn guest(self: &Arc<Self>, tenant: &str) -> GuestTurn {
        let id = {
            let mut state = self.lock();
            state.next_guest += 1;
            state.next_guest
        };
        GuestTurn {
            turns: self.clone(),
            tenant: tenant.into(),
            id,
        }
    }

    /// Takes turns back from holders that did not tick within the lease, and gives them to
    /// waiters. The epoch ticker calls it at every tick.
    pub fn expire(&self) {
        let mut state = self.lock();
        let now = Instant::now();
        state
            .held
            .retain(|_, taken| now.duration_since(*taken) < self.lease);
        self.hand_out(&mut state, now);
    }

    /// Gives free turns to waiting guests, one tenant after another.
    fn hand_out(&self, state: &mut State, now: Instant) {
        while state.held.len() < self.count {
            let Some(tenant) = state.order.pop_front() else {
                break;
            };
            let queue = state
                .waiting
                .get_mut(&tenant)
                .expect("an ordered tenant waits");
            // A waiter whose call ended meanwhile is skipped.
            while let Some((guest, wake)) = queue.pop_front() {
                if wake.send(()).is_ok() {
                    state.held.insert(guest, now);
                    break;
                }
            }
            if queue.is_empty() {
                state.waiting.remove(&tenant);
            } else {
                state.order.push_back(tenant);
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One guest's claim on the turns; dropping it gives back what it holds.
pub struct GuestTurn {
    turns: Arc<Turns>,
    tenant: Arc<str>,
    id: u64,
}

impl GuestTurn {
    /// At a tick: gives back this guest's turn, and takes one to go on running. `None`: it
    /// has one; else it has one once the receiver resolves.
    pub fn tick(&self) -> Option<oneshot::Receiver<()>> {
        let turns = &*self.turns;
        let mut state = turns.lock();
        let now = Instant::now();
        state.held.remove(&self.id);
        if state.order.is_empty() && state.held.len() < turns.count {
            state.held.insert(self.id, now);
            return None;
        }
        let (wake, woken) = oneshot::channel();
        if !state.waiting.contains_key(&self.tenant) {
            state.order.push_back(self.tenant.clone());
        }
        let queue = state.waiting.entry(self.tenant.clone()).or_default();
        queue.push_back((self.id, wake));
        turns.hand_out(&mut state, now);
        Some(woken)
    }
}

impl Drop for GuestTurn {
    fn drop(&mut self) {
        let turns = &*self.turns;
        let mut state = turns.lock();
        if state.held.remove(&self.id).is_some() {
            turns.hand_out(&mut state, Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn has_turn(woken: &mut Option<oneshot::Receiver<()>>) -> bool {
        match woken {
            None => true,
            Some(receiver) => receiver.try_recv().is_ok(),
        }
    }

    #[test]
    fn turns_go_round_the_tenants_not_the_guests() {
        let turns = Turns::new(1, Duration::from_secs(60));
        let a: Vec<_> = (0..3).map(|_| turns.guest("a")).collect();
        let b = turns.guest("b");
        // a0 takes the only turn; a1, a2 and then b wait.
        assert!(a[0].tick().is_none());
        let mut a1 = a[1].tick();
        let mut a2 = a[2].tick();
        let mut b0 = b.tick();
        assert!(!has_turn(&mut a1) && !has_turn(&mut a2) && !has_turn(&mut b0));
        // a0's next tick hands the turn on: a1 (its tenant waited first), then b, then a2.
        let mut a0 = a[0].tick();
        assert!(has_turn(&mut a1) && !has_turn(&mut b0));
        let mut a1 = a[1].tick();
        assert!(has_turn(&mut b0), "b's guest before a's third");
        assert!(!has_turn(&mut a2) && !has_turn(&mut a0) && !has_turn(&mut a1));
        drop(b);
        assert!(has_turn(&mut a2), "a guest that ends gives its turn back");
    }

    #[test]
    fn a_guest_that_stops_ticking_loses_its_turn_to_a_waiter() {
        let turns = Turns::new(1, Duration::from_millis(20));
        let (sleeper, busy) = (turns.guest("a"), turns.guest("b"));
        assert!(sleeper.tick().is_none());
        let mut waiting = busy.tick();
        turns.expire();
        assert!(!has_turn(&mut waiting), "within the lease");
        std::thread::sleep(Duration::from_millis(25));
        turns.expire();
        assert!(has_turn(&mut waiting));
    }

    #[test]
    fn a_waiter_that_went_away_is_skipped() {
        let turns = Turns::new(1, Duration::from_secs(60));
        let (holder, gone, next) = (turns.guest("a"), turns.guest("b"), turns.guest("c"));
        assert!(holder.tick().is_none());
        drop(gone.tick());
        let mut next_turn = next.tick();
        drop(holder);
        assert!(has_turn(&mut next_turn));
    }
}
