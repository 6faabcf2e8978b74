//! The sticky summary cache (DESIGN.md §3): content-addressed by `(tenant, summarizer
//! fingerprint, prefix digest)` and bounded by bytes.

use std::sync::Arc;

use quick_cache::sync::Cache;
use quick_cache::Weighter;

use crate::compaction::planner::digest::Digest;
use crate::compaction::planner::plan::{CachedSummary, Pace, PaceRecord, SummaryLookup};
use crate::compaction::scope::Scope;

pub type CacheKey = [u8; 32];

#[derive(Clone)]
struct SummaryWeight;

impl Weighter<CacheKey, Arc<CachedSummary>> for SummaryWeight {
    fn weight(&self, _key: &CacheKey, value: &Arc<CachedSummary>) -> u64 {
        // Text plus a fixed allowance for the key, indices and bookkeeping.
        let splits: usize = value.splits.iter().map(|s| 8 + s.calls.len() * 8).sum();
        (value.text.len() + value.excluded.len() * 8 + splits + 128) as u64
    }
}

pub struct SummaryCache {
    entries: Cache<CacheKey, Arc<CachedSummary>, SummaryWeight>,
    /// Layouts whose summary came back no smaller than what it replaced: not paid for again.
    too_large: Cache<CacheKey, ()>,
    /// Summaries made ahead of need that no request has used yet: the first to use one
    /// carries the notice, as the first request the client sees compacted.
    made_ahead: Cache<CacheKey, ()>,
    /// Each conversation's growth per request as of its latest request over a trigger, under
    /// the digest of that request's messages (local to this replica: a conversation whose
    /// requests are spread over replicas is measured by each over what it saw).
    paces: Cache<CacheKey, Pace>,
}

impl SummaryCache {
    pub fn new(max_bytes: u64) -> SummaryCache {
        let estimated_items = (max_bytes / 2048).clamp(16, 1 << 20) as usize;
        SummaryCache {
            entries: Cache::with_weighter(estimated_items, max_bytes, SummaryWeight),
            too_large: Cache::new(estimated_items),
            made_ahead: Cache::new(estimated_items),
            paces: Cache::new(estimated_items),
        }
    }

    /// Keeps what a plan learned of its conversation for the next request, in place of the
    /// record it learned from (one record a conversation, not one a request).
    pub fn keep_pace(&self, record: PaceRecord) {
        if let Some(superseded) = record.superseded {
            self.paces.remove(&superseded);
        }
        self.paces.insert(record.key, record.pace);
    }

    /// Marks the summary under `key` as made ahead of need, not yet used.
    pub fn mark_made_ahead(&self, key: CacheKey) {
        self.made_ahead.insert(key, ());
    }

    /// Whether the summary under `key` was made ahead and this is its first use.
    pub fn take_made_ahead(&self, key: &CacheKey) -> bool {
        self.made_ahead.remove(key).is_some()
    }

    pub fn get(&self, key: &CacheKey) -> Option<Arc<CachedSummary>> {
        self.entries.get(key)
    }

    pub fn insert(&self, key: CacheKey, summary: Arc<CachedSummary>) {
        self.entries.insert(key, summary);
    }

    /// Remembers that the summary for `flight` (a layout) was not worth using.
    pub fn remember_too_large(&self, flight: CacheKey) {
        self.too_large.insert(flight, ());
    }

    pub fn known_too_large(&self, flight: &CacheKey) -> bool {
        self.too_large.get(flight).is_some()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The bytes the entries weigh now.
    pub fn weight(&self) -> u64 {
        self.entries.weight()
    }

    /// The configured bound, in bytes.
    pub fn capacity(&self) -> u64 {
        self.entries.capacity()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.len() == 0
    }
}

/// The planner's view of the summaries for one scope: the local tier, and what the shared
/// tier sent for this request. The scope (two hashes) is only computed when the planner
/// actually looks, so requests under the trigger never pay for it.
pub struct ScopedLookup<'c> {
    cache: &'c SummaryCache,
    /// Summaries the shared tier sent for this request, looked at before the cache (which
    /// holds them too, unless it has already evicted them).
    fetched: Vec<(CacheKey, CachedSummary)>,
    make_scope: Box<dyn Fn() -> Scope + Send + 'c>,
    scope: Option<Scope>,
}

impl<'c> ScopedLookup<'c> {
    pub fn new(cache: &'c SummaryCache, make_scope: impl Fn() -> Scope + Send + 'c) -> Self {
        ScopedLookup {
            cache,
            fetched: Vec::new(),
            make_scope: Box::new(make_scope),
            scope: None,
        }
    }

    pub fn scope(&mut self) -> Scope {
        *self.scope.get_or_insert_with(|| (self.make_scope)())
    }

    /// Adds what the shared tier sent.
    pub fn add(&mut self, fetched: Vec<(CacheKey, CachedSummary)>) {
        self.fetched.extend(fetched);
    }
}

impl SummaryLookup for ScopedLookup<'_> {
    fn chain_seed(&mut self) -> Digest {
        self.scope().seed()
    }

    fn get(&mut self, prefix: &Digest) -> Option<CachedSummary> {
        self.fetched
            .iter()
            .find(|(key, _)| key == prefix)
            .map(|(_, summary)| summary.clone())
            .or_else(|| self.cache.get(prefix).map(|summary| (*summary).clone()))
    }

    fn made_ahead(&mut self, prefix: &Digest) -> bool {
        self.cache.made_ahead.get(prefix).is_some()
    }

    fn pace(&mut self, request: &Digest) -> Option<Pace> {
        self.cache.paces.get(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(cut: usize, size: usize) -> Arc<CachedSummary> {
        Arc::new(CachedSummary {
            cut,
            excluded: vec![],
            splits: vec![],
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
}
