//! A node-wide bound on what clients can make the node hold in memory at once.
//!
//! Some requests make the node buffer data whose size a client chooses: a sandbox's files read
//! for a snapshot, a snapshot loaded to be restored or forked. Each is bounded on its own (the
//! key's quota), but many at once, from one key or several, would add up to far more than the
//! node has. Every such buffer reserves its bytes here as it grows; when the node's bound is
//! reached the request fails at once with [`Exhausted`] (answered as 503, nothing stored), and
//! its reservation is given back when the buffer is dropped.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Reservations are counted in KiB, so a bound of terabytes fits a semaphore's permits.
const UNIT: u64 = 1024;

/// The node's bound and what is reserved of it.
#[derive(Debug, Clone)]
pub struct MemoryBudget {
    units: Arc<Semaphore>,
    total: u64,
}

/// The bound is reached: the request would make the node hold more than it allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the node holds as much client data in memory as it allows ({total} bytes); try again when other snapshots, restores or forks have finished")]
pub struct Exhausted {
    /// The node's bound, bytes.
    pub total: u64,
}

/// Bytes reserved for one buffer; given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: MemoryBudget,
    permit: Option<OwnedSemaphorePermit>,
    units: u64,
}

impl MemoryBudget {
    /// A budget of `bytes` (at least one unit).
    pub fn new(bytes: u64) -> Self {
        let units = (bytes / UNIT).clamp(1, Semaphore::MAX_PERMITS as u64);
        Self {
            units: Arc::new(Semaphore::new(units as usize)),
            total: units * UNIT,
        }
    }

    /// The bound, bytes.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Bytes not reserved now.
    pub fn available(&self) -> u64 {
        self.units.available_permits() as u64 * UNIT
    }

    /// A reservation of `bytes`, or [`Exhausted`] at once when the node has not that much left.
    pub fn reserve(&self, bytes: u64) -> Result<Reservation, Exhausted> {
        let mut held = Reservation {
            budget: self.clone(),
            permit: None,
            units: 0,
        };
        held.grow_to(bytes)?;
        Ok(held)
    }
}

impl Reservation {
    /// Grows the reservation to cover `bytes` (never shrinks it).
    pub fn grow_to(&mut self, bytes: u64) -> Result<(), Exhausted> {
        let want = bytes.div_ceil(UNIT);
        if want <= self.units {
            return Ok(());
        }
        let more = u32::try_from(want - self.units).map_err(|_| self.exhausted())?;
        let permit = self
            .budget
            .units
            .clone()
            .try_acquire_many_owned(more)
            .map_err(|_| self.exhausted())?;
        match &mut self.permit {
            Some(held) => held.merge(permit),
            None => self.permit = Some(permit),
        }
        self.units = want;
        Ok(())
    }

    /// Bytes reserved.
    pub fn bytes(&self) -> u64 {
        self.units * UNIT
    }

    fn exhausted(&self) -> Exhausted {
        Exhausted {
            total: self.budget.total,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_add_up_to_the_bound_and_are_given_back() {
        let budget = MemoryBudget::new(10 * 1024);
        let mut a = budget.reserve(4 * 1024).unwrap();
        let b = budget.reserve(5 * 1024).unwrap();
        assert_eq!(budget.available(), 1024);
        assert_eq!(a.grow_to(6 * 1024), Err(Exhausted { total: 10 * 1024 }));
        assert_eq!(a.bytes(), 4 * 1024, "a refused growth keeps what was held");
        a.grow_to(5 * 1024).unwrap();
        assert!(budget.reserve(1).is_err());
        drop(b);
        assert_eq!(budget.available(), 5 * 1024);
        drop(a);
        assert_eq!(budget.available(), 10 * 1024);
    }
}
