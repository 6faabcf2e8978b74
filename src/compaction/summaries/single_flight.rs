//! Single-flight: concurrent requests that need the same summary share one summarizer run.
//!
//! The run is a detached task: a client that goes away neither cancels it (the call is paid
//! for once and its result is cached for the next turn) nor strands the requests waiting on
//! it, and the task removes its own entry when it ends, whoever is still waiting.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

pub type FlightKey = [u8; 32];

type Flights<T> = Arc<Mutex<HashMap<FlightKey, watch::Receiver<Option<T>>>>>;

pub struct SingleFlight<T> {
    flights: Flights<T>,
}

impl<T> Default for SingleFlight<T> {
    fn default() -> Self {
        SingleFlight {
            flights: Arc::default(),
        }
    }
}

/// Removes a flight's entry when its task ends, also when it panics.
struct Landing<T> {
    flights: Flights<T>,
    key: FlightKey,
}

impl<T> Drop for Landing<T> {
    fn drop(&mut self) {
        lock(&self.flights).remove(&self.key);
    }
}

fn lock<K>(mutex: &Mutex<K>) -> MutexGuard<'_, K> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl<T: Clone + Send + Sync + 'static> SingleFlight<T> {
    /// Waits for the flight `key` (which must identify exactly what `make` produces), starting
    /// it with `make` when none is running. Returns its result (None if the task died) and
    /// whether this caller started it. Must be called inside a tokio runtime.
    pub async fn join<F, Fut>(&self, key: FlightKey, make: F) -> (Option<T>, bool)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = T> + Send + 'static,
    {
        let (mut receiver, started) = {
            let mut flights = lock(&self.flights);
            match flights.get(&key) {
                Some(receiver) => (receiver.clone(), false),
                None => {
                    let (sender, receiver) = watch::channel(None);
                    flights.insert(key, receiver.clone());
                    let landing = Landing {
                        flights: self.flights.clone(),
                        key,
                    };
                    let work = make();
                    tokio::spawn(async move {
                        let value = work.await;
                        // Leave the map before publishing: whoever comes later finds what the
                        // work stored (the cache) instead of a finished flight.
                        drop(landing);
                        let _ = sender.send(Some(value));
                    });
                    (receiver, true)
                }
            }
        };
        let value = receiver
            .wait_for(Option::is_some)
            .await
            .ok()
            .and_then(|value| value.clone());
        (value, started)
    }

    /// Flights running now.
    pub fn in_flight(&self) -> usize {
        lock(&self.flights).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn concurrent_callers_share_one_run() {
        let flights = Arc::new(SingleFlight::<u32>::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let (release, gate) = watch::channel(false);
        let mut tasks = Vec::new();
        for _ in 0..10 {
            let (flights, runs, gate) = (flights.clone(), runs.clone(), gate.clone());
            tasks.push(tokio::spawn(async move {
                flights
                    .join([5; 32], || async move {
                        runs.fetch_add(1, Ordering::SeqCst);
                        let mut gate = gate;
                        let _ = gate.wait_for(|open| *open).await;
                        7
                    })
                    .await
            }));
        }
        // Every caller has joined once the flight is registered and ten have asked; the gate
        // holds the run until then.
        while runs.load(Ordering::SeqCst) == 0 || flights.in_flight() == 0 {
            tokio::task::yield_now().await;
        }
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        release.send(true).unwrap();
        let mut started = 0;
        for task in tasks {
            let (value, did_start) = task.await.unwrap();
            assert_eq!(value, Some(7));
            started += usize::from(did_start);
        }
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(started, 1);
        assert_eq!(flights.in_flight(), 0);
    }

    #[tokio::test]
    async fn the_run_finishes_and_lands_when_its_caller_goes_away() {
        let flights = Arc::new(SingleFlight::<u32>::default());
        let (release, gate) = watch::channel(false);
        let (done_tx, mut done) = watch::channel(false);
        let caller = {
            let flights = flights.clone();
            tokio::spawn(async move {
                flights
                    .join([1; 32], || async move {
                        let mut gate = gate;
                        let _ = gate.wait_for(|open| *open).await;
                        let _ = done_tx.send(true);
                        3
                    })
                    .await
            })
        };
        while flights.in_flight() == 0 {
            tokio::task::yield_now().await;
        }
        caller.abort();
        let _ = caller.await;
        release.send(true).unwrap();
        done.wait_for(|d| *d).await.unwrap();
        while flights.in_flight() != 0 {
            tokio::task::yield_now().await;
        }
        // A later caller starts afresh rather than joining a dead flight.
        let (value, started) = flights.join([1; 32], || async { 4 }).await;
        assert_eq!((value, started), (Some(4), true));
    }
}
