//! A build without the `redis` feature has no shared tier: `cache.backend: redis` is refused at
//! startup, and the types the store names exist but are never made ([`RedisTier::new`] always
//! says why), so every method below is unreachable by construction.

use std::sync::Arc;

use crate::compaction::calibration::SharedCalibration;
use crate::compaction::planner::plan::CachedSummary;
use crate::compaction::summaries::cache::CacheKey;
use crate::config::RedisConfig;
use crate::metrics::Metrics;

/// No value of it exists.
#[derive(Clone, Copy)]
enum Absent {}

#[derive(Clone)]
pub struct RedisTier(Absent);

pub struct LeaseGuard(Absent);

pub enum Lease {
    Held(LeaseGuard),
    Taken,
    Unavailable,
}

pub enum Stored {
    Summary(CachedSummary),
    TooLarge,
    Nothing,
}

impl RedisTier {
    pub fn new(_config: &RedisConfig, _metrics: Arc<Metrics>) -> Result<RedisTier, String> {
        Err(WITHOUT.into())
    }

    pub fn made_with(&self, _config: &RedisConfig) -> bool {
        match self.0 {}
    }

    pub fn available(&self) -> bool {
        match self.0 {}
    }

    pub async fn get_many(&self, _keys: &[CacheKey]) -> Vec<(CacheKey, CachedSummary)> {
        match self.0 {}
    }

    pub async fn stored(&self, _key: &CacheKey, _flight: &CacheKey) -> Stored {
        match self.0 {}
    }

    pub async fn put(&self, _key: &CacheKey, _summary: &CachedSummary) {
        match self.0 {}
    }

    pub async fn calibration(&self, _model: &str) -> Option<SharedCalibration> {
        match self.0 {}
    }

    pub async fn put_calibration(&self, _model: &str, _shared: &SharedCalibration) {
        match self.0 {}
    }

    pub async fn mark_too_large(&self, _flight: &CacheKey) {
        match self.0 {}
    }

    pub async fn lease(&self, _flight: &CacheKey) -> Lease {
        match self.0 {}
    }
}

impl LeaseGuard {
    pub async fn release(self) {
        match self.0 {}
    }
}

/// Why a shared tier cannot be had.
pub const WITHOUT: &str = "cache.backend: redis needs a compactor built with the redis feature";
