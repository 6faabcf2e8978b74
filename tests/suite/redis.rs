//! Many replicas, one memory: real `compactor` processes sharing a real `redis-server` on
//! loopback (started on a free port here, stopped after). One summary for a conversation
//! whichever replicas its turns reach, a replica that dies mid-summary taken over, Redis going
//! away and coming back without a failed request, tenants kept apart, foreign values ignored.

use std::process::Stdio;

use crate::common::*;
use mock_upstream::{MockHandle, MockMode, MockOptions};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// A `redis-server` of its own on a free loopback port, killed when dropped.
struct RedisServer {
    port: u16,
    child: Option<tokio::process::Child>,
    /// A cluster node's folder (its `nodes.conf`), when it is one.
    cluster: Option<tempfile::TempDir>,
}

impl RedisServer {
    async fn start() -> RedisServer {
        let port = dead_address().await.port();
        let mut server = RedisServer {
            port,
            child: None,
            cluster: None,
        };
        server.run().await;
        server
    }

    /// A node of a Redis Cluster (not joined to one yet); a master gone for a second is
    /// replaced by its replica.
    async fn start_cluster_node() -> RedisServer {
        let port = dead_address().await.port();
        let mut server = RedisServer {
            port,
            child: None,
            cluster: Some(tempfile::tempdir().expect("a folder for nodes.conf")),
        };
        server.run().await;
        server
    }

    async fn run(&mut self) {
        let mut command = tokio::process::Command::new("redis-server");
        if let Some(dir) = &self.cluster {
            command
                .args(["--cluster-enabled", "yes", "--cluster-node-timeout", "1000"])
                // A replica takes over however long ago it last heard from its master.
                .args(["--cluster-replica-validity-factor", "0"])
                .arg("--dir")
                .arg(dir.path());
        }
        let child = command
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--protected-mode", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("redis-server is installed (.ci/run installs it)");
        self.child = Some(child);
        let ready = async {
            loop {
                if let Ok(mut connection) = self.connection().await {
                    let pong: redis::RedisResult<String> =
                        redis::cmd("PING").query_async(&mut connection).await;
                    if pong.is_ok() {
                        return;
                    }
                }
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(BOUND, ready)
            .await
            .expect("redis-server answers in time");
    }

    async fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill().await;
            let _ = child.wait().await;
        }
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    async fn connection(&self) -> redis::RedisResult<redis::aio::MultiplexedConnection> {
        redis::Client::open(self.url())?
            .get_multiplexed_async_connection()
            .await
    }
}

/// An echoing upstream and a summarizer, both mocks, shared by the replicas.
struct Upstreams {
    upstream: MockHandle,
    summarizer: MockHandle,
}

async fn upstreams() -> Upstreams {
    Upstreams {
        upstream: echo_mock().await,
        summarizer: mock(MockOptions {
            mode: MockMode::Summarizer,
            ..MockOptions::default()
        })
        .await,
    }
}

/// One replica: the real binary on the shared Redis.
struct Replica {
    child: tokio::process::Child,
    addr: String,
    _config: tempfile::NamedTempFile,
}

impl Replica {
    async fn start(upstreams: &Upstreams, redis: &RedisServer) -> Replica {
        Replica::start_with(upstreams, redis, "a-signing-key-for-tests", "").await
    }

    /// A replica of the deployment that `signing_key` names, with `auth` (YAML) appended.
    async fn start_with(
        upstreams: &Upstreams,
        redis: &RedisServer,
        signing_key: &str,
        auth: &str,
    ) -> Replica {
        let target = format!("url: {}", redis.url());
        Replica::start_on(upstreams, &target, signing_key, auth).await
    }

    /// A replica whose `cache.redis` names its Redis by `target` (`url: …` or `cluster: […]`).
    async fn start_on(
        upstreams: &Upstreams,
        target: &str,
        signing_key: &str,
        auth: &str,
    ) -> Replica {
        let config = write_config(&format!(
            "{auth}listen: 127.0.0.1:0\nupstreams:\n  - name: mock\n    base_url: {}\n  - name: summarizer\n    base_url: {}\n    models: [\"summarizer-*\"]\nsummarization:\n  enabled: true\n  upstream: summarizer\n  model_name: summarizer-model\n  summary_max_tokens: 32\n  trigger: [{{type: tokens, value: 200}}]\n  keep: {{type: messages, value: 2}}\n  max_calls_per_minute_per_tenant: 1000\ncache:\n  backend: redis\n  redis:\n    {target}\n    signing_key: {signing_key}\n    key_prefix: \"test:\"\n    lease_secs: 1\n    command_timeout_secs: 0.5\n    connect_timeout_secs: 0.5\n    breaker_failures: 2\n    breaker_cooldown_secs: 0.05\n",
            upstreams.upstream.base_url(),
            upstreams.summarizer.base_url(),
        ));
        let (child, addr, _lines) = start(config.path()).await;
        Replica {
            child,
            addr,
            _config: config,
        }
    }

    async fn chat(&self, messages: &[Value], tenant: &str) -> Collected {
        let body = json!({"model": "gpt-4o-mini", "messages": messages}).to_string();
        let url = format!("http://{}/v1/chat/completions", self.addr);
        let auth = format!("Bearer {tenant}");
        roundtrip(
            &client(),
            json_request(&url, body, &[("authorization", auth.as_str())]),
        )
        .await
    }

    /// One sample of the replica's /metrics (0 when absent).
    async fn metric(&self, sample: &str) -> f64 {
        let text = get(&format!("http://{}/metrics", self.addr)).await.text();
        text.lines()
            .find(|line| line.starts_with(sample) && line[sample.len()..].starts_with(' '))
            .and_then(|line| line.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }

    /// Waits (bounded) until a metric reaches `value`.
    async fn wait_metric(&self, sample: &str, value: f64) {
        let reached = async {
            while self.metric(sample).await != value {
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(BOUND, reached)
            .await
            .unwrap_or_else(|_| panic!("{sample} never reached {value}"));
    }
}

fn conversation(tag: &str, turns: usize) -> Vec<Value> {
    let mut messages = vec![json!({"role": "system", "content": "You are terse."})];
    for t in 0..turns {
        messages.push(json!({"role": "user", "content": format!("{tag} question {t}: ") + &"words ".repeat(40)}));
        messages.push(json!({"role": "assistant", "content": format!("{tag} answer {t}: ") + &"reply ".repeat(40)}));
    }
    messages.push(json!({"role": "user", "content": format!("{tag}: go on")}));
    messages
}

const WAITING: &str = "compactor_redis_lease_waiting";

#[tokio::test]
async fn two_replicas_asked_at_once_make_one_summary_and_forward_the_same_bytes() {
    let redis = RedisServer::start().await;
    let upstreams = upstreams().await;
    let (a, b) = (
        Replica::start(&upstreams, &redis).await,
        Replica::start(&upstreams, &redis).await,
    );
    let messages = conversation("together", 6);
    upstreams.summarizer.hold();
    let first = {
        let (addr, messages) = (a.addr.clone(), messages.clone());
        tokio::spawn(async move { chat_at(&addr, &messages).await })
    };
    assert!(upstreams.summarizer.wait_arrivals(1, BOUND).await);
    let second = {
        let (addr, messages) = (b.addr.clone(), messages.clone());
        tokio::spawn(async move { chat_at(&addr, &messages).await })
    };
    // B waits on A's lease rather than calling the summarizer itself.
    b.wait_metric(WAITING, 1.0).await;
    upstreams.summarizer.release(10);
    let (first, second) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!(first.status, 200);
    assert_eq!(second.status, 200);
    assert_eq!(upstreams.summarizer.chat_calls(), 1, "one summary for both");
    let forwarded: Vec<_> = upstreams
        .upstream
        .requests()
        .into_iter()
        .rev()
        .take(2)
        .map(|r| r.body)
        .collect();
    assert_eq!(
        forwarded[0], forwarded[1],
        "both replicas forwarded the same bytes"
    );
    assert_eq!(
        b.metric("compactor_redis_leases_total{result=\"joined\"}")
            .await,
        1.0
    );
}

async fn chat_at(addr: &str, messages: &[Value]) -> Collected {
    let body = json!({"model": "gpt-4o-mini", "messages": messages}).to_string();
    let url = format!("http://{addr}/v1/chat/completions");
    roundtrip(&client(), json_request(&url, body, &[])).await
}

#[tokio::test]
async fn the_next_turn_on_another_replica_reuses_the_summary_with_no_call() {
    next_turn_on_another_replica(conversation("turns", 6)).await;
}

#[tokio::test]
async fn a_large_conversation_planned_off_the_reactor_finds_the_shared_summary_too() {
    // Over 256 KiB: planned on the planner's threads, which ask Redis in the middle of planning.
    let mut messages = vec![json!({"role": "system", "content": "You are terse."})];
    for t in 0..60 {
        messages.push(json!({"role": "user", "content": format!("large question {t}: ") + &"words ".repeat(500)}));
        messages.push(json!({"role": "assistant", "content": format!("large answer {t}: ") + &"reply ".repeat(500)}));
    }
    messages.push(json!({"role": "user", "content": "go on"}));
    assert!(serde_json::to_string(&messages).unwrap().len() > 256 * 1024);
    next_turn_on_another_replica(messages).await;
}

async fn next_turn_on_another_replica(mut messages: Vec<Value>) {
    let redis = RedisServer::start().await;
    let upstreams = upstreams().await;
    let (a, b) = (
        Replica::start(&upstreams, &redis).await,
        Replica::start(&upstreams, &redis).await,
    );
    let first = a.chat(&messages, "tenant").await;
    assert_eq!(outcome(&first), "summarized");
    let calls = upstreams.summarizer.chat_calls();
    messages.push(json!({"role": "assistant", "content": "done"}));
    messages.push(json!({"role": "user", "content": "and then?"}));
    let second = b.chat(&messages, "tenant").await;
    assert_eq!(second.status, 200);
    assert_eq!(outcome(&second), "reused");
    assert_eq!(
        upstreams.summarizer.chat_calls(),
        calls,
        "no call for the second turn"
    );
    assert_eq!(
        b.metric("compactor_summary_cache_remote_lookups_total{result=\"hit\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn a_replica_that_dies_mid_summary_is_taken_over_when_its_lease_runs_out() {
    let redis = RedisServer::start().await;
    let upstreams = upstreams().await;
    let (mut a, b) = (
        Replica::start(&upstreams, &redis).await,
        Replica::start(&upstreams, &redis).await,
    );
    let messages = conversation("orphan", 6);
    upstreams.summarizer.hold();
    let doomed = {
        let (addr, messages) = (a.addr.clone(), messages.clone());
        tokio::spawn(async move {
            let body = json!({"model": "gpt-4o-mini", "messages": messages}).to_string();
            let url = format!("http://{addr}/v1/chat/completions");
            client().request(json_request(&url, body, &[])).await
        })
    };
    assert!(upstreams.summarizer.wait_arrivals(1, BOUND).await);
    let survivor = {
        let (addr, messages) = (b.addr.clone(), messages.clone());
        tokio::spawn(async move { chat_at(&addr, &messages).await })
    };
    b.wait_metric(WAITING, 1.0).await;
    a.child.start_kill().expect("kill the lease owner");
    let _ = a.child.wait().await;
    assert!(
        doomed.await.unwrap().is_err(),
        "the dead replica's client saw it die"
    );
    // B takes the lease once it runs out and makes the summary itself.
    assert!(upstreams.summarizer.wait_arrivals(2, BOUND).await);
    upstreams.summarizer.release(10);
    let answered = survivor.await.unwrap();
    assert_eq!(answered.status, 200, "no request lost");
    assert_eq!(outcome(&answered), "summarized");
    assert_eq!(
        b.metric("compactor_redis_leases_total{result=\"taken_over\"}")
            .await,
        1.0
    );
}

#[tokio::test]
async fn redis_going_away_fails_no_request_and_its_return_is_noticed() {
    let mut redis = RedisServer::start().await;
    let upstreams = upstreams().await;
    let a = Replica::start(&upstreams, &redis).await;
    assert_eq!(a.metric("compactor_redis_up").await, 1.0);
    redis.stop().await;

    // Without Redis: summarized locally, and the next turn reuses the local summary.
    let mut messages = conversation("offline", 6);
    let first = a.chat(&messages, "tenant").await;
    assert_eq!(first.status, 200);
    assert_eq!(outcome(&first), "summarized");
    a.wait_metric("compactor_redis_up", 0.0).await;
    messages.push(json!({"role": "assistant", "content": "done"}));
    messages.push(json!({"role": "user", "content": "and then?"}));
    let second = a.chat(&messages, "tenant").await;
    assert_eq!(outcome(&second), "reused", "made meanwhile, kept locally");

    // Back again: the next request that needs it probes, and the breaker closes.
    redis.run().await;
    let back = async {
        let mut round = 0;
        while a.metric("compactor_redis_up").await != 1.0 {
            round += 1;
            let answer = a
                .chat(&conversation(&format!("probe{round}"), 6), "tenant")
                .await;
            assert_eq!(answer.status, 200);
        }
    };
    tokio::time::timeout(BOUND, back)
        .await
        .expect("the shared tier is used again");
}

#[tokio::test]
async fn tenants_never_share_a_summary_through_redis() {
    let redis = RedisServer::start().await;
    let upstreams = upstreams().await;
    let (a, b) = (
        Replica::start(&upstreams, &redis).await,
        Replica::start(&upstreams, &redis).await,
    );
    let messages = conversation("private", 6);
    assert_eq!(
        outcome(&a.chat(&messages, "tenant-one").await),
        "summarized"
    );
    assert_eq!(
        outcome(&b.chat(&messages, "tenant-two").await),
        "summarized"
    );
    assert_eq!(upstreams.summarizer.chat_calls(), 2);
}

#[tokio::test]
async fn a_corrupt_or_foreign_value_is_a_miss_and_never_forwarded() {
    let redis = RedisServer::start().await;
    let upstreams = upstreams().await;
    let (a, b) = (
        Replica::start(&upstreams, &redis).await,
        Replica::start(&upstreams, &redis).await,
    );
    let mut messages = conversation("tampered", 6);
    assert_eq!(outcome(&a.chat(&messages, "tenant").await), "summarized");
    let mut connection = redis.connection().await.expect("redis");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("test:s:*")
        .query_async(&mut connection)
        .await
        .expect("keys");
    assert!(!keys.is_empty(), "the summary went to redis");
    for (i, key) in keys.iter().enumerate() {
        let garbage: &[u8] = if i % 2 == 0 {
            b"\x01{\"cut\":\"not a number\"}"
        } else {
            b"FOREIGN-VALUE-NOT-OURS"
        };
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(garbage)
            .query_async(&mut connection)
            .await
            .expect("set");
    }
    messages.push(json!({"role": "assistant", "content": "done"}));
    messages.push(json!({"role": "user", "content": "and then?"}));
    let second = b.chat(&messages, "tenant").await;
    assert_eq!(second.status, 200);
    assert_eq!(outcome(&second), "summarized", "made again, not read");
    assert_eq!(upstreams.summarizer.chat_calls(), 2);
    let forwarded = upstreams.upstream.last_request().unwrap().body;
    let text = String::from_utf8_lossy(&forwarded);
    assert!(!text.contains("FOREIGN-VALUE") && !text.contains("not a number"));
    assert!(text.contains("Here is a summary of the conversation to date"));
}

#[tokio::test]
async fn an_entry_nobody_signed_is_a_miss_however_it_was_crafted() {
    let redis = RedisServer::start().await;
    let upstreams = upstreams().await;
    let (a, b) = (
        Replica::start(&upstreams, &redis).await,
        Replica::start(&upstreams, &redis).await,
    );
    let mut messages = conversation("crafted", 6);
    assert_eq!(outcome(&a.chat(&messages, "tenant").await), "summarized");
    let mut connection = redis.connection().await.expect("redis");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("test:s:*")
        .query_async(&mut connection)
        .await
        .expect("keys");
    assert!(!keys.is_empty(), "the summary went to redis");
    for (i, key) in keys.iter().enumerate() {
        let stored: Vec<u8> = redis::cmd("GET")
            .arg(key)
            .query_async(&mut connection)
            .await
            .expect("get");
        // format byte, 32-byte tag, then the JSON the replica wrote.
        let (head, json) = stored.split_at(33);
        let mut entry: Value = serde_json::from_slice(json).expect("the stored JSON");
        entry["excluded"] = json!(vec![1; 50_000]);
        entry["tokens"] = json!(0);
        entry["text"] = json!("CRAFTED-SUMMARY");
        let crafted = serde_json::to_vec(&entry).unwrap();
        let value = match i % 3 {
            // The format before signing existed.
            0 => [b"\x01".as_slice(), &crafted].concat(),
            // The replica's own tag over other bytes.
            1 => [head, &crafted].concat(),
            // No tag at all.
            _ => [b"\x02".as_slice(), &crafted].concat(),
        };
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(value)
            .query_async(&mut connection)
            .await
            .expect("set");
    }
    messages.push(json!({"role": "assistant", "content": "done"}));
    messages.push(json!({"role": "user", "content": "and then?"}));
    let original = json!({"model": "gpt-4o-mini", "messages": &messages}).to_string();
    let second = b.chat(&messages, "tenant").await;
    assert_eq!(second.status, 200);
    assert_eq!(outcome(&second), "summarized", "made again, not read");
    let forwarded = upstreams.upstream.last_request().unwrap().body;
    assert!(
        forwarded.len() < original.len(),
        "forwarded {} bytes for an original of {}",
        forwarded.len(),
        original.len()
    );
    assert!(!String::from_utf8_lossy(&forwarded).contains("CRAFTED-SUMMARY"));
}

#[tokio::test]
async fn a_key_of_the_same_name_in_another_deployment_is_another_tenant() {
    let redis = RedisServer::start().await;
    let upstreams = upstreams().await;
    let team = |key: &str| format!("auth:\n  keys:\n    - name: team\n      key: {key}\n");
    let deployment = "one-deployment-signing-key";
    let here = Replica::start_with(&upstreams, &redis, deployment, &team("sk-here")).await;
    let here_too = Replica::start_with(&upstreams, &redis, deployment, &team("sk-here")).await;
    let there = Replica::start_with(&upstreams, &redis, deployment, &team("sk-there")).await;
    let elsewhere = Replica::start_with(
        &upstreams,
        &redis,
        "another-deployment-key",
        &team("sk-here"),
    )
    .await;
    let messages = conversation("same words", 6);
    assert_eq!(
        outcome(&here.chat(&messages, "sk-here").await),
        "summarized"
    );
    // The same key in the same deployment shares, as before.
    assert_eq!(
        outcome(&here_too.chat(&messages, "sk-here").await),
        "reused"
    );
    // A key of the same name but another value, or the same key in another deployment, never
    // learns that someone sent this conversation.
    assert_eq!(
        outcome(&there.chat(&messages, "sk-there").await),
        "summarized"
    );
    assert_eq!(
        outcome(&elsewhere.chat(&messages, "sk-here").await),
        "summarized"
    );
    assert_eq!(upstreams.summarizer.chat_calls(), 3);
}

#[tokio::test]
async fn a_replica_starts_from_the_calibration_another_learned() {
    let redis = RedisServer::start().await;
    // An upstream that counts with a real tokenizer and reports it in `usage`.
    let upstreams = Upstreams {
        upstream: mock(MockOptions {
            counting: mock_upstream::window::Counting::Cl100k,
            ..MockOptions::default()
        })
        .await,
        summarizer: mock(MockOptions {
            mode: MockMode::Summarizer,
            ..MockOptions::default()
        })
        .await,
    };
    let first = Replica::start(&upstreams, &redis).await;
    let second = Replica::start(&upstreams, &redis).await;
    let send = |replica: &Replica, tag: &str| {
        let body = json!({"model": "local-model", "messages": conversation(tag, 3)}).to_string();
        let url = format!("http://{}/v1/chat/completions", replica.addr);
        async move {
            roundtrip(
                &client(),
                json_request(&url, body, &[("authorization", "Bearer tenant")]),
            )
            .await
        }
    };
    let used = r#"compactor_token_calibration_samples_total{result="used"}"#;
    for i in 0..3 {
        assert_eq!(send(&first, &format!("a{i}")).await.status, 200);
    }
    // The first replica offers its calibration once usable (three samples of the model on its
    // upstream).
    let calibrated = compactor::compaction::windows::calibration_key("mock", "local-model");
    let digest: String = Sha256::digest(calibrated.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let key = format!("test:c:{digest}");
    let mut connection = redis.connection().await.expect("redis");
    let offered = async {
        loop {
            let exists: bool = redis::cmd("EXISTS")
                .arg(&key)
                .query_async(&mut connection)
                .await
                .unwrap_or(false);
            if exists {
                return;
            }
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(BOUND, offered)
        .await
        .expect("the calibration is offered in time");
    // One sample of its own would leave the second replica on the bare estimate (it takes
    // three); it starts from the first's calibration instead. (A conversation the first
    // summarized is reused from Redis: no summarizer call, so the one sample is the chat's.)
    assert_eq!(send(&second, "a0").await.status, 200);
    second.wait_metric(used, 1.0).await;
    let response = send(&second, "a1").await;
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.headers["x-compactor-tokens-count"], "calibrated");
}

/// A Redis Cluster of its own on loopback: three masters, each with a replica.
struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    async fn start() -> RedisCluster {
        let mut nodes = Vec::new();
        for _ in 0..6 {
            nodes.push(RedisServer::start_cluster_node().await);
        }
        let addresses: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let created = tokio::process::Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await
            .expect("redis-cli is installed with redis-server");
        assert!(created.success(), "redis-cli --cluster create");
        let cluster = RedisCluster { nodes };
        cluster.wait_ok().await;
        cluster.wait_replicas_synced().await;
        cluster
    }

    /// Waits (bounded) until every replica has its master's data: only then can it take over.
    async fn wait_replicas_synced(&self) {
        let synced = async {
            loop {
                let mut replicas = 0;
                let mut linked = 0;
                for node in &self.nodes {
                    let Ok(mut connection) = node.connection().await else {
                        continue;
                    };
                    let info: String = redis::cmd("INFO")
                        .arg("replication")
                        .query_async(&mut connection)
                        .await
                        .unwrap_or_default();
                    if info.contains("role:slave") {
                        replicas += 1;
                        linked += usize::from(info.contains("master_link_status:up"));
                    }
                }
                if replicas == 3 && linked == 3 {
                    return;
                }
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(BOUND, synced)
            .await
            .expect("the replicas sync in time");
    }

    /// `cache.redis` naming two of its nodes: the client finds the rest.
    fn target(&self) -> String {
        format!(
            "cluster: [{}, {}]",
            self.nodes[0].url(),
            self.nodes[1].url()
        )
    }

    /// Waits (bounded) until every running node says the cluster is whole and every slot
    /// is served.
    async fn wait_ok(&self) {
        let whole = async {
            loop {
                let mut ok = true;
                for node in self.nodes.iter().filter(|n| n.child.is_some()) {
                    let info: Option<String> = match node.connection().await {
                        Ok(mut connection) => redis::cmd("CLUSTER")
                            .arg("INFO")
                            .query_async(&mut connection)
                            .await
                            .ok(),
                        Err(_) => None,
                    };
                    ok &= info.is_some_and(|info| info.contains("cluster_state:ok"));
                }
                if ok {
                    return;
                }
                tokio::task::yield_now().await;
            }
        };
        tokio::time::timeout(BOUND, whole)
            .await
            .expect("the cluster is whole in time");
    }

    /// The node serving `key`'s slot as master.
    async fn master_of(&self, key: &str) -> usize {
        let alive = self
            .nodes
            .iter()
            .find(|n| n.child.is_some())
            .expect("a node runs");
        let mut connection = alive.connection().await.expect("a node answers");
        let slot: u16 = redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query_async(&mut connection)
            .await
            .expect("CLUSTER KEYSLOT");
        let shards: redis::Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query_async(&mut connection)
            .await
            .expect("CLUSTER SLOTS");
        let redis::Value::Array(ranges) = shards else {
            panic!("CLUSTER SLOTS: {shards:?}")
        };
        for range in ranges {
            let redis::Value::Array(fields) = range else {
                continue;
            };
            let (
                Some(redis::Value::Int(from)),
                Some(redis::Value::Int(to)),
                Some(redis::Value::Array(master)),
            ) = (fields.first(), fields.get(1), fields.get(2))
            else {
                continue;
            };
            if (*from..=*to).contains(&i64::from(slot)) {
                if let Some(redis::Value::Int(port)) = master.get(1) {
                    return self
                        .nodes
                        .iter()
                        .position(|n| i64::from(n.port) == *port)
                        .expect("a node of ours");
                }
            }
        }
        panic!("no master serves slot {slot}")
    }
}

/// Every summary key this deployment wrote (they start with the test prefix).
async fn summary_keys(cluster: &RedisCluster) -> Vec<String> {
    let mut keys = Vec::new();
    for node in cluster.nodes.iter().filter(|n| n.child.is_some()) {
        if let Ok(mut connection) = node.connection().await {
            let found: Vec<String> = redis::cmd("KEYS")
                .arg("test:s:*")
                .query_async(&mut connection)
                .await
                .unwrap_or_default();
            keys.extend(found);
        }
    }
    keys.sort();
    keys.dedup();
    keys
}

#[tokio::test]
async fn replicas_share_summaries_through_a_redis_cluster_and_a_lost_master_fails_no_request() {
    let mut cluster = RedisCluster::start().await;
    let upstreams = upstreams().await;
    let target = cluster.target();
    let key = "a-signing-key-for-tests";
    let a = Replica::start_on(&upstreams, &target, key, "").await;
    let b = Replica::start_on(&upstreams, &target, key, "").await;

    // One replica summarizes, the other reuses it from the cluster with no call.
    let mut messages = conversation("cluster", 6);
    assert_eq!(outcome(&a.chat(&messages, "tenant").await), "summarized");
    let calls = upstreams.summarizer.chat_calls();
    messages.push(json!({"role": "assistant", "content": "done"}));
    messages.push(json!({"role": "user", "content": "and then?"}));
    assert_eq!(outcome(&b.chat(&messages, "tenant").await), "reused");
    assert_eq!(upstreams.summarizer.chat_calls(), calls);

    // The master holding that summary goes away while both replicas keep serving: no request
    // fails, and once its replica has taken over, summaries are shared again.
    let stored = summary_keys(&cluster).await;
    assert!(!stored.is_empty(), "the summary is in the cluster");
    let lost = cluster.master_of(&stored[0]).await;
    cluster.nodes[lost].stop().await;
    for round in 0..10 {
        for replica in [&a, &b] {
            let answer = replica
                .chat(&conversation(&format!("during{round}"), 6), "tenant")
                .await;
            assert_eq!(answer.status, 200, "round {round}: {}", answer.text());
        }
    }
    let promoted = async {
        while cluster.master_of(&stored[0]).await == lost {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(BOUND, promoted)
        .await
        .expect("the lost master's replica takes over");
    cluster.wait_ok().await;
    let resumed = async {
        let mut round = 0;
        loop {
            round += 1;
            let mut messages = conversation(&format!("after{round}"), 6);
            a.chat(&messages, "tenant").await;
            messages.push(json!({"role": "assistant", "content": "done"}));
            messages.push(json!({"role": "user", "content": "and then?"}));
            let next = b.chat(&messages, "tenant").await;
            assert_eq!(next.status, 200);
            if outcome(&next) == "reused" {
                return;
            }
        }
    };
    tokio::time::timeout(BOUND, resumed)
        .await
        .expect("reuse through the cluster resumes after the failover");
}
