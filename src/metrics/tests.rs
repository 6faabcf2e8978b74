use super::*;

#[test]
fn model_labels_are_the_configured_patterns_only() {
    let config = Config::from_yaml_with_env(
            "upstreams:\n  - name: a\n    base_url: http://x/v1\n    models: [\"*\"]\n  - name: b\n    base_url: http://y/v1\n    models: [\"llama-*\", \"gpt-4o*\"]\nmodels:\n  - match: \"gpt-4o*\"\n  - match: \"claude*\"\n",
            &|_| None,
        )
        .unwrap();
    let labels = ModelLabels::new(&config);
    assert_eq!(labels.label("gpt-4o-mini").as_deref(), Some("gpt-4o*"));
    assert_eq!(
        labels.label("claude-sonnet-4-5").as_deref(),
        Some("claude*")
    );
    assert_eq!(labels.label("llama-3"), Some(Arc::from("llama-*")));
    assert_eq!(labels.label("made-up-by-a-client"), None);
    assert_eq!(labels.patterns.len(), 3, "no duplicate, no bare *");
}

#[test]
fn a_disabled_registry_counts_nothing() {
    let metrics = Metrics::new(false);
    metrics.finished(&Finished {
        route: Route::Api("chat_completions"),
        status: 200,
        upstream: None,
        model: None,
        duration: Duration::from_millis(5),
        first_byte: None,
        overhead: None,
        usage: None,
        compaction: None,
    });
    assert!(!metrics
        .render(Gauges::default())
        .contains("compactor_requests_total{"));
}
