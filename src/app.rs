//! The running proxy's state. What the configuration decides (routing, keys, models,
//! compaction, body bounds) is one [`Generation`], swapped whole when the file is reloaded: a
//! request takes the generation current when it arrives and keeps it to its end, so a reload
//! never drops a connection or changes a request in flight. Each worker builds its own upstream
//! connection pools for a generation the first time one of its requests needs them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use crate::apis::{self, summarizer::HttpSummarizer};
use crate::auth::Auth;
use crate::compaction::engine::CompactionEngine;
use crate::config::Config;
use crate::inbound::{BodyBounds, BufferBudget};
use crate::metrics::{Gauges, Metrics, ModelLabels};
use crate::routing::Upstreams;
use crate::upstream::UpstreamSetupError;

/// Everything one version of the configuration decides.
pub struct Generation {
    pub id: u64,
    pub config: Arc<Config>,
    pub compaction: Option<CompactionEngine>,
    pub auth: Auth,
    pub bounds: BodyBounds,
    pub model_labels: ModelLabels,
    /// The providers' compaction contracts compactor serves, per upstream.
    pub native: crate::served::NativeCompaction,
}

/// What one request works with: the current generation and this worker's pools for it.
pub struct Current {
    pub generation: Arc<Generation>,
    pub upstreams: Arc<Upstreams>,
}

/// The state every worker shares.
struct Shared {
    generation: ArcSwap<Generation>,
    buffer_budget: BufferBudget,
    ready: AtomicBool,
    metrics: Arc<Metrics>,
    next_id: AtomicU64,
    /// One reload at a time.
    reloading: Mutex<()>,
    relay_limits: crate::relay::RelayLimits,
}

/// One worker's pools, and the generation they were built for.
struct Local {
    generation: u64,
    upstreams: Arc<Upstreams>,
}

/// The app as one worker sees it: the shared state and its own upstream pools.
pub struct App {
    shared: Arc<Shared>,
    local: ArcSwap<Local>,
}

impl App {
    pub fn new(config: Config) -> Result<App, UpstreamSetupError> {
        let metrics = Arc::new(Metrics::new(config.telemetry.metrics));
        let config = Arc::new(config);
        let upstreams = Arc::new(Upstreams::from_config(&config, apis::provider)?);
        let generation = Generation::new(0, config.clone(), upstreams.clone(), &metrics, None);
        let shared = Arc::new(Shared {
            generation: ArcSwap::from_pointee(generation),
            buffer_budget: BufferBudget::new(config.limits.max_buffered_bytes),
            ready: AtomicBool::new(false),
            metrics,
            next_id: AtomicU64::new(1),
            reloading: Mutex::new(()),
            relay_limits: crate::relay::RelayLimits {
                slots: Arc::new(tokio::sync::Semaphore::new(config.limits.max_connections)),
                idle_timeout: std::time::Duration::from_secs_f64(
                    config.limits.idle_connection_timeout_secs,
                ),
                lifetime: std::time::Duration::from_secs_f64(config.limits.relay_max_lifetime_secs),
            },
        });
        Ok(App {
            shared,
            local: ArcSwap::from_pointee(Local {
                generation: 0,
                upstreams,
            }),
        })
    }

    /// A copy for one worker thread: its own upstream connection pools (a connection lives on
    /// the runtime that opened it, so no request hops threads), the rest shared.
    pub fn for_worker(&self) -> Result<App, UpstreamSetupError> {
        let generation = self.shared.generation.load_full();
        Ok(App {
            shared: self.shared.clone(),
            local: ArcSwap::from_pointee(Local {
                generation: generation.id,
                upstreams: Arc::new(Upstreams::from_config(&generation.config, apis::provider)?),
            }),
        })
    }

    /// The generation to serve a request with, and this worker's pools for it.
    pub fn current(&self) -> Current {
        let generation = self.shared.generation.load_full();
        let local = self.local.load();
        if local.generation == generation.id {
            return Current {
                upstreams: local.upstreams.clone(),
                generation,
            };
        }
        // Checked when the generation was made: a failure here is the host's, not the file's.
        match Upstreams::from_config(&generation.config, apis::provider) {
            Ok(upstreams) => {
                let upstreams = Arc::new(upstreams);
                self.local.store(Arc::new(Local {
                    generation: generation.id,
                    upstreams: upstreams.clone(),
                }));
                Current {
                    generation,
                    upstreams,
                }
            }
            Err(e) => {
                tracing::warn!("cannot build upstream pools for the reloaded config: {e}");
                Current {
                    upstreams: local.upstreams.clone(),
                    generation,
                }
            }
        }
    }

    /// The configuration requests are served with now.
    pub fn config(&self) -> Arc<Config> {
        self.shared.generation.load().config.clone()
    }

    /// The compaction engine of the current generation.
    pub fn compaction(&self) -> Option<CompactionEngine> {
        self.shared.generation.load().compaction.clone()
    }

    pub fn metrics(&self) -> &Metrics {
        &self.shared.metrics
    }

    /// The metrics, to be held by a request until its body ends.
    pub fn metrics_handle(&self) -> Arc<Metrics> {
        self.shared.metrics.clone()
    }

    /// Open WebSocket relays are bounded apart from connections (a relayed socket has left
    /// the connection that opened it).
    pub fn relay_limits(&self) -> &crate::relay::RelayLimits {
        &self.shared.relay_limits
    }

    pub fn buffer_budget(&self) -> &BufferBudget {
        &self.shared.buffer_budget
    }

    pub fn set_ready(&self, ready: bool) {
        self.shared.ready.store(ready, Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.shared.ready.load(Ordering::SeqCst)
    }

    /// The metrics' text exposition.
    pub fn render_metrics(&self) -> String {
        let (cache_entries, cache_bytes) = self
            .compaction()
            .map(|engine| engine.cache_size())
            .unwrap_or_default();
        let (bodies_in_flight, buffered_bytes) = self.shared.buffer_budget.held();
        self.shared.metrics.render(Gauges {
            cache_entries,
            cache_bytes,
            bodies_in_flight,
            buffered_bytes,
        })
    }

    /// Serves `config` from the next request on. Settings only read at start-up keep their old
    /// values; their keys are returned so the caller can say a restart is needed.
    pub fn reload(&self, config: Config) -> Result<Vec<&'static str>, ReloadRefused> {
        let _one_at_a_time = self
            .shared
            .reloading
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let previous = self.shared.generation.load_full();
        let auth_removed = previous.config.auth.enabled() && !config.auth.enabled();
        if auth_removed {
            // The listener stays the one the process started with (`listen` needs a restart).
            let open = !previous.config.listens_on_loopback();
            if open && !config.auth.disabled {
                return Err(ReloadRefused::AuthRemoved(previous.config.listen.clone()));
            }
            tracing::warn!(
                listen = %previous.config.listen,
                "configuration reload turns auth off: every client is let in without a key"
            );
        }
        let restart = restart_needed(&previous.config, &config);
        let config = Arc::new(config);
        let upstreams = Arc::new(
            Upstreams::from_config(&config, apis::provider).map_err(ReloadRefused::Upstream)?,
        );
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let metrics = &self.shared.metrics;
        metrics.set_enabled(config.telemetry.metrics);
        let generation = Generation::new(id, config, upstreams, metrics, Some(&previous));
        self.shared.generation.store(Arc::new(generation));
        Ok(restart)
    }

    /// Reloads the file at `path`: a valid config replaces the current one (each setting that
    /// needs a restart is logged), an invalid one is refused with every problem and its key
    /// logged, and the current one keeps serving. Returns whether it was applied.
    pub fn reload_file(&self, path: &std::path::Path) -> bool {
        let loaded = Config::load(path)
            .map_err(|e| e.to_string())
            .and_then(|config| self.reload(config).map_err(|e| e.to_string()));
        let applied = match loaded {
            Ok(restart) => {
                for key in restart {
                    tracing::warn!(
                        key,
                        "configuration reloaded, but '{key}' changes only after a restart"
                    );
                }
                tracing::info!(path = %path.display(), "configuration reloaded");
                true
            }
            Err(problems) => {
                for problem in problems.lines() {
                    tracing::error!(path = %path.display(), "configuration reload refused, the running one stays: {problem}");
                }
                false
            }
        };
        self.shared.metrics.reload(applied);
        applied
    }
}

/// Why a valid file was not applied.
#[derive(Debug, thiserror::Error)]
pub enum ReloadRefused {
    #[error(transparent)]
    Upstream(UpstreamSetupError),
    #[error("the new file has no auth.keys: it would open {0} to anyone who reaches it, spending every upstream's key; add `auth: {{disabled: true}}` if that is meant")]
    AuthRemoved(String),
}

impl Generation {
    fn new(
        id: u64,
        config: Arc<Config>,
        upstreams: Arc<Upstreams>,
        metrics: &Arc<Metrics>,
        previous: Option<&Generation>,
    ) -> Generation {
        let compaction = config.summarization.enabled.then(|| {
            let carried = previous.and_then(|p| p.compaction.as_ref());
            let timeout = std::time::Duration::from_secs_f64(config.summarization.timeout_secs);
            let summarizer = Arc::new(HttpSummarizer::new(upstreams, timeout));
            CompactionEngine::new(&config, summarizer, metrics.clone(), carried)
        });
        Generation {
            id,
            compaction,
            auth: Auth::from_config(&config.auth),
            bounds: BodyBounds::from_config(&config.limits),
            model_labels: ModelLabels::new(&config),
            native: crate::served::NativeCompaction::new(&config),
            config,
        }
    }
}

/// The start-up-only settings that differ between two configs.
fn restart_needed(old: &Config, new: &Config) -> Vec<&'static str> {
    fn differs<T: serde::Serialize>(a: &T, b: &T) -> bool {
        serde_yaml_ng::to_string(a).ok() != serde_yaml_ng::to_string(b).ok()
    }
    let (was, now) = (&old.limits, &new.limits);
    [
        ("listen", differs(&old.listen, &new.listen)),
        ("runtime", differs(&old.runtime, &new.runtime)),
        ("admin", differs(&old.admin, &new.admin)),
        (
            "telemetry.otlp_endpoint",
            differs(&old.telemetry.otlp_endpoint, &new.telemetry.otlp_endpoint),
        ),
        (
            "shutdown_grace_secs",
            differs(&old.shutdown_grace_secs, &new.shutdown_grace_secs),
        ),
        (
            "limits.max_connections",
            differs(&was.max_connections, &now.max_connections),
        ),
        (
            "limits.max_connections_per_ip",
            differs(&was.max_connections_per_ip, &now.max_connections_per_ip),
        ),
        (
            "limits.max_buffered_bytes",
            differs(&was.max_buffered_bytes, &now.max_buffered_bytes),
        ),
        (
            "limits.header_read_timeout_secs",
            differs(&was.header_read_timeout_secs, &now.header_read_timeout_secs),
        ),
        (
            "limits.idle_connection_timeout_secs",
            differs(
                &was.idle_connection_timeout_secs,
                &now.idle_connection_timeout_secs,
            ),
        ),
    ]
    .into_iter()
    .filter(|(_, changed)| *changed)
    .map(|(key, _)| key)
    .collect()
}
