//! Each model's context window and how it counts: from the `models` table, the window lowered
//! by what an upstream's context-length error taught, the count calibrated by what upstreams
//! reported (both kept in memory, per model name, bounded).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use quick_cache::sync::Cache;

use crate::compaction::calibration::{
    Calibrations, Learned as Calibrated, SampleClaim, SharedCalibration,
};
use crate::compaction::overflow::Overflow;
use crate::compaction::planner::size_bound::ModelBounds;
use crate::compaction::planner::tokens::{Encoding, ModelTable, TokenModel, Weights, FEATURES};
use crate::config::ModelConfig;

/// Model names whose learned window is remembered; past it the least used are forgotten.
const LEARNED_MODELS: usize = 1024;

pub struct Windows {
    table: ModelTable,
    bounds: ModelBounds,
    learned: Arc<Learned>,
}

/// What errors taught, kept across configuration reloads (they are facts about the upstreams).
struct Learned {
    /// Windows learned from errors.
    windows: Cache<String, LearnedWindow>,
    /// The smallest window ever learned (`u64::MAX` for none): the size bound must respect it.
    smallest: AtomicU64,
    calibrations: Calibrations,
}

impl Windows {
    pub fn new(models: &[ModelConfig]) -> Windows {
        Windows::carrying(models, None)
    }

    /// The table of `models`, with the windows `previous` learned.
    pub fn carrying(models: &[ModelConfig], previous: Option<&Windows>) -> Windows {
        let table = ModelTable::new(models);
        let learned = match previous {
            Some(previous) => previous.learned.clone(),
            None => Arc::new(Learned {
                windows: Cache::new(LEARNED_MODELS),
                smallest: AtomicU64::new(u64::MAX),
                calibrations: Calibrations::default(),
            }),
        };
        Windows {
            bounds: ModelBounds::of(&table),
            table,
            learned,
        }
    }

    /// How `model` counts on `upstream` (calibrated once that upstream has reported enough
    /// counts of it), with the smaller of its configured and learned windows.
    pub fn token_model(&self, upstream: &str, model: Option<&str>) -> TokenModel {
        let mut token_model = self.table.lookup(model);
        token_model.calibration =
            model
                .filter(|name| self.table.calibrates(name))
                .and_then(|name| {
                    self.learned
                        .calibrations
                        .weights(&calibration_key(upstream, name))
                });
        if let Some(learned) = model.and_then(|name| self.learned.windows.get(name)) {
            let learned = learned.in_estimate(token_model.calibration.is_some());
            token_model.max_input_tokens = Some(match token_model.max_input_tokens {
                Some(configured) => configured.min(learned),
                None => learned,
            });
        }
        token_model
    }

    /// The tokenizer `model` is counted with near a trigger, when compactor has it.
    pub fn encoding(&self, model: Option<&str>) -> Option<Encoding> {
        self.table.encoding(model)
    }

    /// The size bound's view of every model, learned windows and calibrations included.
    pub fn bounds(&self) -> ModelBounds {
        let learned = self.learned.smallest.load(Ordering::Relaxed);
        let (per_byte, per_message) = self.learned.calibrations.maxima();
        let mut bounds = self.bounds.with_calibration(per_byte, per_message);
        if learned != u64::MAX {
            bounds.min_window = Some(bounds.min_window.map_or(learned, |w| w.min(learned)));
        }
        bounds
    }

    /// Lowers the learned window of `model` to `window` (in the estimate's tokens), never
    /// raising it.
    pub fn learn_at_most(&self, model: &str, window: u64) {
        let lower = match self.learned.windows.get(model) {
            Some(known) => known.in_estimate(false).min(window),
            None => window,
        };
        self.learn(model, LearnedWindow::exact(lower));
    }

    /// The right to calibrate `model` on `upstream` from that upstream's count of this
    /// request, when one is due (and the model is calibrated at all).
    pub fn calibration_claim(&self, upstream: &str, model: &str) -> Option<SampleClaim> {
        if !self.table.calibrates(model) {
            return None;
        }
        let prior = Weights::prior(self.table.lookup(Some(model)).chars_per_token);
        self.learned
            .calibrations
            .claim(&calibration_key(upstream, model), prior)
    }

    pub fn calibrate(
        &self,
        claim: &SampleClaim,
        features: &[f64; FEATURES],
        counted: u64,
        floor: u64,
    ) -> Option<Calibrated> {
        self.learned
            .calibrations
            .learn(claim, features, counted, floor)
    }

    /// How `model` counts by its configured ratio alone (no calibration, no tokenizer).
    pub fn configured_token_model(&self, model: &str) -> TokenModel {
        self.table.lookup(Some(model))
    }

    /// Starts the claimed model from what other replicas learned.
    pub fn seed_calibration(&self, claim: &SampleClaim, shared: &SharedCalibration) {
        self.learned.calibrations.seed(claim, shared);
    }

    /// The claimed model's calibration to offer other replicas, when due.
    pub fn calibration_to_share(&self, claim: &SampleClaim) -> Option<SharedCalibration> {
        self.learned.calibrations.to_share(claim)
    }

    /// Waits until every calibration sample claimed so far is learned from or given up.
    pub async fn calibrations_idle(&self) {
        self.learned.calibrations.idle().await;
    }

    pub fn learn(&self, model: &str, window: LearnedWindow) {
        self.learned.windows.insert(model.to_string(), window);
        self.learned
            .smallest
            .fetch_min(window.in_estimate(false), Ordering::Relaxed);
    }
}

/// A window an upstream's error stated, and how much the estimate undercounted the same input
/// then (estimate over the upstream's count, at most 1).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LearnedWindow {
    pub limit: u64,
    pub scale: f64,
}

impl LearnedWindow {
    fn exact(limit: u64) -> LearnedWindow {
        LearnedWindow { limit, scale: 1.0 }
    }

    /// The window in the estimate's tokens: the stated limit once the model's count is
    /// calibrated (it counts like the upstream), else scaled by the undercount seen with it, so
    /// an uncalibrated estimate still stays under it. Kept apart, so a window learned before
    /// calibration does not stay shrunk by an undercount calibration has since fixed.
    pub fn in_estimate(&self, calibrated: bool) -> u64 {
        if calibrated {
            return self.limit;
        }
        ((self.limit as f64 * self.scale).floor() as u64).max(1)
    }
}

/// What an error teaches: its stated limit, and how much our estimate undercounted the
/// provider's count of the same input (never scaled up).
pub fn learned_window(overflow: &Overflow, estimated_input: u64) -> Option<LearnedWindow> {
    let limit = overflow.limit?;
    let scale = match overflow.input {
        Some(counted) if counted > estimated_input && counted > 0 => {
            estimated_input as f64 / counted as f64
        }
        _ => 1.0,
    };
    Some(LearnedWindow { limit, scale })
}

/// One calibration per upstream and model: two upstreams serving a model may count it apart,
/// and one that reports odd counts must not move the other's. Also the shared tier's key.
pub fn calibration_key(upstream: &str, model: &str) -> String {
    format!("{upstream}\u{1f}{model}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_learned_window_lowers_the_configured_one_and_the_bound() {
        let windows = Windows::new(&[ModelConfig {
            pattern: "gpt-4o*".into(),
            max_input_tokens: Some(128_000),
            ..ModelConfig::default()
        }]);
        assert_eq!(
            windows.token_model("mock", Some("gpt-4o")).max_input_tokens,
            Some(128_000)
        );
        windows.learn("gpt-4o", LearnedWindow::exact(8_000));
        windows.learn("local", LearnedWindow::exact(4_000));
        assert_eq!(
            windows.token_model("mock", Some("gpt-4o")).max_input_tokens,
            Some(8_000)
        );
        assert_eq!(
            windows.token_model("mock", Some("local")).max_input_tokens,
            Some(4_000)
        );
        assert_eq!(
            windows.token_model("mock", Some("other")).max_input_tokens,
            None
        );
        assert_eq!(windows.bounds().min_window, Some(4_000));
    }

    #[test]
    fn an_undercounting_estimate_scales_the_limit_down() {
        let overflow = Overflow {
            limit: Some(8_000),
            input: Some(10_000),
        };
        let undercounted = learned_window(&overflow, 5_000).unwrap();
        assert_eq!(undercounted.in_estimate(false), 4_000);
        assert_eq!(undercounted.in_estimate(true), 8_000);
        let overcounted = learned_window(&overflow, 12_000).unwrap();
        assert_eq!(overcounted.in_estimate(false), 8_000);
        let no_limit = Overflow {
            limit: None,
            input: Some(10),
        };
        assert_eq!(learned_window(&no_limit, 5), None);
    }
}
