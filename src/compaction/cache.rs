//! The sticky summary cache (DESIGN.md §3): content-addressed by `(tenant, summarizer
//! fingerprint, prefix digest)`, bounded by bytes, with single-flight so concurrent requests
//! needing the same summary share one summarizer call.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use quick_cache::sync::Cache;
use quick_cache::Weighter;
use tokio::sync::OnceCell;

use super::digest::Digest;
use super::plan::{CachedSummary, SummaryLookup};

pub type CacheKey = [u8; 32];

#[derive(Clone)]
struct SummaryWeight;

impl Weighter<CacheKey, Arc<CachedSummary>> for SummaryWeight {
    fn weight(&self, _key: &CacheKey, value: &Arc<CachedSummary>) -> u64 {
        // Text plus a fixed allowance for the key, indices and bookkeeping.
        (value.text.len() + value.excluded.len() * 8 + 128) as u64
    }
}

/// Result of one shared summarizer run, as every waiter sees it.
pub type Shared = Result<Arc<CachedSummary>, super::engine::CompactionFailure>;

pub struct SummaryCache {
    entries: Cache<CacheKey, Arc<CachedSummary>, SummaryWeight>,
    in_flight: Mutex<HashMap<CacheKey, Arc<OnceCell<Shared>>>>,
}

/// Who is asking: summaries are only ever shared within one (tenant, fingerprint) scope.
#[derive(Clone, Copy)]
pub struct Scope {
    pub tenant: [u8; 32],
    pub fingerprint: [u8; 32],
}

impl Scope {
    /// Seeds the prefix chain: a chain digest is then the cache key of that prefix in this scope.
    pub fn seed(&self) -> Digest {
        super::digest::hash_parts([self.tenant.as_slice(), &self.fingerprint])
    }
}

impl SummaryCache {
    pub fn new(max_bytes: u64) -> SummaryCache {
        let estimated_items = (max_bytes / 2048).clamp(16, 1 << 20) as usize;
        SummaryCache {
            entries: Cache::with_weighter(estimated_items, max_bytes, SummaryWeight),
            in_flight: Mutex::new(HashMap::new()),
        }
    }

    pub fn get(&self, key: &CacheKey) -> Option<Arc<CachedSummary>> {
        self.entries.get(key)
    }

    pub fn insert(&self, key: CacheKey, summary: Arc<CachedSummary>) {
        self.entries.insert(key, summary);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.len() == 0
    }

    /// Runs `make` once for all concurrent callers with the same `flight` (which must identify
    /// exactly what `make` produces); each gets its result, which is cached under `key`.
    /// Returns whether this caller's `make` ran. If the running caller goes away, a waiting one
    /// takes over, so a disconnecting client cannot strand the others.
    pub async fn single_flight<F, Fut>(
        &self,
        flight: CacheKey,
        key: CacheKey,
        make: F,
    ) -> (Shared, bool)
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Shared>,
    {
        let cell = {
            let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            in_flight.entry(flight).or_default().clone()
        };
        let mut ran = false;
        let result = cell
            .get_or_init(|| {
                ran = true;
                make()
            })
            .await
            .clone();
        if ran {
            if let Ok(summary) = &result {
                self.insert(key, summary.clone());
            }
            let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
            if in_flight
                .get(&flight)
                .is_some_and(|c| Arc::ptr_eq(c, &cell))
            {
                in_flight.remove(&flight);
            }
        }
        (result, ran)
    }
}

/// The planner's view of the cache for one scope. The scope (two hashes) is only computed
/// when the planner actually looks, so requests under the trigger never pay for it.
pub struct ScopedLookup<'c> {
    cache: &'c SummaryCache,
    make_scope: Box<dyn Fn() -> Scope + 'c>,
    scope: Option<Scope>,
}

impl<'c> ScopedLookup<'c> {
    pub fn new(cache: &'c SummaryCache, make_scope: impl Fn() -> Scope + 'c) -> Self {
        ScopedLookup {
            cache,
            make_scope: Box::new(make_scope),
            scope: None,
        }
    }

    pub fn scope(&mut self) -> Scope {
        *self.scope.get_or_insert_with(|| (self.make_scope)())
    }
}

impl SummaryLookup for ScopedLookup<'_> {
    fn chain_seed(&mut self) -> Digest {
        self.scope().seed()
    }

    fn get(&mut self, prefix: &Digest) -> Option<CachedSummary> {
        self.cache.get(prefix).map(|summary| (*summary).clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(cut: usize, size: usize) -> Arc<CachedSummary> {
        Arc::new(CachedSummary {
            cut,
            excluded: vec![],
            text: "s".repeat(size),
            tokens: 10,
        })
    }

    #[test]
    fn bounded_by_bytes() {
        let cache = SummaryCache::new(64 * 1024);
        for i in 0..1000u32 {
            let mut key = [0u8; 32];
            key[..4].copy_from_slice(&i.to_le_bytes());
            cache.insert(key, summary(1, 1024));
        }
        assert!(cache.entries.weight() <= 64 * 1024);
        assert!(cache.len() < 1000);
    }

    #[test]
    fn scopes_never_share_keys() {
        let a = Scope {
            tenant: [1; 32],
            fingerprint: [9; 32],
        };
        let b = Scope {
            tenant: [2; 32],
            fingerprint: [9; 32],
        };
        let c = Scope {
            tenant: [1; 32],
            fingerprint: [8; 32],
        };
        assert_ne!(a.seed(), b.seed());
        assert_ne!(a.seed(), c.seed());
    }

    #[tokio::test]
    async fn single_flight_runs_once_for_concurrent_callers() {
        let cache = Arc::new(SummaryCache::new(1 << 20));
        let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..10 {
            let (cache, runs) = (cache.clone(), runs.clone());
            tasks.push(tokio::spawn(async move {
                cache
                    .single_flight([5; 32], [5; 32], || async move {
                        runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        // Yielding lets every other task (FIFO on this single-threaded
                        // runtime) reach the shared cell before the result exists.
                        for _ in 0..20 {
                            tokio::task::yield_now().await;
                        }
                        Ok(summary(3, 10))
                    })
                    .await
            }));
        }
        let mut ran = 0;
        for task in tasks {
            let (result, did_run) = task.await.unwrap();
            assert_eq!(result.unwrap().cut, 3);
            ran += usize::from(did_run);
        }
        assert_eq!(ran, 1);
        assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert!(cache.get(&[5; 32]).is_some());
    }
}
