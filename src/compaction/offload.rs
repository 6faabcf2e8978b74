//! Where CPU-heavy compaction work runs: inline for small bodies, on the blocking pool for large
//! ones, so a megabyte-sized plan never stalls a reactor thread.

/// Bodies above this are planned on the blocking pool, off the reactor threads.
const INLINE_LIMIT: usize = 1024 * 1024;

/// Runs `work` for a body of `size` bytes; None when the blocking task did not complete.
pub async fn run_cpu<T, F>(size: usize, work: F) -> Option<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    if size <= INLINE_LIMIT {
        Some(work())
    } else {
        tokio::task::spawn_blocking(work).await.ok()
    }
}
