//! Locks that outlive a panic: a thread that panicked while holding one of compactor's mutexes
//! left plain counters and caches behind, never a half-written invariant, so the next holder
//! takes the value as it is rather than failing every request after.

use std::sync::{Mutex, MutexGuard};

pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
