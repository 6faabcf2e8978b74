//! Where CPU-heavy compaction work runs: inline for small bodies, on a bounded pool for large
//! ones, so a megabyte-sized plan never stalls a reactor thread and a burst of them never queues
//! without bound.

use std::sync::Arc;

use tokio::sync::Semaphore;

/// Bodies above this are planned on the pool, off the reactor threads (about a millisecond of
/// planning: what a reactor thread may spend without its other connections noticing).
const INLINE_LIMIT: usize = 256 * 1024;

/// How offloaded work went.
#[derive(Debug, PartialEq, Eq)]
pub enum Offloaded<T> {
    Done(T),
    /// Every planner thread was taken: the caller forwards the request as is.
    Busy,
    /// The work panicked or was cancelled.
    Lost,
}

/// At most `threads` large plans at once, shared by every worker.
#[derive(Clone)]
pub struct CpuPool {
    permits: Arc<Semaphore>,
}

impl CpuPool {
    pub fn new(threads: usize) -> CpuPool {
        CpuPool {
            permits: Arc::new(Semaphore::new(threads.clamp(1, Semaphore::MAX_PERMITS))),
        }
    }

    /// Whether the work for a body of `size` bytes runs on the pool's threads (where it may
    /// block), not inline.
    pub fn offloads(size: usize) -> bool {
        size > INLINE_LIMIT
    }

    /// Runs `work` for a body of `size` bytes.
    pub async fn run<T, F>(&self, size: usize, work: F) -> Offloaded<T>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        if !CpuPool::offloads(size) {
            return Offloaded::Done(work());
        }
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            return Offloaded::Busy;
        };
        let task = tokio::task::spawn_blocking(move || {
            let _permit = permit;
            work()
        });
        match task.await {
            Ok(value) => Offloaded::Done(value),
            Err(_) => Offloaded::Lost,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_full_pool_answers_busy_and_frees_its_thread_after() {
        let pool = CpuPool::new(1);
        let (hold, held) = std::sync::mpsc::channel::<()>();
        let (started, is_started) = tokio::sync::oneshot::channel();
        let first = tokio::spawn({
            let pool = pool.clone();
            async move {
                pool.run(INLINE_LIMIT + 1, move || {
                    let _ = started.send(());
                    held.recv().is_ok()
                })
                .await
            }
        });
        is_started.await.unwrap();
        assert_eq!(pool.run(INLINE_LIMIT + 1, || 2).await, Offloaded::Busy);
        // Small bodies never wait for the pool.
        assert_eq!(pool.run(10, || 3).await, Offloaded::Done(3));
        hold.send(()).unwrap();
        assert_eq!(first.await.unwrap(), Offloaded::Done(true));
        assert_eq!(pool.run(INLINE_LIMIT + 1, || 4).await, Offloaded::Done(4));
    }
}
