//! `compactor [--config proxy.yaml]` serves; `compactor check` validates and prints the config.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use compactor::app::App;
use compactor::config::{Config, RuntimeMode};
use compactor::operate;
use compactor::server::{self, ConnectionSlots};
use tracing_appender::non_blocking::{ErrorCounter, WorkerGuard};

// glibc malloc/free were about a sixth of the proxy's CPU under load; mimalloc's thread-local
// free lists suit the many short-lived buffers of a request.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    version,
    about = "OpenAI-compatible reverse proxy that compacts long conversations"
)]
struct Cli {
    /// Path of the configuration file.
    #[arg(
        long,
        short,
        env = "COMPACTOR_CONFIG",
        default_value = "proxy.yaml",
        global = true
    )]
    config: PathBuf,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Validate the configuration and print it, secrets redacted.
    Check,
    /// Exit 0 when the running proxy answers `/healthz` (for container health checks, where
    /// there may be no curl).
    Health {
        /// The URL to ask; by default `/healthz` on the configured `listen` (an unspecified
        /// address asked on loopback).
        #[arg(long)]
        url: Option<String>,
    },
    /// What audit mode says enforce would have done with the traffic a running compactor has
    /// seen, read from its metrics.
    Report {
        /// The metrics URL; by default `/metrics` on the configured `admin.listen`, else
        /// `listen` (an unspecified address asked on loopback).
        #[arg(long)]
        url: Option<String>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Health { url }) = &cli.command {
        return health(url.clone(), &cli.config);
    }
    if let Some(Command::Report { url }) = &cli.command {
        return report(url.clone(), &cli.config);
    }
    let loaded = operate::fingerprint(&cli.config);
    let config = match Config::load(&cli.config) {
        Ok(config) => config,
        Err(e) => {
            eprintln!("compactor: invalid config {}:\n{e}", cli.config.display());
            return ExitCode::from(2);
        }
    };
    if let Some(Command::Check) = cli.command {
        for warning in config.warnings() {
            eprintln!("compactor: WARNING: {warning}");
        }
        println!(
            "# {} is valid; effective configuration:",
            cli.config.display()
        );
        print!("{}", config.redacted_yaml());
        return ExitCode::SUCCESS;
    }
    let traces = match compactor::telemetry::init(&config.telemetry) {
        Ok(traces) => traces,
        Err(e) => {
            eprintln!("compactor: {e}");
            return ExitCode::from(2);
        }
    };
    let (traces, tracer) = match traces {
        Some((guard, tracer)) => (Some(guard), Some(tracer)),
        None => (None, None),
    };
    let (_log_writer, dropped_lines) = init_logging(cli.log_format, tracer);
    server::install_crypto_provider();
    let code = match config.runtime.mode {
        RuntimeMode::PerCore => run_per_core(config, &cli.config, loaded),
        RuntimeMode::Shared => run_shared(config, &cli.config, loaded),
    };
    // The last spans are flushed before the exit.
    drop(traces);
    let dropped = dropped_lines.dropped_lines();
    if dropped > 0 {
        eprintln!("compactor: {dropped} log lines were dropped because stderr could not keep up");
    }
    code
}

/// One work-stealing runtime on every core, one listener.
fn run_shared(config: Config, path: &std::path::Path, loaded: Option<[u8; 32]>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .worker_threads(config.runtime.worker_count())
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("compactor: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let listener = match server::bind(&config).await {
            Ok(listener) => listener,
            Err(e) => {
                eprintln!("compactor: cannot listen on {}: {e}", config.listen);
                return ExitCode::FAILURE;
            }
        };
        let app = match App::new(config) {
            Ok(app) => Arc::new(app),
            Err(e) => {
                eprintln!("compactor: {e}");
                return ExitCode::from(2);
            }
        };
        let (stop, stopping) = tokio::sync::watch::channel(false);
        // Signals are registered before the address is announced (see `shutdown_signal`).
        let operator = tokio::spawn(operate::run(
            app.clone(),
            path.to_path_buf(),
            loaded,
            stopping,
        ));
        let terminated = server::shutdown_signal();
        let slots = start_up(&app, listener.local_addr().ok(), 1);
        let grace = app.config().shutdown_grace_secs;
        let shutdown = async {
            terminated.await;
            let _ = stop.send(true);
            say_shutting_down(grace);
        };
        server::serve_on(listener, app, shutdown, slots).await;
        let _ = operator.await;
        ExitCode::SUCCESS
    })
}

/// One single-threaded runtime per core, each with its own `SO_REUSEPORT` listener and upstream
/// pools: a request never changes threads, and no two cores contend for one accept queue.
fn run_per_core(config: Config, path: &std::path::Path, loaded: Option<[u8; 32]>) -> ExitCode {
    let workers = config.runtime.worker_count();
    let listeners = match server::bind_reuseport(&config.listen, workers) {
        Ok(listeners) => listeners,
        Err(e) => {
            eprintln!("compactor: cannot listen on {}: {e}", config.listen);
            return ExitCode::FAILURE;
        }
    };
    let app = match App::new(config) {
        Ok(app) => Arc::new(app),
        Err(e) => {
            eprintln!("compactor: {e}");
            return ExitCode::from(2);
        }
    };
    // Signals, reloads and the admin listener run on a runtime of their own so no worker
    // carries them. Their handlers are registered before the address is announced (see
    // `shutdown_signal`).
    let signals = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("compactor: cannot wait for signals: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let (operator, terminated) = {
        let _inside = signals.enter();
        (
            operate::run(app.clone(), path.to_path_buf(), loaded, stopping.clone()),
            server::shutdown_signal(),
        )
    };
    let addr = listeners.first().and_then(|l| l.local_addr().ok());
    let slots = start_up(&app, addr, workers);
    let mut threads = Vec::with_capacity(workers);
    for (index, listener) in listeners.into_iter().enumerate() {
        let worker_app = match app.for_worker() {
            Ok(worker_app) => Arc::new(worker_app),
            Err(e) => {
                eprintln!("compactor: {e}");
                return ExitCode::from(2);
            }
        };
        match spawn_worker(index, listener, worker_app, slots.clone(), stopping.clone()) {
            Ok(thread) => threads.push(thread),
            Err(e) => {
                eprintln!("compactor: cannot start worker thread {index}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    signals.block_on(async {
        let operator = tokio::spawn(operator);
        terminated.await;
        let _ = stop.send(true);
        say_shutting_down(app.config().shutdown_grace_secs);
        let _ = operator.await;
    });
    let mut code = ExitCode::SUCCESS;
    for thread in threads {
        match thread.join() {
            Ok(Ok(_finished_in_time)) => {}
            Ok(Err(e)) => {
                let e: std::io::Error = e;
                eprintln!("compactor: a worker failed: {e}");
                code = ExitCode::FAILURE;
            }
            Err(_) => code = ExitCode::FAILURE,
        }
    }
    code
}

type Worker = std::thread::JoinHandle<std::io::Result<bool>>;

/// One worker: a thread with a current-thread runtime serving its own listener until stopped.
fn spawn_worker(
    index: usize,
    listener: std::net::TcpListener,
    app: Arc<App>,
    slots: server::ConnectionSlots,
    mut stopping: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<Worker> {
    std::thread::Builder::new()
        .name(format!("compactor-worker-{index}"))
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                let shutdown = async move {
                    let _ = stopping.wait_for(|stop| *stop).await;
                };
                Ok(server::serve_on(listener, app, shutdown, slots).await)
            })
        })
}

/// Said once for the whole process, whatever the number of workers draining.
fn say_shutting_down(grace_secs: f64) {
    tracing::info!(
        "shutting down: waiting up to {:?} for in-flight requests",
        std::time::Duration::from_secs_f64(grace_secs)
    );
}

/// Start-up shared by both modes: warnings, the descriptor limit, the connection cap, and the
/// line scripts wait for.
fn start_up(app: &App, addr: Option<std::net::SocketAddr>, workers: usize) -> ConnectionSlots {
    let config = app.config();
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    let fd_limit = server::raise_fd_limit();
    let cap = server::connection_cap(config.limits.max_connections, fd_limit);
    if cap < config.limits.max_connections {
        tracing::warn!(
            fd_limit,
            max_connections = cap,
            "limits.max_connections lowered to fit the open-files limit"
        );
    }
    if let Some(addr) = addr {
        tracing::info!(%addr, max_connections = cap, workers, "listening");
        server::announce("compactor", addr);
    }
    ConnectionSlots::new(cap, &config.limits)
}

/// `compactor health`: one GET, within a few seconds, answered 200.
/// `http://{address}{path}` on the configured `listen` (`admin.listen` when `admin` and it is
/// set), an unspecified address asked on loopback.
fn local_url(config: &std::path::Path, path: &str, admin: bool) -> String {
    let listen = Config::load(config)
        .map(|c| match c.admin.listen {
            Some(listen) if admin => listen,
            _ => c.listen,
        })
        .unwrap_or_else(|_| "127.0.0.1:8080".into());
    let listen = listen
        .replace("0.0.0.0:", "127.0.0.1:")
        .replace("[::]:", "[::1]:");
    format!("http://{listen}{path}")
}

fn current_thread(command: &str) -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => Some(runtime),
        Err(e) => {
            eprintln!("compactor {command}: {e}");
            None
        }
    }
}

/// The metrics text is a few hundred KB at most; more is not compactor's.
const METRICS_LIMIT: usize = 16 * 1024 * 1024;

fn report(url: Option<String>, config: &std::path::Path) -> ExitCode {
    let url = url.unwrap_or_else(|| local_url(config, "/metrics", true));
    let Some(runtime) = current_thread("report") else {
        return ExitCode::FAILURE;
    };
    let fetched = operate::fetch(&url, std::time::Duration::from_secs(10), METRICS_LIMIT);
    match runtime.block_on(fetched) {
        Ok(metrics) => {
            print!(
                "{}",
                compactor::report::audit(&String::from_utf8_lossy(&metrics))
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("compactor report: {url}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn health(url: Option<String>, config: &std::path::Path) -> ExitCode {
    let url = url.unwrap_or_else(|| local_url(config, "/healthz", false));
    let Some(runtime) = current_thread("health") else {
        return ExitCode::FAILURE;
    };
    match runtime.block_on(operate::probe(&url, std::time::Duration::from_secs(3))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("compactor health: {url}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Logs go through a bounded, non-blocking writer: a slow stderr drops (and counts) lines
/// instead of stalling the thread that serves requests.
fn init_logging(
    format: LogFormat,
    tracer: Option<compactor::telemetry::Tracer>,
) -> (WorkerGuard, ErrorCounter) {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(LOG_BUFFER_LINES)
        .thread_name("compactor-log")
        .finish(std::io::stderr());
    let dropped = writer.error_counter();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    #[cfg(feature = "otel")]
    let spans = tracer.map(|tracer| tracing_opentelemetry::layer().with_tracer(tracer));
    // Without the feature there is no tracer (the type has no value).
    #[cfg(not(feature = "otel"))]
    let spans = tracer.map(|tracer| match tracer {});
    #[cfg(not(feature = "otel"))]
    let spans: Option<tracing_subscriber::layer::Identity> = spans;
    let lines = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(writer);
    let registry = tracing_subscriber::registry().with(filter).with(spans);
    match format {
        LogFormat::Text => registry.with(lines).init(),
        LogFormat::Json => registry.with(lines.json().flatten_event(true)).init(),
    }
    (guard, dropped)
}

/// Lines the log writer holds before it drops: a few seconds of a busy proxy's access log.
const LOG_BUFFER_LINES: usize = 65_536;
