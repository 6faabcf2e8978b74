//! `compactor [--config proxy.yaml]` serves; `compactor check` validates and prints the config.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};
use compactor::config::Config;
use compactor::proxy::App;
use compactor::server;

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
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
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
    init_logging(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("compactor: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(config))
}

async fn run(config: Config) -> ExitCode {
    server::install_crypto_provider();
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
    for warning in app.config.warnings() {
        tracing::warn!("{warning}");
    }
    let fd_limit = server::raise_fd_limit();
    let cap = server::connection_cap(app.config.limits.max_connections, fd_limit);
    if cap < app.config.limits.max_connections {
        tracing::warn!(
            fd_limit,
            max_connections = cap,
            "limits.max_connections lowered to fit the open-files limit"
        );
    }
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, max_connections = cap, "listening");
        server::announce("compactor", addr);
    }
    server::serve_with_cap(listener, app, server::shutdown_signal(), cap).await;
    ExitCode::SUCCESS
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}
