//! Each model's context window: from the `models` table, lowered by what an upstream's
//! context-length error taught (kept in memory, per model name, bounded).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use quick_cache::sync::Cache;

use crate::compaction::overflow::Overflow;
use crate::compaction::planner::size_bound::ModelBounds;
use crate::compaction::planner::tokens::{ModelTable, TokenModel};
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
    /// Windows learned from errors, in the estimate's tokens.
    windows: Cache<String, u64>,
    /// The smallest window ever learned (`u64::MAX` for none): the size bound must respect it.
    smallest: AtomicU64,
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
            }),
        };
        Windows {
            bounds: ModelBounds::of(&table),
            table,
            learned,
        }
    }

    /// How `model` counts, with the smaller of its configured and learned windows.
    pub fn token_model(&self, model: Option<&str>) -> TokenModel {
        let mut token_model = self.table.lookup(model);
        if let Some(learned) = model.and_then(|name| self.learned.windows.get(name)) {
            token_model.max_input_tokens = Some(match token_model.max_input_tokens {
                Some(configured) => configured.min(learned),
                None => learned,
            });
        }
        token_model
    }

    /// The size bound's view of every model, learned windows included.
    pub fn bounds(&self) -> ModelBounds {
        let learned = self.learned.smallest.load(Ordering::Relaxed);
        let mut bounds = self.bounds;
        if learned != u64::MAX {
            bounds.min_window = Some(bounds.min_window.map_or(learned, |w| w.min(learned)));
        }
        bounds
    }

    /// Lowers the learned window of `model` to `window`, never raising it.
    pub fn learn_at_most(&self, model: &str, window: u64) {
        let lower = match self.learned.windows.get(model) {
            Some(known) => known.min(window),
            None => window,
        };
        self.learn(model, lower);
    }

    pub fn learn(&self, model: &str, window: u64) {
        self.learned.windows.insert(model.to_string(), window);
        self.learned.smallest.fetch_min(window, Ordering::Relaxed);
    }
}

/// What an error teaches, in the estimate's tokens: its stated limit, scaled by how much our
/// estimate undercounted the provider's count of the same input (never scaled up).
pub fn learned_window(overflow: &Overflow, estimated_input: u64) -> Option<u64> {
    let limit = overflow.limit?;
    let scale = match overflow.input {
        Some(counted) if counted > estimated_input && counted > 0 => {
            estimated_input as f64 / counted as f64
        }
        _ => 1.0,
    };
    Some(((limit as f64 * scale).floor() as u64).max(1))
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
            windows.token_model(Some("gpt-4o")).max_input_tokens,
            Some(128_000)
        );
        windows.learn("gpt-4o", 8_000);
        windows.learn("local", 4_000);
        assert_eq!(
            windows.token_model(Some("gpt-4o")).max_input_tokens,
            Some(8_000)
        );
        assert_eq!(
            windows.token_model(Some("local")).max_input_tokens,
            Some(4_000)
        );
        assert_eq!(windows.token_model(Some("other")).max_input_tokens, None);
        assert_eq!(windows.bounds().min_window, Some(4_000));
    }

    #[test]
    fn an_undercounting_estimate_scales_the_limit_down() {
        let overflow = Overflow {
            limit: Some(8_000),
            input: Some(10_000),
        };
        assert_eq!(learned_window(&overflow, 5_000), Some(4_000));
        assert_eq!(learned_window(&overflow, 12_000), Some(8_000));
        let no_limit = Overflow {
            limit: None,
            input: Some(10),
        };
        assert_eq!(learned_window(&no_limit, 5), None);
    }
}
