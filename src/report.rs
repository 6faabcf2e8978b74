//! `compactor report`: what audit mode's metrics say enforce would have done with the traffic
//! a running compactor has seen, in words. Pure: the metrics text in, the report out.

/// The sum of the samples of `name` whose labels hold every `label="value"` of `with`.
fn total(metrics: &str, name: &str, with: &[&str]) -> f64 {
    metrics
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (metric, labels) = match series.split_once('{') {
                Some((metric, labels)) => (metric, labels),
                None => (series, ""),
            };
            (metric == name && with.iter().all(|label| labels.contains(label)))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

/// The report of the audit metrics in `metrics` (Prometheus text, as `/metrics` serves it).
pub fn audit(metrics: &str) -> String {
    let outcomes = [
        "summarized",
        "reused",
        "cleared",
        "truncated",
        "skipped",
        "failed",
    ];
    let by_outcome: Vec<(&str, f64)> = outcomes
        .iter()
        .map(|&outcome| {
            let label = format!("outcome=\"{outcome}\"");
            (outcome, total(metrics, "compactor_audit_total", &[&label]))
        })
        .collect();
    let audited: f64 = by_outcome.iter().map(|(_, n)| n).sum();
    if audited == 0.0 {
        return "No request was audited: set `summarization.mode: audit` (or `mode: audit` on a \
                client key) and send traffic through compactor.\n"
            .to_string();
    }
    let saved = total(metrics, "compactor_audit_tokens_saved_total", &[]);
    let input = total(
        metrics,
        "gen_ai_client_token_usage_sum",
        &["gen_ai_token_type=\"input\""],
    );
    let spent = total(metrics, "compactor_audit_summarizer_tokens_total", &[]);
    let breaks = total(metrics, "compactor_audit_prefix_breaks_total", &[]);
    let shadow = total(metrics, "compactor_audit_shadow_summaries_total", &[]);
    let mut out = format!("Audited requests: {audited:.0}, forwarded as they came.\n");
    out.push_str("What enforce would have done with them:\n");
    for (outcome, n) in by_outcome.iter().filter(|(_, n)| *n > 0.0) {
        out.push_str(&format!("  {outcome:<11} {n:.0}\n"));
    }
    out.push_str(&format!(
        "Input tokens it would have kept from the upstreams: {saved:.0}"
    ));
    if input > 0.0 {
        let share = 100.0 * saved / (input + saved);
        out.push_str(&format!(
            " ({share:.1} % of the {:.0} they would have counted)",
            input + saved
        ));
    }
    out.push_str(&format!(
        "\nSummarizer tokens it would have spent for that: {spent:.0}\n\
         Requests where a new summary would have ended the upstream's cached prefix: {breaks:.0}\n\
         Summaries made for real off the request path (shadow_sample): {shadow:.0}\n"
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_audit_metrics_read_as_what_enforce_would_have_saved() {
        let metrics = "# TYPE compactor_audit counter\n\
            compactor_audit_total{outcome=\"summarized\"} 3\n\
            compactor_audit_total{outcome=\"reused\"} 5\n\
            compactor_audit_total{outcome=\"skipped\"} 12\n\
            compactor_audit_total{outcome=\"failed\"} 0\n\
            compactor_audit_tokens_saved_total 30000\n\
            compactor_audit_summarizer_tokens_total 9000\n\
            compactor_audit_prefix_breaks_total 3\n\
            compactor_audit_shadow_summaries_total 0\n\
            gen_ai_client_token_usage_sum{gen_ai_operation_name=\"chat\",gen_ai_token_type=\"input\"} 70000\n\
            gen_ai_client_token_usage_sum{gen_ai_operation_name=\"chat\",gen_ai_token_type=\"output\"} 999\n";
        let report = audit(metrics);
        assert!(report.contains("Audited requests: 20"), "{report}");
        assert!(
            report.contains("  summarized  3\n  reused      5\n  skipped     12\n"),
            "{report}"
        );
        assert!(!report.contains("failed"), "{report}");
        assert!(report.contains("30000 (30.0 % of the 100000"), "{report}");
        assert!(report.contains("spent for that: 9000"), "{report}");
        assert!(audit("").starts_with("No request was audited"));
    }
}
