//! The Helm chart in `deploy/helm/compactor`, rendered and checked: it parses as Kubernetes
//! YAML, holds the probes, ports, config mount, drain timing and security context, its
//! ConfigMap is a proxy.yaml compactor accepts, and the optional objects come and go with their
//! values.
//!
//! Helm is not packaged for the machines CI runs on, so the templates are rendered here by a
//! small interpreter of the part of Helm's template language the chart uses (`define`,
//! `include`, `if`/`else`, pipelines, and `printf trunc trimSuffix default quote nindent toYaml
//! not add`). Anything else in a template is an error, so a chart that outgrows it fails here
//! instead of being checked loosely. `scripts/helm-check.sh` runs the real `helm template` and
//! `helm lint` where helm is installed.

use std::collections::HashMap;
use std::path::Path;

use serde_json::{json, Value};

const CHART: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/helm/compactor");

/// A parsed template: text and actions, with `define` bodies kept apart.
#[derive(Debug, Clone)]
enum Node {
    Text(String),
    Expr(String),
    If {
        condition: String,
        then: Vec<Node>,
        otherwise: Vec<Node>,
    },
}

struct Chart {
    defines: HashMap<String, Vec<Node>>,
    root: Value,
}

/// Splits a template into text and `{{ }}` actions, applying `{{-` and `-}}` trimming.
fn lex(template: &str) -> Vec<(bool, String)> {
    let mut pieces: Vec<(bool, String)> = Vec::new();
    let mut rest = template;
    let mut trim_next = false;
    while let Some(open) = rest.find("{{") {
        let mut text = rest[..open].to_string();
        if trim_next {
            text = text.trim_start().to_string();
        }
        let close = rest[open..].find("}}").expect("an action is closed") + open;
        let mut action = &rest[open + 2..close];
        if let Some(trimmed) = action.strip_prefix('-') {
            text = text.trim_end().to_string();
            action = trimmed;
        }
        trim_next = false;
        if let Some(trimmed) = action.strip_suffix('-') {
            trim_next = true;
            action = trimmed;
        }
        pieces.push((false, text));
        pieces.push((true, action.trim().to_string()));
        rest = &rest[close + 2..];
    }
    let text = if trim_next { rest.trim_start() } else { rest };
    pieces.push((false, text.to_string()));
    pieces
}

/// Builds the node tree; `define` blocks go to `defines`.
fn parse(
    pieces: &mut std::vec::IntoIter<(bool, String)>,
    defines: &mut HashMap<String, Vec<Node>>,
    until_end: bool,
) -> (Vec<Node>, Option<String>) {
    let mut nodes = Vec::new();
    while let Some((is_action, text)) = pieces.next() {
        if !is_action {
            if !text.is_empty() {
                nodes.push(Node::Text(text));
            }
            continue;
        }
        if text == "end" || text == "else" {
            assert!(until_end, "unexpected {text}");
            return (nodes, Some(text));
        }
        if let Some(name) = text.strip_prefix("define ") {
            let (body, end) = parse(pieces, defines, true);
            assert_eq!(end.as_deref(), Some("end"), "define {name}");
            defines.insert(name.trim().trim_matches('"').to_string(), body);
        } else if let Some(condition) = text.strip_prefix("if ") {
            let (then, end) = parse(pieces, defines, true);
            let otherwise = match end.as_deref() {
                Some("else") => {
                    let (otherwise, end) = parse(pieces, defines, true);
                    assert_eq!(end.as_deref(), Some("end"));
                    otherwise
                }
                _ => Vec::new(),
            };
            nodes.push(Node::If {
                condition: condition.to_string(),
                then,
                otherwise,
            });
        } else {
            let first = text.split_whitespace().next().unwrap_or("");
            assert!(
                !["range", "with", "template", "block", "/*"].contains(&first),
                "the chart uses '{first}', which this test's interpreter does not know"
            );
            nodes.push(Node::Expr(text));
        }
    }
    (nodes, None)
}

fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
    }
}

fn text_of(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Splits on whitespace outside double quotes.
fn words(command: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    for c in command.chars() {
        match c {
            '"' => {
                quoted = !quoted;
                current.push(c);
            }
            c if c.is_whitespace() && !quoted => {
                if !current.is_empty() {
                    words.push(std::mem::take(&mut current));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        words.push(current);
    }
    words
}

impl Chart {
    fn load(values: Value) -> Chart {
        let chart: Value = yaml(&read(Path::new(CHART).join("Chart.yaml")));
        let root = json!({
            "Values": values,
            "Release": {"Name": "prod", "Namespace": "llm"},
            "Chart": {
                "Name": chart["name"],
                "Version": chart["version"],
                "AppVersion": chart["appVersion"],
            },
        });
        let mut defines = HashMap::new();
        let helpers = read(Path::new(CHART).join("templates/_helpers.tpl"));
        parse(&mut lex(&helpers).into_iter(), &mut defines, false);
        Chart { defines, root }
    }

    fn render_file(&self, name: &str) -> String {
        let template = read(Path::new(CHART).join("templates").join(name));
        let mut defines = HashMap::new();
        let (nodes, _) = parse(&mut lex(&template).into_iter(), &mut defines, false);
        self.render(&nodes)
    }

    fn render(&self, nodes: &[Node]) -> String {
        let mut out = String::new();
        for node in nodes {
            match node {
                Node::Text(text) => out.push_str(text),
                Node::Expr(expr) => out.push_str(&text_of(&self.pipeline(expr))),
                Node::If {
                    condition,
                    then,
                    otherwise,
                } => {
                    let branch = if truthy(&self.pipeline(condition)) {
                        then
                    } else {
                        otherwise
                    };
                    out.push_str(&self.render(branch));
                }
            }
        }
        out
    }

    fn pipeline(&self, expr: &str) -> Value {
        let mut value = None;
        for command in expr.split(" | ") {
            let mut args: Vec<Value> = Vec::new();
            let words = words(command);
            let (name, rest) = words.split_first().expect("a command");
            let is_function =
                !(name.starts_with('.') || name.starts_with('"')) && name.parse::<f64>().is_err();
            if !is_function {
                assert!(rest.is_empty() && value.is_none(), "{command}");
                value = Some(self.operand(name));
                continue;
            }
            args.extend(rest.iter().map(|w| self.operand(w)));
            args.extend(value.take());
            value = Some(self.call(name, &args));
        }
        value.unwrap_or(Value::Null)
    }

    fn operand(&self, word: &str) -> Value {
        if word == "." {
            return self.root.clone();
        }
        if let Some(path) = word.strip_prefix('.') {
            let mut value = &self.root;
            for key in path.split('.') {
                value = value
                    .get(key)
                    .unwrap_or_else(|| panic!("the chart reads {word}, which is not set"));
            }
            return value.clone();
        }
        if let Some(text) = word.strip_prefix('"').and_then(|w| w.strip_suffix('"')) {
            return Value::String(text.to_string());
        }
        serde_json::from_str(word).unwrap_or_else(|_| panic!("unknown operand {word}"))
    }

    fn call(&self, name: &str, args: &[Value]) -> Value {
        let number = |v: &Value| {
            v.as_f64()
                .unwrap_or_else(|| panic!("{name}: {v} is not a number"))
        };
        let indented = |n: &Value, text: &Value| {
            let pad = " ".repeat(number(n) as usize);
            text_of(text)
                .lines()
                .map(|line| {
                    if line.is_empty() {
                        String::new()
                    } else {
                        format!("{pad}{line}")
                    }
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        match (name, args) {
            ("include", [template, _dot]) => {
                let body = &self.defines[&text_of(template)];
                Value::String(self.render(body))
            }
            ("printf", [format, rest @ ..]) => {
                let mut out = text_of(format);
                for arg in rest {
                    out = out.replacen("%s", &text_of(arg), 1);
                }
                Value::String(out)
            }
            ("trunc", [n, text]) => {
                Value::String(text_of(text).chars().take(number(n) as usize).collect())
            }
            ("trimSuffix", [suffix, text]) => {
                let text = text_of(text);
                Value::String(text.strip_suffix(&text_of(suffix)).unwrap_or(&text).to_string())
            }
            ("default", [fallback, value]) => {
                if truthy(value) {
                    value.clone()
                } else {
                    fallback.clone()
                }
            }
            ("quote", [value]) => Value::String(format!("{:?}", text_of(value))),
            ("not", [value]) => Value::Bool(!truthy(value)),
            ("add", numbers) => json!(numbers.iter().map(number).sum::<f64>() as i64),
            ("toYaml", [value]) => Value::String(
                serde_yaml_ng::to_string(value)
                    .expect("YAML")
                    .trim_end()
                    .to_string(),
            ),
            ("nindent", [n, text]) => Value::String(format!("\n{}", indented(n, text))),
            ("indent", [n, text]) => Value::String(indented(n, text)),
            _ => panic!("the chart calls {name} with {} arguments, which this test's interpreter does not know", args.len()),
        }
    }
}

fn read(path: impl AsRef<Path>) -> String {
    std::fs::read_to_string(path.as_ref())
        .unwrap_or_else(|e| panic!("{}: {e}", path.as_ref().display()))
}

fn yaml(text: &str) -> Value {
    serde_yaml_ng::from_str(text).unwrap_or_else(|e| panic!("not YAML ({e}):\n{text}"))
}

fn default_values() -> Value {
    yaml(&read(Path::new(CHART).join("values.yaml")))
}

/// Every template rendered with `values`, each document parsed as a Kubernetes object, by
/// kind (and `kind/name` for every object).
fn render_all(values: Value) -> HashMap<String, Value> {
    let chart = Chart::load(values);
    let mut objects = HashMap::new();
    for entry in std::fs::read_dir(Path::new(CHART).join("templates")).expect("templates") {
        let name = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .to_string();
        if name.starts_with('_') {
            continue;
        }
        let rendered = chart.render_file(&name);
        // `SHOW_CHART=1 cargo test --test helm_chart -- --nocapture` prints what was rendered.
        if std::env::var("SHOW_CHART").is_ok() {
            eprintln!("--- {name}\n{rendered}");
        }
        for document in rendered.split("\n---\n") {
            if document.trim().is_empty() {
                continue;
            }
            let object = yaml(document);
            let kind = object["kind"].as_str().expect("a kind").to_string();
            let object_name = object["metadata"]["name"]
                .as_str()
                .expect("a name")
                .to_string();
            assert!(object["apiVersion"].is_string(), "{name}");
            assert!(object_name.starts_with("prod-compactor"), "{name}");
            objects.insert(format!("{kind}/{object_name}"), object.clone());
            objects.entry(kind).or_insert(object);
        }
    }
    objects
}

#[test]
fn the_chart_renders_a_deployment_with_probes_ports_drain_and_config() {
    let objects = render_all(default_values());
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
    assert!(container["args"]
        .as_array()
        .unwrap()
        .contains(&json!("/etc/compactor/proxy.yaml")));

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
    let mut values = default_values();
    values["autoscaling"]["enabled"] = json!(true);
    values["serviceMonitor"]["enabled"] = json!(true);
    values["existingSecret"] = json!("llm-keys");
    values["nodeSelector"] = json!({"pool": "gateway"});
    let objects = render_all(values);
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
    let mut values = default_values();
    values["redis"]["deploy"] = json!(true);
    let objects = render_all(values);
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
    let config = compactor::config::Config::from_yaml_with_env(proxy_yaml, &|_| None)
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
    let compose = yaml(&read(deploy.join("docker-compose.yaml")));
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

    // The image: two stages, a non-root user, the health check the binary answers.
    let dockerfile = read(Path::new(env!("CARGO_MANIFEST_DIR")).join("Dockerfile"));
    assert_eq!(
        dockerfile
            .lines()
            .filter(|l| l.starts_with("FROM "))
            .count(),
        2
    );
    assert!(dockerfile.lines().any(|l| l.starts_with("USER 10001")));
    assert!(
        dockerfile.contains(r#"HEALTHCHECK"#) && dockerfile.contains(r#"["compactor", "health"]"#)
    );
}
