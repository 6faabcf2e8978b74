//! Counting like the model: each model's estimate calibrated against the input counts its
//! upstream reports (`usage.prompt_tokens`, `input_tokens`). A sample is a request compactor
//! counted and forwarded, its features (characters by class, messages: see
//! [`crate::compaction::planner::tokens`]) and the upstream's count of the same body. Per model,
//! a ridge regression toward the configured ratio learns one weight per feature: a class never
//! seen keeps the configured weight, one seen often gets the upstream's.
//!
//! Bounded and robust: each sample is scaled to its own size (every request weighs the same,
//! whatever its length), older samples fade (half-life about 23 samples), a sample far from
//! the current fit counts for less (Huber) and one off by more than 5× not at all (a body the
//! upstream rewrote, a cached count). It cannot be dragged: every weight stays within a band
//! of [`PRIOR_BAND`]× around the configured ratio's, a count more than [`SAMPLE_BAND`]× off the
//! configured estimate of the whole request is not learned from (a real tokenizer is never that
//! far off), nor one under half the request's last message alone (an upstream that reports only
//! the tokens it evaluated after a prefix-cache hit, or a constant). Each upstream's fit of a
//! model is its own ([`crate::compaction::windows::calibration_key`]). The models known
//! are bounded (least used forgotten), and samples are taken sparingly: all of a model's first
//! [`EAGER_SAMPLES`], then one a second, never two at once.

use crate::poison::lock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quick_cache::sync::Cache;
use tokio::sync::watch;

use crate::compaction::planner::tokens::{Weights, FEATURES};

/// Models whose calibration is remembered.
const CALIBRATED_MODELS: usize = 1024;
/// Samples before a model's weights are used instead of the configured ratio.
pub const MIN_SAMPLES: u64 = 3;
/// A calibration is offered to the other replicas when it becomes usable and every this many
/// samples after.
const SHARE_EVERY: u64 = 16;
/// Samples taken as fast as they come before the rate drops to one per [`SAMPLE_INTERVAL`].
const EAGER_SAMPLES: u64 = 32;
const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);
/// How much each older sample still counts, per newer sample.
const FORGETTING: f64 = 0.97;
/// Relative error past which a sample counts for less (Huber's threshold).
const HUBER: f64 = 0.25;
/// Upstream count over estimate outside [1/5, 5]: not the same body, not learned from.
const OUTLIER_RATIO: f64 = 5.0;
/// How far a learned weight may move from the configured ratio's, either way: one class of
/// characters can cost several times what the ratio says (digits, punctuation).
pub const PRIOR_BAND: f64 = 4.0;
/// How far a whole request's count may be from the configured estimate to be learned from: over
/// a whole request the estimate is within about 40 % of a real tokenizer, so a count off by
/// twice that is not the body's count (a prefix-cache hit reported as new tokens only).
pub const SAMPLE_BAND: f64 = 2.0;
/// The most a feature whose configured weight is 0 (words, dense runs) may add per unit.
const MAX_EXTRA_WEIGHT: f64 = 1.0;
const MAX_MESSAGE_WEIGHT: f64 = 64.0;
/// The prior's strength, per feature, in the units of a sample scaled to one token: a few
/// percent of one sample's worth for a class that sample is made of (strong enough to hold the
/// classes no sample has shown, weak enough not to bias the ones seen), more for the message
/// framing, which the text's length would otherwise pass for.
const RIDGE: [f64; FEATURES] = [0.01, 0.01, 0.01, 0.01, 0.01, 0.01, 0.005, 0.005, 1e-3];

/// Every model's calibration, and what the size bound must allow for.
pub struct Calibrations {
    fits: Cache<String, Arc<Mutex<Fit>>>,
    /// The most tokens a byte costs under any weights learned so far (f64 bits; only grows).
    max_per_byte: AtomicU64,
    /// The most tokens a message's framing costs under any weights learned so far.
    max_per_message: AtomicU64,
    /// Samples claimed and not yet learned from or given up.
    pending: Arc<watch::Sender<usize>>,
}

/// What one sample did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Learned {
    /// Learned from; `ratio` is the estimate over the upstream's count before it.
    Used { ratio: f64 },
    /// Too far from the estimate to be the same body's count.
    Outlier { ratio: f64 },
}

impl Learned {
    pub fn used(self) -> bool {
        matches!(self, Learned::Used { .. })
    }

    /// The estimate over the upstream's count.
    pub fn ratio(self) -> f64 {
        match self {
            Learned::Used { ratio } | Learned::Outlier { ratio } => ratio,
        }
    }
}

struct Fit {
    prior: Weights,
    gram: [[f64; FEATURES]; FEATURES],
    moment: [f64; FEATURES],
    samples: u64,
    weights: Weights,
    last_sample: Option<Instant>,
    sampling: bool,
}

/// The right to take the next sample of a model; dropped unused, it frees the model for the
/// next request.
pub struct SampleClaim {
    fit: Arc<Mutex<Fit>>,
    pending: Arc<watch::Sender<usize>>,
}

impl Drop for SampleClaim {
    fn drop(&mut self) {
        lock(&self.fit).sampling = false;
        self.pending.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A model's calibration as replicas share it (through the summary store's shared tier).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SharedCalibration {
    pub weights: Vec<f64>,
    pub samples: u64,
}

impl SampleClaim {
    /// Whether this model has learned nothing yet here: the moment to ask other replicas.
    pub fn is_first(&self) -> bool {
        lock(&self.fit).samples == 0
    }
}

impl Default for Calibrations {
    fn default() -> Self {
        Calibrations {
            fits: Cache::new(CALIBRATED_MODELS),
            max_per_byte: AtomicU64::new(0f64.to_bits()),
            max_per_message: AtomicU64::new(0),
            pending: Arc::new(watch::channel(0).0),
        }
    }
}

impl Calibrations {
    /// The learned weights of `model`, once it has enough samples.
    pub fn weights(&self, model: &str) -> Option<Weights> {
        let fit = self.fits.get(model)?;
        let fit = lock(&fit);
        (fit.samples >= MIN_SAMPLES).then_some(fit.weights)
    }

    /// Whether a request of `model` should be sampled now; `prior` is its configured weights.
    pub fn claim(&self, model: &str, prior: Weights) -> Option<SampleClaim> {
        let fit = self
            .fits
            .get_or_insert_with(model, || {
                Ok::<_, std::convert::Infallible>(Arc::new(Mutex::new(Fit::new(prior))))
            })
            .ok()?;
        {
            let mut state = lock(&fit);
            let due = state.samples < EAGER_SAMPLES
                || state
                    .last_sample
                    .is_none_or(|at| at.elapsed() >= SAMPLE_INTERVAL);
            if state.sampling || !due {
                return None;
            }
            state.sampling = true;
        }
        self.pending.send_modify(|n| *n += 1);
        Some(SampleClaim {
            fit,
            pending: self.pending.clone(),
        })
    }

    /// Waits until every sample claimed so far has been learned from or given up.
    pub async fn idle(&self) {
        let mut pending = self.pending.subscribe();
        let _ = pending.wait_for(|n| *n == 0).await;
    }

    /// Learns from the upstream's count `counted` of a body with these features, whose last
    /// message alone counts `floor` by the configured estimate.
    pub fn learn(
        &self,
        claim: &SampleClaim,
        features: &[f64; FEATURES],
        counted: u64,
        floor: u64,
    ) -> Option<Learned> {
        let mut fit = lock(&claim.fit);
        let learned = fit.learn(features, counted, floor)?;
        if matches!(learned, Learned::Used { .. }) && fit.samples >= MIN_SAMPLES {
            self.raise_maxima(&fit.weights);
        }
        Some(learned)
    }

    /// Starts a model that has learned little here from what other replicas learned: their
    /// weights become its prior and its current fit.
    pub fn seed(&self, claim: &SampleClaim, shared: &SharedCalibration) {
        let Ok(weights) = <[f64; FEATURES]>::try_from(shared.weights.as_slice()) else {
            return;
        };
        let mut fit = lock(&claim.fit);
        let sane = weights.iter().enumerate().all(|(j, w)| {
            let (lower, upper) = bounds(&fit.prior, j);
            w.is_finite() && (lower..=upper).contains(w)
        });
        if !sane || shared.samples < MIN_SAMPLES {
            return;
        }
        if fit.samples >= MIN_SAMPLES {
            return;
        }
        let weights = Weights(weights);
        *fit = Fit {
            samples: MIN_SAMPLES,
            sampling: fit.sampling,
            ..Fit::new(weights)
        };
        self.raise_maxima(&weights);
    }

    /// This model's calibration to offer the other replicas, when one is due.
    pub fn to_share(&self, claim: &SampleClaim) -> Option<SharedCalibration> {
        let fit = lock(&claim.fit);
        let due = fit.samples == MIN_SAMPLES || (fit.samples > 0 && fit.samples % SHARE_EVERY == 0);
        due.then(|| SharedCalibration {
            weights: fit.weights.0.to_vec(),
            samples: fit.samples,
        })
    }

    fn raise_maxima(&self, weights: &Weights) {
        self.max_per_byte
            .fetch_max(weights.max_tokens_per_byte().to_bits(), Ordering::Relaxed);
        self.max_per_message
            .fetch_max(weights.0[Weights::MESSAGE].ceil() as u64, Ordering::Relaxed);
    }

    /// The most tokens per byte and per message any calibrated model may count, for the size
    /// bound (zero before any model is calibrated).
    pub fn maxima(&self) -> (f64, u64) {
        (
            f64::from_bits(self.max_per_byte.load(Ordering::Relaxed)),
            self.max_per_message.load(Ordering::Relaxed),
        )
    }
}

impl Fit {
    fn new(prior: Weights) -> Fit {
        let mut gram = [[0.0; FEATURES]; FEATURES];
        for (j, row) in gram.iter_mut().enumerate() {
            row[j] = RIDGE[j];
        }
        let moment = std::array::from_fn(|j| RIDGE[j] * prior.0[j]);
        Fit {
            prior,
            gram,
            moment,
            samples: 0,
            weights: prior,
            last_sample: None,
            sampling: false,
        }
    }

    fn learn(&mut self, features: &[f64; FEATURES], counted: u64, floor: u64) -> Option<Learned> {
        self.last_sample = Some(Instant::now());
        let estimate = self.weights.of(features);
        let configured = self.prior.of(features);
        if counted == 0 || estimate <= 0.0 || configured <= 0.0 {
            return None;
        }
        let ratio = estimate / counted as f64;
        // Measured against the configured estimate, which no sample moves, so a run of
        // samples each a little lower cannot walk the fit away step by step.
        let from_configured = configured / counted as f64;
        if counted < floor
            || !(1.0 / OUTLIER_RATIO..=OUTLIER_RATIO).contains(&ratio)
            || !(1.0 / SAMPLE_BAND..=SAMPLE_BAND).contains(&from_configured)
        {
            return Some(Learned::Outlier { ratio });
        }
        let error = (1.0 / ratio - 1.0).abs();
        let weight = if error <= HUBER { 1.0 } else { HUBER / error };
        // Scaled to one token, so every request weighs the same.
        let row: [f64; FEATURES] = std::array::from_fn(|j| features[j] / counted as f64);
        // The prior is never forgotten: only the samples' part of each sum fades.
        for j in 0..FEATURES {
            for k in 0..FEATURES {
                let ridge = if j == k { RIDGE[j] } else { 0.0 };
                self.gram[j][k] =
                    ridge + FORGETTING * (self.gram[j][k] - ridge) + weight * row[j] * row[k];
            }
            let ridge = RIDGE[j] * self.prior.0[j];
            self.moment[j] = ridge + FORGETTING * (self.moment[j] - ridge) + weight * row[j];
        }
        self.samples += 1;
        if let Some(solved) = solve_bounded(&self.gram, &self.moment, &self.prior) {
            self.weights = Weights(solved);
        }
        Some(Learned::Used { ratio })
    }
}

/// The band a learned weight of feature `j` stays in: [`PRIOR_BAND`]× either way of the
/// configured one; up to [`MAX_EXTRA_WEIGHT`] for a feature configured at 0; the message
/// framing up to [`MAX_MESSAGE_WEIGHT`].
fn bounds(prior: &Weights, j: usize) -> (f64, f64) {
    let configured = prior.0[j];
    if j == Weights::MESSAGE {
        (0.0, MAX_MESSAGE_WEIGHT)
    } else if configured <= 0.0 {
        (0.0, MAX_EXTRA_WEIGHT)
    } else {
        (configured / PRIOR_BAND, configured * PRIOR_BAND)
    }
}

/// Solves `gram · w = moment` with every weight within its band around `prior`: a weight the
/// unbounded solution puts outside is fixed at the bound and the rest solved again.
fn solve_bounded(
    gram: &[[f64; FEATURES]; FEATURES],
    moment: &[f64; FEATURES],
    prior: &Weights,
) -> Option<[f64; FEATURES]> {
    let lower = |j: usize| bounds(prior, j).0;
    let upper = |j: usize| bounds(prior, j).1;
    let mut fixed: [Option<f64>; FEATURES] = [None; FEATURES];
    for _ in 0..=FEATURES {
        let free: Vec<usize> = (0..FEATURES).filter(|&j| fixed[j].is_none()).collect();
        let mut a: Vec<Vec<f64>> = free
            .iter()
            .map(|&j| free.iter().map(|&k| gram[j][k]).collect())
            .collect();
        let mut b: Vec<f64> = free
            .iter()
            .map(|&j| {
                let known: f64 = (0..FEATURES)
                    .filter_map(|k| fixed[k].map(|v| gram[j][k] * v))
                    .sum();
                moment[j] - known
            })
            .collect();
        let solution = gaussian(&mut a, &mut b)?;
        let mut out_of_bounds = false;
        for (&j, &value) in free.iter().zip(&solution) {
            if value < lower(j) {
                fixed[j] = Some(lower(j));
                out_of_bounds = true;
            } else if value > upper(j) {
                fixed[j] = Some(upper(j));
                out_of_bounds = true;
            }
        }
        if !out_of_bounds {
            let mut weights = [0.0; FEATURES];
            for j in 0..FEATURES {
                weights[j] = fixed[j].unwrap_or(0.0);
            }
            for (&j, &value) in free.iter().zip(&solution) {
                weights[j] = value;
            }
            return Some(weights);
        }
    }
    None
}

/// Gaussian elimination with partial pivoting; None for a singular system.
fn gaussian(a: &mut [Vec<f64>], b: &mut [f64]) -> Option<Vec<f64>> {
    let n = b.len();
    for column in 0..n {
        let pivot =
            (column..n).max_by(|&i, &j| a[i][column].abs().total_cmp(&a[j][column].abs()))?;
        if a[pivot][column].abs() < 1e-12 {
            return None;
        }
        a.swap(column, pivot);
        b.swap(column, pivot);
        let (upper, lower) = a.split_at_mut(column + 1);
        let pivot_row = &upper[column];
        for (offset, row) in lower.iter_mut().enumerate() {
            let factor = row[column] / pivot_row[column];
            for (value, above) in row[column..].iter_mut().zip(&pivot_row[column..]) {
                *value -= factor * above;
            }
            b[column + 1 + offset] -= factor * b[column];
        }
    }
    let mut x = vec![0.0; n];
    for row in (0..n).rev() {
        let rest: f64 = (row + 1..n).map(|k| a[row][k] * x[k]).sum();
        x[row] = (b[row] - rest) / a[row][row];
    }
    x.iter().all(|v| v.is_finite()).then_some(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compaction::planner::tokens::CharCount;

    /// A made-up tokenizer with very different costs per class.
    fn true_tokens(chars: &CharCount, messages: u64) -> u64 {
        (chars.letters as f64 * 0.19
            + chars.words as f64 * 0.1
            + chars.digits as f64 * 0.9
            + chars.punct as f64 * 0.6
            + chars.spaces as f64 * 0.05
            + chars.wide as f64 * 1.9
            + messages as f64 * 5.0)
            .round() as u64
    }

    fn text(kind: usize, i: usize) -> String {
        match kind {
            0 => "The quick brown fox jumps over the lazy dog near the river bank. ".repeat(20 + i),
            1 => "fn main() { let x = vec![1, 2, 3]; println!(\"{x:?}\"); }\n".repeat(15 + i),
            2 => "{\"id\": 12345, \"ok\": true, \"tags\": [\"a\", \"b\"]}".repeat(12 + i),
            _ => "日本語のテキストと中文的句子。".repeat(30 + i),
        }
    }

    fn learn_some(calibrations: &Calibrations, kinds: &[usize], rounds: usize) {
        for i in 0..rounds {
            for &kind in kinds {
                let chars = CharCount::of_str(&text(kind, i));
                let claim = calibrations.claim("m", Weights::prior(4.0)).unwrap();
                calibrations.learn(&claim, &chars.features(4), true_tokens(&chars, 4), 0);
            }
        }
    }

    #[test]
    fn each_class_converges_to_the_upstreams_count() {
        let calibrations = Calibrations::default();
        assert_eq!(calibrations.weights("m"), None);
        learn_some(&calibrations, &[0, 1, 2, 3], 6);
        let weights = calibrations.weights("m").unwrap();
        for kind in 0..4 {
            let chars = CharCount::of_str(&text(kind, 8));
            let real = true_tokens(&chars, 4) as f64;
            let estimate = weights.of(&chars.features(4));
            let error = (estimate / real - 1.0).abs();
            assert!(error < 0.05, "kind {kind}: {estimate} vs {real}");
            let prior = Weights::prior(4.0).of(&chars.features(4));
            assert!(
                (prior / real - 1.0).abs() > 0.1,
                "kind {kind} was already right"
            );
        }
    }

    #[test]
    fn a_class_never_seen_keeps_the_configured_weight() {
        let calibrations = Calibrations::default();
        learn_some(&calibrations, &[0], 10);
        let weights = calibrations.weights("m").unwrap();
        let wide = weights.0[5];
        assert!((wide - 1.0).abs() < 0.05, "{wide}");
    }

    #[test]
    fn outliers_are_not_learned_and_one_sample_at_a_time() {
        let calibrations = Calibrations::default();
        let chars = CharCount::of_str(&text(0, 0));
        let claim = calibrations.claim("m", Weights::prior(4.0)).unwrap();
        assert!(calibrations.claim("m", Weights::prior(4.0)).is_none());
        let learned = calibrations.learn(&claim, &chars.features(1), 10, 0);
        drop(claim);
        assert!(matches!(learned, Some(Learned::Outlier { .. })));
        // A dropped claim frees the model.
        drop(calibrations.claim("m", Weights::prior(4.0)));
        assert!(calibrations.claim("m", Weights::prior(4.0)).is_some());
        assert_eq!(calibrations.maxima(), (0.0, 0));
    }

    #[test]
    fn a_shared_calibration_seeds_a_model_new_here_and_is_offered_when_due() {
        let learned = Calibrations::default();
        learn_some(&learned, &[0, 3], 2);
        let claim = learned.claim("m", Weights::prior(4.0)).unwrap();
        let shared = learned.to_share(&claim);
        assert_eq!(
            shared.as_ref().map(|s| s.samples),
            None,
            "4 samples: not due"
        );
        drop(claim);
        learn_some(&learned, &[0, 3], 6);
        let claim = learned.claim("m", Weights::prior(4.0)).unwrap();
        let shared = learned.to_share(&claim).expect("16 samples: due");
        drop(claim);

        let fresh = Calibrations::default();
        let claim = fresh.claim("m", Weights::prior(4.0)).unwrap();
        assert!(claim.is_first());
        fresh.seed(&claim, &shared);
        assert_eq!(
            fresh.weights("m").map(|w| w.0.to_vec()),
            Some(shared.weights.clone())
        );
        assert!(fresh.maxima().0 > 0.0, "the size bound allows for it");
        // Nonsense is not taken.
        let other = fresh.claim("n", Weights::prior(4.0)).unwrap();
        fresh.seed(
            &other,
            &SharedCalibration {
                weights: vec![f64::NAN; FEATURES],
                samples: 40,
            },
        );
        assert_eq!(fresh.weights("n"), None);
    }

    #[test]
    fn the_size_bound_maxima_cover_every_learned_weight() {
        let calibrations = Calibrations::default();
        learn_some(&calibrations, &[3], 5);
        let (per_byte, per_message) = calibrations.maxima();
        let weights = calibrations.weights("m").unwrap();
        assert!(per_byte >= weights.max_tokens_per_byte());
        assert!(per_byte >= weights.0[5] / 3.0);
        assert!(per_message as f64 >= weights.0[Weights::MESSAGE]);
    }
}
