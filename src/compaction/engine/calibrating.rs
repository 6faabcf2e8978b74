//! Calibration samples: a forwarded body held until its upstream reports usage, then counted
//! off the response path to learn its model's weights.

use super::*;
/// One calibration sample, at debug: how far the count was from the upstream's before it.
pub(super) fn log_calibration(model: &str, counted: u64, learned: Learned) {
    let (used, ratio) = match learned {
        Learned::Used { ratio } => (true, ratio),
        Learned::Outlier { ratio } => (false, ratio),
    };
    tracing::debug!(
        target: "compactor::calibration",
        model,
        counted,
        estimated = (ratio * counted as f64).round() as u64,
        ratio = (ratio * 1000.0).round() / 1000.0,
        used,
        "calibration sample"
    );
}

/// A forwarded body whose upstream count will calibrate its model's estimate: the body is
/// held (a shared reference, not a copy) until the response reports its usage, then counted
/// by class on the planner's pool, off the response path.
pub struct CalibrationSample {
    inner: Arc<Inner>,
    api: ApiRequest,
    /// The upstream and model it calibrates ([`calibration_key`]).
    key: String,
    model: String,
    body: Bytes,
    claim: SampleClaim,
}

impl CalibrationSample {
    /// Learns from the upstream's count of the body's input tokens.
    pub fn record(self, counted: u64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let CalibrationSample {
                inner,
                api,
                key,
                model,
                body,
                claim,
            } = self;
            let (windows, store) = (&inner.planner.windows, &inner.planner.store);
            // A model new here starts from what the other replicas learned of it.
            if claim.is_first() && store.has_shared() {
                if let Some(shared) = store.shared_calibration(&key).await {
                    windows.seed_calibration(&claim, &shared);
                }
            }
            let claimed_model = model.clone();
            let configured = windows.configured_token_model(&model);
            let features = inner
                .pool
                .run(body.len(), move || match api.parse(&body) {
                    Ok(Parsed::Conversation(conversation))
                        if conversation.model.as_deref() == Some(claimed_model.as_str()) =>
                    {
                        // No count of the whole is below half the last message's estimate.
                        let floor = conversation
                            .messages
                            .last()
                            .map_or(0, |last| last.tokens(&configured) / 2);
                        conversation.features().map(|features| (features, floor))
                    }
                    _ => None,
                })
                .await;
            let Offloaded::Done(Some((features, floor))) = features else {
                return;
            };
            let Some(learned) = windows.calibrate(&claim, &features, counted, floor) else {
                return;
            };
            if let Some(shared) = windows.calibration_to_share(&claim) {
                store.share_calibration(&key, &shared).await;
            }
            log_calibration(&model, counted, learned);
            inner.metrics.calibration(learned.used(), learned.ratio());
        });
    }
}

impl CompactionEngine {
    /// The right to calibrate `model`'s count from the upstream's usage for this forwarded
    /// body, when the model is due a sample.
    pub fn calibration_sample(
        &self,
        api: &ApiRequest,
        upstream: &str,
        model: &str,
        compacted: &Compacted,
    ) -> Option<CalibrationSample> {
        // Bodies under every trigger by their size alone are sampled too (the parse is off
        // the response path): they are most of the traffic, and calibrate the count before a
        // conversation nears its trigger. Bodies left alone are not: their upstream count
        // includes what the body does not hold (a stored conversation, a previous response).
        if !compacted.outcome.counted && compacted.outcome.reason != Reason::UnderTriggerBySize {
            return None;
        }
        let claim = self
            .inner
            .planner
            .windows
            .calibration_claim(upstream, model)?;
        Some(CalibrationSample {
            inner: self.inner.clone(),
            api: api.clone(),
            key: calibration_key(upstream, model),
            model: model.to_string(),
            body: compacted.body.clone(),
            claim,
        })
    }
}
