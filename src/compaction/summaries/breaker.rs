//! One circuit breaker for what compaction calls that can fail for a while (the summarizer, the
//! shared Redis tier): after `threshold` failures in a row it opens for `cooldown`; then exactly
//! one call goes through as a probe, whose success closes it and whose failure opens it again.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::poison::lock;

pub struct Breaker {
    state: Mutex<State>,
    threshold: u64,
    cooldown: Duration,
}

#[derive(Default)]
struct State {
    failures: u64,
    open_until: Option<Instant>,
    /// The probe is running (the breaker is half-open).
    probing: bool,
}

/// How a call was let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    Closed,
    /// The one call after the cooldown: it must be [`Breaker::record`]ed or
    /// [`Breaker::cancel_probe`]d.
    Probe,
}

/// The breaker is open: no call now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Open;

/// What a recorded call changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Unchanged,
    /// It opened (or, after a failed probe, opened again), after this many failures in a row.
    Opened {
        failures: u64,
    },
    /// A success after it had opened.
    Closed,
}

impl Breaker {
    pub fn new(threshold: u64, cooldown: Duration) -> Breaker {
        Breaker {
            state: Mutex::default(),
            threshold: threshold.max(1),
            cooldown,
        }
    }

    /// How long it stays open before the probe.
    pub fn cooldown(&self) -> Duration {
        self.cooldown
    }

    /// Whether a call may start at `now`.
    pub fn admit(&self, now: Instant) -> Result<Admission, Open> {
        let mut state = lock(&self.state);
        match state.open_until {
            None => Ok(Admission::Closed),
            Some(until) if now < until => Err(Open),
            Some(_) if state.probing => Err(Open),
            Some(_) => {
                state.probing = true;
                Ok(Admission::Probe)
            }
        }
    }

    /// Whether a call would be let through at `now`, without taking the probe.
    pub fn would_admit(&self, now: Instant) -> bool {
        let state = lock(&self.state);
        match state.open_until {
            None => true,
            Some(until) => now >= until && !state.probing,
        }
    }

    /// Gives back a probe that made no call.
    pub fn cancel_probe(&self) {
        lock(&self.state).probing = false;
    }

    /// Records how an admitted call ended.
    pub fn record(&self, admission: Admission, ok: bool, now: Instant) -> Change {
        let mut state = lock(&self.state);
        if admission == Admission::Probe {
            state.probing = false;
        }
        if ok {
            let was_open = state.open_until.is_some();
            *state = State::default();
            return if was_open {
                Change::Closed
            } else {
                Change::Unchanged
            };
        }
        state.failures += 1;
        let probe_failed = admission == Admission::Probe;
        if !probe_failed && state.failures < self.threshold {
            return Change::Unchanged;
        }
        let newly = state.open_until.is_none() || probe_failed;
        state.open_until = Some(now + self.cooldown);
        if newly {
            Change::Opened {
                failures: state.failures,
            }
        } else {
            Change::Unchanged
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_failures_in_a_row_then_lets_one_probe_through() {
        let breaker = Breaker::new(2, Duration::from_secs(30));
        let now = Instant::now();
        assert_eq!(breaker.admit(now), Ok(Admission::Closed));
        assert_eq!(
            breaker.record(Admission::Closed, false, now),
            Change::Unchanged
        );
        assert_eq!(
            breaker.record(Admission::Closed, false, now),
            Change::Opened { failures: 2 }
        );
        assert_eq!(breaker.admit(now), Err(Open));
        assert!(!breaker.would_admit(now));
        let later = now + Duration::from_secs(31);
        assert!(breaker.would_admit(later));
        assert_eq!(breaker.admit(later), Ok(Admission::Probe));
        assert_eq!(breaker.admit(later), Err(Open), "one probe at a time");
        assert_eq!(
            breaker.record(Admission::Probe, false, later),
            Change::Opened { failures: 3 }
        );
        let again = later + Duration::from_secs(31);
        assert_eq!(breaker.admit(again), Ok(Admission::Probe));
        breaker.cancel_probe();
        assert_eq!(breaker.admit(again), Ok(Admission::Probe));
        assert_eq!(
            breaker.record(Admission::Probe, true, again),
            Change::Closed
        );
        assert_eq!(breaker.admit(again), Ok(Admission::Closed));
        // A success in between resets the count.
        breaker.record(Admission::Closed, false, again);
        breaker.record(Admission::Closed, true, again);
        assert_eq!(
            breaker.record(Admission::Closed, false, again),
            Change::Unchanged
        );
    }
}
