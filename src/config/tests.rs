use super::*;

const MINIMAL: &str = "upstreams:\n  - name: a\n    base_url: http://127.0.0.1:9/v1\n";

fn no_env(_: &str) -> Option<String> {
    None
}

#[test]
fn minimal_config_gets_defaults() {
    let config = Config::from_yaml_with_env(MINIMAL, &no_env).expect("valid");
    assert_eq!(config.listen, "127.0.0.1:8080");
    assert_eq!(config.prefix, "/v1");
    assert_eq!(config.upstreams[0].models, vec!["*".to_string()]);
    assert_eq!(config.limits.max_request_body_bytes, 32 * 1024 * 1024);
    assert!(!config.summarization.enabled);
    assert_eq!(config.summarization.trim_tokens_to_summarize, None);
    assert_eq!(config.summarization.headroom, Some(0.75));
}

#[test]
fn native_compaction_is_served_where_keys_are_set_and_the_provider_lacks_it() {
    let yaml = "upstreams:
  - name: vllm
    base_url: http://127.0.0.1:9/v1
  - name: openai
    base_url: https://api.openai.com/v1
  - name: anthropic
    api: anthropic
    base_url: https://api.anthropic.com/v1
  - name: forced
    base_url: https://API.OPENAI.COM:443/v1
    native_compaction: serve
  - name: kept
    base_url: http://127.0.0.1:9/v1
    native_compaction: pass
summarization: {enabled: true, model_name: m}
sealing: {keys: [\"${SEAL}\"]}
";
    let env = |name: &str| (name == "SEAL").then(|| "0123456789abcdef".to_string());
    let config = Config::from_yaml_with_env(yaml, &env).expect("valid");
    let served: Vec<bool> = config
        .upstreams
        .iter()
        .map(|u| u.serves_native_compaction(&config.sealing))
        .collect();
    assert_eq!(served, [true, false, false, true, false]);
    // Without keys, auto passes everything.
    let unsealed = SealingConfig::default();
    assert!(!config.upstreams[0].serves_native_compaction(&unsealed));
}

#[test]
fn serving_native_compaction_needs_long_keys_and_a_summarizer() {
    let yaml = "upstreams:
  - name: a
    base_url: http://127.0.0.1:9/v1
    native_compaction: serve
";
    let err = Config::from_yaml_with_env(yaml, &no_env)
        .unwrap_err()
        .to_string();
    assert!(err.contains("serve needs sealing.keys"), "{err}");
    assert!(err.contains("serve needs summarization.enabled"), "{err}");
    let short = format!("{MINIMAL}sealing: {{keys: [short]}}\n");
    let err = Config::from_yaml_with_env(&short, &no_env)
        .unwrap_err()
        .to_string();
    assert!(err.contains("sealing.keys[0]"), "{err}");
}

#[test]
fn unknown_key_is_named_with_its_line() {
    let yaml = "upstreams:\n  - name: a\n    base_url: http://x/v1\n    bogus: 1\n";
    let err = Config::from_yaml_with_env(yaml, &no_env)
        .unwrap_err()
        .to_string();
    assert!(err.contains("bogus"), "{err}");
    assert!(err.contains("line 4"), "{err}");
}

#[test]
fn env_vars_expand_with_defaults_and_fail_when_missing() {
    let env = |name: &str| (name == "KEY").then(|| "sk-live".to_string());
    assert_eq!(expand_vars("${KEY}", &env).unwrap(), "sk-live");
    assert_eq!(expand_vars("a${NOPE:-b}c", &env).unwrap(), "abc");
    assert_eq!(expand_vars("${NOPE:-}", &env).unwrap(), "");
    assert_eq!(expand_vars("cost $$5", &env).unwrap(), "cost $5");
    assert!(expand_vars("${NOPE}", &env).unwrap_err().contains("NOPE"));
    let yaml = "upstreams:\n  - name: a\n    base_url: http://x/v1\n    api_key: ${MISSING}\n";
    let err = Config::from_yaml_with_env(yaml, &no_env)
        .unwrap_err()
        .to_string();
    assert!(err.contains("upstreams[0].api_key"), "{err}");
}

#[test]
fn secrets_are_redacted_in_check_output_and_debug() {
    let env = |_: &str| Some("sk-very-secret".to_string());
    let yaml = "upstreams:\n  - name: a\n    base_url: http://x/v1\n    api_key: ${K}\n    headers:\n      x-api-key: ${K}\n";
    let config = Config::from_yaml_with_env(yaml, &env).unwrap();
    assert_eq!(
        config.upstreams[0].api_key.as_ref().unwrap().expose(),
        "sk-very-secret"
    );
    let rendered = config.redacted_yaml();
    assert!(!rendered.contains("sk-very-secret"), "{rendered}");
    assert!(!format!("{config:?}").contains("sk-very-secret"));
}

#[test]
fn bad_values_are_all_reported_with_their_keys() {
    let yaml = r#"
listen: nope
upstreams:
  - name: a
    base_url: ftp://x
summarization:
  trigger:
    - {type: fraction, value: 1.5}
    - {type: tokens, value: 0}
  keep: {type: messages, value: 0}
  summary_prompt: "no placeholder"
  upstream: ghost
"#;
    let err = Config::from_yaml_with_env(yaml, &no_env)
        .unwrap_err()
        .to_string();
    for key in [
        "listen:",
        "upstreams[0].base_url",
        "summarization.trigger[0]",
        "summarization.trigger[1]",
        "summarization.keep",
        "summarization.summary_prompt",
        "summarization.upstream",
    ] {
        assert!(err.contains(key), "missing {key} in {err}");
    }
}

#[test]
fn missing_required_keys_are_all_reported() {
    let yaml = "upstreams:\n  - models: [\"*\"]\nmodels:\n  - max_input_tokens: 10\n";
    let err = Config::from_yaml_with_env(yaml, &no_env)
        .unwrap_err()
        .to_string();
    for key in [
        "upstreams[0].name",
        "upstreams[0].base_url",
        "models[0].match",
    ] {
        assert!(err.contains(key), "missing {key} in {err}");
    }
    let err = Config::from_yaml_with_env("listen: 127.0.0.1:1\n", &no_env)
        .unwrap_err()
        .to_string();
    assert!(err.contains("upstreams: at least one upstream"), "{err}");
}

#[test]
fn unknown_trigger_type_is_rejected() {
    let yaml = format!("{MINIMAL}summarization:\n  trigger: [{{type: bananas, value: 3}}]\n");
    let err = Config::from_yaml_with_env(&yaml, &no_env)
        .unwrap_err()
        .to_string();
    assert!(err.contains("summarization"), "{err}");
}

#[test]
fn deerflow_block_loads_as_is() {
    let yaml = format!(
        "{MINIMAL}{}",
        r#"summarization:
  enabled: true
  model_name: gpt-4o-mini
  trigger:
    type: tokens
    value: 4000
  keep:
    type: messages
    value: 20
  trim_tokens_to_summarize: null
  summary_prompt: null
  preserve_recent_skill_count: 5
  preserve_recent_skill_tokens: 25000
  preserve_recent_skill_tokens_per_skill: 5000
  skill_file_read_tool_names: [read_file, read, view, cat]
"#
    );
    let config = Config::from_yaml_with_env(&yaml, &no_env).expect("loads");
    assert_eq!(
        config.summarization.trigger.to_vec(),
        vec![ContextSize::Tokens(4000)]
    );
    assert_eq!(config.summarization.trim_tokens_to_summarize, None);
}

#[cfg(feature = "redis")]
#[test]
fn a_redis_cluster_is_named_by_its_nodes_instead_of_a_url() {
    let redis = |block: &str| {
        format!("{MINIMAL}cache:\n  backend: redis\n  redis:\n    signing_key: a-signing-key-of-16-bytes\n{block}")
    };
    let cluster = redis("    cluster: [\"redis://127.0.0.1:7001\", \"redis://127.0.0.1:7002\"]\n");
    let config = Config::from_yaml_with_env(&cluster, &no_env).expect("valid");
    assert_eq!(config.cache.redis.cluster.len(), 2);
    for (block, problem) in [
        (
            "    url: redis://127.0.0.1:6379\n    cluster: [\"redis://127.0.0.1:7001\"]\n",
            "one or the other",
        ),
        (
            "    cluster: [\"http://127.0.0.1:7001\"]\n",
            "cache.redis.cluster[0]",
        ),
        ("", "cache.redis.url (or cache.redis.cluster): required"),
    ] {
        let err = Config::from_yaml_with_env(&redis(block), &no_env)
            .unwrap_err()
            .to_string();
        assert!(err.contains(problem), "{err}");
    }
}

#[cfg(not(feature = "redis"))]
#[test]
fn without_the_redis_feature_a_redis_cache_is_refused_with_why() {
    let yaml = format!("{MINIMAL}cache:\n  backend: redis\n  redis:\n    url: redis://127.0.0.1:6379\n    signing_key: a-signing-key-of-16-bytes\n");
    let err = Config::from_yaml_with_env(&yaml, &no_env)
        .unwrap_err()
        .to_string();
    assert!(err.contains("redis feature"), "{err}");
}
