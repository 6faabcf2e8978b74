//! What the summarizer may cost: a global and a per-tenant cap on calls running at once, a
//! per-tenant rate, and a circuit breaker that stops calling a summarizer that keeps failing.
//! Past any of them compaction fails open (the original request is forwarded).

use crate::poison::lock;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::breaker::{Admission, Breaker, Change, Open};
use crate::config::SummarizationConfig;

/// Why no summarizer call may start now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("the summarizer call budget is spent (calls at once, per tenant, or per minute)")]
    Budget,
    #[error("the summarizer failed repeatedly; its circuit breaker is open")]
    CircuitOpen,
}

/// Tenants tracked at most; full, idle buckets are forgotten first.
const MAX_TRACKED_TENANTS: usize = 10_000;

pub struct SummarizerBudget {
    global: Arc<Semaphore>,
    per_tenant: usize,
    per_minute: f64,
    tenants: Arc<Mutex<HashMap<[u8; 32], TenantState>>>,
    breaker: Breaker,
}

struct TenantState {
    running: usize,
    /// Token bucket of calls: refills at `per_minute` a minute, holds at most `per_minute`.
    tokens: f64,
    refilled: Instant,
}

/// Room for one summarizer run; returned when dropped.
pub struct Ticket {
    _global: OwnedSemaphorePermit,
    tenants: Arc<Mutex<HashMap<[u8; 32], TenantState>>>,
    accounts: Vec<[u8; 32]>,
    /// Whether this run is the half-open breaker's probe.
    pub probe: bool,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut tenants = lock(&self.tenants);
        for account in &self.accounts {
            if let Some(state) = tenants.get_mut(account) {
                state.running = state.running.saturating_sub(1);
            }
        }
    }
}

impl SummarizerBudget {
    pub fn new(config: &SummarizationConfig) -> SummarizerBudget {
        SummarizerBudget {
            global: Arc::new(Semaphore::new(
                (config.max_concurrent_calls as usize).min(Semaphore::MAX_PERMITS),
            )),
            per_tenant: config.max_concurrent_calls_per_tenant as usize,
            per_minute: config.max_calls_per_minute_per_tenant as f64,
            tenants: Arc::default(),
            breaker: Breaker::new(
                config.breaker_failures,
                Duration::from_secs_f64(config.breaker_cooldown_secs),
            ),
        }
    }

    /// Room for one run of `calls` summarizer calls charged to every one of `accounts` (a
    /// tenant, and with auth off the client's address), or why not: each account's own caps
    /// must have room.
    pub fn admit(
        &self,
        accounts: &[[u8; 32]],
        calls: u64,
        now: Instant,
    ) -> Result<Ticket, Refusal> {
        let admission = self
            .breaker
            .admit(now)
            .map_err(|Open| Refusal::CircuitOpen)?;
        let probe = admission == Admission::Probe;
        let refuse = |refusal| {
            if probe {
                self.breaker.cancel_probe();
            }
            Err(refusal)
        };
        let Ok(global) = self.global.clone().try_acquire_owned() else {
            return refuse(Refusal::Budget);
        };
        let mut tenants = lock(&self.tenants);
        if tenants.len() + accounts.len() > MAX_TRACKED_TENANTS
            && accounts.iter().any(|a| !tenants.contains_key(a))
        {
            let per_minute = self.per_minute;
            tenants.retain(|_, s| s.running > 0 || s.refill(now, per_minute) < per_minute);
        }
        let mut room = true;
        for account in accounts {
            let state = tenants.entry(*account).or_insert(TenantState {
                running: 0,
                tokens: self.per_minute,
                refilled: now,
            });
            let tokens = state.refill(now, self.per_minute);
            room &= state.running < self.per_tenant && tokens >= calls as f64;
        }
        if !room {
            drop(tenants);
            return refuse(Refusal::Budget);
        }
        for account in accounts {
            if let Some(state) = tenants.get_mut(account) {
                state.tokens -= calls as f64;
                state.running += 1;
            }
        }
        drop(tenants);
        Ok(Ticket {
            _global: global,
            tenants: self.tenants.clone(),
            accounts: accounts.to_vec(),
            probe,
        })
    }

    /// Ok(true) when this call is the half-open probe.
    /// Records how a run that reached the summarizer ended.
    pub fn record(&self, ticket: &Ticket, succeeded: bool, now: Instant) {
        let admission = if ticket.probe {
            Admission::Probe
        } else {
            Admission::Closed
        };
        if let Change::Opened { failures } = self.breaker.record(admission, succeeded, now) {
            tracing::warn!(
                failures,
                cooldown_secs = self.breaker.cooldown().as_secs_f64(),
                "summarizer circuit breaker open"
            );
        }
    }
}

impl TenantState {
    fn refill(&mut self, now: Instant, per_minute: f64) -> f64 {
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.tokens = (self.tokens + elapsed * per_minute / 60.0).min(per_minute);
        self.refilled = now;
        self.tokens
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(global: u64, per_tenant: u64, per_minute: u64) -> SummarizerBudget {
        SummarizerBudget::new(&SummarizationConfig {
            max_concurrent_calls: global,
            max_concurrent_calls_per_tenant: per_tenant,
            max_calls_per_minute_per_tenant: per_minute,
            breaker_failures: 2,
            breaker_cooldown_secs: 30.0,
            ..SummarizationConfig::default()
        })
    }

    #[test]
    fn caps_at_once_per_tenant_and_globally() {
        let budget = budget(3, 2, 100);
        let now = Instant::now();
        let a1 = budget.admit(&[[1; 32]], 1, now).unwrap();
        let _a2 = budget.admit(&[[1; 32]], 1, now).unwrap();
        assert_eq!(
            budget.admit(&[[1; 32]], 1, now).err(),
            Some(Refusal::Budget)
        );
        let _b1 = budget.admit(&[[2; 32]], 1, now).unwrap();
        assert_eq!(
            budget.admit(&[[3; 32]], 1, now).err(),
            Some(Refusal::Budget)
        );
        drop(a1);
        assert!(budget.admit(&[[1; 32]], 1, now).is_ok());
    }

    #[test]
    fn rate_per_tenant_refills_over_the_minute() {
        let budget = budget(100, 100, 3);
        let now = Instant::now();
        for _ in 0..3 {
            drop(budget.admit(&[[1; 32]], 1, now).unwrap());
        }
        assert_eq!(
            budget.admit(&[[1; 32]], 1, now).err(),
            Some(Refusal::Budget)
        );
        assert!(budget.admit(&[[2; 32]], 1, now).is_ok());
        let later = now + Duration::from_secs(20);
        assert!(budget.admit(&[[1; 32]], 1, later).is_ok());
        assert_eq!(
            budget.admit(&[[1; 32]], 1, later).err(),
            Some(Refusal::Budget)
        );
        assert_eq!(
            budget.admit(&[[3; 32]], 4, now).err(),
            Some(Refusal::Budget)
        );
    }

    #[test]
    fn a_run_charged_to_two_accounts_needs_room_in_both() {
        let budget = budget(100, 1, 100);
        let now = Instant::now();
        let (tenant_a, tenant_b, address) = ([1; 32], [2; 32], [9; 32]);
        let held = budget.admit(&[tenant_a, address], 1, now).unwrap();
        // Another tenant name from the same address: the address is busy.
        assert_eq!(
            budget.admit(&[tenant_b, address], 1, now).err(),
            Some(Refusal::Budget)
        );
        drop(held);
        assert!(budget.admit(&[tenant_b, address], 1, now).is_ok());
    }

    #[test]
    fn breaker_opens_after_consecutive_failures_and_probes_after_cooldown() {
        let budget = budget(100, 100, 100);
        let now = Instant::now();
        for _ in 0..2 {
            let ticket = budget.admit(&[[1; 32]], 1, now).unwrap();
            budget.record(&ticket, false, now);
        }
        assert_eq!(
            budget.admit(&[[1; 32]], 1, now).err(),
            Some(Refusal::CircuitOpen)
        );
        let later = now + Duration::from_secs(31);
        let probe = budget.admit(&[[1; 32]], 1, later).unwrap();
        assert!(probe.probe);
        // One probe at a time.
        assert_eq!(
            budget.admit(&[[2; 32]], 1, later).err(),
            Some(Refusal::CircuitOpen)
        );
        budget.record(&probe, true, later);
        assert!(!budget.admit(&[[2; 32]], 1, later).unwrap().probe);
    }
}
