//! The shared tier of the summary cache (`cache.backend: redis`): Redis or Valkey behind the
//! in-process cache, so replicas behind one load balancer share their summaries and make each
//! one once.
//!
//! Keys are the same content-addressed digests as in process (scoped by tenant and summarizer
//! fingerprint), so replicas agree on names without talking to each other:
//! `{prefix}s:{digest}` a summary, `{prefix}l:{flight}` a replica's lease on the summary it is
//! making, `{prefix}b:{flight}` a layout whose summary came back not smaller. A summary's value
//! is a format byte, then an HMAC-SHA256 under `signing_key` of the key's name and the JSON,
//! then the JSON: anything else under a key (a corrupt or foreign value, an older format, a
//! value written by whoever can write to Redis but does not hold the key, a value moved from
//! another key) is a miss, never forwarded.
//!
//! Redis must never take compactor down: every command is bounded by `command_timeout_secs`,
//! consecutive failures open a breaker (the local tier serves alone, summaries are made
//! locally, a warning says so and `compactor_redis_up` drops to 0) and one probe after the
//! cooldown closes it again.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Client, IntoConnectionInfo, Value};
use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;

use crate::compaction::calibration::SharedCalibration;
use crate::compaction::planner::plan::CachedSummary;
use crate::compaction::summaries::breaker::{Admission, Breaker, Change};
use crate::compaction::summaries::cache::CacheKey;
use crate::config::RedisConfig;
use crate::metrics::Metrics;

/// The format byte of a stored summary: bumped whenever the encoding changes, so a replica of
/// another version reads a miss rather than a misread. 2: authenticated.
const FORMAT: u8 = 2;

/// Bytes of the authentication tag after the format byte.
const TAG_BYTES: usize = 32;

type Mac = hmac::Hmac<sha2::Sha256>;

/// Extends a lease only while this replica still holds it.
const RENEW: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) else return 0 end";
/// Ends a lease only while this replica still holds it.
const RELEASE: &str = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";

/// What a replica gets when it asks to make a summary.
pub enum Lease {
    /// This replica makes it; others wait for it. Renewed until released.
    Held(LeaseGuard),
    /// Another replica is making it.
    Taken,
    /// Redis cannot say: make it locally.
    Unavailable,
}

/// What Redis holds for one summary layout.
pub enum Stored {
    Summary(CachedSummary),
    /// Its summary came back not smaller than what it replaces: not worth another call.
    TooLarge,
    Nothing,
}

#[derive(Clone)]
pub struct RedisTier {
    inner: Arc<Tier>,
    /// The settings it was made with: a reload that keeps them keeps the connection.
    config: RedisConfig,
}

/// Where the tier's commands go: one Redis, or a cluster whose client routes each key to the
/// node that holds its slot (a multi-key `MGET` is split per node and put back in order).
enum Endpoint {
    Single(Box<Client>),
    Cluster(Box<ClusterClient>),
}

/// A connection to either, opened on first use and reconnecting by itself.
#[derive(Clone)]
enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Connection {
    async fn query(&mut self, command: &redis::Cmd) -> redis::RedisResult<Value> {
        match self {
            Connection::Single(connection) => command.query_async(connection).await,
            Connection::Cluster(connection) => command.query_async(connection).await,
        }
    }
}

struct Tier {
    endpoint: Endpoint,
    connection: OnceCell<Connection>,
    connect_timeout: Duration,
    command_timeout: Duration,
    prefix: String,
    ttl: Duration,
    lease: Duration,
    /// This process, in lease values.
    owner: String,
    /// What authenticates a stored summary (validated non-empty with `backend: redis`).
    signing_key: Vec<u8>,
    breaker: Breaker,
    up: AtomicBool,
    metrics: Arc<Metrics>,
}

impl RedisTier {
    pub fn new(config: &RedisConfig, metrics: Arc<Metrics>) -> Result<RedisTier, String> {
        let endpoint = if config.cluster.is_empty() {
            let url = config.url.as_ref().map(|url| url.expose()).unwrap_or("");
            let info =
                with_credentials(url, config).map_err(|e| format!("cache.redis.url: {e}"))?;
            let client = Client::open(info).map_err(|e| format!("cache.redis.url: {e}"))?;
            Endpoint::Single(Box::new(client))
        } else {
            let nodes = config
                .cluster
                .iter()
                .map(|node| with_credentials(node.expose(), config))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("cache.redis.cluster: {e}"))?;
            let client = ClusterClient::builder(nodes)
                .connection_timeout(Duration::from_secs_f64(config.connect_timeout_secs))
                .response_timeout(Duration::from_secs_f64(config.command_timeout_secs))
                .retries(1)
                .build()
                .map_err(|e| format!("cache.redis.cluster: {e}"))?;
            Endpoint::Cluster(Box::new(client))
        };
        metrics.redis_up(true);
        Ok(RedisTier {
            config: config.clone(),
            inner: Arc::new(Tier {
                endpoint,
                connection: OnceCell::new(),
                connect_timeout: Duration::from_secs_f64(config.connect_timeout_secs),
                command_timeout: Duration::from_secs_f64(config.command_timeout_secs),
                prefix: config.key_prefix.clone(),
                ttl: Duration::from_secs_f64(config.ttl_secs),
                lease: Duration::from_secs_f64(config.lease_secs),
                owner: owner_id(),
                signing_key: config
                    .signing_key
                    .as_ref()
                    .map(|key| key.expose().as_bytes().to_vec())
                    .unwrap_or_default(),
                breaker: Breaker::new(
                    config.breaker_failures,
                    Duration::from_secs_f64(config.breaker_cooldown_secs),
                ),
                up: AtomicBool::new(true),
                metrics,
            }),
        })
    }

    /// Whether this tier was made with `config` (secrets compared too).
    pub fn made_with(&self, config: &RedisConfig) -> bool {
        let url = |c: &RedisConfig| c.url.as_ref().map(|u| u.expose().to_string());
        let cluster = |c: &RedisConfig| {
            c.cluster
                .iter()
                .map(|node| node.expose().to_string())
                .collect::<Vec<_>>()
        };
        let password = |c: &RedisConfig| c.password.as_ref().map(|p| p.expose().to_string());
        let signing = |c: &RedisConfig| c.signing_key.as_ref().map(|k| k.expose().to_string());
        url(&self.config) == url(config)
            && cluster(&self.config) == cluster(config)
            && password(&self.config) == password(config)
            && signing(&self.config) == signing(config)
            && serde_json::to_string(&self.config).ok() == serde_json::to_string(config).ok()
    }

    /// Whether Redis is being asked (the breaker is closed, or its cooldown is over).
    pub fn available(&self) -> bool {
        self.inner.allowed()
    }

    /// The summaries Redis holds for these prefix digests.
    pub async fn get_many(&self, keys: &[CacheKey]) -> Vec<(CacheKey, CachedSummary)> {
        if keys.is_empty() {
            return Vec::new();
        }
        let names: Vec<String> = keys.iter().map(|k| self.inner.key("s", k)).collect();
        let mut command = redis::cmd("MGET");
        command.arg(&names);
        let Some(Value::Array(values)) = self.inner.run(command).await else {
            return Vec::new();
        };
        keys.iter()
            .zip(names.iter().zip(values))
            .filter_map(|(key, (name, value))| {
                self.inner.open(name, &value).map(|summary| (*key, summary))
            })
            .collect()
    }

    /// The summary of one layout (`key`, `flight`), or the mark that its summary is too large.
    pub async fn stored(&self, key: &CacheKey, flight: &CacheKey) -> Stored {
        let name = self.inner.key("s", key);
        let mut command = redis::cmd("MGET");
        command.arg(&name).arg(self.inner.key("b", flight));
        match self.inner.run(command).await {
            Some(Value::Array(values)) if values.len() == 2 => {
                if !matches!(values[1], Value::Nil) {
                    return Stored::TooLarge;
                }
                self.inner
                    .open(&name, &values[0])
                    .map_or(Stored::Nothing, Stored::Summary)
            }
            _ => Stored::Nothing,
        }
    }

    pub async fn put(&self, key: &CacheKey, summary: &CachedSummary) {
        if let Ok(json) = serde_json::to_vec(summary) {
            self.put_sealed(self.inner.key("s", key), &json).await;
        }
    }

    /// Stores `json` under `name`, sealed with the deployment's key, for the summaries' TTL.
    async fn put_sealed(&self, name: String, json: &[u8]) {
        let value = self.inner.seal(&name, json);
        let mut command = redis::cmd("SET");
        command
            .arg(&name)
            .arg(value)
            .arg("PX")
            .arg(millis(self.inner.ttl));
        self.inner.run(command).await;
    }

    /// The calibration of `model` a replica of this deployment stored.
    pub async fn calibration(&self, model: &str) -> Option<SharedCalibration> {
        let name = self
            .inner
            .key("c", &Sha256::digest(model.as_bytes()).into());
        let mut command = redis::cmd("GET");
        command.arg(&name);
        let value = self.inner.run(command).await?;
        let json = open_bytes(&self.inner.signing_key, &name, &value)?;
        serde_json::from_slice(json).ok()
    }

    pub async fn put_calibration(&self, model: &str, shared: &SharedCalibration) {
        if let Ok(json) = serde_json::to_vec(shared) {
            let name = self
                .inner
                .key("c", &Sha256::digest(model.as_bytes()).into());
            self.put_sealed(name, &json).await;
        }
    }

    pub async fn mark_too_large(&self, flight: &CacheKey) {
        let mut command = redis::cmd("SET");
        command
            .arg(self.inner.key("b", flight))
            .arg(1)
            .arg("PX")
            .arg(millis(self.inner.ttl));
        self.inner.run(command).await;
    }

    /// Asks to be the replica that makes the summary of `flight`.
    pub async fn lease(&self, flight: &CacheKey) -> Lease {
        let name = self.inner.key("l", flight);
        let mut command = redis::cmd("SET");
        command
            .arg(&name)
            .arg(&self.inner.owner)
            .arg("NX")
            .arg("PX")
            .arg(millis(self.inner.lease));
        match self.inner.run(command).await {
            Some(Value::Okay) => Lease::Held(LeaseGuard::start(self.inner.clone(), name)),
            Some(Value::Nil) => Lease::Taken,
            _ => Lease::Unavailable,
        }
    }
}

impl Tier {
    fn seal(&self, name: &str, json: &[u8]) -> Vec<u8> {
        seal(&self.signing_key, name, json)
    }

    fn open(&self, name: &str, value: &Value) -> Option<CachedSummary> {
        open(&self.signing_key, name, value)
    }

    fn key(&self, kind: &str, digest: &CacheKey) -> String {
        let mut name = String::with_capacity(self.prefix.len() + 2 + 64);
        name.push_str(&self.prefix);
        name.push_str(kind);
        name.push(':');
        const HEX: &[u8; 16] = b"0123456789abcdef";
        for byte in digest {
            name.push(HEX[usize::from(byte >> 4)] as char);
            name.push(HEX[usize::from(byte & 0xf)] as char);
        }
        name
    }

    fn allowed(&self) -> bool {
        self.breaker.would_admit(Instant::now())
    }

    /// Runs one command within the command timeout; None when Redis did not answer (counted
    /// towards the breaker) or the breaker is open (after its cooldown one command probes).
    async fn run(&self, command: redis::Cmd) -> Option<Value> {
        let Ok(admission) = self.breaker.admit(Instant::now()) else {
            return None;
        };
        // One `MGET` on a cluster too: its client sends each node the keys of its slots.
        let attempt = async {
            let connection = self
                .connection
                .get_or_try_init(|| self.connect())
                .await
                .map_err(|e| e.to_string())?;
            connection
                .clone()
                .query(&command)
                .await
                .map_err(|e| e.to_string())
        };
        let bound = self.connect_timeout + self.command_timeout;
        let result = match tokio::time::timeout(bound, attempt).await {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within {bound:?}")),
        };
        self.metrics.redis_command(result.is_ok());
        match result {
            Ok(Value::ServerError(e)) => {
                tracing::debug!("redis refused a command: {e:?}");
                self.record(admission, true);
                None
            }
            Ok(value) => {
                self.record(admission, true);
                Some(value)
            }
            Err(e) => {
                self.record(admission, false);
                tracing::debug!("redis command failed: {e}");
                None
            }
        }
    }

    async fn connect(&self) -> redis::RedisResult<Connection> {
        match &self.endpoint {
            Endpoint::Single(client) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.connect_timeout))
                    .set_response_timeout(Some(self.command_timeout))
                    .set_number_of_retries(1);
                ConnectionManager::new_with_config(client.as_ref().clone(), config)
                    .await
                    .map(Connection::Single)
            }
            Endpoint::Cluster(client) => {
                client.get_async_connection().await.map(Connection::Cluster)
            }
        }
    }

    fn record(&self, admission: Admission, ok: bool) {
        let change = self.breaker.record(admission, ok, Instant::now());
        if ok {
            if !self.up.swap(true, Ordering::Relaxed) {
                tracing::info!("redis answers again: the shared summary cache is back");
                self.metrics.redis_up(true);
            }
            return;
        }
        if let Change::Opened { failures } = change {
            if self.up.swap(false, Ordering::Relaxed) {
                tracing::warn!(
                    failures,
                    "redis is not answering: the local summary cache serves alone, summaries are made locally"
                );
                self.metrics.redis_up(false);
            }
        }
    }

    async fn script(&self, code: &str, key: &str, milliseconds: Option<u64>) -> Option<Value> {
        let mut command = redis::cmd("EVAL");
        command.arg(code).arg(1).arg(key).arg(&self.owner);
        if let Some(ms) = milliseconds {
            command.arg(ms);
        }
        self.run(command).await
    }
}

/// A held lease: renewed every third of its time until released, so a replica that dies stops
/// renewing and its lease runs out.
pub struct LeaseGuard {
    tier: Arc<Tier>,
    name: String,
    renewing: tokio::task::JoinHandle<()>,
    released: bool,
}

impl LeaseGuard {
    fn start(tier: Arc<Tier>, name: String) -> LeaseGuard {
        let renewing = {
            let (tier, name) = (tier.clone(), name.clone());
            tokio::spawn(async move {
                let every = tier.lease / 3;
                loop {
                    tokio::time::sleep(every).await;
                    let still = tier.script(RENEW, &name, Some(millis(tier.lease))).await;
                    if !matches!(still, Some(Value::Int(1))) {
                        return;
                    }
                }
            })
        };
        LeaseGuard {
            tier,
            name,
            renewing,
            released: false,
        }
    }

    pub async fn release(mut self) {
        self.renewing.abort();
        self.released = true;
        self.tier.script(RELEASE, &self.name, None).await;
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.renewing.abort();
        if !self.released {
            // Dropped without a release (the run was cancelled): let it go in the background.
            let (tier, name) = (self.tier.clone(), std::mem::take(&mut self.name));
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    tier.script(RELEASE, &name, None).await;
                });
            }
        }
    }
}

/// The tag of a summary stored under `name`: the name is in it, so a value copied to another
/// key (another tenant's prefix) does not verify there.
fn tag(signing_key: &[u8], name: &str, json: &[u8]) -> Mac {
    use hmac::Mac as _;
    let mut mac = <Mac as hmac::Mac>::new_from_slice(signing_key)
        .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
    mac.update(name.as_bytes());
    mac.update(&[0]);
    mac.update(json);
    mac
}

fn seal(signing_key: &[u8], name: &str, json: &[u8]) -> Vec<u8> {
    use hmac::Mac as _;
    let tag = tag(signing_key, name, json).finalize().into_bytes();
    let mut value = Vec::with_capacity(1 + TAG_BYTES + json.len());
    value.push(FORMAT);
    value.extend_from_slice(&tag);
    value.extend_from_slice(json);
    value
}

/// The JSON under `name` when its value is one this deployment wrote.
fn open_bytes<'v>(signing_key: &[u8], name: &str, value: &'v Value) -> Option<&'v [u8]> {
    use hmac::Mac as _;
    let Value::BulkString(bytes) = value else {
        return None;
    };
    let (format, rest) = bytes.split_first()?;
    if *format != FORMAT || rest.len() < TAG_BYTES {
        return None;
    }
    let (expected, json) = rest.split_at(TAG_BYTES);
    // Constant time: a forger learns nothing from how fast a wrong tag is refused.
    tag(signing_key, name, json).verify_slice(expected).ok()?;
    Some(json)
}

/// The summary under `name` when its value is one this deployment wrote.
fn open(signing_key: &[u8], name: &str, value: &Value) -> Option<CachedSummary> {
    let json = open_bytes(signing_key, name, value)?;
    let summary: CachedSummary = serde_json::from_slice(json).ok()?;
    (summary.cut > 0 && !summary.text.trim().is_empty()).then_some(summary)
}

/// `url`'s connection info with the configured user name and password, which override its own.
fn with_credentials(url: &str, config: &RedisConfig) -> redis::RedisResult<redis::ConnectionInfo> {
    let info = url.into_connection_info()?;
    let mut settings = info.redis_settings().clone();
    if let Some(username) = &config.username {
        settings = settings.set_username(username);
    }
    if let Some(password) = config.password.as_ref().filter(|p| !p.is_empty()) {
        settings = settings.set_password(password.expose());
    }
    Ok(info.set_redis_settings(settings))
}

fn millis(duration: Duration) -> u64 {
    duration.as_millis().max(1) as u64
}

/// A name for this process that no other replica shares: host, pid and start time, hashed.
fn owner_id() -> String {
    use sha2::{Digest, Sha256};
    static STARTED: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let sequence = STARTED.fetch_add(1, Ordering::Relaxed);
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let digest = Sha256::digest(format!("{host}/{}/{now}/{sequence}", std::process::id()));
    digest.iter().take(12).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary() -> CachedSummary {
        CachedSummary {
            cut: 4,
            excluded: vec![2],
            splits: vec![],
            text: "the summary".into(),
            tokens: 12,
        }
    }

    #[test]
    fn stored_values_round_trip_and_anything_else_is_a_miss() {
        let key = b"a key the replicas share";
        let name = "compactor:s:00ff";
        let json = serde_json::to_vec(&summary()).unwrap();
        let value = seal(key, name, &json);
        let read = |value: Vec<u8>| open(key, name, &Value::BulkString(value));
        assert_eq!(read(value.clone()), Some(summary()));
        let mut other_format = value.clone();
        other_format[0] = FORMAT + 1;
        assert_eq!(read(other_format), None, "another format");
        assert_eq!(read(Vec::new()), None);
        assert_eq!(open(key, name, &Value::Nil), None);
        assert_eq!(open(key, name, &Value::Int(3)), None);
        // What anyone who can write to Redis could put there, but not sign.
        let mut unsigned = vec![FORMAT];
        unsigned.extend_from_slice(&json);
        assert_eq!(read(unsigned), None, "no tag");
        let mut forged = value.clone();
        let last = forged.len() - 2;
        forged[last] ^= 1;
        assert_eq!(read(forged), None, "the JSON changed after signing");
        assert_eq!(
            open(
                b"another deployment's key",
                name,
                &Value::BulkString(value.clone())
            ),
            None
        );
        assert_eq!(
            open(key, "compactor:s:11ee", &Value::BulkString(value)),
            None,
            "moved to another tenant's key"
        );
        let blank = CachedSummary {
            text: " ".into(),
            ..summary()
        };
        let blank = seal(key, name, &serde_json::to_vec(&blank).unwrap());
        assert_eq!(read(blank), None, "nothing to forward");
    }
}
