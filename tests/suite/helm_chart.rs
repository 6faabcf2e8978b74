//! The Helm chart in `deploy/helm/compactor`, as the real `helm template` renders it: it parses
//! as Kubernetes YAML, holds the probes, ports, config mount, drain timing and security
//! context, its ConfigMap is a proxy.yaml compactor accepts, and the optional objects come and
//! go with their values.
//!
//! Helm is not packaged for the machines CI runs on, so `scripts/helm-golden.sh` renders the
//! chart with helm into `deploy/helm/rendered/` and those files are checked in; each records a
//! digest of the chart it came from, and the first test fails when the chart has changed
//! since (run the script again). `scripts/helm-golden.sh --check` re-renders and compares.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/helm/compactor");
const RENDERED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/helm/rendered");

/// The digest `scripts/helm-golden.sh` writes: every file of the chart, by path (`./…`) in
/// byte order, each as its path, a newline, its bytes.
fn chart_digest() -> String {
    fn files(dir: &Path, relative: &str, out: &mut Vec<(String, std::path::PathBuf)>) {
        for entry in std::fs::read_dir(dir).expect("the chart is readable") {
            let entry = entry.expect("entry");
            let name = format!("{relative}/{}", entry.file_name().to_string_lossy());
            if entry.path().is_dir() {
                files(&entry.path(), &name, out);
            } else {
                out.push((name, entry.path()));
            }
        }
    }
    let mut all = Vec::new();
    files(Path::new(CHART), ".", &mut all);
    all.sort();
    let mut hasher = Sha256::new();
    for (name, path) in all {
        hasher.update(name.as_bytes());
        hasher.update(b"\n");
        hasher.update(std::fs::read(path).expect("a chart file"));
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn the_rendered_files_are_of_the_chart_as_it_is() {
    let digest = chart_digest();
    for case in ["default", "optional", "redis"] {
        let rendered = read(Path::new(RENDERED).join(format!("{case}.yaml")));
        let first = rendered.lines().next().unwrap_or("");
        assert!(
            first.ends_with(&format!("sha256:{digest}")),
            "deploy/helm/rendered/{case}.yaml was rendered from another chart: run scripts/helm-golden.sh ({first})"
        );
    }
}

fn read(path: impl AsRef<Path>) -> String {
    std::fs::read_to_string(path.as_ref())
        .unwrap_or_else(|e| panic!("{}: {e}", path.as_ref().display()))
}

/// A YAML scalar as the text an environment variable would hold.
fn text_of(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn yaml(text: &str) -> Value {
    serde_yaml_ng::from_str(text).unwrap_or_else(|e| panic!("not YAML ({e}):\n{text}"))
}

/// The objects helm rendered for `case` (see `scripts/helm-golden.sh`), by kind (the first of
/// each) and by `kind/name`.
fn render_all(case: &str) -> HashMap<String, Value> {
    let rendered = read(Path::new(RENDERED).join(format!("{case}.yaml")));
    let mut objects = HashMap::new();
    for document in rendered.split("\n---\n") {
        let object = yaml(document);
        if object.is_null() {
            continue;
        }
        let kind = object["kind"].as_str().expect("a kind").to_string();
        let object_name = object["metadata"]["name"]
            .as_str()
            .expect("a name")
            .to_string();
        assert!(object["apiVersion"].is_string(), "{case}: {kind}");
        assert!(object_name.starts_with("prod-compactor"), "{case}: {kind}");
        objects.insert(format!("{kind}/{object_name}"), object.clone());
        objects.entry(kind).or_insert(object);
    }
    objects
}

#[test]
fn the_chart_renders_a_deployment_with_probes_ports_drain_and_config() {
    let objects = render_all("default");
    let mut kinds: Vec<&str> = objects
        .keys()
        .map(String::as_str)
        .filter(|k| !k.contains('/'))
        .collect();
    kinds.sort();
    assert_eq!(kinds, ["ConfigMap", "Deployment", "Secret", "Service"]);

    let deployment = &objects["Deployment"];
    let pod = &deployment["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(deployment["spec"]["replicas"], 2);
    assert_eq!(container["image"], "compactor:0.1.0");
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["readinessProbe"]["httpGet"]["port"], "admin");
    let ports: Vec<(Value, Value)> = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["name"].clone(), p["containerPort"].clone()))
        .collect();
    assert_eq!(
        ports,
        [(json!("http"), json!(8080)), (json!("admin"), json!(9090))]
    );
    // The drain: preStop pause, then shutdown_grace_secs, within the grace period.
    assert_eq!(
        container["lifecycle"]["preStop"]["exec"]["command"],
        json!(["sleep", "5"])
    );
    assert_eq!(pod["terminationGracePeriodSeconds"], 40);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(container["securityContext"]["readOnlyRootFilesystem"], true);
    assert_eq!(
        container["securityContext"]["capabilities"]["drop"],
        json!(["ALL"])
    );
    assert_eq!(
        container["envFrom"][0]["secretRef"]["name"],
        "prod-compactor"
    );
    // The config is mounted where the container reads it.
    assert_eq!(container["volumeMounts"][0]["mountPath"], "/etc/compactor");
    assert_eq!(pod["volumes"][0]["configMap"]["name"], "prod-compactor");
    // Chosen through COMPACTOR_CONFIG (what `compactor health` reads too), not --config.
    assert_eq!(
        container["env"][0],
        json!({"name": "COMPACTOR_CONFIG", "value": "/etc/compactor/proxy.yaml"})
    );
    assert!(!container["args"]
        .as_array()
        .unwrap()
        .contains(&json!("--config")));

    // The ConfigMap's proxy.yaml is one compactor accepts, listening where the pod expects.
    let proxy_yaml = objects["ConfigMap"]["data"]["proxy.yaml"].as_str().unwrap();
    let env = |name: &str| (name == "OPENAI_API_KEY").then(|| "sk-from-secret".to_string());
    let config = compactor::config::Config::from_yaml_with_env(proxy_yaml, &env)
        .unwrap_or_else(|e| panic!("the chart's config is refused: {e}"));
    assert_eq!(config.listen, "0.0.0.0:8080");
    assert_eq!(config.admin.listen.as_deref(), Some("0.0.0.0:9090"));
    assert_eq!(config.shutdown_grace_secs, 30.0);
    assert!(
        config.reload.watch,
        "a ConfigMap change is picked up in place"
    );

    let service = &objects["Service"];
    assert_eq!(
        service["spec"]["selector"]["app.kubernetes.io/instance"],
        "prod"
    );
    assert_eq!(service["spec"]["ports"][1]["targetPort"], "admin");
    assert_eq!(objects["Secret"]["stringData"]["OPENAI_API_KEY"], "");
}

#[test]
fn autoscaling_a_service_monitor_and_an_existing_secret_are_optional() {
    // autoscaling, serviceMonitor on; existingSecret llm-keys; nodeSelector pool: gateway.
    let objects = render_all("optional");
    assert!(!objects.contains_key("Secret"));
    let deployment = &objects["Deployment"];
    assert!(
        deployment["spec"].get("replicas").is_none(),
        "the HPA owns replicas"
    );
    let pod = &deployment["spec"]["template"]["spec"];
    assert_eq!(
        pod["containers"][0]["envFrom"][0]["secretRef"]["name"],
        "llm-keys"
    );
    assert_eq!(pod["nodeSelector"]["pool"], "gateway");
    let hpa = &objects["HorizontalPodAutoscaler"];
    assert_eq!(hpa["spec"]["scaleTargetRef"]["name"], "prod-compactor");
    assert_eq!(hpa["spec"]["maxReplicas"], 10);
    let monitor = &objects["ServiceMonitor"];
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "admin");
    assert_eq!(monitor["spec"]["endpoints"][0]["path"], "/metrics");
}

#[test]
fn a_redis_deployed_with_the_chart_is_the_replicas_shared_cache() {
    // redis.deploy on.
    let objects = render_all("redis");
    let redis = &objects["Deployment/prod-compactor-redis"];
    let proxy = &objects["Deployment/prod-compactor"];
    assert_eq!(redis["spec"]["replicas"], 1);
    assert_eq!(
        objects["Service/prod-compactor-redis"]["spec"]["ports"][0]["port"],
        6379
    );
    // The proxy's Service never sends traffic to the Redis pod, nor Redis's to a proxy pod.
    let proxy_selector = &objects["Service/prod-compactor"]["spec"]["selector"];
    let redis_labels = &redis["spec"]["template"]["metadata"]["labels"];
    assert_ne!(
        proxy_selector["app.kubernetes.io/component"],
        redis_labels["app.kubernetes.io/component"]
    );
    assert_eq!(
        proxy["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"],
        "proxy"
    );
    let proxy_yaml = objects["ConfigMap"]["data"]["proxy.yaml"].as_str().unwrap();
    let secret = objects["Secret"]["stringData"]["COMPACTOR_CACHE_SIGNING_KEY"]
        .as_str()
        .expect("the signing key is in the chart's Secret")
        .to_string();
    let env = |name: &str| (name == "COMPACTOR_CACHE_SIGNING_KEY").then(|| secret.clone());
    let config = compactor::config::Config::from_yaml_with_env(proxy_yaml, &env)
        .unwrap_or_else(|e| panic!("the chart's config is refused: {e}\n{proxy_yaml}"));
    assert_eq!(config.cache.backend, compactor::config::CacheBackend::Redis);
    assert_eq!(
        config.cache.redis.url.as_ref().map(|u| u.expose()),
        Some("redis://prod-compactor-redis:6379")
    );
    assert!(
        proxy["spec"]["replicas"].as_u64().unwrap() >= 2,
        "replicas to share it"
    );
}

#[test]
fn the_compose_file_and_its_config_hold_together() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy");
    // Compose applies YAML merge keys (`<<: *compactor`); so does this reading.
    let mut merged: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&read(deploy.join("docker-compose.yaml"))).expect("YAML");
    merged.apply_merge().expect("merge keys resolve");
    let compose: Value = serde_yaml_ng::from_value(merged).expect("JSON-shaped");
    let services = compose["services"].as_object().expect("services");
    for service in ["mock", "summarizer", "redis", "compactor-1", "compactor-2"] {
        assert!(services.contains_key(service), "{service}");
    }
    let shared = &compose["x-compactor"];
    assert!(shared["volumes"][0]
        .as_str()
        .unwrap()
        .starts_with("./compose.proxy.yaml:"));
    let proxy = &services["compactor-2"];
    let env: HashMap<String, String> = proxy["environment"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), text_of(v)))
        .collect();
    // The config is chosen through COMPACTOR_CONFIG, which the image's HEALTHCHECK reads too,
    // and it is the file mounted from compose.proxy.yaml.
    let mount = shared["volumes"][0].as_str().unwrap();
    assert_eq!(
        Some(env["COMPACTOR_CONFIG"].as_str()),
        mount.split(':').nth(1)
    );
    let command = proxy["command"].as_array().cloned().unwrap_or_default();
    assert!(!command.contains(&json!("--config")), "{command:?}");
    let config = compactor::config::Config::from_yaml_with_env(
        &read(deploy.join("compose.proxy.yaml")),
        &|name| env.get(name).cloned(),
    )
    .unwrap_or_else(|e| panic!("the compose config is refused: {e}"));
    assert_eq!(config.listen, "0.0.0.0:8080");
    assert_eq!(config.upstreams[0].base_url, "http://mock:9000/v1");
    assert_eq!(config.cache.backend, compactor::config::CacheBackend::Redis);
    assert_eq!(
        config.cache.redis.url.as_ref().map(|u| u.expose()),
        Some("redis://redis:6379")
    );

    // The image: a build stage, the mock's image for the try-out, and the production image
    // last (the default target) holding compactor alone; a non-root user, the health check the
    // binary answers.
    let dockerfile = read(Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile"));
    let stages: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert_eq!(stages.len(), 3, "{stages:?}");
    assert!(stages[2].ends_with("AS compactor"), "{stages:?}");
    let production = dockerfile.rsplit("FROM ").next().unwrap_or_default();
    assert!(!production.contains("mock-upstream"), "{production}");
    for service in ["mock", "summarizer"] {
        assert_eq!(
            services[service]["image"], "compactor-mock:local",
            "{service}"
        );
    }
    assert_eq!(compose["services"]["mock"]["build"]["target"], "mock");
    assert_eq!(shared["build"]["target"], "compactor");
    assert!(dockerfile
        .lines()
        .any(|l| l.starts_with("USER 10001:10001")));
    assert!(
        dockerfile.contains("groupadd --system --gid 10001"),
        "the user's group has an entry"
    );
    // Every binary the image copies is one the release build makes: a plain `cargo build
    // --bins` builds the root package only, and mock-upstream is a workspace member.
    let builds: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.contains("cargo build"))
        .collect();
    assert!(!builds.is_empty());
    for build in &builds {
        assert!(build.contains("--workspace"), "{build}");
    }
    assert!(
        dockerfile.contains(r#"HEALTHCHECK"#) && dockerfile.contains(r#"["compactor", "health"]"#)
    );
}
