//! The summaries, in tiers: the in-process cache in front and, with `cache.backend: redis`, the
//! tier the replicas share behind it. Compaction asks the store for summaries and hands it the
//! ones it makes; only the store knows whether a shared tier exists.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::compaction::calibration::SharedCalibration;
use crate::compaction::planner::plan::CachedSummary;
use crate::compaction::planner::structure::Split;
use crate::compaction::summaries::cache::{CacheKey, SummaryCache};
use crate::compaction::summaries::redis_tier::{Lease, LeaseGuard, RedisTier, Stored};
use crate::config::{CacheBackend, Config};
use crate::metrics::Metrics;

pub struct SummaryStore {
    local: Arc<SummaryCache>,
    shared: Option<RedisTier>,
    metrics: Arc<Metrics>,
    deployment: [u8; 32],
}

/// What the replicas say about one summary layout before this one makes it.
pub enum Claim {
    /// Another replica made it (or had made it before).
    Made(CachedSummary),
    /// Another replica found it not smaller than what it replaces.
    TooLarge,
    /// Make it here, holding the lease when the shared tier gave one.
    Make(Option<LeaseGuard>),
    /// Another replica was making it for longer than a run may take.
    TimedOut,
}

/// A layout: the cut, the excluded messages and the split ones.
pub type LayoutKey = (usize, Vec<usize>, Vec<Split>);

const FIRST_POLL: Duration = Duration::from_millis(20);
const MAX_POLL: Duration = Duration::from_millis(250);

impl SummaryStore {
    /// The store of `config`; after a reload, `previous` hands over its in-process tier (when
    /// its size is unchanged) and its connection to the shared tier (when its settings are).
    pub fn new(
        config: &Config,
        previous: Option<&SummaryStore>,
        metrics: Arc<Metrics>,
    ) -> SummaryStore {
        let local = match previous {
            Some(previous) if previous.local.capacity() == config.cache.max_bytes => {
                previous.local.clone()
            }
            _ => Arc::new(SummaryCache::new(config.cache.max_bytes)),
        };
        let shared = match config.cache.backend {
            CacheBackend::Memory => None,
            CacheBackend::Redis => {
                let kept = previous
                    .and_then(|p| p.shared.clone())
                    .filter(|tier| tier.made_with(&config.cache.redis));
                match kept {
                    Some(tier) => Some(tier),
                    None => match RedisTier::new(&config.cache.redis, metrics.clone()) {
                        Ok(tier) => Some(tier),
                        Err(e) => {
                            tracing::error!("the shared summary cache is off: {e}");
                            None
                        }
                    },
                }
            }
        };
        // Replicas that share a signing key are one deployment; another deployment on the
        // same Redis and prefix names its summaries differently even for the same tenant.
        let deployment = match (&config.cache.backend, &config.cache.redis.signing_key) {
            (CacheBackend::Redis, Some(key)) => {
                use sha2::Digest as _;
                let mut hasher = sha2::Sha256::new();
                hasher.update(b"compactor deployment\0");
                hasher.update(key.expose().as_bytes());
                hasher.finalize().into()
            }
            _ => [0; 32],
        };
        SummaryStore {
            local,
            shared,
            metrics,
            deployment,
        }
    }

    /// What scopes every summary key to this deployment.
    pub fn deployment(&self) -> [u8; 32] {
        self.deployment
    }

    /// The in-process tier: what planning reads without waiting.
    pub fn local(&self) -> &SummaryCache {
        &self.local
    }

    /// Whether a tier behind the local one may hold more.
    pub fn has_shared(&self) -> bool {
        self.shared().is_some()
    }

    /// The shared tier, while it is being asked.
    fn shared(&self) -> Option<&RedisTier> {
        self.shared.as_ref().filter(|tier| tier.available())
    }

    /// What the shared tier holds for these prefixes, each `recount`ed, kept in the local tier
    /// too.
    pub async fn fetch(
        &self,
        keys: &[CacheKey],
        recount: impl Fn(&mut CachedSummary),
    ) -> Vec<(CacheKey, CachedSummary)> {
        let Some(tier) = self.shared() else {
            return Vec::new();
        };
        let mut found = tier.get_many(keys).await;
        self.metrics.remote_lookup(!found.is_empty());
        for (key, summary) in &mut found {
            recount(summary);
            self.local.insert(*key, Arc::new(summary.clone()));
        }
        found
    }

    /// Keeps a summary just made, in every tier; `ahead`: made ahead of need.
    /// What other replicas learned of `model`'s count, when there is a shared tier.
    pub async fn shared_calibration(&self, model: &str) -> Option<SharedCalibration> {
        self.shared.as_ref()?.calibration(model).await
    }

    /// Offers this replica's calibration of `model` to the others.
    pub async fn share_calibration(&self, model: &str, shared: &SharedCalibration) {
        if let Some(tier) = &self.shared {
            tier.put_calibration(model, shared).await;
        }
    }

    pub async fn keep(&self, key: CacheKey, summary: &Arc<CachedSummary>, ahead: bool) {
        if ahead {
            self.local.mark_made_ahead(key);
        }
        self.local.insert(key, summary.clone());
        if let Some(tier) = self.shared() {
            tier.put(&key, summary).await;
        }
    }

    /// Remembers, in every tier, that the summary of `flight` (a layout) is not worth making.
    pub async fn too_large(&self, flight: CacheKey) {
        self.local.remember_too_large(flight);
        if let Some(tier) = self.shared() {
            tier.mark_too_large(&flight).await;
        }
    }

    /// Before this replica makes the summary of one layout: the one another replica made, or
    /// is making (waited for while it holds the lease; a lease that runs out, its owner gone,
    /// is taken over). Without a shared tier: make it here.
    pub async fn claim(
        &self,
        key: &CacheKey,
        flight: &CacheKey,
        layout: &LayoutKey,
        bound: Duration,
    ) -> Claim {
        let Some(tier) = self.shared() else {
            return Claim::Make(None);
        };
        let claim = self.claim_on(tier, key, flight, layout, bound).await;
        match &claim {
            Claim::Made(summary) => self.local.insert(*key, Arc::new(summary.clone())),
            Claim::TooLarge => self.local.remember_too_large(*flight),
            Claim::Make(_) | Claim::TimedOut => {}
        }
        claim
    }

    async fn claim_on(
        &self,
        tier: &RedisTier,
        key: &CacheKey,
        flight: &CacheKey,
        layout: &LayoutKey,
        bound: Duration,
    ) -> Claim {
        let deadline = Instant::now() + bound;
        let mut poll = FIRST_POLL;
        let mut waiting: Option<WaitGauge> = None;
        loop {
            match tier.stored(key, flight).await {
                Stored::Summary(summary)
                    if (summary.cut, &summary.excluded, &summary.splits)
                        == (layout.0, &layout.1, &layout.2) =>
                {
                    waiting.take();
                    self.metrics.lease("joined");
                    return Claim::Made(summary);
                }
                Stored::TooLarge => return Claim::TooLarge,
                _ => {}
            }
            match tier.lease(flight).await {
                Lease::Held(guard) => {
                    let took_over = waiting.take().is_some();
                    self.metrics
                        .lease(if took_over { "taken_over" } else { "made" });
                    return Claim::Make(Some(guard));
                }
                Lease::Unavailable => return Claim::Make(None),
                Lease::Taken => {}
            }
            let now = Instant::now();
            if now >= deadline {
                waiting.take();
                self.metrics.lease("timeout");
                return Claim::TimedOut;
            }
            waiting.get_or_insert_with(|| WaitGauge::new(self.metrics.clone()));
            tokio::time::sleep(poll.min(deadline - now)).await;
            poll = (poll * 2).min(MAX_POLL);
        }
    }
}

/// Counts a request among those waiting on another replica's summary while it exists.
struct WaitGauge(Arc<Metrics>);

impl WaitGauge {
    fn new(metrics: Arc<Metrics>) -> WaitGauge {
        metrics.lease_waiting(true);
        WaitGauge(metrics)
    }
}

impl Drop for WaitGauge {
    fn drop(&mut self) {
        self.0.lease_waiting(false);
    }
}
